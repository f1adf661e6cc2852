# Fleet mode without a fault: every host's agent probes every other host over
# one UD QP at 10 probes/s per target (tests/vm/lib/mesh.sh), targets from a
# file_sd file, and answers the others' probes; one Prometheus on h1 scrapes
# every agent with dashboards/rules.yml.
#
#   every host  30 s: per target sent and answered > 0, lost 0;
#               qpwatch_mesh_qps 1, exactly one UD QP of the agent in
#               `rdma res show qp`, qpwatch_probe_qps_unseen_total{target=
#               "mesh"} 0, answers to the others' probes counted
#   every host  targets file rewritten (renamed into place) with a target
#               more, 198.18.0.99 (no such host: it cannot resolve): picked
#               up without restart (qpwatch_mesh_targets{source="file"} +1,
#               resolution failures for it), the agent's thread count the
#               same as before
#   h1          every expression of dashboards/qpwatch-mesh.json and of the
#               mesh rule groups returns data from Prometheus
#               (tests/dashboards/check_queries.py), no mesh alert for the
#               hosts' paths
#   every host  the extra target removed again: back to the peers only
#   every host  a bad targets file: the last good list kept (probes go on),
#               qpwatch_mesh_targets_file_ok 0, reloads{result="error"} +1;
#               the good file back: ok 1
#   every host  the agent stops with exit 0
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
if [ "$HOST_INDEX" = 1 ]; then start_prometheus; fi
start_mesh_agent
mesh_wait_answering 120
fleet_barrier answering

# --- 30 s of probes
base=$(scrape base)
sleep 30
after=$(scrape after30)
# shellcheck disable=SC2086 # one address a word
mesh_expect_no_loss "$base" "$after" $MESH_TARGETS
for t in $MESH_TARGETS; do
  sent=$(($(mesh_count "$after" qpwatch_mesh_probes_sent_total "$t") - $(mesh_count "$base" qpwatch_mesh_probes_sent_total "$t")))
  answered=$(($(mesh_count "$after" qpwatch_mesh_probes_answered_total "$t") - $(mesh_count "$base" qpwatch_mesh_probes_answered_total "$t")))
  log "h$HOST_INDEX -> $t in 30 s: $sent sent, $answered answered (10/s configured)"
  # the answers of probes in flight at either scrape: within one timeout's worth
  { [ $((sent - answered)) -le 10 ] && [ $((answered - sent)) -le 10 ]; } || fail "h$HOST_INDEX -> $t: $sent sent but $answered answered"
  assert_eq "h$HOST_INDEX -> $t resolved" 1 "$(metric "$after" "$(mesh_sel qpwatch_mesh_target_resolved "$t")")"
done
assert_eq "h$HOST_INDEX: qpwatch_mesh_qps" 1 "$(metric "$after" qpwatch_mesh_qps)"
assert_eq "h$HOST_INDEX: UD QPs of the agent in rdma res show qp" 1 "$(mesh_ud_qps)"
assert_eq "h$HOST_INDEX: mesh QPs unseen by eBPF" 0 "$(metric "$after" 'qpwatch_probe_qps_unseen_total{target="mesh"}')"
# not vacuous: the hooks saw the UD QP, and its create and three modifies
# were matched (each matched call observes the skew histogram once)
[ "$(metric "$after" 'qpwatch_qp_created_total{device="rxe0",qp_type="UD",origin="user"}')" -ge 1 ] || fail "h$HOST_INDEX: the hooks saw no UD QP created"
[ "$(metric "$after" 'qpwatch_probe_kernel_userspace_skew_seconds_count')" -ge 4 ] || fail "h$HOST_INDEX: the mesh UD QP's calls were not matched to the kernel's"
assert_eq "h$HOST_INDEX: targets from the file" "$((FLEET_HOSTS - 1))" "$(metric "$after" 'qpwatch_mesh_targets{source="file"}')"
assert_eq "h$HOST_INDEX: targets file ok" 1 "$(metric "$after" qpwatch_mesh_targets_file_ok)"
[ "$(delta "$base" "$after" qpwatch_mesh_responses_total)" -gt 0 ] || fail "h$HOST_INDEX answered no peer's probe"
log "h$HOST_INDEX answered $(delta "$base" "$after" qpwatch_mesh_responses_total) probes of its peers in 30 s"
fleet_barrier counted

