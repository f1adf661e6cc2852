# Helpers for the rdma-probe VM scenarios (tests/vm/scenarios/probe_*.sh),
# sourced after tests/vm/lib.sh. Not a scenario itself.

PROBE=$BIN/rdma-probe
PROBE_PORT=${PROBE_PORT:-9723}
RESPONDER_PID=

# res_count KIND [JQ_SELECT]: entries of `rdma -j res show KIND` (qp, mr, cm_id).
res_count() {
  rdma -j res show "$1" | jq "[.[] | select(${2:-true})] | length"
}

# res_counts [JQ_SELECT]: "qp=N mr=N cm_id=N" (one jq run for all three).
res_counts() {
  { rdma -j res show qp; rdma -j res show mr; rdma -j res show cm_id; } |
    jq -rs "map([.[] | select(${1:-true})] | length) | \"qp=\(.[0]) mr=\(.[1]) cm_id=\(.[2])\""
}

# res_counts_plus_listener COUNTS: COUNTS with one more cm_id (a listener).
res_counts_plus_listener() {
  local qp mr cm
  read -r qp mr cm <<<"$(sed 's/[a-z_]*=//g' <<<"$1")"
  echo "qp=$qp mr=$mr cm_id=$((cm + 1))"
}

# of_pid PID: jq selector for one process's resources.
of_pid() { echo ".pid == $1"; }

# start_responder [rdma-probe responder flags...]: listens on $RXE_ADDR:$PROBE_PORT.
start_responder() {
  "$PROBE" responder --listen "$RXE_ADDR:$PROBE_PORT" --json "$@" \
    >"$OUT/responder.json" 2>>"$OUT/responder.log" &
  RESPONDER_PID=$!
  local listening=".pid == $RESPONDER_PID and .state == \"LISTEN\""
  wait_until 30 bash -c "[ \"\$(rdma -j res show cm_id | jq '[.[] | select($listening)] | length')\" -eq 1 ]" ||
    fail "responder not listening"
  log "responder listening (pid $RESPONDER_PID)"
}

# stop_responder: SIGTERM, expect exit 0 and the counters on stdout.
stop_responder() {
  kill -TERM "$RESPONDER_PID"
  local rc=0
  wait "$RESPONDER_PID" || rc=$?
  RESPONDER_PID=
  [ "$rc" -eq 0 ] || fail "responder exited with $rc on SIGTERM"
  jq -e . "$OUT/responder.json" >/dev/null || fail "responder printed no counters"
}

# responder_stat FIELD: a counter from the stopped responder's JSON.
responder_stat() { jq -r ".$1" "$OUT/responder.json"; }

# jqf FILE FILTER
jqf() { jq -r "$2" "$1"; }

# expect_json FILE, then lines "label :: expected :: jq filter" on stdin:
# evaluates every filter in ONE jq run (each jq start costs seconds under
# TCG) and asserts each result.
expect_json() {
  local file=$1 line labels=() expected=() prog= i=0 rest
  while IFS= read -r line; do
    [ -z "${line// /}" ] && continue
    labels+=("${line%% :: *}")
    rest=${line#* :: }
    expected+=("${rest%% :: *}")
    prog+="([${rest#* :: }] | if length == 1 then .[0] else . end | tostring),"
  done
  local actual
  mapfile -t actual < <(jq -r "${prog%,}" "$file") || fail "jq failed on $file"
  for ((i = 0; i < ${#labels[@]}; i++)); do
    assert_eq "${labels[i]}" "${expected[i]}" "${actual[i]-<none>}"
  done
}

# wait_res_baseline WHAT EXPECTED [JQ_SELECT]: polls until res_counts equals EXPECTED.
wait_res_baseline() {
  local what=$1 expected=$2 sel=${3:-true} actual=
  for _ in $(seq 1 100); do
    actual=$(res_counts "$sel")
    [ "$actual" = "$expected" ] && { log "ok: $what: $actual"; return 0; }
    sleep 0.1
  done
  rdma res show qp >&2; rdma res show cm_id >&2
  fail "$what: expected $expected, got $actual"
}

# probe_lingering NAME [rdma-probe probe flags...]: runs a probe that stays
# alive after printing its JSON ($OUT/NAME.json), asserts that the live
# process holds no QP, MR or cm_id any more, then stops it with SIGTERM and
# leaves its exit status in $PROBE_RC.
probe_lingering() {
  local name=$1
  shift
  local json=$OUT/$name.json
  "$PROBE" probe --json --linger-ms 120000 "$@" >"$json" 2>"$OUT/$name.log" &
  local pid=$!
  wait_until 120 bash -c "[ -s '$json' ] || ! kill -0 $pid 2>/dev/null" || fail "$name: no output"
  kill -0 "$pid" 2>/dev/null || fail "$name: exited before lingering: $(cat "$OUT/$name.log")"
  assert_eq "$name: RDMA resources of the live probe process" "qp=0 mr=0 cm_id=0" "$(res_counts ".pid == $pid")"
  kill -TERM "$pid"
  PROBE_RC=0
  wait "$pid" || PROBE_RC=$?
}

probe_cleanup() {
  if [ -n "$RESPONDER_PID" ]; then kill -9 "$RESPONDER_PID" 2>/dev/null || true; fi
  pkill -x rdma-probe 2>/dev/null || true
  cleanup_scenario
}
trap probe_cleanup EXIT
