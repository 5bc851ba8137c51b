//! Scenario 1: approval round trips over one [`ApprovalFlow`] (the approval API's routes, or AG-UI), at several concurrency
//! levels, each on a fresh server, or on two fresh instances sharing a fresh PostgreSQL database ([`Store::Postgres2`]:
//! the run started and streamed on the first, the decision posted to the second).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::api::{Api, TripError};
use crate::flow::{ApprovalFlow, CONTENT, Legs, TripSpec, TripTiming};
use crate::postgres::Cluster;
use crate::server::{Server, ServerOptions, Store};
use crate::stats::{Spread, Summary};
use crate::system::{self, CpuTime};

/// How many trips, how many at once.
#[derive(Clone, Debug)]
pub struct Settings {
    pub concurrency: Vec<usize>,
    /// Measured trips per concurrency level, split evenly over the rounds.
    pub trips: usize,
    pub rounds: usize,
    /// Unmeasured (but verified) trips before the rounds, per level.
    pub warmup: usize,
    /// The longest wait for any one event.
    pub patience: Duration,
}

/// One measured round.
#[derive(Clone, Debug, Serialize)]
pub struct Round {
    pub trips: usize,
    pub elapsed_s: f64,
    pub trips_per_second: f64,
    /// Summed over the instances.
    pub server_cpu_ms: f64,
    pub server_cpu_per_trip_us: f64,
    /// The part of it spent in the kernel (sockets, files, scheduling).
    pub server_sys_per_trip_us: f64,
    pub bench_cpu_per_trip_us: f64,
    /// PostgreSQL's own CPU (postmaster and its children), when the store is on PostgreSQL; not in the server's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_cpu_per_trip_us: Option<f64>,
}

/// Everything measured at one concurrency level.
#[derive(Clone, Debug, Serialize)]
pub struct Level {
    pub flow: &'static str,
    /// Where the server kept its state.
    pub store: Store,
    /// toolgate instances measured together (2: the run on the first, the decision on the second); the server's
    /// CPU and memory figures are their sums.
    pub instances: usize,
    /// What the trip and its latency legs are for this flow.
    pub legs: Legs,
    pub concurrency: usize,
    pub warmup_trips: usize,
    pub measured_trips: usize,
    /// Trips that failed on the wire (warm-up included).
    pub failed: usize,
    /// Trips that passed on the wire but whose file is missing or wrong in the workspace.
    pub unverified_files: usize,
    pub failures_by_kind: BTreeMap<String, usize>,
    /// The first few failure messages.
    pub failure_examples: Vec<String>,
    pub rounds: Vec<Round>,
    pub trips_per_second: Spread,
    pub server_cpu_per_trip_us: Spread,
    pub server_sys_per_trip_us: Spread,
    pub bench_cpu_per_trip_us: Spread,
    /// PostgreSQL's own CPU per trip, when the store is on PostgreSQL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_cpu_per_trip_us: Option<Spread>,
    pub whole_trip: Summary,
    pub to_approval: Summary,
    pub decision_to_resolved: Summary,
    pub decision_response: Summary,
    pub server_rss_idle_bytes: u64,
    pub server_rss_after_bytes: u64,
    /// The resolution of the CPU figures: one clock tick spread over a round's trips.
    pub cpu_resolution_per_trip_us: f64,
}

impl Level {
    pub fn is_clean(&self) -> bool {
        self.failed == 0 && self.unverified_files == 0
    }
}

struct Outcome {
    spec: TripSpec,
    result: Result<TripTiming, TripError>,
}

/// Runs `count` trips named `label-N`, `concurrency` at a time.
async fn batch<F: ApprovalFlow>(
    flow: &Arc<F>,
    api: &Api,
    label: &str,
    count: usize,
    concurrency: usize,
    patience: Duration,
) -> Result<Vec<Outcome>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.min(count).max(1) {
        let (flow, api, next, label) = (
            Arc::clone(flow),
            api.clone(),
            Arc::clone(&next),
            label.to_owned(),
        );
        workers.spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return outcomes;
                }
                let spec = TripSpec::new(&label, index);
                let result = flow.trip(&api, &spec, patience).await;
                outcomes.push(Outcome { spec, result });
            }
        });
    }
    let mut outcomes = Vec::with_capacity(count);
    while let Some(worker) = workers.join_next().await {
        outcomes.extend(worker.context("a load-generator worker panicked")?);
    }
    Ok(outcomes)
}

