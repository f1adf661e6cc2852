//! Everything downstream of the ring buffers: decode, correlate, count, and
//! optionally stream each event (the `events` subcommand).

use aya::maps::{MapData, RingBuf};
use tracing::warn;

use crate::{
    cm::CmCorrelator,
    correlator::Correlator,
    events::{decode, CmCall, QpCall, Record},
    metrics::Metrics,
    probing::OwnCalls,
    rdma::QpState,
};

/// Receives each decoded event with the correlators' view of it.
impl Pipeline {
    pub fn new(correlator: Correlator, cm: CmCorrelator, metrics: Metrics) -> Self {
        Self {
            correlator,
            cm,
            metrics,
            sink: None,
            own_calls: OwnCalls::default(),
            own_pid: std::process::id(),
        }
    }
}

pub trait EventSink: Send {
    /// `from` is the QP's state before the call; `cm_id` the CM id it is joined to.
    fn qp(&mut self, call: &QpCall, from: Option<QpState>, cm_id: Option<u32>);
    fn cm(&mut self, call: &CmCall, cm: &CmCorrelator);
}

pub struct Pipeline {
    pub correlator: Correlator,
    pub cm: CmCorrelator,
    pub metrics: Metrics,
    pub sink: Option<Box<dyn EventSink>>,
    /// This process's own QP calls (synthetic probes), for their cross-check.
    pub own_calls: OwnCalls,
    pub own_pid: u32,
}

impl Pipeline {
    /// Drains every record currently in the ring buffer; returns how many.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) -> usize {
        let mut n = 0;
        while let Some(record) = ring.next() {
            self.process(&record);
            n += 1;
        }
        n
    }

    pub fn process(&mut self, bytes: &[u8]) {
        match decode(bytes) {
            Ok(record) => {
                self.metrics.event_received(record.kind_label());
                match record {
                    Record::Qp(call) => {
                        if let Some(sink) = self.sink.as_mut() {
                            let from = self.correlator.state_of(call.device(), call.qp_num);
                            sink.qp(&call, from, self.cm.cm_id_for_qp(call.qp_num));
                        }
                        self.correlator.handle(&call, &mut self.metrics);
                        if call.pid == self.own_pid {
                            self.own_calls.record(&call);
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
            Err(error) => {
                self.metrics.event_malformed(&error);
                warn!(%error, "dropping malformed ring-buffer record");
            }
        }
    }
}
