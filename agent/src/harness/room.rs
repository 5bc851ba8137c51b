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

/// The last exact count and the starts let through since, and the starts whose run is not in the store yet.
#[derive(Debug, Default)]
pub(super) struct Room {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    estimate: Option<Estimate>,
    /// Starts let through whose run's insert has not committed (or failed) yet: a count of the store's rows does
    /// not see them, so two starts counted at once would both find the last place free.
    in_flight: u64,
    /// Starts that stopped being in flight, ever: one that did so while a count was being taken may have committed
    /// after the count read the rows, and is then in neither.
    landed: u64,
}

/// Where the starts stood when a count began ([`Room::before_counting`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Mark {
    landed: u64,
}

#[derive(Clone, Copy, Debug)]
struct Estimate {
    counted: Counts,
    counted_at: u64,
    runs_since: u64,
    sessions_since: u64,
}

/// Why a count leaves no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Full {
    /// As many runs have not ended as may: `.0` of them, the starts on their way included.
    Runs(u64),
    /// As many sessions as may, and the start is not in one of them.
    Sessions(u64),
}

/// Room taken for one start: held until the start's insert committed or failed, so that a count taken meanwhile,
/// which does not see the run yet, still counts it.
#[derive(Debug)]
pub(super) struct Taken<'a>(&'a Room);

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.landed += 1;
    }
}

