//! Types shared between qpwatch's eBPF programs and its userspace agent.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes these
//! structs into the ring buffer or reads them from globals, and the agent reads
//! the same bytes back. Field order is chosen so that no implicit padding exists
//! (the agent decodes with an explicit size check).
#![no_std]

mod hooks;
pub mod vocab;
pub use hooks::{hook, ib_cm_slot, CmOp, IB_CM_TRACEPOINTS};

/// `IB_DEVICE_NAME_MAX` in include/rdma/ib_verbs.h.
pub const DEVICE_NAME_LEN: usize = 64;
/// `TASK_COMM_LEN` in include/linux/sched.h.
pub const COMM_LEN: usize = 16;

/// `IB_QP_STATE` bit of `enum ib_qp_attr_mask` (uapi: `IB_USER_VERBS_...`, stable ABI).
pub const IB_QP_STATE_MASK: u32 = 1;
/// `IB_QP_AV`: `attr->ah_attr` (the remote address) is given.
pub const IB_QP_AV_MASK: u32 = 1 << 7;
/// `IB_QP_DEST_QPN`: `attr->dest_qp_num` is given.
pub const IB_QP_DEST_QPN_MASK: u32 = 1 << 20;
/// `IB_AH_GRH` of `rdma_ah_attr.ah_flags`: the address has a GRH (a GID).
pub const IB_AH_GRH: u8 = 1;

/// [`QpEvent::remote`] bits: which remote fields a modify carried.
pub const REMOTE_GID: u32 = 1;
pub const REMOTE_QPN: u32 = 2;

/// What a ring-buffer record describes. The first `u32` of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    QpCreate = 1,
    QpModify = 2,
    QpDestroy = 3,
    /// An RDMA CM call or handler: a [`CmEvent`].
    Cm = 4,
    /// A QP async event delivered to its consumer's handler (entry only):
    /// [`QpEvent::detail`] is the `enum ib_event_type`.
    QpAsyncEvent = 5,
    /// The device completed a work request of the QP in error (entry only):
    /// [`QpEvent::detail`] is the `enum ib_wc_status`; flushes are left out.
    CompletionError = 6,
    /// The device moved the QP to ERR itself, not at its owner's request
    /// (entry only).
    DeviceError = 7,
}

impl EventKind {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::QpCreate),
            2 => Some(Self::QpModify),
            3 => Some(Self::QpDestroy),
            4 => Some(Self::Cm),
            5 => Some(Self::QpAsyncEvent),
            6 => Some(Self::CompletionError),
            7 => Some(Self::DeviceError),
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
    /// `attr->dest_qp_num`, valid when `remote & REMOTE_QPN`.
    pub remote_qpn: u32,
    pub comm: [u8; COMM_LEN],
    pub device: [u8; DEVICE_NAME_LEN],
    /// `attr->ah_attr.grh.dgid`, valid when `remote & REMOTE_GID`.
    pub remote_gid: [u8; 16],
    /// `REMOTE_*` bits (modifies only).
    pub remote: u32,
    /// `enum ib_event_type` ([`EventKind::QpAsyncEvent`]) or `enum
    /// ib_wc_status` ([`EventKind::CompletionError`]); 0 otherwise.
    pub detail: u32,
    /// `bpf_get_current_cgroup_id()`: the creating task's cgroup v2 id (the
    /// cgroup directory's inode number); creates only, 0 otherwise.
    pub cgroup_id: u64,
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
            remote_qpn: 0,
            comm: [0; COMM_LEN],
            device: [0; DEVICE_NAME_LEN],
            remote_gid: [0; 16],
            remote: 0,
            detail: 0,
            cgroup_id: 0,
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
    /// `ib_qp_attr.dest_qp_num`, `.ah_attr.ah_flags`, `.ah_attr.grh.dgid`:
    /// the remote side of a modify; read only when `peers_valid`.
    pub ib_qp_attr_dest_qp_num: u32,
    pub ib_qp_attr_ah_flags: u32,
    pub ib_qp_attr_dgid: u32,
    /// Non-zero when the three offsets above were found in the kernel's BTF.
    pub peers_valid: u32,
    /// `ib_event.element` (the QP for QP events) and `ib_event.event`; read
    /// only when `events_valid`.
    pub ib_event_element: u32,
    pub ib_event_event: u32,
    pub events_valid: u32,
    /// Non-zero once the agent filled this struct.
    pub valid: u32,
}

/// Offsets in soft-RoCE's structs, from `/sys/kernel/btf/rdma_rxe`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxeOffsets {
    /// `rxe_qp.ibqp`: the embedded `struct ib_qp`.
    pub rxe_qp_ibqp: u32,
    /// `rxe_cq.ibcq` (embedded `struct ib_cq`), `rxe_cq.is_user` (bool).
    pub rxe_cq_ibcq: u32,
    pub rxe_cq_is_user: u32,
    /// `ib_cq.device`.
    pub ib_cq_device: u32,
    /// `rxe_cqe.ibwc.status` and `rxe_cqe.uibwc.status`: the same offset in
    /// both members of the union (the agent checks).
    pub rxe_cqe_status: u32,
    /// `rxe_cqe.ibwc.qp` (kernel CQs: a `struct ib_qp *`).
    pub rxe_cqe_ibwc_qp: u32,
    /// `rxe_cqe.uibwc.qp_num` (user CQs).
    pub rxe_cqe_uibwc_qp_num: u32,
    /// `IB_WC_WR_FLUSH_ERR` in the kernel's `enum ib_wc_status`: the
    /// completions of a QP already in ERR, not a cause.
    pub wc_flush_err: u32,
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
#[cfg(feature = "user")]
// SAFETY: as KernelOffsets.
unsafe impl aya::Pod for RxeOffsets {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn event_has_no_implicit_padding() {
        let fields = 4 * 2 + 8 * 3 + 4 * 6 + COMM_LEN + DEVICE_NAME_LEN + 16 + 4 * 2 + 8;
        assert_eq!(size_of::<QpEvent>(), fields);
        assert_eq!(size_of::<PendingKey>(), 16);
        assert_eq!(size_of::<KernelOffsets>(), 4 * 15);
        assert_eq!(size_of::<RxeOffsets>(), 4 * 9);
        let cm_fields = 4 * 2 + 8 * 4 + 4 * 10 + COMM_LEN + DEVICE_NAME_LEN;
        assert_eq!(size_of::<CmEvent>(), cm_fields);
    }
}
