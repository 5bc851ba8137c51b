//! The command line.

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::server::Store;

/// What can be measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Approval round trips over the approval API's routes, at each --concurrency.
    Roundtrip,
    /// Approval round trips over the AG-UI interrupt flow (POST /api/agui: run 1 to the interrupt, run 2 with the
    /// resume to the final answer), at each --concurrency, with the same --trips, --rounds and --warmup.
    AguiRoundtrip,
    /// --scale runs pending at once with their streams open: memory, then all resolved.
    Scale,
    /// Bytes of wasm, js and css the page needs: raw, gzip, brotli.
    Assets,
    /// Navigation to a hydrated, clickable ApprovalBar in headless Chromium (needs node and Chromium).
    Hydration,
}

impl Scenario {
    pub const FULL: [Scenario; 5] = [
        Scenario::Roundtrip,
        Scenario::AguiRoundtrip,
        Scenario::Scale,
        Scenario::Assets,
        Scenario::Hydration,
    ];
    pub const QUICK: [Scenario; 3] = [
        Scenario::Roundtrip,
        Scenario::AguiRoundtrip,
        Scenario::Scale,
    ];
}

/// The repository this tool was built in, to find the default server binary and the hydration script.
fn repository() -> &'static Path {
    let bench = Path::new(env!("CARGO_MANIFEST_DIR"));
    bench.parent().unwrap_or(bench)
}

fn default_server() -> PathBuf {
    repository().join("target/release/toolgate")
}

fn default_script() -> PathBuf {
    repository().join("end2end/bench/hydration.mjs")
}

/// toolgate-bench: measures toolgate's approval round trips (over the approval API's routes and over the AG-UI interrupt
/// flow), its memory with many runs pending, and what the browser downloads. It starts the server itself (from a fresh temporary directory) and reads the server's CPU
/// time and resident memory from /proc. Exits 1 if any trip failed or could not be verified, 2 on a setup error.
#[derive(Clone, Debug, Parser)]
#[command(name = "toolgate-bench", version)]
pub struct Args {
    /// The toolgate binary to measure: the release build with the site embedded (`make site`).
    #[arg(long, default_value_os_t = default_server())]
    pub server: PathBuf,

    /// An extra option for the server, repeatable, for example --server-arg=--policy=strict.
    #[arg(long = "server-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub server_args: Vec<String>,

    /// What to measure, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Scenario::FULL)]
    pub scenarios: Vec<Scenario>,

    /// A smoke run that finishes in seconds: a few hundred verified trips per flow (the approval API and AG-UI) at
    /// concurrency 1 and 8, scale 200, no browser. Flags given explicitly still win.
    #[arg(long)]
    pub quick: bool,

    /// The stores the round trips are measured on, each on fresh servers; the scale and browser scenarios use the
    /// first of sqlite and memory given (sqlite when neither is). postgres and postgres2 (not in the default set):
    /// one instance, or two on one database, of a private PostgreSQL the bench starts (initdb in a temporary
    /// directory; as root it runs as the postgres user); with two, the run is started and streamed on the first and
    /// the decision posted to the second; the approval API's flow only.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Store::Sqlite, Store::Memory])]
    pub stores: Vec<Store>,

    /// The PostgreSQL server binaries (initdb, postgres, pg_isready, createdb) for the postgres stores [default: the
    /// newest /usr/lib/postgresql/*/bin].
    #[arg(long, value_name = "DIR")]
    pub postgres_bin: Option<PathBuf>,

    /// Round trips in flight at once; one fresh server per level.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub concurrency: Vec<usize>,

    /// Measured round trips per concurrency level (and per flow), split over --rounds.
    #[arg(long, default_value_t = 7_500)]
    pub trips: usize,

    /// Rounds per level; throughput and CPU per trip are reported as median and range over them.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,

    /// Verified but unmeasured round trips per level, before the rounds.
    #[arg(long, default_value_t = 500)]
    pub warmup: usize,

    /// Runs pending at once in the scale scenario, each with its own SSE stream (and connection).
    #[arg(long, default_value_t = 10_000)]
    pub scale: usize,

    /// Requests in flight at once in the scale scenario, while opening streams and while deciding.
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,

