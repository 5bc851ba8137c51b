//! Where the harness keeps what must outlive a request: sessions, runs and their event logs, tool calls and their
//! approvals, AG-UI suspensions, session grants, added rules and the audit log.
//!
//! The rows are the truth; memory is a cache and the place where waiting futures live. One trait, [`Store`], and
//! three implementations: [`memory::MemoryStore`] (one process, nothing survives it: a dead process counts as a
//! denial), and, with the `sql` feature, SQLite (the embedded default, a file beside toolgate) and PostgreSQL (which
//! lets several instances serve as one), one SQL implementation over both (see [`sql`]).
//!
//! Every method that changes state is one atomic state change: it happens whole or not at all, and a conditional
//! one (a decision, a claim, a resume) is taken by exactly one caller however many race for it, in this process or
//! in another one on the same database. Events of a state change are durable before anyone can read them: a reader
//! sees an event only through [`Store::events_after`], which returns committed events only.
//!
//! # The life of a run, as rows
//!
//! - `running`: an instance (the owner, with an epoch) samples the model. Its writes are fenced by the epoch: once
//!   another instance declared it dead and took the run over, its late writes change nothing.
//! - `waiting`: a batch of tool calls is open. Each call is its own row: refused, allowed, pending (an approval),
//!   approved, denied, executing, settled or interrupted. No instance owns a waiting run; whoever settles the last
//!   call of the batch claims it ([`Store::claim_batch`]) and samples on.
//! - `interrupted`: an AG-UI run ended with interrupts; a later run resumes it, once: the resuming run's start takes
//!   the interrupts in the same transaction ([`NewRun::parent_run_id`]), so a resume is used exactly when its run
//!   exists.
//! - `done` and `failed`: ended, with a terminal event as the last of the log.

pub mod memory;
#[cfg(feature = "sql")]
pub mod sql;
mod watches;

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use crate::ids::{RunId, SessionId, ToolCallId};
use crate::interrupts::Suspension;
use crate::runtime::AbortReason;
use crate::wire::{
    ApprovalMode, ApprovalPolicy, ApprovalRequest, Message, Resolution, StreamEvent, ToolCall,
    ToolOutput,
};

/// Which kind of store this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Sqlite,
    Postgres,
}

impl StoreKind {
    /// Whether what the store holds survives the process.
    pub fn is_durable(self) -> bool {
        !matches!(self, Self::Memory)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// A running toolgate process, as the store knows it: a fresh id at every start.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(String);

impl InstanceId {
    pub fn generate() -> Self {
        Self(format!("inst_{}", uuid::Uuid::new_v4().simple()))
    }

    pub fn from_stored(value: String) -> Self {
        Self(value)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which claim on a running run a writer holds: bumped each time the run is claimed.
pub type Epoch = u64;

/// One event as it goes on the wire: its sequence number, its `type`, and its JSON, encoded once for every
/// subscriber.
#[derive(Debug, PartialEq, Eq)]
pub struct EncodedEvent {
    pub seq: u64,
    pub kind: &'static str,
    pub json: Box<str>,
}

/// An event encoded once, not yet given its sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEvent {
    pub kind: &'static str,
    pub json: Box<str>,
}

impl NewEvent {
    pub fn encode(event: &StreamEvent) -> Result<Self, serde_json::Error> {
        Ok(Self {
            kind: event.kind(),
            json: serde_json::to_string(event)?.into_boxed_str(),
        })
    }

    /// Its size in the log, for the bounds on what a run may keep.
    pub fn bytes(&self) -> usize {
        self.json.len()
    }
}

/// The `type` of a stored event, as the `&'static str` the wire uses.
pub fn event_kind(stored: &str) -> Option<&'static str> {
    StreamEvent::KINDS
        .iter()
        .copied()
        .find(|kind| *kind == stored)
}

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Waiting,
    Interrupted,
    Done,
    Failed,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Interrupted => "interrupted",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "running" => Self::Running,
            "waiting" => Self::Waiting,
            "interrupted" => Self::Interrupted,
            "done" => Self::Done,
            "failed" => Self::Failed,
            _ => return None,
        })
    }

    /// Whether the run has ended (its log is complete).
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Interrupted | Self::Done | Self::Failed)
    }
}

/// What the store knows about a run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    pub run_id: RunId,
    pub session_id: SessionId,
    pub parent_run_id: Option<RunId>,
    pub mode: ApprovalMode,
    pub state: RunState,
    /// The sequence number of its newest committed event.
    pub last_seq: u64,
    /// Bytes of JSON its committed events take in its log (what [`NewEvent::bytes`] counts).
    pub event_bytes: u64,
    /// Set once someone aborted the run; the first reason sticks.
    pub abort: Option<AbortReason>,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
}

impl RunInfo {
    /// Whether the run, as read, may still add events after `after`: it is unfinished, or its log goes past it.
    pub fn continues_after(&self, after: u64) -> bool {
        !self.state.is_finished() || self.last_seq > after
    }
}

/// A run this instance holds as running, as the store has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRun {
    pub run_id: RunId,
    /// The claim it is held at.
    pub epoch: Epoch,
    /// Set once someone aborted it.
    pub abort: Option<AbortReason>,
}

