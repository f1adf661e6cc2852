# Benchmark (prints figures, asserts only that everything ran): perftest's
# ib_send_lat over rdma_cm (-R) against `qpwatch probe --persistent` (the agent's probe path, rdma-probe's library), same
# message size, server and client on rxe0, back to back in one VM.
#
# ib_send_lat reports one-way latency: the time between two consecutive
# posts of its ping-pong loop divided by 2 (perftest print_report_lat,
# rtt_factor = 2 for SEND). rdma-probe reports round trips, so the
# comparison is rdma-probe's p50 RTT against 2 x ib_send_lat's t_typical.
# ib_send_lat busy-polls its CQ on both sides; rdma-probe is measured with
# completion events (its default), with --busy-poll on both sides, and with
# busy polling on one side only (to attribute the cost of event mode).
# Under TCG the figures move with whatever else the host runs, so the tools
# run interleaved, ROUNDS times, and each round's ratio is printed next to the
# ratio of the best medians.
SIZE=${BENCH_SIZE:-64}
ITERS=${BENCH_ITERS:-3000}
ROUNDS=${BENCH_ROUNDS:-3}

# perftest converts cycles to microseconds with a CPU MHz it samples at start;
# under TCG that sampling sometimes fails (it then prints "inf"): retry.
send_lat_median_rtt() { # prints 2 x t_typical
  local attempt typical=
  for attempt in 1 2 3 4; do
    ib_send_lat -R -F -s "$SIZE" -n "$ITERS" >"$OUT/ib_send_lat-server.log" 2>&1 &
    local server=$!
    wait_listener ib_send_lat
    ib_send_lat -R -F -s "$SIZE" -n "$ITERS" "$RXE_ADDR" >"$OUT/ib_send_lat-client.log" 2>&1 ||
      { cat "$OUT/ib_send_lat-client.log" >&2; fail "ib_send_lat client failed"; }
    wait "$server" || fail "ib_send_lat server failed"
    cat "$OUT/ib_send_lat-client.log" >>"$OUT/ib_send_lat-all.log"
    # columns: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    typical=$(awk -v s="$SIZE" '$1 == s && NF >= 7 && $5 !~ /inf|nan/ && $5 + 0 > 0 { print $5 }' "$OUT/ib_send_lat-client.log" | tail -n1)
    [ -n "$typical" ] && break
    log "ib_send_lat attempt $attempt: no finite t_typical (CPU MHz sampling failed), retrying"
    sleep 1
  done
  [ -n "$typical" ] || fail "no finite t_typical in the ib_send_lat output"
  awk -v t="$typical" 'BEGIN { printf "%.2f", 2 * t }'
}

# probe_median_rtt NAME RESPONDER_FLAG PROBE_FLAG: prints the p50 RTT in us.
probe_median_rtt() {
  start_responder $2
  # the requester is the agent's own CLI (same library as rdma-probe)
  "$BIN/qpwatch" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --count 1 --pings "$ITERS" --size "$SIZE" \
    --timeout 10 $3 --json >"$OUT/$1.json" || fail "$1: probe failed"
  stop_responder
  mv "$OUT/responder.json" "$OUT/$1-responder.json"
  local n
  n=$(jq -r '.rtt.count' "$OUT/$1.json")
  [ "$n" = "$ITERS" ] || fail "$1: $n RTT samples, expected $ITERS"
  jq -r '.rtt.p50_ns / 1000 | . * 100 | round / 100' "$OUT/$1.json"
}

say "benchmark: $SIZE-byte SEND ping-pong over rxe0 (QEMU TCG guest), $ITERS iterations per run, $ROUNDS rounds"
say "  (ib_send_lat reports RTT/2: its median RTT is 2 x t_typical)"
lat=() busy=() events=()
for r in $(seq 1 "$ROUNDS"); do
  l=$(send_lat_median_rtt)
  b=$(probe_median_rtt "probe-busy-$r" --busy-poll --busy-poll)
  e=$(probe_median_rtt "probe-events-$r" "" "")
  lat+=("$l") busy+=("$b") events+=("$e")
  say "round $r: median RTT ib_send_lat $l us | rdma-probe busy-poll $b us (ratio $(ratio "$b" "$l")) | rdma-probe events $e us (ratio $(ratio "$e" "$l"))"
done
req_busy=$(probe_median_rtt probe-requester-busy "" --busy-poll)
resp_busy=$(probe_median_rtt probe-responder-busy --busy-poll "")
best_lat=$(min "${lat[@]}")
best_busy=$(min "${busy[@]}")
best_events=$(min "${events[@]}")
say "best medians: ib_send_lat -R $best_lat us | rdma-probe --busy-poll $best_busy us (ratio $(ratio "$best_busy" "$best_lat")) | rdma-probe events $best_events us (ratio $(ratio "$best_events" "$best_lat"))"
say "event-mode attribution: requester busy + responder events $req_busy us, requester events + responder busy $resp_busy us"
if awk -v a="$best_busy" -v b="$best_lat" 'BEGIN { exit !(a <= 1.10 * b) }'; then
  say "goal (busy-poll median within 10% of ib_send_lat): met"
else
  say "goal (busy-poll median within 10% of ib_send_lat): NOT met"
fi
