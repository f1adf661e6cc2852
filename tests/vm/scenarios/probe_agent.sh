# The agent's own probes: a responder on 198.18.0.1 and a target pointing at
# it, over rxe0. The responder's counters (independent of the requester and
# of eBPF) give K; everything else must agree with it exactly:
#   probes ok == K, RTT samples == K×N, echoes == K×N,
#   QPs created == 2K (requester thread + responder thread, by comm),
#   every probe QP's 6 verb calls matched by eBPF (unseen == 0, 6K skews).
N=5
cfg=$OUT/qpwatch.toml
write_config() {
  cat >"$cfg" <<CFG
listen = "$AGENT_ADDR"
[responder]
listen = "$RXE_ADDR:9723"
CFG
  [ "$1" = with-target ] && probe_target self "$RXE_ADDR:9723" 3 "$N" 2 >>"$cfg"
  return 0
}
write_config with-target
start_agent --config "$cfg"
wait_for_metric_at_least 'qpwatch_probe_total{target="self",result="ok"}' 3 120 || fail "no 3 successful probes"
up=$(scrape up)
assert_eq "probe up" 1 "$(metric "$up" 'qpwatch_probe_up{target="self"}')"

# stop probing (SIGHUP with the target removed); the responder stays
write_config without-target
reload_agent
wait_for_metric 'qpwatch_responder_active_connections' 0 30 || fail "responder connections still open"
wait_until 30 res_count_is qp -eq 0 '.type == "RC"' || fail "probe QPs left behind"
sleep 6 # the last probe's cross-check waits for its kernel events
end=$(scrape end)
K=$(metric "$end" 'qpwatch_responder_connections_total{event="established"}')
log "responder established $K connections"
[ "$K" -ge 3 ] || fail "expected at least 3 probes, responder saw $K"
assert_eq "probes, all results" "$K" "$(metric "$end" 'qpwatch_probe_total{target="self"}')"
assert_eq "probes ok" "$K" "$(metric "$end" 'qpwatch_probe_total{target="self",result="ok"}')"
assert_eq "RTT samples" $((K * N)) "$(metric "$end" 'qpwatch_probe_rtt_seconds_count{target="self"}')"
assert_eq "responder echoes" $((K * N)) "$(metric "$end" 'qpwatch_responder_echoes_total')"
for step in addr_resolve route_resolve qp_create connect established disconnect; do
  assert_eq "setup step $step timed" "$K" "$(metric "$end" "qpwatch_probe_setup_duration_seconds_count{target=\"self\",step=\"$step\"}")"
done
assert_eq "QPs created (both sides)" $((2 * K)) "$(metric "$end" 'qpwatch_qp_created_total{qp_type="RC"}')"
assert_eq "QPs created by the requester thread" "$K" "$(metric "$end" 'qpwatch_qp_created_by_process_total{comm="probe-self"}')"
assert_eq "QPs created by the responder thread" "$K" "$(metric "$end" 'qpwatch_qp_created_by_process_total{comm="rdma-responder"}')"
assert_eq "QPs destroyed" $((2 * K)) "$(metric "$end" 'qpwatch_qp_destroyed_total{qp_type="RC"}')"
assert_eq "probe QPs the eBPF path missed" 0 "$(metric "$end" 'qpwatch_probe_qps_unseen_total')"
assert_eq "create skews" "$K" "$(metric "$end" 'qpwatch_probe_kernel_userspace_skew_seconds_count{call="create"}')"
assert_eq "modify skews (INIT, RTR, RTS, ERR)" $((4 * K)) "$(metric "$end" 'qpwatch_probe_kernel_userspace_skew_seconds_count{call="modify"}')"
assert_eq "destroy skews" "$K" "$(metric "$end" 'qpwatch_probe_kernel_userspace_skew_seconds_count{call="destroy"}')"
negative=$(metric "$end" 'qpwatch_probe_kernel_userspace_skew_seconds_bucket{le="-0.00001"}')
assert_eq "skews below -10 µs (userspace shorter than the kernel call)" 0 "$negative"
assert_eq "target removed: no up gauge" 0 "$(series_count "$end" 'qpwatch_probe_up')"
stop_agent
wait_until 20 res_count_is cm_id -eq 0 || fail "responder cm_ids left behind"
