# Benchmark (prints figures): SIGTERM-to-exit time of the agent during rping
# traffic, ROUNDS times per probe-group set, and the kernel's share of it (the
# agent logs how long detaching its hooks took: each perf kprobe's release
# waits for RCU grace periods, serialised by the kernel).
ROUNDS=${BENCH_ROUNDS:-3}
start_rping_traffic
say "benchmark: SIGTERM to exit during rping traffic, QEMU TCG guest, $ROUNDS rounds per set"
for groups in qp,cm,kernel-ulp qp; do
  exits=() detaches=()
  for r in $(seq 1 "$ROUNDS"); do
    : >"$OUT/agent.log"
    start_agent --groups "$groups"
    wait_for_metric_at_least 'qpwatch_events_total' 20 120 || fail "no events"
    stop_agent
    hooks=$(sed -n 's/.*detached hooks=\([0-9]*\) .*/\1/p' "$OUT/agent.log" | tail -n1)
    detach=$(sed -n 's/.*detach_ms=\([0-9]*\).*/\1/p' "$OUT/agent.log" | tail -n1)
    exits+=("$EXIT_MS") detaches+=("$detach")
    say "  groups=$groups round $r: exit ${exits[-1]} ms, of which detaching $hooks hooks $detach ms"
  done
  say "groups=$groups: median exit $(median "${exits[@]}") ms, median detach $(median "${detaches[@]}") ms ($hooks hooks)"
done
