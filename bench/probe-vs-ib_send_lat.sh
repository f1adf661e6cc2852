#!/usr/bin/env bash
# Runs the rdma-probe vs ib_send_lat benchmark in the VM test bed and prints
# its figures (tests/vm/bench/probe_vs_send_lat.sh does the measuring).
#   bench/probe-vs-ib_send_lat.sh      (64-byte messages, 3000 iterations each)
set -euo pipefail
cd "$(dirname "$0")/.."
rc=0
out=$(tests/vm/run bench/probe_vs_send_lat) || rc=$?
echo "$out" | grep '^vm:' | head -n 2
dir=$(echo "$out" | sed -n 's/.*output in \([^ ]*\)$/\1/p' | head -n1)
if [ -n "$dir" ] && [ -s "$dir/bench/probe_vs_send_lat/summary.txt" ]; then
  cat "$dir/bench/probe_vs_send_lat/summary.txt"
else
  echo "$out"
fi
exit $rc
