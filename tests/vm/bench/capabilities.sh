# vm-timeout: 2400
# Measurement (prints a table): which capabilities the agent needs, as the
# unit runs it (non-root, NoNewPrivileges, ambient capabilities only,
# LimitMEMLOCK=infinity), under Debian's default kernel.perf_event_paranoid=3
# and under the upstream default 2. Each row drops one capability from the
# candidate set. Measured per row: ready, hooks attached of all, netlink
# reconcile, and a synthetic probe over rxe0 (MR registration, rdma_cm).
# CAP_SWEEP=0 skips the sweep and runs only the minimal sets and the unit's.
candidates="CAP_SYS_ADMIN CAP_BPF CAP_PERFMON CAP_NET_ADMIN CAP_IPC_LOCK"
table=$OUT/capabilities.md
printf '| paranoid | capabilities | ready | hooks attached | reconcile | probe ok |\n|---|---|---|---|---|---|\n' >"$table"
row() { # PARANOID "CAPS"
  local log=$OUT/agent-$1-$(echo "$2" | tr ' ' _).log ready=no attached=- total=- reconcile=no probe=0
  sysctl -qw kernel.perf_event_paranoid="$1"
  launch_as_nobody "$2" unlimited "$log" "$BIN/qpwatch" run --config /dev/null --listen "$AGENT_ADDR" \
    --responder-listen "$RXE_ADDR:9723" --target "self=$RXE_ADDR:9723" --probe-interval 2 --probe-timeout 1 --probe-pings 3
  if wait_until 180 agent_get /readyz; then ready=yes; fi
  if curl -fsS "http://$AGENT_ADDR/metrics" -o "$OUT/cap.prom" 2>/dev/null; then
    attached=$(metric "$OUT/cap.prom" 'qpwatch_hook_attached')
    total=$(series_count "$OUT/cap.prom" 'qpwatch_hook_attached')
    wait_for_metric_at_least 'qpwatch_probe_total{target="self",result="ok"}' 1 20 >/dev/null 2>&1 || true
    curl -fsS "http://$AGENT_ADDR/metrics" -o "$OUT/cap.prom" 2>/dev/null || true
    probe=$(metric "$OUT/cap.prom" 'qpwatch_probe_total{target="self",result="ok"}' 2>/dev/null || echo 0)
  fi
  grep -q "reconciled existing QPs adopted=[1-9]" "$log" && reconcile=yes
  kill -TERM "$AGENT_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null || true; AGENT_PID=
  printf '| %s | %s | %s | %s/%s | %s | %s |\n' "$1" "$2" "$ready" "$attached" "$total" "$reconcile" "${probe:-0}" | tee -a "$table" >&2
}
orig=$(cat /proc/sys/kernel/perf_event_paranoid)
on_exit "sysctl -qw kernel.perf_event_paranoid=$orig"
if [ "${CAP_SWEEP:-1}" = 1 ]; then
  for paranoid in 3 2; do
    row "$paranoid" "$candidates"
    for drop in $candidates; do
      row "$paranoid" "$(echo " $candidates " | sed "s/ $drop / /; s/^ //; s/ $//")"
    done
  done
fi
# the minimal sets the sweep points at, and the unit's own
row 3 "CAP_SYS_ADMIN"
row 2 "CAP_BPF CAP_PERFMON"
unit_caps=$(sed -n 's/^AmbientCapabilities=//p' "$REPO/packaging/qpwatch.service")
row 3 "$unit_caps"
row 2 "$unit_caps"
cat "$table"