/// A run about to start.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRun {
    pub run_id: RunId,
    pub session_id: SessionId,
    /// The interrupted run this one resumes. The start takes that run's interrupts for this one, once, in the same
    /// transaction: if the start fails the interrupts stay open, and a second take finds them used
    /// ([`StartConflict::Resume`]).
    pub parent_run_id: Option<RunId>,
    pub mode: ApprovalMode,
    /// The user's message, for listings (empty for a resume).
    pub message: String,
    /// Its first events (`runStarted`).
    pub events: Vec<NewEvent>,
    /// Audit entries kept with the start, or not at all: a resume's, how each interrupt it takes was answered.
    pub audit: Vec<AuditEntry>,
    pub at: u64,
    /// Whether an interrupt the session waits on refuses the run ([`StartConflict::Interrupted`]): the session's
    /// newest interrupted run, not yet resumed, whose interrupts have not expired at `at`. AG-UI's rule: a thread
    /// answers its interrupts before it starts another run. Checked in the start, with the session's claim, so
    /// that no interrupt opens between the check and the start. Only for a run that resumes none
    /// (`parent_run_id` is `None`): a resume answers its parent's interrupts, and its take checks them.
    pub refused_while_interrupted: bool,
}

#[cfg(test)]
impl NewRun {
    /// A run of `session_id` that asks a person for approvals, with `message` and first `events`, started at 1,000
    /// ms and resuming nothing: what the crate's own tests start.
    pub(crate) fn for_tests(
        run_id: RunId,
        session_id: SessionId,
        message: &str,
        events: Vec<NewEvent>,
    ) -> Self {
        Self {
            run_id,
            session_id,
            parent_run_id: None,
            mode: ApprovalMode::Interactive,
            message: message.to_owned(),
            events,
            audit: Vec::new(),
            at: 1_000,
            refused_while_interrupted: false,
        }
    }
}

/// Why a run could not start. A start refused for more than one of these is refused for the first, in the order
/// they are listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartConflict {
    #[error("run id {0} is taken")]
    RunIdTaken(RunId),
    #[error("session {session_id} is busy with run {active}")]
    SessionBusy {
        session_id: SessionId,
        active: RunId,
    },
    /// The interrupts the run would resume are unknown or already used.
    #[error(transparent)]
    Resume(#[from] TakeError),
    /// The session waits for a resume of `waiting` ([`NewRun::refused_while_interrupted`]).
    #[error("session {session_id} waits for a resume of run {waiting}")]
    Interrupted {
        session_id: SessionId,
        waiting: RunId,
    },
}

/// How long a logout is kept past its cookie's expiry, in milliseconds: a day, for the instances whose clocks are
/// behind (see [`Store::log_out`]).
pub const LOGOUT_KEPT_PAST_EXPIRY_MS: u64 = 24 * 60 * 60 * 1000;

/// What the repeated-call guard has counted in a run, kept across the run's batches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepeatCounts {
    /// How often each (tool, canonical arguments) was called.
    pub seen: Vec<((String, String), usize)>,
    pub strikes: usize,
}

/// What a waiting run needs to go on once its batch is settled: the conversation and the batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedBatch {
    /// The conversation up to and including the assistant message that made the batch.
    pub history: Vec<Message>,
    /// How many of `history`'s messages came before this run; the rest are the run's own.
    pub prior: usize,
    /// Whether the run's messages join the session's history when it ends (false: the client owns the
    /// conversation, as AG-UI clients do).
    pub owned_by_session: bool,
    /// The policy the run runs under.
    pub policy: ApprovalPolicy,
    /// The step whose batch this is.
    pub step: u32,
    /// The batch, in the model's order.
    pub calls: Vec<ToolCall>,
    #[serde(default)]
    pub repeat: RepeatCounts,
}

/// Where a tool call of an open batch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Refused before any decision (unknown tool, invalid input, a deny rule, a repeat): its output is set.
    Refused,
    /// The policy allows it: it runs.
    Allowed,
    /// It waits for a person.
    Pending,
    /// A person approved it: it runs.
    Approved,
    /// A person, the timeout or an abort denied it: its output is set.
    Denied,
    /// It is running, on the instance named in the record.
    Executing,
    /// It ran: its output is set.
    Settled,
    /// It was running when its instance died: its effect is unknown, and it is never run again.
    Interrupted,
}

impl CallStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Allowed => "allowed",
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Executing => "executing",
            Self::Settled => "settled",
            Self::Interrupted => "interrupted",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "refused" => Self::Refused,
            "allowed" => Self::Allowed,
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "denied" => Self::Denied,
            "executing" => Self::Executing,
            "settled" => Self::Settled,
            "interrupted" => Self::Interrupted,
            _ => return None,
        })
    }

    /// Whether the call has its output, so that the batch can go on without it changing again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Refused | Self::Denied | Self::Settled | Self::Interrupted
        )
    }

    /// Whether the call is to run and has not started.
    pub fn is_runnable(self) -> bool {
        matches!(self, Self::Allowed | Self::Approved)
    }
}

