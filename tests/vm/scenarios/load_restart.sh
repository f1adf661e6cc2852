# Agent restart under load: qp-churn holds 400 QPs in RTS and churns more
# pairs while the agent is killed (SIGKILL) and started again. The restarted
# agent adopts what the kernel lists (netlink reconcile after attach) and
# follows the churn from there: once the churn is paused, ONE scrape shows
# as many live QPs as `rdma res show qp`, also by state. Then the generator
# exits, and the gauge returns to the baseline.
# The agent runs with --groups qp (the ib_core QP hooks these QPs go through:
# qp-churn uses no rdma_cm); it starts several times faster under emulation.
HOLD=400
base_kernel=$(res_count qp)
start_agent --groups qp
# paced, so that the agent's start-up (BTF parsing) still gets CPU under emulation
start_churn churn --hold "$HOLD" --threads 1 --rate 100
wait_phase churn holding 120 || fail "qp-churn did not reach the holding phase"
sleep 2
kill_wait "$AGENT_PID"
AGENT_PID=
log "agent killed; the churn goes on"
start_agent --groups qp
sleep 2
kill -USR1 "$CHURN_PID"
wait_phase churn paused 60 || { dump_threads "$CHURN_PID" churn; fail "qp-churn did not pause"; }
sleep 1 # the last events of the pairs in flight reach the ring buffer
kernel_now=$(res_count qp)
first=$(scrape paused)
log "paused: kernel lists $kernel_now QPs ($(res_count qp '.state == "RTS"') in RTS)"
assert_eq "live QPs == rdma res show qp (one scrape)" "$kernel_now" "$(metric "$first" qpwatch_qps)"
for state in RESET INIT RTR RTS; do
  assert_eq "live $state QPs" "$(res_count qp ".state == \"$state\"")" "$(metric "$first" "qpwatch_qps{state=\"$state\"}")"
done
assert_eq "negative qpwatch_qps series" 0 "$(negative_gauges "$first")"
adopted=$(grep -o 'adopted=[0-9]*' "$OUT/agent.log" | tail -n1)
log "restarted agent: $adopted"
kill -USR2 "$CHURN_PID"
wait_phase churn running 30 || fail "qp-churn did not resume"
sleep 1
stop_churn
wait_until 60 res_count_is qp -eq "$base_kernel" || fail "the kernel still lists $(res_count qp) QPs"
wait_for_metric qpwatch_qps "$base_kernel" 30 || fail "live-QP gauge not back to $base_kernel"
end=$LAST
assert_eq "qpwatch_events_lost_total" 0 "$(metric "$end" qpwatch_events_lost_total)"
assert_eq "negative qpwatch_qps series" 0 "$(negative_gauges "$end")"
assert_eq "tracked QPs == sum of live QPs" "$(metric "$end" qpwatch_tracked_qps)" "$(metric "$end" qpwatch_qps)"
stop_agent
