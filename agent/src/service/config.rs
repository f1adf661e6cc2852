//! Configuration: a TOML file (`/etc/qpwatch/qpwatch.toml` by default) and
//! command-line flags for every key; flags win. Every error is one line that
//! names the key and, for the file, `path:line:column`.

use std::{
    fmt, fs,
    io::Read,
    net::SocketAddr,
    ops::Range,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;

use crate::{
    export::metrics::Buckets, kernel::hooks::Group, kernel::offsets::DEFAULT_BTF_DIR,
    model::qp::Limits,
};

pub const DEFAULT_CONFIG: &str = "/etc/qpwatch/qpwatch.toml";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9721";
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 20;
pub const DEFAULT_PROBE_PORT: u16 = rdma_probe::DEFAULT_PORT;
/// The most that is read of a configuration file: far above any real one
/// (a thousand inline targets take about 150 KB), and a bound on what a
/// wrong path (`/dev/zero`, a log file) can make the agent read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
const PAGE_SIZE: u32 = 4096;
const MAX_RING_BUFFER_BYTES: u32 = 1 << 30;

#[derive(Debug, Parser)]
#[command(
    name = "qpwatch",
    // the version, the git revision and whether the tree had changes not committed
    version = env!("QPWATCH_LONG_VERSION"),
    about = "eBPF observability for RDMA queue pair lifecycles"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: attach the probes and serve /metrics (the default).
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
    /// Install the binary, the systemd unit and an example config.
    Install(InstallArgs),
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
}

fn parse_group(s: &str) -> Result<Group, String> {
    Group::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
        format!("unknown probe group {s:?} ({})", names.join(", "))
    })
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

/// `NAME=ADDR[:PORT]`, a probe target from the command line.
fn parse_cli_target(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=ADDR[:PORT]"))?;
    check_target_name(name)?;
    Ok((name.to_owned(), parse_target_address(addr)?))
}

/// One bucket bound of a `--buckets-*` list (the list is checked whole when
/// the flags are applied).
fn parse_bucket(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("{s:?} is not a number"))
}

/// Flags of `run` and `events`. Each overrides the config file's key of the
/// same name (in the section given in its help).
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// Configuration file [default: /etc/qpwatch/qpwatch.toml, if it exists].
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// `listen`: address of the HTTP endpoint [default: 127.0.0.1:9721].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// `log_level`: error, warn, info, debug, trace, or a tracing filter [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// `log_format` [default: text].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// `probes.groups`: probe groups to attach, comma-separated: qp, cm,
    /// kernel-ulp, ib-cm-tracepoints (pins ib_cm) [default: qp,cm,kernel-ulp].
    #[arg(long, value_delimiter = ',', value_parser = parse_group, value_name = "LIST")]
    pub groups: Option<Vec<Group>>,
    /// `probes.strict`: exit if any hook of an enabled group does not attach.
    #[arg(long)]
    pub strict: bool,
    /// `probes.reconcile = false`: do not adopt QPs and CM ids that exist at start-up.
    #[arg(long)]
    pub no_reconcile: bool,
    /// `probes.bpf_stats`: turn on kernel.bpf_stats_enabled and export BPF run time.
    #[arg(long)]
    pub bpf_stats: bool,
    /// `probes.module_poll_interval_seconds` [default: 2].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub module_poll_interval: Option<f64>,
    /// `probes.ring_buffer_bytes`: a power of two, at least 4096 [default: 1048576].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub ring_buffer_bytes: Option<u32>,
    /// `probes.btf_dir`: where the running kernel's BTF is [default: /sys/kernel/btf].
    #[arg(long, value_name = "DIR")]
    pub btf_dir: Option<PathBuf>,
    /// `limits.max_tracked_qps` [default: 262144].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_tracked_qps: Option<usize>,
    /// `limits.max_device_labels` [default: 64].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_device_labels: Option<usize>,
    /// `limits.max_process_labels` [default: 20].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_process_labels: Option<usize>,
    /// `buckets.call_latency`: comma-separated upper bounds in seconds.
    #[arg(long, value_delimiter = ',', value_parser = parse_bucket, value_name = "LIST")]
    pub buckets_call_latency: Option<Vec<f64>>,
    /// `buckets.dwell`.
    #[arg(long, value_delimiter = ',', value_parser = parse_bucket, value_name = "LIST")]
    pub buckets_dwell: Option<Vec<f64>>,
    /// `buckets.lifetime`.
    #[arg(long, value_delimiter = ',', value_parser = parse_bucket, value_name = "LIST")]
    pub buckets_lifetime: Option<Vec<f64>>,
    /// `buckets.probe_rtt`.
    #[arg(long, value_delimiter = ',', value_parser = parse_bucket, value_name = "LIST")]
    pub buckets_probe_rtt: Option<Vec<f64>>,
    /// `responder.listen`: run the probe responder on ADDR[:PORT].
    #[arg(long, value_parser = parse_target_address, value_name = "ADDR[:PORT]")]
    pub responder_listen: Option<SocketAddr>,
    /// `[[targets]]`: a probe target NAME=ADDR[:PORT] (repeatable; replaces the file's targets).
    #[arg(long = "target", value_parser = parse_cli_target, value_name = "NAME=ADDR[:PORT]")]
    pub targets: Vec<(String, SocketAddr)>,
    /// Defaults for `--target`s: seconds between probes [default: 10].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub probe_interval: Option<f64>,
    /// Defaults for `--target`s: ping-pongs per probe [default: 10].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub probe_pings: Option<u32>,
    /// Defaults for `--target`s: timeout of every step in seconds [default: 2].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub probe_timeout: Option<f64>,
    /// Defaults for `--target`s: oneshot or persistent [default: oneshot].
    #[arg(long, value_enum)]
    pub probe_mode: Option<ProbeModeSetting>,
}

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

