//! The Prometheus text exposition format (0.0.4), written straight into one
//! buffer. Its output is byte for byte that of `prometheus::TextEncoder`
//! (tested below); it differs in cost. The crate's encoder formats every sample
//! value as an `f64` and every bucket bound afresh, allocating a `String` for
//! each: nearly all of a scrape's encoding time. Here integral values (the
//! integer counters and gauges, every bucket and count) are written as
//! integers, and bucket bounds are formatted once per distinct bound.

use std::{cell::RefCell, collections::HashMap, fmt::Write as _};

use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType};

/// Appends the exposition of `families` to `out`.
pub fn encode(families: &[MetricFamily], out: &mut String) {
    for family in families {
        encode_family(family, out);
    }
}

fn encode_family(family: &MetricFamily, out: &mut String) {
    let name = family.name();
    if !family.help().is_empty() {
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        escape_into(family.help(), false, out);
        out.push('\n');
    }
    let kind = family.get_field_type();
    out.push_str("# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(match kind {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    });
    out.push('\n');
    for metric in family.get_metric() {
        match kind {
            MetricType::COUNTER => sample(
                out,
                name,
                "",
                metric,
                None,
                metric.get_counter().get_value(),
            ),
            MetricType::GAUGE => {
                sample(out, name, "", metric, None, metric.get_gauge().get_value())
            }
            MetricType::HISTOGRAM => histogram(out, name, metric),
            MetricType::SUMMARY => summary(out, name, metric),
            // qpwatch registers no untyped metrics (the crate's encoder panics on them)
            MetricType::UNTYPED => {}
        }
    }
}

fn histogram(out: &mut String, name: &str, metric: &Metric) {
    let h = metric.get_histogram();
    // `{a="x",` (or `{`), written once and reused for every bucket's line
    let mut open = String::with_capacity(64);
    open.push('{');
    for pair in metric.get_label() {
        label_into(pair.name(), pair.value(), &mut open);
        open.push(',');
    }
    let timestamp = metric.timestamp_ms();
    let mut inf_seen = false;
    BOUND_TEXT.with(|cache| {
        let mut cache = cache.borrow_mut();
        for bucket in h.get_bucket() {
            let bound = bucket.upper_bound();
            let le = cache
                .entry(bound.to_bits())
                .or_insert_with(|| bound.to_string().into_boxed_str());
            bucket_line(out, name, &open, le, bucket.cumulative_count(), timestamp);
            inf_seen |= bound.is_sign_positive() && bound.is_infinite();
        }
    });
    let count = h.get_sample_count();
    if !inf_seen {
        bucket_line(out, name, &open, "+Inf", count, timestamp);
    }
    sample(out, name, "_sum", metric, None, h.get_sample_sum());
    sample(out, name, "_count", metric, None, count as f64);
}

/// `NAME_bucket{LABELS,le="LE"} COUNT[ TIMESTAMP]`; `open` is the labels
/// already written as `{a="x",` (or `{`).
fn bucket_line(out: &mut String, name: &str, open: &str, le: &str, count: u64, timestamp: i64) {
    out.push_str(name);
    out.push_str("_bucket");
    out.push_str(open);
    out.push_str("le=\"");
    out.push_str(le);
    out.push_str("\"} ");
    count_into(count, out);
    timestamp_into(timestamp, out);
    out.push('\n');
}

/// A count as `value_into` writes it as an `f64`, without the conversion.
fn count_into(count: u64, out: &mut String) {
    const EXACT: u64 = 1 << 53;
    if count < EXACT {
        integer_into(count as i64, out);
    } else {
        value_into(count as f64, out);
    }
}

fn timestamp_into(timestamp: i64, out: &mut String) {
    if timestamp != 0 {
        out.push(' ');
        integer_into(timestamp, out);
    }
}

fn summary(out: &mut String, name: &str, metric: &Metric) {
    let s = metric.get_summary();
    for q in s.get_quantile() {
        let quantile = q.quantile().to_string();
        sample(
            out,
            name,
            "",
            metric,
            Some(("quantile", &quantile)),
            q.value(),
        );
    }
    sample(out, name, "_sum", metric, None, s.sample_sum());
    sample(out, name, "_count", metric, None, s.sample_count() as f64);
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    metric: &Metric,
    extra_label: Option<(&str, &str)>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    labels(out, metric.get_label(), extra_label);
    out.push(' ');
    value_into(value, out);
    timestamp_into(metric.timestamp_ms(), out);
    out.push('\n');
}

fn labels(out: &mut String, pairs: &[LabelPair], extra: Option<(&str, &str)>) {
    if pairs.is_empty() && extra.is_none() {
        return;
    }
    let mut separator = '{';
    for (name, value) in pairs.iter().map(|p| (p.name(), p.value())).chain(extra) {
        out.push(separator);
        label_into(name, value, out);
        separator = ',';
    }
    out.push('}');
}

/// `name="value"`, the value escaped.
fn label_into(name: &str, value: &str, out: &mut String) {
    out.push_str(name);
    out.push_str("=\"");
    escape_into(value, true, out);
    out.push('"');
}

/// `i64`'s `Display`, without the formatting machinery.
fn integer_into(value: i64, out: &mut String) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        out.push('-');
    }
    // every byte written above is an ASCII digit
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// `f64`'s `Display`, as the crate writes values, but integers below 2^53
/// (exact in an f64, and printed without exponent or fraction either way) go
/// through the much cheaper integer formatting.
fn value_into(value: f64, out: &mut String) {
    const EXACT: f64 = (1u64 << 53) as f64;
    if value.fract() == 0.0 && value.abs() < EXACT && !(value == 0.0 && value.is_sign_negative()) {
        integer_into(value as i64, out);
    } else {
        let _ = write!(out, "{value}");
    }
}

