//! Registration of the metric families on the agent's registry.
//!
//! Every family file builds its metrics through a [`Registrar`], which
//! registers them; [`super::Metrics::families`] lists what the registry
//! holds (a test holds README.md to it). The constructors
//! panic on an invalid or duplicate metric: both are programming errors that
//! every test building a `Metrics` catches.

use super::durations::DurationHistogramVec;
use crate::export::registry::{
    Collector, Counter, CounterVec, Error, Gauge, Histogram, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, MetricVec, Registry, Series,
};

pub struct Registrar<'a> {
    registry: &'a Registry,
}

impl<'a> Registrar<'a> {
    pub(super) fn new(registry: &'a Registry) -> Self {
        Self { registry }
    }

    /// Registers any collector; fails if one of its names is taken.
    pub fn try_register(&mut self, collector: Box<dyn Collector>) -> Result<(), Error> {
        self.registry.register(collector)
    }

    fn register<C: Collector + Clone + 'static>(&mut self, metric: C) -> C {
        self.try_register(Box::new(metric.clone()))
            .expect("unique metric");
        metric
    }

    /// One series without labels, always exposed.
    fn single<S: Series>(&mut self, family: Result<MetricVec<S>, Error>) -> S {
        self.register(family.expect("valid metric"))
            .with_label_values::<&str>(&[])
    }

    pub fn counter(&mut self, name: &str, help: &str) -> IntCounter {
        self.single(IntCounterVec::new(name, help, &[]))
    }

    pub fn counter_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(name, help, labels).expect("valid metric"))
    }

    /// A counter of fractional values (seconds).
    pub fn float_counter(&mut self, name: &str, help: &str) -> Counter {
        self.single(CounterVec::new(name, help, &[]))
    }

    /// A counter of fractional values (seconds), by label.
    pub fn float_counter_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.register(CounterVec::new(name, help, labels).expect("valid metric"))
    }

    pub fn gauge(&mut self, name: &str, help: &str) -> IntGauge {
        self.single(IntGaugeVec::new(name, help, &[]))
    }

    /// A gauge of fractional values (a Unix time).
    pub fn float_gauge(&mut self, name: &str, help: &str) -> Gauge {
        self.single(MetricVec::<Gauge>::new(name, help, &[]))
    }

    pub fn gauge_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(name, help, labels).expect("valid metric"))
    }

    pub fn histogram(&mut self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.single(HistogramVec::histogram(name, help, &[], buckets))
    }

    /// Durations by label values, for the per-event path ([`DurationHistogramVec`]).
    pub fn duration_histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> DurationHistogramVec {
        self.register(
            DurationHistogramVec::durations(name, help, labels, buckets).expect("valid metric"),
        )
    }

    pub fn histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        self.register(HistogramVec::histogram(name, help, labels, buckets).expect("valid metric"))
    }
}
