//! What the daemon runs with, and the defaults.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{
    cli::{LogFormat, ProbeModeSetting},
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
