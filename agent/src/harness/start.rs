//! Starting a run: checking what the request may ask for, recording the run (which claims its session), and
//! spawning its task.

use std::collections::HashMap;

use super::drive::Segment;
use super::{Actor, Harness, RunHandle, room};
use crate::approvals::resolution_audit;
use crate::clock::now_ms;
use crate::ids::{RunId, SessionId, ToolCallId};
use crate::interrupts::Suspension;
use crate::request_body::StartRunInput;
use crate::store::{
    AuditEntry, CallRecord, CallStatus, Counts, NewRun, RunInfo, RunState, StartConflict, TakeError,
};
use crate::wire::{ApprovalMode, ApprovalPolicy, Message, Resolution};

/// Where a run's conversation comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum RunSource {
    /// The session's own history; the run's messages join it.
    Session,
    /// A conversation the client owns (AG-UI sends it whole on every run). The run's messages do not join the
    /// session's history; the run keeps its final conversation for the client ([`RunHandle::conversation`]).
    Given(Vec<Message>),
    /// The resume of an interrupted run, with a person's resolution for each of its pending calls, checked
    /// already against what was issued, and who sent them (for the audit log).
    Resume {
        suspension: Box<Suspension>,
        resolutions: HashMap<ToolCallId, Resolution>,
        decided_by: Actor,
        /// User messages the client sent with the resume (a person who typed instead of answering): the model reads
        /// them after the interrupted calls' results.
        added: Vec<String>,
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
    /// Whether an interrupt the session waits on refuses the run ([`StartError::Interrupted`]): AG-UI's rule, a
    /// thread answers its interrupts before it starts another run.
    pub refused_while_interrupted: bool,
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
            refused_while_interrupted: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("The server is shutting down and accepts no new runs.")]
    ShuttingDown,
    #[error("Session {session_id} is busy with run {run_id}; wait for it to finish or cancel it.")]
    SessionBusy {
        session_id: SessionId,
        run_id: RunId,
    },
    #[error(
        "Policy {requested} is looser than the server's policy {configured}; a run may only ask for a stricter one."
    )]
    PolicyTooLoose {
        requested: ApprovalPolicy,
        configured: ApprovalPolicy,
    },
    #[error("Run id {0} is already taken; every run needs a new id.")]
    RunIdTaken(RunId),
    #[error(
        "Thread {session_id} waits for a resume of run {waiting}: answer its interrupts (status resolved or cancelled) before starting another run."
    )]
    Interrupted {
        session_id: SessionId,
        waiting: RunId,
    },
    /// The interrupts a resume names are unknown, or another run already resumed them.
    #[error(transparent)]
    Resume(#[from] TakeError),
    /// The store could not record the run; nothing started.
    #[error("The run could not be recorded, so it did not start: {0}")]
    Unavailable(String),
    /// The server holds as much as it may; the runs it holds go on.
    #[error(
        "The server holds {held} {what}, the most it may; finish or cancel some, or wait for old ones to be pruned. Nothing was started."
    )]
    Full { what: &'static str, held: u64 },
}

impl StartError {
    /// The HTTP status and the stable code of a run that could not start: the one mapping for REST, the page's
    /// server functions and AG-UI. A session busy with another run is `THREAD_BUSY` everywhere: AG-UI, where
    /// clients meet it most, calls a session a thread.
    pub fn refusal(&self) -> (u16, &'static str) {
        match self {
            Self::ShuttingDown => (503, "SHUTTING_DOWN"),
            Self::SessionBusy { .. } => (409, "THREAD_BUSY"),
            Self::PolicyTooLoose { .. } => (403, "POLICY_TOO_LOOSE"),
            Self::RunIdTaken(_) => (409, "RUN_ID_TAKEN"),
            Self::Interrupted { .. } => (409, "THREAD_INTERRUPTED"),
            Self::Resume(TakeError::UnknownParent(_)) => (404, "UNKNOWN_PARENT_RUN"),
            Self::Resume(TakeError::AlreadyUsed { .. }) => (409, "RESUME_ALREADY_USED"),
            Self::Unavailable(_) => (503, "STORE_UNAVAILABLE"),
            Self::Full { .. } => (503, "SERVER_FULL"),
        }
    }
}

