//! The agent's main loop: keep the hooks attached (tracer), feed the
//! pipeline, serve metrics, talk to systemd, shut down cleanly on a signal.

use std::{
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::Context;
use tokio::{
    net::TcpListener,
    signal::unix::{signal, SignalKind},
    sync::watch,
};
use tracing::{debug, info, warn};

use crate::{
    export::http::{
        self, lock_for_scrape,
        web_config::WebConfig,
        web_config_watch::{self, WebConfigWatch},
        HttpState, WebConfigHandle,
    },
    export::jsonl::JsonLines,
    export::metrics::{ib_cm, Metrics},
    kernel::cgroup::CgroupPaths,
    kernel::offsets::kernel_release,
    kernel::tracer::{Tracer, TracerConfig},
    model::cm::{CmCorrelator, CmNames},
    model::pipeline::{EventSink, Pipeline},
    model::qp::Correlator,
    service::config::{self, RunArgs, Settings},
    service::local_addrs::local_addresses,
    service::systemd::Notifier,
    synthetic::crosscheck::OwnCallLog,
    synthetic::prober::{ProbeSink, Prober},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serve /metrics.
    Serve,
    /// Print events as JSON lines on stdout.
    Events,
}

/// Opts this process out of transparent huge pages. With THP `always`
/// (Debian's default), khugepaged collapses the sparse heap left after the
/// start-up BTF parsing is freed into 2 MiB pages (`collapse_huge_page`, up
/// to 511 absent pages filled per huge page): measured +3.7 MiB of resident
/// memory, without a single page fault, some seconds after start. An agent
/// this small gains nothing from huge pages and should have a predictable RSS.
fn disable_transparent_hugepages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        debug!(error = %std::io::Error::last_os_error(), "PR_SET_THP_DISABLE");
    }
}

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF maps against it
/// (before 5.11, which moved to memcg accounting).
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        debug!(
            error = %std::io::Error::last_os_error(),
            "cannot raise RLIMIT_MEMLOCK; fine on kernels >= 5.11"
        );
    }
}

/// `--bpf-stats`: BPF_ENABLE_STATS keeps run-time accounting on for as long
/// as the returned fd is open (needs CAP_SYS_ADMIN).
fn enable_bpf_stats(settings: &Settings) -> Option<OwnedFd> {
    if !settings.bpf_stats {
        return None;
    }
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => {
            info!("BPF run-time statistics enabled");
            Some(fd)
        }
        Err(error) => {
            warn!(%error, "cannot enable BPF run-time statistics (needs CAP_SYS_ADMIN)");
            None
        }
    }
}

/// The name of the threads of the runtime's blocking pool (scrapes, prober
/// changes), which come and go with the work: tests and operators tell them
/// apart by it. At most 15 bytes: the kernel keeps that much of a thread's
/// name (`TASK_COMM_LEN`, include/linux/sched.h), and a longer one would show
/// truncated in `/proc/PID/task/*/comm`.
pub const BLOCKING_THREAD_NAME: &str = "qpwatch-pool";

