//! QP churn on plain libibverbs (no rdma_cm): create RC QPs in pairs, move
//! both of a pair RESET → INIT → RTR → RTS connected to each other over the
//! device's own GID (loopback), destroy them, at a configurable rate and
//! concurrency; optionally hold QPs open. Every verbs call is timed and
//! counted, so the kernel-side view (qpwatch, bpftrace) can be compared with
//! what was really done.
//!
//! One QP lifecycle is 5 kernel calls: `ib_create_qp_user`, three
//! `_ib_modify_qp` (INIT, RTR, RTS) and `ib_destroy_qp_user`.

use std::ffi::CStr;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use rdma_sys::*;
use serde::Serialize;

use crate::error::{Errno, Error};
use crate::stats::LatencySummary;
use crate::time::{elapsed, monotonic_ns};

/// An open device context (`ibv_open_device`).
pub(crate) struct Device {
    raw: NonNull<ibv_context>,
    name: String,
}

/// `struct ibv_pd` on a [`Device`].
struct Pd {
    raw: NonNull<ibv_pd>,
    _device: Arc<Device>,
}

/// A `struct ibv_cq` without completion channel (the churn posts no work).
struct Cq {
    raw: NonNull<ibv_cq>,
    _device: Arc<Device>,
}

/// An RC QP whose state changes the churn drives.
struct Qp {
    raw: NonNull<ibv_qp>,
    _pd: Arc<Pd>,
    _cq: Arc<Cq>,
}

// SAFETY: the wrapped objects are only used through libibverbs calls, which
// are thread-safe (ibv_create_qp(3) and friends); each wrapper owns its object.
unsafe impl Send for Device {}
// SAFETY: as above; `&self` only reads immutable fields or calls thread-safe verbs.
unsafe impl Sync for Device {}
// SAFETY: as for Device.
unsafe impl Send for Pd {}
// SAFETY: as for Device.
unsafe impl Sync for Pd {}
// SAFETY: as for Device.
unsafe impl Send for Cq {}
// SAFETY: as for Device.
unsafe impl Sync for Cq {}
// SAFETY: as for Device; a Qp is used by one thread at a time.
unsafe impl Send for Qp {}

impl Device {
    /// Opens `name`, or the first device when `None`.
    pub(crate) fn open(name: Option<&str>) -> Result<Arc<Device>, Error> {
        let mut n: i32 = 0;
        // SAFETY: valid out-pointer; returns NULL with errno set on failure.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(Error::verbs("ibv_get_device_list"));
        }
        let mut found: Option<(*mut ibv_device, String)> = None;
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a listed device has a NUL-terminated name.
            let dev_name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if found.is_none() && name.is_none_or(|want| want == dev_name) {
                found = Some((dev, dev_name.clone()));
            }
            names.push(dev_name);
        }
        let result = match found {
            None => Err(Error::InvalidConfig(format!(
                "no RDMA device {} (devices: {})",
                name.unwrap_or("at all"),
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ))),
            Some((dev, dev_name)) => {
                // SAFETY: `dev` is from the live list; the context outlives the list.
                let raw = unsafe { ibv_open_device(dev) };
                NonNull::new(raw)
                    .map(|raw| {
                        Arc::new(Device {
                            raw,
                            name: dev_name,
                        })
                    })
                    .ok_or_else(|| Error::verbs("ibv_open_device"))
            }
        };
        // SAFETY: the list came from ibv_get_device_list and is freed once;
        // an opened context stays valid after it.
        unsafe { ibv_free_device_list(list) };
        result
    }

    fn port_attr(&self, port: u8) -> Result<ibv_port_attr, Error> {
        // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
        let mut attr: ibv_port_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: live context; `attr` is a valid out-pointer of the right size.
        let rc = unsafe { ___ibv_query_port(self.raw.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(Error::verbs_rc("ibv_query_port", rc));
        }
        Ok(attr)
    }

    fn gid(&self, port: u8, index: u8) -> Result<[u8; 16], Error> {
        // SAFETY: ibv_gid is plain old data.
        let mut gid: ibv_gid = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: live context; valid out-pointer.
        let rc = unsafe { ibv_query_gid(self.raw.as_ptr(), port, i32::from(index), &mut gid) };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid `raw`.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every object on this context holds an Arc of it, so none is left.
        unsafe { ibv_close_device(self.raw.as_ptr()) };
    }
}

