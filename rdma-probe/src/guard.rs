//! Who may talk to the responders, and how much: the allow-list of source
//! subnets, the RC responder's per-source connection count, the UD
//! responder's per-source answer rate, and the RC probe message check.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use crate::requester::{MAGIC, MESSAGE_HEADER};

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, how RoCE writes an IPv4
/// address in a GID) as the IPv4 address it maps.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The source of a received GID (its 16 bytes), IPv4-mapped GIDs as IPv4.
pub fn gid_source(gid: [u8; 16]) -> IpAddr {
    canonical_ip(IpAddr::V6(Ipv6Addr::from(gid)))
}

/// A subnet: `ADDR/PREFIX`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    addr: IpAddr,
    prefix: u8,
}

impl Subnet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical_ip(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask(u32::from(net).into(), self.prefix, 32)
                    == mask(u32::from(ip).into(), self.prefix, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask(u128::from(net), self.prefix, 128) == mask(u128::from(ip), self.prefix, 128)
            }
            _ => false,
        }
    }
}

fn mask(bits: u128, prefix: u8, width: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        bits >> (width - prefix)
    }
}

impl FromStr for Subnet {
    type Err = String;

    fn from_str(s: &str) -> Result<Subnet, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr = addr
            .parse::<IpAddr>()
            .map_err(|_| format!("{s:?} is not ADDR or ADDR/PREFIX"))?;
        let mapped = matches!(addr, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        let addr = canonical_ip(addr);
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => {
                let p: u8 = p
                    .parse()
                    .ok()
                    .map(|p: u8| if mapped { p.wrapping_sub(96) } else { p })
                    .filter(|p| *p <= width)
                    .ok_or_else(|| format!("{s:?}: the prefix length is not 0..={width}"))?;
                p
            }
        };
        Ok(Subnet { addr, prefix })
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The sources a responder answers; empty: every source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    subnets: Vec<Subnet>,
}

impl AllowList {
    /// Every source.
    pub fn everyone() -> AllowList {
        AllowList::default()
    }

    pub fn new(subnets: Vec<Subnet>) -> AllowList {
        AllowList { subnets }
    }

    pub fn subnets(&self) -> &[Subnet] {
        &self.subnets
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        self.subnets.is_empty() || self.subnets.iter().any(|s| s.contains(ip))
    }
}

/// Open connections per source address, for a per-source cap.
#[derive(Debug, Default)]
pub struct SourceCounts {
    counts: HashMap<IpAddr, usize>,
}

impl SourceCounts {
    /// Counts one more connection of `ip` unless it has `cap` already.
    pub fn try_add(&mut self, ip: IpAddr, cap: usize) -> bool {
        let count = self.counts.entry(canonical_ip(ip)).or_default();
        if *count >= cap {
            if *count == 0 {
                self.counts.remove(&canonical_ip(ip));
            }
            return false;
        }
        *count += 1;
        true
    }

    pub fn remove(&mut self, ip: IpAddr) {
        let ip = canonical_ip(ip);
        if let Some(count) = self.counts.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&ip);
            }
        }
    }

    pub fn of(&self, ip: IpAddr) -> usize {
        self.counts.get(&canonical_ip(ip)).copied().unwrap_or(0)
    }

    /// Sources with a connection.
    pub fn sources(&self) -> usize {
        self.counts.len()
    }
}

/// What the rate limiter says of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    Allowed,
    /// Its source spent its tokens.
    Limited,
    /// A new source, and the table is full of sources still limited.
    TableFull,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ns: u64,
}

/// A token bucket per source address (`rate` per second, `burst` at most),
/// in a table of at most `capacity` sources. A source's bucket that has
/// refilled is the same as a new one, so it may go: when the table is full,
/// those are swept (at most once per refill time); a new source finding no
/// room is refused and counted, so sources sprayed by a stranger cannot
/// grow the table, nor push out the buckets of those being limited.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    capacity: usize,
    buckets: HashMap<IpAddr, Bucket>,
    next_sweep_ns: u64,
}

impl RateLimiter {
    /// `rate`: tokens per second, above 0; `burst`: at least 1.
    pub fn new(rate: f64, burst: f64, capacity: usize) -> RateLimiter {
        RateLimiter {
            rate,
            burst: burst.max(1.0),
            capacity: capacity.max(1),
            buckets: HashMap::new(),
            next_sweep_ns: 0,
        }
    }

    fn refill_ns(&self) -> u64 {
        (self.burst / self.rate * 1e9) as u64
    }

