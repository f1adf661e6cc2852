# The Debian package (scripts/package: target/debian/qpwatch_*.deb) installed
# with dpkg into the guest (its root is a copy-on-write overlay: the host's
# dpkg database is not touched):
# - the files where Debian puts them, the config a conffile, the unit enabled
#   the debhelper way (the multi-user.target.wants link; systemd does not run
#   in the guest, so nothing is started);
# - the agent run from the installed unit's ExecStart as the systemd_unit
#   scenario runs it (nobody, the unit's capabilities and LimitMEMLOCK):
#   /readyz 200, rping's QPs counted, the man page and completions work;
# - an edited config survives a reinstall and `dpkg -r`; `dpkg --purge`
#   removes it and the enablement.
deb=$(find "$REPO/target/debian" -maxdepth 1 -name 'qpwatch_*.deb' 2>/dev/null | head -n1)
[ -n "$deb" ] || fail "no package in target/debian: run scripts/package"
unit=/lib/systemd/system/qpwatch.service
config=/etc/qpwatch/qpwatch.toml
wants=/etc/systemd/system/multi-user.target.wants/qpwatch.service
on_exit "dpkg --purge qpwatch >/dev/null 2>&1"
# man-db's trigger would re-index every man page of the host's tree (minutes
# under emulation); Debian's switch for it, in the guest's overlay only
rm -f /var/lib/man-db/auto-update
dpkg -i "$deb" >"$OUT/dpkg-install.log" 2>&1 || { cat "$OUT/dpkg-install.log" >&2; fail "dpkg -i $(basename "$deb")"; }
assert_eq "package status" "install ok installed" "$(dpkg-query -W -f '${Status}' qpwatch)"
log "installed $(basename "$deb"): $(dpkg-query -W -f '${Version} ${Installed-Size} KiB, depends ${Depends}' qpwatch)"
for f in /usr/bin/qpwatch "$unit" "$config" /usr/share/man/man8/qpwatch.8.gz /usr/share/man/man8/qpwatch-run.8.gz \
  /usr/share/qpwatch/rules.yml /usr/share/qpwatch/dashboards/qpwatch-overview.json \
  /usr/share/bash-completion/completions/qpwatch /usr/share/zsh/vendor-completions/_qpwatch \
  /usr/share/fish/vendor_completions.d/qpwatch.fish /usr/share/doc/qpwatch/copyright /usr/share/doc/qpwatch/changelog.gz; do
  [ -f "$f" ] || fail "$f not installed"
done
dpkg-query -W -f '${Conffiles}\n' qpwatch | grep -q "^ $config " || fail "$config is not a conffile: $(dpkg-query -W -f '${Conffiles}' qpwatch)"
[ "$(readlink "$wants")" = "$unit" ] || fail "unit not enabled: $wants -> $(readlink "$wants")"
cmp -s "$REPO/packaging/qpwatch.toml" "$config" || fail "installed config differs from packaging/qpwatch.toml"
log "ok: files in place, $config a conffile, $wants -> $unit"

exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
case $exec_start in /usr/bin/qpwatch\ *) ;; *) fail "ExecStart=$exec_start is not the packaged binary" ;; esac
caps=$(sed -n 's/^AmbientCapabilities=//p' "$unit")
memlock=$(sed -n 's/^LimitMEMLOCK=//p' "$unit")
MANWIDTH=120 man qpwatch 2>/dev/null | grep -q -- '--max-peer-labels' || fail "man qpwatch: no page, or the run flags missing"
# shellcheck disable=SC1091 # the installed completion
bash -c 'source /usr/share/bash-completion/completions/qpwatch && COMP_WORDS=(qpwatch check) COMP_CWORD=1 && _qpwatch qpwatch check qpwatch && printf "%s\n" "${COMPREPLY[@]}"' >"$OUT/completion.txt" 2>&1 ||
  { cat "$OUT/completion.txt" >&2; fail "bash completion"; }
assert_eq "bash completion of 'qpwatch check'" check-config "$(cat "$OUT/completion.txt")"
log "ok: man page and bash completion"

# shellcheck disable=SC2086 # ExecStart's words
launch_as_nobody "$caps" "${memlock/infinity/unlimited}" "$OUT/agent.log" $exec_start
wait_agent_ready 90
assert_eq "/readyz" 200 "$(curl -s -o /dev/null -w '%{http_code}' "http://$AGENT_ADDR/readyz")"
[ "$(stat -c %U "/proc/$AGENT_PID")" = nobody ] || fail "agent not running as nobody"
base=$(scrape base)
before=$(metric "$base" 'qpwatch_qp_destroyed_total{qp_type="RC"}')
rping -s -a "$RXE_ADDR" -C 3 >"$OUT/rping-server.log" 2>&1 &
sleep 1
rping -c -a "$RXE_ADDR" -C 3 >"$OUT/rping-client.log" 2>&1 || fail "rping failed"
wait_for_metric 'qpwatch_qp_destroyed_total{qp_type="RC"}' $((${before:-0} + 2)) 60 || fail "rping's 2 RC QPs not counted"
log "ok: the installed unit's agent ready as nobody, rping's 2 RC QPs counted"
stop_agent

echo '# edited by the operator' >>"$config"
edited=$(md5sum <"$config")
dpkg -i "$deb" >"$OUT/dpkg-reinstall.log" 2>&1 || { cat "$OUT/dpkg-reinstall.log" >&2; fail "dpkg -i again"; }
assert_eq "edited config after a reinstall" "$edited" "$(md5sum <"$config")"
dpkg -r qpwatch >"$OUT/dpkg-remove.log" 2>&1 || { cat "$OUT/dpkg-remove.log" >&2; fail "dpkg -r"; }
assert_eq "package status after dpkg -r" "deinstall ok config-files" "$(dpkg-query -W -f '${Status}' qpwatch)"
for f in /usr/bin/qpwatch "$unit" /usr/share/qpwatch/rules.yml; do
  [ ! -e "$f" ] || fail "$f left after dpkg -r"
done
assert_eq "edited config after dpkg -r" "$edited" "$(md5sum <"$config")"
log "ok: the edited config kept by a reinstall and by dpkg -r"
dpkg --purge qpwatch >"$OUT/dpkg-purge.log" 2>&1 || { cat "$OUT/dpkg-purge.log" >&2; fail "dpkg --purge"; }
[ ! -e /etc/qpwatch ] || fail "/etc/qpwatch left after purge: $(ls -la /etc/qpwatch)"
[ ! -e "$wants" ] && [ ! -L "$wants" ] || fail "$wants left after purge"
dpkg-query -W qpwatch >/dev/null 2>&1 && fail "qpwatch still known to dpkg after purge"
log "ok: dpkg --purge removed the config and the enablement"
