//! Property tests of the config file parser (proptest, a bounded number of
//! cases in the normal `cargo test`): any text is parsed or rejected with an
//! error that points into the text, never a panic; generated valid files
//! parse to exactly their values; an out-of-range value is rejected at its
//! own key and line.

use std::{net::SocketAddr, time::Duration};

use proptest::prelude::*;

use super::{check_buckets, test_support::parse, ConfigError, Origin};
use crate::kernel::hooks::Group;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 500,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An error's position lies within the text (line 1..=lines+1, and a
/// column within that line).
fn check_origin(text: &str, e: &ConfigError) -> Result<(), TestCaseError> {
    if let Origin::File { line, column, .. } = &e.origin {
        let lines: Vec<&str> = text.split('\n').collect();
        prop_assert!(
            *line >= 1 && *line <= lines.len(),
            "line {} of {}",
            line,
            lines.len()
        );
        prop_assert!(
            *column >= 1 && *column <= lines[*line - 1].len() + 1,
            "column {}",
            column
        );
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct Valid {
    port: u16,
    ring_shift: u32,
    groups: Vec<Group>,
    max_tracked: i64,
    max_devices: i64,
    buckets: Vec<f64>,
    targets: Vec<(String, u16, u32, u32)>,
}

fn valid() -> impl Strategy<Value = Valid> {
    (
        1u16..,
        12u32..=30,
        proptest::sample::subsequence(Group::ALL.to_vec(), 1..=Group::ALL.len()),
        1i64..=(1 << 24),
        1i64..=4096,
        proptest::collection::btree_set(1u32..1_000_000, 1..10),
        proptest::collection::btree_map(
            "[a-zA-Z0-9_.-]{1,20}",
            (1u16.., 1u32..100, 1u32..100),
            0..4,
        ),
    )
        .prop_map(
            |(port, ring_shift, groups, max_tracked, max_devices, buckets, targets)| Valid {
                port,
                ring_shift,
                groups,
                max_tracked,
                max_devices,
                buckets: buckets.into_iter().map(|b| f64::from(b) * 1e-6).collect(),
                targets: targets
                    .into_iter()
                    .map(|(name, (port, timeout, extra))| (name, port, timeout, timeout + extra))
                    .collect(),
            },
        )
}

fn render(v: &Valid) -> String {
    let groups: Vec<String> = v.groups.iter().map(|g| format!("{:?}", g.name())).collect();
    let buckets: Vec<String> = v.buckets.iter().map(|b| format!("{b:e}")).collect();
    let mut text = format!(
        "listen = \"127.0.0.1:{}\"\n\n[hooks]\ngroups = [{}]\nring_buffer_bytes = {}\n\n[limits]\nmax_tracked_qps = {}\nmax_device_labels = {}\n\n[buckets]\ncall_latency = [{}]\n",
        v.port,
        groups.join(", "),
        1u64 << v.ring_shift,
        v.max_tracked,
        v.max_devices,
        buckets.join(", "),
    );
    for (name, port, timeout, interval) in &v.targets {
        text.push_str(&format!(
            "\n[[targets]]\nname = \"{name}\"\naddress = \"198.18.0.1:{port}\"\ntimeout_seconds = {timeout}\ninterval_seconds = {interval}\n"
        ));
    }
    text
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary text (often not TOML at all): no panic; errors point into the text.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        if let Err(e) = parse(&text) {
            check_origin(&text, &e)?;
        }
    }

    /// TOML-looking text built from the real keys and random values.
    #[test]
    fn key_soup_never_panics(lines in proptest::collection::vec(
        (
            prop_oneof![
                Just("listen"), Just("log_level"), Just("log_format"), Just("[hooks]"), Just("[probes]"),
                Just("groups"), Just("ring_buffer_bytes"), Just("[limits]"), Just("max_tracked_qps"),
                Just("[buckets]"), Just("dwell"), Just("[[targets]]"), Just("name"), Just("address"),
                Just("timeout_seconds"), Just("interval_seconds"), Just("jitter"), Just("[responder]"),
            ],
            prop_oneof![
                Just("= 1".to_owned()), Just("= -1".to_owned()), Just("= 4096".to_owned()),
                Just("= \"x\"".to_owned()), Just("= [1, 0.5]".to_owned()), Just("= [\"qp\"]".to_owned()),
                Just("= 1e999".to_owned()), Just("= nan".to_owned()), Just("= \"é€\"".to_owned()),
                "= \\PC{0,12}".prop_map(|s| s),
                Just(String::new()),
            ],
        ),
        0..12,
    )) {
        let text: String = lines
            .iter()
            .map(|(k, v)| if k.starts_with('[') { format!("{k}\n") } else { format!("{k} {v}\n") })
            .collect();
        if let Err(e) = parse(&text) {
            check_origin(&text, &e)?;
        }
    }

    /// A generated valid file parses to exactly its values.
    #[test]
    fn valid_files_parse_to_their_values(v in valid()) {
        let text = render(&v);
        let s = match parse(&text) {
            Ok(s) => s,
            Err(e) => return Err(TestCaseError::fail(format!("{e}\n{text}"))),
        };
        prop_assert_eq!(s.listen, SocketAddr::from(([127, 0, 0, 1], v.port)));
        prop_assert_eq!(&s.groups, &v.groups);
        prop_assert_eq!(s.ring_buffer_bytes, 1u32 << v.ring_shift);
        prop_assert_eq!(s.limits.max_tracked_qps as i64, v.max_tracked);
        prop_assert_eq!(s.limits.max_device_labels as i64, v.max_devices);
        prop_assert_eq!(&s.buckets.call_latency, &v.buckets);
        prop_assert_eq!(s.targets.len(), v.targets.len());
        for (t, (name, port, timeout, interval)) in s.targets.iter().zip(&v.targets) {
            prop_assert_eq!(&t.name, name);
            prop_assert_eq!(t.address.port(), *port);
            prop_assert_eq!(t.timeout, Duration::from_secs(u64::from(*timeout)));
            prop_assert_eq!(t.interval, Duration::from_secs(u64::from(*interval)));
        }
    }

    /// Replacing one value by an out-of-range one is rejected at that key and line.
    #[test]
    fn out_of_range_values_are_rejected_at_their_line(
        v in valid(),
        which in 0usize..3,
        bad_ring in prop_oneof![0i64..4096, 4097i64..8191, Just(3 << 20), Just(1i64 << 31)],
        bad_count in prop_oneof![Just(0i64), -1000i64..0, Just((1 << 24) + 1)],
    ) {
        let text = render(&v);
        let (key, line_prefix, replacement) = match which {
            0 => ("hooks.ring_buffer_bytes", "ring_buffer_bytes = ", bad_ring.to_string()),
            1 => ("limits.max_tracked_qps", "max_tracked_qps = ", bad_count.to_string()),
            _ => ("listen", "listen = ", "\"127.0.0.1\"".to_owned()),
        };
        let line_no = text.lines().position(|l| l.starts_with(line_prefix)).unwrap() + 1;
        let bad: String = text
            .lines()
            .map(|l| if l.starts_with(line_prefix) { format!("{line_prefix}{replacement}\n") } else { format!("{l}\n") })
            .collect();
        let e = match parse(&bad) {
            Ok(_) => return Err(TestCaseError::fail(format!("accepted:\n{bad}"))),
            Err(e) => e,
        };
        prop_assert_eq!(&e.key, key);
        let is_at_line = matches!(e.origin, Origin::File { line, .. } if line == line_no);
        prop_assert!(is_at_line, "{} not at line {}", e, line_no);
    }

    /// One byte of a valid file changed: parsed or rejected, never a panic,
    /// and whatever parses still satisfies the checks.
    #[test]
    fn mutated_valid_files_never_panic(v in valid(), at in any::<proptest::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = render(&v).into_bytes();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        let Ok(text) = String::from_utf8(bytes) else { return Ok(()) };
        match parse(&text) {
            Ok(s) => {
                prop_assert!(s.ring_buffer_bytes.is_power_of_two() && s.ring_buffer_bytes >= 4096);
                prop_assert!(check_buckets(&s.buckets.call_latency).is_ok());
                prop_assert!(s.limits.max_tracked_qps >= 1 && !s.groups.is_empty());
            }
            Err(e) => check_origin(&text, &e)?,
        }
    }
}