    pub fn check(&mut self, ip: IpAddr, now_ns: u64) -> Rate {
        let ip = canonical_ip(ip);
        if !self.buckets.contains_key(&ip) && self.buckets.len() >= self.capacity {
            if now_ns < self.next_sweep_ns {
                return Rate::TableFull;
            }
            let refill = self.refill_ns();
            self.buckets
                .retain(|_, b| now_ns.saturating_sub(b.at_ns) < refill);
            self.next_sweep_ns = now_ns.saturating_add(refill.max(1));
            if self.buckets.len() >= self.capacity {
                return Rate::TableFull;
            }
        }
        let (rate, burst) = (self.rate, self.burst);
        let bucket = self.buckets.entry(ip).or_insert(Bucket {
            tokens: burst,
            at_ns: now_ns,
        });
        let elapsed = now_ns.saturating_sub(bucket.at_ns) as f64 / 1e9;
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.at_ns = now_ns.max(bucket.at_ns);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Rate::Allowed
        } else {
            Rate::Limited
        }
    }

    /// Sources in the table.
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }
}

/// Why a message an RC responder received is not a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MalformedProbe {
    /// Shorter than the probe header.
    Short,
    /// The header's magic is not the probe's.
    Magic,
    /// Longer than the responder's receive buffer (the receive failed).
    TooLong,
}

impl MalformedProbe {
    pub const ALL: [MalformedProbe; 3] = [
        MalformedProbe::Short,
        MalformedProbe::Magic,
        MalformedProbe::TooLong,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MalformedProbe::Short => "short",
            MalformedProbe::Magic => "magic",
            MalformedProbe::TooLong => "too_long",
        }
    }
}

/// Whether `message` (what a receive got) is a probe an RC responder echoes.
pub fn check_probe(message: &[u8]) -> Result<(), MalformedProbe> {
    if message.len() < MESSAGE_HEADER {
        return Err(MalformedProbe::Short);
    }
    if message[..8] != MAGIC.to_le_bytes() {
        return Err(MalformedProbe::Magic);
    }
    Ok(())
}

/// Bytes a testing aid sends in place of a probe (`--malformed KIND`): each
/// kind one way a responder must count and drop a message.
pub fn malformed_payload(kind: &str, size: usize, ud_header: &[u8]) -> Option<Vec<u8>> {
    let mut noise = 0x9e37_79b9_7f4a_7c15u64;
    let random = (0..size.max(1))
        .map(|_| {
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            noise as u8
        })
        .collect::<Vec<u8>>();
    let with = |at: usize, byte: u8| {
        let mut v = ud_header.to_vec();
        v.resize(size.max(ud_header.len()), 0);
        if let Some(b) = v.get_mut(at) {
            *b = byte;
        }
        v
    };
    Some(match kind {
        // a UD header cut one byte short; for RC, less than the probe header
        "short" => ud_header[..ud_header.len().saturating_sub(1).min(MESSAGE_HEADER - 1)].to_vec(),
        "magic" => with(0, b'X'),
        "version" => with(4, 0xee),
        "kind" => with(5, 0xee),
        "random" => random,
        // RC only: a probe longer than the responder's receive buffer
        "too_long" => with(MESSAGE_HEADER, 0)
            .into_iter()
            .chain(std::iter::repeat_n(0, crate::MAX_MESSAGE_SIZE + 1))
            .take(crate::MAX_MESSAGE_SIZE + 1)
            .collect(),
        _ => return None,
    })
}

