//! What the programs and the agent must agree on about the hooks: the ids
//! that key in-flight calls, the RDMA CM functions ([`CmOp`]) and the
//! `ib_cma:*` tracepoints ([`IB_CM_TRACEPOINTS`]). Each list is written once,
//! here; positions in it are the numbers both sides use.

/// Hook ids used in [`PendingKey::hook`](crate::PendingKey::hook). CM hooks
/// use `CM_BASE + CmOp` ([`CmOp::hook`]).
pub mod hook {
    pub const CREATE_QP_USER: u32 = 1;
    pub const CREATE_QP_KERNEL: u32 = 2;
    pub const MODIFY_QP: u32 = 3;
    pub const DESTROY_QP: u32 = 4;
    pub const CM_BASE: u32 = 1000;

    /// Entries of the `RETURN_HOOKED_SINCE` array.
    pub const RETURN_SLOTS: u32 = 64;

    /// A kprobe/kretprobe pair's entry in `RETURN_HOOKED_SINCE`, where the
    /// agent writes when the kretprobe was attached (CLOCK_MONOTONIC ns; 0:
    /// not attached). A call that began before that never gets its return
    /// program run (the kernel sets up the return hook at the call's entry):
    /// its entry is dropped, not counted as lost.
    pub const fn return_slot(hook: u32) -> u32 {
        if hook >= CM_BASE {
            16 + hook - CM_BASE
        } else {
            hook
        }
    }

    // The QP hooks keep below the CM ones, and every CM op has a slot.
    const _: () = assert!(return_slot(DESTROY_QP) < return_slot(CM_BASE));
    const _: () = assert!(return_slot(CM_BASE + super::CmOp::COUNT as u32) < RETURN_SLOTS);
}

