//! The remote peers of the host's QPs (from their modifies to RTR): how many
//! per device, and the live QPs to each (a capped `peer` label).

use prometheus::IntGaugeVec;

use super::Registrar;

#[derive(Clone)]
pub struct PeerMetrics {
    peers: IntGaugeVec,
    peer_qps: IntGaugeVec,
}

impl PeerMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        Self {
            peers: r.gauge_vec(
                "qpwatch_peers",
                "Distinct remote GIDs the device's live QPs are connected to (from the address vector of their modify to RTR).",
                &["device"],
            ),
            peer_qps: r.gauge_vec(
                "qpwatch_peer_qps",
                "Live QPs connected to a remote peer: its IP (RoCE) or GID; first max_peer_labels peers, the rest \"other\". A series goes with the peer's last QP.",
                &["device", "peer"],
            ),
        }
    }

    pub fn peers(&self, device: &str, delta: i64) {
        let gauge = self.peers.with_label_values(&[device]);
        gauge.add(delta);
        if gauge.get() <= 0 {
            let _ = self.peers.remove_label_values(&[device]);
        }
    }

    pub fn peer_qps(&self, device: &str, peer: &str, delta: i64) {
        let gauge = self.peer_qps.with_label_values(&[device, peer]);
        gauge.add(delta);
        if gauge.get() <= 0 {
            let _ = self.peer_qps.remove_label_values(&[device, peer]);
        }
    }
}
