//! qpwatch's kernel programs: kprobe/kretprobe pairs on the ib_core QP
//! lifecycle (`qp`) and on the RDMA CM, plus its tracepoints (`cm`); entry
//! kprobes on what sends a QP to ERR (`qp_errors`).
//!
//! Every kprobe records the call's arguments into an in-flight table keyed by
//! (thread, hook, nesting level); the matching kretprobe adds the return value
//! and end time and emits one record into the `EVENTS` ring buffer (the QP
//! hooks keep only what their return cannot read itself, and build the
//! record in its ring slot). A thread's entry is reused
//! from call to call (written in place, disarmed after its return) rather than
//! inserted and deleted each time: a hash update and a delete are the
//! programs' most expensive steps, and the LRU table forgets dead threads.
//! Struct field offsets come from the `OFFSETS`/`CM_OFFSETS`/`RXE_OFFSETS` globals, which
//! the agent fills from the running kernel's BTF.
#![no_std]
#![no_main]

mod cm;
mod qp;
mod qp_errors;

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    Global,
};
use aya_log_ebpf::debug;
use qpwatch_common::{
    hook, KernelOffsets, LostReason, PendingKey, QpEvent, RxeOffsets, COMM_LEN, LOST_REASONS,
    MAX_NESTING,
};

#[no_mangle]
pub(crate) static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    ib_qp_device: 0,
    ib_qp_qp_num: 0,
    ib_qp_qp_type: 0,
    ib_pd_device: 0,
    ib_device_name: 0,
    ib_qp_attr_qp_state: 0,
    ib_qp_init_attr_qp_type: 0,
    ib_qp_attr_dest_qp_num: 0,
    ib_qp_attr_ah_flags: 0,
    ib_qp_attr_dgid: 0,
    peers_valid: 0,
    ib_event_element: 0,
    ib_event_event: 0,
    events_valid: 0,
    valid: 0,
});

/// Filled by the agent in the soft-RoCE instance only (zero elsewhere).
#[no_mangle]
pub(crate) static RXE_OFFSETS: Global<RxeOffsets> = Global::new(RxeOffsets {
    rxe_qp_ibqp: 0,
    rxe_cq_ibcq: 0,
    rxe_cq_is_user: 0,
    ib_cq_device: 0,
    rxe_cqe_status: 0,
    rxe_cqe_ibwc_qp: 0,
    rxe_cqe_uibwc_qp_num: 0,
    wc_flush_err: 0,
    valid: 0,
});

/// Bytes of records after which one wakes the agent up; the others are
/// written without a wakeup and the agent drains them on its own timer (one
/// wakeup per batch instead of one per event). Set before load.
#[no_mangle]
static WAKEUP_BYTES: Global<u64> = Global::new(0);

/// Bytes written since the last record that woke the agent.
#[no_mangle]
static mut BYTES_SINCE_WAKEUP: u64 = 0;

// include/uapi/linux/bpf.h: bpf_ringbuf_output() flags.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Resized by the agent (`ring_buffer_bytes`) before load.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
pub(crate) static PENDING: LruHashMap<PendingKey, Pending<qp::QpCall>> =
    LruHashMap::with_max_entries(16384, 0);

/// Per kprobe/kretprobe pair: since when its kretprobe is attached
/// ([`hook::return_slot`]); written by the agent.
#[map]
static RETURN_HOOKED_SINCE: Array<u64> = Array::with_max_entries(hook::RETURN_SLOTS, 0);

/// Since when the kretprobe of `hook` runs; 0 while it is not attached.
#[inline(always)]
fn return_hooked_since(hook: u32) -> u64 {
    RETURN_HOOKED_SINCE
        .get(hook::return_slot(hook))
        .copied()
        .unwrap_or(0)
}

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

/// `task_struct.comm`'s offset in the running kernel (vmlinux BTF), 0 where
/// the agent did not find it. Set before load; read-only, so the verifier
/// knows it as a constant.
#[no_mangle]
static TASK_COMM_OFFSET: Global<u32> = Global::new(0);