pub async fn run(
    settings: Settings,
    web: WebConfig,
    args: RunArgs,
    mode: Mode,
) -> anyhow::Result<()> {
    bump_memlock_rlimit();
    disable_transparent_hugepages();
    let notifier = Notifier::from_env();
    let _bpf_stats = enable_bpf_stats(&settings);

    let target_labels = settings
        .mesh
        .as_ref()
        .map_or(&[][..], |m| m.target_labels.as_slice());
    let mut metrics =
        Metrics::with_target_labels(&settings.buckets, &kernel_release(), target_labels);
    metrics
        .register_sysfs_counters(
            ib_cm::SYSFS_DIR,
            settings.limits.max_device_labels,
            settings.sysfs_counters_interval,
        )
        .context("setting up the sysfs counters")?;
    let sink: Option<Box<dyn EventSink>> = match mode {
        Mode::Events => Some(Box::new(JsonLines::new(std::io::stdout()))),
        Mode::Serve => None,
    };
    let cgroups = CgroupPaths::from_mounts();
    match cgroups.root() {
        Some(root) => {
            info!(root = %root.display(), "QP creators' cgroups named from this cgroup v2 hierarchy")
        }
        None => warn!("no cgroup2 file system mounted: QP creators' cgroups are \"unknown\""),
    }
    let mut correlator = Correlator::new(settings.limits);
    correlator.set_cgroup_names(Box::new(cgroups));
    let mut pipeline = Pipeline::new(
        correlator,
        CmCorrelator::new(CmNames::linux_6_1()),
        metrics.clone(),
    );
    pipeline.sink = sink;
    let own_calls = OwnCallLog::default();
    pipeline.own_calls = Some(Box::new(own_calls.clone()));
    let pipeline = Arc::new(Mutex::new(pipeline));
    let qp_tracing = Arc::new(AtomicBool::new(false));
    let prober = Arc::new(Mutex::new(Prober::new(ProbeSink {
        metrics: metrics.clone(),
        own_calls,
        qp_tracing: Arc::clone(&qp_tracing),
    })));
    let mut tracer = Tracer::new(
        TracerConfig {
            btf_dir: settings.btf_dir.clone(),
            groups: settings.groups.clone(),
            ring_buffer_bytes: settings.ring_buffer_bytes,
            strict: settings.strict,
            reconcile: settings.reconcile,
            bpf_stats: settings.bpf_stats,
        },
        Arc::clone(&pipeline),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut server = None;
    let web_config = WebConfigHandle::default();
    let mut web_watch = WebConfigWatch::new(&[]);
    let state = if mode == Mode::Serve {
        let counters = tracer.counters();
        let scrape_metrics = metrics.clone();
        let scrape_prober = Arc::clone(&prober);
        let state = HttpState::new(
            metrics.clone(),
            Box::new(move |wait| {
                let Some(mut counters) = lock_for_scrape(&counters, wait) else {
                    return false;
                };
                counters.refresh(&scrape_metrics);
                drop(counters);
                let Some(mut prober) = lock_for_scrape(&scrape_prober, wait) else {
                    return false;
                };
                prober.refresh();
                true
            }),
        );
        metrics.http.tls_cert_expiry(web.cert_expiry);
        web_watch.read_again(&web.files);
        web_config.replace(web);
        let web = web_config.current();
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        info!(listen = %settings.listen, web = %web.summary(), "serving /metrics");
        warn_clear_text_passwords(&web);
        let mut http_stop = stop_rx.clone();
        server = Some(tokio::spawn(http::serve(
            listener,
            http::router(Arc::clone(&state)),
            web_config.clone(),
            settings.http,
            metrics.http.clone(),
            async move {
                let _ = http_stop.changed().await;
            },
        )));
        Some(state)
    } else {
        None
    };

    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let mut poll = tokio::time::interval(settings.module_poll_interval);
    let mut targets_file_check = targets_file_interval(&settings);
    let mut discovery_check = discovery_interval(&settings);
    let mut watchdog = notifier.watchdog_interval().map(tokio::time::interval);
    let mut web_config_check = (mode == Mode::Serve).then(|| {
        let every = web_config_watch::CHECK_INTERVAL;
        let mut check = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        // two looks a whole interval apart, even after a stall
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        check
    });
    let mut ready_sent = false;
    let mut probes_started = mode == Mode::Events;
    let mut settings = settings;
    let result: anyhow::Result<()> = loop {
        tokio::select! {
            _ = term.recv() => { info!("SIGTERM: shutting down"); break Ok(()); }
            _ = int.recv() => { info!("SIGINT: shutting down"); break Ok(()); }
            _ = hup.recv() => {
                notifier.reloading();
                match config::load(&args) {
                    Ok(new) => {
                        reload(&settings, &new);
                        apply_probes(&prober, &new).await;
                        if targets_file_check_period(&new) != targets_file_check_period(&settings) {
                            targets_file_check = targets_file_interval(&new);
                        }
                        if discovery_period(&new) != discovery_period(&settings) {
                            discovery_check = discovery_interval(&new);
                        }
                        settings = new;
                    }
                    // A bad file on reload keeps the running settings.
                    Err(error) => warn!(%error, "SIGHUP: configuration not reloaded"),
                }
                if mode == Mode::Serve {
                    reload_web_config(&web_config, &mut web_watch, &settings, &metrics, "SIGHUP");
                }
                notifier.notify("READY=1");
            }
            _ = poll.tick() => {
                let polled = tracer.poll().await;
                qp_tracing.store(tracer.qp_hooks_attached(), Ordering::Release);
                if !probes_started && rdma_core_present() {
                    // After the first attach, so that the probes' QPs are
                    // seen; and not before ib_core is there: librdmacm's
                    // netlink queries would load the RDMA stack themselves.
                    apply_probes(&prober, &settings).await;
                    probes_started = true;
                } else if probes_started && prober.lock().expect("not poisoned").retry_pending() {
                    with_prober(&prober, Prober::retry, "retrying the responder and the mesh").await;
                }
                let ready = tracer.ready();
                if let Some(state) = &state {
                    state.set_ready(ready);
                }
                if ready && !ready_sent {
                    notifier.notify("READY=1\nSTATUS=hooks attached");
                    ready_sent = true;
                }
                if let Err(error) = polled {
                    break Err(error.into());
                }
            }
            Some(_) = async { match targets_file_check.as_mut() { Some(t) => Some(t.tick().await), None => None } } => {
                if probes_started {
                    with_prober(&prober, Prober::check_targets_file, "checking the targets file").await;
                }
            }
            Some(_) = async { match discovery_check.as_mut() { Some(t) => Some(t.tick().await), None => None } } => {
                if probes_started {
                    update_discovered(&pipeline, &prober).await;
                }
            }
            Some(_) = async { match watchdog.as_mut() { Some(w) => Some(w.tick().await), None => None } } => {
                notifier.notify("WATCHDOG=1");
            }
            Some(_) = async { match web_config_check.as_mut() { Some(t) => Some(t.tick().await), None => None } } => {
                let files = web_config.current().files.clone();
                if !files.is_empty() && web_watch.look(&files) {
                    reload_web_config(&web_config, &mut web_watch, &settings, &metrics, "web configuration files changed");
                }
            }
        }
    };

    notifier.notify("STOPPING=1");
    if let Some(state) = &state {
        state.set_ready(false);
    }
    let _ = stop_tx.send(true);
    let stop_probes = {
        let prober = Arc::clone(&prober);
        tokio::task::spawn_blocking(move || prober.lock().expect("not poisoned").shutdown())
    };
    if let Some(server) = server {
        server.await.context("HTTP server task")??;
    }
    stop_probes.await.context("stopping the probes")?;
    tracer.shutdown().await;
    info!("bye");
    result
}

/// SIGHUP, or its files changed ([`WebConfigWatch`]): the web
/// configuration file is read again (certificates renewed, users changed)
/// and applies to new connections; a file that does not validate keeps the
/// one in force.
/// `why`: what the log lines begin with (`SIGHUP`, or the files changing).
/// `watch` is told the files were read, whatever came of it.
fn reload_web_config(
    web: &WebConfigHandle,
    watch: &mut WebConfigWatch,
    settings: &Settings,
    metrics: &Metrics,
    why: &str,
) {
    match http::web_config::load(settings.web_config_file.as_deref()) {
        Ok(new) => {
            info!(web = %new.summary(), "{why}: web configuration reloaded");
            warn_clear_text_passwords(&new);
            metrics.http.tls_cert_expiry(new.cert_expiry);
            web.replace(new);
            metrics.http.web_config_reload(true);
        }
        Err(error) => {
            warn!(%error, "{why}: web configuration not reloaded, the previous one stays");
            metrics.http.web_config_reload(false);
        }
    }
    watch.read_again(&web.current().files);
}

fn warn_clear_text_passwords(web: &WebConfig) {
    if web.basic_auth.is_some() && web.tls.is_none() {
        warn!("basic auth without TLS: passwords cross the network in clear text");
    }
}

/// `ib_core` is loaded (or built in): its device class exists.
fn rdma_core_present() -> bool {
    std::path::Path::new("/sys/class/infiniband").exists()
}

/// Runs `f` on the prober off the event loop (it may join threads or read
/// a file).
async fn with_prober(prober: &Arc<Mutex<Prober>>, f: fn(&mut Prober), what: &str) {
    let prober = Arc::clone(prober);
    let done =
        tokio::task::spawn_blocking(move || f(&mut prober.lock().expect("not poisoned"))).await;
    if let Err(error) = done {
        warn!(%error, "{what}");
    }
}

fn targets_file_check_period(settings: &Settings) -> Option<Duration> {
    let mesh = settings.mesh.as_ref()?;
    mesh.targets_file.as_ref()?;
    Some(mesh.targets_file_check)
}

/// The targets file's checks, if fleet mode has a targets file.
fn targets_file_interval(settings: &Settings) -> Option<tokio::time::Interval> {
    targets_file_check_period(settings).map(|period| {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    })
}

/// How often the discovered mesh targets follow the live QPs' peers: four
/// times per probe interval, within [0.25 s, 5 s].
fn discovery_period(settings: &Settings) -> Option<Duration> {
    let mesh = settings.mesh.as_ref().filter(|m| m.discover)?;
    Some((mesh.interval / 4).clamp(Duration::from_millis(250), Duration::from_secs(5)))
}

fn discovery_interval(settings: &Settings) -> Option<tokio::time::Interval> {
    discovery_period(settings).map(|period| {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    })
}

/// Hands the peers of the live QPs (read from the state machine) to the
/// mesh, off the event loop.
async fn update_discovered(pipeline: &Arc<Mutex<Pipeline>>, prober: &Arc<Mutex<Prober>>) {
    let live: Vec<std::net::IpAddr> = pipeline
        .lock()
        .expect("not poisoned")
        .correlator
        .peers()
        .iter()
        .map(|peer| peer.gid.ip())
        .collect();
    let prober = Arc::clone(prober);
    let done = tokio::task::spawn_blocking(move || {
        let local = local_addresses();
        prober.lock().expect("not poisoned").update_discovered(
            std::time::Instant::now(),
            &live,
            &local,
        );
    })
    .await;
    if let Err(error) = done {
        warn!(%error, "updating the discovered mesh targets");
    }
}

/// Starts, stops and restarts the responder and probe threads to match
/// `settings` (blocking joins, off the event loop).
async fn apply_probes(prober: &Arc<Mutex<Prober>>, settings: &Settings) {
    let prober = Arc::clone(prober);
    let responder = settings.responder_listen;
    let limits = settings.responder.clone();
    let targets = settings.targets.clone();
    let mesh = settings.mesh.clone();
    let applied = tokio::task::spawn_blocking(move || {
        prober
            .lock()
            .expect("not poisoned")
            .apply(responder, &limits, &targets, mesh.as_ref())
    })
    .await;
    if let Err(error) = applied {
        warn!(%error, "applying probe settings");
    }
}

/// What a SIGHUP changes at run time: the probe targets, the responder and
/// the mesh (but its target labels: the prober says so). Everything else
/// needs a restart, and is said so.
fn reload(old: &Settings, new: &Settings) {
    let restart_keys: Vec<&str> = [
        ("listen", old.listen != new.listen),
        ("http", old.http != new.http),
        (
            "hooks",
            old.groups != new.groups || old.ring_buffer_bytes != new.ring_buffer_bytes,
        ),
        ("limits", old.limits != new.limits),
        (
            "sysfs_counters",
            old.sysfs_counters_interval != new.sysfs_counters_interval,
        ),
        ("buckets", old.buckets != new.buckets),
        (
            "log_level/log_format",
            old.log_level != new.log_level || old.log_format != new.log_format,
        ),
    ]
    .into_iter()
    .filter_map(|(key, changed)| changed.then_some(key))
    .collect();
    if !restart_keys.is_empty() {
        warn!(
            keys = %restart_keys.join(", "),
            "SIGHUP: these settings change only on restart"
        );
    }
    info!(
        targets = new.targets.len(),
        responder = ?new.responder_listen,
        fleet_mode = new.mesh.is_some(),
        "SIGHUP: configuration reloaded"
    );
}

#[cfg(test)]
mod tests {
    use super::BLOCKING_THREAD_NAME;

    /// A blocking-pool thread's name reads back whole from the kernel, as
    /// `agent_threads` (tests/vm/lib/mesh.sh) matches it.
    #[test]
    fn blocking_pool_threads_keep_their_whole_name() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .thread_name(BLOCKING_THREAD_NAME)
            .build()
            .expect("a runtime");
        let comm = runtime
            .block_on(async {
                tokio::task::spawn_blocking(|| std::fs::read_to_string("/proc/thread-self/comm"))
                    .await
            })
            .expect("the task ran")
            .expect("comm read");
        assert_eq!(comm.trim_end(), BLOCKING_THREAD_NAME);
    }
}
