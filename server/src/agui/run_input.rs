//! The AG-UI `RunAgentInput`, read into the harness's terms: ids, the conversation, the resume batch.

use agent::ids::{RunId, SessionId, ToolCallId};
use agent::wire::{Message, ToolCall, ToolErrorCode, ToolOutput, ValidationErrors};
use serde::Deserialize;
use serde_json::Value;

use crate::body::JsonBody;
use crate::error::ApiError;

/// The most messages a client may send in one run's history.
pub const MAX_MESSAGES: usize = 1_000;

/// One answer of a resume batch.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    pub interrupt_id: String,
    pub status: ResumeStatus,
    #[serde(default)]
    pub payload: Option<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    parent_run_id: Option<String>,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    context: Vec<RawContext>,
    #[serde(default)]
    resume: Option<Vec<ResumeEntry>>,
}

#[derive(Clone, Debug, Deserialize)]
struct RawContext {
    description: String,
    value: String,
}

/// A run request, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInput {
    pub thread_id: SessionId,
    pub run_id: RunId,
    pub parent_run_id: Option<RunId>,
    /// The client's messages as it sent them, for the snapshot that ends the run.
    pub raw_messages: Vec<Value>,
    /// The same conversation in the harness's terms.
    pub messages: Vec<Message>,
    /// Ambient context from the client, as system messages.
    pub context: Vec<Message>,
    pub resume: Option<Vec<ResumeEntry>>,
}

fn invalid(field: &str, message: impl Into<String>) -> ValidationErrors {
    let mut errors = ValidationErrors::default();
    errors.field(field, message);
    errors
}

/// Text of a `content` that is a string or a list of parts (only the text parts count).
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => part.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn tool_calls(message: &Value, at: usize) -> Result<Vec<ToolCall>, ValidationErrors> {
    let Some(calls) = message.get("toolCalls") else {
        return Ok(Vec::new());
    };
    let Some(calls) = calls.as_array() else {
        return Err(invalid(
            &format!("messages.{at}.toolCalls"),
            "Expected array",
        ));
    };
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let field = format!("messages.{at}.toolCalls.{i}");
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(&field, "A tool call needs an id"))?;
            let id = ToolCallId::parse(id)
                .map_err(|e| invalid(&format!("{field}.id"), format!("Invalid id: {e}")))?;
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(&field, "A tool call needs function.name"))?;
            let arguments = function
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            Ok(ToolCall {
                id,
                name: name.to_owned(),
                arguments: arguments.to_owned(),
            })
        })
        .collect()
}

/// Converts the client's messages. Roles the harness has no use for (activity, reasoning) are skipped.
fn convert(raw: &[Value]) -> Result<Vec<Message>, ValidationErrors> {
    let mut messages = Vec::with_capacity(raw.len());
    for (at, message) in raw.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(&format!("messages.{at}.role"), "Required"))?;
        let content = message.get("content");
        match role {
            "user" => messages.push(Message::User {
                content: content_text(content),
            }),
            "system" | "developer" => messages.push(Message::System {
                content: content_text(content),
            }),
            "assistant" => messages.push(Message::Assistant {
                content: content_text(content),
                tool_calls: tool_calls(message, at)?,
            }),
            "tool" => {
                let field = format!("messages.{at}.toolCallId");
                let id = message
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&field, "Required"))?;
                let tool_call_id = ToolCallId::parse(id)
                    .map_err(|e| invalid(&field, format!("Invalid id: {e}")))?;
                let tool_name = messages
                    .iter()
                    .rev()
                    .find_map(|m| match m {
                        Message::Assistant { tool_calls, .. } => tool_calls
                            .iter()
                            .find(|call| call.id == tool_call_id)
                            .map(|call| call.name.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                let output = match message.get("error").and_then(Value::as_str) {
                    Some(error) => ToolOutput::error(ToolErrorCode::ToolFailed, error),
                    None => ToolOutput::Ok {
                        content: Value::String(content_text(content)),
                    },
                };
                messages.push(Message::Tool {
                    tool_call_id,
                    tool_name,
                    output,
                });
            }
            _ => {}
        }
    }
    Ok(messages)
}

