//! This host's own IP addresses (getifaddrs), which discovered peers are not.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// Every address of every interface; empty if getifaddrs fails.
pub fn local_addresses() -> HashSet<IpAddr> {
    let mut found = HashSet::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` on success; freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return found;
    }
    let mut next = list;
    while !next.is_null() {
        // SAFETY: a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*next };
        next = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says its type.
        match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
            libc::AF_INET => {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found.insert(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                found.insert(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_local() {
        let local = local_addresses();
        assert!(
            local.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{local:?}"
        );
    }
}
