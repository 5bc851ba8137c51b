//! The approval registry: every pending approval in the process, keyed by (run id, tool call id).
//!
//! A pending approval is a oneshot channel in a map, as in Codex. What can happen to one:
//!
//! - a person decides: [`ApprovalRegistry::resolve`] removes the entry and sends the resolution;
//! - nobody decides in time: the waiter removes the entry and resolves `denied/timeout`;
//! - the run aborts: the waiter removes the entry and resolves `denied/abort`;
//! - the waiter is dropped (its run task ended): the entry is removed and nobody can decide it any more.
//!
//! Whoever removes the entry, under the lock, decides the resolution; everybody else finds nothing. That is the
//! whole exactly-once argument. [`ApprovalRegistry::register`] is synchronous, so by the time it returns the entry
//! is in the map and a caller may resolve it at once: tests need no sleeps.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ids::{RunId, ToolCallId};
use crate::wire::{ApprovalRequest, ApprovalSource, Decision, DenialSource, Resolution};

/// The seed's default: two minutes for a person to decide.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ApprovalKey {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
}

/// What the tool runtime registers when a call needs a person.
#[derive(Clone, Debug)]
pub struct NewApproval {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
    pub tool_name: String,
    pub arguments: Value,
    pub reason: String,
}

/// The resolved pending entry and how it was resolved: the answer to a decision.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedApproval {
    pub pending: ApprovalRequest,
    pub resolution: Resolution,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "No pending approval found for run {run_id} and tool call {tool_call_id}. It may have already been resolved or timed out."
)]
pub struct ApprovalNotFound {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("tool call {tool_call_id} of run {run_id} is already waiting for approval")]
pub struct AlreadyPending {
    pub run_id: RunId,
    pub tool_call_id: ToolCallId,
}

/// Why a decision did not resolve anything.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ResolveError<E> {
    #[error(transparent)]
    NotFound(#[from] ApprovalNotFound),
    /// The check given to [`ApprovalRegistry::resolve_with`] refused the decision; the approval stays pending.
    #[error("the decision was refused")]
    Refused(E),
}

struct PendingEntry {
    request: ApprovalRequest,
    sender: oneshot::Sender<Resolution>,
    ticket: u64,
}

struct Inner {
    pending: Mutex<HashMap<ApprovalKey, PendingEntry>>,
    default_timeout: Duration,
    next_ticket: AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, HashMap<ApprovalKey, PendingEntry>> {
        // No code path panics while holding this lock; if one ever did, the map is still consistent.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One per process, owned by the application state and shared by handle (cloning is cheap).
#[derive(Clone)]
pub struct ApprovalRegistry {
    inner: Arc<Inner>,
}

impl Default for ApprovalRegistry {
    fn default() -> Self {
        Self::new(DEFAULT_APPROVAL_TIMEOUT)
    }
}

impl std::fmt::Debug for ApprovalRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalRegistry")
            .field("pending", &self.len())
            .field("default_timeout", &self.inner.default_timeout)
            .finish()
    }
}

impl Resolution {
    /// The resolution a person's decision makes.
    pub fn from_decision(decision: Decision) -> Self {
        match decision {
            Decision::Approve {
                scope,
                reason,
                arguments,
            } => Resolution::Approved {
                source: ApprovalSource::User,
                scope,
                reason,
                edited_arguments: arguments,
            },
            Decision::Deny { reason } => Resolution::Denied {
                source: DenialSource::User,
                reason: match reason {
                    Some(reason) => format!("The user denied this tool call: {reason}"),
                    None => "The user denied this tool call.".to_owned(),
                },
            },
        }
    }
}

fn denied_by(source: DenialSource, timeout: Duration) -> Resolution {
    let reason = match source {
        DenialSource::Timeout => format!(
            "No decision arrived within {} s, so the call was denied.",
            timeout.as_secs_f64()
        ),
        DenialSource::Abort => "The run was aborted before a decision arrived.".to_owned(),
        DenialSource::User => "The user denied this tool call.".to_owned(),
    };
    Resolution::Denied { source, reason }
}

