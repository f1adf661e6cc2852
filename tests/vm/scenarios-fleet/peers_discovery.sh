# Peers from the kernel and probes that follow the traffic: agents in fleet
# mode with `discover = true` and no configured target; an rdma_cm
# connection h2 -> h1 (rping) and a raw verbs one h3 -> h1 (ib_send_lat -e:
# QP numbers exchanged over TCP, RoCEv2 GID index 1, completions by events
# so that the one-CPU guests are not busy-polled).
#
#   every host  agent up (interval 5 s, discover_expiry 15 s) . barrier agents
#   h1          qpwatch events streaming ........................ barrier events
#   h2, h3      client connected; its QP number shared .. barrier connected
#   each        while connected: qpwatch_peer_qps{peer=<other side>} == 1
#               (h1: 2 peers), no peer between h2 and h3; the discovered
#               target probed (sent >= 1) within 2 probe intervals of the
#               connection's QPs showing in RTR or RTS, and answered
#   h2, h3      traffic stopped ................................. barrier stopped
#   each        peer series gone; the discovered target still probed 5 s
#               after the traffic stopped, gone 15 s (discover_expiry) after
#               it: between 13 and 23 s (the agent last saw the peer live up
#               to one discovery check before; scrapes take seconds here)
#   h1          the events: a modify to RTR with remote_gid h2 and
#               remote_qpn = h2's rping QP number, the same for h3's
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h1=$(fleet_host_addr 1)
interval=5
expiry=15
cat >"$OUT/qpwatch.toml" <<TOML
[mesh]
interval_seconds = $interval.0
timeout_seconds = 1.0
discover = true
discover_expiry_seconds = $expiry
source = "$HOST_ADDR"
TOML
launch_agent --config "$OUT/qpwatch.toml"
wait_agent_ready 180
fleet_barrier agents

# peer_qps FILE PEER: live QPs to PEER in a scrape
peer_qps() { metric "$1" "qpwatch_peer_qps{device=\"rxe0\",peer=\"$2\"}"; }
discovered() { metric "$1" 'qpwatch_mesh_targets{source="discovered"}'; }
sent_to() { metric "$1" "qpwatch_mesh_probes_sent_total{target=\"$2\"}"; }

case $HOST_INDEX in
  1)
    start_events
    rping -s -a "$h1" -C 1000000 >"$OUT/rping-server.log" 2>&1 &
    rping_server=$!
    ib_send_lat -d rxe0 -x 1 -e -n 1000000 >"$OUT/send_lat-server.log" 2>&1 &
    lat_server=$!
    wait_until 30 bash -c "ss -Hltn 'sport = :18515' | grep -q ." || fail "ib_send_lat server not listening"
    fleet_barrier events
    ;;
  *) fleet_barrier events ;;
esac

case $HOST_INDEX in
  2)
    rping -c -a "$h1" -C 1000000 >"$OUT/rping-client.log" 2>&1 &
    client=$!
    ;;
  3)
    ib_send_lat -d rxe0 -x 1 -e -n 1000000 "$h1" >"$OUT/send_lat-client.log" 2>&1 &
    client=$!
    ;;
esac
# the connection as the kernel shows it: an RC QP of the traffic in RTR or
# RTS (the remote side is set at RTR)
case $HOST_INDEX in
  1) mine='.comm == "rping" or .comm == "ib_send_lat"' want=2 ;;
  *) mine=".pid == $client" want=1 ;;
esac
# (rdma res without jq: polled every 0.1 s, it is the reference of the
# "within two intervals" below)
case $HOST_INDEX in
  1) comm='comm (rping|ib_send_lat)' ;;
  *) comm="pid $client " ;;
esac
connected_qps() { [ "$(rdma res show qp | grep -E 'type RC state (RTR|RTS)' | grep -cE "$comm")" -ge "$want" ]; }
WAIT_INTERVAL=0.1 wait_until 60 connected_qps || fail "h$HOST_INDEX: the traffic's QPs not in RTR or RTS"
connected=$(date +%s%N)
log "h$HOST_INDEX: $want RC QP(s) of the traffic connected"
if [ "$HOST_INDEX" != 1 ]; then
  rdma -j res show qp | jq -r ".[] | select(.type == \"RC\" and ($mine)) | .lqpn" | head -n1 >"$FLEET_OUT/qpn.h$HOST_INDEX"
fi

case $HOST_INDEX in
  1) peers="$(fleet_host_addr 2) $(fleet_host_addr 3)" ;;
  *) peers=$h1 ;;
