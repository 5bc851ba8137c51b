//! The harness: runs as resources, sessions, the approval registry and the model, behind one cheap handle.
//!
//! A run is a [`RunRecord`]: an append-only log of its events, each already encoded as JSON once, with a sequence
//! number. Any number of subscribers read the log from any point (a late viewer from the start, a reconnecting one
//! from after its `Last-Event-ID`) and then follow it live. A finished run's log stays for a while, bounded in
//! count and time.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent_loop::{
    Interruption, LoopLimits, LoopOutcome, RunEnd, resume_until_end, run_until_end,
};
use crate::approvals::{
    ApprovalNotFound, ApprovalRegistry, ResolveError, ResolvedApproval, now_ms,
};
use crate::events::{AgentEvent, EventSink};
use crate::ids::{RunId, SessionId, ToolCallId};
use crate::input::StartRunInput;
use crate::interrupts::{InterruptStore, IssuedInterrupt, Suspension, arguments_digest};
use crate::model::Model;
use crate::policy::PermissionPolicy;
use crate::runtime::{AbortReason, RunAbort, RunContext};
use crate::session::{SessionBusy, SessionStore};
use crate::tools::Toolbox;
use crate::view::{RunView, SessionView};
use crate::wire::{
    ApprovalMode, ApprovalPolicy, ApprovalRequest, Decision, InterruptRequest, Message, Resolution,
    RunErrorCode, RunEvent, StreamEvent,
};

/// How much the harness keeps, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Finished runs whose events stay available.
    pub finished_runs: usize,
    /// How long a finished run's events stay available.
    pub finished_ttl: Duration,
    /// Events one run may produce; past this the run is aborted.
    pub events_per_run: usize,
    pub sessions: usize,
    pub session_idle: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            finished_runs: 1_000,
            finished_ttl: Duration::from_secs(30 * 60),
            events_per_run: 50_000,
            sessions: 10_000,
            session_idle: Duration::from_secs(24 * 60 * 60),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct HarnessConfig {
    /// The server's policy and rules. A run may ask for a stricter policy, never a looser one.
    pub permissions: PermissionPolicy,
    pub approval_timeout: Duration,
    pub limits: LoopLimits,
    pub retention: Retention,
}

impl HarnessConfig {
    pub fn new(permissions: PermissionPolicy, approval_timeout: Duration) -> Self {
        Self {
            permissions,
            approval_timeout,
            limits: LoopLimits::default(),
            retention: Retention::default(),
        }
    }
}

/// One event as it goes on the wire: its sequence number, its `type`, and its JSON, encoded once for every
/// subscriber.
#[derive(Debug, PartialEq, Eq)]
pub struct EncodedEvent {
    pub seq: u64,
    pub kind: &'static str,
    pub json: Box<str>,
}

struct RecordState {
    events: Vec<Arc<EncodedEvent>>,
    finished: bool,
}

/// A run as a resource: its identity, its abort switch and its event log.
pub struct RunRecord {
    run_id: RunId,
    session_id: SessionId,
    mode: ApprovalMode,
    abort: RunAbort,
    state: Mutex<RecordState>,
    /// The sequence number of the newest event; subscribers wait on it.
    version: watch::Sender<u64>,
    max_events: usize,
    /// The whole conversation once the run ended, for runs whose client owns it (AG-UI).
    conversation: Mutex<Option<Arc<Vec<Message>>>>,
}

