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
        Arc, RwLock,
    },
    time::Duration,
};

use prometheus::{
    core::{Collector, Desc},
    proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType},
};

/// The bounds of a family, as configured and in nanoseconds.
struct Bounds {
    seconds: Box<[f64]>,
    nanos: Box<[u64]>,
}

impl Bounds {
    /// `seconds` are positive and increasing (the configuration's rules).
    fn new(seconds: &[f64]) -> Self {
        Self {
            seconds: seconds.into(),
            nanos: seconds.iter().map(|&s| (s * 1e9).round() as u64).collect(),
        }
    }
}

/// One series: a count per bucket (the last one above every bound) and the
/// sum in nanoseconds.
#[derive(Clone)]
pub struct DurationHistogram(Arc<Series>);

struct Series {
    bounds: Arc<Bounds>,
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl DurationHistogram {
    fn new(bounds: Arc<Bounds>) -> Self {
        let counts = (0..=bounds.nanos.len())
            .map(|_| AtomicU64::new(0))
            .collect();
        Self(Arc::new(Series {
            bounds,
            counts,
            sum_ns: AtomicU64::new(0),
        }))
    }

    pub fn observe(&self, duration: Duration) {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let bucket = self.0.bounds.nanos.partition_point(|&bound| bound < ns);
        self.0.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.0.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn proto(&self) -> Histogram {
        let mut h = Histogram::default();
        let mut cumulative = 0;
        let buckets = self
            .0
            .bounds
            .seconds
            .iter()
            .zip(self.0.counts.iter())
            .map(|(&bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                let mut b = Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        h.set_bucket(buckets);
        let above = self
            .0
            .counts
            .last()
            .map_or(0, |c| c.load(Ordering::Relaxed));
        // the count from the buckets themselves, so that +Inf equals it
        h.set_sample_count(cumulative + above);
        h.set_sample_sum(self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9);
        h
    }
}

/// A family of [`DurationHistogram`]s by label values.
#[derive(Clone)]
pub struct DurationHistogramVec(Arc<Family>);

struct Family {
    desc: Desc,
    labels: Vec<&'static str>,
    bounds: Arc<Bounds>,
    series: RwLock<Vec<(Vec<String>, DurationHistogram)>>,
}

impl DurationHistogramVec {
    pub fn new(
        name: &str,
        help: &str,
        labels: &[&'static str],
        bounds: &[f64],
    ) -> prometheus::Result<Self> {
        let desc = Desc::new(
            name.to_owned(),
            help.to_owned(),
            labels.iter().map(|l| (*l).to_owned()).collect(),
            Default::default(),
        )?;
        Ok(Self(Arc::new(Family {
            desc,
            labels: labels.to_vec(),
            bounds: Arc::new(Bounds::new(bounds)),
            series: RwLock::default(),
        })))
    }

    /// The series of these label values (in the order of the family's
    /// labels), made on first use.
    pub fn with_label_values(&self, values: &[&str]) -> DurationHistogram {
        assert_eq!(values.len(), self.0.labels.len(), "label values");
        let found = |series: &[(Vec<String>, DurationHistogram)]| {
            series
                .iter()
                .find(|(v, _)| v.iter().map(String::as_str).eq(values.iter().copied()))
                .map(|(_, h)| h.clone())
        };
        if let Some(h) = found(&self.0.series.read().expect("not poisoned")) {
            return h;
        }
        let mut series = self.0.series.write().expect("not poisoned");
        if let Some(h) = found(&series) {
            return h;
        }
        let h = DurationHistogram::new(Arc::clone(&self.0.bounds));
        series.push((values.iter().map(|v| (*v).to_owned()).collect(), h.clone()));
        h
    }
}

impl Collector for DurationHistogramVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let series = self.0.series.read().expect("not poisoned");
        let mut family = MetricFamily::default();
        family.set_name(self.0.desc.fq_name.clone());
        family.set_help(self.0.desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        let metrics = series
            .iter()
            .map(|(values, h)| {
                let mut pairs: Vec<LabelPair> = self
                    .0
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(name, value)| {
                        let mut pair = LabelPair::default();
                        pair.set_name((*name).to_owned());
                        pair.set_value(value.clone());
                        pair
                    })
                    .collect();
                pairs.sort_by(|a, b| a.name().cmp(b.name()));
                let mut m = Metric::default();
                m.set_label(pairs);
                m.set_histogram(h.proto());
                m
            })
            .collect();
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{HistogramOpts, HistogramVec, Registry};
    use proptest::prelude::*;

    use super::*;
    use crate::export::metrics::render;
    use crate::export::metrics::CALL_LATENCY_BUCKETS;

    proptest! {
        /// The same durations into the crate's histogram and this one: the
        /// same exposition but for the last digits of the sums.
        #[test]
        fn exposes_what_the_crate_s_histogram_exposes(
            observations in proptest::collection::vec((0usize..3, 0u64..20_000_000_000), 0..60),
            exact in proptest::collection::vec((0usize..3, 0usize..CALL_LATENCY_BUCKETS.len()), 0..20),
        ) {
            let (theirs, ours) = (Registry::new(), Registry::new());
            let crate_vec = HistogramVec::new(
                HistogramOpts::new("d_seconds", "help").buckets(CALL_LATENCY_BUCKETS.to_vec()),
                &["to", "from"],
            ).unwrap();
            theirs.register(Box::new(crate_vec.clone())).unwrap();
            let our_vec = DurationHistogramVec::new("d_seconds", "help", &["to", "from"], CALL_LATENCY_BUCKETS).unwrap();
            ours.register(Box::new(our_vec.clone())).unwrap();
            let labels = [["RTS", "RTR"], ["INIT", "RESET"], ["ERR", "unknown"]];
            // durations on a bound exactly, too
            let exact = exact.iter().map(|&(l, b)| (l, (CALL_LATENCY_BUCKETS[b] * 1e9).round() as u64));
            for (l, ns) in observations.iter().copied().chain(exact) {
                let d = Duration::from_nanos(ns);
                crate_vec.with_label_values(&labels[l]).observe(d.as_secs_f64());
                our_vec.with_label_values(&labels[l]).observe(d);
            }
            let (theirs, ours) = (render(&theirs), render(&ours));
            let not_sums = |t: &str| t.lines().filter(|l| !l.contains("_sum")).map(str::to_owned).collect::<Vec<_>>();
            prop_assert_eq!(not_sums(&theirs), not_sums(&ours));
            let sums = |t: &str| t.lines().filter(|l| l.contains("_sum")).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).collect::<Vec<_>>();
            for (a, b) in sums(&theirs).into_iter().zip(sums(&ours)) {
                prop_assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "{} against {}", a, b);
            }
        }
    }
}
