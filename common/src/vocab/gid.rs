//! GIDs: an RDMA port's 128-bit address. RoCE GIDs are IP addresses (IPv4 as
//! IPv4-mapped IPv6, `::ffff:a.b.c.d`); IB GIDs are subnet prefix + port GUID.

use core::{
    fmt,
    net::{IpAddr, Ipv6Addr},
};

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The address as an IP address: IPv4 for an IPv4-mapped GID (RoCEv2
    /// over IPv4), else the IPv6 reading of the 16 bytes.
    pub fn ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// Whether the GID is an IPv4-mapped address (RoCEv2 over IPv4), the
    /// only kind the UD probes can reach by IP.
    pub fn is_ipv4(&self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }
}

/// `198.18.0.2` for IPv4-mapped GIDs, `fe80::5054:ff:fe00:a` for others.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.ip(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn ipv4_mapped_reads_as_ipv4() {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[198, 18, 0, 2]);
        let gid = Gid(raw);
        assert!(gid.is_ipv4());
        assert_eq!(gid.to_string(), "198.18.0.2");
    }

    #[test]
    fn ib_and_link_local_gids_read_as_ipv6() {
        let raw = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0, 0, 0x0a,
        ];
        let gid = Gid(raw);
        assert!(!gid.is_ipv4());
        assert_eq!(gid.to_string(), "fe80::5054:ff:fe00:a");
    }
}