impl std::fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRecord")
            .field("run_id", &self.run_id)
            .field("session_id", &self.session_id)
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl RunRecord {
    fn new(run_id: RunId, session_id: SessionId, mode: ApprovalMode, max_events: usize) -> Self {
        Self {
            run_id,
            session_id,
            mode,
            abort: RunAbort::new(),
            state: Mutex::new(RecordState {
                events: Vec::new(),
                finished: false,
            }),
            version: watch::channel(0).0,
            max_events,
            conversation: Mutex::new(None),
        }
    }

    /// The run's whole conversation, once it ended, for runs whose client owns the conversation.
    pub fn conversation(&self) -> Option<Arc<Vec<Message>>> {
        self.conversation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn state(&self) -> MutexGuard<'_, RecordState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    pub fn approval_mode(&self) -> ApprovalMode {
        self.mode
    }

    /// Aborts the run (pending approvals resolve as `denied/abort`); the first reason sticks.
    pub fn abort(&self, reason: AbortReason) {
        self.abort.abort(reason);
    }

    pub fn is_finished(&self) -> bool {
        self.state().finished
    }

    /// The run as a viewer sees it now, folded from its log. Kept as a log only: a run waiting for a person costs
    /// its events, not a second copy of them.
    pub fn view(&self) -> Option<RunView> {
        let (events, _) = self.events_after(0);
        let decoded: Vec<RunEvent> = events
            .iter()
            .filter_map(|encoded| {
                serde_json::from_str(&encoded.json)
                    .map(|event| RunEvent {
                        seq: encoded.seq,
                        event,
                    })
                    .ok()
            })
            .collect();
        RunView::from_events(&decoded)
    }

    /// The sequence number of the newest event.
    pub fn last_seq(&self) -> u64 {
        *self.version.borrow()
    }

    /// The events after `after`, and whether the run has finished.
    pub fn events_after(&self, after: u64) -> (Vec<Arc<EncodedEvent>>, bool) {
        let state = self.state();
        let start = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(state.events.len());
        (state.events[start..].to_vec(), state.finished)
    }

    /// Every event after `after`, then the live ones, until the run ends.
    pub fn subscribe(self: &Arc<Self>, after: u64) -> BoxStream<'static, Arc<EncodedEvent>> {
        let receiver = self.version.subscribe();
        futures::stream::unfold(
            (Arc::clone(self), after, receiver),
            |(record, cursor, mut receiver)| async move {
                loop {
                    // Mark the current version seen before reading the log, so no append slips between the two.
                    receiver.borrow_and_update();
                    let (batch, finished) = record.events_after(cursor);
                    if let Some(last) = batch.last() {
                        let next = last.seq;
                        return Some((futures::stream::iter(batch), (record, next, receiver)));
                    }
                    if finished || receiver.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
        .flatten()
        .boxed()
    }

    /// Waits until the run has finished.
    pub async fn finished(&self) {
        let mut receiver = self.version.subscribe();
        loop {
            receiver.borrow_and_update();
            if self.is_finished() || receiver.changed().await.is_err() {
                return;
            }
        }
    }

    fn push(&self, event: StreamEvent) {
        let terminal = event.is_terminal();
        let json = match serde_json::to_string(&event) {
            Ok(json) => json.into_boxed_str(),
            Err(error) => {
                tracing::error!(run_id = %self.run_id, %error, "an event could not be encoded");
                return;
            }
        };
        let kind = event.kind();
        let seq = {
            let mut state = self.state();
            if state.finished {
                return;
            }
            if !terminal && state.events.len() >= self.max_events {
                drop(state);
                self.abort.abort(AbortReason::EventLimit);
                return;
            }
            let seq = state.events.len() as u64 + 1;
            state
                .events
                .push(Arc::new(EncodedEvent { seq, kind, json }));
            state.finished = terminal;
            seq
        };
        self.version.send_replace(seq);
    }
}

impl EventSink for RunRecord {
    fn emit(&self, event: AgentEvent) {
        for event in event.project(&self.run_id, now_ms()) {
            self.push(event);
        }
    }
}

/// Where a run's conversation comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum RunSource {
    /// The session's own history; the run's messages join it.
    Session,
    /// A conversation the client owns (AG-UI sends it whole on every run). The run's messages do not join the
    /// session's history; the run keeps its final conversation for the client ([`RunRecord::conversation`]).
    Given(Vec<Message>),
    /// The resume of an interrupted run, with a person's resolution for each of its pending calls, checked
    /// already against what was issued.
    Resume {
        suspension: Box<Suspension>,
        resolutions: HashMap<ToolCallId, Resolution>,
    },
}

/// What starting a run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct StartRun {
    pub message: String,
    pub session_id: Option<SessionId>,
    pub policy: Option<ApprovalPolicy>,
    pub mode: ApprovalMode,
    /// A run id the client chose (AG-UI clients do); a fresh one when absent.
    pub run_id: Option<RunId>,
    pub source: RunSource,
}

