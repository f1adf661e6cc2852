//! Fleet mode: the UD probe mesh ([`rdma_probe::mesh`]) run with the inline
//! `mode = "ud"` targets, the targets file's and the discovered peers, its
//! callbacks counted into the mesh metrics, its UD QP cross-checked against
//! the hooks.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Instant,
};

use rdma_probe::{
    mesh::{Answer, Dropped, Mesh, MeshConfig, MeshHandle, MeshSink, MeshTarget, DEFAULT_UD_PORT},
    Error, ProbeResult, QpCall,
};
use tracing::{debug, info, warn};

use crate::{
    export::metrics::mesh::{TargetSource, RESOLVE_FAILURE_REASONS},
    service::{
        config::{MeshSettings, Target},
        targets_file::{FileTarget, Reload, TargetsFileWatcher},
    },
    synthetic::{discovery::Discovery, prober::ProbeSink},
};

/// The `target` label of the mesh's UD QP cross-check.
const CROSS_CHECK_TARGET: &str = "mesh";

/// A target the mesh is to probe, with what its metrics need.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTarget {
    pub target: MeshTarget,
    pub source: TargetSource,
    pub labels: BTreeMap<String, String>,
}

/// The targets to probe: inline ones first, then the file's, then the
/// discovered peers (their responder at the default port, named by their
/// address), each key and each address once, at most `max_targets`. A
/// discovered peer that is configured already is left out silently.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub targets: Vec<PlannedTarget>,
    /// Left out: an earlier target has the same name or address.
    pub duplicates: Vec<Arc<str>>,
    /// Left out: beyond `max_targets`.
    pub refused: Vec<Arc<str>>,
}

pub fn plan(
    settings: &MeshSettings,
    inline: &[Target],
    file: &[FileTarget],
    discovered: &[IpAddr],
) -> Plan {
    let mesh_target = |key: &str, address: SocketAddr, source| MeshTarget {
        key: Arc::from(key),
        address,
        source,
        interval: settings.interval,
    };
    let candidates = inline
        .iter()
        .map(|t| PlannedTarget {
            target: mesh_target(&t.name, t.address, t.source.or(settings.source)),
            source: TargetSource::Config,
            labels: BTreeMap::new(),
        })
        .chain(file.iter().map(|t| PlannedTarget {
            target: mesh_target(&t.name, t.address, settings.source),
            source: TargetSource::File,
            labels: t.labels.clone(),
        }))
        .chain(discovered.iter().map(|&ip| PlannedTarget {
            target: mesh_target(
                &ip.to_string(),
                SocketAddr::new(ip, DEFAULT_UD_PORT),
                settings.source,
            ),
            source: TargetSource::Discovered,
            labels: BTreeMap::new(),
        }));
    let mut plan = Plan::default();
    let mut keys = HashSet::new();
    let mut addresses = HashSet::new();
    for candidate in candidates {
        let key = Arc::clone(&candidate.target.key);
        if keys.contains(&key) || addresses.contains(&candidate.target.address) {
            if candidate.source != TargetSource::Discovered {
                plan.duplicates.push(key);
            }
        } else if plan.targets.len() >= settings.max_targets {
            plan.refused.push(key);
        } else {
            keys.insert(key);
            addresses.insert(candidate.target.address);
            plan.targets.push(candidate);
        }
    }
    plan
}

/// `allow`: `responder.allow`, for the UD responder too.
fn mesh_config(settings: &MeshSettings, allow: &[rdma_probe::Subnet]) -> MeshConfig {
    MeshConfig {
        listen: settings.listen,
        timeout: settings.timeout,
        rtt_breakdown: settings.rtt_breakdown,
        allow: rdma_probe::AllowList::new(allow.to_vec()),
        answer_rate_per_source: Some(f64::from(settings.answer_rate_per_source)),
        ..MeshConfig::default()
    }
}

/// Where the mesh thread reports: counts, and logs what an operator acts on.
/// Nothing here waits (the cross-check runs on a thread of its own).
struct MeshReporter {
    sink: ProbeSink,
    /// Targets whose resolution fails, with the last error logged.
    failing: Mutex<HashMap<Arc<str>, String>>,
}

impl MeshReporter {
    fn failing(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, String>> {
        self.failing.lock().expect("not poisoned")
    }
}

/// A resolution error as a bounded reason label.
fn resolve_failure_reason(error: &Error) -> &'static str {
    let reason = ProbeResult::of_error(error).as_str();
    if RESOLVE_FAILURE_REASONS.contains(&reason) {
        reason
    } else {
        "error"
    }
}

