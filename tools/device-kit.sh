#!/bin/sh
# Makes build-kit/ (ignored, like every build-*/) from a GPU build folder: what
# one call on the GPU host needs, small enough to travel beside the tree (the
# device tool caps what travels at 64 MiB, and the tree alone is ~44 MB):
# the binaries stripped of debug info, libcmocka.so.0 and libprotobuf-c.so.1
# (the H200 host has neither), the cffi and pycparser wheels unpacked for the
# host's Python 3.12 (it has numpy, ml_dtypes and pytest, not cffi), and
# bench/chaos_device.sh's runner. Run it here after
#   make GPU=cuda STATIC_DEPS=1
# and name build-kit in the call's carry. On the host:
#   export LD_LIBRARY_PATH=$PWD/build-kit/lib PYTHONPATH=$PWD/build-kit/py
#   RADIANCE_BUILD=build-kit build-kit/tests/test_gpu ...
# Env: BUILD (build-cuda), NO_TEST_GPU=1 / NO_BENCH=1 leave those out (to stay
# under the cap), WHEELS (a folder of cffi/pycparser wheels; default: pip
# download them into build-kit/.wheels).
# Exit: 0, 1 when a binary is missing or the wheels cannot be had.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build-cuda}
K=build-kit
rm -rf "$K"
mkdir -p "$K/tests" "$K/tools" "$K/bench" "$K/lib" "$K/py"
L="radianced radiancectl libradiance.so.0 tools/radiance-numerics"
[ -n "${NO_TEST_GPU:-}" ] || L="$L tests/test_gpu"
[ -n "${NO_BENCH:-}" ] || L="$L bench/bench_serve bench/bench_w4a8"
for f in $L; do
	[ -f "$B/$f" ] || { echo "device-kit: $B/$f is missing (make GPU=cuda STATIC_DEPS=1)" >&2; exit 1; }
	strip --strip-debug -o "$K/$f" "$B/$f"
done
for l in libcmocka.so.0 libprotobuf-c.so.1; do
	p=$(ldconfig -p | awk -v l="$l" '$1 == l { print $NF; exit }')
	[ -n "$p" ] || { echo "device-kit: $l not found here (sh tools/install-deps.sh)" >&2; exit 1; }
	cp -L "$p" "$K/lib/"
done
W=${WHEELS:-$K/.wheels}
if ! ls "$W"/cffi-*.whl >/dev/null 2>&1; then
	python3 -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 \
		--python-version 3.12 --implementation cp cffi pycparser -d "$W" ||
		{ echo "device-kit: cannot download the cffi wheels (set WHEELS=DIR)" >&2; exit 1; }
fi
for w in "$W"/cffi-*.whl "$W"/pycparser-*.whl; do
	python3 -m zipfile -e "$w" "$K/py"
done
[ "$W" = "$K/.wheels" ] && rm -rf "$W"
tree=$(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
kit=$(du -sb "$K" | cut -f1)
echo "device-kit: $K is $kit bytes; with the tree ($tree) $((tree + kit)) of 67108864"
[ $((tree + kit)) -le 67108864 ] || echo "device-kit: over the cap: NO_BENCH=1 or NO_TEST_GPU=1" >&2
