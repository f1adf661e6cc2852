# RDMA network namespaces: the agent runs in a network namespace of its own
# (qpw-ns) and the device, rxe0, stays in the initial one. Soft-RoCE cannot
# be moved (`rdma dev set rxe0 netns` fails with EOPNOTSUPP: rxe has no
# disassociate_ucontext), so this is a device in another namespace seen from
# the agent's side. An rping connection is up before each agent starts.
#   shared mode     the agent lists rxe0: it adopts the connection's two RC
#                   QPs (and rxe0's QP1) and logs no netns warning;
#   exclusive mode  the agent lists no device: it says so in its log, adopts
#                   nothing and exports no counters of rxe0; the hooks still
#                   see every call on rxe0, under its name: rping -C 2 is
#                   2 RC QPs created and destroyed on device="rxe0" and 2
#                   entries into ERR requested by their owners; the older
#                   connection's QPs, killed, are 2 destroys of QPs the
#                   agent did not know.
NS=qpw-ns
mkdir -p "$OUT/ns-bin"
printf '#!/bin/sh\nexec ip netns exec %s %s/qpwatch "$@"\n' "$NS" "$BIN" >"$OUT/ns-bin/qpwatch"
chmod +x "$OUT/ns-bin/qpwatch"
in_ns() { ip netns exec "$NS" "$@"; }
make_ns() { ip netns add "$NS" && in_ns ip link set lo up; }
# the agent listens on the namespace's loopback: agent_get (and with it
# wait_agent_ready) asks from inside the namespace
agent_get() { in_ns curl -fsS -o /dev/null "http://$AGENT_ADDR$1" 2>/dev/null; }
scrape() {
  local file="$OUT/$1.prom"
  in_ns curl -fsS "http://$AGENT_ADDR/metrics" >"$file" || fail "scrape failed"
  echo "$file"
}
on_exit "ip netns del $NS 2>/dev/null; rdma system set netns shared"
assert_eq "RDMA netns mode at start" shared "$(rdma system show | awk '$1 == "netns" { print $2 }')"

# shared: the agent in qpw-ns sees rxe0
start_rping_connection
make_ns || fail "cannot make $NS"
BIN=$OUT/ns-bin start_agent
shared=$(scrape shared)
grep -q 'reconciled existing QPs adopted=3 dropped=0 listed=3' "$OUT/agent.log" || fail "shared: rxe0's QP1 and rping's QPs not adopted: $(grep 'reconciled existing QPs' "$OUT/agent.log")"
assert_eq "shared: rping's RC QPs adopted" 2 "$(metric "$shared" 'qpwatch_qps{device="rxe0",qp_type="RC"}')"
grep -q 'RDMA netns mode is exclusive' "$OUT/agent.log" && fail "shared: the agent warns of exclusive mode"
stop_agent
kill_rping_connection
mv "$OUT/agent.log" "$OUT/agent-shared.log"

# exclusive: rxe0 is another namespace's device
ip netns del "$NS"
rdma system set netns exclusive || fail "cannot set the RDMA netns mode exclusive"
make_ns || fail "cannot make $NS"
log "rdma dev set rxe0 netns $NS: $(rdma dev set rxe0 netns "$NS" 2>&1 && echo moved)"
assert_eq "devices listed in $NS" 0 "$(in_ns rdma -j dev show | jq length)"
start_rping_connection
BIN=$OUT/ns-bin start_agent --sysfs-counters-interval 1
grep -q 'WARN.*RDMA netns mode is exclusive.* listed=$' "$OUT/agent.log" || fail "exclusive: the agent's log does not say what it cannot see"
log "agent: $(grep -o 'RDMA netns mode is exclusive[^;]*' "$OUT/agent.log")"
grep -q 'reconciled existing QPs adopted=0 dropped=0 listed=0' "$OUT/agent.log" || fail "exclusive: $(grep 'reconciled existing QPs' "$OUT/agent.log")"
base=$(scrape_fresh exclusive)
assert_eq "exclusive: QPs adopted" 0 "$(metric "$base" 'qpwatch_qps')"
assert_eq "exclusive: rxe0 counter series" 0 "$(series_count "$base" 'qpwatch_port_hw_stats_total')"
assert_eq "exclusive: QP hooks attached" 1 "$(metric "$base" 'qpwatch_hook_attached{hook="kprobe:ib_create_qp_user"}')"

rc='device="rxe0",qp_type="RC"'
# another port than the connection's server, which still listens
rping -s -a "$RXE_ADDR" -p 7175 -C 2 >>"$OUT/rping-server.log" 2>&1 &
server=$!
WAIT_INTERVAL=0.5 wait_until 30 res_count_is cm_id -ge 2 '.state == "LISTEN" and .comm == "rping"' || fail "second rping server not listening"
rping -c -a "$RXE_ADDR" -p 7175 -C 2 >"$OUT/rping-client.log" 2>&1 || fail "rping client failed"
wait "$server" || fail "rping server failed"
wait_for_metric "qpwatch_qp_destroyed_total{$rc}" $(($(metric "$base" "qpwatch_qp_destroyed_total{$rc}") + 2)) || fail "exclusive: rping's destroys not seen"
pinged=$(scrape pinged)
assert_eq "exclusive: RC QPs created on rxe0" 2 "$(delta "$base" "$pinged" "qpwatch_qp_created_total{$rc,origin=\"user\"}")"
assert_eq "exclusive: entries into ERR requested" 2 "$(delta "$base" "$pinged" 'qpwatch_qp_errors_total{cause="requested"}')"
assert_eq "exclusive: RC QPs live" 0 "$(metric "$pinged" "qpwatch_qps{$rc}")"
kill_rping_connection
wait_for_metric "qpwatch_qp_destroyed_total{$rc}" $(($(metric "$pinged" "qpwatch_qp_destroyed_total{$rc}") + 2)) || fail "exclusive: the older connection's destroys not seen"
end=$(scrape end)
assert_eq "exclusive: destroys of QPs the agent did not know" 2 "$(delta "$pinged" "$end" 'qpwatch_untracked_qp_events_total{kind="qp_destroy"}')"
assert_eq "exclusive: events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
stop_agent
ip netns del "$NS"
rdma system set netns shared || fail "cannot set the RDMA netns mode back to shared"
