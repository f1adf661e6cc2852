//! `IP[:PORT]` addresses for targets and listeners.

use std::net::{IpAddr, SocketAddr};

use crate::error::Error;

/// rdma_cm port (RDMA_PS_TCP space) of the probe responder when none is given.
pub const DEFAULT_PORT: u16 = 9723;

/// Parses `198.18.0.1`, `198.18.0.1:7471`, `fe80::1`, `[fe80::1]` or
/// `[fe80::1]:7471`; a missing port is `default_port`. Host names are not
/// accepted: rdma_cm resolves IP addresses only.
pub fn parse_endpoint(input: &str, default_port: u16) -> Result<SocketAddr, Error> {
    let invalid = |reason| Error::InvalidAddress {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(invalid("empty"));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(ip) => Ok(SocketAddr::new(IpAddr::V6(ip), default_port)),
            Err(_) => Err(invalid("not an IPv6 address inside [...]")),
        };
    }
    match s.rsplit_once(':') {
        Some((host, port)) if host.parse::<IpAddr>().is_ok() || host.starts_with('[') => {
            if port.parse::<u16>().is_err() {
                Err(invalid("port is not a number in 0..=65535"))
            } else {
                Err(invalid("not IP:PORT"))
            }
        }
        _ => Err(invalid("not an IP address (host names are not resolved)")),
    }
}

/// A probe target: like [`parse_endpoint`], and the port must not be 0.
pub fn parse_target(input: &str) -> Result<SocketAddr, Error> {
    let addr = parse_endpoint(input, DEFAULT_PORT)?;
    if addr.port() == 0 {
        return Err(Error::InvalidAddress {
            input: input.to_string(),
            reason: "port 0 is not a destination",
        });
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        parse_target(s).unwrap().to_string()
    }

    fn err(s: &str) -> String {
        parse_target(s).unwrap_err().to_string()
    }

    #[test]
    fn accepts_ip_with_and_without_port() {
        assert_eq!(ok("198.18.0.1"), "198.18.0.1:9723");
        assert_eq!(ok("198.18.0.1:7471"), "198.18.0.1:7471");
        assert_eq!(ok(" 198.18.0.1:1 "), "198.18.0.1:1");
        assert_eq!(ok("fe80::1"), "[fe80::1]:9723");
        assert_eq!(ok("[fe80::1]"), "[fe80::1]:9723");
        assert_eq!(ok("[fe80::1]:7471"), "[fe80::1]:7471");
        assert_eq!(
            parse_endpoint("0.0.0.0:0", DEFAULT_PORT)
                .unwrap()
                .to_string(),
            "0.0.0.0:0"
        );
    }

    #[test]
    fn rejects_everything_else() {
        assert!(err("").contains("empty"));
        assert!(err("rdma-host:7471").contains("host names"));
        assert!(err("rdma-host").contains("host names"));
        assert!(err("198.18.0.1:99999").contains("port is not a number"));
        assert!(err("198.18.0.1:x").contains("port is not a number"));
        assert!(err("[zz::1]").contains("IPv6"));
        assert!(err("198.18.0.1:0").contains("port 0"));
        assert!(err("198.18.0.256").contains("not an IP"));
    }
}
