//! The one way values become [`Settings`]: the file and the flags each give
//! an [`Input`], every value with where it came from, and [`Input::apply`]
//! checks them (against [`super::limits`] and [`super::rules`]) over the
//! settings so far: the defaults for the file, the file's for the flags.

use std::{collections::HashSet, path::PathBuf};

use super::{
    cli::{LogFormat, ProbeModeSetting, RunArgs},
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
    rules::{
        check_allow, check_buckets, check_groups, check_listen, check_log_level, check_mesh_listen,
        check_source, check_target_labels, check_target_name, check_targets_file,
        parse_target_address,
    },
    settings::{MeshSettings, Settings, Target},
    DEFAULT_FLEET_LISTEN,
};

/// A value as given, and where: a key at its place in the file, or a flag.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Given<T> {
    pub value: T,
    pub origin: Origin,
    /// The key (`targets[1].pings`) or the flag (`--probe-pings`).
    pub key: String,
}

impl<T> Given<T> {
    pub fn flag(flag: &str, value: T) -> Self {
        Given {
            value,
            origin: Origin::Flag,
            key: flag.to_owned(),
        }
    }

    /// A value of a row of the limits table, given by its flag.
    pub fn limited_flag(limit: &Limit, value: T) -> Self {
        Given::flag(limit.flag.unwrap_or(limit.key), value)
    }

    pub fn error(&self, message: String) -> ConfigError {
        ConfigError {
            origin: self.origin.clone(),
            key: self.key.clone(),
            message,
        }
    }

    pub fn check<U>(&self, check: impl FnOnce(&T) -> Result<U, String>) -> Result<U, ConfigError> {
        check(&self.value).map_err(|message| self.error(message))
    }
}

/// What one source (the file or the flags) gives; `None`: not given.
#[derive(Debug, Default)]
pub(super) struct Input {
    pub listen: Option<Given<String>>,
    pub web_config_file: Option<Given<String>>,
    pub http_max_connections: Option<Given<i64>>,
    pub http_max_connections_per_source: Option<Given<i64>>,
    pub http_header_timeout: Option<Given<f64>>,
    pub http_idle_timeout: Option<Given<f64>>,
    pub http_tls_handshake_timeout: Option<Given<f64>>,
    pub http_max_header_bytes: Option<Given<i64>>,
    pub log_level: Option<Given<String>>,
    pub log_format: Option<LogFormat>,
    pub groups: Option<Given<Vec<String>>>,
    pub strict: Option<bool>,
    pub reconcile: Option<bool>,
    pub bpf_stats: Option<bool>,
    pub module_poll_interval: Option<Given<f64>>,
    pub sysfs_counters_interval: Option<Given<f64>>,
    pub ring_buffer_bytes: Option<Given<i64>>,
    pub btf_dir: Option<PathBuf>,
    pub max_tracked_qps: Option<Given<i64>>,
    pub max_device_labels: Option<Given<i64>>,
    pub max_process_labels: Option<Given<i64>>,
    pub max_peer_labels: Option<Given<i64>>,
    pub max_cgroup_labels: Option<Given<i64>>,
    pub buckets_call_latency: Option<Given<Vec<f64>>>,
    pub buckets_dwell: Option<Given<Vec<f64>>>,
    pub buckets_lifetime: Option<Given<Vec<f64>>>,
    pub buckets_probe_rtt: Option<Given<Vec<f64>>>,
    /// The responder's address (if given), and whether it is enabled.
    pub responder: Option<(Option<Given<String>>, bool)>,
    pub responder_max_connections: Option<Given<i64>>,
    pub responder_max_per_source: Option<Given<i64>>,
    pub responder_idle_timeout: Option<Given<f64>>,
    pub responder_allow: Option<Given<Vec<String>>>,
    /// `Some`: these targets replace those so far.
    pub targets: Option<Vec<TargetInput>>,
    /// `Some`: fleet mode, with these keys over those so far.
    pub mesh: Option<MeshInput>,
}

