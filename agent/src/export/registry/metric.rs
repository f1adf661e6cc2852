//! One series of each type: a handle on shared atomics, cheap to clone and
//! to keep (the per-event path keeps the ones it updates most).

use std::sync::{
    atomic::{AtomicI64, AtomicU64, Ordering},
    Arc,
};

use super::{vec::Series, Error};
use crate::export::exposition::{self, Kind, Value};

/// A counter of whole numbers.
#[derive(Clone, Default)]
pub struct IntCounter(Arc<AtomicU64>);

impl IntCounter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A counter of fractional values (seconds).
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// `n` is not negative.
    pub fn inc_by(&self, n: f64) {
        debug_assert!(n >= 0.0, "{n}");
        add_f64(&self.0, n);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

fn add_f64(bits: &AtomicU64, n: f64) {
    let _ = bits.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        Some((f64::from_bits(old) + n).to_bits())
    });
}

/// A gauge of whole numbers.
#[derive(Clone, Default)]
pub struct IntGauge(Arc<AtomicI64>);

impl IntGauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn dec(&self) {
        self.sub(1);
    }

    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }

    pub fn sub(&self, v: i64) {
        self.0.fetch_sub(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge of fractional values (a Unix time).
#[derive(Clone, Default)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A series of one value, made at 0, written as `NAME{LABELS} VALUE`.
macro_rules! single_value_series {
    ($($series:ident: $kind:ident, $value:ident;)*) => {$(
        impl Series for $series {
            type Options = ();
            const KIND: Kind = Kind::$kind;

            fn create(_: &()) -> Self {
                Self::default()
            }

            fn write(&self, name: &str, labels: &str, out: &mut String) {
                exposition::sample(out, name, "", labels, Value::$value(self.get()));
            }
        }
    )*};
}

single_value_series! {
    IntCounter: Counter, Unsigned;
    Counter: Counter, Float;
    IntGauge: Gauge, Signed;
    Gauge: Gauge, Float;
}

/// A histogram's upper bounds, and their text for `le`.
pub struct HistogramBounds {
    values: Box<[f64]>,
    text: Box<[Box<str>]>,
}

impl HistogramBounds {
    /// Increasing bounds; a last `+Inf` is left out (every histogram has it).
    pub fn new(family: &str, bounds: &[f64]) -> Result<Arc<Self>, Error> {
        let bounds = match bounds.split_last() {
            Some((last, rest)) if *last == f64::INFINITY => rest,
            _ => bounds,
        };
        if bounds
            .windows(2)
            .any(|w| w[0].partial_cmp(&w[1]) != Some(std::cmp::Ordering::Less))
            || bounds.iter().any(|b| b.is_nan())
        {
            return Err(Error::Buckets(family.to_owned()));
        }
        Ok(Arc::new(Self {
            values: bounds.into(),
            text: bounds.iter().map(|&b| exposition::bound_text(b)).collect(),
        }))
    }

    pub fn values(&self) -> &[f64] {
        &self.values
    }

    pub fn text(&self) -> &[Box<str>] {
        &self.text
    }
}

/// A histogram of `f64` observations.
#[derive(Clone)]
pub struct Histogram(Arc<HistogramSeries>);

struct HistogramSeries {
    bounds: Arc<HistogramBounds>,
    /// One per bound, the last one above them all.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    /// Counted in the first bucket whose bound is at least `v` (`le`).
    pub fn observe(&self, v: f64) {
        let bounds = &self.0.bounds.values;
        let bucket = if v.is_nan() {
            bounds.len()
        } else {
            bounds.partition_point(|&b| b < v)
        };
        self.0.counts[bucket].fetch_add(1, Ordering::Relaxed);
        add_f64(&self.0.sum, v);
    }

    pub fn get_sample_count(&self) -> u64 {
        self.0
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    pub fn get_sample_sum(&self) -> f64 {
        f64::from_bits(self.0.sum.load(Ordering::Relaxed))
    }
}

impl Series for Histogram {
    type Options = Arc<HistogramBounds>;
    const KIND: Kind = Kind::Histogram;

    fn create(bounds: &Arc<HistogramBounds>) -> Self {
        Self(Arc::new(HistogramSeries {
            bounds: Arc::clone(bounds),
            counts: (0..=bounds.values.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }))
    }

    fn write(&self, name: &str, labels: &str, out: &mut String) {
        exposition::histogram(
            out,
            name,
            labels,
            &self.0.bounds.text,
            self.0.counts.iter().map(|c| c.load(Ordering::Relaxed)),
            self.get_sample_sum(),
        );
    }
}
