//! Agent CPU per event in the hot path, on the host: synthetic ring-buffer
//! records of QP lifecycles (create, INIT, RTR, RTS, destroy; the shape
//! qp-churn produces, the modify to RTR with its loopback peer) go through `Pipeline::process`, decode to metrics.
//! Prints ns per event and heap allocations per event (a counting global
//! allocator). `cargo bench -p qpwatch --bench pipeline`. Figures, not a test.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

use qpwatch::{
    export::metrics::{render, Buckets, Metrics},
    model::cm::{CmCorrelator, CmNames},
    model::pipeline::Pipeline,
    model::qp::{Correlator, Limits},
};
use qpwatch_common::{EventKind, QpEvent, QpOrigin, IB_QP_STATE_MASK, REMOTE_GID, REMOTE_QPN};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for alloc/dealloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// IB_QPT_RC
const RC: u32 = 2;

fn record(kind: EventKind, qp_num: u32, at_ns: u64) -> QpEvent {
    let mut e = QpEvent::zeroed();
    e.kind = kind as u32;
    e.origin = QpOrigin::User as u32;
    e.start_ns = at_ns;
    e.end_ns = at_ns + 20_000;
    e.pid_tgid = (4242u64 << 32) | 4243;
    e.qp_num = qp_num;
    e.qp_type = RC;
    e.comm[..8].copy_from_slice(b"qp-churn");
    e.device[..4].copy_from_slice(b"rxe0");
    e
}

/// `lifecycles` QPs, `concurrent` of them interleaved at a time.
fn lifecycles(lifecycles: u32, concurrent: u32) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut t = 1_000_000_000u64;
    let mut tick = || {
        t += 50_000;
        t
    };
    for batch in (0..lifecycles).step_by(concurrent as usize) {
        let qps: Vec<u32> = (batch..(batch + concurrent).min(lifecycles))
            .map(|i| 17 + i)
            .collect();
        for &qp in &qps {
            out.push(record(EventKind::QpCreate, qp, tick()));
        }
        for state in [1, 2, 3] {
            for &qp in &qps {
                let mut e = record(EventKind::QpModify, qp, tick());
                e.attr_mask = IB_QP_STATE_MASK;
                e.new_state = state;
                if state == 2 {
                    // to RTR: the remote side, as qp-churn's loopback pairs give it
                    e.remote = REMOTE_GID | REMOTE_QPN;
                    e.remote_gid[10..].copy_from_slice(&[0xff, 0xff, 198, 18, 0, 1]);
                    e.remote_qpn = qp ^ 1;
                }
                out.push(e);
            }
        }
        for &qp in &qps {
            out.push(record(EventKind::QpDestroy, qp, tick()));
        }
    }
    out.iter().map(bytes).collect()
}

fn bytes(event: &QpEvent) -> Vec<u8> {
    // SAFETY: QpEvent is #[repr(C)] without padding.
    unsafe {
        std::slice::from_raw_parts((event as *const QpEvent).cast::<u8>(), size_of::<QpEvent>())
    }
    .to_vec()
}

fn main() {
    let rounds = 5;
    let records = lifecycles(100_000, 2);
    let mut pipeline = Pipeline::new(
        Correlator::new(Limits::default()),
        CmCorrelator::new(CmNames::linux_6_1()),
        Metrics::new(&Buckets::default(), "bench"),
    );
    // warm-up: every label series exists, the tables have grown
    for r in &records[..10_000] {
        pipeline.process(r);
    }
    let mut best = f64::MAX;
    let mut allocs = 0;
    for _ in 0..rounds {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let start = Instant::now();
        for r in &records {
            pipeline.process(r);
        }
        let ns = start.elapsed().as_nanos() as f64 / records.len() as f64;
        allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
        best = best.min(ns);
    }
    println!(
        "pipeline: {} records (100,000 lifecycles, 2 in flight) x {rounds} rounds: best {best:.0} ns/event, {:.2} heap allocations/event",
        records.len(),
        allocs as f64 / records.len() as f64
    );
    println!(
        "pipeline: {:.2} ms of agent CPU per 1,000 lifecycles (5 events each) on this host",
        best * 5.0 * 1000.0 / 1e6
    );
    scrape(&pipeline.metrics);
}

/// `/metrics` rendering of the registry the pipeline filled, without HTTP:
/// the agent's side of a scrape.
fn scrape(metrics: &Metrics) {
    let scrapes = 2000;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut bytes = 0;
    for _ in 0..scrapes {
        bytes = render(&metrics.registry).len();
    }
    let render_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(scrapes);
    let allocs = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / f64::from(scrapes);
    println!(
        "scrape: {bytes} bytes rendered in {render_us:.1} µs, {allocs:.0} heap allocations (collectors incl. the process collector's /proc reads)"
    );
}
