//! The mesh thread: one poll loop over the rdma_cm event channel, every
//! device's completion channel and the control eventfd.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use log::{debug, info, warn};
use qpwatch_common::vocab::CmEventKind;
use rdma_sys::{ibv_wc, ibv_wc_status, rdma_conn_param};

use crate::error::{Errno, Error};
use crate::step::Step;
use crate::time::{monotonic_ns, RunQueueWait};
use crate::verbs::{poll_fds, pollin, AddressHandle, CmEvent, CmId, EventChannel, EventFd};

use crate::guard::{Rate, RateLimiter};

use super::device::{grh_source, AnswerError, Device, Probe, SendError, SEND_FLAG};
use super::schedule::{nanos, phase_due, InFlight, Timers};
use super::wire::{Kind, Message};
use super::{Answer, Clock, Dropped, MeshConfig, MeshSink, MeshStats, MeshTarget};

/// Target resolutions under way at most.
const RESOLVING_MAX: usize = 32;
/// Probes waiting for an answer at most (the oldest is given up beyond).
const IN_FLIGHT_MAX: usize = 65_536;
/// Lost probes in a row after which a target is resolved again.
const LOSSES_BEFORE_RERESOLVE: u32 = 3;
const WC_BATCH: usize = 32;

type TargetId = u64;
type DeviceKey = usize;

/// What the caller's thread hands the mesh thread.
pub struct Control {
    pub wake: EventFd,
    pub stop: AtomicBool,
    pub targets: Mutex<Option<Vec<MeshTarget>>>,
}

