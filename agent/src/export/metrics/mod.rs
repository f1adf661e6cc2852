//! The Prometheus metrics qpwatch exports, one file per family group, and
//! the [`Observer`] that feeds them.
//!
//! Each family group registers itself through a [`Registrar`] and offers
//! typed methods; [`Metrics`] owns the groups and the registry and
//! dispatches each [`Observation`] to its group.
//!
//! Label values are bounded: device names (capped by the correlator), QP types,
//! QP states and errno names from fixed tables. No qp_num or pid labels; the
//! only address labels (`peer`, the mesh's `target`) are capped with an
//! overflow count.

mod buckets;
mod build_info;
pub mod cm;
pub mod device_counters;
pub mod durations;
pub mod events;
mod family;
pub mod hooks;
pub mod http;
pub mod ib_cm;
pub mod limits;
pub mod mesh;
pub mod peers;
pub mod probes;
mod process;
pub mod qp;
pub mod qp_errors;
mod registrar;
mod resolved;
pub mod responder;
mod sysfs;
mod sysfs_reads;

use std::{path::PathBuf, time::Duration};

use crate::export::registry::{self, Registry};

pub use buckets::{
    Buckets, CALL_LATENCY_BUCKETS, DWELL_BUCKETS, LIFETIME_BUCKETS, PROBE_DELAY_BUCKETS,
    PROBE_RTT_BUCKETS, PROBE_SKEW_BUCKETS,
};
pub use cm::CM_ERROR_EVENTS;
pub use registrar::Registrar;

use crate::model::qp::{Observation, Observer};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub qp: qp::QpMetrics,
    pub qp_errors: qp_errors::QpErrorMetrics,
    pub cm: cm::CmMetrics,
    pub events: events::EventMetrics,
    pub limits: limits::LimitMetrics,
    pub hooks: hooks::HookMetrics,
    pub probes: probes::ProbeMetrics,
    pub responder: responder::ResponderMetrics,
    pub mesh: mesh::MeshMetrics,
    pub peers: peers::PeerMetrics,
    pub http: http::HttpMetrics,
}

impl Metrics {
    /// Every family but the counters read from sysfs (see
    /// [`Metrics::register_sysfs_counters`]); `kernel` is the running
    /// kernel's release, for `qpwatch_build_info`.
    pub fn new(buckets: &Buckets, kernel: &str) -> Self {
        Self::with_target_labels(buckets, kernel, &[])
    }

    /// [`Metrics::new`], the mesh's per-target families with these labels
    /// after `target` (fixed for the registry's life).
    pub fn with_target_labels(buckets: &Buckets, kernel: &str, target_labels: &[String]) -> Self {
        let registry = Registry::new();
        let mut r = Registrar::new(&registry);
        build_info::register(&mut r, kernel);
        process::register(&mut r);
        let qp = qp::QpMetrics::new(&mut r, buckets);
        let qp_errors = qp_errors::QpErrorMetrics::new(&mut r);
        let cm = cm::CmMetrics::new(&mut r, buckets);
        let events = events::EventMetrics::new(&mut r);
        let limits = limits::LimitMetrics::new(&mut r);
        let hooks = hooks::HookMetrics::new(&mut r);
        let probes = probes::ProbeMetrics::new(&mut r, buckets);
        let responder = responder::ResponderMetrics::new(&mut r);
        let mesh = mesh::MeshMetrics::new(&mut r, buckets, target_labels);
        let peers = peers::PeerMetrics::new(&mut r);
        let http = http::HttpMetrics::new(&mut r);
        Metrics {
            registry,
            qp,
            qp_errors,
            cm,
            events,
            limits,
            hooks,
            probes,
            responder,
            mesh,
            peers,
            http,
        }
    }

