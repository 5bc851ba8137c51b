//! What interrupt-mode runs issued, kept until a resume uses it, once.
//!
//! An interrupted run leaves a [`Suspension`]: the conversation up to the batch, the batch itself, and one issued
//! interrupt per call that needs a person (its id, tool, argument digest and expiry). A resume names the run that
//! issued the interrupts; [`InterruptStore::take`] checks it against the suspension under the store's lock and, only
//! if every check passes, marks the suspension used before anything executes. A second resume of the same run finds
//! a tombstone and is refused: a tool runs at most once per approval, whatever a client resends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::agent_loop::Interruption;
use crate::ids::{RunId, SessionId};
use crate::wire::{InterruptRequest, Message};

/// The digest of a call's arguments: SHA-256 over their canonical JSON (object keys sorted), in hex.
pub fn arguments_digest(arguments: &Value) -> String {
    let digest = Sha256::digest(arguments.to_string().as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// One interrupt as issued: what a client sees, and the digest of the arguments it was issued for.
#[derive(Clone, Debug, PartialEq)]
pub struct IssuedInterrupt {
    pub request: InterruptRequest,
    pub digest: String,
}

/// An interrupted run, waiting for its resume.
#[derive(Clone, Debug, PartialEq)]
pub struct Suspension {
    /// The run that issued the interrupts.
    pub run_id: RunId,
    /// Its session (the AG-UI thread).
    pub session_id: SessionId,
    /// The conversation up to and including the assistant message that made the interrupted batch.
    pub history: Vec<Message>,
    pub interruption: Interruption,
    pub interrupts: Vec<IssuedInterrupt>,
}

impl Suspension {
    /// The earliest expiry among the interrupts, in milliseconds since the Unix epoch.
    pub fn expires_at(&self) -> u64 {
        self.interrupts
            .iter()
            .map(|issued| issued.request.expires_at)
            .min()
            .unwrap_or(0)
    }
}

enum Slot {
    Open(Box<Suspension>),
    /// Resumed already, by this run.
    Used {
        by: RunId,
    },
}

/// Why a suspension could not be taken.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum TakeError<E> {
    #[error("Run {0} issued no interrupts that this server knows of.")]
    UnknownParent(RunId),
    #[error(
        "The interrupts of run {parent} were already resumed by run {by}; a resume is used once."
    )]
    AlreadyUsed { parent: RunId, by: RunId },
    /// The check refused the resume; the suspension stays open.
    #[error("the resume was refused")]
    Refused(E),
}

struct Slots {
    by_run: HashMap<RunId, Slot>,
    /// Issue order, oldest first, for the bound on how many are kept.
    order: VecDeque<RunId>,
    /// The newest open suspension of each session.
    open_by_session: HashMap<SessionId, RunId>,
}

impl Slots {
    /// Keeps a suspension open, as its session's newest.
    fn open(&mut self, suspension: Suspension) {
        let run_id = suspension.run_id.clone();
        // An id with a slot (a tombstone, when a taken suspension comes back) already has its place in the order.
        if !self.by_run.contains_key(&run_id) {
            self.order.push_back(run_id.clone());
        }
        self.open_by_session
            .insert(suspension.session_id.clone(), run_id.clone());
        self.by_run.insert(run_id, Slot::Open(Box::new(suspension)));
    }

    /// Forgets used and expired suspensions, oldest first, until at most `keep` remain. An open suspension that
    /// has not expired is never dropped: a person may still answer it.
    fn evict(&mut self, keep: usize, now_ms: u64) {
        let mut kept = VecDeque::with_capacity(self.order.len());
        while let Some(run_id) = self.order.pop_front() {
            let evictable = match self.by_run.get(&run_id) {
                Some(Slot::Used { .. }) | None => true,
                Some(Slot::Open(suspension)) => suspension.expires_at() <= now_ms,
            };
            if evictable && self.by_run.len() > keep {
                if let Some(Slot::Open(suspension)) = self.by_run.remove(&run_id)
                    && self.open_by_session.get(&suspension.session_id) == Some(&run_id)
                {
                    self.open_by_session.remove(&suspension.session_id);
                }
            } else {
                kept.push_back(run_id);
            }
        }
        self.order = kept;
    }
}

