//! The per-CM-id state machine: turns RDMA CM calls, handler invocations and
//! tracepoint hits into connection-setup observations, and joins CM ids to
//! their QPs.
//!
//! Ids are keyed by `res.id` (what `rdma res show cm_id` prints), which an id
//! only has once it is attached to a device; address resolution can start
//! before that, so resolve starts are keyed by the id's kernel address.

use std::{collections::HashMap, sync::Arc, time::Duration};

use qpwatch_common::CmOp;

use crate::{
    kernel::rdma::{cm_event, cm_event_name, cm_status_label},
    model::events::CmCall,
    model::qp::{Label, Observation, Observer},
};

/// Derived state label for an id in CONNECT that saw its connection established.
pub const ESTABLISHED: &str = "ESTABLISHED";
pub const UNKNOWN: &str = "unknown";
const MAX_PENDING_RESOLVES: usize = 4096;
const MAX_TRACKED_IDS: usize = 262_144;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sent the connect request.
    Active,
    /// Received it.
    Passive,
    Listener,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Passive => "passive",
            Role::Listener => "listener",
        }
    }
}

/// Names the kernel gives to its internal enums, read from rdma_cm's BTF.
#[derive(Debug, Clone)]
pub struct CmNames {
    /// `enum rdma_cm_state`, by value, `RDMA_CM_` stripped.
    pub states: Vec<Option<Label>>,
    /// `enum ib_cm_event_type`, by value, `IB_CM_` stripped.
    pub ib_events: Vec<Option<Label>>,
}

impl CmNames {
    pub fn new(states: Vec<Option<String>>, ib_events: Vec<Option<String>>) -> Self {
        let labels = |v: Vec<Option<String>>| {
            v.into_iter()
                .map(|s| s.map(|s| Label::from(s.as_str())))
                .collect()
        };
        Self {
            states: labels(states),
            ib_events: labels(ib_events),
        }
    }

    /// The names of Linux 6.1, for tests.
    pub fn linux_6_1() -> Self {
        let states = [
            "IDLE",
            "ADDR_QUERY",
            "ADDR_RESOLVED",
            "ROUTE_QUERY",
            "ROUTE_RESOLVED",
            "CONNECT",
            "DISCONNECT",
            "ADDR_BOUND",
            "LISTEN",
            "DEVICE_REMOVAL",
            "DESTROYING",
        ];
        let ib_events = [
            "REQ_ERROR",
            "REQ_RECEIVED",
            "REP_ERROR",
            "REP_RECEIVED",
            "RTU_RECEIVED",
            "USER_ESTABLISHED",
            "DREQ_ERROR",
            "DREQ_RECEIVED",
            "DREP_RECEIVED",
            "TIMEWAIT_EXIT",
            "MRA_RECEIVED",
            "REJ_RECEIVED",
            "LAP_ERROR",
            "LAP_RECEIVED",
            "APR_RECEIVED",
            "SIDR_REQ_ERROR",
            "SIDR_REQ_RECEIVED",
            "SIDR_REP_RECEIVED",
        ];
        Self::new(
            states.iter().map(|s| Some((*s).to_owned())).collect(),
            ib_events.iter().map(|s| Some((*s).to_owned())).collect(),
        )
    }

    fn lookup(table: &[Option<Label>], value: u32) -> Option<Label> {
        table.get(value as usize).cloned().flatten()
    }

    pub fn state(&self, value: u32) -> Label {
        Self::lookup(&self.states, value).unwrap_or_else(|| Label::from(UNKNOWN))
    }

    pub fn state_value(&self, name: &str) -> Option<u32> {
        self.states
            .iter()
            .position(|s| s.as_deref() == Some(name))
            .map(|i| i as u32)
    }

    pub fn ib_event(&self, value: u32) -> Label {
        Self::lookup(&self.ib_events, value).unwrap_or_else(|| Label::from("other"))
    }
}