impl ApprovalRegistry {
    pub fn new(default_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                pending: Mutex::new(HashMap::new()),
                default_timeout,
                next_ticket: AtomicU64::new(1),
            }),
        }
    }

    pub fn default_timeout(&self) -> Duration {
        self.inner.default_timeout
    }

    /// Registers a pending approval with the default timeout. The entry is in the map when this returns.
    pub fn register(
        &self,
        approval: NewApproval,
        cancel: CancellationToken,
    ) -> Result<PendingApproval, AlreadyPending> {
        self.register_with_timeout(approval, cancel, self.inner.default_timeout)
    }

    pub fn register_with_timeout(
        &self,
        approval: NewApproval,
        cancel: CancellationToken,
        timeout: Duration,
    ) -> Result<PendingApproval, AlreadyPending> {
        let key = ApprovalKey {
            run_id: approval.run_id.clone(),
            tool_call_id: approval.tool_call_id.clone(),
        };
        let requested_at = now_ms();
        let request = ApprovalRequest {
            run_id: approval.run_id,
            tool_call_id: approval.tool_call_id,
            tool_name: approval.tool_name,
            arguments: approval.arguments,
            reason: approval.reason,
            requested_at,
            expires_at: requested_at.saturating_add(timeout.as_millis() as u64),
        };
        let (sender, receiver) = oneshot::channel();
        let ticket = self.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
        match self.inner.lock().entry(key.clone()) {
            Entry::Occupied(_) => {
                return Err(AlreadyPending {
                    run_id: key.run_id,
                    tool_call_id: key.tool_call_id,
                });
            }
            Entry::Vacant(slot) => {
                slot.insert(PendingEntry {
                    request,
                    sender,
                    ticket,
                });
            }
        }
        Ok(PendingApproval {
            key,
            receiver,
            registry: Arc::clone(&self.inner),
            deadline: Instant::now() + timeout,
            timeout,
            cancel,
            ticket,
            settled: false,
        })
    }

    /// Resolves a pending approval with a person's decision.
    pub fn resolve(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decision: Decision,
    ) -> Result<ResolvedApproval, ApprovalNotFound> {
        self.resolve_with(run_id, tool_call_id, |_| {
            Ok::<_, std::convert::Infallible>(Resolution::from_decision(decision))
        })
        .map_err(|error| match error {
            ResolveError::NotFound(not_found) => not_found,
            ResolveError::Refused(never) => match never {},
        })
    }

    /// Resolves a pending approval with the resolution `decide` makes from the pending request, under the
    /// registry's lock: a check inside `decide` (edited arguments against the tool's schema, say) cannot race the
    /// timeout. When `decide` refuses, the approval stays pending.
    pub fn resolve_with<E>(
        &self,
        run_id: &RunId,
        tool_call_id: &ToolCallId,
        decide: impl FnOnce(&ApprovalRequest) -> Result<Resolution, E>,
    ) -> Result<ResolvedApproval, ResolveError<E>> {
        let key = ApprovalKey {
            run_id: run_id.clone(),
            tool_call_id: tool_call_id.clone(),
        };
        let mut pending = self.inner.lock();
        let Entry::Occupied(slot) = pending.entry(key) else {
            return Err(ResolveError::NotFound(ApprovalNotFound {
                run_id: run_id.clone(),
                tool_call_id: tool_call_id.clone(),
            }));
        };
        let resolution = decide(&slot.get().request).map_err(ResolveError::Refused)?;
        let entry = slot.remove();
        // Sent under the lock: a waiter that finds the entry gone knows the resolution is already in its channel.
        // The waiter cannot have dropped its receiver yet: dropping it takes this lock first.
        let _ = entry.sender.send(resolution.clone());
        Ok(ResolvedApproval {
            pending: entry.request,
            resolution,
        })
    }

    /// Every pending approval, or those of one run, oldest first.
    pub fn pending(&self, run_id: Option<&RunId>) -> Vec<ApprovalRequest> {
        let mut list: Vec<ApprovalRequest> = self
            .inner
            .lock()
            .values()
            .filter(|entry| run_id.is_none_or(|run_id| &entry.request.run_id == run_id))
            .map(|entry| entry.request.clone())
            .collect();
        list.sort_by(|a, b| {
            (a.requested_at, a.run_id.as_str(), a.tool_call_id.as_str()).cmp(&(
                b.requested_at,
                b.run_id.as_str(),
                b.tool_call_id.as_str(),
            ))
        });
        list
    }

    pub fn len(&self) -> usize {
        self.inner.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The waiting side of one pending approval. Await [`PendingApproval::wait`] for its resolution.
pub struct PendingApproval {
    key: ApprovalKey,
    receiver: oneshot::Receiver<Resolution>,
    registry: Arc<Inner>,
    deadline: Instant,
    timeout: Duration,
    cancel: CancellationToken,
    ticket: u64,
    settled: bool,
}

impl PendingApproval {
    /// The pending request, while it is pending (the registry holds the one copy).
    pub fn request(&self) -> Option<ApprovalRequest> {
        self.registry
            .lock()
            .get(&self.key)
            .filter(|entry| entry.ticket == self.ticket)
            .map(|entry| entry.request.clone())
    }

    /// Waits for a decision, the timeout or the run's abort, whichever comes first, and resolves exactly once.
    pub async fn wait(mut self) -> Resolution {
        let source = tokio::select! {
            biased;
            received = &mut self.receiver => match received {
                Ok(resolution) => {
                    self.settled = true;
                    return resolution;
                }
                // The sender is dropped only with its entry; treat a vanished registry as an abort.
                Err(_) => DenialSource::Abort,
            },
            () = self.cancel.cancelled() => DenialSource::Abort,
            () = tokio::time::sleep_until(self.deadline) => DenialSource::Timeout,
        };
        self.settle(source)
    }

    fn settle(&mut self, source: DenialSource) -> Resolution {
        self.settled = true;
        let removed = {
            let mut pending = self.registry.lock();
            match pending.get(&self.key) {
                Some(entry) if entry.ticket == self.ticket => pending.remove(&self.key),
                _ => None,
            }
        };
        match removed {
            Some(_) => denied_by(source, self.timeout),
            // A person's decision removed the entry first, and sent it under the lock: it is in the channel.
            None => self
                .receiver
                .try_recv()
                .unwrap_or_else(|_| denied_by(source, self.timeout)),
        }
    }
}

impl Drop for PendingApproval {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut pending = self.registry.lock();
        if pending
            .get(&self.key)
            .is_some_and(|entry| entry.ticket == self.ticket)
        {
            pending.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DecisionScope;
    use serde_json::json;

    fn new_approval(call: &str) -> NewApproval {
        NewApproval {
            run_id: RunId::parse("run-1").unwrap(),
            tool_call_id: ToolCallId::parse(call).unwrap(),
            tool_name: "delete_file".into(),
            arguments: json!({"path": "a.txt"}),
            reason: "delete_file is destructive".into(),
        }
    }

    fn ids(call: &str) -> (RunId, ToolCallId) {
        (
            RunId::parse("run-1").unwrap(),
            ToolCallId::parse(call).unwrap(),
        )
    }

    #[tokio::test]
    async fn registration_is_visible_before_the_first_await() {
        let registry = ApprovalRegistry::default();
        let pending = registry
            .register(new_approval("call-1"), CancellationToken::new())
            .unwrap();
        let listed = registry.pending(None);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].tool_name, "delete_file");
        assert_eq!(
            listed[0].expires_at - listed[0].requested_at,
            120_000,
            "the default timeout is 120 s"
        );
        drop(pending);
        assert!(registry.is_empty(), "dropping the waiter removes the entry");
    }

    #[tokio::test]
    async fn a_decision_resolves_the_waiter_in_the_same_tick() {
        let registry = ApprovalRegistry::default();
        let pending = registry
            .register(new_approval("call-1"), CancellationToken::new())
            .unwrap();
        let (run, call) = ids("call-1");
        let resolved = registry.resolve(&run, &call, Decision::approve()).unwrap();
        assert_eq!(resolved.pending.tool_call_id, call);
        assert_eq!(
            pending.wait().await,
            Resolution::Approved {
                source: ApprovalSource::User,
                scope: DecisionScope::Once,
                reason: None,
                edited_arguments: None
            }
        );
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn a_second_decision_finds_nothing() {
        let registry = ApprovalRegistry::default();
        let _pending = registry
            .register(new_approval("call-1"), CancellationToken::new())
            .unwrap();
        let (run, call) = ids("call-1");
        registry.resolve(&run, &call, Decision::deny()).unwrap();
        let error = registry
            .resolve(&run, &call, Decision::approve())
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "No pending approval found for run run-1 and tool call call-1. It may have already been resolved or timed out."
        );
    }

    #[tokio::test]
    async fn resolving_an_unknown_approval_is_not_found() {
        let registry = ApprovalRegistry::default();
        let error = registry
            .resolve(
                &RunId::parse("demo-run").unwrap(),
                &ToolCallId::parse("demo-call").unwrap(),
                Decision::approve(),
            )
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "No pending approval found for run demo-run and tool call demo-call. It may have already been resolved or timed out."
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_deciding_in_time_denies_with_source_timeout() {
        let registry = ApprovalRegistry::new(Duration::from_secs(120));
        let pending = registry
            .register(new_approval("call-1"), CancellationToken::new())
            .unwrap();
        let resolution = pending.wait().await;
        assert_eq!(
            resolution,
            Resolution::Denied {
                source: DenialSource::Timeout,
                reason: "No decision arrived within 120 s, so the call was denied.".into()
            }
        );
        assert!(
            registry.is_empty(),
            "a timed-out approval is no longer pending"
        );
        let (run, call) = ids("call-1");
        assert!(registry.resolve(&run, &call, Decision::approve()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn an_explicit_timeout_overrides_the_default() {
        let registry = ApprovalRegistry::default();
        let pending = registry
            .register_with_timeout(
                new_approval("call-1"),
                CancellationToken::new(),
                Duration::from_millis(1500),
            )
            .unwrap();
        let started = Instant::now();
        let resolution = pending.wait().await;
        assert_eq!(started.elapsed(), Duration::from_millis(1500));
        assert!(matches!(
            resolution,
            Resolution::Denied {
                source: DenialSource::Timeout,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn aborting_the_run_denies_with_source_abort() {
        let registry = ApprovalRegistry::default();
        let cancel = CancellationToken::new();
        let pending = registry
            .register(new_approval("call-1"), cancel.clone())
            .unwrap();
        cancel.cancel();
        assert_eq!(
            pending.wait().await,
            Resolution::Denied {
                source: DenialSource::Abort,
                reason: "The run was aborted before a decision arrived.".into()
            }
        );
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn a_decision_that_arrived_first_wins_over_a_later_abort() {
        let registry = ApprovalRegistry::default();
        let cancel = CancellationToken::new();
        let pending = registry
            .register(new_approval("call-1"), cancel.clone())
            .unwrap();
        let (run, call) = ids("call-1");
        registry.resolve(&run, &call, Decision::approve()).unwrap();
        cancel.cancel();
        assert!(pending.wait().await.is_approved());
    }

    #[tokio::test]
    async fn a_refused_check_leaves_the_approval_pending() {
        let registry = ApprovalRegistry::default();
        let _pending = registry
            .register(new_approval("call-1"), CancellationToken::new())
            .unwrap();
        let (run, call) = ids("call-1");
        let refused = registry.resolve_with(&run, &call, |_| Err::<Resolution, _>("bad arguments"));
        assert_eq!(refused.unwrap_err(), ResolveError::Refused("bad arguments"));
        assert_eq!(registry.pending(Some(&run)).len(), 1);
    }

    #[tokio::test]
    async fn the_same_call_cannot_wait_twice() {
        let registry = ApprovalRegistry::default();
        let _first = registry
            .register(new_approval("call-1"), CancellationToken::new())
            .unwrap();
        assert!(
            registry
                .register(new_approval("call-1"), CancellationToken::new())
                .is_err()
        );
    }

    #[tokio::test]
    async fn pending_lists_one_run_or_all() {
        let registry = ApprovalRegistry::default();
        let _a = registry
            .register(new_approval("call-a"), CancellationToken::new())
            .unwrap();
        let mut other = new_approval("call-b");
        other.run_id = RunId::parse("run-2").unwrap();
        let _b = registry.register(other, CancellationToken::new()).unwrap();
        assert_eq!(registry.pending(None).len(), 2);
        assert_eq!(
            registry
                .pending(Some(&RunId::parse("run-2").unwrap()))
                .len(),
            1
        );
        assert!(
            registry
                .pending(Some(&RunId::parse("demo").unwrap()))
                .is_empty()
        );
    }
}
