# vm-timeout: 1500
# Not part of the suite: the guest-kernel failure that start_rping_connection
# and the sigterm scenario stay clear of. An rping connection pings flat out
# (rxe_cq_post runs for every completion) while a kprobe on rxe_cq_post is
# attached and detached REPRO_N times (40) by REPRO_TOOL: bpftrace (default),
# or the agent (start_agent/stop_agent; REPRO_TOOL=qpwatch). On Debian's
# 6.1.192 under QEMU 7.2 TCG:
# with 2 vCPUs, the first bpftrace attach oopsed rping in do_complete ->
# rxe_cq_post with RIP 0; with 1 vCPU, the 14th bpftrace run never exited
# after SIGINT.
#   VM_CPUS=2 REPRO_TOOL=bpftrace tests/vm/run repro/kprobe_race
# Watch tests/vm/out/*/console.log (vng --verbose) for the kernel's report.
start_rping_connection
# shellcheck disable=SC2086 # two PIDs
kill -CONT $RPING_PIDS
for i in $(seq 1 "${REPRO_N:-40}"); do
  if [ "${REPRO_TOOL:-bpftrace}" = bpftrace ]; then
    bpftrace -e 'BEGIN { printf("attached\n"); } kprobe:rxe_cq_post { @n = count(); } kprobe:rxe_qp_error { @e = count(); }' >"$OUT/bt.log" 2>&1 &
    bt=$!
    wait_until 60 grep -q attached "$OUT/bt.log" || fail "bpftrace did not attach"
    sleep 1
    kill -INT $bt
    wait $bt || true
    log "$i: bpftrace saw $(grep -o '@n: [0-9]*' "$OUT/bt.log" || echo 'no') rxe_cq_post calls"
  else
    start_agent
    stop_agent
    log "$i: agent started and stopped"
  fi
done
kill_rping_connection
