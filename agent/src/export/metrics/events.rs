//! The event path itself: records received, lost in the kernel, malformed,
//! and events for QPs the agent did not know.

use std::sync::Arc;

use crate::export::registry::{IntCounter, IntCounterVec};
use qpwatch_common::{LostReason, LOST_REASONS};

use super::{resolved::Resolved, Registrar};
use crate::model::events::{DecodeError, RECORD_KINDS};

#[derive(Clone)]
pub struct EventMetrics {
    received: IntCounterVec,
    /// `received`'s series per [`RECORD_KINDS`] entry, made at its first event.
    received_by_kind: Arc<Resolved<IntCounter, { RECORD_KINDS.len() }>>,
    lost: IntCounterVec,
    malformed: IntCounterVec,
    untracked: IntCounterVec,
}

impl EventMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        let lost = r.counter_vec(
            "qpwatch_events_lost_total",
            "Events that never reached the agent, counted in the kernel, by reason.",
            &["reason"],
        );
        for reason in LostReason::ALL {
            lost.with_label_values(&[reason.label()]);
        }
        Self {
            received: r.counter_vec(
                "qpwatch_events_total",
                "Kernel events received from the ring buffer, by kind.",
                &["kind"],
            ),
            received_by_kind: Arc::new(Resolved::new()),
            lost,
            malformed: r.counter_vec(
                "qpwatch_events_malformed_total",
                "Ring-buffer records the agent could not decode or that carried invalid values.",
                &["reason"],
            ),
            untracked: r.counter_vec(
                "qpwatch_untracked_qp_events_total",
                "Modify or destroy events for QPs the agent did not know (created before it started).",
                &["kind"],
            ),
        }
    }

    pub fn received(&self, kind: &str) {
        match RECORD_KINDS.iter().position(|k| *k == kind) {
            Some(i) => self.received_kind(i),
            None => self.received.with_label_values(&[kind]).inc(),
        }
    }

    /// A record of kind `RECORD_KINDS[index]` (`Record::kind_index`).
    pub fn received_kind(&self, index: usize) {
        self.received_by_kind
            .get(index, || {
                self.received.with_label_values(&[RECORD_KINDS[index]])
            })
            .inc();
    }

    pub fn malformed(&self, error: &DecodeError) {
        let reason = match error {
            DecodeError::Short(_) => "short",
            DecodeError::UnknownKind(_) => "unknown_kind",
            DecodeError::BadLength { .. } => "bad_length",
            DecodeError::UnknownOp(_) => "unknown_op",
        };
        self.malformed.with_label_values(&[reason]).inc();
    }

    /// A modify whose state value the kernel does not define.
    pub fn invalid_state(&self) {
        self.malformed.with_label_values(&["invalid_state"]).inc();
    }

    /// Adds events the kernel counted as lost since the last read, per reason.
    pub fn add_lost(&self, delta: [u64; LOST_REASONS]) {
        for (i, reason) in LostReason::ALL.iter().enumerate() {
            if delta[i] > 0 {
                self.lost
                    .with_label_values(&[reason.label()])
                    .inc_by(delta[i]);
            }
        }
    }

    /// A modify or destroy for a QP the table did not know.
    pub fn untracked(&self, kind: &str) {
        self.untracked.with_label_values(&[kind]).inc();
    }
}