impl MeshSink for MeshReporter {
    fn qp_created(&self, device: &str, qp_num: u32, calls: &[QpCall]) {
        info!(device, qp_num, "mesh UD QP created");
        let sink = self.sink.clone();
        let device = device.to_owned();
        let calls = calls.to_vec();
        let spawned = std::thread::Builder::new()
            .name("mesh-crosscheck".to_owned())
            .spawn(move || sink.check_qp(CROSS_CHECK_TARGET, &device, qp_num, &calls));
        if let Err(error) = spawned {
            warn!(%error, "cannot cross-check the mesh UD QP");
        }
    }

    fn resolved(&self, target: &Arc<str>, device: &str, remote_qp_num: u32) {
        self.sink.metrics.mesh.resolved(target);
        if self.failing().remove(target).is_some() {
            info!(target = %target, device, remote_qp_num, "mesh target resolved");
        } else {
            debug!(target = %target, device, remote_qp_num, "mesh target resolved");
        }
    }

    fn resolve_failed(&self, target: &Arc<str>, error: &Error) {
        let reason = resolve_failure_reason(error);
        self.sink.metrics.mesh.resolve_failed(target, reason);
        let error = error.to_string();
        let mut failing = self.failing();
        if failing.get(target) != Some(&error) {
            warn!(target = %target, reason, %error, "mesh target not resolved (retrying)");
            failing.insert(Arc::clone(target), error);
        }
    }

    fn sent(&self, target: &Arc<str>) {
        self.sink.metrics.mesh.sent(target);
    }

    fn send_failed(&self, target: &Arc<str>, error: &Error) {
        debug!(target = %target, %error, "mesh probe not posted");
        self.sink.metrics.mesh.send_failed(target);
    }

    fn answered(&self, target: &Arc<str>, answer: &Answer) {
        self.sink.metrics.mesh.answered(target, answer);
    }

    fn lost(&self, target: &Arc<str>, _seq: u64) {
        self.sink.metrics.mesh.lost(target);
    }

    fn responded(&self, device: &str) {
        self.sink.metrics.mesh.responded(device);
    }

    fn dropped(&self, reason: Dropped) {
        self.sink.metrics.mesh.dropped(reason);
    }
}

/// The mesh, its targets, the targets file, and their reconfiguration.
pub struct MeshProber {
    reporter: Arc<MeshReporter>,
    settings: Option<MeshSettings>,
    /// Inline `mode = "ud"` targets.
    inline: Vec<Target>,
    file: Option<TargetsFileWatcher>,
    /// The file's last good list.
    file_targets: Vec<FileTarget>,
    running: Option<(MeshConfig, MeshHandle)>,
    /// The mesh that could not start, and why (retried).
    failed: Option<(MeshConfig, String)>,
    /// What is probed now (and has series), by key.
    probed: HashMap<Arc<str>, PlannedTarget>,
    /// Refused at the last plan (each counted once while refused).
    refused: HashSet<Arc<str>>,
    /// The peers of live QPs probed (`[mesh] discover`).
    discovery: Option<Discovery>,
}

impl MeshProber {
    pub fn new(sink: ProbeSink) -> Self {
        Self {
            reporter: Arc::new(MeshReporter {
                sink,
                failing: Mutex::default(),
            }),
            settings: None,
            inline: Vec::new(),
            file: None,
            file_targets: Vec::new(),
            running: None,
            failed: None,
            probed: HashMap::new(),
            refused: HashSet::new(),
            discovery: None,
        }
    }

    fn metrics(&self) -> &crate::export::metrics::mesh::MeshMetrics {
        &self.reporter.sink.metrics.mesh
    }