/// `[mesh]` as given, or the `--mesh*` flags.
#[derive(Debug, Default)]
pub(super) struct MeshInput {
    pub listen: Option<Given<String>>,
    pub interval_seconds: Option<Given<f64>>,
    pub timeout_seconds: Option<Given<f64>>,
    pub targets_file: Option<Given<String>>,
    pub targets_file_check_seconds: Option<Given<f64>>,
    pub target_labels: Option<Given<Vec<String>>>,
    pub max_targets: Option<Given<i64>>,
    pub source: Option<Given<String>>,
    pub discover: Option<bool>,
    pub discover_expiry_seconds: Option<Given<f64>>,
    pub discover_max_targets: Option<Given<i64>>,
    pub rtt_breakdown: Option<bool>,
    pub answer_rate_per_source: Option<Given<i64>>,
}

impl MeshInput {
    fn apply(&self, mut m: MeshSettings) -> Result<MeshSettings, ConfigError> {
        set(&mut m.listen, &self.listen, |v| check_mesh_listen(v))?;
        set(&mut m.interval, &self.interval_seconds, |v| {
            MESH_INTERVAL.seconds(*v)
        })?;
        set(&mut m.timeout, &self.timeout_seconds, |v| {
            MESH_TIMEOUT.seconds(*v)
        })?;
        set(&mut m.targets_file, &self.targets_file, |v| {
            check_targets_file(v).map(Some)
        })?;
        set(
            &mut m.targets_file_check,
            &self.targets_file_check_seconds,
            |v| MESH_TARGETS_FILE_CHECK.seconds(*v),
        )?;
        set(&mut m.target_labels, &self.target_labels, |v| {
            check_target_labels(v)
        })?;
        set(&mut m.max_targets, &self.max_targets, |v| {
            MESH_MAX_TARGETS.integer(*v).map(|v| v as usize)
        })?;
        set(&mut m.source, &self.source, |v| check_source(v).map(Some))?;
        m.discover = self.discover.unwrap_or(m.discover);
        set(&mut m.discover_expiry, &self.discover_expiry_seconds, |v| {
            MESH_DISCOVER_EXPIRY.seconds(*v)
        })?;
        set(
            &mut m.discover_max_targets,
            &self.discover_max_targets,
            |v| MESH_DISCOVER_MAX_TARGETS.integer(*v).map(|v| v as usize),
        )?;
        if let Some(on) = self.rtt_breakdown {
            m.rtt_breakdown = on;
        }
        set(
            &mut m.answer_rate_per_source,
            &self.answer_rate_per_source,
            |v| MESH_ANSWER_RATE.integer(*v).map(|v| v as u32),
        )?;
        Ok(m)
    }
}

/// A probe target as given: a `[[targets]]` table, or a `--target` with the
/// `--probe-*` flags.
#[derive(Debug)]
pub(super) struct TargetInput {
    pub name: Given<String>,
    pub address: Given<String>,
    pub source: Option<Given<String>>,
    pub device: Option<String>,
    pub interval_seconds: Option<Given<f64>>,
    pub jitter: Option<Given<f64>>,
    pub pings: Option<Given<i64>>,
    /// Placed even when not given: a default timeout not shorter than the
    /// interval is reported here.
    pub timeout_seconds: Given<Option<f64>>,
    pub message_size: Option<Given<i64>>,
    pub mode: Option<Given<ProbeModeSetting>>,
}

fn set<T, U>(
    slot: &mut U,
    given: &Option<Given<T>>,
    check: impl FnOnce(&T) -> Result<U, String>,
) -> Result<(), ConfigError> {
    if let Some(given) = given {
        *slot = given.check(check)?;
    }
    Ok(())
}

