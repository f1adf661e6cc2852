# The agent started the way packaging/qpwatch.service starts it: installed by
# `qpwatch install`, ExecStart's command line, a non-root user (DynamicUser)
# with exactly the unit's AmbientCapabilities and NoNewPrivileges, the unit's
# LimitMEMLOCK, and a $NOTIFY_SOCKET to receive sd_notify messages. Which
# capabilities are needed for what is measured by tests/vm/bench/capabilities.sh.
unit=$REPO/packaging/qpwatch.service
on_exit "rm -rf /usr/local/bin/qpwatch /etc/systemd/system/qpwatch.service /etc/qpwatch"
"$BIN/qpwatch" install >"$OUT/install.log" || fail "qpwatch install failed"
cmp -s "$unit" /etc/systemd/system/qpwatch.service || fail "installed unit differs from packaging/"
cmp -s "$REPO/packaging/qpwatch.toml" /etc/qpwatch/qpwatch.toml || fail "installed config differs from packaging/"
# the shipped config probes nothing: a target, as an operator adds one (the
# commented example's), unroutable here
printf '\n[[targets]]\nname = "rack-b-host-7"\naddress = "10.20.0.7:9723"\n' >>/etc/qpwatch/qpwatch.toml
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
caps=$(sed -n 's/^AmbientCapabilities=//p' "$unit")
bounding=$(sed -n 's/^CapabilityBoundingSet=//p' "$unit")
[ "$caps" = "$bounding" ] || fail "ambient and bounding capabilities differ"
memlock=$(sed -n 's/^LimitMEMLOCK=//p' "$unit")
watchdog_s=$(sed -n 's/^WatchdogSec=\([0-9]*\)s$/\1/p' "$unit")
log "ExecStart=$exec_start; capabilities: $caps; LimitMEMLOCK=$memlock; WatchdogSec=${watchdog_s}s"

notify_dir=$(mktemp -d /tmp/qpwatch-notify.XXXXXX) # not on 9p: no sockets there
chmod 755 "$notify_dir"                            # the agent runs as nobody
NOTIFY=$notify_dir/notify.sock
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sys.argv[1])
import os; os.chmod(sys.argv[1], 0o777)
with open(sys.argv[2], "a", buffering=1) as f:
    while True: f.write(s.recv(4096).decode().replace("\n", " ") + "\n")
' "$NOTIFY" "$OUT/notify.log" 2>"$OUT/notify.err" &
notify_reader=$!
on_exit "kill $notify_reader"
wait_until 60 test -S "$NOTIFY" || { cat "$OUT/notify.err"; fail "notify socket"; }

# the unit's command line as nobody with the unit's capabilities
NOTIFY_SOCKET=$NOTIFY WATCHDOG_USEC=$((watchdog_s * 1000000 / 15)) \
  launch_as_nobody "$caps" "${memlock/infinity/unlimited}" "$OUT/agent.log" $exec_start
wait_agent_ready 90
log "ready as nobody with: $caps"
grep -q '^READY=1' "$OUT/notify.log" || fail "no READY=1 from sd_notify"
wait_until 10 grep -q '^WATCHDOG=1' "$OUT/notify.log" || fail "no WATCHDOG=1"
log "ok: READY=1 and WATCHDOG=1 received"
[ "$(stat -c %U "/proc/$AGENT_PID")" = nobody ] || fail "agent not running as nobody"
grep -q "reconciled existing QPs adopted=1" "$OUT/agent.log" || fail "netlink reconcile did not adopt rxe0's GSI QP"
base=$(scrape base)
assert_eq "hooks not attached" 0 "$(metric "$base" 'qpwatch_hook_attached' | awk -v n="$(series_count "$base" 'qpwatch_hook_attached')" '{print n - $1}')"
rping -s -a "$RXE_ADDR" -C 3 >"$OUT/rping-server.log" 2>&1 &
sleep 1
rping -c -a "$RXE_ADDR" -C 3 >"$OUT/rping-client.log" 2>&1 || fail "rping failed"
wait_for_metric 'qpwatch_qp_destroyed_total{qp_type="RC"}' 2 60 || fail "rping QPs not seen"
# the added probe target is unroutable here: the probe path runs unprivileged
wait_for_metric_at_least 'qpwatch_probe_total{target="rack-b-host-7",result="addr_error"}' 1 60 || fail "example target not probed"
kill -HUP "$AGENT_PID"
wait_until 10 grep -q '^RELOADING=1' "$OUT/notify.log" || fail "no RELOADING=1 on SIGHUP"
# sd_notify(3): RELOADING=1 comes with MONOTONIC_USEC (systemd >= 253 waits for it)
reload_usec=$(sed -n 's/^RELOADING=1 MONOTONIC_USEC=\([0-9]*\)$/\1/p' "$OUT/notify.log" | head -n1)
[ -n "$reload_usec" ] || fail "RELOADING=1 without MONOTONIC_USEC: $(grep RELOADING "$OUT/notify.log")"
now_usec=$(awk '{ printf "%.0f", $1 * 1000000 }' /proc/uptime)
skew=$((now_usec - reload_usec))
# /proc/uptime is CLOCK_BOOTTIME; without a suspend in the guest it is CLOCK_MONOTONIC.
# 5 s: a loaded TCG host measured 1.38 s between the send and this check;
# a wrong clock (realtime, or ms) is off by far more.
[ "${skew#-}" -lt 5000000 ] || fail "MONOTONIC_USEC=$reload_usec is ${skew} us from the guest's clock"
log "ok: RELOADING=1 MONOTONIC_USEC=$reload_usec (${skew} us before the check)"
stop_agent
grep -q '^STOPPING=1' "$OUT/notify.log" || fail "no STOPPING=1"
