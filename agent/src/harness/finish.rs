//! What becomes of a segment of a run: a batch opened for people, or the run's end recorded with its terminal
//! event last, so that whoever sees that event can rely on everything before it.

use std::sync::Arc;
use std::time::Duration;

use super::drive::Ending;
use super::{Actor, Harness};
use crate::agent_loop::{Interruption, LoopOutcome, RunEnd, SuspendedBatch, answer_unfinished};
use crate::approvals::{denied_by, not_run_after_abort, request_audit, settlement};
use crate::clock::now_ms;
use crate::events::AgentEvent;
use crate::interrupts::{IssuedInterrupt, Suspension, arguments_digest};
use crate::runtime::{AbortReason, RunContext, RunError, call_record, encode, tool_result};
use crate::store::{
    AuditEntry, AuditKind, CallStatus, EndClaim, Fenced, FinishRun, HeldRun, InterruptsTaken,
    OpenBatch, RecoveryEvents, RunState, SavedBatch, SettleExpired, Settlement,
};
use crate::tools::Toolbox;
use crate::wire::{
    ApprovalMode, DenialSource, InterruptRequest, Message, Resolution, RunErrorCode, ToolErrorCode,
    ToolOutput,
};

/// A run whose events passed its bound ends at the limit, whatever its loop made of the step in which they did: the
/// events past the bound are not in its log, so its log must not end as though they were (an answer the log does not
/// hold, a batch that waits on calls whose start it lacks). The calls of such a batch are answered as an abort's are.
fn unless_past_event_bound(
    end: RunEnd,
    messages: &mut Vec<Message>,
    context: &RunContext,
) -> RunEnd {
    // (An abort's reason reads `Cancelled` until the run is aborted.)
    let reason = context.abort.reason();
    if matches!(end, RunEnd::Failed(_)) || reason != AbortReason::EventLimit {
        return end;
    }
    let error = RunError::Aborted { reason };
    match &end {
        RunEnd::Suspended(batch) => answer_unfinished(messages, &batch.calls, &error),
        RunEnd::Interrupted(interruption) => {
            // What ran before the batch was interrupted has its result; the rest ends with the run.
            messages.extend(interruption.calls.iter().filter_map(|call| {
                let (_, output) = interruption.settled.iter().find(|(id, _)| id == &call.id)?;
                Some(Message::Tool {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    output: output.clone(),
                })
            }));
            answer_unfinished(messages, &interruption.calls, &error);
        }
        RunEnd::Answer(_) | RunEnd::Failed(_) => {}
    }
    RunEnd::Failed(error)
}

impl Harness {
    /// Ends a run this instance holds that no task of it works on (`reconcile_held_runs_forever`), under its claim:
    /// aborted if it was, failed otherwise. What it still had pending is settled as an abort would.
    pub(super) async fn end_unworked(&self, run: HeldRun) {
        let HeldRun {
            run_id,
            epoch,
            abort,
        } = run;
        let failure = match abort {
            Some(reason) => AgentEvent::RunFailed {
                code: reason.code(),
                message: reason.message().to_owned(),
            },
            None => AgentEvent::RunFailed {
                code: RunErrorCode::Store,
                message: "This run stopped without its end being recorded (the database failed as it ended, or its work stopped on an error), so it was ended afterwards. The session can go on with a new message.".to_owned(),
            },
        };
        // What it was asked and did, for its session's next run, as its end would have recorded it.
        let history = match self.run_view(&run_id).await {
            Ok(Some(view)) => recovered_history(&self.inner.toolbox, &view),
            Ok(None) | Err(_) => Vec::new(),
        };
        let finish = FinishRun {
            events: encode(&run_id, failure),
            run_id: run_id.clone(),
            claim: EndClaim::Held(epoch),
            state: RunState::Failed,
            history,
            conversation: None,
            suspension: None,
            audit: Vec::new(),
            settle_pending: Some(abort_settlement(None)),
        };
        match self.inner.store.finish_run(finish).await {
            Ok(Ok(())) => {
                tracing::warn!(%run_id, "ended a run that no task of this instance worked on any more");
            }
            // Ended or taken over meanwhile.
            Ok(Err(_)) => {}
            Err(error) => {
                tracing::warn!(%run_id, %error, "cannot end a run that no task works on; trying again later");
            }
        }
    }
}

