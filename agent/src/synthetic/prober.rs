//! The agent's synthetic RDMA probes: a responder, and a scheduler running
//! each configured target on its own thread, whose outcomes are counted and
//! cross-checked against the kernel calls the eBPF path saw.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use rdma_probe::{
    probe_summary, run_probes, PollMode, ProbeConfig, ProbeDriver, ProbeMode, ProbeOutcome, QpCall,
    Responder, ResponderConfig, ResponderHandle, ResponderStats,
};
use tracing::{info, warn};

use crate::{
    export::metrics::Metrics,
    service::config::{
        MeshSettings, ProbeArgs, ProbeModeSetting, ResponderArgs, ResponderSettings, Target,
    },
    synthetic::{crosscheck::OwnCallLog, mesh::MeshProber},
};

fn responder_config(listen: SocketAddr, settings: &ResponderSettings) -> ResponderConfig {
    let mut config = ResponderConfig::new(listen);
    config.max_connections = settings.max_connections;
    config.max_per_source = settings.max_per_source;
    config.idle_timeout = settings.idle_timeout;
    config.allow = rdma_probe::AllowList::new(settings.allow.clone());
    config
}

fn probe_config(target: &Target) -> ProbeConfig {
    let mut config = ProbeConfig::new(target.address);
    config.source = target.source;
    config.device.clone_from(&target.device);
    config.pings = target.pings;
    config.message_size = target.message_size;
    config.step_timeout = target.timeout;
    config
}

/// How long after a probe the kernel's events about its QPs may still be on
/// their way through the ring buffer.
const KERNEL_EVENT_GRACE: Duration = Duration::from_secs(5);

/// Shared by the probe threads: where outcomes go.
#[derive(Clone)]
pub struct ProbeSink {
    pub metrics: Metrics,
    /// The kernel's side of the cross-check.
    pub own_calls: OwnCallLog,
    /// The QP hooks are attached: the kernel side of the cross-check can be seen.
    pub qp_tracing: Arc<AtomicBool>,
}

impl ProbeSink {
    /// Matches the probe's QP calls to the kernel's. The kernel's events are
    /// drained asynchronously, so this waits (up to a grace period) until
    /// each userspace call has its counterpart.
    fn cross_check(&self, target: &str, outcome: &ProbeOutcome) {
        let Some(device) = &outcome.device else {
            return;
        };
        for (qp_num, user_calls) in &outcome.qp_calls {
            self.check_qp(target, device, *qp_num, user_calls);
        }
    }

    /// Cross-checks one QP's successful calls (waits up to a grace period).
    pub fn check_qp(&self, target: &str, device: &str, qp_num: u32, calls: &[QpCall]) {
        if !self.qp_tracing.load(Ordering::Acquire) {
            return;
        }
        let key = (device.to_owned(), qp_num);
        let user_calls: Vec<QpCall> = calls.iter().filter(|c| c.rc == 0).cloned().collect();
        let checked = self.own_calls.check(&key, &user_calls, KERNEL_EVENT_GRACE);
        for (call, skew) in &checked.skews {
            self.metrics.probes.skew(call, *skew);
        }
        if !checked.missing.is_empty() {
            warn!(
                target,
                qp_num,
                device,
                missing = %checked.missing.join(", "),
                "probe QP calls the eBPF path did not see"
            );
            self.metrics.probes.qp_unseen(target);
        }
    }
}

/// One target's probe thread.
struct TargetRunner {
    target: Target,
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

fn jittered(interval: Duration, jitter: f64) -> Duration {
    if jitter == 0.0 {
        return interval;
    }
    // A cheap, per-process random: the low bits of the monotonic clock.
    let r = (rdma_probe::monotonic_ns() % 10_000) as f64 / 10_000.0;
    interval.mul_f64(1.0 + jitter * (2.0 * r - 1.0))
}

/// A target's probe loop, until its runner says stop: each outcome counted
/// and cross-checked.
struct TargetLoop {
    target: Target,
    sink: ProbeSink,
    stop: mpsc::Receiver<()>,
}

impl ProbeDriver for TargetLoop {
    fn pause(&mut self, index: u64) -> bool {
        let mut wait = jittered(self.target.interval, self.target.jitter);
        if index == 0 {
            wait = wait.min(Duration::from_secs(1));
        }
        // a message or a dropped sender both mean stop
        matches!(
            self.stop.recv_timeout(wait),
            Err(mpsc::RecvTimeoutError::Timeout)
        )
    }