impl StartRun {
    pub fn new(input: StartRunInput, mode: ApprovalMode) -> Self {
        Self {
            message: input.message,
            session_id: input.session_id,
            policy: input.policy,
            mode,
            run_id: None,
            source: RunSource::Session,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("The server is shutting down and accepts no new runs.")]
    ShuttingDown,
    #[error("Session {} is busy with run {}; wait for it to finish or cancel it.", .0.session_id, .0.run_id)]
    SessionBusy(#[from] SessionBusy),
    #[error(
        "Policy {requested} is looser than the server's policy {configured}; a run may only ask for a stricter one."
    )]
    PolicyTooLoose {
        requested: ApprovalPolicy,
        configured: ApprovalPolicy,
    },
    #[error("Run id {0} is already taken; every run needs a new id.")]
    RunIdTaken(RunId),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "No run {0} is known. It may never have existed, or it finished long enough ago to be forgotten."
)]
pub struct RunNotFound(pub RunId);

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    NotFound(#[from] ApprovalNotFound),
    #[error("{0}")]
    InvalidArguments(String),
}

struct RunTable {
    runs: HashMap<RunId, Arc<RunRecord>>,
    finished: VecDeque<(Instant, RunId)>,
}

struct Inner {
    config: HarnessConfig,
    model: Arc<dyn Model>,
    toolbox: Arc<Toolbox>,
    approvals: ApprovalRegistry,
    sessions: SessionStore,
    runs: Mutex<RunTable>,
    interrupts: InterruptStore,
    closing: CancellationToken,
    tasks: TaskTracker,
    /// Bumped whenever a run begins in any session, for viewers of a session that does not exist yet.
    runs_begun: watch::Sender<u64>,
}

impl Inner {
    fn runs(&self) -> MutexGuard<'_, RunTable> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets finished runs past their time or beyond the count.
    fn sweep(&self, table: &mut RunTable) {
        let retention = self.config.retention;
        while let Some((finished_at, run_id)) = table.finished.front() {
            let expired = finished_at.elapsed() >= retention.finished_ttl;
            if !expired && table.finished.len() <= retention.finished_runs {
                break;
            }
            table.runs.remove(run_id);
            table.finished.pop_front();
        }
    }
}

/// Where a session follower is in the session's list of runs.
enum Position {
    /// Before the first run.
    Start,
    /// In this run, after this event.
    Resume(RunId, u64),
    /// Done with this run.
    After(RunId),
}