    /// Measured repetitions of the hydration timing (after one warm-up).
    #[arg(long, default_value_t = 10)]
    pub hydration_runs: usize,

    /// Node.js, to run the hydration script.
    #[arg(long, default_value = "node")]
    pub node: PathBuf,

    /// The Playwright script that times hydration.
    #[arg(long, default_value_os_t = default_script())]
    pub hydration_script: PathBuf,

    /// The Chromium Playwright drives (never downloaded).
    #[arg(long, default_value = "/usr/bin/chromium")]
    pub chromium: PathBuf,

    /// The longest wait for any one event or response, in seconds.
    #[arg(long, default_value_t = 30)]
    pub patience_secs: u64,

    /// Also write every figure as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Where each server's temporary directory (workspace and log) is made [default: /dev/shm when writable, so the
    /// disk's filesystem is not what is measured; else the system's temporary directory].
    #[arg(long, value_name = "DIR")]
    pub tmpdir: Option<PathBuf>,

    /// Keep the servers' temporary directories (workspace and log).
    #[arg(long)]
    pub keep_workdir: bool,

    /// Worker threads of the load generator (default: one per CPU).
    #[arg(long)]
    pub client_threads: Option<usize>,
}

fn defaulted(matches: &ArgMatches, id: &str) -> bool {
    !matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

impl Args {
    /// Parses the command line; `--quick` replaces the defaults the user did not override.
    pub fn parse_with_quick() -> Self {
        let matches = Self::command().get_matches();
        Self::from_matches_with_quick(&matches).unwrap_or_else(|error| error.exit())
    }

    fn from_matches_with_quick(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = Self::from_arg_matches(matches)?;
        if args.quick {
            if defaulted(matches, "scenarios") {
                args.scenarios = Scenario::QUICK.to_vec();
            }
            if defaulted(matches, "stores") {
                args.stores = vec![Store::Sqlite];
            }
            if defaulted(matches, "concurrency") {
                args.concurrency = vec![1, 8];
            }
            if defaulted(matches, "trips") {
                args.trips = 150;
            }
            if defaulted(matches, "rounds") {
                args.rounds = 3;
            }
            if defaulted(matches, "warmup") {
                args.warmup = 20;
            }
            if defaulted(matches, "scale") {
                args.scale = 200;
            }
            if defaulted(matches, "in_flight") {
                args.in_flight = 64;
            }
            if defaulted(matches, "hydration_runs") {
                args.hydration_runs = 2;
            }
        }
        Ok(args)
    }

    pub fn wants(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Args::command().debug_assert();
        let args = Args::try_parse_from(["toolgate-bench", "--concurrency", "1,4,16"]).unwrap();
        assert_eq!(args.concurrency, [1, 4, 16]);
        assert_eq!(args.scenarios, Scenario::FULL);
        assert!(args.wants(Scenario::AguiRoundtrip));
        assert_eq!(args.stores, [Store::Sqlite, Store::Memory]);
        let args =
            Args::try_parse_from(["toolgate-bench", "--stores", "sqlite,postgres2"]).unwrap();
        assert_eq!(args.stores, [Store::Sqlite, Store::Postgres2]);
    }

    #[test]
    fn quick_runs_both_flows_unless_told_otherwise() {
        let quick = |argv: &[&str]| {
            let matches = Args::command().try_get_matches_from(argv).unwrap();
            Args::from_matches_with_quick(&matches).unwrap()
        };
        let args = quick(&["toolgate-bench", "--quick"]);
        assert_eq!(args.scenarios, Scenario::QUICK);
        assert_eq!(args.stores, [Store::Sqlite]);
        assert!(args.wants(Scenario::Roundtrip) && args.wants(Scenario::AguiRoundtrip));
        assert_eq!(
            (args.trips, args.concurrency.as_slice()),
            (150, &[1, 8][..])
        );
        let args = quick(&[
            "toolgate-bench",
            "--quick",
            "--scenarios",
            "agui-roundtrip",
            "--trips",
            "30",
        ]);
        assert_eq!(args.scenarios, [Scenario::AguiRoundtrip]);
        assert_eq!(args.trips, 30);
    }
}
