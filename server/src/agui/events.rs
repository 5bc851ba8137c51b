//! The run's events, projected to AG-UI events.
//!
//! A run's own events already say everything; this keeps the little state AG-UI needs on top (which text message
//! is open, which message id each step's assistant message has) and builds the `MESSAGES_SNAPSHOT` that ends a
//! run: the client's messages as it sent them, then the run's new ones.
//!
//! Each AG-UI event is a typed value that borrows from the run's event and is serialized once, straight into the
//! text that goes out: no tree of JSON values is built on the way (that tree, its map inserts and its walk were
//! about a tenth of the server's CPU per AG-UI round trip with the `memory` store). Each of the run's events is read
//! from its stored JSON by its kind, into the fields the translation uses (strings borrowed when they hold no
//! escape); the rest is scanned past, not decoded (decoding whole events, as
//! [`StreamEvent`](agent::wire::StreamEvent)s, took 6.5% more instructions per AG-UI round trip with the `memory`
//! store).

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};

use agent::ids::{RunId, SessionId, ToolCallId};
use agent::wire::{DecisionScope, InterruptRequest, Message, RunErrorCode, ToolCall, ToolOutput};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::resume::response_schema;

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` from milliseconds since the Unix epoch.
pub fn iso8601(ms: u64) -> String {
    let (year, month, day) = agent::dates::civil_from_days((ms / 86_400_000) as i64);
    let day_ms = ms % 86_400_000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// What a resume may answer to an interrupt: the same for every interrupt, so built and encoded once (as a value,
/// every `RUN_FINISHED` that carries interrupts walked its tree again).
static RESPONSE_SCHEMA: LazyLock<Box<RawValue>> = LazyLock::new(|| {
    serde_json::value::to_raw_value(&response_schema(true)).expect("a JSON value encodes")
});

/// The schema of an interrupt whose call offers no approval for the thread: `scope` is `once` alone.
static ONCE_ONLY_SCHEMA: LazyLock<Box<RawValue>> = LazyLock::new(|| {
    serde_json::value::to_raw_value(&response_schema(false)).expect("a JSON value encodes")
});

/// The AG-UI events this server sends, each borrowing what it says from the run.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
enum AguiEvent<'a> {
    #[serde(rename_all = "camelCase")]
    RunStarted {
        thread_id: &'a SessionId,
        run_id: &'a RunId,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<&'a RunId>,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageStart {
        message_id: &'a str,
        role: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageContent {
        message_id: &'a str,
        delta: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageEnd {
        message_id: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallStart {
        tool_call_id: &'a ToolCallId,
        tool_call_name: &'a str,
        parent_message_id: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallArgs {
        tool_call_id: &'a ToolCallId,
        delta: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallEnd {
        tool_call_id: &'a ToolCallId,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallResult {
        message_id: &'a str,
        tool_call_id: &'a ToolCallId,
        content: &'a str,
        role: &'static str,
    },
    MessagesSnapshot {
        messages: Snapshot<'a>,
    },
    #[serde(rename_all = "camelCase")]
    RunFinished {
        thread_id: &'a SessionId,
        run_id: &'a RunId,
        outcome: Outcome<'a>,
    },
    RunError {
        message: &'a str,
        code: RunErrorCode,
    },
    Custom {
        name: &'static str,
        value: TrimmedContext,
    },
}

/// What `RUN_ERROR` says when a run ended but the conversation it ended with could not be read.
pub const UNREAD_ENDING: &str = "The run ended, but the conversation it ended with could not be read (the database did not answer, or the run was already forgotten), so no snapshot was sent: it would have replaced yours without the run's part.";

/// How a run ended, as `RUN_FINISHED` says it.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Outcome<'a> {
    Success,
    Interrupt { interrupts: Vec<Interrupt<'a>> },
}

/// One interrupt as AG-UI clients read it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Interrupt<'a> {
    id: &'a str,
    reason: &'static str,
    message: &'a str,
    tool_call_id: &'a ToolCallId,
    response_schema: &'static RawValue,
    expires_at: String,
    metadata: InterruptMetadata<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InterruptMetadata<'a> {
    tool_name: &'a str,
    arguments: &'a Value,
    /// What `scope: "session"` would cover (the card's words), when it is on offer.
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionChoice<'a>>,
    /// Why it is not on offer, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_note: Option<&'a str>,
}

/// The approval for the thread an interrupt offers, as the page's card says it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionChoice<'a> {
    label: &'a str,
    covers: &'a str,
}

impl<'a> From<&'a InterruptRequest> for Interrupt<'a> {
    fn from(interrupt: &'a InterruptRequest) -> Self {
        let session = interrupt
            .choices
            .session
            .iter()
            .find(|choice| choice.scope == DecisionScope::Session);
        // An interrupt an older version issued says nothing of its choices: its schema stays the one it had.
        let offers_session = session.is_some() || interrupt.choices.is_empty();
        Self {
            id: &interrupt.id,
            reason: "tool_call",
            message: &interrupt.reason,
            tool_call_id: &interrupt.tool_call_id,
            response_schema: if offers_session {
                &RESPONSE_SCHEMA
            } else {
                &ONCE_ONLY_SCHEMA
            },
            expires_at: iso8601(interrupt.expires_at),
            metadata: InterruptMetadata {
                tool_name: &interrupt.tool_name,
                arguments: &interrupt.arguments,
                session: session.map(|choice| SessionChoice {
                    label: &choice.label,
                    covers: &choice.covers,
                }),
                session_note: session
                    .is_none()
                    .then_some(interrupt.choices.session_note.as_deref())
                    .flatten(),
            },
        }
    }
}

/// The value of the `toolgate.contextTrimmed` custom event.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TrimmedContext {
    omitted_messages: u32,
}

/// The conversation at the end of a run: the client's messages as sent, then the run's new ones.
struct Snapshot<'a> {
    client: &'a [Value],
    new: Vec<SnapshotMessage<'a>>,
}

impl Serialize for Snapshot<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.client.len() + self.new.len()))?;
        for message in self.client {
            seq.serialize_element(message)?;
        }
        for message in &self.new {
            seq.serialize_element(message)?;
        }
        seq.end()
    }
}

/// The AG-UI form of one of the run's new messages.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum SnapshotMessage<'a> {
    #[serde(rename_all = "camelCase")]
    Assistant {
        id: String,
        #[serde(skip_serializing_if = "str::is_empty")]
        content: &'a str,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<SnapshotCall<'a>>,
    },
    #[serde(rename_all = "camelCase")]
    Tool {
        id: String,
        tool_call_id: &'a ToolCallId,
        content: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
    },
}

impl SnapshotMessage<'_> {
    fn id(&self) -> &str {
        match self {
            Self::Assistant { id, .. } | Self::Tool { id, .. } => id,
        }
    }
}

/// A tool call of an assistant message, in the OpenAI shape AG-UI uses.
#[derive(Serialize)]
struct SnapshotCall<'a> {
    id: &'a ToolCallId,
    #[serde(rename = "type")]
    kind: &'static str,
    function: SnapshotFunction<'a>,
}

#[derive(Serialize)]
struct SnapshotFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl<'a> From<&'a ToolCall> for SnapshotCall<'a> {
    fn from(call: &'a ToolCall) -> Self {
        Self {
            id: &call.id,
            kind: "function",
            function: SnapshotFunction {
                name: &call.name,
                arguments: &call.arguments,
            },
        }
    }
}

/// The id of a tool result message: the same in `TOOL_CALL_RESULT` and in the snapshot.
fn result_id(tool_call_id: &ToolCallId) -> String {
    format!("result_{tool_call_id}")
}

/// A message of the run's conversation as the snapshot shows it; `None` for those the client sent.
fn snapshot_message<'a>(
    message: &'a Message,
    assistant_id: &mut impl FnMut() -> String,
) -> Option<SnapshotMessage<'a>> {
    match message {
        Message::Assistant {
            content,
            tool_calls,
        } => Some(SnapshotMessage::Assistant {
            id: assistant_id(),
            content,
            tool_calls: tool_calls.iter().map(SnapshotCall::from).collect(),
        }),
        Message::Tool {
            tool_call_id,
            output,
            ..
        } => Some(SnapshotMessage::Tool {
            id: result_id(tool_call_id),
            tool_call_id,
            content: output.model_text(),
            error: match output {
                ToolOutput::Error { message, .. } => Some(message),
                ToolOutput::Ok { .. } => None,
            },
        }),
        // The user's message and context came from the client, which has them.
        Message::User { .. } | Message::System { .. } => None,
    }
}

/// What the translation reads of a `runStarted` event.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Started {
    #[serde(default)]
    parent_run_id: Option<RunId>,
}

/// What it reads of a `step` event.
#[derive(Deserialize)]
struct Step {
    step: u32,
}

/// What it reads of an `assistantDelta` event.
#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    delta: std::borrow::Cow<'a, str>,
}

/// What it reads of a `toolCall` event: its arguments as stored, a JSON string of the model's text or a JSON value.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Called<'a> {
    tool_call_id: ToolCallId,
    #[serde(borrow)]
    tool_name: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

/// What it reads of a `toolResult` event.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Returned {
    tool_call_id: ToolCallId,
    output: ToolOutput,
}

/// What it reads of an `interrupted` event.
#[derive(Deserialize)]
struct Interrupted {
    interrupts: Vec<InterruptRequest>,
}

/// What it reads of an `error` event.
#[derive(Deserialize)]
struct Failed {
    code: RunErrorCode,
    message: String,
}

/// What it reads of a `contextTrimmed` event.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trimmed {
    omitted_messages: u32,
}

/// The kinds of event the translation reads; it skips the others ([`Translator::ignores`]).
const TRANSLATED: [&str; 9] = [
    "runStarted",
    "step",
    "assistantDelta",
    "toolCall",
    "toolResult",
    "done",
    "interrupted",
    "error",
    "contextTrimmed",
];

/// One AG-UI event as the text of an SSE `data:` line.
fn encode(event: &AguiEvent<'_>, out: &mut Vec<String>) {
    match serde_json::to_string(event) {
        Ok(json) => out.push(json),
        // Nothing in these types can fail to serialize (no map has non-string keys); say so if it ever does.
        Err(error) => tracing::error!(%error, "an AG-UI event could not be encoded"),
    }
}

/// Turns one run's events into AG-UI events.
pub struct Translator {
    thread_id: SessionId,
    run_id: RunId,
    /// The client's messages, as sent.
    client_messages: Vec<Value>,
    /// How many leading messages of the run's conversation the client already has.
    known: usize,
    /// Calls of a resumed batch: AG-UI does not replay their start and arguments.
    resumed: HashSet<ToolCallId>,
    /// The message id of each step's assistant message, in step order.
    step_ids: Vec<String>,
    open_text: Option<String>,
}

impl Translator {
    pub fn new(
        thread_id: SessionId,
        run_id: RunId,
        client_messages: Vec<Value>,
        known: usize,
        resumed: HashSet<ToolCallId>,
    ) -> Self {
        Self {
            thread_id,
            run_id,
            client_messages,
            known,
            resumed,
            step_ids: Vec::new(),
            open_text: None,
        }
    }

    /// Whether events of this `type` become no AG-UI event and change nothing here (AG-UI has no event for
    /// approvals or debug notes; the snapshot at the end carries what the client needs), so that they need not be
    /// read back at all.
    pub fn ignores(kind: &str) -> bool {
        !TRANSLATED.contains(&kind)
    }

    fn step_id(&self) -> String {
        self.step_ids
            .last()
            .cloned()
            .unwrap_or_else(|| format!("msg_{}_0", self.run_id))
    }

    fn close_text(&mut self, out: &mut Vec<String>) {
        if let Some(message_id) = self.open_text.take() {
            encode(
                &AguiEvent::TextMessageEnd {
                    message_id: &message_id,
                },
                out,
            );
        }
    }

    /// The run's new messages for the snapshot, without those the client sent already.
    fn new_messages<'a>(&self, conversation: &'a [Message]) -> Vec<SnapshotMessage<'a>> {
        let have: HashSet<&str> = self
            .client_messages
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str))
            .collect();
        // The k-th assistant message of the run was made in its k-th step, whose id the text events used.
        let mut step_ids = self.step_ids.iter();
        let mut unnamed = 0;
        let mut assistant_id = || match step_ids.next() {
            Some(id) => id.clone(),
            None => {
                unnamed += 1;
                format!("msg_{}_extra{unnamed}", self.run_id)
            }
        };
        conversation
            .iter()
            .skip(self.known)
            .filter_map(|message| snapshot_message(message, &mut assistant_id))
            .filter(|message| !have.contains(message.id()))
            .collect()
    }

    /// Ends the run: the conversation's snapshot, then `RUN_FINISHED` with its outcome; `RUN_ERROR` when the
    /// conversation it ended with could not be read.
    fn finish(
        &mut self,
        out: &mut Vec<String>,
        outcome: Outcome<'_>,
        conversation: impl FnOnce() -> Option<Arc<[Message]>>,
    ) {
        self.close_text(out);
        let Some(conversation) = conversation() else {
            // The run ended, but what it ended with could not be read. The client replaces its conversation with the
            // snapshot: one without the run's part would take the answer (or the interrupted calls, and with them
            // any resume) from it. Nothing is better than that, and the error says why.
            encode(
                &AguiEvent::RunError {
                    message: UNREAD_ENDING,
                    code: RunErrorCode::Store,
                },
                out,
            );
            return;
        };
        encode(
            &AguiEvent::MessagesSnapshot {
                messages: Snapshot {
                    client: &self.client_messages,
                    new: self.new_messages(&conversation),
                },
            },
            out,
        );
        encode(
            &AguiEvent::RunFinished {
                thread_id: &self.thread_id,
                run_id: &self.run_id,
                outcome,
            },
            out,
        );
    }

    /// The AG-UI events for one of the run's events (its `type` and its stored JSON), each as the JSON text of one SSE
    /// `data:` line. `conversation` is read only when the run ends. An event of a kind this translation does not read
    /// becomes nothing; one that does not read as its kind is an error.
    pub fn translate(
        &mut self,
        kind: &str,
        json: &str,
        conversation: impl FnOnce() -> Option<Arc<[Message]>>,
    ) -> Result<Vec<String>, serde_json::Error> {
        let mut out = Vec::new();
        match kind {
            "runStarted" => {
                let Started { parent_run_id } = serde_json::from_str(json)?;
                encode(
                    &AguiEvent::RunStarted {
                        thread_id: &self.thread_id,
                        run_id: &self.run_id,
                        parent_run_id: parent_run_id.as_ref(),
                    },
                    &mut out,
                );
            }
            "step" => {
                let Step { step } = serde_json::from_str(json)?;
                self.close_text(&mut out);
                self.step_ids.push(format!("msg_{}_{step}", self.run_id));
            }
            "assistantDelta" => {
                let Delta { delta } = serde_json::from_str(json)?;
                if self.open_text.is_none() {
                    let message_id = self.step_id();
                    encode(
                        &AguiEvent::TextMessageStart {
                            message_id: &message_id,
                            role: "assistant",
                        },
                        &mut out,
                    );
                    self.open_text = Some(message_id);
                }
                if let Some(message_id) = &self.open_text {
                    encode(
                        &AguiEvent::TextMessageContent {
                            message_id,
                            delta: &delta,
                        },
                        &mut out,
                    );
                }
            }
            "toolCall" => {
                let Called {
                    tool_call_id,
                    tool_name,
                    arguments,
                } = serde_json::from_str(json)?;
                // The model's text of the arguments when it was stored as such; else the value, as stored.
                let text;
                let arguments = if arguments.get().starts_with('"') {
                    text = serde_json::from_str::<String>(arguments.get())?;
                    text.as_str()
                } else {
                    arguments.get()
                };
                self.close_text(&mut out);
                if !self.resumed.contains(&tool_call_id) {
                    let parent_message_id = self.step_id();
                    for event in [
                        AguiEvent::ToolCallStart {
                            tool_call_id: &tool_call_id,
                            tool_call_name: &tool_name,
                            parent_message_id: &parent_message_id,
                        },
                        AguiEvent::ToolCallArgs {
                            tool_call_id: &tool_call_id,
                            delta: arguments,
                        },
                        AguiEvent::ToolCallEnd {
                            tool_call_id: &tool_call_id,
                        },
                    ] {
                        encode(&event, &mut out);
                    }
                }
            }
            "toolResult" => {
                let Returned {
                    tool_call_id,
                    output,
                } = serde_json::from_str(json)?;
                self.close_text(&mut out);
                encode(
                    &AguiEvent::ToolCallResult {
                        message_id: &result_id(&tool_call_id),
                        tool_call_id: &tool_call_id,
                        content: &output.model_text(),
                        role: "tool",
                    },
                    &mut out,
                );
            }
            "done" => self.finish(&mut out, Outcome::Success, conversation),
            "interrupted" => {
                let Interrupted { interrupts } = serde_json::from_str(json)?;
                self.finish(
                    &mut out,
                    Outcome::Interrupt {
                        interrupts: interrupts.iter().map(Interrupt::from).collect(),
                    },
                    conversation,
                );
            }
            "error" => {
                let Failed { code, message } = serde_json::from_str(json)?;
                self.close_text(&mut out);
                encode(
                    &AguiEvent::RunError {
                        message: &message,
                        code,
                    },
                    &mut out,
                );
            }
            "contextTrimmed" => {
                let Trimmed { omitted_messages } = serde_json::from_str(json)?;
                // The client owns the conversation; it should know the model saw less of it.
                encode(
                    &AguiEvent::Custom {
                        name: "toolgate.contextTrimmed",
                        value: TrimmedContext { omitted_messages },
                    },
                    &mut out,
                );
            }
            // Approvals and debug notes (see `ignores`), and kinds newer than this translation.
            _ => {}
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use agent::wire::{
        ApprovalMode, ApprovalPolicy, PermissionDecision, StreamEvent, ToolErrorCode,
    };
    use serde_json::json;

    use super::*;

    fn run_id(id: &str) -> RunId {
        RunId::parse(id).unwrap()
    }

    fn call_id() -> ToolCallId {
        ToolCallId::parse("call_1").unwrap()
    }

    fn started(run: &str, parent: Option<&str>) -> StreamEvent {
        StreamEvent::RunStarted {
            run_id: run_id(run),
            session_id: SessionId::parse("thread-1").unwrap(),
            message: "delete a.txt".into(),
            policy: ApprovalPolicy::OnRequest,
            approval_mode: ApprovalMode::Interrupt,
            parent_run_id: parent.map(run_id),
        }
    }

    fn delta(run: &str, step: u32, text: &str) -> StreamEvent {
        StreamEvent::AssistantDelta {
            run_id: run_id(run),
            step,
            delta: text.into(),
        }
    }

    fn tool_call(run: &str) -> StreamEvent {
        StreamEvent::ToolCall {
            run_id: run_id(run),
            step: 1,
            tool_call_id: call_id(),
            tool_name: "delete_file".into(),
            arguments: Value::String(r#"{"path":"a.txt"}"#.into()),
            permission: PermissionDecision::Ask {
                reason: "it deletes".into(),
            },
        }
    }

    fn call() -> ToolCall {
        ToolCall {
            id: call_id(),
            name: "delete_file".into(),
            arguments: r#"{"path":"a.txt"}"#.into(),
        }
    }

    fn denied() -> ToolOutput {
        ToolOutput::error(ToolErrorCode::ApprovalDenied, "Not today.")
    }

    /// A translator for `run` of thread `thread-1`, whose client sent no message.
    fn fresh(run: RunId) -> Translator {
        Translator::new(
            SessionId::parse("thread-1").unwrap(),
            run,
            Vec::new(),
            0,
            HashSet::new(),
        )
    }

    /// What the translator makes of `event`, stored as the run stores it.
    fn translate(
        translator: &mut Translator,
        event: &StreamEvent,
        conversation: impl FnOnce() -> Option<Arc<[Message]>>,
    ) -> Vec<String> {
        let stored = serde_json::to_string(event).unwrap();
        translator
            .translate(event.kind(), &stored, conversation)
            .unwrap()
    }

    /// Every AG-UI event the translator made for `events`, parsed back.
    fn project(
        translator: &mut Translator,
        events: &[StreamEvent],
        conversation: &[Message],
    ) -> Vec<Value> {
        events
            .iter()
            .flat_map(|event| translate(translator, event, || Some(Arc::from(conversation))))
            .map(|json| serde_json::from_str(&json).unwrap())
            .collect()
    }

    #[test]
    fn iso8601_is_utc_with_milliseconds() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(1_796_001_492_433), "2026-11-30T01:18:12.433Z");
    }

    /// A run whose ending conversation could not be read ends with RUN_ERROR, never with a snapshot that would
    /// replace the client's conversation without the run's part. Before, the snapshot held the client's messages
    /// alone, and RUN_FINISHED followed.
    #[test]
    fn a_run_whose_conversation_could_not_be_read_ends_with_run_error_and_no_snapshot() {
        let run = run_id("run-a");
        let mut translator = fresh(run.clone());
        let done = StreamEvent::Done {
            run_id: run,
            answer: "Deleted.".into(),
            steps: 2,
        };
        let events: Vec<Value> = translate(&mut translator, &done, || None)
            .iter()
            .map(|json| serde_json::from_str(json).unwrap())
            .collect();
        assert_eq!(
            events,
            [json!({"type": "RUN_ERROR", "message": UNREAD_ENDING, "code": "STORE"})]
        );
    }

    #[test]
    fn a_run_that_meets_a_call_needing_a_person_ends_with_its_snapshot_and_an_interrupt() {
        let user = json!({"id": "user-1", "role": "user", "content": "delete a.txt"});
        let mut translator = Translator::new(
            SessionId::parse("thread-1").unwrap(),
            run_id("run-a"),
            vec![user.clone()],
            1,
            HashSet::new(),
        );
        let interrupt = InterruptRequest {
            id: "int_1".into(),
            tool_call_id: call_id(),
            tool_name: "delete_file".into(),
            arguments: json!({"path": "a.txt"}),
            reason: "it deletes".into(),
            expires_at: 1_796_001_492_433,
            choices: Default::default(),
        };
        let events = [
            started("run-a", None),
            StreamEvent::Step {
                run_id: run_id("run-a"),
                step: 1,
            },
            delta("run-a", 1, "Let me "),
            delta("run-a", 1, "check."),
            tool_call("run-a"),
            StreamEvent::Debug {
                run_id: run_id("run-a"),
                at: 1,
                message: "policy asked".into(),
                data: None,
            },
            StreamEvent::Interrupted {
                run_id: run_id("run-a"),
                interrupts: vec![interrupt],
            },
        ];
        let conversation = [
            Message::User {
                content: "delete a.txt".into(),
            },
            Message::Assistant {
                content: "Let me check.".into(),
                tool_calls: vec![call()],
            },
        ];

        let projected = project(&mut translator, &events, &conversation);

        assert_eq!(
            projected,
            [
                json!({"type": "RUN_STARTED", "threadId": "thread-1", "runId": "run-a"}),
                json!({"type": "TEXT_MESSAGE_START", "messageId": "msg_run-a_1", "role": "assistant"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg_run-a_1", "delta": "Let me "}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg_run-a_1", "delta": "check."}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "msg_run-a_1"}),
                json!({"type": "TOOL_CALL_START", "toolCallId": "call_1", "toolCallName": "delete_file", "parentMessageId": "msg_run-a_1"}),
                json!({"type": "TOOL_CALL_ARGS", "toolCallId": "call_1", "delta": r#"{"path":"a.txt"}"#}),
                json!({"type": "TOOL_CALL_END", "toolCallId": "call_1"}),
                json!({"type": "MESSAGES_SNAPSHOT", "messages": [
                    user,
                    {"id": "msg_run-a_1", "role": "assistant", "content": "Let me check.", "toolCalls": [
                        {"id": "call_1", "type": "function", "function": {"name": "delete_file", "arguments": r#"{"path":"a.txt"}"#}},
                    ]},
                ]}),
                json!({"type": "RUN_FINISHED", "threadId": "thread-1", "runId": "run-a", "outcome": {
                    "type": "interrupt",
                    "interrupts": [{
                        "id": "int_1",
                        "reason": "tool_call",
                        "message": "it deletes",
                        "toolCallId": "call_1",
                        "responseSchema": response_schema(true),
                        "expiresAt": "2026-11-30T01:18:12.433Z",
                        "metadata": {"toolName": "delete_file", "arguments": {"path": "a.txt"}},
                    }],
                }}),
            ]
        );
    }

    #[test]
    fn a_resume_reports_the_result_not_the_call_again_and_snapshots_only_what_is_new() {
        let client = vec![
            json!({"id": "user-1", "role": "user", "content": "delete a.txt"}),
            json!({"id": "msg_run-a_1", "role": "assistant", "toolCalls": [
                {"id": "call_1", "type": "function", "function": {"name": "delete_file", "arguments": r#"{"path":"a.txt"}"#}},
            ]}),
        ];
        let mut translator = Translator::new(
            SessionId::parse("thread-1").unwrap(),
            run_id("run-b"),
            client.clone(),
            2,
            HashSet::from([call_id()]),
        );
        let events = [
            started("run-b", Some("run-a")),
            tool_call("run-b"),
            StreamEvent::ToolResult {
                run_id: run_id("run-b"),
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                executed_arguments: None,
                output: denied(),
                duration_ms: 0,
            },
            StreamEvent::Step {
                run_id: run_id("run-b"),
                step: 2,
            },
            delta("run-b", 2, "I left it."),
            StreamEvent::ContextTrimmed {
                run_id: run_id("run-b"),
                step: 2,
                omitted_messages: 3,
            },
            StreamEvent::Done {
                run_id: run_id("run-b"),
                answer: "I left it.".into(),
                steps: 2,
            },
        ];
        let conversation = [
            Message::User {
                content: "delete a.txt".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call()],
            },
            Message::Tool {
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                output: denied(),
            },
            Message::Assistant {
                content: "I left it.".into(),
                tool_calls: Vec::new(),
            },
        ];

        let projected = project(&mut translator, &events, &conversation);

        let denied_text = denied().model_text();
        let mut snapshot = client.clone();
        snapshot.push(json!({"id": "result_call_1", "role": "tool", "toolCallId": "call_1", "content": denied_text, "error": "Not today."}));
        snapshot.push(json!({"id": "msg_run-b_2", "role": "assistant", "content": "I left it."}));
        assert_eq!(
            projected,
            [
                json!({"type": "RUN_STARTED", "threadId": "thread-1", "runId": "run-b", "parentRunId": "run-a"}),
                json!({"type": "TOOL_CALL_RESULT", "messageId": "result_call_1", "toolCallId": "call_1", "content": denied_text, "role": "tool"}),
                json!({"type": "TEXT_MESSAGE_START", "messageId": "msg_run-b_2", "role": "assistant"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg_run-b_2", "delta": "I left it."}),
                json!({"type": "CUSTOM", "name": "toolgate.contextTrimmed", "value": {"omittedMessages": 3}}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "msg_run-b_2"}),
                json!({"type": "MESSAGES_SNAPSHOT", "messages": snapshot}),
                json!({"type": "RUN_FINISHED", "threadId": "thread-1", "runId": "run-b", "outcome": {"type": "success"}}),
            ]
        );
    }

    #[test]
    fn a_run_that_fails_closes_its_text_and_says_why() {
        let mut translator = fresh(run_id("run-c"));
        let events = [
            delta("run-c", 1, "Hm"),
            StreamEvent::Error {
                run_id: run_id("run-c"),
                code: RunErrorCode::StepLimit,
                message: "Too many steps.".into(),
            },
        ];

        let projected = project(&mut translator, &events, &[]);

        assert_eq!(
            projected,
            [
                json!({"type": "TEXT_MESSAGE_START", "messageId": "msg_run-c_0", "role": "assistant"}),
                json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg_run-c_0", "delta": "Hm"}),
                json!({"type": "TEXT_MESSAGE_END", "messageId": "msg_run-c_0"}),
                json!({"type": "RUN_ERROR", "message": "Too many steps.", "code": "STEP_LIMIT"}),
            ]
        );
    }

    #[test]
    fn the_kinds_it_skips_unread_are_kinds_it_makes_nothing_of() {
        let run = run_id("run-d");
        for event in [
            StreamEvent::Debug {
                run_id: run.clone(),
                at: 1,
                message: "note".into(),
                data: Some(json!({"k": 1})),
            },
            StreamEvent::ApprovalResolved {
                run_id: run.clone(),
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                resolution: agent::wire::Resolution::Denied {
                    source: agent::wire::DenialSource::User,
                    reason: "no".into(),
                },
                grant: None,
            },
        ] {
            let mut translator = fresh(run.clone());
            assert!(Translator::ignores(event.kind()), "{}", event.kind());
            assert!(translate(&mut translator, &event, || None).is_empty());
        }
        let skipped: Vec<_> = StreamEvent::KINDS
            .into_iter()
            .filter(|kind| Translator::ignores(kind))
            .collect();
        assert_eq!(skipped, ["approvalRequired", "approvalResolved", "debug"]);
        // Each kind it reads has an arm that reads it: an event of the kind without its fields does not read.
        for kind in TRANSLATED {
            let mut translator = fresh(run.clone());
            let read = translator.translate(kind, "{}", || Some(Arc::from([])));
            match kind {
                "done" => assert_eq!(read.unwrap().len(), 2, "a snapshot and RUN_FINISHED"),
                "runStarted" => assert_eq!(read.unwrap().len(), 1, "RUN_STARTED"),
                _ => assert!(read.is_err(), "{kind}"),
            }
        }
    }

    /// Arguments the model sent as text go out as that text; arguments stored as a JSON value go out as its JSON.
    #[test]
    fn a_calls_arguments_go_out_as_the_text_they_were_stored_as() {
        let run = run_id("run-e");
        for (arguments, sent) in [
            (json!(r#"{"path": "a b.txt"}"#), r#"{"path": "a b.txt"}"#),
            (
                json!({"path": "a.txt", "n": 1.5}),
                r#"{"n":1.5,"path":"a.txt"}"#,
            ),
        ] {
            let mut translator = fresh(run.clone());
            let call = StreamEvent::ToolCall {
                run_id: run.clone(),
                step: 1,
                tool_call_id: call_id(),
                tool_name: "delete_file".into(),
                arguments,
                permission: PermissionDecision::Allow {
                    reason: "allowed".into(),
                },
            };
            let events = project(&mut translator, &[call], &[]);
            assert_eq!(events[1]["type"], "TOOL_CALL_ARGS", "{events:?}");
            assert_eq!(events[1]["delta"], sent, "{events:?}");
        }
    }

    /// A stored event that does not read as its kind is an error, not an AG-UI event made of a guess.
    #[test]
    fn an_event_that_does_not_read_as_its_kind_is_an_error() {
        let mut translator = fresh(run_id("run-f"));
        assert!(
            translator
                .translate("step", r#"{"type":"step"}"#, || None)
                .is_err()
        );
        assert!(
            translator
                .translate("toolCall", "not json", || None)
                .is_err()
        );
    }
}