struct SessionFollow {
    harness: Harness,
    session: Arc<crate::session::Session>,
    runs_changed: watch::Receiver<u64>,
    position: Position,
    current: Option<(RunId, BoxStream<'static, Arc<EncodedEvent>>)>,
}

impl SessionFollow {
    async fn next(&mut self) -> Option<(RunId, Arc<EncodedEvent>)> {
        loop {
            if let Some((run_id, events)) = &mut self.current {
                match events.next().await {
                    Some(event) => return Some((run_id.clone(), event)),
                    None => {
                        self.position = Position::After(run_id.clone());
                        self.current = None;
                    }
                }
            }
            self.runs_changed.borrow_and_update();
            let runs = self.session.runs();
            let next = match &self.position {
                Position::Start => runs.first().map(|run| (run.clone(), 0)),
                Position::Resume(run_id, after) if runs.contains(run_id) => {
                    Some((run_id.clone(), *after))
                }
                Position::Resume(..) => runs.first().map(|run| (run.clone(), 0)),
                // A run the session no longer lists fell off the front: every listed run is newer.
                Position::After(run_id) => match runs.iter().position(|run| run == run_id) {
                    Some(i) => runs.get(i + 1),
                    None => runs.first(),
                }
                .map(|run| (run.clone(), 0)),
            };
            match next {
                Some((run_id, after)) => {
                    if let Some(record) = self.harness.run(&run_id) {
                        self.current = Some((run_id.clone(), record.subscribe(after)));
                    }
                    self.position = Position::After(run_id);
                }
                None => {
                    let closing = self.harness.inner.closing.clone();
                    tokio::select! {
                        changed = self.runs_changed.changed() => changed.ok()?,
                        () = closing.cancelled() => return None,
                    }
                }
            }
        }
    }
}

impl Inner {
    /// Records how a run ended (the session's history, a suspension, the conversation), then emits its terminal
    /// event: whoever sees that event can rely on everything before it.
    fn finish_run(
        &self,
        record: &RunRecord,
        session: &crate::session::Session,
        prior: Vec<Message>,
        owned_by_session: bool,
        outcome: std::thread::Result<LoopOutcome>,
    ) {
        let run_id = record.run_id().clone();
        let (messages, terminal) = match outcome {
            Ok(outcome) => {
                let terminal = match (&outcome.end, outcome.terminal_event()) {
                    (_, Some(terminal)) => terminal,
                    (RunEnd::Interrupted(interruption), None) => {
                        let mut history = prior.clone();
                        history.extend(outcome.messages.iter().cloned());
                        let interrupts =
                            self.issue_interrupts(record, history, interruption.clone());
                        AgentEvent::RunInterrupted { interrupts }
                    }
                    (_, None) => AgentEvent::RunFailed {
                        code: RunErrorCode::Internal,
                        message: "The run ended without a terminal event.".to_owned(),
                    },
                };
                (outcome.messages, terminal)
            }
            Err(_) => {
                tracing::error!(%run_id, "the run panicked");
                let terminal = AgentEvent::RunFailed {
                    code: RunErrorCode::Internal,
                    message: "The run failed unexpectedly.".to_owned(),
                };
                (Vec::new(), terminal)
            }
        };
        if owned_by_session {
            session.end(&run_id, messages);
        } else {
            let mut conversation = prior;
            conversation.extend(messages);
            *record
                .conversation
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(conversation));
            session.end(&run_id, Vec::new());
        }
        {
            let mut table = self.runs();
            table.finished.push_back((Instant::now(), run_id));
            self.sweep(&mut table);
        }
        record.emit(terminal);
    }

    /// Keeps an interrupted run's suspension and returns the interrupts it issued.
    fn issue_interrupts(
        &self,
        record: &RunRecord,
        history: Vec<Message>,
        interruption: Interruption,
    ) -> Vec<InterruptRequest> {
        let expires_at = now_ms().saturating_add(self.config.approval_timeout.as_millis() as u64);
        let interrupts: Vec<IssuedInterrupt> = interruption
            .pending
            .iter()
            .map(|pending| IssuedInterrupt {
                request: InterruptRequest {
                    id: format!("int_{}", uuid::Uuid::new_v4().simple()),
                    tool_call_id: pending.call.id.clone(),
                    tool_name: pending.call.name.clone(),
                    arguments: pending.input.clone(),
                    reason: pending.reason.clone(),
                    expires_at,
                },
                digest: arguments_digest(&pending.input),
            })
            .collect();
        let requests = interrupts
            .iter()
            .map(|issued| issued.request.clone())
            .collect();
        self.interrupts.issue(
            Suspension {
                run_id: record.run_id().clone(),
                session_id: record.session_id().clone(),
                history,
                interruption,
                interrupts,
            },
            now_ms(),
        );
        requests
    }
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
            .field("approvals", &self.inner.approvals)
            .finish()
    }
}

impl Harness {
    pub fn new(config: HarnessConfig, model: Arc<dyn Model>, toolbox: Toolbox) -> Self {
        let sessions = SessionStore::new(config.retention.sessions, config.retention.session_idle);
        Self {
            inner: Arc::new(Inner {
                approvals: ApprovalRegistry::new(config.approval_timeout),
                interrupts: InterruptStore::new(config.retention.sessions),
                config,
                model,
                toolbox: Arc::new(toolbox),
                sessions,
                runs: Mutex::new(RunTable {
                    runs: HashMap::new(),
                    finished: VecDeque::new(),
                }),
                closing: CancellationToken::new(),
                tasks: TaskTracker::new(),
                runs_begun: watch::channel(0).0,
            }),
        }
    }

    pub fn config(&self) -> &HarnessConfig {
        &self.inner.config
    }

    pub fn approvals(&self) -> &ApprovalRegistry {
        &self.inner.approvals
    }

    pub fn toolbox(&self) -> &Toolbox {
        &self.inner.toolbox
    }

