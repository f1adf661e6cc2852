# Fleet helpers of tests/vm/lib.sh: several guests booted by tests/vm/fleet,
# joined by virtual Ethernet over unix sockets on the host (a direct link for
# two hosts, a switch guest bridging one NIC per host otherwise). Sourced by
# tests/vm/lib.sh only.
#
# A fleet scenario (tests/vm/scenarios-fleet/NAME.sh) runs in every host
# guest at once, with, besides what every scenario has:
#   HOST_INDEX   1..FLEET_HOSTS        HOST_ADDR    198.18.0.HOST_INDEX
#   FLEET_HOSTS  number of hosts       PEERS        the other hosts' addresses
#   OUT          this host's output directory ($FLEET_OUT/hHOST_INDEX)
#   FLEET_OUT    the scenario's directory, shared by all hosts (--rwdir)
#   FLEET_ROOT   the run's output directory (shared; abort markers)
# and AGENT_ADDR = RXE_ADDR = HOST_ADDR (the agent listens on the link, where
# the other hosts' Prometheus can scrape it). Hosts sync with fleet_barrier.
# shellcheck shell=bash
# shellcheck disable=SC2153 # FLEET_OUT, FLEET_HOSTS...: set by tests/vm/fleet-guest.sh

FLEET_NET=198.18.0
# Locally administered MACs: hosts 52:54:00:00:00:HH, switch ports 52:54:00:00:01:HH.
fleet_host_mac() { printf '52:54:00:00:00:%02x' "$1"; }
fleet_switch_mac() { printf '52:54:00:00:01:%02x' "$1"; }
fleet_host_addr() { echo "$FLEET_NET.$1"; }

# fleet_nics: the guest's interfaces other than lo, one a line.
fleet_nics() { ip -o link show | awk -F': ' '$2 != "lo" { sub(/@.*/, "", $2); print $2 }'; }

# fleet_nic_by_mac MAC: the interface with that MAC address.
fleet_nic_by_mac() {
  ip -o link show | awk -v mac="$1" '$0 ~ "link/ether " mac { split($0, f, ": "); print f[2] }'
}

fleet_nic_by_mac_is_there() { [ -n "$(fleet_nic_by_mac "$1")" ]; }

# fleet_check_isolated NIC...: fails unless the guest has no interface but lo
# and NIC..., no global address but this host's own, and no default route:
# test traffic never leaves the guests.
fleet_check_isolated() {
  local extra addrs
  extra=$(fleet_nics | grep -vxF -f <(printf '%s\n' "$@") || true)
  [ -z "$extra" ] || fail "unexpected network interfaces: $extra"
  addrs=$(ip -o addr show scope global | awk '{print $4}' | sort | tr '\n' ' ')
  [ "$addrs" = "${HOST_ADDR:+$HOST_ADDR/24 }" ] || fail "unexpected global addresses: ${addrs:-none}"
  [ -z "$(ip route show default)" ] || fail "a default route: $(ip route show default)"
}

# fleet_setup_host: this host's link NIC (virtio-net, MAC fleet_host_mac
# HOST_INDEX) addressed HOST_ADDR/24 and soft-RoCE rxe0 on it; checks the
# isolation. Run once per guest by tests/vm/fleet-guest.sh.
fleet_setup_host() {
  local mac nic
  mac=$(fleet_host_mac "$HOST_INDEX")
  ip link set lo up
  modprobe virtio_net
  modprobe rdma_rxe
  modprobe rdma_ucm
  wait_until 10 fleet_nic_by_mac_is_there "$mac" || { ip -o link show >&2; fail "no NIC with MAC $mac"; }
  nic=$(fleet_nic_by_mac "$mac")
  ip addr add "$HOST_ADDR/24" dev "$nic"
  ip link set "$nic" up
  rdma link add rxe0 type rxe netdev "$nic"
  fleet_check_isolated "$nic"
  log "h$HOST_INDEX: $nic ($mac) $HOST_ADDR/24, rxe0 on $nic"
}