/// One tool call of a batch, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRecord {
    pub run_id: RunId,
    pub call: ToolCall,
    /// The parsed arguments (valid against the tool's schema for calls that run).
    pub input: Value,
    pub status: CallStatus,
    /// The approval it asked for, when it asked.
    pub approval: Option<ApprovalRequest>,
    pub resolution: Option<Resolution>,
    /// Who decided, from the authentication layer.
    pub decided_by: Option<String>,
    /// The arguments a person edited before approving; they replace `input`.
    pub edited_arguments: Option<Value>,
    pub output: Option<ToolOutput>,
    /// The instance running it, while it runs.
    pub executing_on: Option<InstanceId>,
    /// The digest of the tool's definition when the call was decided, for a tool whose definition may change
    /// while the process runs (an MCP server's): the call runs only under that definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_digest: Option<String>,
    /// What the call acts on (a file) as its card showed it, for a tool whose effect depends on it
    /// ([`crate::tools::Tool::state`]): an approved call runs only while it is still so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_state: Option<String>,
}

impl CallRecord {
    /// A call as a batch opens it.
    pub fn new(run_id: RunId, call: ToolCall, input: Value, status: CallStatus) -> Self {
        Self {
            run_id,
            call,
            input,
            status,
            approval: None,
            resolution: None,
            decided_by: None,
            edited_arguments: None,
            output: None,
            executing_on: None,
            spec_digest: None,
            shown_state: None,
        }
    }

    /// The arguments the call runs with.
    pub fn arguments_to_run(&self) -> &Value {
        self.edited_arguments.as_ref().unwrap_or(&self.input)
    }

    /// The digest of the arguments a person edited, as the audit log names them: none when they are the ones asked
    /// about (sent back unchanged with the approval, as clients do).
    pub fn edited_digest(&self) -> Option<String> {
        self.edited_arguments
            .as_ref()
            .filter(|edited| **edited != self.input)
            .map(crate::interrupts::arguments_digest)
    }
}

/// A batch a running run opens: it becomes `waiting`, and its owner lets go of it.
#[derive(Clone, Debug)]
pub struct OpenBatch {
    pub run_id: RunId,
    pub epoch: Epoch,
    pub batch: SavedBatch,
    /// Every call of the batch, in the model's order.
    pub calls: Vec<CallRecord>,
    /// `approvalRequired` and friends: durable with the pending approvals, before anyone sees them.
    pub events: Vec<NewEvent>,
    pub audit: Vec<AuditEntry>,
}

/// What settles a pending approval: made from the pending call, under the store's guard.
#[derive(Clone, Debug)]
pub struct Settlement {
    pub resolution: Resolution,
    /// `Approved` or `Denied`.
    pub status: CallStatus,
    pub edited_arguments: Option<Value>,
    /// The output, for a denial.
    pub output: Option<ToolOutput>,
    pub events: Vec<NewEvent>,
    pub audit: Vec<AuditEntry>,
    /// The grant an approval for the session makes, kept for the run's session in the decision's own change, so
    /// that whoever sees the decision finds the grant. Only a decision makes one.
    pub grant: Option<StoredGrant>,
    /// The id of the session grant this approval stands on (a card another decision's grant covers): it is settled
    /// only while the run's session still holds that grant, as read in the decision's own change, so that a revoke
    /// that lands first approves nothing more ([`DecideFailure::GrantRevoked`]).
    pub under_grant: Option<String>,
}

/// A decision refused by its check (edited arguments outside the schema, say); the approval stays pending.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Makes the settlement of a pending call, or refuses.
pub type Settle = Box<dyn FnOnce(&CallRecord) -> Result<Settlement, DecideFailure> + Send>;
/// Makes the settlement of each pending call whose time ran out.
pub type SettleExpired = Box<dyn Fn(&CallRecord) -> Settlement + Send + Sync>;

/// Whose pending approvals a listing reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingOf<'a> {
    All,
    Run(&'a RunId),
    /// The runs of one session: what one browser's page shows, read without reading everyone's.
    Session(&'a SessionId),
}

/// Why a pending approval could not be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecideFailure {
    #[error("not pending")]
    NotPending,
    /// The approval's time ran out, though no sweep has settled it yet: it is left for the sweep.
    #[error("expired")]
    Expired,
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The session grant the settlement stands on ([`Settlement::under_grant`]) is no longer held; the approval
    /// stays pending.
    #[error("the session grant it stood on was revoked")]
    GrantRevoked,
}

/// A call an instance took to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Begun {
    pub record: CallRecord,
}

/// A call's result, recorded by the instance that ran it.
#[derive(Clone, Debug)]
pub struct CallResult {
    pub run_id: RunId,
    pub call_id: ToolCallId,
    pub output: ToolOutput,
    pub events: Vec<NewEvent>,
    pub audit: Vec<AuditEntry>,
}

/// A waiting run whose batch is settled, claimed to go on.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub epoch: Epoch,
    pub batch: SavedBatch,
    /// Each call's output, in the model's order.
    pub outputs: Vec<(ToolCall, ToolOutput)>,
    /// The run as the claim left it: running, with the events the claim added, and its abort if it was aborted.
    pub run: RunInfo,
}

