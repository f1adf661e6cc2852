//! What the agent's caps did: the size of its QP table, the QPs evicted from
//! it when full, and label values folded into "other".

use crate::export::registry::{IntCounter, IntCounterVec, IntGauge};

use super::Registrar;

#[derive(Clone)]
pub struct LimitMetrics {
    tracked_qps: IntGauge,
    evicted: IntCounter,
    label_overflow: IntCounterVec,
}

impl LimitMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        Self {
            tracked_qps: r.gauge(
                "qpwatch_tracked_qps",
                "QPs in the agent's state table (bounded by max_tracked_qps).",
            ),
            evicted: r.counter(
                "qpwatch_tracked_qps_evicted_total",
                "QPs dropped from the full state table, oldest first.",
            ),
            label_overflow: r.counter_vec(
                "qpwatch_label_overflow_total",
                "Observations whose label value was folded into \"other\" because the label's cap was reached.",
                &["label"],
            ),
        }
    }

    pub fn tracked_qps(&self, count: usize) {
        self.tracked_qps.set(count as i64);
    }

    pub fn evicted(&self) {
        self.evicted.inc();
    }

    pub fn label_overflow(&self, label: &str) {
        self.label_overflow.with_label_values(&[label]).inc();
    }
}
