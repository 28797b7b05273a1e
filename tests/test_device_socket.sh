#!/bin/sh
# One daemon per GPU, as a client picks it: libradiance's
# radiance_default_socket_path() with $RADIANCE_DEVICE (a program built
# against the library prints what it resolves), and radiancectl --device N,
# which names the socket it tried. Expected paths are written out here,
# not derived from the code.
# Env: BUILD (default build), RADIANCECTL.
set -u
BUILD=${RADIANCE_BUILD:-${BUILD:-build}}
RADIANCECTL=${RADIANCECTL:-$BUILD/radiancectl}
. "$(dirname "$0")/script_lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

san=""
objdump -p "$BUILD/libradiance.so.0" | grep -q 'NEEDED.*libasan' && san="$san -fsanitize=address"
objdump -p "$BUILD/libradiance.so.0" | grep -q 'NEEDED.*libubsan' && san="$san -fsanitize=undefined"
cat >"$tmp/path.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include "radiance.h"
int main(void)
{
	char buf[108];
	int rc = radiance_default_socket_path(buf, sizeof buf);
	if (rc < 0) {
		printf("error %s\n", radiance_strerror(rc));
		return 1;
	}
	printf("%s\n", buf);
	return 0;
}
EOF
if ! cc $san -std=c11 -Iclient "$tmp/path.c" -L"$BUILD" -lradiance -o "$tmp/path" 2>"$tmp/cc.err"; then
	bad "cannot build the probe: $(cat "$tmp/cc.err")"
	script_done test_device_socket
fi

# resolve "ENV..." EXPECTED: the probe's answer with exactly these variables
resolve() {
	got=$(env -u RADIANCE_SOCKET -u RADIANCE_DEVICE -u XDG_RUNTIME_DIR $1 \
		LD_LIBRARY_PATH="$BUILD" "$tmp/path" 2>&1)
	[ "$got" = "$2" ] && ok "${1:-(nothing set)} -> $got" || bad "$1: expected '$2', got '$got'"
}
resolve "RADIANCE_DEVICE=0" /run/radiance/radiance-0.sock
resolve "RADIANCE_DEVICE=3" /run/radiance/radiance-3.sock
resolve "RADIANCE_DEVICE=1024" /run/radiance/radiance-1024.sock
resolve "RADIANCE_DEVICE=" /run/radiance/radiance.sock
resolve "RADIANCE_SOCKET=/tmp/x.sock RADIANCE_DEVICE=3" /tmp/x.sock
for v in -1 +1 1025 99999 01 1x x 0x2; do
	resolve "RADIANCE_DEVICE=$v" "error Invalid argument"
done

# radiancectl --device: the path it could not reach, and its usage errors
out=$(env -u RADIANCE_SOCKET "$RADIANCECTL" --device 7 status 2>&1)
rc=$?
case $out in
*"/run/radiance/radiance-7.sock"*) [ $rc = 3 ] && ok "radiancectl --device 7: exit 3, names /run/radiance/radiance-7.sock" ||
	bad "radiancectl --device 7: exit $rc: $out" ;;
*) bad "radiancectl --device 7: $out" ;;
esac
out=$(RADIANCE_SOCKET=$tmp/nothing.sock "$RADIANCECTL" --device 2 status 2>&1)
case $out in
*"/run/radiance/radiance-2.sock"*) ok "--device wins over \$RADIANCE_SOCKET" ;;
*) bad "--device 2 with RADIANCE_SOCKET set: $out" ;;
esac
out=$(RADIANCE_DEVICE=5 "$RADIANCECTL" status 2>&1)
case $out in
*"/run/radiance/radiance-5.sock"*) ok "radiancectl follows \$RADIANCE_DEVICE" ;;
*) bad "RADIANCE_DEVICE=5 radiancectl: $out" ;;
esac
out=$("$RADIANCECTL" --device x1 status 2>&1)
rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "\-\-device 'x1': not a GPU ordinal" &&
	ok "--device x1: exit 2: $(echo "$out" | head -n 1)" || bad "--device x1: exit $rc: $out"
# a $RADIANCE_DEVICE that is no ordinal: no default socket, and each client
# says why (they said "cannot connect to : Invalid argument" and "$RADIANCE_SOCKET
# is too long")
out=$(env -u RADIANCE_SOCKET RADIANCE_DEVICE=x1 "$RADIANCECTL" status 2>&1)
rc=$?
[ $rc = 3 ] && echo "$out" | grep -q "RADIANCE_DEVICE is 'x1', not a GPU ordinal (0 to 1024" &&
	ok "RADIANCE_DEVICE=x1 radiancectl: exit 3: $(echo "$out" | head -n 1)" ||
	bad "RADIANCE_DEVICE=x1 radiancectl: exit $rc: $out"
out=$(env -u RADIANCE_SOCKET RADIANCE_DEVICE=x1 "$BUILD/examples/linear" tests/data/minilm-w4g128 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "RADIANCE_DEVICE is 'x1', not a GPU ordinal" &&
	ok "RADIANCE_DEVICE=x1 examples/linear: exit 1: $out" ||
	bad "RADIANCE_DEVICE=x1 examples/linear: exit $rc: $out"
out=$("$RADIANCECTL" --device 1 --socket "$tmp/s" status 2>&1)
rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "pick one" && ok "--device with --socket: exit 2" ||
	bad "--device with --socket: exit $rc: $out"

script_done test_device_socket
