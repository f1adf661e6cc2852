//! The UD probe mesh (fleet mode): per target, probes sent, answered and
//! lost, their round-trip times and the target's resolution; the responder's
//! answers and drops; the targets and the targets file.
//!
//! Per-target families carry `target` and the configured target labels
//! (`[mesh] target_labels`, fixed when the family is registered). A target's
//! series exist while it is probed: added at 0, removed with it. The RTT
//! breakdown's (network RTT, responder and prober delays, rejected
//! responder times) exist only while `[mesh] rtt_breakdown` is on; those
//! measured on our side also carry `clock`.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use crate::export::registry::{
    Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};
use rdma_probe::mesh::{Answer, Clock};

use super::{Buckets, Registrar, PROBE_DELAY_BUCKETS};

/// Why a target could not be resolved (a bounded label).
pub const RESOLVE_FAILURE_REASONS: [&str; 6] = [
    "addr_error",
    "route_error",
    "unreachable",
    "rejected",
    "timeout",
    "error",
];

/// Where a probed target came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSource {
    /// An inline `[[targets]]` with `mode = "ud"`.
    Config,
    /// The targets file.
    File,
    /// A remote peer of the host's live QPs (`[mesh] discover`).
    Discovered,
}

impl TargetSource {
    pub const ALL: [TargetSource; 3] = [
        TargetSource::Config,
        TargetSource::File,
        TargetSource::Discovered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TargetSource::Config => "config",
            TargetSource::File => "file",
            TargetSource::Discovered => "discovered",
        }
    }
}

/// One target's series, looked up by key on the mesh thread.
struct TargetSeries {
    /// `target` and the target labels' values, in the family's order.
    values: Vec<String>,
    sent: IntCounter,
    answered: IntCounter,
    lost: IntCounter,
    rtt: Histogram,
    resolved: IntGauge,
    breakdown: Option<BreakdownSeries>,
}

/// A target's RTT breakdown series; `clock="software"`, the clock the mesh
/// times with (another clock's series are made on its first answer).
struct BreakdownSeries {
    network_rtt: Histogram,
    responder_delay: Histogram,
    prober_delay: Histogram,
    rejected: IntCounter,
    clamped: IntCounter,
}

struct Series {
    targets: HashMap<Arc<str>, TargetSeries>,
    /// `[mesh] rtt_breakdown`.
    breakdown: bool,
}

#[derive(Clone)]
pub struct MeshMetrics {
    /// The target labels after `target`.
    target_labels: Arc<[String]>,
    sent: IntCounterVec,
    answered: IntCounterVec,
    lost: IntCounterVec,
    rtt: HistogramVec,
    resolved: IntGaugeVec,
    /// After the target labels: `clock`.
    network_rtt: HistogramVec,
    responder_delay: HistogramVec,
    /// After the target labels: `clock`.
    prober_delay: HistogramVec,
    rejected: IntCounterVec,
    clamped: IntCounterVec,
    resolve_failures: IntCounterVec,
    responses: IntCounterVec,
    dropped: IntCounterVec,
    targets: IntGaugeVec,
    file_reloads: IntCounterVec,
    /// No labels: a series only while a targets file is configured.
    file_ok: IntGaugeVec,
    /// No labels: a series only while the mesh runs.
    qps: IntGaugeVec,
    series: Arc<RwLock<Series>>,
}