impl Input {
    /// Checks every value given and sets it over `s`.
    pub fn apply(&self, mut s: Settings) -> Result<Settings, ConfigError> {
        set(&mut s.listen, &self.listen, |v| check_listen(v))?;
        set(&mut s.web_config_file, &self.web_config_file, |v| {
            if v.is_empty() {
                Err("must not be empty (leave it out for plain HTTP without auth)".to_owned())
            } else {
                Ok(Some(PathBuf::from(v)))
            }
        })?;
        set(
            &mut s.http.max_connections,
            &self.http_max_connections,
            |v| HTTP_MAX_CONNECTIONS.integer(*v).map(|v| v as usize),
        )?;
        set(
            &mut s.http.max_connections_per_source,
            &self.http_max_connections_per_source,
            |v| {
                HTTP_MAX_CONNECTIONS_PER_SOURCE
                    .integer(*v)
                    .map(|v| v as usize)
            },
        )?;
        set(&mut s.http.header_timeout, &self.http_header_timeout, |v| {
            HTTP_HEADER_TIMEOUT.seconds(*v)
        })?;
        set(&mut s.http.idle_timeout, &self.http_idle_timeout, |v| {
            HTTP_IDLE_TIMEOUT.seconds(*v)
        })?;
        set(
            &mut s.http.tls_handshake_timeout,
            &self.http_tls_handshake_timeout,
            |v| HTTP_TLS_HANDSHAKE_TIMEOUT.seconds(*v),
        )?;
        set(
            &mut s.http.max_header_bytes,
            &self.http_max_header_bytes,
            |v| HTTP_MAX_HEADER_BYTES.integer(*v).map(|v| v as usize),
        )?;
        set(&mut s.log_level, &self.log_level, |v| {
            check_log_level(v).map(|()| v.clone())
        })?;
        s.log_format = self.log_format.unwrap_or(s.log_format);
        set(&mut s.groups, &self.groups, |v| check_groups(v))?;
        s.strict = self.strict.unwrap_or(s.strict);
        s.reconcile = self.reconcile.unwrap_or(s.reconcile);
        s.bpf_stats = self.bpf_stats.unwrap_or(s.bpf_stats);
        set(
            &mut s.module_poll_interval,
            &self.module_poll_interval,
            |v| MODULE_POLL_INTERVAL.seconds(*v),
        )?;
        set(
            &mut s.sysfs_counters_interval,
            &self.sysfs_counters_interval,
            |v| SYSFS_COUNTERS_INTERVAL.seconds(*v),
        )?;
        set(&mut s.ring_buffer_bytes, &self.ring_buffer_bytes, |v| {
            RING_BUFFER_BYTES.integer(*v).map(|v| v as u32)
        })?;
        if let Some(dir) = &self.btf_dir {
            s.btf_dir.clone_from(dir);
        }
        for (limit, given, slot) in [
            (
                MAX_TRACKED_QPS,
                &self.max_tracked_qps,
                &mut s.limits.max_tracked_qps,
            ),
            (
                MAX_DEVICE_LABELS,
                &self.max_device_labels,
                &mut s.limits.max_device_labels,
            ),
            (
                MAX_PROCESS_LABELS,
                &self.max_process_labels,
                &mut s.limits.max_process_labels,
            ),
            (
                MAX_PEER_LABELS,
                &self.max_peer_labels,
                &mut s.limits.max_peer_labels,
            ),
            (
                MAX_CGROUP_LABELS,
                &self.max_cgroup_labels,
                &mut s.limits.max_cgroup_labels,
            ),
        ] {
            set(slot, given, |v| limit.integer(*v).map(|v| v as usize))?;
        }
        for (given, slot) in [
            (&self.buckets_call_latency, &mut s.buckets.call_latency),
            (&self.buckets_dwell, &mut s.buckets.dwell),
            (&self.buckets_lifetime, &mut s.buckets.lifetime),
            (&self.buckets_probe_rtt, &mut s.buckets.probe_rtt),
        ] {
            set(slot, given, |v| check_buckets(v).map(|()| v.clone()))?;
        }
        match &self.responder {
            Some((Some(listen), enabled)) => {
                let listen = listen.check(|v| parse_target_address(v))?;
                s.responder_listen = enabled.then_some(listen);
                s.responder_configured = true;
            }
            Some((None, false)) => {
                s.responder_listen = None;
                s.responder_configured = true;
            }
            _ => {}
        }
        let r = &mut s.responder;
        set(
            &mut r.max_connections,
            &self.responder_max_connections,
            |v| RESPONDER_MAX_CONNECTIONS.integer(*v).map(|v| v as usize),
        )?;
        set(&mut r.max_per_source, &self.responder_max_per_source, |v| {
            RESPONDER_MAX_PER_SOURCE.integer(*v).map(|v| v as usize)
        })?;
        set(&mut r.idle_timeout, &self.responder_idle_timeout, |v| {
            RESPONDER_IDLE_TIMEOUT.seconds(*v)
        })?;
        set(&mut r.allow, &self.responder_allow, |v| check_allow(v))?;
        if let Some(mesh) = &self.mesh {
            s.mesh = Some(mesh.apply(s.mesh.take().unwrap_or_default())?);
        }
        if s.mesh.is_some() && !s.responder_configured {
            s.responder_listen = Some(DEFAULT_FLEET_LISTEN.parse().expect("valid"));
        }
        if let Some(targets) = &self.targets {
            let mut names = HashSet::new();
            s.targets = targets
                .iter()
                .map(|t| t.check(&mut names))
                .collect::<Result<_, _>>()?;
            if s.mesh.is_none() {
                if let Some(ud) = targets
                    .iter()
                    .find_map(|t| t.mode.as_ref().filter(|m| m.value == ProbeModeSetting::Ud))
                {
                    return Err(ud.error(
                        "\"ud\" targets are probed by the mesh: needs [mesh] (or --mesh)"
                            .to_owned(),
                    ));
                }
            }
        }
        Ok(s)
    }
}