/// Where an error is: a file position or a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File {
        path: PathBuf,
        line: usize,
        column: usize,
    },
    FileOnly(PathBuf),
    Flag,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line, column } => write!(f, "{}:{line}:{column}", path.display()),
            Origin::FileOnly(path) => write!(f, "{}", path.display()),
            Origin::Flag => f.write_str("command line"),
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{origin}: {key}: {message}")]
pub struct ConfigError {
    pub origin: Origin,
    /// The key, e.g. `targets[1].interval_seconds`, or `--flag`.
    pub key: String,
    pub message: String,
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

// ---- the file ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<Spanned<String>>,
    log_level: Option<Spanned<String>>,
    log_format: Option<LogFormat>,
    #[serde(default)]
    probes: FileProbes,
    #[serde(default)]
    limits: FileLimits,
    #[serde(default)]
    buckets: FileBuckets,
    responder: Option<FileResponder>,
    #[serde(default)]
    targets: Vec<FileTarget>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProbes {
    groups: Option<Spanned<Vec<String>>>,
    strict: Option<bool>,
    reconcile: Option<bool>,
    bpf_stats: Option<bool>,
    module_poll_interval_seconds: Option<Spanned<f64>>,
    ring_buffer_bytes: Option<Spanned<i64>>,
    btf_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    max_tracked_qps: Option<Spanned<i64>>,
    max_device_labels: Option<Spanned<i64>>,
    max_process_labels: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBuckets {
    call_latency: Option<Spanned<Vec<f64>>>,
    dwell: Option<Spanned<Vec<f64>>>,
    lifetime: Option<Spanned<Vec<f64>>>,
    probe_rtt: Option<Spanned<Vec<f64>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileResponder {
    enabled: Option<bool>,
    listen: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTarget {
    name: Spanned<String>,
    address: Spanned<String>,
    source: Option<Spanned<String>>,
    device: Option<String>,
    interval_seconds: Option<Spanned<f64>>,
    jitter: Option<Spanned<f64>>,
    pings: Option<Spanned<i64>>,
    timeout_seconds: Option<Spanned<f64>>,
    message_size: Option<Spanned<i64>>,
    mode: Option<ProbeModeSetting>,
}

fn check_target_name(name: &str) -> Result<(), String> {
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

fn check_ring_buffer(bytes: i64) -> Result<u32, String> {
    match u32::try_from(bytes) {
        Ok(b) if (PAGE_SIZE..=MAX_RING_BUFFER_BYTES).contains(&b) && b.is_power_of_two() => Ok(b),
        _ => Err(format!(
            "{bytes} is not a power of two between {PAGE_SIZE} and {MAX_RING_BUFFER_BYTES}"
        )),
    }
}

fn check_seconds(value: f64) -> Result<Duration, String> {
    if value.is_finite() && value > 0.0 && value <= 86_400.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!(
            "{value} is not a positive number of seconds (at most 86400)"
        ))
    }
}

fn check_count(value: i64, max: i64) -> Result<usize, String> {
    if (1..=max).contains(&value) {
        Ok(value as usize)
    } else {
        Err(format!("{value} is not between 1 and {max}"))
    }
}

/// A level name, or `tracing` directives each of the form `target=level`
/// (a bare word would silently be read as a target name).
fn check_log_level(level: &str) -> Result<(), String> {
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

struct FileContext<'a> {
    path: &'a Path,
    text: &'a str,
}

impl FileContext<'_> {
    fn error(
        &self,
        key: impl Into<String>,
        span: Option<Range<usize>>,
        message: String,
    ) -> ConfigError {
        let origin = match span {
            Some(span) => {
                let (line, column) = line_column(self.text, span.start);
                Origin::File {
                    path: self.path.to_owned(),
                    line,
                    column,
                }
            }
            None => Origin::FileOnly(self.path.to_owned()),
        };
        ConfigError {
            origin,
            key: key.into(),
            message,
        }
    }

    fn check<T, U>(
        &self,
        key: impl Into<String>,
        value: &Spanned<T>,
        check: impl FnOnce(&T) -> Result<U, String>,
    ) -> Result<U, ConfigError> {
        check(value.get_ref()).map_err(|m| self.error(key, Some(value.span()), m))
    }
}

/// Parses and validates a config file's text.
pub fn parse_file(path: &Path, text: &str) -> Result<Settings, ConfigError> {
    let cx = FileContext { path, text };
    let deserializer = toml::Deserializer::parse(text)
        .map_err(|e| cx.error("(syntax)", e.span(), one_line(e.message())))?;
    let file: FileConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        // toml::Spanned deserialises through a private inner field
        let path = e.path().to_string();
        let key = match path.split(".$__serde_spanned").next().unwrap_or(&path) {
            "." => "(top level)".to_owned(),
            p => p.to_owned(),
        };
        let inner = e.inner();
        cx.error(key, inner.span(), one_line(inner.message()))
    })?;
    let mut s = Settings {
        source: Some(path.to_owned()),
        ..Settings::default()
    };
    if let Some(listen) = &file.listen {
        s.listen = cx.check("listen", listen, |v| {
            v.parse::<SocketAddr>()
                .map_err(|_| format!("{v:?} is not ADDR:PORT"))
        })?;
    }
    if let Some(level) = &file.log_level {
        cx.check("log_level", level, |v| check_log_level(v))?;
        s.log_level = level.get_ref().clone();
    }
    if let Some(format) = file.log_format {
        s.log_format = format;
    }
    let p = &file.probes;
    if let Some(groups) = &p.groups {
        s.groups = cx.check("probes.groups", groups, |names| {
            if names.is_empty() {
                return Err("needs at least one group".to_owned());
            }
            names.iter().map(|n| parse_group(n)).collect()
        })?;
    }
    s.strict = p.strict.unwrap_or(s.strict);
    s.reconcile = p.reconcile.unwrap_or(s.reconcile);
    s.bpf_stats = p.bpf_stats.unwrap_or(s.bpf_stats);
    if let Some(v) = &p.module_poll_interval_seconds {
        s.module_poll_interval = cx.check("probes.module_poll_interval_seconds", v, |v| {
            check_seconds(*v)
        })?;
    }
    if let Some(v) = &p.ring_buffer_bytes {
        s.ring_buffer_bytes = cx.check("probes.ring_buffer_bytes", v, |v| check_ring_buffer(*v))?;
    }
    if let Some(dir) = &p.btf_dir {
        s.btf_dir = dir.clone();
    }
    let l = &file.limits;
    if let Some(v) = &l.max_tracked_qps {
        s.limits.max_tracked_qps =
            cx.check("limits.max_tracked_qps", v, |v| check_count(*v, 1 << 24))?;
    }
    if let Some(v) = &l.max_device_labels {
        s.limits.max_device_labels =
            cx.check("limits.max_device_labels", v, |v| check_count(*v, 4096))?;
    }
    if let Some(v) = &l.max_process_labels {
        s.limits.max_process_labels =
            cx.check("limits.max_process_labels", v, |v| check_count(*v, 4096))?;
    }
    let b = &file.buckets;
    for (key, value, slot) in [
        (
            "buckets.call_latency",
            &b.call_latency,
            &mut s.buckets.call_latency,
        ),
        ("buckets.dwell", &b.dwell, &mut s.buckets.dwell),
        ("buckets.lifetime", &b.lifetime, &mut s.buckets.lifetime),
        ("buckets.probe_rtt", &b.probe_rtt, &mut s.buckets.probe_rtt),
    ] {
        if let Some(v) = value {
            cx.check(key, v, |v| check_buckets(v))?;
            *slot = v.get_ref().clone();
        }
    }
    if let Some(r) = &file.responder {
        let listen = cx.check("responder.listen", &r.listen, |v| parse_target_address(v))?;
        if r.enabled.unwrap_or(true) {
            s.responder_listen = Some(listen);
        }
    }
    let mut names = std::collections::HashSet::new();
    for (i, t) in file.targets.iter().enumerate() {
        let key = |k: &str| format!("targets[{i}].{k}");
        cx.check(key("name"), &t.name, |n| check_target_name(n))?;
        if !names.insert(t.name.get_ref().clone()) {
            return Err(cx.error(
                key("name"),
                Some(t.name.span()),
                format!("{:?} is used by another target", t.name.get_ref()),
            ));
        }
        let defaults = Target::defaults(String::new(), DEFAULT_LISTEN.parse().expect("valid"));
        let target = Target {
            name: t.name.get_ref().clone(),
            address: cx.check(key("address"), &t.address, |v| parse_target_address(v))?,
            source: match &t.source {
                Some(v) => Some(cx.check(key("source"), v, |v| {
                    v.parse().map_err(|_| format!("{v:?} is not an IP address"))
                })?),
                None => None,
            },
            device: t.device.clone(),
            interval: match &t.interval_seconds {
                Some(v) => cx.check(key("interval_seconds"), v, |v| check_seconds(*v))?,
                None => defaults.interval,
            },
            jitter: match &t.jitter {
                Some(v) => cx.check(key("jitter"), v, |v| {
                    if (0.0..1.0).contains(v) {
                        Ok(*v)
                    } else {
                        Err(format!("{v} is not in [0, 1)"))
                    }
                })?,
                None => defaults.jitter,
            },
            pings: match &t.pings {
                Some(v) => cx.check(key("pings"), v, |v| check_count(*v, 100_000))? as u32,
                None => defaults.pings,
            },
            timeout: match &t.timeout_seconds {
                Some(v) => cx.check(key("timeout_seconds"), v, |v| check_seconds(*v))?,
                None => defaults.timeout,
            },
            message_size: match &t.message_size {
                Some(v) => cx.check(key("message_size"), v, |v| {
                    check_count(*v, 4096).and_then(|n| {
                        if n < 16 {
                            Err(format!("{n} is below the 16-byte probe header"))
                        } else {
                            Ok(n)
                        }
                    })
                })?,
                None => defaults.message_size,
            },
            mode: t.mode.unwrap_or(defaults.mode),
        };
        if target.timeout >= target.interval {
            return Err(cx.error(
                key("timeout_seconds"),
                t.timeout_seconds.as_ref().map(Spanned::span),
                format!(
                    "the step timeout ({:?}) must be shorter than the interval ({:?})",
                    target.timeout, target.interval
                ),
            ));
        }
        s.targets.push(target);
    }
    Ok(s)
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Target {
    fn defaults(name: String, address: SocketAddr) -> Self {
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

/// Reads a configuration file, at most [`MAX_CONFIG_BYTES`] of it.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    let error = |message: String| ConfigError {
        origin: Origin::FileOnly(path.to_owned()),
        key: "(file)".to_owned(),
        message,
    };
    let file = fs::File::open(path).map_err(|e| error(format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(error(format!(
            "larger than {} KiB, not a qpwatch configuration",
            MAX_CONFIG_BYTES / 1024
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        error(format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Reads the file named by `--config` (it must exist) or the default one (if
/// it exists), then applies the flags.
pub fn load(args: &RunArgs) -> Result<Settings, ConfigError> {
    let base = match &args.config {
        Some(path) => parse_file(path, &read_file(path)?)?,
        None => {
            let path = Path::new(DEFAULT_CONFIG);
            if path.exists() {
                parse_file(path, &read_file(path)?)?
            } else {
                Settings::default()
            }
        }
    };
    apply_flags(base, args)
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

    /// The default ports and why (README, "Ports"): not those of the
    /// exporters likely to run beside qpwatch on an RDMA host (node_exporter,
    /// ebpf_exporter, DCGM, the NVIDIA GPU, InfiniBand and mlx5 exporters,
    /// process, smartctl, IPMI, systemd, ethtool and Intel PCM exporters,
    /// Prometheus itself), and for the responder, an RDMA CM port, not those of
    /// the RDMA CM services on such hosts either.
    #[test]
    fn default_ports_leave_the_neighbours_alone() {
        let tcp_neighbours = [
            9100, 9435, 9400, 9835, 9683, 9315, 9615, 9256, 9633, 9290, 9558, 9417, 9738, 9090,
            9091, 9093,
        ];
        // NVMe-oF, NFS/RDMA, iSER, SMB Direct, rping, ucmatose/rdma_server,
        // perftest -R, qperf, Lustre o2ib
        let rdma_cm_neighbours = [4420, 20049, 3260, 5445, 7174, 7471, 18515, 19765, 987];
        let http = DEFAULT_LISTEN.parse::<SocketAddr>().unwrap().port();
        assert!(!tcp_neighbours.contains(&http));
        assert!(!tcp_neighbours.contains(&DEFAULT_PROBE_PORT));
        assert!(!rdma_cm_neighbours.contains(&DEFAULT_PROBE_PORT));
        assert_ne!(http, DEFAULT_PROBE_PORT, "one TCP port each on iWARP");
    }

    fn parse(text: &str) -> Result<Settings, ConfigError> {
        parse_file(Path::new("/etc/qpwatch/qpwatch.toml"), text)
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("qpwatch").chain(args.iter().copied()))
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let s = parse("").unwrap();
        assert_eq!(
            s,
            Settings {
                source: Some(PathBuf::from("/etc/qpwatch/qpwatch.toml")),
                ..Settings::default()
            }
        );
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../../packaging/qpwatch.toml");
        let s = parse(text).unwrap();
        assert_eq!(s.listen, "0.0.0.0:9721".parse().unwrap());
        assert!(!s.targets.is_empty());
    }

    #[test]
    fn full_file() {
        let s = parse(
            r#"
listen = "0.0.0.0:9500"
log_format = "json"
[probes]
groups = ["qp", "cm"]
ring_buffer_bytes = 65536
[limits]
max_process_labels = 5
[buckets]
probe_rtt = [1e-6, 1e-3, 1.0]
[responder]
listen = "198.18.0.1"
[[targets]]
name = "self"
address = "198.18.0.1:9723"
interval_seconds = 5
mode = "persistent"
"#,
        )
        .unwrap();
        assert_eq!(s.groups, vec![Group::Qp, Group::Cm]);
        assert_eq!(s.ring_buffer_bytes, 65536);
        assert_eq!(s.limits.max_process_labels, 5);
        assert_eq!(s.buckets.probe_rtt, vec![1e-6, 1e-3, 1.0]);
        assert_eq!(s.responder_listen, Some("198.18.0.1:9723".parse().unwrap()));
        assert_eq!(s.targets[0].interval, Duration::from_secs(5));
        assert_eq!(s.targets[0].mode, ProbeModeSetting::Persistent);
        assert_eq!(s.log_format, LogFormat::Json);
    }

    /// The bad-input table of the closing note: one line, key and file:line.
    #[test]
    fn bad_files_name_key_and_position() {
        let cases: &[(&str, &str)] = &[
            ("lisen = \"x\"", "/etc/qpwatch/qpwatch.toml:1:1: lisen: unknown field `lisen`"),
            ("[probes]\nring_buffer_bytes = \"big\"", ":2:21: probes.ring_buffer_bytes: invalid type: string \"big\""),
            ("listen = \"localhost\"", ":1:10: listen: \"localhost\" is not ADDR:PORT"),
            ("[probes]\nmodule_poll_interval_seconds = -1", ":2:32: probes.module_poll_interval_seconds: -1 is not a positive number"),
            ("[[targets]]\nname = \"\"\naddress = \"198.18.0.1\"", ":2:8: targets[0].name: must not be empty"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\ninterval_seconds = 0", ":4:20: targets[0].interval_seconds: 0 is not a positive number"),
            ("[[targets]]\nname = \"a\"\naddress = \"nowhere\"", ":3:11: targets[0].address: \"nowhere\" is not an IP address"),
            ("[probes]\nring_buffer_bytes = 5000", ":2:21: probes.ring_buffer_bytes: 5000 is not a power of two"),
            ("[probes]\ngroups = [\"qp\", \"rdma\"]", ":2:10: probes.groups: unknown probe group \"rdma\""),
            ("[limits]\nmax_tracked_qps = 0", ":2:19: limits.max_tracked_qps: 0 is not between 1"),
            ("[buckets]\ndwell = [1.0, 0.5]", ":2:9: buckets.dwell: buckets must be strictly increasing"),
            ("log_level = \"loud\"", ":1:13: log_level: \"loud\" is not a log level"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\n[[targets]]\nname = \"a\"\naddress = \"198.18.0.2\"", ":5:8: targets[1].name: \"a\" is used by another target"),
            ("[probes]\nstrict = \"yes\"", ":2:10: probes.strict: invalid type: string \"yes\", expected a boolean"),
            ("listen = ", ":1:10: (syntax):"),
            ("[[targets]]\nname = \"a b\"\naddress = \"198.18.0.1\"", ":2:8: targets[0].name: \"a b\": use at most 64"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\ntimeout_seconds = 20", ":4:19: targets[0].timeout_seconds: the step timeout"),
            ("[responder]\nlisten = \"198.18.0.1:99999\"", ":2:10: responder.listen:"),
            ("log_format = \"yaml\"", ":1:14: log_format: unknown variant `yaml`"),
            ("[[targets]]\naddress = \"198.18.0.1\"", ":1:1: targets[0]: missing field `name`"),
        ];
        for (text, expected) in cases {
            let message = err(text);
            assert!(
                message.contains(expected),
                "for {text:?}\n  got:      {message}\n  expected: …{expected}…"
            );
            assert!(!message.contains('\n'), "one line: {message:?}");
        }
    }

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
    fn missing_explicit_config_is_an_error_default_is_not() {
        let args = cli(&["--config", "/nonexistent/qpwatch.toml"]).unwrap();
        let e = load(&args.run).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/qpwatch.toml: (file): cannot read"),
            "{e}"
        );
        assert_eq!(line_column("a\nbc\nd", 3), (2, 2));
    }
}

/// Property tests of the config file parser (proptest, a bounded number of
/// cases in the normal `cargo test`): any text is parsed or rejected with an
/// error that points into the text, never a panic; generated valid files
/// parse to exactly their values; an out-of-range value is rejected at its
/// own key and line.
#[cfg(test)]
mod prop {
    use proptest::prelude::*;

    use super::*;

    fn parse(text: &str) -> Result<Settings, ConfigError> {
        parse_file(Path::new("/etc/qpwatch/qpwatch.toml"), text)
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 500,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// An error's position lies within the text (line 1..=lines+1, and a
    /// column within that line).
    fn check_origin(text: &str, e: &ConfigError) -> Result<(), TestCaseError> {
        if let Origin::File { line, column, .. } = &e.origin {
            let lines: Vec<&str> = text.split('\n').collect();
            prop_assert!(
                *line >= 1 && *line <= lines.len(),
                "line {} of {}",
                line,
                lines.len()
            );
            prop_assert!(
                *column >= 1 && *column <= lines[*line - 1].len() + 1,
                "column {}",
                column
            );
        }
        Ok(())
    }

    #[derive(Debug, Clone)]
    struct Valid {
        port: u16,
        ring_shift: u32,
        groups: Vec<Group>,
        max_tracked: i64,
        max_devices: i64,
        buckets: Vec<f64>,
        targets: Vec<(String, u16, u32, u32)>,
    }

    fn valid() -> impl Strategy<Value = Valid> {
        (
            1u16..,
            12u32..=30,
            proptest::sample::subsequence(Group::ALL.to_vec(), 1..=Group::ALL.len()),
            1i64..=(1 << 24),
            1i64..=4096,
            proptest::collection::btree_set(1u32..1_000_000, 1..10),
            proptest::collection::btree_map(
                "[a-zA-Z0-9_.-]{1,20}",
                (1u16.., 1u32..100, 1u32..100),
                0..4,
            ),
        )
            .prop_map(
                |(port, ring_shift, groups, max_tracked, max_devices, buckets, targets)| Valid {
                    port,
                    ring_shift,
                    groups,
                    max_tracked,
                    max_devices,
                    buckets: buckets.into_iter().map(|b| f64::from(b) * 1e-6).collect(),
                    targets: targets
                        .into_iter()
                        .map(|(name, (port, timeout, extra))| {
                            (name, port, timeout, timeout + extra)
                        })
                        .collect(),
                },
            )
    }

    fn render(v: &Valid) -> String {
        let groups: Vec<String> = v.groups.iter().map(|g| format!("{:?}", g.name())).collect();
        let buckets: Vec<String> = v.buckets.iter().map(|b| format!("{b:e}")).collect();
        let mut text = format!(
            "listen = \"127.0.0.1:{}\"\n\n[probes]\ngroups = [{}]\nring_buffer_bytes = {}\n\n[limits]\nmax_tracked_qps = {}\nmax_device_labels = {}\n\n[buckets]\ncall_latency = [{}]\n",
            v.port,
            groups.join(", "),
            1u64 << v.ring_shift,
            v.max_tracked,
            v.max_devices,
            buckets.join(", "),
        );
        for (name, port, timeout, interval) in &v.targets {
            text.push_str(&format!(
                "\n[[targets]]\nname = \"{name}\"\naddress = \"198.18.0.1:{port}\"\ntimeout_seconds = {timeout}\ninterval_seconds = {interval}\n"
            ));
        }
        text
    }

    proptest! {
        #![proptest_config(config())]

        /// Arbitrary text (often not TOML at all): no panic; errors point into the text.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            if let Err(e) = parse(&text) {
                check_origin(&text, &e)?;
            }
        }

        /// TOML-looking text built from the real keys and random values.
        #[test]
        fn key_soup_never_panics(lines in proptest::collection::vec(
            (
                prop_oneof![
                    Just("listen"), Just("log_level"), Just("log_format"), Just("[probes]"),
                    Just("groups"), Just("ring_buffer_bytes"), Just("[limits]"), Just("max_tracked_qps"),
                    Just("[buckets]"), Just("dwell"), Just("[[targets]]"), Just("name"), Just("address"),
                    Just("timeout_seconds"), Just("interval_seconds"), Just("jitter"), Just("[responder]"),
                ],
                prop_oneof![
                    Just("= 1".to_owned()), Just("= -1".to_owned()), Just("= 4096".to_owned()),
                    Just("= \"x\"".to_owned()), Just("= [1, 0.5]".to_owned()), Just("= [\"qp\"]".to_owned()),
                    Just("= 1e999".to_owned()), Just("= nan".to_owned()), Just("= \"é€\"".to_owned()),
                    "= \\PC{0,12}".prop_map(|s| s),
                    Just(String::new()),
                ],
            ),
            0..12,
        )) {
            let text: String = lines
                .iter()
                .map(|(k, v)| if k.starts_with('[') { format!("{k}\n") } else { format!("{k} {v}\n") })
                .collect();
            if let Err(e) = parse(&text) {
                check_origin(&text, &e)?;
            }
        }

        /// A generated valid file parses to exactly its values.
        #[test]
        fn valid_files_parse_to_their_values(v in valid()) {
            let text = render(&v);
            let s = match parse(&text) {
                Ok(s) => s,
                Err(e) => return Err(TestCaseError::fail(format!("{e}\n{text}"))),
            };
            prop_assert_eq!(s.listen, SocketAddr::from(([127, 0, 0, 1], v.port)));
            prop_assert_eq!(&s.groups, &v.groups);
            prop_assert_eq!(s.ring_buffer_bytes, 1u32 << v.ring_shift);
            prop_assert_eq!(s.limits.max_tracked_qps as i64, v.max_tracked);
            prop_assert_eq!(s.limits.max_device_labels as i64, v.max_devices);
            prop_assert_eq!(&s.buckets.call_latency, &v.buckets);
            prop_assert_eq!(s.targets.len(), v.targets.len());
            for (t, (name, port, timeout, interval)) in s.targets.iter().zip(&v.targets) {
                prop_assert_eq!(&t.name, name);
                prop_assert_eq!(t.address.port(), *port);
                prop_assert_eq!(t.timeout, Duration::from_secs(u64::from(*timeout)));
                prop_assert_eq!(t.interval, Duration::from_secs(u64::from(*interval)));
            }
        }

        /// Replacing one value by an out-of-range one is rejected at that key and line.
        #[test]
        fn out_of_range_values_are_rejected_at_their_line(
            v in valid(),
            which in 0usize..3,
            bad_ring in prop_oneof![0i64..4096, 4097i64..8191, Just(3 << 20), Just(1i64 << 31)],
            bad_count in prop_oneof![Just(0i64), -1000i64..0, Just((1 << 24) + 1)],
        ) {
            let text = render(&v);
            let (key, line_prefix, replacement) = match which {
                0 => ("probes.ring_buffer_bytes", "ring_buffer_bytes = ", bad_ring.to_string()),
                1 => ("limits.max_tracked_qps", "max_tracked_qps = ", bad_count.to_string()),
                _ => ("listen", "listen = ", "\"127.0.0.1\"".to_owned()),
            };
            let line_no = text.lines().position(|l| l.starts_with(line_prefix)).unwrap() + 1;
            let bad: String = text
                .lines()
                .map(|l| if l.starts_with(line_prefix) { format!("{line_prefix}{replacement}\n") } else { format!("{l}\n") })
                .collect();
            let e = match parse(&bad) {
                Ok(_) => return Err(TestCaseError::fail(format!("accepted:\n{bad}"))),
                Err(e) => e,
            };
            prop_assert_eq!(&e.key, key);
            let is_at_line = matches!(e.origin, Origin::File { line, .. } if line == line_no);
            prop_assert!(is_at_line, "{} not at line {}", e, line_no);
        }

        /// One byte of a valid file changed: parsed or rejected, never a panic,
        /// and whatever parses still satisfies the checks.
        #[test]
        fn mutated_valid_files_never_panic(v in valid(), at in any::<proptest::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = render(&v).into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let Ok(text) = String::from_utf8(bytes) else { return Ok(()) };
            match parse(&text) {
                Ok(s) => {
                    prop_assert!(s.ring_buffer_bytes.is_power_of_two() && s.ring_buffer_bytes >= 4096);
                    prop_assert!(check_buckets(&s.buckets.call_latency).is_ok());
                    prop_assert!(s.limits.max_tracked_qps >= 1 && !s.groups.is_empty());
                }
                Err(e) => check_origin(&text, &e)?,
            }
        }
    }
}
