# Benchmark (prints figures): the agent's start, from launch to /readyz
# answering 200, with the scenario's readiness poll asking every 0.1 s
# either through curl (a fork and exec per ask) or through bash's /dev/tcp
# (no fork; wait_agent_ready since bench/RESULTS.md round 13), every hook
# group; and through /dev/tcp with the QP hooks only (--groups qp, as the
# fleet's mesh scenarios run). ROUNDS rounds with the three in turn, one
# agent at a time.
ROUNDS=${BENCH_ROUNDS:-4}
say "benchmark: agent start to /readyz, QEMU TCG guest ($(nproc) vCPU), $ROUNDS rounds, polls in turn"
declare -A took=()
for ((r = 1; r <= ROUNDS; r++)); do
  for variant in curl builtin builtin-qp; do
    poll=${variant%-qp} groups=()
    [ "$variant" = builtin-qp ] && groups=(--groups qp)
    : >"$OUT/agent.log"
    t0=$EPOCHREALTIME
    launch_agent "${groups[@]}"
    AGENT_READY_POLL=$poll wait_agent_ready 120
    t1=$EPOCHREALTIME
    ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b - a) * 1000 }')
    took[$variant]+="$ms "
    say "  round $r, $variant: ready after $ms ms"
    stop_agent
  done
done
for variant in curl builtin builtin-qp; do
  # shellcheck disable=SC2086 # one figure a word
  say "$variant: ready after ${took[$variant]}ms; median $(median ${took[$variant]}) ms"
done
