# The switch's port toward h3 goes down for 20 s, then up (fleet_switch):
# h3 is cut off from every other host.
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering
#   every host  during the outage: the agent keeps serving /metrics and
#               /healthz (curl every 2 s); paths to or from h3 lose their
#               probes (lost grows, answered does not: the first 3 s left
#               for the probes in flight): at least 50 of the ~190 lost, or,
#               if the agent stops to re-resolve the target, resolution
#               failures (their reasons logged); h1 <-> h2 lose nothing
#   every host  after up: the paths to and from h3 answer again within 60 s
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h3=$(fleet_host_addr 3)
start_mesh_agent
mesh_wait_answering 120
fleet_barrier answering
# the paths through h3's port, from this host
if [ "$HOST_INDEX" = 3 ]; then cut=$MESH_TARGETS intact=; else cut=$h3 intact=${MESH_TARGETS/$h3/}; fi

base=$(scrape base)
[ "$HOST_INDEX" = 1 ] && fleet_switch link 3 down >&2
fleet_barrier down
sleep 3
d0=$(scrape down0)
for ((i = 0; i < 8; i++)); do
  agent_get /metrics || fail "h$HOST_INDEX: /metrics not served during the outage"
  agent_get /healthz || fail "h$HOST_INDEX: /healthz not healthy during the outage"
  sleep 2
done
d1=$(scrape down1)
for t in $cut; do
  lost=$(($(mesh_count "$d1" qpwatch_mesh_probes_lost_total "$t") - $(mesh_count "$base" qpwatch_mesh_probes_lost_total "$t")))
  answered=$(($(mesh_count "$d1" qpwatch_mesh_probes_answered_total "$t") - $(mesh_count "$d0" qpwatch_mesh_probes_answered_total "$t")))
  failures=$(($(metric "$d1" "$(mesh_sel qpwatch_mesh_resolve_failures_total "$t")") - $(metric "$base" "$(mesh_sel qpwatch_mesh_resolve_failures_total "$t")")))
  log "h$HOST_INDEX -> $t, link down: $lost lost, $answered answered after the first 3 s, $failures resolution failures ($(grep '^qpwatch_mesh_resolve_failures_total{' "$d1" | grep -F "\"$t\"" | tr '\n' ' '))"
  # ~190 probes in the outage: lost, unless the agent stopped sending to
  # re-resolve the target, which then fails with a reason
  [ "$lost" -ge 50 ] || [ "$failures" -ge 1 ] || fail "h$HOST_INDEX -> $t: $lost probes lost and $failures resolution failures in ~19 s of outage"
  assert_eq "h$HOST_INDEX -> $t: answered during the outage" 0 "$answered"
done
fleet_barrier outage
[ "$HOST_INDEX" = 1 ] && fleet_switch link 3 up >&2
up_at=$SECONDS
fleet_barrier up
for t in $cut; do
  n=$(mesh_count "$d1" qpwatch_mesh_probes_answered_total "$t")
  WAIT_INTERVAL=1 wait_until 60 mesh_answered_above "$t" "$n" || fail "h$HOST_INDEX -> $t: no answer 60 s after the link came up"
  log "h$HOST_INDEX -> $t answers again $((SECONDS - up_at)) s after the link came up"
done
fleet_barrier recovered
end=$(scrape end)
# shellcheck disable=SC2086 # one address a word
[ -z "${intact// /}" ] || mesh_expect_no_loss "$base" "$end" $intact
stop_agent
