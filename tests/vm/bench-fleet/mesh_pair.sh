# The UD probe mesh across the link, next to perftest's UD latency:
#
#   h1   qpwatch responder (RC and UD) on its link address ... barrier responder
#   h2   qpwatch probe --ud --target h1 --count 300 --interval-ms 10: all
#        answered, none lost, one UD QP on each side ........ barrier probed
#   h1/h2  ib_send_lat -c UD -x 1 -n 1000 (server h1, client h2) right after:
#        both medians in the log and in $FLEET_OUT/mesh_pair.txt (the probe's
#        RTT p50 / 2 against ib_send_lat's t_typical, which is half a round
#        trip: figures, not assertions) ........................ barrier perftest
#   h1   the responder stops with exit 0 having answered 300 UD probes
# vm-timeout: 600
[ "$FLEET_HOSTS" -ge 2 ] || fail "needs two hosts"
h1=$(fleet_host_addr 1)
N=300
case $HOST_INDEX in
  1)
    "$BIN/qpwatch" responder --listen "$HOST_ADDR:9723" >"$OUT/responder.log" 2>&1 &
    responder=$!
    on_exit "kill_wait $responder"
    wait_until 60 res_count_is cm_id -eq 2 ".state == \"LISTEN\" and .pid == $responder" ||
      fail "responder not listening in both port spaces"
    fleet_barrier responder
    fleet_barrier probed
    assert_eq "h1: UD QPs of the responder" 1 "$(res_count qp '.type == "UD" and .comm == "qpwatch-mesh"')"
    ib_send_lat -d rxe0 -c UD -x 1 -n 1000 >"$OUT/ib_send_lat-server.log" 2>&1 &
    server=$!
    wait_until 30 bash -c "ss -Hltn 'sport = :18515' | grep -q ." || fail "ib_send_lat server not listening"
    fleet_barrier perftest-listening
    wait "$server" || { cat "$OUT/ib_send_lat-server.log" >&2; fail "ib_send_lat server failed"; }
    fleet_barrier perftest
    terminate $responder
    [ "$EXIT_RC" -eq 0 ] || fail "responder exited with $EXIT_RC on SIGTERM"
    grep -q "ud_answers=$N" "$OUT/responder.log" || fail "responder did not answer $N UD probes: $(tail -3 "$OUT/responder.log")"
    ;;
  2)
    fleet_barrier responder
    "$BIN/qpwatch" probe --ud --target "$h1" --count $N --interval-ms 10 --json >"$OUT/ud.json" 2>"$OUT/ud.err" &
    probe=$!
    # rdma res names the thread that made the QP: the mesh's.
    wait_until 60 res_count_is qp -eq 1 '.type == "UD" and .comm == "qpwatch-mesh"' || fail "no UD QP on h2"
    wait $probe || fail "UD probe failed: $(cat "$OUT/ud.json" "$OUT/ud.err")"
    expect_json "$OUT/ud.json" <<EOF2
probes sent :: $N :: .sent
probes answered :: $N :: .answered
probes lost :: 0 :: .lost
UD QPs the probe created :: 1 :: .qps_created
EOF2
    fleet_barrier probed
    fleet_barrier perftest-listening
    ib_send_lat -d rxe0 -c UD -x 1 -n 1000 "$h1" >"$OUT/ib_send_lat-client.log" 2>&1 ||
      { cat "$OUT/ib_send_lat-client.log" >&2; fail "ib_send_lat client failed"; }
    typical=$(awk '/t_typical/ { getline; print $5 }' "$OUT/ib_send_lat-client.log")
    p50_ns=$(jq .rtt.p50_ns "$OUT/ud.json")
    half_us=$(awk -v n="$p50_ns" 'BEGIN { printf "%.2f", n / 2000 }')
    ratio=$(awk -v a="$half_us" -v b="$typical" 'BEGIN { printf "%.3f", a / b }')
    log "UD mesh probe h2 -> h1: RTT p50 $(awk -v n="$p50_ns" 'BEGIN { printf "%.2f", n / 1000 }') us, half $half_us us; responder delay p50 $(jq '.responder_delay.p50_ns / 1000' "$OUT/ud.json") us"
    log "ib_send_lat -c UD -x 1 h2 -> h1: t_typical $typical us; probe half-RTT / t_typical = $ratio"
    {
      echo "mesh_probe_rtt_p50_us $(awk -v n="$p50_ns" 'BEGIN { printf "%.2f", n / 1000 }')"
      echo "mesh_probe_half_rtt_p50_us $half_us"
      echo "ib_send_lat_ud_typical_us $typical"
      echo "ratio $ratio"
    } >"$FLEET_OUT/mesh_pair.txt"
    fleet_barrier perftest
    ;;
  *)
    for b in responder probed perftest-listening perftest; do fleet_barrier $b; done
    ;;
esac
