# perftest, a client we did not write, with the agent attached (default
# flags): ib_send_lat, ib_write_lat, ib_read_lat and ib_send_bw over rxe0,
# each with its QP information exchanged over TCP and over rdma_cm (-R),
# server and client in the guest. A bpftrace script (perftest.bt; another
# tool we did not write) counts the same runs' successful ib_create_qp_user
# returns and ib_destroy_qp_user calls per command: the agent's counts must equal them
# exactly, with 0 events lost, 0 untracked and the live-QP gauge back to its
# baseline after every run. bpftrace also prints each QP it counts with its
# process, and each run logs the agent's count and its server's pid: a
# mismatch shows in which run.
#
# Under TCG a perftest client now and then gives up on a completion; such a
# run is retried once (the failed run's QPs still count on both sides: the
# comparison with bpftrace is over every run).
#
# perftest's rdma_cm server listens on the wildcard address: rdma_listen()
# calls rdma_listen() again for each device (cma_listen_on_dev), on the
# same thread, so this also checks nested calls of one hook.
# vm-timeout: 600
start_agent
ref=$OUT/bpftrace-reference.out
start_bpftrace reference "$REPO/tests/vm/scenarios/perftest.bt"

base=$(scrape base)
tests="ib_send_lat ib_write_lat ib_read_lat ib_send_bw"
# listening TEST CM: the server is ready for its client
listening() {
  if [ -n "$2" ]; then
    cm_listening "$1"
  else
    ss -Hltn 'sport = :18515' | grep -q .
  fi
}
for t in $tests; do
  for cm in "" "-R"; do
    run="$t${cm:+ $cm}"
    before=$(scrape "$t${cm}-before")
    attempt=1
    while :; do
      "$t" -d rxe0 $cm -n 200 >"$OUT/$t$cm-server.$attempt.log" 2>&1 &
      server=$!
      wait_until 30 listening "$t" "$cm" || fail "$run: server not listening"
      if "$t" -d rxe0 $cm -n 200 "$RXE_ADDR" >"$OUT/$t$cm-client.$attempt.log" 2>&1; then
        wait "$server" || fail "$run: server failed"
        break
      fi
      cat "$OUT/$t$cm-client.$attempt.log" >&2
      kill "$server" 2>/dev/null || true # it may have given up already
      wait "$server" 2>/dev/null || true
      [ $attempt -lt 2 ] || fail "$run: client failed twice: $(grep -v '^ *$' "$OUT/$t$cm-client.$attempt.log" | tail -n 1)"
      log "$run: client failed ($(grep -v '^ *$' "$OUT/$t$cm-client.$attempt.log" | tail -n 1)); once more"
      attempt=2
    done
    wait_for_metric 'qpwatch_qps' "$(metric "$base" 'qpwatch_qps')" || fail "$run: live QPs not back to baseline"
    after=$(scrape "$t${cm}-after")
    created=$(delta "$before" "$after" "qpwatch_qp_created_by_process_total{comm=\"$t\"}")
    destroyed=$(delta "$before" "$after" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}')
    [ "$created" -gt 0 ] || fail "$run: no QP creation counted"
    log "$run: $created QPs created, attempt $attempt, server pid $server"
    assert_eq "$run: RC QPs destroyed = created" "$created" "$destroyed"
    assert_eq "$run: events lost" 0 "$(delta "$before" "$after" 'qpwatch_events_lost_total')"
    assert_eq "$run: untracked QP events" 0 "$(delta "$before" "$after" 'qpwatch_untracked_qp_events_total')"
    assert_eq "$run: modify errors" 0 "$(delta "$before" "$after" 'qpwatch_qp_modify_errors_total')"
  done
done

stop_bpftrace reference
end=$(scrape end)
# bpftrace's maps: "@created[ib_send_lat]: 6"
reference() { sed -n "s/^@$1\[$2\]: //p" "$ref"; }
for t in $tests; do
  want=$(reference created "$t")
  [ -n "$want" ] || { cat "$ref" >&2; fail "bpftrace counted no QP of $t"; }
  assert_eq "$t: QPs created (agent vs bpftrace)" "$want" "$(delta "$base" "$end" "qpwatch_qp_created_by_process_total{comm=\"$t\"}")"
done
total_destroyed=0
for t in $tests; do total_destroyed=$((total_destroyed + $(reference destroyed "$t"))); done
assert_eq "QPs destroyed (agent vs bpftrace)" "$total_destroyed" "$(delta "$base" "$end" 'qpwatch_qp_destroyed_total{device="rxe0",qp_type="RC"}')"
listens=0
for t in $tests; do listens=$((listens + $(reference listen_calls "$t"))); done
assert_eq "rdma_listen calls, nested ones included (agent vs bpftrace)" "$listens" "$(delta "$base" "$end" 'qpwatch_cm_call_duration_seconds_count{call="rdma_listen"}')"
assert_eq "live QPs back to baseline" "$(metric "$base" 'qpwatch_qps')" "$(metric "$end" 'qpwatch_qps')"
assert_eq "events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
stop_agent
