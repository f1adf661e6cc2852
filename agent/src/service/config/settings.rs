//! What the daemon runs with, and the flags applied over it.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{
    cli::{LogFormat, ProbeModeSetting, RunArgs},
    error::{ConfigError, Origin},
    rules::{check_buckets, check_count, check_log_level, check_ring_buffer, check_seconds},
    DEFAULT_LISTEN, DEFAULT_RING_BUFFER_BYTES,
};
use crate::{
    export::metrics::Buckets, kernel::hooks::Group, kernel::offsets::DEFAULT_BTF_DIR,
    model::qp::Limits,
};

/// A probe target, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub address: SocketAddr,
    pub source: Option<std::net::IpAddr>,
    pub device: Option<String>,
    pub interval: Duration,
    /// Fraction of the interval by which each wait is randomly shortened or lengthened.
    pub jitter: f64,
    pub pings: u32,
    pub timeout: Duration,
    pub message_size: usize,
    pub mode: ProbeModeSetting,
}

/// Everything the daemon runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The file the settings came from, if any.
    pub source: Option<PathBuf>,
    pub listen: SocketAddr,
    pub log_level: String,
    pub log_format: LogFormat,
    pub groups: Vec<Group>,
    pub strict: bool,
    pub reconcile: bool,
    pub bpf_stats: bool,
    pub module_poll_interval: Duration,
    pub ring_buffer_bytes: u32,
    pub btf_dir: PathBuf,
    pub limits: Limits,
    pub buckets: Buckets,
    pub responder_listen: Option<SocketAddr>,
    pub targets: Vec<Target>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            source: None,
            listen: DEFAULT_LISTEN.parse().expect("valid"),
            log_level: "info".to_owned(),
            log_format: LogFormat::Text,
            groups: Group::DEFAULT.to_vec(),
            strict: false,
            reconcile: true,
            bpf_stats: false,
            module_poll_interval: Duration::from_secs(2),
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            btf_dir: PathBuf::from(DEFAULT_BTF_DIR),
            limits: Limits::default(),
            buckets: Buckets::default(),
            responder_listen: None,
            targets: Vec::new(),
        }
    }
}

impl Target {
    pub(super) fn defaults(name: String, address: SocketAddr) -> Self {
        Target {
            name,
            address,
            source: None,
            device: None,
            interval: Duration::from_secs(10),
            jitter: 0.1,
            pings: 10,
            timeout: Duration::from_secs(2),
            message_size: 64,
            mode: ProbeModeSetting::Oneshot,
        }
    }
}

fn flag_error(flag: &str, message: String) -> ConfigError {
    ConfigError {
        origin: Origin::Flag,
        key: flag.to_owned(),
        message,
    }
}