    fn outcome(&mut self, outcome: ProbeOutcome) {
        self.sink
            .metrics
            .probes
            .outcome(&self.target.name, &outcome);
        self.sink.cross_check(&self.target.name, &outcome);
    }

    /// The persistent QP's ERR and destroy are cross-checked too, but the
    /// disconnect is not a probe of its own.
    fn closed(&mut self, outcome: ProbeOutcome) {
        self.sink.cross_check(&self.target.name, &outcome);
    }
}

fn run_target(target: Target, sink: ProbeSink, stop: mpsc::Receiver<()>) {
    let config = probe_config(&target);
    let mode = match target.mode {
        ProbeModeSetting::Persistent => ProbeMode::Persistent,
        ProbeModeSetting::Oneshot => ProbeMode::OneShot,
        ProbeModeSetting::Ud => unreachable!("UD targets are the mesh's"),
    };
    run_probes(&config, mode, None, &mut TargetLoop { target, sink, stop });
}

/// The responder, the probe threads, the UD mesh, and their reconfiguration.
pub struct Prober {
    sink: ProbeSink,
    mesh: MeshProber,
    responder: Option<(SocketAddr, ResponderHandle)>,
    /// The configured responder that could not start, and why (retried).
    responder_failed: Option<(SocketAddr, String)>,
    /// The limits the responder runs with.
    responder_settings: ResponderSettings,
    responder_seen: ResponderStats,
    targets: HashMap<String, TargetRunner>,
}

impl Prober {
    pub fn new(sink: ProbeSink) -> Self {
        Self {
            mesh: MeshProber::new(sink.clone()),
            sink,
            responder: None,
            responder_failed: None,
            responder_settings: ResponderSettings::default(),
            responder_seen: ResponderStats::default(),
            targets: HashMap::new(),
        }
    }

    /// Makes the running responder, targets and mesh match the settings;
    /// targets that did not change keep running (and their persistent
    /// connections). `mode = "ud"` targets go to the mesh (`mesh`: fleet mode).
    /// A change of the responder's limits restarts it (its connections are
    /// closed; the requesters connect again).
    pub fn apply(
        &mut self,
        responder: Option<SocketAddr>,
        limits: &ResponderSettings,
        targets: &[Target],
        mesh: Option<&MeshSettings>,
    ) {
        let (ud, targets): (Vec<Target>, Vec<Target>) = targets
            .iter()
            .cloned()
            .partition(|t| t.mode == ProbeModeSetting::Ud);
        self.mesh.apply(mesh, &ud, &limits.allow);
        let changed = self.responder_settings != *limits;
        self.responder_settings = limits.clone();
        if changed || self.responder.as_ref().map(|(a, _)| *a) != responder {
            self.stop_responder();
            self.responder_failed = None;
            if let Some(listen) = responder {
                self.start_responder(listen);
            }
        }
        let wanted: HashMap<&str, &Target> = targets.iter().map(|t| (t.name.as_str(), t)).collect();
        let stale: Vec<String> = self
            .targets
            .iter()
            .filter(|(name, runner)| wanted.get(name.as_str()) != Some(&&runner.target))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(runner) = self.targets.remove(&name) {
                let _ = runner.stop.send(());
                let _ = runner.thread.join();
                self.sink.metrics.probes.forget_target(&name);
            }
        }
        for target in &targets {
            if self.targets.contains_key(&target.name) {
                continue;
            }
            let (stop, stop_rx) = mpsc::channel();
            let sink = self.sink.clone();
            let runner_target = target.clone();
            let thread = std::thread::Builder::new()
                .name(format!("probe-{}", target.name))
                .spawn(move || run_target(runner_target, sink, stop_rx));
            match thread {
                Ok(thread) => {
                    info!(target = %target.name, address = %target.address, "probing");
                    self.targets.insert(
                        target.name.clone(),
                        TargetRunner {
                            target: target.clone(),
                            stop,
                            thread,
                        },
                    );
                }
                Err(error) => warn!(target = %target.name, %error, "cannot start probe thread"),
            }
        }
    }

