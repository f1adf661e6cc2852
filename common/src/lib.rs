//! Types shared between qpwatch's eBPF programs and its userspace agent.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes these
//! structs into the ring buffer or reads them from globals, and the agent reads
//! the same bytes back. Field order is chosen so that no implicit padding exists
//! (the agent decodes with an explicit size check).
#![no_std]

pub mod vocab;

/// `IB_DEVICE_NAME_MAX` in include/rdma/ib_verbs.h.
pub const DEVICE_NAME_LEN: usize = 64;
/// `TASK_COMM_LEN` in include/linux/sched.h.
pub const COMM_LEN: usize = 16;

/// `IB_QP_STATE` bit of `enum ib_qp_attr_mask` (uapi: `IB_USER_VERBS_...`, stable ABI).
pub const IB_QP_STATE_MASK: u32 = 1;

/// What a ring-buffer record describes. The first `u32` of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    QpCreate = 1,
    QpModify = 2,
    QpDestroy = 3,
    /// An RDMA CM call or handler: a [`CmEvent`].
    Cm = 4,
}

impl EventKind {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::QpCreate),
            2 => Some(Self::QpModify),
            3 => Some(Self::QpDestroy),
            4 => Some(Self::Cm),
            _ => None,
        }
    }
}

/// Which kernel entry point produced a QP event.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpOrigin {
    /// Through uverbs (`ib_create_qp_user`): a userspace process.
    User = 0,
    /// An in-kernel ULP (`ib_create_qp_kernel`): NVMe-oF, iSER, NFS/RDMA, MAD.
    Kernel = 1,
}

/// One QP lifecycle call, filled at the kprobe and completed at the kretprobe.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QpEvent {
    /// [`EventKind`] as u32.
    pub kind: u32,
    /// [`QpOrigin`] as u32 (creates only; 0 otherwise).
    pub origin: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at function entry.
    pub start_ns: u64,
    /// `bpf_ktime_get_ns()` at function return.
    pub end_ns: u64,
    /// `bpf_get_current_pid_tgid()`: tgid in the upper 32 bits.
    pub pid_tgid: u64,
    pub qp_num: u32,
    /// `enum ib_qp_type`.
    pub qp_type: u32,
    /// Return code: 0 or a negative errno.
    pub rc: i32,
    /// `attr_mask` argument of `_ib_modify_qp` (modifies only).
    pub attr_mask: u32,
    /// `attr->qp_state` (`enum ib_qp_state`), valid when `attr_mask & IB_QP_STATE`.
    pub new_state: u32,
    pub _reserved: u32,
    pub comm: [u8; COMM_LEN],
    pub device: [u8; DEVICE_NAME_LEN],
}

impl QpEvent {
    pub const fn zeroed() -> Self {
        Self {
            kind: 0,
            origin: 0,
            start_ns: 0,
            end_ns: 0,
            pid_tgid: 0,
            qp_num: 0,
            qp_type: 0,
            rc: 0,
            attr_mask: 0,
            new_state: 0,
            _reserved: 0,
            comm: [0; COMM_LEN],
            device: [0; DEVICE_NAME_LEN],
        }
    }
}

/// Key of the in-flight call table: one entry per (thread, hook, nesting
/// level) between a kprobe and its kretprobe. A hooked function can run
/// inside itself on one thread (`rdma_listen` on a wildcard address calls
/// `rdma_listen` for each device, `cma_listen_on_dev`): level 0 holds the
/// outermost call, level n the call n deep inside it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingKey {
    pub pid_tgid: u64,
    pub hook: u32,
    pub level: u32,
}

/// Nesting levels of one hook on one thread that are recorded; a call deeper
/// than that is counted as [`LostReason::NestedTooDeep`].
pub const MAX_NESTING: u32 = 4;