#[derive(Debug, Clone)]
struct TrackedId {
    state: Label,
    role: Option<Role>,
    connect_start_ns: Option<u64>,
    connect_observed: bool,
    qp_num: Option<u32>,
}

/// Pairs a resolve call with its completion event, whichever is seen first:
/// the event can be delivered (from a workqueue, on another CPU) before the
/// call that started the resolution returns and is emitted.
#[derive(Debug, Default)]
struct Rendezvous {
    /// id address → start of the call.
    starts: HashMap<u64, u64>,
    /// id address → time of the completion event and whether it succeeded.
    completions: HashMap<u64, (u64, bool)>,
}

impl Rendezvous {
    fn bound(map_len: usize) -> bool {
        map_len >= MAX_PENDING_RESOLVES
    }

    /// Returns the duration once both halves are known and the resolution succeeded.
    fn started(&mut self, id: u64, start: u64) -> Option<Duration> {
        match self.completions.remove(&id) {
            Some((at, ok)) if at >= start => ok.then(|| since(start, at)),
            _ => {
                if Self::bound(self.starts.len()) {
                    self.starts.clear();
                }
                self.starts.insert(id, start);
                None
            }
        }
    }

    fn completed(&mut self, id: u64, at: u64, ok: bool) -> Option<Duration> {
        match self.starts.remove(&id) {
            Some(start) => ok.then(|| since(start, at)),
            None => {
                if Self::bound(self.completions.len()) {
                    self.completions.clear();
                }
                self.completions.insert(id, (at, ok));
                None
            }
        }
    }
}

pub struct CmCorrelator {
    names: CmNames,
    ids: HashMap<u32, TrackedId>,
    addr_resolves: Rendezvous,
    route_resolves: Rendezvous,
    qp_to_cm: HashMap<u32, u32>,
    destroyed: RecentIds,
    established: Label,
    unknown: Label,
}

/// The most recently destroyed ids. The kernel numbers ids cyclically
/// (`xa_alloc_cyclic` in rdma_restrack_add()), so a number is not reused soon.
#[derive(Debug, Default)]
struct RecentIds {
    order: std::collections::VecDeque<u32>,
    set: std::collections::HashSet<u32>,
}

impl RecentIds {
    const CAPACITY: usize = 4096;

    fn insert(&mut self, id: u32) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > Self::CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn contains(&self, id: u32) -> bool {
        self.set.contains(&id)
    }
}

fn since(start: u64, end: u64) -> Duration {
    Duration::from_nanos(end.saturating_sub(start))
}

impl CmCorrelator {
    pub fn new(names: CmNames) -> Self {
        Self {
            names,
            ids: HashMap::new(),
            addr_resolves: Rendezvous::default(),
            route_resolves: Rendezvous::default(),
            qp_to_cm: HashMap::new(),
            destroyed: RecentIds::default(),
            established: Label::from(ESTABLISHED),
            unknown: Label::from(UNKNOWN),
        }
    }

    pub fn names(&self) -> &CmNames {
        &self.names
    }

    /// Replaces the kernel enum names (read from BTF when rdma_cm loads).
    pub fn set_names(&mut self, names: CmNames) {
        self.names = names;
    }

    pub fn tracked(&self) -> usize {
        self.ids.len()
    }

    /// The CM id a QP was joined to (by `cm_send_req`/`cm_send_rep` for
    /// userspace QPs, `rdma_create_qp` for kernel ones).
    pub fn cm_id_for_qp(&self, qp_num: u32) -> Option<u32> {
        self.qp_to_cm.get(&qp_num).copied()
    }

    pub fn state_of(&self, cm_id: u32) -> Option<&str> {
        self.ids.get(&cm_id).map(|t| &*t.state)
    }

