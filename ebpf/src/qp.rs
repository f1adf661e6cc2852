//! QP lifecycle programs: kprobe/kretprobe pairs in ib_core. The kprobe
//! keeps the arguments and what the return can no longer read (a destroyed
//! QP); the kretprobe reads the rest and builds the record in its ring slot.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf,
    },
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use qpwatch_common::{
    hook, EventKind, KernelOffsets, QpEvent, QpOrigin, IB_AH_GRH, IB_QP_AV_MASK,
    IB_QP_DEST_QPN_MASK, IB_QP_STATE_MASK, REMOTE_GID, REMOTE_QPN,
};

use crate::{
    begin, current_comm, emit_in_place, finish, now_ns, offsets, read_device_name, read_ptr,
    read_u32, read_u8, MAX_ERRNO, PENDING,
};

/// A QP call between its kprobe and its kretprobe.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct QpCall {
    /// [`EventKind`] as u32; 0 once the call is closed.
    pub(crate) kind: u32,
    /// Modifies: `attr_mask`; destroys: the QP's number.
    pub(crate) word: u32,
    pub(crate) start_ns: u64,
    pub(crate) pid_tgid: u64,
    /// Creates and destroys: the `ib_device`; modifies: the `ib_qp`.
    pub(crate) object: u64,
    /// Creates: the `ib_qp_init_attr`; modifies: the `ib_qp_attr`;
    /// destroys: the QP's type.
    pub(crate) attr: u64,
}

impl QpCall {
    pub(crate) const fn zeroed() -> Self {
        Self {
            kind: 0,
            word: 0,
            start_ns: 0,
            pid_tgid: 0,
            object: 0,
            attr: 0,
        }
    }

    /// The call of `pid_tgid` beginning now.
    #[inline(always)]
    fn new(kind: EventKind, pid_tgid: u64, object: u64, attr: u64, word: u32) -> Self {
        Self {
            kind: kind as u32,
            word,
            start_ns: now_ns(),
            pid_tgid,
            object,
            attr,
        }
    }

    /// The record of this call, returning now: who made it (the same thread
    /// as at entry) and when.
    #[inline(always)]
    fn record_into(&self, event: &mut QpEvent) {
        event.kind = self.kind;
        event.start_ns = self.start_ns;
        event.end_ns = now_ns();
        event.pid_tgid = self.pid_tgid;
        current_comm(&mut event.comm);
    }
}

#[inline(always)]
pub(crate) fn new_event(kind: EventKind) -> QpEvent {
    let mut event = QpEvent::zeroed();
    event.kind = kind as u32;
    event.start_ns = now_ns();
    event.pid_tgid = bpf_get_current_pid_tgid();
    current_comm(&mut event.comm);
    event
}

/// Closes the returning QP call of `hook` with its record, built in its ring
/// slot: who and when, then what `fill` reads.
#[inline(always)]
fn finish_qp(
    ctx: &RetProbeContext,
    hook: u32,
    fill: impl FnOnce(&QpCall, &mut QpEvent, &KernelOffsets),
) {
    let Some(offsets) = offsets() else { return };
    finish(ctx, &PENDING, hook, |call| {
        emit_in_place(|event| {
            call.record_into(event);
            fill(call, event, &offsets);
        });
    });
}

#[inline(always)]
fn begin_create(ctx: &ProbeContext, hook: u32, device: u64, init_attr: u64) {
    begin(ctx, &PENDING, hook, |call, pid_tgid| {
        *call = QpCall::new(EventKind::QpCreate, pid_tgid, device, init_attr, 0);
    });
}

#[inline(always)]
fn finish_create(ctx: &RetProbeContext, hook: u32, origin: QpOrigin) {
    let qp: u64 = ctx.ret();
    finish_qp(ctx, hook, |call, event, offsets| {
        event.origin = origin as u32;
        // SAFETY: a helper without arguments, allowed in kprobes.
        event.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
        read_device_name(call.object, offsets, &mut event.device);
        if qp == 0 || qp >= MAX_ERRNO.wrapping_neg() {
            event.rc = qp as i64 as i32;
            event.qp_type = read_u32(call.attr, offsets.ib_qp_init_attr_qp_type);
        } else {
            (event.qp_num, event.qp_type) = read_qp_num_and_type(qp, offsets);
        }
    });
}

/// `struct ib_qp *ib_create_qp_user(struct ib_device *dev, struct ib_pd *pd,
///     struct ib_qp_init_attr *attr, struct ib_udata *udata, struct ib_uqp_object *uobj,
///     const char *caller)` — every uverbs QP, including librdmacm's `rdma_create_qp`.
#[kprobe(function = "ib_create_qp_user")]
pub fn qp_create_user(ctx: ProbeContext) -> u32 {
    if offsets().is_none() {
        return 0;
    }
    let device: u64 = ctx.arg(0).unwrap_or(0);
    let init_attr: u64 = ctx.arg(2).unwrap_or(0);
    begin_create(&ctx, hook::CREATE_QP_USER, device, init_attr);
    0
}

