#!/usr/bin/env bash
# Runs inside each host guest of the fleet (started by tests/vm/fleet with
# HOST_INDEX and FLEET_HOSTS set): sets up the link NIC and rxe0 on it
# (fleet_setup_host), waits until every host is up and answers ARP, then runs
# each fleet scenario (tests/vm/scenarios-fleet/NAME.sh) in its own shell,
# recording "name<TAB>status<TAB>seconds" in $OUT_ROOT/results.hN.tsv. All
# hosts run the same scenarios in the same order; every scenario ends on all
# hosts before the next starts.
#
#   fleet-guest.sh OUT_ROOT SWITCH(0|1) SCENARIO...
set -uo pipefail
OUT_ROOT=$1
shift 2 # SWITCH: for the log only; the host side wired the NICs
REPO=$(cd "$(dirname "$0")/../.." && pwd)
export REPO
# shellcheck source=tests/vm/lib/runner.sh
source "$REPO/tests/vm/lib/runner.sh"
export BIN=${BIN:-$REPO/target/release}
: "${HOST_INDEX:?}" "${FLEET_HOSTS:?}"
export HOST_INDEX FLEET_HOSTS FLEET_ROOT=$OUT_ROOT
export HOST_ADDR=198.18.0.$HOST_INDEX
PEERS=
for ((h = 1; h <= FLEET_HOSTS; h++)); do
  [ "$h" -eq "$HOST_INDEX" ] || PEERS+="${PEERS:+ }198.18.0.$h"
done
export PEERS
export AGENT_ADDR=$HOST_ADDR:9721
H=h$HOST_INDEX
RESULTS=$OUT_ROOT/results.$H.tsv
: >"$RESULTS"

# in_lib OUT FLEET_OUT COMMANDS: COMMANDS in a shell with the library, as
# scenarios are.
in_lib() {
  # shellcheck disable=SC2016 # expanded by the inner shell
  OUT=$1 FLEET_OUT=$2 bash -c 'set -euo pipefail; source "$REPO/tests/vm/lib.sh"; eval "$1"' _ "$3"
}

echo "fleet $H: kernel $(uname -r), $(nproc) cpu, up $(cut -d' ' -f1 /proc/uptime) s; peers $PEERS"
mkdir -p "$OUT_ROOT/$H"
start=$(date +%s)
if ! in_lib "$OUT_ROOT/$H" "$OUT_ROOT" fleet_setup_host >"$OUT_ROOT/setup.$H.log" 2>&1; then
  cat "$OUT_ROOT/setup.$H.log"
  echo "$H: setup failed" >>"$OUT_ROOT/abort"
  printf 'setup\tFAIL\t0\n' >>"$RESULTS"
  exit 1
fi
touch "$OUT_ROOT/up.$H"
# The others boot after this host (one QEMU at a time starts): a long wait.
# shellcheck disable=SC2016 # expanded by in_lib's shell
if ! in_lib "$OUT_ROOT/$H" "$OUT_ROOT" 'fleet_barrier up "${FLEET_BOOT_TIMEOUT:-900}"; fleet_check_peers' \
  >>"$OUT_ROOT/setup.$H.log" 2>&1; then
  cat "$OUT_ROOT/setup.$H.log"
  printf 'setup\tFAIL\t%s\n' "$(($(date +%s) - start))" >>"$RESULTS"
  exit 1
fi
printf 'setup\tPASS\t%s\n' "$(($(date +%s) - start))" >>"$RESULTS"
echo "fleet $H: all $FLEET_HOSTS hosts up after $(cut -d' ' -f1 /proc/uptime) s of uptime"
guest_debug_setup

for scenario in "$@"; do
  case $scenario in
    */*) script=$REPO/tests/vm/$scenario.sh ;;
    *) script=$REPO/tests/vm/scenarios-fleet/$scenario.sh ;;
  esac
  fleet_out=$OUT_ROOT/${scenario//\//-}
  out=$fleet_out/$H
  mkdir -p "$out"
  echo "fleet $H: === $scenario"
  run_scenario "$script" "$out" FLEET_OUT="$fleet_out"
  status=$SCENARIO_STATUS secs=$SCENARIO_SECS
  # the other hosts' barriers give up at once
  [ "$status" = PASS ] || echo "$status" >"$fleet_out/failed.$H"
  printf '%s\t%s\t%s\n' "$scenario" "$status" "$secs" >>"$RESULTS"
  echo "fleet $H: $scenario $status (${secs}s)"
  pkill -x qpwatch 2>/dev/null; pkill -x rping 2>/dev/null; pkill -x prometheus 2>/dev/null
  pkill -x ib_send_lat 2>/dev/null
  # no link fault outlives its scenario (fleet_switch)
  if [ "$HOST_INDEX" = 1 ] && [ -e "$fleet_out/switch-used" ]; then
    in_lib "$out" "$fleet_out" 'fleet_switch reset 0 >/dev/null' >>"$out/log" 2>&1 || echo "fleet $H: the switch was not reset after $scenario"
  fi
  # every host ends the scenario before any starts the next, pass or fail
  FLEET_IGNORE_FAILED=1 in_lib "$out" "$fleet_out" "fleet_barrier end $((SCENARIO_LIMIT + 60))" >>"$out/log" 2>&1 ||
    echo "fleet $H: not every host ended $scenario"
done
touch "$OUT_ROOT/done.$H"
echo "fleet $H: done"
