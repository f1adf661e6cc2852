# Benchmark (prints figures, asserts only that everything ran): the cost of
# watching QP lifecycles. qp-churn (loopback RC pairs: create, INIT, RTR,
# RTS, destroy; 1 thread, flat out) runs with
#   (a) nothing attached,
#   (b) qpwatch attached (default flags),
#   (c) bpftrace bench/qpwatch.bt attached (same hooks, per-QP maps in the kernel),
#   (d) bpftrace bench/hooks-only.bt attached (same hooks, empty programs: the
#       probe mechanism's own cost, the floor under (b) and (c)),
#   (e) qpwatch attached but stopped (SIGSTOP) while the churn runs, its ring
#       holding the records: qpwatch's in-kernel cost without its userspace,
# interleaved, ROUNDS times, each timed churn after BENCH_WARMUP (100)
# untimed lifecycles in its mode; per-operation latency medians (the median over
# rounds of each run's p50) and the ratios to (a). Then, with the kernel's BPF
# run-time statistics on, one more churn under (b), (c) and (d): the time
# each program spends per call (bpftool's run_time_ns / run_cnt). Then, with the
# agent attached: agent CPU per 1,000 lifecycles, the event rate it keeps up
# with (flat-out churn at 1, 2, 4 threads; and the rate at which it drains a
# ring it could not read for a while), /metrics scrape time with HOLD QPs open,
# and its peak RSS. Writes $OUT/summary.txt and $OUT/table.md.
# BENCH_ONLY=churn: only the interleaved rounds and the slowdowns (for
# repeating the churn-loop comparison without the rest).
# BENCH_ONLY=idle: an idle agent's CPU and system calls per second.
# BENCH_ONLY=bpf: only the BPF run-time statistics (a few minutes: for
# measuring a change to the programs before a full run); with BENCH_ALT_BIN,
# the other qpwatch builds in every repetition too.
# BENCH_ALT_BIN: directories holding other qpwatch builds, separated by
# spaces, run in turn after this one in the bpf, scrape and idle modes.
# BENCH_PIN=1 (with 2 vCPUs or more): the bench, qp-churn and bpftrace on
# CPU 0, the agent's threads on CPU 1 (do the agent and the churn share a
# CPU?).
# vm-timeout: 2400
# With the guest's idle vCPU halted, every wake-up of or call to the other
# vCPU waits for the host to run that vCPU's thread: the RTR modify took 200
# to 290 µs on two vCPUs against 77 on one, and a churn with nothing
# attached took up to twice as long from one round to the next. With the
# idle vCPU polling, the RTR modify took 84 to 102 µs (bench/RESULTS.md
# round 17). The other modes boot as the suite does (the scrape under
# idle=poll: 5.46 and 11.57 ms against 6.27 and 4.69 halting, not settled).
# vm-kernel-args if BENCH_ONLY=churn: idle=poll
ROUNDS=${BENCH_ROUNDS:-5}
LC=${BENCH_LIFECYCLES:-1000}
RAMP_LC=${BENCH_RAMP_LIFECYCLES:-2500}
HOLD=${BENCH_HOLD:-10000}
table=$OUT/table.md
read -ra ALT_BINS <<<"${BENCH_ALT_BIN:-}"
: >"$table"
row() { echo "$*" >>"$table"; }
OPS=(create modify_init modify_rtr modify_rts destroy)

