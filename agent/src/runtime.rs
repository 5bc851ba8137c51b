//! The tool runtime: one tool call from the model's request to the output the model reads back.
//!
//! A call is first *prepared* (tool found, arguments parsed and checked against the schema, permission decided),
//! with no side effect but events; then, when it may run, *executed*. The loop prepares a whole batch before any of
//! it runs, so fail-closed mode refuses a batch before anything in it runs.
//!
//! | approval mode | decision | result |
//! | --- | --- | --- |
//! | `fail_closed` | ask | the run fails with an approval-required error |
//! | `interactive` | ask | the batch opens in the store; a decision, the timeout or an abort settles the call |
//! | `interrupt` | ask | the run ends with the call set aside for a later resume |
//! | any | deny | a recoverable `PERMISSION_DENIED` output; no approval is asked |
//! | any | allow | executes |
//!
//! Every execution is recorded in the store as it begins and as it ends ([`execute`]): a call runs at most once,
//! and a call whose process died while it ran is known as interrupted, never run again.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::events::{AgentEvent, EventSink};
use crate::ids::{RunId, SessionId};
use crate::permissions::SessionGrant;
use crate::policy::{PermissionPolicy, SessionGrants, session_grant, stored_grant};
use crate::store::{CallRecord, CallResult, CallStatus, Epoch, NewEvent, Store};
use crate::tools::{RegisteredTool, ToolContext, ToolError, Toolbox, unknown_tool_message};
use crate::wire::{
    ApprovalMode, DecisionScope, PermissionDecision, RunErrorCode, ToolCall, ToolErrorCode,
    ToolOutput, approval_denied_message,
};

/// Why a run was aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// Someone cancelled it.
    Cancelled,
    /// The client of a streamed run went away.
    Disconnected,
    /// The server is shutting down.
    Shutdown,
    /// The run produced more events than a run may keep.
    EventLimit,
    /// Another instance took the run over, judging this one dead (it was only late): nothing more of it runs here,
    /// not even a call that was about to begin, which the other recorded as interrupted.
    TakenOver,
}

impl AbortReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::Disconnected => "disconnected",
            Self::Shutdown => "shutdown",
            Self::EventLimit => "event_limit",
            Self::TakenOver => "taken_over",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "cancelled" => Self::Cancelled,
            "disconnected" => Self::Disconnected,
            "shutdown" => Self::Shutdown,
            "event_limit" => Self::EventLimit,
            "taken_over" => Self::TakenOver,
            _ => return None,
        })
    }

    /// Whether a call of the run that was about to begin goes on once the run is aborted for this reason: only
    /// for a shutdown, which stops this process, not the run (a durable store keeps it for the next start), so the
    /// call goes on as it would have, its tool told of the shutdown as any running tool is. Not when another
    /// instance took the run over: it recorded the call as interrupted, never to run.
    pub fn lets_a_call_begin(self) -> bool {
        self == Self::Shutdown
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::Cancelled => "The run was cancelled.",
            Self::Disconnected => "The client disconnected, so the run was aborted.",
            Self::Shutdown => "The server is shutting down, so the run was aborted.",
            Self::EventLimit => {
                "The run produced more events than a run may keep, so it was aborted."
            }
            Self::TakenOver => {
                "Another instance took this run over, judging this one stopped, so it stopped here."
            }
        }
    }

    pub fn code(self) -> RunErrorCode {
        match self {
            Self::Shutdown => RunErrorCode::Shutdown,
            Self::EventLimit => RunErrorCode::EventLimit,
            Self::TakenOver => RunErrorCode::Restarted,
            Self::Cancelled | Self::Disconnected => RunErrorCode::Aborted,
        }
    }
}

/// A run's abort switch: a cancellation token and the first reason given.
#[derive(Clone, Debug, Default)]
pub struct RunAbort {
    token: CancellationToken,
    reason: Arc<OnceLock<AbortReason>>,
    /// The reason of the switch this one is part of ([`RunAbort::part`]), which aborts this one too.
    whole: Option<Arc<OnceLock<AbortReason>>>,
}

impl RunAbort {
    pub fn new() -> Self {
        Self::default()
    }

    /// A switch for a part of what this one stops (one call of the run): aborting this one aborts the part, with
    /// this one's reason; aborting the part alone leaves this one, and the run's other parts, going.
    pub fn part(&self) -> Self {
        Self {
            token: self.token.child_token(),
            reason: Arc::default(),
            whole: Some(Arc::clone(&self.reason)),
        }
    }

