# The RDMA stack is loaded after the agent starts (a real ops case: the driver
# comes up late). With ib_core and rdma_cm absent the agent runs, reports every
# hook detached and is not ready; once `modprobe rdma_rxe rdma_ucm` brings them
# in it attaches them all, observes the GSI QP rxe0's link brings up, and
# counts rping's QPs and CM events exactly. rxe0 is restored for later scenarios.
stack="nvme_rdma nvmet_rdma rpcrdma rdma_ucm rdma_rxe ib_uverbs rdma_cm iw_cm ib_cm ib_core"
unload_stack() {
  rdma link delete rxe0 2>/dev/null || true
  local m
  for m in $stack; do [ -d "/sys/module/$m" ] && modprobe -r "$m"; done
  [ ! -d /sys/module/ib_core ]
}
on_exit restore_rxe
unload_stack || fail "could not unload the RDMA stack: $(lsmod | grep -E 'ib_|rdma' | tr '\n' ' ')"
log "RDMA stack unloaded"

# Not start_agent: that waits for /readyz, which must stay 503 here.
launch_agent --module-poll-interval 1
wait_until 60 grep -q 'instance="rdma_cm" reason=module' "$OUT/agent.log" || fail "agent did not report the missing modules"
agent_get /healthz || fail "/healthz not 200"
sleep 3 # a few module polls: nothing may load the RDMA stack meanwhile
[ ! -d /sys/module/ib_core ] || fail "ib_core was loaded while the agent waited for it"
status=$(curl -s -o /dev/null -w '%{http_code}' "http://$AGENT_ADDR/readyz")
assert_eq "/readyz without ib_core" 503 "$status"
before=$(scrape before)
hooks=$(series_count "$before" 'qpwatch_hook_attached')
[ "$hooks" -gt 0 ] || fail "no qpwatch_hook_attached series"
assert_eq "hooks attached without ib_core/rdma_cm" 0 "$(metric "$before" 'qpwatch_hook_attached')"
grep -q 'instance="ib_core" reason=module ib_core not loaded' "$OUT/agent.log" || fail "agent log does not name the missing ib_core"
log "$hooks hooks reported detached; /readyz 503"

modprobe rdma_rxe
modprobe rdma_ucm
wait_until 60 agent_get /readyz || fail "not ready after modprobe"
wait_until 90 grep -q 'hooks attached instance="rdma_cm"' "$OUT/agent.log" || fail "rdma_cm hooks not attached after modprobe"
attached=$(scrape attached)
assert_eq "hooks left detached after modprobe" 0 "$(($(series_count "$attached" 'qpwatch_hook_attached') - $(metric "$attached" 'qpwatch_hook_attached')))"
log "$(metric "$attached" 'qpwatch_hook_attached') hooks attached after modprobe"

# rxe0's link brings up its GSI QP (QP1) in the kernel: ib_mad → ib_create_qp_kernel.
rdma link add rxe0 type rxe netdev qpw0
wait_for_metric 'qpwatch_qp_created_total{device="rxe0",qp_type="GSI",origin="kernel"}' 1 60 ||
  fail "GSI QP creation of the late rxe0 not seen"
# ib_mad_port_start takes it RESET→INIT→RTR→RTS right away.
wait_for_metric 'qpwatch_qps{device="rxe0",qp_type="GSI",state="RTS"}' 1 30 || fail "GSI QP not seen reaching RTS"
gsi=$(scrape gsi)

rping_once 3
wait_for_metric 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}' 2 60 || fail "rping destroys not seen"
end=$(scrape end)
assert_eq "RC QPs created" 2 "$(delta "$gsi" "$end" 'qpwatch_qp_created_total{device="rxe0",qp_type="RC",origin="user"}')"
for edge in 'from="RESET",to="INIT"' 'from="INIT",to="RTR"' 'from="RTR",to="RTS"'; do
  assert_eq "transitions {$edge}" 2 "$(delta "$gsi" "$end" "qpwatch_qp_transition_duration_seconds_count{$edge}")"
done
assert_eq "CONNECT_REQUEST events" 1 "$(metric "$end" 'qpwatch_cm_events_total{event="CONNECT_REQUEST"}')"
assert_eq "ESTABLISHED events" 1 "$(metric "$end" 'qpwatch_cm_events_total{event="ESTABLISHED"}')"
assert_eq "live RC QPs" 0 "$(metric "$end" 'qpwatch_qps{device="rxe0",qp_type="RC"}')"
assert_eq "live QPs (agent) vs rdma res show qp" "$(res_count qp)" "$(metric "$end" 'qpwatch_qps{device="rxe0"}')"
assert_eq "lost events" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
stop_agent
