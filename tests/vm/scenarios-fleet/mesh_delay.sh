# netem delay 2ms on the switch's port toward h3 (fleet_switch): every frame
# the switch sends to h3 waits 2 ms, so h1's probes to h3 take 2 ms more per
# round trip (the answers come back through h1's port, undelayed).
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering
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
#               drift out. Then ib_send_lat -c UD -x 1 -n 1000 to h3 with the
#               delay, and again without it.
#               - h1 -> h3: the median's rise is within 20% of 2 ms, or its
#                 rise beyond h1 -> h2's over the same windows is, or it is
#                 within 20% of the delay perftest saw the switch add: the
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
start_mesh_agent
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
    fleet_switch netem 3 delay 0ms >&2
    sleep 2
    base=() delayed=()
    for ((cycle = 1; cycle <= CYCLES; cycle++)); do
      f=$(scrape "base$cycle-0")
      base+=("$f")
      sleep "$WINDOW"
      f=$(scrape "base$cycle-1")
      base+=("$f")
      fleet_switch netem 3 delay 2ms >&2
      sleep 1
      f=$(scrape "delay$cycle-0")
      delayed+=("$f")
      sleep "$WINDOW"
      f=$(scrape "delay$cycle-1")
      delayed+=("$f")
      [ "$cycle" = "$CYCLES" ] || { fleet_switch netem 3 delay 0ms >&2 && sleep 1; }
    done
    lat=$(lat_client delay)
    read -r lat_delay lat_delay_min <<<"$lat"
    fleet_switch netem 3 delay 0ms >&2
    lat=$(lat_client base)
    read -r lat_base lat_base_min <<<"$lat"
    fleet_switch clear 3 >&2
    median() { hist_quantile_windows 0.5 "$1" qpwatch_mesh_probe_rtt_seconds "${@:2}"; }
    read -r m3_base n3_base <<<"$(median "$h3" "${base[@]}")"
    read -r m3_delay n3_delay <<<"$(median "$h3" "${delayed[@]}")"
    read -r m2_base n2_base <<<"$(median "$h2" "${base[@]}")"
    read -r m2_delay n2_delay <<<"$(median "$h2" "${delayed[@]}")"
    {
      for ((cycle = 0; cycle < CYCLES; cycle++)); do
        w=("${base[@]:2*cycle:2}") x=("${delayed[@]:2*cycle:2}")
        echo "cycle $((cycle + 1)) mesh_median_rtt_s h1->h3 base $(median "$h3" "${w[@]}" | cut -d' ' -f1) delay $(median "$h3" "${x[@]}" | cut -d' ' -f1)" \
          "h1->h2 base $(median "$h2" "${w[@]}" | cut -d' ' -f1) delay $(median "$h2" "${x[@]}" | cut -d' ' -f1)"
      done
      echo "mesh_median_rtt_s h1->h3 base $m3_base ($n3_base probes) delay $m3_delay ($n3_delay probes)"
      echo "mesh_median_rtt_s h1->h2 base $m2_base ($n2_base probes) delay $m2_delay ($n2_delay probes)"
      echo "ib_send_lat_us h1->h3 t_typical base $lat_base delay $lat_delay, t_min base $lat_base_min delay $lat_delay_min (half round trip)"
    } | tee -a "$FLEET_OUT/figures.txt" >&2
    rise_mesh=$(awk -v a="$m3_base" -v b="$m3_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_ctl=$(awk -v a="$m2_base" -v b="$m2_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_diff=$(awk -v m="$rise_mesh" -v c="$rise_ctl" 'BEGIN { printf "%.6f", m - c }')
    rise_lat=$(awk -v a="$lat_base" -v b="$lat_delay" 'BEGIN { printf "%.6f", 2 * (b - a) / 1e6 }')
    rise_lat_min=$(awk -v a="$lat_base_min" -v b="$lat_delay_min" 'BEGIN { printf "%.6f", 2 * (b - a) / 1e6 }')
    log "round-trip rise with netem delay 2ms toward h3: mesh median +$rise_mesh s (h1 -> h2 +$rise_ctl s, difference +$rise_diff s), ib_send_lat +$rise_lat_min s (2 x t_min), +$rise_lat s (2 x t_typical)"
    echo "rtt_rise_s h1->h3 mesh $rise_mesh h1->h2 mesh $rise_ctl difference $rise_diff ib_send_lat_t_min $rise_lat_min ib_send_lat_t_typical $rise_lat" >>"$FLEET_OUT/figures.txt"
    # within 20% of the 2 ms asked (alone or beyond the undelayed path's
    # rise), or of the delay perftest saw the switch add
    awk -v m="$rise_mesh" -v c="$rise_diff" -v l="$rise_lat_min" '
      function near(x, want) { x -= want; if (x < 0) x = -x; return x <= 0.2 * want }
      BEGIN { exit !(near(m, 0.002) || near(c, 0.002) || (l > 0.001 && near(m, l))) }' ||
      fail "h1 -> h3 median rose by $rise_mesh s ($rise_diff s beyond h1 -> h2's), ib_send_lat by $rise_lat_min s: within 20% of neither 2 ms nor the delay perftest saw"
    log "ok: h1 -> h3 rise within 20% of 2 ms (alone or beyond h1 -> h2's) or of the delay perftest saw"
    awk -v a="$m2_base" -v b="$m2_delay" 'BEGIN { d = b - a; if (d < 0) d = -d; bound = 0.2 * a; if (bound < 0.001) bound = 0.001; exit !(d <= bound) }' ||
      fail "h1 -> h2 median moved from $m2_base to $m2_delay s with the delay on h3's port"
    log "ok: h1 -> h2 median $m2_base -> $m2_delay s"
    mesh_expect_no_loss "${base[0]}" "${delayed[-1]}" "$h2" "$h3"
    ;;
  3)
    (ib_send_lat -d rxe0 -c UD -x 1 -n 1000 && ib_send_lat -d rxe0 -c UD -x 1 -n 1000) >"$OUT/ib_send_lat-server.log" 2>&1 &
    server=$!
    fleet_barrier lat-server
    wait "$server" || { cat "$OUT/ib_send_lat-server.log" >&2; fail "ib_send_lat server"; }
    ;;
  *) fleet_barrier lat-server ;;
esac
fleet_barrier measured
stop_agent