/// Defines [`CmOp`] from its list: the first op is 1, the next 2, and so on
/// (0 is no op).
macro_rules! cm_ops {
    (
        $(#[$first_doc:meta])* $first:ident => $first_function:literal,
        $($(#[$doc:meta])* $op:ident => $function:literal,)*
    ) => {
        /// What produced a [`CmEvent`](crate::CmEvent): an rdma_cm or rdma_ucm
        /// function, hooked by a kprobe and kretprobe pair (a completed
        /// call) or by a kprobe alone (entry only). Its value in a record is
        /// its position in the list, from 1.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum CmOp {
            $(#[$first_doc])* $first = 1,
            $($(#[$doc])* $op,)*
        }

        impl CmOp {
            pub const COUNT: usize = [$first_function, $($function),*].len();

            pub const ALL: [CmOp; CmOp::COUNT] = [CmOp::$first, $(CmOp::$op),*];

            /// The kernel function the op's programs are attached to.
            pub const fn function(self) -> &'static str {
                match self {
                    CmOp::$first => $first_function,
                    $(CmOp::$op => $function,)*
                }
            }
        }
    };
}

cm_ops! {
    /// `rdma_create_qp(id, pd, init_attr)`
    CreateQp => "rdma_create_qp",
    /// `cma_init_conn_qp(id_priv, qp)`: RESET→INIT of a connected kernel QP
    InitConnQp => "cma_init_conn_qp",
    /// `cma_init_ud_qp(id_priv, qp)`: RESET→INIT→RTR→RTS of a kernel UD QP
    InitUdQp => "cma_init_ud_qp",
    /// `cma_modify_qp_rtr(id_priv, conn_param)`
    ModifyQpRtr => "cma_modify_qp_rtr",
    /// `cma_modify_qp_rts(id_priv, conn_param)`
    ModifyQpRts => "cma_modify_qp_rts",
    /// `cma_modify_qp_err(id_priv)`
    ModifyQpErr => "cma_modify_qp_err",
    /// `cma_cm_event_handler(id_priv, event)`: delivery of an RDMA CM event
    EventHandler => "cma_cm_event_handler",
    /// `cma_ib_handler(ib_cm_id, ib_cm_event)`: IB CM event on a connection
    IbHandler => "cma_ib_handler",
    /// `cma_ib_req_handler(ib_cm_id, ib_cm_event)`: incoming connection request
    IbReqHandler => "cma_ib_req_handler",
    /// `ucma_event_handler(cm_id, event)`: queueing of an event to userspace
    UcmaHandler => "ucma_event_handler",
    /// `rdma_resolve_addr(id, ...)`
    ResolveAddr => "rdma_resolve_addr",
    /// `rdma_resolve_route(id, timeout_ms)`
    ResolveRoute => "rdma_resolve_route",
    /// `rdma_listen(id, backlog)`
    Listen => "rdma_listen",
    /// `rdma_connect_locked(id, conn_param)`: sends the REQ (SIDR REQ for UD)
    Connect => "rdma_connect_locked",
    /// `rdma_accept(id, conn_param)`: the REP, or without parameters the
    /// active side's RTU (through `cma_rep_recv`)
    Accept => "rdma_accept",
    /// `cma_rep_recv(id_priv)`: the active side's QP to RTR and RTS, then the RTU
    RepRecv => "cma_rep_recv",
    /// `rdma_reject(id, ...)`
    Reject => "rdma_reject",
    /// `rdma_disconnect(id)`: DREQ, or DREP to the peer's DREQ
    Disconnect => "rdma_disconnect",
    /// `_destroy_id(id_priv, state)` (entry only): the end of every id
    DestroyId => "_destroy_id",
    /// `rdma_destroy_qp(id)` (entry only): a kernel QP leaves its id
    DestroyQp => "rdma_destroy_qp",
}

impl CmOp {
    pub const fn from_u32(v: u32) -> Option<Self> {
        if v >= 1 && v as usize <= Self::COUNT {
            Some(Self::ALL[v as usize - 1])
        } else {
            None
        }
    }

    /// What metrics (`call`, `handler`) and JSON lines (`op`) call the op:
    /// its kernel function.
    pub const fn label(self) -> &'static str {
        self.function()
    }

    /// The op's id in [`PendingKey::hook`](crate::PendingKey::hook).
    pub const fn hook(self) -> u32 {
        hook::CM_BASE + self as u32
    }

    /// Whether `function` is the op's kernel function: the programs check
    /// at compile time that they are attached where the op says.
    pub const fn is_function(self, function: &str) -> bool {
        same_str(self.function(), function)
    }
}

/// The `ib_cma:*` tracepoints (drivers/infiniband/core/cm_trace.h) counted in
/// the kernel, one line each: the eBPF program that counts it and the
/// tracepoint. A tracepoint's position in the list is its slot in the
/// programs' `IB_CM_HITS` counters and in [`IB_CM_TRACEPOINTS`].
///
/// `ib_cm_tracepoints!(callback)` expands to `callback! { program =>
/// "tracepoint", ... }`: the eBPF crate defines the programs from it.
#[macro_export]
macro_rules! ib_cm_tracepoints {
    ($callback:ident) => {
        $callback! {
            tp_icm_dreq_skipped => "icm_dreq_skipped",
            tp_icm_dreq_unknown_err => "icm_dreq_unknown_err",
            tp_icm_establish_err => "icm_establish_err",
            tp_icm_handler_err => "icm_handler_err",
            tp_icm_insert_failed_err => "icm_insert_failed_err",
            tp_icm_issue_drep => "icm_issue_drep",
            tp_icm_issue_rej => "icm_issue_rej",
            tp_icm_mad_send_err => "icm_mad_send_err",
            tp_icm_mra_unknown_err => "icm_mra_unknown_err",
            tp_icm_no_listener_err => "icm_no_listener_err",
            tp_icm_no_priv_err => "icm_no_priv_err",
            tp_icm_qp_init_err => "icm_qp_init_err",
            tp_icm_qp_rtr_err => "icm_qp_rtr_err",
            tp_icm_qp_rts_err => "icm_qp_rts_err",
            tp_icm_rej_unknown_err => "icm_rej_unknown_err",
            tp_icm_remote_no_priv_err => "icm_remote_no_priv_err",
            tp_icm_rep_unknown_err => "icm_rep_unknown_err",
            tp_icm_send_cm_rtu_err => "icm_send_cm_rtu_err",
            tp_icm_send_drep => "icm_send_drep",
            tp_icm_send_drep_err => "icm_send_drep_err",
            tp_icm_send_dreq => "icm_send_dreq",
            tp_icm_send_dup_rep => "icm_send_dup_rep",
            tp_icm_send_dup_req => "icm_send_dup_req",
            tp_icm_send_mra => "icm_send_mra",
            tp_icm_send_mra_unknown_err => "icm_send_mra_unknown_err",
            tp_icm_send_rej => "icm_send_rej",
            tp_icm_send_rep => "icm_send_rep",
            tp_icm_send_rep_err => "icm_send_rep_err",
            tp_icm_send_req => "icm_send_req",
            tp_icm_send_rtu => "icm_send_rtu",
            tp_icm_send_sidr_rep => "icm_send_sidr_rep",
            tp_icm_send_sidr_req => "icm_send_sidr_req",
            tp_icm_send_unknown_rej_err => "icm_send_unknown_rej_err",
            tp_icm_staleconn_err => "icm_staleconn_err",
        }
    };
}

macro_rules! ib_cm_tracepoint_names {
    ($($program:ident => $tracepoint:literal,)*) => {
        /// The `ib_cma:*` tracepoints of [`ib_cm_tracepoints!`], by slot.
        pub const IB_CM_TRACEPOINTS: [&str; [$($tracepoint),*].len()] = [$($tracepoint),*];
    };
}
ib_cm_tracepoints!(ib_cm_tracepoint_names);

/// The slot of `tracepoint` in [`IB_CM_TRACEPOINTS`]; fails to compile in a
/// const context if it is not there.
pub const fn ib_cm_slot(tracepoint: &str) -> usize {
    let mut slot = 0;
    while slot < IB_CM_TRACEPOINTS.len() {
        if same_str(IB_CM_TRACEPOINTS[slot], tracepoint) {
            return slot;
        }
        slot += 1;
    }
    panic!("not an ib_cma tracepoint of ib_cm_tracepoints!")
}

const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_ops_round_trip() {
        for (i, op) in CmOp::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i + 1, "{op:?} numbered by position");
            assert_eq!(CmOp::from_u32(op as u32), Some(op));
            assert!(op.is_function(op.function()));
        }
        assert_eq!(CmOp::from_u32(0), None);
        assert_eq!(CmOp::from_u32(CmOp::COUNT as u32 + 1), None);
        assert!(!CmOp::Connect.is_function("rdma_connect"));
    }

    #[test]
    fn return_slots_are_distinct_and_in_range() {
        let mut slots: [u32; 4 + CmOp::COUNT] = [0; 4 + CmOp::COUNT];
        let qp = [
            hook::CREATE_QP_USER,
            hook::CREATE_QP_KERNEL,
            hook::MODIFY_QP,
            hook::DESTROY_QP,
        ];
        for (slot, id) in slots
            .iter_mut()
            .zip(qp.into_iter().chain(CmOp::ALL.map(CmOp::hook)))
        {
            *slot = hook::return_slot(id);
            assert!(*slot < hook::RETURN_SLOTS);
        }
        slots.sort_unstable();
        assert!(slots.windows(2).all(|w| w[0] != w[1]), "{slots:?}");
    }

    #[test]
    fn ib_cm_slots_are_positions() {
        for (i, name) in IB_CM_TRACEPOINTS.into_iter().enumerate() {
            assert_eq!(ib_cm_slot(name), i);
        }
        assert_eq!(IB_CM_TRACEPOINTS.len(), 34);
    }
}
