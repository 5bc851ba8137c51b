//! The sampling loop: ask the model for a step, stream its text, run its tool calls as a batch, feed the results
//! back, until a final answer, the step limit, an abort or an error.

use std::collections::HashMap;
use std::time::Instant;

use futures::StreamExt;

use crate::events::AgentEvent;
use crate::model::{Model, ModelChunk, ModelRequest};
use crate::runtime::{PreparedCall, RunContext, RunError, prepare_call, settle_call};
use crate::wire::{ApprovalMode, Message, ToolCall, ToolErrorCode, ToolOutput};

/// Bounds on one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopLimits {
    /// Model steps before the run stops without an answer.
    pub max_steps: u32,
    /// How often the same call (same tool, same arguments) may run in one run.
    pub max_identical_calls: usize,
    /// Blocked repeats tolerated before the run ends.
    pub repeat_strikes: usize,
}

impl Default for LoopLimits {
    fn default() -> Self {
        Self {
            max_steps: 12,
            max_identical_calls: 2,
            repeat_strikes: 2,
        }
    }
}

/// How a run ended, and the messages it added to the conversation (the user's message first).
#[derive(Debug)]
pub struct LoopOutcome {
    pub messages: Vec<Message>,
    pub result: Result<String, RunError>,
    pub steps: u32,
}

enum Repeat {
    Fresh,
    Blocked(usize),
    Stop,
}

/// The repeated-call guard: the same tool with the same arguments again and again.
struct RepeatGuard {
    limits: LoopLimits,
    seen: HashMap<(String, String), usize>,
    strikes: usize,
}

impl RepeatGuard {
    fn new(limits: LoopLimits) -> Self {
        Self {
            limits,
            seen: HashMap::new(),
            strikes: 0,
        }
    }

    fn check(&mut self, call: &ToolCall) -> Repeat {
        // serde_json objects are ordered maps, so the same arguments in another key order compare equal.
        let arguments = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| call.arguments.clone());
        let times = self.seen.entry((call.name.clone(), arguments)).or_insert(0);
        *times += 1;
        if *times <= self.limits.max_identical_calls {
            return Repeat::Fresh;
        }
        self.strikes += 1;
        if self.strikes > self.limits.repeat_strikes {
            Repeat::Stop
        } else {
            Repeat::Blocked(*times)
        }
    }
}

impl LoopOutcome {
    /// The event that ends the run: `done` with the answer, or `error`.
    pub fn terminal_event(&self) -> AgentEvent {
        match &self.result {
            Ok(answer) => AgentEvent::RunFinished {
                answer: answer.clone(),
                steps: self.steps,
            },
            Err(error) => AgentEvent::RunFailed {
                code: error.code(),
                message: error.to_string(),
            },
        }
    }
}

/// Runs one user message to the end. Emits every event, the terminal `done` or `error` included.
pub async fn run_loop(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    history: &[Message],
    user_message: &str,
) -> LoopOutcome {
    let outcome = run_until_end(model, context, limits, history, user_message).await;
    context.emit(outcome.terminal_event());
    outcome
}

/// Runs one user message to the end and emits every event but the terminal one, which the caller emits once it
/// has recorded the outcome (so that whoever sees `done` can start the session's next run at once).
pub async fn run_until_end(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    history: &[Message],
    user_message: &str,
) -> LoopOutcome {
    context.emit(AgentEvent::RunStarted {
        session_id: context.session_id.clone(),
        message: user_message.to_owned(),
        policy: context.permissions.policy,
        approval_mode: context.approval_mode,
    });
    let mut messages = history.to_vec();
    messages.push(Message::User {
        content: user_message.to_owned(),
    });
    let (result, steps) = sample(model, context, limits, &mut messages).await;
    LoopOutcome {
        messages: messages.split_off(history.len()),
        result,
        steps,
    }
}

