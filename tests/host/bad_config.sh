#!/usr/bin/env bash
# Bad configuration files and flags against the real binary: each must print
# ONE error line naming the key (and file:line:col for files) and exit 2,
# before anything touches the kernel. Prints the table (markdown) it checked.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/qpwatch}
[ -x "$BIN" ] || { echo "bad_config: $BIN not built" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0 n=0
printf '| kind | input | exit | error printed |\n|---|---|---|---|\n'
check() { # KIND EXPECTED_SUBSTRING INPUT_DESCRIPTION -- COMMAND...
  local kind=$1 expected=$2 input=$3 err rc first
  shift 4
  err=$("$@" 2>&1 >/dev/null); rc=$?
  n=$((n + 1))
  first=$(echo "$err" | head -n1)
  printf '| %s | `%s` | %s | `%s` |\n' "$kind" "$input" "$rc" "$(echo "$first" | sed 's/|/\\|/g')"
  # config errors are one line; clap's flag errors add its usage hint below
  if [ "$rc" -ne 2 ] || { [[ $first != error:* ]] && [ "$(printf '%s\n' "$err" | grep -c .)" -ne 1 ]; } ||
    [[ $first != *"$expected"* ]]; then
    echo "bad_config: FAIL $kind: exit $rc, expected 2 and one line containing: $expected; got: $err" >&2
    failures=$((failures + 1))
  fi
}
file_case() { # KIND EXPECTED TOML
  local f=$dir/qpwatch.toml
  printf '%b\n' "$3" >"$f"
  check "$1" "$2" "$(printf '%b' "$3" | tr '\n' ';' | sed 's/|/\\|/g')" -- "$BIN" check-config "$f"
}
flag_case() { # KIND EXPECTED FLAGS...
  local kind=$1 expected=$2
  shift 2
  check "$kind" "$expected" "$*" -- "$BIN" run --config /dev/null "$@"
}
file_case "unknown key" "qpwatch.toml:1:1: lisen: unknown field" 'lisen = "127.0.0.1:9721"'
file_case "wrong type" "qpwatch.toml:2:21: hooks.ring_buffer_bytes: invalid type" '[hooks]\nring_buffer_bytes = "big"'
file_case "bad listen address" "qpwatch.toml:1:10: listen:" 'listen = "localhost"'
file_case "negative interval" "qpwatch.toml:2:32: hooks.module_poll_interval_seconds: -1" '[hooks]\nmodule_poll_interval_seconds = -1'
file_case "empty target name" "qpwatch.toml:2:8: targets[0].name: must not be empty" '[[targets]]\nname = ""\naddress = "198.18.0.1"'
file_case "zero target interval" "qpwatch.toml:4:20: targets[0].interval_seconds" '[[targets]]\nname = "a"\naddress = "198.18.0.1"\ninterval_seconds = 0'
file_case "target not an IP" "qpwatch.toml:3:11: targets[0].address" '[[targets]]\nname = "a"\naddress = "nowhere"'
file_case "duplicate target" "qpwatch.toml:5:8: targets[1].name" '[[targets]]\nname = "a"\naddress = "198.18.0.1"\n[[targets]]\nname = "a"\naddress = "198.18.0.2"'
file_case "ring not a power of two" "qpwatch.toml:2:21: hooks.ring_buffer_bytes: 5000" '[hooks]\nring_buffer_bytes = 5000'
file_case "unknown hook group" "qpwatch.toml:2:10: hooks.groups" '[hooks]\ngroups = ["qp", "rdma"]'
file_case "zero cardinality cap" "qpwatch.toml:2:19: limits.max_tracked_qps" '[limits]\nmax_tracked_qps = 0'
file_case "buckets not increasing" "qpwatch.toml:2:9: buckets.dwell" '[buckets]\ndwell = [1.0, 0.5]'
file_case "bad log level" "qpwatch.toml:1:13: log_level" 'log_level = "loud"'
file_case "bad log format" "qpwatch.toml:1:14: log_format" 'log_format = "yaml"'
file_case "TOML syntax error" "qpwatch.toml:1:10:" 'listen = '
file_case "port out of range" "qpwatch.toml:2:10: responder.listen" '[responder]\nlisten = "198.18.0.1:99999"'
file_case "missing target field" "qpwatch.toml:1:1: targets[0]: missing field" '[[targets]]\naddress = "198.18.0.1"'
file_case "renamed section" "qpwatch.toml:1:2: probes: \`[probes]\` was renamed \`[hooks]\`" '[probes]\ngroups = ["qp"]'
file_case "timeout > interval" "qpwatch.toml:4:19: targets[0].timeout_seconds" '[[targets]]\nname = "a"\naddress = "198.18.0.1"\ntimeout_seconds = 20'
file_case "mesh: zero interval" "qpwatch.toml:2:20: mesh.interval_seconds: 0 is not a number of seconds between 0.01 and 3600" '[mesh]\ninterval_seconds = 0'
file_case "mesh: bad target label" "qpwatch.toml:2:17: mesh.target_labels: \"to-r\" is not a label name" '[mesh]\ntarget_labels = ["rack", "to-r"]'
file_case "mesh: reserved target label" "qpwatch.toml:2:17: mesh.target_labels: \"target\"" '[mesh]\ntarget_labels = ["target"]'
file_case "mesh: targets file extension" "qpwatch.toml:2:16: mesh.targets_file: \"/etc/qpwatch/targets.txt\": the extension tells the format" '[mesh]\ntargets_file = "/etc/qpwatch/targets.txt"'
file_case "mesh: zero max targets" "qpwatch.toml:2:15: mesh.max_targets: 0 is not between 1 and 100000" '[mesh]\nmax_targets = 0'
file_case "mesh: zero discover expiry" "qpwatch.toml:2:27: mesh.discover_expiry_seconds: 0 is not a number of seconds between 1 and 86400" '[mesh]\ndiscover_expiry_seconds = 0'
file_case "mesh: discover not a bool" "qpwatch.toml:2:12: mesh.discover" '[mesh]\ndiscover = "yes"'
file_case "limits: zero peer labels" "qpwatch.toml:2:19: limits.max_peer_labels: 0 is not between 1 and 4096" '[limits]\nmax_peer_labels = 0'
file_case "limits: too many cgroup labels" "qpwatch.toml:2:21: limits.max_cgroup_labels: 5000 is not between 1 and 4096" '[limits]\nmax_cgroup_labels = 5000'
file_case "mesh: rtt_breakdown not a boolean" "qpwatch.toml:2:17: mesh.rtt_breakdown: invalid type: string \"yes\", expected a boolean" '[mesh]\nrtt_breakdown = "yes"'
file_case "mesh: unknown key" "qpwatch.toml:2:1: mesh.interval: unknown field" '[mesh]\ninterval = 1'
file_case "ud target without [mesh]" "qpwatch.toml:4:8: targets[0].mode: \"ud\" targets are probed by the mesh" '[[targets]]\nname = "a"\naddress = "198.18.0.1"\nmode = "ud"'
file_case "ud target with an RC key" "qpwatch.toml:6:9: targets[0].pings: not used by mode = \"ud\"" '[mesh]\n[[targets]]\nname = "a"\naddress = "198.18.0.1"\nmode = "ud"\npings = 3'
file_case "http: zero max connections" "qpwatch.toml:2:19: http.max_connections: 0 is not between 1 and 65536" '[http]\nmax_connections = 0'
file_case "http: header buffer below hyper's" "qpwatch.toml:2:20: http.max_header_bytes: 4096 is not between 8192 and 1048576" '[http]\nmax_header_bytes = 4096'
file_case "http: unknown key" "qpwatch.toml:2:1: http.timeout: unknown field" '[http]\ntimeout = 1'
file_case "empty web config path" "qpwatch.toml:1:19: web_config_file: must not be empty" 'web_config_file = ""'
web_case() { # KIND EXPECTED YAML: the web configuration file, by flag and by key
  local web=$dir/web.yml
  printf '%b\n' "$3" >"$web"
  check "web config: $1" "$2" "$(printf '%b' "$3" | tr '\n' ';' | sed 's/|/\\|/g')" -- "$BIN" run --config /dev/null --web-config-file "$web"
  printf 'web_config_file = "%s"\n' "$web" >"$dir/with-web.toml"
  check "web config: $1 (check-config)" "$2" "check-config, web_config_file = web.yml" -- "$BIN" check-config "$dir/with-web.toml"
}
web_case "TLS 1.0" "web.yml: tls_server_config.min_version: TLS10 is not supported" 'tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  min_version: TLS10'
web_case "unknown key" "web.yml: tls_server_config.certfile: unknown field" 'tls_server_config:\n  certfile: a.crt'
web_case "missing certificate file" "web.yml: tls_server_config.cert_file: cannot read" 'tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key'
web_case "unverified client certificates" "web.yml: tls_server_config.client_auth_type: RequireAnyClientCert is not supported" 'tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  client_auth_type: RequireAnyClientCert'
web_case "plain-text password" "web.yml: basic_auth_users.prometheus: not a bcrypt hash" 'basic_auth_users:\n  prometheus: secret'
web_case "YAML syntax" "web.yml: (syntax):" 'basic_auth_users: [a'
web_case "rate_limit" "web.yml: rate_limit: not supported by qpwatch" 'rate_limit:\n  interval: 1s'
check "missing web config file" "/nonexistent/web.yml: (file): cannot read" "--web-config-file /nonexistent/web.yml" -- "$BIN" run --config /dev/null --web-config-file /nonexistent/web.yml
file_case "responder: empty allow-list" "qpwatch.toml:2:9: responder.allow: an empty list would answer no one" '[responder]\nallow = []'
file_case "responder: bad subnet" "qpwatch.toml:2:9: responder.allow: \"10.0.0.0/33\": the prefix length is not 0..=32" '[responder]\nallow = ["10.0.0.0/33"]'
file_case "responder: zero per-source cap" "qpwatch.toml:2:30: responder.max_connections_per_source: 0 is not between 1 and 65536" '[responder]\nmax_connections_per_source = 0'
file_case "mesh: zero answer rate" "qpwatch.toml:2:26: mesh.answer_rate_per_source: 0 is not between 1 and 1000000" '[mesh]\nanswer_rate_per_source = 0'
check "missing config file" "/nonexistent/qpwatch.toml" "--config /nonexistent/qpwatch.toml" -- "$BIN" run --config /nonexistent/qpwatch.toml
# an endless file: read up to a bound, not forever (timeout: the unbounded read never ends)
check "endless file" "/dev/zero: (file): larger than 1024 KiB" "check-config /dev/zero" -- timeout 20 "$BIN" check-config /dev/zero
check "endless file (run)" "/dev/zero: (file): larger than 1024 KiB" "run --config /dev/zero" -- timeout 20 "$BIN" run --config /dev/zero
head -c 64 /dev/urandom | tr -d '\n' | { printf '\377'; cat; } >"$dir/binary.toml"
check "binary file" "binary.toml: (file): not UTF-8 text" "check-config BINARY" -- "$BIN" check-config "$dir/binary.toml"
check "check-config: path and --config" "cannot be used with" "check-config a --config b" -- "$BIN" check-config a --config b
flag_case "flag: bad listen" "--listen" --listen nonsense
flag_case "flag: negative ring size" "--ring-buffer-bytes: -1 is not a power of two" --ring-buffer-bytes -1
flag_case "flag: non-numeric cap" "--max-process-labels" --max-process-labels many
flag_case "flag: ring not a power of two" "--ring-buffer-bytes: 5000 is not a power of two" --ring-buffer-bytes 5000
flag_case "flag: unknown group" "--groups" --groups qp,bogus
flag_case "flag: target without name" "--target" --target =198.18.0.1
flag_case "flag: negative poll interval" "--module-poll-interval" --module-poll-interval -3
flag_case "flag: unknown flag" "--bogus" --bogus
flag_case "flag: mesh interval too short" "--mesh-interval: 0.001 is not a number of seconds between 0.01 and 3600" --mesh-interval 0.001
flag_case "flag: too many discovered targets" "--mesh-discover-max-targets: 100001 is not between 1 and 100000" --mesh-discover-max-targets 100001
flag_case "flag: duplicate target label" "--mesh-target-label: \"rack\" is named twice" --mesh-target-label rack --mesh-target-label rack
flag_case "flag: targets file extension" "--mesh-targets-file: \"targets.csv\"" --mesh-targets-file targets.csv
flag_case "flag: zero idle timeout" "--http-idle-timeout: 0 is not a number of seconds between 0.1 and 86400" --http-idle-timeout 0
flag_case "flag: per-source cap not a number" "--http-max-connections-per-source" --http-max-connections-per-source many
flag_case "flag: rtt breakdown not a boolean" "--mesh-rtt-breakdown" --mesh-rtt-breakdown yes
flag_case "flag: bad allow-list" "--responder-allow: \"198.18.0.0/x\"" --responder-allow 198.18.0.1,198.18.0.0/x
flag_case "flag: short idle timeout" "--responder-idle-timeout: 0.1 is not a number of seconds between 1 and 86400" --responder-idle-timeout 0.1
echo
for spelling in "check-config packaging/qpwatch.toml" "check-config --config packaging/qpwatch.toml"; do
  # shellcheck disable=SC2086
  if ! out=$("$BIN" $spelling 2>&1); then
    echo "bad_config: FAIL the example config does not validate ($spelling): $out" >&2
    failures=$((failures + 1))
  fi
done
if [ "$failures" -ne 0 ]; then
  echo "bad_config: $failures of $n cases failed" >&2
  exit 1
fi
echo "bad_config: all $n cases exit 2 with one error line" >&2
