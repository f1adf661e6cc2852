# SIGTERM in the middle of QP churn (creates, modifies, destroys: what the
# hooks see): the agent exits 0, within the unit's TimeoutStopSec, and leaves
# no kprobe, BPF program or link of its own behind. Not rping's data traffic:
# detaching from rxe_cq_post while it runs can crash this TCG guest, with
# bpftrace too (tests/vm/repro/kprobe_race.sh).
# How long the exit takes is a figure, not a pass/fail bound (this host is
# shared and emulated): bench/shutdown.sh measures it.
start_agent
start_churn sigterm --rate 20
wait_for_metric_at_least 'qpwatch_qp_created_total{qp_type="RC"}' 4 120 || fail "no churn"
terminate "$AGENT_PID"
AGENT_PID=
rc=$EXIT_RC elapsed_ms=$EXIT_MS
log "exit after SIGTERM: rc=$rc in $elapsed_ms ms ($(grep -o 'detached hooks=[0-9]* detach_ms=[0-9]*' "$OUT/agent.log"))"
assert_eq "exit code on SIGTERM" 0 "$rc"
stop_timeout=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$REPO/packaging/qpwatch.service")
[ "$elapsed_ms" -lt $((stop_timeout * 1000)) ] || fail "exit took $elapsed_ms ms, beyond TimeoutStopSec=${stop_timeout}s"
kill "$CHURN_PID" 2>/dev/null || true
ours='ib_create_qp_user|ib_create_qp_kernel|_ib_modify_qp|ib_destroy_qp_user|rdma_create_qp|cma_|ucma_event_handler|rdma_resolve_|rdma_listen'
left=$(grep -E "$ours" /sys/kernel/debug/kprobes/list || true)
[ -z "$left" ] || fail "kprobes left behind: $left"
log "ok: no kprobes on our functions in /sys/kernel/debug/kprobes/list"
progs=$(bpftool -j prog show | jq -r '.[].name // empty' | grep -E '^(qp_|cm_|tp_)' || true)
[ -z "$progs" ] || fail "BPF programs left behind: $progs"
links=$(bpftool -j link show | jq length)
assert_eq "BPF links left" 0 "$links"
