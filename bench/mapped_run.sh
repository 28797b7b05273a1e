#!/bin/sh
# The mapped-weights evidence in one call on the GPU host (docs/mapped.md),
# from a build folder made elsewhere (make GPU=cuda STATIC_DEPS=1, libcmocka.so.0
# copied into $B/lib, as for bench/device_run.sh):
#   1. tests/test_gpu_map (every kernel path on mapped memory against the CPU
#      reference, bit-identical to the rings, CUDA graph, read-only, IPC) and
#      tests/test_gpu (the backend, which now allocates through the share);
#   2. a synthetic checkpoint of the 27B shapes (bench_mapped gen, BLOCKS
#      blocks) in /dev/shm, a GPU daemon that loads it, bench_mapped run:
#      per-call and 64-layer decode-step times, in-process vs mapped vs rings;
#   3. memory: nvidia-smi with the daemon alone, with 4 engine processes that
#      map the model, with 4 that each hold a private copy;
#   4. rwprobe: can a mapping session change the weights others use?
# Files in $OUT: test_gpu_map.log test_gpu.log bench.log mapped.csv mem.txt
# daemon.log summary.txt. SKIP_TESTS=1, SKIP_TEST_GPU=1, SKIP_RUN=1, SKIP_MEM=1, COPYPROBE=1, BLOCKS=16.
set -u
OUT=${OUT:-device-out}
B=${BUILD:-build-cuda}
BLOCKS=${BLOCKS:-16}
mkdir -p "$OUT"
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
lib=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ $site -maxdepth 5 \
	-name 'libcublas.so.13*' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$B/lib:${lib:+$(dirname "$lib"):}${LD_LIBRARY_PATH:-}"
DATA=${RADIANCE_TEST_DATA:-tests/data}
export RADIANCED=$B/radianced RADIANCECTL=$B/radiancectl RADIANCE_TEST_DATA=$DATA
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee "$S"
smi() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1; }

if [ -z "${SKIP_TESTS:-}" ]; then
	timeout 240 "$B/tests/test_gpu_map" >"$OUT/test_gpu_map.log" 2>&1
	echo "test_gpu_map exit $?" | tee -a "$S"
	grep -E '^# |PASSED|FAILED|FAIL' "$OUT/test_gpu_map.log" | head -40 | tee -a "$S"
	if [ -z "${SKIP_TEST_GPU:-}" ]; then
		timeout 240 "$B/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1
		echo "test_gpu exit $?" | tee -a "$S"
		grep -E 'PASSED|FAILED|FAIL|checkpoint:' "$OUT/test_gpu.log" | head -20 | tee -a "$S"
	fi
fi

T=$(mktemp -d /dev/shm/radiance-mapped.XXXXXX)
D=$T/synthetic-27b
mkdir -p "$D"
"$B/bench/bench_mapped" gen "$D" "$BLOCKS" 2>&1 | tee -a "$S"
SOCK=$T/r.sock
before=$(smi)
# preloaded: the model stays resident between the sessions below
"$B/radianced" --no-config --backend gpu --socket "$SOCK" --log-level info --preload "$D" \
	>"$OUT/daemon.log" 2>&1 &
DPID=$!
for i in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
if [ -z "${SKIP_RUN:-}" ]; then
	timeout 300 "$B/bench/bench_mapped" run "$SOCK" "$D" "$OUT/mapped" >"$OUT/bench.log" 2>&1
	echo "bench run exit $?" | tee -a "$S"
	cat "$OUT/bench.log" | tee -a "$S"
fi

# memory: the daemon holds the model (preloaded); SKIP_MEM=1 skips this
[ -z "${SKIP_MEM:-}" ] && {
	echo "device memory used (MiB, nvidia-smi) before the daemon: $before"
	echo "daemon alone (the model resident, its scratch and context): $(smi) MiB used"
	for how in mapped private; do
		pids=""
		for i in 1 2 3 4; do
			"$B/bench/bench_mapped" hold "$SOCK" "$D" $how 120 >"$T/hold-$how-$i.log" 2>&1 &
			pids="$pids $!"
		done
		for i in $(seq 600); do
			[ "$(cat "$T"/hold-$how-*.log 2>/dev/null | grep -c '^ready')" -ge 4 ] && break
			sleep 0.1
		done
		echo "with 4 $how engine processes ready: $(smi) MiB used"
		cat "$T"/hold-$how-*.log | grep -E 'ready|error|bench_mapped:' 
		nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
		kill $pids 2>/dev/null
		wait $pids 2>/dev/null
		sleep 1
		echo "after they were killed: $(smi) MiB used"
	done
	echo "daemon alone again: $(smi) MiB used"
} >"$OUT/mem.txt" 2>&1
[ -f "$OUT/mem.txt" ] && cat "$OUT/mem.txt" | tee -a "$S"

[ -n "${COPYPROBE:-}" ] && timeout 60 "$B/bench/bench_mapped" copyprobe "$SOCK" 2>&1 | tee -a "$S"
timeout 60 "$B/bench/bench_mapped" rwprobe "$SOCK" "$DATA/minilm-w4g128" 2>&1 | tee -a "$S"
kill "$DPID"
wait "$DPID"
echo "daemon exit $?" | tee -a "$S"
grep -E 'mappable|VMM|IPC|maps model|error|warn' "$OUT/daemon.log" | head -20 | tee -a "$S"
rm -rf "$T"
