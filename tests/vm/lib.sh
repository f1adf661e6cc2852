# The VM test bed's one library: every helper of the guest scenarios
# (tests/vm/scenarios/*.sh) and of the benchmarks' guest halves
# (tests/vm/bench/*.sh). tests/vm/guest.sh sources it before each of them;
# it sources its topic files from tests/vm/lib/ (rdma-probe, qp-churn and
# benchmark figures, fleet hosts). Every scenario runs with: set -euo
# pipefail, $REPO (repository root), $OUT (this scenario's output directory),
# $BIN (release binaries); fleet scenarios with more (lib/fleet.sh).
# shellcheck shell=bash
# shellcheck source-path=SCRIPTDIR
[ -z "${QPWATCH_VM_LIB:-}" ] || return 0 # sourced once: a second time would reset ON_EXIT
QPWATCH_VM_LIB=1
# Under emulation a fork and exec of /usr/bin/sleep costs a guest about 45 ms
# of CPU: a poll every 0.1 s took half a vCPU (an idle guest: 0.6 %; polling
# with the builtin: 4.4 %). bash-builtins' loadable sleep forks nothing.
enable -f /usr/lib/bash/sleep sleep || {
  echo "lib.sh: no loadable sleep builtin (/usr/lib/bash/sleep): run scripts/setup" >&2
  return 2
}

AGENT_ADDR=${AGENT_ADDR:-127.0.0.1:9721}
RXE_ADDR=${HOST_ADDR:-198.18.0.1} # a fleet host's own address
AGENT_PID=
EVENTS_PID=
RPING_PIDS=

# --- basics

log() { printf '[%(%T)T] %s\n' -1 "$*" >&2; }

fail() {
  log "FAIL: $*"
  exit 1
}

assert_eq() {
  local what=$1 expected=$2 actual=$3
  if [ "$expected" != "$actual" ]; then
    fail "$what: expected $expected, got $actual"
  fi
  log "ok: $what = $actual"
}

