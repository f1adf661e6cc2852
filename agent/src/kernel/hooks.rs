//! Loading qpwatch's eBPF object and attaching its hooks, each independently.
//!
//! The object is loaded once per kernel module group ([`Instance`]): the QP
//! programs need ib_core's struct offsets, the CM programs rdma_cm's, and
//! offsets are written into the programs' globals at load time. So the CM
//! instance can be loaded later than the QP one, when rdma_cm appears.

use std::collections::{HashMap, HashSet};

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{KProbe, ProgramError, RawTracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use qpwatch_common::{hook, CmOffsets, CmOp, KernelOffsets, IB_CM_TRACEPOINTS, LOST_REASONS};
use thiserror::Error;
use tracing::{debug, info, warn};

/// The eBPF object built by build.rs from `ebpf/`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/qpwatch-ebpf"));

/// Hook groups, switchable in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// ib_core QP create/modify/destroy.
    Qp,
    /// RDMA CM calls and event handlers.
    Cm,
    /// rdma_create_qp / rdma_destroy_qp and the CMA's QP transitions for in-kernel ULPs.
    KernelUlp,
    /// The `ib_cma:*` tracepoints of ib_cm, counted. Opt-in: a tracepoint
    /// attachment holds its module, so ib_cm cannot be unloaded while they
    /// are attached.
    IbCmTracepoints,
}

impl Group {
    pub const ALL: [Group; 4] = [
        Group::Qp,
        Group::Cm,
        Group::KernelUlp,
        Group::IbCmTracepoints,
    ];
    /// Attached unless the configuration says otherwise: every group that
    /// leaves the RDMA modules free to unload.
    pub const DEFAULT: [Group; 3] = [Group::Qp, Group::Cm, Group::KernelUlp];

    pub fn name(self) -> &'static str {
        match self {
            Group::Qp => "qp",
            Group::Cm => "cm",
            Group::KernelUlp => "kernel-ulp",
            Group::IbCmTracepoints => "ib-cm-tracepoints",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// Which eBPF object instance a hook lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceKind {
    /// Needs ib_core.
    IbCore,
    /// Needs rdma_cm (and ib_core).
    RdmaCm,
}

impl InstanceKind {
    pub const ALL: [InstanceKind; 2] = [InstanceKind::IbCore, InstanceKind::RdmaCm];

    /// Kernel modules whose BTF the instance's offsets come from.
    pub fn modules(self) -> &'static [&'static str] {
        match self {
            InstanceKind::IbCore => &["ib_core"],
            InstanceKind::RdmaCm => &["ib_core", "rdma_cm"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InstanceKind::IbCore => "ib_core",
            InstanceKind::RdmaCm => "rdma_cm",
        }
    }

    /// The instance whose offsets the programs hooked in `module` read.
    fn for_module(module: &str) -> Self {
        match module {
            "ib_core" => InstanceKind::IbCore,
            _ => InstanceKind::RdmaCm,
        }
    }
}

/// How full the ring buffer gets before a record wakes the agent: a quarter
/// of it, at most 64 KiB. Below that the agent drains on its timer
/// ([`DRAIN_INTERVAL`]), so a burst costs one wakeup, not one per event.
pub fn wakeup_bytes(ring_buffer_bytes: u32) -> u64 {
    u64::from(ring_buffer_bytes / 4).min(64 * 1024)
}

/// How often the agent drains the ring buffer without being woken up.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Debian's kernel refuses `perf_event_open` (which every kprobe attach goes
/// through) without CAP_SYS_ADMIN when `kernel.perf_event_paranoid` is 3, its
/// default: CAP_PERFMON alone is not enough (kernel/events/core.c,
/// `perf_event_open`: `perf_paranoid_any() && !capable(CAP_SYS_ADMIN)`).
pub fn perf_event_paranoid_hint(error: &str, paranoid: Option<i32>) -> Option<String> {
    let denied = error.contains("perf_event_open") && error.contains("Permission denied");
    match paranoid {
        Some(level) if denied && level > 2 => Some(format!(
            " (kernel.perf_event_paranoid={level} needs CAP_SYS_ADMIN for kprobes; \
             grant it or set the sysctl to 2, where CAP_PERFMON suffices)"
        )),
        _ => None,
    }
}

fn read_perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    Kprobe {
        function: &'static str,
        ret: bool,
    },
    /// A raw tracepoint; `category` only names it.
    RawTracepoint {
        category: &'static str,
        name: &'static str,
    },
}

