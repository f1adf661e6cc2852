# The HTTP endpoint locked down as README "TLS, basic auth and limits" says:
# the real agent on all addresses with a web configuration file (TLS and a
# basic auth user whose hash `qpwatch hash-password` made). curl: 200 with
# the credentials, 401 without or with a wrong password, /healthz open, no
# answer to plain HTTP. Debian's Prometheus scrapes it over TLS with basic
# auth (scheme https, tls_config.ca_file, basic_auth): up == 1 and a
# qpwatch series in its API. Then 300 idle connections from 127.0.0.1: the
# agent keeps 8 (max_connections_per_source) and refuses the rest, while
# Prometheus and curl from 198.18.0.1 still get their scrapes. A renewed
# certificate is taken without a SIGHUP (the agent looks at the files every
# 5 s). A web configuration that does not validate keeps the one in force,
# when its files change and on SIGHUP; a good one is taken on SIGHUP.
# qpwatch_http_tls_cert_expiry_timestamp_seconds is the served
# certificate's notAfter as openssl reads it, before and after each
# renewal taken (not after the bad reloads). SIGTERM with the idle
# connections still open: exit 0.
PASSWORD='correct horse battery staple'
PORT=9721
AGENT_ADDR=0.0.0.0:$PORT
certs=$OUT/certs
make_test_certs "$certs"
hash=$(printf '%s\n' "$PASSWORD" | "$BIN/qpwatch" hash-password) || fail "qpwatch hash-password"
[[ $hash == '$2b$10$'* ]] || fail "hash-password printed $hash"
web=$OUT/web.yml
# relative paths: from the file's directory
printf 'tls_server_config:\n  cert_file: certs/agent.crt\n  key_file: certs/agent.key\nbasic_auth_users:\n  prometheus: %s\n' "$hash" >"$web"
printf 'web_config_file = "%s"\n' "$web" >"$OUT/qpwatch.toml"
checked=$("$BIN/qpwatch" check-config "$OUT/qpwatch.toml" 2>&1) || fail "check-config: $checked"
log "$checked"

printf '%s' "$PASSWORD" >"$OUT/prometheus.password"
cat >"$OUT/prometheus.yml" <<YML
global:
  scrape_interval: 2s
  scrape_timeout: 2s
scrape_configs:
  - job_name: qpwatch
    scheme: https
    tls_config:
      ca_file: $certs/ca.crt
    basic_auth:
      username: prometheus
      password_file: $OUT/prometheus.password
    static_configs:
      - targets: ["$RXE_ADDR:$PORT"]
YML
run_prometheus

launch_agent --web-config-file "$web"
https() { curl -s -o /dev/null -w '%{http_code}' --max-time 10 --cacert "$certs/ca.crt" "$@"; }
ready() { [ "$(https "https://127.0.0.1:$PORT/readyz")" = 200 ]; }
wait_until 60 ready || { cat "$OUT/agent.log" >&2; fail "agent not ready over TLS"; }
grep -q 'web=TLS, basic auth (1 users)' "$OUT/agent.log" || fail "the agent does not log its web configuration"

url=https://127.0.0.1:$PORT
assert_eq "with the credentials" 200 "$(https -u "prometheus:$PASSWORD" "$url/metrics")"
assert_eq "a wrong password" 401 "$(https -u prometheus:guess "$url/metrics")"
assert_eq "an unknown user" 401 "$(https -u "root:$PASSWORD" "$url/metrics")"
assert_eq "no credentials" 401 "$(https "$url/metrics")"
assert_eq "/healthz without credentials" 200 "$(https "$url/healthz")"
plain=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$PORT/metrics" || true)
assert_eq "plain HTTP to the TLS endpoint (no HTTP status)" 000 "$plain"
assert_eq "a client that does not trust the agent's CA" 000 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -u "prometheus:$PASSWORD" "$url/metrics" || true)"
# scrape_from NAME URL [CURL_ARGS...]: URL/metrics over TLS with the
# credentials, saved to $OUT/NAME.prom (its path printed)
scrape_from() {
  local file=$OUT/$1.prom base=$2
  shift 2
  curl -fsS --max-time 10 --cacert "$certs/ca.crt" -u "prometheus:$PASSWORD" "$@" "$base/metrics" >"$file" && echo "$file"
}
scrape_tls() { scrape_from "$1" "$url"; }
# from and to the rxe address, as Prometheus scrapes
scrape_rxe() { scrape_from "$1" "https://$RXE_ADDR:$PORT" --interface "$RXE_ADDR"; }
first=$(scrape_tls first) || fail "scrape over TLS"
assert_eq 'qpwatch_http_auth_failures_total{reason="invalid"}' 2 "$(metric "$first" 'qpwatch_http_auth_failures_total{reason="invalid"}')"
assert_eq 'qpwatch_http_auth_failures_total{reason="missing"}' 1 "$(metric "$first" 'qpwatch_http_auth_failures_total{reason="missing"}')"
# not_after CERT: its notAfter in Unix seconds, as openssl reads it
not_after() { date -u -d "$(openssl x509 -noout -enddate -in "$1" | sed 's/^notAfter=//')" +%s; }
expiry='qpwatch_http_tls_cert_expiry_timestamp_seconds'
assert_eq "$expiry: agent.crt's notAfter" "$(not_after "$certs/agent.crt")" "$(metric "$first" "$expiry")"

WAIT_INTERVAL=1 wait_until 120 prom_has 'up{job="qpwatch"} == 1' || { tail -n 20 "$OUT/prometheus.log"; fail "Prometheus does not scrape the agent over TLS with basic auth"; }
WAIT_INTERVAL=1 wait_until 30 prom_has 'qpwatch_build_info{job="qpwatch"} == 1' || fail "no qpwatch series in Prometheus"
log "Prometheus $(curl -fsS "http://$PROM/api/v1/status/buildinfo" | jq -r .data.version) scrapes https://$RXE_ADDR:$PORT with basic auth: up == 1, qpwatch_build_info present"

timed_scrape() { # the same scrape from $RXE_ADDR: its status in $SCRAPE_CODE, its time in $SCRAPE_MS
  local t0
  t0=$(date +%s%N)
  SCRAPE_CODE=$(https --interface "$RXE_ADDR" -u "prometheus:$PASSWORD" "https://$RXE_ADDR:$PORT/metrics")
  SCRAPE_MS=$((($(date +%s%N) - t0) / 1000000))
}
timed_scrape
assert_eq "a scrape from $RXE_ADDR" 200 "$SCRAPE_CODE"
before_ms=$SCRAPE_MS

# 300 idle connections from 127.0.0.1, held until the end
python3 -c '
import socket, sys, time
held = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(300)]
print(len(held), flush=True)
time.sleep(600)
' "$PORT" >"$OUT/idle.log" 2>&1 &
idle_pid=$!
on_exit "kill $idle_pid 2>/dev/null"
wait_until 30 grep -q 300 "$OUT/idle.log" || fail "the idle connections: $(cat "$OUT/idle.log")"
timed_scrape
assert_eq "a scrape from $RXE_ADDR while 300 idle connections from 127.0.0.1 are open" 200 "$SCRAPE_CODE"
log "that scrape (curl under emulation) took $SCRAPE_MS ms; before the idle connections: $before_ms ms"
during=$(scrape_rxe during) || fail "scrape during the flood"
refused=$(metric "$during" 'qpwatch_http_connections_refused_total{reason="max_connections_per_source"}')
[ "$refused" -ge 292 ] || fail "refused for max_connections_per_source: $refused, expected at least 292 (300 - 8)"
log "ok: $refused connections refused at max_connections_per_source; open: $(metric "$during" qpwatch_http_active_connections)"
sleep 6
prom_has 'min_over_time(up{job="qpwatch"}[8s]) == 1' || fail "Prometheus missed scrapes during the flood"
log "ok: Prometheus's scrapes all succeeded during the flood"

