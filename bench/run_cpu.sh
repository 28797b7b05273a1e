#!/bin/sh
# The CPU benchmark and its peers in one run (docs/cpu.md):
#   sh bench/run_cpu.sh [BUILD]   -> bench/results/cpu-<date>.csv and .md
# bench_cpu at threads 1 and 2 (the scalar reference as a peer at M <= 4),
# then the numpy/OpenBLAS peer in a venv of its own (PyPI: numpy,
# threadpoolctl), with OpenBLAS left to pick its own kernel.
set -eu
BUILD=${1:-build}
make -s "$BUILD/bench/bench_cpu"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load=$(uptime)
for t in 1 2; do
	"$BUILD/bench/bench_cpu" --threads "$t" --reference --header > "$tmp/t$t.csv"
done
venv=$BUILD/benchenv
if [ ! -x "$venv/bin/python" ] || ! cmp -s bench/requirements-cpu.txt "$venv/requirements.txt"; then
	python3 -m venv "$venv" && "$venv/bin/pip" install -q -r bench/requirements-cpu.txt &&
		cp bench/requirements-cpu.txt "$venv/requirements.txt"
fi
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS \
	"$venv/bin/python" bench/cpu_peers.py "$tmp/t1.csv" "$tmp/t2.csv" \
	--out "bench/results/cpu-$(date -u +%F)" --load "$load"
echo "wrote bench/results/cpu-$(date -u +%F).csv and .md"