    pub fn model_name(&self) -> &str {
        self.inner.model.name()
    }

    pub fn is_closing(&self) -> bool {
        self.inner.closing.is_cancelled()
    }

    /// Starts a run in the background and returns its record at once.
    pub fn start(&self, request: StartRun) -> Result<Arc<RunRecord>, StartError> {
        let inner = &self.inner;
        if inner.closing.is_cancelled() {
            return Err(StartError::ShuttingDown);
        }
        let configured = inner.config.permissions.policy;
        let policy = match request.policy {
            Some(requested) if requested < configured => {
                return Err(StartError::PolicyTooLoose {
                    requested,
                    configured,
                });
            }
            Some(requested) => requested,
            None => configured,
        };
        let session_id = request.session_id.unwrap_or_else(SessionId::generate);
        let session = inner.sessions.get_or_create(&session_id);
        let run_id = request.run_id.unwrap_or_else(RunId::generate);
        let record = Arc::new(RunRecord::new(
            run_id.clone(),
            session_id.clone(),
            request.mode,
            inner.config.retention.events_per_run,
        ));
        // The record is findable before the session announces the run: a session follower woken by the
        // announcement must find it.
        {
            let mut table = inner.runs();
            inner.sweep(&mut table);
            if table.runs.contains_key(&run_id) || inner.interrupts.knows(&run_id) {
                return Err(StartError::RunIdTaken(run_id));
            }
            table.runs.insert(run_id.clone(), Arc::clone(&record));
        }
        if let Err(busy) = session.begin(&run_id) {
            inner.runs().runs.remove(&run_id);
            return Err(busy.into());
        }
        inner
            .runs_begun
            .send_modify(|count| *count = count.wrapping_add(1));

        let context = RunContext {
            run_id,
            session_id,
            approval_mode: request.mode,
            permissions: PermissionPolicy::new(policy, inner.config.permissions.rules.clone()),
            grants: Arc::clone(session.grants()),
            approvals: inner.approvals.clone(),
            approval_timeout: inner.config.approval_timeout,
            toolbox: Arc::clone(&inner.toolbox),
            abort: record.abort.clone(),
            events: Arc::clone(&record) as Arc<dyn EventSink>,
        };
        let task_inner = Arc::clone(inner);
        let task_record = Arc::clone(&record);
        inner.tasks.spawn(async move {
            let model = &*task_inner.model;
            let limits = task_inner.config.limits;
            // A panic in a run must not leave its viewers waiting: it ends the run with an internal error.
            let (prior, owned_by_session, outcome) = match request.source {
                RunSource::Session => {
                    let history = session.history();
                    let run = run_until_end(model, &context, limits, &history, &request.message);
                    let outcome = AssertUnwindSafe(run).catch_unwind().await;
                    (history, true, outcome)
                }
                RunSource::Given(history) => {
                    let run = run_until_end(model, &context, limits, &history, &request.message);
                    let outcome = AssertUnwindSafe(run).catch_unwind().await;
                    (history, false, outcome)
                }
                RunSource::Resume {
                    suspension,
                    resolutions,
                } => {
                    let Suspension {
                        run_id: parent,
                        history,
                        interruption,
                        ..
                    } = *suspension;
                    let run = resume_until_end(
                        model,
                        &context,
                        limits,
                        &parent,
                        &history,
                        interruption,
                        &resolutions,
                    );
                    let outcome = AssertUnwindSafe(run).catch_unwind().await;
                    (history, false, outcome)
                }
            };
            task_inner.finish_run(&task_record, &session, prior, owned_by_session, outcome);
        });
        Ok(record)
    }

    /// The record of a run that is going or finished recently.
    pub fn run(&self, run_id: &RunId) -> Option<Arc<RunRecord>> {
        let mut table = self.inner.runs();
        self.inner.sweep(&mut table);
        table.runs.get(run_id).cloned()
    }

    /// Aborts a run: its pending approvals resolve as `denied/abort` and nothing runs after that.
    pub fn cancel(&self, run_id: &RunId) -> Result<Arc<RunRecord>, RunNotFound> {
        let record = self
            .run(run_id)
            .ok_or_else(|| RunNotFound(run_id.clone()))?;
        record.abort(AbortReason::Cancelled);
        Ok(record)
    }

