#!/bin/sh
# The CPU fast path's aarch64 level (kernels/cpu_neon.c) on an x86-64
# machine: tests/test_cpu_fast.c cross-compiled with aarch64-linux-gnu-gcc
# and run under qemu-aarch64 (user-mode emulation), so the NEON kernels are
# checked bit for bit against the scalar reference built for aarch64, on
# every M, N, K, dtype and special row that test covers.
#
# What this does not cover, and why:
#  - one compute thread only: qemu-aarch64 7.2 (Debian 12) hangs in the
#    guest's first pthread_create on this kind of machine (seen 2026-12-07;
#    a five-line program does too), so the pool tests are left out; the pool
#    is the same C code on every level and test_cpu_fast runs it natively at
#    1-4 threads;
#  - speed: emulation says nothing about it, and no ARM machine has run
#    these kernels (docs/cpu.md).
#
# Needs gcc-aarch64-linux-gnu and qemu-user (tools/install-deps.sh). cmocka
# for arm64 is unpacked from Debian's packages into $BUILD/arm64 (apt-get
# download with arm64 package lists of its own: the system's dpkg
# architectures stay as they are); that needs the network once per build
# folder. Prints "test_cpu_neon: N passed, N failed".
set -u
BUILD=${BUILD:-build}
A=$BUILD/arm64
CC=aarch64-linux-gnu-gcc
QEMU=qemu-aarch64
for tool in $CC $QEMU; do
	command -v "$tool" >/dev/null 2>&1 ||
		{ echo "test_cpu_neon: $tool is missing (sh tools/install-deps.sh)"; exit 1; }
done

root=$A/root
if [ ! -f "$root/usr/include/cmocka.h" ]; then
	mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/debs"
	o="-qq -oAPT::Architecture=arm64 -oAPT::Architectures=arm64 -oDir::State::Lists=$PWD/$A/lists
	   -oDir::Cache=$PWD/$A/cache -oDebug::NoLocking=1 -oAPT::Sandbox::User=root"
	# shellcheck disable=SC2086
	if ! apt-get $o update || ! (cd "$A/debs" && apt-get $o download libcmocka0 libcmocka-dev); then
		echo "test_cpu_neon: cannot download cmocka for arm64 (Debian's package lists)"
		exit 1
	fi
	for d in "$A"/debs/*.deb; do dpkg -x "$d" "$root"; done
fi
lib=$root/usr/lib/aarch64-linux-gnu

# the Makefile's flags for these files: the reference rounds every product
# and sum as written (-ffp-contract=off), the SIMD file at -O3
flags="-std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -ffp-contract=off
       -Ikernels -Icommon -I$root/usr/include"
mkdir -p "$A/obj"
# shellcheck disable=SC2086
$CC $flags -O3 -c kernels/cpu_neon.c -o "$A/obj/cpu_neon.o" &&
	$CC $flags -O2 -o "$A/test_cpu_fast" tests/test_cpu_fast.c kernels/cpu_fast.c \
		kernels/cpu_pool.c kernels/w4a8_cpu.c "$A/obj/cpu_neon.o" -L"$lib" -lcmocka -lpthread -lm ||
	{ echo "test_cpu_neon: the aarch64 build failed"; exit 1; }

passed=0
failed=0
for t in 'test_w4a8*' 'test_bf16*'; do
	out=$(RADIANCE_TEST_MAX_THREADS=1 RADIANCE_TEST_FILTER="$t" \
		timeout -s KILL 600 $QEMU -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH="$lib" \
		"$A/test_cpu_fast" 2>&1)
	rc=$?
	echo "$out"
	# the level under test must be there: no "neon not on this CPU"
	if echo "$out" | grep -q "neon not on this CPU"; then
		echo "test_cpu_neon: the neon level was not created under emulation"
		rc=1
	fi
	p=$(echo "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
	f=$(echo "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
	passed=$((passed + ${p:-0}))
	failed=$((failed + ${f:-0}))
	if [ "$rc" != 0 ] && [ "${f:-0}" = 0 ]; then failed=$((failed + 1)); fi
done
echo "test_cpu_neon: $passed passed, $failed failed"
[ "$failed" = 0 ]
