# Why QPs die, on one host (rxe0; the fleet's mesh_qp_death does it across a
# link), counted exactly against what the QPs' owners saw:
#   requested       rping -C 3: client and server each rdma_disconnect(),
#                   librdmacm's modify to ERR: 2 entries, cause requested,
#                   as many as the modify edges into ERR;
#   sq-drained      pyverbs (rdma-core's bindings, tests/vm/lib/qp_die.py):
#                   RTS -> SQD raises SQ_DRAINED, which the owner reads with
#                   ibv_get_async_event: counted once per event it got, and
#                   no entry into ERR;
#   retry-exceeded  pyverbs: the peer QP destroyed, a send with retry_cnt 2:
#                   the owner polls IBV_WC_RETRY_EXC_ERR and finds its QP in
#                   ERR; the agent counts the completion error and one entry
#                   into ERR with cause completion:RETRY_EXC_ERR, and the
#                   owner's modify to ERR after it is no second entry; the
#                   port's retry_exceeded_err moves by 1 and
#                   completer_retry_err by 2, in sysfs and in the agent's
#                   export; `qpwatch events` shows the dying QP's sequence.
# The optional hooks (uverbs' QP event handler, soft-RoCE's) are attached,
# that of a ULP the guest does not load (ib_srp) has no series.
start_agent --sysfs-counters-interval 1
start_events
base=$(scrape base)
for hook in kprobe:ib_uverbs_qp_event_handler kprobe:rxe_cq_post kprobe:rxe_qp_error; do
  assert_eq "$hook attached" 1 "$(metric "$base" "qpwatch_hook_attached{hook=\"$hook\"}")"
done
# SRP's initiator: a ULP no scenario loads (nvmeof_kernel leaves nvme_rdma loaded)
[ ! -d /sys/module/ib_srp ] || fail "ib_srp is loaded: pick another absent ULP"
assert_eq "hooks of a ULP not loaded (ib_srp) listed" 0 "$(series_count "$base" 'qpwatch_hook_attached{hook="kprobe:srp_qp_event"}')"

# requested: both rping QPs moved to ERR by their owners
into_err() { # FILE: modify edges into ERR from another state
  local s n=0
  for s in RESET INIT RTR RTS SQD SQE; do
    n=$((n + $(metric "$1" "qpwatch_qp_transition_duration_seconds_count{from=\"$s\",to=\"ERR\"}")))
  done
  echo "$n"
}
rping_once 3
wait_for_metric 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}' \
  $(($(metric "$base" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}') + 2)) || fail "rping's destroys not seen"
rping=$(scrape rping)
assert_eq "rping's QPs moved to ERR by their owners (requested)" 2 "$(delta "$base" "$rping" 'qpwatch_qp_errors_total{cause="requested"}')"
assert_eq "modify edges into ERR (rping)" 2 $(($(into_err "$rping") - $(into_err "$base")))
assert_eq "other causes (rping)" 0 $(($(metric "$rping" 'qpwatch_qp_errors_total') - $(metric "$base" 'qpwatch_qp_errors_total') - 2))

# sq-drained
qp_die sq-drained "$OUT/sq-drained.txt"
cat "$OUT/sq-drained.txt" >&2
seen=$(awk -F= '$1 == "sq_drained" { print $2 }' "$OUT/sq-drained.txt")
assert_eq "SQ_DRAINED events the owner read" 1 "$seen"
sel='qpwatch_qp_async_events_total{device="rxe0",qp_type="RC",event="SQ_DRAINED"}'
wait_for_metric "$sel" "$(($(metric "$base" "$sel") + seen))" || fail "SQ_DRAINED not counted"
sqd=$(scrape sq-drained)
assert_eq "async events of any kind (sq-drained)" "$(awk -F= '$1 == "async_events" { print $2 }' "$OUT/sq-drained.txt")" "$(delta "$rping" "$sqd" 'qpwatch_qp_async_events_total')"
assert_eq "entries into ERR after SQ_DRAINED" 0 "$(delta "$rping" "$sqd" 'qpwatch_qp_errors_total')"