/// Settles what a finished run still has pending: a card never outlives its run. `actor` is who cancelled the run,
/// if a person did.
pub(super) fn abort_settlement(actor: Option<&Actor>) -> SettleExpired {
    let actor = actor.map(|actor| actor.as_str().to_owned());
    Box::new(move |record| {
        let resolution = if record.status == CallStatus::Pending {
            denied_by(DenialSource::Abort, Duration::ZERO)
        } else {
            not_run_after_abort()
        };
        settlement(record, resolution, actor.as_deref())
    })
}

/// The most of a result the model reads back from a recovered run's log for a tool that is gone (an MCP server's
/// no longer listed): as much as an MCP tool's model reads.
const GONE_TOOL_OUTPUT_LIMIT: usize = 64 * 1024;

/// What a run that ended without its end recording it added to its session's conversation, from its log: nothing
/// for a run whose client keeps the conversation (AG-UI's); results bounded as `toolbox`'s tools bound them.
fn recovered_history(toolbox: &Toolbox, view: &crate::view::RunView) -> Vec<Message> {
    if view.approval_mode == ApprovalMode::Interrupt {
        return Vec::new();
    }
    view.messages(|name| {
        toolbox
            .lookup(name)
            .map_or(Some(GONE_TOOL_OUTPUT_LIMIT), |tool| {
                tool.tool().model_output_limit()
            })
    })
}

/// How recovery words what it records about the work of a dead process; `toolbox` bounds what the next run's
/// model reads of the results in a recovered run's conversation, as it bounded them in the run.
pub(super) fn recovery_events(toolbox: Arc<Toolbox>) -> RecoveryEvents {
    RecoveryEvents {
        history: Box::new(move |view| recovered_history(&toolbox, view)),
        run_failed: Box::new(|info, taken| {
            let message = match taken {
                InterruptsTaken::Kept => {
                    "The server restarted while this run was working, so it ended here. The session can go on with a new message."
                }
                InterruptsTaken::GivenBack => {
                    "The server restarted before this run began the calls it resumed, so it ended here and ran none of them. The interrupts it answered are open again: resume them again."
                }
            };
            encode(
                &info.run_id,
                AgentEvent::RunFailed {
                    code: RunErrorCode::Restarted,
                    message: message.to_owned(),
                },
            )
        }),
        call_interrupted: Box::new(|record| {
            let output = ToolOutput::error(
                ToolErrorCode::ToolFailed,
                format!(
                    "{} was interrupted: the server stopped while it was running, so its effect is unknown. It was not run again.",
                    record.call.name
                ),
            );
            let events = tool_result(
                &record.run_id,
                &record.call,
                record.edited_arguments.clone(),
                output.clone(),
                Duration::ZERO,
            );
            Settlement {
                resolution: record.resolution.clone().unwrap_or(Resolution::Denied {
                    source: DenialSource::Abort,
                    reason: "interrupted".to_owned(),
                }),
                status: CallStatus::Interrupted,
                edited_arguments: record.edited_arguments.clone(),
                output: Some(output),
                events,
                audit: vec![AuditEntry {
                    id: 0,
                    at: now_ms(),
                    kind: AuditKind::CallInterrupted,
                    session_id: None,
                    run_id: Some(record.run_id.clone()),
                    tool_call_id: Some(record.call.id.clone()),
                    tool: Some(record.call.name.clone()),
                    // As every other line of the call has them: the arguments asked about, and the ones a person
                    // edited (which ran).
                    arguments_digest: Some(arguments_digest(&record.input)),
                    edited_digest: record.edited_digest(),
                    outcome: "interrupted".to_owned(),
                    source: Some("restart".to_owned()),
                    scope: None,
                    reason: Some(
                        "its process stopped while it was running; its effect is unknown"
                            .to_owned(),
                    ),
                    actor: None,
                }],
                grant: None,
                under_grant: None,
            }
        }),
    }
}