/// One kernel attach point.
#[derive(Debug, Clone)]
pub struct Hook {
    /// Program name in the eBPF object.
    pub program: String,
    pub attach: Attach,
    pub group: Group,
    pub instance: InstanceKind,
    /// The kernel module the function or tracepoint is in: the hook goes
    /// away with it and is attached again when it is back.
    pub module: &'static str,
    /// A kretprobe's entry in `RETURN_HOOKED_SINCE` ([`hook::return_slot`]).
    pub return_slot: Option<u32>,
}

impl Hook {
    /// `kprobe:f`, `kretprobe:f` or `tracepoint:cat:name`: the `hook` label.
    pub fn label(&self) -> String {
        match &self.attach {
            Attach::Kprobe { function, ret } => {
                format!("{}:{function}", if *ret { "kretprobe" } else { "kprobe" })
            }
            Attach::RawTracepoint { category, name } => {
                format!("raw_tracepoint:{category}:{name}")
            }
        }
    }
}

/// A kprobe alone: the program records the call at its entry.
fn kprobe(program: &str, function: &'static str, module: &'static str, group: Group) -> Hook {
    Hook {
        program: program.to_owned(),
        attach: Attach::Kprobe {
            function,
            ret: false,
        },
        group,
        instance: InstanceKind::for_module(module),
        module,
        return_slot: None,
    }
}

/// A kprobe and kretprobe on `function`, programs `entry` and `entry_ret`,
/// whose in-flight calls the programs key by `hook_id`.
fn kprobe_pair(
    entry: &str,
    function: &'static str,
    module: &'static str,
    group: Group,
    hook_id: u32,
) -> [Hook; 2] {
    let ret = Hook {
        program: format!("{entry}_ret"),
        attach: Attach::Kprobe {
            function,
            ret: true,
        },
        return_slot: Some(hook::return_slot(hook_id)),
        ..kprobe(entry, function, module, group)
    };
    [kprobe(entry, function, module, group), ret]
}

