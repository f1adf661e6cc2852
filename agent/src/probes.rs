//! Loading qpwatch's eBPF object and attaching its hooks, each independently.
//!
//! The object is loaded once per kernel module group ([`Instance`]): the QP
//! programs need ib_core's struct offsets, the CM programs rdma_cm's, and
//! offsets are written into the programs' globals at load time. So the CM
//! instance can be loaded later than the QP one, when rdma_cm appears.

use std::collections::HashSet;

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{KProbe, ProgramError, RawTracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use qpwatch_common::{CmOffsets, KernelOffsets, IB_CM_TRACEPOINTS, LOST_REASONS};
use thiserror::Error;
use tracing::{debug, info, warn};

/// The `rdma_cma:*` tracepoints (drivers/infiniband/core/cma_trace.h) used;
/// program `tp_<name>` each.
pub const CMA_TRACEPOINTS: [&str; 14] = [
    "cm_send_req",
    "cm_send_rep",
    "cm_send_rtu",
    "cm_send_rej",
    "cm_send_mra",
    "cm_disconnect",
    "cm_sent_dreq",
    "cm_sent_drep",
    "cm_id_destroy",
    "cm_qp_create",
    "cm_qp_destroy",
    "cm_event_handler",
    "cm_event_done",
    "cm_req_handler",
];

/// The eBPF object built by build.rs from `ebpf/`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/qpwatch-ebpf"));

/// Probe groups, switchable in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// ib_core QP create/modify/destroy.
    Qp,
    /// RDMA CM calls, event handlers and tracepoints.
    Cm,
    /// rdma_create_qp / rdma_destroy_qp and the CMA's QP transitions for in-kernel ULPs.
    KernelUlp,
}

impl Group {
    pub const ALL: [Group; 3] = [Group::Qp, Group::Cm, Group::KernelUlp];

    pub fn name(self) -> &'static str {
        match self {
            Group::Qp => "qp",
            Group::Cm => "cm",
            Group::KernelUlp => "kernel-ulp",
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
        name: String,
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
    /// Attach only if the hook with this label did not attach (a fallback).
    pub fallback_for: Option<&'static str>,
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

/// The raw tracepoint `category:name`, attached by the program `tp_<name>`.
fn raw_tracepoint(
    category: &'static str,
    name: &str,
    group: Group,
    instance: InstanceKind,
) -> Hook {
    Hook {
        program: format!("tp_{name}"),
        attach: Attach::RawTracepoint {
            category,
            name: name.to_owned(),
        },
        group,
        instance,
        fallback_for: None,
    }
}

fn kprobe_pair(
    entry: &str,
    ret: &str,
    function: &'static str,
    group: Group,
    instance: InstanceKind,
) -> [Hook; 2] {
    [
        Hook {
            program: entry.to_owned(),
            attach: Attach::Kprobe {
                function,
                ret: false,
            },
            group,
            instance,
            fallback_for: None,
        },
        Hook {
            program: ret.to_owned(),
            attach: Attach::Kprobe {
                function,
                ret: true,
            },
            group,
            instance,
            fallback_for: None,
        },
    ]
}

/// Every hook qpwatch knows, in attach order. Within a pair the entry probe
/// comes first, so that no call in flight at attach time yields a return
/// without its entry.
pub fn all_hooks() -> Vec<Hook> {
    use Group::*;
    use InstanceKind::*;
    let mut hooks = Vec::new();
    for (entry, ret, function) in [
        ("qp_create_user", "qp_create_user_ret", "ib_create_qp_user"),
        (
            "qp_create_kernel",
            "qp_create_kernel_ret",
            "ib_create_qp_kernel",
        ),
        ("qp_modify", "qp_modify_ret", "_ib_modify_qp"),
        ("qp_destroy", "qp_destroy_ret", "ib_destroy_qp_user"),
    ] {
        hooks.extend(kprobe_pair(entry, ret, function, Qp, IbCore));
    }
    for (entry, ret, function) in [
        ("cm_create_qp", "cm_create_qp_ret", "rdma_create_qp"),
        ("cm_init_conn_qp", "cm_init_conn_qp_ret", "cma_init_conn_qp"),
        ("cm_init_ud_qp", "cm_init_ud_qp_ret", "cma_init_ud_qp"),
        (
            "cm_modify_qp_rtr",
            "cm_modify_qp_rtr_ret",
            "cma_modify_qp_rtr",
        ),
        (
            "cm_modify_qp_rts",
            "cm_modify_qp_rts_ret",
            "cma_modify_qp_rts",
        ),
        (
            "cm_modify_qp_err",
            "cm_modify_qp_err_ret",
            "cma_modify_qp_err",
        ),
    ] {
        hooks.extend(kprobe_pair(entry, ret, function, KernelUlp, RdmaCm));
    }
    for name in CMA_TRACEPOINTS {
        hooks.push(raw_tracepoint("rdma_cma", name, Cm, RdmaCm));
    }
    // The raw tracepoints around the consumer's handler give what a kprobe
    // pair on cma_cm_event_handler would: the pair stands by in case they
    // cannot attach.
    let [mut handler_entry, mut handler_return] = kprobe_pair(
        "cm_event_handler",
        "cm_event_handler_ret",
        "cma_cm_event_handler",
        Cm,
        RdmaCm,
    );
    handler_entry.fallback_for = Some("raw_tracepoint:rdma_cma:cm_event_handler");
    handler_return.fallback_for = Some("raw_tracepoint:rdma_cma:cm_event_done");
    hooks.extend([handler_entry, handler_return]);
    for (entry, ret, function) in [
        ("cm_ib_handler", "cm_ib_handler_ret", "cma_ib_handler"),
        (
            "cm_ib_req_handler",
            "cm_ib_req_handler_ret",
            "cma_ib_req_handler",
        ),
        (
            "cm_ucma_handler",
            "cm_ucma_handler_ret",
            "ucma_event_handler",
        ),
        (
            "cm_resolve_addr",
            "cm_resolve_addr_ret",
            "rdma_resolve_addr",
        ),
        (
            "cm_resolve_route",
            "cm_resolve_route_ret",
            "rdma_resolve_route",
        ),
        ("cm_listen", "cm_listen_ret", "rdma_listen"),
    ] {
        hooks.extend(kprobe_pair(entry, ret, function, Cm, RdmaCm));
    }
    // IB CM protocol messages and errors, counted in the kernel.
    for name in IB_CM_TRACEPOINTS {
        hooks.push(raw_tracepoint("ib_cma", name, Cm, RdmaCm));
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
    /// A fallback whose primary hook is attached.
    Standby,
    /// Its group is switched off in the config.
    Disabled,
}

/// One loaded copy of the eBPF object and the hooks attached from it.
pub struct Instance {
    pub kind: InstanceKind,
    ebpf: Ebpf,
    loaded: HashSet<String>,
    attached: HashSet<String>,
    /// Owned links: each detaches when dropped (see [`Instance::detach`]).
    links: Vec<Box<dyn Send>>,
    /// Kernel program id → hook label, for BPF run-time statistics.
    pub program_ids: Vec<(u32, String)>,
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
            attached: HashSet::new(),
            links: Vec::new(),
            program_ids: Vec::new(),
        })
    }

