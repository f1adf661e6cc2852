# The agent's probes against targets that fail, each with its own result
# label; the agent keeps running, and nothing is left once the targets are
# removed. rxe answers (see rdma-probe/README.md):
#   closed    - no listener on the port: the target's CM rejects (rejected)
#   unroutable- no route to the address: rdma_resolve_addr fails (addr_error)
#   silent    - on-link address with nobody there: the connect step times out
#   frozen    - persistent connection whose responder is stopped: ping timeout
cfg=$OUT/qpwatch.toml
{
  echo "listen = \"$AGENT_ADDR\""
  probe_target closed "$RXE_ADDR:9999" 3 3 1
  probe_target unroutable "203.0.113.1:9723" 3 3 1
  probe_target silent "198.18.0.2:9723" 3 3 1
  probe_target frozen "$RXE_ADDR:9437" 3 3 1 'mode = "persistent"'
} >"$cfg"
"$BIN/qpwatch" check-config "$cfg" || fail "test config invalid"
base_qps=$(res_count qp)
"$BIN/qpwatch" responder --listen "$RXE_ADDR:9437" >"$OUT/responder.log" 2>&1 &
responder=$!
on_exit "kill -CONT $responder; kill -9 $responder"
wait_until 20 res_count_is cm_id -ge 1 '.state == "LISTEN"' || fail "responder not listening"
start_agent --config "$cfg"
for t in closed unroutable silent; do
  wait_for_metric_at_least "qpwatch_probe_total{target=\"$t\"}" 2 120 || fail "target $t not probed twice"
done
wait_for_metric_at_least 'qpwatch_probe_total{target="frozen",result="ok"}' 2 120 || fail "frozen target never ok"
kill -STOP "$responder"
log "responder stopped (SIGSTOP)"
wait_for_metric_at_least 'qpwatch_probe_total{target="frozen",result="timeout"}' 1 60 || fail "no timeout from the frozen responder"
# remove every target; the agent stays up
echo "listen = \"$AGENT_ADDR\"" >"$cfg"
reload_agent
sleep 4
end=$(scrape end)
for pair in closed:rejected unroutable:addr_error silent:timeout; do
  t=${pair%%:*} result=${pair#*:}
  all=$(metric "$end" "qpwatch_probe_total{target=\"$t\"}")
  assert_eq "target $t: every probe is $result ($all)" "$all" "$(metric "$end" "qpwatch_probe_total{target=\"$t\",result=\"$result\"}")"
done
assert_eq "frozen: only ok and timeout" "$(metric "$end" 'qpwatch_probe_total{target="frozen"}')" \
  "$(( $(metric "$end" 'qpwatch_probe_total{target="frozen",result="ok"}') + $(metric "$end" 'qpwatch_probe_total{target="frozen",result="timeout"}') ))"
assert_eq "probe QPs the eBPF path missed" 0 "$(metric "$end" 'qpwatch_probe_qps_unseen_total')"
agent_get /healthz || fail "agent not healthy"
kill -CONT "$responder"; kill_wait "$responder"
back() { res_count_is qp -eq "$base_qps" && res_count_is mr -eq 0; }
wait_until 30 back || { rdma res show qp; rdma res show mr; fail "QPs or MRs left behind"; }
assert_eq "CM ids left" 0 "$(res_count cm_id)"
stop_agent