/// Every hook qpwatch knows, in attach order. Within a pair the entry probe
/// comes first, so that no call in flight at attach time yields a return
/// without its entry.
pub fn all_hooks() -> Vec<Hook> {
    use Group::*;
    let mut hooks = Vec::new();
    for (program, function, id) in [
        ("qp_create_user", "ib_create_qp_user", hook::CREATE_QP_USER),
        (
            "qp_create_kernel",
            "ib_create_qp_kernel",
            hook::CREATE_QP_KERNEL,
        ),
        ("qp_modify", "_ib_modify_qp", hook::MODIFY_QP),
        ("qp_destroy", "ib_destroy_qp_user", hook::DESTROY_QP),
    ] {
        hooks.extend(kprobe_pair(program, function, "ib_core", Qp, id));
    }
    let cm = |op: CmOp| hook::CM_BASE + op as u32;
    for (program, function, op) in [
        ("cm_create_qp", "rdma_create_qp", CmOp::CreateQp),
        ("cm_init_conn_qp", "cma_init_conn_qp", CmOp::InitConnQp),
        ("cm_init_ud_qp", "cma_init_ud_qp", CmOp::InitUdQp),
        ("cm_modify_qp_rtr", "cma_modify_qp_rtr", CmOp::ModifyQpRtr),
        ("cm_modify_qp_rts", "cma_modify_qp_rts", CmOp::ModifyQpRts),
        ("cm_modify_qp_err", "cma_modify_qp_err", CmOp::ModifyQpErr),
    ] {
        hooks.extend(kprobe_pair(program, function, "rdma_cm", KernelUlp, cm(op)));
    }
    hooks.push(kprobe(
        "cm_destroy_qp",
        "rdma_destroy_qp",
        "rdma_cm",
        KernelUlp,
    ));
    for (program, function, op) in [
        (
            "cm_event_handler",
            "cma_cm_event_handler",
            CmOp::EventHandler,
        ),
        ("cm_ib_handler", "cma_ib_handler", CmOp::IbHandler),
        (
            "cm_ib_req_handler",
            "cma_ib_req_handler",
            CmOp::IbReqHandler,
        ),
        ("cm_resolve_addr", "rdma_resolve_addr", CmOp::ResolveAddr),
        ("cm_resolve_route", "rdma_resolve_route", CmOp::ResolveRoute),
        ("cm_listen", "rdma_listen", CmOp::Listen),
        ("cm_connect", "rdma_connect_locked", CmOp::Connect),
        ("cm_accept", "rdma_accept", CmOp::Accept),
        ("cm_rep_recv", "cma_rep_recv", CmOp::RepRecv),
        ("cm_reject", "rdma_reject", CmOp::Reject),
        ("cm_disconnect", "rdma_disconnect", CmOp::Disconnect),
    ] {
        hooks.extend(kprobe_pair(program, function, "rdma_cm", Cm, cm(op)));
    }
    hooks.extend(kprobe_pair(
        "cm_ucma_handler",
        "ucma_event_handler",
        "rdma_ucm",
        Cm,
        cm(CmOp::UcmaHandler),
    ));
    hooks.push(kprobe("cm_destroy_id", "_destroy_id", "rdma_cm", Cm));
    // IB CM protocol messages and errors, counted in the kernel.
    for name in IB_CM_TRACEPOINTS {
        hooks.push(Hook {
            program: format!("tp_{name}"),
            attach: Attach::RawTracepoint {
                category: "ib_cma",
                name,
            },
            group: IbCmTracepoints,
            instance: InstanceKind::RdmaCm,
            module: "ib_cm",
            return_slot: None,
        });
    }
    hooks
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("eBPF object has no program {0}")]
    MissingProgram(String),
    #[error("eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("program {program}: {source}")]
    Program {
        program: String,
        source: ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
}

/// Outcome of one hook's attach attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookStatus {
    Attached,
    /// Not attached; why (module missing, symbol missing, verifier, ...).
    Detached(String),
    /// Its group is switched off in the config.
    Disabled,
}

/// One loaded copy of the eBPF object and the hooks attached from it.
pub struct Instance {
    pub kind: InstanceKind,
    ebpf: Ebpf,
    loaded: HashSet<String>,
    /// Attached hooks by label: each link detaches when dropped (see
    /// [`Instance::detach`]).
    attached: HashMap<String, AttachedHook>,
    /// Kernel program id → hook label, for BPF run-time statistics.
    pub program_ids: HashMap<u32, String>,
}

struct AttachedHook {
    link: Box<dyn Send>,
    module: &'static str,
    return_slot: Option<u32>,
    /// The module's load it was attached in ([`module_generation`]).
    generation: u64,
}

impl Instance {
    /// Loads the object with the kernel's offsets and the ring-buffer size.
    pub fn load(
        kind: InstanceKind,
        offsets: &KernelOffsets,
        cm_offsets: &CmOffsets,
        ring_buffer_bytes: u32,
    ) -> Result<Self, ProbeError> {
        let wakeup = wakeup_bytes(ring_buffer_bytes);
        let ebpf = EbpfLoader::new()
            .override_global("OFFSETS", offsets, true)
            .override_global("CM_OFFSETS", cm_offsets, true)
            .override_global("WAKEUP_BYTES", &wakeup, true)
            .map_max_entries("EVENTS", ring_buffer_bytes)
            .load(EBPF_OBJECT)?;
        Ok(Self {
            kind,
            ebpf,
            loaded: HashSet::new(),
            attached: HashMap::new(),
            program_ids: HashMap::new(),
        })
    }

