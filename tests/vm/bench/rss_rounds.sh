# Agent memory over repeated 10,000-lifecycle rounds: RSS, RssAnon and the
# anonymous mappings that grew, per round (a leak grows every round; allocator
# high-water marks stop growing). Prints figures; not a pass/fail test.
# vm-timeout: 900
ROUNDS=${BENCH_ROUNDS:-4}
start_agent --groups qp
anon_maps() { awk '/^[0-9a-f]+-[0-9a-f]+ /{m=$1" "$6} /^Anonymous:/{if ($2>0) print m, $2}' "/proc/$AGENT_PID/smaps"; }
churn warmup --lifecycles 2500 --threads 2
sleep 2
anon_maps >"$OUT/maps.0"
log "round 0: RSS $(status_kib "$AGENT_PID" VmRSS) anon $(status_kib "$AGENT_PID" RssAnon) threads $(status_kib "$AGENT_PID" Threads)"
for r in $(seq 1 "$ROUNDS"); do
  churn "round$r" --lifecycles 10000 --threads 2
  sleep 2
  scrape "s$r" >/dev/null
  anon_maps >"$OUT/maps.$r"
  log "round $r: RSS $(status_kib "$AGENT_PID" VmRSS) anon $(status_kib "$AGENT_PID" RssAnon) threads $(awk '$1=="Threads:"{print $2}' /proc/$AGENT_PID/status) lost $(metric "$OUT/s$r.prom" qpwatch_events_lost_total)"
  join -a1 -a2 -e0 -o 0,1.2,2.2 <(awk '{print $1"|"$2, $3}' "$OUT/maps.$((r-1))" | sort) <(awk '{print $1"|"$2, $3}' "$OUT/maps.$r" | sort) |
    awk '$3 != $2 { printf "  %s %d -> %d KiB\n", $1, $2, $3 }' | while read -r line; do log "$line"; done
done
stop_agent
