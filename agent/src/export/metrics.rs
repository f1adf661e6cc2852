//! The Prometheus metrics qpwatch exports, and the [`Observer`] that feeds them.
//!
//! Label values are bounded: device names (capped by the correlator), QP types,
//! QP states and errno names from fixed tables. No qp_num, pid or address labels.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use qpwatch_common::{LostReason, QpOrigin, LOST_REASONS};

use crate::kernel::hooks::HookStatus;

use crate::{
    kernel::rdma::errno_label,
    model::events::DecodeError,
    model::qp::{Observation, Observer},
};

/// Kernel call latencies (create, modify): 1 µs to 10 s in 1-2.5-5 steps.
pub const CALL_LATENCY_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Time spent in a state and time to RTS: 10 µs to 1 h.
pub const DWELL_BUCKETS: &[f64] = &[
    1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// QP lifetime: 1 ms to 7 days.
pub const LIFETIME_BUCKETS: &[f64] = &[
    1e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
    604800.0,
];

fn origin_label(origin: QpOrigin) -> &'static str {
    match origin {
        QpOrigin::User => "user",
        QpOrigin::Kernel => "kernel",
    }
}

/// Probe round-trip times: 500 ns to 100 ms (soft-RoCE RTTs are tens of µs,
/// hardware RTTs a few µs).
pub const PROBE_RTT_BUCKETS: &[f64] = &[
    5e-7, 1e-6, 2e-6, 3e-6, 5e-6, 7.5e-6, 1e-5, 1.5e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 2e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
];

/// Histogram bucket layouts, overridable from the config file.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    pub call_latency: Vec<f64>,
    pub dwell: Vec<f64>,
    pub lifetime: Vec<f64>,
    pub probe_rtt: Vec<f64>,
}

impl Default for Buckets {
    fn default() -> Self {
        Self {
            call_latency: CALL_LATENCY_BUCKETS.to_vec(),
            dwell: DWELL_BUCKETS.to_vec(),
            lifetime: LIFETIME_BUCKETS.to_vec(),
            probe_rtt: PROBE_RTT_BUCKETS.to_vec(),
        }
    }
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    qp_created: IntCounterVec,
    qp_create_errors: IntCounterVec,
    qp_create_duration: HistogramVec,
    qp_transition_duration: HistogramVec,
    qp_state_dwell: HistogramVec,
    qp_time_to_rts: Histogram,
    qp_lifetime: Histogram,
    qp_modify_errors: IntCounterVec,
    qp_destroyed: IntCounterVec,
    qp_destroy_errors: IntCounterVec,
    qps: IntGaugeVec,
    events: IntCounterVec,
    events_lost: IntCounterVec,
    events_malformed: IntCounterVec,
    untracked: IntCounterVec,
    tracked_qps: IntGauge,
    tracked_evicted: IntCounter,
    qp_created_by_process: IntCounterVec,
    label_overflow: IntCounterVec,
    probe_attached: IntGaugeVec,
    tracepoint_hits: IntCounterVec,
    cm_events: IntCounterVec,
    cm_errors: IntCounterVec,
    cm_event_handler_duration: HistogramVec,
    cm_connect_duration: HistogramVec,
    cm_addr_resolve: Histogram,
    cm_route_resolve: Histogram,
    cm_ids: IntGaugeVec,
    cm_handler_duration: HistogramVec,
    cm_call_duration: HistogramVec,
    cm_call_errors: IntCounterVec,
    bpf_run_seconds: prometheus::CounterVec,
    bpf_runs: IntCounterVec,
    probe_rtt: HistogramVec,
    probe_setup: HistogramVec,
    probe_total: IntCounterVec,
    probe_up: IntGaugeVec,
    probe_skew: HistogramVec,
    probe_unseen: IntCounterVec,
    responder_connections: IntCounterVec,
    responder_echoes: IntCounter,
    responder_active: IntGauge,
}

