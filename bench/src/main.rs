//! toolgate-bench: the load generator behind `make bench`.
//!
//! It starts the real `toolgate` binary for each scenario, drives it over HTTP/1.1 and SSE like a client would,
//! verifies every trip, and reads the server's CPU time and memory from /proc. `--quick` is the smoke run the test
//! command uses so the tool cannot rot.

mod api;
mod browser;
mod cli;
mod flow;
mod postgres;
mod report;
mod roundtrip;
mod scale;
mod server;
mod stats;
mod system;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cli::{Args, Scenario};
use crate::flow::ApprovalFlow;
use crate::postgres::Cluster;
use crate::report::{Meta, Report};
use crate::server::{ServerOptions, Store};

fn main() -> ExitCode {
    let args = Args::parse_with_quick();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = args.client_threads {
        runtime.worker_threads(threads.max(1));
    }
    let outcome = runtime
        .build()
        .context("cannot start the async runtime")
        .and_then(|runtime| {
            runtime.block_on(async {
                // On Ctrl-C or SIGTERM the run is dropped, and with it the servers and PostgreSQL (their guards
                // stop them and remove their directories).
                let mut terminate =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .context("cannot listen for SIGTERM")?;
                tokio::select! {
                    outcome = run(args) => outcome,
                    _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
                    _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
                }
            })
        });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "toolgate-bench: some trips failed or could not be verified (see FAILED above)"
            );
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!("toolgate-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// `git rev-parse --short HEAD` of the repository, with `+dirty` when the work tree has changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(hash) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|status| !status.is_empty());
            if dirty { format!("{hash}+dirty") } else { hash }
        }
        None => "unknown".to_owned(),
    }
}

/// The round-trip scenario over one flow: every level, with progress on stderr and the table on stdout.
async fn roundtrips<F: ApprovalFlow>(
    flow: F,
    server_options: &ServerOptions,
    settings: &roundtrip::Settings,
    cluster: Option<&mut Cluster>,
) -> Result<Vec<roundtrip::Level>> {
    eprintln!(
        "round trips ({}, {} store): {} measured + {} warm-up per level, at concurrency {:?}…",
        flow.name(),
        server_options.store.as_str(),
        settings.trips,
        settings.warmup,
        settings.concurrency
    );
    let levels = roundtrip::run(flow, server_options, settings, cluster, |level| {
        eprintln!(
            "  concurrency {}: {:.0} trips/s, {} failed",
            level.concurrency,
            level.trips_per_second.median,
            level.failed + level.unverified_files
        );
    })
    .await?;
    println!("{}", report::roundtrip(&levels));
    Ok(levels)
}

/// Runs the chosen scenarios and prints the report; `Ok(false)` when a trip failed or was not verified.
async fn run(args: Args) -> Result<bool> {
    if args.concurrency.contains(&0) {
        bail!("--concurrency must be at least 1");
    }
    let files_limit = system::raise_open_files_limit()?;
    if args.stores.is_empty() {
        bail!("--stores needs at least one store");
    }
    // The scale and browser scenarios run on one instance.
    let single_store = args
        .stores
        .iter()
        .copied()
        .find(|store| !store.on_postgres())
        .unwrap_or(Store::Sqlite);
    let server_options = ServerOptions {
        store: single_store,
        binary: std::path::absolute(&args.server)
            .with_context(|| format!("bad --server path {}", args.server.display()))?,
        extra_args: args.server_args.clone(),
        keep_workdir: args.keep_workdir,
        tmpdir: args.tmpdir.clone().unwrap_or_else(server::default_tmpdir),
    };
    let meta = Meta {
        date_utc: report::now_utc(),
        commit: commit(),
        server: server_options.binary.display().to_string(),
        workspace_dir: server_options.tmpdir.display().to_string(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: system::Machine::detect(),
    };
    println!("{}", report::header(&meta));
    eprintln!("open-files limit of the bench and its servers: {files_limit}");
    let patience = Duration::from_secs(args.patience_secs.max(1));
    let mut report = Report {
        meta: Some(meta),
        ..Report::default()
    };

    let roundtrip_settings = roundtrip::Settings {
        concurrency: args.concurrency.clone(),
        trips: args.trips,
        rounds: args.rounds,
        warmup: args.warmup,
        patience,
    };
    for &store in &args.stores {
        let server_options = ServerOptions {
            store,
            ..server_options.clone()
        };
        let wanted = args.wants(Scenario::Roundtrip);
        // A private PostgreSQL for this store's levels, stopped when this iteration ends (or fails).
        let mut cluster = if store.on_postgres() && wanted {
            let bin = postgres::bin_dir(args.postgres_bin.as_deref())?;
            eprintln!(
                "PostgreSQL: starting a private cluster from {}…",
                bin.display()
            );
            let cluster = Cluster::start(bin, args.keep_workdir).await?;
            eprintln!("PostgreSQL: ready in {}", cluster.dir().display());
            Some(cluster)
        } else {
            None
        };
        if wanted {
            report.roundtrip.extend(
                roundtrips(
                    flow::ApprovalApiFlow,
                    &server_options,
                    &roundtrip_settings,
                    cluster.as_mut(),
                )
                .await?,
            );
        }
        drop(cluster);
        if args.wants(Scenario::AguiRoundtrip) {
            if store.on_postgres() {
                eprintln!(
                    "round trips (AG-UI, {} store): not measured, the PostgreSQL modes measure the approval API's flow",
                    store.as_str()
                );
            } else {
                report.agui_roundtrip.extend(
                    roundtrips(flow::AguiFlow, &server_options, &roundtrip_settings, None).await?,
                );
            }
        }
    }
    if args.stores.len() > 1 && !report.roundtrip.is_empty() {
        println!("{}", report::by_store(&report.roundtrip));
    }

    if args.wants(Scenario::Scale) {
        eprintln!("scale: {} runs pending at once…", args.scale);
        let settings = scale::Settings {
            runs: args.scale,
            in_flight: args.in_flight,
            patience,
        };
        let scale = scale::run(&server_options, &settings).await?;
        println!("{}", report::scale(&scale));
        report.scale = Some(scale);
    }

    let hydration_settings = browser::HydrationSettings {
        node: args.node.clone(),
        script: args.hydration_script.clone(),
        chromium: args.chromium.clone(),
        runs: args.hydration_runs,
        warmup: 1,
    };
    if args.wants(Scenario::Assets) || args.wants(Scenario::Hydration) {
        eprintln!("browser: asset sizes and hydration timing…");
        let (assets, hydration) = browser::run(
            &server_options,
            args.wants(Scenario::Assets),
            args.wants(Scenario::Hydration)
                .then_some(&hydration_settings),
        )
        .await?;
        if let Some(assets) = &assets {
            println!("{}", report::assets(assets));
        }
        if let Some(hydration) = &hydration {
            println!("{}", report::hydration(hydration));
        }
        report.assets = assets;
        report.hydration = hydration;
    }

    report.targets = report::targets(&report);
    if !report.targets.is_empty() {
        println!("{}", report::targets_table(&report.targets));
    }
    let clean = report.is_clean();
    println!(
        "{}",
        if clean {
            "result: every trip verified"
        } else {
            "result: FAILED (see above)"
        }
    );
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(clean)
}