/// Index into the per-CPU `LOST` counter array: why an event never reached userspace.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// `bpf_ringbuf_output` failed: the ring buffer was full.
    RingBufferFull = 0,
    /// The in-flight call table was full at the kprobe.
    PendingTableFull = 1,
    /// A kretprobe fired with no matching kprobe entry (the call began before
    /// the hooks were attached, or the kernel skipped the entry program: its
    /// BPF recursion protection skips a program while another one runs on
    /// the CPU).
    UnmatchedReturn = 2,
    /// A call nested more than [`MAX_NESTING`] deep in calls of the same
    /// hooked function on one thread.
    NestedTooDeep = 3,
    /// A call whose kretprobe never ran: a later call on the same thread
    /// found its entry still open at the same or a shallower stack depth.
    /// The kernel skips a return when more calls of the function are in
    /// flight than the kretprobe's `maxactive` (`max(10, 2 × CPUs)`).
    ReturnMissed = 4,
}

pub const LOST_REASONS: usize = 5;

impl LostReason {
    pub const ALL: [LostReason; LOST_REASONS] = [
        LostReason::RingBufferFull,
        LostReason::PendingTableFull,
        LostReason::UnmatchedReturn,
        LostReason::NestedTooDeep,
        LostReason::ReturnMissed,
    ];

    pub const fn label(self) -> &'static str {
        match self {
            LostReason::RingBufferFull => "ring_buffer_full",
            LostReason::PendingTableFull => "pending_table_full",
            LostReason::UnmatchedReturn => "unmatched_return",
            LostReason::NestedTooDeep => "nested_too_deep",
            LostReason::ReturnMissed => "return_missed",
        }
    }
}

/// Hook ids used in [`PendingKey::hook`]. CM hooks use `CM_BASE + CmOp`.
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
}

/// What produced a [`CmEvent`]: an rdma_cm function, hooked by a kprobe and
/// kretprobe pair (a completed call) or by a kprobe alone (entry only).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmOp {
    /// `rdma_create_qp(id, pd, init_attr)`
    CreateQp = 1,
    /// `cma_init_conn_qp(id_priv, qp)`: RESET→INIT of a connected kernel QP
    InitConnQp = 3,
    /// `cma_init_ud_qp(id_priv, qp)`: RESET→INIT→RTR→RTS of a kernel UD QP
    InitUdQp = 4,
    /// `cma_modify_qp_rtr(id_priv, conn_param)`
    ModifyQpRtr = 5,
    /// `cma_modify_qp_rts(id_priv, conn_param)`
    ModifyQpRts = 6,
    /// `cma_modify_qp_err(id_priv)`
    ModifyQpErr = 7,
    /// `cma_cm_event_handler(id_priv, event)`: delivery of an RDMA CM event
    EventHandler = 8,
    /// `cma_ib_handler(ib_cm_id, ib_cm_event)`: IB CM event on a connection
    IbHandler = 9,
    /// `cma_ib_req_handler(ib_cm_id, ib_cm_event)`: incoming connection request
    IbReqHandler = 10,
    /// `ucma_event_handler(cm_id, event)`: queueing of an event to userspace
    UcmaHandler = 11,
    ResolveAddr = 13,
    ResolveRoute = 14,
    Listen = 15,
    /// `rdma_connect_locked(id, conn_param)`: sends the REQ (SIDR REQ for UD)
    Connect = 16,
    /// `rdma_accept(id, conn_param)`: the REP, or without parameters the
    /// active side's RTU (through `cma_rep_recv`)
    Accept = 17,
    /// `cma_rep_recv(id_priv)`: the active side's QP to RTR and RTS, then the RTU
    RepRecv = 18,
    /// `rdma_reject(id, ...)`
    Reject = 19,
    /// `rdma_disconnect(id)`: DREQ, or DREP to the peer's DREQ
    Disconnect = 20,
    /// `_destroy_id(id_priv, state)` (entry only): the end of every id
    DestroyId = 21,
    /// `rdma_destroy_qp(id)` (entry only): a kernel QP leaves its id
    DestroyQp = 22,
}

