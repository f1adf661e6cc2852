#!/usr/bin/env bash
# The shipped build and the test build resolve every dependency they share
# with the same features. Where a dev-dependency turns a feature on, cargo
# builds that crate and everything above it twice: once for `cargo test
# --release`, again for `cargo build --release` (86 s of a clean-clone CI
# run before agent/Cargo.toml turned those features on for the agent too).
# Prints each crate whose features differ, with both lists, and fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
# features EDGES: "crate@version features" for the workspace's dependency
# graph along EDGES, one line per crate
features() {
  cargo tree --workspace --offline -e "$1" -f '{p} {f}' --prefix none |
    sed 's/ (\*)$//; s/ ([^)]*)//' |
    awk '{ print $1 "@" $2, ($3 == "" ? "-" : $3) }' | sort -u
}
shipped=$(features normal)
tested=$(features normal,dev)
[ -n "$shipped" ] || { echo "features: cargo tree printed nothing" >&2; exit 1; }
differ=$(join <(echo "$shipped") <(echo "$tested") | awk '$2 != $3')
if [ -n "$differ" ]; then
  echo "features: the test build turns on features the shipped build does not (crate, shipped, tested):" >&2
  echo "$differ" >&2
  echo "features: turn them on in agent/Cargo.toml's [dependencies] too" >&2
  exit 1
fi
echo "features: $(echo "$shipped" | wc -l) crates, the same features in the shipped and the test build" >&2