    /// Aborts the run; the first reason sticks (for a part, the whole's, when the whole was aborted first).
    pub fn abort(&self, reason: AbortReason) {
        if !self.token.is_cancelled() {
            let _ = self.reason.set(reason);
        }
        self.token.cancel();
    }

    pub fn is_aborted(&self) -> bool {
        self.token.is_cancelled()
    }

    pub fn reason(&self) -> AbortReason {
        self.reason
            .get()
            .or_else(|| self.whole.as_ref()?.get())
            .copied()
            .unwrap_or(AbortReason::Cancelled)
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether `other` is this very switch (a clone of it), not another one.
    pub fn is(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.reason, &other.reason)
    }

    pub async fn aborted(&self) {
        self.token.cancelled().await;
    }
}

/// Why a run ended without a final answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error(
        "{tool_name} needs approval ({reason}), and this run has no way to ask a person (approval mode fail_closed). Use the streaming API, or change the policy or rules."
    )]
    ApprovalRequired { tool_name: String, reason: String },
    #[error("the run stopped after {max_steps} steps without a final answer")]
    StepLimit { max_steps: u32 },
    #[error("the model kept repeating the same call to {tool_name}, so the run was stopped")]
    RepeatedCall { tool_name: String },
    #[error("{}", reason.message())]
    Aborted { reason: AbortReason },
    #[error("{0}")]
    Model(String),
    /// The store could not record the run's progress, or read what it saved of it.
    #[error("{0}")]
    Store(String),
    /// Another instance took the run over (this one was presumed dead): this one must stop writing.
    #[error("the run was taken over by another instance")]
    Lost,
}

impl RunError {
    pub fn code(&self) -> RunErrorCode {
        match self {
            Self::ApprovalRequired { .. } => RunErrorCode::ApprovalRequired,
            Self::StepLimit { .. } => RunErrorCode::StepLimit,
            Self::RepeatedCall { .. } => RunErrorCode::RepeatedCall,
            Self::Aborted { reason } => reason.code(),
            Self::Model(_) => RunErrorCode::Model,
            Self::Store(_) => RunErrorCode::Store,
            Self::Lost => RunErrorCode::Restarted,
        }
    }
}

/// Everything the runtime needs to know about the run a call belongs to.
#[derive(Clone)]
pub struct RunContext {
    pub run_id: RunId,
    pub session_id: SessionId,
    pub approval_mode: ApprovalMode,
    pub permissions: PermissionPolicy,
    /// What people approved for the session: as the store held it before this step's calls were decided (see
    /// [`RunContext::refresh_permissions`]), and what this part granted since (an AG-UI resume approving for the
    /// session).
    pub grants: Arc<parking_lot::RwLock<SessionGrants>>,
    pub approval_timeout: Duration,
    pub toolbox: Arc<Toolbox>,
    pub abort: RunAbort,
    /// Where the run's streaming events go (the store's log of the run, through its owner's epoch).
    pub events: Arc<dyn EventSink>,
    pub store: Arc<dyn Store>,
    /// The claim this process holds on the run while it samples (0 when it only runs a waiting run's calls).
    pub epoch: Epoch,
}

impl RunContext {
    pub fn emit(&self, event: AgentEvent) {
        self.events.emit(event);
    }

    /// The session's grants as this part of the run knows them.
    pub fn grants(&self) -> parking_lot::RwLockReadGuard<'_, SessionGrants> {
        self.grants.read()
    }

    /// Reads the session's grants, and the rules people added, again before a step's calls are decided: a grant
    /// revoked or a rule removed since (on any instance sharing the store) no longer allows, and one given or added
    /// elsewhere applies. When the store cannot say, the run holds no grant (what one would have allowed asks, which
    /// is safe) and the rules read last stay in force (see [`RuleBook::reread_shared`]).
    ///
    /// [`RuleBook::reread_shared`]: crate::policy::RuleBook::reread_shared
    pub async fn refresh_permissions(&self) {
        self.permissions.rule_book().reread_shared().await;
        let grants = match self.store.grants(&self.session_id).await {
            Ok(stored) => SessionGrants::from_stored(&stored),
            Err(error) => {
                tracing::warn!(%error, run_id = %self.run_id, "cannot read the session's grants; what they cover will ask");
                SessionGrants::default()
            }
        };
        *self.grants.write() = grants;
    }

    /// The decision for a call of `spec` with `input`.
    pub fn decide(&self, spec: &crate::wire::ToolSpec, input: &Value) -> PermissionDecision {
        self.permissions.decide(spec, input, &self.grants())
    }
}

