//! Keeps the hooks attached as kernel modules come and go.
//!
//! Every poll: an instance whose modules' BTF is present but that is not
//! loaded gets loaded, attached, reconciled with the kernel's netlink view
//! and drained; an instance whose module disappeared is dropped; hooks that
//! failed are retried when the set of loaded modules changes. Each hook's
//! outcome is exported as `qpwatch_hook_attached{hook}`.

use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use qpwatch_common::{CmOffsets, RxeOffsets};
use thiserror::Error;
use tokio::{
    io::{unix::AsyncFd, Interest},
    sync::watch,
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use crate::{
    export::metrics::Metrics,
    kernel::hooks::{
        all_hooks, attach_instance, Group, Hook, HookStatus, Instance, InstanceKind, KernelCounters,
    },
    kernel::offsets::{module_generation, KernelBtf, TASK_COMM},
    kernel::rdma::{
        netlink::{self, NetnsMode},
        QpState, QpType,
    },
    model::cm::CmNames,
    model::pipeline::Pipeline,
};

#[derive(Debug, Error)]
pub enum TracerError {
    #[error("--strict: hook {hook} did not attach: {reason}")]
    Strict { hook: String, reason: String },
}

pub struct TracerConfig {
    pub btf_dir: PathBuf,
    pub groups: Vec<Group>,
    pub ring_buffer_bytes: u32,
    /// Any hook that does not attach is an error.
    pub strict: bool,
    /// Adopt QPs and CM ids that exist already (RDMA netlink).
    pub reconcile: bool,
    /// Export the programs' run time (kernel BPF statistics).
    pub bpf_stats: bool,
}

struct Running {
    instance: Instance,
    /// The loads of the instance's modules it was loaded against.
    generations: Vec<Option<u64>>,
    stop: watch::Sender<bool>,
    drain: JoinHandle<()>,
}

/// The kernel-side counters of the running instances, shared with the scrape path.
#[derive(Default)]
pub struct CounterSet {
    instances: HashMap<InstanceKind, KernelCounters>,
    /// Program id → hook label; empty unless BPF statistics are on.
    programs: HashMap<u32, String>,
    /// Program id → (run time ns, runs) at the last read.
    programs_seen: HashMap<u32, (u64, u64)>,
}

impl CounterSet {
    /// Pulls the counters kept in the kernel into the metrics (at scrape time).
    pub fn refresh(&mut self, metrics: &Metrics) {
        for counters in self.instances.values_mut() {
            match counters.lost_delta() {
                Ok(delta) => metrics.events.add_lost(delta),
                Err(error) => warn!(%error, "reading lost-event counters"),
            }
            for (name, hits) in counters.ib_cm_delta() {
                metrics
                    .hooks
                    .tracepoint_hits(&format!("ib_cma:{name}"), hits);
            }
        }
        if self.programs.is_empty() {
            return;
        }
        for info in aya::programs::loaded_programs().filter_map(Result::ok) {
            let Some(hook) = self.programs.get(&info.id()) else {
                continue;
            };
            let (run_ns, runs) = (info.run_time().as_nanos() as u64, info.run_count());
            let seen = self.programs_seen.entry(info.id()).or_default();
            metrics.hooks.bpf_run(
                hook,
                run_ns.saturating_sub(seen.0),
                runs.saturating_sub(seen.1),
            );
            *seen = (run_ns.max(seen.0), runs.max(seen.1));
        }
    }
}

pub struct Tracer {
    config: TracerConfig,
    btf: KernelBtf,
    hooks: Vec<Hook>,
    running: HashMap<InstanceKind, Running>,
    statuses: BTreeMap<String, HookStatus>,
    /// Last reason logged per instance, to log each failure once.
    last_failure: HashMap<InstanceKind, String>,
    /// The RDMA netns mode was read (and, if exclusive, its limits logged).
    netns_mode_logged: bool,
    modules_seen: String,
    pipeline: Arc<Mutex<Pipeline>>,
    counters: Arc<Mutex<CounterSet>>,
    /// Drains every ring on [`DRAIN_INTERVAL`](crate::kernel::hooks::DRAIN_INTERVAL)
    /// while any instance runs: one timer for all of them.
    drain_timer: Option<JoinHandle<()>>,
}

fn loaded_modules() -> String {
    std::fs::read_to_string("/proc/modules")
        .map(|s| {
            let mut names: Vec<&str> = s.lines().filter_map(|l| l.split(' ').next()).collect();
            names.sort_unstable();
            names.join(",")
        })
        .unwrap_or_default()
}

impl Tracer {
    pub fn new(config: TracerConfig, pipeline: Arc<Mutex<Pipeline>>) -> Self {
        let btf = KernelBtf::new(&config.btf_dir);
        let hooks = all_hooks();
        let mut statuses = BTreeMap::new();
        for hook in &hooks {
            let status = if config.groups.contains(&hook.group) {
                HookStatus::Detached("not attached yet".into())
            } else {
                HookStatus::Disabled
            };
            statuses.insert(hook.label(), status);
        }
        Self {
            config,
            btf,
            hooks,
            running: HashMap::new(),
            statuses,
            last_failure: HashMap::new(),
            netns_mode_logged: false,
            modules_seen: String::new(),
            pipeline,
            counters: Arc::default(),
            drain_timer: None,
        }
    }

    /// Kernel-side counters, for the scrape path.
    pub fn counters(&self) -> Arc<Mutex<CounterSet>> {
        Arc::clone(&self.counters)
    }

    pub fn kernel(&self) -> &str {
        self.btf.kernel()
    }

    pub fn statuses(&self) -> Vec<(String, HookStatus)> {
        self.statuses
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Ready: the QP hooks are attached and their ring buffer is being drained
    /// (or the QP group is switched off and some instance runs).
    pub fn ready(&self) -> bool {
        if self.config.groups.contains(&Group::Qp) {
            self.running
                .get(&InstanceKind::IbCore)
                .is_some_and(|r| r.instance.attached_count() > 0)
        } else {
            self.running
                .values()
                .any(|r| r.instance.attached_count() > 0)
        }
    }

    /// The ib_core hooks are attached (the probes' QPs can be cross-checked).
    pub fn qp_hooks_attached(&self) -> bool {
        self.running
            .get(&InstanceKind::IbCore)
            .is_some_and(|r| r.instance.attached_count() > 0)
    }

    fn wanted(&self, kind: InstanceKind) -> bool {
        self.hooks
            .iter()
            .any(|h| h.instance == kind && self.config.groups.contains(&h.group))
    }

    /// Marks the hooks of an instance that is not running: detached for
    /// `reason`, or idle if they are optional and their module is not loaded
    /// (a consumer or driver the host does not run).
    fn set_instance_status(&mut self, kind: InstanceKind, reason: &str) {
        for hook in self.hooks.iter().filter(|h| h.instance == kind) {
            if self.config.groups.contains(&hook.group) {
                let status = match module_generation(&self.config.btf_dir, hook.module) {
                    None => hook.without_module(reason.to_owned()),
                    Some(_) => HookStatus::Detached(reason.to_owned()),
                };
                self.statuses.insert(hook.label(), status);
            }
        }
    }

    /// The current load of each module a hook or instance needs (`None`: not loaded).
    fn generations(&self) -> HashMap<&'static str, Option<u64>> {
        let mut modules: Vec<&'static str> = self.hooks.iter().map(|h| h.module).collect();
        modules.extend(
            InstanceKind::ALL
                .iter()
                .flat_map(|k| k.modules().iter().copied()),
        );
        // one stat per module, not one per hook
        modules.sort_unstable();
        modules.dedup();
        modules
            .into_iter()
            .map(|m| (m, module_generation(&self.config.btf_dir, m)))
            .collect()
    }

    /// One supervision round; see the module docs.
    pub async fn poll(&mut self) -> Result<(), TracerError> {
        let modules = loaded_modules();
        let modules_changed = modules != self.modules_seen;
        self.modules_seen = modules;
        let generations = self.generations();
        let generation = |m: &str| generations.get(m).copied().flatten();
        let mut started = false;

        for kind in InstanceKind::ALL {
            if !self.wanted(kind) {
                continue;
            }
            let now: Vec<Option<u64>> = kind.modules().iter().map(|m| generation(m)).collect();
            let present = now.iter().all(Option::is_some);
            if let Some(running) = self.running.get(&kind) {
                if running.generations != now {
                    // gone, or unloaded and loaded again between two polls:
                    // its hooks went with the old module
                    let reason = "module unloaded".to_owned();
                    warn!(instance = kind.name(), "{reason}: detaching its hooks");
                    self.stop(kind).await;
                    for m in kind.modules() {
                        self.btf.forget(m);
                    }
                    self.set_instance_status(kind, &reason);
                }
            }
            match (self.running.contains_key(&kind), present) {
                (false, true) => {
                    self.start(kind, &generation);
                    started = true;
                }
                (false, false) => {
                    let missing: Vec<&str> = kind
                        .modules()
                        .iter()
                        .copied()
                        .filter(|m| generation(m).is_none())
                        .collect();
                    let reason = format!("module {} not loaded", missing.join(", "));
                    if kind.optional() {
                        if self.last_failure.get(&kind) != Some(&reason) {
                            info!(instance = kind.name(), %reason, "driver hooks idle");
                            self.last_failure.insert(kind, reason.clone());
                        }
                        self.set_instance_status(kind, &reason);
                    } else {
                        self.fail(kind, reason);
                    }
                }
                (true, _) => self.refresh_hooks(kind, modules_changed, &generation),
            }
        }
        if started {
            // The parsed BTF (vmlinux's alone is ~10 MB in memory) is only
            // needed to load an instance: re-read when a module comes back.
            self.btf.release();
            release_free_heap();
        }
        self.publish_statuses();
        if self.config.strict {
            if let Some((hook, HookStatus::Detached(reason))) = self
                .statuses
                .iter()
                .find(|(_, s)| matches!(s, HookStatus::Detached(_)))
            {
                return Err(TracerError::Strict {
                    hook: hook.clone(),
                    reason: reason.clone(),
                });
            }
        }
        Ok(())
    }

    fn publish_statuses(&self) {
        let statuses = self.statuses();
        self.pipeline
            .lock()
            .expect("not poisoned")
            .metrics
            .hooks
            .set_statuses(&statuses);
    }

    fn fail(&mut self, kind: InstanceKind, reason: String) {
        if self.last_failure.get(&kind) != Some(&reason) {
            warn!(instance = kind.name(), %reason, "hooks not attached");
            self.last_failure.insert(kind, reason.clone());
        }
        self.set_instance_status(kind, &reason);
    }

    fn start(&mut self, kind: InstanceKind, generation: &impl Fn(&str) -> Option<u64>) {
        match self.load(kind, generation) {
            Ok(()) => {
                self.last_failure.remove(&kind);
            }
            Err(reason) => self.fail(kind, reason),
        }
    }

    fn load(
        &mut self,
        kind: InstanceKind,
        generation: &impl Fn(&str) -> Option<u64>,
    ) -> Result<(), String> {
        let offsets = self.btf.qp_offsets().map_err(|e| e.to_string())?;
        if offsets.peers_valid == 0 && kind == InstanceKind::IbCore {
            if let Err(reason) = self.btf.peer_offsets() {
                warn!(%reason, "peers off: modifies are read without their remote side");
            }
        }
        let mut rxe_offsets = RxeOffsets::default();
        let cm_offsets = match kind {
            InstanceKind::IbCore => {
                match self.btf.enum_names("ib_core", "ib_event_type", "IB_EVENT_") {
                    Ok(names) => {
                        let mut pipeline = self.pipeline.lock().expect("not poisoned");
                        pipeline.correlator.set_async_event_names(names);
                        pipeline.init_err_causes();
                    }
                    Err(error) => warn!(%error, "QP async events are not named"),
                }
                CmOffsets::default()
            }
            InstanceKind::Rxe => {
                let wc_status = self
                    .btf
                    .enum_names("ib_core", "ib_wc_status", "IB_WC_")
                    .map_err(|e| e.to_string())?;
                rxe_offsets = self
                    .btf
                    .rxe_offsets(&wc_status)
                    .map_err(|e| e.to_string())?;
                let mut pipeline = self.pipeline.lock().expect("not poisoned");
                pipeline.correlator.set_completion_status_names(wc_status);
                pipeline.init_err_causes();
                CmOffsets::default()
            }
            InstanceKind::RdmaCm => {
                let cm = self.btf.cm_offsets().map_err(|e| e.to_string())?;
                let states = self
                    .btf
                    .enum_names("rdma_cm", "rdma_cm_state", "RDMA_CM_")
                    .map_err(|e| e.to_string())?;
                // ib_cm_event_type is ib_cm's; rdma_cm's BTF carries it too.
                let ib_events = self
                    .btf
                    .enum_names("rdma_cm", "ib_cm_event_type", "IB_CM_")
                    .unwrap_or_default();
                self.pipeline
                    .lock()
                    .expect("not poisoned")
                    .cm
                    .set_names(CmNames::new(states, ib_events));
                cm
            }
        };
        let task_comm = self.btf.offset(TASK_COMM).unwrap_or_else(|error| {
            debug!(%error, "comm read with bpf_get_current_comm()");
            0
        });
        info!(
            instance = kind.name(),
            kernel = self.btf.kernel(),
            task_comm,
            ?offsets,
            ?cm_offsets,
            ?rxe_offsets,
            "loading with offsets from BTF"
        );
        let mut instance = Instance::load(
            kind,
            &offsets,
            &cm_offsets,
            &rxe_offsets,
            task_comm,
            self.config.ring_buffer_bytes,
        )
        .map_err(|e| format!("{e}: {}", error_chain(&e)))?;
        let statuses = attach_instance(&mut instance, &self.hooks, &self.config.groups, generation);
        for (label, status) in statuses {
            if let HookStatus::Detached(reason) = &status {
                debug!(hook = %label, %reason, "not attached");
            }
            self.statuses.insert(label, status);
        }
        let ring = instance.take_events().map_err(|e| e.to_string())?;
        let counters = instance.take_counters().map_err(|e| e.to_string())?;

        // Events of the attach window first (some hooks were attached before
        // others, so they may tell half a story), then the kernel's own list,
        // taken after every hook is attached, which wins over them; the events
        // still in the ring are newer than both.
        let ring_fd = match ring.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(error) => return Err(format!("cannot poll the ring buffer: {error}")),
        };
        {
            let mut pipeline = self.pipeline.lock().expect("not poisoned");
            pipeline.add_ring(kind.name(), ring);
            pipeline.flush();
        }
        if kind == InstanceKind::IbCore && !self.netns_mode_logged {
            self.netns_mode_logged = log_netns_mode();
        }
        if self.config.reconcile {
            self.reconcile(kind);
        }
        let (stop, stop_rx) = watch::channel(false);
        match aya_log::EbpfLogger::init(instance.ebpf_mut()) {
            Ok(logger) => {
                tokio::spawn(forward_ebpf_logs(logger, stop_rx.clone()));
            }
            Err(error) => debug!(%error, "no eBPF log forwarding"),
        }
        if self.drain_timer.is_none() {
            self.drain_timer = Some(tokio::spawn(drain_on_timer(Arc::clone(&self.pipeline))));
        }
        let drain = tokio::spawn(drain_rings(
            kind,
            ring_fd,
            Arc::clone(&self.pipeline),
            stop_rx,
        ));
        {
            let mut set = self.counters.lock().expect("not poisoned");
            set.instances.insert(kind, counters);
            if self.config.bpf_stats {
                set.programs
                    .extend(instance.program_ids.iter().map(|(id, l)| (*id, l.clone())));
            }
        }
        self.running.insert(
            kind,
            Running {
                instance,
                generations: kind.modules().iter().map(|m| generation(m)).collect(),
                stop,
                drain,
            },
        );
        Ok(())
    }

    fn reconcile(&mut self, kind: InstanceKind) {
        let snapshot = match netlink::snapshot() {
            Ok(s) => s,
            Err(error) => {
                warn!(%error, "cannot read existing RDMA resources; QPs created before qpwatch are counted when first seen");
                return;
            }
        };
        let mut pipeline = self.pipeline.lock().expect("not poisoned");
        let pipeline = &mut *pipeline;
        let mut adopted = 0;
        match kind {
            InstanceKind::IbCore => {
                let listed: Vec<_> = snapshot
                    .qps
                    .iter()
                    .filter_map(|qp| {
                        let state = QpState::from_kernel(u32::from(qp.state))?;
                        let qp_type = QpType::from_kernel(u32::from(qp.qp_type));
                        Some((qp.device.as_str(), qp.lqpn, qp_type, state))
                    })
                    .collect();
                let (adopted, dropped) = pipeline
                    .correlator
                    .reconcile(&listed, &mut pipeline.metrics);
                info!(
                    adopted,
                    dropped,
                    listed = snapshot.qps.len(),
                    "reconciled existing QPs"
                );
            }
            InstanceKind::Rxe => {}
            InstanceKind::RdmaCm => {
                for id in &snapshot.cm_ids {
                    if pipeline.cm.adopt(
                        id.cm_idn,
                        u32::from(id.state),
                        id.lqpn,
                        &mut pipeline.metrics,
                    ) {
                        adopted += 1;
                    }
                }
                info!(
                    adopted,
                    listed = snapshot.cm_ids.len(),
                    "reconciled existing CM ids"
                );
            }
        }
    }

    /// Detaches the hooks whose own module (rdma_ucm, ib_cm) went away or was
    /// reloaded, and retries the detached ones when the set of loaded
    /// modules changed.
    fn refresh_hooks(
        &mut self,
        kind: InstanceKind,
        modules_changed: bool,
        generation: &impl Fn(&str) -> Option<u64>,
    ) {
        let Some(running) = self.running.get_mut(&kind) else {
            return;
        };
        let stale = running.instance.detach_stale(generation);
        // attach_instance below gives them their status (idle, when optional)
        for (label, module) in &stale {
            self.statuses.insert(
                label.clone(),
                HookStatus::Detached(format!("module {module} unloaded")),
            );
        }
        if !stale.is_empty() {
            warn!(
                instance = kind.name(),
                "{} hooks detached, their module unloaded: {}",
                stale.len(),
                stale
                    .iter()
                    .map(|(l, _)| l.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if modules_changed || !stale.is_empty() {
            let statuses = attach_instance(
                &mut running.instance,
                &self.hooks,
                &self.config.groups,
                generation,
            );
            for (label, status) in statuses {
                self.statuses.insert(label, status);
            }
        }
    }

    /// Stops an instance's drain task (it drains what is left first) and
    /// takes the instance out, its counters read one last time.
    /// Detaches the given instances (off the event loop, while their drain
    /// tasks keep reading), then stops the drains, which read what is left:
    /// an event the kernel emitted before its hook went away is counted.
    async fn stop_all(&mut self, kinds: &[InstanceKind]) {
        let mut instances = Vec::new();
        let mut drains = Vec::new();
        for kind in kinds {
            if let Some(running) = self.running.remove(kind) {
                instances.push(running.instance);
                drains.push((running.stop, running.drain));
            }
        }
        if instances.is_empty() {
            return;
        }
        if let Err(error) = tokio::task::spawn_blocking(move || detach_all(instances)).await {
            warn!(%error, "detaching");
        }
        for (stop, drain) in drains {
            let _ = stop.send(true);
            let _ = drain.await;
        }
        if self.running.is_empty() {
            if let Some(timer) = self.drain_timer.take() {
                timer.abort();
            }
        }
        // what the kernel counted since the last scrape is still exported
        let mut set = self.counters.lock().expect("not poisoned");
        let mut last = CounterSet::default();
        for kind in kinds {
            if let Some(counters) = set.instances.remove(kind) {
                last.instances.insert(*kind, counters);
            }
        }
        drop(set);
        last.refresh(&self.pipeline.lock().expect("not poisoned").metrics);
    }

    async fn stop(&mut self, kind: InstanceKind) {
        self.stop_all(&[kind]).await;
    }

    /// Detaches and drains every instance, all at once.
    pub async fn shutdown(&mut self) {
        self.stop_all(&InstanceKind::ALL).await;
    }
}

/// Says what the agent cannot see when RDMA devices are exclusive to their
/// network namespace; returns whether the mode could be read.
fn log_netns_mode() -> bool {
    match netlink::netns_mode() {
        Ok(NetnsMode::Shared) => true,
        Ok(NetnsMode::Exclusive) => {
            let listed = netlink::devices()
                .map(|d| d.into_iter().map(|d| d.name).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            warn!(
                listed = %listed,
                "RDMA netns mode is exclusive: this network namespace lists only its own \
                 RDMA devices; QPs and CM ids of devices in other namespaces are not adopted \
                 at start-up and their device counters are not read, while the hooks see \
                 their calls from then on, under the device's name"
            );
            true
        }
        Err(error) => {
            debug!(%error, "RDMA netns mode not read");
            false
        }
    }
}

fn detach_all(instances: Vec<Instance>) {
    let started = std::time::Instant::now();
    let hooks: usize = instances.iter().map(Instance::attached_count).sum();
    std::thread::scope(|scope| {
        for instance in instances {
            scope.spawn(move || instance.detach());
        }
    });
    info!(
        hooks,
        detach_ms = started.elapsed().as_millis() as u64,
        "detached"
    );
}

/// Returns freed heap pages to the kernel (glibc keeps them otherwise): the
/// BTF parsing and program loading at start-up peak far above what the agent
/// needs afterwards.
fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = error.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}

/// Wakes when a record of one instance's ring asks for it
/// ([`crate::kernel::hooks::wakeup_bytes`]) and drains every
/// ring, merged in kernel order (`Pipeline::drain`). On stop it drains what
/// is left and takes its ring out of the pipeline.
async fn drain_rings(
    kind: InstanceKind,
    ring_fd: OwnedFd,
    pipeline: Arc<Mutex<Pipeline>>,
    stop: watch::Receiver<bool>,
) {
    let drain_all = || pipeline.lock().expect("not poisoned").drain();
    // SAFETY: the OwnedFd is this task's own duplicate of the ring's map fd,
    // open for as long as the AsyncFd that owns it.
    match unsafe { AsyncFd::register_with_interest(ring_fd, Interest::READABLE) } {
        Ok(ring) => drain_until_stopped(ring, drain_all, stop).await,
        Err(error) => warn!(%error, "cannot poll the ring buffer"),
    }
    // Whatever is still in the ring is counted before the hooks go away.
    let mut pipeline = pipeline.lock().expect("not poisoned");
    let flushed = pipeline.flush();
    pipeline.remove_ring(kind.name());
    debug!(instance = kind.name(), flushed, "drained the ring buffers");
}

async fn drain_until_stopped(
    mut ring: AsyncFd<OwnedFd>,
    drain_all: impl Fn() -> usize,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            guard = ring.readable_mut() => {
                let Ok(mut guard) = guard else { break };
                // cleared first: a record submitted while draining wakes us again
                guard.clear_ready();
                drain_all();
            }
        }
    }
}

/// Records that do not ask for a wakeup wake nobody: every ring is read on
/// this one timer.
async fn drain_on_timer(pipeline: Arc<Mutex<Pipeline>>) {
    let mut timer = tokio::time::interval(crate::kernel::hooks::DRAIN_INTERVAL);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        timer.tick().await;
        pipeline.lock().expect("not poisoned").drain();
    }
}

/// aya-log records from the programs go to the `log` facade (bridged into
/// `tracing`), at the level they were logged with.
async fn forward_ebpf_logs<T: log::Log>(
    logger: aya_log::EbpfLogger<T>,
    mut stop: watch::Receiver<bool>,
) {
    // SAFETY: the logger owns its ring-buffer fd for as long as the AsyncFd lives.
    let Ok(mut fd) = (unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) })
    else {
        warn!("cannot poll the eBPF log ring buffer");
        return;
    };
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { return };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        }
    }
}
