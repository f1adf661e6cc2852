//! Reading counters from sysfs at scrape time, for the collectors that
//! export the kernel's own RDMA counters (ib_cm's, the devices' and ports').

use std::{fs, path::Path};

use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

use crate::model::qp::OTHER;

/// The names in `dir`, none if it cannot be read.
pub(super) fn entries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The counters of every device under `dir` that has any, in name order,
/// each with its `device` label: its name for the first `max_devices`,
/// `"other"` after them (a device without counters takes no name).
pub(super) fn labelled_devices<T>(
    dir: &Path,
    max_devices: usize,
    counters: impl Fn(&Path) -> Vec<T>,
) -> Vec<(String, Vec<T>)> {
    let mut devices = entries(dir);
    devices.sort();
    let mut named = 0;
    let mut out = Vec::new();
    for device in devices {
        let found = counters(&dir.join(&device));
        if found.is_empty() {
            continue;
        }
        let label = if named < max_devices {
            named += 1;
            device
        } else {
            OTHER.to_owned()
        };
        out.push((label, found));
    }
    out
}

/// A file holding one unsigned integer; `None` if it cannot be read or holds
/// anything else.
pub(super) fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A label value from a file name: lowercase letters, digits and `_`.
pub(super) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// A counter family of `(labels, value)` samples; labels in name order.
/// `None` without samples: a family with no series is left out.
pub(super) fn counter_family(
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> Option<MetricFamily> {
    let metrics: Vec<Metric> = samples
        .into_iter()
        .map(|(labels, value)| {
            let mut counter = Counter::default();
            counter.set_value(value as f64);
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
            m.set_counter(counter);
            m
        })
        .collect();
    if metrics.is_empty() {
        return None;
    }
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(MetricType::COUNTER);
    family.set_metric(metrics);
    Some(family)
}