impl TargetInput {
    /// The one check of a target, from the file or the flags; `names`: those
    /// of the targets before it.
    pub fn check(&self, names: &mut HashSet<String>) -> Result<Target, ConfigError> {
        self.name.check(|n| check_target_name(n))?;
        if !names.insert(self.name.value.clone()) {
            return Err(self
                .name
                .error(format!("{:?} is used by another target", self.name.value)));
        }
        let address = self.address.check(|v| parse_target_address(v))?;
        let mut t = Target::defaults(self.name.value.clone(), address);
        if let Some(source) = &self.source {
            t.source = Some(source.check(|v| check_source(v))?);
        }
        if let Some(mode) = self
            .mode
            .as_ref()
            .filter(|m| m.value == ProbeModeSetting::Ud)
        {
            self.refuse_rc_keys(mode)?;
            t.mode = ProbeModeSetting::Ud;
            return Ok(t);
        }
        t.device.clone_from(&self.device);
        set(&mut t.interval, &self.interval_seconds, |v| {
            TARGET_INTERVAL.seconds(*v)
        })?;
        set(&mut t.jitter, &self.jitter, |v| TARGET_JITTER.fraction(*v))?;
        set(&mut t.pings, &self.pings, |v| {
            TARGET_PINGS.integer(*v).map(|v| v as u32)
        })?;
        if let Some(v) = self.timeout_seconds.value {
            t.timeout = self.timeout_seconds.check(|_| TARGET_TIMEOUT.seconds(v))?;
        }
        set(&mut t.message_size, &self.message_size, |v| {
            TARGET_MESSAGE_SIZE.integer(*v).map(|v| v as usize)
        })?;
        t.mode = self.mode.as_ref().map_or(t.mode, |m| m.value);
        if t.timeout >= t.interval {
            return Err(self.timeout_seconds.error(format!(
                "the step timeout ({:?}) must be shorter than the interval ({:?})",
                t.timeout, t.interval
            )));
        }
        Ok(t)
    }
}

impl TargetInput {
    /// A UD target is probed at the mesh's interval and timeout: the keys
    /// of an RC probe would be silently unused.
    fn refuse_rc_keys(&self, mode: &Given<ProbeModeSetting>) -> Result<(), ConfigError> {
        let unused = |given: &Origin, key: &str| ConfigError {
            origin: given.clone(),
            key: key.to_owned(),
            message: "not used by mode = \"ud\" (the [mesh] settings apply)".to_owned(),
        };
        let given: [Option<(&Origin, &str)>; 5] = [
            self.interval_seconds
                .as_ref()
                .map(|g| (&g.origin, g.key.as_str())),
            self.jitter.as_ref().map(|g| (&g.origin, g.key.as_str())),
            self.pings.as_ref().map(|g| (&g.origin, g.key.as_str())),
            self.timeout_seconds.value.map(|_| {
                (
                    &self.timeout_seconds.origin,
                    self.timeout_seconds.key.as_str(),
                )
            }),
            self.message_size
                .as_ref()
                .map(|g| (&g.origin, g.key.as_str())),
        ];
        if let Some((origin, key)) = given.into_iter().flatten().next() {
            return Err(unused(origin, key));
        }
        if self.device.is_some() {
            return Err(ConfigError {
                message: "device is not used by mode = \"ud\" (the mesh picks the device by source address)".to_owned(),
                ..mode.error(String::new())
            });
        }
        Ok(())
    }
}

