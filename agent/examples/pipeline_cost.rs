//! Host-side cost of the agent's event hot path, without a kernel: N
//! synthetic QP lifecycles (create, RESET→INIT→RTR→RTS, destroy = 5 records)
//! decoded and correlated by the same `Pipeline` the daemon drains the ring
//! buffer into, then one `/metrics` render.
//!
//!   cargo run --release -p qpwatch --example pipeline_cost [LIFECYCLES]

use qpwatch::{
    export::metrics::{Buckets, Metrics},
    model::cm::{CmCorrelator, CmNames},
    model::pipeline::Pipeline,
    model::qp::{Correlator, Limits},
};
use qpwatch_common::{EventKind, QpEvent};
use std::time::Instant;

fn bytes(e: &QpEvent) -> Vec<u8> {
    // SAFETY: QpEvent is a plain #[repr(C)] record without padding holes
    // that matter here (it is what the eBPF side writes into the ring).
    unsafe {
        std::slice::from_raw_parts(
            (e as *const QpEvent).cast::<u8>(),
            std::mem::size_of::<QpEvent>(),
        )
    }
    .to_vec()
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let metrics = Metrics::new(&Buckets::default(), "6.1");
    let mut p = Pipeline::new(
        Correlator::new(Limits::default()),
        CmCorrelator::new(CmNames::linux_6_1()),
        metrics,
    );
    let mut recs = Vec::new();
    let mut t = 1000u64;
    for i in 0..n {
        let mut e = QpEvent::zeroed();
        e.device[..4].copy_from_slice(b"rxe0");
        e.comm[..7].copy_from_slice(b"churn-0");
        e.pid_tgid = (7 << 32) | 8;
        e.qp_num = 17 + (i % 1000);
        e.qp_type = 2;
        for (kind, state) in [(1, 0), (2, 1), (2, 2), (2, 3), (3, 0)] {
            e.kind = kind;
            e.attr_mask = if kind == EventKind::QpModify as u32 {
                1
            } else {
                0
            };
            e.new_state = state;
            e.start_ns = t;
            e.end_ns = t + 500;
            t += 1000;
            recs.push(bytes(&e));
        }
    }
    let start = Instant::now();
    for r in &recs {
        p.process(r);
    }
    let el = start.elapsed();
    println!(
        "{} events in {:?}: {:.0} ns/event",
        recs.len(),
        el,
        el.as_nanos() as f64 / recs.len() as f64
    );
    let start = Instant::now();
    let text = qpwatch::export::metrics::render(&p.metrics.registry);
    println!("render {} bytes in {:?}", text.len(), start.elapsed());
}