impl Pd {
    fn alloc(device: &Arc<Device>) -> Result<Arc<Pd>, Error> {
        // SAFETY: live context.
        let raw = unsafe { ibv_alloc_pd(device.raw.as_ptr()) };
        Ok(Arc::new(Pd {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_alloc_pd"))?,
            _device: device.clone(),
        }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: QPs on this PD hold an Arc of it, so none is left.
        unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

impl Cq {
    fn create(device: &Arc<Device>, cqe: i32) -> Result<Arc<Cq>, Error> {
        // SAFETY: live context; no channel, no context pointer.
        let raw = unsafe {
            ibv_create_cq(
                device.raw.as_ptr(),
                cqe,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        Ok(Arc::new(Cq {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_cq"))?,
            _device: device.clone(),
        }))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: QPs on this CQ hold an Arc of it, so none is left; no events.
        unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

impl Qp {
    fn create(pd: &Arc<Pd>, cq: &Arc<Cq>) -> Result<Qp, Error> {
        // SAFETY: ibv_qp_init_attr is plain old data; all-zero is valid.
        let mut attr: ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.send_cq = cq.raw.as_ptr();
        attr.recv_cq = cq.raw.as_ptr();
        attr.cap.max_send_wr = 1;
        attr.cap.max_recv_wr = 1;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        // SAFETY: live PD and CQ on the same context; `attr` lives for the call.
        let raw = unsafe { ibv_create_qp(pd.raw.as_ptr(), &mut attr) };
        Ok(Qp {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_qp"))?,
            _pd: pd.clone(),
            _cq: cq.clone(),
        })
    }

    fn qp_num(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// ibv_modify_qp; 0 or the errno.
    fn modify(&self, attr: &mut ibv_qp_attr, mask: i32) -> i32 {
        // SAFETY: live QP; `attr` lives for the call.
        unsafe { ibv_modify_qp(self.raw.as_ptr(), attr, mask) }
    }

    /// ibv_destroy_qp; 0 or the errno. A QP that fails to go is left to the
    /// kernel's cleanup at process exit.
    fn destroy(self) -> i32 {
        let this = ManuallyDrop::new(self);
        // SAFETY: live QP, destroyed once; Drop is skipped.
        let rc = unsafe { ibv_destroy_qp(this.raw.as_ptr()) };
        // SAFETY: each Arc field is read out once and never used again.
        unsafe {
            drop(ptr::read(&this._cq));
            drop(ptr::read(&this._pd));
        }
        rc
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: live QP, destroyed once.
        unsafe { ibv_destroy_qp(self.raw.as_ptr()) };
    }
}

/// Where a pair's QPs address each other.
#[derive(Debug, Clone, Copy)]
struct Path {
    port: u8,
    mtu: u32,
    /// RoCE / iWARP: a GRH with the device's own GID.
    global: Option<(u8, [u8; 16])>,
    lid: u16,
}

/// `/sys/class/infiniband/DEV/ports/PORT/gid_attrs/types/INDEX` ("RoCE v2", "IB/RoCE v1").
fn gid_type(device: &str, port: u8, index: u8) -> Option<String> {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}"
    ))
    .ok()
    .map(|s| s.trim().to_owned())
}

/// The GID the pairs use: `wanted`, or the first RoCE v2 IPv4-mapped GID, or
/// the first non-zero one.
fn pick_gid(
    device: &Device,
    port: u8,
    table_len: i32,
    wanted: Option<u8>,
) -> Result<(u8, [u8; 16]), Error> {
    if let Some(index) = wanted {
        return Ok((index, device.gid(port, index)?));
    }
    let mut first = None;
    for index in 0..table_len.clamp(0, 256) as u16 {
        let index = index as u8;
        let Ok(gid) = device.gid(port, index) else {
            continue;
        };
        if gid == [0; 16] {
            continue;
        }
        let v4_mapped = gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
        let v2 = gid_type(&device.name, port, index).as_deref() == Some("RoCE v2");
        if v4_mapped && v2 {
            return Ok((index, gid));
        }
        first.get_or_insert((index, gid));
    }
    first.ok_or_else(|| {
        Error::InvalidConfig(format!("{}: no usable GID on port {port}", device.name))
    })
}

/// Which churn operation a latency belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create = 0,
    ModifyInit = 1,
    ModifyRtr = 2,
    ModifyRts = 3,
    Destroy = 4,
}

const OPS: usize = 5;

/// Counters shared by the workers and read live (status file).
#[derive(Debug, Default)]
struct Counters {
    create_calls: AtomicU64,
    modify_calls: AtomicU64,
    destroy_calls: AtomicU64,
    created: AtomicU64,
    destroyed: AtomicU64,
    create_failed: AtomicU64,
    modify_failed: AtomicU64,
    destroy_failed: AtomicU64,
    /// Pairs fully set up to RTS and torn down (churn only).
    lifecycles: AtomicU64,
    held: AtomicU64,
}

/// What the churn did: calls made, QPs created and destroyed, failures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ChurnCounts {
    /// ibv_create_qp calls (each is one `ib_create_qp_user`).
    pub create_calls: u64,
    /// ibv_modify_qp calls (each is one `_ib_modify_qp`).
    pub modify_calls: u64,
    /// ibv_destroy_qp calls (each is one `ib_destroy_qp_user`).
    pub destroy_calls: u64,
    /// create + modify + destroy calls: the kernel events they cause.
    pub kernel_calls: u64,
    pub qps_created: u64,
    pub qps_destroyed: u64,
    pub create_failed: u64,
    pub modify_failed: u64,
    pub destroy_failed: u64,
    /// QP lifecycles of the churn (create → RTS → destroy done), 2 per pair.
    pub lifecycles: u64,
    /// QPs held open (in RTS) now.
    pub qps_held: u64,
}

impl ChurnCounts {
    pub fn failures(&self) -> u64 {
        self.create_failed + self.modify_failed + self.destroy_failed
    }
}

impl Counters {
    fn snapshot(&self) -> ChurnCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Acquire);
        let (c, m, d) = (
            get(&self.create_calls),
            get(&self.modify_calls),
            get(&self.destroy_calls),
        );
        ChurnCounts {
            create_calls: c,
            modify_calls: m,
            destroy_calls: d,
            kernel_calls: c + m + d,
            qps_created: get(&self.created),
            qps_destroyed: get(&self.destroyed),
            create_failed: get(&self.create_failed),
            modify_failed: get(&self.modify_failed),
            destroy_failed: get(&self.destroy_failed),
            lifecycles: get(&self.lifecycles),
            qps_held: get(&self.held),
        }
    }
}

/// Latency summaries per operation (nearest-rank p50/p99).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChurnLatencies {
    pub create: Option<LatencySummary>,
    /// RESET → INIT
    pub modify_init: Option<LatencySummary>,
    /// INIT → RTR
    pub modify_rtr: Option<LatencySummary>,
    /// RTR → RTS
    pub modify_rts: Option<LatencySummary>,
    pub destroy: Option<LatencySummary>,
}

/// How the churn runs.
#[derive(Debug, Clone)]
pub struct ChurnConfig {
    /// RDMA device; the first one when `None`.
    pub device: Option<String>,
    pub port: u8,
    /// GID table index; picked automatically when `None`.
    pub gid_index: Option<u8>,
    /// QP lifecycles to churn (rounded up to pairs); `None`: until stopped.
    pub lifecycles: Option<u64>,
    /// Worker threads, each with its own CQ (one PD for all).
    pub threads: usize,
    /// Target QP lifecycles per second over all threads; `None`: flat out.
    pub rate: Option<f64>,
    /// QPs (rounded up to pairs) created and moved to RTS before the churn
    /// starts, and kept open until the end.
    pub hold: u64,
    /// Thread name prefix (the kernel's `comm` of every call): `PREFIX-N`.
    pub thread_name: String,
}

impl ChurnConfig {
    pub fn validate(&self) -> Result<(), Error> {
        if self.threads == 0 || self.threads > 256 {
            return Err(Error::InvalidConfig("threads must be 1..=256".into()));
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(Error::InvalidConfig("rate must be > 0".into()));
            }
        }
        if self.thread_name.is_empty() || self.thread_name.len() > 11 {
            return Err(Error::InvalidConfig(
                "thread name prefix must be 1..=11 bytes (comm is 15 with -N)".into(),
            ));
        }
        Ok(())
    }
}

