//! The chat-completions wire format: the request we send, the chunks we read, and the assembly of one step from
//! its chunks.
//!
//! Only the fields we use are modelled, and every field we read is optional: the OpenAI-compatible servers differ
//! in what they send (`null` or nothing, an `index` or none, `usage` in every chunk or only the last), and a
//! missing field we can do without must not fail a run.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ToolCallId;
use crate::model::{ModelChunk, ModelError, Usage};
use crate::wire::{Message, ToolCall, ToolSpec};

/// The longest piece of a provider's text we put into an error message.
const MAX_MESSAGE_CHARS: usize = 500;
/// The most text and tool-call arguments one step may carry. The largest call a built-in tool takes is a 1 MiB
/// write; a provider that streams more than this is broken or hostile, and our memory is not its to fill.
pub const MAX_STEP_BYTES: usize = 16 * 1024 * 1024;
/// The most tool calls one step may make: each is a card, a record and an event.
pub const MAX_CALLS_PER_STEP: usize = 256;
/// Finish reasons that say the answer stopped before its end.
const CUT_OFF: [&str; 2] = ["length", "content_filter"];

/// The body of `POST {base}/chat/completions`.
#[derive(Debug, Serialize)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: Vec<ChatMessage<'a>>,
    /// Left out when empty: OpenAI refuses an empty `tools` array.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ChatTool<'a>>,
    pub stream: bool,
    pub stream_options: StreamOptions,
}

impl<'a> ChatRequest<'a> {
    /// A streamed request for the next step of a conversation.
    pub fn new(model: &'a str, messages: &'a [Message], tools: &'a [ToolSpec]) -> Self {
        Self {
            model,
            messages: chat_messages(messages),
            tools: tools.iter().map(ChatTool::from_spec).collect(),
            stream: true,
            // Without it, streamed responses carry no token counts.
            stream_options: StreamOptions {
                include_usage: true,
            },
        }
    }
}

/// What the model reads for a call of a history that has no result for it.
pub const UNANSWERED: &str = "No result of this call reached the conversation (its approval expired, or its run ended before it answered), so whether it ran is not known: check before relying on it, or calling it again.";

/// The messages as the API takes them: each assistant message's tool calls followed at once by a result for each.
/// A client's history (AG-UI) may lack one (its approval expired, so the call never ran) or hold it later (after a
/// message the client added), and OpenAI refuses both, every later step of the thread with them: a result is
/// brought up to its call, and a call without one gets [`UNANSWERED`]. A result whose call is not in what is sent
/// (the trimming of a long conversation cut it off) is left out too: OpenAI refuses a result without its call.
fn chat_messages(messages: &[Message]) -> Vec<ChatMessage<'_>> {
    let mut placed = vec![false; messages.len()];
    let mut chat = Vec::with_capacity(messages.len());
    for (at, message) in messages.iter().enumerate() {
        if placed[at] || matches!(message, Message::Tool { .. }) {
            continue;
        }
        chat.push(ChatMessage::from_message(message));
        let Message::Assistant { tool_calls, .. } = message else {
            continue;
        };
        for call in tool_calls {
            let result = (at + 1..messages.len()).find(|&later| {
                !placed[later]
                    && matches!(&messages[later], Message::Tool { tool_call_id, .. } if *tool_call_id == call.id)
            });
            match result {
                Some(later) => {
                    placed[later] = true;
                    chat.push(ChatMessage::from_message(&messages[later]));
                }
                None => chat.push(ChatMessage::Tool {
                    tool_call_id: call.id.as_str(),
                    content: UNANSWERED.to_owned(),
                }),
            }
        }
    }
    chat
}

#[derive(Debug, Serialize)]
pub struct StreamOptions {
    pub include_usage: bool,
}

/// One message as the API expects it.
#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// `null` when the model only called tools, as the API itself reports such a message.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

