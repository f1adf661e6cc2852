# The agent's responders against strangers (issue 18): two sources on the
# dummy netdev, 198.18.0.1 (legitimate) and 198.18.0.5 (the stranger).
# - RC: the stranger opens connections until refused (exactly
#   max_connections_per_source, the next one rejected) and holds them idle;
#   the legitimate source still probes; after idle_timeout_seconds the held
#   connections are gone and their requesters see DISCONNECTED.
# - Malformed messages of each kind over RC and UD are counted by reason,
#   each exactly once, and a normal probe succeeds after them.
# - UD: a burst above answer_rate_per_source from the stranger is partly
#   refused (every probe answered or counted), while the legitimate source
#   probing at the same time is answered in full.
# - responder.allow, applied by SIGHUP: the stranger's RC connect request and
#   its SIDR request are refused and counted; the legitimate source probes on.
STRANGER=198.18.0.5
PER_SOURCE=3
IDLE=25 # longer than the steps below take under TCG with the connections held (8 s alone in a guest)
RATE=20
ip addr add "$STRANGER/24" dev qpw0
on_exit "ip addr del $STRANGER/24 dev qpw0"
wait_until 20 bash -c "rdma -j link show rxe0/1 >/dev/null && grep -qi 'ffff:c612:0005' /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null" ||
  log "no GID file names $STRANGER yet (rxe adds it asynchronously)"

cfg=$OUT/qpwatch.toml
write_config() { # [ALLOW_LINE]
  cat >"$cfg" <<EOF
listen = "$AGENT_ADDR"
[responder]
listen = "$RXE_ADDR:9723"
max_connections_per_source = $PER_SOURCE
idle_timeout_seconds = $IDLE
${1:-}
[mesh]
listen = "$RXE_ADDR:9723"
answer_rate_per_source = $RATE
EOF
}
write_config
"$BIN/qpwatch" check-config "$cfg" || fail "test config invalid"
start_agent --config "$cfg"
wait_until 60 res_count_is cm_id -ge 2 '.state == "LISTEN"' ||
  fail "agent's responders not listening in both port spaces: $(rdma res show cm_id)"
rdma res show cm_id >&2
before=$(scrape before)
for reason in not_allowed max_connections per_source; do
  assert_eq "refused{$reason} exported at 0" 0 "$(metric "$before" "qpwatch_responder_refused_total{reason=\"$reason\"}")"
done

# --- RC: a stranger holds connections until refused
holders=()
for i in $(seq 1 $PER_SOURCE); do
  "$BIN/rdma-probe" probe --target "$RXE_ADDR:9723" --source "$STRANGER" --persistent --probes 2 --count 1 \
    --probe-interval-ms $(((IDLE + 10) * 1000)) --timeout-ms 5000 --json >"$OUT/hold-$i.json" 2>"$OUT/hold-$i.log" &
  holders+=($!)
done
wait_for_metric qpwatch_responder_active_connections $PER_SOURCE 60 ||
  fail "the stranger's $PER_SOURCE connections not established"
"$BIN/rdma-probe" probe --target "$RXE_ADDR:9723" --source "$STRANGER" --count 1 --timeout-ms 5000 --json \
  >"$OUT/refused.json" 2>"$OUT/refused.log" && fail "connection $((PER_SOURCE + 1)) of the stranger accepted"
expect_json "$OUT/refused.json" <<EOF2
stranger's connection $((PER_SOURCE + 1)) :: rejected :: .outcomes[0].result
EOF2
held=$(scrape held)
assert_eq "refused{per_source}" 1 "$(delta "$before" "$held" 'qpwatch_responder_refused_total{reason="per_source"}')"
assert_eq "refused, all reasons" 1 "$(delta "$before" "$held" qpwatch_responder_refused_total)"
assert_eq "connections rejected" 1 "$(delta "$before" "$held" 'qpwatch_responder_connections_total{event="rejected"}')"
"$BIN/qpwatch" probe --target "$RXE_ADDR:9723" --source "$RXE_ADDR" --count 2 --pings 3 --json >"$OUT/legit.json" ||
  fail "legitimate probe failed next to the held connections: $(cat "$OUT/legit.json")"
