//! The `toolgate` binary: parse the configuration, start the server, stop cleanly on SIGINT or SIGTERM; or run a
//! command (`toolgate audit`, `toolgate rules check`) and exit.

use clap::Parser;
use server::config::{AuditArgs, Command, Config, Database, RulesCommand};
use server::startup::{build, shutdown_signal};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option: its place in mimalloc 3's `mi_option_e`, for which libmimalloc-sys exports no
/// constant (the test below checks that this option is the one whose default is a second).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long memory the server freed stays resident before the allocator hands it back to the system. mimalloc 3
/// waits a second (mimalloc 2 waited 10 ms), and hands it back only on a later call of the thread that freed it: after
/// a burst (10,000 runs decided at once) about 85 MiB more stayed resident once the burst was over. At 10 ms the CPU
/// per round trip did not change measurably (`bench/peers/load.mjs`, both settings alternated).
const PURGE_DELAY_MS: std::ffi::c_long = 10;

fn main() -> std::process::ExitCode {
    keep_memory_from_other_processes();
    // SAFETY: mi_option_set only stores the option's value; it is read when memory is next purged.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    // Whatever a tool is still doing once the server has stopped, the process exits within a bound.
    match server::runtime::run(run(), server::runtime::BLOCKING_WORK_PATIENCE) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("toolgate: cannot start the async runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Marks the process not dumpable, so that no other process of its user may read its memory or its environment
/// through `/proc` (`environ`, `mem`) or attach to it: not a command a person approved, not an MCP server. They
/// run as the same user, and the environment holds the model's key and the access token (`run_command` clears its
/// own environment, but `/proc/<pid>/environ` shows the one a process started with). A fork keeps the mark, so the
/// supervisor each command runs under (a fork of the server that never executes a program, see
/// `agent::tools::process_tree`) has it too; a program executed starts without it. Core dumps go with it.
fn keep_memory_from_other_processes() {
    #[cfg(target_os = "linux")]
    {
        let (zero, none): (libc::c_ulong, libc::c_ulong) = (0, 0);
        // SAFETY: prctl with PR_SET_DUMPABLE reads its integer arguments (passed at the width the kernel reads)
        // and changes only this process.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, zero, none, none, none) } != 0 {
            eprintln!(
                "toolgate: cannot keep its memory from other processes (PR_SET_DUMPABLE): {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

async fn run() -> std::process::ExitCode {
    let config = Config::parse();
    match &config.command {
        Some(Command::Audit(args)) => return print_audit(&config.database_url, args).await,
        Some(Command::Rules(RulesCommand::Check { tool, arguments })) => {
            return match server::rules::check(&config, tool, arguments).await {
                Ok(report) => {
                    print!("{report}");
                    std::process::ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("toolgate: {error}");
                    std::process::ExitCode::from(2)
                }
            };
        }
        None => {}
    }
    let filter = EnvFilter::try_new(&config.log).unwrap_or_else(|error| {
        eprintln!(
            "toolgate: ignoring the log filter {:?}: {error}",
            config.log
        );
        EnvFilter::new("info")
    });
    tracing_subscriber::fmt().with_env_filter(filter).init();

    let application = match build(config).await {
        Ok(application) => application,
        Err(error) => {
            eprintln!("toolgate: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Hand back what start-up used and no longer needs (the route table's building, the embedded site's index).
    // SAFETY: mi_collect has no preconditions; it only frees memory the allocator holds unused.
    unsafe { libmimalloc_sys::mi_collect(true) };
    match application.serve(shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("toolgate: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `toolgate audit`: the audit log as JSON lines, oldest first.
async fn print_audit(database: &Database, args: &AuditArgs) -> std::process::ExitCode {
    use std::io::Write;

    let Database::Sql(url) = database else {
        eprintln!(
            "toolgate: the memory store keeps no audit log beyond its process; name the database with --database-url"
        );
        return std::process::ExitCode::FAILURE;
    };
    let store = match agent::store::sql::SqlStore::read_only(url).await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("toolgate: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let parse = |what: &str, raw: &Option<String>| -> Result<Option<String>, String> {
        match raw {
            Some(id) if id.is_empty() => Err(format!("--{what} names nothing")),
            other => Ok(other.clone()),
        }
    };
    let query = (|| -> Result<agent::store::AuditQuery, String> {
        Ok(agent::store::AuditQuery {
            session_id: parse("session", &args.session)?
                .map(agent::ids::SessionId::parse)
                .transpose()
                .map_err(|error| format!("--session: {error}"))?,
            sessions_or_none: None,
            run_id: parse("run", &args.run)?
                .map(agent::ids::RunId::parse)
                .transpose()
                .map_err(|error| format!("--run: {error}"))?,
            tool: args.tool.clone(),
            outcome: args.outcome.clone(),
            since: args.since,
            until: args.until,
            after_id: None,
            before_id: None,
            newest_first: false,
            limit: args.limit,
        })
    })();
    let mut query = match query {
        Ok(query) => query,
        Err(error) => {
            eprintln!("toolgate: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let mut left = args.limit;
    while left > 0 {
        query.limit = left.min(1_000);
        let entries = match agent::store::Store::audit_log(&*store, query.clone()).await {
            Ok(entries) => entries,
            Err(error) => {
                eprintln!("toolgate: cannot read the audit log: {error}");
                return std::process::ExitCode::FAILURE;
            }
        };
        for entry in &entries {
            if writeln!(out, "{}", serde_json::to_string(entry).unwrap_or_default()).is_err() {
                // The reader went away (`toolgate audit | head`): that is not an error.
                return std::process::ExitCode::SUCCESS;
            }
        }
        left -= entries.len();
        match entries.last() {
            Some(last) if entries.len() == query.limit => query.after_id = Some(last.id),
            _ => break,
        }
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::MI_OPTION_PURGE_DELAY;

    #[test]
    fn the_purge_delay_option_is_the_one_that_waits_a_second_by_default() {
        // SAFETY: reads an option; no test here sets one.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            default, 1_000,
            "mimalloc's option {MI_OPTION_PURGE_DELAY} is not purge_delay"
        );
    }
}
