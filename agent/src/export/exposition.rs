//! The Prometheus text exposition format (0.0.4), written line by line into
//! one buffer by the registry's families ([`crate::export::registry`]). The
//! output is byte for byte what the prometheus crate's `TextEncoder` writes
//! for the same metrics (the registry's tests compare the two); integral
//! values (integer counters and gauges, every bucket and count) are written
//! as integers, which the crate writes through `f64`'s `Display`.

use std::fmt::Write as _;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// What a family is, for its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn text(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// `# HELP NAME HELP` and `# TYPE NAME KIND`, each with its newline.
pub fn header(name: &str, help: &str, kind: Kind) -> String {
    let mut out = String::with_capacity(name.len() * 2 + help.len() + 32);
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    escape_into(help, false, &mut out);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind.text());
    out.push('\n');
    out
}

/// A series' labels as its lines carry them: `a="x",b="y"`, the pairs in
/// the order given, the values escaped; empty without labels.
pub fn label_text<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Box<str> {
    let mut out = String::new();
    for (name, value) in pairs {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        escape_into(value, true, &mut out);
        out.push('"');
    }
    out.into_boxed_str()
}

/// A value, as one of the family's types holds it.
#[derive(Debug, Clone, Copy)]
pub enum Value {
    Float(f64),
    Unsigned(u64),
    Signed(i64),
}

/// `NAME[SUFFIX][{LABELS}] VALUE`; `labels` as [`label_text`] writes them.
pub fn sample(out: &mut String, name: &str, suffix: &str, labels: &str, value: Value) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() {
        out.push('{');
        out.push_str(labels);
        out.push('}');
    }
    out.push(' ');
    match value {
        Value::Float(v) => value_into(v, out),
        Value::Unsigned(v) => count_into(v, out),
        Value::Signed(v) => signed_into(v, out),
    }
    out.push('\n');
}

/// A histogram's lines: its buckets (`le` after the series' labels, one per
/// bound, then `+Inf`), `_sum` and `_count`. `counts` holds the count of
/// each bucket alone (not cumulative), one per bound and one above them all.
pub fn histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    bounds: &[Box<str>],
    counts: impl IntoIterator<Item = u64>,
    sum: f64,
) {
    let mut cumulative = 0u64;
    let mut counts = counts.into_iter();
    for (bound, count) in bounds.iter().zip(counts.by_ref()) {
        cumulative += count;
        bucket_line(out, name, labels, bound, cumulative);
    }
    cumulative += counts.sum::<u64>();
    bucket_line(out, name, labels, "+Inf", cumulative);
    sample(out, name, "_sum", labels, Value::Float(sum));
    sample(out, name, "_count", labels, Value::Unsigned(cumulative));
}

/// A bucket bound as its `le` label carries it.
pub fn bound_text(bound: f64) -> Box<str> {
    bound.to_string().into_boxed_str()
}

fn bucket_line(out: &mut String, name: &str, labels: &str, le: &str, count: u64) {
    out.push_str(name);
    out.push_str("_bucket{");
    if !labels.is_empty() {
        out.push_str(labels);
        out.push(',');
    }
    out.push_str("le=\"");
    out.push_str(le);
    out.push_str("\"} ");
    count_into(count, out);
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

/// A signed value as `value_into` writes it as an `f64`.
fn signed_into(value: i64, out: &mut String) {
    const EXACT: u64 = 1 << 53;
    if value.unsigned_abs() < EXACT {
        integer_into(value, out);
    } else {
        value_into(value as f64, out);
    }
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

/// `\` → `\\`, newline → `\n`, and (in label values) `"` → `\"`.
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
    use super::*;

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
            let mut text = String::new();
            signed_into(v, &mut text);
            assert_eq!(text, (v as f64).to_string(), "{v}");
        }
        for v in [0, 1, (1 << 53) - 1, 1 << 53, (1 << 53) + 1, u64::MAX] {
            let mut text = String::new();
            count_into(v, &mut text);
            assert_eq!(text, (v as f64).to_string(), "{v}");
        }
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(
            &*label_text([("a", "quote\"d"), ("b", "back\\slash\nnl")]),
            r#"a="quote\"d",b="back\\slash\nnl""#
        );
        assert_eq!(
            header("x_total", "a \\ \"help\"\nline", Kind::Counter),
            "# HELP x_total a \\\\ \"help\"\\nline\n# TYPE x_total counter\n"
        );
    }
}
