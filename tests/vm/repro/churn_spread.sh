# vm-timeout: 900
# Not part of the suite: how far a churn with nothing attached moves from one
# run to the next in this guest. REPRO_N (15) churns of 1,000 lifecycles back
# to back; per churn the time per lifecycle and the medians of create, the
# RTR modify and destroy (µs), then the guest's cross-CPU interrupts. Compare
# guests (bench/RESULTS.md round 17):
#   VM_CPUS=1 tests/vm/run repro/churn_spread
#   tests/vm/run repro/churn_spread                      (2 vCPUs, idle halts)
#   VM_KERNEL_ARGS="tsc=reliable clocksource=tsc idle=poll" tests/vm/run repro/churn_spread
log "kernel command line: $(cat /proc/cmdline)"
churn warm --lifecycles 100 --threads 1
for r in $(seq 1 "${REPRO_N:-15}"); do
  churn "a$r" --lifecycles 1000 --threads 1
  log "churn $r: $(jq -r '"\(.churn_elapsed_ns / .counts.lifecycles / 1000 | floor) µs per lifecycle; p50 create \(.latency.create.p50_ns / 1000 | floor), RTR \(.latency.modify_rtr.p50_ns / 1000 | floor), destroy \(.latency.destroy.p50_ns / 1000 | floor) µs"' "$OUT/a$r.json")"
done
log "cross-CPU interrupts: $(grep -E 'TLB|CAL|RES' /proc/interrupts | tr -s ' ' | paste -s -d';')"