/// A body read straight into a [`RawInput`], or refused for the reading of [`RunInput::from_json`] to explain. It
/// accepts only what that reading accepts, and reads it the same: every value in it is read as a JSON value is
/// (a string's lone surrogate, a number out of range and a value nested too deep are malformed, in a field toolgate
/// does not use too), the ids as the strings they are, and `context` and `resume` as values first and then
/// converted as there (their entries' fields toolgate does not use are read as values too, which the entries' own
/// reading would skip unchecked); a field that comes twice, which the value reading takes the last of, refuses.
struct Direct(RawInput);

impl<'de> Deserialize<'de> for Direct {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(DirectVisitor)
    }
}

struct DirectVisitor;

/// A field read as a value, converted as the value reading converts it; absent, its default.
fn converted<T: serde::de::DeserializeOwned + Default, E: serde::de::Error>(
    value: Option<Value>,
) -> Result<T, E> {
    value.map_or_else(
        || Ok(T::default()),
        |value| serde_json::from_value(value).map_err(E::custom),
    )
}

/// Sets a field read once; a second time is an error.
fn once<T, E: serde::de::Error>(
    slot: &mut Option<T>,
    value: T,
    name: &'static str,
) -> Result<(), E> {
    match slot.replace(value) {
        Some(_) => Err(E::duplicate_field(name)),
        None => Ok(()),
    }
}

impl<'de> serde::de::Visitor<'de> for DirectVisitor {
    type Value = Direct;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a RunAgentInput object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Direct, A::Error> {
        use serde::de::Error;
        let (mut thread_id, mut run_id, mut parent_run_id) = (None, None, None);
        let (mut messages, mut context, mut resume) = (None, None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "threadId" => once(&mut thread_id, map.next_value()?, "threadId")?,
                "runId" => once(&mut run_id, map.next_value()?, "runId")?,
                "parentRunId" => once(&mut parent_run_id, map.next_value()?, "parentRunId")?,
                "messages" => once(&mut messages, map.next_value()?, "messages")?,
                "context" => once(&mut context, map.next_value::<Value>()?, "context")?,
                "resume" => once(&mut resume, map.next_value::<Value>()?, "resume")?,
                _ => drop(map.next_value::<Value>()?),
            }
        }
        Ok(Direct(RawInput {
            thread_id: thread_id.ok_or_else(|| A::Error::missing_field("threadId"))?,
            run_id: run_id.ok_or_else(|| A::Error::missing_field("runId"))?,
            parent_run_id: parent_run_id.flatten(),
            messages: messages.unwrap_or_default(),
            context: converted(context)?,
            resume: converted(resume)?,
        }))
    }
}

impl RunInput {
    /// Reads a request's body. A body that reads as an input goes straight into its fields, without a JSON value
    /// of the whole body made first (the common case); any other body is read as a value, so that it is refused as
    /// every route refuses a body: malformed JSON, or what is wrong where. Either way the input is the same
    /// ([`Direct`]).
    pub fn from_body(body: &JsonBody) -> Result<Self, ApiError> {
        let direct = std::str::from_utf8(&body.0)
            .ok()
            .and_then(|text| serde_json::from_str::<Direct>(text).ok());
        match direct {
            Some(Direct(raw)) => Self::from_raw(raw),
            None => Self::from_json(body.value()?),
        }
        .map_err(ApiError::Invalid)
    }

