#!/bin/sh
# Makes build-kit/ (ignored, like every build-*/) from a GPU build folder: what
# one call on the GPU host needs, small enough to travel beside the tree (the
# device tool caps what travels at 64 MiB and the tree alone is ~46 MB, while
# the binaries are ~35 MB, so they travel gzip'd): the binaries stripped of
# debug info, libcmocka.so.0 and libprotobuf-c.so.1 (the H200 host has
# neither), the cffi and pycparser wheels for the host's Python 3.12 (it has
# torch, numpy, ml_dtypes and pytest, not cffi), and build-kit/unpack.sh. Run
# it here after
#   make GPU=cuda STATIC_DEPS=1
# and name build-kit in the call's carry. On the host:
#   . build-kit/unpack.sh        # into $KIT (default /tmp/kit); sets
#                                # LD_LIBRARY_PATH (with cuBLAS's folder),
#                                # PYTHONPATH, RADIANCE_BUILD, RADIANCED,
#                                # RADIANCECTL, RADIANCE_LIBRARY,
#                                # RADIANCE_GPU_LIBRARY, RADIANCE_TEST_DATA
#   $KIT/tests/test_gpu; $KIT/bench/bench_w4a8 --out $OUT ...
#   RADIANCE_TEST_BACKEND=gpu python3 -m pytest tests/python/test_torch_cuda.py
# Env: BUILD (build-cuda), NO_TEST_GPU=1 / NO_BENCH=1 leave those out, WHEELS
# (a folder of cffi/pycparser wheels; default: pip download them).
# Exit: 0, 1 when a binary is missing or the wheels cannot be had.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build-cuda}
K=build-kit
rm -rf "$K"
mkdir -p "$K/bin" "$K/wheels"
L="radianced radiancectl libradiance.so.0 libradiance-gpu.so.0 tools/radiance-numerics"
[ -n "${NO_TEST_GPU:-}" ] || L="$L tests/test_gpu tests/test_gpu_map"
[ -n "${NO_BENCH:-}" ] || L="$L bench/bench_serve bench/bench_w4a8"
for f in $L; do
	[ -f "$B/$f" ] || { echo "device-kit: $B/$f is missing (make GPU=cuda STATIC_DEPS=1)" >&2; exit 1; }
	mkdir -p "$K/bin/$(dirname "$f")"
	strip --strip-debug -o "$K/bin/$f" "$B/$f"
done
mkdir -p "$K/bin/lib"
for l in libcmocka.so.0 libprotobuf-c.so.1; do
	p=$(ldconfig -p | awk -v l="$l" '$1 == l { print $NF; exit }')
	[ -n "$p" ] || { echo "device-kit: $l not found here (sh tools/install-deps.sh)" >&2; exit 1; }
	cp -L "$p" "$K/bin/lib/"
done
tar -C "$K/bin" -czf "$K/bin.tar.gz" .
rm -rf "$K/bin"
W=${WHEELS:-}
if [ -z "$W" ]; then
	python3 -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 \
		--python-version 3.12 --implementation cp cffi pycparser -d "$K/wheels" ||
		{ echo "device-kit: cannot download the cffi wheels (set WHEELS=DIR)" >&2; exit 1; }
else
	cp "$W"/cffi-*.whl "$W"/pycparser-*.whl "$K/wheels/"
fi
cat >"$K/unpack.sh" <<'EOF'
# sourced on the GPU host from the repository root: . build-kit/unpack.sh
KIT=${KIT:-/tmp/kit}
mkdir -p "$KIT" && tar -C "$KIT" -xzf build-kit/bin.tar.gz
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$KIT/site" build-kit/wheels/*.whl
site=$("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
cublas=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ $site -maxdepth 5 \
	-name 'libcublas.so.13*' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$KIT/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$KIT/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export RADIANCE_BUILD=$KIT RADIANCED=$KIT/radianced RADIANCECTL=$KIT/radiancectl \
	RADIANCE_LIBRARY=$KIT/libradiance.so.0 RADIANCE_GPU_LIBRARY=$KIT/libradiance-gpu.so.0 \
	RADIANCE_TEST_DATA=$PWD/tests/data
EOF
tree=$(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)
kit=$(du -sb "$K" | cut -f1)
echo "device-kit: $K is $kit bytes; with the tree ($tree) $((tree + kit)) of 67108864"
[ $((tree + kit)) -le 67108864 ] || echo "device-kit: over the cap: NO_BENCH=1 or NO_TEST_GPU=1" >&2
