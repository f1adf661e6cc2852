# vm-timeout: 600
# Not part of the suite: how far bpftrace's attach had got when
# start_bpftrace returned before 2026-12-07. It waited for "Attaching N
# probes..." (printed before bpftrace attaches them), a second, and then for
# ib_create_qp_user in the kernel's kprobe list, where the agent's own kprobe
# already is. perftest's reference script (scenarios/perftest.bt, 4 probes)
# is started REPRO_N times (5) beside the agent; each time the old wait
# returns, the probes bpftrace has attached are counted (bpftool perf list),
# then the new start_bpftrace runs on a fresh bpftrace and must see all of
# them.
# REPRO_HOG=1: a shell loop spins on the guest's CPU meanwhile, as a busy
# guest's other work would.
#   VM_CPUS=1 tests/vm/run repro/bpftrace_attach
start_agent
if [ "${REPRO_HOG:-0}" = 1 ]; then
  bash -c 'while :; do :; done' &
  on_exit "kill $! 2>/dev/null"
fi
reference=$REPO/tests/vm/scenarios/perftest.bt
short=0
for i in $(seq 1 "${REPRO_N:-5}"); do
  bpftrace "$reference" >"$OUT/old-$i.out" 2>&1 &
  BT_PID=$!
  wait_until 180 grep -q Attaching "$OUT/old-$i.out" || fail "bpftrace did not attach"
  sleep 1
  wait_until 60 grep -q 'ib_create_qp_user' /sys/kernel/debug/kprobes/list || fail "no kprobe listed"
  n=$(bpftrace_probes)
  log "$i: the old wait returned with $n of 4 probes attached"
  [ "$n" -ge 4 ] || short=$((short + 1))
  stop_bpftrace "old-$i"
  start_bpftrace "new-$i" "$reference"
  assert_eq "$i: probes attached when the new wait returned" 4 "$(bpftrace_probes)"
  stop_bpftrace "new-$i"
done
log "figure: the old wait returned early in $short of ${REPRO_N:-5} starts"
stop_agent
