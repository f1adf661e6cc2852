# The generator is killed (SIGKILL) with QPs open: 400 held in RTS plus the
# churn's pairs in flight (in RESET, INIT, RTR or RTS). The kernel destroys
# them on the process's exit (uverbs cleanup, ib_destroy_qp_user), qpwatch
# sees every destroy, and the live-QP gauge returns to its baseline.
# The agent runs with --groups qp (the ib_core QP hooks these QPs go through:
# qp-churn uses no rdma_cm); it starts several times faster under emulation.
HOLD=400
start_agent --groups qp
before=$(scrape before)
base_live=$(metric "$before" qpwatch_qps)
base_kernel=$(res_count qp)
assert_eq "baseline: live QPs == rdma res show qp" "$base_kernel" "$base_live"
start_churn churn --hold "$HOLD" --threads 2
wait_phase churn holding 120 || fail "qp-churn did not reach the holding phase"
sleep 2 # the churn runs on next to the held QPs
open_qps=$(($(res_count qp) - base_kernel))
kill_wait "$CHURN_PID"
log "qp-churn killed with about $open_qps QPs open"
[ "$open_qps" -ge "$HOLD" ] || fail "only $open_qps QPs were open"
wait_until 60 res_count_is qp -eq "$base_kernel" || fail "the kernel still lists $(res_count qp) QPs"
wait_for_metric qpwatch_qps "$base_live" 30 || fail "live-QP gauge not back to $base_live"
after=$LAST
created=$(delta "$before" "$after" 'qpwatch_qp_created_total{qp_type="RC"}')
destroyed=$(delta "$before" "$after" 'qpwatch_qp_destroyed_total{qp_type="RC"}')
log "created $created, destroyed $destroyed (of which $HOLD held)"
[ "$created" -ge "$HOLD" ] || fail "only $created QPs created"
assert_eq "every created QP destroyed" "$created" "$destroyed"
assert_eq "tracked QPs back to baseline" "$(metric "$before" qpwatch_tracked_qps)" "$(metric "$after" qpwatch_tracked_qps)"
assert_eq "qpwatch_events_lost_total" 0 "$(metric "$after" qpwatch_events_lost_total)"
assert_eq "untracked QP events" 0 "$(delta "$before" "$after" qpwatch_untracked_qp_events_total)"
assert_eq "negative qpwatch_qps series" 0 "$(negative_gauges "$after")"
stop_agent
