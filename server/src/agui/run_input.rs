//! The AG-UI `RunAgentInput`, read into the harness's terms: ids, the conversation, the resume batch.

use agent::ids::{RunId, SessionId, ToolCallId};
use agent::wire::{Message, ToolCall, ToolErrorCode, ToolOutput, ValidationErrors};
use serde::Deserialize;
use serde_json::Value;

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

impl RunInput {
    pub fn from_json(body: Value) -> Result<Self, ValidationErrors> {
        let raw: RawInput = serde_json::from_value(body)
            .map_err(|error| ValidationErrors::form(format!("Not a RunAgentInput: {error}")))?;
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
    use serde_json::json;

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
