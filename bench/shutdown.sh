#!/usr/bin/env bash
# SIGTERM-to-exit time of the agent during traffic, in the VM test bed
# (tests/vm/bench/shutdown.sh does the measuring). Prints figures.
set -euo pipefail
cd "$(dirname "$0")/.."
others=$(pgrep -c -f qemu-system || true)
[ "${others:-0}" -eq 0 ] || echo "bench: WARNING: $others other QEMU VM(s) running; figures will be distorted"
out=$(tests/vm/run bench/shutdown) || { echo "$out"; exit 1; }
dir=$(echo "$out" | sed -n 's/.*output in \([^ ]*\)$/\1/p' | head -n1)
cat "$dir/bench/shutdown/summary.txt"
