//! Registration of the metric families on the agent's registry.
//!
//! Every family file builds its metrics through a [`Registrar`], which
//! registers them and remembers their names: [`super::Metrics::families`]
//! lists what is registered (a test holds README.md to it). The constructors
//! panic on an invalid or duplicate metric: both are programming errors that
//! every test building a `Metrics` catches.

use super::durations::DurationHistogramVec;
use prometheus::{
    core::Collector, Counter, CounterVec, Gauge, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub struct Registrar<'a> {
    registry: &'a Registry,
    families: &'a mut Vec<String>,
}

impl<'a> Registrar<'a> {
    pub(super) fn new(registry: &'a Registry, families: &'a mut Vec<String>) -> Self {
        Self { registry, families }
    }

    /// Registers any collector; fails if one of its names is taken.
    pub fn try_register(&mut self, collector: Box<dyn Collector>) -> prometheus::Result<()> {
        let names: Vec<String> = collector
            .desc()
            .iter()
            .map(|desc| desc.fq_name.clone())
            .collect();
        self.registry.register(collector)?;
        self.families.extend(names);
        Ok(())
    }

    fn register<C: Collector + Clone + 'static>(&mut self, metric: C) -> C {
        self.try_register(Box::new(metric.clone()))
            .expect("unique metric");
        metric
    }

    pub fn counter(&mut self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("valid metric"))
    }

    pub fn counter_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    /// A counter of fractional values (seconds).
    pub fn float_counter(&mut self, name: &str, help: &str) -> Counter {
        self.register(Counter::new(name, help).expect("valid metric"))
    }

    /// A counter of fractional values (seconds), by label.
    pub fn float_counter_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.register(CounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub fn gauge(&mut self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }

    /// A gauge of fractional values (a Unix time).
    pub fn float_gauge(&mut self, name: &str, help: &str) -> Gauge {
        self.register(Gauge::new(name, help).expect("valid metric"))
    }

    pub fn gauge_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub fn histogram(&mut self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.register(
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric"),
        )
    }

    /// Durations by label values, for the per-event path ([`DurationHistogramVec`]).
    pub fn duration_histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&'static str],
        buckets: &[f64],
    ) -> DurationHistogramVec {
        self.register(DurationHistogramVec::new(name, help, labels, buckets).expect("valid metric"))
    }

    pub fn histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        self.register(
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid metric"),
        )
    }
}