/// A call that has been checked and decided, not yet run.
pub enum PreparedCall {
    /// Refused before any decision was needed: the output goes straight to the model.
    Refused { call: ToolCall, output: ToolOutput },
    /// Valid input and a permission decision.
    Decided {
        call: ToolCall,
        input: Value,
        permission: PermissionDecision,
        /// The tool as it was when the call was decided: its definition is the one the call is recorded with
        /// (an MCP server may change its tools at any moment).
        tool: Arc<RegisteredTool>,
    },
}

impl PreparedCall {
    pub fn call(&self) -> &ToolCall {
        match self {
            Self::Refused { call, .. } | Self::Decided { call, .. } => call,
        }
    }

    /// The reason, when the policy asks before this call runs.
    pub fn asks(&self) -> Option<&str> {
        match self {
            Self::Decided {
                permission: PermissionDecision::Ask { reason },
                ..
            } => Some(reason),
            _ => None,
        }
    }
}

/// Finds the tool, parses and validates the arguments and decides the permission; emits the `toolCall` event.
pub fn prepare_call(call: &ToolCall, step: u32, context: &RunContext) -> PreparedCall {
    let decided = |permission: PermissionDecision, arguments: Value| {
        context.emit(AgentEvent::ToolCallDecided {
            step,
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            arguments,
            permission,
        });
    };
    let refused = |output: ToolOutput| PreparedCall::Refused {
        call: call.clone(),
        output,
    };

    // Looked up once: the decision, the checks and the record are all of one definition.
    let Some(tool) = context.toolbox.lookup(&call.name) else {
        let message = unknown_tool_message(&call.name, &context.toolbox);
        decided(
            PermissionDecision::Deny {
                reason: message.clone(),
            },
            call.arguments_value(),
        );
        return refused(ToolOutput::error(ToolErrorCode::UnknownTool, message));
    };
    let arguments = call.arguments_json();
    // Rules read the arguments: the decision waits for them.
    let input = match arguments {
        Ok(input) => input,
        Err(error) => {
            let raw = call.arguments_value();
            decided(context.decide(tool.spec(), &raw), raw);
            return refused(ToolOutput::error(
                ToolErrorCode::InvalidArguments,
                format!(
                    "The arguments for {} are not valid JSON ({error}). Send a JSON object.",
                    call.name
                ),
            ));
        }
    };
    let permission = context.decide(tool.spec(), &input);
    decided(permission.clone(), input.clone());
    if let Err(error) = tool.validate(&input) {
        return refused(error.into());
    }
    if let PermissionDecision::Deny { reason } = &permission {
        return refused(ToolOutput::error(
            ToolErrorCode::PermissionDenied,
            reason.clone(),
        ));
    }
    PreparedCall::Decided {
        call: call.clone(),
        input,
        permission,
        tool,
    }
}

/// Encodes an event of a run for the store, once.
pub fn encode(run_id: &RunId, event: AgentEvent) -> Vec<NewEvent> {
    event
        .project(run_id, now_ms())
        .iter()
        .filter_map(|event| match NewEvent::encode(event) {
            Ok(encoded) => Some(encoded),
            Err(error) => {
                tracing::error!(%run_id, %error, "an event could not be encoded");
                None
            }
        })
        .collect()
}

/// The `toolResult` of a call, encoded.
pub fn tool_result(
    run_id: &RunId,
    call: &ToolCall,
    executed_arguments: Option<Value>,
    output: ToolOutput,
    elapsed: Duration,
) -> Vec<NewEvent> {
    encode(
        run_id,
        AgentEvent::ToolFinished {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            executed_arguments,
            output,
            elapsed,
        },
    )
}

/// How long a tool may take to end after its run is aborted before the run stops waiting for it.
pub const TOOL_ABORT_GRACE: Duration = Duration::from_secs(2);

/// What the model reads when a person edited its call's arguments before approving it.
pub const EDITED_NOTE: &str = "A person edited the arguments of this call before approving it; it ran with editedArguments, not with yours.";

