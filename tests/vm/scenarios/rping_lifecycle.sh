# rping over rxe0 with the agent attached: exact QP lifecycle counts.
#
# Phase 1: `rping -C 5`, server + client. rping creates one RC QP per side
# through librdmacm (rdma_create_qp → uverbs → ib_create_qp_user), so 2 QPs,
# each RESET→INIT→RTR→RTS, then destroyed.
# Phase 2: a long rping, counted through the kernel's own view (`rdma res show
# qp`) while connected, then both processes are killed: the kernel destroys
# their QPs and the agent must see every destroy.
# First, what loading the programs cost the kernel's verifier: the
# instructions it walked through, summed over the three instances' logs,
# stay under 150,000 (79,478 on 6.1 since the records are written in place;
# 609,343 when the CM entries built theirs on the stack, bench/RESULTS.md
# round 11).
start_agent
base=$(scrape base)
attached_logs() { [ "$(grep -c 'hooks attached instance=.* verified_instructions=' "$OUT/agent.log")" -ge 3 ]; }
wait_until 60 attached_logs || fail "not every instance logged its verified instructions: $(grep 'hooks attached' "$OUT/agent.log")"
verified=$(grep -o 'verified_instructions=[0-9]*' "$OUT/agent.log" | awk -F= '{ s += $2 } END { print s + 0 }')
log "the verifier walked $verified instructions to load the programs"
[ "$verified" -gt 0 ] && [ "$verified" -le 150000 ] || fail "verified instructions: $verified, expected 1 to 150000"

rping_once 5 -v
grep -c "ping data" "$OUT/rping-client.log" | grep -qx 5 || fail "rping did not complete 5 pings"

qps=2
wait_for_metric 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}' $(( $(metric "$base" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}') + qps )) ||
  fail "destroys not seen"
after=$(scrape phase1)
assert_eq "QPs created (user, RC)" $qps "$(delta "$base" "$after" 'qpwatch_qp_created_total{device="rxe0",qp_type="RC",origin="user"}')"
assert_eq "create latency observations" $qps "$(delta "$base" "$after" 'qpwatch_qp_create_duration_seconds_count{device="rxe0",origin="user"}')"
for edge in 'from="RESET",to="INIT"' 'from="INIT",to="RTR"' 'from="RTR",to="RTS"'; do
  assert_eq "transitions {$edge}" $qps "$(delta "$base" "$after" "qpwatch_qp_transition_duration_seconds_count{$edge}")"
done
assert_eq "time-to-RTS observations" $qps "$(delta "$base" "$after" 'qpwatch_qp_time_to_rts_seconds_count')"
assert_eq "QPs destroyed" $qps "$(delta "$base" "$after" 'qpwatch_qp_destroyed_total{device="rxe0"}')"
assert_eq "lifetimes observed" $qps "$(delta "$base" "$after" 'qpwatch_qp_lifetime_seconds_count')"
assert_eq "RESET dwell observations" $qps "$(delta "$base" "$after" 'qpwatch_qp_state_dwell_seconds_count{state="RESET"}')"
assert_eq "live QPs back to baseline" "$(metric "$base" 'qpwatch_qps')" "$(metric "$after" 'qpwatch_qps')"
assert_eq "modify errors" 0 "$(delta "$base" "$after" 'qpwatch_qp_modify_errors_total')"
assert_eq "untracked-QP events" 0 "$(delta "$base" "$after" 'qpwatch_untracked_qp_events_total')"

# Phase 2: count with the kernel's netlink view while connected.
start_rping_connection
seen=$(res_count qp '.comm == "rping"')
rdma res show qp >"$OUT/rdma-res-qp.txt"
log "rdma res show qp lists $seen rping QPs while connected"
mid=$(scrape phase2-connected)
assert_eq "live RTS QPs (agent) vs rdma res" "$seen" "$(( $(metric "$mid" 'qpwatch_qps{device="rxe0",qp_type="RC",state="RTS"}') - $(metric "$base" 'qpwatch_qps{device="rxe0",qp_type="RC",state="RTS"}') ))"
kill_rping_connection
wait_for_metric 'qpwatch_qps{device="rxe0",qp_type="RC"}' "$(metric "$base" 'qpwatch_qps{device="rxe0",qp_type="RC"}')" ||
  fail "live-QP gauge did not return to baseline"
end=$(scrape end)
assert_eq "phase 2 QPs created" "$seen" "$(delta "$after" "$end" 'qpwatch_qp_created_total{device="rxe0",origin="user"}')"
assert_eq "phase 2 QPs destroyed" "$seen" "$(delta "$after" "$end" 'qpwatch_qp_destroyed_total{device="rxe0"}')"
assert_eq "events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
assert_eq "malformed events" 0 "$(metric "$end" 'qpwatch_events_malformed_total')"
stop_agent
