//! Tests of the families through [`Metrics`]: observations in, exposition out.

use super::*;
use crate::kernel::rdma::{QpState, QpType};
use qpwatch_common::QpOrigin;
use rdma_probe::mesh::{Answer, Clock};
use std::{sync::Arc, time::Duration};

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn observations_land_in_the_exposition() {
    let mut m = Metrics::new(&Buckets::default(), "6.1.0-test");
    m.observe(Observation::Created {
        device: Arc::from("rxe0"),
        qp_type: QpType::Rc,
        origin: QpOrigin::User,
        comm: Arc::from("rping"),
        cgroup: Arc::from("/system.slice/rping.service"),
        duration: Duration::from_micros(30),
    });
    m.observe(Observation::Transition {
        from: Some(QpState::Reset),
        to: QpState::Init,
        duration: Duration::from_micros(3),
    });
    m.observe(Observation::LiveQps {
        device: Arc::from("rxe0"),
        qp_type: QpType::Rc,
        state: QpState::Init,
        delta: 1,
    });
    m.observe(Observation::ModifyFailed {
        to: None,
        errno: -22,
    });
    let text = render(&m.registry);
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qp_created_total{device="rxe0",origin="user",qp_type="RC"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qp_transition_duration_seconds_count{from="RESET",to="INIT"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qp_transition_duration_seconds_bucket{from="RESET",to="INIT",le="0.000005"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qps{device="rxe0",qp_type="RC",state="INIT"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qp_modify_errors_total{errno="EINVAL",to="unchanged"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!(
                r#"qpwatch_build_info{{dirty="{}",kernel="6.1.0-test",revision="{}",version="0.1.0"}}"#,
                env!("QPWATCH_GIT_DIRTY"),
                env!("QPWATCH_GIT_REVISION")
            )
        ),
        Some(1.0)
    );
}

/// Series looked up once and kept: the same figures as through the family,
/// per device, type and state, in every clone, and no series before its
/// first observation.
#[test]
fn events_received_count_per_kind_across_clones() {
    let m = Metrics::new(&Buckets::default(), "6.1.0-test");
    let clone = m.events.clone();
    assert!(!render(&m.registry).contains("qpwatch_events_total{"));
    for _ in 0..3 {
        m.events.received("qp_modify");
    }
    clone.received("qp_modify");
    clone.received("cm");
    m.events.received("not_a_kind");
    let text = render(&m.registry);
    let received = |kind: &str| value(&text, &format!(r#"qpwatch_events_total{{kind="{kind}"}}"#));
    assert_eq!(received("qp_modify"), Some(4.0));
    assert_eq!(received("cm"), Some(1.0));
    assert_eq!(received("not_a_kind"), Some(1.0));
    assert_eq!(
        received("qp_create"),
        None,
        "no series before its first event"
    );
}

#[test]
fn resolved_series_count_like_the_family() {
    let m = Metrics::new(&Buckets::default(), "6.1.0-test");
    let clone = m.qp.clone();
    assert!(!render(&m.registry).contains("qpwatch_qps{"));
    m.qp.live("rxe0", QpType::Rc, QpState::Init, 1);
    clone.live("rxe0", QpType::Rc, QpState::Init, 1);
    m.qp.live("rxe0", QpType::Ud, QpState::Init, 1);
    m.qp.live("mlx5_0", QpType::Rc, QpState::Init, 1);
    clone.live("rxe0", QpType::Rc, QpState::Init, -1);
    m.qp.live("rxe0", QpType::Rc, QpState::Rts, 1);
    for _ in 0..3 {
        clone.transition(Some(QpState::Init), QpState::Rtr, Duration::from_micros(5));
    }
    m.qp.transition(None, QpState::Rtr, Duration::from_micros(5));
    m.qp.dwell(QpState::Sqd, Duration::from_secs(2));
    let text = render(&m.registry);
    let qps = |labels: &str| value(&text, &format!("qpwatch_qps{{{labels}}}"));
    assert_eq!(qps(r#"device="rxe0",qp_type="RC",state="INIT""#), Some(1.0));
    assert_eq!(qps(r#"device="rxe0",qp_type="UD",state="INIT""#), Some(1.0));
    assert_eq!(
        qps(r#"device="mlx5_0",qp_type="RC",state="INIT""#),
        Some(1.0)
    );
    assert_eq!(qps(r#"device="rxe0",qp_type="RC",state="RTS""#), Some(1.0));
    assert_eq!(text.matches("qpwatch_qps{").count(), 4, "{text}");
    let transitions = |from: &str| {
        value(
            &text,
            &format!(r#"qpwatch_qp_transition_duration_seconds_count{{from="{from}",to="RTR"}}"#),
        )
    };
    assert_eq!(transitions("INIT"), Some(3.0));
    assert_eq!(transitions("unknown"), Some(1.0));
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qp_state_dwell_seconds_count{state="SQD"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn the_process_collector_is_registered() {
    let m = Metrics::new(&Buckets::default(), "k");
    let text = render(&m.registry);
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.contains(&format!("\n{name} ")), "{name} missing");
    }
}

#[test]
fn lost_events_add_up() {
    let m = Metrics::new(&Buckets::default(), "k");
    let text = render(&m.registry);
    assert_eq!(
        value(
            &text,
            r#"qpwatch_events_lost_total{reason="ring_buffer_full"}"#
        ),
        Some(0.0),
        "exported at zero from the start"
    );
    m.events.add_lost([5, 0, 1, 0, 0]);
    m.events.add_lost([2, 0, 0, 0, 0]);
    let text = render(&m.registry);
    assert_eq!(
        value(
            &text,
            r#"qpwatch_events_lost_total{reason="ring_buffer_full"}"#
        ),
        Some(7.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_events_lost_total{reason="unmatched_return"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn process_and_cm_error_counters() {
    let mut m = Metrics::new(&Buckets::default(), "k");
    m.observe(Observation::Created {
        device: Arc::from("rxe0"),
        qp_type: QpType::Rc,
        origin: QpOrigin::Kernel,
        comm: Arc::from("kworker/u4:1"),
        cgroup: Arc::from("/"),
        duration: Duration::from_micros(30),
    });
    for event in ["REJECTED", "ESTABLISHED"] {
        m.observe(Observation::CmEvent {
            event,
            status: Arc::from("0"),
            duration: Duration::from_micros(5),
            result: 0,
        });
    }
    let text = render(&m.registry);
    assert_eq!(
        value(
            &text,
            r#"qpwatch_qp_created_by_process_total{comm="kworker/u4:1"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"qpwatch_qp_created_by_cgroup_total{cgroup="/"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"qpwatch_cm_errors_total{event="REJECTED"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"qpwatch_cm_errors_total{event="ESTABLISHED"}"#),
        None
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_cm_events_total{event="ESTABLISHED",status="0"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn hook_statuses_are_exported_per_hook() {
    use crate::kernel::hooks::HookStatus;
    let m = Metrics::new(&Buckets::default(), "k");
    let status = |hook: &str, status| (hook.to_owned(), status);
    m.hooks.set_statuses(&[
        status("kprobe:_ib_modify_qp", HookStatus::Attached),
        status("kprobe:rdma_listen", HookStatus::Detached("gone".into())),
    ]);
    let text = render(&m.registry);
    assert_eq!(
        value(
            &text,
            r#"qpwatch_hook_attached{hook="kprobe:_ib_modify_qp"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"qpwatch_hook_attached{hook="kprobe:rdma_listen"}"#),
        Some(0.0)
    );
    // a group switched off: its hooks' series go away
    m.hooks
        .set_statuses(&[status("kprobe:rdma_listen", HookStatus::Disabled)]);
    let text = render(&m.registry);
    assert_eq!(
        value(&text, r#"qpwatch_hook_attached{hook="kprobe:rdma_listen"}"#),
        None
    );
    assert!(!text.contains("qpwatch_probe_attached"));
}

#[test]
fn mesh_targets_have_series_from_added_to_removed() {
    let labels = ["rack".to_owned(), "tor".to_owned()];
    let m = Metrics::with_target_labels(&Buckets::default(), "k", &labels);
    let text = render(&m.registry);
    assert!(
        !text.contains("qpwatch_mesh_qps"),
        "no series before fleet mode"
    );
    assert!(!text.contains("qpwatch_mesh_targets_file_ok"));

    let a: Arc<str> = Arc::from("198.18.0.2");
    let b: Arc<str> = Arc::from("peer3");
    let rack = std::collections::BTreeMap::from([
        ("rack".to_owned(), "r1".to_owned()),
        ("zone".to_owned(), "ignored".to_owned()),
    ]);
    m.mesh.started();
    m.mesh.add_target(&a, &rack);
    m.mesh.add_target(&b, &Default::default());
    let a_series = r#"{rack="r1",target="198.18.0.2",tor=""}"#;
    let text = render(&m.registry);
    for family in [
        "qpwatch_mesh_probes_sent_total",
        "qpwatch_mesh_probes_answered_total",
        "qpwatch_mesh_probes_lost_total",
        "qpwatch_mesh_probe_rtt_seconds_count",
        "qpwatch_mesh_target_resolved",
    ] {
        assert_eq!(
            value(&text, &format!("{family}{a_series}")),
            Some(0.0),
            "{family}"
        );
    }
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_probes_sent_total{rack="",target="peer3",tor=""}"#
        ),
        Some(0.0)
    );
    assert_eq!(value(&text, "qpwatch_mesh_qps"), Some(0.0));
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_messages_dropped_total{reason="no_return_path"}"#
        ),
        Some(0.0)
    );

    m.mesh.sent(&a);
    m.mesh.sent(&a);
    m.mesh.answered(&a, &answer(900_000, 0, Some(20_000)));
    m.mesh.lost(&a);
    m.mesh.send_failed(&a);
    m.mesh.resolved(&a);
    m.mesh.resolve_failed(&b, "unreachable");
    m.mesh.responded("rxe0");
    m.mesh.dropped(rdma_probe::mesh::Dropped::Malformed);
    m.mesh.sent("removed-already");
    m.mesh.targets(mesh::TargetSource::File, 2);
    m.mesh.targets_file_read(false);
    m.mesh.qps(1);
    let text = render(&m.registry);
    assert_eq!(
        value(&text, &format!("qpwatch_mesh_probes_sent_total{a_series}")),
        Some(3.0)
    );
    assert_eq!(
        value(&text, &format!("qpwatch_mesh_probes_lost_total{a_series}")),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            &format!("qpwatch_mesh_probes_answered_total{a_series}")
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            &format!("qpwatch_mesh_probe_rtt_seconds_count{a_series}")
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, &format!("qpwatch_mesh_target_resolved{a_series}")),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_resolve_failures_total{reason="unreachable",target="peer3"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"qpwatch_mesh_responses_total{device="rxe0"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_messages_dropped_total{reason="malformed"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"qpwatch_mesh_targets{source="file"}"#),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_targets_file_reloads_total{result="error"}"#
        ),
        Some(1.0)
    );
    assert_eq!(value(&text, "qpwatch_mesh_targets_file_ok"), Some(0.0));
    assert_eq!(value(&text, "qpwatch_mesh_qps"), Some(1.0));
    assert!(!text.contains("removed-already"));

    // re-adding with the same labels keeps the counts; other labels restart them
    m.mesh.add_target(&a, &rack);
    let text = render(&m.registry);
    assert_eq!(
        value(&text, &format!("qpwatch_mesh_probes_sent_total{a_series}")),
        Some(3.0)
    );
    m.mesh.add_target(&a, &Default::default());
    let text = render(&m.registry);
    assert_eq!(
        value(&text, &format!("qpwatch_mesh_probes_sent_total{a_series}")),
        None
    );
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_probes_sent_total{rack="",target="198.18.0.2",tor=""}"#
        ),
        Some(0.0)
    );

    m.mesh.remove_target(&a);
    m.mesh.remove_target(&b);
    m.mesh.stopped();
    m.mesh.targets_file_unconfigured();
    let text = render(&m.registry);
    assert!(
        !text.contains("198.18.0.2"),
        "removed targets leave no series"
    );
    assert!(!text.contains("peer3"));
    assert!(!text.contains("qpwatch_mesh_qps "));
    assert!(!text.contains("qpwatch_mesh_targets_file_ok "));
}

/// An answer after `rtt_ns`, `responder_ns` of it in the responder.
fn answer(rtt_ns: u64, responder_ns: u64, prober_delay_ns: Option<u64>) -> Answer {
    Answer {
        seq: 1,
        sent_ns: 1_000_000,
        received_ns: 1_000_000 + rtt_ns,
        responder_rx_ns: 5_000_000_000,
        responder_tx_ns: 5_000_000_000 + responder_ns,
        prober_delay_ns,
        clock: Clock::Software,
    }
}

#[test]
fn mesh_rtt_breakdown_per_target() {
    let labels = ["rack".to_owned()];
    let m = Metrics::with_target_labels(&Buckets::default(), "k", &labels);
    let a: Arc<str> = Arc::from("198.18.0.2");
    let rack = std::collections::BTreeMap::from([("rack".to_owned(), "r1".to_owned())]);
    m.mesh.add_target(&a, &rack);
    let series = r#"{rack="r1",target="198.18.0.2"}"#;
    let software = r#"{clock="software",rack="r1",target="198.18.0.2"}"#;
    let text = render(&m.registry);
    for family in [
        "qpwatch_mesh_responder_delay_seconds_count",
        "qpwatch_mesh_responder_times_rejected_total",
        "qpwatch_mesh_responder_delay_clamped_total",
    ] {
        assert_eq!(
            value(&text, &format!("{family}{series}")),
            Some(0.0),
            "{family}"
        );
    }
    for family in [
        "qpwatch_mesh_probe_network_rtt_seconds_count",
        "qpwatch_mesh_prober_delay_seconds_count",
    ] {
        assert_eq!(
            value(&text, &format!("{family}{software}")),
            Some(0.0),
            "{family}"
        );
    }
    assert!(!text.contains("clock=\"device\""), "only the clock in use");

    // 100 µs RTT: 30 µs in the responder, 70 µs network; prober 12 µs
    m.mesh.answered(&a, &answer(100_000, 30_000, Some(12_000)));
    // the responder claims more than the RTT: all of it is the host's
    m.mesh.answered(&a, &answer(100_000, 150_000, Some(5_000)));
    // not measured: no prober delay
    m.mesh.answered(&a, &answer(100_000, 30_000, None));
    // impossible: answered before it was received; the RTT counts, not the parts
    let impossible = Answer {
        responder_tx_ns: 4_999_999_000,
        ..answer(100_000, 0, None)
    };
    m.mesh.answered(&a, &impossible);
    let text = render(&m.registry);
    let get = |family: &str, labels: &str| value(&text, &format!("{family}{labels}"));
    assert_eq!(
        get("qpwatch_mesh_probe_rtt_seconds_count", series),
        Some(4.0)
    );
    assert_eq!(
        get("qpwatch_mesh_probe_network_rtt_seconds_count", software),
        Some(3.0)
    );
    assert_eq!(
        get("qpwatch_mesh_probe_network_rtt_seconds_sum", software),
        Some(140e-6)
    );
    assert_eq!(
        get(
            "qpwatch_mesh_probe_network_rtt_seconds_bucket",
            r#"{clock="software",rack="r1",target="198.18.0.2",le="0.000075"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        get("qpwatch_mesh_responder_delay_seconds_count", series),
        Some(3.0)
    );
    assert_eq!(
        get("qpwatch_mesh_responder_delay_seconds_sum", series),
        Some(160e-6)
    );
    assert_eq!(
        get(
            "qpwatch_mesh_responder_delay_seconds_bucket",
            r#"{rack="r1",target="198.18.0.2",le="0.00003"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        get("qpwatch_mesh_responder_times_rejected_total", series),
        Some(1.0)
    );
    assert_eq!(
        get("qpwatch_mesh_responder_delay_clamped_total", series),
        Some(1.0)
    );
    assert_eq!(
        get("qpwatch_mesh_prober_delay_seconds_count", software),
        Some(2.0)
    );
    assert_eq!(
        get(
            "qpwatch_mesh_prober_delay_seconds_bucket",
            r#"{clock="software",rack="r1",target="198.18.0.2",le="0.000005"}"#
        ),
        Some(1.0)
    );

    // another clock gets series of its own, removed with the target's
    let device = Answer {
        clock: Clock::Device,
        ..answer(50_000, 10_000, Some(1_000))
    };
    m.mesh.answered(&a, &device);
    let text = render(&m.registry);
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_probe_network_rtt_seconds_count{clock="device",rack="r1",target="198.18.0.2"}"#
        ),
        Some(1.0)
    );
    m.mesh.remove_target(&a);
    let text = render(&m.registry);
    assert!(!text.contains("198.18.0.2"), "{text}");
}

#[test]
fn mesh_rtt_breakdown_off_leaves_no_series() {
    let m = Metrics::new(&Buckets::default(), "k");
    let a: Arc<str> = Arc::from("peer2");
    let b: Arc<str> = Arc::from("peer3");
    let breakdown_families = [
        "qpwatch_mesh_probe_network_rtt_seconds",
        "qpwatch_mesh_responder_delay_seconds",
        "qpwatch_mesh_prober_delay_seconds",
        "qpwatch_mesh_responder_times_rejected_total",
        "qpwatch_mesh_responder_delay_clamped_total",
    ];
    let none_left = |text: &str| breakdown_families.iter().all(|f| !text.contains(f));
    m.mesh.add_target(&a, &Default::default());
    m.mesh.set_rtt_breakdown(false);
    m.mesh.add_target(&b, &Default::default());
    m.mesh.answered(&a, &answer(100_000, 30_000, Some(12_000)));
    m.mesh.answered(&b, &answer(100_000, 300_000, None));
    let text = render(&m.registry);
    assert!(none_left(&text), "{text}");
    assert_eq!(
        value(
            &text,
            r#"qpwatch_mesh_probe_rtt_seconds_count{target="peer2"}"#
        ),
        Some(1.0)
    );

    // on again: every target's series from 0
    m.mesh.set_rtt_breakdown(true);
    let text = render(&m.registry);
    for target in ["peer2", "peer3"] {
        assert_eq!(
            value(
                &text,
                &format!(r#"qpwatch_mesh_responder_delay_seconds_count{{target="{target}"}}"#)
            ),
            Some(0.0)
        );
    }
    m.mesh.set_rtt_breakdown(false);
    assert!(none_left(&render(&m.registry)));
}

// README.md and the registry agree.

const README: &str = include_str!("../../../../README.md");

/// Every family, the sysfs counters (registered by the daemon, not by
/// `Metrics::new`) included.
fn all_families() -> Vec<String> {
    let mut m = Metrics::new(&Buckets::default(), "k");
    m.register_sysfs_counters("/nonexistent", 1, std::time::Duration::from_secs(5))
        .expect("registered once");
    m.families()
}

/// The README's `## Metrics` section, up to the next `## ` heading.
fn metrics_section() -> &'static str {
    let start = README
        .find("\n## Metrics\n")
        .expect("README.md has a ## Metrics section")
        + 1;
    let end = README[start + 1..]
        .find("\n## ")
        .map_or(README.len(), |i| start + 1 + i);
    &README[start..end]
}

/// The `qpwatch_*` names in `text`, each with whether it is a prefix (it
/// ends in `_`, or a `*` follows: `qpwatch_bpf_program_*`). Recording rules
/// (`instance:qpwatch_...:rate5m`, `qpwatch:...`) are not metric names, and
/// neither is the package's file name (`qpwatch_0.1.0_amd64.deb`): a
/// metric's name goes on with a letter.
fn mentioned(text: &str) -> Vec<(&str, bool)> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("qpwatch_") {
        let start = from + i;
        let end = text[start..]
            .find(|c: char| !is_name(c))
            .map_or(text.len(), |j| start + j);
        from = end;
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| is_name(c) || c == ':')
            || text[end..].starts_with(':')
            || text[start + "qpwatch_".len()..].starts_with(|c: char| c.is_ascii_digit())
        {
            continue;
        }
        let name = &text[start..end];
        names.push((name, name.ends_with('_') || text[end..].starts_with('*')));
    }
    names
}

#[test]
fn every_metric_the_readme_names_is_registered() {
    let families = all_families();
    let registered = |name: &str| families.iter().any(|f| f == name);
    let unknown: Vec<&str> = mentioned(README)
        .into_iter()
        .filter(|&(name, prefix)| {
            if prefix {
                return !families.iter().any(|f| f.starts_with(name));
            }
            // a histogram's series
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            !registered(name) && !registered(base)
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        unknown.is_empty(),
        "README.md names metrics that are not registered: {unknown:?}"
    );
}

#[test]
fn every_registered_family_has_a_row_in_the_readme_metrics_table() {
    // first cells of the section's table rows: "| `qpwatch_qps` | gauge ..."
    let rows: Vec<&str> = metrics_section()
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split('`').next())
        .collect();
    let missing: Vec<String> = all_families()
        .into_iter()
        .filter(|family| {
            !rows.iter().any(|row| match row.strip_suffix('*') {
                Some(prefix) => family.starts_with(prefix),
                None => row == family,
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "registered, but without a row in README.md's Metrics table: {missing:?}"
    );
}

#[test]
fn the_readme_scan_finds_names_prefixes_and_skips_recording_rules() {
    let text = "`qpwatch_qps{state}` and `qpwatch_bpf_program_*`, the `qpwatch_` prefix, \
                `instance:qpwatch_qp_created:rate5m`, `qpwatch:x`, myqpwatch_y, \
                ./target/debian/qpwatch_0.1.0_amd64.deb";
    assert_eq!(
        mentioned(text),
        [
            ("qpwatch_qps", false),
            ("qpwatch_bpf_program_", true),
            ("qpwatch_", true)
        ]
    );
}

/// A sysfs read that hangs (here: a FIFO with no writer, whose open blocks)
/// holds up neither the agent's start nor its scrapes: the sysfs series are
/// missing until a read completes.
#[test]
fn a_hanging_sysfs_read_holds_up_neither_start_nor_scrapes() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("rxe0/ports/1/hw_counters");
    std::fs::create_dir_all(&hw).unwrap();
    let fifo = hw.join("sent_pkts");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let (done, started) = std::sync::mpsc::channel();
    let root = dir.path().to_owned();
    std::thread::spawn(move || {
        let mut m = Metrics::new(&Buckets::default(), "k");
        m.register_sysfs_counters(&root, 64, Duration::from_secs(5))
            .unwrap();
        done.send(render(&m.registry)).unwrap();
    });
    let text = started
        .recv_timeout(Duration::from_secs(10))
        .expect("start-up and a scrape while the read hangs");
    assert_eq!(value(&text, "qpwatch_sysfs_reads_total"), Some(0.0));
    assert!(!text.contains("qpwatch_port_hw_stats_total"), "{text}");
    // Let the reader go, if it is still there (it leaves without opening
    // the FIFO once the registry is gone): a writer that does not wait.
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo);
}
