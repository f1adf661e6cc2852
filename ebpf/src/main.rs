//! qpwatch's kernel programs: kprobe/kretprobe pairs on the ib_core QP
//! lifecycle (`qp`) and on the RDMA CM, plus its tracepoints (`cm`).
//!
//! Every kprobe records the call's arguments into an in-flight table keyed by
//! (thread, hook); the matching kretprobe adds the return value and end time and
//! emits one record into the `EVENTS` ring buffer. A thread's entry is reused
//! from call to call (written in place, disarmed after its return) rather than
//! inserted and deleted each time: a hash update and a delete are the
//! programs' most expensive steps, and the LRU table forgets dead threads.
//! Struct field offsets come from the `OFFSETS`/`CM_OFFSETS` globals, which
//! the agent fills from the running kernel's BTF.
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

/// Lost events per [`LostReason`], all in one per-CPU entry: the agent reads
/// every counter with one syscall at each scrape.
#[map]
static LOST: PerCpuArray<[u64; LOST_REASONS]> = PerCpuArray::with_max_entries(1, 0);

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
    if let Some(counters) = LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; a BPF program is not preempted by itself on one CPU.
        unsafe { (*counters)[reason as usize] += 1 };
    }
}

#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions; it is `unsafe` only as an FFI helper.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn pending_key(pid_tgid: u64, hook: u32) -> PendingKey {
    PendingKey {
        pid_tgid,
        hook,
        _reserved: 0,
    }
}

/// A record built at a kprobe and completed at its kretprobe. Its `kind`
/// (never 0 in an event) is set to 0 once the record is emitted.
pub(crate) trait InFlight: Copy + 'static {
    /// The calling thread, as recorded at entry.
    fn pid_tgid(&self) -> u64;
    fn set_end_ns(&mut self, ns: u64);
    fn armed(&self) -> bool;
    fn disarm(&mut self);
}

impl InFlight for QpEvent {
    fn pid_tgid(&self) -> u64 {
        self.pid_tgid
    }
    fn set_end_ns(&mut self, ns: u64) {
        self.end_ns = ns;
    }
    fn armed(&self) -> bool {
        self.kind != 0
    }
    fn disarm(&mut self) {
        self.kind = 0;
    }
}

impl InFlight for qpwatch_common::CmEvent {
    fn pid_tgid(&self) -> u64 {
        self.pid_tgid
    }
    fn set_end_ns(&mut self, ns: u64) {
        self.end_ns = ns;
    }
    fn armed(&self) -> bool {
        self.kind != 0
    }
    fn disarm(&mut self) {
        self.kind = 0;
    }
}

/// Records a call's entry: over this thread's entry for the hook if it has
/// one (a lookup, no allocation), else as a new entry.
#[inline(always)]
pub(crate) fn begin<T: InFlight>(table: &LruHashMap<PendingKey, T>, hook: u32, event: &T) {
    let key = pending_key(event.pid_tgid(), hook);
    if let Some(slot) = table.get_ptr_mut(key) {
        // SAFETY: the entry of this thread and hook; only this thread writes it.
        unsafe { *slot = *event };
        return;
    }
    if table.insert(key, event, 0).is_err() {
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
    // SAFETY: the entry belongs to this thread and hook; only this thread writes it.
    let event = table
        .get_ptr_mut(pending_key(bpf_get_current_pid_tgid(), hook))
        .map(|event| unsafe { &mut *event })
        .filter(|event| event.armed());
    let Some(event) = event else {
        // no entry, or a disarmed one: the kprobe of this call did not run
        count_lost(LostReason::UnmatchedReturn);
        debug!(ctx, "qpwatch: return without entry, hook {}", hook);
        return;
    };
    event.set_end_ns(now_ns());
    if complete(event) {
        emit(&*event);
    }
    event.disarm();
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
