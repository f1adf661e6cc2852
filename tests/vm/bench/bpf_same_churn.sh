# Benchmark (prints figures, asserts only that everything ran): the BPF
# program time per QP lifecycle of qpwatch and of bpftrace bench/qpwatch.bt
# in the same churn, both attached at once to the same kprobes and
# kretprobes, so that a stretch in which the host runs the guest slower
# weighs on both tools alike. `BENCH_ONLY=bpf` (bench/churn) measures each
# tool in a churn of its own, seconds apart, and a churn that ran at half
# speed, the kernel's own calls included, doubled one tool's figure alone
# (bench/RESULTS.md round 22). The two tools attach in turn, and a probed
# function runs its probes' programs in that order, so the order alternates
# from one repetition to the next.
#   VM_CPUS=1 tests/vm/run bench/bpf_same_churn
#   BENCH_BPF_REPS (default 6), BENCH_BPF_LIFECYCLES (default 1000)
# vm-timeout: 2400
REPS=${BENCH_BPF_REPS:-6}
LC=${BENCH_BPF_LIFECYCLES:-1000}
on_exit 'sysctl -qw kernel.bpf_stats_enabled=0'
prog_ids() { bpftool prog show -j | jq -r '.[].id' | sort; }
start_qpwatch() {
  local before=$OUT/ids-before-b$1
  prog_ids >"$before"
  : >"$OUT/agent.log"
  start_agent
  sleep 5 # its start-up work (reconciling, trimming) done
  comm -13 "$before" <(prog_ids) >"$OUT/ids-b$1"
  [ -n "${OFFSETS:-}" ] || OFFSETS=$(qp_offsets "$OUT/agent.log") || fail "no BTF offsets in the agent log"
}
start_reference() {
  local before=$OUT/ids-before-c$1
  prog_ids >"$before"
  # shellcheck disable=SC2086 # the offsets are three arguments
  start_bpftrace "c$1" qpwatch.bt $OFFSETS
  comm -13 "$before" <(prog_ids) >"$OUT/ids-c$1"
}
say "BPF program time in the same churn: qp-churn on rxe0 ($(nproc) vCPUs, kernel $(uname -r)), $LC lifecycles after 50 of warm-up per repetition, qpwatch and bpftrace qpwatch.bt attached at once"
ratios=() qpwatch_us=() bpftrace_us=()
for rep in $(seq 1 "$REPS"); do
  if [ $((rep % 2)) -eq 1 ]; then
    order="qpwatch first"
    start_qpwatch "$rep"
    start_reference "$rep"
  else
    order="bpftrace first"
    start_reference "$rep"
    start_qpwatch "$rep"
  fi
  churn "w$rep" --lifecycles 50 --threads 1
  sysctl -qw kernel.bpf_stats_enabled=1
  churn "s$rep" --lifecycles "$LC" --threads 1
  b=$(bpf_cost "b$rep" "$OUT/ids-b$rep") c=$(bpf_cost "c$rep" "$OUT/ids-c$rep")
  sysctl -qw kernel.bpf_stats_enabled=0
  stop_bpftrace "c$rep"
  stop_agent
  qpwatch_us+=("$(us_per_lifecycle "$b" "$LC")") bpftrace_us+=("$(us_per_lifecycle "$c" "$LC")")
  ratios+=("$(ratio "$b" "$c")")
  say "repetition $rep ($order; the churn $(churn_us "s$rep") us per lifecycle): qpwatch ${qpwatch_us[-1]} us, bpftrace ${bpftrace_us[-1]} us per lifecycle; qpwatch/bpftrace ${ratios[-1]}"
  say "  qpwatch: $(bpf_cost_detail "b$rep")"
  say "  bpftrace: $(bpf_cost_detail "c$rep")"
done
say "BPF program time in the same churn, median of $REPS: qpwatch $(median "${qpwatch_us[@]}") us, bpftrace $(median "${bpftrace_us[@]}") us; qpwatch/bpftrace $(median "${ratios[@]}") (each: ${ratios[*]})"