/// What the model reads after the error of a call a person edited before approving it: the error is the edited
/// call's, not its own.
fn edited_error_note(edited: &Value) -> String {
    format!(
        "(A person edited the arguments of this call before approving it, to {edited}: this is the result of the edited call, not of yours.)"
    )
}

/// Runs a call that may run and records it in the store: taken (`begin_call`) before it starts, settled with its
/// `toolResult` when it ends. `inline` is the record of a call of a running run's own batch (inserted as it
/// begins); without it, the call is one of a waiting run's batch, allowed or approved already.
///
/// Returns `None` when the call is not this caller's to run: somebody else took it, or it is no longer to run.
/// Arguments a person edited replace the model's; they are checked against the tool's schema again, because
/// nothing runs unchecked. A tool that is running when the run aborts is asked to stop (its cancellation token)
/// and reports what really happened.
pub async fn execute(
    context: &RunContext,
    call_id: &crate::ids::ToolCallId,
    inline: Option<(CallRecord, Epoch)>,
) -> Result<Option<ToolOutput>, RunError> {
    // A call of a waiting batch may run long after it was decided (after its approval, or at the next start); one of
    // the running batch was decided moments ago, under these rules, unless a person decided it (an AG-UI resume).
    let decided_earlier = inline.is_none();
    let begun = context
        .store
        .begin_call(&context.run_id, call_id, inline)
        .await
        .map_err(|error| RunError::Store(error.to_string()))?;
    let Some(record) = begun else {
        return Ok(None);
    };
    let call = &record.call;
    // The arguments asked about, sent back unchanged with the approval (as clients do), are no edit.
    let edited = record
        .edited_arguments
        .clone()
        .filter(|edited| *edited != record.input);
    let started = Instant::now();
    // Looked up once: the definition checked is the one that runs and bounds what the model reads, whatever the
    // tool's server changes meanwhile.
    let tool = context.toolbox.lookup(&call.name);
    // From the look at what the card showed to the tool's end, the files the call names are this call's alone (see
    // `FileLocks`); an abort while it waits for them leaves the call not run.
    // `ran`: the tool was called (with the edited arguments, if any), not refused before it.
    let (output, aborted_before_it_ran, ran) =
        match FileLocks::of(&record, tool.as_deref(), edited.as_ref())
            .take(context)
            .await
        {
            None => (
                ToolOutput::error(
                    ToolErrorCode::ApprovalDenied,
                    approval_denied_message(crate::approvals::ABORTED_BEFORE_IT_RAN),
                ),
                true,
                false,
            ),
            Some(_acting) => {
                let output = match (&tool, &edited) {
                    _ if let Some(refused) = changed_since_decided(tool.as_deref(), &record) => {
                        Err(refused)
                    }
                    (None, _) => Err(ToolOutput::error(
                        ToolErrorCode::UnknownTool,
                        unknown_tool_message(&call.name, &context.toolbox),
                    )),
                    // An edit that acts on what the card showed (the same file) was made looking at it as it was: if it
                    // changed since, the edit was for something else too.
                    (Some(tool), Some(edited))
                        if let Some(refused) = same_path(edited, &record.input)
                            .then(|| changed_since_shown(tool, &record))
                            .flatten() =>
                    {
                        Err(refused)
                    }
                    (Some(tool), Some(edited)) => match tool.validate(edited) {
                        Err(error) => Err(ToolOutput::from(error)),
                        Ok(()) => match denied_by_rule(context, tool, edited) {
                            Some(refused) => Err(refused),
                            None => Ok((tool, edited.clone())),
                        },
                    },
                    (Some(tool), None) => match changed_since_shown(tool, &record) {
                        Some(refused) => Err(refused),
                        // A call decided earlier may have waited for hours: a deny rule added meanwhile beats its
                        // approval, or the rule that allowed it, as it would have beaten the call.
                        None => match (decided_earlier || record.resolution.is_some())
                            .then(|| denied_by_rule(context, tool, &record.input))
                            .flatten()
                        {
                            Some(refused) => Err(refused),
                            None => Ok((tool, record.input.clone())),
                        },
                    },
                };
                match output {
                    Err(refused) => (refused, false, false),
                    Ok((tool, input)) => (
                        run_tool(context, tool.tool(), call, input, edited.is_some()).await,
                        false,
                        true,
                    ),
                }
            }
        };
    // A call refused for what let it run no longer holding (its file or its tool changed since it was decided, a
    // deny rule added meanwhile), here or by its tool itself (an MCP tool its restarted server defines otherwise):
    // the audit log says so, beside the approval it overrules.
    let audit = match &output {
        _ if aborted_before_it_ran => crate::approvals::not_run_after_abort_entry(
            &record,
            crate::approvals::ABORTED_BEFORE_IT_RAN,
            None,
        )
        .into_iter()
        .collect(),
        ToolOutput::Error {
            code: ToolErrorCode::PermissionDenied,
            message,
        } => vec![crate::approvals::not_run_entry(&record, "policy", message)],
        _ => Vec::new(),
    };
    // The model must know that what failed, or was not run, was a person's edit of its call, not its own call.
    let output = match (output, &edited) {
        (ToolOutput::Error { code, message }, Some(edited)) => ToolOutput::Error {
            code,
            message: format!("{message} {}", edited_error_note(edited)),
        },
        (output, _) => output,
    };
    // The run's log (its `toolResult` event) keeps the whole output; the model may read less of it.
    let for_model = match tool
        .as_ref()
        .and_then(|tool| tool.tool().model_output_limit())
    {
        Some(limit) => output.clone().bounded_for_model(limit),
        None => output.clone(),
    };
    // The arguments it ran with, only when it ran: a call refused before its tool was called ran with none, nor did
    // one its tool refused to make (an MCP tool whose server defines it otherwise now), as its badge says.
    let refused = matches!(
        output,
        ToolOutput::Error {
            code: ToolErrorCode::PermissionDenied,
            ..
        }
    );
    let executed = edited.filter(|_| ran && !refused);
    let events = tool_result(&context.run_id, call, executed, output, started.elapsed());
    let recorded = context
        .store
        .settle_call(CallResult {
            run_id: context.run_id.clone(),
            call_id: call.id.clone(),
            output: for_model.clone(),
            events,
            audit,
        })
        .await
        .map_err(|error| RunError::Store(error.to_string()))?;
    if !recorded {
        return Err(RunError::Lost);
    }
    Ok(Some(for_model))
}