# A renewed certificate is taken without a SIGHUP: the agent looks at the
# web configuration's files every 5 s and reloads a change that held still
# for one look.
cp "$web" "$OUT/web.good"
first_expiry=$(not_after "$certs/agent.crt")
sign_test_cert "$certs" 1
renewed_expiry=$(not_after "$certs/agent.crt")
[ "$renewed_expiry" -lt "$first_expiry" ] || fail "the renewed certificate expires at $renewed_expiry, not before $first_expiry"
renewed_at=$SECONDS
wait_until 30 grep -q 'web configuration files changed: web configuration reloaded' "$OUT/agent.log" || fail "the renewed certificate was not taken without a SIGHUP"
log "ok: the renewed certificate taken without a SIGHUP, within $((SECONDS - renewed_at)) s"
renewed=$(scrape_rxe renewed) || fail "scrape after the renewal"
assert_eq "$expiry after the renewal: the renewed certificate's" "$renewed_expiry" "$(metric "$renewed" "$expiry")"

# A web configuration that does not validate keeps the one in force, and
# the certificate it serves, though another one is on disk already: when
# the files change, and again on SIGHUP.
sign_test_cert "$certs" 3
third_expiry=$(not_after "$certs/agent.crt")
printf 'tls_server_config:\n  cert_file: certs/agent.crt\n  key_file: certs/agent.key\n  min_version: TLS10\n' >"$web"
wait_until 30 grep -q 'web configuration files changed: web configuration not reloaded' "$OUT/agent.log" || fail "no warning for the bad web configuration"
grep 'web configuration not reloaded' "$OUT/agent.log" | tail -n1 >&2
kill -HUP "$AGENT_PID"
wait_until 30 grep -q 'SIGHUP: web configuration not reloaded' "$OUT/agent.log" || fail "no warning for the bad web configuration on SIGHUP"
assert_eq "after a bad reload, without credentials" 401 "$(https --interface "$RXE_ADDR" "https://$RXE_ADDR:$PORT/metrics")"
bad=$(scrape_rxe after-bad) || fail "scrape after the bad reload"
assert_eq "$expiry after a bad reload: still the renewed certificate's" "$renewed_expiry" "$(metric "$bad" "$expiry")"
cp "$OUT/web.good" "$web"
kill -HUP "$AGENT_PID"
wait_until 30 grep -q 'SIGHUP: web configuration reloaded' "$OUT/agent.log" || fail "the good web configuration was not reloaded"
after=$(scrape_rxe after) || fail "scrape after the reloads"
assert_eq 'qpwatch_http_web_config_reloads_total{result="error"}' 2 "$(metric "$after" 'qpwatch_http_web_config_reloads_total{result="error"}')"
assert_eq 'qpwatch_http_web_config_reloads_total{result="ok"}' 2 "$(metric "$after" 'qpwatch_http_web_config_reloads_total{result="ok"}')"
assert_eq "$expiry after the good reload: the third certificate's" "$third_expiry" "$(metric "$after" "$expiry")"

# SIGTERM while the idle connections are still open
kill -0 "$idle_pid" 2>/dev/null || fail "the idle connections were closed before SIGTERM"
stop_agent
log "ok: exit 0 on SIGTERM with idle connections open, in $EXIT_MS ms"
