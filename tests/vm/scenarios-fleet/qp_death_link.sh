# A QP dies for a reason across the link: perftest's ib_write_bw over
# rdma_cm with --retry_count 2 from h1 to h2, and the switch's port toward
# h2 taken down mid-traffic, so h1's QP runs out of transport retries.
#
#   every host  agent up ...................................... barrier agents
#   h2          ib_write_bw -R server ......................... barrier server
#   h1          ib_write_bw -R --retry_count 2 -D 60 client, its two QPs (the
#               rdma_cm exchange's, the data's) in RTS and its packets
#               flowing; the port toward h2 down; the client fails with a
#               completion error; the port up again
#   h1          its agent: one entry into ERR with cause
#               completion:RETRY_EXC_ERR and nothing else, one RETRY_EXC_ERR
#               completion (the flushes after it are not counted), and no
#               entry requested by the owner; rxe0's retry_exceeded_err moved
#               by 1 and completer_retry_err by at least 2 (the retries) in
#               sysfs, the agent exporting sysfs' values; `qpwatch events`
#               shows one QP moved to ERR by the device, ib_write_bw's, and
#               its life: RTS, the RETRY_EXC_ERR completion, the device's
#               move to ERR with its cause, the destroy
#   h2          the server killed (it waits for the client forever)
# vm-timeout: 600
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs the switch (three hosts)"
h2=$(fleet_host_addr 2)
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
launch_agent --sysfs-counters-interval 1
wait_agent_ready 180
[ "$HOST_INDEX" = 1 ] && start_events
base=$(scrape base)
fleet_barrier agents

