//! Metric families built by hand, for the collectors that read their values
//! themselves at a scrape (sysfs, `/proc/self`) instead of keeping metrics.

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// A family of `kind` (a counter or a gauge) with these `(labels, value)`
/// samples; labels in name order. `None` without samples: a family with no
/// series is left out.
pub(super) fn family(
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, f64)>,
) -> Option<MetricFamily> {
    let metrics: Vec<Metric> = samples
        .into_iter()
        .map(|(labels, value)| {
            let mut m = Metric::default();
            m.set_label(
                labels
                    .into_iter()
                    .map(|(name, value)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(name.to_owned());
                        pair.set_value(value);
                        pair
                    })
                    .collect(),
            );
            if kind == MetricType::COUNTER {
                let mut counter = Counter::default();
                counter.set_value(value);
                m.set_counter(counter);
            } else {
                let mut gauge = Gauge::default();
                gauge.set_value(value);
                m.set_gauge(gauge);
            }
            m
        })
        .collect();
    if metrics.is_empty() {
        return None;
    }
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(kind);
    family.set_metric(metrics);
    Some(family)
}