async fn sample(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    messages: &mut Vec<Message>,
) -> (Result<String, RunError>, u32) {
    let tools = context.toolbox.specs();
    let mut guard = RepeatGuard::new(limits);
    let aborted = || RunError::Aborted {
        reason: context.abort.reason(),
    };

    for step in 1..=limits.max_steps {
        if context.abort.is_aborted() {
            return (Err(aborted()), step - 1);
        }
        context.emit(AgentEvent::StepStarted { step });
        context.emit(AgentEvent::ModelRequested {
            step,
            model: model.name().to_owned(),
            messages: messages.len(),
            tools: tools.len(),
        });
        let started = Instant::now();
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut finish_reason = None;
        let mut usage = None;
        {
            let mut stream = model.stream(ModelRequest {
                run_id: &context.run_id,
                messages,
                tools: &tools,
            });
            loop {
                let chunk = tokio::select! {
                    biased;
                    () = context.abort.aborted() => return (Err(aborted()), step),
                    chunk = stream.next() => chunk,
                };
                match chunk {
                    None => break,
                    Some(Ok(ModelChunk::Text(delta))) => {
                        text.push_str(&delta);
                        context.emit(AgentEvent::TextDelta { step, delta });
                    }
                    Some(Ok(ModelChunk::ToolCall(call))) => calls.push(call),
                    Some(Ok(ModelChunk::Usage(reported))) => usage = Some(reported),
                    Some(Ok(ModelChunk::Finish(reason))) => finish_reason = Some(reason),
                    Some(Err(error)) => return (Err(RunError::Model(error.to_string())), step),
                }
            }
        }
        context.emit(AgentEvent::ModelFinished {
            step,
            finish_reason,
            usage,
            elapsed: started.elapsed(),
        });
        messages.push(Message::Assistant {
            content: text.clone(),
            tool_calls: calls.clone(),
        });
        if calls.is_empty() {
            return (Ok(text), step);
        }

        // Prepare the whole batch before any of it runs.
        let mut batch = Vec::with_capacity(calls.len());
        for call in &calls {
            let prepared = match guard.check(call) {
                Repeat::Fresh => prepare_call(call, step, context),
                Repeat::Blocked(times) => {
                    context.emit(AgentEvent::RepeatedCallBlocked {
                        tool_name: call.name.clone(),
                        times,
                    });
                    let prepared = prepare_call(call, step, context);
                    PreparedCall::Refused {
                        call: prepared.call().clone(),
                        output: ToolOutput::error(
                            ToolErrorCode::RepeatedCall,
                            format!(
                                "You have called {} with these exact arguments {} times already. Do not call it again; use the results you have or explain the problem in your final answer.",
                                call.name,
                                times - 1
                            ),
                        ),
                    }
                }
                Repeat::Stop => {
                    return (
                        Err(RunError::RepeatedCall {
                            tool_name: call.name.clone(),
                        }),
                        step,
                    );
                }
            };
            batch.push(prepared);
        }
        if context.approval_mode == ApprovalMode::FailClosed
            && let Some((call, reason)) = batch
                .iter()
                .find_map(|prepared| prepared.asks().map(|reason| (prepared.call(), reason)))
        {
            let error = RunError::ApprovalRequired {
                tool_name: call.name.clone(),
                reason: reason.to_owned(),
            };
            answer_unfinished(messages, &calls, &error);
            return (Err(error), step);
        }

        // Settle the batch concurrently: parallel approvals are independent.
        let settled = futures::future::join_all(batch.into_iter().map(|prepared| async move {
            let call = prepared.call().clone();
            (call, settle_call(prepared, context).await)
        }))
        .await;
        let mut failure = None;
        for (call, result) in settled {
            match result {
                Ok(output) => messages.push(Message::Tool {
                    tool_call_id: call.id,
                    tool_name: call.name,
                    output,
                }),
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        if let Some(error) = failure {
            answer_unfinished(messages, &calls, &error);
            return (Err(error), step);
        }
    }
    (
        Err(RunError::StepLimit {
            max_steps: limits.max_steps,
        }),
        limits.max_steps,
    )
}

/// Gives every call of the last batch that has no result one that says the run ended, so the history stays a
/// valid conversation (every tool call answered) for the session's next run.
fn answer_unfinished(messages: &mut Vec<Message>, calls: &[ToolCall], error: &RunError) {
    let batch_start = messages
        .iter()
        .rposition(|message| matches!(message, Message::Assistant { .. }))
        .map_or(0, |i| i + 1);
    for call in calls {
        let answered = messages[batch_start..].iter().any(|message| {
            matches!(message, Message::Tool { tool_call_id, .. } if tool_call_id == &call.id)
        });
        if !answered {
            messages.push(Message::Tool {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                output: ToolOutput::error(
                    ToolErrorCode::ToolFailed,
                    format!("The call was not completed because the run ended: {error}"),
                ),
            });
        }
    }
}
