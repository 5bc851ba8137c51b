//! The [`Harness`]: runs as resources, sessions, decisions and the model, behind one cheap handle, on a
//! [`Store`].
//!
//! The rooms, in the order a run passes through them:
//!
//! - [`start`]: what a run may ask for, recording it, spawning its task;
//! - [`drive`]: a run's task: sampling, and what becomes of the batch that stops it;
//! - [`decide`]: a person's decision, cancelling a run, and the sweeper that times approvals out;
//! - [`continuation`]: a waiting run's calls run and its batch is claimed, by whichever process gets there;
//! - [`finish`]: recording how a run ended, its terminal event last;
//! - [`permissions`]: what people allowed beyond one call: session grants and the rules they added;
//! - [`subscription`]: a run's events from any point, then live; a session's, run after run;
//! - [`retention`]: how much is kept, and for how long.
//!
//! A waiting run is a batch in the store, not a task: its approvals, its calls and the conversation it stopped at
//! are rows, and whoever settles its last call (this process or another on the same database, now or after a
//! restart) samples on from there.

mod continuation;
mod decide;
mod drive;
mod finish;
mod permissions;
mod retention;
mod room;
mod start;
mod subscription;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use decide::{Actor, CancelError, Cancelled, DecideError};
pub use permissions::{GrantNotFound, RevokeError};
pub use retention::Retention;
pub use start::{RunSource, StartError, StartRun};
pub use subscription::{RunHandle, is_terminal};

use crate::agent_loop::LoopLimits;
use crate::ids::{RunId, SessionId, ToolCallId};
use crate::model::Model;
use crate::policy::{PermissionPolicy, RuleBook, StoredRuleBook};
use crate::runtime::{AbortReason, RunAbort};
use crate::store::memory::MemoryStore;
use crate::store::{
    AuditEntry, AuditQuery, CallStatus, EncodedEvent, RemoteStop, RunInfo, SessionSummary, Store,
    StoreError, StoreKind,
};
use crate::tools::Toolbox;
use crate::view::{RunView, SessionView};
use crate::wire::ApprovalRequest;

#[derive(Clone, Debug)]
pub struct HarnessConfig {
    /// The server's policy and rules. A run may ask for a stricter policy, never a looser one.
    pub permissions: PermissionPolicy,
    pub approval_timeout: Duration,
    pub limits: LoopLimits,
    pub retention: Retention,
    /// How often an instance on a shared database looks for stopped instances to take over from.
    pub takeover_every: Duration,
    /// How often the runs this instance holds are checked against the tasks it has (see
    /// `Harness::reconcile_held_runs_forever`).
    pub reconcile_every: Duration,
}

