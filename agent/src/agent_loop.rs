//! The sampling loop: ask the model for a step, stream its text, prepare its tool calls as a batch, run what may
//! run, feed the results back, until a final answer, the step limit, an abort or an error.
//!
//! A batch that needs a person ends this part of the run, in a way that depends on the approval mode:
//! `fail_closed` fails the run; `interactive` returns the batch to be opened in the store ([`RunEnd::Suspended`]),
//! where decisions settle it and whoever settles it last samples on from its saved state; `interrupt` (AG-UI) runs
//! what needs nobody and ends the run with the rest set aside ([`RunEnd::Interrupted`]) for a later run to resume.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use futures::StreamExt;
use serde_json::Value;

use crate::approvals::{ABORTED_BEFORE_IT_RAN, not_run_after_abort_entry};
use crate::events::AgentEvent;
use crate::ids::{RunId, ToolCallId};
use crate::model::{Model, ModelChunk, ModelRequest};
use crate::permissions::ApprovalChoices;
use crate::runtime::{
    PreparedCall, RunContext, RunError, execute, grant_for_session, prepare_call,
};
use crate::store::{CallRecord, CallStatus, RepeatCounts, RunInfo};
use crate::wire::{
    ApprovalMode, Message, PermissionDecision, Resolution, ToolCall, ToolErrorCode, ToolOutput,
    approval_denied_message,
};

/// Bounds on one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopLimits {
    /// Model steps before the run stops without an answer.
    pub max_steps: u32,
    /// How often the same call (same tool, same arguments) may run in one run.
    pub max_identical_calls: usize,
    /// Blocked repeats tolerated before the run ends.
    pub repeat_strikes: usize,
    /// Bytes (of the messages' JSON) the earlier conversation may take in what the model is sent; past it the
    /// oldest turns are left out. The run's own messages are always sent.
    pub context_bytes: usize,
}

impl Default for LoopLimits {
    fn default() -> Self {
        Self {
            max_steps: 12,
            max_identical_calls: 2,
            repeat_strikes: 2,
            context_bytes: 256 * 1024,
        }
    }
}

/// Where what the model is sent starts: the oldest whole turns of the earlier conversation (`messages[..prior]`)
/// are left out until it fits `budget` bytes. A turn is a user message and everything after it up to the next one,
/// so a call and its result are always left out together. Returns the index of the first message sent.
pub fn context_start(messages: &[Message], prior: usize, budget: usize) -> usize {
    let prior = prior.min(messages.len());
    let sizes: Vec<usize> = messages[..prior]
        .iter()
        .map(|message| serde_json::to_string(message).map_or(0, |json| json.len()))
        .collect();
    let mut earlier: usize = sizes.iter().sum();
    let mut start = 0;
    while earlier > budget {
        // The next turn starts at the next user message after `start`.
        let Some(next) = messages[start + 1..prior]
            .iter()
            .position(|message| matches!(message, Message::User { .. }))
            .map(|offset| start + 1 + offset)
        else {
            // The earlier conversation is one turn: leave it all out.
            return prior;
        };
        earlier -= sizes[start..next].iter().sum::<usize>();
        start = next;
    }
    start
}

/// A call of an interrupted batch that waits for a person.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PendingCall {
    pub call: ToolCall,
    /// The parsed arguments, already valid against the tool's schema.
    pub input: Value,
    /// Why the policy asks.
    pub reason: String,
    /// The digest of the tool's definition when it asked, for a tool whose definition may change (see
    /// [`crate::store::CallRecord::spec_digest`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_digest: Option<String>,
    /// What it acts on (a file) when it asked (see [`crate::store::CallRecord::shown_state`]): an approved call
    /// runs only while it is still so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_state: Option<String>,
    /// What approving it may cover beyond this call, as its card offers it.
    #[serde(default, skip_serializing_if = "ApprovalChoices::is_empty")]
    pub choices: ApprovalChoices,
}

/// Where an `interrupt`-mode run stopped: a batch in which some calls need a person. The calls that did not need
/// one have run already; their outputs wait here until the batch is resumed.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interruption {
    /// The step whose batch was interrupted.
    pub step: u32,
    /// The whole batch, in the model's order.
    pub calls: Vec<ToolCall>,
    /// Outputs of the calls that are settled already.
    pub settled: Vec<(ToolCallId, ToolOutput)>,
    /// The calls that wait for a person, in the model's order.
    pub pending: Vec<PendingCall>,
}