# p50s RUN: "create init rtr rts destroy lifecycle typical" in ns (lifecycle:
# churn time per lifecycle; typical: the five operations' medians added up,
# which the rare long calls that weigh on the churn time leave out).
p50s() {
  jq -r '[.latency.create.p50_ns, .latency.modify_init.p50_ns, .latency.modify_rtr.p50_ns,
          .latency.modify_rts.p50_ns, .latency.destroy.p50_ns, (.churn_elapsed_ns / .counts.lifecycles | floor),
          ([.latency[].p50_ns] | add)] | @tsv' "$OUT/$1.json"
}
# arrived NAME BEFORE WANT: the agent has received WANT QP events (or lost some).
arrived() { [ "$(qp_events "$(scrape "$1-after")")" -ge "$3" ] || [ "$(metric "$OUT/$1-after.prom" qpwatch_events_lost_total)" -gt "$(metric "$2" qpwatch_events_lost_total)" ]; }
# collect_churn NAME BEFORE [LATE_NOTE]: waits until the agent has NAME's
# events (logging LATE_NOTE if the first check finds them still arriving),
# then sets LOST (delta since the BEFORE scrape) and counts the lifecycles.
collect_churn() {
  local name=$1 b=$2 want
  want=$(($(qp_events "$b") + $(jq .counts.kernel_calls "$OUT/$name.json")))
  if ! arrived "$name" "$b" "$want"; then
    [ -z "${3:-}" ] || log "$name: $3"
    wait_until 60 arrived "$name" "$b" "$want" || log "$name: events missing"
  fi
  LOST=$(delta "$b" "$(scrape "$name-after")" qpwatch_events_lost_total)
  AGENT_LIFECYCLES=$((AGENT_LIFECYCLES + $(jq .counts.lifecycles "$OUT/$name.json")))
}
# paused_churn NAME [flags]: a churn while the agent is stopped (SIGSTOP), so
# only its programs run; then it is continued and drains. Sets LOST (delta).
paused_churn() {
  local name=$1 b
  shift
  b=$(scrape "$name-before")
  kill -STOP "$AGENT_PID"
  churn "$name" "$@"
  kill -CONT "$AGENT_PID"
  collect_churn "$name" "$b"
}
# agent_churn NAME [flags]: a churn with the agent attached; waits until its
# events have arrived; sets CPU_NS (agent CPU during the churn and its drain,
# without the scrapes that check arrival) and LOST (delta).
agent_churn() {
  local name=$1 b n0
  shift
  b=$(scrape "$name-before")
  n0=$(cpu_ns "$AGENT_PID")
  churn "$name" "$@"
  sleep 0.5 # > 2 drain intervals (100 ms): the churn's tail is drained; no scrape yet
  CPU_NS=$(($(cpu_ns "$AGENT_PID") - n0))
  # the first check's scrape is the one the CPU figure would miss events of
  collect_churn "$name" "$b" "events still arriving 0.5 s after the churn (CPU figure is low)"
}
# warm NAME: BENCH_WARMUP lifecycles (default 100), untimed, before NAME's
# timed churn in every mode: the timed runs see each tool in its steady
# state, not its first calls after attaching (the agent's first events make
# its metric series and, under TCG, translate its code).
warm() {
  [ "${BENCH_WARMUP:-100}" -gt 0 ] || return 0
  churn "$1-warmup" --lifecycles "${BENCH_WARMUP:-100}" --threads 1
  [[ $1 != b* ]] || AGENT_LIFECYCLES=$((AGENT_LIFECYCLES + $(jq .counts.lifecycles "$OUT/$1-warmup.json")))
  sleep 0.5 # > 2 drain intervals: the agent has read them before the timed churn's first scrape
}
AGENT_LIFECYCLES=0 B_LOST=0
MODES=(a b c d e)
declare -A P50 # P50[mode,op_index] = space-separated per-round p50s
cpu_per_k=()
# per_syscall FILE N: an `strace -c` summary divided by N: "total (name n, ...)".
per_syscall() {
  echo "$(awk -v n="$2" '$NF == "total" { printf "%.1f", $4 / n }' "$1") ($(awk -v n="$2" '$1 ~ /^[0-9.]+$/ && $NF != "total" { printf "%s %.1f, ", $NF, $4 / n }' "$1" | sed 's/, $//'))"
}
# BENCH_ONLY=scrape: /metrics and /healthz over one kept-alive connection,
# each agent fresh, BENCH_SCRAPE_REPS times; with BENCH_ALT_BIN the builds
# in turn, for comparing them.
# BENCH_SCRAPE_HOLD=N: with N more QPs held open by qp-churn meanwhile (each
# agent adopts them at start-up, from RDMA netlink).
if [ "${BENCH_ONLY:-}" = scrape ]; then
  bins=("$BIN" "${ALT_BINS[@]}")
  say "scrape benchmark ($(nproc) vCPUs): builds ${bins[*]}"
  held=${BENCH_SCRAPE_HOLD:-0}
  if [ "$held" -gt 0 ]; then
    start_churn hold --hold "$held" --lifecycles 0 --threads 2
    wait_phase hold held 900 || fail "qp-churn did not hold $held QPs"
    say "qp-churn holds $held QPs"
  fi
  declare -A SCRAPES=()
  for rep in $(seq 1 "${BENCH_SCRAPE_REPS:-3}"); do
    for i in "${!bins[@]}"; do
      : >"$OUT/agent.log"
      BIN=${bins[$i]} start_agent
      [ "$held" -eq 0 ] || wait_for_metric_at_least qpwatch_qps "$held" 120 || fail "agent does not show $held live QPs"
      sleep 5
      mapfile -t m < <(scrape_ms 21)
      mapfile -t h < <(scrape_ms 11 /healthz)
      SCRAPES[$i]="${SCRAPES[$i]:-} $(median "${m[@]}")"
      say "repetition $rep, ${bins[$i]}: /metrics median $(median "${m[@]}") ms (min $(printf '%s\n' "${m[@]}" | sort -g | head -n1)), /healthz median $(median "${h[@]}") ms, $(curl -fsS "http://$AGENT_ADDR/metrics" | wc -c) bytes"
      # the agent's system calls over 20 more scrapes (not timed: strace
      # slows every call), a figure other work on the machine cannot move
      strace -f -c -qq -o "$OUT/strace.txt" -p "$AGENT_PID" &
      strace_pid=$!
      sleep 2
      scrape_ms 19 >/dev/null
      kill -INT "$strace_pid" && wait "$strace_pid" || true
      say "repetition $rep, ${bins[$i]}: system calls per scrape $(per_syscall "$OUT/strace.txt" 20)"
      stop_agent
    done
  done
  for i in "${!bins[@]}"; do
    # shellcheck disable=SC2086 # one figure a word
    say "${bins[$i]}: /metrics medians${SCRAPES[$i]}; median of them $(median ${SCRAPES[$i]}) ms"
  done
  [ "$held" -eq 0 ] || stop_churn
  return 0