impl HarnessConfig {
    pub fn new(permissions: PermissionPolicy, approval_timeout: Duration) -> Self {
        Self {
            permissions,
            approval_timeout,
            limits: LoopLimits::default(),
            retention: Retention::default(),
            takeover_every: Duration::from_secs(2),
            reconcile_every: Duration::from_secs(5),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "No run {0} is known. It may never have existed, or it finished long enough ago to be forgotten."
)]
pub struct RunNotFound(pub RunId);

/// A failure to read or change what the store holds; nothing was half-written.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(#[from] pub StoreError);

/// The runs this process works on (samples, or runs calls of), with their abort switches: an abort reaches the
/// tasks and tools of this process through them.
#[derive(Default)]
struct LocalRuns {
    runs: Mutex<HashMap<RunId, (RunAbort, usize)>>,
    /// The calls of waiting runs this process runs, each with a switch of its own, a part of its run's: a call a
    /// recovery took from this instance stops alone (`RemoteStop::Call`). Several for one call while tasks race to
    /// begin it (one wins).
    calls: Mutex<HashMap<(RunId, ToolCallId), Vec<RunAbort>>>,
}

/// Holds a run's abort switch while a task of this process works on the run. Taken before the run is this
/// instance's to work on (its start, its claim), so that an abort recorded as soon as it is reaches the task, and the
/// run is never taken for one that no task works on.
struct LocalRun {
    runs: Arc<LocalRuns>,
    run_id: RunId,
    abort: RunAbort,
}

/// Holds the switch of a call of a waiting run while a task of this process runs it.
struct LocalCall {
    runs: Arc<LocalRuns>,
    key: (RunId, ToolCallId),
    abort: RunAbort,
}

impl LocalRun {
    /// A switch for running `call_id` of this run: the run's abort stops it too.
    fn call(&self, call_id: &ToolCallId) -> LocalCall {
        let abort = self.abort.part();
        let key = (self.run_id.clone(), call_id.clone());
        self.runs
            .calls
            .lock()
            .entry(key.clone())
            .or_default()
            .push(abort.clone());
        LocalCall {
            runs: Arc::clone(&self.runs),
            key,
            abort,
        }
    }
}

impl Drop for LocalCall {
    fn drop(&mut self) {
        let mut calls = self.runs.calls.lock();
        if let Some(switches) = calls.get_mut(&self.key) {
            switches.retain(|switch| !switch.is(&self.abort));
            if switches.is_empty() {
                calls.remove(&self.key);
            }
        }
    }
}

impl LocalRuns {
    fn enter(self: &Arc<Self>, run_id: &RunId) -> LocalRun {
        let mut runs = self.runs.lock();
        let entry = runs
            .entry(run_id.clone())
            .or_insert_with(|| (RunAbort::new(), 0));
        entry.1 += 1;
        LocalRun {
            runs: Arc::clone(self),
            run_id: run_id.clone(),
            abort: entry.0.clone(),
        }
    }

    fn abort(&self, run_id: &RunId, reason: AbortReason) {
        self.reach(run_id, Some(reason));
    }

    /// Stops this process's run of one call, which is not this instance's any more; the run's other work goes on.
    /// As a cancel, not a shutdown: a call still waiting for its file does not run (a shutdown's would, as a durable
    /// store keeps it for the next start), and a running tool is told to stop.
    fn stop_call(&self, run_id: &RunId, call_id: &ToolCallId) {
        let calls = self.calls.lock();
        for switch in calls
            .get(&(run_id.clone(), call_id.clone()))
            .into_iter()
            .flatten()
        {
            switch.abort(AbortReason::Cancelled);
        }
    }

    /// The calls of waiting runs this process runs, by run.
    fn calls_by_run(&self) -> HashMap<RunId, Vec<ToolCallId>> {
        let mut by_run: HashMap<RunId, Vec<ToolCallId>> = HashMap::new();
        for (run_id, call_id) in self.calls.lock().keys() {
            by_run
                .entry(run_id.clone())
                .or_default()
                .push(call_id.clone());
        }
        by_run
    }

    /// Whether a task of this process works on the run; an abort given reaches it.
    fn reach(&self, run_id: &RunId, abort: Option<AbortReason>) -> bool {
        let runs = self.runs.lock();
        let Some((switch, _)) = runs.get(run_id) else {
            return false;
        };
        if let Some(reason) = abort {
            switch.abort(reason);
        }
        true
    }

    fn ids(&self) -> Vec<RunId> {
        self.runs.lock().keys().cloned().collect()
    }

    fn is_empty(&self) -> bool {
        self.runs.lock().is_empty()
    }
}

impl Drop for LocalRun {
    fn drop(&mut self) {
        let mut runs = self.runs.runs.lock();
        if let Some(entry) = runs.get_mut(&self.run_id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                runs.remove(&self.run_id);
            }
        }
    }
}

