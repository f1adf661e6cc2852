# Benchmark (figures, not a timed test): the UD probe mesh at 1,000 targets.
# Run: BIN=<release dir> tests/vm/fleet --hosts 5 bench-fleet/mesh_scale bench-fleet/mesh_scale_off
#
#   A  no agents: h2 runs `qpwatch responder`; h1 measures h1 -> h2 with
#      `ib_send_lat -c UD -x 1 -n N` and `qpwatch probe --ud --count N`,
#      one after the other (side by side in one boot)
#   B  the same two measurements with an agent in fleet mode on every host
#   C  every other host adds MESH_TARGETS (1000) / (hosts - 1) addresses
#      to its link NIC, at most 250 each (a verbs AH names its source GID
#      by a u8 index, ibv_global_route's sgid_index, so a port's GIDs past
#      index 255 can answer no SIDR request: a run with 500 per host
#      resolved 254 per host, the rest failed with EINVAL; one with 250 on
#      rxe0 and 250 on an rxe1 over a macvlan resolved rxe0's 500 only, the
#      kernel rejecting the SIDR requests to rxe1's, status 2): 5 hosts for
#      1,000. h1's agent probes all of them (targets file) at 1 probe/s
#      each; once every target resolved, MESH_SECONDS (60) s are measured:
#      probes sent/answered/lost, the agent's threads and UD QPs before the
#      targets came and after, its CPU time per 1,000 probes, its RSS; the
#      responders' CPU time.
#   MESH_BREAKDOWN=false (bench-fleet/mesh_scale_off): the same without the
#      RTT breakdown ([mesh] rtt_breakdown), for its cost side by side in one
#      boot; the peers' addresses are removed at the end.
# Figures: $FLEET_OUT/mesh_scale.txt (key value lines) and the log.
# vm-timeout: 1500
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts (h1 probes, h2 and h3 hold the targets)"
total=${MESH_TARGETS:-1000}
per_host=$(((total + FLEET_HOSTS - 2) / (FLEET_HOSTS - 1)))
[ "$per_host" -le 250 ] || fail "$total targets on $((FLEET_HOSTS - 1)) hosts: $per_host per host, at most 250 (--hosts $(((total + 249) / 250 + 1)))"
seconds=${MESH_SECONDS:-60}
pings=${MESH_PINGS:-1000}
h2=$(fleet_host_addr 2)
figures=$FLEET_OUT/mesh_scale.txt
nic=$(fleet_nic_by_mac "$(fleet_host_mac "$HOST_INDEX")")
record() {
  log "figure: $1 $2"
  echo "$1 $2" >>"$figures"
}
# cpu_ticks PID: utime + stime of the process (all threads), clock ticks
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

hz=$(getconf CLK_TCK)

# send_lat_vs_probe PHASE: h1 -> h2, ib_send_lat then qpwatch probe --ud.
send_lat_vs_probe() {
  local phase=$1
  case $HOST_INDEX in
    2)
      ib_send_lat -d rxe0 -c UD -x 1 -n "$pings" >"$OUT/send_lat-server-$phase.log" 2>&1 &
      local server=$!
      wait_until 30 bash -c "ss -Hltn 'sport = :18515' | grep -q ." || fail "ib_send_lat server not listening"
      fleet_barrier "$phase-listening"
      wait "$server" || fail "ib_send_lat server failed ($phase)"
      ;;
    1)
      fleet_barrier "$phase-listening"
      ib_send_lat -d rxe0 -c UD -x 1 -n "$pings" "$h2" >"$OUT/send_lat-$phase.log" 2>&1 || { cat "$OUT/send_lat-$phase.log" >&2; fail "ib_send_lat failed ($phase)"; }
      record "$phase.ib_send_lat_ud_typical_us" "$(awk '/t_typical/ { getline; print $5 }' "$OUT/send_lat-$phase.log")"
      "$BIN/qpwatch" probe --ud --target "$h2" --count "$pings" --interval-ms 10 --json >"$OUT/probe-$phase.json" 2>"$OUT/probe-$phase.err" ||
        { cat "$OUT/probe-$phase.err" >&2; fail "qpwatch probe --ud failed ($phase)"; }
      # ib_send_lat reports half a round trip
      record "$phase.probe_ud_half_rtt_median_us" "$(jq -r '.rtt.p50_ns / 2000' "$OUT/probe-$phase.json")"
      record "$phase.probe_ud_answered" "$(jq -r '.answered // empty' "$OUT/probe-$phase.json")"
      cp "$OUT/probe-$phase.json" "$FLEET_OUT/probe-$phase.json"
      ;;
    *) fleet_barrier "$phase-listening" ;;
  esac
  fleet_barrier "$phase-measured"
}

