//! The checks of values: the same for the file and for the flags.

use std::{net::SocketAddr, time::Duration};

use super::DEFAULT_PROBE_PORT;

const PAGE_SIZE: u32 = 4096;
const MAX_RING_BUFFER_BYTES: u32 = 1 << 30;

/// `ADDR` or `ADDR:PORT`, IPv4 or `[IPv6]:PORT`; the port defaults to 9723.
pub fn parse_target_address(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, DEFAULT_PROBE_PORT))
        .map_err(|_| format!("{s:?} is not an IP address or ADDR:PORT"))
}

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

pub(super) fn check_ring_buffer(bytes: i64) -> Result<u32, String> {
    match u32::try_from(bytes) {
        Ok(b) if (PAGE_SIZE..=MAX_RING_BUFFER_BYTES).contains(&b) && b.is_power_of_two() => Ok(b),
        _ => Err(format!(
            "{bytes} is not a power of two between {PAGE_SIZE} and {MAX_RING_BUFFER_BYTES}"
        )),
    }
}

pub(super) fn check_seconds(value: f64) -> Result<Duration, String> {
    if value.is_finite() && value > 0.0 && value <= 86_400.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!(
            "{value} is not a positive number of seconds (at most 86400)"
        ))
    }
}

pub(super) fn check_count(value: i64, max: i64) -> Result<usize, String> {
    if (1..=max).contains(&value) {
        Ok(value as usize)
    } else {
        Err(format!("{value} is not between 1 and {max}"))
    }
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