impl<'a> ChatMessage<'a> {
    pub fn from_message(message: &'a Message) -> Self {
        match message {
            Message::System { content } => Self::System { content },
            Message::User { content } => Self::User { content },
            Message::Assistant {
                content,
                tool_calls,
            } => Self::Assistant {
                content: (!content.is_empty() || tool_calls.is_empty()).then_some(content.as_str()),
                tool_calls: tool_calls.iter().map(ChatToolCall::from_call).collect(),
            },
            // Every result goes back, denials included: the denial's wording is what keeps the model from
            // retrying the same call.
            Message::Tool {
                tool_call_id,
                output,
                ..
            } => Self::Tool {
                tool_call_id: tool_call_id.as_str(),
                content: output.model_text(),
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChatToolCall<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: ChatFunctionCall<'a>,
}

impl<'a> ChatToolCall<'a> {
    fn from_call(call: &'a ToolCall) -> Self {
        Self {
            id: call.id.as_str(),
            kind: "function",
            function: ChatFunctionCall {
                name: &call.name,
                // Models send an empty string for a call without arguments, and the tool runtime reads it as `{}`.
                // Servers that parse the history (Ollama, vLLM, llama.cpp) refuse what is not JSON, so a call whose
                // arguments were not JSON (the model was told so in its result) is sent back with none: the
                // run's log keeps what the model sent.
                arguments: if serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments).is_ok()
                {
                    &call.arguments
                } else {
                    "{}"
                },
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChatFunctionCall<'a> {
    pub name: &'a str,
    pub arguments: &'a str,
}

/// A tool the model may call.
#[derive(Debug, Serialize)]
pub struct ChatTool<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: ChatFunction<'a>,
}

impl<'a> ChatTool<'a> {
    fn from_spec(spec: &'a ToolSpec) -> Self {
        Self {
            kind: "function",
            function: ChatFunction {
                name: &spec.name,
                description: &spec.description,
                parameters: &spec.input_schema,
            },
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChatFunction<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub parameters: &'a Value,
}

/// One `data:` payload of the stream.
#[derive(Debug, Deserialize)]
pub struct ChatChunk {
    #[serde(default)]
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    /// Some servers report a failure inside the stream, after the 200.
    #[serde(default)]
    error: Option<Value>,
}

impl ChatChunk {
    /// Whether the chunk reports a failure rather than carrying the step.
    pub fn reports_error(&self) -> bool {
        self.error.as_ref().is_some_and(|error| !error.is_null())
    }
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    delta: Option<ChunkDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
    /// OpenAI's refusal text, sent instead of content. The person should read it like an answer.
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

impl From<ChunkUsage> for Usage {
    fn from(usage: ChunkUsage) -> Self {
        let prompt_tokens = usage.prompt_tokens.unwrap_or(0);
        let completion_tokens = usage.completion_tokens.unwrap_or(0);
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: usage
                .total_tokens
                .unwrap_or_else(|| prompt_tokens.saturating_add(completion_tokens)),
        }
    }
}

/// A tool call whose pieces are still arriving.
#[derive(Debug, Default)]
struct PartialCall {
    /// The `index` its pieces carry (its place when it came without one), then its place among the calls: the
    /// order they come out in.
    order: (u32, usize),
    id: Option<String>,
    name: String,
    arguments: String,
}

/// One step assembled from its chunks: text goes out as it arrives, tool calls and the rest when the step ends.
#[derive(Debug, Default)]
pub struct StepAssembler {
    /// In the order their first pieces came; they come out in the order of their `index`, as the model made them,
    /// even when their pieces interleave.
    calls: Vec<PartialCall>,
    /// The call each `index` last stood for. Some servers (Ollama, for one) give every call of a step the same
    /// index, each with an id of its own: a piece with another id, or another name, starts a new call.
    by_index: HashMap<u32, usize>,
    /// The call the last piece belonged to, for servers that send no `index`.
    last: Option<usize>,
    finish_reason: Option<String>,
    /// Text or a call's piece came after a reason: this server's reasons do not mean the step ended (some send one
    /// with every chunk), so only the stream's own end does.
    more_after_reason: bool,
    usage: Option<Usage>,
    /// The bytes of text and arguments taken so far.
    carried: usize,
}

impl StepAssembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// True once the model said why it stopped, and nothing but token counts came after: the step's content is
    /// complete even if the usage or the terminator never come. Not for a server that went on after a reason.
    pub fn has_finished(&self) -> bool {
        self.finish_reason.is_some() && !self.more_after_reason
    }

    /// True once the model gave a reason at all, whether or not more came after it: a stream that then ends cleanly
    /// (without `[DONE]`) ended the step.
    pub fn said_why(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Takes one chunk and returns the text it carries. A chunk that reports an error fails the step.
    pub fn apply(&mut self, chunk: ChatChunk) -> Result<Option<String>, ModelError> {
        if let Some(error) = chunk.error.filter(|error| !error.is_null()) {
            return Err(ModelError::Provider(error_message_in(&error)));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        let mut text = String::new();
        // We ask for one choice; a server that sends more gets its first one read.
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                let before = text.len();
                text.extend(delta.content);
                text.extend(delta.refusal);
                let pieces = delta.tool_calls.unwrap_or_default();
                self.more_after_reason |=
                    self.finish_reason.is_some() && (text.len() > before || !pieces.is_empty());
                for piece in pieces {
                    self.carry(piece_bytes(&piece))?;
                    self.add_call_piece(piece)?;
                }
            }
            // Some servers send an empty reason (sglang, older Ollama) or the text "null" (KoboldCpp) on every chunk,
            // for "not finished": only a reason with a name ends the step.
            // Some send a reason too early, with every chunk, or a `stop` after a `length`: what follows a reason is
            // still read, and a later reason replaces an earlier one, except that a step cut off stays cut off.
            if let Some(reason) = choice
                .finish_reason
                .filter(|reason| !reason.is_empty() && reason != "null")
                && !self
                    .finish_reason
                    .as_deref()
                    .is_some_and(|held| CUT_OFF.contains(&held))
            {
                self.finish_reason = Some(reason);
            }
        }
        self.carry(text.len())?;
        Ok((!text.is_empty()).then_some(text))
    }

    /// Counts what a chunk adds, refusing a step larger than [`MAX_STEP_BYTES`].
    fn carry(&mut self, bytes: usize) -> Result<(), ModelError> {
        self.carried = self.carried.saturating_add(bytes);
        if self.carried > MAX_STEP_BYTES {
            return Err(ModelError::TooLarge {
                limit: MAX_STEP_BYTES,
            });
        }
        Ok(())
    }

    fn add_call_piece(&mut self, piece: ToolCallDelta) -> Result<(), ModelError> {
        let id = piece.id.filter(|id| !id.is_empty());
        let name = piece
            .function
            .as_ref()
            .and_then(|function| function.name.clone())
            .filter(|name| !name.is_empty());
        // The call this piece goes on with, if any. Without an index, a known id names its call, a new id starts a
        // new call, and a piece without an id continues the last one.
        let current = match piece.index {
            Some(index) => self.by_index.get(&index).copied(),
            None => match &id {
                Some(id) => self
                    .calls
                    .iter()
                    .position(|call| call.id.as_ref() == Some(id)),
                None => self.last,
            },
        };
        // The id and the name come whole in the call's first piece; some servers repeat them in later pieces. Another
        // id or another name is another call.
        let continues = current.filter(|&at| {
            let call = &self.calls[at];
            let other_id = matches!((&call.id, &id), (Some(known), Some(new)) if known != new);
            let other_name =
                matches!(&name, Some(new) if !call.name.is_empty() && *new != call.name);
            !other_id && !other_name
        });
        let at = match continues {
            Some(at) => at,
            None => {
                let at = self.calls.len();
                if at == MAX_CALLS_PER_STEP {
                    return Err(ModelError::TooManyCalls {
                        limit: MAX_CALLS_PER_STEP,
                    });
                }
                let index = piece
                    .index
                    .unwrap_or_else(|| u32::try_from(at).unwrap_or(u32::MAX));
                self.calls.push(PartialCall {
                    order: (index, at),
                    ..PartialCall::default()
                });
                at
            }
        };
        if let Some(index) = piece.index {
            self.by_index.insert(index, at);
        }
        self.last = Some(at);
        let call = &mut self.calls[at];
        if call.id.is_none() {
            call.id = id;
        }
        if let Some(name) = name
            && call.name.is_empty()
        {
            call.name = name;
        }
        if let Some(arguments) = piece.function.and_then(|function| function.arguments) {
            call.arguments.push_str(&arguments);
        }
        Ok(())
    }

    /// The end of the step: the complete tool calls in the model's order, then the usage and the finish reason.
    pub fn finish(self) -> Result<Vec<ModelChunk>, ModelError> {
        if let Some(reason) = self.finish_reason.as_deref()
            && CUT_OFF.contains(&reason)
            && !self.calls.is_empty()
        {
            return Err(ModelError::CutOff {
                reason: reason.to_owned(),
                calls: self.calls.len(),
            });
        }
        let mut chunks = Vec::with_capacity(self.calls.len() + 2);
        let mut calls = self.calls;
        calls.sort_by_key(|call| call.order);
        for call in calls {
            if call.name.is_empty() {
                return Err(ModelError::Malformed(format!(
                    "tool call {} has no function name",
                    call.order.0
                )));
            }
            chunks.push(ModelChunk::ToolCall(ToolCall {
                id: call_id(call.id, &call.name),
                name: call.name,
                // Not checked here: arguments that are not JSON are a recoverable error the tool runtime reports
                // to the model, so it can correct itself.
                arguments: call.arguments,
            }));
        }
        chunks.extend(self.usage.map(ModelChunk::Usage));
        chunks.extend(self.finish_reason.map(ModelChunk::Finish));
        Ok(chunks)
    }
}

/// What a piece of a call adds to the step: its id, name and arguments.
fn piece_bytes(piece: &ToolCallDelta) -> usize {
    let function = piece.function.as_ref();
    piece.id.as_ref().map_or(0, String::len)
        + function
            .and_then(|function| function.name.as_ref())
            .map_or(0, String::len)
        + function
            .and_then(|function| function.arguments.as_ref())
            .map_or(0, String::len)
}

/// The provider's id when it is one we can carry, otherwise a fresh one. The API matches tool results to calls by
/// the ids in the conversation we send, so a replaced id works as long as we use it consistently, and we do.
fn call_id(id: Option<String>, name: &str) -> ToolCallId {
    match id.map(ToolCallId::parse) {
        Some(Ok(id)) => id,
        Some(Err(error)) => {
            tracing::debug!(tool = name, %error, "the provider's tool call id is not usable; using a fresh one");
            ToolCallId::generate()
        }
        None => ToolCallId::generate(),
    }
}

/// The provider's explanation in an error body: `{"error":{"message":...}}` (OpenAI, vLLM, llama.cpp),
/// `{"error":"..."}` (Ollama's native errors), `{"message":...}`, or else the text itself. Shortened.
pub fn error_message(body: &str) -> String {
    match serde_json::from_str::<Value>(body) {
        Ok(value) => error_message_in(&value),
        Err(_) => shorten(body.trim()),
    }
}

fn error_message_in(value: &Value) -> String {
    let error = value.get("error").unwrap_or(value);
    let message = match error {
        Value::String(text) => Some(text.as_str()),
        _ => error
            .get("message")
            .or_else(|| value.get("message"))
            .and_then(Value::as_str),
    };
    shorten(&message.map_or_else(|| value.to_string(), str::to_owned))
}

/// At most [`MAX_MESSAGE_CHARS`] characters of a provider's text.
pub fn shorten(text: &str) -> String {
    if text.chars().count() <= MAX_MESSAGE_CHARS {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(MAX_MESSAGE_CHARS).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ToolAnnotations, ToolErrorCode, ToolOutput, approval_denied_message};
    use serde_json::json;

    fn chunk(value: Value) -> ChatChunk {
        serde_json::from_value(value).unwrap()
    }

    /// Token counts are the server's to send: counts that would overflow when added (a broken or hostile server)
    /// neither panic nor wrap. Before, the sum was taken even when the total was given, and overflowed.
    #[test]
    fn token_counts_past_u64_neither_panic_nor_wrap() {
        let usage =
            |value: Value| -> Usage { serde_json::from_value::<ChunkUsage>(value).unwrap().into() };
        let huge = json!({"prompt_tokens": u64::MAX, "completion_tokens": 1, "total_tokens": 5});
        assert_eq!(usage(huge).total_tokens, 5);
        let no_total = json!({"prompt_tokens": u64::MAX, "completion_tokens": 1});
        assert_eq!(usage(no_total).total_tokens, u64::MAX);
    }

    fn tool_piece(index: u32, id: Option<&str>, name: Option<&str>, arguments: &str) -> Value {
        let mut function = json!({ "arguments": arguments });
        if let Some(name) = name {
            function["name"] = json!(name);
        }
        let mut piece = json!({ "index": index, "type": "function", "function": function });
        if let Some(id) = id {
            piece["id"] = json!(id);
        }
        json!({ "choices": [{ "index": 0, "delta": { "tool_calls": [piece] }, "finish_reason": null }] })
    }

    fn calls(chunks: &[ModelChunk]) -> Vec<(String, String, String)> {
        chunks
            .iter()
            .filter_map(|chunk| match chunk {
                ModelChunk::ToolCall(call) => Some((
                    call.id.to_string(),
                    call.name.clone(),
                    call.arguments.clone(),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn maps_the_conversation_to_the_api_format() {
        let denial = ToolOutput::error(
            ToolErrorCode::ApprovalDenied,
            approval_denied_message("The user denied this tool call."),
        );
        let messages = vec![
            Message::System {
                content: "Be brief.".into(),
            },
            Message::User {
                content: "tidy up".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: ToolCallId::parse("call_1").unwrap(),
                        name: "delete_file".into(),
                        arguments: r#"{"path":"a.txt"}"#.into(),
                    },
                    ToolCall {
                        id: ToolCallId::parse("call_2").unwrap(),
                        name: "list_files".into(),
                        arguments: String::new(),
                    },
                ],
            },
            Message::Tool {
                tool_call_id: ToolCallId::parse("call_1").unwrap(),
                tool_name: "delete_file".into(),
                output: denial.clone(),
            },
            Message::Tool {
                tool_call_id: ToolCallId::parse("call_2").unwrap(),
                tool_name: "list_files".into(),
                output: ToolOutput::Ok {
                    content: json!({"entries": []}),
                },
            },
            Message::Assistant {
                content: "Done.".into(),
                tool_calls: vec![],
            },
        ];
        let tools = vec![ToolSpec {
            name: "delete_file".into(),
            description: "Deletes a file.".into(),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            annotations: ToolAnnotations::default(),
            mcp: None,
        }];
        let body = serde_json::to_value(ChatRequest::new("gpt-test", &messages, &tools)).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-test",
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": [{
                    "type": "function",
                    "function": {
                        "name": "delete_file",
                        "description": "Deletes a file.",
                        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}
                    }
                }],
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "tidy up"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "delete_file", "arguments": "{\"path\":\"a.txt\"}"}},
                        {"id": "call_2", "type": "function",
                         "function": {"name": "list_files", "arguments": "{}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1",
                     "content": denial.model_text()},
                    {"role": "tool", "tool_call_id": "call_2", "content": "{\"entries\":[]}"},
                    {"role": "assistant", "content": "Done."}
                ]
            })
        );
        let denial = body["messages"][3]["content"].as_str().unwrap();
        assert!(denial.contains("APPROVAL_DENIED") && denial.contains("Do not retry"));
    }

