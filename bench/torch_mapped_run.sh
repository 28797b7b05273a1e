#!/bin/sh
# radiance.torch in mapped mode on a GPU host, in one call (docs/mapped.md,
# "PyTorch"), from a build folder made elsewhere (make GPU=cuda STATIC_DEPS=1:
# radianced, libradiance.so.0, libradiance-gpu.so.0; libprotobuf-c.so.1 in
# $B/lib where the host lacks it), with a python3 that has torch (CUDA),
# numpy, ml_dtypes, tokenizers and pytest, and cffi/pycparser wheels in
# $WHL when it lacks cffi:
#   1. the MiniLM engine (examples/engine/run.py) against a GPU daemon that
#      holds tests/data/minilm-w4g128: --device cuda (torch on the GPU, every
#      linear mapped) with 2 worker processes, nvidia-smi's per-process device
#      memory sampled meanwhile; then --device cpu (numpy, the rings) on the
#      same daemon for comparison; bench/torch_mapped.py (per-call cost of
#      RadianceLinear: mapped eager, mapped from a CUDA graph, the rings);
#   2. pytest tests/python/test_torch_cuda.py test_torch.py test_mapped.py
#      (the torch tests; RADIANCE_TEST_BACKEND=gpu).
# Files in $OUT: engine-cuda.txt engine-cuda.json engine-cpu.txt bench.txt
# bench.csv smi.txt daemon.log pytest.txt summary.txt.
#   BUILD=dir (default build-cuda) WHL=dir (default: none) PYTHON=python3
#   RADIANCE_TEST_DATA=dir (default tests/data) SKIP_PYTEST=1 SKIP_ENGINE=1
set -u
OUT=${OUT:-device-out}
B=${BUILD:-build-cuda}
PY=${PYTHON:-python3}
DATA=${RADIANCE_TEST_DATA:-tests/data}
mkdir -p "$OUT"
S="$OUT/summary.txt"
if [ -n "${WHL:-}" ]; then
	$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
		--target /tmp/radiance-site "$WHL"/*.whl || exit 1
	export PYTHONPATH="/tmp/radiance-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
site=$($PY -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
lib=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/x86_64-linux/lib/ $site -maxdepth 5 \
	-name 'libcublas.so.13*' 2>/dev/null | head -n 1)
export LD_LIBRARY_PATH="$B/lib:${lib:+$(dirname "$lib"):}${LD_LIBRARY_PATH:-}"
export RADIANCE_BUILD=$B RADIANCED=$B/radianced RADIANCE_LIBRARY=$B/libradiance.so.0 \
	RADIANCE_GPU_LIBRARY=$B/libradiance-gpu.so.0 RADIANCE_TEST_DATA=$DATA RADIANCE_TEST_BACKEND=gpu
{
	nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
	$PY -c 'import torch, cffi; print("torch", torch.__version__, "cuda", torch.version.cuda, "cffi", cffi.__version__)'
} 2>&1 | tee "$S"

if [ -z "${SKIP_ENGINE:-}" ]; then
	T=$(mktemp -d /tmp/radiance-torch.XXXXXX)
	SOCK=$T/r.sock
	"$B/radianced" --no-config --backend gpu --socket "$SOCK" --log-level info \
		>"$OUT/daemon.log" 2>&1 &
	DPID=$!
	for i in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
	( while kill -0 "$DPID" 2>/dev/null; do
		date +%T.%N | cut -c1-12
		nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
		sleep 0.5
	done ) >"$OUT/smi.txt" 2>&1 &
	SMI=$!
	timeout 90 $PY examples/engine/run.py --device cuda --socket "$SOCK" --workers 2 \
		--data "$DATA" --json "$OUT/engine-cuda.json" >"$OUT/engine-cuda.txt" 2>&1
	echo "engine --device cuda exit $?" | tee -a "$S"
	cat "$OUT/engine-cuda.txt" | tee -a "$S"
	timeout 60 $PY examples/engine/run.py --device cpu --socket "$SOCK" --workers 2 \
		--data "$DATA" >"$OUT/engine-cpu.txt" 2>&1
	echo "engine --device cpu (rings) exit $?" | tee -a "$S"
	cat "$OUT/engine-cpu.txt" | tee -a "$S"
	timeout 60 $PY bench/torch_mapped.py "$SOCK" "$DATA/minilm-w4g128" --csv "$OUT/bench.csv" \
		>"$OUT/bench.txt" 2>&1
	echo "bench/torch_mapped.py exit $?" | tee -a "$S"
	cat "$OUT/bench.txt" | tee -a "$S"
	kill "$DPID"
	wait "$DPID"
	echo "daemon exit $?" | tee -a "$S"
	kill "$SMI" 2>/dev/null
	echo "largest per-process device memory seen (MiB, nvidia-smi):" | tee -a "$S"
	grep -v '^[0-9][0-9]:' "$OUT/smi.txt" | awk -F', ' '{ sub(/ MiB/, "", $3);
		if ($3 + 0 > m[$1 " " $2]) m[$1 " " $2] = $3 + 0 }
		END { for (k in m) print "  " k ": " m[k] }' | tee -a "$S"
	grep -E 'maps model|mappable|VMM|error|warn' "$OUT/daemon.log" | head -20 | tee -a "$S"
	rm -rf "$T"
fi

if [ -z "${SKIP_PYTEST:-}" ]; then
	timeout 140 $PY -m pytest -p no:cacheprovider -q -rs --durations=8 \
		tests/python/test_torch_cuda.py tests/python/test_torch.py tests/python/test_mapped.py \
		>"$OUT/pytest.txt" 2>&1
	echo "pytest exit $?" | tee -a "$S"
	tail -n 40 "$OUT/pytest.txt" | tee -a "$S"
fi
