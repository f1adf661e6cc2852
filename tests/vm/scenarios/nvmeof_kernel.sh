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
# two target ports: the specific address, and every address (a wildcard
# listen: rdma_listen() calls rdma_listen() for each device, and connection
# requests reach the consumer through the per-device listener)
add_port() { # ID TRADDR TRSVCID
  on_exit "rmdir $CFG/ports/$1"
  mkdir "$CFG/ports/$1"
  echo rdma >"$CFG/ports/$1/addr_trtype"
  echo ipv4 >"$CFG/ports/$1/addr_adrfam"
  echo "$2" >"$CFG/ports/$1/addr_traddr"
  echo "$3" >"$CFG/ports/$1/addr_trsvcid"
  on_exit "rm -f $CFG/ports/$1/subsystems/$NQN"
  ln -s "$CFG/subsystems/$NQN" "$CFG/ports/$1/subsystems/$NQN"
}
on_exit "echo 0 > $CFG/subsystems/$NQN/namespaces/1/enable"

start_agent
idle=$(scrape idle)
add_port 1 "$RXE_ADDR" 4420
add_port 2 0.0.0.0 4421
wait_until 30 res_count_is cm_id -ge 2 '.state == "LISTEN"' ||
  fail "nvmet-rdma not listening on both ports"
wait_for_metric 'qpwatch_cm_ids{state="LISTEN"}' "$(res_count cm_id '.state == "LISTEN"')" || fail "listening CM ids not all counted"
listened=$(scrape listening)
# the specific address: one call; every address: the call and one nested per device (rxe0)
assert_eq "rdma_listen calls of the two target ports" 3 "$(delta "$idle" "$listened" 'qpwatch_cm_call_duration_seconds_count{call="rdma_listen"}')"
assert_eq "events lost while listening" 0 "$(metric "$listened" 'qpwatch_events_lost_total')"
# the consumers' QP event handlers (optional hooks) attach with their modules
for handler in nvme_rdma_qp_event nvmet_rdma_qp_event; do
  assert_eq "kprobe:$handler attached" 1 "$(metric "$listened" "qpwatch_hook_attached{hook=\"kprobe:$handler\"}")"
done

