//! Probes follow the traffic: the remote peers of the host's live QPs (from
//! the kernel, see `model::peers`) become UD probe targets, each until a set
//! time after its last QP went away.
//!
//! Pure logic: the daemon feeds it the peers it reads and the local
//! addresses; the mesh prober plans its targets from [`Discovery::targets`].

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::IpAddr,
    time::{Duration, Instant},
};

#[derive(Debug)]
pub struct Discovery {
    expiry: Duration,
    max_targets: usize,
    /// Discovered peers, with when they last had a live QP.
    targets: BTreeMap<IpAddr, Instant>,
    /// Peers left out because `max_targets` were discovered already.
    refused: BTreeSet<IpAddr>,
}

/// What one [`Discovery::update`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Update {
    pub added: Vec<IpAddr>,
    pub expired: Vec<IpAddr>,
    /// Peers refused for the first time (beyond `max_targets`).
    pub refused: Vec<IpAddr>,
}

impl Update {
    pub fn changed(&self) -> bool {
        !self.added.is_empty() || !self.expired.is_empty()
    }
}

impl Discovery {
    pub fn new(expiry: Duration, max_targets: usize) -> Self {
        Self {
            expiry,
            max_targets,
            targets: BTreeMap::new(),
            refused: BTreeSet::new(),
        }
    }

    /// New limits; targets beyond the new bound go at the next update.
    pub fn set_limits(&mut self, expiry: Duration, max_targets: usize) {
        self.expiry = expiry;
        self.max_targets = max_targets;
    }

    /// `live`: the remote addresses of the live QPs now; `local`: this
    /// host's own addresses (a QP to oneself is no path to probe). A peer
    /// not live any more is kept until `expiry` after it was last seen.
    pub fn update(&mut self, now: Instant, live: &[IpAddr], local: &HashSet<IpAddr>) -> Update {
        let mut update = Update::default();
        let live: BTreeSet<IpAddr> = live
            .iter()
            .copied()
            .filter(|ip| probeable(ip) && !local.contains(ip))
            .collect();
        for &ip in &live {
            if let Some(last_seen) = self.targets.get_mut(&ip) {
                *last_seen = now;
            } else if self.targets.len() < self.max_targets {
                self.targets.insert(ip, now);
                update.added.push(ip);
            } else if self.refused.insert(ip) {
                update.refused.push(ip);
            }
        }
        let expiry = self.expiry;
        let max = self.max_targets;
        let mut kept = 0;
        self.targets.retain(|ip, last_seen| {
            let keep = now.saturating_duration_since(*last_seen) < expiry && kept < max;
            if keep {
                kept += 1;
            } else {
                update.expired.push(*ip);
            }
            keep
        });
        // a refused peer that went away may be admitted when it comes back
        self.refused.retain(|ip| live.contains(ip));
        update
    }

    pub fn targets(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.targets.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

/// An address the UD probes can reach: not unspecified, loopback,
/// multicast or IPv6 link-local (a GID made from a MAC, not routable).
fn probeable(ip: &IpAddr) -> bool {
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return false;
    }
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 != 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn live_peers_become_targets_and_expire_after_their_last_qp() {
        let mut d = Discovery::new(Duration::from_secs(10), 8);
        let t0 = Instant::now();
        let local = HashSet::from([ip("198.18.0.1")]);
        let u = d.update(
            t0,
            &[ip("198.18.0.2"), ip("198.18.0.1"), ip("198.18.0.2")],
            &local,
        );
        assert_eq!(
            u.added,
            [ip("198.18.0.2")],
            "own address left out, once each"
        );
        assert!(u.changed());
        // still live 5 s later: no change
        let u = d.update(t0 + Duration::from_secs(5), &[ip("198.18.0.2")], &local);
        assert!(!u.changed());
        // its QPs gone: kept until 10 s after last seen (t0 + 5)
        let u = d.update(t0 + Duration::from_secs(14), &[], &local);
        assert!(!u.changed());
        assert_eq!(d.len(), 1);
        let u = d.update(t0 + Duration::from_secs(15), &[], &local);
        assert_eq!(u.expired, [ip("198.18.0.2")]);
        assert!(d.is_empty());
    }

    #[test]
    fn bounded_with_each_refusal_reported_once() {
        let mut d = Discovery::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        let none = HashSet::new();
        let live = [ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")];
        let u = d.update(t0, &live, &none);
        assert_eq!(u.added.len(), 2);
        assert_eq!(u.refused, [ip("10.0.0.3")]);
        let u = d.update(t0, &live, &none);
        assert!(u.refused.is_empty(), "refused once while it stays");
        // a smaller bound drops the excess at the next update
        d.set_limits(Duration::from_secs(10), 1);
        let u = d.update(t0, &live[..1], &none);
        assert_eq!(u.expired, [ip("10.0.0.2")]);
        assert_eq!(d.targets().collect::<Vec<_>>(), [ip("10.0.0.1")]);
    }

    #[test]
    fn unreachable_kinds_of_address_are_never_targets() {
        let mut d = Discovery::new(Duration::from_secs(10), 8);
        let u = d.update(
            Instant::now(),
            &[
                ip("fe80::5054:ff:fe00:a"),
                ip("::1"),
                ip("0.0.0.0"),
                ip("2001:db8::2"),
            ],
            &HashSet::new(),
        );
        assert_eq!(u.added, [ip("2001:db8::2")]);
    }
}