# --- a target more, without restart
threads_before=$(agent_threads)
log "h$HOST_INDEX: the agent has $threads_before threads"
ok_before=$(metric "$after" 'qpwatch_mesh_targets_file_reloads_total{result="ok"}')
# shellcheck disable=SC2046 # one index a word
mesh_write_targets "$(mesh_targets_json $(mesh_peers) 99)"
wait_for_metric 'qpwatch_mesh_targets{source="file"}' "$FLEET_HOSTS" 30 || fail "the added target was not picked up"
wait_for_metric_at_least 'qpwatch_mesh_resolve_failures_total{target="198.18.0.99"}' 1 60 || fail "no resolution failure for 198.18.0.99"
added=$(scrape added)
[ "$(metric "$added" 'qpwatch_mesh_targets_file_reloads_total{result="ok"}')" -gt "$ok_before" ] || fail "no ok reload counted"
log "h$HOST_INDEX: 198.18.0.99 fails to resolve: $(grep '^qpwatch_mesh_resolve_failures_total{' "$added" | grep -F '198.18.0.99' | tr '\n' ' ')"
assert_eq "h$HOST_INDEX: agent threads with a target more" "$threads_before" "$(agent_threads)"
assert_eq "h$HOST_INDEX: UD QPs with a target more" 1 "$(mesh_ud_qps)"
fleet_barrier added

# --- every mesh expression against the real Prometheus (h1)
if [ "$HOST_INDEX" = 1 ]; then
  expect_prom "Prometheus: up" 'up{job="qpwatch"}' "$(fleet_agent_targets | sed 's/$/=1/' | sort | paste -sd' ')" 180
  rc=0
  no_alerts=()
  for ((i = 1; i <= FLEET_HOSTS; i++)); do
    no_alerts+=(--expect-no-alert "QpwatchMeshTargetsFileBad{instance=\"$(fleet_host_addr "$i"):9721\"}")
    for ((j = 1; j <= FLEET_HOSTS; j++)); do
      [ "$i" = "$j" ] || no_alerts+=(--expect-no-alert "QpwatchMeshPathLoss{instance=\"$(fleet_host_addr "$i"):9721\",target=\"$(fleet_host_addr "$j")\"}")
    done
  done
  /usr/bin/python3 -u "$REPO/tests/dashboards/check_queries.py" --prometheus "http://$PROM" \
    --wait 120 --retry-interval 3 \
    --rules "$REPO/dashboards/rules.yml" --rule-groups 'qpwatch\.mesh\..*' \
    --builtin __rate_interval=1m --builtin __interval=15s --builtin __range=5m \
    "${no_alerts[@]}" \
    "$REPO/dashboards/qpwatch-mesh.json" >"$OUT/queries.txt" 2>&1 || rc=$?
  cat "$OUT/queries.txt" >&2
  log "check_queries.py exit $rc: $(grep -E '^[0-9]+ expressions' "$OUT/queries.txt")"
  [ "$rc" -eq 0 ] || fail "mesh dashboard/rule expressions failed (exit $rc), see above"
fi
fleet_barrier dashboards

# --- the extra target removed
# shellcheck disable=SC2046 # one index a word
mesh_write_targets "$(mesh_targets_json $(mesh_peers))"
wait_for_metric 'qpwatch_mesh_targets{source="file"}' "$((FLEET_HOSTS - 1))" 30 || fail "the removed target is still probed"
assert_eq "h$HOST_INDEX: agent threads after the removal" "$threads_before" "$(agent_threads)"
fleet_barrier removed

# --- a bad file keeps the last good list
good=$(scrape good)
mesh_write_targets '[{"targets": ["198.18.0.2"], "labels": {"rack": '
wait_for_metric qpwatch_mesh_targets_file_ok 0 30 || fail "targets_file_ok still 1 with a bad file"
bad=$(scrape bad)
assert_eq "h$HOST_INDEX: error reloads" 1 "$(delta "$good" "$bad" 'qpwatch_mesh_targets_file_reloads_total{result="error"}')"
assert_eq "h$HOST_INDEX: targets kept" "$((FLEET_HOSTS - 1))" "$(metric "$bad" 'qpwatch_mesh_targets{source="file"}')"
sleep 3
still=$(scrape still)
for t in $MESH_TARGETS; do
  [ "$(mesh_count "$still" qpwatch_mesh_probes_answered_total "$t")" -gt "$(mesh_count "$bad" qpwatch_mesh_probes_answered_total "$t")" ] ||
    fail "h$HOST_INDEX -> $t: no answer after the bad file"
done
# shellcheck disable=SC2046 # one index a word
mesh_write_targets "$(mesh_targets_json $(mesh_peers))"
wait_for_metric qpwatch_mesh_targets_file_ok 1 30 || fail "targets_file_ok not back to 1"
fleet_barrier bad-file

end=$(scrape end)
# shellcheck disable=SC2086 # one address a word
mesh_expect_no_loss "$base" "$end" $MESH_TARGETS
stop_agent
log "h$HOST_INDEX: agent stopped in $EXIT_MS ms"
