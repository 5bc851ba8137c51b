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
//! A run that ended here keeps, beside its tail, what its end recorded in its row ([`Ending`]): the conversation
//! (for runs whose client owns it: an AG-UI stream closes with it) and the suspension of a run ended by an
//! interrupt (its resume checks against it), with who took it. Only the end of a run records them, and every end
//! commits through the store's `finish_run`, which hands them to the tail; the take of a suspension commits through
//! the start of the run that takes it, which tells the tail.
//!
//! Bounded by bytes over all runs: the oldest events go first.
//!
//! PostgreSQL keeps no tail: other instances append to the same logs.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ids::RunId;
use crate::interrupts::Suspension;
use crate::store::{EncodedEvent, NewEvent};
use crate::wire::Message;

/// How many bytes of event JSON the tails hold over all runs, by default.
pub(super) const DEFAULT_BYTES: usize = 4 << 20;

/// The largest share of the bound one run's end may take: a larger one is not kept (its readers read its row), so
/// that one long conversation does not push every other run's tail out.
const ENDING_SHARE: usize = 16;

struct RunTail {
    /// Consecutive sequence numbers from `from` on, oldest first.
    events: VecDeque<Arc<EncodedEvent>>,
    /// The sequence number of the first event held, or of the next one when none is.
    from: u64,
    /// The newest sequence number this process knows is committed for the run.
    known: u64,
    /// Whether the run is finished, as far as this process saw it go.
    progress: Progress,
}

/// What a tail knows of its run's state. Unlike the events, a claim the database is not asked about: a run this
/// process started is known unfinished from its start, and every end of a run commits through the store's
/// `finish_run`, which marks it finished. A tail that began with events of a run started before (after a restart,
/// or after its tail was evicted) knows nothing of it, and its readers ask the run's row.
#[derive(Clone, Debug)]
enum Progress {
    Unknown,
    Unfinished,
    /// Finished, with its log ending at `last`; what its end recorded (unless it was too large to keep), and the
    /// run that took its suspension.
    Finished {
        last: u64,
        ending: Option<Arc<Ending>>,
        resumed_by: Option<RunId>,
    },
}

/// What a run's end recorded in its row beside its state.
#[derive(Debug, Default)]
pub(super) struct Ending {
    /// The whole conversation, for runs whose client owns it.
    pub(super) conversation: Option<Arc<[Message]>>,
    /// What a run ended by an interrupt issued, for its resume.
    pub(super) suspension: Option<Suspension>,
    /// The size of their JSON, counted against the tails' bound.
    pub(super) bytes: usize,
}

impl RunTail {
    fn next_seq(&self) -> u64 {
        self.from + self.events.len() as u64
    }

    /// Whether the tail holds every committed event after `after`.
    fn covers(&self, after: u64) -> bool {
        self.from <= after.saturating_add(1) && self.next_seq() > self.known
    }
}

/// What a run's tail counts against the bound while it holds no event (a run that started without one).
const EMPTY_TAIL_BYTES: usize = 64;

struct Inner {
    runs: HashMap<RunId, RunTail>,
    /// Every held event, in the order they joined: the oldest is evicted first.
    order: VecDeque<(RunId, u64, usize)>,
    bytes: usize,
    limit: usize,
}

impl Inner {
    /// Lets the oldest events go until the tails are within their bound; a tail left empty goes.
    fn evict(&mut self) {
        while self.bytes > self.limit {
            let Some((run, seq, bytes)) = self.order.pop_front() else {
                break;
            };
            self.bytes -= bytes;
            if let Some(tail) = self.runs.get_mut(&run) {
                // An entry numbered 0 (a run's empty tail, or what its end recorded) matches no event: the run
                // goes now if it holds no event, else with its last one (its entry stays counted until it comes
                // up here: the bound errs on the safe side).
                if tail.events.front().is_some_and(|event| event.seq == seq) {
                    tail.events.pop_front();
                    tail.from += 1;
                }
                if tail.events.is_empty() {
                    self.runs.remove(&run);
                }
            }
        }
    }
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
        let tail = inner.runs.entry(run_id.clone()).or_insert(RunTail {
            events: VecDeque::new(),
            from: first,
            known: 0,
            progress: Progress::Unknown,
        });
        if tail.next_seq() != first {
            // A gap (or the first events this process sees of the run): the tail starts again here. The events it
            // held stay counted in `order` until evicted, and are skipped then.
            tail.events.clear();
            tail.from = first;
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
        inner.evict();
    }