    /// Resolves a pending approval with a person's decision. Edited arguments must satisfy the tool's schema;
    /// when they do not, the approval stays pending.
    pub fn decide(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decision: Decision,
    ) -> Result<ResolvedApproval, DecideError> {
        let toolbox = &self.inner.toolbox;
        self.inner
            .approvals
            .resolve_with(run_id, tool_call_id, |request| {
                if let Decision::Approve {
                    arguments: Some(arguments),
                    ..
                } = &decision
                {
                    toolbox.validate(&request.tool_name, arguments)?;
                }
                Ok::<_, crate::tools::ToolError>(Resolution::from_decision(decision))
            })
            .map_err(|error| match error {
                ResolveError::NotFound(not_found) => DecideError::NotFound(not_found),
                ResolveError::Refused(error) => DecideError::InvalidArguments(error.message),
            })
    }

    /// The suspensions interrupted runs left, for resumes.
    pub fn interrupts(&self) -> &InterruptStore {
        &self.inner.interrupts
    }

    /// Pending approvals, of one run or of all.
    pub fn pending(&self, run_id: Option<&RunId>) -> Vec<ApprovalRequest> {
        self.inner.approvals.pending(run_id)
    }

    /// A session's runs that are still remembered, as a viewer sees them.
    pub fn session_view(&self, session_id: &SessionId) -> SessionView {
        let mut view = SessionView::new(session_id.clone());
        if let Some(session) = self.inner.sessions.get(session_id) {
            view.runs = session
                .runs()
                .iter()
                .filter_map(|run_id| self.run(run_id))
                .filter_map(|record| record.view())
                .collect();
        }
        view
    }

    /// A session's events, run after run, as long as the harness runs: the run `resume` names from after its
    /// sequence number, then every later run of the session from its start, including runs not started yet. Each
    /// event comes with the run it belongs to. Without `resume`, every remembered run of the session is replayed.
    /// Following a session that does not exist yet does not create it (a viewer makes the harness hold nothing):
    /// the stream waits for the session's first run.
    pub fn session_events(
        &self,
        session_id: &SessionId,
        resume: Option<(RunId, u64)>,
    ) -> BoxStream<'static, (RunId, Arc<EncodedEvent>)> {
        let harness = self.clone();
        let session_id = session_id.clone();
        let session = async move {
            // Watching before looking: a run that begins in between is either found or announced.
            let mut runs_begun = harness.inner.runs_begun.subscribe();
            let closing = harness.inner.closing.clone();
            loop {
                if let Some(session) = harness.inner.sessions.get(&session_id) {
                    return Some((harness, session));
                }
                tokio::select! {
                    changed = runs_begun.changed() => changed.ok()?,
                    () = closing.cancelled() => return None,
                }
            }
        };
        futures::stream::once(session)
            .filter_map(futures::future::ready)
            .flat_map(move |(harness, session)| {
                let follow = SessionFollow {
                    harness,
                    runs_changed: session.watch_runs(),
                    session,
                    position: match resume.clone() {
                        Some((run_id, after)) => Position::Resume(run_id, after),
                        None => Position::Start,
                    },
                    current: None,
                };
                futures::stream::unfold(follow, |mut follow| async move {
                    let item = follow.next().await?;
                    Some((item, follow))
                })
            })
            .boxed()
    }

    /// How many sessions the harness holds.
    pub fn session_count(&self) -> usize {
        self.inner.sessions.len()
    }

    /// Runs still going.
    pub fn active_runs(&self) -> Vec<Arc<RunRecord>> {
        self.inner
            .runs()
            .runs
            .values()
            .filter(|record| !record.is_finished())
            .cloned()
            .collect()
    }

    /// Stops accepting runs, aborts every run (pending approvals resolve as aborted, streams end with an error
    /// event that says why), and waits up to `grace` for them to end. True when all ended in time.
    pub async fn shutdown(&self, grace: Duration) -> bool {
        self.inner.closing.cancel();
        for record in self.active_runs() {
            record.abort(AbortReason::Shutdown);
        }
        self.inner.tasks.close();
        tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_ok()
    }
}
