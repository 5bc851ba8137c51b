//! Scenario 2: many runs waiting for approval at once, each with its own event stream open; the server's memory
//! at idle, with all of them pending and after; then all resolved concurrently, none lost and none doubled.

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
use crate::system;

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
    pub rss_idle_bytes: u64,
    pub rss_pending_bytes: u64,
    pub rss_after_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Runs that reached `approvalRequired` with their stream open.
    pub pending: usize,
    /// What `GET /api/agent/approvals` listed with all of them pending.
    pub pending_listed_by_server: usize,
    pub open_s: f64,
    pub resolve_s: f64,
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

/// What a stream task reports once its run waits for a person.
enum Opened {
    Pending {
        index: usize,
        run_id: String,
        call_id: String,
    },
    Failed,
}

struct StreamOutcome {
    index: usize,
    spec: TripSpec,
    /// When `approvalResolved` arrived.
    result: Result<Instant, TripError>,
}

fn id(value: &serde_json::Value, field: &str) -> Result<String, TripError> {
    value[field].as_str().map(str::to_owned).ok_or_else(|| {
        TripError::Unverified(format!(
            "the approvalRequired event has no {field}: {value}"
        ))
    })
}

/// One run: open its stream, report it pending, then wait for its resolution and check the rest of the run.
async fn stream_task(
    api: Api,
    index: usize,
    open: Arc<Semaphore>,
    opened: mpsc::UnboundedSender<Opened>,
    patience: Duration,
) -> StreamOutcome {
    let spec = TripSpec::new("scale", index);
    let permit = open.acquire_owned().await;
    let started = async {
        let mut events = api
            .start_stream(&spec.message(), &spec.session_id, patience)
            .await?;
        let required = events.until("approvalRequired").await?;
        let request = &required["request"];
        Ok::<_, TripError>((events, id(request, "runId")?, id(request, "toolCallId")?))
    }
    .await;
    drop(permit);
    let (mut events, run_id, call_id) = match started {
        Ok(started) => started,
        Err(error) => {
            let _ = opened.send(Opened::Failed);
            return StreamOutcome {
                index,
                spec,
                result: Err(error),
            };
        }
    };
    let _ = opened.send(Opened::Pending {
        index,
        run_id,
        call_id: call_id.clone(),
    });
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

    // Open every stream, `in_flight` at a time, each on its own connection, and wait until all are pending.
    let stream_api = Api::new(server.base_url())?;
    let open = Arc::new(Semaphore::new(in_flight));
    let (opened_tx, mut opened_rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    for index in 0..runs {
        tasks.spawn(stream_task(
            stream_api.clone(),
            index,
            Arc::clone(&open),
            opened_tx.clone(),
            settings.patience,
        ));
    }
    drop(opened_tx);
    // Each task reports exactly once (and keeps its sender until it ends, so count rather than wait for the end).
    let mut pending = Vec::with_capacity(runs);
    for _ in 0..runs {
        let report = tokio::time::timeout(settings.patience * 2, opened_rx.recv())
            .await
            .with_context(|| {
                format!(
                    "no stream reached approvalRequired (or failed) within {} s",
                    (settings.patience * 2).as_secs()
                )
            })?;
        match report {
            Some(Opened::Pending {
                index,
                run_id,
                call_id,
            }) => pending.push((index, run_id, call_id)),
            Some(Opened::Failed) => {}
            None => bail!("every stream task ended before all of them reported"),
        }
    }
    let open_s = started.elapsed().as_secs_f64();
    let cpu_opened = server.cpu_time()?;
    tokio::time::sleep(SETTLE).await;
    server.ensure_running()?;
    let with_pending = server.memory()?;
    let decision_api = Api::new(server.base_url())?;
    let pending_listed_by_server = decision_api.pending_count().await.unwrap_or(0);

    // Resolve them all, `in_flight` decisions at a time.
    let resolving = Instant::now();
    let cpu_before_resolve = server.cpu_time()?;
    let decisions: Vec<(usize, Instant, Result<(), TripError>)> =
        futures::stream::iter(pending.iter().cloned())
            .map(|(index, run_id, call_id)| {
                let api = decision_api.clone();
                async move {
                    let sent_at = Instant::now();
                    (index, sent_at, api.approve(&run_id, &call_id).await)
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

    let mut failures = Failures::default();
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
    let pending_indices: HashSet<usize> = pending.iter().map(|(index, _, _)| *index).collect();
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
            .map(|(_, run_id, call_id)| {
                let api = decision_api.clone();
                async move { api.decide(&run_id, &call_id, "approve").await }
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
        rss_idle_bytes: idle.rss_bytes,
        rss_pending_bytes: with_pending.rss_bytes,
        rss_after_bytes: after.rss_bytes,
        peak_rss_bytes: after.peak_rss_bytes,
        pending: pending.len(),
        pending_listed_by_server,
        open_s,
        resolve_s,
        server_cpu_open_ms: ms(cpu_opened.since(cpu_at_start).total()),
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