    /// Starts tracking an id that existed before qpwatch (netlink view).
    pub fn adopt(
        &mut self,
        cm_id: u32,
        state: u32,
        qp_num: Option<u32>,
        out: &mut impl Observer,
    ) -> bool {
        if self.ids.contains_key(&cm_id) {
            return false;
        }
        let label = self.names.state(state);
        let role = match label.as_ref() {
            "LISTEN" => Some(Role::Listener),
            _ => None,
        };
        self.track(cm_id, label, out);
        if let Some(t) = self.ids.get_mut(&cm_id) {
            t.role = role;
            t.connect_observed = true; // its setup happened before qpwatch
        }
        if let Some(qp) = qp_num {
            self.join(cm_id, qp);
        }
        true
    }

    fn track(&mut self, cm_id: u32, state: Label, out: &mut impl Observer) {
        if self.ids.len() >= MAX_TRACKED_IDS {
            return;
        }
        tracing::debug!(cm_id, state = %state, "tracking CM id");
        out.observe(Observation::LiveCmIds {
            state: Arc::clone(&state),
            delta: 1,
        });
        self.ids.insert(
            cm_id,
            TrackedId {
                state,
                role: None,
                connect_start_ns: None,
                connect_observed: false,
                qp_num: None,
            },
        );
    }

    /// Makes sure an attached id is tracked; returns whether it is. An id
    /// whose destroy was seen is not tracked again: a handler that began
    /// before the destroy returns (and is emitted) after it.
    fn ensure(&mut self, call: &CmCall, out: &mut impl Observer) -> bool {
        if !call.attached || self.destroyed.contains(call.cm_id) {
            return false;
        }
        if !self.ids.contains_key(&call.cm_id) {
            let state = call
                .state_after
                .or(call.state)
                .map(|s| self.names.state(s))
                .unwrap_or_else(|| Arc::clone(&self.unknown));
            self.track(call.cm_id, state, out);
        }
        self.ids.contains_key(&call.cm_id)
    }

    fn set_state(&mut self, cm_id: u32, state: Label, out: &mut impl Observer) {
        let Some(t) = self.ids.get_mut(&cm_id) else {
            return;
        };
        if t.state == state {
            return;
        }
        out.observe(Observation::LiveCmIds {
            state: std::mem::replace(&mut t.state, Arc::clone(&state)),
            delta: -1,
        });
        out.observe(Observation::LiveCmIds { state, delta: 1 });
    }

    fn join(&mut self, cm_id: u32, qp_num: u32) {
        if qp_num == 0 {
            return;
        }
        if let Some(t) = self.ids.get_mut(&cm_id) {
            t.qp_num = Some(qp_num);
        }
        self.qp_to_cm.insert(qp_num, cm_id);
    }

    fn connect_done(&mut self, cm_id: u32, at_ns: u64, out: &mut impl Observer) {
        let Some(t) = self.ids.get_mut(&cm_id) else {
            return;
        };
        if t.connect_observed {
            return;
        }
        if let (Some(start), Some(role)) = (t.connect_start_ns, t.role) {
            t.connect_observed = true;
            out.observe(Observation::CmConnect {
                role: role.label(),
                duration: since(start, at_ns),
            });
        }
    }

