//! Loading qpwatch's eBPF object and attaching its hooks.

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{KProbe, ProgramError},
    Ebpf, EbpfError, EbpfLoader,
};
use qpwatch_common::{KernelOffsets, LOST_REASONS};
use thiserror::Error;
use tracing::{debug, info};

/// The eBPF object built by build.rs from `ebpf/`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/qpwatch-ebpf"));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Entry,
    Return,
}

/// One kernel attach point.
#[derive(Debug, Clone, Copy)]
pub struct Hook {
    /// Program name in the eBPF object.
    pub program: &'static str,
    /// Kernel function.
    pub function: &'static str,
    pub kind: ProbeKind,
}

impl Hook {
    /// `function` for kprobes, `function:return` for kretprobes: the `hook` label.
    pub fn label(&self) -> String {
        match self.kind {
            ProbeKind::Entry => self.function.to_owned(),
            ProbeKind::Return => format!("{}:return", self.function),
        }
    }
}

const fn pair(entry: &'static str, ret: &'static str, function: &'static str) -> [Hook; 2] {
    [
        Hook {
            program: entry,
            function,
            kind: ProbeKind::Entry,
        },
        Hook {
            program: ret,
            function,
            kind: ProbeKind::Return,
        },
    ]
}

/// QP lifecycle hooks in ib_core. Entry probes are attached before return
/// probes so that no call in flight at attach time yields a return without entry.
pub fn qp_hooks() -> Vec<Hook> {
    let pairs = [
        pair("qp_create_user", "qp_create_user_ret", "ib_create_qp_user"),
        pair(
            "qp_create_kernel",
            "qp_create_kernel_ret",
            "ib_create_qp_kernel",
        ),
        pair("qp_modify", "qp_modify_ret", "_ib_modify_qp"),
        pair("qp_destroy", "qp_destroy_ret", "ib_destroy_qp_user"),
    ];
    let entries = pairs.iter().map(|p| p[0]);
    let returns = pairs.iter().map(|p| p[1]);
    entries.chain(returns).collect()
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("eBPF object has no program {0}")]
    MissingProgram(&'static str),
    #[error("eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("loading program {program} for {function}: {source}")]
    LoadProgram {
        program: &'static str,
        function: &'static str,
        source: ProgramError,
    },
    #[error("attaching {hook}: {source} (is the function in /proc/kallsyms?)")]
    Attach { hook: String, source: ProgramError },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
}

pub struct Probes {
    ebpf: Ebpf,
}

impl Probes {
    /// Loads the object with the kernel's offsets and the ring-buffer size.
    pub fn load(offsets: &KernelOffsets, ring_buffer_bytes: u32) -> Result<Self, ProbeError> {
        let ebpf = EbpfLoader::new()
            .override_global("OFFSETS", offsets, true)
            .map_max_entries("EVENTS", ring_buffer_bytes)
            .load(EBPF_OBJECT)?;
        Ok(Self { ebpf })
    }

    /// Loads and attaches every hook; the first failure is returned.
    pub fn attach(&mut self, hooks: &[Hook]) -> Result<(), ProbeError> {
        for hook in hooks {
            let program: &mut KProbe = self
                .ebpf
                .program_mut(hook.program)
                .ok_or(ProbeError::MissingProgram(hook.program))?
                .try_into()
                .map_err(|source| ProbeError::LoadProgram {
                    program: hook.program,
                    function: hook.function,
                    source,
                })?;
            program.load().map_err(|source| ProbeError::LoadProgram {
                program: hook.program,
                function: hook.function,
                source,
            })?;
            program
                .attach(hook.function, 0)
                .map_err(|source| ProbeError::Attach {
                    hook: hook.label(),
                    source,
                })?;
            debug!(hook = %hook.label(), program = hook.program, "attached");
        }
        info!(hooks = hooks.len(), "all hooks attached");
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

    pub fn take_lost_counters(&mut self) -> Result<LostCounters, ProbeError> {
        let map = self
            .ebpf
            .take_map("LOST")
            .ok_or(ProbeError::MissingMap("LOST"))?;
        let map = PerCpuArray::try_from(map).map_err(|source| ProbeError::Map {
            name: "LOST",
            source,
        })?;
        Ok(LostCounters { map })
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }
}

/// The kernel's per-CPU counts of events that never reached the ring buffer.
pub struct LostCounters {
    map: PerCpuArray<MapData, u64>,
}

impl LostCounters {
    /// Totals over all CPUs, per [`qpwatch_common::LostReason`].
    pub fn read(&self) -> Result<[u64; LOST_REASONS], aya::maps::MapError> {
        let mut totals = [0u64; LOST_REASONS];
        for (reason, total) in totals.iter_mut().enumerate() {
            let per_cpu = self.map.get(&(reason as u32), 0)?;
            *total = per_cpu.iter().sum();
        }
        Ok(totals)
    }
}
