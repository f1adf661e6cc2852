# rdma-probe over rxe0, responder and requester in the guest: K one-shot
# probes of N pings each, then persistent mode; exact counts from the probe's
# JSON, the responder's counters and the kernel's `rdma res` view.
K=5
N=10
base=$(res_counts)
log "baseline: $base"
start_responder

# One-shot probes.
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --probes $K --count $N --timeout-ms 5000 --json \
  >"$OUT/oneshot.json" || fail "one-shot probes failed: $(cat "$OUT/oneshot.json")"
# Each probe QP: create, RESET→INIT→RTR→RTS, →ERR, destroy; all rc 0.
expect_json "$OUT/oneshot.json" <<EOF2
probes ok :: $K :: .results.ok
probes failed :: 0 :: [.results | to_entries[] | select(.key != "ok") | .value] | add
RTT samples :: $((K * N)) :: .rtt.count
probes with $N RTTs :: $K :: [.outcomes[] | select((.rtts_ns | length) == $N)] | length
latencies of addr_resolve route_resolve qp_create connect established disconnect :: $K $K $K $K $K $K :: [.steps.addr_resolve, .steps.route_resolve, .steps.qp_create, .steps.connect, .steps.established, .steps.disconnect] | map(.count | tostring) | join(" ")
setup latencies :: $K :: .setup.count
device :: rxe0 :: .devices | join(",")
distinct QP numbers :: $K :: [.outcomes[].qp_num] | unique | length
remote QP numbers :: $K :: [.outcomes[].remote_qp_num | select(. != null)] | length
QP calls of every probe :: create:-:0,modify:INIT:0,modify:RTR:0,modify:RTS:0,modify:ERR:0,destroy:-:0 :: [.outcomes[] | .qp_calls | to_entries[] | .value | map(.kind + ":" + (.target_state // "-") + ":" + (.rc | tostring)) | join(",")] | unique | join(" ")
qp_calls keyed by the probe's qp_num :: $K :: [.outcomes[] | select((.qp_calls | keys) == [(.qp_num | tostring)])] | length
non-positive RTTs or call durations :: 0 :: [.outcomes[] | (.rtts_ns[], (.qp_calls[][] | .duration_ns)) | select(. <= 0)] | length
EOF2
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --probes 2 --count 3 >"$OUT/oneshot-table.txt" || fail "table run failed"
grep -q 't_p50\[usec\]' "$OUT/oneshot-table.txt" || fail "no summary table"
cat "$OUT/oneshot-table.txt" >&2

# Persistent mode: one connection, 3 rounds of 20 pings.
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --probes 3 --count 20 --timeout-ms 5000 --json \
  >"$OUT/persistent.json" || fail "persistent probe failed"
expect_json "$OUT/persistent.json" <<EOF2
persistent rounds ok :: 3 :: .results.ok
persistent RTT samples :: 60 :: .rtt.count
one QP for all rounds :: 1 :: [.outcomes[].qp_num] | unique | length
setup only in round 1 :: false,true,true :: [.outcomes[].reused_connection | tostring] | join(",")
setup latencies :: 1 :: .setup.count
disconnect recorded once :: 1 :: .steps.disconnect.count
EOF2

# While a persistent probe runs, the kernel lists its QP in RTS under the
# QP number the probe reports, connected to the responder's QP. (rdma res
# names the task that created a resource: the responder's connections are
# made on its "rdma-responder" thread.)
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --persistent --count 40 --interval-ms 100 --timeout-ms 5000 --json \
  >"$OUT/persistent-live.json" &
live=$!
rts_qps=".state == \"RTS\" and (.pid == $live or .comm == \"rdma-responder\")"
wait_until 30 res_count_is qp -eq 2 "$rts_qps" ||
  fail "probe and responder QPs not both in RTS"
rdma -j res show qp >"$OUT/res-qp-live.json"
wait "$live" || fail "live persistent probe failed"
read -r kernel_qpn kernel_rqpn responder_qpn < <(jq -r "[(.[] | select(.pid == $live) | .lqpn, .rqpn), (.[] | select(.comm == \"rdma-responder\") | .lqpn)] | map(tostring) | join(\" \")" "$OUT/res-qp-live.json")
expect_json "$OUT/persistent-live.json" <<EOF2
reported qp_num = kernel lqpn :: $kernel_qpn :: .outcomes[0].qp_num
reported remote_qp_num = responder lqpn :: $responder_qpn :: .outcomes[0].remote_qp_num
live probe pings :: 40 :: .rtt.count
EOF2
assert_eq "kernel rqpn of the probe QP = responder lqpn" "$responder_qpn" "$kernel_rqpn"

# Everything freed: only the responder's listening cm_id remains.
wait_res_baseline "after probes (responder listening)" "$(res_counts_plus_listener "$base")"
stop_responder
expect_json "$OUT/responder.json" <<EOF2
connections established :: $((K + 2 + 2)) :: .established
connections closed :: $((K + 2 + 2)) :: .closed
closed by peer (DREQ) :: $((K + 2 + 2)) :: .closed_by_peer
active connections :: 0 :: .active
echoes :: $((K * N + 2 * 3 + 60 + 40)) :: .echoes
EOF2
wait_res_baseline "after responder stop" "$base"