/// The kinds of [`malformed_payload`].
pub const MALFORMED_KINDS: [&str; 6] = ["short", "magic", "version", "kind", "random", "too_long"];

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    fn subnet(s: &str) -> Subnet {
        s.parse().unwrap()
    }

    #[test]
    fn subnets_parse_and_match() {
        let net = subnet("198.18.0.0/24");
        assert!(net.contains(v4(198, 18, 0, 1)));
        assert!(net.contains(v4(198, 18, 0, 255)));
        assert!(!net.contains(v4(198, 18, 1, 1)));
        let host = subnet("198.18.0.5");
        assert_eq!(host.to_string(), "198.18.0.5/32");
        assert!(host.contains(v4(198, 18, 0, 5)));
        assert!(!host.contains(v4(198, 18, 0, 4)));
        assert!(subnet("0.0.0.0/0").contains(v4(1, 2, 3, 4)));
        assert!(!subnet("0.0.0.0/0").contains("fe80::1".parse().unwrap()));
        let v6 = subnet("fe80::/10");
        assert!(v6.contains("fe80::1234".parse().unwrap()));
        assert!(!v6.contains("fec0::1".parse().unwrap()));
        assert!(subnet("::/0").contains("2001:db8::1".parse().unwrap()));
        for bad in [
            "",
            "198.18.0.0/33",
            "198.18.0/24",
            "fe80::/129",
            "x/1",
            "1.2.3.4/-1",
        ] {
            assert!(bad.parse::<Subnet>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ipv4_mapped_addresses_match_ipv4_subnets() {
        // how RoCEv2 over IPv4 writes the source in a GID
        let gid = "::ffff:198.18.0.5".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(gid_source(gid), v4(198, 18, 0, 5));
        assert!(subnet("198.18.0.0/24").contains(IpAddr::V6(Ipv6Addr::from(gid))));
        let mapped = subnet("::ffff:198.18.0.0/120");
        assert_eq!(mapped, subnet("198.18.0.0/24"));
        assert!(mapped.contains(v4(198, 18, 0, 9)));
        let link_local = "fe80::1".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(gid_source(link_local), "fe80::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn allow_list() {
        assert!(AllowList::everyone().allows(v4(8, 8, 8, 8)));
        let list = AllowList::new(vec![subnet("198.18.0.1"), subnet("10.0.0.0/8")]);
        assert!(list.allows(v4(198, 18, 0, 1)));
        assert!(list.allows(v4(10, 200, 0, 1)));
        assert!(!list.allows(v4(198, 18, 0, 5)));
        assert!(list.allows("::ffff:10.1.1.1".parse().unwrap()));
    }

    #[test]
    fn per_source_counts() {
        let mut counts = SourceCounts::default();
        let a = v4(198, 18, 0, 5);
        for _ in 0..3 {
            assert!(counts.try_add(a, 3));
        }
        assert!(!counts.try_add(a, 3));
        assert!(counts.try_add(v4(198, 18, 0, 1), 3), "another source");
        assert!(!counts.try_add("::ffff:198.18.0.5".parse().unwrap(), 3));
        counts.remove(a);
        assert_eq!(counts.of(a), 2);
        assert!(counts.try_add(a, 3));
        for _ in 0..3 {
            counts.remove(a);
        }
        counts.remove(v4(198, 18, 0, 1));
        assert_eq!(counts.sources(), 0, "no empty entries left");
        assert!(!counts.try_add(a, 0));
        assert_eq!(counts.sources(), 0);
    }

    #[test]
    fn token_bucket_per_source() {
        const S: u64 = 1_000_000_000;
        let mut limiter = RateLimiter::new(10.0, 5.0, 16);
        let a = v4(198, 18, 0, 5);
        let b = v4(198, 18, 0, 1);
        let allowed = (0..8).filter(|_| limiter.check(a, S) == Rate::Allowed);
        assert_eq!(allowed.count(), 5, "the burst");
        assert_eq!(limiter.check(a, S), Rate::Limited);
        assert_eq!(limiter.check(b, S), Rate::Allowed, "another source");
        // 10 per second: one more after 100 ms, the burst after 500 ms
        assert_eq!(limiter.check(a, S + S / 10), Rate::Allowed);
        assert_eq!(limiter.check(a, S + S / 10), Rate::Limited);
        let later = (0..8).filter(|_| limiter.check(a, 3 * S) == Rate::Allowed);
        assert_eq!(later.count(), 5, "refilled to the burst, not beyond");
        // a clock going backwards takes nothing
        assert_eq!(limiter.check(b, 0), Rate::Allowed);
    }

    #[test]
    fn rate_table_is_bounded() {
        const S: u64 = 1_000_000_000;
        let mut limiter = RateLimiter::new(10.0, 10.0, 4);
        for i in 0..4 {
            assert_eq!(limiter.check(v4(10, 0, 0, i), S), Rate::Allowed);
        }
        assert_eq!(limiter.check(v4(10, 0, 0, 9), S), Rate::TableFull);
        assert_eq!(limiter.sources(), 4);
        assert_eq!(limiter.check(v4(10, 0, 0, 1), S), Rate::Allowed, "known");
        // within the refill time (1 s) nothing is swept
        assert_eq!(limiter.check(v4(10, 0, 0, 9), S + S / 2), Rate::TableFull);
        // after it, the refilled buckets go and the new source gets one
        assert_eq!(limiter.check(v4(10, 0, 0, 9), 3 * S), Rate::Allowed);
        assert_eq!(limiter.sources(), 1);
    }

    #[test]
    fn probe_messages_are_checked() {
        let mut probe = vec![0u8; 64];
        probe[..8].copy_from_slice(b"QPWPROBE");
        assert_eq!(check_probe(&probe), Ok(()));
        assert_eq!(check_probe(&probe[..16]), Ok(()));
        assert_eq!(check_probe(&probe[..15]), Err(MalformedProbe::Short));
        assert_eq!(check_probe(&[]), Err(MalformedProbe::Short));
        probe[0] = b'X';
        assert_eq!(check_probe(&probe), Err(MalformedProbe::Magic));
        let names: Vec<&str> = MalformedProbe::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names, ["short", "magic", "too_long"]);
    }

    #[test]
    fn malformed_payloads() {
        let header = b"QPWPROBE\x01\0\0\0\0\0\0\0";
        assert_eq!(malformed_payload("short", 64, header).unwrap().len(), 15);
        assert_eq!(
            check_probe(&malformed_payload("magic", 64, header).unwrap()),
            Err(MalformedProbe::Magic)
        );
        assert_eq!(malformed_payload("random", 64, header).unwrap().len(), 64);
        assert!(malformed_payload("nonsense", 64, header).is_none());
        let long = malformed_payload("too_long", 64, header).unwrap();
        assert_eq!(long.len(), 4097);
        assert_eq!(check_probe(&long), Ok(()), "a probe, only too long");
    }
}