    pub fn from_json(body: Value) -> Result<Self, ValidationErrors> {
        let raw: RawInput = serde_json::from_value(body)
            .map_err(|error| ValidationErrors::form(format!("Not a RunAgentInput: {error}")))?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawInput) -> Result<Self, ValidationErrors> {
        let thread_id = SessionId::parse(&raw.thread_id)
            .map_err(|e| invalid("threadId", format!("Invalid id: {e}")))?;
        let run_id =
            RunId::parse(&raw.run_id).map_err(|e| invalid("runId", format!("Invalid id: {e}")))?;
        let parent_run_id = raw
            .parent_run_id
            .map(|parent| {
                RunId::parse(&parent)
                    .map_err(|e| invalid("parentRunId", format!("Invalid id: {e}")))
            })
            .transpose()?;
        if raw.messages.len() > MAX_MESSAGES {
            return Err(invalid(
                "messages",
                format!("Array must contain at most {MAX_MESSAGES} element(s)"),
            ));
        }
        // Each context item becomes a message of the run's history: the same bound, over both.
        if raw.messages.len() + raw.context.len() > MAX_MESSAGES {
            return Err(invalid(
                "context",
                format!(
                    "The messages and the context items may be at most {MAX_MESSAGES} together"
                ),
            ));
        }
        // An interrupt id is an id (toolgate issues `int_` and 32 hex digits): a text of any other shape or length,
        // which a refusal would repeat into the audit log, is refused as input before anything is looked up.
        for (at, entry) in raw.resume.iter().flatten().enumerate() {
            ToolCallId::parse(&entry.interrupt_id).map_err(|e| {
                invalid(
                    &format!("resume.{at}.interruptId"),
                    format!("Invalid id: {e}"),
                )
            })?;
        }
        let messages = convert(&raw.messages)?;
        let context = raw
            .context
            .iter()
            .map(|item| Message::System {
                content: format!("Context ({}): {}", item.description, item.value),
            })
            .collect();
        Ok(Self {
            thread_id,
            run_id,
            parent_run_id,
            raw_messages: raw.messages,
            messages,
            context,
            resume: raw.resume,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use serde_json::json;

    /// A body as the route reads it, and as every route's reading (a JSON value first) reads it.
    fn read_both(body: &[u8]) -> (Result<RunInput, String>, Result<RunInput, String>) {
        let body = JsonBody(Bytes::copy_from_slice(body));
        let direct = RunInput::from_body(&body).map_err(|error| format!("{error:?}"));
        let by_value = body
            .value()
            .and_then(|value| RunInput::from_json(value).map_err(ApiError::Invalid))
            .map_err(|error| format!("{error:?}"));
        (direct, by_value)
    }

    /// What an AG-UI client sends to resume a run, every field of `RunAgentInput` in it.
    const RESUME: &str = r#"{"threadId":"thread-1","runId":"run-2","parentRunId":"run-1",
        "messages":[{"id":"user-1","role":"user","content":"delete a.txt"},
            {"id":"m2","role":"assistant","toolCalls":[{"id":"call_1","type":"function",
                "function":{"name":"delete_file","arguments":"{\"path\":\"a.txt\"}"}}]}],
        "tools":[],"context":[{"description":"user","value":"Ada"}],"state":{},"forwardedProps":{},
        "resume":[{"interruptId":"int-1","status":"resolved","payload":{"approved":true}}]}"#;

    #[test]
    fn a_clients_body_is_read_straight_into_the_input() {
        assert!(serde_json::from_str::<Direct>(RESUME).is_ok());
        let (direct, by_value) = read_both(RESUME.as_bytes());
        assert_eq!(direct, by_value);
        let input = direct.unwrap();
        assert_eq!(input.run_id.as_str(), "run-2");
        assert_eq!(input.raw_messages.len(), 2);
        assert_eq!(input.context.len(), 1);
        assert_eq!(input.resume.unwrap()[0].status, ResumeStatus::Resolved);
    }

    /// Whether a body is read straight into its fields (else it is read as a value first).
    fn read_directly(body: &[u8]) -> bool {
        std::str::from_utf8(body)
            .ok()
            .is_some_and(|text| serde_json::from_str::<Direct>(text).is_ok())
    }

    #[test]
    fn any_body_reads_as_the_value_reading_reads_it() {
        let deep = format!(
            r#"{{"threadId":"t","runId":"r","context":[{{"description":"d","value":"v","x":{}{}}}]}}"#,
            "[".repeat(300),
            "]".repeat(300)
        );
        // Each body, and whether it is read straight into its fields.
        let bodies: &[(&[u8], bool)] = &[
            (
                br#"{"threadId":"t","runId":"r","parentRunId":null,"resume":null,"messages":[]}"#,
                true,
            ),
            // An escaped name is the field's name.
            (br#"{"thread\u0049d":"t","runId":"r"}"#, true),
            // Fields toolgate does not use, in the input and in its entries.
            (
                br#"{"threadId":"t","runId":"r","x":[1,{"y":null}],"context":[{"description":"d","value":"v","x":1}],"resume":[{"interruptId":"i","status":"cancelled","x":{}}]}"#,
                true,
            ),
            // Read, then refused for what is in it.
            (br#"{"threadId":"a b","runId":"r"}"#, true),
            (
                br#"{"threadId":"t","runId":"r","messages":[{"role":"tool","content":"x"}]}"#,
                true,
            ),
            // A field twice: the value reading takes the last.
            (br#"{"threadId":"t","runId":"r1","runId":"r2"}"#, false),
            (
                br#"{"threadId":"t","runId":"r","messages":[],"messages":[{"role":"user","content":"hi"}]}"#,
                false,
            ),
            // Malformed in a field toolgate does not use: a lone surrogate, a number out of range, too deep.
            (br#"{"threadId":"t","runId":"r","state":{"note":"\ud800"}}"#, false),
            (
                br#"{"threadId":"t","runId":"r","context":[{"description":"d","value":"v","x":"\ud800"}]}"#,
                false,
            ),
            (
                br#"{"threadId":"t","runId":"r","resume":[{"interruptId":"i","status":"resolved","x":"\udc00"}]}"#,
                false,
            ),
            (
                br#"{"threadId":"t","runId":"r","context":[{"description":"d","value":"v","n":1e999}]}"#,
                false,
            ),
            (deep.as_bytes(), false),
            (
                br#"{"threadId":"t","runId":"r","messages":[{"role":"user","content":"\udc00"}]}"#,
                false,
            ),
            // Not UTF-8, in a field toolgate does not use.
            (b"{\"threadId\":\"t\",\"runId\":\"r\",\"state\":\"\xff\"}", false),
            (br#"{"runId":"r"}"#, false),
            (br#"{"threadId":"t","runId":"r","messages":null}"#, false),
            (br#"{"threadId":"t","runId":"r","context":null}"#, false),
            (
                br#"{"threadId":"t","runId":"r","resume":[{"interruptId":"i","status":"maybe"}]}"#,
                false,
            ),
            (br#"["t","r"]"#, false),
            (br#"{"threadId":"t","runId":"r"} trailing"#, false),
            (b"", false),
        ];
        for (body, direct) in bodies {
            let shown = String::from_utf8_lossy(body);
            assert_eq!(read_directly(body), *direct, "{shown}");
            let (read, by_value) = read_both(body);
            assert_eq!(read, by_value, "{shown}");
        }
        let (read, _) = read_both(bodies[5].0);
        assert_eq!(read.unwrap().run_id.as_str(), "r2");
        for (body, _) in &bodies[7..12] {
            assert!(read_both(body).0.unwrap_err().contains("Malformed JSON"));
        }
    }

    #[test]
    fn a_conversation_is_read_in_the_harness_terms() {
        let input = RunInput::from_json(json!({
            "threadId": "thread-1",
            "runId": "run-2",
            "parentRunId": "run-1",
            "messages": [
                {"id": "m1", "role": "user", "content": [{"type": "text", "text": "delete a.txt"}]},
                {"id": "m2", "role": "assistant", "toolCalls": [
                    {"id": "call_1", "type": "function", "function": {"name": "delete_file", "arguments": "{\"path\":\"a.txt\"}"}}
                ]},
                {"id": "m3", "role": "tool", "toolCallId": "call_1", "content": "done"},
                {"id": "m4", "role": "reasoning", "content": "hmm"}
            ],
            "context": [{"description": "user", "value": "Ada"}],
            "resume": [{"interruptId": "int-1", "status": "resolved", "payload": {"approved": true}}],
            "state": {}, "forwardedProps": {}, "tools": []
        }))
        .unwrap();
        assert_eq!(input.parent_run_id, Some(RunId::parse("run-1").unwrap()));
        assert_eq!(input.messages.len(), 3);
        assert!(
            matches!(&input.messages[2], Message::Tool { tool_name, .. } if tool_name == "delete_file")
        );
        assert_eq!(input.resume.unwrap()[0].status, ResumeStatus::Resolved);
        assert_eq!(input.raw_messages.len(), 4);
    }

    #[test]
    fn bad_ids_and_shapes_are_refused_with_the_field() {
        let errors = RunInput::from_json(json!({"threadId": "a b", "runId": "r", "messages": []}))
            .unwrap_err();
        assert!(errors.field_errors.contains_key("threadId"));
        let errors = RunInput::from_json(json!({"runId": "r", "messages": []})).unwrap_err();
        assert!(errors.form_errors[0].contains("threadId"));
        let errors = RunInput::from_json(json!({
            "threadId": "t", "runId": "r",
            "messages": [{"id": "m", "role": "tool", "content": "x"}]
        }))
        .unwrap_err();
        assert!(errors.field_errors.contains_key("messages.0.toolCallId"));
        let errors = RunInput::from_json(json!({
            "threadId": "t", "runId": "r",
            "resume": [{"interruptId": "i", "status": "maybe"}], "messages": []
        }))
        .unwrap_err();
        assert!(errors.form_errors[0].contains("maybe"));
    }
}