    pub fn is_attached(&self, label: &str) -> bool {
        self.attached.contains_key(label)
    }

    pub fn attached_count(&self) -> usize {
        self.attached.len()
    }

    /// Tries to attach `hook`, whose module is in its load `generation` (a
    /// no-op if it is attached).
    pub fn attach(&mut self, hook: &Hook, generation: u64) -> Result<(), String> {
        let label = hook.label();
        if self.attached.contains_key(&label) {
            return Ok(());
        }
        let link = self.try_attach(hook).map_err(|e| {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let s_text = s.to_string();
                if !text.ends_with(&s_text) {
                    text.push_str(": ");
                    text.push_str(&s_text);
                }
                source = s.source();
            }
            if matches!(hook.attach, Attach::Kprobe { .. }) {
                if let Some(hint) = perf_event_paranoid_hint(&text, read_perf_event_paranoid()) {
                    text.push_str(&hint);
                }
            }
            text
        })?;
        debug!(hook = %label, program = hook.program, "attached");
        if let Some(slot) = hook.return_slot {
            self.set_return_hooked_since(
                slot,
                crate::model::events::clock_ns(libc::CLOCK_MONOTONIC) as u64,
            );
        }
        if let Some(id) = self
            .ebpf
            .program(&hook.program)
            .and_then(|p| p.info().ok())
            .map(|info| info.id())
        {
            self.program_ids.insert(id, label.clone());
        }
        self.attached.insert(
            label,
            AttachedHook {
                link,
                module: hook.module,
                return_slot: hook.return_slot,
                generation,
            },
        );
        Ok(())
    }

    /// Detaches the hooks whose module went away or was loaded again since
    /// they were attached (`generation` of a module: `None` if not loaded).
    /// Returns their labels and modules.
    pub fn detach_stale(
        &mut self,
        generation: impl Fn(&str) -> Option<u64>,
    ) -> Vec<(String, &'static str)> {
        let stale: Vec<String> = self
            .attached
            .iter()
            .filter(|(_, a)| generation(a.module) != Some(a.generation))
            .map(|(label, _)| label.clone())
            .collect();
        stale
            .into_iter()
            .filter_map(|label| {
                let hook = self.attached.remove(&label)?;
                if let Some(slot) = hook.return_slot {
                    self.set_return_hooked_since(slot, 0);
                }
                drop(hook.link);
                Some((label, hook.module))
            })
            .collect()
    }

    /// Tells the programs since when a pair's kretprobe runs (0: it does not).
    fn set_return_hooked_since(&mut self, slot: u32, since_ns: u64) {
        let set = self
            .ebpf
            .map_mut("RETURN_HOOKED_SINCE")
            .ok_or("no map")
            .and_then(|map| aya::maps::Array::<_, u64>::try_from(map).map_err(|_| "not an array"))
            .and_then(|mut array| array.set(slot, since_ns, 0).map_err(|_| "write failed"));
        if let Err(error) = set {
            warn!(slot, error, "RETURN_HOOKED_SINCE not written");
        }
    }

    fn try_attach(&mut self, hook: &Hook) -> Result<Box<dyn Send>, ProbeError> {
        let first_load = !self.loaded.contains(&hook.program);
        let err = |source| ProbeError::Program {
            program: hook.program.clone(),
            source,
        };
        let link: Box<dyn Send> = match &hook.attach {
            Attach::Kprobe { function, .. } => {
                let p: &mut KProbe = program_of(&mut self.ebpf, &hook.program)?
                    .try_into()
                    .map_err(err)?;
                if first_load {
                    p.load().map_err(err)?;
                }
                self.loaded.insert(hook.program.clone());
                let link = p.attach(function, 0).map_err(err)?;
                Box::new(p.take_link(link).map_err(err)?)
            }
            Attach::RawTracepoint { name, .. } => {
                let p: &mut RawTracePoint = program_of(&mut self.ebpf, &hook.program)?
                    .try_into()
                    .map_err(err)?;
                if first_load {
                    p.load().map_err(err)?;
                }
                self.loaded.insert(hook.program.clone());
                let link = p.attach(name).map_err(err)?;
                Box::new(p.take_link(link).map_err(err)?)
            }
        };
        Ok(link)
    }

    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or(ProbeError::MissingMap("EVENTS"))?;
        RingBuf::try_from(map).map_err(|source| ProbeError::Map {
            name: "EVENTS",
            source,
        })
    }

    pub fn take_counters(&mut self) -> Result<KernelCounters, ProbeError> {
        let lost = self
            .ebpf
            .take_map("LOST")
            .ok_or(ProbeError::MissingMap("LOST"))?;
        let lost = PerCpuArray::try_from(lost).map_err(|source| ProbeError::Map {
            name: "LOST",
            source,
        })?;
        let ib_cm = self
            .ebpf
            .take_map("IB_CM_HITS")
            .ok_or(ProbeError::MissingMap("IB_CM_HITS"))?;
        let ib_cm = PerCpuArray::try_from(ib_cm).map_err(|source| ProbeError::Map {
            name: "IB_CM_HITS",
            source,
        })?;
        Ok(KernelCounters {
            lost,
            ib_cm,
            lost_seen: [0; LOST_REASONS],
            ib_cm_seen: [0; IB_CM_TRACEPOINTS.len()],
        })
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Detaches every hook, several at a time: each kprobe or tracepoint perf
    /// event waits for RCU grace periods when it is released
    /// (perf_trace_event_unreg → tracepoint_synchronize_unregister,
    /// unregister_kprobe → synchronize_rcu), and the waits overlap.
    pub fn detach(mut self) {
        const THREADS: usize = 16;
        let links: Vec<Box<dyn Send>> = std::mem::take(&mut self.attached)
            .into_values()
            .map(|a| a.link)
            .collect();
        let chunk = links.len().div_ceil(THREADS).max(1);
        let mut chunks: Vec<Vec<Box<dyn Send>>> = Vec::new();
        let mut links = links.into_iter().peekable();
        while links.peek().is_some() {
            chunks.push(links.by_ref().take(chunk).collect());
        }
        std::thread::scope(|scope| {
            for chunk in chunks {
                scope.spawn(move || drop(chunk));
            }
        });
        drop(self.ebpf);
    }
}

