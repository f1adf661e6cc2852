#!/usr/bin/env bash
# Runs inside the VM (started by tests/vm/run): brings up soft-RoCE on a dummy
# netdev with no outside network, then runs each scenario in its own shell,
# recording "name<TAB>status<TAB>seconds" in $RESULTS. GUEST_TAG (set by
# tests/vm/run when it boots several guests) names this guest's files:
# results.TAG.tsv and setup.TAG.log instead of results.tsv and setup.log;
# GUEST_QUEUE (a directory all the guests share) makes the scenarios a
# queue: this guest runs the ones it claims first.
set -uo pipefail
OUT_ROOT=$1
shift
REPO=$(cd "$(dirname "$0")/../.." && pwd)
export REPO
# shellcheck source=tests/vm/lib/runner.sh
source "$REPO/tests/vm/lib/runner.sh"
export BIN=${BIN:-$REPO/target/release}
RESULTS=$OUT_ROOT/results${GUEST_TAG:+.$GUEST_TAG}.tsv
SETUP_LOG=$OUT_ROOT/setup${GUEST_TAG:+.$GUEST_TAG}.log
: >"$RESULTS"

setup_rxe() {
  set -e
  ip link set lo up
  modprobe rdma_rxe
  modprobe rdma_ucm
  ip link add qpw0 type dummy
  ip addr add 198.18.0.1/24 dev qpw0
  ip link set qpw0 up
  rdma link add rxe0 type rxe netdev qpw0
  set +e
  # Test traffic stays inside the guest: no interface but loopback and the dummy.
  local extra
  extra=$(ip -o link show | awk -F': ' '{print $2}' | grep -vxE 'lo|qpw0' || true)
  if [ -n "$extra" ]; then
    echo "guest: unexpected network interfaces: $extra"
    return 1
  fi
}

echo "guest: kernel $(uname -r), $(nproc) cpus, clock $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
if ! setup_rxe >"$SETUP_LOG" 2>&1; then
  cat "$SETUP_LOG"
  printf 'setup\tFAIL\t0\n' >>"$RESULTS"
  exit 1
fi
guest_debug_setup

for scenario in "$@"; do
  # a claim is a directory: the host's mkdir lets one guest create it
  if [ -n "${GUEST_QUEUE:-}" ] && ! mkdir "$GUEST_QUEUE/${scenario//\//-}" 2>/dev/null; then
    continue
  fi
  # "name" is tests/vm/scenarios/name.sh; "dir/name" is tests/vm/dir/name.sh
  case $scenario in
    */*) script=$REPO/tests/vm/$scenario.sh ;;
    *) script=$REPO/tests/vm/scenarios/$scenario.sh ;;
  esac
  out=$OUT_ROOT/$scenario
  mkdir -p "$out"
  echo "guest: === $scenario"
  run_scenario "$script" "$out"
  status=$SCENARIO_STATUS secs=$SCENARIO_SECS
  printf '%s\t%s\t%s\n' "$scenario" "$status" "$secs" >>"$RESULTS"
  echo "guest: $scenario $status (${secs}s)"
  # leftovers of a failed scenario must not leak into the next one
  pkill -x qpwatch 2>/dev/null; pkill -x rping 2>/dev/null
  sleep 0.5
done
echo "guest: done"
