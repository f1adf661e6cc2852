//! The configuration file: TOML, read up to a bound, every value placed at
//! its `path:line:column` and key for [`super::apply`], which checks it.

use std::{
    fs,
    io::Read,
    ops::Range,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use toml::Spanned;

use super::{
    apply::{Given, Input, MeshInput, TargetInput},
    cli::{LogFormat, ProbeModeSetting},
    error::{ConfigError, Origin},
    limits::{
        Limit, HTTP_HEADER_TIMEOUT, HTTP_IDLE_TIMEOUT, HTTP_MAX_CONNECTIONS,
        HTTP_MAX_CONNECTIONS_PER_SOURCE, HTTP_MAX_HEADER_BYTES, HTTP_TLS_HANDSHAKE_TIMEOUT,
        MAX_CGROUP_LABELS, MAX_DEVICE_LABELS, MAX_PEER_LABELS, MAX_PROCESS_LABELS, MAX_TRACKED_QPS,
        MESH_ANSWER_RATE, MESH_DISCOVER_EXPIRY, MESH_DISCOVER_MAX_TARGETS, MESH_INTERVAL,
        MESH_MAX_TARGETS, MESH_TARGETS_FILE_CHECK, MESH_TIMEOUT, MODULE_POLL_INTERVAL,
        RESPONDER_IDLE_TIMEOUT, RESPONDER_MAX_CONNECTIONS, RESPONDER_MAX_PER_SOURCE,
        RING_BUFFER_BYTES, SYSFS_COUNTERS_INTERVAL, TARGET_INTERVAL, TARGET_JITTER,
        TARGET_MESSAGE_SIZE, TARGET_PINGS, TARGET_TIMEOUT,
    },
    settings::Settings,
};

/// The most that is read of a configuration file: far above any real one
/// (a thousand inline targets take about 150 KB), and a bound on what a
/// wrong path (`/dev/zero`, a log file) can make the agent read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Sections renamed before any release, with no alias: the old name is
/// refused with an error that names the new one.
const RENAMED_SECTIONS: [(&str, &str); 1] = [
    // a hook is a kernel attachment point; a probe is a synthetic RDMA probe
    ("probes", "hooks"),
];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<Spanned<String>>,
    web_config_file: Option<Spanned<String>>,
    #[serde(default)]
    http: FileHttp,
    log_level: Option<Spanned<String>>,
    log_format: Option<LogFormat>,
    #[serde(default)]
    hooks: FileHooks,
    #[serde(default)]
    limits: FileLimits,
    #[serde(default)]
    sysfs_counters: FileSysfsCounters,
    #[serde(default)]
    buckets: FileBuckets,
    responder: Option<FileResponder>,
    #[serde(default)]
    targets: Vec<FileTarget>,
    mesh: Option<FileMesh>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMesh {
    listen: Option<Spanned<String>>,
    interval_seconds: Option<Spanned<f64>>,
    timeout_seconds: Option<Spanned<f64>>,
    targets_file: Option<Spanned<String>>,
    targets_file_check_seconds: Option<Spanned<f64>>,
    target_labels: Option<Spanned<Vec<String>>>,
    max_targets: Option<Spanned<i64>>,
    source: Option<Spanned<String>>,
    discover: Option<bool>,
    discover_expiry_seconds: Option<Spanned<f64>>,
    discover_max_targets: Option<Spanned<i64>>,
    rtt_breakdown: Option<bool>,
    answer_rate_per_source: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHttp {
    max_connections: Option<Spanned<i64>>,
    max_connections_per_source: Option<Spanned<i64>>,
    header_timeout_seconds: Option<Spanned<f64>>,
    idle_timeout_seconds: Option<Spanned<f64>>,
    tls_handshake_timeout_seconds: Option<Spanned<f64>>,
    max_header_bytes: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHooks {
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
struct FileSysfsCounters {
    interval_seconds: Option<Spanned<f64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    max_tracked_qps: Option<Spanned<i64>>,
    max_device_labels: Option<Spanned<i64>>,
    max_process_labels: Option<Spanned<i64>>,
    max_peer_labels: Option<Spanned<i64>>,
    max_cgroup_labels: Option<Spanned<i64>>,
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
    listen: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    max_connections_per_source: Option<Spanned<i64>>,
    idle_timeout_seconds: Option<Spanned<f64>>,
    allow: Option<Spanned<Vec<String>>>,
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
    mode: Option<Spanned<ProbeModeSetting>>,
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

struct FileContext<'a> {
    path: &'a Path,
    text: &'a str,
}

impl FileContext<'_> {
    fn origin(&self, span: Option<Range<usize>>) -> Origin {
        match span {
            Some(span) => {
                let (line, column) = line_column(self.text, span.start);
                Origin::File {
                    path: self.path.to_owned(),
                    line,
                    column,
                }
            }
            None => Origin::FileOnly(self.path.to_owned()),
        }
    }

    fn error(
        &self,
        key: impl Into<String>,
        span: Option<Range<usize>>,
        message: String,
    ) -> ConfigError {
        ConfigError {
            origin: self.origin(span),
            key: key.into(),
            message,
        }
    }

    /// A value at its key and position.
    fn given<T: Clone>(&self, key: impl Into<String>, value: &Spanned<T>) -> Given<T> {
        Given {
            value: value.get_ref().clone(),
            origin: self.origin(Some(value.span())),
            key: key.into(),
        }
    }

    fn given_opt<T: Clone>(
        &self,
        key: impl Into<String>,
        value: &Option<Spanned<T>>,
    ) -> Option<Given<T>> {
        value.as_ref().map(|v| self.given(key, v))
    }

    /// A bounded number, named by its row of the limits table.
    fn limited<T: Clone>(
        &self,
        limit: &Limit,
        target: Option<usize>,
        value: &Option<Spanned<T>>,
    ) -> Option<Given<T>> {
        self.given_opt(limit.file_key(target), value)
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
        let message = match RENAMED_SECTIONS.iter().find(|(old, _)| *old == key) {
            Some((old, new)) => format!("`[{old}]` was renamed `[{new}]`"),
            None => one_line(inner.message()),
        };
        cx.error(key, inner.span(), message)
    })?;
    let settings = Settings {
        source: Some(path.to_owned()),
        ..Settings::default()
    };
    file.input(&cx).apply(settings)
}

impl FileConfig {
    /// Every value with its key and position.
    fn input(&self, cx: &FileContext) -> Input {
        let h = &self.hooks;
        let l = &self.limits;
        let b = &self.buckets;
        let w = &self.http;
        Input {
            listen: cx.given_opt("listen", &self.listen),
            web_config_file: cx.given_opt("web_config_file", &self.web_config_file),
            http_max_connections: cx.limited(&HTTP_MAX_CONNECTIONS, None, &w.max_connections),
            http_max_connections_per_source: cx.limited(
                &HTTP_MAX_CONNECTIONS_PER_SOURCE,
                None,
                &w.max_connections_per_source,
            ),
            http_header_timeout: cx.limited(&HTTP_HEADER_TIMEOUT, None, &w.header_timeout_seconds),
            http_idle_timeout: cx.limited(&HTTP_IDLE_TIMEOUT, None, &w.idle_timeout_seconds),
            http_tls_handshake_timeout: cx.limited(
                &HTTP_TLS_HANDSHAKE_TIMEOUT,
                None,
                &w.tls_handshake_timeout_seconds,
            ),
            http_max_header_bytes: cx.limited(&HTTP_MAX_HEADER_BYTES, None, &w.max_header_bytes),
            log_level: cx.given_opt("log_level", &self.log_level),
            log_format: self.log_format,
            groups: cx.given_opt("hooks.groups", &h.groups),
            strict: h.strict,
            reconcile: h.reconcile,
            bpf_stats: h.bpf_stats,
            module_poll_interval: cx.limited(
                &MODULE_POLL_INTERVAL,
                None,
                &h.module_poll_interval_seconds,
            ),
            sysfs_counters_interval: cx.limited(
                &SYSFS_COUNTERS_INTERVAL,
                None,
                &self.sysfs_counters.interval_seconds,
            ),
            ring_buffer_bytes: cx.limited(&RING_BUFFER_BYTES, None, &h.ring_buffer_bytes),
            btf_dir: h.btf_dir.clone(),
            max_tracked_qps: cx.limited(&MAX_TRACKED_QPS, None, &l.max_tracked_qps),
            max_device_labels: cx.limited(&MAX_DEVICE_LABELS, None, &l.max_device_labels),
            max_process_labels: cx.limited(&MAX_PROCESS_LABELS, None, &l.max_process_labels),
            max_peer_labels: cx.limited(&MAX_PEER_LABELS, None, &l.max_peer_labels),
            max_cgroup_labels: cx.limited(&MAX_CGROUP_LABELS, None, &l.max_cgroup_labels),
            buckets_call_latency: cx.given_opt("buckets.call_latency", &b.call_latency),
            buckets_dwell: cx.given_opt("buckets.dwell", &b.dwell),
            buckets_lifetime: cx.given_opt("buckets.lifetime", &b.lifetime),
            buckets_probe_rtt: cx.given_opt("buckets.probe_rtt", &b.probe_rtt),
            responder: self.responder.as_ref().map(|r| {
                (
                    cx.given_opt("responder.listen", &r.listen),
                    r.enabled.unwrap_or(true),
                )
            }),
            responder_max_connections: self
                .responder
                .as_ref()
                .and_then(|r| cx.limited(&RESPONDER_MAX_CONNECTIONS, None, &r.max_connections)),
            responder_max_per_source: self.responder.as_ref().and_then(|r| {
                cx.limited(
                    &RESPONDER_MAX_PER_SOURCE,
                    None,
                    &r.max_connections_per_source,
                )
            }),
            responder_idle_timeout: self
                .responder
                .as_ref()
                .and_then(|r| cx.limited(&RESPONDER_IDLE_TIMEOUT, None, &r.idle_timeout_seconds)),
            responder_allow: self
                .responder
                .as_ref()
                .and_then(|r| cx.given_opt("responder.allow", &r.allow)),
            // the file's targets replace none: there are none before it
            targets: (!self.targets.is_empty()).then(|| {
                self.targets
                    .iter()
                    .enumerate()
                    .map(|(i, t)| t.input(cx, i))
                    .collect()
            }),
            mesh: self.mesh.as_ref().map(|m| MeshInput {
                listen: cx.given_opt("mesh.listen", &m.listen),
                interval_seconds: cx.limited(&MESH_INTERVAL, None, &m.interval_seconds),
                timeout_seconds: cx.limited(&MESH_TIMEOUT, None, &m.timeout_seconds),
                targets_file: cx.given_opt("mesh.targets_file", &m.targets_file),
                targets_file_check_seconds: cx.limited(
                    &MESH_TARGETS_FILE_CHECK,
                    None,
                    &m.targets_file_check_seconds,
                ),
                target_labels: cx.given_opt("mesh.target_labels", &m.target_labels),
                max_targets: cx.limited(&MESH_MAX_TARGETS, None, &m.max_targets),
                source: cx.given_opt("mesh.source", &m.source),
                discover: m.discover,
                discover_expiry_seconds: cx.limited(
                    &MESH_DISCOVER_EXPIRY,
                    None,
                    &m.discover_expiry_seconds,
                ),
                discover_max_targets: cx.limited(
                    &MESH_DISCOVER_MAX_TARGETS,
                    None,
                    &m.discover_max_targets,
                ),
                rtt_breakdown: m.rtt_breakdown,
                answer_rate_per_source: cx.limited(
                    &MESH_ANSWER_RATE,
                    None,
                    &m.answer_rate_per_source,
                ),
            }),
        }
    }
}

impl FileTarget {
    fn input(&self, cx: &FileContext, i: usize) -> TargetInput {
        let key = |k: &str| format!("targets[{i}].{k}");
        let at = Some(i);
        TargetInput {
            name: cx.given(key("name"), &self.name),
            address: cx.given(key("address"), &self.address),
            source: cx.given_opt(key("source"), &self.source),
            device: self.device.clone(),
            interval_seconds: cx.limited(&TARGET_INTERVAL, at, &self.interval_seconds),
            jitter: cx.limited(&TARGET_JITTER, at, &self.jitter),
            pings: cx.limited(&TARGET_PINGS, at, &self.pings),
            timeout_seconds: Given {
                value: self.timeout_seconds.as_ref().map(|v| *v.get_ref()),
                origin: cx.origin(self.timeout_seconds.as_ref().map(Spanned::span)),
                key: TARGET_TIMEOUT.file_key(at),
            },
            message_size: cx.limited(&TARGET_MESSAGE_SIZE, at, &self.message_size),
            mode: cx.given_opt(key("mode"), &self.mode),
        }
    }
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        kernel::hooks::Group,
        service::config::test_support::{err, parse},
    };

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

    const SHIPPED: &str = include_str!("../../../../packaging/qpwatch.toml");

    #[test]
    fn the_shipped_config_is_valid_and_probes_nothing() {
        let s = parse(SHIPPED).unwrap();
        assert_eq!(s.listen, "0.0.0.0:9721".parse().unwrap());
        assert!(s.targets.is_empty(), "{:?}", s.targets);
        assert!(s.mesh.is_none());
    }

    #[test]
    fn the_shipped_config_example_target_is_valid_uncommented() {
        let start = SHIPPED.find("# [[targets]]\n").unwrap();
        let end = start + SHIPPED[start..].find("\n\n").unwrap();
        let uncommented: String = SHIPPED[start..end]
            .lines()
            .map(|line| {
                let rest = line.trim_start_matches("# ");
                if rest.starts_with("[[targets]]") || rest.split_once(" = ").is_some() {
                    rest
                } else {
                    line
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let s = parse(&format!("{}{uncommented}\n", &SHIPPED[..start])).unwrap();
        assert_eq!(s.targets.len(), 1);
        assert_eq!(s.targets[0].name, "rack-b-host-7");
    }

    #[test]
    fn full_file() {
        let s = parse(
            r#"
listen = "0.0.0.0:9500"
log_format = "json"
[hooks]
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

    #[test]
    fn mesh_section() {
        let s = parse(
            r#"
[mesh]
interval_seconds = 0.1
timeout_seconds = 0.5
targets_file = "/etc/qpwatch/targets.yaml"
targets_file_check_seconds = 2
target_labels = ["rack", "tor"]
max_targets = 1000
source = "198.18.0.1"
rtt_breakdown = false
[[targets]]
name = "peer2"
address = "198.18.0.2"
mode = "ud"
source = "198.18.0.1"
"#,
        )
        .unwrap();
        let m = s.mesh.unwrap();
        assert_eq!(m.listen, Some("0.0.0.0:9723".parse().unwrap()));
        assert_eq!(m.interval, Duration::from_millis(100));
        assert_eq!(m.timeout, Duration::from_millis(500));
        assert_eq!(
            m.targets_file,
            Some(PathBuf::from("/etc/qpwatch/targets.yaml"))
        );
        assert_eq!(m.targets_file_check, Duration::from_secs(2));
        assert_eq!(m.target_labels, ["rack", "tor"]);
        assert_eq!(m.max_targets, 1000);
        assert_eq!(m.source, Some("198.18.0.1".parse().unwrap()));
        assert!(!m.rtt_breakdown);
        assert!(
            parse("[mesh]").unwrap().mesh.unwrap().rtt_breakdown,
            "on by default"
        );
        assert_eq!(s.targets[0].mode, ProbeModeSetting::Ud);
        assert_eq!(
            s.responder_listen,
            Some("0.0.0.0:9723".parse().unwrap()),
            "fleet mode: every agent answers RC probes too"
        );
    }

    #[test]
    fn fleet_mode_defaults_the_responder_unless_configured() {
        let s = parse(
            "[mesh]
listen = \"\"",
        )
        .unwrap();
        assert_eq!(s.mesh.unwrap().listen, None);
        assert_eq!(s.responder_listen, Some("0.0.0.0:9723".parse().unwrap()));
        let s = parse(
            "[mesh]
[responder]
listen = \"198.18.0.1:7000\"",
        )
        .unwrap();
        assert_eq!(s.responder_listen, Some("198.18.0.1:7000".parse().unwrap()));
        let s = parse(
            "[mesh]
[responder]
enabled = false
listen = \"198.18.0.1\"",
        )
        .unwrap();
        assert_eq!(s.responder_listen, None);
        assert_eq!(
            parse("").unwrap().responder_listen,
            None,
            "not in fleet mode"
        );
    }

    #[test]
    fn responder_limits() {
        let s = parse(
            r#"
[responder]
listen = "198.18.0.1"
max_connections = 64
max_connections_per_source = 2
idle_timeout_seconds = 30
allow = ["198.18.0.0/24", "10.1.2.3", "fe80::/10"]
[mesh]
answer_rate_per_source = 50
"#,
        )
        .unwrap();
        let r = &s.responder;
        assert_eq!(r.max_connections, 64);
        assert_eq!(r.max_per_source, 2);
        assert_eq!(r.idle_timeout, Duration::from_secs(30));
        let allow: Vec<String> = r.allow.iter().map(ToString::to_string).collect();
        assert_eq!(allow, ["198.18.0.0/24", "10.1.2.3/32", "fe80::/10"]);
        assert_eq!(s.mesh.unwrap().answer_rate_per_source, 50);
        let d = parse("").unwrap();
        assert_eq!(d.responder, super::super::ResponderSettings::default());
        assert!(d.responder.allow.is_empty(), "every source by default");
        // the limits without `listen`: fleet mode's default responder gets them
        let s = parse("[mesh]\n[responder]\nmax_connections_per_source = 3").unwrap();
        assert_eq!(s.responder_listen, Some("0.0.0.0:9723".parse().unwrap()));
        assert_eq!(s.responder.max_per_source, 3);
        assert_eq!(
            parse("[responder]\nallow = [\"10.0.0.0/8\"]")
                .unwrap()
                .responder_listen,
            None
        );
        for (text, message) in [
            ("[responder]\nallow = []", ":2:9: responder.allow: an empty list would answer no one"),
            ("[responder]\nallow = [\"10.0.0.0/33\"]", ":2:9: responder.allow: \"10.0.0.0/33\": the prefix length is not 0..=32"),
            ("[responder]\nallow = [\"any\"]", ":2:9: responder.allow: \"any\" is not ADDR or ADDR/PREFIX"),
            ("[responder]\nmax_connections_per_source = 0", ":2:30: responder.max_connections_per_source: 0 is not between 1 and 65536"),
            ("[responder]\nidle_timeout_seconds = 0.5", ":2:24: responder.idle_timeout_seconds: 0.5 is not a number of seconds between 1 and 86400"),
            ("[mesh]\nanswer_rate_per_source = 0", ":2:26: mesh.answer_rate_per_source: 0 is not between 1 and 1000000"),
        ] {
            let e = err(text);
            assert!(e.contains(message), "{text:?}: {e}");
        }
    }

    /// The bad-input table of the closing note: one line, key and file:line.
    #[test]
    fn bad_files_name_key_and_position() {
        let cases: &[(&str, &str)] = &[
            ("lisen = \"x\"", "/etc/qpwatch/qpwatch.toml:1:1: lisen: unknown field `lisen`"),
            ("[hooks]\nring_buffer_bytes = \"big\"", ":2:21: hooks.ring_buffer_bytes: invalid type: string \"big\""),
            ("listen = \"localhost\"", ":1:10: listen: \"localhost\" is not ADDR:PORT"),
            ("[hooks]\nmodule_poll_interval_seconds = -1", ":2:32: hooks.module_poll_interval_seconds: -1 is not a positive number"),
            ("[[targets]]\nname = \"\"\naddress = \"198.18.0.1\"", ":2:8: targets[0].name: must not be empty"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\ninterval_seconds = 0", ":4:20: targets[0].interval_seconds: 0 is not a positive number"),
            ("[[targets]]\nname = \"a\"\naddress = \"nowhere\"", ":3:11: targets[0].address: \"nowhere\" is not an IP address"),
            ("[hooks]\nring_buffer_bytes = 5000", ":2:21: hooks.ring_buffer_bytes: 5000 is not a power of two"),
            ("[hooks]\ngroups = [\"qp\", \"rdma\"]", ":2:10: hooks.groups: unknown hook group \"rdma\""),
            ("[limits]\nmax_tracked_qps = 0", ":2:19: limits.max_tracked_qps: 0 is not between 1"),
            ("[buckets]\ndwell = [1.0, 0.5]", ":2:9: buckets.dwell: buckets must be strictly increasing"),
            ("log_level = \"loud\"", ":1:13: log_level: \"loud\" is not a log level"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\n[[targets]]\nname = \"a\"\naddress = \"198.18.0.2\"", ":5:8: targets[1].name: \"a\" is used by another target"),
            ("[hooks]\nstrict = \"yes\"", ":2:10: hooks.strict: invalid type: string \"yes\", expected a boolean"),
            ("listen = ", ":1:10: (syntax):"),
            ("[[targets]]\nname = \"a b\"\naddress = \"198.18.0.1\"", ":2:8: targets[0].name: \"a b\": use at most 64"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\ntimeout_seconds = 20", ":4:19: targets[0].timeout_seconds: the step timeout"),
            ("[responder]\nlisten = \"198.18.0.1:99999\"", ":2:10: responder.listen:"),
            ("log_format = \"yaml\"", ":1:14: log_format: unknown variant `yaml`"),
            ("[[targets]]\naddress = \"198.18.0.1\"", ":1:1: targets[0]: missing field `name`"),
            ("[probes]\ngroups = [\"qp\"]", ":1:2: probes: `[probes]` was renamed `[hooks]`"),
            ("listen = \"127.0.0.1:9\"\nprobes.strict = true", ":2:1: probes: `[probes]` was renamed `[hooks]`"),
            ("probes = { strict = \"yes\" }", ":1:1: probes: `[probes]` was renamed `[hooks]`"),
            ("[mesh]\ninterval_seconds = 0", ":2:20: mesh.interval_seconds: 0 is not a number of seconds between 0.01 and 3600"),
            ("[mesh]\nmax_targets = 0", ":2:15: mesh.max_targets: 0 is not between 1 and 100000"),
            ("[mesh]\ntarget_labels = [\"rack\", \"to-r\"]", ":2:17: mesh.target_labels: \"to-r\" is not a label name"),
            ("[mesh]\ntarget_labels = [\"target\"]", ":2:17: mesh.target_labels: \"target\" is every mesh metric's own label"),
            ("[mesh]\ntarget_labels = [\"__x\"]", ":2:17: mesh.target_labels: \"__x\": names starting with __ are reserved"),
            ("[mesh]\ntargets_file = \"/etc/t.txt\"", ":2:16: mesh.targets_file: \"/etc/t.txt\": the extension tells the format: .json, .yml or .yaml"),
            ("[mesh]\nlisten = \"nowhere\"", ":2:10: mesh.listen: \"nowhere\" is not an IP address or ADDR:PORT"),
            ("[mesh]\nsource = \"host\"", ":2:10: mesh.source: \"host\" is not an IP address"),
            ("[mesh]\nrtt_breakdown = \"yes\"", ":2:17: mesh.rtt_breakdown: invalid type: string \"yes\", expected a boolean"),
            ("[mesh]\nintervals = 1", ":2:1: mesh.intervals: unknown field `intervals`"),
            ("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\nmode = \"ud\"", ":4:8: targets[0].mode: \"ud\" targets are probed by the mesh: needs [mesh] (or --mesh)"),
            ("[mesh]\n[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\nmode = \"ud\"\npings = 3", ":6:9: targets[0].pings: not used by mode = \"ud\" (the [mesh] settings apply)"),
            ("[mesh]\n[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\nmode = \"ud\"\ndevice = \"rxe0\"", ":5:8: targets[0].mode: device is not used by mode = \"ud\""),
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
    fn positions_count_from_one() {
        assert_eq!(line_column("a\nbc\nd", 3), (2, 2));
    }
}