struct Inner {
    config: HarnessConfig,
    model: Arc<dyn Model>,
    toolbox: Arc<Toolbox>,
    store: Arc<dyn Store>,
    /// The configured rules and the ones people added; `config.permissions` reads it.
    rules: Arc<StoredRuleBook>,
    local: Arc<LocalRuns>,
    /// Cancelled when the harness stops accepting work.
    closing: CancellationToken,
    /// Cancelled when shutdown is over: readers read what is left, then end.
    closed: CancellationToken,
    tasks: TaskTracker,
    /// Wakes the sweeper when an approval with an earlier expiry appears.
    sweeper: Notify,
    /// The bounds on runs and sessions, estimated between counts.
    room: room::Room,
    /// Waiting runs whose saved state this process could not read, logged once each (the look for stalled runs
    /// meets them again every round).
    unreadable: crate::logged_once::LoggedOnce<RunId>,
}

/// The application's harness. Cloning is cheap; every clone is the same harness.
#[derive(Clone)]
pub struct Harness {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("model", &self.inner.model.name())
            .field("tools", &self.inner.toolbox)
            .field("store", &self.inner.store.kind())
            .finish()
    }
}

impl Harness {
    /// A harness on a memory store. Call it inside a tokio runtime: it starts its sweeper.
    pub fn new(config: HarnessConfig, model: Arc<dyn Model>, toolbox: Toolbox) -> Self {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // A new memory store keeps no added rules yet: the configured ones are all there is.
        let rules = StoredRuleBook::new(config.permissions.rule_book().rules(), Arc::clone(&store));
        Self::build(config, model, toolbox, store, rules)
    }

    /// A harness on `store`: first it reads the rules people added (a kept rule it cannot read is an error), and
    /// recovers what dead processes left (runs that were sampling fail with `RESTARTED`, calls that were running
    /// are recorded as interrupted), then it picks up waiting runs that have work to do, and starts its sweeper.
    pub async fn open(
        config: HarnessConfig,
        model: Arc<dyn Model>,
        toolbox: Toolbox,
        store: Arc<dyn Store>,
    ) -> Result<Self, Unavailable> {
        let rules =
            StoredRuleBook::open(config.permissions.rule_book().rules(), Arc::clone(&store))
                .await
                .map_err(|error| match error {
                    crate::policy::RuleBookError::Store(error) => Unavailable(error),
                    other => Unavailable(StoreError::Corrupt(other.to_string())),
                })?;
        let harness = Self::build(config, model, toolbox, store, rules);
        let recovered = harness
            .inner
            .store
            .recover(finish::recovery_events(Arc::clone(&harness.inner.toolbox)))
            .await?;
        if !recovered.failed_runs.is_empty() || !recovered.interrupted_calls.is_empty() {
            tracing::warn!(
                failed_runs = recovered.failed_runs.len(),
                interrupted_calls = recovered.interrupted_calls.len(),
                "recovered what a stopped toolgate left: runs that were sampling failed with RESTARTED, calls that were running are marked interrupted"
            );
        }
        harness.kick_stalled().await?;
        Ok(harness)
    }

    fn build(
        mut config: HarnessConfig,
        model: Arc<dyn Model>,
        toolbox: Toolbox,
        store: Arc<dyn Store>,
        rules: StoredRuleBook,
    ) -> Self {
        let rules = Arc::new(rules);
        config.permissions = config
            .permissions
            .with_rule_book(Arc::clone(&rules) as Arc<dyn RuleBook>);
        let harness = Self {
            inner: Arc::new(Inner {
                config,
                model,
                toolbox: Arc::new(toolbox),
                store,
                rules,
                local: Arc::default(),
                closing: CancellationToken::new(),
                closed: CancellationToken::new(),
                tasks: TaskTracker::new(),
                sweeper: Notify::new(),
                room: room::Room::default(),
                unreadable: Default::default(),
            }),
        };
        harness.spawn_background();
        harness
    }

    pub fn config(&self) -> &HarnessConfig {
        &self.inner.config
    }

