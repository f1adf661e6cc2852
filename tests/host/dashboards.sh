#!/usr/bin/env bash
# Host-side checks of dashboards/ (no VM, no running Prometheus):
#   - every dashboard file is valid JSON and up to date with dashboards/generate.py;
#   - tests/dashboards/lint_dashboards.py: schemaVersion, gridPos, targets,
#     ${datasource} only (no hard-coded datasource uid), units ("s" where a
#     panel shows seconds), $__rate_interval windows, every metric name and
#     label known to agent/src/export/metrics/ (or up / process_* / a recording
#     rule), alert severities and annotations;
#   - promtool check rules, promtool test rules (tests/dashboards/rules_test.yml
#     and mesh_rules_test.yml, the fleet mode's rules),
#     promtool check config on the example Prometheus configuration;
#   - unit tests of the VM checker's helpers.
# The expressions themselves run against a real Prometheus and agent in the
# VM scenario tests/vm/scenarios/prometheus_dashboards.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
failed=()
run() {
  local name=$1
  shift
  local out
  if out=$("$@" 2>&1); then
    echo "dashboards: ok    $name"
  else
    echo "dashboards: FAIL  $name"
    printf '%s\n' "$out" | sed 's/^/    /'
    failed+=("$name")
  fi
}
command -v promtool >/dev/null || { echo "dashboards: promtool not found (Debian package prometheus; scripts/setup)" >&2; exit 2; }
shopt -s nullglob
boards=(dashboards/*.json)
[ ${#boards[@]} -gt 0 ] || { echo "dashboards: no dashboards/*.json" >&2; exit 1; }
for f in "${boards[@]}"; do
  run "valid JSON: $f" python3 -m json.tool "$f"
done
run "dashboards/*.json generated from dashboards/generate.py" python3 dashboards/generate.py --check
run "lint (datasource, units, metrics, labels, PromQL)" \
  python3 tests/dashboards/lint_dashboards.py --metrics agent/src/export/metrics --rules dashboards/rules.yml "${boards[@]}"
run "promtool check rules dashboards/rules.yml" promtool check rules dashboards/rules.yml
run "promtool test rules tests/dashboards/rules_test.yml" promtool test rules tests/dashboards/rules_test.yml
run "promtool test rules tests/dashboards/mesh_rules_test.yml (fleet mode)" promtool test rules tests/dashboards/mesh_rules_test.yml
run "promtool check config dashboards/prometheus-example.yml" promtool check config dashboards/prometheus-example.yml
run "check_queries.py helper unit tests" python3 -m unittest discover -s tests/dashboards -q
if [ ${#failed[@]} -gt 0 ]; then
  echo "dashboards: ${#failed[@]} check(s) failed"
  exit 1
fi
echo "dashboards: all host checks passed"
