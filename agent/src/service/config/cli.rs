//! The command line: subcommands and the flags of `run` and `events`, one
//! per configuration key.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use super::rules::parse_target_address;

#[derive(Debug, Parser)]
#[command(
    name = "qpwatch",
    // the version, the git revision and whether the tree had changes not committed
    version = env!("QPWATCH_LONG_VERSION"),
    about = "eBPF observability for RDMA queue pair lifecycles",
    long_about = "eBPF observability for RDMA queue pair lifecycles.\n\n\
        qpwatch attaches kprobes to the kernel's RDMA core (ib_core) and \
        connection manager (rdma_cm), follows every queue pair from creation \
        through its state transitions to destruction, and serves what it saw \
        as Prometheus metrics on /metrics, with /healthz and /readyz. It can \
        also send synthetic RDMA probes to other hosts and answer theirs: RC \
        probes to [[targets]], and in fleet mode ([mesh]) a UD probe mesh.\n\n\
        Without a subcommand it runs the agent (as `qpwatch run`). The \
        configuration file is /etc/qpwatch/qpwatch.toml; every key has the \
        flag listed below, and flags win. SIGHUP re-reads the file; SIGTERM \
        or SIGINT stops the agent."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: attach the hooks and serve /metrics (the default).
    Run(RunArgs),
    /// Stream the decoded lifecycle events to stdout as JSON lines (no HTTP).
    Events(RunArgs),
    /// Validate a configuration file and exit (0: valid, 2: invalid).
    CheckConfig {
        /// The file to check.
        #[arg(
            value_name = "PATH",
            required_unless_present = "config",
            conflicts_with = "config"
        )]
        path: Option<PathBuf>,
        /// The file to check, as the other commands name it.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Run RDMA probes against a target and print an ib_send_lat-like summary
    /// (exit 0: all ok, 3: some failed).
    Probe(ProbeArgs),
    /// Run only the probe responder, until SIGTERM/SIGINT.
    Responder(ResponderArgs),
    /// Install the binary, the systemd unit and an example config into
    /// /usr/local (for tarball users; the Debian package installs its own).
    Install(InstallArgs),
    /// Print a shell completion script to stdout.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (qpwatch.8 and one per subcommand) into DIR.
    Manpages {
        /// Directory to write the pages into (created if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Read a password on stdin (not echoed on a terminal) and print its
    /// bcrypt hash, for basic_auth_users of the web configuration file.
    HashPassword {
        /// bcrypt cost, 4 to 31: each step doubles the time a check takes.
        #[arg(long, default_value_t = 10, value_name = "N")]
        cost: u32,
    },
}

#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Responder address, ADDR[:PORT] (port defaults to 9723).
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = parse_target_address)]
    pub target: SocketAddr,
    /// Probes to run (persistent: rounds on one connection).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub count: u32,
    /// Ping-pongs per probe.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub pings: u32,
    /// Keep one connection up and only ping-pong (steady-state RTT).
    #[arg(long)]
    pub persistent: bool,
    /// Timeout of every step, in seconds.
    #[arg(
        long,
        default_value_t = 2.0,
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub timeout: f64,
    /// Message size in bytes (16..=4096).
    #[arg(long, default_value_t = 64, value_name = "BYTES")]
    pub size: usize,
    /// Busy-poll completions instead of sleeping on the completion channel.
    #[arg(long)]
    pub busy_poll: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Probe the target's UD mesh responder (SIDR-resolved UD QP; --count
    /// probes of --size bytes, --timeout per probe) instead of RC.
    #[arg(long)]
    pub ud: bool,
    /// With --ud: time between two probes, in milliseconds.
    #[arg(long, default_value_t = 10, value_name = "MS")]
    pub interval_ms: u64,
    /// Local address to probe from (it picks the RDMA device).
    #[arg(long, value_name = "ADDR")]
    pub source: Option<std::net::IpAddr>,
    /// Testing aid: send malformed bytes of this kind instead of every probe
    /// (short, magic, version, kind, random; too_long: RC only); the
    /// responder counts and drops them, so every probe fails.
    #[arg(long, hide = true, value_name = "KIND")]
    pub malformed: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ResponderArgs {
    /// Address to listen on, ADDR[:PORT] (port defaults to 9723).
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = parse_target_address)]
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// Root to install into (for packaging).
    #[arg(long, default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeModeSetting {
    /// A new connection per probe: setup and RTT.
    Oneshot,
    /// One connection kept up: steady-state RTT.
    Persistent,
    /// Probed by the UD mesh (fleet mode), at the `[mesh]` interval.
    Ud,
}

