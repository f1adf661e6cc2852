#!/usr/bin/env bash
# Runs inside the fleet's switch guest (started by tests/vm/fleet for three
# hosts or more, or --switch): bridges its PORTS NICs, one per host
# (fleet_setup_switch), then forwards frames and applies the link faults
# host scenarios request (fleet_switch_serve) until the host side touches
# $OUT_ROOT/fleet.done (or kills the guest). Its log: $OUT_ROOT/switch.log.
#
#   fleet-switch.sh OUT_ROOT PORTS
set -uo pipefail
OUT_ROOT=$1
PORTS=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
export REPO
LOG=$OUT_ROOT/switch.log

echo "fleet switch: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s, $PORTS ports"
# shellcheck disable=SC2016 # expanded by the inner shell
if ! OUT=$OUT_ROOT bash -c 'set -euo pipefail; source "$REPO/tests/vm/lib.sh"; fleet_setup_switch "$1"' _ "$PORTS" >"$LOG" 2>&1; then
  cat "$LOG"
  echo "switch: setup failed" >>"$OUT_ROOT/abort"
  exit 1
fi
touch "$OUT_ROOT/up.switch"
echo "fleet switch: forwarding after $(cut -d' ' -f1 /proc/uptime) s of uptime"
# link faults on the hosts' requests (fleet_switch in tests/vm/lib/fleet.sh)
# shellcheck disable=SC2016 # expanded by the inner shell
OUT=$OUT_ROOT bash -c 'set -uo pipefail; source "$REPO/tests/vm/lib.sh"; fleet_switch_serve "$1" "$2"' _ "$OUT_ROOT" "$PORTS" >>"$LOG" 2>&1
{
  echo "--- bridge forwarding database"
  bridge fdb show br br0 dynamic
  echo "--- port counters"
  ip -s link show master br0
} >>"$LOG" 2>&1
echo "fleet switch: done"