/// Flags win over the file.
pub fn apply_flags(mut s: Settings, a: &RunArgs) -> Result<Settings, ConfigError> {
    if let Some(v) = a.listen {
        s.listen = v;
    }
    if let Some(v) = &a.log_level {
        check_log_level(v).map_err(|m| flag_error("--log-level", m))?;
        s.log_level = v.clone();
    }
    if let Some(v) = a.log_format {
        s.log_format = v;
    }
    if let Some(v) = &a.groups {
        if v.is_empty() {
            return Err(flag_error("--groups", "needs at least one group".into()));
        }
        s.groups = v.clone();
    }
    s.strict |= a.strict;
    if a.no_reconcile {
        s.reconcile = false;
    }
    s.bpf_stats |= a.bpf_stats;
    if let Some(v) = a.module_poll_interval {
        s.module_poll_interval =
            check_seconds(v).map_err(|m| flag_error("--module-poll-interval", m))?;
    }
    if let Some(v) = a.ring_buffer_bytes {
        s.ring_buffer_bytes =
            check_ring_buffer(i64::from(v)).map_err(|m| flag_error("--ring-buffer-bytes", m))?;
    }
    if let Some(v) = &a.btf_dir {
        s.btf_dir = v.clone();
    }
    for (flag, value, slot, max) in [
        (
            "--max-tracked-qps",
            a.max_tracked_qps,
            &mut s.limits.max_tracked_qps,
            1 << 24,
        ),
        (
            "--max-device-labels",
            a.max_device_labels,
            &mut s.limits.max_device_labels,
            4096,
        ),
        (
            "--max-process-labels",
            a.max_process_labels,
            &mut s.limits.max_process_labels,
            4096,
        ),
    ] {
        if let Some(v) = value {
            *slot = check_count(v as i64, max).map_err(|m| flag_error(flag, m))?;
        }
    }
    for (flag, value, slot) in [
        (
            "--buckets-call-latency",
            &a.buckets_call_latency,
            &mut s.buckets.call_latency,
        ),
        ("--buckets-dwell", &a.buckets_dwell, &mut s.buckets.dwell),
        (
            "--buckets-lifetime",
            &a.buckets_lifetime,
            &mut s.buckets.lifetime,
        ),
        (
            "--buckets-probe-rtt",
            &a.buckets_probe_rtt,
            &mut s.buckets.probe_rtt,
        ),
    ] {
        if let Some(v) = value {
            check_buckets(v).map_err(|m| flag_error(flag, m))?;
            slot.clone_from(v);
        }
    }
    if let Some(v) = a.responder_listen {
        s.responder_listen = Some(v);
    }
    if !a.targets.is_empty() {
        let mut names = std::collections::HashSet::new();
        s.targets.clear();
        for (name, address) in &a.targets {
            if !names.insert(name) {
                return Err(flag_error("--target", format!("{name:?} given twice")));
            }
            let mut t = Target::defaults(name.clone(), *address);
            if let Some(v) = a.probe_interval {
                t.interval = check_seconds(v).map_err(|m| flag_error("--probe-interval", m))?;
            }
            if let Some(v) = a.probe_pings {
                t.pings = check_count(i64::from(v), 100_000)
                    .map_err(|m| flag_error("--probe-pings", m))? as u32;
            }
            if let Some(v) = a.probe_timeout {
                t.timeout = check_seconds(v).map_err(|m| flag_error("--probe-timeout", m))?;
            }
            if let Some(v) = a.probe_mode {
                t.mode = v;
            }
            if t.timeout >= t.interval {
                return Err(flag_error(
                    "--probe-timeout",
                    "the step timeout must be shorter than --probe-interval".into(),
                ));
            }
            s.targets.push(t);
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::config::test_support::{cli, parse};

    #[test]
    fn flags_win_over_the_file() {
        let file = parse("listen = \"0.0.0.0:9500\"\n[limits]\nmax_process_labels = 5").unwrap();
        let args = cli(&["--listen", "127.0.0.1:9600", "--max-process-labels", "7"]).unwrap();
        let s = apply_flags(file, &args.run).unwrap();
        assert_eq!(s.listen, "127.0.0.1:9600".parse().unwrap());
        assert_eq!(s.limits.max_process_labels, 7);
    }

    #[test]
    fn bad_flags() {
        assert!(cli(&["--listen", "nonsense"]).is_err());
        assert!(cli(&["--ring-buffer-bytes", "-1"]).is_err());
        assert!(cli(&["--groups", "qp,bogus"]).is_err());
        assert!(cli(&["--target", "noequals"]).is_err());
        assert!(cli(&["--target", "=198.18.0.1"]).is_err());
        assert!(cli(&["--buckets-dwell", "1,x"]).is_err());
        let args = cli(&["--buckets-dwell", "2,1"]).unwrap();
        let e = apply_flags(Settings::default(), &args.run).unwrap_err();
        assert_eq!(
            e.to_string(),
            "command line: --buckets-dwell: buckets must be strictly increasing"
        );
        let args = cli(&["--ring-buffer-bytes", "5000"]).unwrap();
        let e = apply_flags(Settings::default(), &args.run).unwrap_err();
        assert_eq!(e.to_string(), "command line: --ring-buffer-bytes: 5000 is not a power of two between 4096 and 1073741824");
        let args = cli(&["--module-poll-interval", "-3"]).unwrap();
        assert!(apply_flags(Settings::default(), &args.run).is_err());
        let args = cli(&["--target", "a=198.18.0.1", "--target", "a=198.18.0.2"]).unwrap();
        assert!(apply_flags(Settings::default(), &args.run).is_err());
    }

    /// Every `--buckets-*` flag takes a comma-separated list (clap once
    /// panicked on any valid one: the parser returned the whole list where
    /// clap expected one value of it).
    #[test]
    fn bucket_flags_take_lists() {
        let args = cli(&[
            "--buckets-call-latency",
            "0.001,0.01",
            "--buckets-dwell",
            "1, 2,3",
            "--buckets-lifetime",
            "5",
            "--buckets-probe-rtt",
            "1e-6,1e-3",
        ])
        .unwrap();
        let s = apply_flags(Settings::default(), &args.run).unwrap();
        assert_eq!(s.buckets.call_latency, vec![0.001, 0.01]);
        assert_eq!(s.buckets.dwell, vec![1.0, 2.0, 3.0]);
        assert_eq!(s.buckets.lifetime, vec![5.0]);
        assert_eq!(s.buckets.probe_rtt, vec![1e-6, 1e-3]);
    }
}