/// A `deny` rule beats a person too: neither an approval given after the rule was added nor arguments a person
/// edited reach what a rule forbids.
fn denied_by_rule(
    context: &RunContext,
    tool: &RegisteredTool,
    edited: &Value,
) -> Option<ToolOutput> {
    match context.decide(tool.spec(), edited) {
        PermissionDecision::Deny { reason } => {
            Some(ToolOutput::error(ToolErrorCode::PermissionDenied, reason))
        }
        _ => None,
    }
}

/// Remembers what a person approved for the rest of the session with `scope`: the grant the card offered for the
/// arguments `asked` (edited arguments must make the same one; the resume's check refuses others first), no more.
/// Nothing for `once`, for a scope the call does not offer, or in a `strict` run. The grant is kept in the store,
/// and this part of the run holds it at once; the caller announces it.
pub async fn grant_for_session(
    context: &RunContext,
    call: &ToolCall,
    asked: &Value,
    edited: Option<&Value>,
    scope: DecisionScope,
    decided_for: Option<&str>,
) -> Option<SessionGrant> {
    let tool = context.toolbox.lookup(&call.name)?;
    if decided_for.is_some()
        && changing_definition(&context.toolbox, &call.name).as_deref() != decided_for
    {
        // The tool changed since the card was shown: the grant would be for a definition nobody saw.
        tracing::warn!(call = %call.id, "approved once: the tool changed since it asked");
        return None;
    }
    let grant = match context
        .permissions
        .grant_for(tool.spec(), asked, edited, scope)
    {
        Ok(grant) => grant?,
        Err(error) => {
            tracing::warn!(%error, call = %call.id, "approved once: {error}");
            return None;
        }
    };
    let granted = session_grant(grant, context.run_id.clone(), call.id.clone());
    let kept = context
        .store
        .add_grant(&context.run_id, context.epoch, stored_grant(&granted))
        .await;
    // Without the grant, later calls it would have covered ask: safe.
    match kept {
        Ok(Ok(())) => {}
        Ok(Err(fenced)) => {
            tracing::warn!(%fenced, grant = %granted.id, "no session grant kept: {fenced}; what it covers will ask again");
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, grant = %granted.id, "cannot keep a session grant; what it covers will ask again");
            return None;
        }
    }
    context.grants.write().insert(granted.clone());
    Some(granted)
}