impl RunArgs {
    /// The flags, each named as given.
    pub(super) fn input(&self) -> Input {
        let flag = |flag: &str, v: &Option<String>| v.clone().map(|v| Given::flag(flag, v));
        let limited = |limit: &Limit, v: Option<i64>| v.map(|v| Given::limited_flag(limit, v));
        let seconds = |limit: &Limit, v: Option<f64>| v.map(|v| Given::limited_flag(limit, v));
        let buckets = |flag: &str, v: &Option<Vec<f64>>| v.clone().map(|v| Given::flag(flag, v));
        Input {
            listen: flag("--listen", &self.listen),
            web_config_file: flag("--web-config-file", &self.web_config_file),
            http_max_connections: limited(&HTTP_MAX_CONNECTIONS, self.http_max_connections),
            http_max_connections_per_source: limited(
                &HTTP_MAX_CONNECTIONS_PER_SOURCE,
                self.http_max_connections_per_source,
            ),
            http_header_timeout: seconds(&HTTP_HEADER_TIMEOUT, self.http_header_timeout),
            http_idle_timeout: seconds(&HTTP_IDLE_TIMEOUT, self.http_idle_timeout),
            http_tls_handshake_timeout: seconds(
                &HTTP_TLS_HANDSHAKE_TIMEOUT,
                self.http_tls_handshake_timeout,
            ),
            http_max_header_bytes: limited(&HTTP_MAX_HEADER_BYTES, self.http_max_header_bytes),
            log_level: flag("--log-level", &self.log_level),
            log_format: self.log_format,
            groups: self.groups.clone().map(|v| Given::flag("--groups", v)),
            strict: self.strict.then_some(true),
            reconcile: self.no_reconcile.then_some(false),
            bpf_stats: self.bpf_stats.then_some(true),
            module_poll_interval: seconds(&MODULE_POLL_INTERVAL, self.module_poll_interval),
            sysfs_counters_interval: seconds(
                &SYSFS_COUNTERS_INTERVAL,
                self.sysfs_counters_interval,
            ),
            ring_buffer_bytes: limited(&RING_BUFFER_BYTES, self.ring_buffer_bytes),
            btf_dir: self.btf_dir.clone(),
            max_tracked_qps: limited(&MAX_TRACKED_QPS, self.max_tracked_qps),
            max_device_labels: limited(&MAX_DEVICE_LABELS, self.max_device_labels),
            max_process_labels: limited(&MAX_PROCESS_LABELS, self.max_process_labels),
            max_peer_labels: limited(&MAX_PEER_LABELS, self.max_peer_labels),
            max_cgroup_labels: limited(&MAX_CGROUP_LABELS, self.max_cgroup_labels),
            buckets_call_latency: buckets("--buckets-call-latency", &self.buckets_call_latency),
            buckets_dwell: buckets("--buckets-dwell", &self.buckets_dwell),
            buckets_lifetime: buckets("--buckets-lifetime", &self.buckets_lifetime),
            buckets_probe_rtt: buckets("--buckets-probe-rtt", &self.buckets_probe_rtt),
            responder: flag("--responder-listen", &self.responder_listen).map(|l| (Some(l), true)),
            responder_max_connections: limited(
                &RESPONDER_MAX_CONNECTIONS,
                self.responder_max_connections,
            ),
            responder_max_per_source: limited(
                &RESPONDER_MAX_PER_SOURCE,
                self.responder_max_connections_per_source,
            ),
            responder_idle_timeout: seconds(&RESPONDER_IDLE_TIMEOUT, self.responder_idle_timeout),
            responder_allow: self
                .responder_allow
                .clone()
                .map(|v| Given::flag("--responder-allow", v)),
            targets: (!self.targets.is_empty()).then(|| {
                self.targets
                    .iter()
                    .map(|(name, address)| TargetInput {
                        name: Given::flag("--target", name.clone()),
                        address: Given::flag("--target", address.clone()),
                        source: None,
                        device: None,
                        interval_seconds: seconds(&TARGET_INTERVAL, self.probe_interval),
                        jitter: None,
                        pings: limited(&TARGET_PINGS, self.probe_pings),
                        timeout_seconds: Given::limited_flag(&TARGET_TIMEOUT, self.probe_timeout),
                        message_size: None,
                        mode: self.probe_mode.map(|m| Given::flag("--probe-mode", m)),
                    })
                    .collect()
            }),
            mesh: self.mesh_input(),
        }
    }

