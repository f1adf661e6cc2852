# Fleet mode helpers of tests/vm/lib.sh: the agents' UD probe mesh across the
# fleet's hosts (tests/vm/scenarios-fleet/mesh_*.sh). Sourced by
# tests/vm/lib.sh only.
#
# Every host runs an agent in fleet mode ([mesh]) whose targets file
# ($OUT/targets.json, Prometheus file_sd) lists the other hosts, each with
# labels rack and tor: h1 and h2 in rack a behind tor a1, h3 and up in rack b
# behind tor b1. A target's `target` label is the entry as written: the
# host's address (UD responder port: the default 9723).
# shellcheck shell=bash
# shellcheck disable=SC2153 # HOST_INDEX, FLEET_HOSTS, OUT: set by the fleet

MESH_INTERVAL=${MESH_INTERVAL:-0.1} # 10 probes/s per target
# The mesh scenarios watch the agents' own UD QPs only: the QP hooks. The
# rdma_cm instance's 38 hooks were most of each agent's start (three agents
# verifying their programs at once in 1-vCPU guests: 7 to 18 s); two_hosts,
# peers_discovery and qp_death_link start every group.
MESH_HOOK_GROUPS=${MESH_HOOK_GROUPS:-'"qp"'}
MESH_TARGETS=
# RTT buckets for the mesh (they are [buckets] probe_rtt): 250 µs steps where
# the emulated fleet's RTTs are (1 to 15 ms), so that a median is not
# interpolated across a 2.5 ms wide bucket, then 500 µs steps to 30 ms and
# 1 ms steps to 50 ms, where a loaded CI machine put them (a run's medians
# 13 to 36 ms, interpolated across buckets 5 and 10 ms wide) and a starved
# host's answers come.
MESH_RTT_BUCKETS="1e-4, 2.5e-4, 5e-4, 7.5e-4$(awk 'BEGIN { for (v = 1; v <= 15.001; v += 0.25) printf ", %ge-3", v; for (v = 15.5; v <= 30.001; v += 0.5) printf ", %ge-3", v; for (v = 31; v <= 50.001; v += 1) printf ", %ge-3", v }'), 0.1, 0.25, 0.5, 1"

mesh_rack() { if [ "$1" -le 2 ]; then echo a; else echo b; fi; }
mesh_tor() { echo "$(mesh_rack "$1")1"; }

# mesh_targets_json HOST...: a file_sd list, one group per host (its address,
# its rack and tor), on stdout.
mesh_targets_json() {
  local h sep=
  printf '['
  for h in "$@"; do
    printf '%s\n  {"targets": ["%s"], "labels": {"rack": "%s", "tor": "%s", "__meta_ignored": "x", "zone": "ignored"}}' \
      "$sep" "$(fleet_host_addr "$h")" "$(mesh_rack "$h")" "$(mesh_tor "$h")"
    sep=,
  done
  printf '\n]\n'
}

# mesh_write_targets CONTENT: replaces $OUT/targets.json atomically (written
# aside, then renamed), as an operator's tooling should.
mesh_write_targets() {
  printf '%s' "$1" >"$OUT/targets.json.tmp"
  mv "$OUT/targets.json.tmp" "$OUT/targets.json"
}

# mesh_peers: the other hosts' indexes.
mesh_peers() {
  local h
  for ((h = 1; h <= FLEET_HOSTS; h++)); do [ "$h" = "$HOST_INDEX" ] || echo "$h"; done
}

# mesh_config: the agent's configuration (fleet mode) on stdout.
mesh_config() {
  cat <<TOML
[mesh]
interval_seconds = $MESH_INTERVAL
timeout_seconds = 1.0
targets_file = "$OUT/targets.json"
targets_file_check_seconds = 1.0
target_labels = ["rack", "tor"]
source = "$HOST_ADDR"

[hooks]
groups = [$MESH_HOOK_GROUPS]

[buckets]
probe_rtt = [$MESH_RTT_BUCKETS]
TOML
}

