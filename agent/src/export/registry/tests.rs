//! The same metrics, updated the same way, in this registry and in the
//! prometheus crate's: the same exposition, byte for byte.

use proptest::prelude::*;

use super::*;

/// Families of every type, registered in an order that is not their names'
/// order, labels declared out of name order.
struct Ours {
    registry: Registry,
    counters: IntCounterVec,
    gauge: IntGauge,
    gauges: IntGaugeVec,
    seconds: CounterVec,
    plain: Counter,
    unix_time: Gauge,
    histograms: HistogramVec,
    bare: Histogram,
    empty: IntCounterVec,
}

struct Theirs {
    registry: prometheus::Registry,
    counters: prometheus::IntCounterVec,
    gauge: prometheus::IntGauge,
    gauges: prometheus::IntGaugeVec,
    seconds: prometheus::CounterVec,
    plain: prometheus::Counter,
    unix_time: prometheus::Gauge,
    histograms: prometheus::HistogramVec,
    bare: prometheus::Histogram,
}

const COUNTERS: (&str, &str) = ("z_counted_total", "a \\ help\nline with \"quotes\"");
const BOUNDS: [f64; 5] = [1e-6, 2.5e-4, 0.5, 1.0, 3600.0];

fn ours() -> Ours {
    let registry = Registry::new();
    let counters = IntCounterVec::new(COUNTERS.0, COUNTERS.1, &["zone", "app"]).unwrap();
    registry.register(Box::new(counters.clone())).unwrap();
    let gauges = IntGaugeVec::new("m_gauges", "gauges", &["b", "a"]).unwrap();
    registry.register(Box::new(gauges.clone())).unwrap();
    let single = IntGaugeVec::new("g", "gauge", &[]).unwrap();
    registry.register(Box::new(single.clone())).unwrap();
    let seconds = CounterVec::new("f_seconds_total", "float", &["k"]).unwrap();
    registry.register(Box::new(seconds.clone())).unwrap();
    let plain = CounterVec::new("plain_total", "no labels", &[]).unwrap();
    registry.register(Box::new(plain.clone())).unwrap();
    let unix_time = MetricVec::<Gauge>::new("t_timestamp_seconds", "a time", &[]).unwrap();
    registry.register(Box::new(unix_time.clone())).unwrap();
    let histograms =
        HistogramVec::histogram("h_seconds", "histogram", &["state"], &BOUNDS).unwrap();
    registry.register(Box::new(histograms.clone())).unwrap();
    let bare =
        HistogramVec::histogram("bare_seconds", "no labels", &[], &[0.1, f64::INFINITY]).unwrap();
    registry.register(Box::new(bare.clone())).unwrap();
    let empty = IntCounterVec::new("a_empty_total", "no series", &["x"]).unwrap();
    registry.register(Box::new(empty.clone())).unwrap();
    Ours {
        registry,
        counters,
        gauge: single.with_label_values::<&str>(&[]),
        gauges,
        seconds,
        plain: plain.with_label_values::<&str>(&[]),
        unix_time: unix_time.with_label_values::<&str>(&[]),
        histograms,
        bare: bare.with_label_values::<&str>(&[]),
        empty,
    }
}

