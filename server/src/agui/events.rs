//! The run's events, projected to AG-UI events.
//!
//! A run's own events already say everything; this keeps the little state AG-UI needs on top (which text message
//! is open, which message id each step's assistant message has) and builds the `MESSAGES_SNAPSHOT` that ends a
//! run: the client's messages as it sent them, then the run's new ones.

use std::collections::HashSet;

use agent::ids::{RunId, SessionId, ToolCallId};
use agent::wire::{InterruptRequest, Message, StreamEvent, ToolOutput};
use serde_json::{Map, Value, json};

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

/// One interrupt as AG-UI clients read it.
pub fn interrupt_json(interrupt: &InterruptRequest) -> Value {
    json!({
        "id": interrupt.id,
        "reason": "tool_call",
        "message": interrupt.reason,
        "toolCallId": interrupt.tool_call_id,
        "responseSchema": response_schema(),
        "expiresAt": iso8601(interrupt.expires_at),
        "metadata": {"toolName": interrupt.tool_name, "arguments": interrupt.arguments},
    })
}

/// The id of a tool result message: the same in `TOOL_CALL_RESULT` and in the snapshot.
fn result_id(tool_call_id: &ToolCallId) -> String {
    format!("result_{tool_call_id}")
}

/// The AG-UI form of one of the run's new messages.
fn message_json(message: &Message, assistant_id: &mut impl FnMut() -> String) -> Option<Value> {
    match message {
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut object = Map::new();
            object.insert("id".into(), Value::String(assistant_id()));
            object.insert("role".into(), Value::String("assistant".into()));
            if !content.is_empty() {
                object.insert("content".into(), Value::String(content.clone()));
            }
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        })
                    })
                    .collect();
                object.insert("toolCalls".into(), Value::Array(calls));
            }
            Some(Value::Object(object))
        }
        Message::Tool {
            tool_call_id,
            output,
            ..
        } => {
            let mut object = json!({
                "id": result_id(tool_call_id),
                "role": "tool",
                "toolCallId": tool_call_id,
                "content": output.model_text(),
            });
            if let ToolOutput::Error { message, .. } = output {
                object["error"] = Value::String(message.clone());
            }
            Some(object)
        }
        // The user's message and context came from the client, which has them.
        Message::User { .. } | Message::System { .. } => None,
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

    fn step_id(&self) -> String {
        self.step_ids
            .last()
            .cloned()
            .unwrap_or_else(|| format!("msg_{}_0", self.run_id))
    }

    fn close_text(&mut self, out: &mut Vec<Value>) {
        if let Some(message_id) = self.open_text.take() {
            out.push(json!({"type": "TEXT_MESSAGE_END", "messageId": message_id}));
        }
    }

    /// The snapshot of the whole conversation once the run ended.
    fn snapshot(&self, conversation: Option<&[Message]>) -> Value {
        let mut messages = self.client_messages.clone();
        let have: HashSet<String> = messages
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
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
        for message in conversation.unwrap_or_default().iter().skip(self.known) {
            if let Some(json) = message_json(message, &mut assistant_id)
                && json["id"].as_str().is_some_and(|id| !have.contains(id))
            {
                messages.push(json);
            }
        }
        json!({"type": "MESSAGES_SNAPSHOT", "messages": messages})
    }

    /// Ends the run: the conversation's snapshot, then `RUN_FINISHED` with its outcome.
    fn finish(
        &mut self,
        out: &mut Vec<Value>,
        outcome: Value,
        conversation: impl FnOnce() -> Option<Vec<Message>>,
    ) {
        self.close_text(out);
        out.push(self.snapshot(conversation().as_deref()));
        out.push(json!({
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "outcome": outcome,
        }));
    }

    /// The AG-UI events for one of the run's events. `conversation` is read only when the run ends.
    pub fn translate(
        &mut self,
        event: &StreamEvent,
        conversation: impl FnOnce() -> Option<Vec<Message>>,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        match event {
            StreamEvent::RunStarted { parent_run_id, .. } => {
                let mut started = json!({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id});
                if let Some(parent) = parent_run_id {
                    started["parentRunId"] = json!(parent);
                }
                out.push(started);
            }
            StreamEvent::Step { step, .. } => {
                self.close_text(&mut out);
                self.step_ids.push(format!("msg_{}_{step}", self.run_id));
            }
            StreamEvent::AssistantDelta { delta, .. } => {
                if self.open_text.is_none() {
                    let message_id = self.step_id();
                    out.push(json!({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}));
                    self.open_text = Some(message_id);
                }
                if let Some(message_id) = &self.open_text {
                    out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": delta}));
                }
            }
            StreamEvent::ToolCall {
                tool_call_id,
                tool_name,
                arguments,
                ..
            } => {
                self.close_text(&mut out);
                if !self.resumed.contains(tool_call_id) {
                    let arguments = match arguments {
                        Value::String(raw) => raw.clone(),
                        other => other.to_string(),
                    };
                    out.push(json!({
                        "type": "TOOL_CALL_START",
                        "toolCallId": tool_call_id,
                        "toolCallName": tool_name,
                        "parentMessageId": self.step_id(),
                    }));
                    out.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": tool_call_id, "delta": arguments}));
                    out.push(json!({"type": "TOOL_CALL_END", "toolCallId": tool_call_id}));
                }
            }
            StreamEvent::ToolResult {
                tool_call_id,
                output,
                ..
            } => {
                self.close_text(&mut out);
                out.push(json!({
                    "type": "TOOL_CALL_RESULT",
                    "messageId": result_id(tool_call_id),
                    "toolCallId": tool_call_id,
                    "content": output.model_text(),
                    "role": "tool",
                }));
            }
            StreamEvent::Done { .. } => {
                self.finish(&mut out, json!({"type": "success"}), conversation)
            }
            StreamEvent::Interrupted { interrupts, .. } => {
                let interrupts: Vec<Value> = interrupts.iter().map(interrupt_json).collect();
                self.finish(
                    &mut out,
                    json!({"type": "interrupt", "interrupts": interrupts}),
                    conversation,
                );
            }
            StreamEvent::Error { code, message, .. } => {
                self.close_text(&mut out);
                out.push(json!({"type": "RUN_ERROR", "message": message, "code": code}));
            }
            StreamEvent::ContextTrimmed {
                omitted_messages, ..
            } => {
                // The client owns the conversation; it should know the model saw less of it.
                out.push(json!({
                    "type": "CUSTOM",
                    "name": "toolgate.contextTrimmed",
                    "value": {"omittedMessages": omitted_messages},
                }));
            }
            // AG-UI has no event for these; the snapshot at the end carries what the client needs.
            StreamEvent::ApprovalRequired { .. }
            | StreamEvent::ApprovalResolved { .. }
            | StreamEvent::Debug { .. } => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_is_utc_with_milliseconds() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(1_796_001_492_433), "2026-11-30T01:18:12.433Z");
    }
}
