//! The checks of values other than bounded numbers (those are in
//! [`super::limits`]): the same function for a key of the file and for its
//! flag, so both give the same message.

use std::net::{IpAddr, SocketAddr};

use super::DEFAULT_PROBE_PORT;
use crate::kernel::hooks::Group;

/// `listen`: `ADDR:PORT`.
pub(super) fn check_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| format!("{s:?} is not ADDR:PORT"))
}

/// `ADDR` or `ADDR:PORT`, IPv4 or `[IPv6]:PORT`; the port defaults to 9723.
pub fn parse_target_address(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, DEFAULT_PROBE_PORT))
        .map_err(|_| format!("{s:?} is not an IP address or ADDR:PORT"))
}

/// A target's `source`: an IP address.
pub(super) fn check_source(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("{s:?} is not an IP address"))
}

/// Hook groups by name, at least one.
pub(super) fn check_groups(names: &[String]) -> Result<Vec<Group>, String> {
    if names.is_empty() {
        return Err("needs at least one group".to_owned());
    }
    names
        .iter()
        .map(|name| {
            Group::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
                format!("unknown hook group {name:?} ({})", names.join(", "))
            })
        })
        .collect()
}

/// A target's name, a label value.
pub(super) fn check_target_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{name:?}: use at most 64 of A-Z a-z 0-9 - _ . (it is a label value)"
        ));
    }
    Ok(())
}

/// Histogram bucket bounds: positive seconds, strictly increasing.
pub fn check_buckets(buckets: &[f64]) -> Result<(), String> {
    if buckets.is_empty() {
        return Err("needs at least one bucket".to_owned());
    }
    if buckets.iter().any(|b| !b.is_finite() || *b <= 0.0) {
        return Err("buckets must be positive numbers of seconds".to_owned());
    }
    if buckets.windows(2).any(|w| w[0] >= w[1]) {
        return Err("buckets must be strictly increasing".to_owned());
    }
    Ok(())
}

/// A level name, or `tracing` directives each of the form `target=level`
/// (a bare word would silently be read as a target name).
pub(super) fn check_log_level(level: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let bad = || {
        format!("{level:?} is not a log level (error, warn, info, debug, trace, off) or target=level filter")
    };
    let directives_ok = level.split(',').all(|d| {
        let d = d.trim();
        LEVELS.contains(&d.to_ascii_lowercase().as_str())
            || d.split_once('=').is_some_and(|(target, lvl)| {
                !target.is_empty() && LEVELS.contains(&lvl.to_ascii_lowercase().as_str())
            })
    });
    if !directives_ok {
        return Err(bad());
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map(|_| ())
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_addresses_default_the_port() {
        assert_eq!(
            parse_target_address("198.18.0.1").unwrap(),
            "198.18.0.1:9723".parse().unwrap()
        );
        assert_eq!(
            parse_target_address("[fe80::1]:9").unwrap(),
            "[fe80::1]:9".parse().unwrap()
        );
        assert!(parse_target_address("host:1").is_err());
    }
}
