//! qpwatch's kernel programs: kprobe/kretprobe pairs on the ib_core QP lifecycle.
//!
//! Every kprobe records the call's arguments into `PENDING`, keyed by (thread,
//! hook); the matching kretprobe adds the return value and end time and emits one
//! `QpEvent` into the `EVENTS` ring buffer. Struct field offsets come from the
//! `OFFSETS` global, which the agent fills from the running kernel's BTF.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{kprobe, kretprobe, map},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext, Global,
};
use aya_log_ebpf::debug;
use qpwatch_common::{
    hook, EventKind, KernelOffsets, LostReason, PendingKey, QpEvent, QpOrigin, COMM_LEN,
    IB_QP_STATE_MASK, LOST_REASONS,
};

#[no_mangle]
static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    ib_qp_device: 0,
    ib_qp_qp_num: 0,
    ib_qp_qp_type: 0,
    ib_pd_device: 0,
    ib_device_name: 0,
    ib_qp_attr_qp_state: 0,
    ib_qp_init_attr_qp_type: 0,
    valid: 0,
});

/// Resized by the agent (`ring_buffer_bytes`) before load.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
static PENDING: LruHashMap<PendingKey, QpEvent> = LruHashMap::with_max_entries(16384, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_REASONS as u32, 0);

/// `IS_ERR_VALUE()` in include/linux/err.h: the top 4095 addresses are errnos.
const MAX_ERRNO: u64 = 4095;

#[inline(always)]
fn offsets() -> Option<KernelOffsets> {
    let offsets = OFFSETS.load();
    (offsets.valid != 0).then_some(offsets)
}

#[inline(always)]
fn read_u32(base: u64, offset: u32) -> u32 {
    // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const u32) }.unwrap_or(0)
}

#[inline(always)]
fn read_ptr(base: u64, offset: u32) -> u64 {
    // SAFETY: as in read_u32.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const u64) }.unwrap_or(0)
}

#[inline(always)]
fn read_device_name(device: u64, offsets: &KernelOffsets, out: &mut [u8]) {
    if device == 0 {
        return;
    }
    let name = (device + offsets.ib_device_name as u64) as *const u8;
    // SAFETY: as in read_u32; the helper NUL-terminates within `out`.
    let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, out) };
}

#[inline(always)]
fn count_lost(reason: LostReason) {
    if let Some(counter) = LOST.get_ptr_mut(reason as u32) {
        // SAFETY: per-CPU slot; a BPF program is not preempted by itself on one CPU.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions; it is `unsafe` only as an FFI helper.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn new_event(kind: EventKind) -> QpEvent {
    let mut event = QpEvent::zeroed();
    event.kind = kind as u32;
    event.start_ns = now_ns();
    event.pid_tgid = bpf_get_current_pid_tgid();
    event.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    event
}

#[inline(always)]
fn pending_key(hook: u32) -> PendingKey {
    PendingKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        hook,
        _reserved: 0,
    }
}

#[inline(always)]
fn begin(hook: u32, event: &QpEvent) {
    if PENDING.insert(pending_key(hook), event, 0).is_err() {
        count_lost(LostReason::PendingTableFull);
    }
}

/// Completes the in-flight call of `hook` on this thread and emits it.
#[inline(always)]
fn finish<C: EbpfContext>(ctx: &C, hook: u32, complete: impl FnOnce(&mut QpEvent)) {
    let key = pending_key(hook);
    let Some(event) = PENDING.get_ptr_mut(key) else {
        count_lost(LostReason::UnmatchedReturn);
        debug!(ctx, "qpwatch: return without entry, hook {}", hook);
        return;
    };
    // SAFETY: the entry belongs to this thread and hook; nothing else writes it until removed.
    let event = unsafe { &mut *event };
    event.end_ns = now_ns();
    complete(event);
    if EVENTS.output::<QpEvent>(&*event, 0).is_err() {
        count_lost(LostReason::RingBufferFull);
    }
    let _ = PENDING.remove(key);
}

#[inline(always)]
fn begin_create(origin: QpOrigin, hook: u32, device: u64, init_attr: u64, offsets: &KernelOffsets) {
    let mut event = new_event(EventKind::QpCreate);
    event.origin = origin as u32;
    event.qp_type = read_u32(init_attr, offsets.ib_qp_init_attr_qp_type);
    read_device_name(device, offsets, &mut event.device);
    begin(hook, &event);
}

