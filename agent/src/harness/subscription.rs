//! Reading a run as it goes: its events from any point, then live; a session's, run after run.
//!
//! Every reader reads the store's log from its cursor and waits for the store's notification that the log changed;
//! a notification carries no data, so a missed one costs a read, never an event. A run's log ends with its terminal
//! event, so a reader knows the run ended when it has read that event.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;

use super::{Harness, Unavailable};
use crate::ids::{RunId, SessionId};
use crate::runtime::AbortReason;
use crate::store::{EncodedEvent, RunInfo, StoreError};
use crate::view::RunView;
use crate::wire::{ApprovalMode, Message};

pub use crate::store::is_terminal;

/// A run as a resource: a cheap handle to read it, wait for it, or abort it.
#[derive(Clone)]
pub struct RunHandle {
    harness: Harness,
    /// Shared, so that a handle's clone copies no id.
    info: Arc<RunInfo>,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle")
            .field("run_id", &self.info.run_id)
            .field("session_id", &self.info.session_id)
            .finish()
    }
}

impl RunHandle {
    pub(super) fn new(harness: Harness, info: RunInfo) -> Self {
        Self {
            harness,
            info: Arc::new(info),
        }
    }

    pub fn run_id(&self) -> &RunId {
        &self.info.run_id
    }

    pub fn session_id(&self) -> &SessionId {
        &self.info.session_id
    }

    pub fn approval_mode(&self) -> ApprovalMode {
        self.info.mode
    }

    /// The run as the store knew it when this handle was made.
    pub fn info(&self) -> &RunInfo {
        &self.info
    }

    /// Every event after `after`, then the live ones, until the run ends (or the harness closes).
    pub fn subscribe(&self, after: u64) -> BoxStream<'static, Arc<EncodedEvent>> {
        subscribe(self.harness.clone(), self.info.run_id.clone(), after)
    }

    /// Waits until the run has ended (or the harness closes).
    pub async fn finished(&self) {
        let store = &self.harness.inner.store;
        let mut changes = store.watch_run(&self.info.run_id);
        loop {
            changes.borrow_and_update();
            match store.run(&self.info.run_id).await {
                Ok(Some(info)) if !info.state.is_finished() => {}
                _ => return,
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = self.harness.inner.closed.cancelled() => return,
            }
        }
    }

    /// Whether the run has ended.
    pub async fn is_finished(&self) -> Result<bool, Unavailable> {
        Ok(self
            .harness
            .inner
            .store
            .run(&self.info.run_id)
            .await?
            .is_none_or(|info| info.state.is_finished()))
    }

    /// The event of the run's log numbered `seq`, if the log has it.
    pub async fn event(&self, seq: u64) -> Result<Option<Arc<EncodedEvent>>, Unavailable> {
        let Some(after) = seq.checked_sub(1) else {
            return Ok(None);
        };
        Ok(self
            .harness
            .inner
            .store
            .events_after(&self.info.run_id, after, 1)
            .await?
            .into_iter()
            .next()
            .filter(|event| event.seq == seq))
    }

    /// The run as a viewer sees it now, folded from its log.
    pub async fn view(&self) -> Result<Option<RunView>, Unavailable> {
        self.harness.run_view(&self.info.run_id).await
    }

    /// Aborts the run (pending approvals resolve as `denied/abort`); the first reason sticks. Returns at once; the
    /// abort is recorded in the background.
    pub fn abort(&self, reason: AbortReason) {
        let harness = self.harness.clone();
        let run_id = self.info.run_id.clone();
        tokio::spawn(async move {
            if let Err(error) = harness.abort_run(&run_id, reason, None).await {
                tracing::error!(%run_id, %error, "cannot abort the run");
            }
        });
    }

    /// The client of a streamed run went away: the run is aborted, unless the harness itself is closing (then the
    /// server ended the stream, not the client, and a durable run stays as it is for after the restart).
    pub fn client_gone(&self) {
        if !self.harness.is_closing() {
            self.abort(AbortReason::Disconnected);
        }
    }

    /// The run's whole conversation, once it ended, for runs whose client owns the conversation.
    pub async fn conversation(&self) -> Result<Option<Arc<[Message]>>, Unavailable> {
        Ok(self
            .harness
            .inner
            .store
            .conversation(&self.info.run_id)
            .await?)
    }

    /// The conversation as the run goes on from it, for a run that ended interrupted with `waiting` calls of its
    /// batch waiting for a person: the results of the others, which ran already, follow the batch's calls (the run
    /// keeps its conversation up to the calls, and those results wait with its interrupts until it resumes). When
    /// every call of the batch waits, that is the conversation as it is, and the interrupts are not read.
    pub async fn conversation_with_settled(
        &self,
        waiting: usize,
    ) -> Result<Option<Arc<[Message]>>, Unavailable> {
        let Some(conversation) = self.conversation().await? else {
            return Ok(None);
        };
        let batch = match conversation.last() {
            Some(Message::Assistant { tool_calls, .. }) => tool_calls.len(),
            _ => 0,
        };
        if batch <= waiting {
            return Ok(Some(conversation));
        }
        let store = &self.harness.inner.store;
        let Some((suspension, _)) = store.interrupt(&self.info.run_id).await? else {
            return Ok(Some(conversation));
        };
        let interruption = &suspension.interruption;
        if interruption.settled.is_empty() {
            return Ok(Some(conversation));
        }
        let mut messages = conversation.to_vec();
        for call in &interruption.calls {
            if let Some((_, output)) = interruption.settled.iter().find(|(id, _)| *id == call.id) {
                messages.push(Message::Tool {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    output: output.clone(),
                });
            }
        }
        Ok(Some(Arc::from(messages)))
    }
}