/// How a resume answered each interrupt it takes, as the audit log keeps a decision on the approval API: one entry
/// per call, about the interrupted run, with who sent it. Kept with the start that takes the interrupts.
fn resume_audit(
    suspension: &Suspension,
    resolutions: &HashMap<ToolCallId, Resolution>,
    decided_by: &Actor,
) -> Vec<AuditEntry> {
    suspension
        .interruption
        .pending
        .iter()
        .filter_map(|pending| {
            let resolution = resolutions.get(&pending.call.id)?;
            let record = CallRecord::new(
                suspension.run_id.clone(),
                pending.call.clone(),
                pending.input.clone(),
                CallStatus::Pending,
            );
            let mut entry = resolution_audit(&record, resolution, Some(decided_by.as_str()));
            entry.session_id = Some(suspension.session_id.clone());
            Some(entry)
        })
        .collect()
}

impl Harness {
    /// Records a run and starts it in the background.
    pub async fn start(&self, request: StartRun) -> Result<RunHandle, StartError> {
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
        // Held until the run is in the store (or its start failed): starts counted meanwhile count it.
        let _room = self.check_room(request.session_id.as_ref()).await?;
        let session_id = request.session_id.unwrap_or_else(SessionId::generate);
        let run_id = request.run_id.unwrap_or_else(RunId::generate);
        let (parent_run_id, audit) = match &request.source {
            RunSource::Resume {
                suspension,
                resolutions,
                decided_by,
                ..
            } => (
                Some(suspension.run_id.clone()),
                resume_audit(suspension, resolutions, decided_by),
            ),
            _ => (None, Vec::new()),
        };
        let at = now_ms();
        // Before the run is this instance's: an abort recorded as soon as it starts finds its task's switch.
        let local = inner.local.enter(&run_id);
        let epoch = inner
            .store
            .start_run(NewRun {
                run_id: run_id.clone(),
                session_id: session_id.clone(),
                parent_run_id: parent_run_id.clone(),
                mode: request.mode,
                message: request.message.clone(),
                events: Vec::new(),
                audit,
                at,
                refused_while_interrupted: request.refused_while_interrupted,
            })
            .await
            .map_err(|error| StartError::Unavailable(error.to_string()))?
            .map_err(|conflict| match conflict {
                StartConflict::RunIdTaken(run_id) => StartError::RunIdTaken(run_id),
                StartConflict::Resume(refused) => StartError::Resume(refused),
                StartConflict::SessionBusy { session_id, active } => StartError::SessionBusy {
                    session_id,
                    run_id: active,
                },
                StartConflict::Interrupted {
                    session_id,
                    waiting,
                } => StartError::Interrupted {
                    session_id,
                    waiting,
                },
            })?;
        let info = RunInfo {
            run_id,
            session_id,
            parent_run_id,
            mode: request.mode,
            state: RunState::Running,
            last_seq: 0,
            event_bytes: 0,
            abort: None,
            created_at: at,
        };
        let segment = match request.source {
            RunSource::Session => Segment::Start {
                history: None,
                message: request.message,
            },
            RunSource::Given(history) => Segment::Start {
                history: Some(history),
                message: request.message,
            },
            RunSource::Resume {
                suspension,
                resolutions,
                added,
                ..
            } => Segment::Resume {
                suspension,
                resolutions,
                added,
            },
        };
        self.spawn_segment(info.clone(), policy, epoch, segment, local);
        Ok(RunHandle::new(self.clone(), info))
    }
}

impl Harness {
    /// Refuses a new run when the store holds as many unfinished runs (or, for a new session, sessions) as it may,
    /// counting the starts on their way; otherwise takes room for it, held until its run is in the store.
    async fn check_room(&self, session: Option<&SessionId>) -> Result<room::Taken<'_>, StartError> {
        let retention = self.inner.config.retention;
        let bounds = Counts {
            unfinished_runs: retention.max_unfinished_runs,
            sessions: retention.max_sessions,
        };
        let now = now_ms();
        if let Some(taken) = self.inner.room.take_estimated(now, bounds) {
            return Ok(taken);
        }
        let mark = self.inner.room.before_counting();
        let counts = self
            .inner
            .store
            .counts()
            .await
            .map_err(|error| StartError::Unavailable(error.to_string()))?;
        let taken = match self
            .inner
            .room
            .take_counted(mark, now, counts, bounds, false)
        {
            // Full of sessions: a start in a session the store has takes no new place among them.
            Err(room::Full::Sessions(_)) if let Some(session) = session => {
                let known = !self
                    .inner
                    .store
                    .session_runs(session, 1)
                    .await
                    .map_err(|error| StartError::Unavailable(error.to_string()))?
                    .is_empty();
                self.inner
                    .room
                    .take_counted(mark, now, counts, bounds, known)
            }
            taken => taken,
        };
        taken.map_err(|full| match full {
            room::Full::Runs(held) => StartError::Full {
                what: "runs that have not ended",
                held,
            },
            room::Full::Sessions(held) => StartError::Full {
                what: "sessions",
                held,
            },
        })
    }
}