impl CmOp {
    pub const ALL: [CmOp; 20] = [
        CmOp::CreateQp,
        CmOp::InitConnQp,
        CmOp::InitUdQp,
        CmOp::ModifyQpRtr,
        CmOp::ModifyQpRts,
        CmOp::ModifyQpErr,
        CmOp::EventHandler,
        CmOp::IbHandler,
        CmOp::IbReqHandler,
        CmOp::UcmaHandler,
        CmOp::ResolveAddr,
        CmOp::ResolveRoute,
        CmOp::Listen,
        CmOp::Connect,
        CmOp::Accept,
        CmOp::RepRecv,
        CmOp::Reject,
        CmOp::Disconnect,
        CmOp::DestroyId,
        CmOp::DestroyQp,
    ];

    pub fn from_u32(v: u32) -> Option<Self> {
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as u32 == v {
                return Some(Self::ALL[i]);
            }
            i += 1;
        }
        None
    }
}

/// [`CmEvent::flags`]: the id belongs to a userspace process (`res.user`).
pub const CM_FLAG_USER: u32 = 1;
/// The id has a kernel QP attached (`id->qp != NULL`): in-kernel consumers only.
pub const CM_FLAG_HAS_QP: u32 = 2;
/// `state` (at entry) was read.
pub const CM_FLAG_STATE: u32 = 4;
/// `state_after` (at return) was read.
pub const CM_FLAG_STATE_AFTER: u32 = 8;
/// The id is attached to a device (`res.valid`): `cm_id` is meaningful. Ids
/// are numbered from 0, so 0 is a valid id.
pub const CM_FLAG_ATTACHED: u32 = 16;
/// `rdma_accept()` was given connection parameters (the passive side's REP).
pub const CM_FLAG_CONN_PARAM: u32 = 32;

/// One RDMA CM observation: a completed call (kprobe pair) or a function
/// entry (kprobe alone).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CmEvent {
    /// [`EventKind::Cm`].
    pub kind: u32,
    /// [`CmOp`] as u32.
    pub op: u32,
    pub start_ns: u64,
    /// Equal to `start_ns` for entry-only hooks.
    pub end_ns: u64,
    pub pid_tgid: u64,
    /// Kernel address of the `rdma_id_private`. Identifies an id before it is
    /// attached to a device (and has no `res.id` yet).
    pub id_ptr: u64,
    /// `rdma_id_private.res.id`: the id `rdma res show cm_id` prints, valid
    /// when [`CM_FLAG_ATTACHED`] is set.
    pub cm_id: u32,
    pub qp_num: u32,
    /// `enum rdma_cm_event_type` (handlers) or `enum ib_cm_event_type` (IB handlers).
    pub event: u32,
    /// Event status (handlers) or consumer result (`cm_event_done`).
    pub status: i32,
    /// Return code of the call.
    pub rc: i32,
    /// `enum rdma_cm_state` at entry.
    pub state: u32,
    /// `enum rdma_cm_state` at return.
    pub state_after: u32,
    /// `enum ib_qp_type` of the id.
    pub qp_type: u32,
    /// `CM_FLAG_*`.
    pub flags: u32,
    pub _reserved: u32,
    pub comm: [u8; COMM_LEN],
    pub device: [u8; DEVICE_NAME_LEN],
}

impl CmEvent {
    pub const fn zeroed() -> Self {
        Self {
            kind: 0,
            op: 0,
            start_ns: 0,
            end_ns: 0,
            pid_tgid: 0,
            id_ptr: 0,
            cm_id: 0,
            qp_num: 0,
            event: 0,
            status: 0,
            rc: 0,
            state: 0,
            state_after: 0,
            qp_type: 0,
            flags: 0,
            _reserved: 0,
            comm: [0; COMM_LEN],
            device: [0; DEVICE_NAME_LEN],
        }
    }
}