    /// A run this process just started, whose log is committed through `seq`: its readers are answered from here
    /// from the start, even before its first event. (A run that already has a tail keeps it.)
    pub(super) fn started(&self, run_id: &RunId, seq: u64) {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        if let Some(tail) = inner.runs.get_mut(run_id) {
            tail.progress = Progress::Unfinished;
            return;
        }
        inner.runs.insert(
            run_id.clone(),
            RunTail {
                events: VecDeque::new(),
                from: seq + 1,
                known: seq,
                progress: Progress::Unfinished,
            },
        );
        // Counted like an event (one that never matches a sequence number), so that the tail of a run that never
        // gets an event is evicted too.
        inner.order.push_back((run_id.clone(), 0, EMPTY_TAIL_BYTES));
        inner.bytes += EMPTY_TAIL_BYTES;
        inner.evict();
    }

    /// The run's log is committed through `seq`, or is being committed through it: a tail that does not reach it is
    /// not whole (its readers read the database).
    pub(super) fn touched(&self, run_id: &RunId, seq: u64) {
        if let Some(tail) = self.inner.lock().runs.get_mut(run_id) {
            tail.known = tail.known.max(seq);
        }
    }

    /// The run's end committed, its log ending at `seq`, with `ending` in its row.
    pub(super) fn finished(&self, run_id: &RunId, seq: u64, ending: Ending) {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let Some(tail) = inner.runs.get_mut(run_id) else {
            return;
        };
        let kept = ending.bytes <= inner.limit / ENDING_SHARE;
        if kept && ending.bytes > 0 {
            // Counted like an event that never matches a sequence number.
            inner.order.push_back((run_id.clone(), 0, ending.bytes));
            inner.bytes += ending.bytes;
        }
        tail.progress = Progress::Finished {
            last: seq,
            ending: kept.then(|| Arc::new(ending)),
            resumed_by: None,
        };
        inner.evict();
    }

    /// The run `by` took the suspension of `parent`: its start committed.
    pub(super) fn resumed(&self, parent: &RunId, by: &RunId) {
        if let Some(RunTail {
            progress: Progress::Finished { resumed_by, .. },
            ..
        }) = self.inner.lock().runs.get_mut(parent)
        {
            *resumed_by = Some(by.clone());
        }
    }

    /// The run `by`, whose process died before it began a call, gave the suspension of `parent` back.
    pub(super) fn given_back(&self, parent: &RunId, by: &RunId) {
        if let Some(RunTail {
            progress: Progress::Finished { resumed_by, .. },
            ..
        }) = self.inner.lock().runs.get_mut(parent)
            && resumed_by.as_ref() == Some(by)
        {
            *resumed_by = None;
        }
    }

    /// What the run's end recorded and who took its suspension, when the run ended here and its end is kept.
    fn ending(&self, run_id: &RunId) -> Option<(Arc<Ending>, Option<RunId>)> {
        match &self.inner.lock().runs.get(run_id)?.progress {
            Progress::Finished {
                ending: Some(ending),
                resumed_by,
                ..
            } => Some((Arc::clone(ending), resumed_by.clone())),
            _ => None,
        }
    }

    /// The conversation the run's end recorded, when the run ended here and its end is kept. (Shared, and taken
    /// once the tails' lock is let go: the writer takes that lock after each commit.)
    pub(super) fn conversation(&self, run_id: &RunId) -> Option<Option<Arc<[Message]>>> {
        let (ending, _) = self.ending(run_id)?;
        Some(ending.conversation.clone())
    }

    /// The suspension the run's end recorded and the run that took it, when the run ended here and its end is
    /// kept.
    pub(super) fn suspension(&self, run_id: &RunId) -> Option<Option<(Suspension, Option<RunId>)>> {
        let (ending, resumed_by) = self.ending(run_id)?;
        Some(
            ending
                .suspension
                .clone()
                .map(|suspension| (suspension, resumed_by)),
        )
    }