# fleet_setup_switch PORTS: a Linux bridge br0 over the guest's PORTS NICs
# (MACs fleet_switch_mac 1..PORTS), with no address at all (IPv6 off): a
# learning switch between the hosts. Per-port faults are applied here, on a
# host scenario's request (fleet_switch, fleet_switch_serve), so sch_netem
# and tc must be there.
fleet_setup_switch() {
  local ports=$1 p nic
  ip link set lo up
  sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  modprobe virtio_net
  modprobe bridge
  modprobe sch_netem
  command -v tc >/dev/null || fail "no tc (iproute2) in the switch guest"
  ip link add br0 type bridge stp_state 0
  for ((p = 1; p <= ports; p++)); do
    wait_until 10 fleet_nic_by_mac_is_there "$(fleet_switch_mac "$p")" || { ip -o link show >&2; fail "no switch port $p"; }
    nic=$(fleet_nic_by_mac "$(fleet_switch_mac "$p")")
    ip link set "$nic" master br0 up
    FLEET_PORTS+=("$nic")
  done
  ip link set br0 up
  fleet_check_isolated br0 "${FLEET_PORTS[@]}"
  log "switch: br0 over ${FLEET_PORTS[*]}"
}
FLEET_PORTS=()

# --- link faults, applied by the switch guest on a host's request
#
# A host scenario calls `fleet_switch ACTION HOST [ARGS...]`: it writes a
# request file into $FLEET_ROOT/switch/ (atomically: written aside, then
# renamed), the switch guest (fleet_switch_serve, polling) runs it on its
# port toward host HOST and answers with an acknowledgement file holding the
# exit status and the output, which fleet_switch prints (and fails on a
# non-zero status, or no answer in 60 s). The port toward host N is the
# switch NIC with MAC fleet_switch_mac N; a root qdisc there delays or drops
# the frames the switch sends TO host N (requests to N, not N's answers).
#   fleet_switch netem N ARGS...   tc qdisc replace dev PORT root netem ARGS...
#   fleet_switch netem-from N M ARGS...  the same for the frames from host M
#                                  only (a prio qdisc, a u32 filter on M's
#                                  address): a fault of the link M -> N alone
#   fleet_switch clear N           remove the port's root qdisc (if any)
#   fleet_switch link N up|down    ip link set PORT up|down
#   fleet_switch stats N           tc -s qdisc and ip -s link of the port
#   fleet_switch reset 0           every port: no qdisc, link up
# Faults outlive the request, not the scenario: after a scenario that used
# the switch (pass, fail or time limit), fleet-guest.sh on h1 asks for reset.

FLEET_REQUEST_SEQ=0