#[kretprobe(function = "ib_create_qp_user")]
pub fn qp_create_user_ret(ctx: RetProbeContext) -> u32 {
    finish_create(&ctx, hook::CREATE_QP_USER, QpOrigin::User);
    0
}

/// `struct ib_qp *ib_create_qp_kernel(struct ib_pd *pd, struct ib_qp_init_attr *attr,
///     const char *caller)` — in-kernel consumers; the device is `pd->device`.
#[kprobe(function = "ib_create_qp_kernel")]
pub fn qp_create_kernel(ctx: ProbeContext) -> u32 {
    let Some(offsets) = offsets() else { return 0 };
    let pd: u64 = ctx.arg(0).unwrap_or(0);
    let init_attr: u64 = ctx.arg(1).unwrap_or(0);
    let device = if pd == 0 {
        0
    } else {
        read_ptr(pd, offsets.ib_pd_device)
    };
    begin_create(&ctx, hook::CREATE_QP_KERNEL, device, init_attr);
    0
}

#[kretprobe(function = "ib_create_qp_kernel")]
pub fn qp_create_kernel_ret(ctx: RetProbeContext) -> u32 {
    finish_create(&ctx, hook::CREATE_QP_KERNEL, QpOrigin::Kernel);
    0
}

/// `qp->qp_num` and `qp->qp_type`, with one read where the type lies in the
/// 16 bytes from the number on (6.1: `qp_num`, `max_write_sge`,
/// `max_read_sge`, `qp_type`).
#[inline(always)]
pub(crate) fn read_qp_num_and_type(qp: u64, offsets: &KernelOffsets) -> (u32, u32) {
    let type_word = match offsets.ib_qp_qp_type.wrapping_sub(offsets.ib_qp_qp_num) {
        4 => 1,
        8 => 2,
        12 => 3,
        _ => {
            return (
                read_u32(qp, offsets.ib_qp_qp_num),
                read_u32(qp, offsets.ib_qp_qp_type),
            )
        }
    };
    let from = (qp + offsets.ib_qp_qp_num as u64) as *const [u32; 4];
    // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
    let words = unsafe { bpf_probe_read_kernel(from) }.unwrap_or([0; 4]);
    (words[0], words[type_word & 3])
}

#[inline(always)]
pub(crate) fn qp_identity(event: &mut QpEvent, qp: u64, offsets: &KernelOffsets) {
    (event.qp_num, event.qp_type) = read_qp_num_and_type(qp, offsets);
    read_device_name(
        read_ptr(qp, offsets.ib_qp_device),
        offsets,
        &mut event.device,
    );
}

/// `static int _ib_modify_qp(struct ib_qp *qp, struct ib_qp_attr *attr, int attr_mask,
///     struct ib_udata *udata)` — both `ib_modify_qp_with_udata` (uverbs) and
/// `ib_modify_qp` (kernel) end here, always with `qp->real_qp`. Both callers
/// own `attr` until this returns, and it keeps the fields read here.
#[kprobe(function = "_ib_modify_qp")]
pub fn qp_modify(ctx: ProbeContext) -> u32 {
    if offsets().is_none() {
        return 0;
    }
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    let attr: u64 = ctx.arg(1).unwrap_or(0);
    let attr_mask: u32 = ctx.arg(2).unwrap_or(0);
    begin(&ctx, &PENDING, hook::MODIFY_QP, |call, pid_tgid| {
        *call = QpCall::new(EventKind::QpModify, pid_tgid, qp, attr, attr_mask);
    });
    0
}

#[kretprobe(function = "_ib_modify_qp")]
pub fn qp_modify_ret(ctx: RetProbeContext) -> u32 {
    let rc: u64 = ctx.ret();
    finish_qp(&ctx, hook::MODIFY_QP, |call, event, offsets| {
        event.rc = rc as i32;
        qp_identity(event, call.object, offsets);
        let (attr, attr_mask) = (call.attr, call.word);
        event.attr_mask = attr_mask;
        let with_remote = attr_mask & (IB_QP_DEST_QPN_MASK | IB_QP_AV_MASK) != 0;
        if offsets.peers_valid != 0 && with_remote {
            if read_attr_head(event, attr, attr_mask, offsets) {
                return;
            }
            read_remote(event, attr, attr_mask, offsets);
        }
        if attr_mask & IB_QP_STATE_MASK != 0 {
            event.new_state = read_u32(attr, offsets.ib_qp_attr_qp_state);
        }
    });
    0
}

/// Bytes of `ib_qp_attr` from its start read at once when a modify carries
/// the remote side: 6.1 keeps every field the return reads within its first
/// 105 (`qp_state` 0, `dest_qp_num` 28, `ah_attr.grh.dgid` 72,
/// `ah_attr.ah_flags` 104).
const ATTR_HEAD_WORDS: usize = 16;
const ATTR_HEAD: u32 = (ATTR_HEAD_WORDS * 8) as u32;
const _: () = assert!(core::mem::offset_of!(QpEvent, remote_gid) % 8 == 0);

