# h3's agent is killed (SIGKILL) for 20 s, then started again: h3's UD
# responder is gone, then back with a new UD QP.
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering
#   h1, h2      while h3's agent is dead: probes to h3 time out (at least
#               50 lost, or resolution failures if the agent re-resolves;
#               answered does not grow after the first 3 s); h1 <-> h2 lose
#               nothing, over the whole scenario
#   h3          the agent restarted: one UD QP again
#   h1, h2      probes to h3 answered again within 60 s of h3's agent ready
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h3=$(fleet_host_addr 3)
start_mesh_agent
mesh_wait_answering 120
fleet_barrier answering
base=$(scrape base)
if [ "$HOST_INDEX" = 3 ]; then
  dead=$AGENT_PID
  kill_wait "$AGENT_PID"
  log "h3: agent killed"
fi
fleet_barrier killed
if [ "$HOST_INDEX" = 3 ]; then
  sleep 20
  assert_eq "h3: QPs of the dead agent" 0 "$(res_count qp ".pid == $dead")"
  launch_agent --config "$OUT/qpwatch.toml"
  wait_agent_ready 180
  assert_eq "h3: UD QPs of the restarted agent" 1 "$(mesh_ud_qps)"
else
  sleep 3
  d0=$(scrape dead0)
  sleep 16
  d1=$(scrape dead1)
  lost=$(($(mesh_count "$d1" qpwatch_mesh_probes_lost_total "$h3") - $(mesh_count "$base" qpwatch_mesh_probes_lost_total "$h3")))
  answered=$(($(mesh_count "$d1" qpwatch_mesh_probes_answered_total "$h3") - $(mesh_count "$d0" qpwatch_mesh_probes_answered_total "$h3")))
  failures=$(($(metric "$d1" "$(mesh_sel qpwatch_mesh_resolve_failures_total "$h3")") - $(metric "$base" "$(mesh_sel qpwatch_mesh_resolve_failures_total "$h3")")))
  log "h$HOST_INDEX -> h3, its agent dead: $lost lost, $answered answered after the first 3 s, $failures resolution failures"
  # lost, unless the agent stopped sending to re-resolve h3 (SIDR: no listener)
  [ "$lost" -ge 50 ] || [ "$failures" -ge 1 ] || fail "h$HOST_INDEX -> h3: $lost probes lost and $failures resolution failures with its agent dead"
  assert_eq "h$HOST_INDEX -> h3: answered with its agent dead" 0 "$answered"
fi
fleet_barrier restarted 300
if [ "$HOST_INDEX" != 3 ]; then
  n=$(mesh_count "$(scrape restarted)" qpwatch_mesh_probes_answered_total "$h3")
  WAIT_INTERVAL=1 wait_until 60 mesh_answered_above "$h3" "$n" || fail "h$HOST_INDEX -> h3: no answer 60 s after its agent came back"
  log "h$HOST_INDEX -> h3 answers again"
  end=$(scrape end)
  other=$(fleet_host_addr $((3 - HOST_INDEX)))
  mesh_expect_no_loss "$base" "$end" "$other"
fi
fleet_barrier recovered
stop_agent
