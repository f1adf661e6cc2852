//! qpwatch's kernel programs: kprobe/kretprobe pairs on the ib_core QP
//! lifecycle (`qp`) and on the RDMA CM, plus its tracepoints (`cm`).
//!
//! Every kprobe records the call's arguments into an in-flight table keyed by
//! (thread, hook); the matching kretprobe adds the return value and end time and
//! emits one record into the `EVENTS` ring buffer. Struct field offsets come
//! from the `OFFSETS`/`CM_OFFSETS` globals, which the agent fills from the
//! running kernel's BTF.
#![no_std]
#![no_main]

mod cm;
mod qp;

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::map,
    maps::{LruHashMap, PerCpuArray, RingBuf},
    EbpfContext, Global,
};
use aya_log_ebpf::debug;
use qpwatch_common::{KernelOffsets, LostReason, PendingKey, QpEvent, LOST_REASONS};

#[no_mangle]
pub(crate) static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    ib_qp_device: 0,
    ib_qp_qp_num: 0,
    ib_qp_qp_type: 0,
    ib_pd_device: 0,
    ib_device_name: 0,
    ib_qp_attr_qp_state: 0,
    ib_qp_init_attr_qp_type: 0,
    valid: 0,
});

/// Bytes of unread records from which a record wakes the agent up; below it,
/// records are written without a wakeup and the agent drains them on its own
/// timer (one wakeup per batch instead of one per event). Set before load.
#[no_mangle]
static WAKEUP_BYTES: Global<u64> = Global::new(0);

// include/uapi/linux/bpf.h: bpf_ringbuf_output() flags, bpf_ringbuf_query() flag.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Resized by the agent (`ring_buffer_bytes`) before load.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
pub(crate) static PENDING: LruHashMap<PendingKey, QpEvent> = LruHashMap::with_max_entries(16384, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_REASONS as u32, 0);

/// `IS_ERR_VALUE()` in include/linux/err.h: the top 4095 addresses are errnos.
pub(crate) const MAX_ERRNO: u64 = 4095;

#[inline(always)]
pub(crate) fn offsets() -> Option<KernelOffsets> {
    let offsets = OFFSETS.load();
    (offsets.valid != 0).then_some(offsets)
}

#[inline(always)]
pub(crate) fn read_u32(base: u64, offset: u32) -> u32 {
    // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const u32) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_ptr(base: u64, offset: u32) -> u64 {
    // SAFETY: as in read_u32.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const u64) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_u8(base: u64, offset: u32) -> u8 {
    // SAFETY: as in read_u32.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const u8) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_device_name(device: u64, offsets: &KernelOffsets, out: &mut [u8]) {
    if device == 0 {
        return;
    }
    let name = (device + offsets.ib_device_name as u64) as *const u8;
    // SAFETY: as in read_u32; the helper NUL-terminates within `out`.
    let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, out) };
}

#[inline(always)]
pub(crate) fn count_lost(reason: LostReason) {
    if let Some(counter) = LOST.get_ptr_mut(reason as u32) {
        // SAFETY: per-CPU slot; a BPF program is not preempted by itself on one CPU.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions; it is `unsafe` only as an FFI helper.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub(crate) fn pending_key(hook: u32) -> PendingKey {
    PendingKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        hook,
        _reserved: 0,
    }
}

/// A record built at a kprobe and completed at its kretprobe.
pub(crate) trait InFlight: 'static {
    fn set_end_ns(&mut self, ns: u64);
}

impl InFlight for QpEvent {
    fn set_end_ns(&mut self, ns: u64) {
        self.end_ns = ns;
    }
}

impl InFlight for qpwatch_common::CmEvent {
    fn set_end_ns(&mut self, ns: u64) {
        self.end_ns = ns;
    }
}

#[inline(always)]
pub(crate) fn begin<T: InFlight>(table: &LruHashMap<PendingKey, T>, hook: u32, event: &T) {
    if table.insert(pending_key(hook), event, 0).is_err() {
        count_lost(LostReason::PendingTableFull);
    }
}

/// Completes the in-flight call of `hook` on this thread and emits it unless
/// `complete` says to drop it.
#[inline(always)]
pub(crate) fn finish<T: InFlight, C: EbpfContext>(
    ctx: &C,
    table: &LruHashMap<PendingKey, T>,
    hook: u32,
    complete: impl FnOnce(&mut T) -> bool,
) {
    let key = pending_key(hook);
    let Some(event) = table.get_ptr_mut(key) else {
        count_lost(LostReason::UnmatchedReturn);
        debug!(ctx, "qpwatch: return without entry, hook {}", hook);
        return;
    };
    // SAFETY: the entry belongs to this thread and hook; nothing else writes it until removed.
    let event = unsafe { &mut *event };
    event.set_end_ns(now_ns());
    if complete(event) {
        emit(&*event);
    }
    let _ = table.remove(key);
}

#[inline(always)]
pub(crate) fn emit<T>(event: &T) {
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES.load() {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if EVENTS.output::<T>(event, flags).is_err() {
        count_lost(LostReason::RingBufferFull);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
