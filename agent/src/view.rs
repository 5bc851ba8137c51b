//! The transcript of a run, folded from its events.
//!
//! One reducer serves every viewer: the server folds a run's events into a [`RunView`] for the non-streaming route
//! and for the first server-rendered page; the browser keeps folding the live events into the same structure. Events
//! carry a per-run sequence number, and a view ignores any event it has already applied, so a reconnect that replays
//! an event never shows it twice.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{RunId, SessionId, ToolCallId};
use crate::wire::{
    ApprovalMode, ApprovalPolicy, ApprovalRequest, InterruptRequest, Message, PermissionDecision,
    Resolution, RunErrorCode, RunEvent, StreamEvent, ToolCall, ToolErrorCode, ToolOutput,
};

/// How many debug entries a view keeps per run; older ones are dropped from the view (not from the event log).
pub const MAX_DEBUG_ENTRIES: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Done,
    /// Ended with calls that wait for a resume (AG-UI interrupts).
    Interrupted,
    Failed,
}

/// Where one tool call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallStatus {
    /// Decided, not finished yet.
    Running,
    /// Waiting for a person.
    AwaitingApproval,
    /// Finished with an ok output.
    Succeeded,
    /// Finished with an error output (including denials).
    Failed,
    /// Left for a later run to resume (AG-UI interrupts).
    Interrupted,
    /// Its run ended before it had a result (a batch the run failed in, after a repeated call or a call that needed
    /// approval where none may be asked): it is not running any more.
    Unfinished,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallView {
    pub id: ToolCallId,
    pub name: String,
    pub arguments: Value,
    pub permission: PermissionDecision,
    /// Set while (and after) the call waited for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executed_arguments: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ToolOutput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Set when the run ended with this call left for a resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt: Option<InterruptRequest>,
}

impl ToolCallView {
    pub fn status(&self) -> ToolCallStatus {
        match (&self.output, &self.approval, &self.resolution) {
            (Some(output), _, _) if output.is_ok() => ToolCallStatus::Succeeded,
            (Some(_), _, _) => ToolCallStatus::Failed,
            (None, Some(_), None) => ToolCallStatus::AwaitingApproval,
            (None, _, _) if self.interrupt.is_some() => ToolCallStatus::Interrupted,
            (None, _, _) => ToolCallStatus::Running,
        }
    }

    /// Where the call stands in a run that stands at `run`: one its run ended without a result for is not running.
    pub fn status_in(&self, run: RunStatus) -> ToolCallStatus {
        match self.status() {
            ToolCallStatus::Running if run != RunStatus::Running => ToolCallStatus::Unfinished,
            status => status,
        }
    }

