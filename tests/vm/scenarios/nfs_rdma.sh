# NFS over RDMA, server and client in the kernel: svcrdma (nfsd) listening on
# port 20049 of every address, xprtrdma mounting 198.18.0.1:/ over it, an
# 8 MiB write, umount. Both sides of the connection are in-kernel consumers of
# the RDMA CM, whose QPs come from rdma_create_qp() → ib_create_qp_kernel().
# Counted exactly: 2 kernel RC QPs created (one per side) and destroyed at
# umount, live QPs equal to the kernel's list while mounted, one connect
# duration per side, the CM events of each side, the server's wildcard
# listens (nested rdma_listen calls) without a lost event, 0 untracked, every
# gauge back to where it was before the mount, and every QP joined to the cm
# id of its side in `qpwatch events`.
# vm-timeout: 400
EXPORT=/tmp/qpwatch-nfs-export MNT=/tmp/qpwatch-nfs-mnt
modprobe rpcrdma
modprobe nfsd
mountpoint -q /var/lib/nfs || mount -t tmpfs tmpfs /var/lib/nfs
mkdir -p /var/lib/nfs/v4recovery /run/rpcbind "$EXPORT" "$MNT"
touch /var/lib/nfs/etab /var/lib/nfs/rmtab
mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
mount -t tmpfs tmpfs "$EXPORT"
on_exit "umount -l $MNT; rpc.nfsd 0; pkill -x rpc.mountd; pkill -x rpcbind; exportfs -ua; umount $EXPORT; umount /proc/fs/nfsd; umount /var/lib/nfs; modprobe -r rpcrdma nfsd nfsv4"

start_agent
start_events
idle=$(scrape idle)

rpcbind -w
exportfs -o rw,fsid=0,no_root_squash,insecure,no_subtree_check "198.18.0.0/24:$EXPORT"
rpc.mountd -N 3
# the NFSv4 grace period (90 s by default) would hold the first write back
echo 10 >/proc/fs/nfsd/nfsv4gracetime
echo 10 >/proc/fs/nfsd/nfsv4leasetime
rpc.nfsd -N 3 1
echo "rdma 20049" >/proc/fs/nfsd/portlist
wait_until 30 res_count_is cm_id -ge 2 '.state == "LISTEN" and (."src-addr" | endswith(":20049"))' || fail "svcrdma not listening on port 20049"
rdma res show cm_id >"$OUT/cm-listen.txt"
wait_for_metric 'qpwatch_cm_ids{state="LISTEN"}' "$(res_count cm_id '.state == "LISTEN"')" ||
  fail "listening CM ids not all counted"
base=$(scrape base)
assert_eq "rdma_listen calls of svcrdma's wildcard listeners (nested per device)" 4 "$(delta "$idle" "$base" 'qpwatch_cm_call_duration_seconds_count{call="rdma_listen"}')"
assert_eq "events lost while listening" 0 "$(metric "$base" 'qpwatch_events_lost_total')"

kernel_rc_base=$(res_count qp '.type == "RC"')
mount -t nfs4 -o proto=rdma,port=20049 198.18.0.1:/ "$MNT" || fail "NFS over RDMA mount failed"
dd if=/dev/zero of="$MNT/file" bs=1M count=8 conv=fsync 2>"$OUT/dd.log" || fail "8 MiB write over NFS/RDMA failed"
rdma res show qp >"$OUT/rdma-qp-mounted.txt"
kernel_qps=$(( $(res_count qp '.type == "RC"') - kernel_rc_base ))
assert_eq "RC QPs the kernel lists while mounted" 2 "$kernel_qps"
wait_for_metric 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}' \
  $(( $(metric "$base" 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}') + kernel_qps )) ||
  fail "kernel QP creations not all seen"