# fleet_request DIR NAME WORDS...: asks the server of DIR (fleet_serve) to run
# WORDS: a request file written aside, then renamed into DIR; waits for its
# acknowledgement (the exit status, then the output), prints the output and
# fails on a non-zero status, no answer in 60 s or an aborted run. NAME
# prefixes the log line and the failures.
fleet_request() {
  local dir=$1 name=$2 id ack why start=$SECONDS answer
  shift 2
  [ -d "$dir" ] || mkdir -p "$dir"
  FLEET_REQUEST_SEQ=$((FLEET_REQUEST_SEQ + 1))
  id=h$HOST_INDEX.$$.$FLEET_REQUEST_SEQ
  ack=$dir/$id.ack
  printf '%s\n' "$*" >"$dir/.$id.tmp"
  mv "$dir/.$id.tmp" "$dir/$id.req"
  while [ ! -e "$ack" ]; do
    [ $((SECONDS - start)) -lt 60 ] || fail "$name $*: no answer in 60 s"
    if [ -s "$FLEET_ROOT/abort" ]; then why=$(head -n1 "$FLEET_ROOT/abort") && fail "$name $*: run aborted: $why"; fi
    sleep 0.05
  done
  mapfile -t answer <"$ack"
  [ ${#answer[@]} -lt 2 ] || printf '%s\n' "${answer[@]:1}"
  [ "${answer[0]:-}" = 0 ] || fail "$name $*: exit ${answer[0]:-none}"
  log "$name: $* (answered in $((SECONDS - start)) s)"
}

# fleet_serve DIR HANDLER UNTIL: runs `HANDLER WORDS...` for every request
# fleet_request writes into DIR and acknowledges it with HANDLER's exit
# status and output, until the file UNTIL exists.
fleet_serve() {
  local dir=$1 handler=$2 until=$3 req id rc output words line
  mkdir -p "$dir"
  enable -f /usr/lib/bash/rm rm
  while [ ! -e "$until" ]; do
    for req in "$dir"/*.req; do
      [ -e "$req" ] || continue
      id=${req##*/} id=${id%.req}
      read -r -a words <"$req"
      rc=0
      output=$("$handler" "${words[@]}" 2>&1) || rc=$?
      log "request $id: ${words[*]} -> exit $rc"
      while IFS= read -r line; do printf '  %s\n' "$line"; done <<<"$output" >&2
      printf '%s\n%s\n' "$rc" "$output" >"$dir/.$id.ack"
      mv "$dir/.$id.ack" "$dir/$id.ack"
      rm -f "$req"
    done
    sleep 0.1
  done
}

# fleet_switch ACTION HOST [ARGS...]: see above; prints the switch's output.
# Both ends fork as little as they can: under emulation a fork and exec costs
# a guest about 45 ms of CPU, and a request took 1.4 s on an idle bed, 2 to
# 3 s beside the agents (bench-fleet/switch_requests).
fleet_switch() {
  [ "$FLEET_HOSTS" -ge 3 ] || [ -e "$FLEET_ROOT/up.switch" ] || fail "fleet_switch: no switch guest (--hosts 3 or --switch)"
  [ -e "$FLEET_OUT/switch-used" ] || : >"$FLEET_OUT/switch-used" # fleet-guest.sh resets the switch after the scenario
  fleet_request "$FLEET_ROOT/switch" switch "$@"
}

# fleet_switch_port N: the switch's NIC toward host N, looked up.
fleet_switch_port() {
  local nic
  nic=$(fleet_nic_by_mac "$(fleet_switch_mac "$1")")
  [ -n "$nic" ] || { echo "no switch port toward host $1" >&2; return 1; }
  echo "$nic"
}
# FLEET_PORT_OF[N]: fleet_switch_port N, looked up once by fleet_switch_serve
declare -A FLEET_PORT_OF=()

# fleet_switch_do ACTION HOST [ARGS...]: one request, in the switch guest.
fleet_switch_do() {
  local action=$1 host=${2:-} port p
  shift 2 || { echo "usage: ACTION HOST [ARGS...]" >&2; return 2; }
  if [ "$action" = reset ]; then
    for p in $(ip -o link show master br0 | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
      tc qdisc del dev "$p" root 2>/dev/null || true
      ip link set "$p" up
    done
    tc qdisc show
    return 0
  fi
  port=${FLEET_PORT_OF[$host]:-}
  [ -n "$port" ] || port=$(fleet_switch_port "$host") || return 1
  case $action in
    netem) tc qdisc replace dev "$port" root netem "$@" && tc qdisc show dev "$port" ;;
    netem-from)
      p=$1
      shift
      tc qdisc del dev "$port" root 2>/dev/null || true
      # band 1:2 for everything (priomap), 1:3 (netem) for host p's frames
      tc qdisc add dev "$port" root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 &&
        tc qdisc add dev "$port" parent 1:3 handle 30: netem "$@" &&
        tc filter add dev "$port" parent 1: protocol ip prio 1 u32 match ip src "$(fleet_host_addr "$p")/32" flowid 1:3 &&
        tc qdisc show dev "$port" && tc filter show dev "$port"
      ;;
    clear) tc qdisc del dev "$port" root 2>/dev/null || true; tc qdisc show dev "$port" ;;
    link) ip link set "$port" "$1" && ip -o link show "$port" ;;
    stats) tc -s qdisc show dev "$port" && ip -s link show "$port" ;;
    *) echo "unknown action $action" >&2; return 2 ;;
  esac
}

