# A network delay is seen as one and tells the network from the host: a
# delay on the switch's port toward h3 (netem delay 2ms) measured against
# ping and perftest on the same port, then a delay toward h2, then h3's
# agent starved of CPU (a CPU hog at a higher priority), each seen from h1,
# the last two judged by the shipped rules in the real Prometheus.
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh); only h1 probes, h2
#               and h3 answer (with every agent probing every other, the
#               bed's emulated CPUs were loaded enough that the delay
#               overlapped with the hosts' waits for a CPU: a run's base
#               median 7.5 ms, the rise 1.48 ms where perftest's t_min rose
#               by 2.43)
#   h1          Prometheus with dashboards/rules.yml, QpwatchMeshPathSlow's
#               for: shortened to 10s (fleet_rules)
#   network     a netem qdisc on the switch's port toward h3, first with no
#               delay; then CYCLES cycles of a WINDOW s with no delay and a
#               WINDOW s with 2 ms (the same qdisc changed in place: nothing
#               queued is dropped). The medians of h1 -> h3 and h1 -> h2 are
#               taken over all the undelayed windows and over all the
#               delayed ones (the agent's histograms between the scrapes
#               that open and close each window): the bed's load drifts over
#               a minute by as much as the delay (a CI run with one 30 s
#               window each way saw h1 -> h2 move by 0.36 ms with no fault
#               on it and h1 -> h3 rise by 1.10 ms, another 0.72 ms of the
#               2), windows taken in turn average the drift out. ping
#               h1 -> h3 (20/s) runs through the windows. Then
#               ib_send_lat -c UD -x 1 -n 1000 to h3 with the delay and
#               without it, twice each way in turn.
#               - h1 -> h3: the median RTT's rise, or its rise beyond
#                 h1 -> h2's over the same windows (drift on h1's side of
#                 the probes), lies between 80% of the least and 120% of the
#                 most of: 2 ms, ping's median rise over the same windows,
#                 and twice the rise of perftest's t_min and of its t_typical
#                 (means of its two pairs of runs), each counted where it
#                 saw more than 1 ms. The emulated switch's timers add to a
#                 netem delay, by more the busier the machine: on this
#                 machine the four rose by 2.0 to 4.5 ms in seven runs; on a
#                 loaded CI machine (undelayed medians 12 to 24 ms, four
#                 times this one's) ping's rose by 3.1 ms, t_min's 2.7,
#                 t_typical's 6.6 and the mesh's 3.8, which the earlier test
#                 (within 20% of 2 ms, of ping's or of t_min's) failed;
#               - h1 -> h3's network RTT rises by at least half of the RTT's
#                 rise (medians of two histograms do not subtract exactly:
#                 77% to 102% of the RTT's rise in four runs), its responder
#                 delay moves by less than 10% of it;
#               - h1 -> h2 does not move: within 20% of its baseline or
#                 1 ms, whichever is larger;
#               - no probe lost to either (the qdisc is changed, never
#                 replaced, while probes are counted)
#   normal      90 s of answers in all (the rules' 30 min normal is what
#               they have: h1 -> h3's holds the cycles, which only raise its
#               normal network RTT)
#   alerts      netem delay 2ms toward h2, on to the end:
#               QpwatchMeshPathSlow{cause="network"} fires for h1 -> h2 and
#               cause="host" does not (the host phase runs meanwhile:
#               h1 -> h2 and h1 -> h3 cross different switch ports)
#   host        on h3 a SCHED_FIFO hog that spins 30 ms of every 40 ms: the
#               agent's threads wait on the run queue 75% of the time (a
#               cgroup cpu.max throttle was tried first: it also holds the
#               thread inside its post of the answer, after the answer's
#               timestamp, so part of the host's delay showed as network;
#               see the README); h3's ksoftirqd/0 runs at a higher priority
#               than the hog, as the kernel's own receive path is not what
#               is starved here (before 6.5, invoke_softirq() leaves every
#               softirq to a runnable ksoftirqd: the probe's receive waited
#               for the hog too, and on a loaded machine the network RTT
#               rose 5.7 ms with the responder delay's 2.1; see the README).
#               HOST_CYCLES cycles of a CYCLE_WINDOW s with
#               the hog stopped (SIGSTOP) and one with it running, as for
#               the delay: one starved window against the cycles' undelayed
#               ones measured minutes before failed on a loaded machine
#               (the network RTT "rose" 3.9 ms with the responder delay's
#               2.4; h1 -> h2's 8 s windows' medians moved by up to 4.8 ms
#               with no fault on it). A hog of 15 ms in 20 was used before: its
#               responder delay rose 4.7 to 5.0 ms on this machine, 2.4 on
#               the loaded one. h1 -> h3's responder delay rises by at
#               least 1 ms and by more than the network RTT moves (clamped
#               answers counted in the figures); the hog is left on:
#               QpwatchMeshPathSlow{cause="host"} fires for h1 -> h3 and
#               cause="network" does not
#   figures in $FLEET_OUT/figures.txt
# vm-timeout: 1500
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h2=$(fleet_host_addr 2) h3=$(fleet_host_addr 3)
# the network part: 5 cycles of 8 s each way, about 400 probes per path in
# each phase; the host part: 3 cycles
CYCLES=5 CYCLE_WINDOW=8 HOST_CYCLES=3
# seconds of answers before the delay toward h2 goes on
NORMAL=90
if [ "$HOST_INDEX" = 1 ]; then start_mesh_agent; else start_mesh_agent --answer-only; fi
mesh_wait_answering 120
if [ "$HOST_INDEX" = 1 ]; then
  PROM_SHORT_FOR=QpwatchMeshPathSlow start_prometheus
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
# delay_rises TARGET BASE: TARGET's parts without the delay (BASE, its parts
# over MESH_BASE) and with it (over MESH_FAULT) as figures; "rise_rtt
# rise_network rise_responder base_rtt delayed_rtt" on stdout
delay_rises() {
  local base=$2 delayed rtt net resp rise_rtt rise_net rise_resp base_rtt
  delayed=$(parts "$1" "${MESH_FAULT[@]}")
  read -r rise_rtt rise_net rise_resp <<<"$(rises "$base" "$delayed")"
  read -r rtt net resp <<<"$base"
  base_rtt=$rtt
  figure "h1->$1 no delay: rtt $rtt network $net responder $resp (s, medians over $CYCLES windows of $CYCLE_WINDOW s)"
  read -r rtt net resp <<<"$delayed"
  figure "h1->$1 netem delay 2ms toward h3: rtt $rtt network $net responder $resp"
  figure "h1->$1 rises: rtt $rise_rtt network $rise_net responder $rise_resp"
  echo "$rise_rtt $rise_net $rise_resp $base_rtt $rtt"
}
# lat_client NAME: ib_send_lat h1 -> h3; "t_typical t_min" (us) on stdout.
lat_client() {
  local log=$OUT/ib_send_lat-$1.log
  WAIT_INTERVAL=1 wait_until 60 ib_send_lat -d rxe0 -c UD -x 1 -n 1000 "$h3" >"$log" 2>&1 || { cat "$log" >&2; fail "ib_send_lat $1"; }
  log "ib_send_lat h1 -> $h3 $1: $(awk '/t_typical/ { getline; print "t_min " $3 " us, t_typical " $5 " us, t_avg " $6 " us" }' "$log")"
  awk '/t_typical/ { getline; print $5, $3 }' "$log"
}
# ping_median PHASE: the median ping RTT (s) of the replies within the
# windows of PHASE (mesh_window_mark), and their count
ping_median() {
  awk -v phase="$1" '
    FILENAME == ARGV[1] { if ($1 == "end") { if (open) { lo[++n] = from; hi[n] = $2 } open = 0 } else if ($1 == phase) { open = 1; from = $2 } next }
    /time=/ { t = substr($1, 2, length($1) - 2) + 0; for (i = 1; i <= n; i++) if (t >= lo[i] && t < hi[i]) { r = $0; sub(/.*time=/, "", r); print r / 1000; break } }
  ' "$OUT/windows.txt" "$OUT/ping.log" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan 0"; exit } printf "%.6f %d\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, NR }'
}
mesh_window_mark() { echo "$1 $EPOCHREALTIME" >>"$OUT/windows.txt"; }
delay_toward_h3() { mesh_switch_delay 3 "$1"; }
# starve_h3 on|off: h3's hog runs or is stopped, asked of h3's fleet_serve
# (hog_do) and answered once in force
starve_h3() { fleet_request "$FLEET_OUT/hog" "h3's hog" "$1" >&2; }
hog_do() {
  case $1 in
    on) kill -CONT "$hog" ;;
    off) kill -STOP "$hog" ;;
    *) echo "unknown $1" >&2; return 2 ;;
  esac
}
# window_count METRIC TARGET BEFORE AFTER [BEFORE AFTER...]: METRIC's count
# to TARGET summed over the windows between the pairs of scrapes
window_count() {
  local metric=$1 target=$2 sum=0
  shift 2
  while [ $# -ge 2 ]; do
    sum=$((sum + $(delta "$1" "$2" "$(mesh_sel "$metric" "$target")")))
    shift 2
  done
  echo "$sum"
}
# alert_state NAME CAUSE TARGET: pending, firing or nothing
alert_state() { alerts "$1" "" .alertstate "cause=\"$2\",target=\"$3\",instance=\"$AGENT_ADDR\""; }
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
case $HOST_INDEX in
  1)
    fleet_barrier lat-server
    answering=$SECONDS
    # ping h3 meanwhile (20/s, answered by h3's kernel): what the delay adds
    # to the path in the same seconds, with the same timers and load
    ping -n -D -i 0.05 "$h3" >"$OUT/ping.log" 2>&1 &
    pinger=$!
    on_exit "kill $pinger 2>/dev/null"
    mesh_in_turn delay "$CYCLES" "$CYCLE_WINDOW" delay_toward_h3
    unset -f mesh_window_mark
    kill "$pinger" || fail "ping h1 -> h3 ended early: $(tail -n 2 "$OUT/ping.log")"
    read -r p_base np_base <<<"$(ping_median base)"
    read -r p_delay np_delay <<<"$(ping_median fault)"
    # perftest twice each way, in turn (the delay is still on): the mean of
    # the two t_min rises
    lat_pairs=()
    for pair in 1 2; do
      [ "$pair" = 1 ] || { fleet_switch netem 3 delay 2ms >&2 && sleep 1; }
      read -r lat_delay lat_delay_min <<<"$(lat_client "delay$pair")"
      fleet_switch netem 3 delay 0ms >&2
      sleep 1
      read -r lat_base lat_base_min <<<"$(lat_client "base$pair")"
      lat_pairs+=("$lat_base $lat_delay $lat_base_min $lat_delay_min")
    done
    fleet_switch clear 3 >&2
    rtt_median() { hist_quantile_windows 0.5 "$1" qpwatch_mesh_probe_rtt_seconds "${@:2}" | cut -d' ' -f1; }
    for ((cycle = 0; cycle < CYCLES; cycle++)); do
      w=("${MESH_BASE[@]:2*cycle:2}") x=("${MESH_FAULT[@]:2*cycle:2}")
      figure "cycle $((cycle + 1)) median rtt h1->h3 base $(rtt_median "$h3" "${w[@]}") delay $(rtt_median "$h3" "${x[@]}")" \
        "h1->h2 base $(rtt_median "$h2" "${w[@]}") delay $(rtt_median "$h2" "${x[@]}")"
    done
    read -r rise2_rtt _ _ m2_base m2_delay <<<"$(delay_rises "$h2" "$(parts "$h2" "${MESH_BASE[@]}")")"
    undelayed=$(parts "$h3" "${MESH_BASE[@]}")
    read -r rise_rtt rise_net rise_resp _ _ <<<"$(delay_rises "$h3" "$undelayed")"
    figure "ping median rtt h1->h3 base $p_base ($np_base replies) delay $p_delay ($np_delay replies)"
    for pair in "${lat_pairs[@]}"; do
      read -r a b c d <<<"$pair"
      figure "ib_send_lat_us h1->h3 t_typical base $a delay $b, t_min base $c delay $d (half round trip)"
    done
    rise_diff=$(awk -v m="$rise_rtt" -v c="$rise2_rtt" 'BEGIN { printf "%.6f", m - c }')
    rise_ping=$(awk -v a="$p_base" -v b="$p_delay" 'BEGIN { printf "%.6f", b - a }')
    # round trip: twice the rise of perftest's half round trip, mean of the pairs
    rise_lat=$(printf '%s\n' "${lat_pairs[@]}" | awk '{ s += $2 - $1 } END { printf "%.6f", 2 * s / NR / 1e6 }')
    rise_lat_min=$(printf '%s\n' "${lat_pairs[@]}" | awk '{ s += $4 - $3 } END { printf "%.6f", 2 * s / NR / 1e6 }')
    figure "rtt_rise_s h1->h3 mesh $rise_rtt h1->h2 mesh $rise2_rtt difference $rise_diff ping $rise_ping ib_send_lat_t_min $rise_lat_min ib_send_lat_t_typical $rise_lat"
    # within the rises the 2 ms asked and the clients beside the mesh saw
    # (those that saw the delay: more than 1 ms), from 80% of the least to
    # 120% of the most, alone or beyond the undelayed path's rise
    band=$(awk -v p="$rise_ping" -v l="$rise_lat_min" -v t="$rise_lat" '
      BEGIN { lo = hi = 0.002; n = split(p " " l " " t, v, " ")
        for (i = 1; i <= n; i++) if (v[i] > 0.001) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i] }
        printf "%.6f %.6f", 0.8 * lo, 1.2 * hi }')
    read -r band_lo band_hi <<<"$band"
    figure "rtt_rise_s h1->h3 band $band_lo to $band_hi"
    awk -v m="$rise_rtt" -v c="$rise_diff" -v lo="$band_lo" -v hi="$band_hi" '
      BEGIN { exit !((m >= lo && m <= hi) || (c >= lo && c <= hi)) }' ||
      fail "h1 -> h3 median rose by $rise_rtt s ($rise_diff s beyond h1 -> h2's): outside $band_lo to $band_hi s (2 ms, ping's $rise_ping s, ib_send_lat's $rise_lat_min s at t_min and $rise_lat s at t_typical)"
    log "ok: h1 -> h3 rise (alone or beyond h1 -> h2's) within $band_lo to $band_hi s, what 2 ms, ping and perftest give"
    awk -v a="$m2_base" -v b="$m2_delay" 'BEGIN { d = b - a; if (d < 0) d = -d; bound = 0.2 * a; if (bound < 0.001) bound = 0.001; exit !(d <= bound) }' ||
      fail "h1 -> h2 median moved from $m2_base to $m2_delay s with the delay on h3's port"
    log "ok: h1 -> h2 median $m2_base -> $m2_delay s"
    awk -v r="$rise_rtt" -v n="$rise_net" 'BEGIN { exit !(r > 0.001 && n >= 0.5 * r) }' ||
      fail "h1 -> h3: the network RTT rose by $rise_net s of the RTT's $rise_rtt s"
    awk -v r="$rise_rtt" -v p="$rise_resp" 'BEGIN { if (p < 0) p = -p; exit !(p < 0.1 * r) }' ||
      fail "h1 -> h3: the responder delay moved by $rise_resp s with a network delay"
    log "ok: the network delay is in the network RTT, not in the responder delay"
    mesh_expect_no_loss "${MESH_BASE[0]}" "${MESH_FAULT[-1]}" "$h2" "$h3"

    [ $((SECONDS - answering)) -ge "$NORMAL" ] || sleep $((NORMAL - (SECONDS - answering)))
    read -r rtt3_b net3_b resp3_b <<<"$undelayed"
    figure "normal h1->h3: rtt $rtt3_b network $net3_b responder $resp3_b (s, medians over the $CYCLES undelayed windows)"
    fleet_switch netem 2 delay 2ms >&2
    network_on=$SECONDS
    ;;
  3)
    for run in 1 2 3 4; do
      ib_send_lat -d rxe0 -c UD -x 1 -n 1000 >>"$OUT/ib_send_lat-server.log" 2>&1 || { cat "$OUT/ib_send_lat-server.log" >&2; fail "ib_send_lat server, run $run"; }
    done &
    server=$!
    fleet_barrier lat-server
    wait "$server" || fail "ib_send_lat server"
    ;;
  *) fleet_barrier lat-server ;;