    pub fn toolbox(&self) -> &Toolbox {
        &self.inner.toolbox
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn store_kind(&self) -> StoreKind {
        self.inner.store.kind()
    }

    pub fn model_name(&self) -> &str {
        self.inner.model.name()
    }

    pub fn is_closing(&self) -> bool {
        self.inner.closing.is_cancelled()
    }

    /// A run that is going or remembered.
    pub async fn run(&self, run_id: &RunId) -> Result<Option<RunHandle>, Unavailable> {
        Ok(self
            .inner
            .store
            .run(run_id)
            .await?
            .map(|info| RunHandle::new(self.clone(), info)))
    }

    /// Pending approvals, of one run or of all.
    pub async fn pending(
        &self,
        run_id: Option<&RunId>,
    ) -> Result<Vec<ApprovalRequest>, Unavailable> {
        let of = run_id.map_or(crate::store::PendingOf::All, crate::store::PendingOf::Run);
        Ok(self.inner.store.pending(of).await?)
    }

    /// The pending approvals of one session's runs, oldest first.
    pub async fn pending_in_session(
        &self,
        session_id: &SessionId,
    ) -> Result<Vec<ApprovalRequest>, Unavailable> {
        Ok(self
            .inner
            .store
            .pending(crate::store::PendingOf::Session(session_id))
            .await?)
    }

    /// A session's remembered runs, as a viewer sees them.
    pub async fn session_view(&self, session_id: &SessionId) -> Result<SessionView, Unavailable> {
        let mut view = SessionView::new(session_id.clone());
        let runs = self
            .inner
            .store
            .session_runs(session_id, self.inner.config.retention.runs_shown)
            .await?;
        for run_id in runs {
            if let Some(run) = self.run_view(&run_id).await? {
                view.runs.push(run);
            }
        }
        Ok(view)
    }

    /// A run as a viewer sees it now, folded from its log.
    pub async fn run_view(&self, run_id: &RunId) -> Result<Option<RunView>, Unavailable> {
        let events = crate::store::all_events(&*self.inner.store, run_id).await?;
        Ok(RunView::from_events(&events))
    }

    /// Sessions, most recently used first.
    pub async fn sessions(&self, limit: usize) -> Result<Vec<SessionSummary>, Unavailable> {
        Ok(self.inner.store.sessions(limit).await?)
    }

    /// The sessions among `ids` that exist, most recently updated first.
    pub async fn sessions_among(
        &self,
        ids: &[SessionId],
    ) -> Result<Vec<SessionSummary>, Unavailable> {
        Ok(self.inner.store.sessions_among(ids).await?)
    }

    /// Entries of the audit log.
    pub async fn audit_log(&self, query: AuditQuery) -> Result<Vec<AuditEntry>, Unavailable> {
        Ok(self.inner.store.audit_log(query).await?)
    }

    /// Adds an entry to the audit log (a refused resume, say).
    pub async fn audit(&self, entry: AuditEntry) -> Result<(), Unavailable> {
        Ok(self.inner.store.audit(entry).await?)
    }

    /// A session's events, run after run, as long as the harness runs: the run `resume` names from after its
    /// sequence number, then every later run of the session from its start, including runs not started yet. Each
    /// event comes with the run it belongs to. Without `resume`, every remembered run of the session is replayed.
    pub fn session_events(
        &self,
        session_id: &SessionId,
        resume: Option<(RunId, u64)>,
    ) -> BoxStream<'static, (RunId, Arc<EncodedEvent>)> {
        subscription::follow_session(self.clone(), session_id.clone(), resume)
    }

    /// Runs this process is working on.
    pub fn local_runs(&self) -> Vec<RunId> {
        self.inner.local.ids()
    }