/// The current task's name, written in place (8-byte aligned, as in every
/// record): two loads from the task, where the kernel's BTF gave the field's
/// offset, instead of `bpf_get_current_comm()`'s `strscpy()`. Kernels that
/// rename with `strscpy_pad()` (`__set_task_comm()`) give the helper's 16
/// bytes; older ones (`strlcpy()`) may leave an old name's tail after the
/// NUL, which the agent zeroes when it decodes the record.
#[inline(always)]
pub(crate) fn current_comm(out: &mut [u8; COMM_LEN]) {
    let offset = TASK_COMM_OFFSET.load();
    if offset == 0 || !offset.is_multiple_of(8) {
        // SAFETY: the helper writes at most COMM_LEN bytes into `out`; it
        // zero-fills `out` on failure, and a returned array
        // (`helpers::bpf_get_current_comm`) would be copied byte by byte.
        unsafe {
            aya_ebpf::helpers::generated::bpf_get_current_comm(
                out.as_mut_ptr().cast(),
                COMM_LEN as u32,
            )
        };
        return;
    }
    // SAFETY: the current task, a BTF pointer: the verifier checks the loads
    // against `task_struct` (at the frozen, known offset) and the JIT makes
    // them fault-safe.
    let comm = unsafe {
        let task = aya_ebpf::helpers::generated::bpf_get_current_task_btf().cast::<u8>();
        task.add(offset as usize).cast::<[u64; 2]>().read_volatile()
    };
    // SAFETY: `out` is COMM_LEN (16) bytes at an 8-byte aligned offset of an
    // 8-byte aligned record (asserted below for each record type).
    unsafe { out.as_mut_ptr().cast::<[u64; 2]>().write(comm) };
}
const _: () = assert!(COMM_LEN == 16);
const _: () = assert!(core::mem::offset_of!(QpEvent, comm) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(qpwatch_common::CmEvent, comm) % 8 == 0);

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
fn pending_key(pid_tgid: u64, hook: u32, level: u32) -> PendingKey {
    PendingKey {
        pid_tgid,
        hook,
        level,
    }
}

/// An in-flight call: the record built at the kprobe, and where it stands.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Pending<T> {
    record: T,
    /// The stack pointer at entry (0 where not read): a call nested in this
    /// one runs deeper in the thread's stack, i.e. below it.
    entry_sp: u64,
    /// On level 0: how many calls of the same hook are open inside this one.
    open_inside: u32,
    _pad: u32,
}

/// A record built at a kprobe and completed at its kretprobe. Its `kind`
/// (never 0 in an event) is set to 0 once the record is emitted.
pub(crate) trait InFlight: Copy + 'static {
    /// The value a new in-flight entry is inserted with, then written in
    /// place: a static, not a constant, which would be built on the stack by
    /// a byte loop the verifier walks through on every path.
    fn idle() -> &'static Pending<Self>;
    fn start_ns(&self) -> u64;
    fn armed(&self) -> bool;
    fn disarm(&mut self);
}

macro_rules! in_flight {
    ($t:ty, $idle:ident) => {
        static $idle: Pending<$t> = Pending {
            record: <$t>::zeroed(),
            entry_sp: 0,
            open_inside: 0,
            _pad: 0,
        };

        impl InFlight for $t {
            fn idle() -> &'static Pending<Self> {
                &$idle
            }
            fn start_ns(&self) -> u64 {
                self.start_ns
            }
            fn armed(&self) -> bool {
                self.kind != 0
            }
            fn disarm(&mut self) {
                self.kind = 0;
            }
        }
    };
}
in_flight!(qp::QpCall, QP_IDLE);
in_flight!(qpwatch_common::CmEvent, CM_IDLE);

/// The stack pointer at a kprobe on a function's first instruction, 0 where
/// it is not read (architectures other than x86-64).
#[inline(always)]
fn stack_pointer(regs: *const aya_ebpf::bindings::pt_regs) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    // SAFETY: `regs` is the program's context, which the kernel hands over valid.
    return unsafe { (*regs).rsp };
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = regs;
        0
    }
}

/// At a kretprobe, the stack pointer the returning call had at entry. On
/// x86-64 the return address has been popped by then
/// (arch_rethook_trampoline_callback: `regs->sp += 2 * sizeof(long)` over
/// what the trampoline pushed), so `sp` is 8 above its value at entry.
#[inline(always)]
fn entry_sp_at_return(regs: *const aya_ebpf::bindings::pt_regs) -> u64 {
    stack_pointer(regs).saturating_sub(8)
}

/// The open (armed) in-flight entry of this thread, hook and level.
#[inline(always)]
fn open_entry<T: InFlight>(
    table: &LruHashMap<PendingKey, Pending<T>>,
    pid_tgid: u64,
    hook: u32,
    level: u32,
) -> Option<*mut Pending<T>> {
    let entry = table.get_ptr_mut(pending_key(pid_tgid, hook, level))?;
    // SAFETY: a value pointer from the map; entries of a thread are only
    // written by that thread's programs, which do not run concurrently.
    unsafe { (*entry).record.armed() }.then_some(entry)
}