    /// `--mesh` or any `--mesh-*` flag: fleet mode.
    fn mesh_input(&self) -> Option<MeshInput> {
        let flag = |flag: &str, v: &Option<String>| v.clone().map(|v| Given::flag(flag, v));
        let limited = |limit: &Limit, v: Option<i64>| v.map(|v| Given::limited_flag(limit, v));
        let seconds = |limit: &Limit, v: Option<f64>| v.map(|v| Given::limited_flag(limit, v));
        let m = MeshInput {
            listen: flag("--mesh-listen", &self.mesh_listen),
            interval_seconds: seconds(&MESH_INTERVAL, self.mesh_interval),
            timeout_seconds: seconds(&MESH_TIMEOUT, self.mesh_timeout),
            targets_file: flag("--mesh-targets-file", &self.mesh_targets_file),
            targets_file_check_seconds: seconds(
                &MESH_TARGETS_FILE_CHECK,
                self.mesh_targets_file_check,
            ),
            target_labels: (!self.mesh_target_labels.is_empty())
                .then(|| Given::flag("--mesh-target-label", self.mesh_target_labels.clone())),
            max_targets: limited(&MESH_MAX_TARGETS, self.mesh_max_targets),
            source: flag("--mesh-source", &self.mesh_source),
            discover: self.mesh_discover.then_some(true),
            discover_expiry_seconds: seconds(&MESH_DISCOVER_EXPIRY, self.mesh_discover_expiry),
            discover_max_targets: limited(
                &MESH_DISCOVER_MAX_TARGETS,
                self.mesh_discover_max_targets,
            ),
            rtt_breakdown: self.mesh_rtt_breakdown,
            answer_rate_per_source: limited(&MESH_ANSWER_RATE, self.mesh_answer_rate_per_source),
        };
        let any = m.listen.is_some()
            || m.interval_seconds.is_some()
            || m.timeout_seconds.is_some()
            || m.targets_file.is_some()
            || m.targets_file_check_seconds.is_some()
            || m.target_labels.is_some()
            || m.max_targets.is_some()
            || m.source.is_some()
            || m.discover.is_some()
            || m.discover_expiry_seconds.is_some()
            || m.discover_max_targets.is_some()
            || m.rtt_breakdown.is_some()
            || m.answer_rate_per_source.is_some();
        (self.mesh || any).then_some(m)
    }
}

