//! The harness's clock: milliseconds since the Unix epoch, for expiries and timestamps that are stored and shown.
//!
//! It reads the system clock once and then advances with tokio's clock, so that a test with paused time sees
//! approvals expire when it advances time, and so that a clock stepped back by NTP never makes a deadline move.
//! Tokio's clock (`CLOCK_MONOTONIC`) stands still while the machine is suspended, so the time spent suspended since
//! the origin is added on top: without it, a laptop woken from an hour's sleep would stamp entries an hour early
//! and keep every approval an hour past its deadline.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

struct Origin {
    instant: Instant,
    unix_ms: u64,
    suspended: Duration,
    /// The most suspension (in ms past `suspended`) any reading has counted: the clock never moves back, even when
    /// two readings of the suspension differ by the instants between their two clocks.
    counted_ms: AtomicU64,
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| Origin {
        instant: Instant::now(),
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        suspended: suspended(),
        counted_ms: AtomicU64::new(0),
    })
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let origin = origin();
    let elapsed = Instant::now().saturating_duration_since(origin.instant);
    at(origin, elapsed, suspended())
}

fn at(origin: &Origin, elapsed: Duration, suspended: Duration) -> u64 {
    let slept = suspended.saturating_sub(origin.suspended).as_millis() as u64;
    // Read first: the count changes only after a suspension, and a write on every reading would contend.
    let mut counted = origin.counted_ms.load(Ordering::Relaxed);
    if slept > counted {
        counted = origin
            .counted_ms
            .fetch_max(slept, Ordering::Relaxed)
            .max(slept);
    }
    origin
        .unix_ms
        .saturating_add(elapsed.as_millis() as u64)
        .saturating_add(counted)
}

/// The time the machine has spent suspended since it booted: `CLOCK_BOOTTIME` counts it, `CLOCK_MONOTONIC` does not.
#[cfg(target_os = "linux")]
fn suspended() -> Duration {
    fn read(clock: libc::clockid_t) -> Duration {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec; both clocks exist on every Linux toolgate runs on (2.6.39+).
        if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
            return Duration::ZERO;
        }
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }
    read(libc::CLOCK_BOOTTIME).saturating_sub(read(libc::CLOCK_MONOTONIC))
}

#[cfg(not(target_os = "linux"))]
fn suspended() -> Duration {
    Duration::ZERO
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin_at(unix_ms: u64, suspended_s: u64) -> Origin {
        Origin {
            instant: Instant::now(),
            unix_ms,
            suspended: Duration::from_secs(suspended_s),
            counted_ms: AtomicU64::new(0),
        }
    }

    #[tokio::test]
    async fn an_hour_asleep_moves_the_clock_an_hour() {
        let origin = origin_at(1_000_000, 7);
        assert_eq!(
            at(&origin, Duration::from_secs(2), Duration::from_secs(7)),
            1_002_000
        );
        assert_eq!(
            at(
                &origin,
                Duration::from_secs(3),
                Duration::from_secs(7 + 3600)
            ),
            1_003_000 + 3_600_000
        );
    }

    #[tokio::test]
    async fn a_smaller_reading_of_the_suspension_never_moves_the_clock_back() {
        let origin = origin_at(1_000_000, 7);
        let first = at(
            &origin,
            Duration::from_millis(500),
            Duration::from_millis(7_001),
        );
        let second = at(
            &origin,
            Duration::from_millis(500),
            Duration::from_millis(7_000),
        );
        assert_eq!(first, 1_000_501);
        assert_eq!(second, first);
    }

    #[tokio::test]
    async fn the_clock_reads_the_machines_suspension_at_its_origin() {
        // Whatever this machine slept before the clock's first reading is not counted again.
        let before = now_ms();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            before.abs_diff(wall) < 1_000,
            "clock {before}, system clock {wall}"
        );
    }
}