fn program_of<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut aya::programs::Program, ProbeError> {
    ebpf.program_mut(name)
        .ok_or_else(|| ProbeError::MissingProgram(name.to_owned()))
}

/// Element-wise sum of per-CPU counter arrays.
fn sum_over_cpus<'a, const N: usize>(per_cpu: impl Iterator<Item = &'a [u64; N]>) -> [u64; N] {
    per_cpu.fold([0; N], |mut sum, cpu| {
        sum.iter_mut().zip(cpu).for_each(|(s, c)| *s += c);
        sum
    })
}

/// Counters the programs keep in the kernel, read at scrape time. Reads
/// return what was added since the previous read, so that counters of
/// several instances (and of instances that come and go) add up.
pub struct KernelCounters {
    lost: PerCpuArray<MapData, [u64; LOST_REASONS]>,
    ib_cm: PerCpuArray<MapData, [u64; IB_CM_TRACEPOINTS.len()]>,
    lost_seen: [u64; LOST_REASONS],
    ib_cm_seen: [u64; IB_CM_TRACEPOINTS.len()],
}

impl KernelCounters {
    /// Lost events over all CPUs since the last call, per [`qpwatch_common::LostReason`].
    pub fn lost_delta(&mut self) -> Result<[u64; LOST_REASONS], aya::maps::MapError> {
        let totals = sum_over_cpus(self.lost.get(&0, 0)?.iter());
        Ok(std::array::from_fn(|reason| {
            let delta = totals[reason].saturating_sub(self.lost_seen[reason]);
            self.lost_seen[reason] = totals[reason].max(self.lost_seen[reason]);
            delta
        }))
    }