    pub fn is_attached(&self, label: &str) -> bool {
        self.attached.contains(label)
    }

    pub fn attached_count(&self) -> usize {
        self.attached.len()
    }

    /// Tries to attach `hook` (a no-op if it already is).
    pub fn attach(&mut self, hook: &Hook) -> Result<(), String> {
        let label = hook.label();
        if self.attached.contains(&label) {
            return Ok(());
        }
        self.try_attach(hook).map_err(|e| {
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
        if let Some(id) = self
            .ebpf
            .program(&hook.program)
            .and_then(|p| p.info().ok())
            .map(|info| info.id())
        {
            self.program_ids.push((id, label.clone()));
        }
        self.attached.insert(label);
        Ok(())
    }

    fn try_attach(&mut self, hook: &Hook) -> Result<(), ProbeError> {
        let first_load = !self.loaded.contains(&hook.program);
        let err = |source| ProbeError::Program {
            program: hook.program.clone(),
            source,
        };
        match &hook.attach {
            Attach::Kprobe { function, .. } => {
                let p: &mut KProbe = program_of(&mut self.ebpf, &hook.program)?
                    .try_into()
                    .map_err(err)?;
                if first_load {
                    p.load().map_err(err)?;
                }
                self.loaded.insert(hook.program.clone());
                let link = p.attach(function, 0).map_err(err)?;
                self.links.push(Box::new(p.take_link(link).map_err(err)?));
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
                self.links.push(Box::new(p.take_link(link).map_err(err)?));
            }
        }
        Ok(())
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
        let links = std::mem::take(&mut self.links);
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

/// Hooks to try for `kind`, honouring switched-off groups and fallbacks.
pub fn attach_instance(
    instance: &mut Instance,
    hooks: &[Hook],
    enabled: &[Group],
) -> Vec<(String, HookStatus)> {
    let mut statuses = Vec::new();
    let kind = instance.kind;
    for hook in hooks.iter().filter(|h| h.instance == kind) {
        let label = hook.label();
        if !enabled.contains(&hook.group) {
            statuses.push((label, HookStatus::Disabled));
            continue;
        }
        if let Some(primary) = hook.fallback_for {
            if instance.is_attached(primary) {
                statuses.push((label, HookStatus::Standby));
                continue;
            }
        }
        let status = match instance.attach(hook) {
            Ok(()) => HookStatus::Attached,
            Err(reason) => HookStatus::Detached(reason),
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
    if by_reason.is_empty() {
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
