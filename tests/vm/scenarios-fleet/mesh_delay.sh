# netem delay 2ms on the switch's port toward h3 (fleet_switch): every frame
# the switch sends to h3 waits 2 ms, so h1's probes to h3 take 2 ms more per
# round trip (the answers come back through h1's port, undelayed).
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering;
#               only h1 probes
#   h1          a netem qdisc on the switch's port toward h3, first with no
#               delay; then CYCLES cycles of a WINDOW s with no delay and a
#               WINDOW s with 2 ms (the same qdisc changed in place: nothing
#               queued is dropped). The medians of h1 -> h3 and h1 -> h2 are
#               taken over all the undelayed windows and over all the delayed
#               ones (the agent's histograms between the scrapes that open
#               and close each window): the bed's load drifts over a minute
#               by as much as the delay (a CI run with one 30 s window each
#               way saw h1 -> h2 move by 0.36 ms with no fault on it and
#               h1 -> h3 rise by 1.10 ms), windows taken in turn average the
#               drift out. ping h1 -> h3 (20/s) runs through the windows.
#               Then ib_send_lat -c UD -x 1 -n 1000 to h3 with the delay and
#               without it, twice each way in turn.
#               - h1 -> h3: the median's rise is within 20% of 2 ms, or its
#                 rise beyond h1 -> h2's over the same windows is, or it is
#                 within 20% of ping's median rise over the same windows, or
#                 of the delay perftest saw the switch add (the
#                 mean of its two pairs of runs): the
#                 emulated switch's timers add to a netem delay (in four
#                 runs twice the rise of ib_send_lat's t_min, its figure
#                 least moved by the bed's load, was 1.9 to 2.9 ms for 2 ms;
#                 its t_typical rose by 1.2 to 4.8 ms of half round trip in
#                 bench-fleet/switch_faults);
#               - h1 -> h2 does not move: within 20% of its baseline or
#                 1 ms, whichever is larger;
#               - no probe lost to either (the qdisc is changed, never
#                 replaced, while probes are counted)
#               figures in $FLEET_OUT/figures.txt
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h2=$(fleet_host_addr 2) h3=$(fleet_host_addr 3)
# 5 cycles of 8 s each way: 400 probes to each target in each phase
CYCLES=5 WINDOW=8
# h2 and h3 only answer: with every agent probing every other, the bed's
# emulated CPUs were loaded enough that the delay overlapped with the hosts'
# waits for a CPU (a run: base median 7.5 ms, the rise 1.48 ms where
# perftest's t_min rose by 2.43)
if [ "$HOST_INDEX" = 1 ]; then start_mesh_agent; else start_mesh_agent --answer-only; fi
mesh_wait_answering 120
fleet_barrier answering

# lat_client NAME: ib_send_lat h1 -> h3; "t_typical t_min" (us) on stdout.
lat_client() {
  local log=$OUT/ib_send_lat-$1.log
  WAIT_INTERVAL=1 wait_until 60 ib_send_lat -d rxe0 -c UD -x 1 -n 1000 "$h3" >"$log" 2>&1 || { cat "$log" >&2; fail "ib_send_lat $1"; }
  log "ib_send_lat h1 -> $h3 $1: $(awk '/t_typical/ { getline; print "t_min " $3 " us, t_typical " $5 " us, t_avg " $6 " us" }' "$log")"
  awk '/t_typical/ { getline; print $5, $3 }' "$log"
}

