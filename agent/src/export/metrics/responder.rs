//! The probe responder: its connections, the requests it refused, the
//! messages it echoed and those it dropped.

use crate::export::registry::{IntCounter, IntCounterVec, IntGauge};
use rdma_probe::{MalformedProbe, ResponderStats};

use super::Registrar;

/// Why the responder refused a connect request (a bounded label).
pub const REFUSED_REASONS: [&str; 3] = ["not_allowed", "max_connections", "per_source"];

/// Why the responder closed a connection (a bounded label).
pub const CLOSED_REASONS: [&str; 3] = ["peer", "timeout", "error"];

#[derive(Clone)]
pub struct ResponderMetrics {
    connections: IntCounterVec,
    refused: IntCounterVec,
    closed: IntCounterVec,
    malformed: IntCounterVec,
    echoes: IntCounter,
    active: IntGauge,
}

impl ResponderMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        let metrics = Self {
            connections: r.counter_vec(
                "qpwatch_responder_connections_total",
                "Probe responder connections: requested, rejected, established, closed.",
                &["event"],
            ),
            refused: r.counter_vec(
                "qpwatch_responder_refused_total",
                "Connect requests the probe responder refused: not_allowed (source outside responder.allow), max_connections, per_source (responder.max_connections_per_source).",
                &["reason"],
            ),
            closed: r.counter_vec(
                "qpwatch_responder_closed_total",
                "Probe responder connections closed: peer (it disconnected), timeout (not established in time, or idle), error.",
                &["reason"],
            ),
            malformed: r.counter_vec(
                "qpwatch_responder_malformed_total",
                "Messages the probe responder dropped, not probes: short (below the header), magic (not a probe's), too_long (above the receive buffer: the connection is closed).",
                &["reason"],
            ),
            echoes: r.counter(
                "qpwatch_responder_echoes_total",
                "Probe messages the responder echoed.",
            ),
            active: r.gauge(
                "qpwatch_responder_active_connections",
                "Probe responder connections open now.",
            ),
        };
        for reason in REFUSED_REASONS {
            metrics.refused.with_label_values(&[reason]);
        }
        for reason in CLOSED_REASONS {
            metrics.closed.with_label_values(&[reason]);
        }
        for reason in MalformedProbe::ALL {
            metrics.malformed.with_label_values(&[reason.as_str()]);
        }
        metrics
    }

    /// Adds the responder's counters since `before`.
    pub fn stats(&self, before: &ResponderStats, now: &ResponderStats) {
        let add = |family: &IntCounterVec, label: &str, b: u64, n: u64| {
            family
                .with_label_values(&[label])
                .inc_by(n.saturating_sub(b));
        };
        for (event, b, n) in [
            ("requested", before.connect_requests, now.connect_requests),
            ("rejected", before.rejected, now.rejected),
            ("established", before.established, now.established),
            ("closed", before.closed, now.closed),
        ] {
            add(&self.connections, event, b, n);
        }
        for (reason, b, n) in [
            (
                "not_allowed",
                before.refused_not_allowed,
                now.refused_not_allowed,
            ),
            (
                "max_connections",
                before.refused_max_connections,
                now.refused_max_connections,
            ),
            (
                "per_source",
                before.refused_per_source,
                now.refused_per_source,
            ),
        ] {
            add(&self.refused, reason, b, n);
        }
        for (reason, b, n) in [
            ("peer", before.closed_by_peer, now.closed_by_peer),
            ("timeout", before.closed_timeout, now.closed_timeout),
            ("error", before.closed_error, now.closed_error),
        ] {
            add(&self.closed, reason, b, n);
        }
        for reason in MalformedProbe::ALL {
            add(
                &self.malformed,
                reason.as_str(),
                before.malformed(reason),
                now.malformed(reason),
            );
        }
        self.echoes.inc_by(now.echoes.saturating_sub(before.echoes));
        self.active.set(now.active as i64);
    }
}
