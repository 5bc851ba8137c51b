//! Whether the store has room for another run: the bounds on runs not ended and on sessions, checked without
//! counting the store's rows on every start.
//!
//! Counting is a scan of the tables, and a server that ran for a while holds many sessions, so an exact count per
//! start would make every start slower the longer the server runs. Instead the harness keeps the last exact count
//! and adds every start it let through since; only when that estimate reaches a bound, or the count is older than
//! [`FRESH_FOR_MS`], does it count again. The estimate never undercounts what this instance started (runs that
//! ended and sessions that were already known only make it high, which a recount corrects), so one instance is
//! refused exactly at its bound; instances sharing a store see each other's starts within [`FRESH_FOR_MS`].

use parking_lot::Mutex;

use crate::store::Counts;

/// How long an exact count stands in for the store's.
pub(super) const FRESH_FOR_MS: u64 = 1_000;

/// The last exact count and the starts let through since.
#[derive(Debug, Default)]
pub(super) struct Room {
    estimate: Mutex<Option<Estimate>>,
}

#[derive(Clone, Copy, Debug)]
struct Estimate {
    counted: Counts,
    counted_at: u64,
    runs_since: u64,
    sessions_since: u64,
}

impl Room {
    /// Takes room for one start if the estimate shows it under both bounds; `false` when the store must be counted.
    pub(super) fn take_estimated(&self, now: u64, bounds: Counts) -> bool {
        let mut estimate = self.estimate.lock();
        let Some(estimate) = estimate.as_mut() else {
            return false;
        };
        let fresh = now.saturating_sub(estimate.counted_at) < FRESH_FOR_MS;
        let runs = estimate.counted.unfinished_runs + estimate.runs_since;
        // Any start may make a session, so the estimate counts one for each.
        let sessions = estimate.counted.sessions + estimate.sessions_since;
        if !fresh || runs + 1 > bounds.unfinished_runs || sessions + 1 > bounds.sessions {
            return false;
        }
        estimate.runs_since += 1;
        estimate.sessions_since += 1;
        true
    }

    /// Records an exact count taken at `now`, and whether it let a start through.
    pub(super) fn counted(&self, now: u64, counted: Counts, started: bool) {
        *self.estimate.lock() = Some(Estimate {
            counted,
            counted_at: now,
            runs_since: u64::from(started),
            sessions_since: u64::from(started),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Counts = Counts {
        unfinished_runs: 3,
        sessions: 10,
    };

    fn counts(unfinished_runs: u64, sessions: u64) -> Counts {
        Counts {
            unfinished_runs,
            sessions,
        }
    }

    #[test]
    fn without_a_count_the_store_is_counted() {
        assert!(!Room::default().take_estimated(0, BOUNDS));
    }

    #[test]
    fn starts_are_let_through_up_to_the_bound_then_the_store_is_counted_again() {
        let room = Room::default();
        room.counted(0, counts(0, 0), true);
        assert!(room.take_estimated(1, BOUNDS));
        assert!(room.take_estimated(2, BOUNDS));
        // Three started since the count: the bound, so the next start counts.
        assert!(!room.take_estimated(3, BOUNDS));
    }

    #[test]
    fn an_old_count_is_not_trusted() {
        let room = Room::default();
        room.counted(0, counts(0, 0), false);
        assert!(room.take_estimated(FRESH_FOR_MS - 1, BOUNDS));
        assert!(!room.take_estimated(FRESH_FOR_MS, BOUNDS));
    }

    #[test]
    fn a_recount_forgets_the_starts_it_includes() {
        let room = Room::default();
        room.counted(0, counts(2, 0), true);
        assert!(!room.take_estimated(1, BOUNDS), "2 counted + 1 started");
        // The recount found that two runs ended meanwhile.
        room.counted(2, counts(1, 1), false);
        assert!(room.take_estimated(3, BOUNDS));
        assert!(room.take_estimated(4, BOUNDS));
        assert!(!room.take_estimated(5, BOUNDS));
    }

    #[test]
    fn sessions_bound_the_estimate_as_runs_do() {
        let room = Room::default();
        let bounds = counts(100, 2);
        room.counted(0, counts(0, 1), false);
        assert!(room.take_estimated(1, bounds));
        assert!(!room.take_estimated(2, bounds));
    }
}