    /// Hits per ib_cma tracepoint since the last call.
    pub fn ib_cm_delta(&mut self) -> Vec<(&'static str, u64)> {
        let mut deltas = Vec::new();
        let Ok(per_cpu) = self.ib_cm.get(&0, 0) else {
            return deltas;
        };
        let totals = sum_over_cpus(per_cpu.iter());
        for (i, name) in IB_CM_TRACEPOINTS.iter().enumerate() {
            let total = totals[i];
            let delta = total.saturating_sub(self.ib_cm_seen[i]);
            self.ib_cm_seen[i] = total.max(self.ib_cm_seen[i]);
            if delta > 0 {
                deltas.push((*name, delta));
            }
        }
        deltas
    }
}

/// Attaches the hooks of `instance` whose group is enabled and whose module
/// is loaded (`generation` of a module: `None` if not loaded).
pub fn attach_instance(
    instance: &mut Instance,
    hooks: &[Hook],
    enabled: &[Group],
    generation: impl Fn(&str) -> Option<u64>,
) -> Vec<(String, HookStatus)> {
    let mut statuses = Vec::new();
    let kind = instance.kind;
    let attached_before = instance.attached_count();
    for hook in hooks.iter().filter(|h| h.instance == kind) {
        let label = hook.label();
        if !enabled.contains(&hook.group) {
            statuses.push((label, HookStatus::Disabled));
            continue;
        }
        let status = match generation(hook.module) {
            None => HookStatus::Detached(format!("module {} not loaded", hook.module)),
            Some(generation) => match instance.attach(hook, generation) {
                Ok(()) => HookStatus::Attached,
                Err(reason) => {
                    debug!(hook = %label, %reason, "not attached");
                    HookStatus::Detached(reason)
                }
            },
        };
        statuses.push((label, status));
    }
    let attached = statuses
        .iter()
        .filter(|(_, s)| *s == HookStatus::Attached)
        .count();
    // One warning per distinct reason, naming the hooks it applies to.
    let mut by_reason: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (label, status) in &statuses {
        if let HookStatus::Detached(reason) = status {
            by_reason.entry(reason).or_default().push(label);
        }
    }
    if by_reason.is_empty() && instance.attached_count() > attached_before {
        info!(instance = instance.kind.name(), attached, "hooks attached");
    }
    for (reason, hooks) in by_reason {
        warn!(
            instance = instance.kind.name(),
            attached,
            %reason,
            "{} hooks not attached: {}",
            hooks.len(),
            hooks.join(", ")
        );
    }
    statuses
}

#[cfg(test)]
mod tests {
    use super::perf_event_paranoid_hint;

    #[test]
    fn wakeup_threshold_leaves_room_in_any_ring() {
        assert_eq!(super::wakeup_bytes(4096), 1024);
        assert_eq!(super::wakeup_bytes(1 << 20), 64 * 1024);
        assert_eq!(super::wakeup_bytes(1 << 30), 64 * 1024);
    }

    #[test]
    fn paranoid_hint_only_for_denied_perf_event_open_above_2() {
        let denied = "program p: `perf_event_open` failed: Permission denied (os error 13)";
        assert!(perf_event_paranoid_hint(denied, Some(3))
            .unwrap()
            .contains("perf_event_paranoid=3"));
        assert_eq!(perf_event_paranoid_hint(denied, Some(2)), None);
        assert_eq!(perf_event_paranoid_hint(denied, None), None);
        let missing = "program p: `perf_event_open` failed: No such file or directory (os error 2)";
        assert_eq!(perf_event_paranoid_hint(missing, Some(3)), None);
    }
}