# fleet_switch_serve OUT_ROOT PORTS: the switch guest's loop: runs every
# request of $OUT_ROOT/switch/ and acknowledges it, until the host side
# touches $OUT_ROOT/fleet.done.
fleet_switch_serve() {
  local h
  for ((h = 1; h <= $2; h++)); do FLEET_PORT_OF[$h]=$(fleet_switch_port "$h") || return 1; done
  fleet_serve "$1/switch" fleet_switch_do "$1/fleet.done"
}

# fleet_aborted: why the fleet run is off, if it is: a host failed this
# scenario ($FLEET_OUT/failed.hN) or the host-side runner gave up
# ($FLEET_ROOT/abort: a guest died or did not come up).
fleet_aborted() {
  local f
  if [ -s "$FLEET_ROOT/abort" ]; then
    echo "run aborted: $(head -n1 "$FLEET_ROOT/abort")"
    return 0
  fi
  [ "${FLEET_IGNORE_FAILED:-0}" = 1 ] && return 1
  for f in "$FLEET_OUT"/failed.h*; do
    [ -e "$f" ] || continue
    echo "${f##*.} failed"
    return 0
  done
  return 1
}

# fleet_barrier NAME [TIMEOUT_S]: touches $FLEET_OUT/barrier/NAME.hHOST_INDEX
# and waits until every host has touched its own (all hosts called
# fleet_barrier NAME). Fails at once if another host failed or the run was
# aborted, and after TIMEOUT_S ($FLEET_BARRIER_TIMEOUT, 300). Files on the
# shared directory, polled: a host sees another's file within a second or so.
fleet_barrier() {
  local name=$1 dir=$FLEET_OUT/barrier h missing why start=$SECONDS
  local limit=${2:-${FLEET_BARRIER_TIMEOUT:-300}}
  mkdir -p "$dir"
  touch "$dir/$name.h$HOST_INDEX"
  while :; do
    missing=
    for ((h = 1; h <= FLEET_HOSTS; h++)); do
      [ -e "$dir/$name.h$h" ] || missing+=" h$h"
    done
    if [ -z "$missing" ]; then
      log "barrier $name: all $FLEET_HOSTS hosts (waited $((SECONDS - start)) s)"
      return 0
    fi
    if why=$(fleet_aborted); then fail "barrier $name: $why"; fi
    [ $((SECONDS - start)) -lt "$limit" ] || fail "barrier $name: no$missing after $limit s"
    sleep 0.5
  done
}