fi
# BENCH_ONLY=idle: an idle agent's CPU (µs per second, over 10 s) and its
# system calls per second (over another 10 s, under strace), each agent
# fresh, BENCH_IDLE_REPS times; with BENCH_ALT_BIN the builds in turn.
if [ "${BENCH_ONLY:-}" = idle ]; then
  bins=("$BIN" "${ALT_BINS[@]}")
  say "idle benchmark ($(nproc) vCPUs, clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)): builds ${bins[*]}"
  declare -A IDLE=()
  for rep in $(seq 1 "${BENCH_IDLE_REPS:-3}"); do
    for i in "${!bins[@]}"; do
      : >"$OUT/agent.log"
      BIN=${bins[$i]} start_agent
      sleep 5
      n0=$(cpu_ns "$AGENT_PID")
      sleep 10
      us=$((($(cpu_ns "$AGENT_PID") - n0) / 10000))
      IDLE[$i]="${IDLE[$i]:-} $us"
      strace -f -c -qq -o "$OUT/strace-idle.txt" -p "$AGENT_PID" &
      strace_pid=$!
      sleep 10
      kill -INT "$strace_pid" && wait "$strace_pid" || true
      say "repetition $rep, ${bins[$i]}: idle CPU $us µs/s; system calls per second $(per_syscall "$OUT/strace-idle.txt" 10)"
      stop_agent
    done
  done
  for i in "${!bins[@]}"; do
    # shellcheck disable=SC2086 # one figure a word
    say "${bins[$i]}: idle CPU per repetition${IDLE[$i]} µs/s; median $(median ${IDLE[$i]}) µs/s"
  done
  return 0
fi
BPF_ONLY=
[ "${BENCH_ONLY:-}" = bpf ] && BPF_ONLY=1 ROUNDS=0
say "benchmark: qp-churn on rxe0 (QEMU TCG guest, $(nproc) vCPUs, kernel $(uname -r), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource), idle $(grep -qw idle=poll /proc/cmdline && echo polling || echo halting)), $LC lifecycles per run, 1 thread, $ROUNDS interleaved rounds of (a) nothing, (b) qpwatch, (e) qpwatch with its agent stopped, (c) bpftrace qpwatch.bt, (d) bpftrace hooks-only.bt"
if [ "${BENCH_PIN:-0}" = 1 ]; then
  taskset -pc 0 $$ >/dev/null || fail "taskset on the bench shell"
  say "pinned: the bench, qp-churn and bpftrace on CPU 0, the agent on CPU 1"