    /// A server that parses the history refuses arguments that are not JSON, and would refuse every later step of
    /// the session: a call whose arguments were not JSON goes back with none.
    #[test]
    fn arguments_that_are_not_json_go_back_as_none() {
        for (sent, back) in [
            (r#"{"path": "a.txt"}"#, r#"{"path": "a.txt"}"#),
            ("", "{}"),
            ("  ", "{}"),
            (r#"{"path": "a.txt"}{"path": "b.txt"}"#, "{}"),
            (r#"{"path": "#, "{}"),
        ] {
            let call = ToolCall {
                id: ToolCallId::parse("call_1").unwrap(),
                name: "read_file".into(),
                arguments: sent.into(),
            };
            assert_eq!(
                ChatToolCall::from_call(&call).function.arguments,
                back,
                "{sent}"
            );
        }
    }

    /// OpenAI refuses a history where a call is not followed at once by its result ("An assistant message with
    /// 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'"), and an AG-UI client's
    /// history may be one: after an approval that expired the call has no result, and a message the client added
    /// may stand between a call and its result. Before, every later step of the thread failed with that 400.
    #[test]
    fn every_call_is_followed_at_once_by_a_result() {
        let call = |id: &str| ToolCall {
            id: ToolCallId::parse(id).unwrap(),
            name: "delete_file".into(),
            arguments: "{}".into(),
        };
        let result = |id: &str| Message::Tool {
            tool_call_id: ToolCallId::parse(id).unwrap(),
            tool_name: "delete_file".into(),
            output: ToolOutput::Ok {
                content: json!("done"),
            },
        };
        let user = |content: &str| Message::User {
            content: content.into(),
        };
        let messages = vec![
            // A result whose call the trimming of a long conversation cut off.
            result("c0"),
            user("delete a and b"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call("c1"), call("c2")],
            },
            user("and c"),
            result("c2"),
            Message::Assistant {
                content: "Done.".into(),
                tool_calls: vec![],
            },
        ];
        let body = serde_json::to_value(ChatRequest::new("m", &messages, &[])).unwrap();
        let roles: Vec<(&str, Option<&str>)> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|message| {
                (
                    message["role"].as_str().unwrap(),
                    message["tool_call_id"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            roles,
            [
                ("user", None),
                ("assistant", None),
                ("tool", Some("c1")),
                ("tool", Some("c2")),
                ("user", None),
                ("assistant", None),
            ]
        );
        assert_eq!(body["messages"][2]["content"], UNANSWERED);
        assert_eq!(body["messages"][3]["content"], "done");
    }

    #[test]
    fn leaves_out_an_empty_tool_list() {
        let messages = vec![Message::User {
            content: "hi".into(),
        }];
        let body = serde_json::to_value(ChatRequest::new("m", &messages, &[])).unwrap();
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn assembles_interleaved_calls_by_index() {
        let mut step = StepAssembler::new();
        let pieces = [
            tool_piece(0, Some("call_a"), Some("read_file"), ""),
            tool_piece(1, Some("call_b"), Some("list_files"), "{\"pa"),
            tool_piece(0, None, None, "{\"path\": \"no"),
            tool_piece(1, None, None, "th\":\".\"}"),
            tool_piece(0, None, None, "tes.txt\"}"),
        ];
        for piece in pieces {
            assert_eq!(step.apply(chunk(piece)).unwrap(), None);
        }
        step.apply(chunk(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ))
        .unwrap();
        step.apply(chunk(json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})))
            .unwrap();
        let chunks = step.finish().unwrap();
        assert_eq!(
            calls(&chunks),
            vec![
                (
                    "call_a".into(),
                    "read_file".into(),
                    "{\"path\": \"notes.txt\"}".into()
                ),
                (
                    "call_b".into(),
                    "list_files".into(),
                    "{\"path\":\".\"}".into()
                ),
            ]
        );
        assert_eq!(
            &chunks[2..],
            &[
                ModelChunk::Usage(Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    total_tokens: 15
                }),
                ModelChunk::Finish("tool_calls".into())
            ]
        );
    }

    #[test]
    fn assembles_calls_from_servers_that_send_no_index_and_repeat_names() {
        let mut step = StepAssembler::new();
        let piece = |id: Option<&str>, name: Option<&str>, arguments: &str| {
            let mut value = tool_piece(0, id, name, arguments);
            value["choices"][0]["delta"]["tool_calls"][0]
                .as_object_mut()
                .unwrap()
                .remove("index");
            chunk(value)
        };
        for next in [
            piece(Some("c1"), Some("read_file"), "{\"path\":"),
            piece(None, Some("read_file"), "\"a\"}"),
            piece(Some("c2"), Some("read_file"), "{\"path\":\"b\"}"),
            piece(Some("c1"), None, ""),
        ] {
            step.apply(next).unwrap();
        }
        assert_eq!(
            calls(&step.finish().unwrap()),
            vec![
                ("c1".into(), "read_file".into(), "{\"path\":\"a\"}".into()),
                ("c2".into(), "read_file".into(), "{\"path\":\"b\"}".into()),
            ]
        );
    }

    /// Ollama gives every call of a step index 0, each with an id of its own (and llama.cpp-style servers may
    /// repeat an index for another name): each is a call of its own, never one call with both calls' arguments.
    #[test]
    fn calls_that_share_an_index_are_told_apart_by_their_ids_and_names() {
        let mut step = StepAssembler::new();
        for piece in [
            tool_piece(0, Some("call_a"), Some("list_files"), ""),
            tool_piece(0, Some("call_b"), Some("read_file"), "{\"path\":"),
            tool_piece(0, None, None, "\"a.txt\"}"),
            tool_piece(1, None, Some("list_files"), "{}"),
            tool_piece(1, None, Some("delete_file"), "{\"path\":\"b\"}"),
        ] {
            step.apply(chunk(piece)).unwrap();
        }
        let assembled = calls(&step.finish().unwrap());
        let named: Vec<(&str, &str)> = assembled
            .iter()
            .map(|(_, name, arguments)| (name.as_str(), arguments.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("list_files", ""),
                ("read_file", "{\"path\":\"a.txt\"}"),
                ("list_files", "{}"),
                ("delete_file", "{\"path\":\"b\"}"),
            ]
        );
        assert_eq!((&*assembled[0].0, &*assembled[1].0), ("call_a", "call_b"));
    }

    #[test]
    fn replaces_missing_or_unusable_ids_and_keeps_raw_arguments() {
        let mut step = StepAssembler::new();
        step.apply(chunk(tool_piece(0, None, Some("read_file"), "{not json")))
            .unwrap();
        step.apply(chunk(tool_piece(
            1,
            Some("call with spaces"),
            Some("read_file"),
            "",
        )))
        .unwrap();
        let found = calls(&step.finish().unwrap());
        assert_eq!(found.len(), 2);
        assert!(found.iter().all(|(id, _, _)| id.starts_with("call_")));
        assert_ne!(found[0].0, found[1].0);
        assert_eq!(found[0].2, "{not json");
        assert_eq!(found[1].2, "");
    }

    /// sglang and older Ollama send `"finish_reason": ""` with every chunk, KoboldCpp `"null"`: not a reason. Taken
    /// for one, it made the client wait only 2 s for each later chunk, and end the step short at the first pause.
    #[test]
    fn an_empty_finish_reason_is_no_reason() {
        let mut step = StepAssembler::new();
        for reason in ["", "null"] {
            step.apply(chunk(
                json!({"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": reason}]}),
            ))
            .unwrap();
            assert!(!step.has_finished(), "{reason:?}");
        }
        step.apply(chunk(
            json!({"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}),
        ))
        .unwrap();
        assert!(step.has_finished());
    }

    #[test]
    fn text_and_refusals_come_out_at_once_and_empty_deltas_do_not() {
        let mut step = StepAssembler::new();
        assert_eq!(
            step.apply(chunk(
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            ))
            .unwrap(),
            None
        );
        assert_eq!(
            step.apply(chunk(json!({"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}], "usage": null})))
                .unwrap(),
            Some("Hel".into())
        );
        assert_eq!(
            step.apply(chunk(json!({"choices": [{"index": 0, "delta": {"content": null, "refusal": "I can't."}}]})))
                .unwrap(),
            Some("I can't.".into())
        );
        assert!(!step.has_finished());
        step.apply(chunk(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ))
        .unwrap();
        assert!(step.has_finished());
        assert_eq!(
            step.finish().unwrap(),
            vec![ModelChunk::Finish("stop".into())]
        );
    }

    #[test]
    fn calls_of_an_answer_cut_off_run_none_and_a_cut_off_text_is_kept() {
        for reason in ["length", "content_filter"] {
            let mut step = StepAssembler::new();
            step.apply(chunk(tool_piece(
                0,
                Some("call_a"),
                Some("run_command"),
                r#"{"command": "ls"}"#,
            )))
            .unwrap();
            step.apply(chunk(tool_piece(
                1,
                Some("call_b"),
                Some("delete_file"),
                r#"{"path": "#,
            )))
            .unwrap();
            step.apply(chunk(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
            ))
            .unwrap();
            assert_eq!(
                step.finish(),
                Err(ModelError::CutOff {
                    reason: reason.into(),
                    calls: 2
                })
            );
        }
        let mut step = StepAssembler::new();
        step.apply(chunk(
            json!({"choices": [{"index": 0, "delta": {"content": "A long ans"}, "finish_reason": "length"}]}),
        ))
        .unwrap();
        assert_eq!(
            step.finish().unwrap(),
            vec![ModelChunk::Finish("length".into())]
        );
    }

    /// A step cut off stays cut off whatever reason follows (a `stop` after a `length`), and its calls run none;
    /// before, the last reason won. What follows a reason is still read: some servers send `stop` with every chunk,
    /// and their answers and calls go on after it.
    #[test]
    fn a_cut_off_step_stays_cut_off_and_what_follows_a_reason_is_read() {
        let mut step = StepAssembler::new();
        step.apply(chunk(tool_piece(
            0,
            Some("call_a"),
            Some("delete_file"),
            r#"{"path": "#,
        )))
        .unwrap();
        step.apply(chunk(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        ))
        .unwrap();
        step.apply(chunk(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ))
        .unwrap();
        assert_eq!(
            step.finish(),
            Err(ModelError::CutOff {
                reason: "length".into(),
                calls: 1
            })
        );

        let mut step = StepAssembler::new();
        let stop = |delta: Value| {
            chunk(json!({"choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]}))
        };
        assert_eq!(
            step.apply(stop(json!({"content": "Reading "}))).unwrap(),
            Some("Reading ".into())
        );
        assert!(step.has_finished(), "a reason alone ends a step");
        assert_eq!(
            step.apply(stop(json!({"content": "both."}))).unwrap(),
            Some("both.".into())
        );
        assert!(
            !step.has_finished() && step.said_why(),
            "this server's reasons do not end its steps"
        );
        for (index, id, path) in [(0, "call_a", "a"), (1, "call_b", "b")] {
            step.apply(stop(json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": "read_file", "arguments": format!(r#"{{"path": "{path}"}}"#)}}]})))
                .unwrap();
        }
        let chunks = step.finish().unwrap();
        let calls = chunks
            .iter()
            .filter(|chunk| matches!(chunk, ModelChunk::ToolCall(_)))
            .count();
        assert_eq!(calls, 2, "{chunks:?}");
    }

    #[test]
    fn a_step_may_carry_only_so_much() {
        let piece = "x".repeat(1024 * 1024);
        let mut step = StepAssembler::new();
        step.apply(chunk(tool_piece(0, Some("call_a"), Some("write_file"), "")))
            .unwrap();
        for _ in 0..MAX_STEP_BYTES / piece.len() - 1 {
            step.apply(chunk(tool_piece(0, None, None, &piece)))
                .unwrap();
        }
        assert_eq!(
            step.apply(chunk(tool_piece(0, None, None, &piece))),
            Err(ModelError::TooLarge {
                limit: MAX_STEP_BYTES
            })
        );

        let mut text = StepAssembler::new();
        for _ in 0..MAX_STEP_BYTES / piece.len() {
            text.apply(chunk(
                json!({"choices": [{"index": 0, "delta": {"content": piece}}]}),
            ))
            .unwrap();
        }
        assert_eq!(
            text.apply(chunk(
                json!({"choices": [{"index": 0, "delta": {"content": "!"}}]})
            )),
            Err(ModelError::TooLarge {
                limit: MAX_STEP_BYTES
            })
        );

        let mut calls = StepAssembler::new();
        for index in 0..MAX_CALLS_PER_STEP {
            let index = u32::try_from(index).unwrap();
            calls
                .apply(chunk(tool_piece(index, None, Some("read_file"), "{}")))
                .unwrap();
        }
        assert_eq!(
            calls.apply(chunk(tool_piece(9999, None, Some("read_file"), "{}"))),
            Err(ModelError::TooManyCalls {
                limit: MAX_CALLS_PER_STEP
            })
        );
    }

    #[test]
    fn a_nameless_call_or_an_error_chunk_fails_the_step() {
        let mut step = StepAssembler::new();
        step.apply(chunk(tool_piece(0, Some("c1"), None, "{}")))
            .unwrap();
        assert!(matches!(step.finish(), Err(ModelError::Malformed(_))));

        let mut step = StepAssembler::new();
        let error = step
            .apply(chunk(json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}})))
            .unwrap_err();
        assert_eq!(
            error,
            ModelError::Provider("The server had an error while processing your request.".into())
        );
    }

    #[test]
    fn finds_the_providers_message_in_any_common_shape() {
        assert_eq!(
            error_message(
                r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error"}}"#
            ),
            "Incorrect API key provided."
        );
        assert_eq!(
            error_message(r#"{"error":"model 'llama9' not found"}"#),
            "model 'llama9' not found"
        );
        assert_eq!(
            error_message(r#"{"message":"Not Found","status":404}"#),
            "Not Found"
        );
        assert_eq!(error_message("  Bad Gateway\n"), "Bad Gateway");
        let long = "x".repeat(2000);
        assert_eq!(error_message(&long).chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}