fn theirs() -> Theirs {
    use prometheus::{HistogramOpts, Opts};
    let registry = prometheus::Registry::new();
    let counters =
        prometheus::IntCounterVec::new(Opts::new(COUNTERS.0, COUNTERS.1), &["zone", "app"])
            .unwrap();
    registry.register(Box::new(counters.clone())).unwrap();
    let gauges =
        prometheus::IntGaugeVec::new(Opts::new("m_gauges", "gauges"), &["b", "a"]).unwrap();
    registry.register(Box::new(gauges.clone())).unwrap();
    let gauge = prometheus::IntGauge::new("g", "gauge").unwrap();
    registry.register(Box::new(gauge.clone())).unwrap();
    let seconds =
        prometheus::CounterVec::new(Opts::new("f_seconds_total", "float"), &["k"]).unwrap();
    registry.register(Box::new(seconds.clone())).unwrap();
    let plain = prometheus::Counter::new("plain_total", "no labels").unwrap();
    registry.register(Box::new(plain.clone())).unwrap();
    let unix_time = prometheus::Gauge::new("t_timestamp_seconds", "a time").unwrap();
    registry.register(Box::new(unix_time.clone())).unwrap();
    let histograms = prometheus::HistogramVec::new(
        HistogramOpts::new("h_seconds", "histogram").buckets(BOUNDS.to_vec()),
        &["state"],
    )
    .unwrap();
    registry.register(Box::new(histograms.clone())).unwrap();
    let bare = prometheus::Histogram::with_opts(
        HistogramOpts::new("bare_seconds", "no labels").buckets(vec![0.1, f64::INFINITY]),
    )
    .unwrap();
    registry.register(Box::new(bare.clone())).unwrap();
    let empty =
        prometheus::IntCounterVec::new(Opts::new("a_empty_total", "no series"), &["x"]).unwrap();
    registry.register(Box::new(empty)).unwrap();
    Theirs {
        registry,
        counters,
        gauge,
        gauges,
        seconds,
        plain,
        unix_time,
        histograms,
        bare,
    }
}

fn their_text(registry: &prometheus::Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap()
}

/// Label values that sort differently by byte than by the order they come
/// in, and need escaping. The random updates leave out the last one: the
/// crate finds a series by a hash of its values run together, so that
/// `["", "x"]` and `["x", ""]` are one series to it.
const VALUES: [&str; 6] = ["x", "quote\"d", "back\\slash\nnl", "B", "é", ""];

#[derive(Debug, Clone)]
enum Update {
    Count(usize, usize, u64),
    Gauge(usize, usize, i64),
    Set(i64),
    Seconds(usize, f64),
    Plain(f64),
    Time(f64),
    Observe(usize, f64),
    Bare(f64),
    RemoveCount(usize, usize),
    RemoveGauge(usize, usize),
}

fn update() -> impl Strategy<Value = Update> {
    let value = 0..VALUES.len() - 1;
    let float = prop_oneof![
        Just(0.0),
        Just(1e-6),
        Just(0.5),
        Just(3600.0),
        Just(1e9),
        0.0..5000.0f64
    ];
    prop_oneof![
        (
            value.clone(),
            value.clone(),
            prop_oneof![0..1000u64, Just((1 << 53) + 1)]
        )
            .prop_map(|(a, b, n)| Update::Count(a, b, n)),
        (value.clone(), value.clone(), -1000..1000i64).prop_map(|(a, b, n)| Update::Gauge(a, b, n)),
        prop_oneof![-1000..1000i64, Just(i64::MIN + 1), Just(1 << 60)].prop_map(Update::Set),
        (value.clone(), float.clone()).prop_map(|(k, v)| Update::Seconds(k, v)),
        float.clone().prop_map(Update::Plain),
        prop_oneof![Just(1_796_000_000.25), 0.0..2e9f64].prop_map(Update::Time),
        (value.clone(), float.clone()).prop_map(|(k, v)| Update::Observe(k, v)),
        float.prop_map(Update::Bare),
        (value.clone(), value.clone()).prop_map(|(a, b)| Update::RemoveCount(a, b)),
        (value.clone(), value).prop_map(|(a, b)| Update::RemoveGauge(a, b)),
    ]
}