# start_mesh_agent [--answer-only]: targets file with every other host (or
# none: the agent only answers), the fleet-mode configuration, the agent
# started and ready (180 s: one emulated CPU).
start_mesh_agent() {
  local h peers
  peers=$(mesh_peers)
  [ "${1:-}" = --answer-only ] && peers=
  MESH_TARGETS=
  for h in $peers; do MESH_TARGETS+="${MESH_TARGETS:+ }$(fleet_host_addr "$h")"; done
  # shellcheck disable=SC2086 # one index a word
  mesh_write_targets "$(mesh_targets_json $peers)"
  mesh_config >"$OUT/qpwatch.toml"
  launch_agent --config "$OUT/qpwatch.toml"
  wait_agent_ready 180
}

# mesh_sel NAME TARGET: the selector of a per-target mesh series.
mesh_sel() { echo "$1{target=\"$2\"}"; }

# mesh_count FILE NAME TARGET: a per-target mesh counter in a scrape.
mesh_count() { metric "$1" "$(mesh_sel "$2" "$3")"; }

# mesh_answered_above TARGET N: the agent's answered count to TARGET is above
# N (a condition for wait_until).
mesh_answered_above() {
  local f
  f=$(scrape answered) || return 1
  [ "$(mesh_count "$f" qpwatch_mesh_probes_answered_total "$1")" -gt "$2" ]
}

# mesh_wait_answering [TIMEOUT_S]: until every target has answers.
mesh_wait_answering() {
  local t
  for t in $MESH_TARGETS; do
    WAIT_INTERVAL=1 wait_until "${1:-120}" mesh_answered_above "$t" 0 || fail "no answer from $t after ${1:-120} s"
  done
  log "h$HOST_INDEX: every target answers: $MESH_TARGETS"
}

# hist_quantile BEFORE AFTER Q TARGET [HISTOGRAM]: the Q quantile of the mesh
# RTT histogram (or HISTOGRAM, another per-target mesh histogram) of TARGET
# over the observations between two scrapes, linear within the bucket as
# histogram_quantile does; prints "value count".
hist_quantile() { hist_quantile_windows "$3" "$4" "${5:-qpwatch_mesh_probe_rtt_seconds}" "$1" "$2"; }

# hist_quantile_windows Q TARGET HISTOGRAM BEFORE AFTER [BEFORE AFTER...]: as
# hist_quantile, over the observations of several windows together (each
# between its own two scrapes).
hist_quantile_windows() {
  local q=$1 target=$2 name=$3
  shift 3
  awk -v q="$q" -v tgt="target=\"$target\"" -v name="${name}_bucket{" '
    FNR == 1 { sign = (++file % 2 == 1) ? -1 : 1 }
    index($0, name) == 1 && index($0, tgt) {
      le = $0; sub(/.*le="/, "", le); sub(/".*/, "", le)
      v[le] += sign * $NF
      if (!(le in seen)) { seen[le] = 1; les[++n] = le }
    }
    END {
      for (i = 1; i <= n; i++) num[i] = (les[i] == "+Inf" ? 1e300 : les[i] + 0)
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (num[j] < num[i]) {
        t = num[i]; num[i] = num[j]; num[j] = t; t = les[i]; les[i] = les[j]; les[j] = t }
      total = v[les[n]]
      if (total <= 0) { print "nan 0"; exit }
      rank = q * total; prev = 0; lo = 0
      for (i = 1; i <= n; i++) {
        c = v[les[i]]
        if (c >= rank) {
          if (les[i] == "+Inf") { printf "%g %d\n", lo, total; exit }
          printf "%.6f %d\n", lo + (num[i] - lo) * (rank - prev) / (c - prev), total; exit
        }
        prev = c; lo = num[i]
      }
    }' "$@"
}

