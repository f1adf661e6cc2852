# How long a link fault takes to be applied (fleet_switch, tests/vm/lib/fleet.sh):
# h1 asks the switch guest for N netem changes on the port toward h3, in
# turn, with every host idle (no agent), and prints each round trip
# (request written -> acknowledgement read) with $EPOCHREALTIME; figures in
# $FLEET_OUT/figures.txt.
# vm-timeout: 600
[ "$FLEET_HOSTS" -ge 3 ] || fail "needs three hosts (and the switch)"
N=12
if [ "$HOST_INDEX" = 1 ]; then
  times=()
  for ((i = 0; i < N; i++)); do
    t0=$EPOCHREALTIME
    fleet_switch netem 3 delay "$((i % 2 * 2))ms" >/dev/null
    t1=$EPOCHREALTIME
    times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
  done
  fleet_switch clear 3 >/dev/null
  sorted=$(printf '%s\n' "${times[@]}" | sort -g | paste -sd' ')
  echo "switch_request_s $sorted (median $(printf '%s\n' "${times[@]}" | sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'))" | tee -a "$FLEET_OUT/figures.txt" >&2
fi
fleet_barrier measured
