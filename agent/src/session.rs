//! Sessions: a conversation's history, its runs, and the tools a person approved for it. In memory, bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::ids::{RunId, SessionId};
use crate::policy::SessionGrants;
use crate::wire::Message;

/// How many run ids a session remembers for its transcript.
const MAX_RUNS_PER_SESSION: usize = 200;

#[derive(Debug)]
struct SessionState {
    history: Vec<Message>,
    runs: Vec<RunId>,
    active_run: Option<RunId>,
    last_used: Instant,
}

#[derive(Debug)]
pub struct Session {
    id: SessionId,
    state: Mutex<SessionState>,
    grants: Arc<Mutex<SessionGrants>>,
    /// Bumped whenever a run begins, for viewers that follow the session from run to run.
    runs_changed: watch::Sender<u64>,
}

/// A session already has a run going.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("session {session_id} is busy with run {run_id}; wait for it to finish or cancel it")]
pub struct SessionBusy {
    pub session_id: SessionId,
    pub run_id: RunId,
}

impl Session {
    fn new(id: SessionId) -> Self {
        Self {
            id,
            state: Mutex::new(SessionState {
                history: Vec::new(),
                runs: Vec::new(),
                active_run: None,
                last_used: Instant::now(),
            }),
            grants: Arc::new(Mutex::new(SessionGrants::new())),
            runs_changed: watch::channel(0).0,
        }
    }

    /// Notices each new run of the session.
    pub fn watch_runs(&self) -> watch::Receiver<u64> {
        self.runs_changed.subscribe()
    }

    fn state(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// The tools approved for the rest of this session, shared with its runs.
    pub fn grants(&self) -> &Arc<Mutex<SessionGrants>> {
        &self.grants
    }

    pub fn history(&self) -> Vec<Message> {
        self.state().history.clone()
    }

    /// The session's runs, oldest first (the most recent ones).
    pub fn runs(&self) -> Vec<RunId> {
        self.state().runs.clone()
    }

    pub fn active_run(&self) -> Option<RunId> {
        self.state().active_run.clone()
    }

    /// Claims the session for a run; a session runs one at a time.
    pub fn begin(&self, run_id: &RunId) -> Result<(), SessionBusy> {
        let mut state = self.state();
        if let Some(active) = &state.active_run {
            return Err(SessionBusy {
                session_id: self.id.clone(),
                run_id: active.clone(),
            });
        }
        state.active_run = Some(run_id.clone());
        state.runs.push(run_id.clone());
        if state.runs.len() > MAX_RUNS_PER_SESSION {
            state.runs.remove(0);
        }
        state.last_used = Instant::now();
        drop(state);
        self.runs_changed.send_modify(|version| *version += 1);
        Ok(())
    }

    /// Ends a run: its messages join the history and the session is free again.
    pub fn end(&self, run_id: &RunId, messages: Vec<Message>) {
        let mut state = self.state();
        state.history.extend(messages);
        if state.active_run.as_ref() == Some(run_id) {
            state.active_run = None;
        }
        state.last_used = Instant::now();
    }
}

/// Every session, bounded in count; idle sessions past their time go first.
#[derive(Debug)]
pub struct SessionStore {
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    max_sessions: usize,
    idle_ttl: Duration,
}

impl SessionStore {
    pub fn new(max_sessions: usize, idle_ttl: Duration) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            max_sessions,
            idle_ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, id: &SessionId) -> Option<Arc<Session>> {
        self.lock().get(id).cloned()
    }

    /// The session with this id, created when missing.
    pub fn get_or_create(&self, id: &SessionId) -> Arc<Session> {
        let mut sessions = self.lock();
        if let Some(session) = sessions.get(id) {
            return Arc::clone(session);
        }
        if sessions.len() >= self.max_sessions {
            // Make room for a tenth more at once, so that a full store sorts once per many new sessions rather
            // than for each one.
            let keep = self.max_sessions - (self.max_sessions / 10).max(1);
            Self::evict(&mut sessions, self.idle_ttl, keep);
        }
        let session = Arc::new(Session::new(id.clone()));
        sessions.insert(id.clone(), Arc::clone(&session));
        session
    }

    /// Drops idle sessions past their time, then the least recently used idle ones until at most `keep` remain.
    /// A session with a run going is never dropped.
    fn evict(sessions: &mut HashMap<SessionId, Arc<Session>>, idle_ttl: Duration, keep: usize) {
        let now = Instant::now();
        let mut idle: Vec<(Instant, SessionId)> = sessions
            .values()
            .filter_map(|s| {
                let state = s.state();
                state
                    .active_run
                    .is_none()
                    .then(|| (state.last_used, s.id.clone()))
            })
            .collect();
        idle.sort_unstable();
        for (last_used, id) in idle {
            let expired = now.duration_since(last_used) >= idle_ttl;
            if !expired && sessions.len() <= keep {
                break;
            }
            sessions.remove(&id);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SessionId {
        SessionId::parse(s).unwrap()
    }

    #[test]
    fn a_session_runs_one_run_at_a_time() {
        let store = SessionStore::new(10, Duration::from_secs(60));
        let session = store.get_or_create(&sid("s"));
        let first = RunId::parse("r1").unwrap();
        session.begin(&first).unwrap();
        let busy = session.begin(&RunId::parse("r2").unwrap()).unwrap_err();
        assert_eq!(busy.run_id, first);
        session.end(
            &first,
            vec![Message::User {
                content: "hi".into(),
            }],
        );
        session.begin(&RunId::parse("r2").unwrap()).unwrap();
        assert_eq!(session.history().len(), 1);
        assert_eq!(session.runs().len(), 2);
        assert!(Arc::ptr_eq(&session, &store.get_or_create(&sid("s"))));
    }

    #[test]
    fn the_store_is_bounded_and_never_evicts_a_busy_session() {
        let store = SessionStore::new(2, Duration::from_secs(3600));
        let busy = store.get_or_create(&sid("busy"));
        busy.begin(&RunId::parse("r").unwrap()).unwrap();
        store.get_or_create(&sid("idle"));
        store.get_or_create(&sid("new"));
        assert_eq!(store.len(), 2);
        assert!(store.get(&sid("busy")).is_some());
        assert!(store.get(&sid("idle")).is_none());
    }

    #[test]
    fn a_full_store_makes_room_for_many_at_once_oldest_first() {
        let store = SessionStore::new(100, Duration::from_secs(3600));
        for i in 0..100 {
            store.get_or_create(&sid(&format!("s{i:03}")));
        }
        store.get_or_create(&sid("newest"));
        assert_eq!(store.len(), 91, "down to 90, plus the new one");
        assert!(store.get(&sid("s000")).is_none() && store.get(&sid("s009")).is_none());
        assert!(store.get(&sid("s010")).is_some() && store.get(&sid("newest")).is_some());
    }
}
