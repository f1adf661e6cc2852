//! Everything downstream of the ring buffers: decode, correlate, count, and
//! optionally stream each event (the `events` subcommand).

use aya::maps::{MapData, RingBuf};
use tracing::warn;

use crate::{
    export::metrics::Metrics,
    kernel::rdma::QpState,
    model::cm::CmCorrelator,
    model::events::{clock_ns, decode, Call, CmCall, QpCall, Record},
    model::qp::{Correlator, QpDetail},
};

/// How long a record is held back after the kernel finished it, for records
/// of other CPUs that finished earlier but are submitted later: the gap
/// between a program's timestamp and its ring-buffer submit. Measured above
/// 1 ms in the TCG guest, where a vCPU can be descheduled in between. Below
/// the drain interval, so a held record is processed at the next tick.
pub const REORDER_WINDOW_NS: u64 = 50_000_000;

/// Receives each decoded event with the correlators' view of it.
pub trait EventSink: Send {
    /// `from` is the QP's state before the call; `cm_id` the CM id it is
    /// joined to; `cgroup` the creating task's cgroup path (creates only);
    /// `detail` what else the call told (async event, error cause).
    fn qp(
        &mut self,
        call: &QpCall,
        from: Option<QpState>,
        cm_id: Option<u32>,
        cgroup: Option<&str>,
        detail: &QpDetail,
    );
    fn cm(&mut self, call: &CmCall, cm: &CmCorrelator);
}

/// Receives the QP calls this process made itself (its synthetic probes' and
/// responder's), for their cross-check against the userspace calls.
pub trait OwnCallSink: Send {
    fn own_call(&self, call: &QpCall);
}

pub struct Pipeline {
    pub correlator: Correlator,
    pub cm: CmCorrelator,
    pub metrics: Metrics,
    pub sink: Option<Box<dyn EventSink>>,
    /// Where this process's own QP calls go (synthetic probes), if anywhere.
    pub own_calls: Option<Box<dyn OwnCallSink>>,
    pub own_pid: u32,
    /// Every running instance's ring buffer, drained together (see `drain`).
    rings: Vec<(&'static str, RingBuf<MapData>)>,
    /// Records read but not yet processed, in completion order (held back by
    /// `drain` for the reorder window). Reused: no allocation per event once
    /// it has grown.
    batch: Vec<Record>,
}

impl Pipeline {
    pub fn new(correlator: Correlator, cm: CmCorrelator, metrics: Metrics) -> Self {
        Self {
            correlator,
            cm,
            metrics,
            sink: None,
            own_calls: None,
            own_pid: std::process::id(),
            rings: Vec::new(),
            batch: Vec::new(),
        }
    }

    /// Starts the counter of every cause of an entry into ERR the
    /// correlator can name at 0.
    pub fn init_err_causes(&mut self) {
        let causes = self.correlator.err_causes();
        self.metrics
            .qp_errors
            .init_causes(causes.iter().map(|c| &**c));
    }

    /// Adds an instance's ring buffer to the ones `drain` reads.
    pub fn add_ring(&mut self, name: &'static str, ring: RingBuf<MapData>) {
        self.rings.push((name, ring));
    }

    /// Takes an instance's ring buffer out (after a last `flush`).
    pub fn remove_ring(&mut self, name: &str) -> Option<RingBuf<MapData>> {
        let index = self.rings.iter().position(|(n, _)| *n == name)?;
        Some(self.rings.swap_remove(index).1)
    }

    /// Reads every record currently in every ring buffer and processes, in
    /// the order the kernel finished them, those that finished more than
    /// [`REORDER_WINDOW_NS`] ago; later ones wait for the next drain. Returns
    /// how many records were read.
    ///
    /// One ring per instance: the CM events that join a QP to its cm_id come
    /// through rdma_cm's ring, the QP's own modifies through ib_core's, and
    /// with wakeup batching either ring may be read up to a drain interval
    /// late. Merging by completion time keeps the join before the modifies
    /// that follow it. A record is timestamped before it is submitted, so one
    /// from another CPU can reach its ring after a record that finished later
    /// has been read: the window covers that gap.
    pub fn drain(&mut self) -> usize {
        let now = u64::try_from(clock_ns(libc::CLOCK_MONOTONIC)).unwrap_or(0);
        self.drain_finished_by(now.saturating_sub(REORDER_WINDOW_NS))
    }

    /// Reads and processes every record, held back or in a ring (at attach,
    /// before the kernel's own lists are read, and before a ring goes away).
    pub fn flush(&mut self) -> usize {
        self.drain_finished_by(u64::MAX)
    }

    fn drain_finished_by(&mut self, watermark_ns: u64) -> usize {
        let mut batch = std::mem::take(&mut self.batch);
        let mut received = 0;
        for (_, ring) in &mut self.rings {
            while let Some(bytes) = ring.next() {
                received += 1;
                batch.extend(decode_counted(&bytes, &self.metrics));
            }
        }
        // stable: each ring is already in submission order
        batch.sort_by_key(Record::end_ns);
        let ready = batch.partition_point(|record| record.end_ns() <= watermark_ns);
        for record in batch.drain(..ready) {
            self.handle(record);
        }
        self.batch = batch;
        received
    }

    /// Decodes and processes one record outside any ring (benchmarks, replays).
    pub fn process(&mut self, bytes: &[u8]) {
        if let Some(record) = decode_counted(bytes, &self.metrics) {
            self.handle(record);
        }
    }

    fn handle(&mut self, record: Record) {
        self.metrics.events.received_kind(record.kind_index());
        match record {
            Record::Qp(call) => {
                let before = self.sink.is_some().then(|| {
                    let from = self.correlator.state_of(call.device(), call.qp_num);
                    let cgroup = matches!(call.call, Call::Create { .. })
                        .then(|| self.correlator.cgroup_path(call.cgroup_id))
                        .flatten();
                    (from, cgroup)
                });
                self.correlator.handle(&call, &mut self.metrics);
                if let (Some(sink), Some((from, cgroup))) = (self.sink.as_mut(), before) {
                    sink.qp(
                        &call,
                        from,
                        self.cm.cm_id_for_qp(call.qp_num),
                        cgroup.as_deref(),
                        &self.correlator.take_detail(),
                    );
                }
                if call.pid == self.own_pid {
                    if let Some(own) = &self.own_calls {
                        own.own_call(&call);
                    }
                }
            }
            Record::Cm(call) => {
                self.cm.handle(&call, &mut self.metrics);
                if let Some(sink) = self.sink.as_mut() {
                    sink.cm(&call, &self.cm);
                }
            }
        }
    }
}

/// Decodes one ring-buffer record; a malformed one is counted and logged, not processed.
fn decode_counted(bytes: &[u8], metrics: &Metrics) -> Option<Record> {
    decode(bytes)
        .map_err(|error| {
            metrics.events.malformed(&error);
            warn!(%error, "dropping malformed ring-buffer record");
        })
        .ok()
}
