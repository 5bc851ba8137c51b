//! How much the harness keeps, and for how long.

use std::time::Duration;

use crate::store::RetentionLimits;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// How long a finished run (its events, its transcript) is kept.
    pub finished_ttl: Duration,
    /// Bytes of event log kept over all runs; past it, the oldest finished runs go first.
    pub event_log_bytes: u64,
    /// Events one run may produce; past this the run is aborted.
    pub events_per_run: usize,
    /// Bytes of events one run may produce; past this the run is aborted.
    pub event_bytes_per_run: usize,
    /// How many of a session's newest runs a page shows.
    pub runs_shown: usize,
    /// Runs not ended (sampling or waiting) the store may hold; past it a new run is refused.
    pub max_unfinished_runs: u64,
    /// Sessions the store may hold; past it a run in a new session is refused.
    pub max_sessions: u64,
    /// How often old runs are pruned.
    pub prune_every: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            finished_ttl: Duration::from_secs(30 * 24 * 60 * 60),
            event_log_bytes: 1024 * 1024 * 1024,
            events_per_run: 50_000,
            event_bytes_per_run: 32 * 1024 * 1024,
            runs_shown: 200,
            max_unfinished_runs: 100_000,
            max_sessions: 100_000,
            prune_every: Duration::from_secs(60),
        }
    }
}

impl Retention {
    pub fn limits(&self) -> RetentionLimits {
        RetentionLimits {
            max_age_ms: self.finished_ttl.as_millis() as u64,
            max_event_bytes: self.event_log_bytes,
        }
    }
}