thread_local! {
    /// Bucket bounds come from a fixed configuration: few distinct values.
    static BOUND_TEXT: RefCell<HashMap<u64, Box<str>>> = RefCell::new(HashMap::new());
}

/// `\` → `\\`, newline → `\n`, and `"` → `\"` in label values.
fn escape_into(text: &str, quotes: bool, out: &mut String) {
    let special = |c: char| c == '\\' || c == '\n' || (quotes && c == '"');
    // every special character is ASCII: a byte scan finds them
    if !text.bytes().any(|b| special(char::from(b))) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            c if special(c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{
        Counter, CounterVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    };

    use super::*;

    /// Both encodings of one gathering (the process collector's values move).
    fn both(registry: &Registry) -> (String, String) {
        let families = registry.gather();
        let mut theirs = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&families, &mut theirs)
            .unwrap();
        let mut ours = String::new();
        encode(&families, &mut ours);
        (ours, theirs)
    }

    #[test]
    fn equals_the_crate_encoder() {
        let r = Registry::new();
        let c = IntCounterVec::new(Opts::new("c_total", "a \\ help\nline"), &["a", "b"]).unwrap();
        r.register(Box::new(c.clone())).unwrap();
        c.with_label_values(&["x", "y"]).inc_by(3);
        c.with_label_values(&["quote\"d", "back\\slash\nnl"]).inc();
        c.with_label_values(&["big", "n"]).inc_by((1 << 53) + 1);
        let g = IntGauge::new("g", "gauge").unwrap();
        r.register(Box::new(g.clone())).unwrap();
        g.set(-7);
        let f = CounterVec::new(Opts::new("f_seconds_total", "float"), &["k"]).unwrap();
        r.register(Box::new(f.clone())).unwrap();
        f.with_label_values(&["v"]).inc_by(0.000123);
        f.with_label_values(&["w"]).inc_by(1e-9);
        let plain = Counter::new("plain_total", "no labels").unwrap();
        r.register(Box::new(plain.clone())).unwrap();
        plain.inc_by(2.5);
        let h = HistogramVec::new(
            HistogramOpts::new("h_seconds", "histogram")
                .buckets(vec![1e-6, 2.5e-4, 0.5, 1.0, 3600.0]),
            &["state"],
        )
        .unwrap();
        r.register(Box::new(h.clone())).unwrap();
        for v in [0.0, 3e-7, 0.0002, 0.7, 42.0, 1e9] {
            h.with_label_values(&["RTS"]).observe(v);
        }
        h.with_label_values(&["INIT"]);
        let bare = prometheus::Histogram::with_opts(
            HistogramOpts::new("bare_seconds", "no labels").buckets(vec![0.1, f64::INFINITY]),
        )
        .unwrap();
        r.register(Box::new(bare.clone())).unwrap();
        bare.observe(0.05);
        bare.observe(7.0);
        let (ours, theirs) = both(&r);
        assert!(
            ours.contains("bare_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{ours}"
        );
        assert_eq!(ours, theirs);
    }

    #[test]
    fn equals_the_crate_encoder_on_qpwatch_metrics() {
        use crate::{
            export::metrics::{Buckets, Metrics},
            kernel::rdma::QpState,
            model::qp::{Observation, Observer},
        };
        let mut m = Metrics::new(&Buckets::default(), "6.1.0-test");
        m.observe(Observation::Transition {
            from: Some(QpState::Init),
            to: QpState::Rtr,
            duration: std::time::Duration::from_micros(250),
        });
        m.events.received("qp_modify");
        let (ours, theirs) = both(&m.registry);
        assert!(ours.contains("qpwatch_qp_transition_duration_seconds_bucket"));
        assert_eq!(ours, theirs);
    }

    #[test]
    fn integral_values_are_written_as_the_crate_writes_floats() {
        for v in [
            0.0,
            1.0,
            -3.0,
            1e15,
            9.007_199_254_740_991e15,
            0.5,
            -0.0,
            1e300,
            f64::NAN,
            f64::INFINITY,
        ] {
            let mut text = String::new();
            value_into(v, &mut text);
            assert_eq!(text, v.to_string(), "{v}");
        }
    }

    #[test]
    fn integers_are_written_as_display_writes_them() {
        for v in [
            0,
            1,
            -1,
            9,
            10,
            -10,
            1 << 53,
            i64::MAX,
            i64::MIN,
            4_294_967_296,
        ] {
            let mut text = String::new();
            integer_into(v, &mut text);
            assert_eq!(text, v.to_string());
        }
        for v in [0, 1, (1 << 53) - 1, 1 << 53, (1 << 53) + 1, u64::MAX] {
            let mut text = String::new();
            count_into(v, &mut text);
            assert_eq!(text, (v as f64).to_string(), "{v}");
        }
    }
}