    pub fn handle(&mut self, call: &CmCall, out: &mut impl Observer) {
        match call.op {
            CmOp::EventHandler => self.on_event(call, call.duration(), call.rc, out),
            CmOp::IbHandler | CmOp::IbReqHandler => {
                out.observe(Observation::CmHandler {
                    handler: call.op.label(),
                    event: self.names.ib_event(call.event),
                    duration: call.duration(),
                });
                self.after_call(call, out);
            }
            CmOp::UcmaHandler => out.observe(Observation::CmHandler {
                handler: call.op.label(),
                event: Label::from(cm_event_name(call.event)),
                duration: call.duration(),
            }),
            CmOp::DestroyQp => {
                if self.qp_to_cm.get(&call.qp_num) == Some(&call.cm_id) {
                    self.qp_to_cm.remove(&call.qp_num);
                }
            }
            CmOp::DestroyId => {
                tracing::debug!(
                    cm_id = call.cm_id,
                    attached = call.attached,
                    "CM id destroyed"
                );
                if call.attached {
                    self.destroyed.insert(call.cm_id);
                }
                if let Some(t) = self.ids.remove(&call.cm_id) {
                    out.observe(Observation::LiveCmIds {
                        state: t.state,
                        delta: -1,
                    });
                    if let Some(qp) = t.qp_num {
                        if self.qp_to_cm.get(&qp) == Some(&call.cm_id) {
                            self.qp_to_cm.remove(&qp);
                        }
                    }
                }
            }
            CmOp::ResolveAddr
            | CmOp::ResolveRoute
            | CmOp::Listen
            | CmOp::Connect
            | CmOp::Accept
            | CmOp::RepRecv
            | CmOp::Reject
            | CmOp::Disconnect
            | CmOp::CreateQp
            | CmOp::InitConnQp
            | CmOp::InitUdQp
            | CmOp::ModifyQpRtr
            | CmOp::ModifyQpRts
            | CmOp::ModifyQpErr => {
                out.observe(Observation::CmCall {
                    call: call.op.label(),
                    duration: call.duration(),
                    rc: call.rc,
                });
                if call.rc == 0 {
                    self.call_succeeded(call, out);
                } else {
                    self.after_call(call, out);
                }
            }
        }
    }

    /// What a call that returned 0 tells about its id.
    fn call_succeeded(&mut self, call: &CmCall, out: &mut impl Observer) {
        match call.op {
            CmOp::ResolveAddr => {
                if let Some(duration) = self.addr_resolves.started(call.id_ptr, call.start_ns) {
                    out.observe(Observation::CmAddrResolved { duration });
                }
            }
            CmOp::ResolveRoute => {
                if let Some(duration) = self.route_resolves.started(call.id_ptr, call.start_ns) {
                    out.observe(Observation::CmRouteResolved { duration });
                }
            }
            _ => {}
        }
        self.after_call(call, out);
        if !self.ids.contains_key(&call.cm_id) {
            return;
        }
        match call.op {
            CmOp::Listen => self.set_role(call.cm_id, Role::Listener),
            CmOp::CreateQp => self.join(call.cm_id, call.qp_num),
            // The REQ went out: the active side's connection setup starts.
            CmOp::Connect => {
                self.join(call.cm_id, call.qp_num);
                self.set_role(call.cm_id, Role::Active);
                if let Some(t) = self.ids.get_mut(&call.cm_id) {
                    t.connect_start_ns.get_or_insert(call.start_ns);
                }
            }
            // The passive side's REP: rdma_accept() set id_priv->qp_num
            // from the parameters (userspace QPs are not on the id).
            CmOp::Accept if call.conn_param => self.join(call.cm_id, call.qp_num),
            // The active side's RTU went out: established. Userspace ids get
            // no ESTABLISHED event on this side (librdmacm turns
            // CONNECT_RESPONSE into it); kernel consumers get it right after.
            CmOp::RepRecv => {
                self.connect_done(call.cm_id, call.end_ns, out);
                let established = Arc::clone(&self.established);
                self.set_state(call.cm_id, established, out);
            }
            // rdma_disconnect() leaves the state alone until the peer
            // answers (cma_ib_handler): the id is disconnecting from now on.
            CmOp::Disconnect => {
                if let Some(state) = self.names.state_value("DISCONNECT") {
                    let label = self.names.state(state);
                    self.set_state(call.cm_id, label, out);
                }
            }
            _ => {}
        }
    }

    fn set_role(&mut self, cm_id: u32, role: Role) {
        if let Some(t) = self.ids.get_mut(&cm_id) {
            t.role = Some(role);
        }
    }