/// Control from outside the workers (signals, the CLI's timers).
#[derive(Debug, Default)]
pub struct ChurnControl {
    /// Finish the pairs in flight and start no more.
    pub stop: AtomicBool,
    /// Start no new pairs until cleared.
    pub pause: AtomicBool,
    parked: AtomicUsize,
    churn_done: AtomicUsize,
}

impl ChurnControl {
    /// Workers idle because of `pause` (or done).
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::Acquire)
    }

    /// Workers whose churn loop has ended.
    pub fn churn_done(&self) -> usize {
        self.churn_done.load(Ordering::Acquire)
    }
}

/// Final report of a churn run.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnReport {
    pub device: String,
    pub port: u8,
    pub gid_index: Option<u8>,
    pub threads: usize,
    pub rate: Option<f64>,
    pub lifecycles_requested: Option<u64>,
    pub hold_requested: u64,
    /// From the first churn pair to the end of the last.
    pub churn_elapsed_ns: u64,
    /// Churn QP lifecycles per second achieved.
    pub lifecycles_per_s: f64,
    pub counts: ChurnCounts,
    pub latency: ChurnLatencies,
    /// The first few errors, as text.
    pub errors: Vec<String>,
}

/// A running churn: workers started, held QPs being set up.
pub struct Churn {
    control: Arc<ChurnControl>,
    counters: Arc<Counters>,
    workers: Vec<std::thread::JoinHandle<Worker>>,
    held_barrier: Arc<Barrier>,
    config: ChurnConfig,
    device: String,
    gid_index: Option<u8>,
}