impl Room {
    /// Takes room for one start if the estimate shows it under both bounds; `None` when the store must be counted.
    pub(super) fn take_estimated(&self, now: u64, bounds: Counts) -> Option<Taken<'_>> {
        let mut state = self.state.lock();
        let estimate = state.estimate.as_mut()?;
        let fresh = now.saturating_sub(estimate.counted_at) < FRESH_FOR_MS;
        let runs = estimate.counted.unfinished_runs + estimate.runs_since;
        // Any start may make a session, so the estimate counts one for each.
        let sessions = estimate.counted.sessions + estimate.sessions_since;
        if !fresh || runs + 1 > bounds.unfinished_runs || sessions + 1 > bounds.sessions {
            return None;
        }
        estimate.runs_since += 1;
        estimate.sessions_since += 1;
        state.in_flight += 1;
        Some(Taken(self))
    }

    /// Marks where the starts stand before the store is counted: the ones that land while it counts are added to
    /// the count ([`Room::take_counted`]).
    pub(super) fn before_counting(&self) -> Mark {
        Mark {
            landed: self.state.lock().landed,
        }
    }

    /// Takes room for one start after an exact count of the store, begun at `mark` and taken at `now`, to which
    /// the starts on their way are added, and those that landed while it counted (a start counted in the rows too
    /// is then counted twice, which only refuses early, and only while starts come at once). `known_session`: the
    /// start is in a session the store has, which takes no new place among the sessions. The count becomes the
    /// estimate.
    pub(super) fn take_counted(
        &self,
        mark: Mark,
        now: u64,
        counted: Counts,
        bounds: Counts,
        known_session: bool,
    ) -> Result<Taken<'_>, Full> {
        let mut state = self.state.lock();
        let unseen = state.in_flight + state.landed.saturating_sub(mark.landed);
        let runs = counted.unfinished_runs + unseen;
        if runs >= bounds.unfinished_runs {
            return Err(Full::Runs(runs));
        }
        let sessions = counted.sessions + unseen;
        if !known_session && sessions >= bounds.sessions {
            return Err(Full::Sessions(sessions));
        }
        state.in_flight += 1;
        state.estimate = Some(Estimate {
            counted,
            counted_at: now,
            runs_since: unseen + 1,
            sessions_since: unseen + 1,
        });
        Ok(Taken(self))
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
        assert!(Room::default().take_estimated(0, BOUNDS).is_none());
    }

    #[test]
    fn starts_are_let_through_up_to_the_bound_then_the_store_is_counted_again() {
        let room = Room::default();
        let _first = room
            .take_counted(room.before_counting(), 0, counts(0, 0), BOUNDS, false)
            .unwrap();
        let _second = room.take_estimated(1, BOUNDS).unwrap();
        let _third = room.take_estimated(2, BOUNDS).unwrap();
        // Three started since the count: the bound, so the next start counts.
        assert!(room.take_estimated(3, BOUNDS).is_none());
    }

    #[test]
    fn an_old_count_is_not_trusted() {
        let room = Room::default();
        drop(
            room.take_counted(room.before_counting(), 0, counts(0, 0), BOUNDS, false)
                .unwrap(),
        );
        assert!(room.take_estimated(FRESH_FOR_MS - 1, BOUNDS).is_some());
        assert!(room.take_estimated(FRESH_FOR_MS, BOUNDS).is_none());
    }

    #[test]
    fn a_recount_forgets_the_starts_it_includes() {
        let room = Room::default();
        // Two runs counted, one started: the bound.
        drop(
            room.take_counted(room.before_counting(), 0, counts(2, 0), BOUNDS, false)
                .unwrap(),
        );
        assert!(
            room.take_estimated(1, BOUNDS).is_none(),
            "2 counted + 1 started"
        );
        // The recount found that two runs ended meanwhile (and the start's run is in it).
        drop(
            room.take_counted(room.before_counting(), 2, counts(1, 1), BOUNDS, false)
                .unwrap(),
        );
        assert!(room.take_estimated(3, BOUNDS).is_some());
        assert!(room.take_estimated(4, BOUNDS).is_none());
    }

    #[test]
    fn sessions_bound_the_estimate_as_runs_do() {
        let room = Room::default();
        let bounds = counts(100, 2);
        drop(
            room.take_counted(room.before_counting(), 0, counts(0, 0), bounds, false)
                .unwrap(),
        );
        assert!(room.take_estimated(1, bounds).is_some());
        assert!(room.take_estimated(2, bounds).is_none());
    }

    /// Starts counted at once, before any of their runs is in the store, all read the same count: the room each
    /// takes is added to it, so only as many as there are places go through. Before, each found the last place free.
    #[test]
    fn starts_counted_at_once_take_the_places_left_and_no_more() {
        let room = Room::default();
        let same_count = counts(1, 0);
        let first = room
            .take_counted(room.before_counting(), 0, same_count, BOUNDS, false)
            .unwrap();
        let second = room
            .take_counted(room.before_counting(), 0, same_count, BOUNDS, false)
            .unwrap();
        assert_eq!(
            room.take_counted(room.before_counting(), 0, same_count, BOUNDS, false)
                .unwrap_err(),
            Full::Runs(3)
        );
        // Once their runs are in the store, a count sees them there instead.
        drop((first, second));
        assert_eq!(
            room.take_counted(room.before_counting(), 1, counts(3, 0), BOUNDS, false)
                .unwrap_err(),
            Full::Runs(3)
        );
        // A start in a session the store has takes no new place among the sessions.
        let sessions = counts(100, 1);
        let _on_its_way = room
            .take_counted(room.before_counting(), 2, counts(0, 0), sessions, false)
            .unwrap();
        assert_eq!(
            room.take_counted(room.before_counting(), 2, counts(0, 0), sessions, false)
                .unwrap_err(),
            Full::Sessions(1)
        );
        assert!(
            room.take_counted(room.before_counting(), 2, counts(0, 0), sessions, true)
                .is_ok()
        );
    }

    /// A start that lands while another start's count reads the rows (counted before it committed) and lets go of
    /// its room before that count is weighed is in neither the rows nor the starts on their way: what landed since
    /// the count began is added to it. Before, the third of three starts at once against a bound of two went through.
    #[test]
    fn a_start_that_lands_while_the_store_is_counted_is_counted() {
        let room = Room::default();
        let bounds = counts(2, 100);
        let first = room
            .take_counted(room.before_counting(), 0, counts(0, 0), bounds, false)
            .unwrap();
        let _second = room
            .take_counted(room.before_counting(), 0, counts(0, 0), bounds, false)
            .unwrap();
        let mark = room.before_counting();
        // The third's count reads no run: neither insert has committed. Then the first commits and lets go.
        let read = counts(0, 0);
        drop(first);
        assert_eq!(
            room.take_counted(mark, 1, read, bounds, false).unwrap_err(),
            Full::Runs(2)
        );
    }
}