/// The `ib_cma:*` tracepoints (drivers/infiniband/core/cm_trace.h) counted in
/// the kernel: raw tracepoint program `tp_<name>` increments slot `index` of
/// `IB_CM_HITS`.
pub const IB_CM_TRACEPOINTS: [&str; 34] = [
    "icm_dreq_skipped",
    "icm_dreq_unknown_err",
    "icm_establish_err",
    "icm_handler_err",
    "icm_insert_failed_err",
    "icm_issue_drep",
    "icm_issue_rej",
    "icm_mad_send_err",
    "icm_mra_unknown_err",
    "icm_no_listener_err",
    "icm_no_priv_err",
    "icm_qp_init_err",
    "icm_qp_rtr_err",
    "icm_qp_rts_err",
    "icm_rej_unknown_err",
    "icm_remote_no_priv_err",
    "icm_rep_unknown_err",
    "icm_send_cm_rtu_err",
    "icm_send_drep",
    "icm_send_drep_err",
    "icm_send_dreq",
    "icm_send_dup_rep",
    "icm_send_dup_req",
    "icm_send_mra",
    "icm_send_mra_unknown_err",
    "icm_send_rej",
    "icm_send_rep",
    "icm_send_rep_err",
    "icm_send_req",
    "icm_send_rtu",
    "icm_send_sidr_rep",
    "icm_send_sidr_req",
    "icm_send_unknown_rej_err",
    "icm_staleconn_err",
];

/// Byte offsets of the kernel struct fields the programs read, resolved from the
/// running kernel's BTF by the agent and written into the `OFFSETS` global
/// before load. Never compiled in: the programs read nothing without them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub ib_qp_device: u32,
    pub ib_qp_qp_num: u32,
    pub ib_qp_qp_type: u32,
    pub ib_pd_device: u32,
    pub ib_device_name: u32,
    pub ib_qp_attr_qp_state: u32,
    pub ib_qp_init_attr_qp_type: u32,
    /// Non-zero once the agent filled this struct.
    pub valid: u32,
}

/// Offsets in rdma_cm's structs, from `/sys/kernel/btf/rdma_cm`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmOffsets {
    /// `rdma_id_private.id`: the embedded `struct rdma_cm_id` (container_of).
    pub id_priv_id: u32,
    pub id_priv_state: u32,
    pub id_priv_qp_num: u32,
    pub id_priv_res_id: u32,
    /// `rdma_id_private.res.user` (bool).
    pub id_priv_res_user: u32,
    /// `rdma_id_private.res.valid` (bool): set by rdma_restrack_add().
    pub id_priv_res_valid: u32,
    /// `rdma_id_private.id.device`, `.id.qp`, `.id.qp_type`.
    pub id_priv_device: u32,
    pub id_priv_qp: u32,
    pub id_priv_qp_type: u32,
    pub cm_event_event: u32,
    pub cm_event_status: u32,
    pub ib_cm_id_context: u32,
    pub ib_cm_event_event: u32,
    /// Non-zero once the agent filled this struct.
    pub valid: u32,
}

#[cfg(feature = "user")]
// SAFETY: KernelOffsets is #[repr(C)], made only of u32 fields, and has no padding.
unsafe impl aya::Pod for KernelOffsets {}
#[cfg(feature = "user")]
// SAFETY: as KernelOffsets.
unsafe impl aya::Pod for CmOffsets {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn event_has_no_implicit_padding() {
        let fields = 4 * 2 + 8 * 3 + 4 * 6 + COMM_LEN + DEVICE_NAME_LEN;
        assert_eq!(size_of::<QpEvent>(), fields);
        assert_eq!(size_of::<PendingKey>(), 16);
        assert_eq!(size_of::<KernelOffsets>(), 4 * 8);
        let cm_fields = 4 * 2 + 8 * 4 + 4 * 10 + COMM_LEN + DEVICE_NAME_LEN;
        assert_eq!(size_of::<CmEvent>(), cm_fields);
    }

    #[test]
    fn cm_ops_round_trip() {
        for op in CmOp::ALL {
            assert_eq!(CmOp::from_u32(op as u32), Some(op));
        }
        assert_eq!(CmOp::from_u32(0), None);
    }
}