# mesh_in_turn NAME CYCLES WINDOW FAULT: CYCLES cycles of a WINDOW s without
# a fault and a WINDOW s with it, each window between two scrapes (named
# NAME-base1-0 ... NAME-fault1-1 ...); `FAULT off` and `FAULT on` switch it
# and return once it is in force. The bed's load drifts over a minute by as
# much as a fault (a CI run with one 30 s window each way saw h1 -> h2 move
# by 0.36 ms with no fault on it, another saw a 2 ms delay raise a median by
# 0.72 ms; on a loaded CI machine h1 -> h2, with no fault on it, had a
# median of 11.9 ms in one 8 s window and 26.2 ms in the next); windows taken
# in turn average the drift out.
# MESH_BASE and MESH_FAULT get each window's two scrapes, in turn, for
# hist_quantile_windows. The fault is on at the end. If the scenario defines
# mesh_window_mark PHASE, it is called as each window opens (base, fault)
# and closes (end).
mesh_in_turn() {
  local name=$1 cycles=$2 window=$3 fault=$4 cycle phase opened closed
  MESH_BASE=() MESH_FAULT=()
  for ((cycle = 1; cycle <= cycles; cycle++)); do
    for phase in base fault; do
      if [ "$phase" = base ]; then "$fault" off; else "$fault" on; fi
      sleep 1
      opened=$(scrape "$name-$phase$cycle-0")
      ! declare -F mesh_window_mark >/dev/null || mesh_window_mark "$phase"
      sleep "$window"
      ! declare -F mesh_window_mark >/dev/null || mesh_window_mark end
      closed=$(scrape "$name-$phase$cycle-1")
      if [ "$phase" = base ]; then MESH_BASE+=("$opened" "$closed"); else MESH_FAULT+=("$opened" "$closed"); fi
    done
  done
}

# mesh_switch_delay PORT on|off: netem delay 2ms on the switch's port toward
# host PORT, or none (one qdisc, changed in place: nothing queued is
# dropped; fleet_switch clear PORT removes it). A FAULT for mesh_in_turn.
mesh_switch_delay() {
  if [ "$2" = on ]; then fleet_switch netem "$1" delay 2ms >&2; else fleet_switch netem "$1" delay 0ms >&2; fi
}

# agent_threads: the agent's thread count, without tokio's blocking pool
# ("qpwatch-pool", service::daemon::BLOCKING_THREAD_NAME: threads come for a
# scrape or a prober change and leave after 10 s idle).
agent_threads() { cat "/proc/$AGENT_PID"/task/*/comm | grep -cvx 'qpwatch-pool'; }

# mesh_ud_qps [PID]: UD QPs of the process (the agent) in the kernel's
# resource table. rdma res names the thread that created a QP (the UD QP's
# is the "qpwatch-mesh" thread), so every thread of the process counts.
mesh_ud_qps() {
  local tids
  tids=$(find "/proc/${1:-$AGENT_PID}/task" -mindepth 1 -maxdepth 1 -printf '%f\n' | jq -s -c .)
  rdma -j res show qp | jq --argjson tids "$tids" '[.[] | select(.type == "UD" and (.pid as $p | $tids | index($p)))] | length'
}

# mesh_expect_no_loss BEFORE AFTER TARGET...: lost 0, sent and answered > 0 to
# each TARGET between two scrapes.
mesh_expect_no_loss() {
  local before=$1 after=$2 t sent
  shift 2
  for t in "$@"; do
    sent=$(($(mesh_count "$after" qpwatch_mesh_probes_sent_total "$t") - $(mesh_count "$before" qpwatch_mesh_probes_sent_total "$t")))
    [ "$sent" -gt 0 ] || fail "h$HOST_INDEX -> $t: no probe sent"
    assert_eq "h$HOST_INDEX -> $t: lost (of $sent sent)" 0 \
      $(($(mesh_count "$after" qpwatch_mesh_probes_lost_total "$t") - $(mesh_count "$before" qpwatch_mesh_probes_lost_total "$t")))
  done
}