esac
fleet_barrier network-on 600

if [ "$HOST_INDEX" = 3 ]; then
  python3 -c '
import time
while True:
    start = time.monotonic()
    while time.monotonic() - start < 0.030:
        pass
    time.sleep(0.010)
' &
  hog=$!
  kill -STOP "$hog"
  on_exit "kill -9 $hog 2>/dev/null"
  chrt -f -p 10 "$hog" || fail "chrt -f 10 on the hog"
  softirqd=$(pgrep -x ksoftirqd/0) || fail "no ksoftirqd/0"
  chrt -f -p 20 "$softirqd" || fail "chrt -f 20 on ksoftirqd/0"
  on_exit "chrt -o -p 0 $softirqd"
  fleet_serve "$FLEET_OUT/hog" hog_do "$FLEET_OUT/hog/quit" &
  hog_server=$!
  on_exit "kill $hog_server 2>/dev/null"
  figure "h3: a SCHED_FIFO 10 hog spins 30 ms of every 40 ms while on (pid $hog)"
fi
fleet_barrier starved
if [ "$HOST_INDEX" = 1 ]; then
  mesh_in_turn starve "$HOST_CYCLES" "$CYCLE_WINDOW" starve_h3
  normal=$(parts "$h3" "${MESH_BASE[@]}")
  starved=$(parts "$h3" "${MESH_FAULT[@]}")
  read -r rtt3_b net3_b resp3_b <<<"$normal"
  read -r rtt3_s net3_s resp3_s <<<"$starved"
  clamped=$(window_count qpwatch_mesh_responder_delay_clamped_total "$h3" "${MESH_FAULT[@]}")
  answered=$(window_count qpwatch_mesh_probes_answered_total "$h3" "${MESH_FAULT[@]}")
  lost=$(window_count qpwatch_mesh_probes_lost_total "$h3" "${MESH_BASE[@]}" "${MESH_FAULT[@]}")
  figure "h3 starved: $answered answers from h3 ($clamped with the responder delay clamped to the RTT), $lost lost (over $HOST_CYCLES windows of $CYCLE_WINDOW s each way)"
  figure "h3 not starved, h1->h3: rtt $rtt3_b network $net3_b responder $resp3_b"
  figure "h3 starved, h1->h3: rtt $rtt3_s network $net3_s responder $resp3_s"
  read -r rise_rtt rise_net rise_resp <<<"$(rises "$normal" "$starved")"
  figure "h3 starved, h1->h3 rises: rtt $rise_rtt network $rise_net responder $rise_resp"
  awk -v p="$rise_resp" -v n="$rise_net" 'BEGIN { if (n < 0) n = -n; exit !(p >= 0.001 && p > n) }' ||
    fail "h1 -> h3: responder delay rose by $rise_resp s, network RTT moved by $rise_net s"
  log "ok: the starved host is in the responder delay, not in the network RTT"
  expect_causes "$network_on" "$SECONDS"
  fleet_switch clear 2 >&2
  : >"$FLEET_OUT/hog/quit"
fi
fleet_barrier host-done 600
if [ "$HOST_INDEX" = 3 ]; then
  wait "$hog_server" || fail "serving the hog's requests"
  kill -9 "$hog"
  wait "$hog" 2>/dev/null || true
  chrt -o -p 0 "$softirqd"
fi
fleet_barrier restored
stop_agent
