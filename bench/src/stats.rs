//! Percentiles of latencies, and the spread of a figure measured several times.

use std::time::Duration;

use serde::Serialize;

/// Latency percentiles, in milliseconds (nearest-rank percentiles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The nearest-rank percentile of sorted values.
fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    pub fn of(mut samples: Vec<Duration>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let total: Duration = samples.iter().sum();
        Self {
            count: samples.len(),
            min_ms: ms(samples[0]),
            p50_ms: ms(percentile(&samples, 50.0)),
            p95_ms: ms(percentile(&samples, 95.0)),
            p99_ms: ms(percentile(&samples, 99.0)),
            max_ms: ms(samples[samples.len() - 1]),
            mean_ms: ms(total) / samples.len() as f64,
        }
    }
}

/// A figure measured several times (once per round, say): its median and its range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub count: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return Self::default();
        }
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Self {
            count: n,
            median,
            min: sorted[0],
            max: sorted[n - 1],
        }
    }

    /// `median [min–max]` with the given number of decimals.
    pub fn show(&self, decimals: usize) -> String {
        if self.count == 0 {
            return "n/a".to_owned();
        }
        if self.count == 1 {
            return format!("{:.decimals$}", self.median);
        }
        format!(
            "{:.decimals$} [{:.decimals$}–{:.decimals$}]",
            self.median, self.min, self.max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let summary = Summary::of(samples);
        assert_eq!(summary.count, 100);
        assert_eq!(summary.p50_ms, 50.0);
        assert_eq!(summary.p95_ms, 95.0);
        assert_eq!(summary.p99_ms, 99.0);
        assert_eq!(summary.max_ms, 100.0);
        assert_eq!(Summary::of(vec![Duration::from_millis(7)]).p99_ms, 7.0);
        assert_eq!(Summary::of(Vec::new()).count, 0);
    }

    #[test]
    fn spread_has_a_median_and_a_range() {
        let spread = Spread::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!(spread.median, 2.5);
        assert_eq!((spread.min, spread.max), (1.0, 10.0));
        assert_eq!(spread.show(1), "2.5 [1.0–10.0]");
        assert_eq!(Spread::of(&[]).show(1), "n/a");
    }
}
