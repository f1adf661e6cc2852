//! The probe responder: its connections and the messages it echoed.

use prometheus::{IntCounter, IntCounterVec, IntGauge};
use rdma_probe::ResponderStats;

use super::Registrar;

#[derive(Clone)]
pub struct ResponderMetrics {
    connections: IntCounterVec,
    echoes: IntCounter,
    active: IntGauge,
}

impl ResponderMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        Self {
            connections: r.counter_vec(
                "qpwatch_responder_connections_total",
                "Probe responder connections: requested, rejected, established, closed.",
                &["event"],
            ),
            echoes: r.counter(
                "qpwatch_responder_echoes_total",
                "Probe messages the responder echoed.",
            ),
            active: r.gauge(
                "qpwatch_responder_active_connections",
                "Probe responder connections open now.",
            ),
        }
    }

    /// Adds the responder's counters since `before`.
    pub fn stats(&self, before: &ResponderStats, now: &ResponderStats) {
        for (event, b, n) in [
            ("requested", before.connect_requests, now.connect_requests),
            ("rejected", before.rejected, now.rejected),
            ("established", before.established, now.established),
            ("closed", before.closed, now.closed),
        ] {
            self.connections
                .with_label_values(&[event])
                .inc_by(n.saturating_sub(b));
        }
        self.echoes.inc_by(now.echoes.saturating_sub(before.echoes));
        self.active.set(now.active as i64);
    }
}
