# Userspace RDMA CM through rdma_ucm: rping over rxe0 with the agent attached
# and `qpwatch events` streaming. Exact counts for one connection:
#   CONNECT_REQUEST 1 (passive id), ESTABLISHED 1 (passive: for userspace ids
#   the active side gets CONNECT_RESPONSE, librdmacm moves the QP to RTS and
#   sends the RTU; cma_ib_handler), DISCONNECTED 2 (both sides),
#   one connect-duration observation per side, every QP joined to a cm_id.
# Then a connect to a port with no listener: REJECTED (IB CM reject reason 8,
# invalid service id), counted in qpwatch_cm_errors_total.
# The agent also runs the opt-in ib-cm-tracepoints group here (the ib_cma:*
# tracepoints, which pin ib_cm); ib_cm's own message counters (sysfs) must
# agree with it.
start_agent --groups qp,cm,kernel-ulp,ib-cm-tracepoints --sysfs-counters-interval 1
start_events
base=$(scrape_fresh base)

rping_once 5

ids_base=$(metric "$base" 'qpwatch_cm_ids')
wait_for_metric 'qpwatch_cm_ids' "$ids_base" || fail "CM ids not all destroyed"
after=$(scrape_fresh after)
ev() { delta "$base" "$after" "qpwatch_cm_events_total{event=\"$1\"}"; }
assert_eq "CONNECT_REQUEST events" 1 "$(ev CONNECT_REQUEST)"
assert_eq "ESTABLISHED events" 1 "$(ev ESTABLISHED)"
assert_eq "DISCONNECTED events" 2 "$(ev DISCONNECTED)"
assert_eq "CONNECT_RESPONSE events" 1 "$(ev CONNECT_RESPONSE)"
assert_eq "ADDR_RESOLVED events" 1 "$(ev ADDR_RESOLVED)"
assert_eq "ROUTE_RESOLVED events" 1 "$(ev ROUTE_RESOLVED)"
assert_eq "active connect durations" 1 "$(delta "$base" "$after" 'qpwatch_cm_connect_duration_seconds_count{role="active"}')"
assert_eq "passive connect durations" 1 "$(delta "$base" "$after" 'qpwatch_cm_connect_duration_seconds_count{role="passive"}')"
assert_eq "address resolutions timed" 1 "$(delta "$base" "$after" 'qpwatch_cm_address_resolve_duration_seconds_count')"
assert_eq "route resolutions timed" 1 "$(delta "$base" "$after" 'qpwatch_cm_route_resolve_duration_seconds_count')"
assert_eq "rdma_connect_locked calls (the REQ)" 1 "$(delta "$base" "$after" 'qpwatch_cm_call_duration_seconds_count{call="rdma_connect_locked"}')"
assert_eq "rdma_accept calls (passive REP, active RTU)" 2 "$(delta "$base" "$after" 'qpwatch_cm_call_duration_seconds_count{call="rdma_accept"}')"
assert_eq "cma_rep_recv calls (active side's RTU)" 1 "$(delta "$base" "$after" 'qpwatch_cm_call_duration_seconds_count{call="cma_rep_recv"}')"
assert_eq "rdma_disconnect calls" 2 "$(delta "$base" "$after" 'qpwatch_cm_call_duration_seconds_count{call="rdma_disconnect"}')"
assert_eq "IB CM REQ sent (ib_cma tracepoint)" 1 "$(delta "$base" "$after" 'qpwatch_tracepoint_hits_total{tracepoint="ib_cma:icm_send_req"}')"
for m in req rep rtu; do
  assert_eq "IB CM ${m^^} sent (ib_cm's counters)" 1 "$(delta "$base" "$after" "qpwatch_ib_cm_messages_total{device=\"rxe0\",direction=\"sent\",message=\"$m\"}")"
  assert_eq "IB CM ${m^^} received (ib_cm's counters)" 1 "$(delta "$base" "$after" "qpwatch_ib_cm_messages_total{device=\"rxe0\",direction=\"received\",message=\"$m\"}")"
done
assert_eq "CM errors" 0 "$(delta "$base" "$after" 'qpwatch_cm_errors_total')"
assert_eq "QPs by process rping" 2 "$(delta "$base" "$after" 'qpwatch_qp_created_by_process_total{comm="rping"}')"

# every QP the connection created is joined to a CM id in the event stream
sleep 1
created=$(jq -r 'select(.kind == "qp_create" and .comm == "rping") | .qp_num' "$OUT/events.jsonl" | sort -u)
assert_eq "QPs created in the event stream" 2 "$(echo "$created" | grep -c .)"
for qp in $created; do
  cm=$(events_cm_ids "$qp")
  [ -n "$cm" ] || fail "QP $qp never appears with a cm_id"
  log "ok: QP $qp joined to cm_id $(echo $cm | tr '\n' ' ')"
done
# modifies after the join carry the cm_id too (the active side's RTR/RTS)
joined_modifies=$(jq -r 'select(.kind == "qp_modify" and .cm_id != null) | .qp_num' "$OUT/events.jsonl" | grep -c . || true)
[ "$joined_modifies" -ge 2 ] || fail "expected modifies annotated with a cm_id, got $joined_modifies"

# no listener on this port: the passive side's IB CM rejects the REQ
rping -c -a "$RXE_ADDR" -p 7471 -C 1 >"$OUT/rping-refused.log" 2>&1 && fail "connect to a closed port succeeded"
wait_for_metric 'qpwatch_cm_errors_total{event="REJECTED"}' 1 || fail "REJECTED not counted"
end=$(scrape_fresh end)
assert_eq "REJECTED with reject reason 8 (invalid service id)" 1 "$(delta "$after" "$end" 'qpwatch_cm_events_total{event="REJECTED",status="reject_8"}')"
assert_eq "no-listener IB CM errors (ib_cma tracepoint)" 1 "$(delta "$after" "$end" 'qpwatch_tracepoint_hits_total{tracepoint="ib_cma:icm_no_listener_err"}')"
assert_eq "IB CM REJ sent (ib_cm's counters)" 1 "$(delta "$after" "$end" 'qpwatch_ib_cm_messages_total{device="rxe0",direction="sent",message="rej"}')"
assert_eq "events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
stop_events
stop_agent
