//! Loading qpwatch's eBPF object and attaching its hooks, each independently.
//!
//! The object is loaded once per kernel module group ([`Instance`]): the QP
//! programs need ib_core's struct offsets, the CM programs rdma_cm's, the
//! soft-RoCE programs rdma_rxe's, and offsets are written into the programs'
//! globals at load time. So the CM instance can be loaded later than the QP
//! one, when rdma_cm appears.

use std::collections::{HashMap, HashSet};

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{KProbe, ProgramError, RawTracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use qpwatch_common::{
    hook, CmOffsets, CmOp, KernelOffsets, RxeOffsets, IB_CM_TRACEPOINTS, LOST_REASONS,
};
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
    /// QP async events, at the QP event handlers of uverbs (every userspace
    /// QP) and of the in-kernel consumers.
    QpAsyncEvents,
    /// Soft-RoCE's error completions and its own moves of a QP to ERR.
    RxeQpErrors,
}

impl Group {
    pub const ALL: [Group; 6] = [
        Group::Qp,
        Group::Cm,
        Group::KernelUlp,
        Group::IbCmTracepoints,
        Group::QpAsyncEvents,
        Group::RxeQpErrors,
    ];
    /// Attached unless the configuration says otherwise: every group that
    /// leaves the RDMA modules free to unload.
    pub const DEFAULT: [Group; 5] = [
        Group::Qp,
        Group::Cm,
        Group::KernelUlp,
        Group::QpAsyncEvents,
        Group::RxeQpErrors,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Qp => "qp",
            Group::Cm => "cm",
            Group::KernelUlp => "kernel-ulp",
            Group::IbCmTracepoints => "ib-cm-tracepoints",
            Group::QpAsyncEvents => "qp-async-events",
            Group::RxeQpErrors => "rxe-qp-errors",
        }
    }

    /// The instance whose offsets the group's programs read.
    fn instance(self) -> InstanceKind {
        match self {
            Group::Qp | Group::QpAsyncEvents => InstanceKind::IbCore,
            Group::Cm | Group::KernelUlp | Group::IbCmTracepoints => InstanceKind::RdmaCm,
            Group::RxeQpErrors => InstanceKind::Rxe,
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
    /// Needs soft-RoCE, rdma_rxe (and ib_core): a driver many hosts do not
    /// run, so its absence is no failure.
    Rxe,
}

impl InstanceKind {
    pub const ALL: [InstanceKind; 3] = [
        InstanceKind::IbCore,
        InstanceKind::RdmaCm,
        InstanceKind::Rxe,
    ];

    /// Kernel modules whose BTF the instance's offsets come from.
    pub fn modules(self) -> &'static [&'static str] {
        match self {
            InstanceKind::IbCore => &["ib_core"],
            InstanceKind::RdmaCm => &["ib_core", "rdma_cm"],
            InstanceKind::Rxe => &["ib_core", "rdma_rxe"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InstanceKind::IbCore => "ib_core",
            InstanceKind::RdmaCm => "rdma_cm",
            InstanceKind::Rxe => "rdma_rxe",
        }
    }

    /// A driver's instance: its module missing is the host's choice.
    pub fn optional(self) -> bool {
        self == InstanceKind::Rxe
    }
}

/// How many bytes of records are written between two that wake the agent: a
/// quarter of the ring, at most 64 KiB. The others are drained on the
/// agent's timer ([`DRAIN_INTERVAL`]), so a burst costs one wakeup, not one
/// per event, and a reader that falls behind is not woken by every record.
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

/// What a program is attached to, as its section in the eBPF object says:
/// aya-ebpf's `#[kprobe(function = "f")]` puts the program in section
/// `kprobe/f`, `#[kretprobe(function = "f")]` in `kretprobe/f`,
/// `#[raw_tracepoint(tracepoint = "t")]` in `raw_tp/t` and
/// `#[tracepoint(category = "c", name = "t")]` in `tracepoint/c/t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProgramKind {
    Kprobe,
    Kretprobe,
    RawTracepoint,
    Tracepoint,
}

