# The agent never keeps the RDMA stack from being unloaded (a driver or
# firmware upgrade reloads it under a running agent). With default flags and
# every hook attached, the stack's module reference counts are the same as
# without the agent; the whole stack then unloads with plain `modprobe -r`
# while the agent runs; the agent keeps serving, /readyz is 503 and every hook
# shows detached with the reason; once the stack is loaded again every hook
# re-attaches by itself and an rping is counted exactly.
stack="rdma_ucm rdma_cm ib_cm iw_cm ib_uverbs rdma_rxe ib_core"
# consumers other scenarios may have left loaded, unloaded first
consumers="nvme_rdma nvmet_rdma rpcrdma"
on_exit restore_rxe
for m in $consumers; do [ ! -d "/sys/module/$m" ] || modprobe -r "$m"; done
refcounts() {
  local m
  for m in $stack; do printf '%s=%s ' "$m" "$(cat "/sys/module/$m/refcnt")"; done
}
without=$(refcounts)
log "refcounts without the agent: $without"

start_agent --module-poll-interval 1
all_attached() {
  local s
  s=$(scrape hooks)
  [ "$(series_count "$s" 'qpwatch_hook_attached')" -gt 0 ] &&
    [ "$(metric "$s" 'qpwatch_hook_attached')" -eq "$(series_count "$s" 'qpwatch_hook_attached')" ]
}
wait_until 60 all_attached || fail "not every hook attached: $(grep -c ' 0$' "$OUT/hooks.prom") detached"
hooks=$(metric "$OUT/hooks.prom" 'qpwatch_hook_attached')
log "$hooks hooks attached"
with=$(refcounts)
log "refcounts with the agent: $with"
assert_eq "module refcounts with the agent attached (same as without)" "$without" "$with"

rdma link delete rxe0
for m in rdma_rxe rdma_ucm rdma_cm ib_cm iw_cm ib_uverbs ib_core; do
  [ ! -d "/sys/module/$m" ] || modprobe -r "$m" 2>"$OUT/modprobe-$m.err" ||
    fail "modprobe -r $m with the agent running: $(cat "$OUT/modprobe-$m.err")"
done
for m in $stack; do [ ! -d "/sys/module/$m" ] || fail "$m still loaded"; done
log "RDMA stack unloaded under the agent"

detached() { [ "$(metric "$(scrape gone)" 'qpwatch_hook_attached')" -eq 0 ]; }
wait_until 30 detached || fail "hooks still shown attached with the stack gone"
kill -0 "$AGENT_PID" || fail "agent exited"
curl -fsS "http://$AGENT_ADDR/healthz" -o /dev/null || fail "/healthz not 200 with the stack gone"
assert_eq "/readyz with the stack gone" 503 "$(curl -s -o /dev/null -w '%{http_code}' "http://$AGENT_ADDR/readyz")"
assert_eq "hooks attached with the stack gone" 0 "$(metric "$OUT/gone.prom" 'qpwatch_hook_attached')"
# the hooks on modules a host may not load (uverbs' QP event handler, the
# soft-RoCE driver's) are idle, without a series, while their module is away
optional=$(grep -cE '^qpwatch_hook_attached\{hook="kprobe:(ib_uverbs_qp_event_handler|rxe_cq_post|rxe_qp_error)"\} 1$' "$OUT/hooks.prom")
assert_eq "optional hooks attached with the stack loaded" 3 "$optional"
assert_eq "hooks listed with the stack gone (optional ones idle)" "$((hooks - optional))" "$(series_count "$OUT/gone.prom" 'qpwatch_hook_attached')"
for i in ib_core rdma_cm; do
  grep -q "module unloaded: detaching its hooks instance=\"$i\"" "$OUT/agent.log" || fail "the log does not say why the $i hooks went"
done

restore_rxe
wait_until 60 curl -fs "http://$AGENT_ADDR/readyz" -o /dev/null || fail "not ready after the stack came back"
wait_until 60 all_attached || fail "not every hook re-attached: $(metric "$OUT/hooks.prom" 'qpwatch_hook_attached') of $hooks"
back=$(scrape back)
assert_eq "hooks attached after the reload" "$hooks" "$(metric "$back" 'qpwatch_hook_attached')"

rping_once 3
wait_for_metric 'qpwatch_qps{device="rxe0",qp_type="RC"}' 0 || fail "rping's QPs still live"
end=$(scrape end)
assert_eq "RC QPs created after the reload" 2 "$(delta "$back" "$end" 'qpwatch_qp_created_total{device="rxe0",qp_type="RC",origin="user"}')"
assert_eq "RC QPs destroyed after the reload" 2 "$(delta "$back" "$end" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}')"
for edge in 'from="RESET",to="INIT"' 'from="INIT",to="RTR"' 'from="RTR",to="RTS"'; do
  assert_eq "transitions {$edge}" 2 "$(delta "$back" "$end" "qpwatch_qp_transition_duration_seconds_count{$edge}")"
done
assert_eq "CONNECT_REQUEST events" 1 "$(delta "$back" "$end" 'qpwatch_cm_events_total{event="CONNECT_REQUEST"}')"
assert_eq "ESTABLISHED events" 1 "$(delta "$back" "$end" 'qpwatch_cm_events_total{event="ESTABLISHED"}')"
assert_eq "connect durations" 2 "$(delta "$back" "$end" 'qpwatch_cm_connect_duration_seconds_count')"
assert_eq "live QPs (agent) vs rdma res show qp" "$(res_count qp)" "$(metric "$end" 'qpwatch_qps{device="rxe0"}')"
assert_eq "events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
stop_agent
assert_eq "module refcounts after the agent stopped" "$without" "$(refcounts)"

# The opt-in ib-cm-tracepoints group pins ib_cm, as documented: one reference
# per ib_cma:* tracepoint attached, and none left when the agent stops.
start_agent --groups qp,cm,kernel-ulp,ib-cm-tracepoints
wait_until 60 all_attached || fail "not every hook attached with ib-cm-tracepoints"
tracepoints=$(grep -c '^qpwatch_hook_attached{hook="raw_tracepoint:ib_cma:[a-z_]*"} 1$' "$OUT/hooks.prom")
assert_eq "ib_cma tracepoints attached" 34 "$tracepoints"
pinned=$(refcounts)
log "refcounts with ib-cm-tracepoints ($tracepoints tracepoints): $pinned"
ib_cm_refs() { sed 's/.*ib_cm=\([0-9]*\) .*/\1/' <<<"$1"; }
assert_eq "ib_cm references held by the ib_cma tracepoints" "$tracepoints" "$(( $(ib_cm_refs "$pinned") - $(ib_cm_refs "$without") ))"
stop_agent
assert_eq "module refcounts after that agent stopped" "$without" "$(refcounts)"