/// Per-thread results.
#[derive(Default)]
struct Worker {
    samples: [Vec<Duration>; OPS],
    errors: Vec<String>,
    first_ns: Option<u64>,
    last_ns: u64,
    held: Vec<Qp>,
}

const MAX_ERRORS: usize = 8;

struct Shared {
    counters: Arc<Counters>,
    control: Arc<ChurnControl>,
    path: Path,
    /// Next churn pair to claim; pair k is due at start + k × interval.
    next_pair: AtomicU64,
    pairs: Option<u64>,
    interval_ns: Option<u64>,
    next_hold: AtomicU64,
    hold_pairs: u64,
    start_ns: AtomicU64,
}

impl Churn {
    /// Opens the device and starts the workers; held QPs are set up at once
    /// ([`Churn::wait_held`]), then the churn begins.
    pub fn start(config: ChurnConfig) -> Result<Churn, Error> {
        config.validate()?;
        let device = Device::open(config.device.as_deref())?;
        let port_attr = device.port_attr(config.port)?;
        // IBV_LINK_LAYER_INFINIBAND = 1; Ethernet (RoCE) = 2; 0 = unspecified (IB).
        let global = if u32::from(port_attr.link_layer) == 2 {
            Some(pick_gid(
                &device,
                config.port,
                port_attr.gid_tbl_len,
                config.gid_index,
            )?)
        } else {
            None
        };
        let path = Path {
            port: config.port,
            mtu: port_attr.active_mtu,
            global,
            lid: port_attr.lid,
        };
        log::info!(
            "churn on {} port {} (mtu enum {}, {})",
            device.name,
            config.port,
            path.mtu,
            match global {
                Some((i, gid)) => format!("GID index {i} {}", std::net::Ipv6Addr::from(gid)),
                None => format!("LID {}", path.lid),
            }
        );
        let pd = Pd::alloc(&device)?;
        let counters = Arc::new(Counters::default());
        let control = Arc::new(ChurnControl::default());
        let shared = Arc::new(Shared {
            counters: counters.clone(),
            control: control.clone(),
            path,
            next_pair: AtomicU64::new(0),
            pairs: config.lifecycles.map(|n| n.div_ceil(2)),
            interval_ns: config.rate.map(|r| (2e9 / r) as u64),
            next_hold: AtomicU64::new(0),
            hold_pairs: config.hold.div_ceil(2),
            start_ns: AtomicU64::new(0),
        });
        let held_barrier = Arc::new(Barrier::new(config.threads + 1));
        let mut workers = Vec::new();
        for i in 0..config.threads {
            let cq = Cq::create(&device, 1)?;
            let (pd, shared, barrier) = (pd.clone(), shared.clone(), held_barrier.clone());
            let handle = std::thread::Builder::new()
                .name(format!("{}-{i}", config.thread_name))
                .spawn(move || run_worker(&shared, &pd, &cq, &barrier))
                .map_err(|e| Error::InvalidConfig(format!("cannot start a worker: {e}")))?;
            workers.push(handle);
        }
        Ok(Churn {
            control,
            counters,
            workers,
            held_barrier,
            device: device.name.clone(),
            gid_index: global.map(|(i, _)| i),
            config,
        })
    }

