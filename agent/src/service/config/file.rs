//! The configuration file: TOML, read up to a bound, every error at its
//! `path:line:column` and key.

use std::{
    fs,
    io::Read,
    net::SocketAddr,
    ops::Range,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use toml::Spanned;

use super::{
    cli::{parse_group, LogFormat, ProbeModeSetting},
    error::{ConfigError, Origin},
    rules::{
        check_buckets, check_count, check_log_level, check_ring_buffer, check_seconds,
        check_target_name, parse_target_address,
    },
    settings::{Settings, Target},
    DEFAULT_LISTEN,
};

/// The most that is read of a configuration file: far above any real one
/// (a thousand inline targets take about 150 KB), and a bound on what a
/// wrong path (`/dev/zero`, a log file) can make the agent read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

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

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../../../packaging/qpwatch.toml");
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
    fn positions_count_from_one() {
        assert_eq!(line_column("a\nbc\nd", 3), (2, 2));
    }
}