    /// Makes the mesh match the settings (`None`: fleet mode off); targets
    /// that did not change keep their resolution and sequence numbers.
    pub fn apply(
        &mut self,
        settings: Option<&MeshSettings>,
        inline: &[Target],
        allow: &[rdma_probe::Subnet],
    ) {
        let Some(settings) = settings else {
            self.stop();
            return;
        };
        let labels = self.metrics().target_labels();
        if settings.target_labels != labels {
            warn!(
                configured = ?settings.target_labels,
                exported = ?labels,
                "mesh.target_labels change only on restart; the mesh metrics keep their labels"
            );
        }
        self.settings = Some(settings.clone());
        self.inline = inline.to_vec();
        match (&mut self.discovery, settings.discover) {
            (Some(d), true) => {
                d.set_limits(settings.discover_expiry, settings.discover_max_targets)
            }
            (None, true) => {
                self.discovery = Some(Discovery::new(
                    settings.discover_expiry,
                    settings.discover_max_targets,
                ))
            }
            (_, false) => self.discovery = None,
        }
        self.metrics().set_rtt_breakdown(settings.rtt_breakdown);
        let path = settings.targets_file.as_deref();
        if self.file.as_ref().map(TargetsFileWatcher::path) != path {
            self.file = path.and_then(|p| TargetsFileWatcher::new(p.to_owned()));
            self.file_targets.clear();
            if self.file.is_some() {
                self.metrics().targets_file_configured();
                self.read_targets_file();
            } else {
                self.metrics().targets_file_unconfigured();
            }
        }
        let config = mesh_config(settings, allow);
        let wanted = Some(&config);
        if self.running.as_ref().map(|(c, _)| c) != wanted {
            self.stop_engine();
            if self.failed.as_ref().map(|(c, _)| c) != wanted {
                self.failed = None;
            }
            self.start_engine(config);
        }
        self.push_targets();
    }

    /// Whether the mesh probes the peers of live QPs.
    pub fn discovering(&self) -> bool {
        self.discovery.is_some()
    }

    /// The remote addresses of the live QPs now (`live`) and this host's own:
    /// re-plans if a discovered target came or expired.
    pub fn update_discovered(&mut self, now: Instant, live: &[IpAddr], local: &HashSet<IpAddr>) {
        let Some(discovery) = self.discovery.as_mut() else {
            return;
        };
        let update = discovery.update(now, live, local);
        if !update.refused.is_empty() {
            warn!(
                first = %update.refused[0],
                count = update.refused.len(),
                "discovered peers beyond discover_max_targets are not probed"
            );
            for _ in &update.refused {
                self.reporter
                    .sink
                    .metrics
                    .limits
                    .label_overflow("discovered_target");
            }
        }
        if update.changed() {
            info!(added = ?update.added, expired = ?update.expired, "discovered mesh targets");
            self.push_targets();
        }
    }

    /// Checks the targets file, and re-plans if it changed.
    pub fn check_targets_file(&mut self) {
        if self.read_targets_file() {
            self.push_targets();
        }
    }

    /// Reads the targets file if it changed; whether its list was replaced.
    fn read_targets_file(&mut self) -> bool {
        let Some(file) = self.file.as_mut() else {
            return false;
        };
        match file.check() {
            Reload::Unchanged => false,
            Reload::Loaded(list) => {
                info!(
                    path = %file.path().display(),
                    targets = list.targets.len(),
                    duplicates = list.duplicates.len(),
                    "targets file read"
                );
                if !list.duplicates.is_empty() {
                    warn!(
                        path = %file.path().display(),
                        first = %list.duplicates[0],
                        count = list.duplicates.len(),
                        "targets file: entries with the address of an earlier one left out"
                    );
                }
                self.reporter.sink.metrics.mesh.targets_file_read(true);
                self.file_targets = list.targets;
                true
            }
            Reload::Failed { error, repeated } => {
                if !repeated {
                    warn!(%error, "targets file not loaded; the last good list is probed");
                }
                self.reporter.sink.metrics.mesh.targets_file_read(false);
                false
            }
        }
    }

    /// Plans the targets, brings the series and the running mesh to it.
    fn push_targets(&mut self) {
        let Some(settings) = &self.settings else {
            return;
        };
        let discovered: Vec<IpAddr> = self
            .discovery
            .as_ref()
            .map(|d| d.targets().collect())
            .unwrap_or_default();
        let plan = plan(settings, &self.inline, &self.file_targets, &discovered);
        let metrics = &self.reporter.sink.metrics;
        if !plan.duplicates.is_empty() {
            warn!(
                first = %plan.duplicates[0],
                count = plan.duplicates.len(),
                "mesh targets with the name or address of an earlier one left out"
            );
        }
        let newly_refused: Vec<&Arc<str>> = plan
            .refused
            .iter()
            .filter(|k| !self.refused.contains(*k))
            .collect();
        if !newly_refused.is_empty() {
            warn!(
                max_targets = settings.max_targets,
                refused = plan.refused.len(),
                first = %plan.refused[0],
                "mesh targets beyond max_targets are not probed"
            );
            for _ in &newly_refused {
                metrics.limits.label_overflow("target");
            }
        }
        self.refused = plan.refused.iter().cloned().collect();

        let wanted: HashMap<&Arc<str>, &PlannedTarget> =
            plan.targets.iter().map(|t| (&t.target.key, t)).collect();
        self.probed.retain(|key, old| {
            let keep = wanted.get(key).is_some_and(|t| t.labels == old.labels);
            if !keep {
                metrics.mesh.remove_target(key);
                self.reporter.failing().remove(key);
            }
            keep
        });
        for t in &plan.targets {
            if !self.probed.contains_key(&t.target.key) {
                metrics.mesh.add_target(&t.target.key, &t.labels);
            }
        }
        self.probed = plan
            .targets
            .iter()
            .map(|t| (Arc::clone(&t.target.key), t.clone()))
            .collect();
        for source in TargetSource::ALL {
            let count = plan.targets.iter().filter(|t| t.source == source).count();
            metrics.mesh.targets(source, count);
        }
        if let Some((_, handle)) = &self.running {
            handle.set_targets(plan.targets.into_iter().map(|t| t.target).collect());
        }
    }