fi
for r in $(seq 1 "$ROUNDS"); do
  warm "a$r"
  churn "a$r" --lifecycles "$LC" --threads 1
  : >"$OUT/agent.log"
  start_agent
  [ "${BENCH_PIN:-0}" != 1 ] || taskset -apc 1 "$AGENT_PID" >/dev/null || fail "taskset on the agent"
  [ -n "${OFFSETS:-}" ] || OFFSETS=$(qp_offsets "$OUT/agent.log") || fail "no BTF offsets in the agent log"
  warm "b$r"
  agent_churn "b$r" --lifecycles "$LC" --threads 1
  B_LOST=$((B_LOST + LOST))
  cpu_per_k+=("$(awk -v ns="$CPU_NS" -v n="$LC" 'BEGIN { printf "%.3f", ns / 1e9 / n * 1000 }')")
  paused_churn "e$r" --lifecycles "$LC" --threads 1 # 5,000 records: within the 1 MiB ring
  B_LOST=$((B_LOST + LOST))
  stop_agent
  start_bpftrace "c$r" qpwatch.bt $OFFSETS
  warm "c$r"
  churn "c$r" --lifecycles "$LC" --threads 1
  stop_bpftrace "c$r"
  grep -q '^@created: ' "$OUT/bpftrace-c$r.out" || say "round $r: bpftrace printed no @created ($(tail -n1 "$OUT/bpftrace-c$r.out"))"
  start_bpftrace "d$r" hooks-only.bt
  warm "d$r"
  churn "d$r" --lifecycles "$LC" --threads 1
  stop_bpftrace "d$r"
  line="round $r: per lifecycle"
  for m in "${MODES[@]}"; do
    read -r -a v < <(p50s "$m$r")
    for i in 0 1 2 3 4 5 6; do P50[$m,$i]="${P50[$m,$i]:-} ${v[$i]}"; done
    line="$line $m ${v[5]} ns"
  done
  la=$(p50s "a$r" | cut -f6) lb=$(p50s "b$r" | cut -f6) lc=$(p50s "c$r" | cut -f6) ld=$(p50s "d$r" | cut -f6) le=$(p50s "e$r" | cut -f6)
  say "$line | (b)/(a) $(ratio "$lb" "$la") (c)/(a) $(ratio "$lc" "$la") (d)/(a) $(ratio "$ld" "$la") (e)/(a) $(ratio "$le" "$la") | agent CPU ${cpu_per_k[-1]} s/1000 lifecycles, lost $LOST | bpftrace @created $(sed -n 's/^@created: //p' "$OUT/bpftrace-c$r.out")"
done

us() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1000 }'; }
if [ -z "$BPF_ONLY" ]; then
row "| operation | (a) nothing, µs | (b) qpwatch, µs | (c) bpftrace, µs | (d) hooks only, µs | (e) qpwatch, agent stopped, µs | (b)/(a) | (c)/(a) | (d)/(a) | (e)/(a) |"
row "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
names=(ibv_create_qp "ibv_modify_qp → INIT" "ibv_modify_qp → RTR" "ibv_modify_qp → RTS" ibv_destroy_qp "whole lifecycle (churn time / QP)" "typical lifecycle (the five medians added up)")
for i in 0 1 2 3 4 5 6; do
  ma=$(median ${P50[a,$i]}) mb=$(median ${P50[b,$i]}) mc=$(median ${P50[c,$i]}) md=$(median ${P50[d,$i]}) me=$(median ${P50[e,$i]})
  row "| ${names[$i]} | $(us "$ma") | $(us "$mb") | $(us "$mc") | $(us "$md") | $(us "$me") | $(ratio "$mb" "$ma") | $(ratio "$mc" "$ma") | $(ratio "$md" "$ma") | $(ratio "$me" "$ma") |"
  say "median p50 ${names[$i]}: a $(us "$ma") us, b $(us "$mb") us, c $(us "$mc") us, d $(us "$md") us, e $(us "$me") us; (b)/(a) $(ratio "$mb" "$ma"), (c)/(a) $(ratio "$mc" "$ma"), (d)/(a) $(ratio "$md" "$ma"), (e)/(a) $(ratio "$me" "$ma")"
  if [ "$i" -eq 5 ]; then RB=$(ratio "$mb" "$ma") RC=$(ratio "$mc" "$ma") RD=$(ratio "$md" "$ma") RE=$(ratio "$me" "$ma"); fi
  if [ "$i" -eq 6 ]; then TB=$(ratio "$mb" "$ma") TC=$(ratio "$mc" "$ma"); fi
