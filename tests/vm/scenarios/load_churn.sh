# 10,000 QP lifecycles (qp-churn: loopback RC pairs, create → INIT → RTR →
# RTS → destroy, 2 threads flat out) at the default ring size: the agent's
# created/destroyed counters move by exactly the generator's counts, every
# kernel call arrives as an event, nothing is lost, and the agent's memory
# does not grow with the QPs it has seen. Then the programs' wakeup count
# moves by exactly one more churn's records (one wakeup per 64 KiB).
#
# RSS bound: after - before <= ring size + 1 MiB, measured after a warm-up
# that has already sent more than the ring's size through it (the ring is
# mmapped into the agent: its pages become resident as the producer wraps
# round); the extra MiB is allocator slack. A per-QP leak of even 100 bytes would be 1 MB over 10,000 QPs, and a
# table leak shows in qpwatch_tracked_qps, which must return to its baseline.
# The agent runs with --groups qp (the ib_core QP hooks these QPs go through:
# qp-churn uses no rdma_cm); it starts several times faster under emulation.
# vm-timeout: 600
LIFECYCLES=${LOAD_LIFECYCLES:-10000}
RING_BYTES=1048576 # the agent's default (README, --ring-buffer-bytes)
start_agent --groups qp
# Warm-up: the label series of every edge, state and histogram exist
# afterwards, and ~1.3 MB of records have gone round the 1 MiB ring once.
churn warmup --lifecycles 2500 --threads 2
read -r _ _ _ warm_calls _ _ _ < <(counts "$OUT/warmup.json")
wait_for_metric_at_least 'qpwatch_events_total{kind="qp_destroy"}' 2500 120 || fail "warm-up events not seen"
before=$(scrape before)
rss_before=$(status_kib "$AGENT_PID" VmRSS)
anon_before=$(status_kib "$AGENT_PID" RssAnon)
cpu_before=$(cpu_ticks "$AGENT_PID")
log "before: RSS $rss_before KiB, tracked $(metric "$before" qpwatch_tracked_qps), live $(metric "$before" qpwatch_qps)"

t0=$SECONDS
churn churn --lifecycles "$LIFECYCLES" --threads 2
read -r create_calls modify_calls destroy_calls kernel_calls created destroyed failures < <(counts "$OUT/churn.json")
log "qp-churn: $created created, $destroyed destroyed, $kernel_calls kernel calls in $((SECONDS - t0)) s ($(jq -r '.lifecycles_per_s | floor' "$OUT/churn.json") lifecycles/s)"
assert_eq "generator lifecycles" "$LIFECYCLES" "$(jq .counts.lifecycles "$OUT/churn.json")"
expected_events=$(($(qp_events "$before") + kernel_calls))
arrived() { [ "$(qp_events "$(scrape after)")" -ge "$expected_events" ]; }
wait_until 60 arrived || log "events still missing after 60 s"
after=$(scrape after)
rss_after=$(status_kib "$AGENT_PID" VmRSS)
cpu_after=$(cpu_ticks "$AGENT_PID")

assert_eq "qpwatch_qp_created_total delta" "$created" "$(delta "$before" "$after" 'qpwatch_qp_created_total{qp_type="RC"}')"
assert_eq "qpwatch_qp_destroyed_total delta" "$destroyed" "$(delta "$before" "$after" 'qpwatch_qp_destroyed_total{qp_type="RC"}')"
assert_eq "qp_create events" "$create_calls" "$(delta "$before" "$after" 'qpwatch_events_total{kind="qp_create"}')"
assert_eq "qp_modify events" "$modify_calls" "$(delta "$before" "$after" 'qpwatch_events_total{kind="qp_modify"}')"
assert_eq "qp_destroy events" "$destroy_calls" "$(delta "$before" "$after" 'qpwatch_events_total{kind="qp_destroy"}')"
assert_eq "RTR->RTS transitions" "$created" "$(delta "$before" "$after" 'qpwatch_qp_transition_duration_seconds_count{from="RTR",to="RTS"}')"
assert_eq "qpwatch_events_lost_total" 0 "$(metric "$after" qpwatch_events_lost_total)"
assert_eq "untracked QP events" 0 "$(delta "$before" "$after" qpwatch_untracked_qp_events_total)"
assert_eq "live QPs back to baseline" "$(metric "$before" qpwatch_qps)" "$(metric "$after" qpwatch_qps)"
assert_eq "tracked QPs back to baseline" "$(metric "$before" qpwatch_tracked_qps)" "$(metric "$after" qpwatch_tracked_qps)"
assert_eq "negative qpwatch_qps series" 0 "$(negative_gauges "$after")"
bound=$((RING_BYTES / 1024 + 1024))
growth=$((rss_after - rss_before))
log "RSS $rss_before -> $rss_after KiB (+$growth, bound +$bound; anon $anon_before -> $(status_kib "$AGENT_PID" RssAnon) KiB), peak $(status_kib "$AGENT_PID" VmHWM) KiB; agent CPU $(ticks_to_s $((cpu_after - cpu_before))) s for $LIFECYCLES lifecycles"
[ "$growth" -le "$bound" ] || fail "agent RSS grew by $growth KiB over $LIFECYCLES lifecycles (bound $bound KiB)"
log "ok: RSS growth $growth KiB <= $bound KiB"

# The wakeup rule (README, --ring-buffer-bytes): one record in every 64 KiB
# written asks for a wakeup. The programs count the bytes written since the
# last such record in their .bss map; one thread's records are never
# written concurrently, so after N more QP records (168 bytes each) the
# count has moved by exactly N records, starting again from 0 at the record
# that reaches 64 KiB (every 391st).
record=168 mark=$((RING_BYTES / 4 < 65536 ? RING_BYTES / 4 : 65536)) # hooks::wakeup_bytes
per_wakeup=$(((mark + record - 1) / record))
count0=$(wakeup_counter) || fail "no .bss map of the agent's programs"
churn wakeups --lifecycles 100 --threads 1
read -r _ _ _ wake_calls _ _ _ < <(counts "$OUT/wakeups.json")
count1=$(wakeup_counter)
log "bytes since the last wakeup: $count0, then $count1 after $wake_calls records"
assert_eq "bytes since the last wakeup" "$(((count0 / record + wake_calls) % per_wakeup * record))" "$count1"
stop_agent
