#!/bin/sh
# One call on the GPU host: the GPU tests, the torch peers and the benchmark,
# from a build folder made elsewhere: make GPU=cuda STATIC_DEPS=1, with
# libcmocka.so.0 copied into build-cuda/lib (the H200 host has none).
# Logs and results go to $OUT (default device-out); at most 7 files.
#   QUICK=--quick  only M in {1, 16, 2048}
#   SKIP_TESTS=1 / SKIP_BENCH=1 / SKIP_PEERS=1
#   BENCH_ARGS=...  extra bench_w4a8 arguments (e.g. --variants)
#   DEMO=1         then tools/demo.sh on the daemon of this build (demo.log),
#                  with the numerics gate on (RADIANCE_NUMERICS_GATE=1)
#   NCU="--n 16384 --m 1"  also profile that one configuration with Nsight
#                   Compute (SpeedOfLight, occupancy, warp stalls) into ncu.txt
set -u
OUT=${OUT:-device-out}
B=${BUILD:-build-cuda}
QUICK=${QUICK:-}
mkdir -p "$OUT"
# libcublas.so.13: the toolkit's, else the one PyTorch's wheels ship
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
lib=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ $site -maxdepth 5 \
	-name 'libcublas.so.13*' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$B/lib:${lib:+$(dirname "$lib"):}${LD_LIBRARY_PATH:-}"
echo "device_run: libcublas from ${lib:-nowhere}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
	--format=csv 2>&1 | tee "$OUT/gpu.txt"
if command -v cuobjdump >/dev/null; then
	for o in "$B"/obj/kernels/w4a8_*.gpu.o; do
		[ -f "$o" ] && echo "$(basename "$o"): $(cuobjdump --dump-sass "$o" | grep -cE 'QGMMA|HGMMA') gmma," \
			"$(cuobjdump --dump-sass "$o" | grep -c 'HMMA') hmma, $(cuobjdump --dump-sass "$o" | grep -cE 'LDL|STL') local ld/st"
	done | tee -a "$OUT/gpu.txt"
fi
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
	RADIANCE_TEST_DATA=${RADIANCE_TEST_DATA:-tests/data} timeout "${TEST_TIMEOUT:-400}" "$B/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1
	trc=$?
	grep -vE '^\[ (RUN|      OK) ' "$OUT/test_gpu.log" | tail -n 60
	echo "test_gpu exit $trc"
	[ $trc = 0 ] || rc=1
fi
if [ -z "${SKIP_PEERS:-}" ]; then
	PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers.py "$OUT/peers.csv" $QUICK >"$OUT/peers.log" 2>&1
	echo "peers exit $? ($(grep -c , "$OUT/peers.csv" 2>/dev/null) lines)"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
	timeout 400 "$B/bench/bench_w4a8" $QUICK ${BENCH_ARGS:-} --peers "$OUT/peers.csv" --out "$OUT" \
		>"$OUT/bench.log" 2>&1
	echo "bench exit $?"
	cat "$OUT/bench.log"
fi
if [ -n "${DEMO:-}" ]; then
	RADIANCE_NUMERICS_GATE=1 BUILD="$B" timeout 300 sh tools/demo.sh >"$OUT/demo.log" 2>&1
	drc=$?
	grep -E '^(==|  ok|  FAIL|demo:)|numerics gate' "$OUT/demo.log" | head -60
	echo "demo exit $drc"
	[ $drc = 0 ] || rc=1
fi
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "${NCU:-}" ] && [ -z "$ncu_bin" ] && echo "device_run: no ncu on this host"
if [ -n "${NCU:-}" ] && [ -n "$ncu_bin" ]; then
	mkdir -p /tmp/ncu-out
	echo "$NCU" | tr ';' '\n' | while read -r cfg; do
		timeout 200 "$ncu_bin" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
			--section WarpStateStats --section MemoryWorkloadAnalysis -k 'regex:rad_w4a8_(gemv|mma|wgmma)' \
			-s 5 -c 1 "$B/bench/bench_w4a8" $cfg --out /tmp/ncu-out >>"$OUT/ncu.txt" 2>&1
	done
	grep -E 'rad_w4a8|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Warp|L2 Hit|L1/TEX Hit|One or More' "$OUT/ncu.txt" | head -80
fi
exit $rc