done
cpu_med=$(median "${cpu_per_k[@]}")
fi
if [ "${BENCH_ONLY:-}" = churn ]; then
  slowdown() { awk -v r="$1" 'BEGIN { printf "%.1f", (r - 1) * 100 }'; }
  # Most rounds' baseline in slow stretches of the host makes the median
  # baseline slow and every tool look faster than none (bench/RESULTS.md
  # round 22, run P16: 731, 844 and 670 µs against 461 and 439).
  # shellcheck disable=SC2086 # one figure a word
  a_fastest=$(min ${P50[a,5]}) a_median=$(median ${P50[a,5]})
  if awk -v m="$a_median" -v f="$a_fastest" 'BEGIN { exit !(m > 1.25 * f) }'; then
    say "WARNING: with nothing attached, the median round took $(us "$a_median") us per lifecycle against $(us "$a_fastest") in the fastest: most rounds ran in slow stretches of the host, and this run's slowdowns are not figures"
  fi
  say "churn-loop slowdown: qpwatch (b) +$(slowdown "$RB") %, bpftrace (c) +$(slowdown "$RC") %, hooks only (d) +$(slowdown "$RD") %, agent stopped (e) +$(slowdown "$RE") %; (b)/(c) $(awk -v b="$RB" -v c="$RC" 'BEGIN { printf "%.2f", (b - 1) / (c - 1) }') (goal: at most 0.5); in the typical lifecycle: (b) +$(slowdown "$TB") %, (c) +$(slowdown "$TC") %, (b)/(c) $(awk -v b="$TB" -v c="$TC" 'BEGIN { printf "%.2f", (b - 1) / (c - 1) }')"
  return 0
fi

