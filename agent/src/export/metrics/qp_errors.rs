//! Why QPs die: the async events their consumers receive, the completions
//! in error, and every entry into ERR with its cause.

use crate::export::registry::IntCounterVec;

use super::Registrar;
use crate::kernel::rdma::QpType;

#[derive(Clone)]
pub struct QpErrorMetrics {
    async_events: IntCounterVec,
    completion_errors: IntCounterVec,
    errors: IntCounterVec,
}

impl QpErrorMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        Self {
            async_events: r.counter_vec(
                "qpwatch_qp_async_events_total",
                "QP async events delivered to the QP's consumer (uverbs for userspace QPs, the ULP's handler for kernel QPs), by the kernel's name of the event (enum ib_event_type).",
                &["device", "qp_type", "event"],
            ),
            completion_errors: r.counter_vec(
                "qpwatch_qp_completion_errors_total",
                "Work completions in error, flushes left out, by the kernel's name of the status (enum ib_wc_status); soft-RoCE only (rxe-qp-errors hooks): other devices write completions where the kernel does not see them.",
                &["device", "status"],
            ),
            errors: r.counter_vec(
                "qpwatch_qp_errors_total",
                "QPs that entered ERR, by cause: requested (a modify to ERR by the owner), async_event:<event>, completion:<status> (the device moved it after that error completion), unknown (the device moved it, no cause seen).",
                &["cause"],
            ),
        }
    }

    pub fn async_event(&self, device: &str, qp_type: QpType, event: &str) {
        self.async_events
            .with_label_values(&[device, qp_type.label(), event])
            .inc();
    }

    pub fn completion_error(&self, device: &str, status: &str) {
        self.completion_errors
            .with_label_values(&[device, status])
            .inc();
    }

    /// Starts the `qpwatch_qp_errors_total` series of these causes at 0.
    pub fn init_causes<'a>(&self, causes: impl IntoIterator<Item = &'a str>) {
        for cause in causes {
            self.errors.with_label_values(&[cause]);
        }
    }

    pub fn error(&self, cause: &str) {
        self.errors.with_label_values(&[cause]).inc();
    }
}