    /// Starts the responder; a failure is logged once per distinct error and
    /// retried by [`Prober::retry`] (e.g. until an address appears).
    fn start_responder(&mut self, listen: SocketAddr) {
        match Responder::spawn(responder_config(listen, &self.responder_settings)) {
            Ok(handle) => {
                info!(%listen, "probe responder listening");
                self.responder = Some((listen, handle));
                self.responder_failed = None;
            }
            Err(error) => {
                let error = error.to_string();
                if self.responder_failed.as_ref().map(|(_, e)| e) != Some(&error) {
                    warn!(%listen, %error, "probe responder not started (retrying)");
                }
                self.responder_failed = Some((listen, error));
            }
        }
    }

    /// Whether a configured responder or the mesh is waiting to be retried.
    pub fn retry_pending(&self) -> bool {
        self.responder_failed.is_some() || self.mesh.pending()
    }

    /// Retries the responder and the mesh that could not start.
    pub fn retry(&mut self) {
        if let Some((listen, _)) = self.responder_failed {
            self.start_responder(listen);
        }
        self.mesh.retry();
    }

    /// Whether the mesh probes the peers of live QPs.
    pub fn discovering(&self) -> bool {
        self.mesh.discovering()
    }

    /// The mesh's discovered targets follow the live QPs' peers.
    pub fn update_discovered(
        &mut self,
        now: std::time::Instant,
        live: &[std::net::IpAddr],
        local: &std::collections::HashSet<std::net::IpAddr>,
    ) {
        self.mesh.update_discovered(now, live, local);
    }

    /// Re-reads the mesh's targets file if it changed.
    pub fn check_targets_file(&mut self) {
        self.mesh.check_targets_file();
    }

    fn stop_responder(&mut self) {
        if let Some((listen, handle)) = self.responder.take() {
            self.refresh_responder_with(&handle.stats());
            match handle.stop() {
                Ok(stats) => info!(%listen, echoes = stats.echoes, "probe responder stopped"),
                Err(error) => warn!(%listen, %error, "probe responder stopped with an error"),
            }
            self.responder_seen = ResponderStats::default();
        }
    }

    fn refresh_responder_with(&mut self, now: &ResponderStats) {
        self.sink.metrics.responder.stats(&self.responder_seen, now);
        self.responder_seen = *now;
    }

    /// Brings the responder's counters into the metrics (at scrape time).
    pub fn refresh(&mut self) {
        if let Some(stats) = self.responder.as_ref().map(|(_, h)| h.stats()) {
            self.refresh_responder_with(&stats);
        }
        self.mesh.refresh();
    }

    /// Stops every probe thread, the mesh and the responder.
    pub fn shutdown(&mut self) {
        self.apply(None, &ResponderSettings::default(), &[], None);
    }
}