case $HOST_INDEX in
  1)
    fleet_barrier lat-server
    # ping h3 meanwhile (20/s, answered by h3's kernel): what the delay adds
    # to the path in the same seconds, with the same timers and load
    ping -n -D -i 0.05 "$h3" >"$OUT/ping.log" 2>&1 &
    pinger=$!
    on_exit "kill $pinger 2>/dev/null"
    mesh_window_mark() { echo "$1 $(date +%s.%N)" >>"$OUT/windows.txt"; }
    mesh_delay_in_turn 3 "$CYCLES" "$WINDOW"
    base=("${MESH_BASE[@]}") delay=("${MESH_DELAY[@]}")
    kill "$pinger" || fail "ping h1 -> h3 ended early: $(tail -n 2 "$OUT/ping.log")"
    # ping_median PHASE: the median ping RTT (s) of the replies within the
    # windows of PHASE, and their count
    ping_median() {
      awk -v phase="$1" '
        FILENAME == ARGV[1] { if ($1 == "end") { if (open) { lo[++n] = from; hi[n] = $2 } open = 0 } else if ($1 == phase) { open = 1; from = $2 } next }
        /time=/ { t = substr($1, 2, length($1) - 2) + 0; for (i = 1; i <= n; i++) if (t >= lo[i] && t < hi[i]) { r = $0; sub(/.*time=/, "", r); print r / 1000; break } }
      ' "$OUT/windows.txt" "$OUT/ping.log" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan 0"; exit } printf "%.6f %d\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, NR }'
    }
    read -r p_base np_base <<<"$(ping_median base)"
    read -r p_delay np_delay <<<"$(ping_median delay)"
    # perftest twice each way, in turn: the mean of the two t_min rises
    lat_pairs=()
    for pair in 1 2; do
      [ "$pair" = 1 ] || { fleet_switch netem 3 delay 2ms >&2 && sleep 1; }
      lat=$(lat_client "delay$pair")
      read -r lat_delay lat_delay_min <<<"$lat"
      fleet_switch netem 3 delay 0ms >&2
      sleep 1
      lat=$(lat_client "base$pair")
      read -r lat_base lat_base_min <<<"$lat"
      lat_pairs+=("$lat_base $lat_delay $lat_base_min $lat_delay_min")
    done
    fleet_switch clear 3 >&2
    rtt_median() { hist_quantile_windows 0.5 "$1" qpwatch_mesh_probe_rtt_seconds "${@:2}"; }
    read -r m3_base n3_base <<<"$(rtt_median "$h3" "${base[@]}")"
    read -r m3_delay n3_delay <<<"$(rtt_median "$h3" "${delay[@]}")"
    read -r m2_base n2_base <<<"$(rtt_median "$h2" "${base[@]}")"
    read -r m2_delay n2_delay <<<"$(rtt_median "$h2" "${delay[@]}")"
    {
      for ((cycle = 0; cycle < CYCLES; cycle++)); do
        w=("${base[@]:2*cycle:2}") x=("${delay[@]:2*cycle:2}")
        echo "cycle $((cycle + 1)) mesh_median_rtt_s h1->h3 base $(rtt_median "$h3" "${w[@]}" | cut -d' ' -f1) delay $(rtt_median "$h3" "${x[@]}" | cut -d' ' -f1)" \
          "h1->h2 base $(rtt_median "$h2" "${w[@]}" | cut -d' ' -f1) delay $(rtt_median "$h2" "${x[@]}" | cut -d' ' -f1)"
      done
      echo "mesh_median_rtt_s h1->h3 base $m3_base ($n3_base probes) delay $m3_delay ($n3_delay probes)"
      echo "ping_median_rtt_s h1->h3 base $p_base ($np_base replies) delay $p_delay ($np_delay replies)"
      echo "mesh_median_rtt_s h1->h2 base $m2_base ($n2_base probes) delay $m2_delay ($n2_delay probes)"
      for pair in "${lat_pairs[@]}"; do
        read -r a b c d <<<"$pair"
        echo "ib_send_lat_us h1->h3 t_typical base $a delay $b, t_min base $c delay $d (half round trip)"
      done
    } | tee -a "$FLEET_OUT/figures.txt" >&2
    rise_mesh=$(awk -v a="$m3_base" -v b="$m3_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_ctl=$(awk -v a="$m2_base" -v b="$m2_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_diff=$(awk -v m="$rise_mesh" -v c="$rise_ctl" 'BEGIN { printf "%.6f", m - c }')
    # round trip: twice the rise of perftest's half round trip, mean of the pairs
    rise_lat=$(printf '%s\n' "${lat_pairs[@]}" | awk '{ s += $2 - $1 } END { printf "%.6f", 2 * s / NR / 1e6 }')
    rise_ping=$(awk -v a="$p_base" -v b="$p_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_lat_min=$(printf '%s\n' "${lat_pairs[@]}" | awk '{ s += $4 - $3 } END { printf "%.6f", 2 * s / NR / 1e6 }')
    log "round-trip rise with netem delay 2ms toward h3: mesh median +$rise_mesh s (h1 -> h2 +$rise_ctl s, difference +$rise_diff s), ping +$rise_ping s, ib_send_lat +$rise_lat_min s (2 x t_min), +$rise_lat s (2 x t_typical)"
    echo "rtt_rise_s h1->h3 mesh $rise_mesh h1->h2 mesh $rise_ctl difference $rise_diff ping $rise_ping ib_send_lat_t_min $rise_lat_min ib_send_lat_t_typical $rise_lat" >>"$FLEET_OUT/figures.txt"
    # within 20% of the 2 ms asked (alone or beyond the undelayed path's
    # rise), or of the delay ping saw added in the same windows, or of the
    # delay perftest saw
    awk -v m="$rise_mesh" -v c="$rise_diff" -v p="$rise_ping" -v l="$rise_lat_min" '
      function near(x, want) { x -= want; if (x < 0) x = -x; return x <= 0.2 * want }
      BEGIN { exit !(near(m, 0.002) || near(c, 0.002) || (p > 0.001 && near(m, p)) || (l > 0.001 && near(m, l))) }' ||
      fail "h1 -> h3 median rose by $rise_mesh s ($rise_diff s beyond h1 -> h2's), ping by $rise_ping s, ib_send_lat by $rise_lat_min s: within 20% of neither 2 ms nor the delay ping or perftest saw"
    log "ok: h1 -> h3 rise within 20% of 2 ms (alone or beyond h1 -> h2's) or of the delay ping or perftest saw"
    awk -v a="$m2_base" -v b="$m2_delay" 'BEGIN { d = b - a; if (d < 0) d = -d; bound = 0.2 * a; if (bound < 0.001) bound = 0.001; exit !(d <= bound) }' ||
      fail "h1 -> h2 median moved from $m2_base to $m2_delay s with the delay on h3's port"
    log "ok: h1 -> h2 median $m2_base -> $m2_delay s"
    mesh_expect_no_loss "${base[0]}" "${delay[-1]}" "$h2" "$h3"
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
fleet_barrier measured
stop_agent
