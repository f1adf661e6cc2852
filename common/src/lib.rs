//! Types shared between qpwatch's eBPF programs and its userspace agent.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes these
//! structs into the ring buffer or reads them from globals, and the agent reads
//! the same bytes back. Field order is chosen so that no implicit padding exists
//! (the agent decodes with an explicit size check).
#![no_std]

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
}

impl EventKind {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::QpCreate),
            2 => Some(Self::QpModify),
            3 => Some(Self::QpDestroy),
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

/// Key of the in-flight call table: one entry per (thread, hook) between a
/// kprobe and its kretprobe.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingKey {
    pub pid_tgid: u64,
    pub hook: u32,
    pub _reserved: u32,
}

/// Index into the per-CPU `LOST` counter array: why an event never reached userspace.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// `bpf_ringbuf_output` failed: the ring buffer was full.
    RingBufferFull = 0,
    /// The in-flight call table was full at the kprobe.
    PendingTableFull = 1,
    /// A kretprobe fired with no matching kprobe entry (entry dropped or the
    /// call began before the probes were attached).
    UnmatchedReturn = 2,
}

pub const LOST_REASONS: usize = 3;

impl LostReason {
    pub const ALL: [LostReason; LOST_REASONS] = [
        LostReason::RingBufferFull,
        LostReason::PendingTableFull,
        LostReason::UnmatchedReturn,
    ];

    pub const fn label(self) -> &'static str {
        match self {
            LostReason::RingBufferFull => "ring_buffer_full",
            LostReason::PendingTableFull => "pending_table_full",
            LostReason::UnmatchedReturn => "unmatched_return",
        }
    }
}

/// Hook ids used in [`PendingKey::hook`].
pub mod hook {
    pub const CREATE_QP_USER: u32 = 1;
    pub const CREATE_QP_KERNEL: u32 = 2;
    pub const MODIFY_QP: u32 = 3;
    pub const DESTROY_QP: u32 = 4;
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
    /// Non-zero once the agent filled this struct.
    pub valid: u32,
}

#[cfg(feature = "user")]
// SAFETY: KernelOffsets is #[repr(C)], made only of u32 fields, and has no padding.
unsafe impl aya::Pod for KernelOffsets {}

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
    }
}
