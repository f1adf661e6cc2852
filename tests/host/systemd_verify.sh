#!/usr/bin/env bash
# `systemd-analyze verify` on packaging/qpwatch.service. The unit's ExecStart
# names the installed path (/usr/local/bin/qpwatch), which verify requires to
# exist; the check runs on a copy whose ExecStart points at the built binary
# instead, every other line unchanged. Its Documentation= names the man page
# the binary writes (`qpwatch manpages`), which verify looks up with man(1).
# Any output from verify is a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=$(realpath "${BIN:-target/release/qpwatch}")
[ -x "$BIN" ] || { echo "systemd_verify: $BIN not built" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s|^ExecStart=/usr/local/bin/qpwatch |ExecStart=$BIN |" packaging/qpwatch.service >"$dir/qpwatch.service"
[ "$(diff packaging/qpwatch.service "$dir/qpwatch.service" | grep -c '^>')" -eq 1 ] ||
  { echo "systemd_verify: ExecStart is not /usr/local/bin/qpwatch ..." >&2; exit 1; }
"$BIN" manpages "$dir/man/man8" >/dev/null
out=$(MANPATH=$dir/man systemd-analyze verify "$dir/qpwatch.service" 2>&1) || { echo "$out" >&2; exit 1; }
[ -z "$out" ] || { echo "systemd_verify: verify printed:" >&2; echo "$out" >&2; exit 1; }
echo "systemd_verify: systemd-analyze verify clean ($(systemd-analyze --version | head -n1))" >&2
