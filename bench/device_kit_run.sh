#!/bin/bash
# One device call from build-kit/ (tools/device-kit.sh; name build-kit in the
# call's carry), in the order issue 12 needs its answers, each step skipped
# once less than 20 s of BUDGET is left (a call may run 600 s; starting the
# machine counts too):
#   1. bench/peers.py, then bench_w4a8 --peers (the results table with its
#      Targets section; both decode kernels forced at M = 17..64);
#   2. test_gpu's test_w4a8_* (every path, the forced 32/64-token launches);
#   3. bench_w4a8 --sweep at M = 32 and 64 (the streaming kernel's launch
#      shapes against the kernels the policy picks there);
#   4. pytest tests/python/test_torch_cuda.py; test_gpu_map;
#   5. the rest of test_gpu, one filter at a time.
# Output under $OUT: gpu.txt, peers.{csv,log}, bench.log, w4a8-DATE.{md,csv},
# test_gpu_*.txt, sweep/, sweep64/, pytest.txt, test_gpu_map.txt. Each step
# prints "STEP name rc=N secs".
# Env: OUT (device-out), BUDGET (seconds, 570), PYTHON (the host's torch
# python: /opt/torch/.venv/bin/python3 where it exists).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - T0) )); }
step() {   # step NAME TIMEOUT CMD...: skipped when less time is left than asked
	local name=$1 t=$2; shift 2
	local l=$(left)
	if [ "$l" -lt 20 ]; then echo "SKIP $name (no time)"; return; fi
	[ "$t" -gt "$l" ] && t=$l
	local s=$(date +%s)
	timeout "$t" "$@"; local rc=$?
	echo "STEP $name rc=$rc $(( $(date +%s) - s ))s"
}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}; [ -x "$PYTHON" ] || PYTHON=python3
export PYTHON
. build-kit/unpack.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; date -u; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
G=$KIT/tests/test_gpu
step peers 120 $PYTHON bench/peers.py $OUT/peers.csv > $OUT/peers.log 2>&1
step bench 200 $KIT/bench/bench_w4a8 --peers $OUT/peers.csv --out $OUT > $OUT/bench.log 2>&1
grep -E "STEP|M=(16|32|64) |forced\)" $OUT/bench.log | head -30
RADIANCE_TEST_FILTER='test_w4a8_*' step w4a8 150 $G > $OUT/test_gpu_w4a8.txt 2>&1
tail -n 4 $OUT/test_gpu_w4a8.txt; grep -E "FAILED|ERROR" $OUT/test_gpu_w4a8.txt | head -5
mkdir -p $OUT/sweep $OUT/sweep64
step sweep32 60 $KIT/bench/bench_w4a8 --sweep --m 32 --out $OUT/sweep > $OUT/sweep/sweep.log 2>&1
step sweep64 60 $KIT/bench/bench_w4a8 --sweep --m 64 --out $OUT/sweep64 > $OUT/sweep64/sweep.log 2>&1
grep -h SWEEP $OUT/sweep/sweep.log $OUT/sweep64/sweep.log
RADIANCE_TEST_BACKEND=gpu step pytest 100 $PYTHON -m pytest -q -p no:cacheprovider tests/python/test_torch_cuda.py > $OUT/pytest.txt 2>&1
tail -n 2 $OUT/pytest.txt
step gpu_map 60 $KIT/tests/test_gpu_map > $OUT/test_gpu_map.txt 2>&1
tail -n 3 $OUT/test_gpu_map.txt
for f in 'test_quant_*' test_layer_chain test_fused_quant 'test_backend_*' test_checkpoint_layers; do
	RADIANCE_TEST_FILTER="$f" step "gpu:$f" 200 $G >> $OUT/test_gpu_rest.txt 2>&1
done
grep -E "^\[  (PASSED|FAILED)|^\[==========\] .* ran|STEP" $OUT/test_gpu_rest.txt
grep -A30 "^## Targets" $OUT/w4a8-*.md | head -34
echo "total $(( $(date +%s) - T0 ))s"