/// A batch that waits for people, to be opened in the store.
pub struct SuspendedBatch {
    pub step: u32,
    pub calls: Vec<ToolCall>,
    pub prepared: Vec<PreparedCall>,
}

/// How a part of a run ended.
pub enum RunEnd {
    /// The model gave a final answer.
    Answer(String),
    /// An interactive batch waits for people.
    Suspended(SuspendedBatch),
    /// A batch needs a person; a later run resumes it.
    Interrupted(Interruption),
    Failed(RunError),
}

/// The repeated-call guard's state, carried from batch to batch.
pub struct RepeatGuard {
    limits: LoopLimits,
    seen: HashMap<(String, String), usize>,
    strikes: usize,
}

enum Repeat {
    Fresh,
    Blocked(usize),
    Stop,
}

impl RepeatGuard {
    pub fn new(limits: LoopLimits) -> Self {
        Self::restore(limits, RepeatCounts::default())
    }

    /// The guard as a batch saved it.
    pub fn restore(limits: LoopLimits, counts: RepeatCounts) -> Self {
        Self {
            limits,
            seen: counts.seen.into_iter().collect(),
            strikes: counts.strikes,
        }
    }

    /// What to save with a batch.
    pub fn counts(&self) -> RepeatCounts {
        let mut seen: Vec<_> = self
            .seen
            .iter()
            .map(|(key, times)| (key.clone(), *times))
            .collect();
        seen.sort();
        RepeatCounts {
            seen,
            strikes: self.strikes,
        }
    }

