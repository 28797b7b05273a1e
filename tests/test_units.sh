#!/bin/sh
# Checks systemd/ offline, as root or not, with no running systemd:
#   - radianced.service (ExecStart pointed at the built binary, as
#     `make install` seds @SBINDIR@) and radianced.socket with
#     `systemd-analyze verify`; any message at all is a failure, because
#     verify exits 0 on "Unknown key ... ignoring" and similar;
#   - radiance.sysusers with systemd-sysusers into a scratch root;
#   - radiance.tmpfiles with systemd-tmpfiles --create into that root;
#   - and that this checker does catch a broken unit.
# Env: BUILD (default build).
set -u
BUILD=${BUILD:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
units=$top/systemd
bin=$top/$BUILD/radianced
case $BUILD in /*) bin=$BUILD/radianced ;; esac
failed=0

if [ ! -x "$bin" ]; then
	echo "FAIL: $bin is not built"
	exit 1
fi
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
	if ! command -v $tool >/dev/null; then
		echo "FAIL: $tool not found (install the Debian package systemd)"
		exit 1
	fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/units" "$tmp/root/etc"

# verify DIR: 0 when systemd-analyze verify is silent and happy
verify() {
	out=$(cd "$1" && SYSTEMD_UNIT_PATH="$1:" systemd-analyze verify --man=no \
		"$1/radianced.service" "$1/radianced.socket" 2>&1)
	rc=$?
	if [ $rc -ne 0 ] || [ -n "$out" ]; then
		echo "$out"
		return 1
	fi
	return 0
}

report() {   # name rc
	if [ "$2" = 0 ]; then
		echo "ok: $1"
	else
		echo "FAIL: $1"
		failed=$((failed + 1))
	fi
}

sed "s|@SBINDIR@|$(dirname "$bin")|" "$units/radianced.service" > "$tmp/units/radianced.service"
cp "$units/radianced.socket" "$tmp/units/"
if grep -q '@[A-Z]*@' "$tmp/units/radianced.service"; then
	echo "unsubstituted placeholder in radianced.service"
	report "placeholders" 1
fi
verify "$tmp/units"
report "systemd-analyze verify radianced.service radianced.socket" $?

grep -q '^Type=notify$' "$units/radianced.service" &&
	grep -q '^WatchdogSec=' "$units/radianced.service" &&
	grep -q '^ListenStream=/run/radiance/radiance.sock$' "$units/radianced.socket"
report "Type=notify, WatchdogSec and ListenStream present" $?

# sysusers: creates the user in a scratch root; any complaint fails
out=$(systemd-sysusers --root="$tmp/root" "$units/radiance.sysusers" 2>&1)
rc=$?
echo "$out" | grep -Eqi 'fail|invalid|ignor|unknown' && rc=1
[ $rc = 0 ] && ! grep -q '^radiance:' "$tmp/root/etc/passwd" && rc=1
[ $rc = 0 ] || echo "$out"
report "systemd-sysusers radiance.sysusers" $rc

# tmpfiles: resolves the user created above, makes /run/radiance
out=$(systemd-tmpfiles --root="$tmp/root" --create "$units/radiance.tmpfiles" 2>&1)
rc=$?
[ -n "$out" ] && rc=1
[ $rc = 0 ] && [ ! -d "$tmp/root/run/radiance" ] && rc=1
[ $rc = 0 ] || echo "$out"
report "systemd-tmpfiles radiance.tmpfiles" $rc

# the checker itself: an unknown key and a bad value must be caught
mkdir -p "$tmp/broken"
sed 's/^Type=notify$/Type=bogus\nNoSuchKey=1/' "$tmp/units/radianced.service" > "$tmp/broken/radianced.service"
cp "$units/radianced.socket" "$tmp/broken/"
if verify "$tmp/broken" >/dev/null; then
	report "verify catches a broken unit" 1
else
	report "verify catches a broken unit" 0
fi

[ $failed = 0 ] && echo "test_units: all ok"
[ $failed = 0 ]
