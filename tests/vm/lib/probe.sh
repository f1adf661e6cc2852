# rdma-probe helpers of tests/vm/lib.sh (the probe_* scenarios and the
# probe_vs_send_lat benchmark): a responder, probes that linger after their
# result. Sourced by tests/vm/lib.sh only.
# shellcheck shell=bash

PROBE=$BIN/rdma-probe
PROBE_PORT=${PROBE_PORT:-9723}
RESPONDER_PID=

# res_counts_plus_listener COUNTS: res_counts COUNTS with one more cm_id (a listener).
res_counts_plus_listener() {
  local qp mr cm
  IFS=' =' read -r _ qp _ mr _ cm <<<"$1"
  echo "qp=$qp mr=$mr cm_id=$((cm + 1))"
}

# start_responder [rdma-probe responder flags...]: listens on $RXE_ADDR:$PROBE_PORT;
# its counters go to $OUT/responder.json when it stops.
start_responder() {
  "$PROBE" responder --listen "$RXE_ADDR:$PROBE_PORT" --json "$@" \
    >"$OUT/responder.json" 2>>"$OUT/responder.log" &
  RESPONDER_PID=$!
  wait_until 30 res_count_is cm_id -eq 1 ".pid == $RESPONDER_PID and .state == \"LISTEN\"" ||
    fail "responder not listening"
  log "responder listening (pid $RESPONDER_PID)"
}

# stop_responder: SIGTERM, expect exit 0 and the counters on stdout.
stop_responder() {
  stop_child RESPONDER_PID responder
  jq -e . "$OUT/responder.json" >/dev/null || fail "responder printed no counters"
}

# start_lingering NAME [rdma-probe probe flags...]: starts a probe that stays
# alive after printing its JSON ($OUT/NAME.json); its PID is in $PROBE_PID.
start_lingering() {
  local name=$1
  shift
  "$PROBE" probe --json --linger-ms 120000 "$@" >"$OUT/$name.json" 2>"$OUT/$name.log" &
  PROBE_PID=$!
}

# finish_lingering NAME [TIMEOUT_S]: waits (120 s) for the JSON of the probe
# start_lingering started, asserts that the live process holds no QP, MR or
# cm_id any more, then stops it with SIGTERM and leaves its exit status in
# $PROBE_RC.
finish_lingering() {
  local name=$1 json=$OUT/$1.json
  wait_until "${2:-120}" bash -c "[ -s '$json' ] || ! kill -0 $PROBE_PID 2>/dev/null" || fail "$name: no output"
  kill -0 "$PROBE_PID" 2>/dev/null || fail "$name: exited before lingering: $(cat "$OUT/$name.log")"
  assert_eq "$name: RDMA resources of the live probe process" "qp=0 mr=0 cm_id=0" "$(res_counts ".pid == $PROBE_PID")"
  terminate "$PROBE_PID"
  PROBE_RC=$EXIT_RC
}

# probe_lingering NAME [rdma-probe probe flags...]: start_lingering, then
# finish_lingering.
probe_lingering() {
  start_lingering "$@"
  finish_lingering "$1"
}

# expect_failed_probe NAME BASELINE, then expect_json lines on stdin: the
# probe NAME (probe_lingering) exited with status 3 (probe failed), its JSON
# meets the expectations, and the system's QP/MR/cm_id counts return to
# BASELINE (res_counts).
expect_failed_probe() {
  local name=$1 baseline=$2
  assert_eq "$name: exit status" 3 "$PROBE_RC"
  expect_json "$OUT/$name.json"
  wait_res_baseline "$name: back to the baseline" "$baseline"
}