# expect_json FILE, then lines "label :: expected :: jq filter" on stdin:
# evaluates every filter in ONE jq run (each jq start costs seconds under
# TCG) and asserts each result.
expect_json() {
  local file=$1 line labels=() wanted=() prog='' i=0 rest results=()
  while IFS= read -r line; do
    [ -z "${line// /}" ] && continue
    labels+=("${line%% :: *}")
    rest=${line#* :: }
    wanted+=("${rest%% :: *}")
    prog+="([${rest#* :: }] | if length == 1 then .[0] else . end | tostring),"
  done
  mapfile -t results < <(jq -r "${prog%,}" "$file") || fail "jq failed on $file"
  for ((i = 0; i < ${#labels[@]}; i++)); do
    assert_eq "${labels[i]}" "${wanted[i]}" "${results[i]-<none>}"
  done
}

# wait_until TIMEOUT_S CMD...: retries CMD until it succeeds or the time is up
# (a deadline, not a retry count: commands are slow under emulation), every
# $WAIT_INTERVAL seconds (0.1; set it on the call for slow checks).
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  while :; do
    "$@" && return 0
    [ $SECONDS -lt $deadline ] || return 1
    sleep "${WAIT_INTERVAL:-0.1}"
  done
}

# terminate PID [SIGNAL]: sends SIGNAL (TERM) to a child and waits for it; its
# exit status is left in $EXIT_RC, the time from the signal to the exit in $EXIT_MS.
terminate() {
  local t0
  t0=$(date +%s%N)
  kill -"${2:-TERM}" "$1"
  EXIT_RC=0
  wait "$1" || EXIT_RC=$?
  # shellcheck disable=SC2034 # for the callers
  EXIT_MS=$((($(date +%s%N) - t0) / 1000000))
}

# stop_child VAR WHAT: terminate the child whose PID is in $VAR, empty VAR,
# and fail unless WHAT exited 0.
stop_child() {
  local -n pid_of_child=$1
  terminate "$pid_of_child"
  pid_of_child=
  [ "$EXIT_RC" -eq 0 ] || fail "$2 exited with $EXIT_RC on SIGTERM"
}

# kill_wait PID...: SIGKILL to children, and reaps them; fails, with where
# in the kernel it waits, if one is still not dead 30 s later (a task stuck
# in the kernel would otherwise hang the scenario until its time limit).
kill_wait() {
  kill -9 "$@" 2>/dev/null || true
  local pid deadline=$((SECONDS + 30))
  for pid in "$@"; do
    while [ -e "/proc/$pid" ] && [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" != Z* ]]; do
      if [ $SECONDS -ge $deadline ]; then
        where_stuck "$pid" >&2
        fail "pid $pid alive 30 s after SIGKILL: stuck in the kernel"
      fi
      sleep 0.2
    done
  done
  wait "$@" 2>/dev/null || true
}

# on_exit CMD: runs CMD when the scenario ends, pass or fail (last added, first run).
ON_EXIT=()
on_exit() { ON_EXIT=("$*" "${ON_EXIT[@]}"); }

# --- the agent

# launch_agent [extra qpwatch flags...]: starts the agent in the background
# (its PID in $AGENT_PID, its log in $OUT/agent.log) and returns at once.
launch_agent() {
  local config=(--config /dev/null) # hermetic: never /etc/qpwatch
  [[ " $* " == *" --config "* ]] && config=()
  "$BIN/qpwatch" "${config[@]}" --listen "$AGENT_ADDR" --log-level "${AGENT_LOG_LEVEL:-info}" "$@" >>"$OUT/agent.log" 2>&1 &
  AGENT_PID=$!
}

# agent_get PATH: the agent answers GET PATH (/readyz, /healthz) with a 2xx,
# over plain HTTP through http_open (no fork), its body not read. With
# AGENT_CACERT set (a scenario that serves TLS), agent_get and scrape speak
# https through curl and trust that CA.
agent_url() { if [ -n "${AGENT_CACERT:-}" ]; then echo "https://$AGENT_ADDR$1"; else echo "http://$AGENT_ADDR$1"; fi; }
agent_curl() { curl ${AGENT_CACERT:+--cacert "$AGENT_CACERT"} "$@"; }
agent_get() {
  [ -z "${AGENT_CACERT:-}" ] || { agent_curl -fsS -o /dev/null "$(agent_url "$1")" 2>/dev/null; return; }
  http_open "$AGENT_ADDR" "$1" || return 1
  exec {HTTP_FD}>&-
  [[ $HTTP_STATUS == "HTTP/1."[01]" 2"* ]]
}

# make_test_certs DIR: a throwaway CA (DIR/ca.crt) and a server certificate
# for 127.0.0.1 and $RXE_ADDR signed by it (DIR/agent.crt, DIR/agent.key),
# valid for 2 days.
make_test_certs() {
  mkdir -p "$1"
  (
    cd "$1"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj "/CN=qpwatch test CA" -days 2 \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -out ca.crt
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out agent.key 2>/dev/null
    openssl req -new -key agent.key -subj /CN=qpwatch -out agent.csr
    printf 'subjectAltName=IP:127.0.0.1,IP:%s\nextendedKeyUsage=serverAuth\n' "$RXE_ADDR" >agent.ext
  ) || fail "making the test certificates"
  sign_test_cert "$1" 2
}

# sign_test_cert DIR DAYS: DIR/agent.crt (made or renewed) from make_test_certs'
# request, signed by its CA, valid for DAYS days.
sign_test_cert() {
  (cd "$1" && openssl x509 -req -in agent.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days "$2" -extfile agent.ext -out agent.crt 2>/dev/null) ||
    fail "signing the test certificate"
}

# wait_agent_ready [TIMEOUT_S]: until /readyz answers (60 s); fails, with the
# agent's log, if the agent exits or the time is up.
wait_agent_ready() {
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt "${1:-60}" ]; do
    if agent_ready_poll; then
      log "agent ready (pid $AGENT_PID) after $((SECONDS - start)) s"
      return 0
    fi
    if ! kill -0 "$AGENT_PID" 2>/dev/null; then
      cat "$OUT/agent.log" >&2
      fail "agent exited during start-up"
    fi
    sleep 0.1
  done
  cat "$OUT/agent.log" >&2
  fail "agent not ready after ${1:-60} s"
}

# agent_ready_poll: the agent answers GET /readyz with a 2xx, through
# agent_get (no fork over plain HTTP: a curl every 0.1 s took CPU the
# starting agent needed, bench/agent_start; a scenario whose agent runs
# elsewhere overrides agent_get). AGENT_READY_POLL=curl: through curl, for
# that benchmark's comparison.
agent_ready_poll() {
  if [ "${AGENT_READY_POLL:-}" = curl ]; then
    agent_curl -fsS -o /dev/null "$(agent_url /readyz)" 2>/dev/null
  else
    HTTP_TIMEOUT=5 agent_get /readyz
  fi
}

# http_open HOST:PORT PATH: sends GET http://HOST:PORT/PATH through bash's
# /dev/tcp (HTTP/1.0: never a chunked body) and reads the answer's status
# line (HTTP_STATUS) and headers (Content-Length in HTTP_LENGTH, empty if
# none), each within HTTP_TIMEOUT s (10); the body is left on HTTP_FD, which
# the caller closes. Fails, with nothing open, if there is no answer.
http_open() {
  local line
  HTTP_STATUS= HTTP_LENGTH=
  { exec {HTTP_FD}<>"/dev/tcp/${1%:*}/${1##*:}"; } 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$1" >&"$HTTP_FD"
  IFS= read -r -t "${HTTP_TIMEOUT:-10}" -u "$HTTP_FD" HTTP_STATUS || { exec {HTTP_FD}>&-; return 1; }
  while IFS= read -r -t "${HTTP_TIMEOUT:-10}" -u "$HTTP_FD" line; do
    line=${line%$'\r'}
    [ -n "$line" ] || break
    shopt -s nocasematch
    [[ $line == content-length:* ]] && HTTP_LENGTH=${line#*:} && HTTP_LENGTH=${HTTP_LENGTH// /}
    shopt -u nocasematch
  done
}

# http_get HOST:PORT PATH FILE: http_open's body into FILE (- for stdout);
# fails unless the answer is a 200. The body is Content-Length bytes (head
# -c: no wait for the server to close), or everything to the close where
# there is none.
http_get() {
  http_open "$1" "$2" || return 1
  # "-": the inherited stdout, not /dev/stdout reopened (empty in a guest)
  if [ "$3" = - ]; then
    if [ -n "$HTTP_LENGTH" ]; then head -c "$HTTP_LENGTH" <&"$HTTP_FD"; else cat <&"$HTTP_FD"; fi
  elif [ -n "$HTTP_LENGTH" ]; then head -c "$HTTP_LENGTH" <&"$HTTP_FD" >"$3"; else cat <&"$HTTP_FD" >"$3"; fi
  exec {HTTP_FD}>&-
  [[ $HTTP_STATUS == "HTTP/1."[01]" 200"* ]]
}

start_agent() {
  launch_agent "$@"
  wait_agent_ready 60
}

# stop_agent: SIGTERM, expect exit 0 (how long it took: $EXIT_MS).
stop_agent() {
  [ -n "$AGENT_PID" ] || return 0
  stop_child AGENT_PID agent
}

# reload_agent: SIGHUP; returns once the agent logs that it reloaded.
reload_agent() {
  local done='SIGHUP: configuration reloaded' before
  before=$(grep -c "$done" "$OUT/agent.log" || true)
  kill -HUP "$AGENT_PID"
  # shellcheck disable=SC2016 # bash -c's own arguments
  wait_until 30 bash -c '[ "$(grep -c "$1" "$2")" -gt "$3" ]' _ "$done" "$OUT/agent.log" "$before" || fail "no reload"
}

# probe_target NAME ADDRESS INTERVAL_S PINGS TIMEOUT_S [EXTRA_LINE]: a
# [[targets]] table of the agent's configuration file, on stdout.
probe_target() {
  printf '[[targets]]\nname = "%s"\naddress = "%s"\ninterval_seconds = %s\njitter = 0\npings = %s\ntimeout_seconds = %s\n' "${@:1:5}"
  [ -z "${6:-}" ] || printf '%s\n' "$6"
}

# capset "CAP_BPF CAP_PERFMON": "-all,+bpf,+perfmon", for setpriv.
capset() {
  local out=-all c
  for c in $1; do c=${c#CAP_} && out+=",+${c,,}"; done
  echo "$out"
}

# launch_as_nobody CAPS MEMLOCK LOG AGENT_CMD...: starts the agent in the
# background the way packaging/qpwatch.service runs it: as user nobody with
# exactly the capabilities CAPS (ambient, inheritable and bounding), no new
# privileges and RLIMIT_MEMLOCK MEMLOCK; output to LOG, PID in $AGENT_PID.
launch_as_nobody() {
  local set
  set=$(capset "$1")
  prlimit --memlock="$2" setpriv --reuid=nobody --regid=nogroup --clear-groups --no-new-privs \
    --inh-caps="$set" --ambient-caps="$set" --bounding-set="$set" "${@:4}" >"$3" 2>&1 &
  AGENT_PID=$!
}

# start_events: `qpwatch events` streaming to $OUT/events.jsonl; returns once
# its rdma_cm hooks are attached. stop_events: SIGINT, expect exit 0.
start_events() {
  "$BIN/qpwatch" events --no-reconcile >"$OUT/events.jsonl" 2>"$OUT/events.log" &
  EVENTS_PID=$!
  wait_until 60 grep -q 'hooks attached instance="rdma_cm"' "$OUT/events.log" || fail "events stream did not attach"
}
stop_events() {
  kill -INT "$EVENTS_PID"
  wait "$EVENTS_PID" || fail "events stream exited non-zero"
  EVENTS_PID=
}

# events_cm_ids QP_NUM: the cm ids the event stream joins the QP to, one a line.
events_cm_ids() {
  jq -r --argjson qp "$1" 'select(.qp_num == $qp and .cm_id != null) | .cm_id' "$OUT/events.jsonl" | sort -u
}

# --- the agent's metrics

# scrape NAME: saves /metrics to $OUT/NAME.prom and prints the path. Over
# plain HTTP through http_get (no curl: its start alone took 0.3 s of a
# 1-vCPU guest, bench/helper_costs); with TLS through curl.
scrape() {
  local file="$OUT/$1.prom"
  if [ -n "${AGENT_CACERT:-}" ]; then
    agent_curl -fsS "$(agent_url /metrics)" >"$file" || fail "scrape failed"
  else
    http_get "$AGENT_ADDR" /metrics "$file" || fail "scrape failed"
  fi
  echo "$file"
}

# scrape_ms N [PATH]: N request times (ms) over one kept-alive connection, as
# Prometheus scrapes; a first request that opens the connection is left out
# (under TCG, curl's connect -- its resolver thread -- alone takes ~10 ms).
scrape_ms() {
  local i urls=()
  for i in $(seq 0 "$1"); do urls+=(-o /dev/null "http://$AGENT_ADDR${2:-/metrics}"); done
  curl -fsS -w '%{num_connects} %{time_total}\n' "${urls[@]}" | awk 'NR > 1 { printf "%.2f\n", $2 * 1000 }'
}

# scrape_fresh NAME: a scrape (its file on stdout) whose sysfs counters
# (ib_cm's, the ports' and drivers') were read after the call: the agent
# reads them on a timer, so this waits for two more reads (the first may have
# begun before the call). Start the agent with a short
# --sysfs-counters-interval.
scrape_fresh() {
  local reads
  reads=$(metric "$(scrape "$1")" qpwatch_sysfs_reads_total)
  WAIT_INTERVAL=0.2 wait_until 60 sysfs_read_since "$reads" "$1" ||
    fail "the sysfs counters were not read twice within 60 s of the $1 scrape"
  echo "$OUT/$1.prom"
}
sysfs_read_since() { [ "$(metric "$(scrape "$2")" qpwatch_sysfs_reads_total)" -ge $(($1 + 2)) ]; }

# metric FILE SELECTOR: sum of the matching series (see promtext.awk).
metric() { awk -v sel="$2" -f "$REPO/tests/vm/promtext.awk" "$1"; }

# series_count FILE SELECTOR: number of matching series.
series_count() { awk -v sel="$2" -v mode=count -f "$REPO/tests/vm/promtext.awk" "$1"; }

# delta BEFORE AFTER SELECTOR
delta() { echo $(($(metric "$2" "$3") - $(metric "$1" "$3"))); }

# qp_events FILE: events received of the three QP kinds (a scrape file).
qp_events() {
  echo $(($(metric "$1" 'qpwatch_events_total{kind="qp_create"}') + $(metric "$1" 'qpwatch_events_total{kind="qp_modify"}') + $(metric "$1" 'qpwatch_events_total{kind="qp_destroy"}')))
}

# negative_gauges FILE: number of qpwatch_qps series below zero.
negative_gauges() {
  awk '/^qpwatch_qps\{/ && $NF + 0 < 0 { n++ } END { print n + 0 }' "$1"
}

# scraped_metric OP SELECTOR N: scrapes once (the file in $LAST, the sum in
# $LAST_VALUE) and compares the sum with N: OP is = (exactly) or -ge (at least).
scraped_metric() {
  LAST=$(scrape wait) || return 1
  LAST_VALUE=$(metric "$LAST" "$2")
  if [ "$1" = = ]; then [ "$LAST_VALUE" = "$3" ]; else test "${LAST_VALUE%.*}" "$1" "$3"; fi
}

# wait_for_metric SELECTOR EXPECTED [TIMEOUT_S]: polls until the sum equals
# EXPECTED (events are drained asynchronously); leaves the last scrape in $LAST.
wait_for_metric() {
  WAIT_INTERVAL=0.2 wait_until "${3:-30}" scraped_metric = "$1" "$2" && return 0
  log "timeout: $1 = $LAST_VALUE, expected $2"
  return 1
}

# wait_for_metric_at_least SELECTOR MIN [TIMEOUT_S]: polls until the sum is >= MIN.
wait_for_metric_at_least() {
  WAIT_INTERVAL=0.2 wait_until "${3:-30}" scraped_metric -ge "$1" "$2" && return 0
  log "timeout: $1 = $LAST_VALUE, expected at least $2"
  return 1
}

# --- the kernel's RDMA resources (`rdma res show`)

# res_count KIND [JQ_SELECT]: entries of `rdma -j res show KIND` (qp, mr,
# cm_id), all or those matching a jq select.
res_count() {
  rdma -j res show "$1" | jq "[.[] | select(${2:-true})] | length"
}

# res_count_is KIND OP N [JQ_SELECT]: res_count compared with N by test's OP
# (-eq, -ge, ...): a condition for wait_until.
res_count_is() {
  test "$(res_count "$1" "${4:-true}")" "$2" "$3"
}

# qp_in_rts PID: the process holds exactly one QP, in RTS.
qp_in_rts() { res_count_is qp -eq 1 ".pid == $1 and .state == \"RTS\""; }

# res_counts [JQ_SELECT]: "qp=N mr=N cm_id=N" (one jq run for all three).
res_counts() {
  { rdma -j res show qp; rdma -j res show mr; rdma -j res show cm_id; } |
    jq -rs "map([.[] | select(${1:-true})] | length) | \"qp=\(.[0]) mr=\(.[1]) cm_id=\(.[2])\""
}

# res_counts_are EXPECTED [JQ_SELECT]: res_counts equals EXPECTED (what it
# was is left in $RES_COUNTS).
res_counts_are() { RES_COUNTS=$(res_counts "${2:-true}") && [ "$RES_COUNTS" = "$1" ]; }

# wait_res_baseline WHAT EXPECTED [JQ_SELECT]: polls until res_counts equals EXPECTED.
wait_res_baseline() {
  if wait_until 60 res_counts_are "$2" "${3:-true}"; then
    log "ok: $1: $RES_COUNTS"
    return 0
  fi
  rdma res show qp >&2; rdma res show cm_id >&2
  fail "$1: expected $2, got $RES_COUNTS"
}

# restore_rxe: the RDMA stack loaded and rxe0 on qpw0, as tests/vm/guest.sh
# set them up (after a scenario unloaded them).
restore_rxe() {
  modprobe rdma_rxe && modprobe rdma_ucm
  rdma link show rxe0 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev qpw0
}

# --- rping traffic over rxe0

# cm_listening COMM: a process named COMM listens on an RDMA CM id.
cm_listening() { res_count_is cm_id -ge 1 ".state == \"LISTEN\" and .comm == \"$1\""; }

# wait_listener COMM [TIMEOUT_S]: until cm_listening COMM (30 s), or fails.
wait_listener() {
  wait_until "${2:-30}" cm_listening "$1" || fail "$1 server not listening"
}

# qp_die MODE FILE: tests/vm/lib/qp_die.py on rxe0 in MODE (sq-drained,
# retry-exceeded), its report in FILE; fails (showing it) unless it exits 0.
qp_die() {
  timeout 60 /usr/bin/python3 -u "$REPO/tests/vm/lib/qp_die.py" rxe0 "$1" >"$2" 2>&1 ||
    { cat "$2" >&2; fail "qp_die.py $1"; }
}

# rping_once COUNT [rping client flags...]: an rping server and client
# exchanging COUNT pings; fails unless both exit 0. Logs:
# $OUT/rping-server.log (appended to), $OUT/rping-client.log.
rping_once() {
  local count=$1 server
  shift
  rping -s -a "$RXE_ADDR" -C "$count" >>"$OUT/rping-server.log" 2>&1 &
  server=$!
  wait_listener rping
  rping -c -a "$RXE_ADDR" -C "$count" "$@" >"$OUT/rping-client.log" 2>&1 || fail "rping client failed"
  wait "$server" || fail "rping server failed"
}

# start_rping_connection: an rping server and a client, connected and then
# stopped (SIGSTOP) until they are killed; returns once both QPs are in RTS.
# Their PIDs are in $RPING_PIDS.
start_rping_connection() {
  rping -s -a "$RXE_ADDR" >>"$OUT/rping-server.log" 2>&1 &
  RPING_PIDS=$!
  wait_listener rping
  rping -c -a "$RXE_ADDR" >>"$OUT/rping-client.log" 2>&1 &
  RPING_PIDS="$RPING_PIDS $!"
  wait_until 30 res_count_is qp -ge 2 '.comm == "rping" and .state == "RTS"' || fail "rping not connected"
  # Connected, then idle: attaching or detaching a kprobe on rxe_cq_post while
  # it runs on another vCPU crashes this TCG guest (a NULL RIP at its entry,
  # from do_complete) or never returns; bpftrace does the same
  # (tests/vm/repro/kprobe_race.sh). The QPs and CM ids stay up.
  # shellcheck disable=SC2086 # two PIDs
  kill -STOP $RPING_PIDS
}

# kill_rping_connection: SIGKILL to both ends of start_rping_connection;
# returns once the kernel has destroyed their QPs.
kill_rping_connection() {
  # shellcheck disable=SC2086 # two PIDs
  kill_wait $RPING_PIDS
  RPING_PIDS=
  wait_until 30 res_count_is qp -eq 0 '.comm == "rping"' || fail "the kernel kept the killed rpings' QPs"
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

# shellcheck source=lib/runner.sh
source "${BASH_SOURCE[0]%/*}/lib/runner.sh"
# shellcheck source=lib/probe.sh
source "${BASH_SOURCE[0]%/*}/lib/probe.sh"
# shellcheck source=lib/load.sh
source "${BASH_SOURCE[0]%/*}/lib/load.sh"
# --- Debian's Prometheus, for the scenarios that check what it sees

PROM=${PROM:-127.0.0.1:9090}
PROM_PID=

# run_prometheus: Prometheus on $PROM with $OUT/prometheus.yml and a fresh
# TSDB, in the background (its PID in $PROM_PID; stopped and the TSDB removed
# when the scenario ends); returns at once: it is slow to start under
# emulation.
run_prometheus() {
  local tsdb
  tsdb=$(mktemp -d /tmp/prom-tsdb.XXXXXX)
  prometheus --config.file="$OUT/prometheus.yml" --storage.tsdb.path="$tsdb" \
    --web.listen-address="$PROM" --log.level=warn >"$OUT/prometheus.log" 2>&1 &
  PROM_PID=$!
  on_exit "kill $PROM_PID; wait $PROM_PID; rm -rf $tsdb"
}

# prom_query EXPR: the instant query's JSON answer (through http_get).
prom_query() { http_get "$PROM" "/api/v1/query?query=$(urlencode "$1")" - 2>/dev/null; }

# urlencode STRING: STRING percent-encoded, RFC 3986's unreserved characters
# kept (in bash: no fork of curl or python).
urlencode() {
  local LC_ALL=C s=$1 out= c i # bytes, not characters
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case $c in
      [a-zA-Z0-9.~_-]) out+=$c ;;
      *) printf -v c '%%%02X' "'$c"; out+=$c ;;
    esac
  done
  printf '%s' "$out"
}

# prom_has EXPR: the instant query has a result.
prom_has() { prom_query "$1" | jq -e '.data.result | length > 0' >/dev/null 2>&1; }

# shellcheck source=lib/fleet.sh
source "${BASH_SOURCE[0]%/*}/lib/fleet.sh"
# shellcheck source=lib/mesh.sh
source "${BASH_SOURCE[0]%/*}/lib/mesh.sh"

cleanup_scenario() {
  local cmd
  for cmd in "${ON_EXIT[@]}"; do eval "$cmd" >/dev/null 2>&1 || true; done
  if [ -n "$RESPONDER_PID" ]; then kill -9 "$RESPONDER_PID" 2>/dev/null || true; fi
  if [ -n "$EVENTS_PID" ]; then kill -INT "$EVENTS_PID" 2>/dev/null || true; fi
  if [ -n "$BT_PID" ]; then kill -9 "$BT_PID" 2>/dev/null || true; fi
  if [ -n "$AGENT_PID" ]; then kill -TERM "$AGENT_PID" 2>/dev/null || true; wait "$AGENT_PID" 2>/dev/null || true; fi
  pkill -x rping 2>/dev/null || true
  pkill -x rdma-probe 2>/dev/null || true
}
trap cleanup_scenario EXIT
