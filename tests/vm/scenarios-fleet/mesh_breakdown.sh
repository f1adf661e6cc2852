# The RTT breakdown tells the network from the host: a delay on the switch's
# port toward h3, then toward h2 (netem delay 2ms), then h3's agent starved
# of CPU (a CPU hog at a higher priority), each seen from h1 and the last
# two judged by the shipped rules in the real Prometheus.
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering
#   h1          Prometheus with dashboards/rules.yml
#   network     netem delay 2ms toward h3 in turn with none (4 cycles of 8 s
#               each way, mesh_delay_in_turn: one 30 s window each way saw
#               the bed's drift take 0.72 ms of the 2), the medians of the
#               RTT, network RTT and responder delay of h1 -> h3 over each
#               phase's windows (the agent's histograms between the scrapes
#               that open and close each window), h1 -> h2's for the record:
#               h1 -> h3's RTT rises by more than 1 ms (mesh_delay holds the
#               rise against ib_send_lat's), its network RTT by at least half
#               of that (medians of two histograms do not subtract exactly:
#               77% to 102% of the RTT's rise in four runs), the responder
#               delay moves by less than 10% of it
#   normal      90 s of answers in all, then h1 -> h3's medians over 30 s
#               (the rules' 30 min normal is what they have: h1 -> h3's
#               holds the cycles, which only raise its normal network RTT)
#   alerts      netem delay 2ms toward h2, on to the end:
#               QpwatchMeshPathSlow{cause="network"} fires for h1 -> h2 and
#               cause="host" does not (the host phase runs while this
#               alert's 1m goes by: h1 -> h2 and h1 -> h3 cross different
#               switch ports)
#   host        on h3 a SCHED_FIFO hog spins 15 ms of every 20 ms: the
#               agent's threads wait on the run queue 75% of the time (a
#               cgroup cpu.max throttle was tried first: it also holds the
#               thread inside its post of the answer, after the answer's
#               timestamp, so part of the host's delay showed as network;
#               see the README): h1 -> h3's responder delay rises by at
#               least 1 ms and by more than the network RTT moves (clamped
#               answers counted in the figures);
#               QpwatchMeshPathSlow{cause="host"} fires for h1 -> h3 and
#               cause="network" does not
#   figures in $FLEET_OUT/figures.txt
# vm-timeout: 1500
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h2=$(fleet_host_addr 2) h3=$(fleet_host_addr 3)
WINDOW=30
# the network part: 4 cycles of 8 s each way, about 320 probes per path in
# each phase
CYCLES=4 CYCLE_WINDOW=8
# seconds of answers before the delay toward h2 goes on
NORMAL=90
start_mesh_agent
mesh_wait_answering 120
if [ "$HOST_INDEX" = 1 ]; then
  start_prometheus
  expect_prom "Prometheus scrapes every agent" 'up{job="qpwatch"}' \
    "$(fleet_agent_targets | sed 's/$/=1/' | sort | paste -sd' ')" 180
fi
fleet_barrier answering