/// Every suspension and tombstone of the process, bounded in count: used and expired ones go first (oldest first),
/// and an open one never goes before it expires.
pub struct InterruptStore {
    slots: Mutex<Slots>,
    capacity: usize,
}

impl std::fmt::Debug for InterruptStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterruptStore")
            .field("kept", &self.lock().by_run.len())
            .finish()
    }
}

impl InterruptStore {
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: Mutex::new(Slots {
                by_run: HashMap::new(),
                order: VecDeque::new(),
                open_by_session: HashMap::new(),
            }),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a suspension until it is resumed, or expires and is pushed out by newer ones.
    pub fn issue(&self, suspension: Suspension, now_ms: u64) {
        let mut slots = self.lock();
        if slots.by_run.len() >= self.capacity {
            // Make room for a tenth more at once, so that a full store scans once per many issues.
            let keep = self.capacity - (self.capacity / 10).max(1);
            slots.evict(keep, now_ms);
        }
        slots.open(suspension);
    }

    /// Whether a run id was ever issued interrupts (open or used): such an id cannot be reused for a new run.
    pub fn knows(&self, run_id: &RunId) -> bool {
        self.lock().by_run.contains_key(run_id)
    }

    /// The session's open suspension that has not expired, if any: the session waits for a resume.
    pub fn open_in_session(&self, session_id: &SessionId, now_ms: u64) -> Option<RunId> {
        let slots = self.lock();
        let run_id = slots.open_by_session.get(session_id)?;
        match slots.by_run.get(run_id) {
            Some(Slot::Open(suspension)) if suspension.expires_at() > now_ms => {
                Some(run_id.clone())
            }
            _ => None,
        }
    }

    /// The session's newest suspension that is still open (expired or not): the run a resume answers when the
    /// client does not name it (`@ag-ui/client` sends no `parentRunId`).
    pub fn latest_open_in_session(&self, session_id: &SessionId) -> Option<RunId> {
        let slots = self.lock();
        let run_id = slots.open_by_session.get(session_id)?;
        matches!(slots.by_run.get(run_id), Some(Slot::Open(_))).then(|| run_id.clone())
    }

    /// Puts a taken suspension back, open, when the run that took it could not start after all.
    pub fn restore(&self, suspension: Suspension) {
        self.lock().open(suspension);
    }

