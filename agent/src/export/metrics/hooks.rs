//! The hooks (the kernel attachment points): whether each is attached, hits
//! of the counted tracepoints, and the BPF run-time statistics of their
//! programs.

use crate::export::registry::{CounterVec, IntCounterVec, IntGaugeVec};

use super::Registrar;
use crate::kernel::hooks::HookStatus;

#[derive(Clone)]
pub struct HookMetrics {
    attached: IntGaugeVec,
    tracepoint_hits: IntCounterVec,
    bpf_run_seconds: CounterVec,
    bpf_runs: IntCounterVec,
}

impl HookMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        Self {
            attached: r.gauge_vec(
                "qpwatch_hook_attached",
                "1 if the hook is attached, 0 if not (see the logs for the reason).",
                &["hook"],
            ),
            tracepoint_hits: r.counter_vec(
                "qpwatch_tracepoint_hits_total",
                "Hits of the ib_cma:* tracepoints (the opt-in ib-cm-tracepoints group).",
                &["tracepoint"],
            ),
            bpf_run_seconds: r.float_counter_vec(
                "qpwatch_bpf_program_run_seconds_total",
                "Time the hook's BPF program ran, from kernel BPF statistics (--bpf-stats).",
                &["hook"],
            ),
            bpf_runs: r.counter_vec(
                "qpwatch_bpf_program_runs_total",
                "Runs of the hook's BPF program, from kernel BPF statistics (--bpf-stats).",
                &["hook"],
            ),
        }
    }

    /// Sets `qpwatch_hook_attached` for each hook of an enabled group; the
    /// hooks of a disabled group, and optional hooks whose module is not
    /// loaded, lose their series.
    pub fn set_statuses(&self, statuses: &[(String, HookStatus)]) {
        for (hook, status) in statuses {
            let value = match status {
                HookStatus::Attached => 1,
                HookStatus::Detached(_) => 0,
                HookStatus::Disabled | HookStatus::Idle => {
                    let _ = self.attached.remove_label_values(&[hook]);
                    continue;
                }
            };
            self.attached.with_label_values(&[hook]).set(value);
        }
    }

    pub fn tracepoint_hits(&self, tracepoint: &str, hits: u64) {
        self.tracepoint_hits
            .with_label_values(&[tracepoint])
            .inc_by(hits);
    }

    /// Adds BPF run-time statistics of one hook's program.
    pub fn bpf_run(&self, hook: &str, run_ns: u64, runs: u64) {
        self.bpf_run_seconds
            .with_label_values(&[hook])
            .inc_by(run_ns as f64 / 1e9);
        self.bpf_runs.with_label_values(&[hook]).inc_by(runs);
    }
}
