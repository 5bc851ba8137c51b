//! The tool runtime: one tool call from the model's request to the output the model reads back.
//!
//! A call is first *prepared* (tool found, arguments parsed and checked against the schema, permission decided),
//! with no side effect but events; then *settled* (asked for, when the decision is `ask`, and executed when
//! allowed). The loop prepares a whole batch before it settles any of it, so fail-closed mode refuses a batch
//! before anything in it runs.
//!
//! | approval mode | decision | result |
//! | --- | --- | --- |
//! | `fail_closed` | ask | the run fails with an approval-required error |
//! | `interactive` | ask | waits for approve / deny / timeout / abort |
//! | any | deny | a recoverable `PERMISSION_DENIED` output; no approval is asked |
//! | any | allow | executes |

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::approvals::{ApprovalRegistry, NewApproval};
use crate::events::{AgentEvent, EventSink};
use crate::ids::{RunId, SessionId};
use crate::policy::{PermissionPolicy, SessionGrants, grant_key};
use crate::tools::{ToolContext, ToolError, Toolbox, unknown_tool_message};
use crate::wire::{
    ApprovalMode, DecisionScope, PermissionDecision, Resolution, RunErrorCode, ToolCall,
    ToolErrorCode, ToolOutput, approval_denied_message,
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
}

impl AbortReason {
    pub fn message(self) -> &'static str {
        match self {
            Self::Cancelled => "The run was cancelled.",
            Self::Disconnected => "The client disconnected, so the run was aborted.",
            Self::Shutdown => "The server is shutting down, so the run was aborted.",
            Self::EventLimit => {
                "The run produced more events than a run may keep, so it was aborted."
            }
        }
    }

    pub fn code(self) -> RunErrorCode {
        match self {
            Self::Shutdown => RunErrorCode::Shutdown,
            Self::EventLimit => RunErrorCode::EventLimit,
            Self::Cancelled | Self::Disconnected => RunErrorCode::Aborted,
        }
    }
}

/// A run's abort switch: a cancellation token and the first reason given.
#[derive(Clone, Debug, Default)]
pub struct RunAbort {
    token: CancellationToken,
    reason: Arc<OnceLock<AbortReason>>,
}

impl RunAbort {
    pub fn new() -> Self {
        Self::default()
    }