/// The servers of one level: one, or two on one shared PostgreSQL database, the run's instance first. Dropping it
/// kills them.
struct Servers {
    servers: Vec<Server>,
}

impl Servers {
    async fn start(
        options: &ServerOptions,
        cluster: Option<&mut Cluster>,
        label: &str,
    ) -> Result<Self> {
        if !options.store.on_postgres() {
            return Ok(Self {
                servers: vec![Server::start(options).await?],
            });
        }
        let cluster = cluster.with_context(|| {
            format!("the {} store needs its PostgreSQL", options.store.as_str())
        })?;
        let url = cluster.create_database(label)?;
        // One workspace for all: the instance that wins a decision runs the tool (toolgate's README asks for a
        // shared volume), so the files are checked there.
        let first = Server::start_on(options, &url, None).await?;
        let workspace = first.workspace().to_path_buf();
        let mut servers = vec![first];
        for _ in 1..options.store.instances() {
            servers.push(Server::start_on(options, &url, Some(&workspace)).await?);
        }
        Ok(Self { servers })
    }

    /// Runs start and stream on the first instance; decisions go to the last.
    fn api(&self) -> Result<Api> {
        let api = Api::new(self.runs().base_url())?;
        Ok(match self.servers.as_slice() {
            [_, .., decisions] => api.with_decisions_at(decisions.base_url()),
            _ => api,
        })
    }

    /// The instance the runs are started and streamed on; its workspace is every instance's.
    fn runs(&self) -> &Server {
        &self.servers[0]
    }

    fn cpu_time(&self) -> Result<CpuTime> {
        self.servers
            .iter()
            .try_fold(CpuTime::default(), |sum, server| {
                Ok(sum.plus(server.cpu_time()?))
            })
    }

    fn rss_bytes(&self) -> Result<u64> {
        self.servers
            .iter()
            .try_fold(0, |sum, server| Ok(sum + server.memory()?.rss_bytes))
    }

    fn ensure_running(&mut self) -> Result<()> {
        self.servers.iter_mut().try_for_each(Server::ensure_running)
    }

    async fn stop(self) -> Result<()> {
        for server in self.servers {
            server.stop().await?;
        }
        Ok(())
    }
}

/// Every concurrency level of `settings`, each on fresh servers (and, for [`Store::Postgres2`], a fresh database on
/// `cluster`).
pub async fn run<F: ApprovalFlow>(
    flow: F,
    server_options: &ServerOptions,
    settings: &Settings,
    mut cluster: Option<&mut Cluster>,
    mut progress: impl FnMut(&Level),
) -> Result<Vec<Level>> {
    let flow = Arc::new(flow);
    let mut levels = Vec::new();
    for &concurrency in &settings.concurrency {
        let level = run_level(
            &flow,
            server_options,
            settings,
            cluster.as_deref_mut(),
            concurrency,
        )
        .await?;
        progress(&level);
        levels.push(level);
    }
    Ok(levels)
}