/// Userspace minus kernel duration of a probe QP's verb call: the syscall and
/// library overhead around the kernel function, normally a few µs.
pub const PROBE_SKEW_BUCKETS: &[f64] = &[
    -1e-4, -1e-5, 0.0, 1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 1e-2,
];

/// The CM events counted in `qpwatch_cm_errors_total`.
pub const CM_ERROR_EVENTS: [&str; 5] = [
    "REJECTED",
    "UNREACHABLE",
    "CONNECT_ERROR",
    "ADDR_ERROR",
    "ROUTE_ERROR",
];

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn plain_histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

impl Metrics {
    pub fn new(buckets: &Buckets, kernel: &str) -> Self {
        let registry = Registry::new();
        let r = &registry;
        let build_info = IntGaugeVec::new(
            Opts::new(
                "qpwatch_build_info",
                "qpwatch version, the git revision it was built from (dirty: with changes not committed) and the kernel it runs on; always 1.",
            ),
            &["version", "revision", "dirty", "kernel"],
        )
        .expect("valid metric");
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                env!("QPWATCH_GIT_REVISION"),
                env!("QPWATCH_GIT_DIRTY"),
                kernel,
            ])
            .set(1);
        registry
            .register(Box::new(build_info))
            .expect("unique metric");
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");

        let qps = IntGaugeVec::new(
            Opts::new("qpwatch_qps", "Live QPs by device, type and current state."),
            &["device", "qp_type", "state"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(qps.clone()))
            .expect("unique metric");
        let tracked_qps = IntGauge::new(
            "qpwatch_tracked_qps",
            "QPs in the agent's state table (bounded by max_tracked_qps).",
        )
        .expect("valid metric");
        registry
            .register(Box::new(tracked_qps.clone()))
            .expect("unique metric");
        let tracked_evicted = IntCounter::new(
            "qpwatch_tracked_qps_evicted_total",
            "QPs dropped from the full state table, oldest first.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(tracked_evicted.clone()))
            .expect("unique metric");
        let qp_time_to_rts = Histogram::with_opts(
            HistogramOpts::new(
                "qpwatch_qp_time_to_rts_seconds",
                "Time from the end of QP creation to the end of its first transition into RTS.",
            )
            .buckets(buckets.dwell.clone()),
        )
        .expect("valid metric");
        registry
            .register(Box::new(qp_time_to_rts.clone()))
            .expect("unique metric");
        let qp_lifetime = Histogram::with_opts(
            HistogramOpts::new(
                "qpwatch_qp_lifetime_seconds",
                "Time from the end of QP creation to the end of its destruction.",
            )
            .buckets(buckets.lifetime.clone()),
        )
        .expect("valid metric");
        registry
            .register(Box::new(qp_lifetime.clone()))
            .expect("unique metric");

        let events_lost = counter(
            r,
            "qpwatch_events_lost_total",
            "Events that never reached the agent, counted in the kernel, by reason.",
            &["reason"],
        );
        for reason in LostReason::ALL {
            events_lost.with_label_values(&[reason.label()]);
        }

        Metrics {
            qp_created: counter(
                r,
                "qpwatch_qp_created_total",
                "QPs created successfully.",
                &["device", "qp_type", "origin"],
            ),
            qp_create_errors: counter(
                r,
                "qpwatch_qp_create_errors_total",
                "QP creations that failed, by errno.",
                &["device", "origin", "errno"],
            ),
            qp_create_duration: histogram(
                r,
                "qpwatch_qp_create_duration_seconds",
                "Duration of the kernel's QP create call (ib_create_qp_user / ib_create_qp_kernel).",
                &["device", "origin"],
                &buckets.call_latency,
            ),
            qp_transition_duration: histogram(
                r,
                "qpwatch_qp_transition_duration_seconds",
                "Duration of successful state-changing modify calls (_ib_modify_qp), by edge.",
                &["from", "to"],
                &buckets.call_latency,
            ),
            qp_state_dwell: histogram(
                r,
                "qpwatch_qp_state_dwell_seconds",
                "Time QPs spent in a state before the next transition or destroy.",
                &["state"],
                &buckets.dwell,
            ),
            qp_time_to_rts,
            qp_lifetime,
            qp_modify_errors: counter(
                r,
                "qpwatch_qp_modify_errors_total",
                "Modify calls that failed, by requested state and errno.",
                &["to", "errno"],
            ),
            qp_destroyed: counter(
                r,
                "qpwatch_qp_destroyed_total",
                "QPs destroyed successfully.",
                &["device", "qp_type"],
            ),
            qp_destroy_errors: counter(
                r,
                "qpwatch_qp_destroy_errors_total",
                "QP destroys that failed (e.g. EBUSY while still attached), by errno.",
                &["errno"],
            ),
            qps,
            events: counter(
                r,
                "qpwatch_events_total",
                "Kernel events received from the ring buffer, by kind.",
                &["kind"],
            ),
            events_lost,
            events_malformed: counter(
                r,
                "qpwatch_events_malformed_total",
                "Ring-buffer records the agent could not decode or that carried invalid values.",
                &["reason"],
            ),
            untracked: counter(
                r,
                "qpwatch_untracked_qp_events_total",
                "Modify or destroy events for QPs the agent did not know (created before it started).",
                &["kind"],
            ),
            tracked_qps,
            tracked_evicted,
            qp_created_by_process: counter(
                r,
                "qpwatch_qp_created_by_process_total",
                "QPs created, by the creating task's name (first max_process_labels names; the rest are \"other\").",
                &["comm"],
            ),
            label_overflow: counter(
                r,
                "qpwatch_label_overflow_total",
                "Observations whose label value was folded into \"other\" because the label's cap was reached.",
                &["label"],
            ),
            probe_attached: gauge(
                r,
                "qpwatch_probe_attached",
                "1 if the hook is attached, 0 if not (see the logs for the reason).",
                &["hook"],
            ),
            tracepoint_hits: counter(
                r,
                "qpwatch_tracepoint_hits_total",
                "Hits of the rdma_cma:* and ib_cma:* tracepoints qpwatch attaches to.",
                &["tracepoint"],
            ),
            cm_events: counter(
                r,
                "qpwatch_cm_events_total",
                "RDMA CM events delivered to consumers, by event and status.",
                &["event", "status"],
            ),
            cm_errors: counter(
                r,
                "qpwatch_cm_errors_total",
                "RDMA CM error events (REJECTED, UNREACHABLE, CONNECT_ERROR, ADDR_ERROR, ROUTE_ERROR).",
                &["event"],
            ),
            cm_event_handler_duration: histogram(
                r,
                "qpwatch_cm_event_handler_duration_seconds",
                "Time in cma_cm_event_handler (the consumer's handling of one CM event).",
                &["event"],
                &buckets.call_latency,
            ),
            cm_connect_duration: histogram(
                r,
                "qpwatch_cm_connect_duration_seconds",
                "Connection setup: active = connect request sent to established, passive = CONNECT_REQUEST to ESTABLISHED.",
                &["role"],
                &buckets.call_latency,
            ),
            cm_addr_resolve: plain_histogram(
                r,
                "qpwatch_cm_address_resolve_duration_seconds",
                "rdma_resolve_addr() to ADDR_RESOLVED.",
                &buckets.call_latency,
            ),
            cm_route_resolve: plain_histogram(
                r,
                "qpwatch_cm_route_resolve_duration_seconds",
                "rdma_resolve_route() to ROUTE_RESOLVED.",
                &buckets.call_latency,
            ),
            cm_ids: gauge(
                r,
                "qpwatch_cm_ids",
                "Live RDMA CM ids attached to a device, by state (ESTABLISHED is CONNECT after establishment).",
                &["state"],
            ),
            cm_handler_duration: histogram(
                r,
                "qpwatch_cm_handler_duration_seconds",
                "Time in the IB CM handlers of the CMA (cma_ib_handler, cma_ib_req_handler) and in ucma_event_handler, by event.",
                &["handler", "event"],
                &buckets.call_latency,
            ),
            cm_call_duration: histogram(
                r,
                "qpwatch_cm_call_duration_seconds",
                "Duration of rdma_cm calls and of the CMA's QP transitions for kernel QPs.",
                &["call"],
                &buckets.call_latency,
            ),
            cm_call_errors: counter(
                r,
                "qpwatch_cm_call_errors_total",
                "rdma_cm calls that returned an error.",
                &["call", "errno"],
            ),
            bpf_run_seconds: {
                let c = prometheus::CounterVec::new(
                    Opts::new(
                        "qpwatch_bpf_program_run_seconds_total",
                        "Time the hook's BPF program ran, from kernel BPF statistics (--bpf-stats).",
                    ),
                    &["hook"],
                )
                .expect("valid metric");
                r.register(Box::new(c.clone())).expect("unique metric");
                c
            },
            bpf_runs: counter(
                r,
                "qpwatch_bpf_program_runs_total",
                "Runs of the hook's BPF program, from kernel BPF statistics (--bpf-stats).",
                &["hook"],
            ),
            probe_rtt: histogram(
                r,
                "qpwatch_probe_rtt_seconds",
                "Round-trip time of a synthetic probe's SEND/RECV ping-pong.",
                &["target"],
                &buckets.probe_rtt,
            ),
            probe_setup: histogram(
                r,
                "qpwatch_probe_setup_duration_seconds",
                "Latency of each connection step of a synthetic probe.",
                &["target", "step"],
                &buckets.call_latency,
            ),
            probe_total: counter(
                r,
                "qpwatch_probe_total",
                "Synthetic probes by result (ok, timeout, rejected, unreachable, addr_error, route_error, connect_error, error).",
                &["target", "result"],
            ),
            probe_up: gauge(
                r,
                "qpwatch_probe_up",
                "1 if the target's last probe succeeded, 0 if not.",
                &["target"],
            ),
            probe_skew: histogram(
                r,
                "qpwatch_probe_kernel_userspace_skew_seconds",
                "Probe QP verb calls: userspace-measured minus kernel-measured (eBPF) duration.",
                &["call"],
                PROBE_SKEW_BUCKETS,
            ),
            probe_unseen: counter(
                r,
                "qpwatch_probe_qps_unseen_total",
                "Probe QPs with a verb call the eBPF path did not see (the tracing self-test).",
                &["target"],
            ),
            responder_connections: counter(
                r,
                "qpwatch_responder_connections_total",
                "Probe responder connections: requested, rejected, established, closed.",
                &["event"],
            ),
            responder_echoes: {
                let c = IntCounter::new(
                    "qpwatch_responder_echoes_total",
                    "Probe messages the responder echoed.",
                )
                .expect("valid metric");
                r.register(Box::new(c.clone())).expect("unique metric");
                c
            },
            responder_active: {
                let g = IntGauge::new(
                    "qpwatch_responder_active_connections",
                    "Probe responder connections open now.",
                )
                .expect("valid metric");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            registry,
        }
    }

    /// Sets `qpwatch_probe_attached` for each hook of an enabled group.
    pub fn set_hook_statuses(&self, statuses: &[(String, HookStatus)]) {
        for (hook, status) in statuses {
            let value = match status {
                HookStatus::Attached => 1,
                HookStatus::Detached(_) => 0,
                HookStatus::Disabled => {
                    let _ = self.probe_attached.remove_label_values(&[hook]);
                    continue;
                }
            };
            self.probe_attached.with_label_values(&[hook]).set(value);
        }
    }

    /// Adds BPF run-time statistics of one hook's program.
    pub fn bpf_run(&self, hook: &str, run_ns: u64, runs: u64) {
        self.bpf_run_seconds
            .with_label_values(&[hook])
            .inc_by(run_ns as f64 / 1e9);
        self.bpf_runs.with_label_values(&[hook]).inc_by(runs);
    }

    /// Counts a probe and its latencies.
    pub fn probe_outcome(&self, target: &str, outcome: &rdma_probe::ProbeOutcome) {
        if self.probe_total.with_label_values(&[target, "ok"]).get() == 0 {
            for result in rdma_probe::ProbeResult::ALL {
                self.probe_total
                    .with_label_values(&[target, result.as_str()]);
            }
            self.probe_unseen.with_label_values(&[target]);
        }
        self.probe_total
            .with_label_values(&[target, outcome.result.as_str()])
            .inc();
        self.probe_up
            .with_label_values(&[target])
            .set(i64::from(outcome.is_ok()));
        let rtt = self.probe_rtt.with_label_values(&[target]);
        for sample in &outcome.rtts {
            rtt.observe(sample.as_secs_f64());
        }
        for (step, duration) in &outcome.steps {
            if *step != rdma_probe::Step::Ping {
                self.probe_setup
                    .with_label_values(&[target, step.as_str()])
                    .observe(duration.as_secs_f64());
            }
        }
    }

    pub fn probe_skew(&self, call: &str, seconds: f64) {
        self.probe_skew.with_label_values(&[call]).observe(seconds);
    }

    pub fn probe_qp_unseen(&self, target: &str) {
        self.probe_unseen.with_label_values(&[target]).inc();
    }

    /// A target that was removed: its up gauge goes away.
    pub fn forget_probe_target(&self, target: &str) {
        let _ = self.probe_up.remove_label_values(&[target]);
    }

    /// Adds the responder's counters since `before`.
    pub fn responder_stats(
        &self,
        before: &rdma_probe::ResponderStats,
        now: &rdma_probe::ResponderStats,
    ) {
        for (event, b, n) in [
            ("requested", before.connect_requests, now.connect_requests),
            ("rejected", before.rejected, now.rejected),
            ("established", before.established, now.established),
            ("closed", before.closed, now.closed),
        ] {
            self.responder_connections
                .with_label_values(&[event])
                .inc_by(n.saturating_sub(b));
        }
        self.responder_echoes
            .inc_by(now.echoes.saturating_sub(before.echoes));
        self.responder_active.set(now.active as i64);
    }

    pub fn tracepoint_hits(&self, tracepoint: &str, hits: u64) {
        self.tracepoint_hits
            .with_label_values(&[tracepoint])
            .inc_by(hits);
    }

    pub fn event_received(&self, kind: &str) {
        self.events.with_label_values(&[kind]).inc();
    }

    pub fn event_malformed(&self, error: &DecodeError) {
        let reason = match error {
            DecodeError::Short(_) => "short",
            DecodeError::UnknownKind(_) => "unknown_kind",
            DecodeError::BadLength { .. } => "bad_length",
            DecodeError::UnknownOp(_) => "unknown_op",
        };
        self.events_malformed.with_label_values(&[reason]).inc();
    }

    /// Adds events the kernel counted as lost since the last read, per reason.
    pub fn add_lost(&self, delta: [u64; LOST_REASONS]) {
        for (i, reason) in LostReason::ALL.iter().enumerate() {
            if delta[i] > 0 {
                self.events_lost
                    .with_label_values(&[reason.label()])
                    .inc_by(delta[i]);
            }
        }
    }
}

impl Observer for Metrics {
    fn observe(&mut self, observation: Observation) {
        match observation {
            Observation::Created {
                device,
                qp_type,
                origin,
                comm,
                duration,
            } => {
                let origin = origin_label(origin);
                self.qp_created
                    .with_label_values(&[&device, qp_type.label(), origin])
                    .inc();
                self.qp_created_by_process.with_label_values(&[&comm]).inc();
                self.qp_create_duration
                    .with_label_values(&[&device, origin])
                    .observe(duration.as_secs_f64());
            }
            Observation::CreateFailed {
                device,
                origin,
                errno,
            } => self
                .qp_create_errors
                .with_label_values(&[&device, origin_label(origin), errno_label(errno)])
                .inc(),
            Observation::Transition { from, to, duration } => self
                .qp_transition_duration
                .with_label_values(&[from.map_or("unknown", |s| s.label()), to.label()])
                .observe(duration.as_secs_f64()),
            Observation::ModifyFailed { to, errno } => self
                .qp_modify_errors
                .with_label_values(&[to.map_or("unchanged", |s| s.label()), errno_label(errno)])
                .inc(),
            Observation::Dwell { state, duration } => self
                .qp_state_dwell
                .with_label_values(&[state.label()])
                .observe(duration.as_secs_f64()),
            Observation::TimeToRts { duration } => {
                self.qp_time_to_rts.observe(duration.as_secs_f64())
            }
            Observation::Destroyed {
                device,
                qp_type,
                lifetime,
            } => {
                self.qp_destroyed
                    .with_label_values(&[&device, qp_type.label()])
                    .inc();
                if let Some(lifetime) = lifetime {
                    self.qp_lifetime.observe(lifetime.as_secs_f64());
                }
            }
            Observation::DestroyFailed { errno } => self
                .qp_destroy_errors
                .with_label_values(&[errno_label(errno)])
                .inc(),
            Observation::LiveQps {
                device,
                qp_type,
                state,
                delta,
            } => self
                .qps
                .with_label_values(&[&device, qp_type.label(), state.label()])
                .add(delta),
            Observation::Untracked { kind } => self.untracked.with_label_values(&[kind]).inc(),
            Observation::Evicted => self.tracked_evicted.inc(),
            Observation::InvalidState => self
                .events_malformed
                .with_label_values(&["invalid_state"])
                .inc(),
            Observation::LabelOverflow { label } => {
                self.label_overflow.with_label_values(&[label]).inc()
            }
            Observation::LiveCmIds { state, delta } => {
                self.cm_ids.with_label_values(&[&state]).add(delta)
            }
            Observation::CmEvent {
                event,
                status,
                duration,
                result: _,
            } => {
                self.cm_events.with_label_values(&[event, &status]).inc();
                self.cm_event_handler_duration
                    .with_label_values(&[event])
                    .observe(duration.as_secs_f64());
                if CM_ERROR_EVENTS.contains(&event) {
                    self.cm_errors.with_label_values(&[event]).inc();
                }
            }
            Observation::CmConnect { role, duration } => self
                .cm_connect_duration
                .with_label_values(&[role])
                .observe(duration.as_secs_f64()),
            Observation::CmAddrResolved { duration } => {
                self.cm_addr_resolve.observe(duration.as_secs_f64())
            }
            Observation::CmRouteResolved { duration } => {
                self.cm_route_resolve.observe(duration.as_secs_f64())
            }
            Observation::CmHandler {
                handler,
                event,
                duration,
            } => self
                .cm_handler_duration
                .with_label_values(&[handler, &event])
                .observe(duration.as_secs_f64()),
            Observation::CmCall { call, duration, rc } => {
                self.cm_call_duration
                    .with_label_values(&[call])
                    .observe(duration.as_secs_f64());
                if rc != 0 {
                    self.cm_call_errors
                        .with_label_values(&[call, errno_label(rc)])
                        .inc();
                }
            }
        }
    }

    fn tracked_qps(&mut self, count: usize) {
        self.tracked_qps.set(count as i64);
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(32 * 1024);
    crate::export::exposition::encode(&registry.gather(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::rdma::{QpState, QpType};
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
        m.add_lost([5, 0, 1, 0, 0]);
        m.add_lost([2, 0, 0, 0, 0]);
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
    fn buckets_are_sorted_and_span_microseconds_to_seconds() {
        for b in [CALL_LATENCY_BUCKETS, DWELL_BUCKETS, LIFETIME_BUCKETS] {
            assert!(b.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!(CALL_LATENCY_BUCKETS[0], 1e-6);
        assert_eq!(*CALL_LATENCY_BUCKETS.last().unwrap(), 10.0);
    }

    #[test]
    fn process_and_cm_error_counters() {
        let mut m = Metrics::new(&Buckets::default(), "k");
        m.observe(Observation::Created {
            device: Arc::from("rxe0"),
            qp_type: QpType::Rc,
            origin: QpOrigin::Kernel,
            comm: Arc::from("kworker/u4:1"),
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
}