/// The longest wait before a reader whose reads keep failing reads again.
const MOST_BETWEEN_READS: Duration = Duration::from_secs(2);

struct Cursor {
    harness: Harness,
    run_id: RunId,
    after: u64,
    changes: watch::Receiver<u64>,
    ended: bool,
    /// The harness is closing: what is in the log is read, then the stream ends.
    closed: bool,
    /// Reads that failed in a row.
    failed_reads: u32,
}

impl Cursor {
    /// The next page of events, waiting for one when there is none yet; `None` once the run ended.
    async fn next_page(&mut self) -> Option<Vec<Arc<EncodedEvent>>> {
        let store = Arc::clone(&self.harness.inner.store);
        loop {
            if self.ended {
                return None;
            }
            // Mark the current version seen before reading the log, so that no append slips between the two.
            self.changes.borrow_and_update();
            let page = match store
                .events_after(&self.run_id, self.after, crate::store::PAGE_EVENTS)
                .await
            {
                Ok(page) => page,
                Err(error) => {
                    self.read_again_after(error).await?;
                    continue;
                }
            };
            if let Some(last) = page.last() {
                self.failed_reads = 0;
                self.after = last.seq;
                self.ended = is_terminal(last.kind);
                return Some(page);
            }
            // Nothing new: a run that ended (or was forgotten) has nothing more to say.
            match store.continues_after(&self.run_id, self.after).await {
                Ok(true) => self.failed_reads = 0,
                Ok(false) => return None,
                Err(error) => {
                    self.read_again_after(error).await?;
                    continue;
                }
            }
            if self.closed {
                return None;
            }
            let closed = self.harness.inner.closed.clone();
            tokio::select! {
                changed = self.changes.changed() => changed.ok()?,
                // One more read: what the shutdown itself recorded (a run's `SHUTDOWN` end) goes out too.
                () = closed.cancelled() => self.closed = true,
            }
        }
    }

    /// After a read that failed: a database that is unavailable for a while (a lost connection, a failover) is read
    /// again, after a wait that grows with each failure in a row, for as long as the reader waits for the run (the
    /// stream is not ended, which its reader would take for the run's end, and a client that started the run on
    /// it for its own leaving, which aborts the run). `None` for what reading again cannot mend (a log this version
    /// cannot read), and once the harness closes.
    async fn read_again_after(&mut self, error: StoreError) -> Option<()> {
        tracing::warn!(run_id = %self.run_id, %error, "cannot read the run's events");
        if matches!(error, StoreError::Corrupt(_)) || self.closed {
            return None;
        }
        let wait = (MOST_BETWEEN_READS / 64)
            .saturating_mul(1 << self.failed_reads.min(6))
            .min(MOST_BETWEEN_READS);
        self.failed_reads = self.failed_reads.saturating_add(1);
        let closed = self.harness.inner.closed.clone();
        tokio::select! {
            () = tokio::time::sleep(wait) => Some(()),
            () = closed.cancelled() => {
                self.closed = true;
                Some(())
            }
        }
    }
}

fn subscribe(harness: Harness, run_id: RunId, after: u64) -> BoxStream<'static, Arc<EncodedEvent>> {
    let changes = harness.inner.store.watch_run(&run_id);
    let cursor = Cursor {
        harness,
        run_id,
        after,
        changes,
        ended: false,
        closed: false,
        failed_reads: 0,
    };
    futures::stream::unfold(cursor, |mut cursor| async move {
        let page = cursor.next_page().await?;
        Some((futures::stream::iter(page), cursor))
    })
    .flatten()
    .boxed()
}