figure() {
  log "figure: $*"
  echo "$*" >>"$FLEET_OUT/figures.txt"
}
# parts TARGET BEFORE AFTER [BEFORE AFTER...]: "rtt network responder"
# medians (s) of TARGET over the windows between the pairs of scrapes
parts() {
  local rtt net resp
  rtt=$(hist_quantile_windows 0.5 "$1" qpwatch_mesh_probe_rtt_seconds "${@:2}" | cut -d' ' -f1)
  net=$(hist_quantile_windows 0.5 "$1" qpwatch_mesh_probe_network_rtt_seconds "${@:2}" | cut -d' ' -f1)
  resp=$(hist_quantile_windows 0.5 "$1" qpwatch_mesh_responder_delay_seconds "${@:2}" | cut -d' ' -f1)
  echo "$rtt $net $resp"
}
# rises BEFORE AFTER: two "rtt network responder" triples, AFTER's minus
# BEFORE's, on stdout
rises() {
  awk -v before="$1" -v after="$2" \
    'BEGIN { split(before, a, " "); split(after, b, " "); printf "%.6f %.6f %.6f", b[1] - a[1], b[2] - a[2], b[3] - a[3] }'
}
# delay_rises TARGET: TARGET's parts without and with the delay (MESH_BASE,
# MESH_DELAY) as figures; their rises "rtt network responder" on stdout
delay_rises() {
  local base delayed rtt net resp rise_rtt rise_net rise_resp
  base=$(parts "$1" "${MESH_BASE[@]}")
  delayed=$(parts "$1" "${MESH_DELAY[@]}")
  read -r rise_rtt rise_net rise_resp <<<"$(rises "$base" "$delayed")"
  read -r rtt net resp <<<"$base"
  figure "h1->$1 no delay: rtt $rtt network $net responder $resp (s, medians over $CYCLES windows of $CYCLE_WINDOW s)"
  read -r rtt net resp <<<"$delayed"
  figure "h1->$1 netem delay 2ms toward h3: rtt $rtt network $net responder $resp"
  figure "h1->$1 rises: rtt $rise_rtt network $rise_net responder $rise_resp"
  echo "$rise_rtt $rise_net $rise_resp"
}
# alert_state NAME CAUSE TARGET: pending, firing or nothing
alert_state() {
  curl -fsS "http://$PROM/api/v1/alerts" 2>/dev/null | jq -r --arg n "$1" --arg c "$2" --arg t "$3" \
    '[.data.alerts[] | select(.labels.alertname == $n and .labels.cause == $c and .labels.target == $t and .labels.instance == "'"$AGENT_ADDR"'") | .state] | first // ""'
}
firing() { [ "$(alert_state QpwatchMeshPathSlow "$1" "$2")" = firing ]; }
# expect_causes SINCE_NETWORK SINCE_HOST: within 4 min, cause="network" fires
# for h1 -> h2 and cause="host" for h1 -> h3, each seen as it begins firing
# with the other cause not firing for its path; SINCE_NETWORK is the
# $SECONDS the delay toward h2 went on at, SINCE_HOST the starved host's
# window was measured at.
expect_causes() {
  local start=$SECONDS network=$1 host=$2 seen_network= seen_host=
  while [ -z "$seen_network" ] || [ -z "$seen_host" ]; do
    if [ -z "$seen_network" ] && firing network "$h2"; then
      seen_network=seen
      figure "alert QpwatchMeshPathSlow{cause=\"network\"} h1 -> $h2 firing $((SECONDS - network)) s after the delay went on"
      assert_eq "QpwatchMeshPathSlow{cause=\"host\"} for h1 -> $h2" "" "$(alert_state QpwatchMeshPathSlow host "$h2")"
    fi
    if [ -z "$seen_host" ] && firing host "$h3"; then
      seen_host=seen
      figure "alert QpwatchMeshPathSlow{cause=\"host\"} h1 -> $h3 firing $((SECONDS - host)) s after the fault's window was measured"
      assert_eq "QpwatchMeshPathSlow{cause=\"network\"} for h1 -> $h3" "" "$(alert_state QpwatchMeshPathSlow network "$h3")"
    fi
    [ $((SECONDS - start)) -lt 240 ] || fail "after 240 s: QpwatchMeshPathSlow{cause=\"network\"} for h1 -> $h2 ${seen_network:-not seen} firing, cause=\"host\" for h1 -> $h3 ${seen_host:-not seen} firing"
    sleep 2
  done
}
if [ "$HOST_INDEX" = 1 ]; then
  answering=$SECONDS
  mesh_delay_in_turn 3 "$CYCLES" "$CYCLE_WINDOW"
  fleet_switch clear 3 >&2
  delay_rises "$h2" >/dev/null
  read -r rise_rtt rise_net rise_resp <<<"$(delay_rises "$h3")"
  awk -v r="$rise_rtt" -v n="$rise_net" 'BEGIN { exit !(r > 0.001 && n >= 0.5 * r) }' ||
    fail "h1 -> h3: the network RTT rose by $rise_net s of the RTT's $rise_rtt s"
  awk -v r="$rise_rtt" -v p="$rise_resp" 'BEGIN { if (p < 0) p = -p; exit !(p < 0.1 * r) }' ||
    fail "h1 -> h3: the responder delay moved by $rise_resp s with a network delay"
  log "ok: the network delay is in the network RTT, not in the responder delay"

  [ $((SECONDS - answering)) -ge "$NORMAL" ] || sleep $((NORMAL - (SECONDS - answering)))
  b0=$(scrape base0)
  sleep "$WINDOW"
  b1=$(scrape base1)
  normal=$(parts "$h3" "$b0" "$b1")
  read -r rtt3_b net3_b resp3_b <<<"$normal"
  figure "normal h1->h3: rtt $rtt3_b network $net3_b responder $resp3_b (s, medians over ${WINDOW} s)"
  fleet_switch netem 2 delay 2ms >&2
  network_on=$SECONDS
fi
fleet_barrier network-on 600

if [ "$HOST_INDEX" = 3 ]; then
  python3 -c '
import time
while True:
    start = time.monotonic()
    while time.monotonic() - start < 0.015:
        pass
    time.sleep(0.005)
' &
  hog=$!
  chrt -f -p 10 "$hog" || fail "chrt -f 10 on the hog"
  figure "h3: a SCHED_FIFO 10 hog spins 15 ms of every 20 ms (pid $hog)"
fi
fleet_barrier starved
if [ "$HOST_INDEX" = 1 ]; then
  sleep 5
  s0=$(scrape starve0)
  sleep "$WINDOW"
  s1=$(scrape starve1)
  starved=$(parts "$h3" "$s0" "$s1")
  read -r rtt3_s net3_s resp3_s <<<"$starved"
  clamped=$(($(mesh_count "$s1" qpwatch_mesh_responder_delay_clamped_total "$h3") - $(mesh_count "$s0" qpwatch_mesh_responder_delay_clamped_total "$h3")))
  answered=$(($(mesh_count "$s1" qpwatch_mesh_probes_answered_total "$h3") - $(mesh_count "$s0" qpwatch_mesh_probes_answered_total "$h3")))
  lost=$(($(mesh_count "$s1" qpwatch_mesh_probes_lost_total "$h3") - $(mesh_count "$s0" qpwatch_mesh_probes_lost_total "$h3")))
  figure "h3 starved: $answered answers from h3 ($clamped with the responder delay clamped to the RTT), $lost lost"
  figure "h3 starved, h1->h3: rtt $rtt3_s network $net3_s responder $resp3_s"
  read -r rise_rtt rise_net rise_resp <<<"$(rises "$normal" "$starved")"
  figure "h3 starved, h1->h3 rises: rtt $rise_rtt network $rise_net responder $rise_resp"
  awk -v p="$rise_resp" -v n="$rise_net" 'BEGIN { if (n < 0) n = -n; exit !(p >= 0.001 && p > n) }' ||
    fail "h1 -> h3: responder delay rose by $rise_resp s, network RTT moved by $rise_net s"
  log "ok: the starved host is in the responder delay, not in the network RTT"
  expect_causes "$network_on" "$SECONDS"
  fleet_switch clear 2 >&2
fi
fleet_barrier host-done 600
if [ "$HOST_INDEX" = 3 ]; then
  kill "$hog"
  wait "$hog" 2>/dev/null || true
fi
fleet_barrier restored
stop_agent
