//! The per-QP state machine: turns completed kernel calls into lifecycle
//! observations (latencies, dwell times, live-QP deltas).
//!
//! Keyed by (device, qp_num). Pure logic, no I/O: every observation goes to an
//! [`Observer`], which the metrics registry implements and tests record.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use fnv::FnvHashMap;
use qpwatch_common::{QpOrigin, COMM_LEN, DEVICE_NAME_LEN};

use crate::{
    kernel::rdma::{Gid, QpState, QpType},
    model::{
        cgroups::{CgroupLabels, CgroupNames},
        events::{Call, QpCall},
        peers::Peers,
        qp_errors::{
            cause_of_completion, cause_of_event, ErrorNames, CAUSE_REQUESTED, CAUSE_UNKNOWN,
        },
    },
};

/// A metric label value shared between observations without copying.
pub type Label = Arc<str>;

/// Label used once a label cap is reached.
pub const OTHER: &str = "other";

#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    Created {
        device: Label,
        qp_type: QpType,
        origin: QpOrigin,
        /// The creating task's name, capped by `max_process_labels`.
        comm: Label,
        /// The creating task's cgroup path, capped by `max_cgroup_labels`.
        cgroup: Label,
        duration: Duration,
    },
    CreateFailed {
        device: Label,
        origin: QpOrigin,
        errno: i32,
    },
    /// A successful modify with `IB_QP_STATE`; `from` is `None` when the QP's
    /// previous state is unknown (it existed before qpwatch saw it).
    Transition {
        from: Option<QpState>,
        to: QpState,
        duration: Duration,
    },
    /// A modify that returned an error; the state is unchanged.
    ModifyFailed {
        to: Option<QpState>,
        errno: i32,
    },
    /// Time a QP spent in `state`: from the end of the call that entered it to
    /// the start of the call that left it (the next transition or the destroy).
    Dwell {
        state: QpState,
        duration: Duration,
    },
    /// From the end of create to the end of the first transition into RTS.
    TimeToRts {
        duration: Duration,
    },
    /// `lifetime` (create end → destroy end) is `None` for QPs created before
    /// qpwatch saw them.
    Destroyed {
        device: Label,
        qp_type: QpType,
        lifetime: Option<Duration>,
    },
    DestroyFailed {
        errno: i32,
    },
    /// Change of the live-QP gauge for (device, qp_type, state).
    LiveQps {
        device: Label,
        qp_type: QpType,
        state: QpState,
        delta: i64,
    },
    /// A modify or destroy for a QP the table did not know.
    Untracked {
        kind: &'static str,
    },
    /// A QP dropped from the full table to make room.
    Evicted,
    /// A modify whose state value the kernel does not define.
    InvalidState,
    /// A label value folded into "other" because its cap was reached.
    LabelOverflow {
        label: &'static str,
    },
    /// Change of the live QPs of `device` connected to the remote `peer`
    /// (a capped label).
    PeerQps {
        device: Label,
        peer: Label,
        delta: i64,
    },
    /// Change of the number of distinct remote peers of `device`.
    Peers {
        device: Label,
        delta: i64,
    },
    /// A QP async event reached its consumer's handler.
    AsyncEvent {
        device: Label,
        qp_type: QpType,
        event: Label,
    },
    /// The device completed a work request in error (flushes left out).
    CompletionError {
        device: Label,
        status: Label,
    },
    /// A QP entered ERR, and why: `requested` by its owner, after an async
    /// event (`async_event:QP_FATAL`), after an error completion
    /// (`completion:RETRY_EXC_ERR`), or `unknown`.
    QpError {
        cause: Label,
    },
    /// Change of the live CM id gauge.
    LiveCmIds {
        state: Label,
        delta: i64,
    },
    /// An RDMA CM event delivered through `cma_cm_event_handler`; `result` is
    /// the consumer's return code.
    CmEvent {
        event: &'static str,
        status: Label,
        duration: Duration,
        result: i32,
    },
    /// Connection setup: active = REQ sent → established, passive =
    /// CONNECT_REQUEST → ESTABLISHED.
    CmConnect {
        role: &'static str,
        duration: Duration,
    },
    /// `rdma_resolve_addr` → ADDR_RESOLVED.
    CmAddrResolved {
        duration: Duration,
    },
    /// `rdma_resolve_route` → ROUTE_RESOLVED.
    CmRouteResolved {
        duration: Duration,
    },
    /// An IB CM or ucma handler invocation.
    CmHandler {
        handler: &'static str,
        event: Label,
        duration: Duration,
    },
    /// A completed rdma_cm call (bind, resolve, listen, connect, accept,
    /// disconnect, rdma_create_qp/rdma_destroy_qp, the CMA's QP transitions).
    CmCall {
        call: &'static str,
        duration: Duration,
        rc: i32,
    },
}

pub trait Observer {
    fn observe(&mut self, observation: Observation);
    /// Size of the QP table after each call.
    fn tracked_qps(&mut self, _count: usize) {}
}

impl Observer for Vec<Observation> {
    fn observe(&mut self, observation: Observation) {
        self.push(observation);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// QPs tracked at once; beyond it the oldest tracked QP is evicted.
    pub max_tracked_qps: usize,
    /// Distinct device label values; further devices share `device="other"`.
    pub max_device_labels: usize,
    /// Distinct `comm` label values of `qpwatch_qp_created_by_process_total`.
    pub max_process_labels: usize,
    /// Distinct `peer` label values of `qpwatch_peer_qps`.
    pub max_peer_labels: usize,
    /// Distinct `cgroup` label values of `qpwatch_qp_created_by_cgroup_total`.
    pub max_cgroup_labels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tracked_qps: 262_144,
            max_device_labels: 64,
            max_process_labels: 20,
            max_peer_labels: 64,
            max_cgroup_labels: 64,
        }
    }
}