/// `qpwatch probe`: one-shot (or persistent) probes and an ib_send_lat-like table.
pub fn cli_probe(args: ProbeArgs) -> anyhow::Result<bool> {
    if args.ud {
        let timeout = Duration::try_from_secs_f64(args.timeout)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| anyhow::anyhow!("--timeout: {} is not positive", args.timeout))?;
        let mut header = vec![0u8; args.size.max(40)];
        rdma_probe::mesh::encode_probe(&mut header);
        let probe = rdma_probe::mesh::CountedProbe {
            target: args.target,
            source: args.source,
            count: args.count.into(),
            interval: Duration::from_millis(args.interval_ms.max(1)),
            config: rdma_probe::mesh::MeshConfig {
                timeout,
                resolve_timeout: timeout,
                message_size: args.size,
                malformed: malformed(&args, args.size, &header)?,
                ..Default::default()
            },
        };
        let summary = rdma_probe::mesh::probe_counted(&probe)
            .map_err(|e| anyhow::anyhow!("UD probe of {}: {e}", args.target))?;
        if args.json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            print!("{}", summary.render_table());
        }
        if let Some(error) = &summary.error {
            eprintln!("error: {error}");
        }
        return Ok(summary.all_ok(probe.count));
    }
    let mut config = ProbeConfig::new(args.target);
    config.source = args.source;
    let mut header = b"QPWPROBE".to_vec();
    header.resize(rdma_probe::MESSAGE_HEADER, 0);
    config.malformed = malformed(&args, args.size, &header)?;
    config.pings = args.pings;
    config.message_size = args.size;
    config.step_timeout = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--timeout: {} is not a positive number of seconds",
                args.timeout
            )
        })?;
    if args.busy_poll {
        config.poll_mode = PollMode::Busy;
    }
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid probe: {e}"))?;
    let mode = if args.persistent {
        ProbeMode::Persistent
    } else {
        ProbeMode::OneShot
    };
    let summary = probe_summary(&config, mode, args.count, Duration::ZERO);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", summary.render_table());
    }
    Ok(summary.all_ok())
}

/// `--malformed KIND` (a testing aid): the bytes sent instead of a probe.
fn malformed(args: &ProbeArgs, size: usize, header: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(kind) = &args.malformed else {
        return Ok(None);
    };
    rdma_probe::malformed_payload(kind, size, header)
        .map(Some)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--malformed: {kind:?} is none of {}",
                rdma_probe::MALFORMED_KINDS.join(", ")
            )
        })
}

/// `qpwatch responder`: only the responder, until SIGTERM/SIGINT.
pub fn cli_responder(args: ResponderArgs) -> anyhow::Result<()> {
    let responder = Responder::bind(ResponderConfig::new(args.listen))
        .map_err(|e| anyhow::anyhow!("responder on {}: {e}", args.listen))?;
    let stopper = responder.stopper();
    // The UD mesh answers on the same address in RDMA_PS_UDP.
    let mesh_config = rdma_probe::mesh::MeshConfig {
        listen: Some(args.listen),
        ..Default::default()
    };
    let mesh = rdma_probe::mesh::Mesh::spawn(mesh_config, Arc::new(LogMeshSink))
        .map_err(|e| anyhow::anyhow!("UD responder on {}: {e}", args.listen))?;
    let mut signals = signal_hook_iterator()?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stopper.stop();
        }
    });
    info!(listen = %responder.local_addr(), "responder listening");
    let stats = responder
        .run()
        .map_err(|e| anyhow::anyhow!("responder: {e}"))?;
    let mesh = mesh
        .stop()
        .map_err(|e| anyhow::anyhow!("UD responder: {e}"))?;
    info!(
        established = stats.established,
        echoes = stats.echoes,
        ud_answers = mesh.responded,
        "responder stopped"
    );
    Ok(())
}

/// The UD responder of `qpwatch responder`: logs what it could not answer.
struct LogMeshSink;

impl rdma_probe::mesh::MeshSink for LogMeshSink {
    fn qp_created(&self, device: &str, qp_num: u32, _calls: &[rdma_probe::QpCall]) {
        info!(device, qp_num, "UD responder QP");
    }
    fn resolved(&self, _: &Arc<str>, _: &str, _: u32) {}
    fn resolve_failed(&self, _: &Arc<str>, _: &rdma_probe::Error) {}
    fn sent(&self, _: &Arc<str>) {}
    fn send_failed(&self, _: &Arc<str>, _: &rdma_probe::Error) {}
    fn answered(&self, _: &Arc<str>, _: &rdma_probe::mesh::Answer) {}
    fn lost(&self, _: &Arc<str>, _: u64) {}
    fn responded(&self, _: &str) {}
    fn dropped(&self, reason: rdma_probe::mesh::Dropped) {
        warn!(reason = reason.as_str(), "UD message not answered");
    }
}

fn signal_hook_iterator() -> anyhow::Result<signal_hook::iterator::Signals> {
    Ok(signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?)
}