/// The digest of a tool's definition as it is now, for a tool whose definition may change while the process runs
/// (an MCP server's; the built-in tools' cannot): what a call decided now is decided for.
pub fn changing_definition(toolbox: &Toolbox, name: &str) -> Option<String> {
    definition_digest(&*toolbox.lookup(name)?)
}

/// The digest of `tool`'s definition, for a tool whose definition may change while the process runs (an MCP
/// server's): what a call decided with it is decided for.
pub fn definition_digest(tool: &RegisteredTool) -> Option<String> {
    tool.spec()
        .mcp
        .is_some()
        .then(|| crate::policy::spec_digest(tool.spec()))
}

/// Refuses a call whose tool's definition changed since the call was decided: an approval, or the policy's
/// decision, was for the definition then (what the card showed), not for whatever the server offers now.
fn changed_since_decided(tool: Option<&RegisteredTool>, record: &CallRecord) -> Option<ToolOutput> {
    let decided = record.spec_digest.as_ref()?;
    if tool.and_then(definition_digest).as_ref() == Some(decided) {
        return None;
    }
    Some(ToolOutput::error(
        ToolErrorCode::PermissionDenied,
        format!(
            "The tool {} changed after this call was decided (its server describes it differently now, or no longer offers it), so the call was not run: what was approved or allowed was the tool as it was.",
            record.call.name
        ),
    ))
}

/// An approved call whose card showed what it acts on (a file) as it was: if that changed since (another call wrote
/// it, a person edited it), the approval was for something else, and the call is not run. (Arguments a person edited
/// are theirs: they approved what they wrote.)
fn changed_since_shown(tool: &RegisteredTool, record: &CallRecord) -> Option<ToolOutput> {
    let shown = record.shown_state.as_ref()?;
    let now = tool.tool().state(&record.input);
    if now.as_ref() == Some(shown) {
        return None;
    }
    Some(ToolOutput::error(
        ToolErrorCode::PermissionDenied,
        format!(
            "{} was not run: what it acts on changed after approval was asked for it (the file was written, replaced, created or deleted since), so the approval was for something else. Call it again to ask with the file as it is now.",
            record.call.name
        ),
    ))
}

/// The locks a call that acts on files holds from its look at what its card showed to the tool's end: a call whose
/// card showed a file's state ([`crate::tools::Tool::state`]), and any call of a built-in file tool that changes
/// files (an allowed write, say, which must not come between another call's look and its act). Without them two
/// approved calls on one file (two writes of one batch, run side by side, or calls of two runs) could both find the
/// file as their cards showed it before either acted, and the second would act on a file the first had changed. With
/// them the second looks once the first is done, and is refused as any call on a file changed since its card is.
///
/// One lock per file name in lower case and composed (Unicode's NFC), among 64, for the path asked about and the one
/// a person edited it to: the spellings of one file that keep its name (another case, another normalization, another
/// directory through a link) share theirs, and two files that share one only wait for each other. Names that differ
/// for one file (a link of another name, a hard link) do not meet here. Within this process: instances that share a workspace do
/// not share these locks, and neither do commands and MCP tools, which may change any file. A tool left behind after
/// an abort's grace (its future dropped) lets them go while a write it handed to another thread may still be going.
struct FileLocks(Vec<usize>);

impl FileLocks {
    const STRIPES: usize = 64;

    fn of(record: &CallRecord, tool: Option<&RegisteredTool>, edited: Option<&Value>) -> Self {
        // A file tool that only reads needs none: it changes nothing another call looked at.
        let changes_a_file = tool.is_some_and(|tool| {
            crate::policy::matcher::ToolKind::of(&record.call.name)
                == crate::policy::matcher::ToolKind::WorkspaceFile
                && tool.spec().annotations.read_only != Some(true)
        });
        if record.shown_state.is_none() && !changes_a_file {
            return Self(Vec::new());
        }
        let mut stripes: Vec<usize> = std::iter::once(&record.input)
            .chain(edited)
            .map(Self::stripe)
            .collect();
        // Always in the same order, each once: two calls that need the same two never wait for each other.
        stripes.sort_unstable();
        stripes.dedup();
        Self(stripes)
    }

