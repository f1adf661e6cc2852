//! What the daemon runs with, and the defaults.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use rdma_probe::Subnet;

use super::{
    cli::{LogFormat, ProbeModeSetting},
    DEFAULT_FLEET_LISTEN, DEFAULT_LISTEN, DEFAULT_RING_BUFFER_BYTES,
};
use crate::{
    export::http::HttpLimits, export::metrics::Buckets, kernel::hooks::Group,
    kernel::offsets::DEFAULT_BTF_DIR, model::qp::Limits,
};

/// A probe target, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub address: SocketAddr,
    pub source: Option<IpAddr>,
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
    /// The exporter-toolkit web configuration file: TLS, basic auth.
    pub web_config_file: Option<PathBuf>,
    /// `[http]`: the endpoint's limits.
    pub http: HttpLimits,
    pub log_level: String,
    pub log_format: LogFormat,
    pub groups: Vec<Group>,
    pub strict: bool,
    pub reconcile: bool,
    pub bpf_stats: bool,
    pub module_poll_interval: Duration,
    /// `[sysfs_counters]`: how often the kernel's counters are read from sysfs.
    pub sysfs_counters_interval: Duration,
    pub ring_buffer_bytes: u32,
    pub btf_dir: PathBuf,
    pub limits: Limits,
    pub buckets: Buckets,
    pub responder_listen: Option<SocketAddr>,
    /// `[responder]` or `--responder-listen` was given (else fleet mode
    /// defaults the responder to [`DEFAULT_FLEET_LISTEN`]).
    pub responder_configured: bool,
    /// Who may talk to the RC responder (and, `allow`, to the UD one).
    pub responder: ResponderSettings,
    pub targets: Vec<Target>,
    /// `[mesh]`: fleet mode.
    pub mesh: Option<MeshSettings>,
}

/// `[responder]`'s limits on its peers.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponderSettings {
    /// Open RC connections at most.
    pub max_connections: usize,
    /// Open RC connections of one source address at most.
    pub max_per_source: usize,
    /// An RC connection with no probe for this long is closed.
    pub idle_timeout: Duration,
    /// Source subnets both responders answer; empty: every source.
    pub allow: Vec<Subnet>,
}

impl Default for ResponderSettings {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_source: 8,
            idle_timeout: Duration::from_secs(120),
            allow: Vec::new(),
        }
    }
}

/// Fleet mode: the UD probe mesh, its targets and its responder.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshSettings {
    /// The UD responder; `None`: answer no one (`listen = ""`).
    pub listen: Option<SocketAddr>,
    pub interval: Duration,
    pub timeout: Duration,
    /// Prometheus file_sd targets, JSON or YAML by extension.
    pub targets_file: Option<PathBuf>,
    pub targets_file_check: Duration,
    /// file_sd labels carried onto the mesh metrics (fixed at start).
    pub target_labels: Vec<String>,
    pub max_targets: usize,
    /// Local address to probe from.
    pub source: Option<IpAddr>,
    /// The remote peers of live QPs become targets (service-aware probing).
    pub discover: bool,
    /// A discovered target is dropped this long after its last QP closed.
    pub discover_expiry: Duration,
    pub discover_max_targets: usize,
    /// Break each answer's RTT down (network RTT, responder and prober
    /// delays): three more histograms per target, and the probes' send
    /// completions looked up.
    pub rtt_breakdown: bool,
    /// Probes the UD responder answers per second and source at most.
    pub answer_rate_per_source: u32,
}

impl Default for MeshSettings {
    fn default() -> Self {
        Self {
            listen: Some(DEFAULT_FLEET_LISTEN.parse().expect("valid")),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            targets_file: None,
            targets_file_check: Duration::from_secs(5),
            target_labels: Vec::new(),
            max_targets: 2000,
            source: None,
            discover: false,
            discover_expiry: Duration::from_secs(60),
            discover_max_targets: 256,
            rtt_breakdown: true,
            answer_rate_per_source: rdma_probe::mesh::DEFAULT_ANSWER_RATE_PER_SOURCE as u32,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            source: None,
            listen: DEFAULT_LISTEN.parse().expect("valid"),
            web_config_file: None,
            http: HttpLimits::default(),
            log_level: "info".to_owned(),
            log_format: LogFormat::Text,
            groups: Group::DEFAULT.to_vec(),
            strict: false,
            reconcile: true,
            bpf_stats: false,
            module_poll_interval: Duration::from_secs(2),
            sysfs_counters_interval: Duration::from_secs(5),
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            btf_dir: PathBuf::from(DEFAULT_BTF_DIR),
            limits: Limits::default(),
            buckets: Buckets::default(),
            responder_listen: None,
            responder_configured: false,
            responder: ResponderSettings::default(),
            targets: Vec::new(),
            mesh: None,
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
