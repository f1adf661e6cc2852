# Runs one scenario script in its own shell with lib.sh sourced, within its
# time limit (a "# vm-timeout: SECONDS" line in the script, else 300 s;
# SCENARIO_TIMEOUT overrides both). Used by guest.sh and fleet-guest.sh.
#   run_scenario SCRIPT OUT [VAR=VALUE ...]   (extra environment for the scenario)
# Sets SCENARIO_STATUS (PASS, FAIL, TIMEOUT), SCENARIO_SECS and
# SCENARIO_LIMIT (the time limit it ran under), read by the callers.
# Processes the scenario leaves behind are killed.
# shellcheck shell=bash disable=SC2034
run_scenario() {
  local script=$1 out=$2 start limit rc
  shift 2
  start=$(date +%s)
  limit=$(sed -n 's/^# vm-timeout: \([0-9]*\)$/\1/p' "$script" | head -n1)
  SCENARIO_LIMIT=${SCENARIO_TIMEOUT:-${limit:-300}}
  # timeout makes itself a process group leader (it execs in env's pid):
  # whatever the scenario started and left running (a perftest server whose
  # client failed, say) dies with that group and cannot skew the next one.
  # shellcheck disable=SC2016 # expanded by the scenario's shell
  env OUT="$out" "$@" timeout --kill-after=10 "$SCENARIO_LIMIT" \
    bash -c 'set -euo pipefail; source "$REPO/tests/vm/lib.sh"; source "$1"' _ "$script" \
    >"$out/log" 2>&1 &
  local group=$!
  wait "$group"
  rc=$?
  if pgrep -g "$group" >/dev/null 2>&1; then
    echo "runner: killing what the scenario left running: $(pgrep -g "$group" -l | tr '\n' ' ')" >>"$out/log"
    kill -KILL -- "-$group" 2>/dev/null
    sleep 1
  fi
  # what survived SIGKILL waits in the kernel: report_stuck shows where
  if [ $rc -eq 124 ] || pgrep -g "$group" >/dev/null 2>&1; then
    report_stuck "$group" "$start" >>"$out/log"
  fi
  SCENARIO_SECS=$(($(date +%s) - start))
  SCENARIO_STATUS=FAIL
  [ $rc -eq 0 ] && SCENARIO_STATUS=PASS
  [ $rc -eq 124 ] && SCENARIO_STATUS=TIMEOUT
  return 0
}

# report_stuck GROUP START_EPOCH: where the group's processes that outlived
# SIGKILL wait in the kernel, and what the kernel logged since START_EPOCH
# (hung tasks, oopses): a scenario that times out says why, in the lines CI
# shows.
report_stuck() {
  local group=$1 since=$2 pid
  for pid in $(pgrep -g "$group"); do
    where_stuck "$pid" | sed 's/^/runner: /'
  done
  echo "runner: kernel log since the scenario began:"
  dmesg --since "$(date -d "@$since" "+%F %T")" | tail -n 40 | sed 's/^/runner:   /'
}

# where_stuck PID: the process's state, wait channel and command line, then
# its kernel stack.
where_stuck() {
  echo "pid $1 $(ps -o stat=,wchan:32=,args= -p "$1" 2>/dev/null | cut -c1-120)"
  sed 's/^/  /' "/proc/$1/stack" 2>/dev/null | head -n 20
}

# guest_debug_setup: tracefs and debugfs mounted, and a task blocked in the
# kernel for 60 s logged with its stack (for report_stuck to show).
guest_debug_setup() {
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
  sysctl -qw kernel.hung_task_timeout_secs=60 2>/dev/null || true
  mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
}