#[inline(always)]
fn finish_create(ctx: &RetProbeContext, hook: u32) {
    let Some(offsets) = offsets() else { return };
    let qp: u64 = ctx.ret();
    finish(ctx, hook, |event| {
        if qp == 0 || qp >= MAX_ERRNO.wrapping_neg() {
            event.rc = qp as i64 as i32;
        } else {
            event.qp_num = read_u32(qp, offsets.ib_qp_qp_num);
            event.qp_type = read_u32(qp, offsets.ib_qp_qp_type);
        }
    });
}

/// `struct ib_qp *ib_create_qp_user(struct ib_device *dev, struct ib_pd *pd,
///     struct ib_qp_init_attr *attr, struct ib_udata *udata, struct ib_uqp_object *uobj,
///     const char *caller)` — every uverbs QP, including librdmacm's `rdma_create_qp`.
#[kprobe]
pub fn qp_create_user(ctx: ProbeContext) -> u32 {
    let Some(offsets) = offsets() else { return 0 };
    let device: u64 = ctx.arg(0).unwrap_or(0);
    let init_attr: u64 = ctx.arg(2).unwrap_or(0);
    begin_create(
        QpOrigin::User,
        hook::CREATE_QP_USER,
        device,
        init_attr,
        &offsets,
    );
    0
}

#[kretprobe]
pub fn qp_create_user_ret(ctx: RetProbeContext) -> u32 {
    finish_create(&ctx, hook::CREATE_QP_USER);
    0
}

/// `struct ib_qp *ib_create_qp_kernel(struct ib_pd *pd, struct ib_qp_init_attr *attr,
///     const char *caller)` — in-kernel consumers; the device is `pd->device`.
#[kprobe]
pub fn qp_create_kernel(ctx: ProbeContext) -> u32 {
    let Some(offsets) = offsets() else { return 0 };
    let pd: u64 = ctx.arg(0).unwrap_or(0);
    let init_attr: u64 = ctx.arg(1).unwrap_or(0);
    let device = if pd == 0 {
        0
    } else {
        read_ptr(pd, offsets.ib_pd_device)
    };
    begin_create(
        QpOrigin::Kernel,
        hook::CREATE_QP_KERNEL,
        device,
        init_attr,
        &offsets,
    );
    0
}

#[kretprobe]
pub fn qp_create_kernel_ret(ctx: RetProbeContext) -> u32 {
    finish_create(&ctx, hook::CREATE_QP_KERNEL);
    0
}

#[inline(always)]
fn qp_identity(event: &mut QpEvent, qp: u64, offsets: &KernelOffsets) {
    event.qp_num = read_u32(qp, offsets.ib_qp_qp_num);
    event.qp_type = read_u32(qp, offsets.ib_qp_qp_type);
    read_device_name(
        read_ptr(qp, offsets.ib_qp_device),
        offsets,
        &mut event.device,
    );
}

/// `static int _ib_modify_qp(struct ib_qp *qp, struct ib_qp_attr *attr, int attr_mask,
///     struct ib_udata *udata)` — both `ib_modify_qp_with_udata` (uverbs) and
/// `ib_modify_qp` (kernel) end here, always with `qp->real_qp`.
#[kprobe]
pub fn qp_modify(ctx: ProbeContext) -> u32 {
    let Some(offsets) = offsets() else { return 0 };
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    let attr: u64 = ctx.arg(1).unwrap_or(0);
    let attr_mask: u32 = ctx.arg(2).unwrap_or(0);
    let mut event = new_event(EventKind::QpModify);
    qp_identity(&mut event, qp, &offsets);
    event.attr_mask = attr_mask;
    if attr_mask & IB_QP_STATE_MASK != 0 {
        event.new_state = read_u32(attr, offsets.ib_qp_attr_qp_state);
    }
    begin(hook::MODIFY_QP, &event);
    0
}

#[kretprobe]
pub fn qp_modify_ret(ctx: RetProbeContext) -> u32 {
    let rc: u64 = ctx.ret();
    finish(&ctx, hook::MODIFY_QP, |event| event.rc = rc as i32);
    0
}

/// `int ib_destroy_qp_user(struct ib_qp *qp, struct ib_udata *udata)` — uverbs and
/// kernel (`ib_destroy_qp()` is an inline wrapper) destroys alike. Fails with
/// -EBUSY while the QP is still in use, so the return code decides.
#[kprobe]
pub fn qp_destroy(ctx: ProbeContext) -> u32 {
    let Some(offsets) = offsets() else { return 0 };
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    let mut event = new_event(EventKind::QpDestroy);
    qp_identity(&mut event, qp, &offsets);
    begin(hook::DESTROY_QP, &event);
    0
}

#[kretprobe]
pub fn qp_destroy_ret(ctx: RetProbeContext) -> u32 {
    let rc: u64 = ctx.ret();
    finish(&ctx, hook::DESTROY_QP, |event| event.rc = rc as i32);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
