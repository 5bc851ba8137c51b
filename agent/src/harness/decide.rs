//! A person's decision on a pending approval, cancelling a run, and the sweeper that times approvals out.

use std::fmt;
use std::time::Duration;

use super::finish::abort_settlement;
use super::{Harness, RunNotFound, Unavailable};
use crate::approvals::{
    ApprovalNotFound, ResolvedApproval, denied_by, granting_settlement, settlement,
};
use crate::clock::now_ms;
use crate::ids::{RunId, ToolCallId};
use crate::permissions::{Grant, SessionGrant};
use crate::policy::{RuleBook as _, grant, session_grant};
use crate::runtime::AbortReason;
use crate::store::{Aborted, CallStatus, DecideFailure, Refused, RunInfo, Settlement};
use crate::wire::{
    ApprovalSource, Decision, DecisionScope, DenialSource, PermissionDecision, Resolution,
};

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
    /// A session scope the card did not offer (see the request's `choices`); the approval stays pending.
    #[error("{0}")]
    ScopeNotOffered(String),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

impl DecideError {
    /// The HTTP status of a decision refused: the approval API's and the page's.
    pub fn status(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::InvalidArguments(_) | Self::ScopeNotOffered(_) => 400,
            Self::Unavailable(_) => 503,
        }
    }
}

