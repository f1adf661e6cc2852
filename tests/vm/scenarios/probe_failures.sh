# rdma-probe failure results over rxe0. Each case asserts the result and the
# failed step, that the probe process outlives the failure holding no QP, MR
# or cm_id, exits with status 3 (probe failed) after SIGTERM ends its linger, and
# that the system's QP/MR/cm_id counts return to the baseline.
# Answers what rxe gives for "no responder": REJECTED (not UNREACHABLE).
base=$(res_counts)
log "baseline: $base"
T=2000

# persistent_probe_then NAME CMD...: a persistent probe (start_lingering)
# pings the responder; once its QP is in RTS and it has pinged for a second,
# CMD does something to the responder; then finish_lingering.
persistent_probe_then() {
  local name=$1
  shift
  start_lingering "$name" --target "$RXE_ADDR:$PROBE_PORT" --persistent --count 200 --interval-ms 50 --timeout-ms $T
  wait_until 30 qp_in_rts "$PROBE_PID" || fail "$name: probe QP not in RTS"
  sleep 1
  "$@"
  finish_lingering "$name" 60
}

# 1. No responder on the port: rxe's CM answers the REQ with a REJ
#    (IB_CM_REJ_INVALID_SERVICE_ID = 8).
probe_lingering no-responder --target "$RXE_ADDR:9499" --count 1 --timeout-ms $T
expect_failed_probe no-responder "$base" <<EOF2
no-responder: result :: rejected :: .outcomes[0].result
no-responder: failed step :: connect :: .outcomes[0].failed_step
no-responder: CM reject reason :: 8 :: .outcomes[0].cm_event_status
no-responder: QP created and destroyed :: create,modify:INIT,destroy :: [.outcomes[0].qp_calls[][] | .kind + (if .target_state then ":" + .target_state else "" end)] | join(",")
EOF2

# 2. Unroutable address (no route to 203.0.113.0/24 in the guest).
probe_lingering unroutable --target 203.0.113.1 --count 1 --timeout-ms $T
expect_failed_probe unroutable "$base" <<EOF2
unroutable: result :: addr_error :: .outcomes[0].result
unroutable: failed step :: addr_resolve :: .outcomes[0].failed_step
unroutable: errno ENETUNREACH :: 101 :: .outcomes[0].errno
unroutable: no QP :: 0 :: .outcomes[0].qp_calls | length
EOF2

# 3. Step timeout: 198.18.0.2 is on the dummy link (IFF_NOARP, so the address
#    resolves at once) but nobody is there: the REQ goes nowhere and the
#    connect step times out long before the CM would give up.
probe_lingering step-timeout --target 198.18.0.2 --count 1 --timeout-ms $T
expect_failed_probe step-timeout "$base" <<EOF2
step-timeout: result :: timeout :: .outcomes[0].result
step-timeout: failed step :: connect :: .outcomes[0].failed_step
step-timeout: steps done before :: addr_resolve,qp_create,route_resolve :: .outcomes[0].steps | keys | join(",")
step-timeout: connect waited the timeout :: true :: ([.outcomes[0].qp_calls[][] | select(.kind == "destroy")][0].start_ns - .outcomes[0].start_ns) >= $T * 1000000
EOF2

start_responder
listening=$(res_counts_plus_listener "$base")

# 4. Responder frozen (SIGSTOP) while a persistent probe pings: its kernel
#    still ACKs the SENDs, but no echo comes: the ping times out.
persistent_probe_then frozen kill -STOP "$RESPONDER_PID"
kill -CONT "$RESPONDER_PID"
# The responder, thawed, sees the DREQ the probe's destroy sent and cleans up.
expect_failed_probe frozen "$listening" <<EOF2
frozen: result :: timeout :: .outcomes[0].result
frozen: failed step :: ping :: .outcomes[0].failed_step
frozen: some pings done before :: true :: (.outcomes[0].rtts_ns | length) > 0 and (.outcomes[0].rtts_ns | length) < 200
EOF2

# 5. Connect to a frozen responder: the kernel queues the CONNECT_REQUEST,
#    nobody answers, the connect step times out; thawed, the responder copes
#    with a request whose requester is gone.
kill -STOP "$RESPONDER_PID"
probe_lingering frozen-connect --target "$RXE_ADDR:$PROBE_PORT" --count 1 --timeout-ms $T
kill -CONT "$RESPONDER_PID"
expect_failed_probe frozen-connect "$listening" <<EOF2
frozen-connect: result :: timeout :: .outcomes[0].result
frozen-connect: failed step :: connect :: .outcomes[0].failed_step
EOF2

# A thawed responder still serves.
"$PROBE" probe --target "$RXE_ADDR:$PROBE_PORT" --count 3 --timeout-ms 5000 --json >"$OUT/after-thaw.json" ||
  fail "responder does not serve after the frozen cases"

# 6. Responder killed (SIGKILL) mid-probe: the kernel destroys its cm_id,
#    which sends a DREQ (the probe sees RDMA_CM_EVENT_DISCONNECTED mid-ping),
#    and its QP, which makes rxe NAK a SEND in flight (IBV_WC_REM_OP_ERR):
#    whichever reaches the probe first fails the ping, both as `error`.
kill_responder() { kill_wait "$RESPONDER_PID"; RESPONDER_PID=; }
persistent_probe_then killed kill_responder
log "killed: $(jq -r '.outcomes[0].error' "$OUT/killed.json")"
expect_failed_probe killed "$base" <<EOF2
killed: result :: error :: .outcomes[0].result
killed: failed step :: ping :: .outcomes[0].failed_step
killed: peer gone, by DREQ or by NAK :: true :: .outcomes[0].error | IN("ping: the peer disconnected (RDMA_CM_EVENT_DISCONNECTED)", "ping: SEND completion failed: remote operation error (status 11, vendor_err 0x0)")
EOF2
