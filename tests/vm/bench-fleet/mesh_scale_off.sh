# bench-fleet/mesh_scale with [mesh] rtt_breakdown = false: run after it in
# the same boot for the breakdown's cost side by side:
#   tests/vm/fleet --hosts 3 bench-fleet/mesh_scale bench-fleet/mesh_scale_off
# vm-timeout: 1500
MESH_BREAKDOWN=false
# shellcheck source=tests/vm/bench-fleet/mesh_scale.sh
source "$REPO/tests/vm/bench-fleet/mesh_scale.sh"