/// The in-flight entry at `key`: `slot` if there is one, else a new entry.
#[inline(always)]
fn entry_or_insert<T: InFlight>(
    table: &LruHashMap<PendingKey, Pending<T>>,
    key: PendingKey,
    slot: Option<*mut Pending<T>>,
) -> Option<*mut Pending<T>> {
    if slot.is_some() {
        return slot;
    }
    if table.insert(key, T::idle(), 0).is_err() {
        count_lost(LostReason::PendingTableFull);
        return None;
    }
    table.get_ptr_mut(key)
}

/// Records a call's entry: `fill` writes its record in place, in the
/// in-flight entry, given the calling thread. A thread's outermost call of a
/// hook is level 0; a call that begins deeper in the stack than the innermost
/// open one is nested in it and goes one level up. An open call at the same
/// stack depth or shallower returned without its kretprobe running: it is
/// dropped and counted, unless it began before the kretprobe was attached.
///
/// In place, not built on the stack and copied: the verifier tracks every
/// stack slot of a record and compares them at each branch join
/// (`stacksafe()` in kernel/bpf/verifier.c), so a CM record built on the
/// stack had its entry programs walk 21,000 to 80,000 instructions for 550.
#[inline(always)]
pub(crate) fn begin<T: InFlight>(
    ctx: &ProbeContext,
    table: &LruHashMap<PendingKey, Pending<T>>,
    hook: u32,
    fill: impl FnOnce(&mut T, u64),
) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let sp = stack_pointer(ctx.regs);
    let key = pending_key(pid_tgid, hook, 0);
    // the thread's level-0 entry, looked up once: written over when level 0
    let base = table.get_ptr_mut(key);
    let level = entry_level(table, base, pid_tgid, hook, sp);
    if level >= MAX_NESTING {
        count_lost(LostReason::NestedTooDeep);
        return;
    }
    let slot = if level == 0 {
        entry_or_insert(table, key, base)
    } else {
        let key = pending_key(pid_tgid, hook, level);
        entry_or_insert(table, key, table.get_ptr_mut(key))
    };
    let Some(slot) = slot else { return };
    // SAFETY: as in open_entry.
    unsafe {
        fill(&mut (*slot).record, pid_tgid);
        (*slot).entry_sp = sp;
        (*slot).open_inside = 0;
    }
}

/// The level a call entering at stack pointer `sp` is recorded at (see
/// [`begin`]), given the thread's level-0 entry; the level-0 entry counts it,
/// even beyond [`MAX_NESTING`], so that the returns pop the right level.
#[inline(always)]
fn entry_level<T: InFlight>(
    table: &LruHashMap<PendingKey, Pending<T>>,
    base: Option<*mut Pending<T>>,
    pid_tgid: u64,
    hook: u32,
    sp: u64,
) -> u32 {
    let since = return_hooked_since(hook);
    // SAFETY (every dereference in this function): as in open_entry.
    let base = base.filter(|&base| {
        let record = unsafe { &(*base).record };
        record.armed() && since != 0 && record.start_ns() >= since
    });
    let Some(base) = base else { return 0 };
    if sp != 0 && sp >= unsafe { (*base).entry_sp } {
        count_lost(LostReason::ReturnMissed);
        return 0;
    }
    // the innermost open call returned unseen if it is not below us either
    let open = unsafe { (*base).open_inside };
    if sp != 0 && open > 0 && open < MAX_NESTING {
        if let Some(top) = open_entry(table, pid_tgid, hook, open) {
            if sp >= unsafe { (*top).entry_sp } {
                count_lost(LostReason::ReturnMissed);
                unsafe { (*top).record.disarm() };
                unsafe { (*base).open_inside = open - 1 };
            }
        }
    }
    let level = unsafe { (*base).open_inside } + 1;
    unsafe { (*base).open_inside = level };
    level
}

/// Hands the innermost open call of `hook` on this thread to `complete`,
/// then closes it.
#[inline(always)]
pub(crate) fn finish<T: InFlight>(
    ctx: &RetProbeContext,
    table: &LruHashMap<PendingKey, Pending<T>>,
    hook: u32,
    complete: impl FnOnce(&mut T),
) {
    let Some(call) = returning_call(ctx, table, hook) else {
        return;
    };
    // SAFETY: as in open_entry.
    let record = unsafe { &mut (*call).record };
    complete(record);
    record.disarm();
}

