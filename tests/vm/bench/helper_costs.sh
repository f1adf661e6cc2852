# Benchmark (prints figures): what the scenarios' shell helpers cost in a
# QEMU TCG guest, per call, with an agent running: a subshell ($(...)), a
# fork and exec of /bin/true, awk, jq and curl starting, a /metrics scrape
# through curl (`scrape` before bench/RESULTS.md round 14) and through
# http_get (`scrape` since), and `metric` (tests/vm/promtext.awk) over the
# agent's scrape and over one the size of a fleet host's (the agent's own
# repeated to BENCH_SCRAPE_KB, 84 KiB by default: h1's in mesh_basic).
# CALLS calls of each, ROUNDS rounds in turn.
CALLS=${BENCH_CALLS:-20}
ROUNDS=${BENCH_ROUNDS:-3}
SCRAPE_KB=${BENCH_SCRAPE_KB:-84}
start_agent
one=$(scrape one)
big=$OUT/big.prom
: >"$big"
while [ "$(stat -c %s "$big")" -lt $((SCRAPE_KB * 1024)) ]; do
  # series made distinct per copy, as a fleet scrape's are per target
  sed "s/^\(qpwatch_[a-z_]*\){/\1{copy=\"$(stat -c %s "$big")\",/" "$one" >>"$big"
done
say "benchmark: helper costs in a QEMU TCG guest ($(nproc) vCPU), agent running, $CALLS calls x $ROUNDS rounds; scrape $(stat -c %s "$one") bytes, big $(stat -c %s "$big") bytes"
sel='qpwatch_events_total{kind="qp_create"}'
declare -A took=()
# per_call NAME COMMAND...: runs COMMAND CALLS times, adds ms per call to NAME
per_call() {
  local name=$1 t0 t1 i
  shift
  t0=$EPOCHREALTIME
  for ((i = 0; i < CALLS; i++)); do "$@" >/dev/null; done
  t1=$EPOCHREALTIME
  took[$name]+="$(awk -v a="$t0" -v b="$t1" -v n="$CALLS" 'BEGIN { printf "%.1f", (b - a) * 1000 / n }') "
}
subshell() { x=$(true); }
scrape_curl() { curl -fsS "http://$AGENT_ADDR/metrics" >"$OUT/bench.prom"; }
names=(subshell exec_true awk_start jq_start curl_start scrape_curl scrape metric_small metric_big)
for ((r = 1; r <= ROUNDS; r++)); do
  per_call subshell subshell
  per_call exec_true /bin/true
  per_call awk_start awk 'BEGIN { exit }'
  per_call jq_start jq -n 1
  per_call curl_start curl -fsS file:///dev/null
  per_call scrape_curl scrape_curl
  per_call scrape scrape bench
  per_call metric_small metric "$one" "$sel"
  per_call metric_big metric "$big" "$sel"
done
for name in "${names[@]}"; do
  # shellcheck disable=SC2086 # one figure a word
  say "$name: ${took[$name]}ms per call; median $(median ${took[$name]}) ms"
done
stop_agent
