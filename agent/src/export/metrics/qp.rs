//! The QP lifecycle: creations, transitions, destroys, their errors and
//! latencies, and the live QPs by state.

use std::{
    sync::{Arc, RwLock},
    time::Duration,
};

use crate::export::registry::{IntCounterVec, IntGauge, IntGaugeVec};
use fnv::FnvHashMap;
use qpwatch_common::QpOrigin;

use super::{
    durations::{DurationHistogram, DurationHistogramVec},
    resolved::Resolved,
    Buckets, Registrar,
};
use crate::kernel::rdma::{errno_label, QpState, QpType};

#[derive(Clone)]
pub struct QpMetrics {
    created: IntCounterVec,
    created_by_process: IntCounterVec,
    created_by_cgroup: IntCounterVec,
    create_errors: IntCounterVec,
    create_duration: DurationHistogramVec,
    transition_duration: DurationHistogramVec,
    state_dwell: DurationHistogramVec,
    time_to_rts: DurationHistogram,
    lifetime: DurationHistogram,
    modify_errors: IntCounterVec,
    destroyed: IntCounterVec,
    destroy_errors: IntCounterVec,
    live: IntGaugeVec,
    /// Series looked up once ([`Resolved`]); none of these families ever
    /// drops a series.
    transition_series: Arc<Resolved<DurationHistogram, { TRANSITION_SLOTS }>>,
    dwell_series: Arc<Resolved<DurationHistogram, { STATES }>>,
    live_series: Arc<RwLock<LiveByDevice>>,
}

/// The live-QP gauges of each device seen.
type LiveByDevice = FnvHashMap<Box<str>, Box<Resolved<IntGauge, { LIVE_SLOTS }>>>;

const STATES: usize = QpState::ALL.len();
/// A known previous state, or none (`unknown`), to a state.
const TRANSITION_SLOTS: usize = (STATES + 1) * STATES;
/// Every type (the named ones and `Other`) in every state, for one device.
const LIVE_SLOTS: usize = (QpType::KNOWN.len() + 1) * STATES;

fn origin_label(origin: QpOrigin) -> &'static str {
    match origin {
        QpOrigin::User => "user",
        QpOrigin::Kernel => "kernel",
    }
}

impl QpMetrics {
    pub fn new(r: &mut Registrar, buckets: &Buckets) -> Self {
        Self {
            created: r.counter_vec(
                "qpwatch_qp_created_total",
                "QPs created successfully.",
                &["device", "qp_type", "origin"],
            ),
            created_by_process: r.counter_vec(
                "qpwatch_qp_created_by_process_total",
                "QPs created, by the creating task's name (first max_process_labels names; the rest are \"other\").",
                &["comm"],
            ),
            created_by_cgroup: r.counter_vec(
                "qpwatch_qp_created_by_cgroup_total",
                "QPs created, by the creating task's cgroup v2 path (first max_cgroup_labels paths; the rest are \"other\"; \"unknown\" when it could not be named).",
                &["cgroup"],
            ),
            create_errors: r.counter_vec(
                "qpwatch_qp_create_errors_total",
                "QP creations that failed, by errno.",
                &["device", "origin", "errno"],
            ),
            create_duration: r.duration_histogram_vec(
                "qpwatch_qp_create_duration_seconds",
                "Duration of the kernel's QP create call (ib_create_qp_user / ib_create_qp_kernel).",
                &["device", "origin"],
                &buckets.call_latency,
            ),
            transition_duration: r.duration_histogram_vec(
                "qpwatch_qp_transition_duration_seconds",
                "Duration of successful state-changing modify calls (_ib_modify_qp), by edge.",
                &["from", "to"],
                &buckets.call_latency,
            ),
            state_dwell: r.duration_histogram_vec(
                "qpwatch_qp_state_dwell_seconds",
                "Time QPs spent in a state before the next transition or destroy.",
                &["state"],
                &buckets.dwell,
            ),
            time_to_rts: r
                .duration_histogram_vec(
                    "qpwatch_qp_time_to_rts_seconds",
                    "Time from the end of QP creation to the end of its first transition into RTS.",
                    &[],
                    &buckets.dwell,
                )
                .with_label_values::<&str>(&[]),
            lifetime: r
                .duration_histogram_vec(
                    "qpwatch_qp_lifetime_seconds",
                    "Time from the end of QP creation to the end of its destruction.",
                    &[],
                    &buckets.lifetime,
                )
                .with_label_values::<&str>(&[]),
            modify_errors: r.counter_vec(
                "qpwatch_qp_modify_errors_total",
                "Modify calls that failed, by requested state and errno.",
                &["to", "errno"],
            ),
            destroyed: r.counter_vec(
                "qpwatch_qp_destroyed_total",
                "QPs destroyed successfully.",
                &["device", "qp_type"],
            ),
            destroy_errors: r.counter_vec(
                "qpwatch_qp_destroy_errors_total",
                "QP destroys that failed (e.g. EBUSY while still attached), by errno.",
                &["errno"],
            ),
            live: r.gauge_vec(
                "qpwatch_qps",
                "Live QPs by device, type and current state.",
                &["device", "qp_type", "state"],
            ),
            transition_series: Arc::new(Resolved::new()),
            dwell_series: Arc::new(Resolved::new()),
            live_series: Arc::default(),
        }
    }