impl PartialEq for DecideError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::NotFound(a), Self::NotFound(b)) => a == b,
            (Self::InvalidArguments(a), Self::InvalidArguments(b))
            | (Self::ScopeNotOffered(a), Self::ScopeNotOffered(b)) => a == b,
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
    /// Resolves a pending approval with a person's decision. Edited arguments must satisfy the tool's schema, and
    /// a session scope must be one the card offered; otherwise the approval stays pending. A decision is durable
    /// before its `approvalResolved` event is readable, and so is the session grant an approval for the session
    /// made (the event names it); an approved call then runs in this process.
    pub async fn decide(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decision: Decision,
        actor: &Actor,
    ) -> Result<ResolvedApproval, DecideError> {
        self.decide_keeping(run_id, tool_call_id, decision, actor, &[])
            .await
    }

    /// [`Self::decide`], leaving waiting the calls of `kept` that an approval for the session would otherwise
    /// approve with it: the cards the person is editing, or writing a reason on, in the page that decides.
    pub async fn decide_keeping(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decision: Decision,
        actor: &Actor,
        kept: &[ToolCallId],
    ) -> Result<ResolvedApproval, DecideError> {
        let toolbox = std::sync::Arc::clone(&self.inner.toolbox);
        let who = actor.as_str().to_owned();
        let grant = self
            .session_scope(run_id, tool_call_id, &decision)
            .await?
            .map(|grant| session_grant(grant, run_id.clone(), tool_call_id.clone()));
        let made = grant.clone();
        let settle = Box::new(move |record: &crate::store::CallRecord| {
            still_open(record)?;
            if let Decision::Approve {
                arguments: Some(arguments),
                ..
            } = &decision
            {
                toolbox
                    .validate(&record.call.name, arguments)
                    .map_err(|error| Refused(error.message))?;
            }
            Ok(granting_settlement(
                record,
                Resolution::from_decision(decision, &record.input),
                Some(&who),
                grant,
            ))
        });
        let decided = self
            .inner
            .store
            .decide(run_id, tool_call_id, settle)
            .await
            .map_err(Unavailable)?;
        let record = match decided {
            Ok(record) => record,
            // A person's own decision stands on no grant, so `GrantRevoked` is not its failure; were it, the card
            // would still be pending, as for a lost race.
            Err(
                failure @ (DecideFailure::NotPending
                | DecideFailure::Expired
                | DecideFailure::GrantRevoked),
            ) => {
                if failure == DecideFailure::Expired {
                    self.inner.sweeper.notify_one();
                }
                return Err(DecideError::NotFound(ApprovalNotFound {
                    run_id: run_id.clone(),
                    tool_call_id: tool_call_id.clone(),
                }));
            }
            Err(DecideFailure::Refused(refused)) => {
                return Err(DecideError::InvalidArguments(refused.0));
            }
        };
        // A grant the decision made was kept with it (`Settlement::grant`), before the run goes on.
        if let (Some(made), Some(Resolution::Approved { scope, .. })) = (&made, &record.resolution)
        {
            self.approve_covered(run_id, tool_call_id, made, *scope, actor, kept)
                .await;
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

    /// Approves the other calls of the run still waiting that `made`, the grant the decision on `decided` just
    /// made, covers as their cards showed them. The person approved the tool "for the session": a call asked
    /// after the decision runs without a card, and one asked with it in the same batch should not wait for a
    /// second click. A card is approved only when it offered this very grant (the same tool, definition and
    /// reach: what the person was shown) and the rules in force now let the grant allow the call, so a rule that
    /// denies or asks, added since, keeps it waiting. Each is a decision of its own by the same person, with its
    /// `approvalResolved`, its audit entry and a reason that names the grant; one that cannot be read or decided
    /// now waits for a person as before, and so does one of `kept`.
    async fn approve_covered(
        &self,
        run_id: &RunId,
        decided: &ToolCallId,
        made: &SessionGrant,
        scope: DecisionScope,
        actor: &Actor,
        kept: &[ToolCallId],
    ) {
        let calls = match self.inner.store.calls(run_id).await {
            Ok(calls) => calls,
            Err(error) => {
                tracing::warn!(%error, %run_id, "cannot read the run's other calls: those the new session grant covers wait for a person");
                return;
            }
        };
        let mut covered = calls.into_iter().filter(|record| {
            record.call.id != *decided
                && !kept.contains(&record.call.id)
                && record.status == CallStatus::Pending
                && record.approval.as_ref().is_some_and(|approval| {
                    approval
                        .choices
                        .session
                        .iter()
                        .any(|offered| offered.grant == made.grant)
                })
        });
        let Some(first) = covered.next() else {
            return;
        };
        // The rules and the session's grants as they are now: a grant revoked meanwhile (another tab, another
        // instance) approves nothing more.
        self.inner.rules.reread_shared().await;
        let grants = match self.inner.store.run(run_id).await {
            Ok(Some(run)) => self.grants(&run.session_id).await,
            Ok(None) => return,
            Err(error) => Err(Unavailable(error)),
        };
        let grants = match grants {
            Ok(grants) if grants.list().iter().any(|held| held.id == made.id) => grants,
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%error, %run_id, "cannot read the session's grants: the calls the new grant covers wait for a person");
                return;
            }
        };
        for record in std::iter::once(first).chain(covered) {
            let allowed = self
                .inner
                .toolbox
                .lookup(&record.call.name)
                .is_some_and(|tool| {
                    matches!(
                        self.inner
                            .config
                            .permissions
                            .decide(tool.spec(), &record.input, &grants),
                        PermissionDecision::Allow { .. }
                    )
                });
            if !allowed {
                continue;
            }
            let resolution = Resolution::Approved {
                source: ApprovalSource::User,
                scope,
                reason: Some(format!(
                    "Covered by the approval for the session given to call {decided} ({}).",
                    made.grant.describe()
                )),
                edited_arguments: None,
            };
            let who = actor.as_str().to_owned();
            let grant_id = made.id.as_str().to_owned();
            let settle = Box::new(move |record: &crate::store::CallRecord| {
                still_open(record)?;
                Ok(Settlement {
                    under_grant: Some(grant_id),
                    ..settlement(record, resolution, Some(&who))
                })
            });
            match self
                .inner
                .store
                .decide(run_id, &record.call.id, settle)
                .await
            {
                Ok(Ok(_)) => {}
                // Past its expiry: the sweep's, which times it out.
                Ok(Err(DecideFailure::Expired)) => self.inner.sweeper.notify_one(),
                // Revoked since the grants were read above: the rest wait for a person too.
                Ok(Err(DecideFailure::GrantRevoked)) => return,
                // Decided meanwhile, by a person or the sweep: theirs stands.
                Ok(Err(_)) => {}
                Err(error) => {
                    tracing::warn!(%error, %run_id, tool_call_id = %record.call.id, "cannot approve a call the new session grant covers: it waits for a person");
                }
            }
        }
    }

    /// The grant approving with a session scope makes, checked against what the card offered: `None` for `once`
    /// and for a denial. The pending call's card never changes, so reading it before the decision is as good as
    /// reading it with it; a call no longer pending is left for the decision to find so.
    async fn session_scope(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decision: &Decision,
    ) -> Result<Option<Grant>, DecideError> {
        let Decision::Approve {
            scope, arguments, ..
        } = decision
        else {
            return Ok(None);
        };
        if *scope == DecisionScope::Once {
            return Ok(None);
        }
        let record = self
            .inner
            .store
            .call(run_id, tool_call_id)
            .await
            .map_err(Unavailable)?;
        let Some(record) = record.filter(|record| record.status == CallStatus::Pending) else {
            return Ok(None);
        };
        let choices = record
            .approval
            .as_ref()
            .map(|approval| approval.choices.clone())
            .unwrap_or_default();
        let not_offered = |why: &str| {
            DecideError::ScopeNotOffered(
                format!(
                    "This approval does not offer the scope {}. {why}",
                    scope.as_str()
                )
                .trim_end()
                .to_owned(),
            )
        };
        if !choices.offers(*scope) {
            return Err(not_offered(choices.session_note.as_deref().unwrap_or("")));
        }
        // The grant is the one the card offered: edited arguments that would make another are refused.
        let tool = self
            .inner
            .toolbox
            .lookup(&record.call.name)
            .ok_or_else(|| not_offered("The tool is gone."))?;
        // A card shown before this version may offer a scope for a program in the workspace, which no grant covers.
        if self
            .inner
            .config
            .permissions
            .runs_workspace_file(tool.spec(), &record.input)
        {
            return Err(not_offered(crate::policy::WORKSPACE_PROGRAM_NOTE));
        }
        match grant::grant_for_approval(tool.spec(), &record.input, arguments.as_ref(), *scope) {
            // The grant the card offered, for the tool as the card showed it: a tool whose definition changed
            // since (an MCP server's) would make a grant for a definition nobody saw.
            Ok(Some(grant))
                if choices
                    .session_choice(*scope)
                    .is_some_and(|offered| offered.grant == grant) =>
            {
                Ok(Some(grant))
            }
            Ok(Some(_)) => Err(DecideError::ScopeNotOffered(format!(
                "{} changed since this card was shown, so it will not run as the card showed it, and a grant would allow the tool as it is now, which nobody was shown. Deny it; the model may ask again.",
                record.call.name
            ))),
            Ok(None) => Err(not_offered("")),
            Err(edited) => Err(DecideError::ScopeNotOffered(edited.to_string())),
        }
    }

    /// Aborts a run: when this returns, its pending approvals are resolved as `denied/abort` (no later decision
    /// finds them), nothing more of it runs, and its task (if any) is stopping.
    pub async fn cancel(&self, run_id: &RunId, actor: &Actor) -> Result<Cancelled, CancelError> {
        match self
            .abort_run(run_id, AbortReason::Cancelled, Some(actor))
            .await?
        {
            Some(aborted) => Ok(Cancelled { run: aborted.run }),
            None => Err(CancelError::NotFound(RunNotFound(run_id.clone()))),
        }
    }

    /// Records the abort, then stops what runs of it here, and lets a waiting run end.
    /// `actor` is who asked, when a person did (a cancel), for the audit entries of what the abort settles.
    pub(super) async fn abort_run(
        &self,
        run_id: &RunId,
        reason: AbortReason,
        actor: Option<&Actor>,
    ) -> Result<Option<Aborted>, Unavailable> {
        let aborted = self
            .inner
            .store
            .abort_run(run_id, reason, abort_settlement(actor))
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
        // While the last sweep left due approvals pending (a durable store's rows this version cannot read): when
        // it swept, and when to look again. The next look is for what expires after that sweep, so that they are
        // not due again at once. That also hides an approval committed since with an earlier expiry (a batch
        // opened slower than the timeout, another instance's clock), so meanwhile the sweeper looks again by a
        // deadline a few seconds after that sweep, which no wake-up puts off, and each sweep takes whatever is due.
        let mut left: Option<(u64, tokio::time::Instant)> = None;
        loop {
            let swept_at = left.map_or(0, |(at, _)| at);
            let next = match self.inner.store.next_expiry(swept_at).await {
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
            // At most a second at a time: the wait runs on a clock that stands still while the machine sleeps,
            // and the deadlines on one that does not (crate::clock); after a suspension, what came due meanwhile
            // times out within a second of the machine waking.
            let wait = next.map(|at| {
                Duration::from_millis(at.saturating_sub(now_ms())).min(Duration::from_secs(1))
            });
            let wait = match left {
                Some((_, deadline)) => {
                    let by = deadline.saturating_duration_since(tokio::time::Instant::now());
                    Some(wait.map_or(by, |wait| wait.min(by)))
                }
                None => wait.or(idle),
            };
            tokio::select! {
                () = self.inner.closing.cancelled() => return,
                () = self.inner.sweeper.notified() => continue,
                () = sleep_or_forever(wait) => {}
            }
            let settle = Box::new(move |record: &crate::store::CallRecord| {
                settlement(record, denied_by(DenialSource::Timeout, timeout), None)
            });
            let now = now_ms();
            match self.inner.store.expire(now, settle).await {
                Ok(expired) => {
                    // What is still due is what this version cannot read (what an abort left, for its run's
                    // claim, is neither due nor counted). A memory store reads every row, and its aborts settle
                    // every call: an approval due there now was committed during the sweep, and is swept at once.
                    let still_due = durable
                        && match self.inner.store.next_expiry(0).await {
                            Ok(next) => next.is_some_and(|at| at <= now),
                            Err(_) => true,
                        };
                    left = still_due
                        .then(|| (now, tokio::time::Instant::now() + Duration::from_secs(5)));
                    let mut runs: Vec<RunId> =
                        expired.into_iter().map(|record| record.run_id).collect();
                    runs.dedup();
                    for run_id in runs {
                        self.spawn_advance(run_id);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot time out expired approvals; trying again in a second");
                    tokio::select! {
                        () = self.inner.closing.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }
}

/// Refuses a decision on a call past its expiry: it is the sweep's, which times it out, even when no sweep has yet;
/// a decision that comes after the card's time ran out decides nothing.
fn still_open(record: &crate::store::CallRecord) -> Result<(), DecideFailure> {
    if record
        .approval
        .as_ref()
        .is_some_and(|approval| approval.expires_at <= now_ms())
    {
        return Err(DecideFailure::Expired);
    }
    Ok(())
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