# --- in-kernel cost per program call: BPF run-time statistics (they slow
# every program a little, so none of the timed runs above has them on)
STATS_LC=${BENCH_BPF_LIFECYCLES:-1000}
STATS_REPS=${BENCH_BPF_REPS:-3}
on_exit 'sysctl -qw kernel.bpf_stats_enabled=0'
per_lc() { us_per_lifecycle "$1" "$STATS_LC"; }
# stats_churn NAME: a warm-up churn, then STATS_LC lifecycles with the BPF
# run-time statistics on. Under TCG the first calls of a freshly loaded
# program include translating its JIT code (hundreds of µs, counted in
# run_time_ns): over 300 calls, 5 to 17 µs per modify return for the same
# code. The agent drains its ring meanwhile, as it does in use (stopped, it
# was woken by every record once its ring passed the wakeup mark before
# 304d1e2, and the returns took 3 to 4 times as long). On 2 vCPUs of this
# 2-core host, its draining slows the other vCPU: 55 to 87 µs per lifecycle
# from one repetition to the next; BENCH_ONLY=bpf runs are meant for
# VM_CPUS=1.
stats_churn() {
  churn "$1-warmup" --lifecycles 50 --threads 1
  sysctl -qw kernel.bpf_stats_enabled=1
  churn "$1" --lifecycles "$STATS_LC" --threads 1
}
# stats_cost NAME: bpf_cost NAME, then the statistics off again.
stats_cost() {
  bpf_cost "$1"
  sysctl -qw kernel.bpf_stats_enabled=0
}
stats_b=() stats_c=() stats_d=() stats_ratio=()
# BENCH_ONLY=bpf with BENCH_ALT_BIN: every build in each repetition, beside
# the same bpftrace runs.
stats_bins=("$BIN")
[ -z "$BPF_ONLY" ] || stats_bins+=("${ALT_BINS[@]}")
declare -A STATS_ALT=() # STATS_ALT[build index] = per-repetition µs and ratios
for rep in $(seq 1 "$STATS_REPS"); do
  bpf_bins=()
  for i in "${!stats_bins[@]}"; do
    : >"$OUT/agent.log"
    BIN=${stats_bins[$i]} start_agent
    sleep 5 # the agent's start-up work (reconciling, trimming) done
    b=$(scrape "stats-b$rep-$i-before")
    stats_churn "stats-b$rep-$i"
    bpf_bins+=("$(stats_cost "b$rep-$i")")
    collect_churn "stats-b$rep-$i" "$b"
    [ "$LOST" -eq 0 ] || say "repetition $rep, ${stats_bins[$i]}: the agent lost $LOST events"
    B_LOST=$((B_LOST + LOST))
    stop_agent
    [ -n "${OFFSETS:-}" ] || OFFSETS=$(qp_offsets "$OUT/agent.log") || fail "no BTF offsets in the agent log"
  done
  bpf_b=${bpf_bins[0]}
  start_bpftrace "stats-c$rep" qpwatch.bt $OFFSETS
  stats_churn "stats-c$rep"
  bpf_c=$(stats_cost "c$rep")
  stop_bpftrace "stats-c$rep"
  start_bpftrace "stats-d$rep" hooks-only.bt
  stats_churn "stats-d$rep"
  bpf_d=$(stats_cost "d$rep")
  stop_bpftrace "stats-d$rep"
  stats_b+=("$(per_lc "$bpf_b")") stats_c+=("$(per_lc "$bpf_c")") stats_d+=("$(per_lc "$bpf_d")")
  stats_ratio+=("$(ratio "$bpf_b" "$bpf_c")")
  say "BPF run time per lifecycle, repetition $rep ($STATS_LC lifecycles after 50 of warm-up, kernel.bpf_stats_enabled): qpwatch ${stats_b[-1]} us (its churn $(churn_us "stats-b$rep-0") us per lifecycle), bpftrace qpwatch.bt ${stats_c[-1]} us ($(churn_us "stats-c$rep") us), hooks-only ${stats_d[-1]} us ($(churn_us "stats-d$rep") us); qpwatch/bpftrace ${stats_ratio[-1]}"
  for i in "${!stats_bins[@]}"; do
    [ "$i" -gt 0 ] || continue
    STATS_ALT[$i,us]="${STATS_ALT[$i,us]:-} $(per_lc "${bpf_bins[$i]}")"
    STATS_ALT[$i,ratio]="${STATS_ALT[$i,ratio]:-} $(ratio "${bpf_bins[$i]}" "$bpf_c")"
    say "  the other build (${stats_bins[$i]}): qpwatch $(per_lc "${bpf_bins[$i]}") us (its churn $(churn_us "stats-b$rep-$i") us per lifecycle); qpwatch/bpftrace $(ratio "${bpf_bins[$i]}" "$bpf_c")"
  done
  for i in "${!stats_bins[@]}"; do
    say "  b (${stats_bins[$i]}): $(bpf_cost_detail "b$rep-$i")"
  done
  say "  c: $(bpf_cost_detail "c$rep")"
done
BPF_B=$(median "${stats_b[@]}") BPF_C=$(median "${stats_c[@]}") BPF_D=$(median "${stats_d[@]}")
BPF_RATIO=$(median "${stats_ratio[@]}")
say "BPF run time per lifecycle, median of $STATS_REPS: qpwatch $BPF_B us, bpftrace qpwatch.bt $BPF_C us, hooks-only $BPF_D us; qpwatch/bpftrace $BPF_RATIO (each: ${stats_ratio[*]})"
for i in "${!stats_bins[@]}"; do
  [ "$i" -gt 0 ] || continue
  # shellcheck disable=SC2086 # one figure a word
  say "the other build (${stats_bins[$i]}), median of $STATS_REPS: qpwatch $(median ${STATS_ALT[$i,us]}) us; qpwatch/bpftrace $(median ${STATS_ALT[$i,ratio]}) (each:${STATS_ALT[$i,ratio]})"
