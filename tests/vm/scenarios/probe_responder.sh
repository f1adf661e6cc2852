# The responder under concurrent requesters and requesters that vanish: a
# killed requester (kernel sends the DREQ) and a frozen one (no DREQ: only the
# idle timeout frees it) must not disturb the others, and every connection's
# resources are freed.
base=$(res_counts)
log "baseline: $base"
start_responder --idle-timeout-ms 4000
listening=$(res_counts_plus_listener "$base")
P=4
K=3
N=10

# P concurrent requester processes, K one-shot probes of N pings each.
pids=()
for i in $(seq 1 $P); do
  "$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --probes $K --count $N --timeout-ms 10000 --json >"$OUT/concurrent-$i.json" &
  pids+=($!)
done
for i in $(seq 1 $P); do
  wait "${pids[i - 1]}" || fail "concurrent requester $i failed: $(cat "$OUT/concurrent-$i.json")"
done
jq -s '{ok: (map(.results.ok) | add), rtts: (map(.rtt.count) | add)}' "$OUT"/concurrent-*.json >"$OUT/concurrent.json"
expect_json "$OUT/concurrent.json" <<EOF2
concurrent probes ok :: $((P * K)) :: .ok
concurrent RTT samples :: $((P * K * N)) :: .rtts
EOF2
wait_res_baseline "after concurrent probes" "$listening"

# A requester frozen mid-connection (no DREQ ever comes) and one killed
# mid-connection, while a third keeps probing.
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --count 1000 --interval-ms 50 --timeout-ms 5000 >/dev/null 2>&1 &
frozen=$!
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --count 1000 --interval-ms 50 --timeout-ms 5000 >/dev/null 2>&1 &
killed=$!
wait_until 60 qp_in_rts $frozen || fail "frozen requester not connected"
wait_until 60 qp_in_rts $killed || fail "killed requester not connected"
kill -STOP $frozen
kill_wait $killed
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --probes 2 --count $N --timeout-ms 5000 --json >"$OUT/during.json" ||
  fail "probe failed while a requester is frozen: $(cat "$OUT/during.json")"
expect_json "$OUT/during.json" <<EOF2
probes ok next to a frozen requester :: 2 :: .results.ok
EOF2
# The responder's side of the frozen requester's connection goes after the
# idle timeout (4 s); the frozen process still holds its own QP.
wait_until 30 res_count_is qp -eq 0 '.comm == "rdma-responder"' ||
  fail "responder kept the frozen requester's connection"
log "ok: responder dropped the frozen requester's connection"
kill_wait $frozen
wait_res_baseline "after the vanished requesters" "$listening"

# Persistent mode survives a responder restart: round 1 connects, the
# responder is stopped (SIGTERM: it disconnects its connections) and started
# again, round 2 finds the peer gone (DREQ), round 3 connects anew, round 4
# reuses that connection.
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --probes 4 --count 5 --probe-interval-ms 8000 \
  --timeout-ms 5000 --json >"$OUT/restart.json" &
restarting=$!
wait_until 30 qp_in_rts $restarting || fail "restart: probe not connected"
stop_responder
mv "$OUT/responder.json" "$OUT/responder-1.json"
start_responder
wait "$restarting" && fail "restart: probe reported no failure" || true
expect_json "$OUT/restart.json" <<EOF2
restart: results by round :: ok,error,ok,ok :: [.outcomes[].result] | join(",")
restart: reused connection by round :: false,true,false,true :: [.outcomes[].reused_connection | tostring] | join(",")
restart: round 2 error :: ping: the peer disconnected (RDMA_CM_EVENT_DISCONNECTED) :: .outcomes[1].error
restart: QPs used :: 2 :: [.outcomes[].qp_num] | unique | length
restart: pings :: 15 :: .rtt.count
EOF2
wait_res_baseline "after the restart probe" "$listening"

stop_responder
expect_json "$OUT/responder-1.json" <<EOF2
connections established :: $((P * K + 2 + 2 + 1)) :: .established
connections closed :: $((P * K + 2 + 2 + 1)) :: .closed
closed by peer :: $((P * K + 1 + 2)) :: .closed_by_peer
closed on idle timeout :: 1 :: .closed_timeout
active :: 0 :: .active
EOF2
expect_json "$OUT/responder.json" <<EOF2
restarted responder: established :: 1 :: .established
restarted responder: echoes :: 10 :: .echoes
restarted responder: active :: 0 :: .active
EOF2
wait_res_baseline "after responder stop" "$base"