    fn check(&mut self, call: &ToolCall) -> Repeat {
        // The arguments as the tool reads them: serde_json objects are ordered maps, so the same arguments in another
        // key order compare equal, and blank arguments are the empty object they run as.
        let arguments = call
            .arguments_json()
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

/// A run's conversation as the loop carries it.
pub struct Conversation {
    /// Everything the model sees: the earlier conversation, then this run's messages.
    pub messages: Vec<Message>,
    /// How many of `messages` came before this run.
    pub prior: usize,
}

impl Conversation {
    /// This run's own messages.
    pub fn own(&self) -> &[Message] {
        &self.messages[self.prior.min(self.messages.len())..]
    }
}

/// How a part of a run ended, and the conversation as it stands.
pub struct LoopOutcome {
    pub conversation: Conversation,
    pub end: RunEnd,
    /// The last step taken.
    pub steps: u32,
    pub repeat: RepeatGuard,
}

/// Starts a run: the user's message joins the conversation and the loop samples from step 1.
pub async fn run_until_end(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    history: Vec<Message>,
    user_message: &str,
) -> LoopOutcome {
    emit_started(context, user_message, None);
    let prior = history.len();
    let mut conversation = Conversation {
        messages: history,
        prior,
    };
    conversation.messages.push(Message::User {
        content: user_message.to_owned(),
    });
    let mut repeat = RepeatGuard::new(limits);
    let (end, steps) = sample(model, context, limits, &mut conversation, &mut repeat, 1).await;
    LoopOutcome {
        conversation,
        end,
        steps,
        repeat,
    }
}

/// Samples on from `step` once a batch is settled: its outputs join the conversation in the model's order.
pub async fn continue_after_batch(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    mut conversation: Conversation,
    mut repeat: RepeatGuard,
    step: u32,
) -> LoopOutcome {
    let (end, steps) = sample(model, context, limits, &mut conversation, &mut repeat, step).await;
    LoopOutcome {
        conversation,
        end,
        steps,
        repeat,
    }
}

/// What a resume answers: a person's resolution for each pending call, and what they wrote besides.
pub struct Answers<'a> {
    pub resolutions: &'a HashMap<ToolCallId, Resolution>,
    /// User messages sent with the resume (typed instead of answering the cards): read after the calls' results.
    pub added: &'a [String],
}

/// Continues an interrupted batch with a person's resolution for each pending call, then samples on. `history`
/// is the conversation up to and including the assistant message that made the batch. Resolutions must answer
/// every pending call; edited arguments must already be checked against the tool's schema (they are checked
/// again before anything runs).
pub async fn resume_until_end(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    parent_run_id: &RunId,
    history: Vec<Message>,
    interruption: Interruption,
    Answers { resolutions, added }: Answers<'_>,
) -> LoopOutcome {
    emit_started(context, &added.join("\n\n"), Some(parent_run_id));
    let prior = history.len();
    let mut conversation = Conversation {
        messages: history,
        prior,
    };
    let mut repeat = RepeatGuard::new(limits);
    let mut outputs: HashMap<ToolCallId, ToolOutput> = interruption.settled.into_iter().collect();

    let decided = interruption.pending.iter().map(|pending| async {
        let id = pending.call.id.clone();
        context.emit(AgentEvent::ToolCallDecided {
            step: interruption.step,
            tool_call_id: id.clone(),
            tool_name: pending.call.name.clone(),
            arguments: pending.input.clone(),
            permission: PermissionDecision::Ask {
                reason: pending.reason.clone(),
            },
        });
        let Some(resolution) = resolutions.get(&id) else {
            let error = RunError::Model(format!("the resume did not answer tool call {id}"));
            return (id, Err(error));
        };
        // The grant is made before the resolution is announced, so the event names it.
        let grant = match resolution {
            Resolution::Approved {
                scope,
                edited_arguments,
                ..
            } => {
                grant_for_session(
                    context,
                    &pending.call,
                    &pending.input,
                    edited_arguments.as_ref(),
                    *scope,
                    pending.spec_digest.as_deref(),
                )
                .await
            }
            Resolution::Denied { .. } => None,
        };
        context.emit(AgentEvent::ApprovalResolved {
            tool_call_id: id.clone(),
            tool_name: pending.call.name.clone(),
            resolution: resolution.clone(),
            waited: std::time::Duration::ZERO,
            grant: grant.clone(),
        });
        if let Some(grant) = grant {
            context.emit(AgentEvent::SessionGrantAdded { grant });
        }
        let output = match resolution {
            Resolution::Denied { reason, .. } => {
                let output = ToolOutput::error(
                    ToolErrorCode::ApprovalDenied,
                    approval_denied_message(reason),
                );
                context.emit(AgentEvent::ToolFinished {
                    tool_call_id: id.clone(),
                    tool_name: pending.call.name.clone(),
                    executed_arguments: None,
                    output: output.clone(),
                    elapsed: std::time::Duration::ZERO,
                });
                Ok(output)
            }
            Resolution::Approved {
                edited_arguments, ..
            } => {
                let mut record = CallRecord::new(
                    context.run_id.clone(),
                    pending.call.clone(),
                    pending.input.clone(),
                    CallStatus::Approved,
                );
                record.resolution = Some(resolution.clone());
                record.edited_arguments = edited_arguments.clone();
                record.spec_digest = pending.spec_digest.clone();
                record.shown_state = pending.shown_state.clone();
                run_inline(context, record).await
            }
        };
        (id, output)
    });
    let mut failure = None;
    for (id, output) in futures::future::join_all(decided).await {
        match output {
            Ok(output) => {
                outputs.insert(id, output);
            }
            Err(error) => {
                failure.get_or_insert(error);
            }
        }
    }
    for call in &interruption.calls {
        if let Some(output) = outputs.remove(&call.id) {
            conversation.messages.push(Message::Tool {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                output,
            });
        }
    }
    // What the person wrote instead of (or besides) answering the cards comes after the calls' results.
    conversation
        .messages
        .extend(added.iter().map(|content| Message::User {
            content: content.clone(),
        }));
    let (end, steps) = match failure {
        Some(error) => {
            answer_unfinished(&mut conversation.messages, &interruption.calls, &error);
            (RunEnd::Failed(error), interruption.step)
        }
        None => {
            sample(
                model,
                context,
                limits,
                &mut conversation,
                &mut repeat,
                interruption.step + 1,
            )
            .await
        }
    };
    LoopOutcome {
        conversation,
        end,
        steps,
        repeat,
    }
}

fn emit_started(context: &RunContext, user_message: &str, parent_run_id: Option<&RunId>) {
    context.emit(AgentEvent::RunStarted {
        session_id: context.session_id.clone(),
        message: user_message.to_owned(),
        policy: context.permissions.policy,
        approval_mode: context.approval_mode,
        parent_run_id: parent_run_id.cloned(),
    });
}

/// Runs a call of a batch this run holds, recorded as it begins; the model's call id must be new in the run.
async fn run_inline(context: &RunContext, record: CallRecord) -> Result<ToolOutput, RunError> {
    let call_id = record.call.id.clone();
    // A call a person approved (an AG-UI resume's), kept to say in the audit log that it did not run.
    let approved =
        matches!(record.resolution, Some(Resolution::Approved { .. })).then(|| record.clone());
    match execute(context, &call_id, Some((record, context.epoch))).await? {
        Some(output) => Ok(output),
        // Aborted (perhaps before this task heard of it), or not this run's owner any more. (The store refuses two
        // calls of one batch with the same id too, but none reaches it: `sample` gives each call of a step an id of
        // its own before any begins, so the `not_run` line below never names an abort for a duplicate.)
        None => {
            let error = not_begun(context).await;
            if let (Some(record), RunError::Aborted { .. }) = (approved, &error)
                && let Some(entry) = not_run_after_abort_entry(&record, ABORTED_BEFORE_IT_RAN, None)
                && let Err(error) = context.store.audit(entry).await
            {
                tracing::warn!(%error, call = %call_id, "cannot record that an approved call did not run");
            }
            Err(error)
        }
    }
}

/// Why the store began no call of a batch this run holds: an abort it recorded ends the run as aborted (and stops
/// what else of it runs here); otherwise the run is another instance's now.
async fn not_begun(context: &RunContext) -> RunError {
    match context.store.run(&context.run_id).await {
        Ok(Some(RunInfo {
            abort: Some(reason),
            ..
        })) => {
            context.abort.abort(reason);
            RunError::Aborted { reason }
        }
        Ok(_) => RunError::Lost,
        Err(error) => RunError::Store(error.to_string()),
    }
}

/// Runs a prepared call that needs nobody: a refusal answers at once, an allowed call runs.
async fn settle_inline(
    context: &RunContext,
    prepared: PreparedCall,
) -> Result<ToolOutput, RunError> {
    match prepared {
        PreparedCall::Refused { call, output } => {
            context.emit(AgentEvent::ToolFinished {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                executed_arguments: None,
                output: output.clone(),
                elapsed: std::time::Duration::ZERO,
            });
            Ok(output)
        }
        PreparedCall::Decided {
            call, input, tool, ..
        } => {
            let mut record =
                CallRecord::new(context.run_id.clone(), call, input, CallStatus::Allowed);
            record.spec_digest = crate::runtime::definition_digest(&tool);
            run_inline(context, record).await
        }
    }
}

/// Samples from `first_step` until this part of the run ends. Returns how it ended and the last step taken.
async fn sample(
    model: &dyn Model,
    context: &RunContext,
    limits: LoopLimits,
    conversation: &mut Conversation,
    guard: &mut RepeatGuard,
    first_step: u32,
) -> (RunEnd, u32) {
    let prior = conversation.prior;
    let messages = &mut conversation.messages;
    let mut trimmed_reported = false;
    let aborted = || {
        RunEnd::Failed(RunError::Aborted {
            reason: context.abort.reason(),
        })
    };

    // A part that begins past the limit (after a batch decided at the last step) samples nothing: it ends at the
    // limit, or aborted when the run was aborted while its batch waited.
    if first_step > limits.max_steps && context.abort.is_aborted() {
        return (aborted(), first_step - 1);
    }
    for step in first_step..=limits.max_steps {
        if context.abort.is_aborted() {
            return (aborted(), step - 1);
        }
        context.emit(AgentEvent::StepStarted { step });
        let start = context_start(messages, prior, limits.context_bytes);
        if start > 0 && !trimmed_reported {
            trimmed_reported = true;
            context.emit(AgentEvent::ContextTrimmed {
                step,
                omitted_messages: u32::try_from(start).unwrap_or(u32::MAX),
            });
        }
        let sent = &messages[start..];
        // Read at every step: MCP servers may add, change or remove tools while a run goes on.
        let tools = context.toolbox.specs();
        context.emit(AgentEvent::ModelRequested {
            step,
            model: model.name().to_owned(),
            messages: sent.len(),
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
                messages: sent,
                tools: &tools,
            });
            loop {
                let chunk = tokio::select! {
                    biased;
                    () = context.abort.aborted() => return (aborted(), step),
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
                    Some(Err(error)) => {
                        return (RunEnd::Failed(RunError::Model(error.to_string())), step);
                    }
                }
            }
        }
        context.emit(AgentEvent::ModelFinished {
            step,
            finish_reason,
            usage,
            elapsed: started.elapsed(),
        });
        renew_taken_ids(&mut calls, messages);
        messages.push(Message::Assistant {
            content: text.clone(),
            tool_calls: calls.clone(),
        });
        if calls.is_empty() {
            return (RunEnd::Answer(text), step);
        }
        // Aborted while the model answered (by a person, or by the run's own bound on its events, which this step's
        // events may have passed): none of its calls is decided or run.
        if context.abort.is_aborted() {
            let error = RunError::Aborted {
                reason: context.abort.reason(),
            };
            answer_unfinished(messages, &calls, &error);
            return (RunEnd::Failed(error), step);
        }

        // Prepare the whole batch before any of it runs, under the grants the session holds and the rules in force
        // now: a grant revoked or a rule removed while the model answered allows nothing.
        context.refresh_permissions().await;
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
                    let error = RunError::RepeatedCall {
                        tool_name: call.name.clone(),
                    };
                    answer_unfinished(messages, &calls, &error);
                    return (RunEnd::Failed(error), step);
                }
            };
            batch.push(prepared);
        }
        let asking = batch
            .iter()
            .find_map(|prepared| prepared.asks().map(|reason| (prepared.call(), reason)));
        match (context.approval_mode, asking) {
            (ApprovalMode::FailClosed, Some((call, reason))) => {
                let error = RunError::ApprovalRequired {
                    tool_name: call.name.clone(),
                    reason: reason.to_owned(),
                };
                answer_unfinished(messages, &calls, &error);
                return (RunEnd::Failed(error), step);
            }
            (ApprovalMode::Interrupt, Some(_)) => {
                return match interrupt(batch, step, &calls, context).await {
                    Ok(interruption) => (RunEnd::Interrupted(interruption), step),
                    Err(error) => {
                        answer_unfinished(messages, &calls, &error);
                        (RunEnd::Failed(error), step)
                    }
                };
            }
            (ApprovalMode::Interactive, Some(_)) => {
                return (
                    RunEnd::Suspended(SuspendedBatch {
                        step,
                        calls,
                        prepared: batch,
                    }),
                    step,
                );
            }
            (_, None) => {}
        }

        // Nothing asks: run the batch now, concurrently.
        let settled = futures::future::join_all(batch.into_iter().map(|prepared| async move {
            let call = prepared.call().clone();
            (call, settle_inline(context, prepared).await)
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
            return (RunEnd::Failed(error), step);
        }
    }
    (
        RunEnd::Failed(RunError::StepLimit {
            max_steps: limits.max_steps,
        }),
        limits.max_steps.max(first_step.saturating_sub(1)),
    )
}

