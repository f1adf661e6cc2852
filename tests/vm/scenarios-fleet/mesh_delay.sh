# netem delay 2ms on the switch's port toward h3 (fleet_switch): every frame
# the switch sends to h3 waits 2 ms, so h1's probes to h3 take 2 ms more per
# round trip (the answers come back through h1's port, undelayed).
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering
#   h1          baseline: 30 s of probes (median RTT to h2 and h3 from the
#               agent's histogram between two scrapes), then ib_send_lat
#               -c UD -x 1 -n 1000 to h3 and to h2; the delay on; the same
#               30 s and ib_send_lat again; the delay off
#               - h1 -> h3: the median's rise is within 20% of 2 ms, or
#                 its rise beyond h1 -> h2's over the same windows is (the
#                 bed's load moves every path of h1 alike: a CI run saw
#                 h1 -> h2 rise by 0.34 ms with no fault on it, and h1 -> h3
#                 by 2.65 ms), or it is within 20% of the rise ib_send_lat
#                 measures side by side (perftest reports half the round
#                 trip: twice its t_typical rise is compared; the emulated
#                 switch's timers add to a netem delay: bench-fleet/switch_faults
#                 saw t_typical +1.2 to +4.8 ms of half round trip for 2 ms);
#               - h1 -> h2 does not move: within 20% of its baseline or
#                 1 ms, whichever is larger, plus the drift ib_send_lat
#                 h1 -> h2 measures over the same two phases (the bed moves
#                 by itself: in bench-fleet/switch_faults, ib_send_lat h1->h2's
#                 t_typical moved by -1.2 to +1.4 ms of half round trip
#                 with no fault on its path)
#               figures in $FLEET_OUT/figures.txt
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h2=$(fleet_host_addr 2) h3=$(fleet_host_addr 3)
WINDOW=30
start_mesh_agent
mesh_wait_answering 120
fleet_barrier answering

# lat_client NAME PEER: ib_send_lat h1 -> PEER; t_typical (us) on stdout.
lat_client() {
  local log=$OUT/ib_send_lat-$1.log
  WAIT_INTERVAL=1 wait_until 60 ib_send_lat -d rxe0 -c UD -x 1 -n 1000 "$2" >"$log" 2>&1 || { cat "$log" >&2; fail "ib_send_lat $1"; }
  log "ib_send_lat h1 -> $2 $1: $(awk '/t_typical/ { getline; print "t_min " $3 " us, t_typical " $5 " us, t_avg " $6 " us" }' "$log")"
  awk '/t_typical/ { getline; print $5 }' "$log"
}

