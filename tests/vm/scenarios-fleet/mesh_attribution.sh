# A bad link, not a bad host: netem loss 5% on the switch's port toward h2
# for the frames from h1 only (fleet_switch netem-from), so only the paths
# h1 -> h2 (its probes) and h2 -> h1 (h1's answers) lose; every other path of
# h1 and h2, and h3's, is clean. (mesh_loss drops every frame toward h2: a
# bad host.)
#
#   every host  the mesh agent (tests/vm/lib/mesh.sh), every target answering
#   h1          Prometheus: QpwatchMeshLinkBad fires for h1 -> h2 and
#               h2 -> h1 and no other path, QpwatchMeshHostBad for no host,
#               within 150 s of the loss starting (QpwatchMeshLinkBad's
#               for: shortened to 10s, fleet_rules; "no host" counts
#               pending alerts too), and still so 40 s into the loss;
#               h1 -> h3 lost nothing
# vm-timeout: 900
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts"
h1=$(fleet_host_addr 1) h2=$(fleet_host_addr 2) h3=$(fleet_host_addr 3)
if [ "$HOST_INDEX" = 1 ]; then PROM_SHORT_FOR=QpwatchMeshLinkBad start_prometheus; fi
start_mesh_agent
mesh_wait_answering 120
if [ "$HOST_INDEX" = 1 ]; then
  expect_prom "Prometheus: up" 'up{job="qpwatch"}' "$(fleet_agent_targets | sed 's/$/=1/' | sort | paste -sd' ')" 180
fi
fleet_barrier answering
if [ "$HOST_INDEX" = 1 ]; then
  before=$(scrape before)
  fleet_switch netem-from 2 1 loss 5% >&2
  start=$SECONDS
  # bad_links_are LIST: the paths QpwatchMeshLinkBad fires for (in $BAD_LINKS)
  bad_links_are() {
    BAD_LINKS=$(alerts QpwatchMeshLinkBad firing '"\(.src)->\(.dst)"') && [ "$BAD_LINKS" = "$1" ]
  }
  want="$h1->$h2 $h2->$h1"
  WAIT_INTERVAL=2 wait_until 150 bad_links_are "$want" || true
  assert_eq "QpwatchMeshLinkBad firing for paths" "$want" "$BAD_LINKS"
  log "figure: QpwatchMeshLinkBad fired $((SECONDS - start)) s after the loss began"
  echo "link_bad_fired_after_s $((SECONDS - start))" >>"$FLEET_OUT/figures.txt"
  assert_eq "QpwatchMeshHostBad alerts (pending or firing)" "" \
    "$(alerts QpwatchMeshHostBad "" .host)"
  # again once 40 s of loss are in the rules' 1m windows (it fires after
  # about 18 s): a path the fault leaks into at 1.5% is lossy by then
  while [ $((SECONDS - start)) -lt 40 ]; do sleep 1; done
  bad_links_are "$want" || true
  assert_eq "QpwatchMeshLinkBad firing for paths, $((SECONDS - start)) s into the loss" "$want" "$BAD_LINKS"
  assert_eq "QpwatchMeshHostBad alerts (pending or firing), $((SECONDS - start)) s into the loss" "" \
    "$(alerts QpwatchMeshHostBad "" .host)"
  fleet_switch stats 2 >"$OUT/switch-stats.txt"
  fleet_switch clear 2 >&2
  sleep 2
  mesh_expect_no_loss "$before" "$(scrape after)" "$h3"
fi
fleet_barrier checked 400
stop_agent