fn apply(update: &Update, ours: &Ours, theirs: &Theirs) {
    let v = |i: usize| VALUES[i];
    match *update {
        Update::Count(a, b, n) => {
            ours.counters.with_label_values(&[v(a), v(b)]).inc_by(n);
            theirs.counters.with_label_values(&[v(a), v(b)]).inc_by(n);
        }
        Update::Gauge(a, b, n) => {
            ours.gauges.with_label_values(&[v(a), v(b)]).add(n);
            theirs.gauges.with_label_values(&[v(a), v(b)]).add(n);
        }
        Update::Set(n) => {
            ours.gauge.set(n);
            theirs.gauge.set(n);
        }
        Update::Seconds(k, x) => {
            ours.seconds.with_label_values(&[v(k)]).inc_by(x);
            theirs.seconds.with_label_values(&[v(k)]).inc_by(x);
        }
        Update::Plain(x) => {
            ours.plain.inc_by(x);
            theirs.plain.inc_by(x);
        }
        Update::Time(x) => {
            ours.unix_time.set(x);
            theirs.unix_time.set(x);
        }
        Update::Observe(k, x) => {
            ours.histograms.with_label_values(&[v(k)]).observe(x);
            theirs.histograms.with_label_values(&[v(k)]).observe(x);
        }
        Update::Bare(x) => {
            ours.bare.observe(x);
            theirs.bare.observe(x);
        }
        Update::RemoveCount(a, b) => {
            let removed = ours.counters.remove_label_values(&[v(a), v(b)]);
            assert_eq!(
                removed,
                theirs.counters.remove_label_values(&[v(a), v(b)]).is_ok()
            );
        }
        Update::RemoveGauge(a, b) => {
            let removed = ours.gauges.remove_label_values(&[v(a), v(b)]);
            assert_eq!(
                removed,
                theirs.gauges.remove_label_values(&[v(a), v(b)]).is_ok()
            );
        }
    }
}

proptest! {
    /// Sums of floats are added in the same order on both sides, so even
    /// they agree to the last digit.
    #[test]
    fn exposes_what_the_crate_exposes(updates in proptest::collection::vec(update(), 0..80)) {
        let (ours, theirs) = (ours(), theirs());
        for u in &updates {
            apply(u, &ours, &theirs);
        }
        prop_assert_eq!(ours.registry.render(), their_text(&theirs.registry));
        prop_assert!(!ours.registry.render().contains("a_empty_total"));
        prop_assert_eq!(ours.empty.with_label_values(&["x"]).get(), 0);
    }
}

