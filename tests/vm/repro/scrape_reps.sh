# vm-timeout: 900
# Not part of the suite: whether the scrape at HOLD live QPs (10,000) slows
# from one fresh agent to the next within one boot, and whether the guest
# does. Per repetition: the /metrics median of 21 kept-alive requests, a
# fixed shell loop's time (the guest's speed), the kprobes registered and
# the BPF programs loaded before the agent starts. REPRO_STRACE=1 attaches
# strace -f -c as bench/churn.sh's scrape mode does.
held=${REPRO_HOLD:-10000}
start_churn hold --hold "$held" --lifecycles 0 --threads 2
wait_phase hold held 900 || fail "qp-churn did not hold $held QPs"
command -v bpftool >/dev/null || fail "no bpftool"
[ -r /sys/kernel/debug/kprobes/list ] || fail "no kprobes list in debugfs"
bpf_programs() { bpftool prog show | grep -c '^[0-9]' || true; }
kprobes_registered() { wc -l </sys/kernel/debug/kprobes/list; }
yardstick() { local t0=$EPOCHREALTIME i; for ((i = 0; i < 100000; i++)); do :; done; awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }
for rep in $(seq 1 "${REPRO_N:-5}"); do
  kprobes=$(kprobes_registered)
  progs=$(bpf_programs)
  loop=$(yardstick)
  : >"$OUT/agent.log"
  t0=$SECONDS
  start_agent
  wait_for_metric_at_least qpwatch_qps "$held" 120 || fail "agent does not show $held live QPs"
  ready=$((SECONDS - t0))
  sleep 5
  mapfile -t m < <(scrape_ms 21)
  med=$(median "${m[@]}")
  loop2=$(yardstick)
  progs_running=$(bpf_programs)
  kprobes_running=$(kprobes_registered)
  if [ "${REPRO_STRACE:-0}" = 1 ]; then
    strace -f -c -qq -o "$OUT/strace.txt" -p "$AGENT_PID" &
    s=$!
    sleep 2
    scrape_ms 19 >/dev/null
    kill -INT "$s" && wait "$s" || true
  fi
  log "rep $rep: /metrics median $med ms; ready in $ready s; 100k-iteration loop $loop ms before the agent, $loop2 ms with it; kprobes before $kprobes (with the agent $kprobes_running), BPF programs before $progs (with the agent $progs_running); agent RSS $(awk '/VmRSS/ { print $2 }' /proc/$AGENT_PID/status) KiB"
  stop_agent
done
stop_churn
