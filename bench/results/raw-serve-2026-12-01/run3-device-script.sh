#!/bin/sh
# device call: test_gpu, then bench_serve (27b) three ways
set -u
D=.devwork/serve
R=$OUT/r
mkdir -p "$R"
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
lib=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ $site -maxdepth 5 -name 'libcublas.so.13*' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$D/lib:${lib:+$(dirname "$lib"):}${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$R/gpu.txt" 2>&1
t0=$(date +%s)
RADIANCE_TEST_DATA=tests/data timeout 100 "$D/b/tests/test_gpu" > "$R/test_gpu.log" 2>&1
echo "test_gpu exit $? ($(($(date +%s) - t0)) s)"
grep -E 'PASSED|FAILED|OK \]|FAIL' "$R/test_gpu.log" | tail -12
CK=/dev/shm/serve-ckpt
mkdir -p $CK
$D/b/bench/bench_serve gen $CK 27b 16
export BUILD=$D/b CKPT=$CK
timeout ${T1:-150} sh $D/serve_run.sh 27b "$R/serve" ${ARGS1:-} > "$R/serve.log" 2>&1
echo "serve exit $? ($(($(date +%s) - t0)) s)"
cat "$R/serve.log"
DAEMON_ARGS="--sched-chunk-rows 128" timeout 40 sh $D/serve_run.sh 27b "$R/serve-chunk128" --cases d --label chunk128 > "$R/serve-chunk128.log" 2>&1
echo "chunk128 exit $? ($(($(date +%s) - t0)) s)"
grep -E '^(d|bench_serve)' "$R/serve-chunk128.log"
DAEMON_ARGS="--zero-copy-rows 0" timeout 60 sh $D/serve_run.sh 27b "$R/serve-copies" --cases a --label copies --calls 100 --ms 1,4,16,64,256 > "$R/serve-copies.log" 2>&1
echo "copies exit $? ($(($(date +%s) - t0)) s)"
grep -E '^(a|c|bench_serve)' "$R/serve-copies.log"
rm -rf $CK
cd "$OUT" && tar czf r.tgz r && rm -rf r
