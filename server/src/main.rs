//! The `toolgate` binary: parse the configuration, start the server, stop cleanly on SIGINT or SIGTERM.

use clap::Parser;
use server::config::Config;
use server::startup::{build, shutdown_signal};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Whatever a tool is still doing once the server has stopped, the process exits within a bound.
    match server::runtime::run(run(), server::runtime::BLOCKING_WORK_PATIENCE) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("toolgate: cannot start the async runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> std::process::ExitCode {
    let config = Config::parse();
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
