# Load and benchmark helpers of tests/vm/lib.sh (the load_* scenarios and the
# benchmarks in tests/vm/bench/): the qp-churn generator, bpftrace as a
# reference, a process's CPU time and memory, and figures. Sourced by
# tests/vm/lib.sh only.
# shellcheck shell=bash

CHURN=$BIN/qp-churn
CHURN_PID=
BT_PID=

# churn NAME [qp-churn flags...]: runs the generator to its end; its JSON
# report is $OUT/NAME.json. Fails unless it exits 0 (no failed verbs call).
churn() {
  local name=$1 rc=0
  shift
  "$CHURN" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$OUT/$name.log" >&2; head -c 2000 "$OUT/$name.json" >&2; fail "$name: qp-churn exited $rc"; }
}

# start_churn NAME [qp-churn flags...]: the generator in the background
# (its PID in $CHURN_PID, killed when the scenario ends), reporting its phase
# to $OUT/NAME-status.json (see wait_phase); its report is $OUT/NAME.json.
start_churn() {
  local name=$1
  shift
  "$CHURN" --status-file "$OUT/$name-status.json" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log" &
  CHURN_PID=$!
  on_exit "kill -9 $CHURN_PID"
}

# wait_phase NAME PHASE TIMEOUT_S: until start_churn NAME's status file says PHASE.
wait_phase() {
  wait_until "$3" grep -qs "\"phase\":\"$2\"" "$OUT/$1-status.json"
}

# dump_threads PID NAME: where every thread of PID is in the kernel (state,
# wchan, kernel stack) into $OUT/NAME-threads.txt, the blocked tasks
# (SysRq w) and the kernel log's tail into $OUT/NAME-dmesg.txt: what a
# generator that stopped answering was waiting for.
dump_threads() {
  local task
  for task in /proc/"$1"/task/*; do
    echo "== ${task##*/} $(cat "$task/comm" 2>/dev/null): $(awk '{print $3}' "$task/stat" 2>/dev/null) wchan=$(cat "$task/wchan" 2>/dev/null)"
    cat "$task/stack" 2>/dev/null
  done >"$OUT/$2-threads.txt"
  echo w >/proc/sysrq-trigger 2>/dev/null || true
  dmesg | tail -n 200 >"$OUT/$2-dmesg.txt"
  log "$2: $(grep -c '^==' "$OUT/$2-threads.txt") threads; states: $(grep -o '^== [0-9]* [^:]*: [A-Z]' "$OUT/$2-threads.txt" | awk '{print $NF}' | sort | uniq -c | tr -s ' \n' ' ')"
}

# stop_churn: SIGTERM to start_churn's generator, expect exit 0.
stop_churn() {
  stop_child CHURN_PID qp-churn
}

# start_bpftrace NAME SCRIPT [ARGS...]: bpftrace running SCRIPT (a path, or a
# file name in bench/) in the background, its output in $OUT/bpftrace-NAME.out,
# its PID in $BT_PID; returns once every probe it announced ("Attaching N
# probes...", printed before it attaches them) is attached, as bpftool sees
# bpftrace's kprobe and kretprobe perf events. The kernel's kprobe list
# cannot tell: the agent's kprobes are on the same functions.
start_bpftrace() {
  local name=$1 script=$2 want
  shift 2
  [[ $script == */* ]] || script=$REPO/bench/$script
  BPFTRACE_MAP_KEYS_MAX=65536 bpftrace "$script" "$@" >"$OUT/bpftrace-$name.out" 2>&1 &
  BT_PID=$!
  wait_until 180 grep -q Attaching "$OUT/bpftrace-$name.out" || { cat "$OUT/bpftrace-$name.out" >&2; fail "bpftrace did not attach"; }
  want=$(sed -n 's/^Attaching \([0-9]*\) probes\{0,1\}\.\.\.$/\1/p' "$OUT/bpftrace-$name.out")
  [ -n "$want" ] || { cat "$OUT/bpftrace-$name.out" >&2; fail "bpftrace: no probe count"; }
  wait_until 120 bpftrace_attached "$want" || fail "bpftrace attached $(bpftrace_probes) of the $want probes it announced"
  log "bpftrace $name: $want probes attached"
}

# bpftrace_probes: how many kprobes and kretprobes bpftrace ($BT_PID) has
# attached (its perf events with a program; its output buffers are perf
# events too, without one).
bpftrace_probes() { bpftool -j perf list | jq --argjson pid "$BT_PID" '[.[] | select(.pid == $pid)] | length'; }

# bpftrace_attached N: bpftrace has N probes attached (a condition for wait_until).
bpftrace_attached() { [ "$(bpftrace_probes)" -ge "$1" ]; }

# bpftrace_stuck PID: where each of bpftrace's threads is, in the kernel and
# (with gdb) in bpftrace.
bpftrace_stuck() {
  local task
  grep -E '^(State|SigPnd|ShdPnd|SigBlk|SigCgt):' "/proc/$1/status"
  for task in /proc/"$1"/task/*; do
    echo "thread ${task##*/} ($(cat "$task/comm")), kernel stack:"
    cat "$task/stack"
  done
  if command -v gdb >/dev/null; then
    gdb -q -batch -p "$1" -ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)'
  fi
}

