//! A person's decision on a pending approval, cancelling a run, and the sweeper that times approvals out.

use std::fmt;
use std::time::Duration;

use super::finish::abort_settlement;
use super::{Harness, RunNotFound, Unavailable};
use crate::approvals::{ApprovalNotFound, ResolvedApproval, denied_by, settlement};
use crate::clock::now_ms;
use crate::events::AgentEvent;
use crate::ids::{RunId, ToolCallId};
use crate::runtime::{AbortReason, encode};
use crate::store::{Aborted, DecideFailure, Refused, RunInfo, StoredGrant};
use crate::wire::{Decision, DecisionScope, DenialSource, Resolution};

/// Who decided, as the authentication layer knows them (never from a request body): the access token, a login,
/// or `local` when the server has no token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Actor(String);

impl Actor {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// Whoever reaches a server that has no token: a person on this machine.
    pub fn local() -> Self {
        Self("local".to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    NotFound(#[from] ApprovalNotFound),
    #[error("{0}")]
    InvalidArguments(String),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

impl PartialEq for DecideError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::NotFound(a), Self::NotFound(b)) => a == b,
            (Self::InvalidArguments(a), Self::InvalidArguments(b)) => a == b,
            _ => false,
        }
    }
}

/// What cancelling a run found.
#[derive(Clone, Debug, PartialEq)]
pub struct Cancelled {
    /// The run as it was when the abort was recorded.
    pub run: RunInfo,
}

impl Harness {
    /// Resolves a pending approval with a person's decision. Edited arguments must satisfy the tool's schema;
    /// when they do not, the approval stays pending. A decision is durable before its `approvalResolved` event is
    /// readable; an approved call then runs in this process.
    pub async fn decide(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decision: Decision,
        actor: &Actor,
    ) -> Result<ResolvedApproval, DecideError> {
        let toolbox = std::sync::Arc::clone(&self.inner.toolbox);
        let who = actor.as_str().to_owned();
        let for_session = matches!(
            decision,
            Decision::Approve {
                scope: DecisionScope::Session,
                ..
            }
        );
        let settle = Box::new(move |record: &crate::store::CallRecord| {
            if let Decision::Approve {
                arguments: Some(arguments),
                ..
            } = &decision
            {
                toolbox
                    .validate(&record.call.name, arguments)
                    .map_err(|error| Refused(error.message))?;
            }
            let mut settled = settlement(record, Resolution::from_decision(decision), Some(&who));
            if for_session {
                settled.events.extend(encode(
                    &record.run_id,
                    AgentEvent::SessionGrantAdded {
                        tool_name: record.call.name.clone(),
                    },
                ));
            }
            Ok(settled)
        });
        let decided = self
            .inner
            .store
            .decide(run_id, tool_call_id, settle)
            .await
            .map_err(Unavailable)?;
        let record = match decided {
            Ok(record) => record,
            Err(DecideFailure::NotPending) => {
                return Err(DecideError::NotFound(ApprovalNotFound {
                    run_id: run_id.clone(),
                    tool_call_id: tool_call_id.clone(),
                }));
            }
            Err(DecideFailure::Refused(refused)) => {
                return Err(DecideError::InvalidArguments(refused.0));
            }
        };
        if for_session
            && let Some(info) = self.inner.store.run(run_id).await.map_err(Unavailable)?
        {
            let grant = StoredGrant {
                id: format!("tool:{}", record.call.name),
                grant: crate::policy::stored_grant(&record.call.name, &self.inner.toolbox),
                created_at: now_ms(),
            };
            self.inner
                .store
                .add_grant(&info.session_id, grant)
                .await
                .map_err(Unavailable)?;
        }
        self.spawn_advance(run_id.clone());
        let (Some(pending), Some(resolution)) = (record.approval, record.resolution) else {
            return Err(DecideError::Unavailable(Unavailable(
                crate::store::StoreError::Corrupt(format!(
                    "the decided call {tool_call_id} of run {run_id} has no approval"
                )),
            )));
        };
        Ok(ResolvedApproval {
            pending,
            resolution,
        })
    }

    /// Aborts a run: when this returns, its pending approvals are resolved as `denied/abort` (no later decision
    /// finds them), nothing more of it runs, and its task (if any) is stopping.
    pub async fn cancel(&self, run_id: &RunId) -> Result<Cancelled, CancelError> {
        match self.abort_run(run_id, AbortReason::Cancelled).await? {
            Some(aborted) => Ok(Cancelled { run: aborted.run }),
            None => Err(CancelError::NotFound(RunNotFound(run_id.clone()))),
        }
    }

    /// Records the abort, then stops what runs of it here, and lets a waiting run end.
    pub(super) async fn abort_run(
        &self,
        run_id: &RunId,
        reason: AbortReason,
    ) -> Result<Option<Aborted>, Unavailable> {
        let aborted = self
            .inner
            .store
            .abort_run(run_id, reason, abort_settlement())
            .await?;
        if let Some(aborted) = &aborted {
            // Whatever of it runs in this process stops: its task, its tools.
            self.inner.local.abort(run_id, reason);
            if aborted.run.state == crate::store::RunState::Waiting {
                self.spawn_advance(run_id.clone());
            }
        }
        Ok(aborted)
    }

    /// Times out pending approvals as they expire, as long as the harness runs.
    pub(super) async fn sweep_expired_forever(self) {
        let timeout = self.inner.config.approval_timeout;
        let durable = self.inner.store.kind().is_durable();
        loop {
            let next = match self.inner.store.next_expiry().await {
                Ok(next) => next,
                Err(error) => {
                    tracing::warn!(%error, "cannot read when the next approval expires");
                    Some(now_ms() + 1_000)
                }
            };
            // Another process may add approvals to a shared database: look again now and then.
            let idle = if durable {
                Some(Duration::from_secs(5))
            } else {
                None
            };
            let wait = next
                .map(|at| Duration::from_millis(at.saturating_sub(now_ms())))
                .or(idle);
            tokio::select! {
                () = self.inner.closing.cancelled() => return,
                () = self.inner.sweeper.notified() => continue,
                () = sleep_or_forever(wait) => {}
            }
            let settle = Box::new(move |record: &crate::store::CallRecord| {
                settlement(record, denied_by(DenialSource::Timeout, timeout), None)
            });
            match self.inner.store.expire(now_ms(), settle).await {
                Ok(expired) => {
                    let mut runs: Vec<RunId> =
                        expired.into_iter().map(|record| record.run_id).collect();
                    runs.dedup();
                    for run_id in runs {
                        self.spawn_advance(run_id);
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot time out expired approvals"),
            }
        }
    }
}

async fn sleep_or_forever(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error(transparent)]
    NotFound(#[from] RunNotFound),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}
