//! The newest events of each run, kept in memory once they are committed, so that a reader following a run on a
//! SQLite store reads them without a database transaction.
//!
//! A SQLite store is one process's (its file is locked against a second one), so every event of its log commits
//! through this process: right after each commit, while the writer connection is still held, the committed events
//! join their run's tail, in the order of their sequence numbers. A reader takes events from the tail only when
//! the tail is whole up to what it asks and up to the newest sequence number this process was told committed; in
//! every other case (a run whose tail was evicted or never kept, a gap, a run changed by a path that does not
//! feed the tail) it reads the database, as before. The tail is a cache: a miss costs a read, never an event.
//!
//! Bounded by bytes over all runs: the oldest events go first.
//!
//! PostgreSQL keeps no tail: other instances append to the same logs.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ids::RunId;
use crate::store::{EncodedEvent, NewEvent};

/// How many bytes of event JSON the tails hold over all runs, by default.
pub(super) const DEFAULT_BYTES: usize = 4 << 20;

#[derive(Default)]
struct RunTail {
    /// Consecutive sequence numbers, oldest first.
    events: VecDeque<Arc<EncodedEvent>>,
    /// The newest sequence number this process knows is committed for the run.
    known: u64,
}

impl RunTail {
    fn next_seq(&self) -> Option<u64> {
        self.events.back().map(|event| event.seq + 1)
    }

    /// Whether the tail holds every committed event after `after`.
    fn covers(&self, after: u64) -> bool {
        match (self.events.front(), self.events.back()) {
            (Some(first), Some(last)) => first.seq <= after + 1 && last.seq >= self.known,
            _ => false,
        }
    }
}

struct Inner {
    runs: HashMap<RunId, RunTail>,
    /// Every held event, in the order they joined: the oldest is evicted first.
    order: VecDeque<(RunId, u64, usize)>,
    bytes: usize,
    limit: usize,
}

/// The tails of every run, bounded.
pub(super) struct Tails {
    inner: Mutex<Inner>,
}

impl Tails {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                runs: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                limit,
            }),
        }
    }

    /// Events of `run_id` numbered from `first` on were committed.
    pub(super) fn committed(&self, run_id: &RunId, first: u64, events: Vec<NewEvent>) {
        let Some(count) = u64::try_from(events.len()).ok().filter(|n| *n > 0) else {
            return;
        };
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let tail = inner.runs.entry(run_id.clone()).or_default();
        if tail.next_seq() != Some(first) {
            // A gap (or the first events this process sees of the run): the tail starts again here. The events it
            // held stay counted in `order` until evicted, and are skipped then.
            tail.events.clear();
        }
        tail.known = tail.known.max(first + count - 1);
        for (seq, event) in (first..).zip(events) {
            let bytes = event.bytes();
            tail.events.push_back(Arc::new(EncodedEvent {
                seq,
                kind: event.kind,
                json: event.json,
            }));
            inner.order.push_back((run_id.clone(), seq, bytes));
            inner.bytes += bytes;
        }
        while inner.bytes > inner.limit {
            let Some((run, seq, bytes)) = inner.order.pop_front() else {
                break;
            };
            inner.bytes -= bytes;
            if let Some(tail) = inner.runs.get_mut(&run) {
                if tail.events.front().is_some_and(|event| event.seq == seq) {
                    tail.events.pop_front();
                }
                if tail.events.is_empty() {
                    inner.runs.remove(&run);
                }
            }
        }
    }

    /// The run's log is committed through `seq`: a tail that does not reach it is not whole.
    pub(super) fn touched(&self, run_id: &RunId, seq: u64) {
        if let Some(tail) = self.inner.lock().runs.get_mut(run_id) {
            tail.known = tail.known.max(seq);
        }
    }

    /// The committed events after `after`, at most `limit`, when the tail holds all of them.
    pub(super) fn read(
        &self,
        run_id: &RunId,
        after: u64,
        limit: usize,
    ) -> Option<Vec<Arc<EncodedEvent>>> {
        let inner = self.inner.lock();
        let tail = inner.runs.get(run_id)?;
        if !tail.covers(after) {
            return None;
        }
        let first = tail.events.front()?.seq;
        let skip = usize::try_from((after + 1).saturating_sub(first)).ok()?;
        Some(tail.events.iter().skip(skip).take(limit).cloned().collect())
    }

    /// The run is gone from the database.
    pub(super) fn forget(&self, run_id: &RunId) {
        self.inner.lock().runs.remove(run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(n: usize) -> Vec<NewEvent> {
        (0..n)
            .map(|i| NewEvent {
                kind: "debug",
                json: format!("{{\"i\":{i}}}").into_boxed_str(),
            })
            .collect()
    }

    fn seqs(events: Option<Vec<Arc<EncodedEvent>>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|event| event.seq).collect())
    }

    fn run(n: u32) -> RunId {
        RunId::parse(format!("run_{n:032}")).unwrap()
    }

    #[test]
    fn a_whole_tail_answers_and_anything_else_goes_to_the_database() {
        let tails = Tails::new(DEFAULT_BYTES);
        let r = run(1);
        assert_eq!(seqs(tails.read(&r, 0, 10)), None, "nothing kept yet");
        tails.committed(&r, 1, events(3));
        assert_eq!(seqs(tails.read(&r, 0, 10)), Some(vec![1, 2, 3]));
        assert_eq!(seqs(tails.read(&r, 1, 1)), Some(vec![2]));
        assert_eq!(
            seqs(tails.read(&r, 3, 10)),
            Some(vec![]),
            "whole: nothing newer"
        );
        tails.committed(&r, 4, events(2));
        assert_eq!(seqs(tails.read(&r, 2, 10)), Some(vec![3, 4, 5]));

        // Something committed the run's log further without feeding the tail: the tail is not whole.
        tails.touched(&r, 7);
        assert_eq!(seqs(tails.read(&r, 5, 10)), None);
        // A gap: the tail starts again at what it was given, and reads before it go to the database.
        tails.committed(&r, 8, events(1));
        assert_eq!(seqs(tails.read(&r, 7, 10)), Some(vec![8]));
        assert_eq!(seqs(tails.read(&r, 5, 10)), None);

        tails.forget(&r);
        assert_eq!(seqs(tails.read(&r, 7, 10)), None);
    }

    #[test]
    fn the_oldest_events_go_first_past_the_bound() {
        // Each event is 7 bytes of JSON: room for four.
        let tails = Tails::new(30);
        let (a, b) = (run(1), run(2));
        tails.committed(&a, 1, events(3));
        tails.committed(&b, 1, events(3));
        assert_eq!(seqs(tails.read(&a, 0, 10)), None, "a's first two went");
        assert_eq!(seqs(tails.read(&a, 2, 10)), Some(vec![3]));
        assert_eq!(seqs(tails.read(&b, 0, 10)), Some(vec![1, 2, 3]));
        tails.committed(&b, 4, events(1));
        assert_eq!(seqs(tails.read(&a, 2, 10)), None, "a is gone whole");
        assert_eq!(seqs(tails.read(&b, 0, 10)), Some(vec![1, 2, 3, 4]));
    }
}
