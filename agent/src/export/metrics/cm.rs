//! RDMA CM: events delivered to consumers, connection setup, address and
//! route resolution, handlers, calls, and the live CM ids by state.

use std::time::Duration;

use crate::export::registry::{Histogram, HistogramVec, IntCounterVec, IntGaugeVec};

use super::{Buckets, Registrar};
use crate::kernel::rdma::errno_label;

/// The CM events counted in `qpwatch_cm_errors_total`.
pub const CM_ERROR_EVENTS: [&str; 5] = [
    "REJECTED",
    "UNREACHABLE",
    "CONNECT_ERROR",
    "ADDR_ERROR",
    "ROUTE_ERROR",
];

#[derive(Clone)]
pub struct CmMetrics {
    events: IntCounterVec,
    errors: IntCounterVec,
    event_handler_duration: HistogramVec,
    connect_duration: HistogramVec,
    addr_resolve: Histogram,
    route_resolve: Histogram,
    ids: IntGaugeVec,
    handler_duration: HistogramVec,
    call_duration: HistogramVec,
    call_errors: IntCounterVec,
}

impl CmMetrics {
    pub fn new(r: &mut Registrar, buckets: &Buckets) -> Self {
        Self {
            events: r.counter_vec(
                "qpwatch_cm_events_total",
                "RDMA CM events delivered to consumers, by event and status.",
                &["event", "status"],
            ),
            errors: r.counter_vec(
                "qpwatch_cm_errors_total",
                "RDMA CM error events (REJECTED, UNREACHABLE, CONNECT_ERROR, ADDR_ERROR, ROUTE_ERROR).",
                &["event"],
            ),
            event_handler_duration: r.histogram_vec(
                "qpwatch_cm_event_handler_duration_seconds",
                "Time in cma_cm_event_handler (the consumer's handling of one CM event).",
                &["event"],
                &buckets.call_latency,
            ),
            connect_duration: r.histogram_vec(
                "qpwatch_cm_connect_duration_seconds",
                "Connection setup: active = connect request sent to established, passive = CONNECT_REQUEST to ESTABLISHED.",
                &["role"],
                &buckets.call_latency,
            ),
            addr_resolve: r.histogram(
                "qpwatch_cm_address_resolve_duration_seconds",
                "rdma_resolve_addr() to ADDR_RESOLVED.",
                &buckets.call_latency,
            ),
            route_resolve: r.histogram(
                "qpwatch_cm_route_resolve_duration_seconds",
                "rdma_resolve_route() to ROUTE_RESOLVED.",
                &buckets.call_latency,
            ),
            ids: r.gauge_vec(
                "qpwatch_cm_ids",
                "Live RDMA CM ids attached to a device, by state (ESTABLISHED is CONNECT after establishment).",
                &["state"],
            ),
            handler_duration: r.histogram_vec(
                "qpwatch_cm_handler_duration_seconds",
                "Time in the IB CM handlers of the CMA (cma_ib_handler, cma_ib_req_handler) and in ucma_event_handler, by event.",
                &["handler", "event"],
                &buckets.call_latency,
            ),
            call_duration: r.histogram_vec(
                "qpwatch_cm_call_duration_seconds",
                "Duration of rdma_cm calls and of the CMA's QP transitions for kernel QPs.",
                &["call"],
                &buckets.call_latency,
            ),
            call_errors: r.counter_vec(
                "qpwatch_cm_call_errors_total",
                "rdma_cm calls that returned an error.",
                &["call", "errno"],
            ),
        }
    }

    /// An event delivered through `cma_cm_event_handler`; error events also
    /// count in `qpwatch_cm_errors_total`.
    pub fn event(&self, event: &str, status: &str, duration: Duration) {
        self.events.with_label_values(&[event, status]).inc();
        self.event_handler_duration
            .with_label_values(&[event])
            .observe(duration.as_secs_f64());
        if CM_ERROR_EVENTS.contains(&event) {
            self.errors.with_label_values(&[event]).inc();
        }
    }

    pub fn connect(&self, role: &str, duration: Duration) {
        self.connect_duration
            .with_label_values(&[role])
            .observe(duration.as_secs_f64());
    }

    pub fn addr_resolved(&self, duration: Duration) {
        self.addr_resolve.observe(duration.as_secs_f64());
    }

    pub fn route_resolved(&self, duration: Duration) {
        self.route_resolve.observe(duration.as_secs_f64());
    }

    pub fn live_ids(&self, state: &str, delta: i64) {
        self.ids.with_label_values(&[state]).add(delta);
    }

    pub fn handler(&self, handler: &str, event: &str, duration: Duration) {
        self.handler_duration
            .with_label_values(&[handler, event])
            .observe(duration.as_secs_f64());
    }

    /// A completed call; a non-zero `rc` also counts as an error.
    pub fn call(&self, call: &str, duration: Duration, rc: i32) {
        self.call_duration
            .with_label_values(&[call])
            .observe(duration.as_secs_f64());
        if rc != 0 {
            self.call_errors
                .with_label_values(&[call, errno_label(rc)])
                .inc();
        }
    }
}
