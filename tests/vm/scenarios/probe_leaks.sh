# Fault injection after each probe step in turn (two probes per process):
# every failure must free everything it had set up, in the still-running
# probe process and on the responder, back to exact baseline counts.
base=$(res_counts)
log "baseline: $base"
start_responder
listening=$(res_counts_plus_listener "$base")
N=3

# The QP calls each injected failure leaves behind: what was set up, then destroy.
declare -A calls=(
  [addr_resolve]=""
  [route_resolve]=""
  [qp_create]="create,modify:INIT,destroy"
  [connect]="create,modify:INIT,destroy"
  [established]="create,modify:INIT,modify:RTR,modify:RTS,destroy"
  [ping]="create,modify:INIT,modify:RTR,modify:RTS,destroy"
  [disconnect]="create,modify:INIT,modify:RTR,modify:RTS,modify:ERR,destroy"
)
declare -A pings=([addr_resolve]=0 [route_resolve]=0 [qp_create]=0 [connect]=0 [established]=0 [ping]=1 [disconnect]=$N)
completed=() # the setup steps done when the failure is injected: all up to it (ping is none)
for step in addr_resolve route_resolve qp_create connect established ping disconnect; do
  [ "$step" = ping ] || completed+=("$step")
  steps=$(printf '%s\n' "${completed[@]}" | LC_ALL=C sort | paste -sd,) # as jq's keys sorts them
  RDMA_PROBE_FAIL_AFTER=$step probe_lingering "fail-$step" --target "$RXE_ADDR:$PROBE_PORT" --probes 2 --count $N --timeout-ms 5000
  expect_failed_probe "fail-$step" "$listening" <<EOF2
fail-$step: results :: error,error :: [.outcomes[].result] | join(",")
fail-$step: failed step :: $step,$step :: [.outcomes[].failed_step] | join(",")
fail-$step: error :: injected failure after $step :: [.outcomes[].error] | unique | join(";")
fail-$step: steps completed :: $steps :: [.outcomes[] | .steps | keys | join(",")] | unique | join(";")
fail-$step: QP calls :: ${calls[$step]} :: [.outcomes[] | [.qp_calls[][] | .kind + (if .target_state then ":" + .target_state else "" end)] | join(",")] | unique | join(";")
fail-$step: failed QP calls :: 0 :: [.outcomes[].qp_calls[][] | select(.rc != 0)] | length
fail-$step: pings per probe :: ${pings[$step]},${pings[$step]} :: [.outcomes[].rtts_ns | length | tostring] | join(",")
EOF2
done

stop_responder
# connect/established/ping/disconnect reached the responder, twice each; the
# requester that fails after `connect` destroys its cm_id with the REP
# unanswered, so its CM sends a REJ (responder: RDMA_CM_EVENT_REJECTED); the
# others disconnect (DREQ) after ESTABLISHED.
expect_json "$OUT/responder.json" <<EOF2
connect requests :: 8 :: .connect_requests
established :: 6 :: .established
closed :: 8 :: .closed
closed by peer :: 6 :: .closed_by_peer
closed on a CM error event (REJ) :: 2 :: .closed_error
closed on a timeout :: 0 :: .closed_timeout
active :: 0 :: .active
echoes :: $((2 * 1 + 2 * N)) :: .echoes
EOF2
wait_res_baseline "after responder stop" "$base"