#[derive(Debug, Clone)]
struct Tracked {
    device: Label,
    qp_type: QpType,
    state: QpState,
    created_ns: Option<u64>,
    state_since_ns: Option<u64>,
    reached_rts: bool,
    generation: u64,
    /// The remote GID of its last modify with an address vector, until it
    /// is reset or destroyed.
    peer: Option<Gid>,
    /// The status of its last completion in error (not a flush), the cause
    /// if the device moves it to ERR next.
    completion_error: Option<Label>,
}

impl Tracked {
    /// Moves the QP from its state to `to`, a different one: the time it
    /// spent there (until `left_ns`), the live-QP gauge, `to` since
    /// `entered_ns`.
    fn move_to(&mut self, to: QpState, left_ns: u64, entered_ns: u64, out: &mut impl Observer) {
        let from = self.state;
        if let Some(since_ns) = self.state_since_ns {
            out.observe(Observation::Dwell {
                state: from,
                duration: since(since_ns, left_ns),
            });
        }
        for (state, delta) in [(from, -1), (to, 1)] {
            out.observe(Observation::LiveQps {
                device: Arc::clone(&self.device),
                qp_type: self.qp_type,
                state,
                delta,
            });
        }
        self.state = to;
        self.state_since_ns = Some(entered_ns);
    }

    /// A QP known from the kernel's list (netlink), not from its create event.
    fn adopted(device: Label, qp_type: QpType, state: QpState) -> Self {
        Self {
            device,
            qp_type,
            state,
            created_ns: None,
            state_since_ns: None,
            reached_rts: state == QpState::Rts,
            generation: 0,
            peer: None,
            completion_error: None,
        }
    }
}

/// Interned device names: the QP key uses the index, metrics the (capped) label.
#[derive(Debug)]
struct Devices {
    names: Vec<([u8; DEVICE_NAME_LEN], Label)>,
    other: Label,
}

/// Devices beyond this share one key (and qp_num collisions among them are possible).
const MAX_DEVICES: usize = 4096;

impl Devices {
    /// Returns the key, the label and whether the label cap folded it into "other".
    /// `name` is the raw name as text, read only for a name not seen before.
    fn intern<'a>(
        &mut self,
        raw: &[u8; DEVICE_NAME_LEN],
        name: impl FnOnce() -> &'a str,
        label_cap: usize,
    ) -> (u32, Label, bool) {
        if let Some(i) = self.names.iter().position(|(n, _)| n == raw) {
            let label = Arc::clone(&self.names[i].1);
            let capped = Arc::ptr_eq(&label, &self.other);
            return (i as u32, label, capped);
        }
        let other = Arc::clone(&self.other);
        if self.names.len() >= MAX_DEVICES {
            return (MAX_DEVICES as u32, other, true);
        }
        let capped = self.names.len() >= label_cap;
        let label = if capped { other } else { Arc::from(name()) };
        self.names.push((*raw, Arc::clone(&label)));
        ((self.names.len() - 1) as u32, label, capped)
    }
}

/// First-come label values up to a cap; later values share "other".
#[derive(Debug)]
struct CappedLabels {
    values: FnvHashMap<[u8; COMM_LEN], Label>,
    cap: usize,
    other: Label,
}

impl CappedLabels {
    fn new(cap: usize, other: Label) -> Self {
        Self {
            values: FnvHashMap::default(),
            cap,
            other,
        }
    }

    /// `name` is the raw value as text, read only for a value not seen before.
    fn get<'a>(&mut self, raw: &[u8; COMM_LEN], name: impl FnOnce() -> &'a str) -> (Label, bool) {
        if let Some(label) = self.values.get(raw) {
            return (Arc::clone(label), false);
        }
        if self.values.len() >= self.cap {
            return (Arc::clone(&self.other), true);
        }
        let label: Label = Arc::from(name());
        self.values.insert(*raw, Arc::clone(&label));
        (label, false)
    }
}

pub struct Correlator {
    limits: Limits,
    /// FNV: SipHash was a tenth of the pipeline's time (`benches/pipeline.rs`).
    qps: FnvHashMap<u64, Tracked>,
    /// Insertion order of the table, for eviction; entries whose generation no
    /// longer matches are stale and skipped.
    order: VecDeque<(u64, u64)>,
    next_generation: u64,
    devices: Devices,
    comms: CappedLabels,
    cgroups: CgroupLabels,
    peers: Peers,
    error_names: ErrorNames,
    /// What the last handled call told about the QP beyond its state.
    last_detail: QpDetail,
}

/// What a call told about its QP beyond the state: the async event, the
/// completion status, the cause of an entry into ERR (`qpwatch events`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QpDetail {
    pub async_event: Option<Label>,
    pub completion_status: Option<Label>,
    pub err_cause: Option<Label>,
}

fn key(device: u32, qp_num: u32) -> u64 {
    (u64::from(device) << 32) | u64::from(qp_num)
}

fn since(start: u64, end: u64) -> Duration {
    Duration::from_nanos(end.saturating_sub(start))
}

impl Correlator {
    /// Names the cgroup ids of QP creates (without it, all are `"unknown"`).
    pub fn set_cgroup_names(&mut self, names: Box<dyn CgroupNames>) {
        self.cgroups.set_names(names);
    }

    /// A cgroup id's full path, if it can be named (for `qpwatch events`).
    pub fn cgroup_path(&mut self, id: u64) -> Option<Arc<str>> {
        self.cgroups.path(id)
    }

    pub fn new(limits: Limits) -> Self {
        let other: Label = Arc::from(OTHER);
        Self {
            limits,
            qps: FnvHashMap::default(),
            order: VecDeque::new(),
            next_generation: 0,
            devices: Devices {
                names: Vec::new(),
                other: Arc::clone(&other),
            },
            comms: CappedLabels::new(limits.max_process_labels, Arc::clone(&other)),
            cgroups: CgroupLabels::new(limits.max_cgroup_labels, Arc::clone(&other)),
            peers: Peers::new(limits.max_peer_labels, other),
            error_names: ErrorNames::default(),
            last_detail: QpDetail::default(),
        }
    }