# retry-exceeded
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
exceeded0=$(cat "$HW/retry_exceeded_err") retries0=$(cat "$HW/completer_retry_err")
qp_die retry-exceeded "$OUT/retry-exceeded.txt"
cat "$OUT/retry-exceeded.txt" >&2
assert_eq "the owner's completion: IBV_WC_RETRY_EXC_ERR" 1 "$(awk -F= '$1 == "retry_exc_err" { print $2 }' "$OUT/retry-exceeded.txt")"
assert_eq "the owner's QP after it: ERR" 1 "$(awk -F= '$1 == "qp_state_is_err" { print $2 }' "$OUT/retry-exceeded.txt")"
qp_a=$(awk -F= '$1 == "qp_a" { print $2 }' "$OUT/retry-exceeded.txt")
assert_eq "sysfs retry_exceeded_err" 1 $(($(cat "$HW/retry_exceeded_err") - exceeded0))
assert_eq "sysfs completer_retry_err" 2 $(($(cat "$HW/completer_retry_err") - retries0))
sel='qpwatch_qp_errors_total{cause="completion:RETRY_EXC_ERR"}'
wait_for_metric "$sel" "$(($(metric "$sqd" "$sel") + 1))" || fail "the QP's entry into ERR not counted with its cause"
wait_for_metric 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}' \
  $(($(metric "$sqd" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}') + 2)) || fail "qp_die.py's destroys not seen"
died=$(scrape_fresh retry-exceeded)
assert_eq "completion errors RETRY_EXC_ERR" 1 "$(delta "$sqd" "$died" 'qpwatch_qp_completion_errors_total{device="rxe0",status="RETRY_EXC_ERR"}')"
assert_eq "completion errors of any status" 1 "$(delta "$sqd" "$died" 'qpwatch_qp_completion_errors_total')"
assert_eq "entries into ERR (retry-exceeded)" 1 "$(delta "$sqd" "$died" 'qpwatch_qp_errors_total')"
assert_eq "requested after the device's move" 0 "$(delta "$sqd" "$died" 'qpwatch_qp_errors_total{cause="requested"}')"
assert_eq "agent's retry_exceeded_err" "$(cat "$HW/retry_exceeded_err")" "$(metric "$died" 'qpwatch_port_hw_stats_total{device="rxe0",port="1",counter="retry_exceeded_err"}')"
assert_eq "agent's completer_retry_err" "$(cat "$HW/completer_retry_err")" "$(metric "$died" 'qpwatch_port_hw_stats_total{device="rxe0",port="1",counter="completer_retry_err"}')"

# the dying QP's sequence in the event stream
sequence() {
  jq -r --argjson qp "$qp_a" 'select(.qp_num == $qp and .kind != "cm") |
    [.kind, (.from_state // "-"), (.to_state // "-"), (.wc_status // .async_event // "-"), (.err_cause // "-")] | join(" ")' "$OUT/events.jsonl"
}
destroyed() { sequence | grep -q '^qp_destroy'; }
wait_until 10 destroyed || fail "the event stream did not see QP $qp_a destroyed"
stop_events
sequence >"$OUT/sequence.txt"
log "QP $qp_a: $(paste -sd'|' "$OUT/sequence.txt")"
expected="qp_create - - - -
qp_modify RESET INIT - -
qp_modify INIT RTR - -
qp_modify RTR RTS - -
qp_completion_error RTS - RETRY_EXC_ERR -
qp_device_error RTS ERR - completion:RETRY_EXC_ERR
qp_modify ERR ERR - -
qp_destroy ERR - - -"
[ "$(cat "$OUT/sequence.txt")" = "$expected" ] || fail "QP $qp_a's events: $(paste -sd'|' "$OUT/sequence.txt"), expected $(paste -sd'|' <<<"$expected")"
log "ok: QP $qp_a's events in order, cause completion:RETRY_EXC_ERR"
assert_eq "rping's ERR causes in qpwatch events" "requested,requested" \
  "$(jq -r 'select(.comm == "rping" and .err_cause != null) | .err_cause' "$OUT/events.jsonl" | paste -sd,)"
stop_agent
