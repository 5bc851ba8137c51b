//! A run's task: one segment of sampling, from the start, from a resume, or from a settled batch, and what becomes
//! of how it ended.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use super::{Harness, LocalRun};
use crate::agent_loop::{
    Answers, Conversation, LoopOutcome, RepeatGuard, continue_after_batch, resume_until_end,
    run_until_end,
};
use crate::events::{AgentEvent, EventSink};
use crate::ids::ToolCallId;
use crate::interrupts::Suspension;
use crate::policy::RuleBook as _;
use crate::runtime::{RunAbort, RunContext, RunError, StoreEvents};
use crate::store::{Claimed, Epoch, RunInfo};
use crate::wire::{ApprovalPolicy, Message, Resolution};

/// Where a segment of a run begins.
pub(super) enum Segment {
    /// A new run: the user's message on the session's history (`None`) or on a conversation the client owns.
    Start {
        history: Option<Vec<Message>>,
        message: String,
    },
    /// The resume of an interrupted run.
    Resume {
        suspension: Box<Suspension>,
        resolutions: HashMap<ToolCallId, Resolution>,
        added: Vec<String>,
    },
    /// A waiting run whose batch is settled, claimed by this process.
    Continue(Box<Claimed>),
}

/// What the end of a segment needs to know besides how it ended.
pub(super) struct Ending {
    pub context: RunContext,
    pub epoch: Epoch,
    pub owned_by_session: bool,
    pub policy: ApprovalPolicy,
}

/// Drops every event: for a context that only runs calls of a waiting run, whose events go with each call's
/// record.
pub(super) struct NoEvents;

impl EventSink for NoEvents {
    fn emit(&self, _: AgentEvent) {}
}

impl Harness {
    /// What the runtime needs to work on a run in this process.
    pub(super) async fn context(
        &self,
        info: &RunInfo,
        policy: ApprovalPolicy,
        abort: RunAbort,
        events: Arc<dyn EventSink>,
        epoch: Epoch,
    ) -> RunContext {
        let inner = &self.inner;
        // Also for the calls of a waiting batch, which this part runs under the rules of now (a `deny` added since
        // beats an approval); a step's calls read them again before they are decided.
        inner.rules.reread_shared().await;
        RunContext {
            run_id: info.run_id.clone(),
            session_id: info.session_id.clone(),
            approval_mode: info.mode,
            permissions: inner.config.permissions.with_policy(policy),
            // Read before each step's calls are decided (`RunContext::refresh_permissions`).
            grants: Default::default(),
            approval_timeout: inner.config.approval_timeout,
            toolbox: Arc::clone(&inner.toolbox),
            abort,
            events,
            store: Arc::clone(&inner.store),
            epoch,
        }
    }

    /// Runs one segment of a run in a task of this process, then records how it ended.
    pub(super) fn spawn_segment(
        &self,
        info: RunInfo,
        policy: ApprovalPolicy,
        epoch: Epoch,
        segment: Segment,
        local: LocalRun,
    ) {
        let harness = self.clone();
        self.inner.tasks.spawn(async move {
            let retention = harness.inner.config.retention;
            let events = StoreEvents::new(
                Arc::clone(&harness.inner.store),
                info.run_id.clone(),
                epoch,
                // The run's bounds hold over all its parts, not each part after a batch that waited.
                retention
                    .events_per_run
                    .saturating_sub(info.last_seq as usize),
                retention
                    .event_bytes_per_run
                    .saturating_sub(usize::try_from(info.event_bytes).unwrap_or(usize::MAX)),
                local.abort.clone(),
            );
            let policy = match &segment {
                Segment::Continue(claimed) => claimed.batch.policy,
                _ => policy,
            };
            let context = harness
                .context(&info, policy, local.abort.clone(), Arc::new(events), epoch)
                .await;
            let model = Arc::clone(&harness.inner.model);
            let limits = harness.inner.config.limits;
            // A panic in a run must not leave its viewers waiting: it ends the run with an internal error.
            let (owned_by_session, outcome) = match segment {
                Segment::Start { history, message } => {
                    let owned = history.is_none();
                    let history = match history {
                        Some(history) => history,
                        None => match harness.inner.store.history(&info.session_id).await {
                            Ok(history) => history,
                            Err(error) => {
                                let failure = RunError::Store(error.to_string());
                                harness
                                    .end_before_sampling(&context, epoch, owned, failure)
                                    .await;
                                return;
                            }
                        },
                    };
                    let run = run_until_end(&*model, &context, limits, history, &message);
                    (owned, AssertUnwindSafe(run).catch_unwind().await)
                }
                Segment::Resume {
                    suspension,
                    resolutions,
                    added,
                } => {
                    let Suspension {
                        run_id: parent,
                        history,
                        interruption,
                        ..
                    } = *suspension;
                    let run = resume_until_end(
                        &*model,
                        &context,
                        limits,
                        &parent,
                        history,
                        interruption,
                        Answers {
                            resolutions: &resolutions,
                            added: &added,
                        },
                    );
                    (false, AssertUnwindSafe(run).catch_unwind().await)
                }
                Segment::Continue(claimed) => {
                    let Claimed {
                        batch,
                        outputs,
                        run: RunInfo { abort, .. },
                        ..
                    } = *claimed;
                    let mut conversation = Conversation {
                        messages: batch.history,
                        prior: batch.prior,
                    };
                    conversation
                        .messages
                        .extend(outputs.into_iter().map(|(call, output)| Message::Tool {
                            tool_call_id: call.id,
                            tool_name: call.name,
                            output,
                        }));
                    let repeat = RepeatGuard::restore(limits, batch.repeat);
                    if let Some(reason) = abort {
                        context.abort.abort(reason);
                    }
                    let run = continue_after_batch(
                        &*model,
                        &context,
                        limits,
                        conversation,
                        repeat,
                        batch.step + 1,
                    );
                    (
                        batch.owned_by_session,
                        AssertUnwindSafe(run).catch_unwind().await,
                    )
                }
            };
            let ending = Ending {
                context,
                epoch,
                owned_by_session,
                policy,
            };
            harness.settle_segment(ending, outcome).await;
            drop(local);
        });
    }

    /// Ends a run that could not even begin sampling.
    async fn end_before_sampling(
        &self,
        context: &RunContext,
        epoch: Epoch,
        owned_by_session: bool,
        failure: RunError,
    ) {
        let outcome = LoopOutcome {
            conversation: Conversation {
                messages: Vec::new(),
                prior: 0,
            },
            end: crate::agent_loop::RunEnd::Failed(failure),
            steps: 0,
            repeat: RepeatGuard::new(self.inner.config.limits),
        };
        let ending = Ending {
            context: context.clone(),
            epoch,
            owned_by_session,
            policy: context.permissions.policy,
        };
        self.settle_segment(ending, Ok(outcome)).await;
    }
}