expect_json "$OUT/legit.json" <<EOF2
legitimate probes ok while the stranger holds $PER_SOURCE :: 2 :: .results.ok
EOF2
after_legit=$(scrape after-legit)
assert_eq "held connections after the legitimate probes" $PER_SOURCE "$(metric "$after_legit" qpwatch_responder_active_connections)"
assert_eq "closed{timeout} before the idle timeout" 0 "$(delta "$held" "$after_legit" 'qpwatch_responder_closed_total{reason="timeout"}')"
start=$SECONDS
wait_for_metric qpwatch_responder_active_connections 0 $((IDLE + 30)) || fail "held connections not closed on idle timeout"
log "held connections closed $((SECONDS - start)) s after the legitimate probe (idle timeout $IDLE s)"
idle=$LAST
assert_eq "closed{timeout}" $PER_SOURCE "$(delta "$held" "$idle" 'qpwatch_responder_closed_total{reason="timeout"}')"
for i in $(seq 1 $PER_SOURCE); do
  wait "${holders[i - 1]}" && fail "holder $i: its second round succeeded on a closed connection"
  expect_json "$OUT/hold-$i.json" <<EOF2
holder $i: results by round :: ok,error :: [.outcomes[].result] | join(",")
holder $i: round 2 :: ping: the peer disconnected (RDMA_CM_EVENT_DISCONNECTED) :: .outcomes[1].error
EOF2
done

# --- malformed messages, each kind once, over RC then UD
m0=$(scrape malformed-0)
for kind in short magic random too_long; do
  "$BIN/qpwatch" probe --target "$RXE_ADDR:9723" --count 1 --pings 1 --timeout 1 --malformed $kind \
    >"$OUT/rc-$kind.txt" 2>&1 && fail "RC --malformed $kind: the probe succeeded"
done
rc_expected=(short:1 magic:2 too_long:1) # random bytes: another magic
wait_for_metric qpwatch_responder_malformed_total 4 30 || fail "RC malformed messages not all counted"
m1=$LAST
for pair in "${rc_expected[@]}"; do
  assert_eq "RC malformed{${pair%%:*}}" "${pair#*:}" \
    "$(delta "$m0" "$m1" "qpwatch_responder_malformed_total{reason=\"${pair%%:*}\"}")"
done
assert_eq "RC: messages echoed for the malformed sends" 0 "$(delta "$m0" "$m1" qpwatch_responder_echoes_total)"
assert_eq "RC: closed{error} (too_long fails the receive)" 1 "$(delta "$m0" "$m1" 'qpwatch_responder_closed_total{reason="error"}')"
"$BIN/qpwatch" probe --target "$RXE_ADDR:9723" --count 1 --pings 5 --json >"$OUT/rc-after.json" ||
  fail "RC probe after the malformed ones failed: $(cat "$OUT/rc-after.json")"
for kind in short magic version kind random; do
  before_kind=$(scrape "ud-$kind-0")
  "$BIN/qpwatch" probe --ud --target "$RXE_ADDR:9723" --count 1 --timeout 1 --malformed $kind --json \
    >"$OUT/ud-$kind.json" 2>&1 && fail "UD --malformed $kind: the probe was answered"
  wait_for_metric_at_least 'qpwatch_mesh_messages_dropped_total{reason="malformed"}' \
    $(($(metric "$before_kind" 'qpwatch_mesh_messages_dropped_total{reason="malformed"}') + 1)) 30 ||
    fail "UD malformed $kind not counted"
  assert_eq "UD malformed ($kind)" 1 "$(delta "$before_kind" "$LAST" 'qpwatch_mesh_messages_dropped_total{reason="malformed"}')"
  assert_eq "UD answers to malformed ($kind)" 0 "$(delta "$before_kind" "$LAST" qpwatch_mesh_responses_total)"
done
"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:9723" --count 5 --interval-ms 100 --json >"$OUT/ud-after.json" ||
  fail "UD probe after the malformed ones failed: $(cat "$OUT/ud-after.json")"
expect_json "$OUT/ud-after.json" <<EOF2
UD probes answered after the malformed ones :: 5 :: .answered
EOF2

# --- UD: a burst above the answer rate from the stranger, the legitimate source alongside
BURST=150
r0=$(scrape rate-0)
"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:9723" --source "$RXE_ADDR" --count 10 --interval-ms 200 --timeout 2 --json \
  >"$OUT/ud-legit.json" 2>&1 &
