//! The synthetic probes: their results, round-trip times, connection steps,
//! and the cross-check of their QP verb calls against the hooks.

use crate::export::registry::{HistogramVec, IntCounterVec, IntGaugeVec};
use rdma_probe::{ProbeOutcome, ProbeResult, Step};

use super::{Buckets, Registrar, PROBE_SKEW_BUCKETS};

#[derive(Clone)]
pub struct ProbeMetrics {
    rtt: HistogramVec,
    setup: HistogramVec,
    total: IntCounterVec,
    up: IntGaugeVec,
    skew: HistogramVec,
    unseen: IntCounterVec,
}

impl ProbeMetrics {
    pub fn new(r: &mut Registrar, buckets: &Buckets) -> Self {
        Self {
            rtt: r.histogram_vec(
                "qpwatch_probe_rtt_seconds",
                "Round-trip time of a synthetic probe's SEND/RECV ping-pong.",
                &["target"],
                &buckets.probe_rtt,
            ),
            setup: r.histogram_vec(
                "qpwatch_probe_setup_duration_seconds",
                "Latency of each connection step of a synthetic probe.",
                &["target", "step"],
                &buckets.call_latency,
            ),
            total: r.counter_vec(
                "qpwatch_probe_total",
                "Synthetic probes by result (ok, timeout, rejected, unreachable, addr_error, route_error, connect_error, error).",
                &["target", "result"],
            ),
            up: r.gauge_vec(
                "qpwatch_probe_up",
                "1 if the target's last probe succeeded, 0 if not.",
                &["target"],
            ),
            skew: r.histogram_vec(
                "qpwatch_probe_kernel_userspace_skew_seconds",
                "Probe QP verb calls: userspace-measured minus kernel-measured (eBPF) duration.",
                &["call"],
                PROBE_SKEW_BUCKETS,
            ),
            unseen: r.counter_vec(
                "qpwatch_probe_qps_unseen_total",
                "Probe QPs with a verb call the eBPF path did not see (the tracing self-test).",
                &["target"],
            ),
        }
    }

    /// Counts a probe and its latencies. A target's first probe exports all
    /// its result counters (and its unseen counter) at zero.
    pub fn outcome(&self, target: &str, outcome: &ProbeOutcome) {
        if self.total.with_label_values(&[target, "ok"]).get() == 0 {
            for result in ProbeResult::ALL {
                self.total.with_label_values(&[target, result.as_str()]);
            }
            self.unseen.with_label_values(&[target]);
        }
        self.total
            .with_label_values(&[target, outcome.result.as_str()])
            .inc();
        self.up
            .with_label_values(&[target])
            .set(i64::from(outcome.is_ok()));
        let rtt = self.rtt.with_label_values(&[target]);
        for sample in &outcome.rtts {
            rtt.observe(sample.as_secs_f64());
        }
        for (step, duration) in &outcome.steps {
            if *step != Step::Ping {
                self.setup
                    .with_label_values(&[target, step.as_str()])
                    .observe(duration.as_secs_f64());
            }
        }
    }

    /// Userspace minus kernel duration of one of a probe QP's verb calls.
    pub fn skew(&self, call: &str, seconds: f64) {
        self.skew.with_label_values(&[call]).observe(seconds);
    }

    /// Exports a target's unseen counter at zero (the mesh's, which has no
    /// probe outcomes).
    pub fn unseen_at_zero(&self, target: &str) {
        self.unseen.with_label_values(&[target]);
    }

    /// The unseen counter of a cross-check that is gone (fleet mode off).
    pub fn forget_unseen(&self, target: &str) {
        let _ = self.unseen.remove_label_values(&[target]);
    }

    /// A probe QP with a verb call the hooks did not see.
    pub fn qp_unseen(&self, target: &str) {
        self.unseen.with_label_values(&[target]).inc();
    }

    /// A target that was removed: its up gauge goes away.
    pub fn forget_target(&self, target: &str) {
        let _ = self.up.remove_label_values(&[target]);
    }
}
