//! The checks of values other than bounded numbers (those are in
//! [`super::limits`]): the same function for a key of the file and for its
//! flag, so both give the same message.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

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

/// The most subnets `responder.allow` may list.
pub const MAX_ALLOW_SUBNETS: usize = 1024;

/// `responder.allow`: source subnets, `ADDR/PREFIX` or `ADDR`, at least one
/// (leave the key out to answer every source).
pub(super) fn check_allow(list: &[String]) -> Result<Vec<rdma_probe::Subnet>, String> {
    if list.is_empty() {
        return Err(
            "an empty list would answer no one: leave it out to answer every source".to_owned(),
        );
    }
    if list.len() > MAX_ALLOW_SUBNETS {
        return Err(format!(
            "{} subnets: at most {MAX_ALLOW_SUBNETS}",
            list.len()
        ));
    }
    list.iter().map(|s| s.trim().parse()).collect()
}

/// `mesh.listen`: `ADDR[:PORT]`, or `""` for no UD responder.
pub(super) fn check_mesh_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    parse_target_address(s).map(Some)
}

/// The most target labels `mesh.target_labels` may name.
pub const MAX_TARGET_LABELS: usize = 8;

/// `mesh.target_labels`: Prometheus label names, not `target` (every mesh
/// metric has it), none reserved (`__*`), no duplicates.
pub(super) fn check_target_labels(names: &[String]) -> Result<Vec<String>, String> {
    if names.len() > MAX_TARGET_LABELS {
        return Err(format!(
            "{} labels: at most {MAX_TARGET_LABELS}",
            names.len()
        ));
    }
    for (i, name) in names.iter().enumerate() {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"
            ));
        }
        if name.starts_with("__") {
            return Err(format!("{name:?}: names starting with __ are reserved"));
        }
        if name == "target" {
            return Err("\"target\" is every mesh metric's own label".to_owned());
        }
        if name == "clock" {
            return Err("\"clock\" is a label of the mesh's RTT breakdown".to_owned());
        }
        if name == "le" {
            return Err("\"le\" is the histograms' bucket label".to_owned());
        }
        if names[..i].contains(name) {
            return Err(format!("{name:?} is named twice"));
        }
    }
    Ok(names.to_vec())
}

/// `mesh.targets_file`: a path whose extension tells the format.
pub(super) fn check_targets_file(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    let path = PathBuf::from(s);
    if crate::service::targets_file::Format::of(&path).is_none() {
        return Err(format!(
            "{s:?}: the extension tells the format: .json, .yml or .yaml"
        ));
    }
    Ok(path)
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
    crate::service::logging::filter(level)
        .map(|_| ())
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_are_levels_or_target_directives() {
        for good in [
            "info",
            "DEBUG",
            "off",
            "qpwatch=debug",
            "qpwatch=debug, warn",
        ] {
            assert_eq!(check_log_level(good), Ok(()), "{good}");
            crate::service::logging::filter(good).unwrap();
        }
        for bad in ["loud", "qpwatch", "qpwatch=loud", "=info"] {
            assert!(check_log_level(bad).is_err(), "{bad}");
        }
    }

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

    #[test]
    fn target_labels() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_target_labels(&names(&["rack", "tor", "_x1"])).is_ok());
        for (bad, message) in [
            (names(&["1rack"]), "is not a label name"),
            (names(&["ra-ck"]), "is not a label name"),
            (names(&[""]), "is not a label name"),
            (names(&["__meta"]), "reserved"),
            (names(&["target"]), "own label"),
            (names(&["rack", "clock"]), "RTT breakdown"),
            (names(&["le"]), "bucket label"),
            (names(&["rack", "rack"]), "named twice"),
            (
                names(&["a", "b", "c", "d", "e", "f", "g", "h", "i"]),
                "at most 8",
            ),
        ] {
            let e = check_target_labels(&bad).unwrap_err();
            assert!(e.contains(message), "{bad:?}: {e}");
        }
    }

    #[test]
    fn targets_file_extension() {
        assert!(check_targets_file("/etc/qpwatch/targets.json").is_ok());
        assert!(check_targets_file("t.YAML").is_ok());
        assert!(check_targets_file("t.yml").is_ok());
        assert!(check_targets_file("t.txt")
            .unwrap_err()
            .contains(".json, .yml or .yaml"));
        assert!(check_targets_file("").is_err());
        assert_eq!(check_mesh_listen(""), Ok(None));
    }
}