/// Gives a call a fresh id where its id names another call already: one of the conversation (some providers number
/// the calls of each step from the start) or an earlier one of this step (some give several calls of a step one id).
/// An id names one call in the conversation we send back, in the store and in the events a client matches results
/// by (AG-UI's `toolCallId`), so a shared one would make two calls one, and a provider refuses a conversation that
/// answers one id twice. Nothing has shown these calls yet; the conversation carries the new ids from here on, so
/// the provider sees ids it can match.
fn renew_taken_ids(calls: &mut [ToolCall], earlier: &[Message]) {
    if calls.is_empty() {
        return;
    }
    let mut taken: HashSet<ToolCallId> = earlier
        .iter()
        .flat_map(|message| match message {
            Message::Assistant { tool_calls, .. } => tool_calls
                .iter()
                .map(|call| call.id.clone())
                .collect::<Vec<_>>(),
            Message::Tool { tool_call_id, .. } => vec![tool_call_id.clone()],
            Message::System { .. } | Message::User { .. } => Vec::new(),
        })
        .collect();
    for call in calls.iter_mut() {
        if !taken.insert(call.id.clone()) {
            call.id = ToolCallId::generate();
            taken.insert(call.id.clone());
        }
    }
}

/// Runs what in the batch needs no person and sets the rest aside for a later run.
async fn interrupt(
    batch: Vec<PreparedCall>,
    step: u32,
    calls: &[ToolCall],
    context: &RunContext,
) -> Result<Interruption, RunError> {
    let mut pending = Vec::new();
    let mut now = Vec::new();
    for prepared in batch {
        match prepared {
            PreparedCall::Decided {
                call,
                input,
                permission: PermissionDecision::Ask { reason },
                tool,
            } => pending.push(PendingCall {
                spec_digest: crate::runtime::definition_digest(&tool),
                shown_state: tool.tool().state(&input),
                choices: context.permissions.approval_choices(
                    tool.spec(),
                    &input,
                    &context.grants(),
                ),
                call,
                input,
                reason,
            }),
            other => now.push(other),
        }
    }
    let settled = futures::future::join_all(now.into_iter().map(|prepared| async move {
        let id = prepared.call().id.clone();
        (id, settle_inline(context, prepared).await)
    }))
    .await;
    let mut outputs = Vec::with_capacity(settled.len());
    for (id, result) in settled {
        match result {
            Ok(output) => outputs.push((id, output)),
            Err(error) => return Err(error),
        }
    }
    Ok(Interruption {
        step,
        calls: calls.to_vec(),
        settled: outputs,
        pending,
    })
}

