#!/bin/sh
# Checks systemd/ offline, as root or not, with no running systemd:
#   - the units as `make units` generates them (ExecStart pointed at the
#     built binaries): radianced.service/.socket, the per-GPU template
#     radianced@.service/.socket (verified as instance radianced@0) and
#     radiance-metrics.service/.timer, with `systemd-analyze verify`; any
#     message at all is a failure, because verify exits 0 on "Unknown key
#     ... ignoring" and similar;
#   - that the template's instance is the device: its own socket, config
#     file, --device and --require-gpu;
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

# verify DIR UNIT...: 0 when systemd-analyze verify is silent and happy
verify() {
	d=$1
	shift
	out=$(cd "$d" && SYSTEMD_UNIT_PATH="$d:" systemd-analyze verify --man=no "$@" 2>&1)
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

# the Makefile's own recipes (make units), pointed at this build's binaries
bindir=$(dirname "$bin")
if ! make -s --no-print-directory -C "$top" BUILD="$tmp/gen" SBINDIR="$bindir" BINDIR="$bindir" \
	SYSCONFDIR=/etc units >"$tmp/make.log" 2>&1; then
	cat "$tmp/make.log"
	report "make units" 1
fi
cp "$tmp/gen/systemd/"* "$tmp/units/"
ln -s radianced@.service "$tmp/units/radianced@0.service"
ln -s radianced@.socket "$tmp/units/radianced@0.socket"
if grep -l '@[A-Z]*@' "$tmp/units/"*; then
	echo "unsubstituted placeholder in the files above"
	report "placeholders" 1
fi
all_units="radianced.service radianced.socket radianced@0.service radianced@0.socket
radiance-metrics.service radiance-metrics.timer"
list=""
for u in $all_units; do list="$list $tmp/units/$u"; done
verify "$tmp/units" $list
report "systemd-analyze verify $(echo $all_units)" $?

t=$tmp/units/radianced@.service
grep -q '^ListenStream=/run/radiance/radiance-%i.sock$' "$tmp/units/radianced@.socket" &&
	grep -q '^Requires=radianced@%i.socket$' "$t" &&
	grep -q '^Also=radianced@%i.socket$' "$t" &&
	grep -q '^ExecStart=.*/radianced --config /etc/radiance/radianced-%i.conf --socket /run/radiance/radiance-%i.sock --device %i --require-gpu=${RADIANCED_REQUIRE_GPU}$' "$t" &&
	grep -q '^Environment=RADIANCED_REQUIRE_GPU=yes$' "$t" &&
	! cat "$t" "$tmp/units/radianced@.socket" | grep -v '^#' | grep -q 'radianced\.socket\|radiance\.sock'
report "radianced@N: socket radiance-N.sock, radianced-N.conf, --device N, GPU required" $?
grep -q '^ExecStart=.*/radiancectl stats --prometheus --output ${RADIANCE_TEXTFILE_DIR}/radiance.prom$' \
	"$tmp/units/radiance-metrics.service" &&
	grep -q '^OnUnitActiveSec=' "$tmp/units/radiance-metrics.timer"
report "radiance-metrics.service writes the textfile, the timer repeats it" $?

grep -q '^Type=notify$' "$units/radianced.service" &&
	grep -q '^WatchdogSec=' "$units/radianced.service" &&
	grep -q '^ListenStream=/run/radiance/radiance.sock$' "$units/radianced.socket"
report "Type=notify, WatchdogSec and ListenStream present" $?

# sysusers: creates the user in a scratch root; any complaint fails
out=$(systemd-sysusers --root="$tmp/root" "$units/radiance.sysusers" 2>&1)
rc=$?
echo "$out" | grep -Eqi 'fail|invalid|ignor|unknown' && rc=1
[ $rc = 0 ] && ! grep -q '^radiance:' "$tmp/root/etc/passwd" && rc=1
# the GPU device groups: render created where missing, radiance a member
[ $rc = 0 ] && ! grep -q '^render:.*:radiance$' "$tmp/root/etc/group" && rc=1
[ $rc = 0 ] && ! grep -q '^video:.*:radiance$' "$tmp/root/etc/group" && rc=1
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
sed 's/^Type=notify$/Type=bogus\nNoSuchKey=1/' "$tmp/units/radianced@.service" > "$tmp/broken/radianced@.service"
cp "$units/radianced.socket" "$tmp/broken/radianced@.socket"
ln -s radianced@.service "$tmp/broken/radianced@3.service"
if verify "$tmp/broken" "$tmp/broken/radianced@3.service" >/dev/null; then
	report "verify catches a broken (template) unit" 1
else
	report "verify catches a broken (template) unit" 0
fi

[ $failed = 0 ] && echo "test_units: all ok"
[ $failed = 0 ]