/// Under which claim a run's end is made: an end made without it changes nothing ([`Fenced::Lost`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndClaim {
    /// This instance holds the run at this epoch: its task's own end.
    Held(Epoch),
    /// The run has not ended, whoever holds it.
    Unended,
    /// The run is still running under `owner`, an instance found dead, at `epoch`: recovery's end of a dead
    /// instance's run, which must not end it if another instance took it over meanwhile.
    Abandoned { owner: InstanceId, epoch: Epoch },
    /// The run waits, held by nobody: an end that must not take a run another instance claimed meanwhile.
    Waiting,
}

/// How a run ends.
pub struct FinishRun {
    pub run_id: RunId,
    pub claim: EndClaim,
    pub state: RunState,
    /// Messages that join the session's history.
    pub history: Vec<Message>,
    /// The whole conversation, for runs whose client owns it.
    pub conversation: Option<Vec<Message>>,
    /// An AG-UI run's suspension, to be resumed once.
    pub suspension: Option<Suspension>,
    /// The terminal event, last.
    pub events: Vec<NewEvent>,
    pub audit: Vec<AuditEntry>,
    /// How to settle approvals still pending (a run never leaves a card behind).
    pub settle_pending: Option<SettleExpired>,
}

/// What another instance's doorbell tells this one to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteStop {
    /// A run aborted (or taken over from this instance): its tasks and tools here stop, for the reason given.
    Run(RunId, AbortReason),
    /// A call of a waiting run that a recovery, taking this instance for dead, recorded as interrupted: its tool
    /// here stops (what it did from then on would be thrown away). The run's other calls, and whoever claims the
    /// run next (this instance, maybe), go on.
    Call(RunId, ToolCallId),
}

/// Why a fenced write changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fenced {
    #[error("the run is no longer this writer's to change")]
    Lost,
    #[error("the run was aborted")]
    Aborted(AbortReason),
}

/// What aborting a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct Aborted {
    pub run: RunInfo,
    /// The instance sampling it, when it is running: that instance stops its task.
    pub running_on: Option<InstanceId>,
    /// Calls being run right now: their instances stop them.
    pub executing: Vec<(ToolCallId, InstanceId)>,
}

/// Why a suspension could not be taken for a resume.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TakeError {
    #[error("Run {0} issued no interrupts that this server knows of.")]
    UnknownParent(RunId),
    #[error(
        "The interrupts of run {parent} were already resumed by run {by}; a resume is used once."
    )]
    AlreadyUsed { parent: RunId, by: RunId },
}

/// What recovery did with the work of dead instances.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovered {
    /// Runs that were sampling: now failed.
    pub failed_runs: Vec<RunId>,
    /// Calls that were running: now interrupted.
    pub interrupted_calls: Vec<(RunId, ToolCallId)>,
}

/// Makes the terminal events of a run that was sampling when its process died.
pub type RunFailedEvents = Box<dyn Fn(&RunInfo, InterruptsTaken) -> Vec<NewEvent> + Send + Sync>;

/// What became of the interrupts a resume's run took, when its process died before it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptsTaken {
    /// Used: the run was no resume, or it had begun a call, so its answers were acted on.
    Kept,
    /// Given back: the run had begun none of the calls it resumed, so nothing of its answers was acted on, and the
    /// next resume answers the interrupts again (they are open, as before the resume).
    GivenBack,
}

/// How recovery words what it records.
pub struct RecoveryEvents {
    /// The terminal event of a run that was sampling.
    pub run_failed: RunFailedEvents,
    /// The output, events and audit of a call that was running.
    pub call_interrupted: Box<dyn Fn(&CallRecord) -> Settlement + Send + Sync>,
    /// What a run that was sampling added to its session's conversation, from its log (see
    /// [`crate::view::RunView::messages`]), recorded with its end.
    pub history: RecoveredHistory,
}