    pub fn control(&self) -> &Arc<ChurnControl> {
        &self.control
    }

    pub fn counts(&self) -> ChurnCounts {
        self.counters.snapshot()
    }

    /// Blocks until every worker has set up its held QPs (the churn then starts).
    pub fn wait_held(&self) {
        self.held_barrier.wait();
    }

    /// Waits for the workers' churn to end (after [`Churn::wait_held`]; it
    /// ends when the lifecycles are done or on `stop`). Held QPs stay open.
    pub fn finish(self) -> Finished {
        let mut merged = Worker::default();
        for handle in self.workers {
            let worker = handle.join().unwrap_or_else(|_| Worker {
                errors: vec!["a worker panicked".into()],
                ..Worker::default()
            });
            for (all, mine) in merged.samples.iter_mut().zip(worker.samples) {
                all.extend(mine);
            }
            for e in worker.errors {
                merged.error(e);
            }
            merged.first_ns = match (merged.first_ns, worker.first_ns) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            merged.last_ns = merged.last_ns.max(worker.last_ns);
            merged.held.extend(worker.held);
        }
        Finished {
            merged,
            counters: self.counters,
            config: self.config,
            device: self.device,
            gid_index: self.gid_index,
        }
    }
}

/// A churn whose workers are done; its held QPs may still be open.
pub struct Finished {
    merged: Worker,
    counters: Arc<Counters>,
    config: ChurnConfig,
    device: String,
    gid_index: Option<u8>,
}

impl Finished {
    pub fn counts(&self) -> ChurnCounts {
        self.counters.snapshot()
    }

    /// Destroys the held QPs (timed, counted), on this thread.
    pub fn release(&mut self) {
        for qp in std::mem::take(&mut self.merged.held) {
            self.counters.held.fetch_sub(1, Ordering::AcqRel);
            self.merged.destroy(&self.counters, qp);
        }
    }