    fn stripe(input: &Value) -> usize {
        use std::hash::{Hash, Hasher};
        let name = input
            .get("path")
            .and_then(Value::as_str)
            .and_then(crate::policy::matcher::normalize_relative)
            .map(|path| {
                use unicode_normalization::UnicodeNormalization as _;
                // Lower case first: it may decompose (`İ` is `i` and a combining dot), which composing then undoes.
                let name = path.rsplit('/').next().unwrap_or_default().to_lowercase();
                name.nfc().collect::<String>()
            });
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut hasher);
        (hasher.finish() % Self::STRIPES as u64) as usize
    }

    /// Takes the locks, or `None` once the run is aborted (while it waits, or before) for another reason than this
    /// process's shutdown: the call is then not run.
    async fn take(self, context: &RunContext) -> Option<Vec<tokio::sync::MutexGuard<'static, ()>>> {
        static LOCKS: std::sync::LazyLock<Vec<tokio::sync::Mutex<()>>> =
            std::sync::LazyLock::new(|| {
                (0..FileLocks::STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect()
            });
        // A call that needs no lock is not run once its run is aborted either (for its bound on events, say, which the
        // decisions of its batch may have passed).
        if context.abort.is_aborted() && !context.abort.reason().lets_a_call_begin() {
            return None;
        }
        let mut held = Vec::with_capacity(self.0.len());
        for stripe in self.0 {
            let lock = LOCKS[stripe].lock();
            tokio::pin!(lock);
            let guard = tokio::select! {
                biased;
                () = context.abort.aborted() => {
                    if !context.abort.reason().lets_a_call_begin() {
                        return None;
                    }
                    lock.await
                }
                guard = &mut lock => guard,
            };
            held.push(guard);
        }
        Some(held)
    }
}

/// Whether two calls' arguments name the same workspace path (as the file tools read it). Not the files' states:
/// two missing files read the same.
fn same_path(one: &Value, other: &Value) -> bool {
    let path = |input: &Value| {
        input
            .get("path")
            .and_then(Value::as_str)
            .and_then(crate::policy::matcher::normalize_relative)
    };
    matches!((path(one), path(other)), (Some(one), Some(other)) if one == other)
}

/// Runs the tool itself with checked input.
async fn run_tool(
    context: &RunContext,
    tool: &Arc<dyn crate::tools::Tool>,
    call: &ToolCall,
    input: Value,
    edited: bool,
) -> ToolOutput {
    let tool_context = ToolContext {
        run_id: context.run_id.clone(),
        cancel: context.abort.token().clone(),
    };
    let edited_input = edited.then(|| input.clone());
    // A tool honours the run's abort itself (`ToolContext::cancel`): what it returns is what really happened, the
    // work it finished or the point where it stopped, and that is the result reported. Only a tool that does not
    // end within a grace period after the abort is left behind (dropped), and then the result says so.
    // A tool that panics fails its call, not the task that runs it: a waiting run's calls run in a task that has
    // nothing else to record their results, and a call left executing would hold its run for good.
    let execution = AssertUnwindSafe(tool.execute(input, &tool_context))
        .catch_unwind()
        .map(|caught| {
            caught.unwrap_or_else(|_| {
                Err(ToolError::failed(
                    "The tool stopped unexpectedly: it panicked.",
                ))
            })
        });
    tokio::pin!(execution);
    let result = tokio::select! {
        result = &mut execution => result,
        () = context.abort.aborted() => {
            match tokio::time::timeout(TOOL_ABORT_GRACE, &mut execution).await {
                Ok(result) => result,
                Err(_) => {
                    return ToolOutput::error(
                        ToolErrorCode::ToolFailed,
                        format!(
                            "The run was aborted while {} was running, and it did not stop within {} s; what it did is unknown.",
                            call.name,
                            TOOL_ABORT_GRACE.as_secs()
                        ),
                    );
                }
            }
        }
    };
    match (result, edited_input) {
        // The model must know its call did not run as it asked.
        (Ok(content), Some(edited)) => ToolOutput::Ok {
            content: serde_json::json!({
                "note": EDITED_NOTE,
                "editedArguments": edited,
                "result": content,
            }),
        },
        (Ok(content), None) => ToolOutput::Ok { content },
        (Err(error), _) => error.into(),
    }
}

