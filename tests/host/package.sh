#!/usr/bin/env bash
# Builds the Debian package (scripts/package, lintian included: it fails on
# any error or warning) and checks what is in it: the files where Debian puts
# them, the conffile, the unit's ExecStart, the maintainer scripts debhelper
# writes for a systemd unit, the dependencies dpkg-shlibdeps found. The VM
# suite's deb_package scenario installs the same package into a guest.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/package
deb=$(find target/debian -maxdepth 1 -name 'qpwatch_*.deb' | head -n1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
check() {
  if ! eval "$2"; then
    echo "package: FAIL $1" >&2
    failures=$((failures + 1))
  fi
}
dpkg-deb --contents "$deb" | awk '{ print $1, $NF }' | sed 's#\./#/#' >"$dir/contents"
dpkg-deb --control "$deb" "$dir/control"
dpkg-deb --extract "$deb" "$dir/root"
mode() { awk -v f="$1" '$2 == f { print $1 }' "$dir/contents"; }
for f in /usr/bin/qpwatch /lib/systemd/system/qpwatch.service /etc/qpwatch/qpwatch.toml \
  /usr/share/qpwatch/rules.yml /usr/share/man/man8/qpwatch.8.gz \
  /usr/share/bash-completion/completions/qpwatch /usr/share/zsh/vendor-completions/_qpwatch \
  /usr/share/fish/vendor_completions.d/qpwatch.fish /usr/share/doc/qpwatch/copyright \
  /usr/share/doc/qpwatch/changelog.gz /usr/share/doc/qpwatch/crates.txt.gz; do
  check "$f in the package" '[ -n "$(mode "$f")" ]'
done
check "/usr/bin/qpwatch is -rwxr-xr-x" '[ "$(mode /usr/bin/qpwatch)" = -rwxr-xr-x ]'
for page in "$dir"/root/usr/share/man/man8/*.8.gz; do
  check "$(basename "$page"): no groff warnings" '[ -z "$(LC_ALL=C.UTF-8 MANROFFSEQ= MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$page" 2>&1 >/dev/null)" ]'
done
for dash in dashboards/*.json; do
  check "$dash in /usr/share/qpwatch/dashboards" 'cmp -s "$dash" "$dir/root/usr/share/qpwatch/dashboards/$(basename "$dash")"'
done
check "the conffile is the shipped config" 'cmp -s packaging/qpwatch.toml "$dir/root/etc/qpwatch/qpwatch.toml"'
check "conffiles lists /etc/qpwatch/qpwatch.toml" 'grep -qx /etc/qpwatch/qpwatch.toml "$dir/control/conffiles"'
check "the unit is packaging/'s with ExecStart=/usr/bin/qpwatch" \
  '[ "$(diff packaging/qpwatch.service "$dir/root/lib/systemd/system/qpwatch.service" | grep -c "^>")" = 1 ] && grep -qx "ExecStart=/usr/bin/qpwatch run --config /etc/qpwatch/qpwatch.toml" "$dir/root/lib/systemd/system/qpwatch.service"'
check "postinst enables the unit with deb-systemd-helper" 'grep -q "deb-systemd-helper enable .qpwatch.service" "$dir/control/postinst"'
check "postinst starts it only under systemd" 'grep -q "deb-systemd-invoke .* .qpwatch.service" "$dir/control/postinst" && grep -q "/run/systemd/system" "$dir/control/postinst"'
check "prerm stops it" 'grep -q "deb-systemd-invoke stop .qpwatch.service" "$dir/control/prerm"'
check "postrm purges the enablement" 'grep -q "deb-systemd-helper purge .qpwatch.service" "$dir/control/postrm"'
depends=$(dpkg-deb --field "$deb" Depends)
for lib in libibverbs1 librdmacm1 libc6; do
  check "Depends has $lib ($depends)" '[[ $depends == *"$lib "* ]]'
done
if [ "$failures" -ne 0 ]; then
  echo "package: $failures checks failed" >&2
  exit 1
fi
echo "package: $(basename "$deb"): contents, conffile, unit, maintainer scripts and dependencies ok"
