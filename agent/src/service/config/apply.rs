//! The one way values become [`Settings`]: the file and the flags each give
//! an [`Input`], every value with where it came from, and [`Input::apply`]
//! checks them (against [`super::limits`] and [`super::rules`]) over the
//! settings so far: the defaults for the file, the file's for the flags.

use std::{collections::HashSet, path::PathBuf};

use super::{
    cli::{LogFormat, ProbeModeSetting, RunArgs},
    error::{ConfigError, Origin},
    limits::{
        Limit, MAX_DEVICE_LABELS, MAX_PROCESS_LABELS, MAX_TRACKED_QPS, MODULE_POLL_INTERVAL,
        RING_BUFFER_BYTES, TARGET_INTERVAL, TARGET_JITTER, TARGET_MESSAGE_SIZE, TARGET_PINGS,
        TARGET_TIMEOUT,
    },
    rules::{
        check_buckets, check_groups, check_listen, check_log_level, check_source,
        check_target_name, parse_target_address,
    },
    settings::{Settings, Target},
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
    pub log_level: Option<Given<String>>,
    pub log_format: Option<LogFormat>,
    pub groups: Option<Given<Vec<String>>>,
    pub strict: Option<bool>,
    pub reconcile: Option<bool>,
    pub bpf_stats: Option<bool>,
    pub module_poll_interval: Option<Given<f64>>,
    pub ring_buffer_bytes: Option<Given<i64>>,
    pub btf_dir: Option<PathBuf>,
    pub max_tracked_qps: Option<Given<i64>>,
    pub max_device_labels: Option<Given<i64>>,
    pub max_process_labels: Option<Given<i64>>,
    pub buckets_call_latency: Option<Given<Vec<f64>>>,
    pub buckets_dwell: Option<Given<Vec<f64>>>,
    pub buckets_lifetime: Option<Given<Vec<f64>>>,
    pub buckets_probe_rtt: Option<Given<Vec<f64>>>,
    /// The responder's address, and whether it is enabled.
    pub responder: Option<(Given<String>, bool)>,
    /// `Some`: these targets replace those so far.
    pub targets: Option<Vec<TargetInput>>,
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
    pub mode: Option<ProbeModeSetting>,
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
        if let Some((listen, enabled)) = &self.responder {
            let listen = listen.check(|v| parse_target_address(v))?;
            if *enabled {
                s.responder_listen = Some(listen);
            }
        }
        if let Some(targets) = &self.targets {
            let mut names = HashSet::new();
            s.targets = targets
                .iter()
                .map(|t| t.check(&mut names))
                .collect::<Result<_, _>>()?;
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
        t.mode = self.mode.unwrap_or(t.mode);
        if t.timeout >= t.interval {
            return Err(self.timeout_seconds.error(format!(
                "the step timeout ({:?}) must be shorter than the interval ({:?})",
                t.timeout, t.interval
            )));
        }
        Ok(t)
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
            log_level: flag("--log-level", &self.log_level),
            log_format: self.log_format,
            groups: self.groups.clone().map(|v| Given::flag("--groups", v)),
            strict: self.strict.then_some(true),
            reconcile: self.no_reconcile.then_some(false),
            bpf_stats: self.bpf_stats.then_some(true),
            module_poll_interval: seconds(&MODULE_POLL_INTERVAL, self.module_poll_interval),
            ring_buffer_bytes: limited(&RING_BUFFER_BYTES, self.ring_buffer_bytes),
            btf_dir: self.btf_dir.clone(),
            max_tracked_qps: limited(&MAX_TRACKED_QPS, self.max_tracked_qps),
            max_device_labels: limited(&MAX_DEVICE_LABELS, self.max_device_labels),
            max_process_labels: limited(&MAX_PROCESS_LABELS, self.max_process_labels),
            buckets_call_latency: buckets("--buckets-call-latency", &self.buckets_call_latency),
            buckets_dwell: buckets("--buckets-dwell", &self.buckets_dwell),
            buckets_lifetime: buckets("--buckets-lifetime", &self.buckets_lifetime),
            buckets_probe_rtt: buckets("--buckets-probe-rtt", &self.buckets_probe_rtt),
            responder: flag("--responder-listen", &self.responder_listen).map(|l| (l, true)),
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
                        mode: self.probe_mode,
                    })
                    .collect()
            }),
        }
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
                "--groups: unknown hook group \"bogus\" (qp, cm, kernel-ulp, ib-cm-tracepoints)",
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
