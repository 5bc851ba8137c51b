//! The `toolgate` binary: parse the configuration, start the server, stop cleanly on SIGINT or SIGTERM.

use clap::Parser;
use server::config::Config;
use server::startup::{build, shutdown_signal};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
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
    match application.serve(shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("toolgate: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
