# The devices' own counters, read from sysfs at each scrape: every file of
# rxe0's port hw_counters is exported under its own name with sysfs' value;
# rping traffic moves them exactly as much as sysfs shows; a second device
# appears at the next scrape and its series go with it.
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters

# hw_counters DIR: "name value" lines, the lifespan setting left out.
hw_counters() {
  local f
  for f in "$1"/*; do
    [ "${f##*/}" = lifespan ] || echo "${f##*/} $(cat "$f")"
  done
}

# agent_matches_sysfs DIR DEVICE NAME: one scrape between two reads of DIR;
# every counter's value in the scrape lies between them. Prints the scrape.
agent_matches_sysfs() {
  local before after s name low high got n=0
  before=$(hw_counters "$1")
  s=$(scrape "$3")
  after=$(hw_counters "$1")
  while read -r name low; do
    high=$(awk -v n="$name" '$1 == n { print $2 }' <<<"$after")
    got=$(metric "$s" "qpwatch_port_hw_stats_total{device=\"$2\",port=\"1\",counter=\"$name\"}")
    if [ "$got" -lt "$low" ] || [ "$got" -gt "$high" ]; then
      fail "$2 $name: agent $got, sysfs $low before and $high after the scrape"
    fi
    n=$((n + 1))
  done <<<"$before"
  assert_eq "$2 counters exported ($3)" "$n" "$(series_count "$s" "qpwatch_port_hw_stats_total{device=\"$2\"}")"
  echo "$s"
}

start_agent
ls "$HW" >"$OUT/hw_counters.txt"
[ "$(wc -l <"$OUT/hw_counters.txt")" -ge 10 ] || fail "rxe0 has only $(wc -l <"$OUT/hw_counters.txt") hw_counters"
idle=$(agent_matches_sysfs "$HW" rxe0 idle)
assert_eq "lifespan (a setting) not exported" 0 "$(series_count "$idle" 'qpwatch_port_hw_stats_total{counter="lifespan"}')"
assert_eq "no IB port counters on soft-RoCE" 0 "$(series_count "$idle" 'qpwatch_port_ib_stats_total')"
sysfs_sent=$(cat "$HW/sent_pkts")

rping_once 5 -v
grep -c "ping data" "$OUT/rping-client.log" | grep -qx 5 || fail "rping did not complete 5 pings"
busy=$(agent_matches_sysfs "$HW" rxe0 after-rping)
sent=$(delta "$idle" "$busy" 'qpwatch_port_hw_stats_total{device="rxe0",counter="sent_pkts"}')
log "rping -C 5: sent_pkts +$sent (sysfs +$(($(cat "$HW/sent_pkts") - sysfs_sent)))"
# 5 pings: at least a SEND each way and an RDMA READ and WRITE per ping
[ "$sent" -ge 20 ] || fail "sent_pkts moved by $sent over 5 pings"
[ "$(delta "$idle" "$busy" 'qpwatch_port_hw_stats_total{device="rxe0",counter="rcvd_pkts"}')" -ge 20 ] ||
  fail "rcvd_pkts did not move"

# A device that appears is read at the next scrape; one that goes away takes
# its series with it.
ip link add qpw1 type dummy
on_exit "ip link del qpw1 2>/dev/null; rdma link delete rxe1 2>/dev/null"
ip link set qpw1 up
rdma link add rxe1 type rxe netdev qpw1
agent_matches_sysfs /sys/class/infiniband/rxe1/ports/1/hw_counters rxe1 rxe1-added >/dev/null
rdma link delete rxe1
gone=$(scrape rxe1-deleted)
assert_eq "rxe1's series after its delete" 0 "$(series_count "$gone" 'qpwatch_port_hw_stats_total{device="rxe1"}')"
[ "$(series_count "$gone" 'qpwatch_port_hw_stats_total{device="rxe0"}')" -ge 10 ] || fail "rxe0's series went too"
ip link del qpw1
stop_agent
