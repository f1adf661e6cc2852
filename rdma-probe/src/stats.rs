//! Latency summaries: min / p50 / p99 / max / mean over samples.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use crate::ser;

/// Summary of a set of latency samples. Percentiles are nearest-rank: p50 of
/// `[1, 2, 3, 4]` is 2, p99 of 100 samples is the 99th smallest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LatencySummary {
    pub count: usize,
    #[serde(rename = "min_ns", serialize_with = "ser::duration_ns")]
    pub min: Duration,
    #[serde(rename = "p50_ns", serialize_with = "ser::duration_ns")]
    pub p50: Duration,
    #[serde(rename = "p99_ns", serialize_with = "ser::duration_ns")]
    pub p99: Duration,
    #[serde(rename = "max_ns", serialize_with = "ser::duration_ns")]
    pub max: Duration,
    #[serde(rename = "mean_ns", serialize_with = "ser::duration_ns")]
    pub mean: Duration,
}

impl LatencySummary {
    /// `None` for no samples.
    pub fn from_samples(samples: &[Duration]) -> Option<LatencySummary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let total: u128 = sorted.iter().map(Duration::as_nanos).sum();
        let mean_ns = total / sorted.len() as u128;
        Some(LatencySummary {
            count: sorted.len(),
            min: sorted[0],
            p50: nearest_rank(&sorted, 50.0),
            p99: nearest_rank(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
            mean: Duration::from_nanos(u64::try_from(mean_ns).unwrap_or(u64::MAX)),
        })
    }
}

/// Nearest-rank percentile of sorted, non-empty samples.
pub fn nearest_rank(sorted: &[Duration], percentile: f64) -> Duration {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (percentile / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Microseconds with two decimals, as the summary table prints them.
pub fn micros(d: Duration) -> String {
    format!("{:.2}", d.as_nanos() as f64 / 1000.0)
}

/// The header of an ib_send_lat-like round-trip table.
pub(crate) fn write_rtt_header(s: &mut String) {
    let _ = writeln!(
        s,
        " {:<8} {:<12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_p50[usec]",
        "t_p99[usec]",
        "t_max[usec]",
        "t_avg[usec]"
    );
}

/// A row of that table: round trips of `message_size`-byte messages.
pub(crate) fn write_rtt_row(s: &mut String, message_size: usize, r: &LatencySummary) {
    let _ = writeln!(
        s,
        " {:<8} {:<12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        message_size,
        r.count,
        micros(r.min),
        micros(r.p50),
        micros(r.p99),
        micros(r.max),
        micros(r.mean)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_micros(x)).collect()
    }

    #[test]
    fn summary_of_unsorted_samples() {
        let s = LatencySummary::from_samples(&us(&[4, 1, 3, 2])).unwrap();
        assert_eq!(s.count, 4);
        assert_eq!(s.min, Duration::from_micros(1));
        assert_eq!(s.p50, Duration::from_micros(2));
        assert_eq!(s.p99, Duration::from_micros(4));
        assert_eq!(s.max, Duration::from_micros(4));
        assert_eq!(s.mean, Duration::from_nanos(2_500));
    }

    #[test]
    fn percentiles_of_one_to_hundred() {
        let samples: Vec<u64> = (1..=100).rev().collect();
        let s = LatencySummary::from_samples(&us(&samples)).unwrap();
        assert_eq!(s.p50, Duration::from_micros(50));
        assert_eq!(s.p99, Duration::from_micros(99));
        assert_eq!(s.max, Duration::from_micros(100));
        let mut sorted = us(&samples);
        sorted.sort();
        assert_eq!(nearest_rank(&sorted, 0.0), Duration::from_micros(1));
        assert_eq!(nearest_rank(&sorted, 100.0), Duration::from_micros(100));
        assert_eq!(nearest_rank(&sorted, 99.9), Duration::from_micros(100));
    }

    #[test]
    fn single_and_no_samples() {
        assert_eq!(LatencySummary::from_samples(&[]), None);
        let s = LatencySummary::from_samples(&us(&[7])).unwrap();
        assert_eq!(
            (s.min, s.p50, s.p99, s.max),
            (s.mean, s.mean, s.mean, s.mean)
        );
        assert_eq!(micros(Duration::from_nanos(12_345)), "12.35");
    }

    #[test]
    fn serializes_in_nanoseconds() {
        let s = LatencySummary::from_samples(&us(&[1, 3])).unwrap();
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["p50_ns"], 1000);
        assert_eq!(json["max_ns"], 3000);
        assert_eq!(json["mean_ns"], 2000);
        assert_eq!(json["count"], 2);
    }
}