case $HOST_INDEX in
  1)
    fleet_barrier lat-server
    b0=$(scrape base0)
    sleep "$WINDOW"
    b1=$(scrape base1)
    lat_base=$(lat_client h3-base "$h3")
    lat2_base=$(lat_client h2-base "$h2")
    fleet_switch netem 3 delay 2ms >&2
    sleep 2
    d0=$(scrape delay0)
    sleep "$WINDOW"
    d1=$(scrape delay1)
    lat_delay=$(lat_client h3-delay "$h3")
    lat2_delay=$(lat_client h2-delay "$h2")
    fleet_switch clear 3 >&2
    read -r m3_base n3_base <<<"$(hist_quantile "$b0" "$b1" 0.5 "$h3")"
    read -r m3_delay n3_delay <<<"$(hist_quantile "$d0" "$d1" 0.5 "$h3")"
    read -r m2_base n2_base <<<"$(hist_quantile "$b0" "$b1" 0.5 "$h2")"
    read -r m2_delay n2_delay <<<"$(hist_quantile "$d0" "$d1" 0.5 "$h2")"
    {
      echo "mesh_median_rtt_s h1->h3 base $m3_base ($n3_base probes) delay $m3_delay ($n3_delay probes)"
      echo "mesh_median_rtt_s h1->h2 base $m2_base ($n2_base probes) delay $m2_delay ($n2_delay probes)"
      echo "ib_send_lat_typical_us h1->h3 base $lat_base delay $lat_delay (half round trip)"
      echo "ib_send_lat_typical_us h1->h2 base $lat2_base delay $lat2_delay (half round trip)"
    } | tee -a "$FLEET_OUT/figures.txt" >&2
    rise_mesh=$(awk -v a="$m3_base" -v b="$m3_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_ctl=$(awk -v a="$m2_base" -v b="$m2_delay" 'BEGIN { printf "%.6f", b - a }')
    rise_diff=$(awk -v m="$rise_mesh" -v c="$rise_ctl" 'BEGIN { printf "%.6f", m - c }')
    rise_lat=$(awk -v a="$lat_base" -v b="$lat_delay" 'BEGIN { printf "%.6f", 2 * (b - a) / 1e6 }')
    log "round-trip rise with netem delay 2ms toward h3: mesh median +$rise_mesh s (h1 -> h2 +$rise_ctl s, difference +$rise_diff s), ib_send_lat (2 x t_typical) +$rise_lat s"
    echo "rtt_rise_s h1->h3 mesh $rise_mesh h1->h2 mesh $rise_ctl difference $rise_diff ib_send_lat $rise_lat" >>"$FLEET_OUT/figures.txt"
    # within 20% of the 2 ms asked (alone or beyond the undelayed path's
    # rise), or of the rise ib_send_lat measured on the same path (its
    # t_typical rise has ranged from +1.2 to +4.8 ms of half round trip for
    # the same 2 ms: one run measured +3.93 ms of round trip where the probes
    # saw +1.74)
    awk -v m="$rise_mesh" -v c="$rise_diff" -v l="$rise_lat" '
      function near(x, want) { x -= want; if (x < 0) x = -x; return x <= 0.2 * want }
      BEGIN { exit !(near(m, 0.002) || near(c, 0.002) || (l > 0.001 && near(m, l))) }' ||
      fail "h1 -> h3 median rose by $rise_mesh s ($rise_diff s beyond h1 -> h2's), ib_send_lat by $rise_lat s: within 20% of neither 2 ms nor ib_send_lat's rise"
    log "ok: h1 -> h3 rise within 20% of 2 ms (alone or beyond h1 -> h2's) or of ib_send_lat's"
    # the bed's own drift on this path, as ib_send_lat saw it (round trip)
    drift2=$(awk -v a="$lat2_base" -v b="$lat2_delay" 'BEGIN { d = 2 * (b - a) / 1e6; if (d < 0) d = -d; printf "%.6f", d }')
    awk -v a="$m2_base" -v b="$m2_delay" -v drift="$drift2" 'BEGIN { d = b - a; if (d < 0) d = -d; bound = 0.2 * a; if (bound < 0.001) bound = 0.001; exit !(d <= bound + drift) }' ||
      fail "h1 -> h2 median moved from $m2_base to $m2_delay s with the delay on h3's port (ib_send_lat's drift on that path: $drift2 s)"
    log "ok: h1 -> h2 median $m2_base -> $m2_delay s"
    mesh_expect_no_loss "$b0" "$d1" "$h2"
    # Putting netem on h3's port replaces the port's qdisc, and the frames
    # queued in the one replaced are dropped (a run lost 1 probe of 910):
    # a probe or two, not more.
    lost3=$(($(mesh_count "$d1" qpwatch_mesh_probes_lost_total "$h3") - $(mesh_count "$b0" qpwatch_mesh_probes_lost_total "$h3")))
    [ "$lost3" -le 2 ] || fail "h1 -> $h3: $lost3 probes lost with a delay only"
    log "ok: h1 -> $h3: $lost3 lost (at most 2: those queued at the qdisc change)"
    ;;
  2 | 3)
    (ib_send_lat -d rxe0 -c UD -x 1 -n 1000 && ib_send_lat -d rxe0 -c UD -x 1 -n 1000) >"$OUT/ib_send_lat-server.log" 2>&1 &
    server=$!
    fleet_barrier lat-server
    wait "$server" || { cat "$OUT/ib_send_lat-server.log" >&2; fail "ib_send_lat server"; }
    ;;
  *) fleet_barrier lat-server ;;
esac
fleet_barrier measured
stop_agent