    /// Names of `enum ib_event_type` by value, from the kernel's BTF.
    pub fn set_async_event_names(&mut self, names: Vec<Option<String>>) {
        self.error_names.set_async_events(names);
    }

    /// Names of `enum ib_wc_status` by value, from the kernel's BTF.
    pub fn set_completion_status_names(&mut self, names: Vec<Option<String>>) {
        self.error_names.set_completion_status(names);
    }

    /// Every cause of an entry into ERR the known names can give.
    pub fn err_causes(&self) -> Vec<Label> {
        self.error_names.causes()
    }

    /// What the last [`Correlator::handle`]d call told beyond the state.
    pub fn take_detail(&mut self) -> QpDetail {
        std::mem::take(&mut self.last_detail)
    }

    fn device<'a>(
        &mut self,
        raw: &[u8; DEVICE_NAME_LEN],
        name: impl FnOnce() -> &'a str,
        out: &mut impl Observer,
    ) -> (u32, Label) {
        let (key, label, capped) = self
            .devices
            .intern(raw, name, self.limits.max_device_labels);
        if capped {
            out.observe(Observation::LabelOverflow { label: "device" });
        }
        (key, label)
    }

    pub fn tracked(&self) -> usize {
        self.qps.len()
    }

    /// The remote peers of the live QPs.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Current state of a tracked QP.
    pub fn state_of(&mut self, device: &str, qp_num: u32) -> Option<QpState> {
        let raw = device_bytes(device);
        let (dev, _, _) = self
            .devices
            .intern(&raw, || device, self.limits.max_device_labels);
        self.qps.get(&key(dev, qp_num)).map(|t| t.state)
    }

    pub fn handle(&mut self, call: &QpCall, out: &mut impl Observer) {
        self.last_detail = QpDetail::default();
        let (dev, device) = self.device(call.device_bytes(), || call.device(), out);
        let k = key(dev, call.qp_num);
        match call.call {
            Call::Create { origin } => self.on_create(k, device, call, origin, out),
            Call::Modify {
                to, invalid_state, ..
            } => self.on_modify(k, device, call, to, invalid_state, out),
            Call::Destroy => self.on_destroy(k, device, call, out),
            Call::AsyncEvent { event } => self.on_async_event(k, device, call, event, out),
            Call::CompletionError { status } => {
                self.on_completion_error(k, device, status, out);
            }
            Call::DeviceError => {
                let cause = self
                    .qps
                    .get_mut(&k)
                    .and_then(|t| t.completion_error.take())
                    .map_or_else(|| Arc::from(CAUSE_UNKNOWN), |s| cause_of_completion(&s));
                self.enter_err(k, call.end_ns, cause, out);
            }
        }
        out.tracked_qps(self.qps.len());
    }

    fn on_async_event(
        &mut self,
        k: u64,
        device: Label,
        call: &QpCall,
        event: u32,
        out: &mut impl Observer,
    ) {
        let name = self.error_names.async_event(event);
        out.observe(Observation::AsyncEvent {
            device,
            qp_type: call.qp_type,
            event: Arc::clone(&name),
        });
        self.last_detail.async_event = Some(Arc::clone(&name));
        if let Some(cause) = cause_of_event(&name) {
            self.enter_err(k, call.end_ns, cause, out);
        }
    }

    fn on_completion_error(&mut self, k: u64, device: Label, status: u32, out: &mut impl Observer) {
        let name = self.error_names.completion_status(status);
        out.observe(Observation::CompletionError {
            device,
            status: Arc::clone(&name),
        });
        self.last_detail.completion_status = Some(Arc::clone(&name));
        if let Some(tracked) = self.qps.get_mut(&k) {
            if tracked.state != QpState::Err && tracked.completion_error.is_none() {
                tracked.completion_error = Some(name);
            }
        }
    }

    /// The device (not a modify) put the QP in ERR for `cause`; a QP already
    /// in ERR keeps its first cause.
    fn enter_err(&mut self, k: u64, at_ns: u64, cause: Label, out: &mut impl Observer) {
        if let Some(tracked) = self.qps.get_mut(&k) {
            if tracked.state == QpState::Err {
                return;
            }
            tracked.move_to(QpState::Err, at_ns, at_ns, out);
        }
        self.entered_err(cause, out);
    }

    /// A QP entered ERR for `cause`: counted, and told to `qpwatch events`.
    fn entered_err(&mut self, cause: Label, out: &mut impl Observer) {
        self.last_detail.err_cause = Some(Arc::clone(&cause));
        out.observe(Observation::QpError { cause });
    }

    /// Starts tracking a QP that existed before qpwatch (from the netlink view).
    /// Returns false if it was already tracked.
    pub fn adopt(
        &mut self,
        device: &str,
        qp_num: u32,
        qp_type: QpType,
        state: QpState,
        out: &mut impl Observer,
    ) -> bool {
        let raw = device_bytes(device);
        let (dev, label) = self.device(&raw, || device, out);
        let k = key(dev, qp_num);
        if self.qps.contains_key(&k) {
            return false;
        }
        self.insert(k, Tracked::adopted(label, qp_type, state), out);
        out.tracked_qps(self.qps.len());
        true
    }

    /// Makes the table agree with a snapshot of the kernel's QPs (netlink),
    /// taken after the hooks were attached and the events of the attach
    /// window were processed: a listed QP is adopted, or moved to its listed
    /// state; a tracked QP the kernel does not list was destroyed while the
    /// hooks were being attached (its destroy may never have been seen) and
    /// is dropped. Returns (adopted, dropped).
    pub fn reconcile(
        &mut self,
        listed: &[(&str, u32, QpType, QpState)],
        out: &mut impl Observer,
    ) -> (usize, usize) {
        let mut seen = std::collections::HashSet::with_capacity(listed.len());
        let mut adopted = 0;
        for &(device, qp_num, qp_type, state) in listed {
            let raw = device_bytes(device);
            let (dev, label) = self.device(&raw, || device, out);
            let k = key(dev, qp_num);
            seen.insert(k);
            match self.qps.get_mut(&k) {
                Some(t) if t.state != state => {
                    out.observe(Observation::LiveQps {
                        device: Arc::clone(&t.device),
                        qp_type: t.qp_type,
                        state: t.state,
                        delta: -1,
                    });
                    t.state = state;
                    t.state_since_ns = None;
                    t.reached_rts |= state == QpState::Rts;
                    out.observe(Observation::LiveQps {
                        device: Arc::clone(&t.device),
                        qp_type: t.qp_type,
                        state,
                        delta: 1,
                    });
                }
                Some(_) => {}
                None => {
                    self.insert(k, Tracked::adopted(label, qp_type, state), out);
                    adopted += 1;
                }
            }
        }
        let stale: Vec<u64> = self
            .qps
            .keys()
            .filter(|k| !seen.contains(k))
            .copied()
            .collect();
        for &k in &stale {
            self.remove(k, out);
        }
        out.tracked_qps(self.qps.len());
        (adopted, stale.len())
    }

    fn insert(&mut self, k: u64, mut tracked: Tracked, out: &mut impl Observer) {
        if self.qps.len() >= self.limits.max_tracked_qps {
            self.evict_oldest(out);
        }
        self.next_generation += 1;
        tracked.generation = self.next_generation;
        out.observe(Observation::LiveQps {
            device: Arc::clone(&tracked.device),
            qp_type: tracked.qp_type,
            state: tracked.state,
            delta: 1,
        });
        self.order.push_back((k, tracked.generation));
        self.qps.insert(k, tracked);
        if self.order.len() > 2 * self.qps.len() + 1024 {
            let qps = &self.qps;
            self.order
                .retain(|(k, generation)| qps.get(k).is_some_and(|t| t.generation == *generation));
        }
    }

    fn remove(&mut self, k: u64, out: &mut impl Observer) -> Option<Tracked> {
        let tracked = self.qps.remove(&k)?;
        if let Some(gid) = tracked.peer {
            self.peers.detach(&tracked.device, gid, out);
        }
        out.observe(Observation::LiveQps {
            device: Arc::clone(&tracked.device),
            qp_type: tracked.qp_type,
            state: tracked.state,
            delta: -1,
        });
        Some(tracked)
    }

    fn evict_oldest(&mut self, out: &mut impl Observer) {
        while let Some((k, generation)) = self.order.pop_front() {
            if self.qps.get(&k).is_some_and(|t| t.generation == generation) {
                self.remove(k, out);
                out.observe(Observation::Evicted);
                return;
            }
        }
    }

    fn on_create(
        &mut self,
        k: u64,
        device: Label,
        call: &QpCall,
        origin: QpOrigin,
        out: &mut impl Observer,
    ) {
        if !call.ok() {
            out.observe(Observation::CreateFailed {
                device,
                origin,
                errno: call.rc,
            });
            return;
        }
        // A qp_num still in the table means its destroy was never seen
        // (e.g. lost): the kernel only reuses a number after the destroy.
        self.remove(k, out);
        let (comm, capped) = self.comms.get(call.comm_bytes(), || call.comm());
        if capped {
            out.observe(Observation::LabelOverflow { label: "comm" });
        }
        let (cgroup, capped) = self.cgroups.label(call.cgroup_id);
        if capped {
            out.observe(Observation::LabelOverflow { label: "cgroup" });
        }
        out.observe(Observation::Created {
            device: Arc::clone(&device),
            qp_type: call.qp_type,
            origin,
            comm,
            cgroup,
            duration: call.duration(),
        });
        self.insert(
            k,
            Tracked {
                device,
                qp_type: call.qp_type,
                state: QpState::Reset,
                created_ns: Some(call.end_ns),
                state_since_ns: Some(call.end_ns),
                reached_rts: false,
                generation: 0,
                peer: None,
                completion_error: None,
            },
            out,
        );
    }

    fn on_modify(
        &mut self,
        k: u64,
        device: Label,
        call: &QpCall,
        to: Option<QpState>,
        invalid_state: bool,
        out: &mut impl Observer,
    ) {
        if invalid_state {
            out.observe(Observation::InvalidState);
        }
        if !call.ok() {
            out.observe(Observation::ModifyFailed { to, errno: call.rc });
            return;
        }
        self.set_peer(k, call, to, out);
        let Some(to) = to else {
            return; // attribute-only modify: no transition
        };
        if to == QpState::Err && self.qps.get(&k).is_none_or(|t| t.state != QpState::Err) {
            self.entered_err(Arc::from(CAUSE_REQUESTED), out);
        }
        let Some(tracked) = self.qps.get_mut(&k) else {
            out.observe(Observation::Untracked { kind: "qp_modify" });
            out.observe(Observation::Transition {
                from: None,
                to,
                duration: call.duration(),
            });
            self.insert(
                k,
                Tracked {
                    device: Arc::clone(&device),
                    qp_type: call.qp_type,
                    state: to,
                    created_ns: None,
                    state_since_ns: Some(call.end_ns),
                    reached_rts: to == QpState::Rts,
                    generation: 0,
                    peer: None,
                    completion_error: None,
                },
                out,
            );
            if let Some(gid) = call.remote_gid {
                self.peers.attach(&device, gid, call.end_ns, out);
                if let Some(tracked) = self.qps.get_mut(&k) {
                    tracked.peer = Some(gid);
                }
            }
            return;
        };
        let from = tracked.state;
        out.observe(Observation::Transition {
            from: Some(from),
            to,
            duration: call.duration(),
        });
        if from == to {
            return;
        }
        tracked.move_to(to, call.start_ns, call.end_ns, out);
        if to == QpState::Reset {
            tracked.completion_error = None;
        }
        if to == QpState::Rts && !tracked.reached_rts {
            tracked.reached_rts = true;
            if let Some(created) = tracked.created_ns {
                out.observe(Observation::TimeToRts {
                    duration: since(created, call.end_ns),
                });
            }
        }
    }

    /// Follows a tracked QP's remote side: a modify with an address vector
    /// connects it to its GID (leaving any other), a reset forgets it.
    fn set_peer(&mut self, k: u64, call: &QpCall, to: Option<QpState>, out: &mut impl Observer) {
        let Some(tracked) = self.qps.get_mut(&k) else {
            return;
        };
        let next = match (to, call.remote_gid) {
            (Some(QpState::Reset), _) => None,
            (_, Some(gid)) => Some(gid),
            _ => return,
        };
        if tracked.peer == next {
            return;
        }
        let before = std::mem::replace(&mut tracked.peer, next);
        let device = Arc::clone(&tracked.device);
        if let Some(gid) = before {
            self.peers.detach(&device, gid, out);
        }
        if let Some(gid) = next {
            self.peers.attach(&device, gid, call.end_ns, out);
        }
    }

    fn on_destroy(&mut self, k: u64, device: Label, call: &QpCall, out: &mut impl Observer) {
        if !call.ok() {
            out.observe(Observation::DestroyFailed { errno: call.rc });
            return;
        }
        let Some(tracked) = self.remove(k, out) else {
            out.observe(Observation::Untracked { kind: "qp_destroy" });
            out.observe(Observation::Destroyed {
                device,
                qp_type: call.qp_type,
                lifetime: None,
            });
            return;
        };
        if let Some(since_ns) = tracked.state_since_ns {
            out.observe(Observation::Dwell {
                state: tracked.state,
                duration: since(since_ns, call.start_ns),
            });
        }
        out.observe(Observation::Destroyed {
            device: tracked.device,
            qp_type: tracked.qp_type,
            lifetime: tracked.created_ns.map(|c| since(c, call.end_ns)),
        });
    }
}

