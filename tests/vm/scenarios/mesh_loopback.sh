# The UD probe mesh in one guest: `qpwatch responder` answers UD probes (its
# mesh listens in RDMA_PS_UDP next to the RC listener), `qpwatch probe --ud`
# resolves it by SIDR and probes it; exact counts from the probe's JSON, one
# UD QP per process whatever the count (`rdma res`), and an unresolvable
# target fails naming the target and the step.
PORT=9733
N=200
ud_qps() { res_count qp '.type == "UD"'; }
base=$(res_counts)
log "baseline: $base (UD QPs: $(ud_qps))"
[ "$(ud_qps)" -eq 0 ] || fail "UD QPs before the run"

"$BIN/qpwatch" responder --listen "$RXE_ADDR:$PORT" >"$OUT/responder.log" 2>&1 &
responder=$!
on_exit "kill_wait $responder"
wait_until 30 res_count_is cm_id -eq 2 ".state == \"LISTEN\" and .pid == $responder" ||
  fail "responder not listening in both port spaces"

"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:$PORT" --count $N --interval-ms 10 --json \
  >"$OUT/ud.json" 2>"$OUT/ud.err" &
probe=$!
max=0
samples=0
while kill -0 $probe 2>/dev/null; do
  n=$(ud_qps)
  samples=$((samples + 1))
  [ "$n" -le "$max" ] || max=$n
  sleep 0.2
done
wait $probe || fail "UD probe failed: $(cat "$OUT/ud.json" "$OUT/ud.err")"
log "UD QPs during the run: at most $max ($samples samples)"
assert_eq "UD QPs at most during $N probes (requester + responder)" 2 "$max"
expect_json "$OUT/ud.json" <<EOF2
probes sent :: $N :: .sent
probes answered :: $N :: .answered
probes lost :: 0 :: .lost
sends failed :: 0 :: .send_failed
RTT samples :: $N :: .rtt.count
UD QPs the probe created :: 1 :: .qps_created
device :: rxe0 :: .device
no resolve error :: null :: .error
messages dropped :: 0 :: [.dropped[]] | add // 0
EOF2
log "UD RTT p50 $(jq .rtt.p50_ns "$OUT/ud.json") ns, responder delay p50 $(jq .responder_delay.p50_ns "$OUT/ud.json") ns"

# The responder keeps one UD QP across probe runs (made on its
# "qpwatch-mesh" thread, which rdma res names): the only UD QP left once the
# probe exited, the one the probe was answered from; a second run reuses it.
wait_until 30 res_count_is qp -eq 1 '.type == "UD"' || fail "UD QPs left after the probe: $(ud_qps)"
responder_ud_qp() { rdma -j res show qp | jq -r '[.[] | select(.type == "UD" and .comm == "qpwatch-mesh") | .lqpn] | join(",")'; }
responder_qp=$(responder_ud_qp)
assert_eq "remote QP reported = responder's UD QP" "$responder_qp" "$(jq .remote_qp_num "$OUT/ud.json")"
"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:$PORT" --count 20 --interval-ms 5 >"$OUT/ud-table.txt" ||
  fail "second UD probe failed: $(cat "$OUT/ud-table.txt")"
cat "$OUT/ud-table.txt" >&2
grep -q 't_p50\[usec\]' "$OUT/ud-table.txt" || fail "no summary table"
wait_until 30 res_count_is qp -eq 1 '.type == "UD"' || fail "UD QPs left after the second probe"
assert_eq "responder's UD QP after a second run" "$responder_qp" "$(responder_ud_qp)"

# Nobody at .250: no exit 0, and the error names the target and the step.
nobody="${RXE_ADDR%.*}.250"
rc=0
"$BIN/qpwatch" probe --ud --target "$nobody" --count 5 --timeout 2 --json >"$OUT/nobody.json" 2>"$OUT/nobody.err" || rc=$?
cat "$OUT/nobody.err" >&2
[ $rc -ne 0 ] || fail "probe of $nobody exited 0"
grep -E "error: resolving $nobody:9723 failed: (addr_resolve|route_resolve|connect):" "$OUT/nobody.err" >/dev/null ||
  fail "error line does not name $nobody and the step"
expect_json "$OUT/nobody.json" <<EOF2
probes sent to nobody :: 0 :: .sent
EOF2

terminate $responder
[ "$EXIT_RC" -eq 0 ] || fail "responder exited with $EXIT_RC on SIGTERM"
grep -q "ud_answers=$((N + 20))" "$OUT/responder.log" || fail "responder did not count $((N + 20)) UD answers: $(tail -3 "$OUT/responder.log")"
wait_res_baseline "after the responder stopped" "$base"
