//! Histograms of durations for the per-event path: buckets found on
//! integer nanoseconds and two atomic adds per observation. The prometheus
//! crate's `Histogram::observe` scans its `f64` bounds, then makes four
//! atomic updates, one a compare-and-swap loop on an `f64` sum: a seventh of
//! the agent's per-record time under TCG, which emulates every `f64`
//! operation. The exposition is the same: bounds and `le` as configured, the
//! sum in seconds.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::export::{
    exposition::{self, Kind},
    registry::{Error, HistogramBounds, MetricVec, Series},
};

/// The bounds of a family, as configured and in nanoseconds.
pub struct Bounds {
    seconds: Arc<HistogramBounds>,
    nanos: Box<[u64]>,
}

impl Bounds {
    /// `seconds` are positive and increasing (the configuration's rules).
    fn new(family: &str, seconds: &[f64]) -> Result<Arc<Self>, Error> {
        let seconds = HistogramBounds::new(family, seconds)?;
        let nanos = seconds
            .values()
            .iter()
            .map(|&s| (s * 1e9).round() as u64)
            .collect();
        Ok(Arc::new(Self { seconds, nanos }))
    }
}

/// One series: a count per bucket (the last one above every bound) and the
/// sum in nanoseconds.
#[derive(Clone)]
pub struct DurationHistogram(Arc<DurationSeries>);

struct DurationSeries {
    bounds: Arc<Bounds>,
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl DurationHistogram {
    pub fn observe(&self, duration: Duration) {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let bucket = self.0.bounds.nanos.partition_point(|&bound| bound < ns);
        self.0.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.0.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Series for DurationHistogram {
    type Options = Arc<Bounds>;
    const KIND: Kind = Kind::Histogram;

    fn create(bounds: &Arc<Bounds>) -> Self {
        let counts = (0..=bounds.nanos.len())
            .map(|_| AtomicU64::new(0))
            .collect();
        Self(Arc::new(DurationSeries {
            bounds: Arc::clone(bounds),
            counts,
            sum_ns: AtomicU64::new(0),
        }))
    }

    fn write(&self, name: &str, labels: &str, out: &mut String) {
        exposition::histogram(
            out,
            name,
            labels,
            self.0.bounds.seconds.text(),
            self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)),
            self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        );
    }
}

/// A family of [`DurationHistogram`]s by label values.
pub type DurationHistogramVec = MetricVec<DurationHistogram>;

impl MetricVec<DurationHistogram> {
    pub fn durations(
        name: &str,
        help: &str,
        labels: &[&str],
        bounds: &[f64],
    ) -> Result<Self, Error> {
        Self::with_options(name, help, labels, Bounds::new(name, bounds)?)
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{HistogramOpts, HistogramVec};
    use proptest::prelude::*;

    use super::*;
    use crate::export::metrics::CALL_LATENCY_BUCKETS;
    use crate::export::registry::Registry;

    proptest! {
        /// The same durations into the crate's histogram and this one: the
        /// same exposition but for the last digits of the sums.
        #[test]
        fn exposes_what_the_crate_s_histogram_exposes(
            observations in proptest::collection::vec((0usize..3, 0u64..20_000_000_000), 0..60),
            exact in proptest::collection::vec((0usize..3, 0usize..CALL_LATENCY_BUCKETS.len()), 0..20),
        ) {
            let (theirs, ours) = (prometheus::Registry::new(), Registry::new());
            let crate_vec = HistogramVec::new(
                HistogramOpts::new("d_seconds", "help").buckets(CALL_LATENCY_BUCKETS.to_vec()),
                &["to", "from"],
            ).unwrap();
            theirs.register(Box::new(crate_vec.clone())).unwrap();
            let our_vec = DurationHistogramVec::durations("d_seconds", "help", &["to", "from"], CALL_LATENCY_BUCKETS).unwrap();
            ours.register(Box::new(our_vec.clone())).unwrap();
            let labels = [["RTS", "RTR"], ["INIT", "RESET"], ["ERR", "unknown"]];
            // durations on a bound exactly, too
            let exact = exact.iter().map(|&(l, b)| (l, (CALL_LATENCY_BUCKETS[b] * 1e9).round() as u64));
            for (l, ns) in observations.iter().copied().chain(exact) {
                let d = Duration::from_nanos(ns);
                crate_vec.with_label_values(&labels[l]).observe(d.as_secs_f64());
                our_vec.with_label_values(&labels[l]).observe(d);
            }
            let theirs = prometheus::TextEncoder::new().encode_to_string(&theirs.gather()).unwrap();
            let ours = ours.render();
            let not_sums = |t: &str| t.lines().filter(|l| !l.contains("_sum")).map(str::to_owned).collect::<Vec<_>>();
            prop_assert_eq!(not_sums(&theirs), not_sums(&ours));
            let sums = |t: &str| t.lines().filter(|l| l.contains("_sum")).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).collect::<Vec<_>>();
            for (a, b) in sums(&theirs).into_iter().zip(sums(&ours)) {
                prop_assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "{} against {}", a, b);
            }
        }
    }
}