esac
# every peer probed within two probe intervals of the connection: one scrape
# per round, each peer's first round with a probe sent
declare -A first_ms=()
all_probed() {
  local f p
  f=$(scrape probed)
  for p in $peers; do
    if [ -z "${first_ms[$p]:-}" ] && [ "$(sent_to "$f" "$p")" -ge 1 ]; then
      first_ms[$p]=$((($(date +%s%N) - connected) / 1000000))
    fi
  done
  for p in $peers; do [ -n "${first_ms[$p]:-}" ] || return 1; done
}
WAIT_INTERVAL=0.1 wait_until 60 all_probed || fail "h$HOST_INDEX: discovered peers not all probed: ${!first_ms[*]}"
for p in $peers; do
  log "figure: h$HOST_INDEX -> $p: first probe seen ${first_ms[$p]} ms after the connection showed in the kernel"
  [ "${first_ms[$p]}" -le $((2 * interval * 1000)) ] || fail "h$HOST_INDEX -> $p: first probe after ${first_ms[$p]} ms, more than 2 intervals"
done
for p in $peers; do
  WAIT_INTERVAL=1 wait_until 30 mesh_answered_above "$p" 0 || fail "h$HOST_INDEX -> $p: discovered, never answered"
done
live=$(scrape live)
for p in $peers; do
  assert_eq "h$HOST_INDEX: live QPs to $p" 1 "$(peer_qps "$live" "$p")"
done
assert_eq "h$HOST_INDEX: peers of rxe0" "$(wc -w <<<"$peers")" "$(metric "$live" 'qpwatch_peers{device="rxe0"}')"
assert_eq "h$HOST_INDEX: discovered targets" "$(wc -w <<<"$peers")" "$(discovered "$live")"
if [ "$HOST_INDEX" != 1 ]; then
  other=$(fleet_host_addr $((5 - HOST_INDEX)))
  assert_eq "h$HOST_INDEX: QPs to $other (no traffic)" 0 "$(peer_qps "$live" "$other")"
  assert_eq "h$HOST_INDEX: probes to $other (not discovered)" 0 "$(sent_to "$live" "$other")"
fi
fleet_barrier connected

# stop the traffic (the expiry is timed from here: the agent last saw the
# peer live at most one discovery check, 1.25 s, before)
stop_at=$SECONDS
case $HOST_INDEX in
  1)
    kill "$rping_server" "$lat_server" 2>/dev/null || true
    wait "$rping_server" "$lat_server" 2>/dev/null || true
    ;;
  *)
    kill "$client" 2>/dev/null || true
    wait "$client" 2>/dev/null || true
    ;;
esac
no_peer_qps() {
  local f p
  f=$(scrape gone)
  for p in $peers; do [ "$(peer_qps "$f" "$p")" = 0 ] || return 1; done
}
wait_until 60 no_peer_qps || fail "h$HOST_INDEX: peer QPs still counted after the traffic"
log "h$HOST_INDEX: no QP to its peers any more, $((SECONDS - stop_at)) s after the traffic was stopped"
fleet_barrier stopped
[ $((SECONDS - stop_at)) -lt 8 ] || fail "h$HOST_INDEX: the check 5 s after the last QP comes too late"
sleep $((stop_at + 5 - SECONDS > 0 ? stop_at + 5 - SECONDS : 0))
assert_eq "h$HOST_INDEX: discovered targets 5 s after the last QP" "$(wc -w <<<"$peers")" "$(discovered "$(scrape kept)")"
expired() { [ "$(discovered "$(scrape expired)")" = 0 ]; }
WAIT_INTERVAL=0.5 wait_until 40 expired || fail "h$HOST_INDEX: discovered targets never expired"
after=$((SECONDS - stop_at))
log "figure: h$HOST_INDEX: discovered targets gone ${after} s after the traffic was stopped (expiry $expiry s)"
if [ "$after" -lt $((expiry - 2)) ] || [ "$after" -gt $((expiry + 8)) ]; then
  fail "h$HOST_INDEX: expired after $after s, expiry is $expiry s"
fi
end=$(scrape end)
for p in $peers; do
  grep -q "target=\"$p\"" "$end" && fail "h$HOST_INDEX: series of the expired target $p left"
done
assert_eq "h$HOST_INDEX: peers of rxe0 after the traffic" 0 "$(metric "$end" 'qpwatch_peers{device="rxe0"}')"

if [ "$HOST_INDEX" = 1 ]; then
  stop_events
  for h in 2 3; do
    want=$(cat "$FLEET_OUT/qpn.h$h")
    got=$(jq -r --arg gid "$(fleet_host_addr "$h")" \
      'select(.kind == "qp_modify" and .to_state == "RTR" and .remote_gid == $gid) | .remote_qpn' "$OUT/events.jsonl" | sort -u)
    assert_eq "h1: remote QP number of the RTR modify to h$h (qpwatch events)" "$want" "$got"
  done
fi
fleet_barrier checked
stop_agent