    /// Checks a resume of `parent` by run `by` against the suspension, and takes the suspension only if `check`
    /// accepts it. All or nothing: when `check` refuses, the suspension stays open for a correct resume.
    pub fn take<T, E>(
        &self,
        parent: &RunId,
        by: &RunId,
        check: impl FnOnce(&Suspension) -> Result<T, E>,
    ) -> Result<(Suspension, T), TakeError<E>> {
        let mut slots = self.lock();
        let suspension = match slots.by_run.get(parent) {
            None => return Err(TakeError::UnknownParent(parent.clone())),
            Some(Slot::Used { by: used_by }) => {
                return Err(TakeError::AlreadyUsed {
                    parent: parent.clone(),
                    by: used_by.clone(),
                });
            }
            Some(Slot::Open(suspension)) => suspension,
        };
        let checked = check(suspension).map_err(TakeError::Refused)?;
        let slot = slots
            .by_run
            .insert(parent.clone(), Slot::Used { by: by.clone() });
        if let Some(Slot::Open(suspension)) = &slot
            && slots.open_by_session.get(&suspension.session_id) == Some(parent)
        {
            slots.open_by_session.remove(&suspension.session_id);
        }
        match slot {
            Some(Slot::Open(suspension)) => Ok((*suspension, checked)),
            // Unreachable: the slot was open a moment ago and the lock was held throughout.
            _ => Err(TakeError::UnknownParent(parent.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ToolCallId;
    use serde_json::json;

    fn suspension(run: &str, session: &str, expires_at: u64) -> Suspension {
        Suspension {
            run_id: RunId::parse(run).unwrap(),
            session_id: SessionId::parse(session).unwrap(),
            history: Vec::new(),
            interruption: Interruption {
                step: 1,
                calls: Vec::new(),
                settled: Vec::new(),
                pending: Vec::new(),
            },
            interrupts: vec![IssuedInterrupt {
                request: InterruptRequest {
                    id: "int-1".into(),
                    tool_call_id: ToolCallId::parse("call_1").unwrap(),
                    tool_name: "delete_file".into(),
                    arguments: json!({"path": "a"}),
                    reason: "destructive".into(),
                    expires_at,
                },
                digest: arguments_digest(&json!({"path": "a"})),
            }],
        }
    }

    fn run(id: &str) -> RunId {
        RunId::parse(id).unwrap()
    }

    #[test]
    fn digests_ignore_key_order_and_see_every_change() {
        assert_eq!(
            arguments_digest(&json!({"a": 1, "b": 2})),
            arguments_digest(&serde_json::from_str::<Value>(r#"{"b":2,"a":1}"#).unwrap())
        );
        assert_ne!(
            arguments_digest(&json!({"path": "a"})),
            arguments_digest(&json!({"path": "b"}))
        );
        assert_eq!(arguments_digest(&json!({})).len(), 64);
    }

    #[test]
    fn a_suspension_is_taken_once_and_a_replay_is_told_who_took_it() {
        let store = InterruptStore::new(10);
        store.issue(suspension("r1", "t", u64::MAX), 0);
        let (taken, ()) = store
            .take(&run("r1"), &run("r2"), |_| Ok::<_, ()>(()))
            .unwrap();
        assert_eq!(taken.run_id, run("r1"));
        assert_eq!(
            store
                .take(&run("r1"), &run("r3"), |_| Ok::<_, ()>(()))
                .unwrap_err(),
            TakeError::AlreadyUsed {
                parent: run("r1"),
                by: run("r2")
            }
        );
        assert_eq!(
            store
                .take(&run("nope"), &run("r3"), |_| Ok::<_, ()>(()))
                .unwrap_err(),
            TakeError::UnknownParent(run("nope"))
        );
    }

    #[test]
    fn a_refused_check_leaves_the_suspension_open() {
        let store = InterruptStore::new(10);
        store.issue(suspension("r1", "t", u64::MAX), 0);
        assert_eq!(
            store
                .take(&run("r1"), &run("r2"), |_| Err::<(), _>("partial"))
                .unwrap_err(),
            TakeError::Refused("partial")
        );
        assert!(
            store
                .take(&run("r1"), &run("r2"), |_| Ok::<_, ()>(()))
                .is_ok()
        );
    }

    #[test]
    fn open_suspensions_block_their_session_until_they_expire() {
        let store = InterruptStore::new(10);
        store.issue(suspension("r1", "t", 1_000), 0);
        let thread = SessionId::parse("t").unwrap();
        assert_eq!(store.open_in_session(&thread, 999), Some(run("r1")));
        assert_eq!(store.open_in_session(&thread, 1_000), None);
        assert_eq!(
            store.open_in_session(&SessionId::parse("other").unwrap(), 0),
            None
        );
    }

    #[test]
    fn the_store_forgets_used_and_expired_suspensions_first_and_never_an_open_one() {
        let store = InterruptStore::new(3);
        store.issue(suspension("open", "t1", u64::MAX), 0);
        store.issue(suspension("used", "t2", u64::MAX), 0);
        store.issue(suspension("expired", "t3", 10), 0);
        store
            .take(&run("used"), &run("by"), |_| Ok::<_, ()>(()))
            .unwrap();
        store.issue(suspension("new", "t4", u64::MAX), 100);
        assert!(
            store.knows(&run("open")),
            "an open suspension waits for its person"
        );
        assert!(
            !store.knows(&run("used")),
            "the oldest that can go goes first"
        );
        assert!(store.knows(&run("expired")) && store.knows(&run("new")));
        // Even past its capacity, the store does not drop what may still be answered.
        for i in 0..5 {
            store.issue(
                suspension(&format!("more{i}"), &format!("u{i}"), u64::MAX),
                100,
            );
        }
        assert!(!store.knows(&run("expired")));
        assert!(
            store.knows(&run("open")) && store.knows(&run("new")) && store.knows(&run("more4"))
        );
        assert_eq!(
            store.open_in_session(&SessionId::parse("t1").unwrap(), 100),
            Some(run("open"))
        );
    }
}