done
[ -z "$BPF_ONLY" ] || return 0

# --- the agent alone: sustained rate, drain rate, scrape at HOLD live QPs, RSS
: >"$OUT/agent.log"
start_agent
ramp=() best_rate=0 first_loss=
for t in 1 2 4; do
  agent_churn "ramp$t" --lifecycles "$RAMP_LC" --threads "$t"
  rate=$(jq -r '.counts.kernel_calls / (.churn_elapsed_ns / 1e9) | floor' "$OUT/ramp$t.json")
  say "flat-out churn, $t threads: $rate events/s offered ($(jq -r '.lifecycles_per_s | floor' "$OUT/ramp$t.json") lifecycles/s), lost $LOST, agent CPU $(awk -v ns="$CPU_NS" 'BEGIN { printf "%.2f", ns / 1e9 }') s"
  ramp+=("$t threads: $rate/s, lost $LOST")
  if [ "$LOST" -eq 0 ]; then [ "$rate" -gt "$best_rate" ] && best_rate=$rate; else first_loss=${first_loss:-$rate}; fi
done
# Drain rate: the agent is stopped while a burst that fits the ring is
# written, then continued; time until every event is received.
b=$(scrape drain-before)
kill -STOP "$AGENT_PID"
on_exit "kill -CONT $AGENT_PID"
churn drain --lifecycles 1000 --threads 2 # 5,000 records: well inside the 1 MiB ring
want=$(($(qp_events "$b") + $(jq .counts.kernel_calls "$OUT/drain.json")))
c0=$(cpu_ticks "$AGENT_PID")
t0=$(date +%s%N)
kill -CONT "$AGENT_PID"
drained() { # received, or lost if the burst did not fit after all
  local s; s=$(scrape drain-after)
  [ $(($(qp_events "$s") + $(delta "$b" "$s" qpwatch_events_lost_total))) -ge "$want" ]
}
wait_until 120 drained || log "drain: events missing"
t1=$(date +%s%N)
drain_events=$(($(qp_events "$OUT/drain-after.prom") - $(qp_events "$b")))
drain_lost=$(delta "$b" "$OUT/drain-after.prom" qpwatch_events_lost_total)
drain_rate=$(awk -v n="$drain_events" -v ns="$((t1 - t0))" 'BEGIN { printf "%d", n / (ns / 1e9) }')
drain_cpu=$(ticks_to_s $(($(cpu_ticks "$AGENT_PID") - c0)))
say "drain: $drain_events buffered events received in $(((t1 - t0) / 1000000)) ms after SIGCONT ($drain_rate events/s, lower bound: polled by scrapes; agent CPU $drain_cpu s), lost $drain_lost"
AGENT_LIFECYCLES=$((AGENT_LIFECYCLES + 1000))
mapfile -t s0 < <(scrape_ms 11)
scrape_idle=$(median "${s0[@]}")
mapfile -t h0 < <(scrape_ms 11 /healthz)
healthz=$(median "${h0[@]}")
base=$(metric "$(scrape hold-before)" qpwatch_qps)
start_churn hold --hold "$HOLD" --lifecycles 0 --threads 2
wait_phase hold held 900 || fail "qp-churn did not hold $HOLD QPs"
wait_for_metric qpwatch_qps $((base + HOLD)) 120 || fail "agent does not show $HOLD more live QPs"
mapfile -t s1 < <(scrape_ms 21)
scrape_hold=$(median "${s1[@]}")
scrape_hold_max=$(printf '%s\n' "${s1[@]}" | sort -g | tail -n1)
bytes=$(curl -fsS "http://$AGENT_ADDR/metrics" | wc -c)
rss_hold=$(status_kib "$AGENT_PID" VmRSS)
say "scrape: /healthz (HTTP alone) median $healthz ms; /metrics median $scrape_idle ms with $base live QPs; median $scrape_hold ms (max $scrape_hold_max ms, $bytes bytes) with $((base + HOLD)) live QPs; RSS then $rss_hold KiB"
stop_churn
wait_for_metric qpwatch_qps "$base" 300 || fail "held QPs not released in the agent's view"
AGENT_LIFECYCLES=$((AGENT_LIFECYCLES + HOLD))
end=$(scrape end)
AGENT_LOST=$((B_LOST + $(metric "$end" qpwatch_events_lost_total)))
peak=$(status_kib "$AGENT_PID" VmHWM)
rss_end=$(status_kib "$AGENT_PID" VmRSS)
stop_agent
say "agent: peak RSS (VmHWM) $peak KiB, RSS at the end $rss_end KiB; $AGENT_LIFECYCLES lifecycles seen by the agents (the (b) runs, the ramp, the drain, the held QPs), lost $AGENT_LOST"

