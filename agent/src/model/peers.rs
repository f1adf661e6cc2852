//! The peers of the host's QPs: per local device, the remote GIDs the kernel
//! connected QPs to (the address vector of their modify to RTR), how many
//! live QPs each has, and since when.
//!
//! Bounded by the QP table: an entry lives while one of its QPs does. The
//! metric label of a peer is capped separately (first come; later peers
//! share "other").

use std::sync::Arc;

use fnv::FnvHashMap;

use crate::{
    kernel::rdma::Gid,
    model::qp::{Label, Observation, Observer},
};

/// One remote peer of one local device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub device: Label,
    pub gid: Gid,
    /// Live QPs connected to it.
    pub qps: u32,
    /// CLOCK_MONOTONIC ns of the modify that connected its first live QP.
    pub since_ns: u64,
    /// Its `peer` label value (capped).
    pub label: Label,
}

pub struct Peers {
    peers: FnvHashMap<(Label, Gid), Peer>,
    labels: FnvHashMap<Gid, Label>,
    max_labels: usize,
    other: Label,
}

impl Peers {
    pub fn new(max_labels: usize, other: Label) -> Self {
        Self {
            peers: FnvHashMap::default(),
            labels: FnvHashMap::default(),
            max_labels,
            other,
        }
    }

    fn label(&mut self, gid: Gid, out: &mut impl Observer) -> Label {
        if let Some(label) = self.labels.get(&gid) {
            return Arc::clone(label);
        }
        if self.labels.len() >= self.max_labels {
            out.observe(Observation::LabelOverflow { label: "peer" });
            return Arc::clone(&self.other);
        }
        let label: Label = Arc::from(gid.to_string());
        self.labels.insert(gid, Arc::clone(&label));
        label
    }

    /// A QP of `device` was connected to `gid` at `at_ns`.
    pub fn attach(&mut self, device: &Label, gid: Gid, at_ns: u64, out: &mut impl Observer) {
        let key = (Arc::clone(device), gid);
        if let Some(peer) = self.peers.get_mut(&key) {
            peer.qps += 1;
            out.observe(Observation::PeerQps {
                device: Arc::clone(device),
                peer: Arc::clone(&peer.label),
                delta: 1,
            });
            return;
        }
        let label = self.label(gid, out);
        out.observe(Observation::PeerQps {
            device: Arc::clone(device),
            peer: Arc::clone(&label),
            delta: 1,
        });
        out.observe(Observation::Peers {
            device: Arc::clone(device),
            delta: 1,
        });
        self.peers.insert(
            key,
            Peer {
                device: Arc::clone(device),
                gid,
                qps: 1,
                since_ns: at_ns,
                label,
            },
        );
    }

    /// A QP of `device` connected to `gid` went away (destroyed, reset, or
    /// connected elsewhere).
    pub fn detach(&mut self, device: &Label, gid: Gid, out: &mut impl Observer) {
        let key = (Arc::clone(device), gid);
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        peer.qps -= 1;
        out.observe(Observation::PeerQps {
            device: Arc::clone(device),
            peer: Arc::clone(&peer.label),
            delta: -1,
        });
        if peer.qps == 0 {
            self.peers.remove(&key);
            out.observe(Observation::Peers {
                device: Arc::clone(device),
                delta: -1,
            });
        }
    }

    /// Current peers, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(last: u8) -> Gid {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[198, 18, 0, last]);
        Gid(raw)
    }

    #[test]
    fn counts_qps_per_peer_and_peers_per_device() {
        let mut peers = Peers::new(8, Arc::from("other"));
        let mut out = Vec::new();
        let rxe0: Label = Arc::from("rxe0");
        peers.attach(&rxe0, gid(2), 10, &mut out);
        peers.attach(&rxe0, gid(2), 20, &mut out);
        peers.attach(&rxe0, gid(3), 30, &mut out);
        assert_eq!(peers.len(), 2);
        let two = peers.iter().find(|p| p.gid == gid(2)).unwrap();
        assert_eq!((two.qps, two.since_ns, &*two.label), (2, 10, "198.18.0.2"));
        let new_peers: i64 = out
            .iter()
            .filter_map(|o| match o {
                Observation::Peers { delta, .. } => Some(*delta),
                _ => None,
            })
            .sum();
        assert_eq!(new_peers, 2);
        out.clear();
        peers.detach(&rxe0, gid(2), &mut out);
        assert_eq!(peers.len(), 2);
        peers.detach(&rxe0, gid(2), &mut out);
        assert_eq!(peers.len(), 1);
        assert!(out.contains(&Observation::Peers {
            device: Arc::clone(&rxe0),
            delta: -1
        }));
        // an unknown peer's detach changes nothing
        peers.detach(&rxe0, gid(9), &mut out);
        assert_eq!(peers.len(), 1);
    }

    #[test]
    fn peer_labels_are_capped() {
        let mut peers = Peers::new(1, Arc::from("other"));
        let mut out = Vec::new();
        let rxe0: Label = Arc::from("rxe0");
        peers.attach(&rxe0, gid(2), 1, &mut out);
        peers.attach(&rxe0, gid(3), 1, &mut out);
        assert!(out.contains(&Observation::LabelOverflow { label: "peer" }));
        let three = peers.iter().find(|p| p.gid == gid(3)).unwrap();
        assert_eq!(&*three.label, "other");
        // the table itself keeps both
        assert_eq!(peers.len(), 2);
    }
}