# stop_bpftrace NAME: SIGTERM, so that bpftrace prints its maps (not SIGINT: a
# background job of a non-interactive shell starts with SIGINT ignored), again
# each second: bpftrace 0.17's poll_perf_events() misses a SIGTERM that lands
# outside epoll_wait() when no event follows it (repro/bpftrace_exit). Where
# it is, and SIGKILL, if it has not exited after 20 s.
stop_bpftrace() {
  kill -TERM "$BT_PID" 2>/dev/null || true # it may have exited already
  (for _ in $(seq 1 20); do
    sleep 1
    kill -TERM "$BT_PID" 2>/dev/null || exit 0
  done
  {
    echo "bpftrace: no exit 20 s after SIGTERM, killed; it was here:"
    bpftrace_stuck "$BT_PID"
    kill -9 "$BT_PID"
  } >>"$OUT/bpftrace-$1.out" 2>&1) &
  local watchdog=$!
  wait "$BT_PID" 2>/dev/null || true
  kill "$watchdog" 2>/dev/null || true
  BT_PID=
}

# counts FILE: "create_calls modify_calls destroy_calls kernel_calls qps_created qps_destroyed failures"
# of a qp-churn report or status file (one jq run: jq is slow under TCG).
counts() {
  jq -r '.counts | "\(.create_calls) \(.modify_calls) \(.destroy_calls) \(.kernel_calls) \(.qps_created) \(.qps_destroyed) \(.create_failed + .modify_failed + .destroy_failed)"' "$1"
}

# wakeup_counter: the bytes the agent's programs have written to their ring
# since the last record that asked for a wakeup (BYTES_SINCE_WAKEUP in their
# .bss map); fails unless exactly one program object is loaded (--groups qp).
wakeup_counter() {
  local ids
  ids=$(bpftool -j map show | jq -r '.[] | select(.name == ".bss") | .id')
  [ "$(wc -w <<<"$ids")" -eq 1 ] || return 1
  bpftool -j map dump id "$ids" | jq -r '.[0].value | map(ltrimstr("0x")) | reverse | join("")' | { read -r hex && echo $((16#$hex)); }
}

# cpu_ticks PID: user + system CPU time of a process, in clock ticks (CLK_TCK a second).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# cpu_ns PID: nanoseconds on CPU of a process's live threads (the sum of their
# /proc/PID/task/*/schedstat run times): finer than clock ticks for runs of a
# second. Time of threads that have exited is not in it.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f\n", s }'; }

# ticks_to_s TICKS
ticks_to_s() { awk -v t="$1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'; }

# status_kib PID FIELD: a /proc/PID/status field in KiB (VmRSS, VmHWM).
status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# qp_offsets AGENT_LOG: "QP_NUM DEVICE ATTR_STATE" byte offsets of
# ib_qp.qp_num, ib_qp.device and ib_qp_attr.qp_state, as the agent read them
# from the running kernel's BTF (its "loading with offsets" log line).
qp_offsets() {
  grep -m1 'loading with offsets from BTF instance="ib_core"' "$1" | sed -E 's/.*ib_qp_device: ([0-9]+), ib_qp_qp_num: ([0-9]+),.*ib_qp_attr_qp_state: ([0-9]+),.*/\2 \1 \3/' |
    grep -xE '[0-9]+ [0-9]+ [0-9]+'
}

# bpf_cost NAME [IDS_FILE]: "name run_cnt ns/run run_time_ns" of every BPF
# program that ran (with IDS_FILE, one id a line, only those) into
# $OUT/bpf-NAME.txt, from the kernel's run-time statistics
# (kernel.bpf_stats_enabled); prints their total run time (ns).
bpf_cost() {
  local ids=null
  [ -z "${2:-}" ] || ids=$(jq -R 'tonumber' "$2" | jq -sc .)
  bpftool prog show -j | jq -r --argjson ids "$ids" '.[] | select((.run_cnt // 0) > 0)
    | select($ids == null or (.id as $id | $ids | any(. == $id)))
    | "\(.name) \(.run_cnt) \(.run_time_ns / .run_cnt | floor) \(.run_time_ns)"' >"$OUT/bpf-$1.txt"
  awk '{ s += $4 } END { printf "%.0f\n", s }' "$OUT/bpf-$1.txt"
}

# bpf_cost_detail NAME: bpf_cost NAME's programs, "name N ns x RUNS; ...".
bpf_cost_detail() { awk '{ printf "%s%s %d ns x %d", (NR > 1 ? "; " : ""), $1, $3, $2 }' "$OUT/bpf-$1.txt"; }

# us_per_lifecycle NS LIFECYCLES: NS spread over LIFECYCLES, in µs (one decimal).
us_per_lifecycle() { awk -v ns="$1" -v n="$2" 'BEGIN { printf "%.1f", ns / n / 1000 }'; }

# churn_us NAME: the churn NAME's time per lifecycle (µs, from qp-churn's
# report). Benchmarks print it beside a tool's BPF time: in a stretch where
# the host runs the guest slower, the churn's own calls and every program
# slow down together, so a repetition whose churn took far longer per
# lifecycle than the others ran in such a stretch (bench/RESULTS.md round 22).
churn_us() { jq -r '.churn_elapsed_ns / .counts.lifecycles / 1000 | floor' "$OUT/$1.json"; }

# say TEXT...: a line of a benchmark's figures, to stderr and $OUT/summary.txt.
say() { echo "$*" | tee -a "$OUT/summary.txt" >&2; }

# median VALUES...: the middle value (lower middle for an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# min VALUES...: the smallest value.
min() { printf '%s\n' "$@" | sort -g | head -n1; }

# ratio A B: A / B with three decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