/// The new state and the remote side of a modify from one read of the head
/// of its `ib_qp_attr`, instead of one read per field; false, with nothing
/// written, where the kernel's layout puts a field outside that head or
/// unaligned. The offsets are constants to the verifier (`OFFSETS` is
/// read-only and frozen), so every access below has a fixed offset.
#[inline(always)]
fn read_attr_head(event: &mut QpEvent, attr: u64, attr_mask: u32, offsets: &KernelOffsets) -> bool {
    let state = offsets.ib_qp_attr_qp_state;
    let dest_qpn = offsets.ib_qp_attr_dest_qp_num;
    let dgid = offsets.ib_qp_attr_dgid;
    let ah_flags = offsets.ib_qp_attr_ah_flags;
    let end = (state + 4)
        .max(dest_qpn + 4)
        .max(dgid + 16)
        .max(ah_flags + 1);
    if end > ATTR_HEAD
        || !state.is_multiple_of(4)
        || !dest_qpn.is_multiple_of(4)
        || !dgid.is_multiple_of(8)
    {
        return false;
    }
    let mut head = [0u64; ATTR_HEAD_WORDS];
    let base = head.as_mut_ptr().cast::<u8>();
    // SAFETY: the helper writes at most `end` ≤ ATTR_HEAD bytes into `head`;
    // it validates the kernel address and fails instead of faulting.
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            base.cast(),
            end,
            attr as *const core::ffi::c_void,
        )
    };
    if rc != 0 {
        return true;
    }
    // SAFETY (the reads below): each lies within the `end` bytes just read,
    // at the alignment of its type (checked above).
    let word = |offset: u32| unsafe { *base.add(offset as usize).cast::<u32>() };
    if attr_mask & IB_QP_STATE_MASK != 0 {
        event.new_state = word(state);
    }
    if attr_mask & IB_QP_DEST_QPN_MASK != 0 {
        event.remote_qpn = word(dest_qpn);
        event.remote |= REMOTE_QPN;
    }
    if attr_mask & IB_QP_AV_MASK != 0 && unsafe { *base.add(ah_flags as usize) } & IB_AH_GRH != 0 {
        let gid = unsafe { *base.add(dgid as usize).cast::<[u64; 2]>() };
        // SAFETY: `remote_gid` is 16 bytes at an 8-byte aligned offset.
        unsafe { event.remote_gid.as_mut_ptr().cast::<[u64; 2]>().write(gid) };
        event.remote |= REMOTE_GID;
    }
    true
}

/// The remote side a modify gives the QP (the transition to RTR carries it):
/// its GID when the address vector has a GRH (RoCE always, IB across
/// subnets), its QP number.
#[inline(always)]
fn read_remote(event: &mut QpEvent, attr: u64, attr_mask: u32, offsets: &KernelOffsets) {
    if attr_mask & IB_QP_DEST_QPN_MASK != 0 {
        event.remote_qpn = read_u32(attr, offsets.ib_qp_attr_dest_qp_num);
        event.remote |= REMOTE_QPN;
    }
    if attr_mask & IB_QP_AV_MASK != 0 && read_u8(attr, offsets.ib_qp_attr_ah_flags) & IB_AH_GRH != 0
    {
        let gid = (attr + offsets.ib_qp_attr_dgid as u64) as *const u8;
        // SAFETY: bpf_probe_read_kernel validates the address and fails
        // instead of faulting; it zero-fills the buffer on failure. Read in
        // place: a returned array would be copied byte by byte.
        if unsafe { bpf_probe_read_kernel_buf(gid, &mut event.remote_gid) }.is_ok() {
            event.remote |= REMOTE_GID;
        }
    }
}

/// `int ib_destroy_qp_user(struct ib_qp *qp, struct ib_udata *udata)` — uverbs and
/// kernel (`ib_destroy_qp()` is an inline wrapper) destroys alike. Fails with
/// -EBUSY while the QP is still in use, so the return code decides. The QP is
/// freed by its return: what identifies it is read here; its device outlives it.
#[kprobe(function = "ib_destroy_qp_user")]
pub fn qp_destroy(ctx: ProbeContext) -> u32 {
    let Some(offsets) = offsets() else { return 0 };
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    let (qp_num, qp_type) = read_qp_num_and_type(qp, &offsets);
    let device = read_ptr(qp, offsets.ib_qp_device);
    begin(&ctx, &PENDING, hook::DESTROY_QP, |call, pid_tgid| {
        *call = QpCall::new(
            EventKind::QpDestroy,
            pid_tgid,
            device,
            qp_type as u64,
            qp_num,
        );
    });
    0
}

#[kretprobe(function = "ib_destroy_qp_user")]
pub fn qp_destroy_ret(ctx: RetProbeContext) -> u32 {
    let rc: u64 = ctx.ret();
    finish_qp(&ctx, hook::DESTROY_QP, |call, event, offsets| {
        event.rc = rc as i32;
        event.qp_num = call.word;
        event.qp_type = call.attr as u32;
        read_device_name(call.object, offsets, &mut event.device);
    });
    0
}