impl MeshMetrics {
    /// `target_labels`: checked by the configuration (label names, not
    /// `target`, no duplicates).
    pub fn new(r: &mut Registrar, buckets: &Buckets, target_labels: &[String]) -> Self {
        let names: Vec<&str> = std::iter::once("target")
            .chain(target_labels.iter().map(String::as_str))
            .collect();
        let with_clock: Vec<&str> = names.iter().copied().chain(["clock"]).collect();
        Self {
            target_labels: target_labels.into(),
            sent: r.counter_vec(
                "qpwatch_mesh_probes_sent_total",
                "UD mesh probes sent to the target (a probe that could not be posted counts as sent and lost).",
                &names,
            ),
            answered: r.counter_vec(
                "qpwatch_mesh_probes_answered_total",
                "UD mesh probes the target answered within the timeout.",
                &names,
            ),
            lost: r.counter_vec(
                "qpwatch_mesh_probes_lost_total",
                "UD mesh probes with no answer within the timeout, or that could not be posted.",
                &names,
            ),
            rtt: r.histogram_vec(
                "qpwatch_mesh_probe_rtt_seconds",
                "Round-trip time of an answered UD mesh probe.",
                &names,
                &buckets.probe_rtt,
            ),
            resolved: r.gauge_vec(
                "qpwatch_mesh_target_resolved",
                "1 if the target's UD responder is resolved (address handle and QP number), 0 if not.",
                &names,
            ),
            network_rtt: r.histogram_vec(
                "qpwatch_mesh_probe_network_rtt_seconds",
                "RTT of an answered UD mesh probe less the responder's delay (with the software clock, the prober's own delay is still in it).",
                &with_clock,
                &buckets.probe_rtt,
            ),
            responder_delay: r.histogram_vec(
                "qpwatch_mesh_responder_delay_seconds",
                "Time a UD mesh probe spent in the target's responder (probe polled to answer posted), as the responder reports it.",
                &names,
                PROBE_DELAY_BUCKETS,
            ),
            prober_delay: r.histogram_vec(
                "qpwatch_mesh_prober_delay_seconds",
                "Time from posting a UD mesh probe to polling its send completion (the RTT if the answer was polled first).",
                &with_clock,
                PROBE_DELAY_BUCKETS,
            ),
            rejected: r.counter_vec(
                "qpwatch_mesh_responder_times_rejected_total",
                "Answers whose responder times cannot be (answer posted before the probe came): their RTT counts, not their network RTT and responder delay.",
                &names,
            ),
            clamped: r.counter_vec(
                "qpwatch_mesh_responder_delay_clamped_total",
                "Answers whose responder delay exceeded the whole RTT (the responder's estimate of its thread's run-queue wait counted time before the probe came): taken as the RTT, network RTT 0.",
                &names,
            ),
            resolve_failures: r.counter_vec(
                "qpwatch_mesh_resolve_failures_total",
                "Failed resolutions of a target (addr_error, route_error, unreachable, rejected, timeout, error); retried.",
                &["target", "reason"],
            ),
            responses: r.counter_vec(
                "qpwatch_mesh_responses_total",
                "UD mesh probes from peers this agent answered, by local device.",
                &["device"],
            ),
            dropped: r.counter_vec(
                "qpwatch_mesh_messages_dropped_total",
                "UD mesh messages not answered or not matched (malformed, unknown_answer, no_return_path, send_queue_full).",
                &["reason"],
            ),
            targets: r.gauge_vec(
                "qpwatch_mesh_targets",
                "Targets the mesh probes, by where they come from (config, file).",
                &["source"],
            ),
            file_reloads: r.counter_vec(
                "qpwatch_mesh_targets_file_reloads_total",
                "Reads of the changed targets file (ok; error: the last good list is kept).",
                &["result"],
            ),
            file_ok: r.gauge_vec(
                "qpwatch_mesh_targets_file_ok",
                "1 if the last read of the targets file was good, 0 if not (the last good list is probed).",
                &[],
            ),
            qps: r.gauge_vec(
                "qpwatch_mesh_qps",
                "UD QPs the mesh holds (one per local device in use).",
                &[],
            ),
            series: Arc::new(RwLock::new(Series {
                targets: HashMap::new(),
                breakdown: true,
            })),
        }
    }

    /// The target labels the per-target families carry after `target`.
    pub fn target_labels(&self) -> &[String] {
        &self.target_labels
    }

    /// The mesh runs: its counters exported at 0.
    pub fn started(&self) {
        for reason in rdma_probe::mesh::Dropped::ALL {
            self.dropped.with_label_values(&[reason.as_str()]);
        }
        self.qps.with_label_values::<&str>(&[]);
    }

    /// The mesh stopped (fleet mode off): the gauges go away.
    pub fn stopped(&self) {
        let _ = self.qps.remove_label_values::<&str>(&[]);
        for source in TargetSource::ALL {
            let _ = self.targets.remove_label_values(&[source.as_str()]);
        }
    }

    pub fn qps(&self, count: usize) {
        self.qps.with_label_values::<&str>(&[]).set(count as i64);
    }

    /// Starts a target's series at 0; `labels`: the target's labels, those
    /// not among the target labels ignored, a missing one empty.
    pub fn add_target(&self, key: &Arc<str>, labels: &BTreeMap<String, String>) {
        let values: Vec<String> = std::iter::once(key.to_string())
            .chain(
                self.target_labels
                    .iter()
                    .map(|name| labels.get(name).cloned().unwrap_or_default()),
            )
            .collect();
        let mut series = self.write();
        match series.targets.get(key) {
            Some(old) if old.values == values => return,
            Some(old) => self.remove_series(key, old),
            None => {}
        }
        let breakdown = series.breakdown.then(|| self.breakdown_series(&values));
        series.targets.insert(
            Arc::clone(key),
            TargetSeries {
                sent: self.sent.with_label_values(&values),
                answered: self.answered.with_label_values(&values),
                lost: self.lost.with_label_values(&values),
                rtt: self.rtt.with_label_values(&values),
                resolved: self.resolved.with_label_values(&values),
                breakdown,
                values,
            },
        );
    }

    /// Removes a target's series (the registry does not grow on churn).
    pub fn remove_target(&self, key: &Arc<str>) {
        if let Some(series) = self.write().targets.remove(key) {
            self.remove_series(key, &series);
        }
    }

    /// `[mesh] rtt_breakdown`: every target's breakdown series added at 0,
    /// or removed (on at start).
    pub fn set_rtt_breakdown(&self, on: bool) {
        let mut series = self.write();
        if series.breakdown == on {
            return;
        }
        series.breakdown = on;
        for target in series.targets.values_mut() {
            if on {
                target.breakdown = Some(self.breakdown_series(&target.values));
            } else if target.breakdown.take().is_some() {
                self.remove_breakdown(&target.values);
            }
        }
    }