/// `NAME=ADDR[:PORT]`, a probe target from the command line (the name and
/// the address are checked with the file's targets' rules when applied).
fn parse_cli_target(s: &str) -> Result<(String, String), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=ADDR[:PORT]"))?;
    Ok((name.to_owned(), addr.to_owned()))
}

/// One bucket bound of a `--buckets-*` list (the list is checked whole when
/// the flags are applied).
fn parse_bucket(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("{s:?} is not a number"))
}

/// Flags of `run` and `events`. Each overrides the config file's key of the
/// same name (in the section given in its help). Values are checked when
/// applied (`apply.rs`), by the file's rules: numbers are taken as
/// `i64`, addresses as text, so that a value out of range gets the same
/// message from a flag as from the file.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// Configuration file [default: /etc/qpwatch/qpwatch.toml, if it exists].
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// `listen`: address of the HTTP endpoint [default: 127.0.0.1:9721].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// `web_config_file`: TLS and basic auth for the HTTP endpoint, in the
    /// Prometheus exporter-toolkit format (its --web.config.file) [default: none].
    #[arg(long, value_name = "PATH")]
    pub web_config_file: Option<String>,
    /// `http.max_connections`: HTTP connections open at once [default: 64].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub http_max_connections: Option<i64>,
    /// `http.max_connections_per_source`: of those, from one IPv4 address or IPv6 /64 [default: 8].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub http_max_connections_per_source: Option<i64>,
    /// `http.header_timeout_seconds`: a request header must arrive whole within this of its first byte [default: 10].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub http_header_timeout: Option<f64>,
    /// `http.idle_timeout_seconds`: a connection with no request under way is closed after this [default: 120].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub http_idle_timeout: Option<f64>,
    /// `http.tls_handshake_timeout_seconds` [default: 10].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub http_tls_handshake_timeout: Option<f64>,
    /// `http.max_header_bytes`: the largest request header, 8192 to 1048576 [default: 16384].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub http_max_header_bytes: Option<i64>,
    /// `log_level`: error, warn, info, debug, trace, or a tracing filter [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// `log_format` [default: text].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// `hooks.groups`: hook groups to attach, comma-separated: qp, cm,
    /// kernel-ulp, qp-async-events, rxe-qp-errors, ib-cm-tracepoints (pins
    /// ib_cm) [default: qp,cm,kernel-ulp,qp-async-events,rxe-qp-errors].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub groups: Option<Vec<String>>,
    /// `hooks.strict`: exit if any hook of an enabled group does not attach.
    #[arg(long)]
    pub strict: bool,
    /// `hooks.reconcile = false`: do not adopt QPs and CM ids that exist at start-up.
    #[arg(long)]
    pub no_reconcile: bool,
    /// `hooks.bpf_stats`: turn on kernel.bpf_stats_enabled and export BPF run time.
    #[arg(long)]
    pub bpf_stats: bool,
    /// `hooks.module_poll_interval_seconds` [default: 2].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub module_poll_interval: Option<f64>,
    /// `sysfs_counters.interval_seconds`: how often the kernel's RDMA counters are read from sysfs [default: 5].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub sysfs_counters_interval: Option<f64>,
    /// `hooks.ring_buffer_bytes`: a power of two, 4096 to 1073741824 [default: 1048576].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub ring_buffer_bytes: Option<i64>,
    /// `hooks.btf_dir`: where the running kernel's BTF is [default: /sys/kernel/btf].
    #[arg(long, value_name = "DIR")]
    pub btf_dir: Option<PathBuf>,
    /// `limits.max_tracked_qps` [default: 262144].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_tracked_qps: Option<i64>,
    /// `limits.max_device_labels` [default: 64].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_device_labels: Option<i64>,
    /// `limits.max_process_labels` [default: 20].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_process_labels: Option<i64>,
    /// `limits.max_peer_labels` [default: 64].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_peer_labels: Option<i64>,
    /// `limits.max_cgroup_labels` [default: 64].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_cgroup_labels: Option<i64>,
    /// `buckets.call_latency`: comma-separated upper bounds in seconds.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_bucket,
        value_name = "LIST",
        allow_negative_numbers = true
    )]
    pub buckets_call_latency: Option<Vec<f64>>,
    /// `buckets.dwell`.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_bucket,
        value_name = "LIST",
        allow_negative_numbers = true
    )]
    pub buckets_dwell: Option<Vec<f64>>,
    /// `buckets.lifetime`.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_bucket,
        value_name = "LIST",
        allow_negative_numbers = true
    )]
    pub buckets_lifetime: Option<Vec<f64>>,
    /// `buckets.probe_rtt`.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_bucket,
        value_name = "LIST",
        allow_negative_numbers = true
    )]
    pub buckets_probe_rtt: Option<Vec<f64>>,
    /// `responder.listen`: run the probe responder on ADDR[:PORT].
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub responder_listen: Option<String>,
    /// `responder.max_connections`: RC connections open at most [default: 256].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub responder_max_connections: Option<i64>,
    /// `responder.max_connections_per_source`: RC connections of one source address at most [default: 8].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub responder_max_connections_per_source: Option<i64>,
    /// `responder.idle_timeout_seconds`: an RC connection with no probe this long is closed [default: 120].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub responder_idle_timeout: Option<f64>,
    /// `responder.allow`: source subnets (ADDR/PREFIX or ADDR, comma-separated) the RC and UD responders answer [default: every source].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub responder_allow: Option<Vec<String>>,
    /// `[[targets]]`: a probe target NAME=ADDR[:PORT] (repeatable; replaces the file's targets).
    #[arg(long = "target", value_parser = parse_cli_target, value_name = "NAME=ADDR[:PORT]")]
    pub targets: Vec<(String, String)>,
    /// Defaults for `--target`s: seconds between probes [default: 10].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub probe_interval: Option<f64>,
    /// Defaults for `--target`s: ping-pongs per probe [default: 10].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub probe_pings: Option<i64>,
    /// Defaults for `--target`s: timeout of every step in seconds [default: 2].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub probe_timeout: Option<f64>,
    /// Defaults for `--target`s: oneshot, persistent or ud [default: oneshot].
    #[arg(long, value_enum)]
    pub probe_mode: Option<ProbeModeSetting>,
    /// `[mesh]`: fleet mode, the UD probe mesh (any `--mesh-*` flag turns it on too).
    #[arg(long)]
    pub mesh: bool,
    /// `mesh.listen`: the UD responder, ADDR[:PORT], "" for none [default: 0.0.0.0:9723].
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub mesh_listen: Option<String>,
    /// `mesh.interval_seconds`: between two probes to a target [default: 1].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub mesh_interval: Option<f64>,
    /// `mesh.timeout_seconds`: a probe not answered within this is lost [default: 1].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub mesh_timeout: Option<f64>,
    /// `mesh.targets_file`: Prometheus file_sd targets (.json, .yml or .yaml).
    #[arg(long, value_name = "PATH")]
    pub mesh_targets_file: Option<String>,
    /// `mesh.targets_file_check_seconds`: how often the targets file is checked [default: 5].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub mesh_targets_file_check: Option<f64>,
    /// `mesh.target_labels`: a file_sd label carried onto the mesh metrics (repeatable).
    #[arg(long = "mesh-target-label", value_name = "NAME")]
    pub mesh_target_labels: Vec<String>,
    /// `mesh.max_targets`: targets probed at most; the rest are refused [default: 2000].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub mesh_max_targets: Option<i64>,
    /// `mesh.source`: the local address to probe from [default: routing decides].
    #[arg(long, value_name = "ADDR")]
    pub mesh_source: Option<String>,
    /// `mesh.discover`: probe the remote peers of the host's live QPs too.
    #[arg(long)]
    pub mesh_discover: bool,
    /// `mesh.discover_expiry_seconds`: a discovered target is dropped this long after its last QP [default: 60].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub mesh_discover_expiry: Option<f64>,
    /// `mesh.discover_max_targets`: discovered targets at most; the rest are counted [default: 256].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub mesh_discover_max_targets: Option<i64>,
    /// `mesh.rtt_breakdown`: network RTT, responder and prober delay histograms [default: true].
    #[arg(long, value_name = "BOOL")]
    pub mesh_rtt_breakdown: Option<bool>,
    /// `mesh.answer_rate_per_source`: probes the UD responder answers per second and source [default: 200].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub mesh_answer_rate_per_source: Option<i64>,
}
