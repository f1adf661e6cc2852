# Overflow on purpose: a 4 KiB ring buffer, and a burst of QP lifecycles
# while the agent is frozen (SIGSTOP), so it cannot drain. Every event the
# generator caused is either received or counted as lost:
#   lost == (create + modify + destroy calls) - events received,
# lost > 0, the agent keeps serving afterwards, and its QP table stays
# consistent: no negative gauge, tracked == sum of live, and a later churn
# is counted exactly again.
# The agent runs with --groups qp (the ib_core QP hooks these QPs go through:
# qp-churn uses no rdma_cm); it starts several times faster under emulation.
start_agent --groups qp --ring-buffer-bytes 4096
before=$(scrape before)
on_exit "kill -CONT $AGENT_PID"
kill -STOP "$AGENT_PID"
churn burst --lifecycles 400 --threads 2
kill -CONT "$AGENT_PID"
read -r _ _ _ kernel_calls created destroyed _ < <(counts "$OUT/burst.json")
log "burst: $kernel_calls kernel calls ($created created, $destroyed destroyed) with the agent stopped"
accounted() {
  local f
  f=$(scrape after)
  [ $(($(qp_events "$f") - $(qp_events "$before") + $(metric "$f" qpwatch_events_lost_total) - $(metric "$before" qpwatch_events_lost_total))) -ge "$kernel_calls" ]
}
wait_until 60 accounted || log "not all events accounted for after 60 s"
after=$(scrape after)
observed=$(($(qp_events "$after") - $(qp_events "$before")))
lost=$(delta "$before" "$after" qpwatch_events_lost_total)
log "observed $observed, lost $lost (ring_buffer_full $(delta "$before" "$after" 'qpwatch_events_lost_total{reason="ring_buffer_full"}'))"
[ "$lost" -gt 0 ] || fail "nothing lost with a 4 KiB ring and the agent stopped"
assert_eq "lost == kernel calls - observed" "$((kernel_calls - observed))" "$lost"
assert_eq "malformed records" 0 "$(metric "$after" qpwatch_events_malformed_total)"
kill -0 "$AGENT_PID" || fail "agent died"
agent_get /healthz || fail "agent not healthy after the overflow"
assert_eq "negative qpwatch_qps series" 0 "$(negative_gauges "$after")"
assert_eq "tracked QPs == sum of live QPs" "$(metric "$after" qpwatch_tracked_qps)" "$(metric "$after" qpwatch_qps)"
log "live QPs after the overflow: $(metric "$after" qpwatch_qps) (baseline $(metric "$before" qpwatch_qps); QPs whose destroy was lost stay until their number is reused)"

# The agent keeps counting exactly once it can drain again (a paced churn fits the tiny ring).
churn paced --lifecycles 100 --threads 1 --rate 20
read -r _ _ _ paced_calls paced_created _ _ < <(counts "$OUT/paced.json")
want=$(($(qp_events "$after") + paced_calls))
caught_up() { [ "$(qp_events "$(scrape end)")" -ge "$want" ]; }
wait_until 60 caught_up || log "paced events not all received"
end=$(scrape end)
assert_eq "paced churn: lost" 0 "$(delta "$after" "$end" qpwatch_events_lost_total)"
assert_eq "paced churn: created" "$paced_created" "$(delta "$after" "$end" 'qpwatch_qp_created_total{qp_type="RC"}')"
assert_eq "paced churn: events" "$paced_calls" "$(($(qp_events "$end") - $(qp_events "$after")))"
assert_eq "negative qpwatch_qps series" 0 "$(negative_gauges "$end")"
assert_eq "tracked QPs == sum of live QPs" "$(metric "$end" qpwatch_tracked_qps)" "$(metric "$end" qpwatch_qps)"
stop_agent
