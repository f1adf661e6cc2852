# The devices' own counters, read from sysfs on the agent's timer: every file
# of rxe0's port hw_counters is exported under its own name with sysfs' value;
# rping traffic moves them exactly as much as sysfs shows; a second device
# appears at the next read and its series go with it; scrapes read no file
# (the reads follow the timer, not the scrapes).
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters

# hw_counters DIR: "name value" lines, the lifespan setting left out.
hw_counters() {
  local f
  for f in "$1"/*; do
    [ "${f##*/}" = lifespan ] || echo "${f##*/} $(cat "$f")"
  done
}

# agent_matches_sysfs DIR DEVICE NAME: a scrape of values the agent read
# after a first read of DIR, then a second read of DIR; every counter's value
# in the scrape lies between the two. Prints the scrape.
agent_matches_sysfs() {
  local before after s name low high got n=0
  before=$(hw_counters "$1")
  s=$(scrape_fresh "$3")
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

start_agent --sysfs-counters-interval 1
ls "$HW" >"$OUT/hw_counters.txt"
[ "$(wc -l <"$OUT/hw_counters.txt")" -ge 10 ] || fail "rxe0 has only $(wc -l <"$OUT/hw_counters.txt") hw_counters"
idle=$(agent_matches_sysfs "$HW" rxe0 idle)
assert_eq "lifespan (a setting) not exported" 0 "$(series_count "$idle" 'qpwatch_port_hw_stats_total{counter="lifespan"}')"
assert_eq "no IB port counters on soft-RoCE" 0 "$(series_count "$idle" 'qpwatch_port_ib_stats_total')"
sysfs_sent=$(cat "$HW/sent_pkts")

# Scrapes read no file: 20 scrapes back to back add no more reads than the
# timer's, one a second.
t0=$(date +%s%N)
reads0=$(metric "$(scrape back-to-back-0)" qpwatch_sysfs_reads_total)
for i in $(seq 20); do last=$(scrape "back-to-back-$i"); done
reads=$(($(metric "$last" qpwatch_sysfs_reads_total) - reads0))
took_ms=$((($(date +%s%N) - t0) / 1000000))
log "20 scrapes in $took_ms ms; sysfs reads meanwhile: $reads"
[ "$reads" -le $((took_ms / 1000 + 2)) ] || fail "$reads sysfs reads during 20 scrapes in $took_ms ms: the scrapes read sysfs"
age=$(awk -v now="$(date +%s.%N)" '$1 == "qpwatch_sysfs_last_read_timestamp_seconds" { print now - $2 }' "$last")
log "the last read began ${age} s before the last scrape"
awk -v a="$age" 'BEGIN { exit !(a >= 0 && a < 10) }' || fail "last read ${age} s old with a 1 s interval"
awk '$1 == "qpwatch_sysfs_read_seconds_total" { exit !($2 > 0) }' "$last" || fail "no time counted in sysfs reads"

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
gone=$(scrape_fresh rxe1-deleted)
assert_eq "rxe1's series after its delete" 0 "$(series_count "$gone" 'qpwatch_port_hw_stats_total{device="rxe1"}')"
[ "$(series_count "$gone" 'qpwatch_port_hw_stats_total{device="rxe0"}')" -ge 10 ] || fail "rxe0's series went too"
ip link del qpw1
stop_agent
