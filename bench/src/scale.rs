//! Scenario 2: many runs waiting for approval at once. They are started without a stream, so what the server holds
//! for a waiting run is measured alone; then a stream is opened for each (what a watching client costs on top);
//! then all are resolved concurrently, none lost and none doubled. The server's memory at idle, with all of them
//! pending, with their streams open, and after.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use reqwest::StatusCode;
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::api::{Api, TripError};
use crate::flow::{CONTENT, TripSpec, check_resolved};
use crate::roundtrip::Failures;
use crate::server::{Server, ServerOptions};
use crate::stats::Summary;
use crate::system::{self, Memory};

/// How long a pending run's stream may wait for its resolution: the time it takes to open all the others.
const RESOLUTION_PATIENCE: Duration = Duration::from_secs(600);
/// A pause before reading memory, so the figure is not taken in the middle of a burst.
const SETTLE: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Settings {
    pub runs: usize,
    /// Requests in flight at once, while opening streams and while deciding.
    pub in_flight: usize,
    pub patience: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct Scale {
    pub runs: usize,
    pub in_flight: usize,
    pub server_open_files_limit: u64,
    /// The server's memory started, no run yet.
    pub idle: Memory,
    /// All runs waiting for a person, no stream open.
    pub pending_memory: Memory,
    /// All runs waiting, each with its event stream open.
    pub streams_memory: Memory,
    /// All resolved, streams closed; its peak is the whole scenario's.
    pub after: Memory,
    /// Runs whose stream showed the approval the server listed.
    pub pending: usize,
    /// Runs `GET /api/agent/approvals` listed as waiting, after all were started.
    pub pending_listed_by_server: usize,
    /// Starting every run until the server listed all of them as waiting.
    pub create_s: f64,
    pub open_s: f64,
    pub resolve_s: f64,
    pub server_cpu_create_ms: f64,
    pub server_cpu_open_ms: f64,
    pub server_cpu_resolve_ms: f64,
    /// Decision POSTs that answered 200 with an approved resolution.
    pub decisions_ok: usize,
    /// Streams that got `approvalResolved` (approved), the tool's result and `done`.
    pub streams_resolved: usize,
    /// Pending runs whose stream did not end as it must.
    pub lost: usize,
    /// Decision POSTs that did not answer 200, plus second POSTs that did not answer 404.
    pub doubled: usize,
    /// Second decision POSTs for the same calls; each must answer 404.
    pub second_decisions: usize,
    pub second_decisions_404: usize,
    pub files_missing: usize,
    pub decision_to_resolved: Summary,
    pub failures_by_kind: BTreeMap<String, usize>,
    pub failure_examples: Vec<String>,
}

impl Scale {
    pub fn is_clean(&self) -> bool {
        self.pending == self.runs
            && self.pending_listed_by_server == self.runs
            && self.decisions_ok == self.runs
            && self.streams_resolved == self.runs
            && self.lost == 0
            && self.doubled == 0
            && self.second_decisions_404 == self.second_decisions
            && self.files_missing == 0
    }
}

/// What a stream task reports once it saw its run wait for a person.
enum Opened {
    Pending,
    Failed,
}

struct StreamOutcome {
    index: usize,
    spec: TripSpec,
    /// When `approvalResolved` arrived.
    result: Result<Instant, TripError>,
}

/// One pending run: open its stream, check it shows the approval the server listed, report, then wait for its
/// resolution and check the rest of the run.
async fn stream_task(
    api: Api,
    pending: Pending,
    open: Arc<Semaphore>,
    opened: mpsc::UnboundedSender<Opened>,
    patience: Duration,
) -> StreamOutcome {
    let Pending {
        index,
        run_id,
        call_id,
    } = pending;
    let spec = TripSpec::new("scale", index);
    let permit = open.acquire_owned().await;
    let started = async {
        let mut events = api.run_events(&run_id, patience).await?;
        let required = events.until("approvalRequired").await?;
        let shown = required["request"]["toolCallId"].as_str().unwrap_or("");
        if shown != call_id {
            return Err(TripError::Unverified(format!(
                "the stream of run {run_id} shows call {shown:?}, the server listed {call_id}"
            )));
        }
        Ok::<_, TripError>(events)
    }
    .await;
    drop(permit);
    let mut events = match started {
        Ok(events) => events,
        Err(error) => {
            let _ = opened.send(Opened::Failed);
            return StreamOutcome {
                index,
                spec,
                result: Err(error),
            };
        }
    };
    let _ = opened.send(Opened::Pending);
    let result = async {
        events.set_patience(RESOLUTION_PATIENCE);
        let resolved = events.until("approvalResolved").await?;
        let resolved_at = Instant::now();
        check_resolved(&resolved, &call_id)?;
        events.set_patience(patience);
        let result = events.until("toolResult").await?;
        if result["output"]["status"] != "ok" {
            return Err(TripError::Unverified(format!(
                "the approved tool did not run: {}",
                result["output"]
            )));
        }
        events.until("done").await?;
        events.expect_end().await?;
        Ok(resolved_at)
    }
    .await;
    StreamOutcome {
        index,
        spec,
        result,
    }
}

/// A run the server lists as waiting for a person.
#[derive(Clone, Debug)]
struct Pending {
    index: usize,
    run_id: String,
    call_id: String,
}

/// Polls `GET /api/agent/approvals` until it lists `expected` approvals or `patience` passed; the last list.
async fn await_pending(
    api: &Api,
    expected: usize,
    patience: Duration,
) -> Result<Vec<(String, String)>> {
    let deadline = Instant::now() + patience;
    loop {
        let listed = api
            .pending()
            .await
            .map_err(|error| anyhow::anyhow!("cannot list the pending approvals: {error}"))?;
        if listed.len() >= expected || Instant::now() >= deadline {
            return Ok(listed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn run(server_options: &ServerOptions, settings: &Settings) -> Result<Scale> {
    let runs = settings.runs;
    let in_flight = settings.in_flight.max(1);
    let ports = system::ephemeral_ports()?;
    if (runs + 2 * in_flight + 100) as u64 > ports {
        bail!(
            "{runs} streams plus {in_flight} decisions in flight need more local ports than the {ports} of \
             net.ipv4.ip_local_port_range; lower --scale or widen the range"
        );
    }
    let own_limit = system::open_files_limit(std::process::id())?;
    let mut server = Server::start(server_options).await?;
    let server_limit = system::open_files_limit(server.pid())?;
    let needed = (runs + 2 * in_flight + 100) as u64;
    if own_limit < needed || server_limit < needed {
        bail!(
            "{runs} open streams need about {needed} open files in the bench and in the server, but their limits are \
             {own_limit} and {server_limit}; raise the hard limit (`ulimit -Hn`) or lower --scale"
        );
    }

    tokio::time::sleep(SETTLE).await;
    let idle = server.memory()?;
    let cpu_at_start = server.cpu_time()?;
    let mut failures = Failures::default();

    // Start every run without a stream, `in_flight` at a time, and wait until the server lists all of them as
    // pending: a run waiting for a person is held by the store, not by a connection.
    let decision_api = Api::new(server.base_url())?;
    let started = Instant::now();
    let created: Vec<(usize, Result<String, TripError>)> = futures::stream::iter(0..runs)
        .map(|index| {
            let api = decision_api.clone();
            async move {
                let spec = TripSpec::new("scale", index);
                (
                    index,
                    api.create_run(&spec.message(), &spec.session_id).await,
                )
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let mut index_of = HashMap::with_capacity(runs);
    for (index, created) in created {
        match created {
            Ok(run_id) => {
                index_of.insert(run_id, index);
            }
            Err(error) => failures.add(&TripSpec::new("scale", index), &error),
        }
    }
    let listed = await_pending(&decision_api, index_of.len(), settings.patience * 2).await?;
    let pending: Vec<Pending> = listed
        .into_iter()
        .filter_map(|(run_id, call_id)| {
            let index = *index_of.get(&run_id)?;
            Some(Pending {
                index,
                run_id,
                call_id,
            })
        })
        .collect();
    let pending_listed_by_server = pending.len();
    let create_s = started.elapsed().as_secs_f64();
    let cpu_created = server.cpu_time()?;
    tokio::time::sleep(SETTLE).await;
    server.ensure_running()?;
    let held = server.memory()?;

    // Then open a stream for each, `in_flight` at a time, each on its own connection: what a person watching
    // every one of them costs on top.
    let stream_api = Api::new(server.base_url())?;
    let open = Arc::new(Semaphore::new(in_flight));
    let (opened_tx, mut opened_rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    let opening = Instant::now();
    let cpu_before_open = server.cpu_time()?;
    for waiting in &pending {
        tasks.spawn(stream_task(
            stream_api.clone(),
            waiting.clone(),
            Arc::clone(&open),
            opened_tx.clone(),
            settings.patience,
        ));
    }
    drop(opened_tx);
    // Each task reports exactly once (and keeps its sender until it ends, so count rather than wait for the end).
    let mut streams_open = 0;
    for _ in 0..pending.len() {
        let report = tokio::time::timeout(settings.patience * 2, opened_rx.recv())
            .await
            .with_context(|| {
                format!(
                    "no stream showed its approval (or failed) within {} s",
                    (settings.patience * 2).as_secs()
                )
            })?;
        match report {
            Some(Opened::Pending) => streams_open += 1,
            Some(Opened::Failed) => {}
            None => bail!("every stream task ended before all of them reported"),
        }
    }
    let open_s = opening.elapsed().as_secs_f64();
    let cpu_opened = server.cpu_time()?;
    tokio::time::sleep(SETTLE).await;
    server.ensure_running()?;
    let with_streams = server.memory()?;

    // Resolve them all, `in_flight` decisions at a time.
    let resolving = Instant::now();
    let cpu_before_resolve = server.cpu_time()?;
    let decisions: Vec<(usize, Instant, Result<(), TripError>)> =
        futures::stream::iter(pending.iter().cloned())
            .map(|waiting| {
                let api = decision_api.clone();
                async move {
                    let sent_at = Instant::now();
                    let decided = api.approve(&waiting.run_id, &waiting.call_id).await;
                    (waiting.index, sent_at, decided)
                }
            })
            .buffer_unordered(in_flight)
            .collect()
            .await;
    let mut outcomes = Vec::with_capacity(runs);
    while let Some(task) = tasks.join_next().await {
        outcomes.push(task.context("a stream task panicked")?);
    }
    let resolve_s = resolving.elapsed().as_secs_f64();
    let cpu_resolved = server.cpu_time()?;

    let mut sent_at = HashMap::with_capacity(decisions.len());
    let mut decisions_ok = 0;
    let mut doubled = 0;
    for (index, sent, result) in decisions {
        sent_at.insert(index, sent);
        match result {
            Ok(()) => decisions_ok += 1,
            Err(error) => {
                doubled += 1;
                failures.add(&TripSpec::new("scale", index), &error);
            }
        }
    }
    let pending_indices: HashSet<usize> = pending.iter().map(|waiting| waiting.index).collect();
    let mut latencies = Vec::with_capacity(outcomes.len());
    let mut streams_resolved = 0;
    let mut lost = 0;
    let mut passed = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        match outcome.result {
            Ok(resolved_at) => {
                streams_resolved += 1;
                if let Some(sent) = sent_at.get(&outcome.index) {
                    latencies.push(resolved_at.saturating_duration_since(*sent));
                }
                passed.push(outcome.spec);
            }
            Err(error) => {
                if pending_indices.contains(&outcome.index) {
                    lost += 1;
                }
                failures.add(&outcome.spec, &error);
            }
        }
    }

    // Every stream is over: close their connections, as browsers would, and let the server settle.
    drop(stream_api);
    tokio::time::sleep(SETTLE).await;
    server.ensure_running()?;
    let after = server.memory()?;

    // None doubled: a second decision for the same call finds nothing.
    let seconds: Vec<Result<(StatusCode, serde_json::Value), TripError>> =
        futures::stream::iter(pending.iter().cloned())
            .map(|waiting| {
                let api = decision_api.clone();
                async move {
                    api.decide(&waiting.run_id, &waiting.call_id, "approve")
                        .await
                }
            })
            .buffer_unordered(in_flight)
            .collect()
            .await;
    let second_decisions = seconds.len();
    let mut second_decisions_404 = 0;
    for second in seconds {
        match second {
            Ok((StatusCode::NOT_FOUND, _)) => second_decisions_404 += 1,
            Ok((status, body)) => {
                doubled += 1;
                failures.note(format!("a second decision answered {status}: {body}"));
            }
            Err(error) => failures.note(format!("a second decision failed: {error}")),
        }
    }

    let mut files_missing = 0;
    for spec in &passed {
        let path = server.workspace().join(&spec.file);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(CONTENT) {
            files_missing += 1;
            failures.note(format!("{} is missing or wrong", path.display()));
        }
    }
    server.stop().await?;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(Scale {
        runs,
        in_flight,
        server_open_files_limit: server_limit,
        idle,
        pending_memory: held,
        streams_memory: with_streams,
        after,
        pending: streams_open,
        pending_listed_by_server,
        create_s,
        open_s,
        resolve_s,
        server_cpu_create_ms: ms(cpu_created.since(cpu_at_start).total()),
        server_cpu_open_ms: ms(cpu_opened.since(cpu_before_open).total()),
        server_cpu_resolve_ms: ms(cpu_resolved.since(cpu_before_resolve).total()),
        decisions_ok,
        streams_resolved,
        lost,
        doubled,
        second_decisions,
        second_decisions_404,
        files_missing,
        decision_to_resolved: Summary::of(latencies),
        failures_by_kind: failures.by_kind,
        failure_examples: failures.examples,
    })
}
