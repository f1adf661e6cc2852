# Whose QP: an rping server in one cgroup v2 directory and its client in
# another (made after the agent started, so it has to walk the hierarchy
# again). Each side's QP is counted under its own cgroup's path in
# qpwatch_qp_created_by_cgroup_total, and `qpwatch events` carries the paths.
CG=/sys/fs/cgroup
if [ "$(stat -f -c %T "$CG")" != cgroup2fs ]; then
  mount -t cgroup2 none "$CG" || fail "no cgroup2 hierarchy in the guest"
fi
start_agent
start_events
base=$(scrape base)

mkdir -p "$CG/qpw-server" "$CG/qpw-client/inner"
on_exit "rmdir $CG/qpw-client/inner $CG/qpw-client $CG/qpw-server"
# in_cgroup DIR CMD...: CMD run as a member of the cgroup DIR.
in_cgroup() {
  local dir=$1
  shift
  bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$dir" "$@"
}
in_cgroup "$CG/qpw-server" rping -s -a "$RXE_ADDR" -C 3 >"$OUT/rping-server.log" 2>&1 &
server=$!
wait_listener rping
in_cgroup "$CG/qpw-client/inner" rping -c -a "$RXE_ADDR" -C 3 -v >"$OUT/rping-client.log" 2>&1 || fail "rping client failed"
wait "$server" || fail "rping server failed"
grep -c "ping data" "$OUT/rping-client.log" | grep -qx 3 || fail "rping did not complete 3 pings"

wait_for_metric 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}' \
  $(($(metric "$base" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}') + 2)) || fail "destroys not seen"
after=$(scrape after)
assert_eq "QPs created in /qpw-server" 1 "$(delta "$base" "$after" 'qpwatch_qp_created_by_cgroup_total{cgroup="/qpw-server"}')"
assert_eq "QPs created in /qpw-client/inner" 1 "$(delta "$base" "$after" 'qpwatch_qp_created_by_cgroup_total{cgroup="/qpw-client/inner"}')"
assert_eq "QPs of unknown cgroups" 0 "$(delta "$base" "$after" 'qpwatch_qp_created_by_cgroup_total{cgroup="unknown"}')"
assert_eq "cgroup labels folded into other" 0 "$(delta "$base" "$after" 'qpwatch_label_overflow_total{label="cgroup"}')"

# streamed_destroys N: the event stream holds at least N QP destroys.
streamed_destroys() {
  test "$(jq -s '[.[] | select(.kind == "qp_destroy")] | length' "$OUT/events.jsonl")" -ge "$1"
}
wait_until 10 streamed_destroys 2 || fail "the event stream did not see both destroys"
stop_events
assert_eq "rping creates' cgroups in qpwatch events" "/qpw-client/inner,/qpw-server" \
  "$(jq -r 'select(.kind == "qp_create" and .comm == "rping") | .cgroup' "$OUT/events.jsonl" | sort | paste -sd,)"
stop_agent