    /// Leaves the held QPs to the kernel: for a process that exits with QPs open.
    pub fn leak(&mut self) {
        for qp in std::mem::take(&mut self.merged.held) {
            std::mem::forget(qp);
        }
    }

    pub fn report(&self) -> ChurnReport {
        let merged = &self.merged;
        let counts = self.counters.snapshot();
        let elapsed_ns = merged
            .first_ns
            .map_or(0, |first| merged.last_ns.saturating_sub(first));
        let summary = |op: Op| LatencySummary::from_samples(&merged.samples[op as usize]);
        ChurnReport {
            device: self.device.clone(),
            port: self.config.port,
            gid_index: self.gid_index,
            threads: self.config.threads,
            rate: self.config.rate,
            lifecycles_requested: self.config.lifecycles,
            hold_requested: self.config.hold,
            churn_elapsed_ns: elapsed_ns,
            lifecycles_per_s: if elapsed_ns > 0 {
                counts.lifecycles as f64 * 1e9 / elapsed_ns as f64
            } else {
                0.0
            },
            counts,
            latency: ChurnLatencies {
                create: summary(Op::Create),
                modify_init: summary(Op::ModifyInit),
                modify_rtr: summary(Op::ModifyRtr),
                modify_rts: summary(Op::ModifyRts),
                destroy: summary(Op::Destroy),
            },
            errors: merged.errors.clone(),
        }
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.release();
    }
}

impl Worker {
    fn error(&mut self, e: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(e);
        }
    }

    /// One timed ibv_create_qp.
    fn create(&mut self, c: &Counters, pd: &Arc<Pd>, cq: &Arc<Cq>) -> Option<Qp> {
        c.create_calls.fetch_add(1, Ordering::AcqRel);
        let t0 = monotonic_ns();
        let qp = Qp::create(pd, cq);
        let t1 = monotonic_ns();
        match qp {
            Ok(qp) => {
                self.samples[Op::Create as usize].push(elapsed(t0, t1));
                c.created.fetch_add(1, Ordering::AcqRel);
                Some(qp)
            }
            Err(e) => {
                c.create_failed.fetch_add(1, Ordering::AcqRel);
                self.error(e.to_string());
                None
            }
        }
    }

    /// One timed ibv_modify_qp to the state of `op`.
    fn modify(&mut self, shared: &Shared, qp: &Qp, op: Op, remote_qpn: u32) -> bool {
        let (mut attr, mask) = modify_attr(op, &shared.path, remote_qpn);
        let c = &shared.counters;
        c.modify_calls.fetch_add(1, Ordering::AcqRel);
        let t0 = monotonic_ns();
        let rc = qp.modify(&mut attr, mask);
        let t1 = monotonic_ns();
        if rc == 0 {
            self.samples[op as usize].push(elapsed(t0, t1));
            true
        } else {
            c.modify_failed.fetch_add(1, Ordering::AcqRel);
            self.error(format!(
                "ibv_modify_qp({op:?}) of QP {:#x}: {}",
                qp.qp_num(),
                Errno(rc.abs())
            ));
            false
        }
    }

    /// One timed ibv_destroy_qp.
    fn destroy(&mut self, c: &Counters, qp: Qp) -> bool {
        let qpn = qp.qp_num();
        c.destroy_calls.fetch_add(1, Ordering::AcqRel);
        let t0 = monotonic_ns();
        let rc = qp.destroy();
        let t1 = monotonic_ns();
        if rc == 0 {
            self.samples[Op::Destroy as usize].push(elapsed(t0, t1));
            c.destroyed.fetch_add(1, Ordering::AcqRel);
            true
        } else {
            c.destroy_failed.fetch_add(1, Ordering::AcqRel);
            self.error(format!(
                "ibv_destroy_qp of QP {qpn:#x}: {}",
                Errno(rc.abs())
            ));
            false
        }
    }

    /// Creates a pair and moves both QPs to RTS, connected to each other.
    /// Returns what was created, whatever state it reached, and whether both
    /// reached RTS.
    fn connected_pair(&mut self, shared: &Shared, pd: &Arc<Pd>, cq: &Arc<Cq>) -> (Vec<Qp>, bool) {
        let mut qps = Vec::with_capacity(2);
        qps.extend(self.create(&shared.counters, pd, cq));
        qps.extend(self.create(&shared.counters, pd, cq));
        if qps.len() < 2 {
            return (qps, false);
        }
        let (a, b) = (qps[0].qp_num(), qps[1].qp_num());
        for op in [Op::ModifyInit, Op::ModifyRtr, Op::ModifyRts] {
            if !self.modify(shared, &qps[0], op, b) || !self.modify(shared, &qps[1], op, a) {
                return (qps, false);
            }
        }
        (qps, true)
    }
}