up=$(scrape mounted)
assert_eq "kernel RC QPs created" 2 "$(delta "$base" "$up" 'qpwatch_qp_created_total{origin="kernel",qp_type="RC"}')"
assert_eq "user QPs created" 0 "$(delta "$base" "$up" 'qpwatch_qp_created_total{origin="user"}')"
assert_eq "rdma_create_qp calls" 2 "$(delta "$base" "$up" 'qpwatch_cm_call_duration_seconds_count{call="rdma_create_qp"}')"
assert_eq "live RC QPs (agent) vs rdma res show qp" "$(res_count qp '.type == "RC"')" "$(metric "$up" 'qpwatch_qps{qp_type="RC"}')"
assert_eq "live RTS RC QPs" 2 "$(( $(metric "$up" 'qpwatch_qps{qp_type="RC",state="RTS"}') - $(metric "$base" 'qpwatch_qps{qp_type="RC",state="RTS"}') ))"
assert_eq "active connect durations (client, xprtrdma)" 1 "$(delta "$base" "$up" 'qpwatch_cm_connect_duration_seconds_count{role="active"}')"
assert_eq "passive connect durations (server, svcrdma)" 1 "$(delta "$base" "$up" 'qpwatch_cm_connect_duration_seconds_count{role="passive"}')"
ev() { delta "$base" "$1" "qpwatch_cm_events_total{event=\"$2\"}"; }
assert_eq "ADDR_RESOLVED (client)" 1 "$(ev "$up" ADDR_RESOLVED)"
assert_eq "ROUTE_RESOLVED (client)" 1 "$(ev "$up" ROUTE_RESOLVED)"
assert_eq "CONNECT_REQUEST (server)" 1 "$(ev "$up" CONNECT_REQUEST)"
assert_eq "ESTABLISHED (both sides: kernel consumers get it on the active side too)" 2 "$(ev "$up" ESTABLISHED)"
assert_eq "CM errors" 0 "$(delta "$base" "$up" 'qpwatch_cm_errors_total')"

umount "$MNT" || fail "umount failed"
wait_until 30 res_count_is qp -eq "$kernel_rc_base" '.type == "RC"' || fail "the kernel kept NFS/RDMA QPs after umount"
wait_for_metric 'qpwatch_qps' "$(metric "$base" 'qpwatch_qps')" || fail "live-QP gauge not back to its value before the mount"
wait_for_metric 'qpwatch_cm_ids' "$(metric "$base" 'qpwatch_cm_ids')" || fail "CM id gauge not back to its value before the mount"
end=$(scrape end)
assert_eq "kernel RC QPs destroyed" 2 "$(delta "$up" "$end" 'qpwatch_qp_destroyed_total{qp_type="RC"}')"
assert_eq "DISCONNECTED (both sides)" 2 "$(ev "$end" DISCONNECTED)"
assert_eq "untracked QP events" 0 "$(delta "$base" "$end" 'qpwatch_untracked_qp_events_total')"
assert_eq "events lost" 0 "$(metric "$end" 'qpwatch_events_lost_total')"
for g in qpwatch_qps qpwatch_cm_ids qpwatch_tracked_qps; do
  assert_eq "$g back to its value before the mount" "$(metric "$base" "$g")" "$(metric "$end" "$g")"
done

# the event stream: each side's CM events on its own id, each QP joined to it
sleep 1
stop_events
ids_with() { jq -r --arg e "$1" 'select(.kind == "cm" and .cm_event == $e) | .cm_id' "$OUT/events.jsonl" | sort -u; }
active=$(ids_with ADDR_RESOLVED)
passive=$(ids_with CONNECT_REQUEST)
assert_eq "client cm ids (ADDR_RESOLVED)" 1 "$(echo "$active" | grep -c .)"
assert_eq "server cm ids (CONNECT_REQUEST)" 1 "$(echo "$passive" | grep -c .)"
events_of() { jq -r --argjson id "$1" 'select(.op == "cma_cm_event_handler" and .cm_id == $id) | .cm_event' "$OUT/events.jsonl" | tr '\n' ' '; }
assert_eq "client id $active: events" "ADDR_RESOLVED ROUTE_RESOLVED ESTABLISHED DISCONNECTED " "$(events_of "$active" | sed 's/ TIMEWAIT_EXIT//')"
assert_eq "server id $passive: events" "CONNECT_REQUEST ESTABLISHED DISCONNECTED " "$(events_of "$passive" | sed 's/ TIMEWAIT_EXIT//')"
qps=$(jq -r 'select(.kind == "qp_create" and .origin == "kernel" and .qp_type == "RC") | .qp_num' "$OUT/events.jsonl" | sort -u)
assert_eq "kernel RC QPs in the event stream" 2 "$(echo "$qps" | grep -c .)"
joined=""
for qp in $qps; do
  cm=$(events_cm_ids "$qp")
  assert_eq "QP $qp joined to one cm id" 1 "$(echo "$cm" | grep -c .)"
  joined="$joined $cm"
done
assert_eq "the QPs' cm ids are the client's and the server's" "$(printf '%s\n' "$active" "$passive" | sort -n | tr '\n' ' ')" "$(printf '%s\n' $joined | sort -n | tr '\n' ' ')"
stop_agent