# fleet_peer_resolves ADDR: ADDR answers ARP with its host's MAC (a UDP
# datagram to its discard port triggers the request; the guests have no
# ping).
fleet_peer_resolves() {
  echo >"/dev/udp/$1/9" 2>/dev/null || true
  ip neigh show "$1" | grep -qE "lladdr $(fleet_host_mac "${1##*.}") (REACHABLE|STALE|DELAY|PROBE)"
}

# fleet_check_peers: every peer is reachable over the link (60 s each).
fleet_check_peers() {
  local p
  for p in $PEERS; do
    WAIT_INTERVAL=1 wait_until 60 fleet_peer_resolves "$p" || { ip neigh show >&2; fail "h$HOST_INDEX: no ARP answer from $p"; }
  done
  log "h$HOST_INDEX: peers $PEERS answer ARP"
}

# fleet_agent_targets: every host's agent endpoint (ADDR:9721), one a line.
fleet_agent_targets() {
  local h
  for ((h = 1; h <= FLEET_HOSTS; h++)); do echo "$(fleet_host_addr "$h"):${AGENT_ADDR##*:}"; done
}

# --- Prometheus (on one host, scraping every agent over the link)

PROM_ANSWER=

# start_prometheus: Prometheus (Debian's) on 127.0.0.1:9090 scraping every
# host's agent over the link (job qpwatch, every 2 s: guests have one CPU
# each) with dashboards/rules.yml loaded, evaluated as often as the scrapes
# bring new samples (every 1 s, it took about 3/4 of h1's vCPU in
# mesh_breakdown); returns at once (it is slow to start under emulation: wait
# for up == 1 with expect_prom).
# PROM_SHORT_FOR="ALERT...": those alerts' `for:` is PROM_SHORT_FOR_DURATION
# (10s) instead of the shipped one (fleet_rules).
start_prometheus() {
  fleet_rules >"$OUT/rules.yml"
  {
    printf 'global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\n'
    printf 'rule_files:\n  - %s\n' "$OUT/rules.yml"
    printf 'scrape_configs:\n  - job_name: qpwatch\n    static_configs:\n      - targets: [%s]\n' \
      "$(fleet_agent_targets | sed 's/.*/"&"/' | paste -sd, -)"
  } >"$OUT/prometheus.yml"
  run_prometheus
}

# fleet_rules: dashboards/rules.yml, with the `for:` of each alert named in
# $PROM_SHORT_FOR set to $PROM_SHORT_FOR_DURATION (10s). A scenario then sees
# the rule's expression fire on the bed's traffic without waiting out the
# shipped duration (1m); the durations themselves are held by promtool's
# tests on synthetic series (tests/dashboards/*rules_test.yml, run by
# tests/host/dashboards.sh). An alert named but not found, or found without
# a `for:`, fails the scenario.
fleet_rules() {
  awk -v names=" ${PROM_SHORT_FOR:-} " -v duration="${PROM_SHORT_FOR_DURATION:-10s}" '
    /^ *- (alert|record):/ { name = $2 == "alert:" && index(names, " " $3 " ") > 0 ? $3 : "" }
    name != "" && /^ *for: / { sub(/for: .*/, "for: " duration); shortened[name] = 1; name = "" }
    { print }
    END { n = split(names, want, " "); for (i = 1; i <= n; i++) if (!(want[i] in shortened)) exit 1 }
  ' "$REPO/dashboards/rules.yml" || fail "fleet_rules: not every alert of \"$PROM_SHORT_FOR\" has a for: in dashboards/rules.yml"
}

# prom_by_instance EXPR: "instance=value ..." (sorted) of the query's result.
prom_by_instance() {
  prom_query "$1" | jq -r '[.data.result[] | "\(.metric.instance)=\(.value[1])"] | sort | join(" ")'
}

# alerts NAME STATE FIELD [MATCHERS]: Prometheus's alerts NAME in STATE
# (firing, pending, or "" for either), each shown as FIELD (jq over its
# labels: .host, "\(.src)->\(.dst)", .alertstate), sorted and space-separated;
# MATCHERS narrow them (instance="h1:9721").
alerts() {
  prom_query "ALERTS{alertname=\"$1\"${2:+,alertstate=\"$2\"}${4:+,$4}}" |
    jq -r "[.data.result[].metric | $3] | sort | join(\" \")"
}

# prom_is EXPR EXPECTED: prom_by_instance EXPR equals EXPECTED (the answer is
# left in $PROM_ANSWER), a condition for wait_until.
prom_is() { PROM_ANSWER=$(prom_by_instance "$1") && [ "$PROM_ANSWER" = "$2" ]; }

# expect_prom WHAT EXPR EXPECTED [TIMEOUT_S]: polls (once a second: curl and
# jq are slow under emulation) until prom_is EXPR EXPECTED, then asserts it.
expect_prom() {
  WAIT_INTERVAL=1 wait_until "${4:-90}" prom_is "$2" "$3" || true
  assert_eq "$1" "$3" "$PROM_ANSWER"
}