    /// Aborts the run; the first reason sticks.
    pub fn abort(&self, reason: AbortReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    pub fn is_aborted(&self) -> bool {
        self.token.is_cancelled()
    }

    pub fn reason(&self) -> AbortReason {
        self.reason.get().copied().unwrap_or(AbortReason::Cancelled)
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
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
}

impl RunError {
    pub fn code(&self) -> RunErrorCode {
        match self {
            Self::ApprovalRequired { .. } => RunErrorCode::ApprovalRequired,
            Self::StepLimit { .. } => RunErrorCode::StepLimit,
            Self::RepeatedCall { .. } => RunErrorCode::RepeatedCall,
            Self::Aborted { reason } => reason.code(),
            Self::Model(_) => RunErrorCode::Model,
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
    pub grants: Arc<Mutex<SessionGrants>>,
    pub approvals: ApprovalRegistry,
    pub approval_timeout: Duration,
    pub toolbox: Arc<Toolbox>,
    pub abort: RunAbort,
    pub events: Arc<dyn EventSink>,
}

impl RunContext {
    pub fn emit(&self, event: AgentEvent) {
        self.events.emit(event);
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, SessionGrants> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
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
    let permission = context.permissions.decide(tool.spec(), &context.grants());
    let arguments = if call.arguments.trim().is_empty() {
        // Models send an empty string for a call without arguments.
        Ok(Value::Object(Default::default()))
    } else {
        serde_json::from_str::<Value>(&call.arguments)
    };
    let input = match arguments {
        Ok(input) => input,
        Err(error) => {
            decided(permission, call.arguments_value());
            return refused(ToolOutput::error(
                ToolErrorCode::InvalidArguments,
                format!(
                    "The arguments for {} are not valid JSON ({error}). Send a JSON object.",
                    call.name
                ),
            ));
        }
    };
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
    }
}

/// Asks for a decided call when it must, runs it when allowed, and emits its result. An `Err` ends the run.
pub async fn settle_call(
    prepared: PreparedCall,
    context: &RunContext,
) -> Result<ToolOutput, RunError> {
    let (call, input, permission) = match prepared {
        PreparedCall::Refused { call, output } => {
            finish(context, &call, None, output.clone(), Duration::ZERO);
            return Ok(output);
        }
        PreparedCall::Decided {
            call,
            input,
            permission,
        } => (call, input, permission),
    };

    let mut executed_arguments = None;
    if let PermissionDecision::Ask { reason } = permission {
        match request_approval(&call, &input, reason, context).await? {
            Resolution::Denied { reason, .. } => {
                let output = ToolOutput::error(
                    ToolErrorCode::ApprovalDenied,
                    approval_denied_message(&reason),
                );
                finish(context, &call, None, output.clone(), Duration::ZERO);
                return Ok(output);
            }
            Resolution::Approved {
                scope,
                edited_arguments,
                ..
            } => {
                if scope == DecisionScope::Session {
                    grant_for_session(context, &call.name);
                }
                executed_arguments = edited_arguments;
            }
        }
    }
    run_tool(context, &call, input, executed_arguments).await
}

/// Remembers that a person approved `tool_name`, as it is defined now, for the rest of the session.
pub fn grant_for_session(context: &RunContext, tool_name: &str) {
    if let Some(spec) = context.toolbox.spec(tool_name) {
        context.grants().insert(grant_key(&spec));
    }
    context.emit(AgentEvent::SessionGrantAdded {
        tool_name: tool_name.to_owned(),
    });
}

/// Runs an allowed (or approved) call and emits its result. Arguments a person edited replace `input`; they are
/// checked against the tool's schema again, because nothing runs unchecked. Nothing runs once the run is aborted.
pub async fn run_tool(
    context: &RunContext,
    call: &ToolCall,
    input: Value,
    edited_arguments: Option<Value>,
) -> Result<ToolOutput, RunError> {
    let input = match edited_arguments.clone() {
        Some(edited) => {
            if let Err(error) = context.toolbox.validate(&call.name, &edited) {
                let output = ToolOutput::from(error);
                finish(context, call, Some(edited), output.clone(), Duration::ZERO);
                return Ok(output);
            }
            edited
        }
        None => input,
    };
    let Some(tool) = context.toolbox.get(&call.name) else {
        let output = ToolOutput::error(
            ToolErrorCode::UnknownTool,
            unknown_tool_message(&call.name, &context.toolbox),
        );
        finish(
            context,
            call,
            edited_arguments,
            output.clone(),
            Duration::ZERO,
        );
        return Ok(output);
    };
    if context.abort.is_aborted() {
        return Err(RunError::Aborted {
            reason: context.abort.reason(),
        });
    }
    let started = Instant::now();
    let tool_context = ToolContext {
        run_id: context.run_id.clone(),
        cancel: context.abort.token().clone(),
    };
    let result = tokio::select! {
        result = tool.execute(input, &tool_context) => result,
        () = context.abort.aborted() => {
            let output = ToolOutput::from(ToolError::failed(format!(
                "The run was aborted while {} was running.", call.name
            )));
            finish(context, call, edited_arguments, output, started.elapsed());
            return Err(RunError::Aborted { reason: context.abort.reason() });
        }
    };
    let output = match (result, &edited_arguments) {
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
    };
    // The run's log keeps the whole output; the model may get less of it.
    let for_model = match tool.model_output_limit() {
        Some(limit) => output.clone().bounded_for_model(limit),
        None => output.clone(),
    };
    finish(context, call, edited_arguments, output, started.elapsed());
    Ok(for_model)
}

/// What the model reads when a person edited its call's arguments before approving it.
pub const EDITED_NOTE: &str = "A person edited the arguments of this call before approving it; it ran with editedArguments, not with yours.";

/// Registers the approval, announces it, and waits. In fail-closed mode it refuses instead.
async fn request_approval(
    call: &ToolCall,
    input: &Value,
    reason: String,
    context: &RunContext,
) -> Result<Resolution, RunError> {
    // Only interactive mode waits here; an interrupt-mode loop sets asking calls aside before they get here.
    if context.approval_mode != ApprovalMode::Interactive {
        return Err(RunError::ApprovalRequired {
            tool_name: call.name.clone(),
            reason,
        });
    }
    let pending = context
        .approvals
        .register_with_timeout(
            NewApproval {
                run_id: context.run_id.clone(),
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                arguments: input.clone(),
                reason,
            },
            context.abort.token().clone(),
            context.approval_timeout,
        )
        .map_err(|error| RunError::Model(format!("the model reused a tool call id: {error}")))?;
    // Registered before it is announced: whoever sees `approvalRequired` can decide at once. (Someone may have
    // decided already, between the two; then the decision is in the channel and the announcement is skipped.)
    if let Some(request) = pending.request() {
        context.emit(AgentEvent::ApprovalRequested { request });
    }
    let asked = Instant::now();
    let resolution = pending.wait().await;
    context.emit(AgentEvent::ApprovalResolved {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        resolution: resolution.clone(),
        waited: asked.elapsed(),
    });
    Ok(resolution)
}

fn finish(
    context: &RunContext,
    call: &ToolCall,
    executed_arguments: Option<Value>,
    output: ToolOutput,
    elapsed: Duration,
) {
    context.emit(AgentEvent::ToolFinished {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        executed_arguments,
        output,
        elapsed,
    });
}

/// One call, start to end: prepare, then settle. The seed's `executeAgentToolCall`.
pub async fn execute_tool_call(
    call: &ToolCall,
    step: u32,
    context: &RunContext,
) -> Result<ToolOutput, RunError> {
    settle_call(prepare_call(call, step, context), context).await
}