# A: no agents
if [ "$HOST_INDEX" = 2 ]; then
  "$BIN/qpwatch" responder --listen "$HOST_ADDR" >"$OUT/responder.log" 2>&1 &
  # shellcheck disable=SC2034 # stop_child reads it through a nameref
  responder=$!
fi
fleet_barrier responder
send_lat_vs_probe A
if [ "$HOST_INDEX" = 2 ]; then stop_child responder responder; fi
fleet_barrier responder-stopped

# B: agents in fleet mode everywhere, no targets yet
echo '[]' >"$OUT/targets.json"
cat >"$OUT/qpwatch.toml" <<TOML
[mesh]
interval_seconds = 1.0
timeout_seconds = 1.0
targets_file = "$OUT/targets.json"
targets_file_check_seconds = 2.0
target_labels = ["host"]
max_targets = 2000
rtt_breakdown = ${MESH_BREAKDOWN:-true}
TOML
launch_agent --config "$OUT/qpwatch.toml"
wait_agent_ready 240
fleet_barrier agents
send_lat_vs_probe B

# C: 1,000 targets
# target_addr HOST I (I from 0): the I-th target address on HOST
target_addr() { echo "198.18.$(($1 * 10)).$(($2 + 1))"; }
gids_in_use() { grep -vc '^0000:0000:0000:0000:0000:0000:0000:0000$' "/sys/class/infiniband/$1/ports/1/gids/"* 2>/dev/null | awk -F: '{ s += $2 } END { print s }'; }
if [ "$HOST_INDEX" != 1 ]; then
  for ((i = 0; i < per_host; i++)); do
    echo "addr add $(target_addr "$HOST_INDEX" $i)/32 dev $nic"
  done | ip -batch - || fail "adding $per_host addresses"
  log "h$HOST_INDEX: rxe0 GID slots in use: $(gids_in_use rxe0)"
fi
fleet_barrier addresses
if [ "$HOST_INDEX" = 1 ]; then
  sysctl -qw net.ipv4.neigh.default.gc_thresh1=4096 net.ipv4.neigh.default.gc_thresh2=8192 net.ipv4.neigh.default.gc_thresh3=16384
  ip route add 198.18.0.0/16 dev "$nic" 2>/dev/null || true
  threads_before=$(agent_threads)
  qps_before=$(mesh_ud_qps)
  {
    printf '['
    sep=
    for ((h = 2; h <= FLEET_HOSTS; h++)); do
      printf '%s{"targets": [' "$sep"
      sep2=
      for ((i = 0; i < per_host; i++)); do
        printf '%s"%s"' "$sep2" "$(target_addr $h $i)"
        sep2=,
      done
      printf '], "labels": {"host": "h%d"}}' "$h"
      sep=,
    done
    printf ']\n'
  } >"$OUT/targets.json.tmp"
  mv "$OUT/targets.json.tmp" "$OUT/targets.json"
  want=$(((FLEET_HOSTS - 1) * per_host))
  resolved() { [ "$(metric "$(scrape resolving)" 'qpwatch_mesh_target_resolved')" -ge "$want" ]; }
  start=$SECONDS
  WAIT_INTERVAL=5 wait_until 600 resolved || fail "not every target resolved: $(metric "$(scrape resolving)" 'qpwatch_mesh_target_resolved') of $want"
  record C.targets "$want"
  record C.resolve_all_seconds $((SECONDS - start))
  sleep 5
  before=$(scrape before)
  cpu0=$(cpu_ticks "$AGENT_PID") t0=$(date +%s%N)