/// The record of a prepared call as a batch stores it.
pub fn call_record(context: &RunContext, prepared: &PreparedCall, requested_at: u64) -> CallRecord {
    match prepared {
        PreparedCall::Refused { call, output } => {
            let mut record = CallRecord::new(
                context.run_id.clone(),
                call.clone(),
                call.arguments_value(),
                CallStatus::Refused,
            );
            record.output = Some(output.clone());
            record
        }
        PreparedCall::Decided {
            call,
            input,
            permission,
            tool,
        } => {
            let status = match permission {
                PermissionDecision::Ask { .. } => CallStatus::Pending,
                _ => CallStatus::Allowed,
            };
            let mut record =
                CallRecord::new(context.run_id.clone(), call.clone(), input.clone(), status);
            record.spec_digest = definition_digest(tool);
            if let PermissionDecision::Ask { reason } = permission {
                // Before the preview: should the thing change between the two, the call is refused (its state
                // differs when it runs), never run on a card that showed it already changed.
                record.shown_state = tool.tool().state(input);
                let choices =
                    context
                        .permissions
                        .approval_choices(tool.spec(), input, &context.grants());
                record.approval = Some(crate::wire::ApprovalRequest {
                    run_id: context.run_id.clone(),
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    arguments: input.clone(),
                    reason: reason.clone(),
                    choices,
                    requested_at,
                    expires_at: requested_at
                        .saturating_add(context.approval_timeout.as_millis() as u64),
                    preview: tool.tool().preview(input),
                });
            }
            record
        }
    }
}

/// Where a run's streaming events go: appended to its log in the store, as its owner at `epoch`.
pub struct StoreEvents {
    pub store: Arc<dyn Store>,
    pub run_id: RunId,
    pub epoch: Epoch,
    /// What the run may still append, in events and bytes; past either the run is aborted.
    budget: parking_lot::Mutex<(usize, usize)>,
    abort: RunAbort,
}

impl StoreEvents {
    pub fn new(
        store: Arc<dyn Store>,
        run_id: RunId,
        epoch: Epoch,
        max_events: usize,
        max_bytes: usize,
        abort: RunAbort,
    ) -> Self {
        Self {
            store,
            run_id,
            epoch,
            budget: parking_lot::Mutex::new((max_events, max_bytes)),
            abort,
        }
    }
}

impl EventSink for StoreEvents {
    fn emit(&self, event: AgentEvent) {
        let events = encode(&self.run_id, event);
        let bytes: usize = events.iter().map(NewEvent::bytes).sum();
        {
            let mut budget = self.budget.lock();
            if budget.0 < events.len() || budget.1 < bytes {
                drop(budget);
                self.abort.abort(AbortReason::EventLimit);
                return;
            }
            budget.0 -= events.len();
            budget.1 -= bytes;
        }
        self.store.append(&self.run_id, self.epoch, events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of the reasons a run is aborted for, only this process's shutdown lets a call about to begin go on; a run
    /// another instance took over (and whose call it recorded as interrupted) begins nothing more here.
    #[test]
    fn only_a_shutdown_lets_a_call_about_to_begin_go_on() {
        for (reason, goes_on) in [
            (AbortReason::Shutdown, true),
            (AbortReason::TakenOver, false),
            (AbortReason::Cancelled, false),
            (AbortReason::Disconnected, false),
            (AbortReason::EventLimit, false),
        ] {
            assert_eq!(reason.lets_a_call_begin(), goes_on, "{reason:?}");
            assert_eq!(AbortReason::parse(reason.as_str()), Some(reason));
        }
    }

    #[test]
    fn a_part_of_an_abort_switch_stops_alone_and_with_its_whole() {
        let whole = RunAbort::new();
        let (one, other) = (whole.part(), whole.part());
        one.abort(AbortReason::Shutdown);
        assert!(one.is_aborted());
        assert!(
            !whole.is_aborted() && !other.is_aborted(),
            "a part stops alone"
        );
        whole.abort(AbortReason::Cancelled);
        assert!(other.is_aborted());
        assert_eq!(other.reason(), AbortReason::Cancelled, "the whole's reason");
        assert_eq!(one.reason(), AbortReason::Shutdown, "its own, given first");
        let late = whole.part();
        late.abort(AbortReason::Shutdown);
        assert_eq!(
            late.reason(),
            AbortReason::Cancelled,
            "the whole's, given first"
        );
        assert!(one.is(&one.clone()) && !one.is(&other));
    }
}
