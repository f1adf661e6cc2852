//! The remote peers of the host's QPs (from their modifies to RTR): how many
//! per device, and the live QPs to each (a capped `peer` label).
//!
//! A series whose gauge falls to 0 goes at the next collection, not at once:
//! a peer's series made anew for each short-lived QP cost more than all the
//! rest of its lifecycle's events (with the prometheus crate: `Desc`
//! building, label checks; still a label text and an allocation each), and
//! whoever collects sees no zero series either way.

use std::sync::{Arc, Mutex};

use crate::export::registry::{Collector, Desc, IntGauge, IntGaugeVec};
use fnv::FnvHashMap;

use super::Registrar;

#[derive(Clone)]
pub struct PeerMetrics {
    series: Arc<Mutex<PeerSeries>>,
}

struct PeerSeries {
    peers: IntGaugeVec,
    peer_qps: IntGaugeVec,
    /// The series in use, by device (and by peer): looked up here, not
    /// through the families' label hashing.
    by_device: FnvHashMap<Box<str>, IntGauge>,
    by_peer: FnvHashMap<Box<str>, FnvHashMap<Box<str>, IntGauge>>,
}

impl PeerSeries {
    /// Takes out every series at 0.
    fn sweep(&mut self) {
        let peers = &self.peers;
        self.by_device.retain(|device, gauge| {
            let keep = gauge.get() > 0;
            if !keep {
                let _ = peers.remove_label_values(&[device]);
            }
            keep
        });
        let peer_qps = &self.peer_qps;
        self.by_peer.retain(|device, by_peer| {
            by_peer.retain(|peer, gauge| {
                let keep = gauge.get() > 0;
                if !keep {
                    let _ = peer_qps.remove_label_values(&[device, peer]);
                }
                keep
            });
            !by_peer.is_empty()
        });
    }
}

/// Collects both families after a sweep.
struct PeerCollector {
    series: Arc<Mutex<PeerSeries>>,
    descs: Vec<Desc>,
}

impl Collector for PeerCollector {
    fn descs(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self, out: &mut [String]) {
        let mut series = self.series.lock().expect("not poisoned");
        series.sweep();
        series.peers.write_samples(&mut out[0]);
        series.peer_qps.write_samples(&mut out[1]);
    }
}

impl PeerMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        let peers = IntGaugeVec::new(
            "qpwatch_peers",
            "Distinct remote GIDs the device's live QPs are connected to (from the address vector of their modify to RTR).",
            &["device"],
        )
        .expect("valid metric");
        let peer_qps = IntGaugeVec::new(
            "qpwatch_peer_qps",
            "Live QPs connected to a remote peer: its IP (RoCE) or GID; first max_peer_labels peers, the rest \"other\". A series goes with the peer's last QP.",
            &["device", "peer"],
        )
        .expect("valid metric");
        let descs = vec![peers.desc().clone(), peer_qps.desc().clone()];
        let series = Arc::new(Mutex::new(PeerSeries {
            peers,
            peer_qps,
            by_device: FnvHashMap::default(),
            by_peer: FnvHashMap::default(),
        }));
        r.try_register(Box::new(PeerCollector {
            series: Arc::clone(&series),
            descs,
        }))
        .expect("unique metric");
        Self { series }
    }

    pub fn peers(&self, device: &str, delta: i64) {
        let mut series = self.series.lock().expect("not poisoned");
        let PeerSeries {
            peers, by_device, ..
        } = &mut *series;
        if let Some(gauge) = by_device.get(device) {
            gauge.add(delta);
            return;
        }
        let gauge = peers.with_label_values(&[device]);
        gauge.add(delta);
        by_device.insert(device.into(), gauge);
    }

    pub fn peer_qps(&self, device: &str, peer: &str, delta: i64) {
        let mut series = self.series.lock().expect("not poisoned");
        let PeerSeries {
            peer_qps, by_peer, ..
        } = &mut *series;
        if let Some(gauge) = by_peer.get(device).and_then(|by_peer| by_peer.get(peer)) {
            gauge.add(delta);
            return;
        }
        let gauge = peer_qps.with_label_values(&[device, peer]);
        gauge.add(delta);
        by_peer
            .entry(device.into())
            .or_default()
            .insert(peer.into(), gauge);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::render;
    use crate::export::registry::Registry;

    #[test]
    fn a_series_goes_with_its_last_qp_and_comes_back_with_the_next() {
        let registry = Registry::new();
        let metrics = PeerMetrics::new(&mut Registrar::new(&registry));
        assert_eq!(registry.names(), ["qpwatch_peers", "qpwatch_peer_qps"]);
        metrics.peers("rxe0", 1);
        metrics.peer_qps("rxe0", "198.18.0.2", 1);
        metrics.peer_qps("rxe0", "198.18.0.2", 1);
        metrics.peer_qps("rxe0", "198.18.0.3", 1);
        let live = render(&registry);
        assert!(
            live.contains("qpwatch_peers{device=\"rxe0\"} 1\n"),
            "{live}"
        );
        assert!(live.contains("qpwatch_peer_qps{device=\"rxe0\",peer=\"198.18.0.2\"} 2\n"));
        assert!(live.contains("qpwatch_peer_qps{device=\"rxe0\",peer=\"198.18.0.3\"} 1\n"));

        metrics.peer_qps("rxe0", "198.18.0.3", -1);
        let one_gone = render(&registry);
        assert!(!one_gone.contains("198.18.0.3"), "{one_gone}");
        assert!(one_gone.contains("peer=\"198.18.0.2\"} 2\n"));

        // back to 0 and up again between two collections: the same series
        metrics.peer_qps("rxe0", "198.18.0.2", -2);
        metrics.peer_qps("rxe0", "198.18.0.2", 1);
        metrics.peers("rxe0", -1);
        let back = render(&registry);
        assert!(back.contains("peer=\"198.18.0.2\"} 1\n"), "{back}");
        assert!(!back.contains("qpwatch_peers{"), "{back}");

        metrics.peer_qps("rxe0", "198.18.0.2", -1);
        metrics.peers("rxe0", 1);
        let end = render(&registry);
        assert!(!end.contains("qpwatch_peer_qps{"), "{end}");
        assert!(end.contains("qpwatch_peers{device=\"rxe0\"} 1\n"), "{end}");
    }
}