#[test]
fn every_type_every_escape_in_one_exposition() {
    let (ours, theirs) = (ours(), theirs());
    let updates = [
        Update::Count(0, 1, 3),
        Update::Count(2, 3, (1 << 53) + 1),
        Update::Count(5, 4, 1),
        Update::Gauge(3, 0, -7),
        Update::Gauge(0, 3, 2),
        Update::Set(-7),
        Update::Seconds(1, 0.000123),
        Update::Seconds(2, 1e-9),
        Update::Plain(2.5),
        Update::Time(1_796_000_000.25),
        Update::Observe(0, 0.0),
        Update::Observe(0, 3e-7),
        Update::Observe(0, 0.0002),
        Update::Observe(0, 0.7),
        Update::Observe(0, 42.0),
        Update::Observe(0, 1e9),
        Update::Observe(0, f64::INFINITY),
        Update::Observe(3, 1.0),
        Update::Bare(0.05),
        Update::Bare(7.0),
    ];
    for u in &updates {
        apply(u, &ours, &theirs);
    }
    let text = ours.registry.render();
    assert!(
        text.contains("bare_seconds_bucket{le=\"+Inf\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains(r#"z_counted_total{app="quote\"d",zone="x"} 3"#),
        "{text}"
    );
    assert_eq!(text, their_text(&theirs.registry));
}

#[test]
fn bad_names_labels_and_bounds_are_refused() {
    assert!(matches!(
        IntCounterVec::new("1x", "h", &[]),
        Err(Error::Name(_))
    ));
    assert!(matches!(
        IntCounterVec::new("x-y", "h", &[]),
        Err(Error::Name(_))
    ));
    assert!(matches!(
        IntCounterVec::new("x", "", &[]),
        Err(Error::NoHelp(_))
    ));
    for labels in [&["a", "a"][..], &["__a"], &["a:b"], &["0"]] {
        assert!(
            matches!(
                IntCounterVec::new("x", "h", labels),
                Err(Error::Label { .. })
            ),
            "{labels:?}"
        );
    }
    assert!(matches!(
        HistogramVec::histogram("x", "h", &["le"], &[1.0]),
        Err(Error::Label { .. })
    ));
    assert!(IntCounterVec::new("ok:name_1", "h", &["le", "_b"]).is_ok());
    for bounds in [&[1.0, 1.0][..], &[2.0, 1.0], &[f64::NAN]] {
        assert!(matches!(
            HistogramVec::histogram("x", "h", &[], bounds),
            Err(Error::Buckets(_))
        ));
    }
    let registry = Registry::new();
    let x = IntCounterVec::new("x", "h", &[]).unwrap();
    registry.register(Box::new(x.clone())).unwrap();
    assert!(matches!(
        registry.register(Box::new(IntGaugeVec::new("x", "other", &["a"]).unwrap())),
        Err(Error::Duplicate(_))
    ));
}

#[test]
#[should_panic(expected = "label values of x")]
fn too_few_label_values_is_a_programming_error() {
    IntCounterVec::new("x", "h", &["a", "b"])
        .unwrap()
        .with_label_values(&["only one"]);
}

/// Holds a token whose weak reference shows whether it is still alive.
struct Token(#[allow(dead_code)] std::sync::Arc<()>, Desc);

impl Collector for Token {
    fn descs(&self) -> Vec<&Desc> {
        vec![&self.1]
    }

    fn collect(&self, out: &mut [String]) {
        out[0].push_str("token 1\n");
    }
}

#[test]
fn the_collectors_go_with_the_last_clone() {
    let registry = Registry::new();
    let token = std::sync::Arc::new(());
    let alive = std::sync::Arc::downgrade(&token);
    let desc = Desc::new("token", "h", Kind::Gauge, &[]).unwrap();
    registry.register(Box::new(Token(token, desc))).unwrap();
    let clone = registry.clone();
    drop(registry);
    assert_eq!(
        clone.render(),
        "# HELP token h\n# TYPE token gauge\ntoken 1\n"
    );
    assert!(alive.upgrade().is_some());
    drop(clone);
    assert!(alive.upgrade().is_none());
}

/// Waits, on its first collection only, until the test lets it go.
struct FirstWaits {
    desc: Desc,
    first: std::sync::atomic::AtomicBool,
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Collector for FirstWaits {
    fn descs(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self, out: &mut [String]) {
        if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.entered.lock().unwrap().send(()).unwrap();
            self.go.lock().unwrap().recv().unwrap();
        }
        out[0].push_str("waits 1\n");
    }
}

/// A render on the blocking pool must not hold up one on the event loop.
#[test]
fn renders_run_at_once() {
    let registry = Registry::new();
    let (entered, has_entered) = std::sync::mpsc::channel();
    let (go, wait) = std::sync::mpsc::channel();
    registry
        .register(Box::new(FirstWaits {
            desc: Desc::new("waits", "h", Kind::Gauge, &[]).unwrap(),
            first: true.into(),
            entered: entered.into(),
            go: wait.into(),
        }))
        .unwrap();
    let counted = IntCounterVec::new("x_total", "h", &[]).unwrap();
    registry.register(Box::new(counted.clone())).unwrap();
    counted.with_label_values::<&str>(&[]).inc();
    let slow = {
        let registry = registry.clone();
        std::thread::spawn(move || registry.render())
    };
    has_entered.recv().unwrap();
    let (done, quick) = std::sync::mpsc::channel();
    {
        let registry = registry.clone();
        std::thread::spawn(move || done.send(registry.render()));
    }
    let quick = quick.recv_timeout(std::time::Duration::from_secs(30));
    assert!(!slow.is_finished());
    go.send(()).unwrap();
    let quick = quick.expect("a render while another one waits");
    assert_eq!(slow.join().unwrap(), quick);
    assert_eq!(
        quick,
        "# HELP waits h\n# TYPE waits gauge\nwaits 1\n# HELP x_total h\n# TYPE x_total counter\nx_total 1\n"
    );
    // and the buffers kept after both
    assert_eq!(registry.render(), quick);
}
