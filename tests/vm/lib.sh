# Helpers for guest scenarios. Sourced by tests/vm/guest.sh before each scenario.
# Every scenario runs with: set -euo pipefail, $REPO (repository root),
# $OUT (this scenario's output directory), $BIN (release binaries).

AGENT_ADDR=${AGENT_ADDR:-127.0.0.1:9721}
RXE_ADDR=198.18.0.1
AGENT_PID=

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

fail() {
  log "FAIL: $*"
  exit 1
}

# start_agent [extra qpwatch flags...]: starts the agent and waits for /readyz.
start_agent() {
  local log_file="$OUT/agent.log" config=(--config /dev/null) # hermetic: never /etc/qpwatch
  [[ " $* " == *" --config "* ]] && config=()
  "$BIN/qpwatch" "${config[@]}" --listen "$AGENT_ADDR" --log-level "${AGENT_LOG_LEVEL:-info}" "$@" >>"$log_file" 2>&1 &
  AGENT_PID=$!
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt 60 ]; do
    if curl -fsS "http://$AGENT_ADDR/readyz" >/dev/null 2>&1; then
      log "agent ready (pid $AGENT_PID) after $((SECONDS - start)) s"
      return 0
    fi
    if ! kill -0 "$AGENT_PID" 2>/dev/null; then
      cat "$log_file" >&2
      fail "agent exited during start-up"
    fi
    sleep 0.1
  done
  cat "$log_file" >&2
  fail "agent not ready after 60 s"
}

# stop_agent: SIGTERM, expect exit 0.
stop_agent() {
  [ -n "$AGENT_PID" ] || return 0
  kill -TERM "$AGENT_PID"
  local rc=0
  wait "$AGENT_PID" || rc=$?
  AGENT_PID=
  [ "$rc" -eq 0 ] || fail "agent exited with $rc on SIGTERM"
}

# scrape NAME: saves /metrics to $OUT/NAME.prom and prints the path.
scrape() {
  local file="$OUT/$1.prom"
  curl -fsS "http://$AGENT_ADDR/metrics" >"$file" || fail "scrape failed"
  echo "$file"
}

# metric FILE SELECTOR: sum of the matching series (see promtext.awk).
metric() { awk -v sel="$2" -f "$REPO/tests/vm/promtext.awk" "$1"; }

# series_count FILE SELECTOR: number of matching series.
series_count() { awk -v sel="$2" -v mode=count -f "$REPO/tests/vm/promtext.awk" "$1"; }

# delta BEFORE AFTER SELECTOR
delta() { echo $(($(metric "$2" "$3") - $(metric "$1" "$3"))); }

assert_eq() {
  local what=$1 expected=$2 actual=$3
  if [ "$expected" != "$actual" ]; then
    fail "$what: expected $expected, got $actual"
  fi
  log "ok: $what = $actual"
}

# wait_for_metric SELECTOR EXPECTED [TIMEOUT_S]: polls until the sum equals
# EXPECTED (events are drained asynchronously); leaves the last scrape in $LAST.
wait_for_metric() {
  local sel=$1 expected=$2 deadline=$((SECONDS + ${3:-30})) value=
  while :; do
    LAST=$(scrape "wait")
    value=$(metric "$LAST" "$sel")
    [ "$value" = "$expected" ] && return 0
    [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  log "timeout: $sel = $value, expected $expected"
  return 1
}

# wait_for_metric_at_least SELECTOR MIN [TIMEOUT_S]: polls until the sum is >= MIN.
wait_for_metric_at_least() {
  local sel=$1 min=$2 deadline=$((SECONDS + ${3:-30})) value=
  while :; do
    LAST=$(scrape "wait")
    value=$(metric "$LAST" "$sel")
    [ "${value%.*}" -ge "$min" ] && return 0
    [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  log "timeout: $sel = $value, expected at least $min"
  return 1
}

# rdma_qps JQ_FILTER: number of QPs in `rdma -j res show qp` matching a jq select.
rdma_qps() {
  rdma -j res show qp | jq "[.[] | select($1)] | length"
}

# start_rping_traffic: a persistent rping server and clients connecting to it
# over and over (20 pings each) until the scenario ends; their PIDs are in
# $RPING_TRAFFIC, to stop them earlier.
start_rping_traffic() {
  rping -s -P -a "$RXE_ADDR" >"$OUT/rping-server.log" 2>&1 &
  RPING_TRAFFIC=$!
  (while :; do rping -c -a "$RXE_ADDR" -C 20 >/dev/null 2>&1 || sleep 0.2; done) &
  RPING_TRAFFIC="$RPING_TRAFFIC $!"
  on_exit "kill $RPING_TRAFFIC"
}

# wait_until TIMEOUT_S CMD...: retries CMD until it succeeds or the time is up
# (a deadline, not a retry count: commands are slow under emulation).
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  while :; do
    "$@" && return 0
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

# on_exit CMD: runs CMD when the scenario ends, pass or fail (last added, first run).
ON_EXIT=()
on_exit() { ON_EXIT=("$*" "${ON_EXIT[@]}"); }

cleanup_scenario() {
  local cmd
  for cmd in "${ON_EXIT[@]}"; do eval "$cmd" >/dev/null 2>&1 || true; done
  if [ -n "$AGENT_PID" ]; then kill -TERM "$AGENT_PID" 2>/dev/null || true; wait "$AGENT_PID" 2>/dev/null || true; fi
  pkill -x rping 2>/dev/null || true
}
trap cleanup_scenario EXIT
