//! The harness's clock: milliseconds since the Unix epoch, for expiries and timestamps that are stored and shown.
//!
//! It reads the system clock once and then advances with tokio's clock, so that a test with paused time sees
//! approvals expire when it advances time, and so that a clock stepped back by NTP never makes a deadline move.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

struct Origin {
    instant: Instant,
    unix_ms: u64,
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| Origin {
        instant: Instant::now(),
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    })
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let origin = origin();
    let elapsed = Instant::now().saturating_duration_since(origin.instant);
    origin.unix_ms.saturating_add(elapsed.as_millis() as u64)
}