impl ProgramKind {
    pub fn name(self) -> &'static str {
        match self {
            ProgramKind::Kprobe => "kprobe",
            ProgramKind::Kretprobe => "kretprobe",
            ProgramKind::RawTracepoint => "raw_tracepoint",
            ProgramKind::Tracepoint => "tracepoint",
        }
    }

    /// The kind and target of a program in `section` (the prefixes aya
    /// accepts); `None` if the section names no target.
    fn of_section(section: &str) -> Option<(Self, &str)> {
        let (prefix, target) = section.split_once('/')?;
        let kind = match prefix {
            "kprobe" => ProgramKind::Kprobe,
            "kretprobe" => ProgramKind::Kretprobe,
            "raw_tp" | "raw_tracepoint" => ProgramKind::RawTracepoint,
            "tracepoint" | "tp" => ProgramKind::Tracepoint,
            _ => return None,
        };
        (!target.is_empty()).then_some((kind, target))
    }
}

/// One program of the eBPF object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectProgram {
    pub name: &'static str,
    /// Its section, e.g. `kprobe/ib_create_qp_user`.
    pub section: &'static str,
}

impl ObjectProgram {
    /// Its kind and its target: the kernel function, or the tracepoint
    /// (`category/name` for a tracepoint, the name alone for a raw one).
    pub fn attach_point(&self) -> Option<(ProgramKind, &'static str)> {
        ProgramKind::of_section(self.section)
    }
}

/// The programs of an eBPF object, as aya finds them: the named functions
/// of every section but `.text` (which holds the functions they call).
pub fn object_programs(object: &'static [u8]) -> Result<Vec<ObjectProgram>, object::Error> {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    let file = object::File::parse(object)?;
    let mut programs = Vec::new();
    for symbol in file.symbols() {
        if symbol.kind() != SymbolKind::Text || !symbol.is_definition() {
            continue;
        }
        let (Ok(name), Some(index)) = (symbol.name(), symbol.section_index()) else {
            continue;
        };
        let section = file.section_by_index(index)?.name()?;
        if !name.is_empty() && section != ".text" {
            programs.push(ObjectProgram { name, section });
        }
    }
    programs.sort_by_key(|p| p.name);
    Ok(programs)
}

/// How a hook is attached: what a program is attached with.
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

/// One kernel attach point: a program of the object, with its policy.
#[derive(Debug, Clone)]
pub struct Hook {
    /// Program name in the eBPF object.
    pub program: &'static str,
    pub attach: Attach,
    pub group: Group,
    pub instance: InstanceKind,
    /// The kernel module the function or tracepoint is in: the hook goes
    /// away with it and is attached again when it is back.
    pub module: &'static str,
    /// A kretprobe's entry in `RETURN_HOOKED_SINCE` ([`hook::return_slot`]).
    pub return_slot: Option<u32>,
    /// Its module is one a host may well not load (a consumer or a driver):
    /// while it is absent the hook is [`HookStatus::Idle`], not detached.
    pub optional: bool,
}

impl Hook {
    /// Its status while its module is not loaded: idle if it is optional,
    /// else detached for `reason`.
    pub fn without_module(&self, reason: String) -> HookStatus {
        if self.optional {
            HookStatus::Idle
        } else {
            HookStatus::Detached(reason)
        }
    }

    /// `kprobe:f`, `kretprobe:f` or `raw_tracepoint:cat:name`: the `hook` label.
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

/// The programs a policy line expects on its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A kprobe and a kretprobe; the programs key their in-flight calls by
    /// `hook_id` ([`qpwatch_common::hook`]).
    Pair { hook_id: u32 },
    /// A kprobe alone: the program records the call at its entry.
    Entry,
    /// A raw tracepoint; `category` only names it (in the `hook` label).
    RawTracepoint { category: &'static str },
}

impl Shape {
    /// The kinds of program on the target, in attach order: within a pair
    /// the entry program comes first, so that no call in flight at attach
    /// time yields a return without its entry.
    fn kinds(self) -> &'static [ProgramKind] {
        match self {
            Shape::Pair { .. } => &[ProgramKind::Kprobe, ProgramKind::Kretprobe],
            Shape::Entry => &[ProgramKind::Kprobe],
            Shape::RawTracepoint { .. } => &[ProgramKind::RawTracepoint],
        }
    }
}

/// What the object does not say about a hook: its group and its module.
/// Keyed by the kernel function or tracepoint the programs are attached to.
#[derive(Debug, Clone, Copy)]
struct Policy {
    targets: Targets,
    shape: Shape,
    group: Group,
    module: &'static str,
    /// See [`Hook::optional`].
    optional: bool,
}