    /// Adds the counters read from sysfs under `dir` (normally
    /// [`ib_cm::SYSFS_DIR`]): ib_cm's per-port message counters and every
    /// device's port and driver counters, read at once and then every
    /// `interval` on a thread of their own (until the first read, a scrape
    /// has none of them).
    pub fn register_sysfs_counters(
        &mut self,
        dir: impl Into<PathBuf>,
        max_devices: usize,
        interval: Duration,
    ) -> Result<(), SysfsCountersError> {
        let dir = dir.into();
        let ib_cm = ib_cm::IbCmCounters::new(&dir, max_devices);
        let devices = device_counters::DeviceCounters::new(dir, max_devices);
        let sources = vec![ib_cm.source(), devices.source()];
        let mut r = Registrar::new(&self.registry);
        r.try_register(Box::new(ib_cm))?;
        r.try_register(Box::new(devices))?;
        let reads = sysfs_reads::SysfsReadMetrics::new(&mut r);
        sysfs::Refresher::new(sources, reads).start(interval)?;
        Ok(())
    }

    /// The names of the registered metric families (`process_*` included),
    /// in registration order.
    pub fn families(&self) -> Vec<String> {
        self.registry.names()
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
                cgroup,
                duration,
            } => self
                .qp
                .created(&device, qp_type, origin, &comm, &cgroup, duration),
            Observation::CreateFailed {
                device,
                origin,
                errno,
            } => self.qp.create_failed(&device, origin, errno),
            Observation::Transition { from, to, duration } => {
                self.qp.transition(from, to, duration)
            }
            Observation::ModifyFailed { to, errno } => self.qp.modify_failed(to, errno),
            Observation::Dwell { state, duration } => self.qp.dwell(state, duration),
            Observation::TimeToRts { duration } => self.qp.time_to_rts(duration),
            Observation::Destroyed {
                device,
                qp_type,
                lifetime,
            } => self.qp.destroyed(&device, qp_type, lifetime),
            Observation::DestroyFailed { errno } => self.qp.destroy_failed(errno),
            Observation::LiveQps {
                device,
                qp_type,
                state,
                delta,
            } => self.qp.live(&device, qp_type, state, delta),
            Observation::AsyncEvent {
                device,
                qp_type,
                event,
            } => self.qp_errors.async_event(&device, qp_type, &event),
            Observation::CompletionError { device, status } => {
                self.qp_errors.completion_error(&device, &status)
            }
            Observation::QpError { cause } => self.qp_errors.error(&cause),
            Observation::Untracked { kind } => self.events.untracked(kind),
            Observation::InvalidState => self.events.invalid_state(),
            Observation::Evicted => self.limits.evicted(),
            Observation::LabelOverflow { label } => self.limits.label_overflow(label),
            Observation::PeerQps {
                device,
                peer,
                delta,
            } => self.peers.peer_qps(&device, &peer, delta),
            Observation::Peers { device, delta } => self.peers.peers(&device, delta),
            Observation::LiveCmIds { state, delta } => self.cm.live_ids(&state, delta),
            Observation::CmEvent {
                event,
                status,
                duration,
                result: _,
            } => self.cm.event(event, &status, duration),
            Observation::CmConnect { role, duration } => self.cm.connect(role, duration),
            Observation::CmAddrResolved { duration } => self.cm.addr_resolved(duration),
            Observation::CmRouteResolved { duration } => self.cm.route_resolved(duration),
            Observation::CmHandler {
                handler,
                event,
                duration,
            } => self.cm.handler(handler, &event, duration),
            Observation::CmCall { call, duration, rc } => self.cm.call(call, duration, rc),
        }
    }

    fn tracked_qps(&mut self, count: usize) {
        self.limits.tracked_qps(count);
    }
}

/// Why the sysfs counters could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SysfsCountersError {
    #[error("registering the sysfs counter families: {0}")]
    Register(#[from] registry::Error),
    #[error("starting the thread that reads the sysfs counters: {0}")]
    Thread(#[from] std::io::Error),
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    registry.render()
}

#[cfg(test)]
mod tests;
