#!/bin/sh
# The CPU benchmark and its peers in one run (docs/cpu.md):
#   sh bench/run_cpu.sh [BUILD]   -> bench/results/cpu-<date>.csv and .md
# bench_cpu at threads 1 and 2 (the scalar reference as a peer at M <= 4),
# then the numpy/OpenBLAS peer in a venv of its own (PyPI: numpy,
# threadpoolctl), with OpenBLAS left to pick its own kernel, and torch's
# F.linear where that python has torch.
#   PEERS_PYTHON=python  a python with numpy and threadpoolctl (and torch for
#                        the torch peers: bench/requirements-engine.txt) to
#                        use instead of the venv
#   OUT=prefix           results prefix (default bench/results/cpu-<date>)
set -eu
BUILD=${1:-build}
make -s "$BUILD/bench/bench_cpu"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load=$(uptime)
for t in 1 2; do
	"$BUILD/bench/bench_cpu" --threads "$t" --reference --header > "$tmp/t$t.csv"
done
out=${OUT:-bench/results/cpu-$(date -u +%F)}
py=${PEERS_PYTHON:-}
if [ -z "$py" ]; then
	venv=$BUILD/benchenv
	if [ ! -x "$venv/bin/python" ] || ! cmp -s bench/requirements-cpu.txt "$venv/requirements.txt"; then
		python3 -m venv "$venv" && "$venv/bin/pip" install -q -r bench/requirements-cpu.txt &&
			cp bench/requirements-cpu.txt "$venv/requirements.txt"
	fi
	py=$venv/bin/python
fi
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS \
	"$py" bench/cpu_peers.py "$tmp/t1.csv" "$tmp/t2.csv" --out "$out" --load "$load" \
		--machine "$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed "s/^ //"), $(nproc) CPUs"
echo "wrote $out.csv and .md"