/// Gives every call of the last batch that has no result one that says the run ended, so the history stays a
/// valid conversation (every tool call answered) for the session's next run.
pub fn answer_unfinished(messages: &mut Vec<Message>, calls: &[ToolCall], error: &RunError) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.to_owned(),
        }
    }

    fn assistant(text: &str) -> Message {
        Message::Assistant {
            content: text.to_owned(),
            tool_calls: Vec::new(),
        }
    }

    fn size(messages: &[Message]) -> usize {
        messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap().len())
            .sum()
    }

    /// Calls the tool runs alike count as one repeated call: blank arguments run as `{}`, and keys in another
    /// order or other spacing are the same arguments. Before, a model alternating `""` and `{}` got twice the tries.
    #[test]
    fn the_repeat_guard_counts_arguments_as_the_tool_reads_them() {
        let limits = LoopLimits {
            max_identical_calls: 1,
            repeat_strikes: 10,
            ..LoopLimits::default()
        };
        let mut guard = RepeatGuard::new(limits);
        let call = |arguments: &str| ToolCall {
            id: ToolCallId::generate(),
            name: "list_files".to_owned(),
            arguments: arguments.to_owned(),
        };
        assert!(matches!(guard.check(&call("")), Repeat::Fresh));
        assert!(matches!(guard.check(&call("{}")), Repeat::Blocked(2)));
        assert!(matches!(guard.check(&call(" { } ")), Repeat::Blocked(3)));
        assert!(matches!(
            guard.check(&call(r#"{"a":1,"b":2}"#)),
            Repeat::Fresh
        ));
        assert!(matches!(
            guard.check(&call(r#"{ "b": 2, "a": 1 }"#)),
            Repeat::Blocked(2)
        ));
    }

    #[test]
    fn the_oldest_whole_turns_go_first_and_the_runs_own_messages_always_stay() {
        let turns: Vec<Message> = (0..4)
            .flat_map(|i| {
                [
                    user(&format!("question {i}")),
                    assistant(&format!("answer {i}")),
                ]
            })
            .collect();
        let mut messages = turns.clone();
        messages.push(user("the question of this run"));
        let prior = turns.len();
        assert_eq!(
            context_start(&messages, prior, usize::MAX),
            0,
            "everything fits"
        );
        // Room for the last two turns of the earlier conversation only.
        let budget = size(&turns[4..]);
        assert_eq!(context_start(&messages, prior, budget), 4);
        assert!(
            matches!(messages[4], Message::User { .. }),
            "a turn starts the window"
        );
        assert_eq!(context_start(&messages, prior, budget - 1), 6);
        assert_eq!(
            context_start(&messages, prior, 0),
            prior,
            "with no room, only the run's own messages are sent"
        );
        assert_eq!(
            context_start(&messages, 0, 0),
            0,
            "a run's own messages are never cut"
        );
    }
}
