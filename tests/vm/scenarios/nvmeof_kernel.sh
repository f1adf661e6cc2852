# In-kernel QPs: NVMe over Fabrics over rxe0, target (nvmet-rdma, null_blk
# namespace) and host (nvme-rdma) in the guest. Their QPs are created by
# rdma_create_qp() → ib_create_qp_kernel() and moved through their states by the
# CMA (cma_init_conn_qp, cma_modify_qp_rtr/rts), not by userspace.
NQN=nqn.2026-12.io.qpwatch:test
CFG=/sys/kernel/config/nvmet
modprobe null_blk nr_devices=1
modprobe nvmet
modprobe nvmet-rdma
modprobe nvme-rdma
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
on_exit "rmdir $CFG/subsystems/$NQN"
mkdir "$CFG/subsystems/$NQN"
echo 1 >"$CFG/subsystems/$NQN/attr_allow_any_host"
on_exit "rmdir $CFG/subsystems/$NQN/namespaces/1"
mkdir "$CFG/subsystems/$NQN/namespaces/1"
echo /dev/nullb0 >"$CFG/subsystems/$NQN/namespaces/1/device_path"
echo 1 >"$CFG/subsystems/$NQN/namespaces/1/enable"
on_exit "rmdir $CFG/ports/1"
mkdir "$CFG/ports/1"
echo rdma >"$CFG/ports/1/addr_trtype"
echo ipv4 >"$CFG/ports/1/addr_adrfam"
echo "$RXE_ADDR" >"$CFG/ports/1/addr_traddr"
echo 4420 >"$CFG/ports/1/addr_trsvcid"
on_exit "rm -f $CFG/ports/1/subsystems/$NQN; echo 0 > $CFG/subsystems/$NQN/namespaces/1/enable"
ln -s "$CFG/subsystems/$NQN" "$CFG/ports/1/subsystems/$NQN"

start_agent
base=$(scrape base)
on_exit "nvme disconnect -n $NQN"
kernel_rc_base=$(rdma_qps '.type == "RC"')
nvme connect -t rdma -a "$RXE_ADDR" -s 4420 -n "$NQN" -i 1 \
  -q nqn.2026-12.io.qpwatch:host -I 3b6a8c0e-0d5e-4c8e-9a1a-6f1f0c2b9d11 >"$OUT/nvme-connect.log" 2>&1 ||
  { cat "$OUT/nvme-connect.log"; fail "nvme connect failed"; }
wait_until 30 bash -c 'ls /sys/class/nvme/*/subsysnqn >/dev/null 2>&1' || fail "no NVMe controller"
rdma res show qp >"$OUT/rdma-qp.txt"
# host (nvme_rdma) and target (nvmet_rdma) QPs: admin + 1 I/O queue each side
kernel_qps=$(( $(rdma_qps '.type == "RC"') - kernel_rc_base ))
log "rdma res show qp lists $kernel_qps new kernel RC QPs"
[ "$kernel_qps" -ge 4 ] || fail "expected at least 4 NVMe-oF QPs, saw $kernel_qps"
dd if=/dev/nvme0n1 of=/dev/null bs=4k count=256 iflag=direct 2>"$OUT/dd.log" || fail "I/O over NVMe-oF failed"
wait_for_metric 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}' \
  $(( $(metric "$base" 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}') + kernel_qps )) ||
  fail "kernel QP creations not all seen"
up=$(scrape connected)
assert_eq "kernel RC QPs created" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}')"
assert_eq "user QPs created" 0 "$(delta "$base" "$up" 'qpwatch_qp_created_total{origin="user"}')"
assert_eq "rdma_create_qp calls" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_cm_call_duration_seconds_count{call="rdma_create_qp"}')"
assert_eq "cma_init_conn_qp (RESET→INIT)" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_cm_call_duration_seconds_count{call="cma_init_conn_qp"}')"
assert_eq "cma_modify_qp_rtr on kernel QPs" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_cm_call_duration_seconds_count{call="cma_modify_qp_rtr"}')"
assert_eq "cma_modify_qp_rts on kernel QPs" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_cm_call_duration_seconds_count{call="cma_modify_qp_rts"}')"
assert_eq "INIT→RTR transitions" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_qp_transition_duration_seconds_count{from="INIT",to="RTR"}')"
assert_eq "RTR→RTS transitions" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_qp_transition_duration_seconds_count{from="RTR",to="RTS"}')"
assert_eq "live RTS RC QPs" "$kernel_qps" "$(( $(metric "$up" 'qpwatch_qps{qp_type="RC",state="RTS"}') - $(metric "$base" 'qpwatch_qps{qp_type="RC",state="RTS"}') ))"
assert_eq "passive connects (target side)" "$(( kernel_qps / 2 ))" "$(delta "$base" "$up" 'qpwatch_cm_connect_duration_seconds_count{role="passive"}')"
assert_eq "active connects (host side)" "$(( kernel_qps / 2 ))" "$(delta "$base" "$up" 'qpwatch_cm_connect_duration_seconds_count{role="active"}')"
assert_eq "ESTABLISHED events (both sides have kernel QPs)" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_cm_events_total{event="ESTABLISHED"}')"

nvme disconnect -n "$NQN" >"$OUT/nvme-disconnect.log" 2>&1 || fail "nvme disconnect failed"
gone() { [ "$(rdma_qps '.type == "RC"')" -eq "$kernel_rc_base" ]; }
wait_until 30 gone || fail "kernel kept NVMe-oF QPs after disconnect"
wait_for_metric 'qpwatch_qps{qp_type="RC"}' "$(metric "$base" 'qpwatch_qps{qp_type="RC"}')" ||
  fail "live-QP gauge did not return to its value before connect"
end=$(scrape end)
assert_eq "kernel QPs destroyed" "$kernel_qps" "$(delta "$up" "$end" 'qpwatch_qp_destroyed_total{qp_type="RC"}')"

assert_eq "events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
stop_agent