    /// Starts the mesh; a failure (no RDMA device, no address yet) is
    /// logged once per distinct error and retried by [`MeshProber::retry`].
    fn start_engine(&mut self, config: MeshConfig) {
        let sink: Arc<dyn MeshSink> = self.reporter.clone();
        match Mesh::spawn(config.clone(), sink) {
            Ok(handle) => {
                info!(
                    listen = ?config.listen,
                    rtt_breakdown = config.rtt_breakdown,
                    "UD probe mesh running"
                );
                self.reporter.sink.metrics.mesh.started();
                self.reporter
                    .sink
                    .metrics
                    .probes
                    .unseen_at_zero(CROSS_CHECK_TARGET);
                self.running = Some((config, handle));
                self.failed = None;
            }
            Err(error) => {
                let error = error.to_string();
                if self.failed.as_ref().map(|(_, e)| e) != Some(&error) {
                    warn!(listen = ?config.listen, %error, "UD probe mesh not started (retrying)");
                }
                self.failed = Some((config, error));
            }
        }
    }

    fn stop_engine(&mut self) {
        if let Some((config, handle)) = self.running.take() {
            match handle.stop() {
                Ok(stats) => info!(
                    listen = ?config.listen,
                    sent = stats.sent,
                    answered = stats.answered,
                    lost = stats.lost,
                    responded = stats.responded,
                    "UD probe mesh stopped"
                ),
                Err(error) => warn!(%error, "UD probe mesh stopped with an error"),
            }
        }
    }

    /// Whether a mesh that could not start waits to be retried.
    pub fn pending(&self) -> bool {
        self.failed.is_some()
    }

    pub fn retry(&mut self) {
        if let Some((config, _)) = self.failed.clone() {
            self.start_engine(config);
            if self.running.is_some() {
                self.push_targets();
            }
        }
    }

    /// Brings the mesh's QP count into the metrics (at scrape time).
    pub fn refresh(&self) {
        if let Some((_, handle)) = &self.running {
            self.metrics().qps(handle.stats().qps);
        }
    }

