//! Metric families built by hand, for the collectors that read their values
//! themselves at a scrape (sysfs, `/proc/self`) instead of keeping metrics.

use crate::export::exposition::{self, Value};

/// Appends the lines of these `(labels, value)` samples of the family
/// `name`, labels in name order, the series in the order of their label
/// values (as the prometheus crate's gather sorts them).
pub(super) fn samples(
    out: &mut String,
    name: &str,
    samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, Value)>,
) {
    let mut samples: Vec<_> = samples.into_iter().collect();
    samples.sort_by(|(a, _), (b, _)| {
        a.len()
            .cmp(&b.len())
            .then_with(|| a.iter().map(|(_, v)| v).cmp(b.iter().map(|(_, v)| v)))
    });
    for (labels, value) in samples {
        let text = exposition::label_text(labels.iter().map(|(n, v)| (*n, v.as_str())));
        exposition::sample(out, name, "", &text, value);
    }
}