/// Where a session follower is in the session's list of runs.
enum Position {
    /// Before the first run.
    Start,
    /// In this run, after this event.
    Resume(RunId, u64),
    /// Done with this run.
    After(RunId),
}

struct SessionFollow {
    harness: Harness,
    session_id: SessionId,
    runs_changed: watch::Receiver<u64>,
    position: Position,
    current: Option<(RunId, BoxStream<'static, Arc<EncodedEvent>>)>,
}

impl SessionFollow {
    async fn next(&mut self) -> Option<(RunId, Arc<EncodedEvent>)> {
        loop {
            if let Some((run_id, events)) = &mut self.current {
                match events.next().await {
                    Some(event) => return Some((run_id.clone(), event)),
                    None => {
                        self.position = Position::After(run_id.clone());
                        self.current = None;
                    }
                }
            }
            self.runs_changed.borrow_and_update();
            let runs = match self
                .harness
                .inner
                .store
                .session_runs(
                    &self.session_id,
                    self.harness.inner.config.retention.runs_shown,
                )
                .await
            {
                Ok(runs) => runs,
                Err(error) => {
                    tracing::warn!(session_id = %self.session_id, %error, "cannot read the session's runs");
                    return None;
                }
            };
            let next = match &self.position {
                Position::Start => runs.first().map(|run| (run.clone(), 0)),
                Position::Resume(run_id, after) if runs.contains(run_id) => {
                    Some((run_id.clone(), *after))
                }
                Position::Resume(..) => runs.first().map(|run| (run.clone(), 0)),
                // A run the session no longer lists fell off the front: every listed run is newer.
                Position::After(run_id) => match runs.iter().position(|run| run == run_id) {
                    Some(i) => runs.get(i + 1),
                    None => runs.first(),
                }
                .map(|run| (run.clone(), 0)),
            };
            match next {
                Some((run_id, after)) => {
                    self.current = Some((
                        run_id.clone(),
                        subscribe(self.harness.clone(), run_id.clone(), after),
                    ));
                    self.position = Position::After(run_id);
                }
                None => {
                    let closed = self.harness.inner.closed.clone();
                    tokio::select! {
                        changed = self.runs_changed.changed() => changed.ok()?,
                        () = closed.cancelled() => return None,
                    }
                }
            }
        }
    }
}

/// A session's events, run after run (see [`Harness::session_events`]). Following a session creates nothing.
pub(super) fn follow_session(
    harness: Harness,
    session_id: SessionId,
    resume: Option<(RunId, u64)>,
) -> BoxStream<'static, (RunId, Arc<EncodedEvent>)> {
    let follow = SessionFollow {
        runs_changed: harness.inner.store.watch_session(&session_id),
        harness,
        session_id,
        position: match resume {
            Some((run_id, after)) => Position::Resume(run_id, after),
            None => Position::Start,
        },
        current: None,
    };
    futures::stream::unfold(follow, |mut follow| async move {
        let item = follow.next().await?;
        Some((item, follow))
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{NewEvent, NewRun, Store};
    use crate::wire::StreamEvent;

    /// A run's whole log is read, however many pages its size makes: a page shorter than asked for may be cut by
    /// its bytes ([`crate::store::PAGE_BYTES`]), not by the log's end. Before, a short page ended the read, and a
    /// view of a run with large events lacked all but its first few MiB.
    #[tokio::test]
    async fn every_event_of_a_log_larger_than_a_page_is_read() {
        let store = MemoryStore::new();
        let run_id = RunId::parse("r").unwrap();
        let delta = |step: u32| {
            NewEvent::encode(&StreamEvent::AssistantDelta {
                run_id: run_id.clone(),
                step,
                delta: "x".repeat(1 << 20),
            })
            .unwrap()
        };
        let epoch = store
            .start_run(NewRun::for_tests(
                run_id.clone(),
                "s".parse().unwrap(),
                "hello",
                vec![delta(1)],
            ))
            .await
            .unwrap()
            .unwrap();
        for step in 2..=10 {
            store.append(&run_id, epoch, vec![delta(step)]);
        }
        store.flush().await.unwrap();

        let events = crate::store::all_events(&store, &run_id).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
        assert_eq!(seqs, (1..=10).collect::<Vec<u64>>());
    }
}