    /// Fleet mode off: the mesh stopped, every series removed.
    pub fn stop(&mut self) {
        self.stop_engine();
        self.failed = None;
        for key in self.probed.keys() {
            self.metrics().remove_target(key);
        }
        self.probed.clear();
        self.refused.clear();
        self.reporter.failing().clear();
        if self.settings.take().is_some() {
            self.metrics().stopped();
            self.metrics().targets_file_unconfigured();
            self.reporter
                .sink
                .metrics
                .probes
                .forget_unseen(CROSS_CHECK_TARGET);
        }
        self.file = None;
        self.file_targets.clear();
        self.inline.clear();
        self.discovery = None;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::service::config::ProbeModeSetting;

    fn inline(name: &str, address: &str) -> Target {
        Target {
            name: name.to_owned(),
            address: address.parse().unwrap(),
            source: None,
            device: None,
            interval: Duration::from_secs(10),
            jitter: 0.0,
            pings: 1,
            timeout: Duration::from_secs(1),
            message_size: 64,
            mode: ProbeModeSetting::Ud,
        }
    }

    fn file(name: &str, rack: &str) -> FileTarget {
        FileTarget {
            name: name.to_owned(),
            address: rdma_probe::parse_target(name).unwrap(),
            labels: BTreeMap::from([("rack".to_owned(), rack.to_owned())]),
        }
    }

    fn keys(targets: &[PlannedTarget]) -> Vec<&str> {
        targets.iter().map(|t| &*t.target.key).collect()
    }

    #[test]
    fn inline_first_then_the_file_each_once() {
        let settings = MeshSettings {
            source: Some("198.18.0.1".parse().unwrap()),
            interval: Duration::from_millis(100),
            ..MeshSettings::default()
        };
        let plan = plan(
            &settings,
            &[inline("peer2", "198.18.0.2:9723")],
            &[file("198.18.0.2", "r1"), file("198.18.0.3", "r1")],
            &["198.18.0.3".parse().unwrap(), "198.18.0.4".parse().unwrap()],
        );
        assert_eq!(keys(&plan.targets), ["peer2", "198.18.0.3", "198.18.0.4"]);
        assert_eq!(
            plan.duplicates,
            [Arc::from("198.18.0.2")],
            "a discovered peer configured already is no duplicate to report"
        );
        assert_eq!(plan.targets[2].source, TargetSource::Discovered);
        assert_eq!(
            plan.targets[2].target.address,
            SocketAddr::new("198.18.0.4".parse().unwrap(), DEFAULT_UD_PORT)
        );
        assert_eq!(plan.targets[0].source, TargetSource::Config);
        assert_eq!(plan.targets[1].source, TargetSource::File);
        assert_eq!(plan.targets[1].labels["rack"], "r1");
        for t in &plan.targets {
            assert_eq!(t.target.interval, Duration::from_millis(100));
            assert_eq!(t.target.source, settings.source);
        }
    }

    #[test]
    fn beyond_max_targets_is_refused() {
        let settings = MeshSettings {
            max_targets: 2,
            ..MeshSettings::default()
        };
        let targets: Vec<FileTarget> = (2..6).map(|i| file(&format!("198.18.0.{i}"), "")).collect();
        let plan = plan(&settings, &[], &targets, &[]);
        assert_eq!(keys(&plan.targets), ["198.18.0.2", "198.18.0.3"]);
        assert_eq!(
            plan.refused,
            [Arc::from("198.18.0.4"), Arc::from("198.18.0.5")]
        );
    }

    /// The prober's bookkeeping, whatever the engine does (on a host without
    /// RDMA it cannot start, and is left pending).
    #[test]
    fn series_follow_the_config_and_the_targets_file() {
        use crate::export::metrics::{render, Buckets, Metrics};

        let metrics = Metrics::with_target_labels(&Buckets::default(), "k", &["rack".to_owned()]);
        let sink = ProbeSink {
            metrics: metrics.clone(),
            own_calls: Default::default(),
            qp_tracing: Default::default(),
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("targets.yaml");
        let write = |text: &str| {
            let tmp = dir.path().join("tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        write("- targets: [198.18.0.2, 198.18.0.3, 198.18.0.4]\n  labels: {rack: r1}\n");
        let settings = MeshSettings {
            listen: None,
            targets_file: Some(path.clone()),
            max_targets: 3,
            target_labels: vec!["rack".to_owned()],
            ..MeshSettings::default()
        };
        let mut mesh = MeshProber::new(sink);
        mesh.apply(Some(&settings), &[inline("peer9", "198.18.0.9:9723")], &[]);
        let sent = |text: &str, target: &str, rack: &str| {
            text.lines().any(|l| {
                l.starts_with(&format!(
                    "qpwatch_mesh_probes_sent_total{{rack=\"{rack}\",target=\"{target}\"}} 0"
                ))
            })
        };
        let text = render(&metrics.registry);
        assert!(sent(&text, "peer9", ""), "{text}");
        assert!(sent(&text, "198.18.0.2", "r1"));
        assert!(sent(&text, "198.18.0.3", "r1"));
        assert!(!text.contains("198.18.0.4"), "beyond max_targets");
        assert!(text.contains("qpwatch_label_overflow_total{label=\"target\"} 1"));
        assert!(text.contains("qpwatch_mesh_targets{source=\"config\"} 1"));
        assert!(text.contains("qpwatch_mesh_targets{source=\"file\"} 2"));
        assert!(text.contains("qpwatch_mesh_targets_file_ok 1"));

        // a bad file keeps the last good list
        write("- targets: [node1]\n");
        mesh.check_targets_file();
        let text = render(&metrics.registry);
        assert!(sent(&text, "198.18.0.2", "r1"));
        assert!(text.contains("qpwatch_mesh_targets_file_ok 0"));
        assert!(text.contains("qpwatch_mesh_targets_file_reloads_total{result=\"error\"} 1"));

        // a good one replaces it: removed targets lose their series, a
        // refused one is counted once while refused
        write("- targets: [198.18.0.3, 198.18.0.5, 198.18.0.6]\n  labels: {rack: r2}\n");
        mesh.check_targets_file();
        mesh.check_targets_file();
        let text = render(&metrics.registry);
        assert!(!text.contains("198.18.0.2"));
        assert!(sent(&text, "198.18.0.3", "r2"), "new labels, new series");
        assert!(!text.contains("rack=\"r1\""));
        assert!(text.contains("qpwatch_label_overflow_total{label=\"target\"} 2"));
        assert!(text.contains("qpwatch_mesh_targets_file_ok 1"));

        // fleet mode off: nothing of the mesh is left
        mesh.apply(None, &[], &[]);
        let text = render(&metrics.registry);
        assert!(!text.contains("target=\""), "{text}");
        assert!(!text.contains("qpwatch_mesh_targets{"));
        assert!(!text.contains("qpwatch_mesh_targets_file_ok "));
        assert!(!mesh.pending());
    }

    /// `rtt_breakdown` reaches the mesh's config and the series; answers
    /// feed the breakdown only while it is on.
    #[test]
    fn rtt_breakdown_follows_the_config() {
        use crate::export::metrics::{render, Buckets, Metrics};
        use rdma_probe::mesh::Clock;

        let metrics = Metrics::new(&Buckets::default(), "k");
        let sink = ProbeSink {
            metrics: metrics.clone(),
            own_calls: Default::default(),
            qp_tracing: Default::default(),
        };
        let mut mesh = MeshProber::new(sink);
        let on = MeshSettings {
            listen: None,
            ..MeshSettings::default()
        };
        let off = MeshSettings {
            rtt_breakdown: false,
            ..on.clone()
        };
        assert!(mesh_config(&on, &[]).rtt_breakdown);
        assert!(!mesh_config(&off, &[]).rtt_breakdown);

        let peer: Arc<str> = Arc::from("peer2");
        let answer = Answer {
            seq: 1,
            sent_ns: 0,
            received_ns: 80_000,
            responder_rx_ns: 10,
            responder_tx_ns: 20_010,
            prober_delay_ns: Some(9_000),
            clock: Clock::Software,
        };
        let count = |text: &str, family: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{family}_count{{")) && l.contains("peer2"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        mesh.apply(Some(&off), &[inline("peer2", "198.18.0.2:9723")], &[]);
        mesh.reporter.answered(&peer, &answer);
        let text = render(&metrics.registry);
        assert_eq!(count(&text, "qpwatch_mesh_probe_rtt_seconds"), Some(1.0));
        assert_eq!(count(&text, "qpwatch_mesh_probe_network_rtt_seconds"), None);
        assert!(
            !text.contains("qpwatch_mesh_prober_delay_seconds"),
            "{text}"
        );
        assert!(!text.contains("qpwatch_mesh_responder_delay_seconds"));

        // on (a SIGHUP): the series from 0, fed by the next answers
        mesh.apply(Some(&on), &[inline("peer2", "198.18.0.2:9723")], &[]);
        mesh.reporter.answered(&peer, &answer);
        let text = render(&metrics.registry);
        assert_eq!(count(&text, "qpwatch_mesh_probe_rtt_seconds"), Some(2.0));
        for family in [
            "qpwatch_mesh_probe_network_rtt_seconds",
            "qpwatch_mesh_responder_delay_seconds",
            "qpwatch_mesh_prober_delay_seconds",
        ] {
            assert_eq!(count(&text, family), Some(1.0), "{family}");
        }
        assert!(text.contains(
            "qpwatch_mesh_probe_network_rtt_seconds_sum{clock=\"software\",target=\"peer2\"} 0.00006"
        ));

        mesh.apply(None, &[], &[]);
        assert!(!render(&metrics.registry).contains("peer2"));
    }

    #[test]
    fn resolve_reasons_are_bounded() {
        let cm = |call| Error::Cm {
            call,
            errno: rdma_probe::Errno(110),
        };
        assert_eq!(
            resolve_failure_reason(&cm("rdma_resolve_addr")),
            "addr_error"
        );
        assert_eq!(
            resolve_failure_reason(&cm("rdma_resolve_route")),
            "route_error"
        );
        assert_eq!(resolve_failure_reason(&cm("rdma_connect")), "error");
        assert_eq!(
            resolve_failure_reason(&Error::InvalidConfig("x".into())),
            "error"
        );
    }
}
