#!/bin/sh
# make check-build-matrix: builds every documented option combination this
# machine can (README "Building for a GPU", the Makefile's header), each in
# its own build directory under $MATRIX_DIR (default build-matrix/), and
# checks what each produced:
#   - `make all` succeeds (daemon, radiancectl, libradiance.a/.so, tests);
#   - libradiance.so.0 has no text relocations (no non-PIC code inside),
#     needs only shared libraries (protobuf-c, jansson, libc: never libuv,
#     inih, libsystemd or a static archive's copy) and exports only radiance_*;
#   - STATIC_DEPS=1: radianced and radiancectl need no libuv, protobuf-c,
#     jansson or inih shared library (the point of the option);
#   - GPU=cuda: radianced carries the GPU backend (its kernels' symbols);
#   - every radianced answers --version (nothing is initialised for it).
# GPU=hip needs hipcc (ROCm), which this machine lacks: reported as skipped
# (tests/test_gpu_compile.sh compiles the kernels for gfx1201 instead).
# Slow (each combination is a full build; GPU=cuda compiles the kernels
# with nvcc): minutes, so not part of make check.
# Env: MATRIX_DIR, MATRIX (space-separated subset of the names below), JOBS.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${MATRIX_DIR:-$top/build-matrix}
jobs=${JOBS:-2}
passed=0
failed=0
skipped=""
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
hipcc=$(command -v hipcc || ls /opt/rocm/bin/hipcc 2>/dev/null || true)

# name|make arguments
combos="cpu|
static|STATIC_DEPS=1
san|SAN=address,undefined
tsan|SAN=thread
cuda|GPU=cuda
cuda-static|GPU=cuda STATIC_DEPS=1
hip|GPU=hip
hip-static|GPU=hip STATIC_DEPS=1"

want() {
	[ -z "${MATRIX:-}" ] && return 0
	for w in $MATRIX; do [ "$w" = "$1" ] && return 0; done
	return 1
}

mkdir -p "$dir"
oldifs=$IFS
IFS='
'
for line in $combos; do
	IFS=$oldifs
	name=${line%%|*}
	args=${line#*|}
	want "$name" || continue
	case $args in
	*GPU=cuda*) [ -n "$nvcc" ] || { skipped="$skipped $name(no nvcc)"; continue; } ;;
	*GPU=hip*) [ -n "$hipcc" ] || { skipped="$skipped $name(no hipcc)"; continue; } ;;
	esac
	b=$dir/$name
	echo "== $name: make $args BUILD=$b"
	start=$(date +%s)
	# shellcheck disable=SC2086
	if ! make -s --no-print-directory -C "$top" -j"$jobs" $args BUILD="$b" all >"$dir/$name.log" 2>&1; then
		bad "$name: make $args all failed (last lines of $dir/$name.log):"
		tail -n 15 "$dir/$name.log" | sed 's/^/    | /'
		continue
	fi
	ok "$name: make $args all ($(($(date +%s) - start)) s)"
	grep -h '^note:' "$dir/$name.log" | sort -u | sed 's/^/    /'

	so=$b/libradiance.so.0
	if readelf -d "$so" | grep -q TEXTREL; then
		bad "$name: libradiance.so.0 has text relocations (non-PIC code)"
	else
		ok "$name: libradiance.so.0 has no text relocations"
	fi
	needed=$(objdump -p "$so" | awk '$1 == "NEEDED" { print $2 }' | tr '\n' ' ')
	extra=$(echo "$needed" | tr ' ' '\n' | grep -v -e '^$' -e '^libprotobuf-c\.so' -e '^libjansson\.so' \
		-e '^libc\.so' -e '^libasan\.so' -e '^libubsan\.so' -e '^libtsan\.so' -e '^libgcc_s\.so' -e '^libm\.so' || true)
	[ -z "$extra" ] && ok "$name: libradiance.so.0 needs $needed" ||
		bad "$name: libradiance.so.0 needs more than protobuf-c and jansson: $needed"
	leaked=$(nm -D --defined-only "$so" | awk '$2 == "T" { print $3 }' | grep -v '^radiance_' || true)
	[ -z "$leaked" ] && ok "$name: libradiance.so.0 exports only radiance_*" ||
		bad "$name: libradiance.so.0 exports $leaked"

	case $args in
	*STATIC_DEPS=1*)
		dyn=$(for x in "$b/radianced" "$b/radiancectl"; do objdump -p "$x" | awk '$1 == "NEEDED" { print $2 }'; done |
			grep -E 'libuv|libprotobuf-c|libjansson|libinih' | sort -u | tr '\n' ' ')
		[ -z "$dyn" ] && ok "$name: radianced and radiancectl need no libuv/protobuf-c/jansson/inih .so" ||
			bad "$name: STATIC_DEPS=1 executables still need $dyn"
		;;
	esac
	case $args in
	*GPU=*)
		nm "$b/radianced" | grep -q 'radiance__backend_gpu_ops' &&
			ok "$name: radianced has the GPU backend" || bad "$name: no GPU backend in radianced"
		;;
	esac
	v=$("$b/radianced" --version 2>&1)
	case $v in
	"radianced "*) ok "$name: $v" ;;
	*) bad "$name: radianced --version: $v" ;;
	esac
	IFS='
'
done
IFS=$oldifs

[ -n "$skipped" ] && echo "skipped:$skipped"
echo "build_matrix: $passed passed, $failed failed"
[ $failed = 0 ]