fn device_bytes(device: &str) -> [u8; DEVICE_NAME_LEN] {
    let mut raw = [0u8; DEVICE_NAME_LEN];
    let n = device.len().min(DEVICE_NAME_LEN - 1);
    raw[..n].copy_from_slice(&device.as_bytes()[..n]);
    raw
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use QpState::*;

    const US: u64 = 1_000;

    fn create(qp: u32, start: u64, end: u64) -> QpCall {
        QpCall::synthetic(
            Call::Create {
                origin: QpOrigin::User,
            },
            "rxe0",
            qp,
            start,
            end,
        )
    }

    fn modify(qp: u32, to: QpState, start: u64, end: u64) -> QpCall {
        QpCall::synthetic(
            Call::Modify {
                to: Some(to),
                attr_mask: 1,
                invalid_state: false,
            },
            "rxe0",
            qp,
            start,
            end,
        )
    }

    fn destroy(qp: u32, start: u64, end: u64) -> QpCall {
        QpCall::synthetic(Call::Destroy, "rxe0", qp, start, end)
    }

    fn failed(mut call: QpCall, rc: i32) -> QpCall {
        call.rc = rc;
        call
    }

    fn peer_ip(last: u8) -> Gid {
        let mut raw = [0u8; 16];
        raw[10..].copy_from_slice(&[0xff, 0xff, 198, 18, 0, last]);
        Gid(raw)
    }

    /// A modify to RTR with an address vector to 198.18.0.`last`.
    fn rtr_to(qp: u32, last: u8, at: u64) -> QpCall {
        let mut call = modify(qp, Rtr, at, at + 1);
        call.remote_gid = Some(peer_ip(last));
        call.remote_qpn = Some(100 + qp);
        call
    }

    fn peer_qps(c: &Correlator) -> Vec<(String, u32)> {
        let mut peers: Vec<(String, u32)> = c
            .peers()
            .iter()
            .map(|p| (p.gid.to_string(), p.qps))
            .collect();
        peers.sort();
        peers
    }

    #[test]
    fn peers_follow_the_remote_side_of_live_qps() {
        let (mut c, _) = run(&[
            create(1, 0, 1),
            create(2, 0, 1),
            modify(1, Init, 2, 3),
            rtr_to(1, 2, 4),
            rtr_to(2, 2, 5),
        ]);
        assert_eq!(peer_qps(&c), [("198.18.0.2".to_owned(), 2)]);
        let since = c.peers().iter().next().unwrap().since_ns;
        assert_eq!(since, 5, "since the first QP's modify ended");
        let mut out = Vec::new();
        // attribute-only and RTS modifies without an address keep the peer
        c.handle(&modify(1, Rts, 10, 11), &mut out);
        assert_eq!(peer_qps(&c), [("198.18.0.2".to_owned(), 2)]);
        // reset forgets it, destroy drops it
        c.handle(&modify(1, Reset, 12, 13), &mut out);
        assert_eq!(peer_qps(&c), [("198.18.0.2".to_owned(), 1)]);
        c.handle(&destroy(2, 14, 15), &mut out);
        assert!(c.peers().is_empty());
        let net: i64 = out
            .iter()
            .filter_map(|o| match o {
                Observation::PeerQps { delta, .. } => Some(*delta),
                _ => None,
            })
            .sum();
        assert_eq!(net, -2);
        // a reset QP connected again, to another peer, then elsewhere
        c.handle(&rtr_to(1, 3, 20), &mut out);
        c.handle(&rtr_to(1, 4, 22), &mut out);
        assert_eq!(peer_qps(&c), [("198.18.0.4".to_owned(), 1)]);
    }

    #[test]
    fn failed_modify_connects_no_peer_and_eviction_drops_it() {
        let limits = Limits {
            max_tracked_qps: 1,
            ..Limits::default()
        };
        let mut c = Correlator::new(limits);
        let mut out = Vec::new();
        c.handle(&create(1, 0, 1), &mut out);
        c.handle(&failed(rtr_to(1, 2, 2), -22), &mut out);
        assert!(c.peers().is_empty());
        c.handle(&rtr_to(1, 2, 4), &mut out);
        assert_eq!(peer_qps(&c), [("198.18.0.2".to_owned(), 1)]);
        c.handle(&create(2, 6, 7), &mut out);
        assert!(c.peers().is_empty(), "the evicted QP's peer went with it");
    }

    fn run(calls: &[QpCall]) -> (Correlator, Vec<Observation>) {
        let mut c = Correlator::new(Limits::default());
        let mut out = Vec::new();
        for call in calls {
            c.handle(call, &mut out);
        }
        (c, out)
    }

    fn live_sum(out: &[Observation]) -> HashMap<QpState, i64> {
        let mut m = HashMap::new();
        for o in out {
            if let Observation::LiveQps { state, delta, .. } = o {
                *m.entry(*state).or_default() += delta;
            }
        }
        m.retain(|_, v| *v != 0);
        m
    }

    fn transitions(out: &[Observation]) -> Vec<(Option<QpState>, QpState, Duration)> {
        out.iter()
            .filter_map(|o| match o {
                Observation::Transition { from, to, duration } => Some((*from, *to, *duration)),
                _ => None,
            })
            .collect()
    }

    fn dwells(out: &[Observation]) -> Vec<(QpState, Duration)> {
        out.iter()
            .filter_map(|o| match o {
                Observation::Dwell { state, duration } => Some((*state, *duration)),
                _ => None,
            })
            .collect()
    }

    fn d(us: u64) -> Duration {
        Duration::from_micros(us)
    }

    #[test]
    fn full_rc_lifecycle() {
        let (c, out) = run(&[
            create(7, 0, 40 * US),
            modify(7, Init, 100 * US, 110 * US),
            modify(7, Init, 200 * US, 205 * US), // librdmacm re-inits before RTR
            modify(7, Rtr, 300 * US, 320 * US),
            modify(7, Rts, 400 * US, 415 * US),
            modify(7, Err, 1000 * US, 1010 * US),
            destroy(7, 2000 * US, 2100 * US),
        ]);
        assert_eq!(c.tracked(), 0);
        assert!(matches!(
            &out[0],
            Observation::Created { duration, qp_type: QpType::Rc, origin: QpOrigin::User, device, comm, cgroup }
                if *duration == d(40) && &**device == "rxe0" && &**comm == "synthetic"
                    && &**cgroup == crate::model::cgroups::UNKNOWN
        ));
        assert_eq!(
            transitions(&out),
            vec![
                (Some(Reset), Init, d(10)),
                (Some(Init), Init, d(5)),
                (Some(Init), Rtr, d(20)),
                (Some(Rtr), Rts, d(15)),
                (Some(Rts), Err, d(10)),
            ]
        );
        // dwell: end of the entering call → start of the leaving call
        assert_eq!(
            dwells(&out),
            vec![
                (Reset, d(60)),
                (Init, d(190)),
                (Rtr, d(80)),
                (Rts, d(585)),
                (Err, d(990)),
            ]
        );
        assert!(out.contains(&Observation::TimeToRts { duration: d(375) }));
        assert!(out.iter().any(|o| matches!(
            o,
            Observation::Destroyed { lifetime: Some(l), .. } if *l == d(2060)
        )));
        assert!(live_sum(&out).is_empty(), "live gauge returns to zero");
    }

    #[test]
    fn failed_modify_keeps_state_and_reports_errno() {
        let (mut c, out) = run(&[
            create(1, 0, 1),
            failed(modify(1, Rtr, 10, 20), -22),
            modify(1, Init, 30, 40),
        ]);
        assert!(out.contains(&Observation::ModifyFailed {
            to: Some(Rtr),
            errno: -22
        }));
        assert_eq!(
            transitions(&out),
            vec![(Some(Reset), Init, Duration::from_nanos(10))]
        );
        assert_eq!(c.state_of("rxe0", 1), Some(Init));
    }

    #[test]
    fn modify_for_unknown_qp_adopts_it_without_a_from_state() {
        let (mut c, out) = run(&[modify(9, Rts, 10, 20), destroy(9, 30, 40)]);
        assert!(out.contains(&Observation::Untracked { kind: "qp_modify" }));
        assert_eq!(
            transitions(&out),
            vec![(None, Rts, Duration::from_nanos(10))]
        );
        // no create seen: no time-to-RTS, no lifetime, but the gauge stays balanced
        assert!(!out
            .iter()
            .any(|o| matches!(o, Observation::TimeToRts { .. })));
        assert!(out
            .iter()
            .any(|o| matches!(o, Observation::Destroyed { lifetime: None, .. })));
        assert!(live_sum(&out).is_empty());
        assert_eq!(c.state_of("rxe0", 9), None);
    }

    #[test]
    fn destroy_without_create_counts_but_never_goes_negative() {
        let (_, out) = run(&[destroy(5, 0, 10)]);
        assert_eq!(
            out,
            vec![
                Observation::Untracked { kind: "qp_destroy" },
                Observation::Destroyed {
                    device: Arc::from("rxe0"),
                    qp_type: QpType::Rc,
                    lifetime: None
                },
            ]
        );
    }

    #[test]
    fn failed_create_and_destroy() {
        let (c, out) = run(&[
            failed(create(0, 0, 10), -12),
            create(3, 20, 30),
            failed(destroy(3, 40, 50), -16),
        ]);
        assert!(out.contains(&Observation::CreateFailed {
            device: Arc::from("rxe0"),
            origin: QpOrigin::User,
            errno: -12
        }));
        assert!(out.contains(&Observation::DestroyFailed { errno: -16 }));
        assert_eq!(c.tracked(), 1, "a failed destroy leaves the QP alive");
        assert_eq!(live_sum(&out), HashMap::from([(Reset, 1)]));
    }

    #[test]
    fn attribute_only_modify_is_not_a_transition() {
        let attr_only = QpCall::synthetic(
            Call::Modify {
                to: None,
                attr_mask: 0x10,
                invalid_state: false,
            },
            "rxe0",
            4,
            5,
            6,
        );
        let (_, out) = run(&[create(4, 0, 1), attr_only]);
        assert!(transitions(&out).is_empty());
    }

    #[test]
    fn create_of_a_tracked_number_replaces_the_stale_entry() {
        // The destroy of the first incarnation was lost.
        let (c, out) = run(&[create(8, 0, 1), modify(8, Init, 2, 3), create(8, 10, 11)]);
        assert_eq!(c.tracked(), 1);
        assert_eq!(live_sum(&out), HashMap::from([(Reset, 1)]));
    }

    #[test]
    fn reconcile_adopts_listed_updates_states_and_drops_unlisted() {
        let mut c = Correlator::new(Limits::default());
        let mut out = Vec::new();
        // seen while the hooks were being attached: 1 (reached INIT), 2 (its destroy missed)
        c.handle(&create(1, 0, 1), &mut out);
        c.handle(&modify(1, Init, 2, 3), &mut out);
        c.handle(&create(2, 4, 5), &mut out);
        let listed = [("rxe0", 1, QpType::Rc, Rts), ("rxe0", 3, QpType::Rc, Rtr)];
        assert_eq!(c.reconcile(&listed, &mut out), (1, 1));
        assert_eq!(c.tracked(), 2);
        assert_eq!(c.state_of("rxe0", 1), Some(Rts));
        assert_eq!(c.state_of("rxe0", 2), None);
        assert_eq!(live_sum(&out), HashMap::from([(Rtr, 1), (Rts, 1)]));
        // a later destroy of the dropped QP is an untracked one, not a negative gauge
        c.handle(&destroy(2, 6, 7), &mut out);
        assert!(live_sum(&out).values().all(|&n| n >= 0));
    }

    #[test]
    fn same_qp_num_on_two_devices_are_two_qps() {
        let mut other = create(1, 0, 1);
        other = QpCall::synthetic(other.call, "mlx5_0", 1, 0, 1);
        let (c, _) = run(&[create(1, 0, 1), other]);
        assert_eq!(c.tracked(), 2);
    }

    #[test]
    fn full_table_evicts_oldest_first() {
        let mut c = Correlator::new(Limits {
            max_tracked_qps: 2,
            ..Limits::default()
        });
        let mut out = Vec::new();
        for (qp, t) in [(1, 0), (2, 10), (3, 20)] {
            c.handle(&create(qp, t, t + 1), &mut out);
        }
        assert_eq!(c.tracked(), 2);
        assert_eq!(
            out.iter().filter(|o| **o == Observation::Evicted).count(),
            1
        );
        assert_eq!(c.state_of("rxe0", 1), None);
        assert_eq!(c.state_of("rxe0", 3), Some(Reset));
        assert_eq!(live_sum(&out), HashMap::from([(Reset, 2)]));
    }

    #[test]
    fn churn_keeps_eviction_queue_bounded() {
        let mut c = Correlator::new(Limits::default());
        let mut out = Vec::new();
        for qp in 0..100_000u32 {
            let t = u64::from(qp) * 10;
            c.handle(&create(qp, t, t + 1), &mut out);
            c.handle(&destroy(qp, t + 2, t + 3), &mut out);
            out.clear();
        }
        assert_eq!(c.tracked(), 0);
        assert!(c.order.len() <= 1024 + 1, "{}", c.order.len());
    }

    #[test]
    fn device_labels_are_capped() {
        let mut c = Correlator::new(Limits {
            max_tracked_qps: 100,
            max_device_labels: 1,
            ..Limits::default()
        });
        let mut out = Vec::new();
        c.handle(
            &QpCall::synthetic(create(1, 0, 1).call, "mlx5_0", 1, 0, 1),
            &mut out,
        );
        c.handle(
            &QpCall::synthetic(create(1, 0, 1).call, "mlx5_1", 1, 0, 1),
            &mut out,
        );
        let devices: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Observation::Created { device, .. } => Some(&**device),
                _ => None,
            })
            .collect();
        assert_eq!(devices, vec!["mlx5_0", OTHER]);
        assert_eq!(c.tracked(), 2, "capped label, distinct QP keys");
        assert!(out.contains(&Observation::LabelOverflow { label: "device" }));
    }

    #[test]
    fn process_labels_are_capped_first_come() {
        let mut c = Correlator::new(Limits {
            max_process_labels: 2,
            ..Limits::default()
        });
        let mut out = Vec::new();
        for (qp, comm) in [(1, "rping"), (2, "ib_send_lat"), (3, "rping"), (4, "nvme")] {
            let mut call = create(qp, 0, 1);
            call.set_comm(comm);
            c.handle(&call, &mut out);
        }
        let comms: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Observation::Created { comm, .. } => Some(&**comm),
                _ => None,
            })
            .collect();
        assert_eq!(comms, vec!["rping", "ib_send_lat", "rping", OTHER]);
        assert_eq!(
            out.iter()
                .filter(|o| **o == Observation::LabelOverflow { label: "comm" })
                .count(),
            1
        );
    }

    #[test]
    fn cgroup_labels_are_capped_and_paths_stay_nameable() {
        let mut c = Correlator::new(Limits {
            max_cgroup_labels: 1,
            ..Limits::default()
        });
        c.set_cgroup_names(Box::new(crate::model::cgroups::tests::Table(vec![
            (10, "/a.slice"),
            (11, "/b.slice"),
        ])));
        let mut out = Vec::new();
        for (qp, cgroup_id) in [(1, 10), (2, 11), (3, 99)] {
            let mut call = create(qp, 0, 1);
            call.cgroup_id = cgroup_id;
            c.handle(&call, &mut out);
        }
        let cgroups: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Observation::Created { cgroup, .. } => Some(&**cgroup),
                _ => None,
            })
            .collect();
        assert_eq!(
            cgroups,
            vec!["/a.slice", OTHER, crate::model::cgroups::UNKNOWN]
        );
        assert_eq!(
            out.iter()
                .filter(|o| **o == Observation::LabelOverflow { label: "cgroup" })
                .count(),
            1
        );
        assert_eq!(c.cgroup_path(11).as_deref(), Some("/b.slice"));
    }

    #[test]
    fn adopted_qps_count_as_live_and_transition_from_their_state() {
        let mut c = Correlator::new(Limits::default());
        let mut out = Vec::new();
        assert!(c.adopt("rxe0", 12, QpType::Rc, Rts, &mut out));
        assert!(!c.adopt("rxe0", 12, QpType::Rc, Rts, &mut out));
        c.handle(&modify(12, Err, 5, 6), &mut out);
        assert_eq!(
            transitions(&out),
            vec![(Some(Rts), Err, Duration::from_nanos(1))]
        );
        assert!(
            dwells(&out).is_empty(),
            "time in RTS before qpwatch is unknown"
        );
        assert_eq!(live_sum(&out), HashMap::from([(Err, 1)]));
    }

    fn causes(out: &[Observation]) -> Vec<String> {
        out.iter()
            .filter_map(|o| match o {
                Observation::QpError { cause } => Some(cause.to_string()),
                _ => None,
            })
            .collect()
    }

    fn error_names(c: &mut Correlator) {
        let mut events = vec![None; 17];
        events[1] = Some("QP_FATAL".to_owned());
        events[5] = Some("SQ_DRAINED".to_owned());
        let mut status = vec![None; 13];
        status[5] = Some("WR_FLUSH_ERR".to_owned());
        status[12] = Some("RETRY_EXC_ERR".to_owned());
        c.set_async_event_names(events);
        c.set_completion_status_names(status);
    }

    fn rts(qp: u32) -> Vec<QpCall> {
        vec![
            create(qp, 0, 1),
            modify(qp, Init, 2, 3),
            modify(qp, Rtr, 4, 5),
            modify(qp, Rts, 6, 7),
        ]
    }

    #[test]
    fn err_entries_carry_their_cause() {
        let mut c = Correlator::new(Limits::default());
        error_names(&mut c);
        let mut out = Vec::new();
        for qp in [1, 2, 3, 4] {
            for call in rts(qp) {
                c.handle(&call, &mut out);
            }
        }
        out.clear();
        // 1: its owner asks for ERR, then again (already there)
        c.handle(&modify(1, Err, 10, 11), &mut out);
        assert_eq!(c.take_detail().err_cause.as_deref(), Some("requested"));
        c.handle(&modify(1, Err, 12, 13), &mut out);
        assert_eq!(c.take_detail().err_cause, None);
        // 2: retries run out: the error completion, then the device's move
        // to ERR, then the flushes' own (not sent by the programs) nothing
        let at = |call: Call, t: u64| QpCall::synthetic(call, "rxe0", 2, t, t);
        c.handle(&at(Call::CompletionError { status: 12 }, 20), &mut out);
        assert_eq!(
            c.take_detail().completion_status.as_deref(),
            Some("RETRY_EXC_ERR")
        );
        assert_eq!(
            c.state_of("rxe0", 2),
            Some(Rts),
            "a completion alone changes nothing"
        );
        c.handle(&at(Call::DeviceError, 21), &mut out);
        assert_eq!(
            c.take_detail().err_cause.as_deref(),
            Some("completion:RETRY_EXC_ERR")
        );
        assert_eq!(c.state_of("rxe0", 2), Some(Err));
        // the owner's modify to ERR that follows is no new entry
        c.handle(&modify(2, Err, 22, 23), &mut out);
        // 3: an informational event, then a fatal one
        let ev =
            |event: u32, t: u64| QpCall::synthetic(Call::AsyncEvent { event }, "rxe0", 3, t, t);
        c.handle(&ev(5, 30), &mut out);
        assert_eq!(c.take_detail().async_event.as_deref(), Some("SQ_DRAINED"));
        assert_eq!(c.state_of("rxe0", 3), Some(Rts));
        c.handle(&ev(1, 31), &mut out);
        assert_eq!(c.state_of("rxe0", 3), Some(Err));
        // 4: the device moves it with nothing seen before
        c.handle(
            &QpCall::synthetic(Call::DeviceError, "rxe0", 4, 40, 40),
            &mut out,
        );
        assert_eq!(
            causes(&out),
            [
                "requested",
                "completion:RETRY_EXC_ERR",
                "async_event:QP_FATAL",
                "unknown"
            ]
        );
        let events: Vec<(String, String)> = out
            .iter()
            .filter_map(|o| match o {
                Observation::AsyncEvent { event, device, .. } => {
                    Some((device.to_string(), event.to_string()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            events,
            [
                ("rxe0".to_owned(), "SQ_DRAINED".to_owned()),
                ("rxe0".to_owned(), "QP_FATAL".to_owned())
            ]
        );
        // every QP is live in ERR, none left in RTS; time in RTS observed
        // for the device's moves too
        let live = live_sum(&out);
        assert_eq!(live.get(&Err), Some(&4));
        assert_eq!(live.get(&Rts), Some(&-4));
        assert!(dwells(&out).contains(&(Rts, d(0) + Duration::from_nanos(14))));
    }

    #[test]
    fn a_reset_forgets_an_old_completion_error() {
        let mut c = Correlator::new(Limits::default());
        error_names(&mut c);
        let mut out = Vec::new();
        for call in rts(1) {
            c.handle(&call, &mut out);
        }
        let at = |call: Call, t: u64| QpCall::synthetic(call, "rxe0", 1, t, t);
        c.handle(&at(Call::CompletionError { status: 12 }, 10), &mut out);
        c.handle(&modify(1, Reset, 11, 12), &mut out);
        for call in rts(1).into_iter().skip(1) {
            c.handle(&call, &mut out);
        }
        out.clear();
        c.handle(&at(Call::DeviceError, 20), &mut out);
        assert_eq!(causes(&out), ["unknown"]);
    }
}
