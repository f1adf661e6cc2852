#!/usr/bin/env bash
# Runs the rdma-probe vs ib_send_lat benchmark in the VM test bed and prints
# its figures (tests/vm/bench/probe_vs_send_lat.sh does the measuring).
#   bench/probe-vs-ib_send_lat.sh      (64-byte messages, 3000 iterations each)
set -euo pipefail
cd "$(dirname "$0")/.."
# Under TCG every figure scales with the host CPU the VM gets: another VM or a
# build running alongside (2 cores) distorts the comparison. Say so.
others=$(pgrep -c -f qemu-system || true)
[ "${others:-0}" -eq 0 ] || echo "bench: WARNING: $others other QEMU VM(s) running; figures will be distorted"
echo "bench: host load before: $(cut -d' ' -f1-3 /proc/loadavg)"
rc=0
out=$(tests/vm/run bench/probe_vs_send_lat) || rc=$?
echo "bench: host load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$out" | grep '^vm:' | head -n 2
dir=$(echo "$out" | sed -n 's/.*output in \([^ ]*\)$/\1/p' | head -n1)
if [ -n "$dir" ] && [ -s "$dir/bench/probe_vs_send_lat/summary.txt" ]; then
  cat "$dir/bench/probe_vs_send_lat/summary.txt"
else
  echo "$out"
fi
exit $rc