    pub fn created(
        &self,
        device: &str,
        qp_type: QpType,
        origin: QpOrigin,
        comm: &str,
        cgroup: &str,
        duration: Duration,
    ) {
        let origin = origin_label(origin);
        self.created
            .with_label_values(&[device, qp_type.label(), origin])
            .inc();
        self.created_by_process.with_label_values(&[comm]).inc();
        self.created_by_cgroup.with_label_values(&[cgroup]).inc();
        self.create_duration
            .with_label_values(&[device, origin])
            .observe(duration);
    }

    pub fn create_failed(&self, device: &str, origin: QpOrigin, errno: i32) {
        self.create_errors
            .with_label_values(&[device, origin_label(origin), errno_label(errno)])
            .inc();
    }

    /// `from` is `None` when the QP's previous state is unknown.
    pub fn transition(&self, from: Option<QpState>, to: QpState, duration: Duration) {
        let slot = from.map_or(STATES, |s| s as usize) * STATES + to as usize;
        self.transition_series
            .get(slot, || {
                self.transition_duration
                    .with_label_values(&[from.map_or("unknown", |s| s.label()), to.label()])
            })
            .observe(duration);
    }

    /// `to` is `None` for a modify that did not ask for a new state.
    pub fn modify_failed(&self, to: Option<QpState>, errno: i32) {
        self.modify_errors
            .with_label_values(&[to.map_or("unchanged", |s| s.label()), errno_label(errno)])
            .inc();
    }

    pub fn dwell(&self, state: QpState, duration: Duration) {
        self.dwell_series
            .get(state as usize, || {
                self.state_dwell.with_label_values(&[state.label()])
            })
            .observe(duration);
    }

    pub fn time_to_rts(&self, duration: Duration) {
        self.time_to_rts.observe(duration);
    }

    /// `lifetime` is `None` for QPs created before the agent saw them.
    pub fn destroyed(&self, device: &str, qp_type: QpType, lifetime: Option<Duration>) {
        self.destroyed
            .with_label_values(&[device, qp_type.label()])
            .inc();
        if let Some(lifetime) = lifetime {
            self.lifetime.observe(lifetime);
        }
    }

    pub fn destroy_failed(&self, errno: i32) {
        self.destroy_errors
            .with_label_values(&[errno_label(errno)])
            .inc();
    }

    pub fn live(&self, device: &str, qp_type: QpType, state: QpState, delta: i64) {
        let slot = qp_type as usize * STATES + state as usize;
        let make = || {
            self.live
                .with_label_values(&[device, qp_type.label(), state.label()])
        };
        if let Some(series) = self.live_series.read().expect("not poisoned").get(device) {
            series.get(slot, make).add(delta);
            return;
        }
        let mut devices = self.live_series.write().expect("not poisoned");
        devices
            .entry(device.into())
            .or_insert_with(|| Box::new(Resolved::new()))
            .get(slot, make)
            .add(delta);
    }
}
