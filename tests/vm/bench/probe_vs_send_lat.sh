# Benchmark (prints figures, asserts only that everything ran): perftest's
# ib_send_lat over rdma_cm (-R) against rdma-probe's persistent mode, same
# message size, server and client on rxe0, back to back in one VM.
#
# ib_send_lat reports one-way latency: the time between two consecutive
# posts of its ping-pong loop divided by 2 (perftest print_report_lat,
# rtt_factor = 2 for SEND). rdma-probe reports round trips, so the
# comparison is rdma-probe's p50 RTT against 2 x ib_send_lat's t_typical.
# ib_send_lat busy-polls its CQ on both sides; rdma-probe is measured with
# completion events (its default), with --busy-poll on both sides, and with
# busy polling on one side only (to attribute the cost of event mode).
source "$REPO/rdma-probe/tests/vm_helpers.sh"
SIZE=${BENCH_SIZE:-64}
ITERS=${BENCH_ITERS:-3000}
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary" >&2; }

listening_comm() { [ "$(res_count cm_id ".state == \"LISTEN\" and .comm == \"$1\"")" -ge 1 ]; }

# perftest converts cycles to microseconds with a CPU MHz it samples at start;
# under TCG that sampling sometimes fails (it then prints "inf"): retry.
typical=
for attempt in 1 2 3 4; do
  ib_send_lat -R -F -s "$SIZE" -n "$ITERS" >"$OUT/ib_send_lat-server.log" 2>&1 &
  server=$!
  wait_until 30 listening_comm ib_send_lat || fail "ib_send_lat server not listening"
  ib_send_lat -R -F -s "$SIZE" -n "$ITERS" "$RXE_ADDR" >"$OUT/ib_send_lat-client.log" 2>&1 ||
    { cat "$OUT/ib_send_lat-client.log" >&2; fail "ib_send_lat client failed"; }
  wait "$server" || fail "ib_send_lat server failed"
  cat "$OUT/ib_send_lat-client.log" >&2
  # columns: #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
  typical=$(awk -v s="$SIZE" '$1 == s && NF >= 7 && $5 + 0 > 0 && $5 !~ /inf|nan/ { print $5 }' "$OUT/ib_send_lat-client.log" | tail -n1)
  [ -n "$typical" ] && break
  log "ib_send_lat attempt $attempt: no finite t_typical (CPU MHz sampling failed), retrying"
  sleep 1
done
[ -n "$typical" ] || fail "no finite t_typical in the ib_send_lat output"
send_lat_rtt=$(awk -v t="$typical" 'BEGIN { printf "%.2f", 2 * t }')

probe_run() { # NAME RESPONDER_FLAG PROBE_FLAG
  start_responder $2
  "$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --count "$ITERS" --size "$SIZE" \
    --timeout-ms 10000 $3 --json >"$OUT/$1.json" || fail "$1: probe failed"
  stop_responder
  mv "$OUT/responder.json" "$OUT/$1-responder.json"
  jq -r '.rtt | [.p50_ns, .min_ns, .p99_ns, .count] | map(tostring) | join(" ")' "$OUT/$1.json"
}
read -r events_p50 events_min events_p99 events_n < <(probe_run probe-events "" "")
read -r busy_p50 busy_min busy_p99 busy_n < <(probe_run probe-busy --busy-poll --busy-poll)
# Where the event-mode cost is: busy polling on one side only.
read -r req_busy_p50 _ _ _ < <(probe_run probe-requester-busy "" --busy-poll)
read -r resp_busy_p50 _ _ _ < <(probe_run probe-responder-busy --busy-poll "")
[ "$events_n" = "$ITERS" ] && [ "$busy_n" = "$ITERS" ] || fail "probe RTT sample counts $events_n/$busy_n, expected $ITERS"

us() { awk -v ns="$1" 'BEGIN { printf "%.2f", ns / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / 1000 / b }'; }
say "benchmark: $SIZE-byte SEND ping-pong over rxe0 (QEMU TCG guest), $ITERS iterations each"
say "ib_send_lat -R        : t_typical $typical us one-way -> median RTT $send_lat_rtt us"
say "rdma-probe (events)   : median RTT $(us "$events_p50") us (min $(us "$events_min"), p99 $(us "$events_p99")) ratio $(ratio "$events_p50" "$send_lat_rtt")"
say "rdma-probe (busy-poll): median RTT $(us "$busy_p50") us (min $(us "$busy_min"), p99 $(us "$busy_p99")) ratio $(ratio "$busy_p50" "$send_lat_rtt")"
say "  attribution: requester busy + responder events $(us "$req_busy_p50") us, requester events + responder busy $(us "$resp_busy_p50") us"
within() { awk -v a="$1" -v b="$send_lat_rtt" 'BEGIN { exit !(a / 1000 <= 1.10 * b) }'; }
if within "$busy_p50"; then say "goal (busy-poll median within 10% of ib_send_lat): met"; else say "goal (busy-poll median within 10% of ib_send_lat): NOT met"; fi