    /// The pending approval, while there is one.
    pub fn pending_approval(&self) -> Option<&ApprovalRequest> {
        match (&self.approval, &self.resolution) {
            (Some(request), None) => Some(request),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepView {
    pub step: u32,
    pub text: String,
    pub tool_calls: Vec<ToolCallView>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DebugEntry {
    pub seq: u64,
    pub at: u64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunFailure {
    pub code: RunErrorCode,
    pub message: String,
}

/// Everything a viewer knows about one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub run_id: RunId,
    pub session_id: SessionId,
    pub message: String,
    pub policy: ApprovalPolicy,
    pub approval_mode: ApprovalMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    pub status: RunStatus,
    pub steps: Vec<StepView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunFailure>,
    /// The sequence number of the last event applied: a subscriber resumes after it.
    pub last_seq: u64,
    /// How many of the conversation's oldest messages the model was not sent, when a long conversation was bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted_messages: Option<u32>,
    #[serde(default)]
    pub debug: Vec<DebugEntry>,
}

impl RunView {
    /// Starts a view from a run's first event. Any other event cannot start a view.
    pub fn start(event: &RunEvent) -> Option<Self> {
        match &event.event {
            StreamEvent::RunStarted {
                run_id,
                session_id,
                message,
                policy,
                approval_mode,
                parent_run_id,
            } => Some(Self {
                run_id: run_id.clone(),
                session_id: session_id.clone(),
                message: message.clone(),
                policy: *policy,
                approval_mode: *approval_mode,
                parent_run_id: parent_run_id.clone(),
                status: RunStatus::Running,
                steps: Vec::new(),
                answer: None,
                error: None,
                last_seq: event.seq,
                omitted_messages: None,
                debug: Vec::new(),
            }),
            _ => None,
        }
    }

    /// Folds a whole event log.
    pub fn from_events<'a>(events: impl IntoIterator<Item = &'a RunEvent>) -> Option<Self> {
        let mut events = events.into_iter();
        let mut view = Self::start(events.next()?)?;
        for event in events {
            view.apply(event);
        }
        Some(view)
    }

    /// The messages this run added to its session's conversation, as its model had them: the person's message,
    /// each step's text and calls, and each call's result, at most `bound(tool)` bytes of it where the tool bounds
    /// what its model reads; for a call without a recorded result, that whether it ran is unknown (it may not have
    /// begun, or its result may not have been written). For a run that ended without its end recording them: the
    /// session's next run reads what this one was asked and did.
    pub fn messages(&self, bound: impl Fn(&str) -> Option<usize>) -> Vec<Message> {
        let mut messages = Vec::new();
        if !self.message.is_empty() {
            messages.push(Message::User {
                content: self.message.clone(),
            });
        }
        for step in &self.steps {
            if step.text.is_empty() && step.tool_calls.is_empty() {
                continue;
            }
            messages.push(Message::Assistant {
                content: step.text.clone(),
                tool_calls: step
                    .tool_calls
                    .iter()
                    .map(|call| ToolCall {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments.to_string(),
                    })
                    .collect(),
            });
            for call in &step.tool_calls {
                let output = match &call.output {
                    Some(output) => match bound(&call.name) {
                        Some(limit) => output.clone().bounded_for_model(limit),
                        None => output.clone(),
                    },
                    None => ToolOutput::error(
                        ToolErrorCode::ToolFailed,
                        "The run ended before a result of this call was recorded: whether it ran is unknown.",
                    ),
                };
                messages.push(Message::Tool {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    output,
                });
            }
        }
        messages
    }

    pub fn is_finished(&self) -> bool {
        self.status != RunStatus::Running
    }

    /// Every approval still waiting in this run.
    pub fn pending_approvals(&self) -> impl Iterator<Item = &ApprovalRequest> {
        self.tool_calls().filter_map(ToolCallView::pending_approval)
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCallView> {
        self.steps.iter().flat_map(|step| step.tool_calls.iter())
    }

    fn tool_call_mut(&mut self, id: &ToolCallId) -> Option<&mut ToolCallView> {
        self.steps
            .iter_mut()
            .rev()
            .flat_map(|step| step.tool_calls.iter_mut())
            .find(|call| &call.id == id)
    }

    fn step_mut(&mut self, step: u32) -> &mut StepView {
        if self.steps.last().is_none_or(|last| last.step != step) {
            self.steps.push(StepView {
                step,
                text: String::new(),
                tool_calls: Vec::new(),
            });
        }
        let last = self.steps.len() - 1;
        &mut self.steps[last]
    }

    /// Applies one event. Returns false, changing nothing, for an event already applied (or one that belongs to
    /// another run).
    pub fn apply(&mut self, event: &RunEvent) -> bool {
        if event.seq <= self.last_seq {
            return false;
        }
        match &event.event {
            StreamEvent::RunStarted { run_id, .. } if run_id != &self.run_id => return false,
            StreamEvent::RunStarted { .. } => {}
            StreamEvent::Step { step, .. } => {
                self.step_mut(*step);
            }
            StreamEvent::AssistantDelta { step, delta, .. } => {
                self.step_mut(*step).text.push_str(delta);
            }
            StreamEvent::ToolCall {
                step,
                tool_call_id,
                tool_name,
                arguments,
                permission,
                ..
            } => {
                self.step_mut(*step).tool_calls.push(ToolCallView {
                    id: tool_call_id.clone(),
                    name: tool_name.clone(),
                    arguments: arguments.clone(),
                    permission: permission.clone(),
                    approval: None,
                    resolution: None,
                    executed_arguments: None,
                    output: None,
                    duration_ms: None,
                    interrupt: None,
                });
            }
            StreamEvent::ApprovalRequired { request } => {
                if let Some(call) = self.tool_call_mut(&request.tool_call_id) {
                    call.approval = Some(request.clone());
                }
            }
            StreamEvent::ApprovalResolved {
                tool_call_id,
                resolution,
                ..
            } => {
                if let Some(call) = self.tool_call_mut(tool_call_id) {
                    call.resolution = Some(resolution.clone());
                }
            }
            StreamEvent::ToolResult {
                tool_call_id,
                executed_arguments,
                output,
                duration_ms,
                ..
            } => {
                if let Some(call) = self.tool_call_mut(tool_call_id) {
                    call.output = Some(output.clone());
                    call.executed_arguments = executed_arguments.clone();
                    call.duration_ms = Some(*duration_ms);
                }
            }
            StreamEvent::Debug {
                at, message, data, ..
            } => {
                if self.debug.len() == MAX_DEBUG_ENTRIES {
                    self.debug.remove(0);
                }
                self.debug.push(DebugEntry {
                    seq: event.seq,
                    at: *at,
                    message: message.clone(),
                    data: data.clone(),
                });
            }
            StreamEvent::ContextTrimmed {
                omitted_messages, ..
            } => {
                self.omitted_messages = Some(*omitted_messages);
            }
            StreamEvent::Done { answer, .. } => {
                self.status = RunStatus::Done;
                self.answer = Some(answer.clone());
            }
            StreamEvent::Interrupted { interrupts, .. } => {
                self.status = RunStatus::Interrupted;
                for interrupt in interrupts {
                    if let Some(call) = self.tool_call_mut(&interrupt.tool_call_id) {
                        call.interrupt = Some(interrupt.clone());
                    }
                }
            }
            StreamEvent::Error { code, message, .. } => {
                self.status = RunStatus::Failed;
                self.error = Some(RunFailure {
                    code: *code,
                    message: message.clone(),
                });
            }
        }
        self.last_seq = event.seq;
        true
    }
}

/// A conversation as a viewer sees it: its runs in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub session_id: SessionId,
    pub runs: Vec<RunView>,
}

impl SessionView {
    pub fn new(session_id: SessionId) -> Self {
        Self {
            session_id,
            runs: Vec::new(),
        }
    }

    /// Applies an event to the run it belongs to, starting a new run on `runStarted`.
    pub fn apply(&mut self, event: &RunEvent) -> bool {
        let run_id = event_run_id(&event.event);
        if let Some(run) = self.runs.iter_mut().find(|run| &run.run_id == run_id) {
            return run.apply(event);
        }
        match RunView::start(event) {
            Some(run) => {
                self.runs.push(run);
                true
            }
            None => false,
        }
    }

    /// The run still going, if any (a session runs one at a time).
    pub fn active_run(&self) -> Option<&RunView> {
        self.runs.iter().rev().find(|run| !run.is_finished())
    }

    pub fn pending_approvals(&self) -> impl Iterator<Item = &ApprovalRequest> {
        self.runs.iter().flat_map(RunView::pending_approvals)
    }
}

/// The run an event belongs to.
pub fn event_run_id(event: &StreamEvent) -> &RunId {
    match event {
        StreamEvent::RunStarted { run_id, .. }
        | StreamEvent::Step { run_id, .. }
        | StreamEvent::AssistantDelta { run_id, .. }
        | StreamEvent::ToolCall { run_id, .. }
        | StreamEvent::ApprovalResolved { run_id, .. }
        | StreamEvent::ToolResult { run_id, .. }
        | StreamEvent::Debug { run_id, .. }
        | StreamEvent::ContextTrimmed { run_id, .. }
        | StreamEvent::Done { run_id, .. }
        | StreamEvent::Interrupted { run_id, .. }
        | StreamEvent::Error { run_id, .. } => run_id,
        StreamEvent::ApprovalRequired { request } => &request.run_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ApprovalSource, DecisionScope};
    use serde_json::json;

    fn run_id() -> RunId {
        RunId::parse("run_1").unwrap()
    }

    fn call_id() -> ToolCallId {
        ToolCallId::parse("call_1").unwrap()
    }

    fn events() -> Vec<RunEvent> {
        let request = ApprovalRequest {
            run_id: run_id(),
            tool_call_id: call_id(),
            tool_name: "delete_file".into(),
            arguments: json!({"path": "a.txt"}),
            reason: "destructive".into(),
            choices: Default::default(),
            requested_at: 1,
            expires_at: 2,
            preview: None,
        };
        let list = [
            StreamEvent::RunStarted {
                run_id: run_id(),
                session_id: SessionId::parse("s").unwrap(),
                message: "delete a.txt".into(),
                policy: ApprovalPolicy::OnRequest,
                approval_mode: ApprovalMode::Interactive,
                parent_run_id: None,
            },
            StreamEvent::Step {
                run_id: run_id(),
                step: 1,
            },
            StreamEvent::ToolCall {
                run_id: run_id(),
                step: 1,
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                arguments: json!({"path": "a.txt"}),
                permission: PermissionDecision::Ask {
                    reason: "destructive".into(),
                },
            },
            StreamEvent::ApprovalRequired { request },
            StreamEvent::ApprovalResolved {
                run_id: run_id(),
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                resolution: Resolution::Approved {
                    source: ApprovalSource::User,
                    scope: DecisionScope::Once,
                    reason: None,
                    edited_arguments: None,
                },
                grant: None,
            },
            StreamEvent::ToolResult {
                run_id: run_id(),
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                executed_arguments: None,
                output: ToolOutput::Ok {
                    content: json!({"deleted": true}),
                },
                duration_ms: 1,
            },
            StreamEvent::Step {
                run_id: run_id(),
                step: 2,
            },
            StreamEvent::AssistantDelta {
                run_id: run_id(),
                step: 2,
                delta: "Deleted ".into(),
            },
            StreamEvent::AssistantDelta {
                run_id: run_id(),
                step: 2,
                delta: "a.txt.".into(),
            },
            StreamEvent::Done {
                run_id: run_id(),
                answer: "Deleted a.txt.".into(),
                steps: 2,
            },
        ];
        list.into_iter()
            .enumerate()
            .map(|(i, event)| RunEvent {
                seq: i as u64 + 1,
                event,
            })
            .collect()
    }

    /// A run whose process died gives its session what it was asked and did, as its end would have: the person's
    /// message, each step's text and calls, each call's result (bounded as its tool bounds what its model reads),
    /// and for a call without one, that whether it ran is unknown; every call answered, as model APIs require.
    #[test]
    fn a_run_cut_short_gives_the_messages_it_added() {
        let mut events: Vec<RunEvent> = events().into_iter().take(6).collect();
        let second = ToolCallId::parse("call_2").unwrap();
        for event in [
            StreamEvent::Step {
                run_id: run_id(),
                step: 2,
            },
            StreamEvent::AssistantDelta {
                run_id: run_id(),
                step: 2,
                delta: "And the other.".into(),
            },
            StreamEvent::ToolCall {
                run_id: run_id(),
                step: 2,
                tool_call_id: second.clone(),
                tool_name: "delete_file".into(),
                arguments: json!({"path": "b.txt"}),
                permission: PermissionDecision::Ask {
                    reason: "destructive".into(),
                },
            },
        ] {
            let seq = events.len() as u64 + 1;
            events.push(RunEvent { seq, event });
        }
        let view = RunView::from_events(&events).unwrap();
        let messages = view.messages(|_| None);
        assert_eq!(messages.len(), 5, "{messages:?}");
        assert_eq!(
            messages[0],
            Message::User {
                content: "delete a.txt".into()
            }
        );
        assert!(
            matches!(&messages[1], Message::Assistant { content, tool_calls }
                if content.is_empty() && tool_calls.len() == 1 && tool_calls[0].id == call_id()
                    && tool_calls[0].arguments_json().ok() == Some(json!({"path": "a.txt"})))
        );
        assert!(
            matches!(&messages[2], Message::Tool { tool_call_id, output: ToolOutput::Ok { content }, .. }
                if tool_call_id == &call_id() && content == &json!({"deleted": true}))
        );
        assert!(
            matches!(&messages[3], Message::Assistant { content, tool_calls }
                if content == "And the other." && tool_calls[0].id == second)
        );
        assert!(
            matches!(&messages[4], Message::Tool { tool_call_id, output: ToolOutput::Error { code: ToolErrorCode::ToolFailed, message }, .. }
                if tool_call_id == &second && message.contains("whether it ran is unknown"))
        );
        // A result its tool bounds for the model is bounded here too.
        let mut long = events.clone();
        if let StreamEvent::ToolResult { output, .. } = &mut long[5].event {
            *output = ToolOutput::Ok {
                content: json!("x".repeat(10_000)),
            };
        }
        let bounded = RunView::from_events(&long)
            .unwrap()
            .messages(|_| Some(1_000));
        let Message::Tool { output, .. } = &bounded[2] else {
            panic!("{bounded:?}");
        };
        assert!(serde_json::to_string(output).unwrap().len() < 2_000);
    }

    #[test]
    fn folding_a_run_gives_its_steps_calls_and_answer() {
        let events = events();
        let view = RunView::from_events(&events).unwrap();
        assert_eq!(view.status, RunStatus::Done);
        assert_eq!(view.steps.len(), 2);
        assert_eq!(view.steps[1].text, "Deleted a.txt.");
        let call = &view.steps[0].tool_calls[0];
        assert_eq!(call.status(), ToolCallStatus::Succeeded);
        assert!(call.resolution.as_ref().unwrap().is_approved());
        assert_eq!(view.last_seq, 10);
        assert_eq!(view.pending_approvals().count(), 0);
    }

    #[test]
    fn a_pending_approval_shows_until_it_is_resolved() {
        let events = events();
        let view = RunView::from_events(&events[..4]).unwrap();
        assert_eq!(view.pending_approvals().count(), 1);
        assert_eq!(
            view.steps[0].tool_calls[0].status(),
            ToolCallStatus::AwaitingApproval
        );
    }

    #[test]
    fn replayed_events_are_applied_once() {
        let events = events();
        let mut view = RunView::from_events(&events[..8]).unwrap();
        // A reconnect that starts a little early replays events 7 and 8.
        for event in &events[6..] {
            view.apply(event);
        }
        assert_eq!(view, RunView::from_events(&events).unwrap());
        assert_eq!(view.steps[1].text, "Deleted a.txt.");
    }

    #[test]
    fn a_session_view_routes_events_to_their_runs() {
        let mut session = SessionView::new(SessionId::parse("s").unwrap());
        for event in &events()[..4] {
            assert!(session.apply(event));
        }
        assert_eq!(session.runs.len(), 1);
        assert_eq!(session.active_run().unwrap().run_id, run_id());
        assert_eq!(session.pending_approvals().count(), 1);
    }
}