impl Harness {
    /// Records how a segment ended.
    pub(super) async fn settle_segment(
        &self,
        ending: Ending,
        outcome: std::thread::Result<LoopOutcome>,
    ) {
        let run_id = ending.context.run_id.clone();
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(_) => {
                tracing::error!(%run_id, "the run panicked");
                let failure = AgentEvent::RunFailed {
                    code: RunErrorCode::Internal,
                    message: "The run failed unexpectedly.".to_owned(),
                };
                self.finish_with(&ending, Vec::new(), 0, RunState::Failed, None, failure)
                    .await;
                return;
            }
        };
        let LoopOutcome {
            mut conversation,
            end,
            steps,
            repeat,
        } = outcome;
        let end = unless_past_event_bound(end, &mut conversation.messages, &ending.context);
        match end {
            RunEnd::Answer(answer) => {
                let done = AgentEvent::RunFinished { answer, steps };
                self.finish_with(
                    &ending,
                    conversation.messages,
                    conversation.prior,
                    RunState::Done,
                    None,
                    done,
                )
                .await;
            }
            RunEnd::Failed(error) => {
                self.fail(&ending, conversation.messages, conversation.prior, error)
                    .await;
            }
            RunEnd::Interrupted(interruption) => {
                let calls = interruption.calls.clone();
                let (suspension, interrupts, audit) =
                    self.issue_interrupts(&ending.context, &conversation.messages, interruption);
                let event = AgentEvent::RunInterrupted { interrupts };
                let mut finish = self.finish_run(
                    &ending,
                    conversation.messages.clone(),
                    conversation.prior,
                    RunState::Interrupted,
                    Some(suspension),
                    event,
                );
                finish.audit = audit;
                // Aborted where nothing of the run heard of it: it ends aborted, and issues nothing.
                if let Some(reason) = self.commit_finish(finish).await {
                    let error = RunError::Aborted { reason };
                    answer_unfinished(&mut conversation.messages, &calls, &error);
                    self.fail(&ending, conversation.messages, conversation.prior, error)
                        .await;
                }
            }
            RunEnd::Suspended(batch) => {
                let SuspendedBatch {
                    step,
                    calls,
                    prepared,
                } = batch;
                let requested_at = now_ms();
                let records: Vec<_> = prepared
                    .iter()
                    .map(|prepared| call_record(&ending.context, prepared, requested_at))
                    .collect();
                let mut events = Vec::new();
                let mut audit = Vec::new();
                for record in &records {
                    match (&record.approval, &record.output) {
                        (Some(request), _) => {
                            events.extend(encode(
                                &run_id,
                                AgentEvent::ApprovalRequested {
                                    request: request.clone(),
                                },
                            ));
                            audit.extend(request_audit(record));
                        }
                        (None, Some(output)) => events.extend(tool_result(
                            &run_id,
                            &record.call,
                            None,
                            output.clone(),
                            Duration::ZERO,
                        )),
                        (None, None) => {}
                    }
                }
                let saved = SavedBatch {
                    history: conversation.messages.clone(),
                    prior: conversation.prior,
                    owned_by_session: ending.owned_by_session,
                    policy: ending.policy,
                    step,
                    calls: calls.clone(),
                    repeat: repeat.counts(),
                };
                let opened = self
                    .inner
                    .store
                    .open_batch(OpenBatch {
                        run_id: run_id.clone(),
                        epoch: ending.epoch,
                        batch: saved,
                        calls: records,
                        events,
                        audit,
                    })
                    .await;
                match opened {
                    Ok(Ok(())) => {
                        self.inner.sweeper.notify_one();
                        self.spawn_advance(run_id);
                    }
                    Ok(Err(Fenced::Aborted(reason))) => {
                        let error = RunError::Aborted { reason };
                        answer_unfinished(&mut conversation.messages, &calls, &error);
                        self.fail(&ending, conversation.messages, conversation.prior, error)
                            .await;
                    }
                    Ok(Err(Fenced::Lost)) => {
                        tracing::warn!(%run_id, "another instance took this run over; this one stops");
                    }
                    Err(error) => {
                        tracing::error!(%run_id, %error, "cannot open the batch");
                        let error = RunError::Store(error.to_string());
                        answer_unfinished(&mut conversation.messages, &calls, &error);
                        self.fail(&ending, conversation.messages, conversation.prior, error)
                            .await;
                    }
                }
            }
        }
    }

    async fn fail(&self, ending: &Ending, messages: Vec<Message>, prior: usize, error: RunError) {
        let failure = AgentEvent::RunFailed {
            code: error.code(),
            message: error.to_string(),
        };
        if matches!(error, RunError::Lost) {
            tracing::warn!(run_id = %ending.context.run_id, "another instance took this run over; this one stops");
            return;
        }
        self.finish_with(ending, messages, prior, RunState::Failed, None, failure)
            .await;
    }

    async fn finish_with(
        &self,
        ending: &Ending,
        messages: Vec<Message>,
        prior: usize,
        state: RunState,
        suspension: Option<Suspension>,
        terminal: AgentEvent,
    ) {
        let finish = self.finish_run(ending, messages, prior, state, suspension, terminal);
        self.commit_finish(finish).await;
    }

    fn finish_run(
        &self,
        ending: &Ending,
        messages: Vec<Message>,
        prior: usize,
        state: RunState,
        suspension: Option<Suspension>,
        terminal: AgentEvent,
    ) -> FinishRun {
        let run_id = ending.context.run_id.clone();
        let (history, conversation) = if ending.owned_by_session {
            (messages[prior.min(messages.len())..].to_vec(), None)
        } else {
            (Vec::new(), Some(messages))
        };
        FinishRun {
            events: encode(&run_id, terminal),
            run_id,
            claim: EndClaim::Held(ending.epoch),
            state,
            history,
            conversation,
            suspension,
            audit: Vec::new(),
            settle_pending: Some(abort_settlement(None)),
        }
    }

    /// Records the run's end; the abort the store refused it for, if it did (only an end with interrupts is refused
    /// so), for the caller to end the run as aborted instead.
    async fn commit_finish(&self, finish: FinishRun) -> Option<AbortReason> {
        let run_id = finish.run_id.clone();
        match self.inner.store.finish_run(finish).await {
            Ok(Ok(())) => None,
            Ok(Err(Fenced::Aborted(reason))) => Some(reason),
            Ok(Err(fenced)) => {
                tracing::warn!(%run_id, %fenced, "the run's end was not recorded: another instance holds it");
                None
            }
            Err(error) => {
                tracing::error!(%run_id, %error, "cannot record the run's end");
                None
            }
        }
    }

    /// The suspension an interrupted run leaves, the interrupts it issues, and their audit entries.
    fn issue_interrupts(
        &self,
        context: &RunContext,
        history: &[Message],
        interruption: Interruption,
    ) -> (Suspension, Vec<InterruptRequest>, Vec<AuditEntry>) {
        let at = now_ms();
        let expires_at = at.saturating_add(self.inner.config.approval_timeout.as_millis() as u64);
        let interrupts: Vec<IssuedInterrupt> = interruption
            .pending
            .iter()
            .map(|pending| IssuedInterrupt {
                request: InterruptRequest {
                    id: format!("int_{}", uuid::Uuid::new_v4().simple()),
                    tool_call_id: pending.call.id.clone(),
                    tool_name: pending.call.name.clone(),
                    arguments: pending.input.clone(),
                    reason: pending.reason.clone(),
                    expires_at,
                    choices: pending.choices.clone(),
                },
                digest: arguments_digest(&pending.input),
            })
            .collect();
        let requests = interrupts
            .iter()
            .map(|issued| issued.request.clone())
            .collect();
        let audit = interrupts
            .iter()
            .map(|issued| AuditEntry {
                id: 0,
                at,
                kind: AuditKind::ApprovalRequested,
                session_id: Some(context.session_id.clone()),
                run_id: Some(context.run_id.clone()),
                tool_call_id: Some(issued.request.tool_call_id.clone()),
                tool: Some(issued.request.tool_name.clone()),
                arguments_digest: Some(issued.digest.clone()),
                edited_digest: None,
                outcome: "requested".to_owned(),
                source: Some("interrupt".to_owned()),
                scope: None,
                reason: Some(issued.request.reason.clone()),
                actor: None,
            })
            .collect();
        let suspension = Suspension {
            run_id: context.run_id.clone(),
            session_id: context.session_id.clone(),
            history: history.to_vec(),
            interruption,
            interrupts,
        };
        (suspension, requests, audit)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::{RunId, ToolCallId};
    use crate::store::CallRecord;
    use crate::wire::ToolCall;

    /// The line recovery writes for a call that was running names its arguments as the call's other lines do: the
    /// digest of the arguments asked about, and that of the ones a person edited. Before, it gave the edited ones as
    /// the call's own and said nothing was edited.
    #[test]
    fn an_interrupted_call_is_logged_with_the_digests_of_its_approval() {
        let asked = json!({"path": "asked.txt"});
        let edited = json!({"path": "edited.txt"});
        let mut record = CallRecord::new(
            RunId::parse("r").unwrap(),
            ToolCall {
                id: ToolCallId::parse("c").unwrap(),
                name: "delete_file".into(),
                arguments: asked.to_string(),
            },
            asked.clone(),
            CallStatus::Executing,
        );
        record.edited_arguments = Some(edited.clone());
        let settled = (recovery_events(Arc::new(Toolbox::default())).call_interrupted)(&record);
        let line = &settled.audit[0];
        assert_eq!(line.outcome, "interrupted");
        assert_eq!(line.arguments_digest, Some(arguments_digest(&asked)));
        assert_eq!(line.edited_digest, Some(arguments_digest(&edited)));
        record.edited_arguments = None;
        let line =
            &(recovery_events(Arc::new(Toolbox::default())).call_interrupted)(&record).audit[0];
        assert_eq!(line.edited_digest, None);
    }
}
