# QPs and CM ids that exist before the agent starts: a long-running rping is
# connected first, then the agent starts; its first scrape must already show
# what `rdma res show qp` / `rdma res show cm_id` list.
start_rping_connection

qps=$(res_count qp)
cm_ids=$(res_count cm_id)
rdma res show qp >"$OUT/rdma-qp.txt"; rdma res show cm_id >"$OUT/rdma-cm_id.txt"
log "kernel lists $qps QPs and $cm_ids CM ids"
start_agent
first=$(scrape first)
assert_eq "live QPs on the first scrape" "$qps" "$(metric "$first" 'qpwatch_qps')"
assert_eq "live RTS RC QPs" 2 "$(metric "$first" 'qpwatch_qps{qp_type="RC",state="RTS"}')"
assert_eq "GSI QP, labelled by type" "$(res_count qp '.type == "GSI"')" "$(metric "$first" 'qpwatch_qps{qp_type="GSI"}')"
assert_eq "live CM ids on the first scrape" "$cm_ids" "$(metric "$first" 'qpwatch_cm_ids')"
assert_eq "listening CM ids" "$(res_count cm_id '.state == "LISTEN"')" "$(metric "$first" 'qpwatch_cm_ids{state="LISTEN"}')"

kill_rping_connection
wait_for_metric 'qpwatch_qps{qp_type="RC"}' 0 || fail "adopted QPs not removed on destroy"
end=$(scrape end)
assert_eq "destroys of adopted QPs" 2 "$(delta "$first" "$end" 'qpwatch_qp_destroyed_total{qp_type="RC"}')"
assert_eq "untracked destroys" 0 "$(delta "$first" "$end" 'qpwatch_untracked_qp_events_total')"
wait_for_metric 'qpwatch_cm_ids' "$(res_count cm_id)" || fail "CM id gauge does not match the kernel after exit"
stop_agent