# connect_cycle SVCID: nvme connect through one target port, I/O, disconnect,
# with exact counts of both sides (host: nvme_rdma, active; target:
# nvmet_rdma, passive).
connect_cycle() {
  local svcid=$1 base up end kernel_rc_base kernel_qps
  base=$(scrape "base-$svcid")
  on_exit "nvme disconnect -n $NQN"
  kernel_rc_base=$(res_count qp '.type == "RC"')
  nvme connect -t rdma -a "$RXE_ADDR" -s "$svcid" -n "$NQN" -i 1 \
    -q nqn.2026-12.io.qpwatch:host -I 3b6a8c0e-0d5e-4c8e-9a1a-6f1f0c2b9d11 >"$OUT/nvme-connect-$svcid.log" 2>&1 ||
    { cat "$OUT/nvme-connect-$svcid.log"; fail "nvme connect to port $svcid failed"; }
  wait_until 30 bash -c 'ls /sys/class/nvme/*/subsysnqn >/dev/null 2>&1' || fail "no NVMe controller (port $svcid)"
  rdma res show qp >"$OUT/rdma-qp-$svcid.txt"
  # host (nvme_rdma) and target (nvmet_rdma) QPs: admin + 1 I/O queue each side
  kernel_qps=$(( $(res_count qp '.type == "RC"') - kernel_rc_base ))
  log "port $svcid: rdma res show qp lists $kernel_qps new kernel RC QPs"
  [ "$kernel_qps" -ge 4 ] || fail "expected at least 4 NVMe-oF QPs, saw $kernel_qps"
  wait_until 30 bash -c 'ls /dev/nvme*n1 >/dev/null 2>&1' || fail "no NVMe namespace (port $svcid)"
  dd if="$(ls /dev/nvme*n1 | head -n1)" of=/dev/null bs=4k count=256 iflag=direct 2>"$OUT/dd-$svcid.log" ||
    fail "I/O over NVMe-oF failed (port $svcid)"
  wait_for_metric 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}' \
    $(( $(metric "$base" 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}') + kernel_qps )) ||
    fail "kernel QP creations not all seen (port $svcid)"
  up=$(scrape "connected-$svcid")
  assert_eq "$svcid: kernel RC QPs created" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}')"
  assert_eq "$svcid: user QPs created" 0 "$(delta "$base" "$up" 'qpwatch_qp_created_total{origin="user"}')"
  for call in rdma_create_qp cma_init_conn_qp cma_modify_qp_rtr cma_modify_qp_rts; do
    assert_eq "$svcid: $call calls on kernel QPs" "$kernel_qps" "$(delta "$base" "$up" "qpwatch_cm_call_duration_seconds_count{call=\"$call\"}")"
  done
  assert_eq "$svcid: INIT→RTR transitions" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_qp_transition_duration_seconds_count{from="INIT",to="RTR"}')"
  assert_eq "$svcid: RTR→RTS transitions" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_qp_transition_duration_seconds_count{from="RTR",to="RTS"}')"
  assert_eq "$svcid: live RTS RC QPs" "$kernel_qps" "$(( $(metric "$up" 'qpwatch_qps{qp_type="RC",state="RTS"}') - $(metric "$base" 'qpwatch_qps{qp_type="RC",state="RTS"}') ))"
  assert_eq "$svcid: live RC QPs (agent) vs rdma res show qp" "$(res_count qp '.type == "RC"')" "$(metric "$up" 'qpwatch_qps{qp_type="RC"}')"
  assert_eq "$svcid: passive connects (target side)" "$(( kernel_qps / 2 ))" "$(delta "$base" "$up" 'qpwatch_cm_connect_duration_seconds_count{role="passive"}')"
  assert_eq "$svcid: active connects (host side)" "$(( kernel_qps / 2 ))" "$(delta "$base" "$up" 'qpwatch_cm_connect_duration_seconds_count{role="active"}')"
  assert_eq "$svcid: CONNECT_REQUEST events (target side)" "$(( kernel_qps / 2 ))" "$(delta "$base" "$up" 'qpwatch_cm_events_total{event="CONNECT_REQUEST"}')"
  assert_eq "$svcid: ESTABLISHED events (both sides have kernel QPs)" "$kernel_qps" "$(delta "$base" "$up" 'qpwatch_cm_events_total{event="ESTABLISHED"}')"

  nvme disconnect -n "$NQN" >"$OUT/nvme-disconnect-$svcid.log" 2>&1 || fail "nvme disconnect failed (port $svcid)"
  wait_until 30 res_count_is qp -eq "$kernel_rc_base" '.type == "RC"' ||
    fail "kernel kept NVMe-oF QPs after disconnect (port $svcid)"
  wait_for_metric 'qpwatch_qps{qp_type="RC"}' "$(metric "$base" 'qpwatch_qps{qp_type="RC"}')" ||
    fail "live-QP gauge did not return to its value before connect (port $svcid)"
  wait_for_metric 'qpwatch_cm_ids' "$(metric "$base" 'qpwatch_cm_ids')" ||
    fail "CM id gauge did not return to its value before connect (port $svcid)"
  end=$(scrape "end-$svcid")
  assert_eq "$svcid: kernel QPs destroyed" "$kernel_qps" "$(delta "$up" "$end" 'qpwatch_qp_destroyed_total{qp_type="RC"}')"
  # both sides' rdma_disconnect() (cma_modify_qp_err), then ib_drain_qp()
  # on a QP already in ERR
  assert_eq "$svcid: kernel QPs moved to ERR by their consumers (requested)" "$kernel_qps" "$(delta "$up" "$end" 'qpwatch_qp_errors_total{cause="requested"}')"
  assert_eq "$svcid: kernel QPs that entered ERR, any cause" "$kernel_qps" "$(delta "$up" "$end" 'qpwatch_qp_errors_total')"
  assert_eq "$svcid: untracked QP events" 0 "$(delta "$base" "$end" 'qpwatch_untracked_qp_events_total')"
  assert_eq "$svcid: events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
}
connect_cycle 4420
connect_cycle 4421
stop_agent