fn run_worker(shared: &Shared, pd: &Arc<Pd>, cq: &Arc<Cq>, barrier: &Barrier) -> Worker {
    let mut me = Worker::default();
    let control = &shared.control;
    let c = &shared.counters;
    // Held pairs first.
    let mut held = Vec::new();
    while shared.next_hold.fetch_add(1, Ordering::AcqRel) < shared.hold_pairs {
        let (qps, ok) = me.connected_pair(shared, pd, cq);
        if ok {
            c.held.fetch_add(2, Ordering::AcqRel);
        }
        held.extend(qps);
        if control.stop.load(Ordering::Acquire) {
            break;
        }
    }
    barrier.wait();
    // The first worker past the barrier sets the schedule's origin.
    let _ =
        shared
            .start_ns
            .compare_exchange(0, monotonic_ns(), Ordering::AcqRel, Ordering::Acquire);
    let start = shared.start_ns.load(Ordering::Acquire);
    loop {
        if control.stop.load(Ordering::Acquire) {
            break;
        }
        if control.pause.load(Ordering::Acquire) {
            control.parked.fetch_add(1, Ordering::AcqRel);
            while control.pause.load(Ordering::Acquire) && !control.stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
            }
            control.parked.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let k = shared.next_pair.fetch_add(1, Ordering::AcqRel);
        if shared.pairs.is_some_and(|n| k >= n) {
            break;
        }
        if let Some(interval) = shared.interval_ns {
            let due = start.saturating_add(k.saturating_mul(interval));
            let now = monotonic_ns();
            if due > now {
                // At most one interval: the TCG guest's CLOCK_MONOTONIC has
                // been seen to step back (the kernel marks its TSCs
                // unsynchronized and falls back to the HPET), and a worker
                // then asked to sleep 160 s.
                std::thread::sleep(Duration::from_nanos((due - now).min(interval)));
            }
        }
        let t0 = monotonic_ns();
        me.first_ns.get_or_insert(t0);
        let (qps, ok) = me.connected_pair(shared, pd, cq);
        let mut destroyed_all = true;
        for qp in qps {
            destroyed_all &= me.destroy(c, qp);
        }
        if ok && destroyed_all {
            c.lifecycles.fetch_add(2, Ordering::AcqRel);
        }
        me.last_ns = monotonic_ns();
    }
    control.churn_done.fetch_add(1, Ordering::AcqRel);
    control.parked.fetch_add(1, Ordering::AcqRel);
    me.held = held;
    me
}