    /// State bookkeeping after a call that read the id's state at return.
    fn after_call(&mut self, call: &CmCall, out: &mut impl Observer) {
        if !self.ensure(call, out) {
            return;
        }
        if let Some(state) = call.state_after {
            let label = self.names.state(state);
            let keep_established = self
                .ids
                .get(&call.cm_id)
                .is_some_and(|t| t.state == self.established && &*label == "CONNECT");
            if !keep_established {
                self.set_state(call.cm_id, label, out);
            }
        }
    }

    fn on_event(
        &mut self,
        call: &CmCall,
        duration: Duration,
        result: i32,
        out: &mut impl Observer,
    ) {
        let event = cm_event_name(call.event);
        out.observe(Observation::CmEvent {
            event,
            status: Label::from(cm_status_label(call.status)),
            duration,
            result,
        });
        let at = call.start_ns;
        match call.event {
            cm_event::ADDR_RESOLVED | cm_event::ADDR_ERROR => {
                let ok = call.event == cm_event::ADDR_RESOLVED;
                if let Some(duration) = self.addr_resolves.completed(call.id_ptr, at, ok) {
                    out.observe(Observation::CmAddrResolved { duration });
                }
            }
            cm_event::ROUTE_RESOLVED | cm_event::ROUTE_ERROR => {
                let ok = call.event == cm_event::ROUTE_RESOLVED;
                if let Some(duration) = self.route_resolves.completed(call.id_ptr, at, ok) {
                    out.observe(Observation::CmRouteResolved { duration });
                }
            }
            _ => {}
        }
        if !self.ensure(call, out) {
            return;
        }
        match call.event {
            cm_event::CONNECT_REQUEST => {
                if let Some(t) = self.ids.get_mut(&call.cm_id) {
                    t.role = Some(Role::Passive);
                    t.connect_start_ns.get_or_insert(at);
                }
            }
            cm_event::ESTABLISHED => {
                self.connect_done(call.cm_id, at, out);
                let established = Arc::clone(&self.established);
                self.set_state(call.cm_id, established, out);
                return;
            }
            _ => {}
        }
        self.after_call(call, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn names() -> CmNames {
        CmNames::linux_6_1()
    }

    fn state(name: &str) -> u32 {
        names().state_value(name).unwrap()
    }

    fn handler(cm_id: u32, event: u32, at: u64, after: &str) -> CmCall {
        let mut c = CmCall::synthetic(CmOp::EventHandler, cm_id, at);
        c.event = event;
        c.end_ns = at + 10_000;
        c.state_after = Some(state(after));
        c.id_ptr = 0x1000 + u64::from(cm_id);
        c
    }

    fn call(op: CmOp, cm_id: u32, at: u64, after: &str) -> CmCall {
        let mut c = CmCall::synthetic(op, cm_id, at);
        c.end_ns = at + 50_000;
        c.state_after = Some(state(after));
        c.id_ptr = 0x1000 + u64::from(cm_id);
        c
    }

    fn joined(mut c: CmCall, qp_num: u32) -> CmCall {
        c.qp_num = qp_num;
        c
    }

    /// The passive side's rdma_accept() with parameters (the REP).
    fn accept(cm_id: u32, qp_num: u32, at: u64) -> CmCall {
        let mut c = joined(call(CmOp::Accept, cm_id, at, "CONNECT"), qp_num);
        c.conn_param = true;
        c
    }

    /// An entry-only hook (no return state).
    fn entry(op: CmOp, cm_id: u32, at: u64) -> CmCall {
        CmCall::synthetic(op, cm_id, at)
    }

    fn live(out: &[Observation]) -> HashMap<String, i64> {
        let mut m = HashMap::new();
        for o in out {
            if let Observation::LiveCmIds { state, delta } = o {
                *m.entry(state.to_string()).or_default() += delta;
            }
        }
        m.retain(|_, v| *v != 0);
        m
    }

    fn connects(out: &[Observation]) -> Vec<(&'static str, Duration)> {
        out.iter()
            .filter_map(|o| match o {
                Observation::CmConnect { role, duration } => Some((*role, *duration)),
                _ => None,
            })
            .collect()
    }

    /// librdmacm over rxe, both sides in one host: client id 2, listener 1,
    /// passive connection id 3.
    fn userspace_connection() -> Vec<CmCall> {
        let mut resolve = call(CmOp::ResolveAddr, 0, 0, "ADDR_QUERY");
        resolve.id_ptr = 0x1002; // not attached yet: no res.id
        resolve.attached = false;
        vec![
            call(CmOp::Listen, 1, MS, "LISTEN"),
            resolve,
            handler(2, cm_event::ADDR_RESOLVED, 3 * MS, "ADDR_RESOLVED"),
            call(CmOp::ResolveRoute, 2, 4 * MS, "ROUTE_QUERY"),
            handler(2, cm_event::ROUTE_RESOLVED, 6 * MS, "ROUTE_RESOLVED"),
            joined(call(CmOp::Connect, 2, 10 * MS, "CONNECT"), 17),
            handler(3, cm_event::CONNECT_REQUEST, 12 * MS, "CONNECT"),
            accept(3, 18, 15 * MS),
            handler(2, cm_event::CONNECT_RESPONSE, 17 * MS, "CONNECT"),
            call(CmOp::RepRecv, 2, 19 * MS, "CONNECT"),
            handler(3, cm_event::ESTABLISHED, 21 * MS, "CONNECT"),
        ]
    }

    #[test]
    fn userspace_connection_setup() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        for e in userspace_connection() {
            c.handle(&e, &mut out);
        }
        assert_eq!(
            connects(&out),
            vec![
                // Connect's start to the end of cma_rep_recv (the RTU sent)
                ("active", Duration::from_micros(9_050)),
                ("passive", Duration::from_millis(9))
            ]
        );
        assert!(out.contains(&Observation::CmAddrResolved {
            duration: Duration::from_millis(3)
        }));
        assert!(out.contains(&Observation::CmRouteResolved {
            duration: Duration::from_millis(2)
        }));
        assert_eq!(c.cm_id_for_qp(17), Some(2));
        assert_eq!(c.cm_id_for_qp(18), Some(3));
        assert_eq!(
            live(&out),
            HashMap::from([("LISTEN".into(), 1), (ESTABLISHED.into(), 2)])
        );
        let events: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Observation::CmEvent { event, .. } => Some(*event),
                _ => None,
            })
            .collect();
        assert_eq!(
            events,
            vec![
                "ADDR_RESOLVED",
                "ROUTE_RESOLVED",
                "CONNECT_REQUEST",
                "CONNECT_RESPONSE",
                "ESTABLISHED"
            ]
        );
    }

    #[test]
    fn route_resolved_before_the_resolve_call_returned() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        // the handler ran on a workqueue while rdma_resolve_route was still inside
        c.handle(
            &handler(2, cm_event::ROUTE_RESOLVED, 5 * MS, "ROUTE_RESOLVED"),
            &mut out,
        );
        c.handle(
            &call(CmOp::ResolveRoute, 2, 4 * MS, "ROUTE_RESOLVED"),
            &mut out,
        );
        assert!(out.contains(&Observation::CmRouteResolved {
            duration: Duration::from_millis(1)
        }));
        // a failed resolution observes no duration, whatever the order
        let mut error = handler(3, cm_event::ADDR_ERROR, 9 * MS, "ADDR_BOUND");
        error.id_ptr = 0x2003;
        let mut resolve = call(CmOp::ResolveAddr, 3, 8 * MS, "ADDR_QUERY");
        resolve.id_ptr = 0x2003;
        c.handle(&resolve, &mut out);
        c.handle(&error, &mut out);
        assert!(!out
            .iter()
            .any(|o| matches!(o, Observation::CmAddrResolved { .. })));
    }

    #[test]
    fn disconnect_and_destroy_return_the_gauge_to_zero() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        for e in userspace_connection() {
            c.handle(&e, &mut out);
        }
        for e in [
            call(CmOp::Disconnect, 2, 30 * MS, "CONNECT"),
            handler(3, cm_event::DISCONNECTED, 31 * MS, "DISCONNECT"),
            handler(2, cm_event::DISCONNECTED, 32 * MS, "DISCONNECT"),
            entry(CmOp::DestroyId, 3, 40 * MS),
            entry(CmOp::DestroyId, 2, 41 * MS),
            entry(CmOp::DestroyId, 1, 42 * MS),
        ] {
            c.handle(&e, &mut out);
        }
        assert!(live(&out).is_empty(), "{:?}", live(&out));
        assert_eq!(c.tracked(), 0);
        assert_eq!(c.cm_id_for_qp(17), None);
    }

    #[test]
    fn rejected_connect_counts_no_duration() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        let mut rejected = handler(2, cm_event::REJECTED, 20 * MS, "ROUTE_RESOLVED");
        rejected.status = 28;
        for e in [
            joined(call(CmOp::Connect, 2, 10 * MS, "CONNECT"), 17),
            rejected,
        ] {
            c.handle(&e, &mut out);
        }
        assert!(connects(&out).is_empty());
        assert!(out.contains(&Observation::CmEvent {
            event: "REJECTED",
            status: Label::from("reject_28"),
            duration: Duration::from_micros(10),
            result: 0
        }));
    }

    #[test]
    fn kernel_ulp_with_qp_joins_through_rdma_create_qp() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        let mut create = call(CmOp::CreateQp, 5, 0, "ROUTE_RESOLVED");
        create.qp_num = 33;
        create.has_qp = true;
        c.handle(&create, &mut out);
        c.handle(&call(CmOp::ModifyQpRtr, 5, MS, "CONNECT"), &mut out);
        assert_eq!(c.cm_id_for_qp(33), Some(5));
        let calls: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                Observation::CmCall { call, .. } => Some(*call),
                _ => None,
            })
            .collect();
        assert_eq!(calls, vec!["rdma_create_qp", "cma_modify_qp_rtr"]);
    }

    #[test]
    fn adopted_ids_keep_their_state_and_join() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        assert!(c.adopt(9, state("LISTEN"), None, &mut out));
        assert!(c.adopt(10, state("CONNECT"), Some(44), &mut out));
        assert!(!c.adopt(10, state("CONNECT"), Some(44), &mut out));
        assert_eq!(c.cm_id_for_qp(44), Some(10));
        // a late ESTABLISHED for an adopted id observes no connect duration
        c.handle(&handler(10, cm_event::ESTABLISHED, MS, "CONNECT"), &mut out);
        assert!(connects(&out).is_empty());
        assert_eq!(
            live(&out),
            HashMap::from([("LISTEN".into(), 1), (ESTABLISHED.into(), 1)])
        );
    }

    #[test]
    fn unattached_ids_are_not_tracked_but_id_zero_is_an_id() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        let mut unattached = call(CmOp::ResolveAddr, 0, 0, "ADDR_QUERY");
        unattached.attached = false;
        c.handle(&unattached, &mut out);
        assert_eq!(c.tracked(), 0);
        c.handle(&call(CmOp::Listen, 0, MS, "LISTEN"), &mut out);
        assert_eq!(c.state_of(0), Some("LISTEN"));
    }

    #[test]
    fn a_return_after_the_destroy_does_not_revive_the_id() {
        let mut c = CmCorrelator::new(names());
        let mut out = Vec::new();
        c.handle(&call(CmOp::Listen, 4, 0, "LISTEN"), &mut out);
        c.handle(&entry(CmOp::DestroyId, 4, MS), &mut out);
        // cma_cm_event_handler began before the destroy, returned after it
        c.handle(
            &handler(4, cm_event::DISCONNECTED, MS / 2, "DESTROYING"),
            &mut out,
        );
        assert_eq!(c.tracked(), 0);
        assert!(live(&out).is_empty(), "{:?}", live(&out));
    }
}