/// Flags win over the file.
pub fn apply_flags(s: Settings, args: &RunArgs) -> Result<Settings, ConfigError> {
    args.input().apply(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::config::test_support::{cli, parse};

    #[test]
    fn responder_flags() {
        let args = cli(&[
            "--responder-listen",
            "198.18.0.1",
            "--responder-max-connections",
            "16",
            "--responder-max-connections-per-source",
            "1",
            "--responder-idle-timeout",
            "5",
            "--responder-allow",
            "198.18.0.1,198.18.0.5/32",
            "--mesh-answer-rate-per-source",
            "20",
        ])
        .unwrap();
        let file = parse("[responder]\nmax_connections_per_source = 4").unwrap();
        let s = apply_flags(file, &args.run).unwrap();
        assert_eq!(s.responder.max_connections, 16);
        assert_eq!(s.responder.max_per_source, 1, "the flag wins");
        assert_eq!(s.responder.idle_timeout, std::time::Duration::from_secs(5));
        assert_eq!(s.responder.allow.len(), 2);
        assert_eq!(s.mesh.unwrap().answer_rate_per_source, 20);
        let args = cli(&["--responder-allow", "nowhere"]).unwrap();
        assert_eq!(
            apply_flags(Settings::default(), &args.run)
                .unwrap_err()
                .to_string(),
            "command line: --responder-allow: \"nowhere\" is not ADDR or ADDR/PREFIX"
        );
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
        let cases: &[(&[&str], &str)] = &[
            (
                &["--listen", "nonsense"],
                "--listen: \"nonsense\" is not ADDR:PORT",
            ),
            (
                &["--log-level", "loud"],
                "--log-level: \"loud\" is not a log level",
            ),
            (
                &["--ring-buffer-bytes", "-1"],
                "--ring-buffer-bytes: -1 is not a power of two between 4096 and 1073741824",
            ),
            (
                &["--ring-buffer-bytes", "5000"],
                "--ring-buffer-bytes: 5000 is not a power of two between 4096 and 1073741824",
            ),
            (
                &["--module-poll-interval", "-3"],
                "--module-poll-interval: -3 is not a positive number of seconds (at most 86400)",
            ),
            (
                &["--max-tracked-qps", "-1"],
                "--max-tracked-qps: -1 is not between 1 and 16777216",
            ),
            (
                &["--groups", "qp,bogus"],
                "--groups: unknown hook group \"bogus\" (qp, cm, kernel-ulp, ib-cm-tracepoints, qp-async-events, rxe-qp-errors)",
            ),
            (
                &["--buckets-dwell", "2,1"],
                "--buckets-dwell: buckets must be strictly increasing",
            ),
            (
                &["--responder-listen", "nowhere"],
                "--responder-listen: \"nowhere\" is not an IP address or ADDR:PORT",
            ),
            (&["--target", "=198.18.0.1"], "--target: must not be empty"),
            (
                &["--target", "a b=198.18.0.1"],
                "--target: \"a b\": use at most 64",
            ),
            (
                &["--target", "a=nowhere"],
                "--target: \"nowhere\" is not an IP address or ADDR:PORT",
            ),
            (
                &["--target", "a=198.18.0.1", "--target", "a=198.18.0.2"],
                "--target: \"a\" is used by another target",
            ),
            (
                &["--target", "a=198.18.0.1", "--probe-pings", "0"],
                "--probe-pings: 0 is not between 1 and 100000",
            ),
            (
                &["--target", "a=198.18.0.1", "--probe-interval", "1"],
                "--probe-timeout: the step timeout (2s) must be shorter than the interval (1s)",
            ),
            (
                &["--mesh-interval", "0"],
                "--mesh-interval: 0 is not a number of seconds between 0.01 and 3600",
            ),
            (
                &["--mesh-target-label", "rack", "--mesh-target-label", "rack"],
                "--mesh-target-label: \"rack\" is named twice",
            ),
            (
                &["--mesh-targets-file", "targets.csv"],
                "--mesh-targets-file: \"targets.csv\": the extension tells the format",
            ),
            (
                &["--target", "a=198.18.0.1", "--probe-mode", "ud"],
                "--probe-mode: \"ud\" targets are probed by the mesh: needs [mesh] (or --mesh)",
            ),
            (
                &[
                    "--mesh",
                    "--target",
                    "a=198.18.0.1",
                    "--probe-mode",
                    "ud",
                    "--probe-pings",
                    "2",
                ],
                "--probe-pings: not used by mode = \"ud\"",
            ),
        ];
        for (flags, expected) in cases {
            let args = cli(flags).unwrap();
            let e = apply_flags(Settings::default(), &args.run)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("command line: {expected}")),
                "for {flags:?}\n  got:      {e}\n  expected: command line: {expected}…"
            );
        }
        // not numbers, not NAME=ADDR: clap's own errors
        assert!(cli(&["--max-process-labels", "many"]).is_err());
        assert!(cli(&["--target", "noequals"]).is_err());
        assert!(cli(&["--buckets-dwell", "1,x"]).is_err());
    }

    /// Without `--target`, the `--probe-*` defaults apply to nothing (the
    /// file's targets are kept as they are).
    #[test]
    fn probe_defaults_need_a_target() {
        let file = parse("[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"").unwrap();
        let args = cli(&["--probe-pings", "3"]).unwrap();
        let s = apply_flags(file.clone(), &args.run).unwrap();
        assert_eq!(s.targets, file.targets);
        let args = cli(&["--target", "b=198.18.0.2", "--probe-pings", "3"]).unwrap();
        let s = apply_flags(file, &args.run).unwrap();
        assert_eq!(s.targets.len(), 1);
        assert_eq!((s.targets[0].name.as_str(), s.targets[0].pings), ("b", 3));
    }

    #[test]
    fn mesh_flags() {
        let args = cli(&[
            "--mesh-targets-file",
            "/etc/qpwatch/targets.json",
            "--mesh-target-label",
            "rack",
            "--mesh-target-label",
            "tor",
            "--mesh-interval",
            "0.1",
            "--mesh-timeout",
            "0.5",
            "--mesh-targets-file-check",
            "1",
            "--mesh-max-targets",
            "10",
            "--mesh-source",
            "198.18.0.1",
            "--mesh-listen",
            "198.18.0.1:9000",
            "--mesh-rtt-breakdown",
            "false",
            "--target",
            "a=198.18.0.2",
            "--probe-mode",
            "ud",
        ])
        .unwrap();
        let s = apply_flags(Settings::default(), &args.run).unwrap();
        let m = s.mesh.expect("any --mesh-* flag: fleet mode");
        assert_eq!(m.target_labels, ["rack", "tor"]);
        assert_eq!(m.interval, std::time::Duration::from_millis(100));
        assert_eq!(m.max_targets, 10);
        assert_eq!(m.listen, Some("198.18.0.1:9000".parse().unwrap()));
        assert!(!m.rtt_breakdown);
        assert_eq!(s.targets[0].mode, ProbeModeSetting::Ud);
        assert_eq!(s.responder_listen, Some("0.0.0.0:9723".parse().unwrap()));

        // the file's [mesh] keys stay under the flags'
        let file = parse("[mesh]\nmax_targets = 5\ntarget_labels = [\"rack\"]").unwrap();
        let args = cli(&["--mesh-interval", "2", "--responder-listen", "198.18.0.1"]).unwrap();
        let s = apply_flags(file, &args.run).unwrap();
        let m = s.mesh.unwrap();
        assert_eq!(
            (m.max_targets, m.target_labels.as_slice()),
            (5, &["rack".to_owned()][..])
        );
        assert_eq!(m.interval, std::time::Duration::from_secs(2));
        assert_eq!(s.responder_listen, Some("198.18.0.1:9723".parse().unwrap()));

        // the flag turns the breakdown back on over the file, and alone
        // turns fleet mode on
        let file = parse("[mesh]\nrtt_breakdown = false").unwrap();
        let args = cli(&["--mesh-rtt-breakdown", "true"]).unwrap();
        let s = apply_flags(file, &args.run).unwrap();
        assert!(s.mesh.unwrap().rtt_breakdown);
        let args = cli(&["--mesh-rtt-breakdown", "false"]).unwrap();
        let s = apply_flags(Settings::default(), &args.run).unwrap();
        assert!(!s.mesh.expect("fleet mode").rtt_breakdown);
        assert!(
            cli(&["--mesh-rtt-breakdown", "yes"]).is_err(),
            "true or false"
        );

        let s = apply_flags(Settings::default(), &cli(&["--mesh"]).unwrap().run).unwrap();
        assert_eq!(
            s.mesh,
            Some(crate::service::config::MeshSettings::default())
        );
        let s = apply_flags(Settings::default(), &cli(&[]).unwrap().run).unwrap();
        assert_eq!(s.mesh, None);
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