/// Attributes and mask of the modify for `op` (RC; loopback to `remote_qpn`).
fn modify_attr(op: Op, path: &Path, remote_qpn: u32) -> (ibv_qp_attr, i32) {
    use ibv_qp_attr_mask as m;
    // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
    let mut attr: ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
    let mask = match op {
        Op::ModifyInit => {
            attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
            attr.pkey_index = 0;
            attr.port_num = path.port;
            attr.qp_access_flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS
        }
        Op::ModifyRtr => {
            attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
            attr.path_mtu = path.mtu;
            attr.dest_qp_num = remote_qpn;
            attr.rq_psn = 0;
            attr.max_dest_rd_atomic = 1;
            attr.min_rnr_timer = 12;
            attr.ah_attr.port_num = path.port;
            match path.global {
                Some((index, gid)) => {
                    attr.ah_attr.is_global = 1;
                    attr.ah_attr.grh.dgid = ibv_gid { raw: gid };
                    attr.ah_attr.grh.sgid_index = index;
                    attr.ah_attr.grh.hop_limit = 1;
                }
                None => attr.ah_attr.dlid = path.lid,
            }
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER
        }
        Op::ModifyRts => {
            attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
            attr.timeout = 14;
            attr.retry_cnt = 7;
            attr.rnr_retry = 7;
            attr.sq_psn = 0;
            attr.max_rd_atomic = 1;
            m::IBV_QP_STATE
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC
        }
        Op::Create | Op::Destroy => unreachable!("not a modify"),
    };
    (attr, mask.0 as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(global: bool) -> Path {
        Path {
            port: 1,
            mtu: 3,
            global: global.then_some((1, [7; 16])),
            lid: 9,
        }
    }

    #[test]
    fn modify_masks_carry_the_state_and_what_the_edge_needs() {
        use ibv_qp_attr_mask as m;
        let (attr, mask) = modify_attr(Op::ModifyInit, &path(true), 0);
        assert_eq!(attr.qp_state, ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(mask & m::IBV_QP_STATE.0 as i32, 1);
        assert_ne!(mask & m::IBV_QP_PORT.0 as i32, 0);
        let (attr, mask) = modify_attr(Op::ModifyRtr, &path(true), 0x1234);
        assert_eq!(attr.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(attr.dest_qp_num, 0x1234);
        assert_eq!(attr.ah_attr.is_global, 1);
        assert_eq!(attr.ah_attr.grh.sgid_index, 1);
        // SAFETY: reading the raw bytes of a plain union.
        assert_eq!(unsafe { attr.ah_attr.grh.dgid.raw }, [7; 16]);
        assert_ne!(mask & m::IBV_QP_AV.0 as i32, 0);
        assert_ne!(mask & m::IBV_QP_DEST_QPN.0 as i32, 0);
        let (attr, _) = modify_attr(Op::ModifyRtr, &path(false), 1);
        assert_eq!((attr.ah_attr.is_global, attr.ah_attr.dlid), (0, 9));
        let (attr, mask) = modify_attr(Op::ModifyRts, &path(true), 0);
        assert_eq!(attr.qp_state, ibv_qp_state::IBV_QPS_RTS);
        assert_ne!(mask & m::IBV_QP_SQ_PSN.0 as i32, 0);
    }

    #[test]
    fn counts_add_up_kernel_calls() {
        let c = Counters::default();
        c.create_calls.store(4, Ordering::Release);
        c.modify_calls.store(12, Ordering::Release);
        c.destroy_calls.store(4, Ordering::Release);
        c.modify_failed.store(1, Ordering::Release);
        let s = c.snapshot();
        assert_eq!(s.kernel_calls, 20);
        assert_eq!(s.failures(), 1);
    }

    #[test]
    fn config_is_validated() {
        let mut config = ChurnConfig {
            device: None,
            port: 1,
            gid_index: None,
            lifecycles: Some(10),
            threads: 2,
            rate: None,
            hold: 0,
            thread_name: "churn".into(),
        };
        assert!(config.validate().is_ok());
        config.rate = Some(0.0);
        assert!(config.validate().is_err());
        config.rate = None;
        config.threads = 0;
        assert!(config.validate().is_err());
        config.threads = 1;
        config.thread_name = "much-too-long-name".into();
        assert!(config.validate().is_err());
    }
}