legit=$!
"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:9723" --source "$STRANGER" --count $BURST --interval-ms 1 --timeout 2 --json \
  >"$OUT/ud-burst.json" 2>&1 && fail "the stranger's burst of $BURST was answered in full"
wait $legit || fail "legitimate UD probes during the burst failed: $(cat "$OUT/ud-legit.json")"
expect_json "$OUT/ud-legit.json" <<EOF2
legitimate UD probes answered during the stranger's burst :: 10 :: .answered
EOF2
answered=$(jq .answered "$OUT/ud-burst.json")
lost=$(jq .lost "$OUT/ud-burst.json")
unsent=$(jq .send_failed "$OUT/ud-burst.json")
log "the stranger's burst: $answered answered, $lost lost, $unsent not sent"
assert_eq "burst: answered + lost + not sent" $BURST $((answered + lost + unsent))
[ "$answered" -ge $RATE ] || fail "burst: fewer than the bucket's $RATE answered"
[ "$lost" -gt 0 ] || fail "burst: nothing refused"
wait_for_metric 'qpwatch_mesh_messages_dropped_total{reason="rate_limited"}' \
  $(($(metric "$r0" 'qpwatch_mesh_messages_dropped_total{reason="rate_limited"}') + lost)) 30 ||
  fail "rate_limited is not the burst's unanswered probes ($lost)"
log "ok: rate_limited = the burst's $lost unanswered probes"
assert_eq "UD answers (burst + legitimate)" $((answered + 10)) "$(delta "$r0" "$LAST" qpwatch_mesh_responses_total)"
assert_eq "rate_table_full" 0 "$(delta "$r0" "$LAST" 'qpwatch_mesh_messages_dropped_total{reason="rate_table_full"}')"

# --- the allow-list (SIGHUP): the stranger is refused, RC and SIDR
write_config "allow = [\"$RXE_ADDR/32\"]"
reload_agent
restarted() { [ "$(grep -c "$1" "$OUT/agent.log")" -ge 2 ]; }
wait_until 60 restarted 'probe responder listening' || fail "the RC responder did not restart with the allow-list"
wait_until 60 restarted 'UD probe mesh running' || fail "the mesh did not restart with the allow-list"
wait_until 60 res_count_is cm_id -ge 2 '.state == "LISTEN"' ||
  fail "responders not listening again after the reload"
a0=$(scrape allow-0)
"$BIN/rdma-probe" probe --target "$RXE_ADDR:9723" --source "$STRANGER" --count 1 --timeout-ms 5000 --json \
  >"$OUT/not-allowed.json" 2>&1 && fail "the stranger's RC probe was accepted outside the allow-list"
expect_json "$OUT/not-allowed.json" <<EOF2
stranger's RC connection outside the allow-list :: rejected :: .outcomes[0].result
EOF2
"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:9723" --source "$STRANGER" --count 1 --timeout 2 --json \
  >"$OUT/ud-not-allowed.json" 2>"$OUT/ud-not-allowed.err" && fail "the stranger's UD probe was answered outside the allow-list"
"$BIN/qpwatch" probe --target "$RXE_ADDR:9723" --source "$RXE_ADDR" --count 1 --pings 3 >/dev/null ||
  fail "the allowed source's RC probe failed"
"$BIN/qpwatch" probe --ud --target "$RXE_ADDR:9723" --source "$RXE_ADDR" --count 3 --interval-ms 100 >/dev/null ||
  fail "the allowed source's UD probe failed"
wait_for_metric 'qpwatch_responder_refused_total{reason="not_allowed"}' \
  $(($(metric "$a0" 'qpwatch_responder_refused_total{reason="not_allowed"}') + 1)) 30 || fail "refused{not_allowed}"
a1=$LAST
log "ok: refused{not_allowed} = 1"
assert_eq "SIDR requests refused" 1 "$(delta "$a0" "$a1" 'qpwatch_mesh_messages_dropped_total{reason="sidr_not_allowed"}')"
assert_eq "UD answers to the allowed source" 3 "$(delta "$a0" "$a1" qpwatch_mesh_responses_total)"
log "the stranger's UD probe: $(jq -r .error "$OUT/ud-not-allowed.json")"
stop_agent
