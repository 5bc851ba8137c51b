//! Everything that happens in a run, as one internal event enum, and its projection to the wire.
//!
//! Internal events say more than the wire needs (durations, usage, grants); [`AgentEvent::project`] turns each into
//! the stream events clients see. Approval events are first-class on the wire, never wrapped in `debug`.

use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::ids::{RunId, SessionId, ToolCallId};
use crate::model::Usage;
use crate::wire::{
    ApprovalMode, ApprovalPolicy, ApprovalRequest, InterruptRequest, PermissionDecision,
    Resolution, RunErrorCode, StreamEvent, ToolOutput,
};

#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    RunStarted {
        session_id: SessionId,
        message: String,
        policy: ApprovalPolicy,
        approval_mode: ApprovalMode,
        parent_run_id: Option<RunId>,
    },
    StepStarted {
        step: u32,
    },
    ModelRequested {
        step: u32,
        model: String,
        messages: usize,
        tools: usize,
    },
    TextDelta {
        step: u32,
        delta: String,
    },
    ModelFinished {
        step: u32,
        finish_reason: Option<String>,
        usage: Option<Usage>,
        elapsed: Duration,
    },
    ToolCallDecided {
        step: u32,
        tool_call_id: ToolCallId,
        tool_name: String,
        arguments: Value,
        permission: PermissionDecision,
    },
    ApprovalRequested {
        request: ApprovalRequest,
    },
    ApprovalResolved {
        tool_call_id: ToolCallId,
        tool_name: String,
        resolution: Resolution,
        waited: Duration,
    },
    SessionGrantAdded {
        tool_name: String,
    },
    RepeatedCallBlocked {
        tool_name: String,
        times: usize,
    },
    ContextTrimmed {
        step: u32,
        omitted_messages: u32,
    },
    ToolFinished {
        tool_call_id: ToolCallId,
        tool_name: String,
        executed_arguments: Option<Value>,
        output: ToolOutput,
        elapsed: Duration,
    },
    RunFinished {
        answer: String,
        steps: u32,
    },
    RunInterrupted {
        interrupts: Vec<InterruptRequest>,
    },
    RunFailed {
        code: RunErrorCode,
        message: String,
    },
}

fn ms(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

impl AgentEvent {
    /// The stream events this event becomes, in order. `at` is the time in milliseconds since the Unix epoch.
    pub fn project(self, run_id: &RunId, at: u64) -> Vec<StreamEvent> {
        let run_id = run_id.clone();
        let debug = |run_id: RunId, message: String, data: Option<Value>| StreamEvent::Debug {
            run_id,
            at,
            message,
            data,
        };
        match self {
            AgentEvent::RunStarted {
                session_id,
                message,
                policy,
                approval_mode,
                parent_run_id,
            } => vec![StreamEvent::RunStarted {
                run_id,
                session_id,
                message,
                policy,
                approval_mode,
                parent_run_id,
            }],
            AgentEvent::StepStarted { step } => vec![StreamEvent::Step { run_id, step }],
            AgentEvent::ModelRequested {
                step,
                model,
                messages,
                tools,
            } => vec![debug(
                run_id,
                format!(
                    "step {step}: asking the {model} model ({messages} messages, {tools} tools)"
                ),
                None,
            )],
            AgentEvent::TextDelta { step, delta } => {
                vec![StreamEvent::AssistantDelta {
                    run_id,
                    step,
                    delta,
                }]
            }
            AgentEvent::ModelFinished {
                step,
                finish_reason,
                usage,
                elapsed,
            } => vec![debug(
                run_id,
                format!(
                    "step {step}: the model finished ({}) in {} ms",
                    finish_reason.as_deref().unwrap_or("no reason given"),
                    ms(elapsed)
                ),
                usage.map(|usage| json!({ "usage": usage })),
            )],
            AgentEvent::ToolCallDecided {
                step,
                tool_call_id,
                tool_name,
                arguments,
                permission,
            } => {
                let verdict = match &permission {
                    PermissionDecision::Allow { .. } => "allow",
                    PermissionDecision::Ask { .. } => "ask",
                    PermissionDecision::Deny { .. } => "deny",
                };
                let note = debug(
                    run_id.clone(),
                    format!(
                        "{tool_name} ({tool_call_id}): {verdict}: {}",
                        permission.reason()
                    ),
                    None,
                );
                vec![
                    StreamEvent::ToolCall {
                        run_id,
                        step,
                        tool_call_id,
                        tool_name,
                        arguments,
                        permission,
                    },
                    note,
                ]
            }
            AgentEvent::ApprovalRequested { request } => {
                vec![StreamEvent::ApprovalRequired { request }]
            }
            AgentEvent::ApprovalResolved {
                tool_call_id,
                tool_name,
                resolution,
                waited,
            } => {
                let how = match &resolution {
                    Resolution::Approved { .. } => "approved".to_owned(),
                    Resolution::Denied { source, .. } => {
                        format!("denied ({source:?})").to_lowercase()
                    }
                };
                let note = debug(
                    run_id.clone(),
                    format!("{tool_name} ({tool_call_id}) {how} after {} ms", ms(waited)),
                    None,
                );
                vec![
                    StreamEvent::ApprovalResolved {
                        run_id,
                        tool_call_id,
                        tool_name,
                        resolution,
                    },
                    note,
                ]
            }
            AgentEvent::SessionGrantAdded { tool_name } => vec![debug(
                run_id,
                format!("{tool_name} is approved for the rest of this session"),
                None,
            )],
            AgentEvent::RepeatedCallBlocked { tool_name, times } => vec![debug(
                run_id,
                format!(
                    "{tool_name} was called {times} times with the same arguments; the call was blocked"
                ),
                None,
            )],
            AgentEvent::ContextTrimmed {
                step,
                omitted_messages,
            } => vec![StreamEvent::ContextTrimmed {
                run_id,
                step,
                omitted_messages,
            }],
            AgentEvent::ToolFinished {
                tool_call_id,
                tool_name,
                executed_arguments,
                output,
                elapsed,
            } => vec![StreamEvent::ToolResult {
                run_id,
                tool_call_id,
                tool_name,
                executed_arguments,
                output,
                duration_ms: ms(elapsed),
            }],
            AgentEvent::RunFinished { answer, steps } => {
                vec![StreamEvent::Done {
                    run_id,
                    answer,
                    steps,
                }]
            }
            AgentEvent::RunInterrupted { interrupts } => {
                vec![StreamEvent::Interrupted { run_id, interrupts }]
            }
            AgentEvent::RunFailed { code, message } => {
                vec![StreamEvent::Error {
                    run_id,
                    code,
                    message,
                }]
            }
        }
    }
}

/// Where a run's events go.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: AgentEvent);
}

/// Collects events in memory; for tests and for callers that want the whole list.
#[derive(Debug, Default)]
pub struct EventLog(Mutex<Vec<AgentEvent>>);

impl EventLog {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn events(&self) -> Vec<AgentEvent> {
        self.0.lock().clone()
    }
}

impl EventSink for EventLog {
    fn emit(&self, event: AgentEvent) {
        self.0.lock().push(event);
    }
}

impl EventSink for tokio::sync::mpsc::UnboundedSender<AgentEvent> {
    fn emit(&self, event: AgentEvent) {
        // A receiver that went away no longer cares.
        let _ = self.send(event);
    }
}