/// The open call a return belongs to, its level popped. Where the stack
/// pointer is read, the open call must be the returning one: one that
/// encloses it means the returning call's entry program never ran; one
/// deeper than it returned without its kretprobe running.
#[inline(always)]
fn returning_call<T: InFlight>(
    ctx: &RetProbeContext,
    table: &LruHashMap<PendingKey, Pending<T>>,
    hook: u32,
) -> Option<*mut Pending<T>> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(base) = open_entry(table, pid_tgid, hook, 0) else {
        // no entry, or a disarmed one: the kprobe of this call did not run
        count_lost(LostReason::UnmatchedReturn);
        debug!(ctx, "qpwatch: return without entry, hook {}", hook);
        return None;
    };
    // SAFETY (every dereference below): as in open_entry.
    if unsafe { (*base).record.start_ns() } < return_hooked_since(hook) {
        // entered while the kretprobe was being attached: this call, or one
        // whose return never runs; not counted, like a call before the agent
        unsafe {
            (*base).record.disarm();
            (*base).open_inside = 0;
        }
        return None;
    }
    let returning_sp = entry_sp_at_return(ctx.regs);
    let level = unsafe { (*base).open_inside };
    if level >= MAX_NESTING {
        unsafe { (*base).open_inside = level - 1 };
        return None; // counted at its entry
    }
    let call = if level == 0 {
        base
    } else {
        let Some(call) = open_entry(table, pid_tgid, hook, level) else {
            unsafe { (*base).open_inside = level - 1 };
            count_lost(LostReason::UnmatchedReturn);
            return None;
        };
        call
    };
    let call_sp = unsafe { (*call).entry_sp };
    if returning_sp == 0 || call_sp == 0 || call_sp == returning_sp {
        if level > 0 {
            unsafe { (*base).open_inside = level - 1 };
        }
        return Some(call);
    }
    if call_sp < returning_sp {
        // deeper than the returning call: it returned without its kretprobe
        count_lost(LostReason::ReturnMissed);
        unsafe { (*call).record.disarm() };
        if level > 0 {
            unsafe { (*base).open_inside = level - 1 };
        }
        if level == 1 && unsafe { (*base).entry_sp } == returning_sp {
            return Some(base);
        }
    }
    // the open call encloses the returning one, whose entry was not
    // recorded (or the returning call is further down)
    count_lost(LostReason::UnmatchedReturn);
    None
}

/// The flags that submit a record of `size` bytes: a wakeup once
/// `WAKEUP_BYTES` have been written since the last one, none before. A
/// count in memory, not `bpf_ringbuf_query()`: a helper call per record
/// costs more, and a reader that falls behind is not then woken by every
/// record. Programs on other CPUs may lose each other's additions, which
/// only delays a wakeup; the agent's timer drains the ring regardless.
#[inline(always)]
fn submit_flags(size: usize) -> u64 {
    let counter = &raw mut BYTES_SINCE_WAKEUP;
    // SAFETY: a plain u64 in the program's .bss map, always mapped.
    let written = unsafe { counter.read_volatile() } + size as u64;
    let (written, flags) = if written >= WAKEUP_BYTES.load() {
        (0, BPF_RB_FORCE_WAKEUP)
    } else {
        (written, BPF_RB_NO_WAKEUP)
    };
    // SAFETY: as above.
    unsafe { counter.write_volatile(written) };
    flags
}

/// Writes a record built on the stack into the ring.
#[inline(always)]
pub(crate) fn emit<T: 'static>(event: &T) {
    if EVENTS
        .output::<T>(event, submit_flags(core::mem::size_of::<T>()))
        .is_err()
    {
        count_lost(LostReason::RingBufferFull);
    }
}

/// Builds a QP record in its own ring slot, from zero: no copy of it is
/// made on the stack or through `bpf_ringbuf_output()`.
#[inline(always)]
pub(crate) fn emit_in_place(fill: impl FnOnce(&mut QpEvent)) {
    let Some(mut slot) = EVENTS.reserve::<QpEvent>(0) else {
        count_lost(LostReason::RingBufferFull);
        return;
    };
    let flags = submit_flags(core::mem::size_of::<QpEvent>());
    let record: *mut QpEvent = slot.write(QpEvent::zeroed());
    // SAFETY: the slot, initialized by `write`, is ours until submitted.
    fill(unsafe { &mut *record });
    slot.submit(flags);
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