met() { if awk "BEGIN { exit !($1) }"; then echo met; else echo "**unmet**"; fi; }
slow_b=$(awk -v r="$RB" 'BEGIN { printf "%.1f", (r - 1) * 100 }')
slow_c=$(awk -v r="$RC" 'BEGIN { printf "%.1f", (r - 1) * 100 }')
slow_d=$(awk -v r="$RD" 'BEGIN { printf "%.1f", (r - 1) * 100 }')
slow_e=$(awk -v r="$RE" 'BEGIN { printf "%.1f", (r - 1) * 100 }')
peak_mib=$(awk -v k="$peak" 'BEGIN { printf "%.1f", k / 1024 }')
row ""
row "| figure | value |"
row "| --- | ---: |"
row "| churn-loop slowdown, qpwatch (b) | +$slow_b % |"
row "| churn-loop slowdown, bpftrace (c) | +$slow_c % |"
row "| churn-loop slowdown, hooks only (d): the probe mechanism | +$slow_d % |"
row "| churn-loop slowdown, qpwatch with its agent stopped during the churn (e): its in-kernel part | +$slow_e % |"
row "| BPF program time per lifecycle: qpwatch / bpftrace / hooks only (run-time stats, $STATS_LC lifecycles, median of $STATS_REPS interleaved repetitions) | $BPF_B / $BPF_C / $BPF_D µs |"
row "| agent CPU per 1,000 QP lifecycles (median of $ROUNDS (b) runs; churn + drain, no scrapes) | $cpu_med s |"
row "| highest offered rate with 0 lost (flat-out churn; ${ramp[*]}) | $best_rate events/s${first_loss:+ (first loss at $first_loss/s)} |"
row "| drain rate of a full backlog ($drain_events events) | ≥ $drain_rate events/s |"
row "| /healthz request, the HTTP round trip alone (median of 11, kept-alive connection) | $healthz ms |"
row "| /metrics scrape, $base live QPs (median of 11, kept-alive connection) | $scrape_idle ms |"
row "| /metrics scrape, $((base + HOLD)) live QPs (median of 21, max) | $scrape_hold ms ($scrape_hold_max ms) |"
row "| agent RSS with $((base + HOLD)) live QPs | $(awk -v k="$rss_hold" 'BEGIN { printf "%.1f", k / 1024 }') MiB |"
row "| agent peak RSS (VmHWM) | $peak_mib MiB |"
row "| events lost, all agent runs ($AGENT_LIFECYCLES lifecycles) | $AGENT_LOST |"
row ""
row "| goal | figure | |"
row "| --- | --- | --- |"
row "| qpwatch slowdown ≤ ½ of bpftrace's | +$slow_b % vs +$slow_c % (hooks alone: +$slow_d %; qpwatch's programs without its agent running: +$slow_e %) | $(met "($RB - 1) <= 0.5 * ($RC - 1)") |"
row "| BPF program time ≤ 0.25 × bpftrace's | $BPF_RATIO (each repetition: ${stats_ratio[*]}) | $(met "$BPF_RATIO <= 0.25") |"
row "| 0 lost over 10,000 lifecycles | $AGENT_LOST lost over $AGENT_LIFECYCLES | $(met "$AGENT_LOST == 0 && $AGENT_LIFECYCLES >= 10000") |"
row "| scrape ≤ 5 ms at 10,000 live QPs | $scrape_hold ms | $(met "$scrape_hold <= 5 && $HOLD >= 10000") |"
row "| agent RSS ≤ 40 MiB | $peak_mib MiB peak | $(met "$peak <= 40 * 1024") |"
row "| agent CPU per 1,000 lifecycles reported | $cpu_med s | reported |"
cat "$table" >&2