    fn breakdown_series(&self, values: &[String]) -> BreakdownSeries {
        let with_clock = with_clock(values, Clock::Software);
        BreakdownSeries {
            network_rtt: self.network_rtt.with_label_values(&with_clock),
            responder_delay: self.responder_delay.with_label_values(values),
            prober_delay: self.prober_delay.with_label_values(&with_clock),
            rejected: self.rejected.with_label_values(values),
            clamped: self.clamped.with_label_values(values),
        }
    }

    fn remove_series(&self, key: &str, series: &TargetSeries) {
        let values = &series.values;
        let _ = self.sent.remove_label_values(values);
        let _ = self.answered.remove_label_values(values);
        let _ = self.lost.remove_label_values(values);
        let _ = self.rtt.remove_label_values(values);
        let _ = self.resolved.remove_label_values(values);
        if series.breakdown.is_some() {
            self.remove_breakdown(values);
        }
        for reason in RESOLVE_FAILURE_REASONS {
            let _ = self.resolve_failures.remove_label_values(&[key, reason]);
        }
    }

    fn remove_breakdown(&self, values: &[String]) {
        let _ = self.responder_delay.remove_label_values(values);
        let _ = self.rejected.remove_label_values(values);
        let _ = self.clamped.remove_label_values(values);
        for clock in Clock::ALL {
            let with_clock = with_clock(values, clock);
            let _ = self.network_rtt.remove_label_values(&with_clock);
            let _ = self.prober_delay.remove_label_values(&with_clock);
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Series> {
        self.series.write().expect("not poisoned")
    }

    /// Runs `f` on a target's series; a target no longer probed is ignored
    /// (a callback racing its removal).
    fn with(&self, key: &str, f: impl FnOnce(&TargetSeries)) {
        if let Some(series) = self.series.read().expect("not poisoned").targets.get(key) {
            f(series);
        }
    }

    pub fn sent(&self, key: &str) {
        self.with(key, |s| s.sent.inc());
    }

    /// A probe that could not be posted: sent and lost.
    pub fn send_failed(&self, key: &str) {
        self.with(key, |s| {
            s.sent.inc();
            s.lost.inc();
        });
    }

    /// An answer: its RTT and, with the breakdown on, its parts (a
    /// responder whose times cannot be is counted instead of its parts).
    pub fn answered(&self, key: &str, answer: &Answer) {
        self.with(key, |s| {
            s.answered.inc();
            s.rtt.observe(answer.rtt().as_secs_f64());
            let Some(b) = &s.breakdown else {
                return;
            };
            let other_clock;
            let (network_rtt, prober_delay) = match answer.clock {
                Clock::Software => (&b.network_rtt, &b.prober_delay),
                clock => {
                    let with_clock = with_clock(&s.values, clock);
                    other_clock = (
                        self.network_rtt.with_label_values(&with_clock),
                        self.prober_delay.with_label_values(&with_clock),
                    );
                    (&other_clock.0, &other_clock.1)
                }
            };
            if answer.responder_times_fit() {
                network_rtt.observe(answer.network_rtt().as_secs_f64());
                b.responder_delay
                    .observe(answer.responder_delay().as_secs_f64());
                if answer.responder_delay_clamped() {
                    b.clamped.inc();
                }
            } else {
                b.rejected.inc();
            }
            if let Some(delay) = answer.prober_delay() {
                prober_delay.observe(delay.as_secs_f64());
            }
        });
    }

    pub fn lost(&self, key: &str) {
        self.with(key, |s| s.lost.inc());
    }

    pub fn resolved(&self, key: &str) {
        self.with(key, |s| s.resolved.set(1));
    }

    /// `reason`: one of [`RESOLVE_FAILURE_REASONS`].
    pub fn resolve_failed(&self, key: &str, reason: &str) {
        self.with(key, |s| {
            s.resolved.set(0);
            self.resolve_failures
                .with_label_values(&[key, reason])
                .inc();
        });
    }

    pub fn responded(&self, device: &str) {
        self.responses.with_label_values(&[device]).inc();
    }

    pub fn dropped(&self, reason: rdma_probe::mesh::Dropped) {
        self.dropped.with_label_values(&[reason.as_str()]).inc();
    }

    pub fn targets(&self, source: TargetSource, count: usize) {
        self.targets
            .with_label_values(&[source.as_str()])
            .set(count as i64);
    }

    /// A read of the changed targets file.
    pub fn targets_file_read(&self, ok: bool) {
        self.file_reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
        self.file_ok
            .with_label_values::<&str>(&[])
            .set(i64::from(ok));
    }

    /// A targets file is configured: both results exported at 0.
    pub fn targets_file_configured(&self) {
        for result in ["ok", "error"] {
            self.file_reloads.with_label_values(&[result]);
        }
    }

    /// No targets file configured: its gauge goes away.
    pub fn targets_file_unconfigured(&self) {
        let _ = self.file_ok.remove_label_values::<&str>(&[]);
    }
}

/// A target's label values and `clock`.
fn with_clock(values: &[String], clock: Clock) -> Vec<&str> {
    values
        .iter()
        .map(String::as_str)
        .chain([clock.as_str()])
        .collect()
}