fi
fleet_barrier resolved 700
[ "$HOST_INDEX" = 1 ] || resp_cpu0=$(cpu_ticks "$AGENT_PID")
sleep "$seconds"
fleet_barrier window
if [ "$HOST_INDEX" = 1 ]; then
  cpu1=$(cpu_ticks "$AGENT_PID") t1=$(date +%s%N)
  after=$(scrape after)
  sent=$(delta "$before" "$after" qpwatch_mesh_probes_sent_total)
  answered=$(delta "$before" "$after" qpwatch_mesh_probes_answered_total)
  lost=$(delta "$before" "$after" qpwatch_mesh_probes_lost_total)
  record C.window_seconds "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')"
  record C.sent "$sent"
  record C.answered "$answered"
  record C.lost "$lost"
  record C.threads_before_targets "$threads_before"
  record C.threads_with_targets "$(agent_threads)"
  record C.ud_qps_before_targets "$qps_before"
  record C.ud_qps_with_targets "$(mesh_ud_qps)"
  record C.agent_cpu_ms_per_1000_probes "$(awk -v c=$((cpu1 - cpu0)) -v hz="$hz" -v n="$sent" 'BEGIN { if (n > 0) printf "%.1f", c * 1000 / hz * 1000 / n }')"
  record C.agent_cpu_percent "$(awk -v c=$((cpu1 - cpu0)) -v hz="$hz" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", 100 * c / hz / ((b - a) / 1e9) }')"
  record C.agent_rss_kib "$(rss_kib "$AGENT_PID")"
  record C.rtt_breakdown "${MESH_BREAKDOWN:-true}"
  # /metrics at 1,000 targets: 5 scrapes, the median time and the size
  for _ in 1 2 3 4 5; do
    curl -fsS -o /dev/null -w '%{time_total} %{size_download}\n' "http://$AGENT_ADDR/metrics"
  done >"$OUT/scrapes.txt"
  record C.scrape_seconds_median "$(sort -n "$OUT/scrapes.txt" | sed -n 3p | cut -d' ' -f1)"
  record C.scrape_bytes "$(sort -n "$OUT/scrapes.txt" | sed -n 3p | cut -d' ' -f2)"
  record C.scrape_series "$(grep -vc '^#' "$after")"
  record C.messages_dropped "$(metric "$after" qpwatch_mesh_messages_dropped_total)"
  record C.events_lost "$(metric "$after" qpwatch_events_lost_total)"
fi
if [ "$HOST_INDEX" != 1 ]; then
  record "C.h$HOST_INDEX.responder_cpu_ms_per_second" "$(awk -v c=$(($(cpu_ticks "$AGENT_PID") - resp_cpu0)) -v hz="$hz" -v s="$seconds" 'BEGIN { printf "%.1f", c * 1000 / hz / s }')"
  resp=$(scrape resp)
  record "C.h$HOST_INDEX.responses" "$(metric "$resp" qpwatch_mesh_responses_total)"
  record "C.h$HOST_INDEX.responder_ud_qps" "$(metric "$resp" qpwatch_mesh_qps)"
  record "C.h$HOST_INDEX.responder_rss_kib" "$(rss_kib "$AGENT_PID")"
fi
fleet_barrier recorded
stop_agent
if [ "$HOST_INDEX" != 1 ]; then
  for ((i = 0; i < per_host; i++)); do
    echo "addr del $(target_addr "$HOST_INDEX" $i)/32 dev $nic"
  done | ip -force -batch - 2>/dev/null || true
fi
fleet_barrier cleaned