case $HOST_INDEX in
  1)
    fleet_barrier server
    exceeded0=$(cat "$HW/retry_exceeded_err") retries0=$(cat "$HW/completer_retry_err")
    ib_write_bw -d rxe0 -R --retry_count 2 -D 60 "$h2" >"$OUT/ib_write_bw.log" 2>&1 &
    client=$!
    # perftest -R: one QP for the rdma_cm exchange, then the data QP
    flowing() {
      sent1=$(cat "$HW/sent_pkts")
      res_count_is qp -eq 2 '.comm == "ib_write_bw" and .state == "RTS"' && [ "$((sent1 - sent0))" -ge 1000 ]
    }
    sent0=$(cat "$HW/sent_pkts")
    wait_until 60 flowing || { cat "$OUT/ib_write_bw.log" >&2; fail "ib_write_bw's QPs never in RTS with traffic"; }
    log "ib_write_bw's QPs in RTS: $(rdma -j res show qp | jq -r '[.[] | select(.comm == "ib_write_bw") | .lqpn] | join(",")'); $((sent1 - sent0)) packets sent"
    fleet_switch link 2 down >&2
    down_at=$SECONDS
    if wait "$client"; then
      cat "$OUT/ib_write_bw.log" >&2
      fail "ib_write_bw succeeded with the link down"
    fi
    log "ib_write_bw failed $((SECONDS - down_at)) s after the link went down: $(grep -i -m1 -E 'error|failed' "$OUT/ib_write_bw.log")"
    fleet_switch link 2 up >&2
    assert_eq "sysfs retry_exceeded_err" 1 $(($(cat "$HW/retry_exceeded_err") - exceeded0))
    retries=$(($(cat "$HW/completer_retry_err") - retries0))
    [ "$retries" -ge 2 ] || fail "sysfs completer_retry_err moved by $retries, expected at least 2 (retry_count 2)"
    log "sysfs completer_retry_err +$retries"
    sel='qpwatch_qp_errors_total{cause="completion:RETRY_EXC_ERR"}'
    wait_for_metric "$sel" "$(($(metric "$base" "$sel") + 1))" || fail "h1: the QP's entry into ERR not counted with its cause"
    wait_until 30 res_count_is qp -eq 0 '.comm == "ib_write_bw"' || fail "ib_write_bw's QP still listed"
    created=$(($(metric "$(scrape created)" 'qpwatch_qp_created_total{device="rxe0",qp_type="RC"}') - $(metric "$base" 'qpwatch_qp_created_total{device="rxe0",qp_type="RC"}')))
    wait_for_metric 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}' \
      $(($(metric "$base" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}') + created)) || fail "h1: not all $created destroys seen"
    after=$(scrape_fresh after)
    assert_eq "h1: ib_write_bw's RC QPs created (and destroyed)" 2 "$created"
    assert_eq "h1: entries into ERR" 1 "$(delta "$base" "$after" 'qpwatch_qp_errors_total')"
    assert_eq "h1: entries requested by the owner" 0 "$(delta "$base" "$after" 'qpwatch_qp_errors_total{cause="requested"}')"
    assert_eq "h1: RETRY_EXC_ERR completions" 1 "$(delta "$base" "$after" 'qpwatch_qp_completion_errors_total{device="rxe0",status="RETRY_EXC_ERR"}')"
    assert_eq "h1: completion errors of any status" 1 "$(delta "$base" "$after" 'qpwatch_qp_completion_errors_total')"
    assert_eq "h1: agent's retry_exceeded_err" "$(cat "$HW/retry_exceeded_err")" "$(metric "$after" 'qpwatch_port_hw_stats_total{device="rxe0",port="1",counter="retry_exceeded_err"}')"
    assert_eq "h1: agent's completer_retry_err" "$(cat "$HW/completer_retry_err")" "$(metric "$after" 'qpwatch_port_hw_stats_total{device="rxe0",port="1",counter="completer_retry_err"}')"
    assert_eq "h1: events lost" 0 "$(metric "$after" 'qpwatch_events_lost_total')"
    died() { jq -r 'select(.kind == "qp_device_error") | .qp_num' "$OUT/events.jsonl"; }
    has_died() { [ -n "$(died)" ]; }
    wait_until 10 has_died || fail "no qp_device_error in the event stream"
    assert_eq "h1: QPs the device moved to ERR in qpwatch events" 1 "$(died | wc -l)"
    qp=$(died)
    assert_eq "h1: creator of QP $qp" ib_write_bw "$(jq -r --argjson qp "$qp" 'select(.kind == "qp_create" and .qp_num == $qp) | .comm' "$OUT/events.jsonl")"
    sequence() {
      jq -r --argjson qp "$qp" 'select(.qp_num == $qp and .kind != "cm") |
        [.kind, (.from_state // "-"), (.to_state // "-"), (.wc_status // "-"), (.err_cause // "-")] | join(" ")' "$OUT/events.jsonl"
    }
    destroyed() { sequence | grep -q '^qp_destroy'; }
    wait_until 10 destroyed || fail "the event stream did not see QP $qp destroyed"
    stop_events
    sequence >"$OUT/sequence.txt"
    log "QP $qp: $(paste -sd'|' "$OUT/sequence.txt")"
    # from RTS on: the error completion, the device's move with its cause,
    # whatever the owner does to a QP in ERR, the destroy
    awk '/^qp_modify RTR RTS/ { rts = NR } END { exit !rts }' "$OUT/sequence.txt" || fail "QP $qp never seen reaching RTS"
    tail_of_life=$(awk '/^qp_modify RTR RTS/ { on = 1; next } on && !/^qp_modify ERR/' "$OUT/sequence.txt")
    expected="qp_completion_error RTS - RETRY_EXC_ERR -
qp_device_error RTS ERR - completion:RETRY_EXC_ERR
qp_destroy ERR - - -"
    [ "$tail_of_life" = "$expected" ] || fail "QP $qp after RTS: $(paste -sd'|' <<<"$tail_of_life"), expected $(paste -sd'|' <<<"$expected")"
    log "ok: QP $qp died of completion:RETRY_EXC_ERR, in order in qpwatch events"
    ;;
  2)
    timeout 300 ib_write_bw -d rxe0 -R --retry_count 2 -D 60 >"$OUT/ib_write_bw-server.log" 2>&1 &
    server=$!
    wait_listener ib_write_bw
    fleet_barrier server
    ;;
  *) fleet_barrier server ;;
esac
fleet_barrier died
if [ "$HOST_INDEX" = 2 ]; then
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  log "h2: ib_write_bw server stopped: $(tail -n1 "$OUT/ib_write_bw-server.log")"
fi
stop_agent