/// What a recovered run added to its session's conversation, from the view of its log.
pub type RecoveredHistory =
    Box<dyn Fn(&crate::view::RunView) -> Vec<crate::wire::Message> + Send + Sync>;

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Its place in the log, once stored.
    #[serde(default)]
    pub id: u64,
    /// Milliseconds since the Unix epoch.
    pub at: u64,
    pub kind: AuditKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<ToolCallId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// SHA-256 of the call's arguments (canonical JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_digest: Option<String>,
    /// SHA-256 of the arguments a person edited before approving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_digest: Option<String>,
    /// What happened: `requested`, `approved`, `denied`, `timed_out`, `aborted`, ...
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who decided, from the authentication layer: the token, the login, or `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
}

impl AuditEntry {
    /// The most characters of an entry's `reason` the log keeps: a person's reason (at most 2,000) with the words
    /// around it, a refusal's message, a rule's text, what a grant covers. Past it, the text is cut, and ends with
    /// the SHA-256 of the whole (a rule or a grant that long can still be told apart, and checked against its text).
    pub const REASON_CHARS: usize = 4_000;
    /// The most characters of each of its short fields (outcome, tool, source, scope, actor).
    pub const FIELD_CHARS: usize = 256;

    /// The entry as the log keeps it: each text cut to its bound, as a text a client or a model chose (a tool's
    /// name, a refusal that repeats what it refused) could be of any length, and the log keeps every entry for good.
    pub fn bounded(mut self) -> Self {
        if self.fits() {
            return self;
        }
        fn cut(text: &mut String, max: usize) {
            if let Some((at, _)) = text.char_indices().nth(max) {
                text.truncate(at);
                text.pop();
                text.push('…');
            }
        }
        cut(&mut self.outcome, Self::FIELD_CHARS);
        for text in [
            &mut self.tool,
            &mut self.source,
            &mut self.scope,
            &mut self.actor,
        ]
        .into_iter()
        .flatten()
        {
            cut(text, Self::FIELD_CHARS);
        }
        if let Some(reason) = &mut self.reason
            && reason.chars().nth(Self::REASON_CHARS).is_some()
        {
            use sha2::Digest as _;
            let whole = format!(
                "… (cut: the whole is {} characters, SHA-256 {})",
                reason.chars().count(),
                hex::encode(sha2::Sha256::digest(reason.as_bytes()))
            );
            let keep = Self::REASON_CHARS - whole.chars().count();
            if let Some((at, _)) = reason.char_indices().nth(keep) {
                reason.truncate(at);
            }
            reason.push_str(&whole);
        }
        self
    }

    /// Whether every text of the entry is within its bound (as nearly every entry is: the bound is checked by bytes
    /// first, which are never fewer than characters).
    pub fn fits(&self) -> bool {
        let within = |text: &str, max: usize| text.len() <= max || text.chars().count() <= max;
        within(&self.outcome, Self::FIELD_CHARS)
            && [&self.tool, &self.source, &self.scope, &self.actor]
                .into_iter()
                .flatten()
                .all(|text| within(text, Self::FIELD_CHARS))
            && self
                .reason
                .as_deref()
                .is_none_or(|reason| within(reason, Self::REASON_CHARS))
    }

    /// An entry of `kind` with `outcome`, stamped now, that names nothing else yet: each field is set where it is
    /// known.
    pub fn new(kind: AuditKind, outcome: impl Into<String>) -> Self {
        Self {
            id: 0,
            at: crate::clock::now_ms(),
            kind,
            session_id: None,
            run_id: None,
            tool_call_id: None,
            tool: None,
            arguments_digest: None,
            edited_digest: None,
            outcome: outcome.into(),
            source: None,
            scope: None,
            reason: None,
            actor: None,
        }
    }
}

/// What an audit entry is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AuditKind {
    /// A call asked for approval (or an AG-UI interrupt was issued).
    ApprovalRequested,
    /// A pending approval ended: decided, timed out, aborted.
    ApprovalResolved,
    /// A call that was running when its process died: its effect is unknown.
    CallInterrupted,
    /// A call a decision let run that was not run when its turn came: its file or its tool changed since, or a
    /// `deny` rule added meanwhile forbids it (source `policy`), or its run was aborted first (source `abort`).
    CallRefused,
    /// An AG-UI resume was refused.
    ResumeRefused,
    /// A session grant was revoked.
    GrantRevoked,
    /// A rule was added or removed.
    RuleChanged,
    /// A kind this version does not know, as the log holds it: an entry of a newer version's, read back. The audit
    /// view shows it as it is rather than failing, or leaving out a line of the log.
    Unknown(Box<str>),
}

impl AuditKind {
    pub fn as_str(&self) -> &str {
        match self {
            Self::ApprovalRequested => "approval_requested",
            Self::ApprovalResolved => "approval_resolved",
            Self::CallInterrupted => "call_interrupted",
            Self::CallRefused => "call_refused",
            Self::ResumeRefused => "resume_refused",
            Self::GrantRevoked => "grant_revoked",
            Self::RuleChanged => "rule_changed",
            Self::Unknown(kind) => kind,
        }
    }

    /// The kind `value` names; one this version does not know is [`AuditKind::Unknown`].
    pub fn parse(value: &str) -> Self {
        match value {
            "approval_requested" => Self::ApprovalRequested,
            "approval_resolved" => Self::ApprovalResolved,
            "call_interrupted" => Self::CallInterrupted,
            "call_refused" => Self::CallRefused,
            "resume_refused" => Self::ResumeRefused,
            "grant_revoked" => Self::GrantRevoked,
            "rule_changed" => Self::RuleChanged,
            unknown => Self::Unknown(unknown.into()),
        }
    }
}

/// As its name (`approval_requested`, ...).
impl Serialize for AuditKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AuditKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::parse(&String::deserialize(deserializer)?))
    }
}

/// Which audit entries to read, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditQuery {
    pub session_id: Option<SessionId>,
    /// Only entries of one of these sessions, or of none (a rule added or removed): what one browser may see of the
    /// log, read as one query however many entries of other sessions there are.
    pub sessions_or_none: Option<Vec<SessionId>>,
    pub run_id: Option<RunId>,
    pub tool: Option<String>,
    pub outcome: Option<String>,
    /// Milliseconds since the Unix epoch, inclusive.
    pub since: Option<u64>,
    /// Milliseconds since the Unix epoch, exclusive.
    pub until: Option<u64>,
    /// Entries after this id (the page before ended there).
    pub after_id: Option<u64>,
    /// Entries before this id (the page before, read newest first, ended there).
    pub before_id: Option<u64>,
    /// The newest entries first, instead of the oldest: for a view of what happened last.
    pub newest_first: bool,
    pub limit: usize,
}

impl AuditQuery {
    pub fn matches(&self, entry: &AuditEntry) -> bool {
        self.session_id
            .as_ref()
            .is_none_or(|s| entry.session_id.as_ref() == Some(s))
            && self.sessions_or_none.as_ref().is_none_or(|sessions| {
                entry
                    .session_id
                    .as_ref()
                    .is_none_or(|s| sessions.contains(s))
            })
            && self
                .run_id
                .as_ref()
                .is_none_or(|r| entry.run_id.as_ref() == Some(r))
            && self
                .tool
                .as_ref()
                .is_none_or(|t| entry.tool.as_ref() == Some(t))
            && self.outcome.as_ref().is_none_or(|o| &entry.outcome == o)
            && self.since.is_none_or(|since| entry.at >= since)
            && self.until.is_none_or(|until| entry.at < until)
            && self.after_id.is_none_or(|after| entry.id > after)
            && self.before_id.is_none_or(|before| entry.id < before)
    }
}

/// A session's title: its first message, on one line, shortened.
pub fn title_of(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default().trim();
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    title
}

/// How much a store holds, for the bounds on what clients can make it hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub unfinished_runs: u64,
    pub sessions: u64,
}

/// A session, as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    pub session_id: SessionId,
    /// The first user message, shortened: a title a person recognises.
    pub title: String,
    pub created_at: u64,
    pub updated_at: u64,
    pub runs: u64,
}

/// A grant a person gave a session, stored as the policy serialises it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredGrant {
    pub id: String,
    pub grant: Value,
    pub created_at: u64,
}

/// A rule a person added ("Always allow"), stored as its text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRule {
    pub id: String,
    pub rule: String,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// How much the store keeps: finished runs go, oldest first, past their age or past the size of the event log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionLimits {
    /// Milliseconds a finished run (and its events) is kept.
    pub max_age_ms: u64,
    /// Bytes of event log kept over all runs.
    pub max_event_bytes: u64,
}

/// Something the store could not do. The state it guards is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("the database holds something this toolgate cannot read: {0}")]
    Corrupt(String),
}

/// Whether an event of this `type` ends its run.
pub fn is_terminal(kind: &str) -> bool {
    matches!(kind, "done" | "interrupted" | "error")
}

/// How many events one read of a run's log takes.
pub const PAGE_EVENTS: usize = 512;

/// Every event of a run's log, decoded, in order (an event that does not decode is left out), page by page.
pub async fn all_events(
    store: &dyn Store,
    run_id: &RunId,
) -> StoreResult<Vec<crate::wire::RunEvent>> {
    let mut decoded = Vec::new();
    let mut cursor = 0;
    loop {
        let page = store.events_after(run_id, cursor, PAGE_EVENTS).await?;
        let Some(last) = page.last() else {
            return Ok(decoded);
        };
        cursor = last.seq;
        // Nothing follows a run's end; a shorter page than asked for may be cut by its size, not by the log's end.
        let ended = is_terminal(last.kind);
        decoded.extend(page.iter().filter_map(|encoded| {
            serde_json::from_str(&encoded.json)
                .map(|event| crate::wire::RunEvent {
                    seq: encoded.seq,
                    event,
                })
                .ok()
        }));
        if ended {
            return Ok(decoded);
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;
pub type StoreFuture<'a, T> = BoxFuture<'a, StoreResult<T>>;

/// How many bytes of events (their kinds and JSON) one page of [`Store::events_after`] holds at most: what one read
/// of a run's log keeps in memory. A single event may be larger (an MCP tool's result is kept up to 64 MiB), and a
/// page then is that event alone.
pub const PAGE_BYTES: usize = 4 << 20;

/// The page that `events`, in their order, make: at most `limit` of them, within [`PAGE_BYTES`], or the first alone.
pub(crate) fn page_of<'e>(
    events: impl IntoIterator<Item = &'e Arc<EncodedEvent>>,
    limit: usize,
) -> Vec<Arc<EncodedEvent>> {
    let events = events.into_iter().take(limit);
    // As many as there are, as a collect would make it: a page is mostly small events, and all of them.
    let mut page: Vec<Arc<EncodedEvent>> = Vec::with_capacity(events.size_hint().0);
    let mut bytes = 0;
    for event in events {
        bytes += event.kind.len() + event.json.len();
        if bytes > PAGE_BYTES && !page.is_empty() {
            break;
        }
        page.push(Arc::clone(event));
    }
    page
}

/// The store. Object-safe: the harness holds an `Arc<dyn Store>`.
pub trait Store: Send + Sync + 'static {
    fn kind(&self) -> StoreKind;

    /// This process, as the store knows it.
    fn instance(&self) -> &InstanceId;

    // ---- runs and their logs

    /// Creates the run (owned by this instance, epoch 1) and its session when new, claims the session (one run at
    /// a time), and appends the run's first events.
    fn start_run(&self, run: NewRun) -> StoreFuture<'_, Result<Epoch, StartConflict>>;

    /// Appends events to a running run this instance owns at `epoch`, after everything it appended before.
    /// Returns at once; the events become readable once durable. A writer that lost the run appends nothing.
    fn append(&self, run_id: &RunId, epoch: Epoch, events: Vec<NewEvent>);

    /// Waits until everything appended so far is durable (or dropped as fenced).
    fn flush(&self) -> StoreFuture<'_, ()>;

    /// Flushes, and tells other instances this one is gone (so that they take its work over at once).
    fn close(&self) -> StoreFuture<'_, ()>;

    /// What other instances tell this one to stop: runs they aborted that this one may be working on, and calls a
    /// recovery recorded as interrupted that this one, taken for dead, may still run.
    fn remote_stops(&self) -> tokio::sync::broadcast::Receiver<RemoteStop>;

    /// Opens a batch: the run becomes `waiting`, its calls and their approvals are stored with their events.
    fn open_batch(&self, batch: OpenBatch) -> StoreFuture<'_, Result<(), Fenced>>;

    /// Settles one pending approval with what `settle` makes of it. Exactly once: only a pending call passes, and
    /// only while its run is not aborted (an abort settles every call it can read; one it cannot is left for no
    /// decision).
    fn decide(
        &self,
        run_id: &RunId,
        call_id: &ToolCallId,
        settle: Settle,
    ) -> StoreFuture<'_, Result<CallRecord, DecideFailure>>;

    /// Settles every pending approval whose time is up at `now_ms` (as `settle` says) and returns them. One this
    /// version cannot read (a row of a newer version's, or damaged) is left pending, and logged: it keeps no other
    /// approval from timing out. One of an aborted run (its abort could not read it) is left to the run's claim,
    /// which settles it as the abort would have. A run whose expiry cannot be written is left due, for the next
    /// sweep; the others are settled and returned all the same (an error only when nothing was).
    fn expire(&self, now_ms: u64, settle: SettleExpired) -> StoreFuture<'_, Vec<CallRecord>>;

    /// The earliest expiry among pending approvals later than `after_ms`, to know when to look again (0: all of
    /// them), not counting what an abort left (it does not expire). A sweeper whose sweep at `after_ms` left
    /// approvals it cannot read pending asks past it, so that they are not due again at once.
    fn next_expiry(&self, after_ms: u64) -> StoreFuture<'_, Option<u64>>;

    /// Takes a call to run on this instance: allowed or approved, not started. `None` when someone else took it,
    /// it is no longer to run (its run aborted, say), or this instance's lease ran out (another may have taken its
    /// work over). A call of a running run's own batch (`inline`) is inserted as it begins, only while this
    /// instance holds the run at that epoch and nobody aborted it (checked in the same transaction: a partitioned
    /// old owner never runs a call of a run taken over, and a run aborted before its task heard of it runs nothing
    /// more); it replaces a finished call of an earlier batch with the same id (ids are the
    /// model's), never one of its own batch.
    fn begin_call(
        &self,
        run_id: &RunId,
        call_id: &ToolCallId,
        inline: Option<(CallRecord, Epoch)>,
    ) -> StoreFuture<'_, Option<CallRecord>>;

    /// Records a call's output, if this instance still runs it (recovery may have declared it interrupted).
    fn settle_call(&self, result: CallResult) -> StoreFuture<'_, bool>;

    /// Claims a waiting run whose every call is settled, to sample on, with the run as the claim left it (read in the
    /// claim itself: a read after it could fail and leave the run claimed with nobody to go on with it). `None` when
    /// the batch is not settled or somebody else claimed it. [`StoreError::Corrupt`], with nothing changed, when what it would read does not
    /// read.
    ///
    /// An abort settles the run's calls still to run or to decide with it, except those the aborting instance
    /// could not read (a newer version's, on a shared database). Once no call of an aborted run runs, its claim
    /// settles those with `left_by_abort` (the abort's settlement) in its own change, or is refused with
    /// [`StoreError::Corrupt`] when it cannot read one either.
    fn claim_batch(
        &self,
        run_id: &RunId,
        left_by_abort: SettleExpired,
    ) -> StoreFuture<'_, Option<Claimed>>;

    /// Ends a run: its terminal event last, the session free again, nothing left pending.
    fn finish_run(&self, finish: FinishRun) -> StoreFuture<'_, Result<(), Fenced>>;

    /// Marks a run aborted (the first reason sticks), denies what it has pending with `settle`, and tells who
    /// must stop what.
    fn abort_run(
        &self,
        run_id: &RunId,
        reason: AbortReason,
        settle: SettleExpired,
    ) -> StoreFuture<'_, Option<Aborted>>;

    /// Fails the runs and interrupts the calls of dead instances: for SQLite, whoever held the file before this
    /// process; for PostgreSQL, instances whose heartbeat stopped (on the database's clock).
    fn recover(&self, events: RecoveryEvents) -> StoreFuture<'_, Recovered>;

    // ---- AG-UI suspensions

    /// The suspension an interrupted run left, and the run that resumed it, if one did. What was issued never
    /// changes; only its use does.
    fn interrupt(&self, parent: &RunId) -> StoreFuture<'_, Option<(Suspension, Option<RunId>)>>;

    /// The session's newest suspension not yet resumed, with its expiry (milliseconds since the Unix epoch).
    fn open_interrupt(&self, session_id: &SessionId) -> StoreFuture<'_, Option<(RunId, u64)>>;

    // ---- reading

    fn run(&self, run_id: &RunId) -> StoreFuture<'_, Option<RunInfo>>;

    /// Committed events after `after`, at most `limit` and [`PAGE_BYTES`], or the first alone when it is larger (a
    /// page may end before the log does: read on from its last event until a page is empty).
    fn events_after(
        &self,
        run_id: &RunId,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Arc<EncodedEvent>>>;

    /// After [`Store::events_after`] found nothing after `after`: whether the run may still add events after it
    /// (it is there, and unfinished or its log goes past `after`). `false` tells a reader it has read the whole log.
    fn continues_after(&self, run_id: &RunId, after: u64) -> StoreFuture<'_, bool> {
        let run_id = run_id.clone();
        Box::pin(async move {
            Ok(self
                .run(&run_id)
                .await?
                .is_some_and(|info| info.continues_after(after)))
        })
    }

    /// Changes when the run's log or state changes (the newest sequence number).
    fn watch_run(&self, run_id: &RunId) -> watch::Receiver<u64>;

    /// Changes when a run starts in the session.
    fn watch_session(&self, session_id: &SessionId) -> watch::Receiver<u64>;

    /// The session's runs, oldest first, the newest `limit`.
    fn session_runs(&self, session_id: &SessionId, limit: usize) -> StoreFuture<'_, Vec<RunId>>;

    /// The session's conversation.
    fn history(&self, session_id: &SessionId) -> StoreFuture<'_, Vec<Message>>;

    /// Sessions, most recently used first.
    fn sessions(&self, limit: usize) -> StoreFuture<'_, Vec<SessionSummary>>;

    /// The summaries of the sessions among `ids` that exist, most recently updated first.
    fn sessions_among(&self, ids: &[SessionId]) -> StoreFuture<'_, Vec<SessionSummary>>;

    /// Pending approvals, of one run or of all, oldest first.
    fn pending(&self, of: PendingOf<'_>) -> StoreFuture<'_, Vec<ApprovalRequest>>;

    /// A call of a run.
    fn call(&self, run_id: &RunId, call_id: &ToolCallId) -> StoreFuture<'_, Option<CallRecord>>;

    /// The calls of a run's open batch, in the model's order.
    fn calls(&self, run_id: &RunId) -> StoreFuture<'_, Vec<CallRecord>>;

    /// Runs that have not ended.
    fn unfinished_runs(&self) -> StoreFuture<'_, Vec<RunId>>;

    /// The runs this instance holds as running: what its tasks should be working on.
    fn held_runs(&self) -> StoreFuture<'_, Vec<HeldRun>>;

    /// How much the store holds: runs not ended, and sessions.
    fn counts(&self) -> StoreFuture<'_, Counts>;

    /// Waiting runs that may have work no instance is doing: calls to run, a settled batch to claim, or an abort
    /// that should end them.
    fn stalled_runs(&self) -> StoreFuture<'_, Vec<RunId>>;

    /// The conversation of a run whose client owns it, once it ended; shared with the store where it keeps it.
    fn conversation(&self, run_id: &RunId) -> StoreFuture<'_, Option<Arc<[Message]>>>;

    // ---- grants, rules, audit

    fn grants(&self, session_id: &SessionId) -> StoreFuture<'_, Vec<StoredGrant>>;
    /// Keeps `grant`, made by a person's answer in the resume `run_id`, for the run's session, while the run is
    /// still this instance's at `epoch` (in the grant's own change: a recovery that fenced the run finds no grant
    /// made after the fence, and one made before it is there when the recovery looks).
    fn add_grant(
        &self,
        run_id: &RunId,
        epoch: Epoch,
        grant: StoredGrant,
    ) -> StoreFuture<'_, Result<(), Fenced>>;
    /// Whether it existed.
    fn revoke_grant(
        &self,
        session_id: &SessionId,
        grant_id: &str,
        audit: AuditEntry,
    ) -> StoreFuture<'_, bool>;

    fn rules(&self) -> StoreFuture<'_, Vec<StoredRule>>;
    /// Keeps `rule` and its audit line, unless a rule of its id is kept with the same text already: then neither,
    /// and `false` (two instances that add the same rule at once keep one rule and one audit line, once every
    /// instance runs a version that adds so). A row of its id with another text (one that did not read as a rule) is
    /// replaced.
    fn add_rule(&self, rule: StoredRule, audit: AuditEntry) -> StoreFuture<'_, bool>;
    /// Whether it existed.
    fn remove_rule(&self, rule_id: &str, audit: AuditEntry) -> StoreFuture<'_, bool>;

    fn audit(&self, entry: AuditEntry) -> StoreFuture<'_, ()>;
    fn audit_log(&self, query: AuditQuery) -> StoreFuture<'_, Vec<AuditEntry>>;

    // ---- logins

    /// Keeps that a browser's login (its login cookie's id) was logged out, until `expires_at` (milliseconds since
    /// the Unix epoch), when its cookie is refused anyway: every instance that shares the store refuses it from
    /// now on. Logouts a day past their expiry go (a day: an instance whose clock is behind still honours the
    /// cookie a while).
    fn log_out(&self, login: &str, expires_at: u64) -> StoreFuture<'_, ()>;
    /// Whether a login was logged out.
    fn logged_out(&self, login: &str) -> StoreFuture<'_, bool>;

    /// Forgets finished runs past the limits. Returns how many went.
    fn prune(&self, limits: RetentionLimits, now_ms: u64) -> StoreFuture<'_, usize>;
}