#[derive(Debug, Clone, Copy)]
enum Targets {
    One(&'static str),
    Each(&'static [&'static str]),
}

impl Policy {
    const fn pair(
        function: &'static str,
        hook_id: u32,
        group: Group,
        module: &'static str,
    ) -> Self {
        Policy {
            targets: Targets::One(function),
            shape: Shape::Pair { hook_id },
            group,
            module,
            optional: false,
        }
    }

    /// The kprobe and kretprobe of a CM op, on its function.
    const fn cm_pair(op: CmOp, group: Group, module: &'static str) -> Self {
        Policy::pair(op.function(), op.hook(), group, module)
    }

    /// The kprobe of a CM op recorded at entry, on its function.
    const fn cm_entry(op: CmOp, group: Group, module: &'static str) -> Self {
        Policy {
            targets: Targets::One(op.function()),
            shape: Shape::Entry,
            group,
            module,
            optional: false,
        }
    }

    const fn raw_tracepoints(
        category: &'static str,
        names: &'static [&'static str],
        group: Group,
        module: &'static str,
    ) -> Self {
        Policy {
            targets: Targets::Each(names),
            shape: Shape::RawTracepoint { category },
            group,
            module,
            optional: false,
        }
    }

    /// A kprobe recorded at entry, on a function of a module the host may
    /// not load (see [`Hook::optional`]).
    const fn optional_entry(function: &'static str, group: Group, module: &'static str) -> Self {
        Policy {
            targets: Targets::One(function),
            shape: Shape::Entry,
            group,
            module,
            optional: true,
        }
    }

    fn targets(&self) -> &[&'static str] {
        match &self.targets {
            Targets::One(target) => std::slice::from_ref(target),
            Targets::Each(targets) => targets,
        }
    }
}

/// The policy of every hook, in attach order: one line per kernel function
/// (or set of tracepoints). Where a program is attached, and whether it is
/// a kprobe or a kretprobe, is the eBPF object's to say (the programs'
/// attributes); the `hook_table` test checks that both agree.
const POLICY: &[Policy] = {
    use Group::*;
    &[
        // ib_core: the QP lifecycle.
        Policy::pair("ib_create_qp_user", hook::CREATE_QP_USER, Qp, "ib_core"),
        Policy::pair("ib_create_qp_kernel", hook::CREATE_QP_KERNEL, Qp, "ib_core"),
        Policy::pair("_ib_modify_qp", hook::MODIFY_QP, Qp, "ib_core"),
        Policy::pair("ib_destroy_qp_user", hook::DESTROY_QP, Qp, "ib_core"),
        // rdma_cm: the QPs of in-kernel consumers.
        Policy::cm_pair(CmOp::CreateQp, KernelUlp, "rdma_cm"),
        Policy::cm_pair(CmOp::InitConnQp, KernelUlp, "rdma_cm"),
        Policy::cm_pair(CmOp::InitUdQp, KernelUlp, "rdma_cm"),
        Policy::cm_pair(CmOp::ModifyQpRtr, KernelUlp, "rdma_cm"),
        Policy::cm_pair(CmOp::ModifyQpRts, KernelUlp, "rdma_cm"),
        Policy::cm_pair(CmOp::ModifyQpErr, KernelUlp, "rdma_cm"),
        Policy::cm_entry(CmOp::DestroyQp, KernelUlp, "rdma_cm"),
        // rdma_cm and rdma_ucm: calls and event handlers.
        Policy::cm_pair(CmOp::EventHandler, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::IbHandler, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::IbReqHandler, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::ResolveAddr, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::ResolveRoute, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::Listen, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::Connect, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::Accept, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::RepRecv, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::Reject, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::Disconnect, Cm, "rdma_cm"),
        Policy::cm_pair(CmOp::UcmaHandler, Cm, "rdma_ucm"),
        Policy::cm_entry(CmOp::DestroyId, Cm, "rdma_cm"),
        // ib_cm: IB CM protocol messages and errors, counted in the kernel.
        Policy::raw_tracepoints("ib_cma", &IB_CM_TRACEPOINTS, IbCmTracepoints, "ib_cm"),
        // QP async events, at each consumer's handler. rpcrdma's (svcrdma)
        // and 9pnet_rdma's are both static `qp_event_handler`s, a name
        // ib_core's MAD layer has too: a kprobe by name cannot tell them apart.
        Policy::optional_entry("ib_uverbs_qp_event_handler", QpAsyncEvents, "ib_uverbs"),
        Policy::optional_entry("nvme_rdma_qp_event", QpAsyncEvents, "nvme_rdma"),
        Policy::optional_entry("nvmet_rdma_qp_event", QpAsyncEvents, "nvmet_rdma"),
        Policy::optional_entry("iser_qp_event_callback", QpAsyncEvents, "ib_iser"),
        Policy::optional_entry("isert_qp_event_callback", QpAsyncEvents, "ib_isert"),
        Policy::optional_entry("srp_qp_event", QpAsyncEvents, "ib_srp"),
        Policy::optional_entry("srpt_qp_event", QpAsyncEvents, "ib_srpt"),
        Policy::optional_entry("rds_ib_qp_event_handler", QpAsyncEvents, "rds_rdma"),
        Policy::optional_entry("smc_ib_qp_event_handler", QpAsyncEvents, "smc"),
        Policy::optional_entry("ipoib_cm_rx_event_handler", QpAsyncEvents, "ib_ipoib"),
        // soft-RoCE: error completions, then the QP's move to ERR.
        Policy::optional_entry("rxe_cq_post", RxeQpErrors, "rdma_rxe"),
        Policy::optional_entry("rxe_qp_error", RxeQpErrors, "rdma_rxe"),
    ]
};