async fn run_level<F: ApprovalFlow>(
    flow: &Arc<F>,
    server_options: &ServerOptions,
    settings: &Settings,
    mut cluster: Option<&mut Cluster>,
    concurrency: usize,
) -> Result<Level> {
    let mut servers = Servers::start(
        server_options,
        cluster.as_deref_mut(),
        &format!("c{concurrency}"),
    )
    .await?;
    let api = servers.api()?;
    let idle = servers.rss_bytes()?;

    let mut failures = Failures::default();
    let mut passed: Vec<TripSpec> = Vec::new();

    let warmup = batch(
        flow,
        &api,
        &format!("warm-c{concurrency}"),
        settings.warmup,
        concurrency,
        settings.patience,
    )
    .await?;
    for outcome in warmup {
        match outcome.result {
            Ok(_) => passed.push(outcome.spec),
            Err(error) => failures.add(&outcome.spec, &error),
        }
    }

    let rounds = settings.rounds.max(1);
    let per_round = settings.trips.div_ceil(rounds).max(1);
    let mut timings: Vec<TripTiming> = Vec::new();
    let mut round_figures = Vec::new();
    for round in 0..rounds {
        let server_before = servers.cpu_time()?;
        let database_before = cluster.as_deref().map(Cluster::cpu_time).transpose()?;
        let bench_before = system::own_cpu_time()?;
        let started = Instant::now();
        let outcomes = batch(
            flow,
            &api,
            &format!("c{concurrency}-r{round}"),
            per_round,
            concurrency,
            settings.patience,
        )
        .await?;
        let elapsed = started.elapsed();
        let server_cpu = servers.cpu_time()?.since(server_before);
        let database_cpu = match (cluster.as_deref(), database_before) {
            (Some(cluster), Some(before)) => Some(cluster.cpu_time()?.since(before)),
            _ => None,
        };
        let bench_cpu = system::own_cpu_time()?.since(bench_before).total();
        let trips = outcomes.len();
        for outcome in outcomes {
            match outcome.result {
                Ok(timing) => {
                    timings.push(timing);
                    passed.push(outcome.spec);
                }
                Err(error) => failures.add(&outcome.spec, &error),
            }
        }
        round_figures.push(Round {
            trips,
            elapsed_s: elapsed.as_secs_f64(),
            trips_per_second: trips as f64 / elapsed.as_secs_f64(),
            server_cpu_ms: server_cpu.total().as_secs_f64() * 1000.0,
            server_cpu_per_trip_us: server_cpu.total().as_secs_f64() * 1e6 / trips as f64,
            server_sys_per_trip_us: server_cpu.system.as_secs_f64() * 1e6 / trips as f64,
            bench_cpu_per_trip_us: bench_cpu.as_secs_f64() * 1e6 / trips as f64,
            database_cpu_per_trip_us: database_cpu
                .map(|cpu| cpu.total().as_secs_f64() * 1e6 / trips as f64),
        });
    }
    servers.ensure_running()?;
    if let Some(cluster) = cluster.as_deref() {
        cluster.ensure_running()?;
    }
    let after = servers.rss_bytes()?;

    // The tool really ran: every file a passed trip wrote is in the (shared) workspace with its content.
    let mut unverified_files = 0;
    for spec in &passed {
        let path = servers.runs().workspace().join(&spec.file);
        match std::fs::read_to_string(&path) {
            Ok(content) if content == CONTENT => {}
            Ok(content) => {
                unverified_files += 1;
                failures.note(format!(
                    "{}: contains {content:?}, expected {CONTENT:?}",
                    path.display()
                ));
            }
            Err(error) => {
                unverified_files += 1;
                failures.note(format!("{}: {error}", path.display()));
            }
        }
    }
    servers.stop().await?;

    let tick_us = 1e6 / system::clock_ticks() as f64;
    let column =
        |pick: fn(&TripTiming) -> Duration| Summary::of(timings.iter().map(pick).collect());
    let spread =
        |pick: fn(&Round) -> f64| Spread::of(&round_figures.iter().map(pick).collect::<Vec<_>>());
    Ok(Level {
        flow: flow.name(),
        store: server_options.store,
        instances: server_options.store.instances(),
        legs: flow.legs(),
        concurrency,
        warmup_trips: settings.warmup,
        measured_trips: round_figures.iter().map(|r| r.trips).sum(),
        failed: failures.count,
        unverified_files,
        failures_by_kind: failures.by_kind,
        failure_examples: failures.examples,
        trips_per_second: spread(|r| r.trips_per_second),
        server_cpu_per_trip_us: spread(|r| r.server_cpu_per_trip_us),
        server_sys_per_trip_us: spread(|r| r.server_sys_per_trip_us),
        bench_cpu_per_trip_us: spread(|r| r.bench_cpu_per_trip_us),
        database_cpu_per_trip_us: round_figures
            .iter()
            .map(|r| r.database_cpu_per_trip_us)
            .collect::<Option<Vec<f64>>>()
            .map(|values| Spread::of(&values)),
        rounds: round_figures,
        whole_trip: column(|t| t.whole),
        to_approval: column(|t| t.to_approval),
        decision_to_resolved: column(|t| t.decision_to_resolved),
        decision_response: column(|t| t.decision_response),
        server_rss_idle_bytes: idle,
        server_rss_after_bytes: after,
        cpu_resolution_per_trip_us: tick_us / per_round as f64,
    })
}

/// Failed trips, counted by kind, with the first few messages kept.
#[derive(Default)]
pub struct Failures {
    pub count: usize,
    pub by_kind: BTreeMap<String, usize>,
    pub examples: Vec<String>,
}

impl Failures {
    const EXAMPLES: usize = 10;

    pub fn add(&mut self, spec: &TripSpec, error: &TripError) {
        self.count += 1;
        *self.by_kind.entry(error.kind().into_owned()).or_default() += 1;
        self.note(format!("{}: {error}", spec.session_id));
    }

    pub fn note(&mut self, message: String) {
        if self.examples.len() < Self::EXAMPLES {
            self.examples.push(message);
        }
    }
}