    /// Whether the run may still add events after `after` (it is unfinished, or its log goes past `after`), when
    /// the tail knows.
    pub(super) fn continues_after(&self, run_id: &RunId, after: u64) -> Option<bool> {
        match &self.inner.lock().runs.get(run_id)?.progress {
            Progress::Unknown => None,
            Progress::Unfinished => Some(true),
            Progress::Finished { last, .. } => Some(*last > after),
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
        let skip = usize::try_from(after.saturating_add(1).saturating_sub(tail.from)).ok()?;
        Some(crate::store::page_of(tail.events.iter().skip(skip), limit))
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
    fn a_run_started_here_is_answered_before_its_first_event_and_its_empty_tail_is_bounded_too() {
        let tails = Tails::new(200);
        let r = run(1);
        tails.started(&r, 0);
        assert_eq!(
            seqs(tails.read(&r, 0, 10)),
            Some(vec![]),
            "nothing yet, known"
        );
        tails.touched(&r, 2);
        assert_eq!(
            seqs(tails.read(&r, 0, 10)),
            None,
            "committed further elsewhere"
        );
        tails.committed(&r, 1, events(2));
        assert_eq!(seqs(tails.read(&r, 0, 10)), Some(vec![1, 2]));
        // Started again (a second start is not a new log): the tail stays.
        tails.started(&r, 0);
        assert_eq!(seqs(tails.read(&r, 0, 10)), Some(vec![1, 2]));

        // Runs that never get an event: the oldest empty tails go past the bound.
        let empty: Vec<RunId> = (10..20).map(run).collect();
        for r in &empty {
            tails.started(r, 0);
        }
        assert_eq!(seqs(tails.read(&empty[0], 0, 10)), None, "evicted");
        assert_eq!(seqs(tails.read(&empty[9], 0, 10)), Some(vec![]));
        assert!(tails.inner.lock().bytes <= 200);
    }

    #[test]
    fn a_tail_tells_whether_its_run_goes_on_only_for_a_run_this_process_started() {
        let tails = Tails::new(DEFAULT_BYTES);
        let (here, before) = (run(1), run(2));
        tails.started(&here, 0);
        tails.committed(&before, 5, events(1));
        assert_eq!(tails.continues_after(&here, 0), Some(true));
        assert_eq!(
            tails.continues_after(&before, 5),
            None,
            "a run started before this process: its row tells"
        );
        tails.committed(&here, 1, events(2));
        tails.finished(&here, 2, Ending::default());
        assert_eq!(
            tails.continues_after(&here, 1),
            Some(true),
            "its end is to be read"
        );
        assert_eq!(tails.continues_after(&here, 2), Some(false));
        tails.finished(&before, 5, Ending::default());
        assert_eq!(tails.continues_after(&before, 5), Some(false));
        tails.forget(&here);
        assert_eq!(tails.continues_after(&here, 2), None);
    }

    #[test]
    fn a_run_that_ended_here_keeps_its_conversation_within_the_bound() {
        // Room for two empty tails (64 bytes each), an event of 7 and a conversation of 10 (the most one end may
        // take: a sixteenth), and not much more.
        let tails = Tails::new(160);
        let (ended, going, before) = (run(1), run(2), run(3));
        let conversation = vec![Message::User {
            content: "hello".into(),
        }];
        tails.started(&ended, 0);
        tails.started(&going, 0);
        tails.committed(&ended, 1, events(1));
        tails.finished(
            &ended,
            1,
            Ending {
                conversation: Some(Arc::from(conversation.clone())),
                suspension: None,
                bytes: 10,
            },
        );
        assert_eq!(
            tails.conversation(&ended),
            Some(Some(Arc::from(conversation)))
        );
        assert_eq!(tails.conversation(&going), None, "not ended: the row tells");
        tails.finished(&going, 0, Ending::default());
        assert_eq!(tails.conversation(&going), Some(None), "ended without one");
        tails.finished(
            &before,
            5,
            Ending {
                conversation: Some(Arc::from([])),
                suspension: None,
                bytes: 2,
            },
        );
        assert_eq!(
            tails.conversation(&before),
            None,
            "a run this process kept no tail of: the row tells"
        );

        // The conversation counts against the bound: past it, the run goes whole, its conversation with it.
        tails.committed(&going, 1, events(21));
        assert_eq!(tails.conversation(&ended), None);
        assert_eq!(seqs(tails.read(&ended, 0, 10)), None);
        assert_eq!(tails.conversation(&going), Some(None));
        assert!(tails.inner.lock().bytes <= 160);

        // An end larger than its share of the bound is not kept, and pushes no other tail out: its row tells.
        let long = run(4);
        tails.started(&long, 0);
        tails.finished(
            &long,
            0,
            Ending {
                conversation: Some(Arc::from([])),
                suspension: None,
                bytes: 160 / ENDING_SHARE + 1,
            },
        );
        assert_eq!(tails.conversation(&long), None);
        assert_eq!(tails.continues_after(&long, 0), Some(false), "known ended");
        assert_eq!(tails.conversation(&going), Some(None), "still kept");
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