#[derive(Default)]
pub struct Counters {
    pub qps: AtomicU64,
    pub threads: AtomicU64,
    pub targets: AtomicU64,
    pub resolved: AtomicU64,
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub lost: AtomicU64,
    pub responded: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> MeshStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MeshStats {
            qps: get(&self.qps) as usize,
            threads: get(&self.threads) as usize,
            targets: get(&self.targets) as usize,
            resolved: get(&self.resolved) as usize,
            sent: get(&self.sent),
            answered: get(&self.answered),
            lost: get(&self.lost),
            responded: get(&self.responded),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Resolving {
    id: Arc<CmId>,
    step: Step,
    deadline: u64,
}

struct Route {
    device: DeviceKey,
    ah: AddressHandle,
    remote_qpn: u32,
    remote_qkey: u32,
}

enum State {
    /// Waiting in `resolve_at` for its (next) resolution.
    Unresolved,
    Resolving(Resolving),
    Resolved(Route),
}

struct Target {
    spec: MeshTarget,
    state: State,
    /// Place in the batch it was added with: its probes' phase.
    phase: (usize, usize),
    attempts: u64,
    losses_in_row: u32,
}

type Identity = (Arc<str>, SocketAddr, Option<IpAddr>);

fn identity(t: &MeshTarget) -> Identity {
    (t.key.clone(), t.address, t.source)
}

pub struct Engine {
    config: MeshConfig,
    sink: Arc<dyn MeshSink>,
    counters: Arc<Counters>,
    control: Arc<Control>,
    /// Probes per target at most (the CLI's `--count`).
    limit: Option<u64>,
    epoch: u64,
    // Fields drop in this order: targets (AHs, ids being resolved), then the
    // devices, the listener and the event channel last.
    targets: HashMap<TargetId, Target>,
    by_identity: HashMap<Identity, TargetId>,
    /// Ids being resolved (raw cm_id pointer) → their target.
    resolving_ids: HashMap<usize, TargetId>,
    resolve_at: Timers<TargetId>,
    send_at: Timers<TargetId>,
    in_flight: InFlight<TargetId>,
    devices: HashMap<DeviceKey, Device>,
    /// Each device's anchor cm_id (raw pointer) → the device.
    anchors: HashMap<usize, DeviceKey>,
    listener: Option<Arc<CmId>>,
    channel: Arc<EventChannel>,
    wc_buf: Vec<ibv_wc>,
    message: Vec<u8>,
    next_target: TargetId,
    next_seq: u64,
    /// Per device, the thread's run-queue wait total (see [`RunQueueWait`])
    /// when its CQ was last seen empty.
    empty_at_wait: HashMap<DeviceKey, u64>,
    /// The thread's run-queue wait since the CQ being drained was last seen
    /// empty: a probe polled now is taken to have come that much earlier,
    /// so a starved responder shows as host delay, not network.
    held_ns: u64,
    /// Per source, the probes answered ([`MeshConfig::answer_rate_per_source`]).
    answer_rate: Option<RateLimiter>,
}

impl Engine {
    /// Binds the listener (if any): the only step that can fail the spawn.
    pub fn new(
        config: MeshConfig,
        sink: Arc<dyn MeshSink>,
        counters: Arc<Counters>,
        control: Arc<Control>,
        limit: Option<u64>,
    ) -> Result<Engine, Error> {
        if config.message_size < super::wire::HEADER_LEN || config.message_size > 4096 {
            return Err(Error::InvalidConfig(format!(
                "mesh message size {} is outside {}..=4096",
                config.message_size,
                super::wire::HEADER_LEN
            )));
        }
        let channel = EventChannel::new()?;
        let listener = match config.listen {
            Some(addr) => {
                let id = CmId::create_udp(&channel)?;
                id.bind_addr(addr)?;
                id.listen(1024)?;
                Some(id)
            }
            None => None,
        };
        let wc_buf = (0..WC_BATCH)
            // SAFETY: ibv_wc is plain old data; all-zero is valid.
            .map(|_| unsafe { MaybeUninit::<ibv_wc>::zeroed().assume_init() })
            .collect();
        Ok(Engine {
            sink,
            counters,
            control,
            limit,
            epoch: monotonic_ns(),
            targets: HashMap::new(),
            by_identity: HashMap::new(),
            resolving_ids: HashMap::new(),
            resolve_at: Timers::default(),
            send_at: Timers::default(),
            in_flight: InFlight::new(IN_FLIGHT_MAX),
            devices: HashMap::new(),
            anchors: HashMap::new(),
            listener,
            channel,
            wc_buf,
            message: Vec::new(),
            next_target: 0,
            next_seq: 1,
            empty_at_wait: HashMap::new(),
            held_ns: 0,
            answer_rate: config
                .answer_rate_per_source
                .map(|rate| RateLimiter::new(rate, rate, super::RATE_LIMITED_SOURCES)),
            config,
        })
    }

    pub fn run(mut self) -> Result<(), Error> {
        let result = self.serve();
        self.teardown();
        result
    }

    fn serve(&mut self) -> Result<(), Error> {
        let mut fds = Vec::new();
        let mut keys = Vec::new();
        let mut run_queue = RunQueueWait::of_this_thread();
        loop {
            if self.control.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let now = monotonic_ns();
            let timeout_ms = self.wake_at().map_or(1000, |at| {
                i32::try_from(at.saturating_sub(now).div_ceil(1_000_000)).unwrap_or(1000)
            });
            fds.clear();
            keys.clear();
            fds.push(pollin(self.control.wake.fd()));
            fds.push(pollin(self.channel.fd()));
            for (key, device) in &self.devices {
                fds.push(pollin(device.channel.fd()));
                keys.push(*key);
            }
            poll_fds(&mut fds, timeout_ms.min(1000))?;
            // poll(2) scans the fds once more when the thread runs again, so
            // a device not readable now had an empty CQ at this point.
            let waited = run_queue.total_ns().unwrap_or(0);
            for (i, key) in keys.iter().enumerate() {
                if fds[i + 2].revents == 0 {
                    self.empty_at_wait.insert(*key, waited);
                }
            }
            if fds[0].revents != 0 {
                self.control.wake.drain();
                if self.control.stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                let update = self.control.targets.lock().ok().and_then(|mut t| t.take());
                if let Some(targets) = update {
                    self.set_targets(targets);
                }
            }
            self.cm_events()?;
            for (i, key) in keys.iter().enumerate() {
                if fds[i + 2].revents != 0 {
                    let now_waited = run_queue.total_ns().unwrap_or(0);
                    let empty_at = self.empty_at_wait.get(key).copied().unwrap_or(now_waited);
                    self.held_ns = now_waited.saturating_sub(empty_at);
                    self.completions(*key);
                    self.empty_at_wait
                        .insert(*key, run_queue.total_ns().unwrap_or(0));
                }
            }
            self.empty_at_wait
                .retain(|key, _| self.devices.contains_key(key));
            self.drop_broken_devices();
            let now = monotonic_ns();
            self.expire(now);
            self.resolution_timeouts(now);
            self.start_resolutions(now);
            self.send_due(now);
        }
    }

    fn wake_at(&mut self) -> Option<u64> {
        let resolve = (self.resolving_ids.len() < RESOLVING_MAX)
            .then(|| self.resolve_at.next_at())
            .flatten();
        let deadlines = self.targets.values().filter_map(|t| match &t.state {
            State::Resolving(r) => Some(r.deadline),
            _ => None,
        });
        [
            self.send_at.next_at(),
            self.in_flight.next_expiry(),
            resolve,
            deadlines.min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn set_targets(&mut self, list: Vec<MeshTarget>) {
        let now = monotonic_ns();
        let wanted: HashMap<Identity, MeshTarget> =
            list.into_iter().map(|t| (identity(&t), t)).collect();
        let gone: Vec<TargetId> = self
            .by_identity
            .iter()
            .filter(|(ident, _)| !wanted.contains_key(*ident))
            .map(|(_, id)| *id)
            .collect();
        for id in gone {
            self.remove_target(id);
        }
        let new_count = wanted
            .keys()
            .filter(|i| !self.by_identity.contains_key(*i))
            .count();
        let mut index = 0;
        for (ident, spec) in wanted {
            if let Some(id) = self.by_identity.get(&ident) {
                if let Some(target) = self.targets.get_mut(id) {
                    target.spec = spec;
                }
                continue;
            }
            let id = self.next_target;
            self.next_target += 1;
            self.targets.insert(
                id,
                Target {
                    spec,
                    state: State::Unresolved,
                    phase: (index, new_count),
                    attempts: 0,
                    losses_in_row: 0,
                },
            );
            index += 1;
            self.by_identity.insert(ident, id);
            self.resolve_at.set(id, now);
        }
        self.counters
            .targets
            .store(self.targets.len() as u64, Ordering::Relaxed);
        self.count_resolved();
    }

    fn remove_target(&mut self, id: TargetId) {
        let Some(target) = self.targets.remove(&id) else {
            return;
        };
        self.by_identity.remove(&identity(&target.spec));
        self.resolve_at.remove(id);
        self.send_at.remove(id);
        self.in_flight.forget(id);
        if let State::Resolving(r) = &target.state {
            self.resolving_ids.remove(&(r.id.raw() as usize));
        }
    }

    fn count_resolved(&self) {
        let resolved = self
            .targets
            .values()
            .filter(|t| matches!(t.state, State::Resolved(_)))
            .count();
        self.counters
            .resolved
            .store(resolved as u64, Ordering::Relaxed);
    }

    // ---- rdma_cm: resolution (SIDR) and the listener ----

    fn cm_events(&mut self) -> Result<(), Error> {
        while let Some(event) = self.channel.next_event(0)? {
            if event.kind == CmEventKind::ConnectRequest {
                self.accept(event);
            } else if let Some(&id) = self.resolving_ids.get(&(event.id as usize)) {
                self.resolution_event(id, event);
            } else if let Some(&key) = self.anchors.get(&(event.id as usize)) {
                if event.kind == CmEventKind::DeviceRemoval {
                    warn!("mesh: device removal on the UD QP's device");
                    if let Some(device) = self.devices.get_mut(&key) {
                        device.broken = true;
                    }
                }
            } else {
                let on_listener = self.listener.as_ref().is_some_and(|l| l.raw() == event.id);
                if on_listener {
                    warn!(
                        "mesh: UD listener got {} (status {})",
                        event.kind, event.status
                    );
                } else {
                    debug!("mesh: stray {} event", event.kind);
                }
            }
        }
        Ok(())
    }

    /// The UD QP of the device `id` is bound to, created if need be.
    fn device_of(&mut self, id: &CmId) -> Result<DeviceKey, Error> {
        let key = id.verbs()?.as_ptr() as DeviceKey;
        if self.devices.contains_key(&key) {
            return Ok(key);
        }
        // The device's verbs objects hang on a cm_id of their own: librdmacm
        // may close a device context with its last cm_id (ucma_put_device),
        // and the ids of targets and requests come and go.
        let anchor = CmId::create_udp(&self.channel)?;
        let local = id.local_addr().ok_or(Error::Cm {
            call: "rdma_get_local_addr",
            errno: Errno(libc::EADDRNOTAVAIL),
        })?;
        anchor.bind_addr(SocketAddr::new(local.ip(), 0))?;
        if anchor.verbs()?.as_ptr() as DeviceKey != key {
            return Err(Error::Cm {
                call: "rdma_bind_addr",
                errno: Errno(libc::ENODEV),
            });
        }
        let anchor_raw = anchor.raw() as usize;
        let (mut device, calls) = Device::create(anchor, self.config.message_size)?;
        device.malformed.clone_from(&self.config.malformed);
        match device.completion_clock_khz {
            Some(khz) => info!(
                "mesh: {}: the device stamps completions ({khz} kHz core clock); \
                 the mesh times with CLOCK_MONOTONIC",
                device.name
            ),
            None => debug!("mesh: {}: no completion timestamps", device.name),
        }
        self.sink.qp_created(&device.name, device.qp_num(), &calls);
        self.anchors.insert(anchor_raw, key);
        self.devices.insert(key, device);
        self.counters
            .qps
            .store(self.devices.len() as u64, Ordering::Relaxed);
        Ok(key)
    }

    fn accept(&mut self, event: CmEvent) {
        // SAFETY: `event.id` is the new id of a CONNECT_REQUEST received on
        // our channel, adopted once here.
        let Some(request) = (unsafe { CmId::adopt(event.id, &self.channel) }) else {
            return;
        };
        let source = request.peer_addr().map(|a| a.ip());
        if !source.is_some_and(|ip| self.config.allow.allows(ip)) {
            debug!("mesh: refusing a SIDR request from {source:?}");
            let _ = request.reject();
            self.sink.dropped(Dropped::SidrNotAllowed);
            return;
        }
        let key = match self.device_of(&request) {
            Ok(key) => key,
            Err(e) => {
                warn!("mesh: no UD QP for a SIDR request: {e}");
                let _ = request.reject();
                return;
            }
        };
        let mut param = sidr_param(self.devices[&key].qp_num());
        // SIDR REP: librdmacm's rdma_accept takes qp_num from `param` for an
        // id without a QP; the kernel (cma_send_sidr_rep) sends it with the
        // Q_Key of RDMA_PS_UDP.
        if let Err(e) = request.accept(&mut param) {
            warn!("mesh: answering a SIDR request failed: {e}");
        }
        // Dropping `request` destroys the id: the REP is already sent.
    }

    fn start_resolutions(&mut self, now: u64) {
        while self.resolving_ids.len() < RESOLVING_MAX {
            let Some((id, _)) = self.resolve_at.pop_due(now) else {
                return;
            };
            let Some(target) = self.targets.get(&id) else {
                continue;
            };
            let spec = target.spec.clone();
            let started = CmId::create_udp(&self.channel).and_then(|cm_id| {
                cm_id.resolve_addr(
                    spec.source.map(|ip| SocketAddr::new(ip, 0)),
                    spec.address,
                    timeout_ms(&self.config),
                )?;
                Ok(cm_id)
            });
            match started {
                Ok(cm_id) => {
                    self.resolving_ids.insert(cm_id.raw() as usize, id);
                    if let Some(target) = self.targets.get_mut(&id) {
                        target.state = State::Resolving(Resolving {
                            id: cm_id,
                            step: Step::AddrResolve,
                            deadline: now.saturating_add(nanos(self.config.resolve_timeout)),
                        });
                    }
                }
                Err(e) => self.resolution_failed(id, e),
            }
        }
    }

    fn resolution_event(&mut self, id: TargetId, event: CmEvent) {
        let Some(Target {
            state: State::Resolving(r),
            ..
        }) = self.targets.get(&id)
        else {
            return;
        };
        let (cm_id, step) = (r.id.clone(), r.step);
        let expected = match step {
            Step::AddrResolve => CmEventKind::AddrResolved,
            Step::RouteResolve => CmEventKind::RouteResolved,
            _ => CmEventKind::Established,
        };
        if event.kind != expected || event.status != 0 {
            return self.resolution_failed(
                id,
                Error::CmEvent {
                    step,
                    expected,
                    got: event.kind,
                    status: event.status,
                },
            );
        }
        let next = match step {
            Step::AddrResolve => self
                .device_of(&cm_id)
                .and_then(|_| cm_id.resolve_route(timeout_ms(&self.config)))
                .map(|()| Some(Step::RouteResolve)),
            Step::RouteResolve => self.device_of(&cm_id).and_then(|key| {
                let mut param = sidr_param(self.devices[&key].qp_num());
                cm_id.connect(&mut param)?;
                Ok(Some(Step::Connect))
            }),
            _ => self.resolved(id, &cm_id, &event).map(|()| None),
        };
        match next {
            Ok(Some(step)) => {
                if let Some(Target {
                    state: State::Resolving(r),
                    ..
                }) = self.targets.get_mut(&id)
                {
                    r.step = step;
                }
            }
            Ok(None) => {}
            Err(e) => self.resolution_failed(id, e),
        }
    }

    /// SIDR answered: the AH to the peer's UD QP; the cm_id is done.
    fn resolved(&mut self, id: TargetId, cm_id: &CmId, event: &CmEvent) -> Result<(), Error> {
        let key = self.device_of(cm_id)?;
        let device = &self.devices[&key];
        let ah = AddressHandle::create(&device.pd, &event.ud.ah_attr)?;
        let device_name = device.name.clone();
        let now = monotonic_ns();
        self.resolving_ids.remove(&(cm_id.raw() as usize));
        let Some(target) = self.targets.get_mut(&id) else {
            return Ok(());
        };
        target.state = State::Resolved(Route {
            device: key,
            ah,
            remote_qpn: event.ud.qp_num,
            remote_qkey: event.ud.qkey,
        });
        target.losses_in_row = 0;
        // The first probe goes at once (a target discovered from a live
        // QP is probed within an interval); the next ones on its grid slot.
        self.send_at.set(id, now);
        self.sink
            .resolved(&target.spec.key, &device_name, event.ud.qp_num);
        self.count_resolved();
        Ok(())
    }

    fn resolution_failed(&mut self, id: TargetId, error: Error) {
        let Some(target) = self.targets.get_mut(&id) else {
            return;
        };
        if let State::Resolving(r) = &target.state {
            self.resolving_ids.remove(&(r.id.raw() as usize));
        }
        target.state = State::Unresolved;
        let retry = monotonic_ns().saturating_add(nanos(self.config.resolve_retry));
        self.resolve_at.set(id, retry);
        self.sink.resolve_failed(&target.spec.key, &error);
    }

    fn resolution_timeouts(&mut self, now: u64) {
        let late: Vec<(TargetId, Step)> = self
            .targets
            .iter()
            .filter_map(|(id, t)| match &t.state {
                State::Resolving(r) if r.deadline <= now => Some((*id, r.step)),
                _ => None,
            })
            .collect();
        for (id, step) in late {
            let timeout = self.config.resolve_timeout;
            self.resolution_failed(id, Error::Timeout { step, timeout });
        }
    }

    /// Forgets a target's route (a failed send, lost probes, a device gone)
    /// and resolves it again at once.
    fn unresolve(&mut self, id: TargetId) {
        let Some(target) = self.targets.get_mut(&id) else {
            return;
        };
        if !matches!(target.state, State::Resolved(_)) {
            return;
        }
        target.state = State::Unresolved;
        target.losses_in_row = 0;
        self.send_at.remove(id);
        self.resolve_at.set(id, monotonic_ns());
        self.count_resolved();
    }

    // ---- probes ----

    fn send_due(&mut self, now: u64) {
        while let Some((id, _due)) = self.send_at.pop_due(now) {
            let Some(target) = self.targets.get_mut(&id) else {
                continue;
            };
            let State::Resolved(route) = &target.state else {
                continue;
            };
            if self.limit.is_some_and(|limit| target.attempts >= limit) {
                continue;
            }
            target.attempts += 1;
            let key = target.spec.key.clone();
            let interval = target.spec.interval;
            let (index, count) = target.phase;
            let Some(device) = self.devices.get_mut(&route.device) else {
                continue;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let sent = device.send(
                |ts| Message::probe(seq, ts),
                &route.ah,
                route.remote_qpn,
                route.remote_qkey,
                Some(Probe { target: id, seq }),
            );
            let more = self.limit.is_none_or(|limit| target.attempts < limit);
            if more {
                // the next slot of the target's grid: no catch-up burst
                // when the mesh fell behind
                let next = phase_due(monotonic_ns() + 1, self.epoch, interval, index, count);
                self.send_at.set(id, next);
            }
            match sent {
                Ok(sent_ns) => {
                    bump(&self.counters.sent);
                    self.sink.sent(&key);
                    let timeout = self.config.timeout;
                    if let Some((seq, evicted)) = self.in_flight.insert(seq, id, sent_ns, timeout) {
                        self.probe_lost(evicted, seq);
                    }
                }
                Err(SendError::QueueFull) => {
                    bump(&self.counters.lost);
                    let error = Error::Verbs {
                        call: "ibv_post_send",
                        errno: Errno(libc::ENOBUFS),
                    };
                    self.sink.send_failed(&key, &error);
                }
                Err(SendError::Post(error)) => {
                    bump(&self.counters.lost);
                    self.sink.send_failed(&key, &error);
                    self.unresolve(id);
                }
            }
        }
    }

    fn probe_lost(&mut self, id: TargetId, seq: u64) {
        let Some(target) = self.targets.get_mut(&id) else {
            return;
        };
        bump(&self.counters.lost);
        self.sink.lost(&target.spec.key, seq);
        target.losses_in_row += 1;
        if target.losses_in_row >= LOSSES_BEFORE_RERESOLVE {
            self.unresolve(id);
        }
    }

    fn expire(&mut self, now: u64) {
        for (seq, id) in self.in_flight.expire(now) {
            self.probe_lost(id, seq);
        }
    }

    // ---- completions ----

    fn completions(&mut self, key: DeviceKey) {
        let Some(device) = self.devices.get(&key) else {
            return;
        };
        if let Err(e) = device.channel.take_event(&device.cq) {
            warn!("mesh: {} completion channel: {e}", device.name);
        }
        let mut wcs = std::mem::take(&mut self.wc_buf);
        // Drain, re-arm, drain again: completions that arrived between the
        // last poll and the arm raise no event (ibv_req_notify_cq(3)).
        for _ in 0..2 {
            while let Some(device) = self.devices.get(&key) {
                let n = match device.cq.poll_wc(&mut wcs) {
                    Ok(n) => n,
                    Err(e) => {
                        warn!("mesh: {}: {e}", device.name);
                        0
                    }
                };
                let now = monotonic_ns();
                for wc in &mut wcs[..n] {
                    self.completion(key, wc, now);
                }
                if n < wcs.len() {
                    break;
                }
            }
            if let Some(device) = self.devices.get(&key) {
                if let Err(e) = device.cq.arm() {
                    warn!("mesh: {}: {e}", device.name);
                }
            }
        }
        self.wc_buf = wcs;
    }

    fn completion(&mut self, key: DeviceKey, wc: &mut ibv_wc, now: u64) {
        let Some(device) = self.devices.get_mut(&key) else {
            return;
        };
        let ok = wc.status == ibv_wc_status::IBV_WC_SUCCESS;
        if wc.wr_id & SEND_FLAG != 0 {
            let owner = device.send_done((wc.wr_id & !SEND_FLAG) as usize);
            if !ok {
                warn!(
                    "mesh: {}: send completion failed (status {})",
                    device.name, wc.status
                );
                if let Some(probe) = owner {
                    self.unresolve(probe.target);
                }
            } else if let Some(probe) = owner.filter(|_| self.config.rtt_breakdown) {
                self.in_flight.send_completed(probe.seq, now);
            }
            return;
        }
        let slot = wc.wr_id as usize;
        if !ok {
            if wc.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                device.broken = true;
            } else {
                self.sink.dropped(Dropped::Malformed);
                let _ = device.repost(slot);
            }
            return;
        }
        let mut message = std::mem::take(&mut self.message);
        let mut grh = device.received(slot, wc.byte_len as usize, &mut message);
        if let Err(e) = device.repost(slot) {
            warn!("mesh: {}: {e}", device.name);
            device.broken = true;
        }
        match Message::decode(&message) {
            Err(_) => self.sink.dropped(Dropped::Malformed),
            Ok(probe) if probe.kind == Kind::Probe => {
                let has_grh = wc.wc_flags & rdma_sys::ibv_wc_flags::IBV_WC_GRH.0 != 0;
                let source = has_grh.then(|| grh_source(&grh));
                let allowed = match source {
                    Some(ip) => self.config.allow.allows(ip),
                    None => self.config.allow.subnets().is_empty(),
                };
                if !allowed {
                    self.sink.dropped(Dropped::NotAllowed);
                    self.message = message;
                    return;
                }
                let rate = match (source, self.answer_rate.as_mut()) {
                    (Some(ip), Some(limiter)) => limiter.check(ip, now),
                    _ => Rate::Allowed,
                };
                if rate != Rate::Allowed {
                    self.sink.dropped(if rate == Rate::Limited {
                        Dropped::RateLimited
                    } else {
                        Dropped::RateTableFull
                    });
                    self.message = message;
                    return;
                }
                let received = now.saturating_sub(self.held_ns);
                let answered = device.answer(wc, &mut grh, |tx| probe.answer(received, tx));
                match answered {
                    Ok(()) => {
                        bump(&self.counters.responded);
                        self.sink.responded(&device.name);
                    }
                    Err(AnswerError::NoReturnPath(e)) => {
                        debug!("mesh: no route back to QP {:#x}: {e}", wc.src_qp);
                        self.sink.dropped(Dropped::NoReturnPath);
                    }
                    Err(AnswerError::QueueFull) => self.sink.dropped(Dropped::SendQueueFull),
                    Err(AnswerError::Post(e)) => {
                        warn!("mesh: {}: answering: {e}", device.name);
                        self.sink.dropped(Dropped::NoReturnPath);
                    }
                }
            }
            Ok(answer) => match self.in_flight.answer(answer.seq, answer.sender_ts_ns, now) {
                None => self.sink.dropped(Dropped::UnknownAnswer),
                Some(sent) => {
                    if let Some(target) = self.targets.get_mut(&sent.target) {
                        target.losses_in_row = 0;
                        bump(&self.counters.answered);
                        self.sink.answered(
                            &target.spec.key,
                            &Answer {
                                seq: answer.seq,
                                sent_ns: sent.sent_ns,
                                received_ns: now,
                                responder_rx_ns: answer.responder_rx_ns,
                                responder_tx_ns: answer.responder_tx_ns,
                                prober_delay_ns: self
                                    .config
                                    .rtt_breakdown
                                    .then(|| sent.prober_delay_ns(now)),
                                clock: Clock::Software,
                            },
                        );
                    }
                }
            },
        }
        self.message = message;
    }

    fn drop_broken_devices(&mut self) {
        let broken: Vec<DeviceKey> = self
            .devices
            .iter()
            .filter(|(_, d)| d.broken)
            .map(|(k, _)| *k)
            .collect();
        for key in broken {
            let on_device: Vec<TargetId> = self
                .targets
                .iter()
                .filter(|(_, t)| matches!(&t.state, State::Resolved(r) if r.device == key))
                .map(|(id, _)| *id)
                .collect();
            for id in on_device {
                self.unresolve(id);
            }
            if let Some(device) = self.devices.remove(&key) {
                warn!("mesh: {}: UD QP failed, making a new one", device.name);
                self.anchors.remove(&(device.anchor.raw() as usize));
            }
        }
        self.counters
            .qps
            .store(self.devices.len() as u64, Ordering::Relaxed);
    }

    fn teardown(&mut self) {
        // AHs and ids of targets, then every device's AHs, QP, MRs, CQ,
        // channel, PD and anchor id, then the listener; the event channel
        // goes with `self`.
        self.targets.clear();
        self.resolving_ids.clear();
        self.devices.clear();
        self.anchors.clear();
        self.listener = None;
        self.counters.qps.store(0, Ordering::Relaxed);
        self.counters.threads.store(0, Ordering::Relaxed);
    }
}

fn timeout_ms(config: &MeshConfig) -> i32 {
    i32::try_from(config.resolve_timeout.as_millis())
        .unwrap_or(i32::MAX)
        .max(1)
}

fn sidr_param(qp_num: u32) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num,
    }
}