    /// Stops accepting runs and waits up to `grace` for this process's tasks to end. With a memory store, every
    /// run still going is aborted first (nothing of it could survive the process). With a durable one, waiting runs
    /// stay waiting (decidable after a restart, or on another instance), and a run still sampling when the grace
    /// is over is recovered at the next start (it fails with `RESTARTED`). True when everything ended in time.
    pub async fn shutdown(&self, grace: Duration) -> bool {
        self.inner.closing.cancel();
        if !self.inner.store.kind().is_durable() {
            for run_id in self.inner.store.unfinished_runs().await.unwrap_or_default() {
                self.abort_run(&run_id, AbortReason::Shutdown, None)
                    .await
                    .ok();
            }
        } else {
            for run_id in self.inner.local.ids() {
                self.inner.local.abort(&run_id, AbortReason::Shutdown);
            }
        }
        self.inner.tasks.close();
        let ended = tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_ok();
        let flushed = tokio::time::timeout(grace, self.inner.store.close()).await;
        match &flushed {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, "the store did not write everything it held before closing")
            }
            Err(_) => tracing::error!("the store did not close within the grace period"),
        }
        self.inner.closed.cancel();
        ended && matches!(flushed, Ok(Ok(()))) && self.inner.local.is_empty()
    }

    fn spawn_background(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let sweeper = self.clone();
        runtime.spawn(async move { sweeper.sweep_expired_forever().await });
        let pruner = self.clone();
        runtime.spawn(async move { pruner.prune_forever().await });
        let listener = self.clone();
        runtime.spawn(async move { listener.stop_what_others_abort().await });
        let reconciler = self.clone();
        runtime.spawn(async move { reconciler.reconcile_held_runs_forever().await });
        if self.inner.store.kind() == StoreKind::Postgres {
            let watcher = self.clone();
            runtime.spawn(async move { watcher.take_over_from_the_dead_forever().await });
        }
    }

    /// Stops this process's tasks and tools of runs another instance aborted, and its calls a recovery took over.
    async fn stop_what_others_abort(self) {
        let mut stops = self.inner.store.remote_stops();
        loop {
            tokio::select! {
                () = self.inner.closed.cancelled() => return,
                stop = stops.recv() => match stop {
                    Ok(RemoteStop::Run(run_id, reason)) => self.inner.local.abort(&run_id, reason),
                    Ok(RemoteStop::Call(run_id, call_id)) => {
                        self.inner.local.stop_call(&run_id, &call_id)
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }

    /// Stops the calls of waiting runs this process runs that the store says are not this instance's to run now:
    /// settled, or running elsewhere. (A call not begun yet is still to run: it is left.)
    async fn stop_calls_taken_from_here(&self) {
        let here = self.inner.store.instance();
        for (run_id, call_ids) in self.inner.local.calls_by_run() {
            let records = match self.inner.store.calls(&run_id).await {
                Ok(records) => records,
                Err(error) => {
                    tracing::warn!(%run_id, %error, "cannot read the calls this process runs of the run");
                    continue;
                }
            };
            for call_id in call_ids {
                let taken = records
                    .iter()
                    .find(|record| record.call.id == call_id)
                    .is_none_or(|record| {
                        record.status.is_final()
                            || (record.status == CallStatus::Executing
                                && record.executing_on.as_ref() != Some(here))
                    });
                if taken {
                    self.inner.local.stop_call(&run_id, &call_id);
                }
            }
        }
    }

    /// Now and then, checks the runs this instance holds as running against the tasks it has. An abort recorded
    /// that a task or tool of this process did not hear of (another instance's doorbell lost on the way) reaches
    /// it, for a waiting run whose calls it runs too; so does the end of a run another instance took over (its
    /// doorbell lost too), as a stop of what this process still runs of it. A run that no task works on, seen so
    /// twice at the same claim, is ended as failed, so that its session takes the next run: its end could not be
    /// recorded (the database failed just then), or its task stopped without ending it. A run's task registers before the run is this
    /// instance's (`LocalRun`), so a run just started or claimed is not taken for one. On SQLite it also carries on
    /// waiting runs that have work nobody does. A call of a waiting run this process runs that the store no longer
    /// has it run (a recovery recorded it as interrupted, another instance's doorbell lost on the way) stops.
    async fn reconcile_held_runs_forever(self) {
        let every = self.inner.config.reconcile_every;
        let mut unworked: std::collections::HashSet<(RunId, crate::store::Epoch)> =
            Default::default();
        let mut ended_here: std::collections::HashSet<RunId> = Default::default();
        loop {
            tokio::select! {
                () = self.inner.closing.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let held = match self.inner.store.held_runs().await {
                Ok(held) => held,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the runs this instance holds");
                    continue;
                }
            };
            let mut seen = std::collections::HashSet::new();
            // The runs this process works on that it does not hold (a waiting run whose calls it runs): an abort
            // recorded for them reaches their tools too. One that has ended, seen so twice, ended elsewhere: a
            // recovery took it over, judging this instance dead, and the doorbell that stops it here was lost.
            // (Twice, as a run this process ended itself is still worked on for a moment after its end.)
            let held_ids: std::collections::HashSet<&RunId> =
                held.iter().map(|run| &run.run_id).collect();
            let mut ended_now = std::collections::HashSet::new();
            for run_id in self.inner.local.ids() {
                if held_ids.contains(&run_id) {
                    continue;
                }
                match self.inner.store.run(&run_id).await {
                    Ok(Some(RunInfo {
                        abort: Some(reason),
                        ..
                    })) => self.inner.local.abort(&run_id, reason),
                    Ok(Some(info)) if info.state.is_finished() => {
                        if ended_here.contains(&run_id) {
                            tracing::warn!(%run_id, "the run ended elsewhere while this process works on it; stopping what runs of it here");
                            self.inner.local.abort(&run_id, AbortReason::TakenOver);
                        }
                        ended_now.insert(run_id);
                    }
                    _ => {}
                }
            }
            ended_here = ended_now;
            self.stop_calls_taken_from_here().await;
            for run in held {
                if self.inner.local.reach(&run.run_id, run.abort) {
                    continue;
                }
                let key = (run.run_id.clone(), run.epoch);
                if unworked.contains(&key) {
                    self.end_unworked(run).await;
                } else {
                    seen.insert(key);
                }
            }
            unworked = seen;
            // A waiting run whose calls' results were written late (SQLite's group commit failed for a while)
            // was not carried on when they settled. (On PostgreSQL the takeover's look does this.)
            if self.inner.store.kind() == StoreKind::Sqlite
                && let Err(error) = self.kick_stalled().await
            {
                tracing::warn!(%error, "cannot look for waiting runs with work to do");
            }
        }
    }

    /// Several instances on one database: now and then, take over the work of instances whose heartbeat stopped
    /// (their sampling runs end `RESTARTED`, their running calls are interrupted), and pick up waiting runs with
    /// work nobody does.
    async fn take_over_from_the_dead_forever(self) {
        let every = self.inner.config.takeover_every;
        loop {
            tokio::select! {
                () = self.inner.closing.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            match self
                .inner
                .store
                .recover(finish::recovery_events(Arc::clone(&self.inner.toolbox)))
                .await
            {
                Ok(recovered) => {
                    if !recovered.failed_runs.is_empty() || !recovered.interrupted_calls.is_empty()
                    {
                        tracing::warn!(
                            failed_runs = recovered.failed_runs.len(),
                            interrupted_calls = recovered.interrupted_calls.len(),
                            "took over the work of an instance that stopped"
                        );
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot look for stopped instances"),
            }
            if let Err(error) = self.kick_stalled().await {
                tracing::warn!(%error, "cannot look for waiting runs with work to do");
            }
        }
    }

    /// Forgets finished runs past the retention limits now. Returns how many went.
    pub async fn prune(&self) -> Result<usize, Unavailable> {
        let limits = self.inner.config.retention.limits();
        Ok(self
            .inner
            .store
            .prune(limits, crate::clock::now_ms())
            .await?)
    }

    /// Forgets finished runs past the retention limits, now and then.
    async fn prune_forever(self) {
        let every = self.inner.config.retention.prune_every;
        loop {
            tokio::select! {
                () = self.inner.closing.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            if let Err(error) = self.prune().await {
                tracing::warn!(%error, "cannot prune old runs");
            }
        }
    }
}