/// A disagreement between the policy table and the programs of the object.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Mismatch {
    #[error("program {program} is in section {section}, which names no attach point")]
    NoAttachPoint {
        program: &'static str,
        section: &'static str,
    },
    #[error("program {program} ({kind}:{target}) has no policy line")]
    NoPolicy {
        program: &'static str,
        kind: &'static str,
        target: &'static str,
    },
    #[error("program {program} is a {kind} on {target}, which its policy line does not attach")]
    WrongKind {
        program: &'static str,
        kind: &'static str,
        target: &'static str,
    },
    #[error("the policy line of {target} wants a {kind} program, the object has none")]
    NoProgram {
        kind: &'static str,
        target: &'static str,
    },
    #[error("programs {first} and {second} are both {kind}s on {target}")]
    TwoPrograms {
        first: &'static str,
        second: &'static str,
        kind: &'static str,
        target: &'static str,
    },
    #[error("{target} has more than one policy line")]
    TwoPolicies { target: &'static str },
}

/// The hooks of `programs` under `policies`, in policy order, and whatever
/// disagrees between them.
fn hook_table(programs: &[ObjectProgram], policies: &[Policy]) -> (Vec<Hook>, Vec<Mismatch>) {
    let mut mismatches = Vec::new();
    let mut on_target: HashMap<&str, Vec<(ProgramKind, &'static str)>> = HashMap::new();
    for program in programs {
        match program.attach_point() {
            Some((kind, target)) => on_target
                .entry(target)
                .or_default()
                .push((kind, program.name)),
            None => mismatches.push(Mismatch::NoAttachPoint {
                program: program.name,
                section: program.section,
            }),
        }
    }
    let mut hooks = Vec::new();
    let mut with_policy = HashSet::new();
    for policy in policies {
        for &target in policy.targets() {
            if !with_policy.insert(target) {
                mismatches.push(Mismatch::TwoPolicies { target });
                continue;
            }
            let found = on_target.get(target).map_or(&[][..], Vec::as_slice);
            for &(kind, program) in found {
                if !policy.shape.kinds().contains(&kind) {
                    mismatches.push(Mismatch::WrongKind {
                        program,
                        kind: kind.name(),
                        target,
                    });
                }
            }
            for &kind in policy.shape.kinds() {
                let mut of_kind = found.iter().filter(|(k, _)| *k == kind).map(|(_, p)| *p);
                let Some(program) = of_kind.next() else {
                    mismatches.push(Mismatch::NoProgram {
                        kind: kind.name(),
                        target,
                    });
                    continue;
                };
                if let Some(second) = of_kind.next() {
                    mismatches.push(Mismatch::TwoPrograms {
                        first: program,
                        second,
                        kind: kind.name(),
                        target,
                    });
                }
                hooks.push(policy.hook(program, kind, target));
            }
        }
    }
    for program in programs {
        if let Some((kind, target)) = program.attach_point() {
            if !with_policy.contains(target) {
                mismatches.push(Mismatch::NoPolicy {
                    program: program.name,
                    kind: kind.name(),
                    target,
                });
            }
        }
    }
    (hooks, mismatches)
}

impl Policy {
    /// The hook of `program`, a `kind` the policy's shape attaches.
    fn hook(&self, program: &'static str, kind: ProgramKind, target: &'static str) -> Hook {
        let attach = match self.shape {
            Shape::RawTracepoint { category } => Attach::RawTracepoint {
                category,
                name: target,
            },
            Shape::Pair { .. } | Shape::Entry => Attach::Kprobe {
                function: target,
                ret: kind == ProgramKind::Kretprobe,
            },
        };
        let return_slot = match self.shape {
            Shape::Pair { hook_id } if kind == ProgramKind::Kretprobe => {
                Some(hook::return_slot(hook_id))
            }
            _ => None,
        };
        Hook {
            program,
            attach,
            group: self.group,
            instance: self.group.instance(),
            module: self.module,
            return_slot,
            optional: self.optional,
        }
    }
}

/// Every hook qpwatch knows, in attach order: the programs of the embedded
/// object, with their policy.
pub fn all_hooks() -> Vec<Hook> {
    let programs = match object_programs(EBPF_OBJECT) {
        Ok(programs) => programs,
        Err(error) => {
            warn!(%error, "cannot list the programs of the eBPF object");
            return Vec::new();
        }
    };
    let (hooks, mismatches) = hook_table(&programs, POLICY);
    for mismatch in mismatches {
        warn!(%mismatch, "hook table");
    }
    hooks
}

#[derive(Debug, Error)]
pub enum HookError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("eBPF object has no program {0}")]
    MissingProgram(&'static str),
    #[error("eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("program {program}: {source}")]
    Program {
        program: &'static str,
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
    /// An optional hook ([`Hook::optional`]) whose module is not loaded:
    /// nothing to watch, nothing wrong.
    Idle,
}

/// One loaded copy of the eBPF object and the hooks attached from it.
pub struct Instance {
    pub kind: InstanceKind,
    ebpf: Ebpf,
    loaded: HashSet<&'static str>,
    /// Attached hooks by label: each link detaches when dropped (see
    /// [`Instance::detach`]).
    attached: HashMap<String, AttachedHook>,
    /// Kernel program id → hook label, for BPF run-time statistics.
    pub program_ids: HashMap<u32, String>,
    /// Instructions the verifier walked through, over the loaded programs.
    verified_instructions: u64,
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
        rxe_offsets: &RxeOffsets,
        task_comm_offset: u32,
        ring_buffer_bytes: u32,
    ) -> Result<Self, HookError> {
        let wakeup = wakeup_bytes(ring_buffer_bytes);
        let ebpf = EbpfLoader::new()
            .override_global("OFFSETS", offsets, true)
            .override_global("CM_OFFSETS", cm_offsets, true)
            .override_global("RXE_OFFSETS", rxe_offsets, true)
            .override_global("TASK_COMM_OFFSET", &task_comm_offset, true)
            .override_global("WAKEUP_BYTES", &wakeup, true)
            .map_max_entries("EVENTS", ring_buffer_bytes)
            .load(EBPF_OBJECT)?;
        Ok(Self {
            kind,
            ebpf,
            loaded: HashSet::new(),
            attached: HashMap::new(),
            program_ids: HashMap::new(),
            verified_instructions: 0,
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
        if let Some(info) = self.ebpf.program(hook.program).and_then(|p| p.info().ok()) {
            if self.program_ids.insert(info.id(), label.clone()).is_none() {
                self.verified_instructions +=
                    u64::from(info.verified_instruction_count().unwrap_or(0));
            }
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

    fn try_attach(&mut self, hook: &Hook) -> Result<Box<dyn Send>, HookError> {
        let first_load = !self.loaded.contains(hook.program);
        let err = |source| HookError::Program {
            program: hook.program,
            source,
        };
        let link: Box<dyn Send> = match &hook.attach {
            Attach::Kprobe { function, .. } => {
                let p: &mut KProbe = program_of(&mut self.ebpf, hook.program)?
                    .try_into()
                    .map_err(err)?;
                if first_load {
                    p.load().map_err(err)?;
                }
                self.loaded.insert(hook.program);
                let link = p.attach(function, 0).map_err(err)?;
                Box::new(p.take_link(link).map_err(err)?)
            }
            Attach::RawTracepoint { name, .. } => {
                let p: &mut RawTracePoint = program_of(&mut self.ebpf, hook.program)?
                    .try_into()
                    .map_err(err)?;
                if first_load {
                    p.load().map_err(err)?;
                }
                self.loaded.insert(hook.program);
                let link = p.attach(name).map_err(err)?;
                Box::new(p.take_link(link).map_err(err)?)
            }
        };
        Ok(link)
    }

    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, HookError> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or(HookError::MissingMap("EVENTS"))?;
        RingBuf::try_from(map).map_err(|source| HookError::Map {
            name: "EVENTS",
            source,
        })
    }

    pub fn take_counters(&mut self) -> Result<KernelCounters, HookError> {
        let lost = self
            .ebpf
            .take_map("LOST")
            .ok_or(HookError::MissingMap("LOST"))?;
        let lost = PerCpuArray::try_from(lost).map_err(|source| HookError::Map {
            name: "LOST",
            source,
        })?;
        let ib_cm = self
            .ebpf
            .take_map("IB_CM_HITS")
            .ok_or(HookError::MissingMap("IB_CM_HITS"))?;
        let ib_cm = PerCpuArray::try_from(ib_cm).map_err(|source| HookError::Map {
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
    name: &'static str,
) -> Result<&'a mut aya::programs::Program, HookError> {
    ebpf.program_mut(name)
        .ok_or(HookError::MissingProgram(name))
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
            None => hook.without_module(format!("module {} not loaded", hook.module)),
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
        info!(
            instance = instance.kind.name(),
            attached,
            verified_instructions = instance.verified_instructions,
            "hooks attached"
        );
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
    use super::*;

    /// The policy table and the programs of the embedded object agree: every
    /// program has a policy line, every policy line its programs, of the
    /// kinds it attaches.
    #[test]
    fn hook_table_matches_the_ebpf_object() {
        let programs = object_programs(EBPF_OBJECT).expect("the embedded object parses");
        let (hooks, mismatches) = hook_table(&programs, POLICY);
        let mismatches: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
        assert!(
            mismatches.is_empty(),
            "the policy table (POLICY in agent/src/kernel/hooks.rs) and the programs of \
             the eBPF object disagree:\n  {}",
            mismatches.join("\n  ")
        );
        assert_eq!(hooks.len(), programs.len());
    }

    /// No program calls the byte-at-a-time `memset`/`memcpy` that
    /// bpf-linker exports: with LLVM's `-bpf-expand-memcpy-in-order` (which
    /// the linker passes unless told not to, agent/build.rs) the BPF backend
    /// expands no memset inline, and zeroing one event took a loop of
    /// five instructions per byte.
    #[test]
    fn no_program_calls_a_memory_builtin() {
        use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
        let file = object::File::parse(EBPF_OBJECT).expect("the embedded object parses");
        let mut calls = Vec::new();
        for section in file.sections() {
            for (_, relocation) in section.relocations() {
                let RelocationTarget::Symbol(index) = relocation.target() else {
                    continue;
                };
                let name = file
                    .symbol_by_index(index)
                    .and_then(|symbol| symbol.name())
                    .unwrap_or_default();
                if ["memset", "memcpy", "memmove", "memcmp", "bcmp"].contains(&name) {
                    calls.push(format!("{} → {name}", section.name().unwrap_or("?")));
                }
            }
        }
        assert!(calls.is_empty(), "{}", calls.join("\n"));
    }

    #[test]
    fn hooks_keep_their_labels_modules_and_slots() {
        let hooks = all_hooks();
        let find = |label: &str| {
            hooks
                .iter()
                .find(|h| h.label() == label)
                .unwrap_or_else(|| panic!("no hook {label}"))
        };
        let create = find("kprobe:ib_create_qp_user");
        assert_eq!(create.program, "qp_create_user");
        assert_eq!((create.group, create.module), (Group::Qp, "ib_core"));
        assert_eq!(create.instance, InstanceKind::IbCore);
        let create_ret = find("kretprobe:ib_create_qp_user");
        assert_eq!(create_ret.return_slot, Some(hook::CREATE_QP_USER));
        let connect_ret = find("kretprobe:rdma_connect_locked");
        assert_eq!(connect_ret.program, "cm_connect_ret");
        assert_eq!(
            connect_ret.return_slot,
            Some(hook::return_slot(CmOp::Connect.hook()))
        );
        let ucma = find("kprobe:ucma_event_handler");
        assert_eq!((ucma.group, ucma.module), (Group::Cm, "rdma_ucm"));
        assert_eq!(ucma.instance, InstanceKind::RdmaCm);
        let destroy_qp = find("kprobe:rdma_destroy_qp");
        assert_eq!(destroy_qp.group, Group::KernelUlp);
        assert!(hooks
            .iter()
            .all(|h| h.label() != "kretprobe:rdma_destroy_qp"));
        let tp = find("raw_tracepoint:ib_cma:icm_send_req");
        assert_eq!(tp.program, "tp_icm_send_req");
        assert_eq!((tp.group, tp.module), (Group::IbCmTracepoints, "ib_cm"));
        // a pair's entry is attached before its return
        let position = |label: &str| hooks.iter().position(|h| h.label() == label);
        assert!(position("kprobe:rdma_accept") < position("kretprobe:rdma_accept"));
    }

    fn program(name: &'static str, section: &'static str) -> ObjectProgram {
        ObjectProgram { name, section }
    }

    const TEST_POLICY: &[Policy] = &[
        Policy::pair("f", 1, Group::Qp, "ib_core"),
        Policy::cm_entry(CmOp::DestroyId, Group::Cm, "rdma_cm"),
        Policy::raw_tracepoints("cat", &["t1", "t2"], Group::IbCmTracepoints, "ib_cm"),
    ];

    fn mismatches(programs: &[ObjectProgram]) -> Vec<String> {
        let (_, mismatches) = hook_table(programs, TEST_POLICY);
        mismatches.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn hook_table_reports_each_disagreement() {
        let good = [
            program("f_entry", "kprobe/f"),
            program("f_ret", "kretprobe/f"),
            program("destroy", "kprobe/_destroy_id"),
            program("t1", "raw_tp/t1"),
            program("t2", "raw_tp/t2"),
        ];
        let (hooks, none) = hook_table(&good, TEST_POLICY);
        assert_eq!(none, vec![]);
        let labels: Vec<String> = hooks.iter().map(Hook::label).collect();
        assert_eq!(
            labels,
            [
                "kprobe:f",
                "kretprobe:f",
                "kprobe:_destroy_id",
                "raw_tracepoint:cat:t1",
                "raw_tracepoint:cat:t2"
            ]
        );
        assert_eq!(hooks[1].return_slot, Some(1));

        let mut no_policy = good.to_vec();
        no_policy.push(program("g", "kprobe/g"));
        assert_eq!(
            mismatches(&no_policy),
            ["program g (kprobe:g) has no policy line"]
        );
        assert_eq!(
            mismatches(&good[1..]),
            ["the policy line of f wants a kprobe program, the object has none"]
        );
        let mut wrong_kind = good.to_vec();
        wrong_kind[2] = program("destroy", "kretprobe/_destroy_id");
        assert_eq!(
            mismatches(&wrong_kind),
            [
                "program destroy is a kretprobe on _destroy_id, which its policy line does not attach",
                "the policy line of _destroy_id wants a kprobe program, the object has none"
            ]
        );
        let mut bare = good.to_vec();
        bare.push(program("h", "kprobe"));
        assert_eq!(
            mismatches(&bare),
            ["program h is in section kprobe, which names no attach point"]
        );
        let mut twice = good.to_vec();
        twice.push(program("t1_again", "raw_tracepoint/t1"));
        assert_eq!(
            mismatches(&twice),
            ["programs t1 and t1_again are both raw_tracepoints on t1"]
        );
    }

    #[test]
    fn sections_name_kind_and_target() {
        use ProgramKind::*;
        for (section, expected) in [
            (
                "kprobe/ib_create_qp_user",
                Some((Kprobe, "ib_create_qp_user")),
            ),
            (
                "kretprobe/_ib_modify_qp",
                Some((Kretprobe, "_ib_modify_qp")),
            ),
            ("raw_tp/icm_send_req", Some((RawTracepoint, "icm_send_req"))),
            ("raw_tracepoint/x", Some((RawTracepoint, "x"))),
            (
                "tracepoint/ib_cma/icm_send_req",
                Some((Tracepoint, "ib_cma/icm_send_req")),
            ),
            ("kprobe", None),
            ("kprobe/", None),
            ("xdp/f", None),
            ("license", None),
        ] {
            assert_eq!(ProgramKind::of_section(section), expected, "{section}");
        }
    }

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
