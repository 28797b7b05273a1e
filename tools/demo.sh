#!/bin/sh
# make demo: radianced serving the shipped int4 checkpoint to two client
# processes at once, each checking every layer against the CPU reference and
# the original fp32 outputs, then the latency of a small request, the
# daemon's stats, the all-MiniLM-L6-v2 engine (examples/engine, Python) in two
# worker processes against the fp32 model's sentence embeddings, and a clean
# SIGTERM shutdown. Exits non-zero if any check fails.
#
# Env: BUILD (build dir, default build), RADIANCE_BACKEND (--backend for the
# daemon; default cpu for the CPU-only build in build/, auto for any other
# build dir, e.g. build-cuda: the GPU when it has one; the reference is
# always the CPU), RADIANCE_TEST_DATA (default tests/data), DEMO_ITERS
# (latency iterations, default 2000), DEMO_WORKERS (engine workers, default
# 2). The engine's Python venv is $BUILD/pyenv (tools/pyenv.sh builds it).
set -u
BUILD=${BUILD:-build}
DATA=${RADIANCE_TEST_DATA:-tests/data}
if [ "$BUILD" = build ]; then
	BACKEND=${RADIANCE_BACKEND:-cpu}
else
	BACKEND=${RADIANCE_BACKEND:-auto}
fi
ITERS=${DEMO_ITERS:-2000}
RADIANCED=$BUILD/radianced
CTL=$BUILD/radiancectl
CLIENT=$BUILD/tools/radiance-demo-client

for f in "$RADIANCED" "$CTL" "$CLIENT"; do
	[ -x "$f" ] || { echo "demo: $f is missing (run make BUILD=$BUILD first)" >&2; exit 2; }
done
[ -f "$DATA/minilm-w4g128/model.safetensors" ] || {
	echo "demo: no checkpoint in $DATA/minilm-w4g128" >&2; exit 2; }

tmp=$(mktemp -d /tmp/radiance-demo.XXXXXX)
sock=$tmp/radiance.sock
pid=
failures=0
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

check() {   # name status
	if [ "$2" = 0 ]; then
		echo "  ok    $1"
	else
		echo "  FAIL  $1 (exit $2)"
		failures=$((failures + 1))
	fi
}

section() {
	echo
	echo "== $*"
}

section "starting radianced --backend $BACKEND on $sock"
"$RADIANCED" --no-config --socket "$sock" --backend "$BACKEND" --log-level warn \
	>"$tmp/radianced.log" 2>&1 &
pid=$!
i=0
until "$CTL" --socket "$sock" status >/dev/null 2>&1; do
	i=$((i + 1))
	if [ $i -gt 200 ] || ! kill -0 "$pid" 2>/dev/null; then
		echo "demo: radianced did not come up:" >&2
		cat "$tmp/radianced.log" >&2
		exit 1
	fi
	sleep 0.05
done
"$CTL" --socket "$sock" status
served=$("$CTL" --socket "$sock" --json status | sed -n 's/^ *"backend": "\(.*\)",*$/\1/p')
if [ "$served" = cpu ]; then
	expect="bit-exact"
else
	expect="within the bf16 floor (one bf16 rounding)"
fi

section "two clients at once: A loads $DATA/minilm-w4g128 (its fds), B attaches by name"
"$CLIENT" --socket "$sock" --data "$DATA" --label A --iters "$ITERS" >"$tmp/A.out" 2>&1 &
a=$!
"$CLIENT" --socket "$sock" --data "$DATA" --label B --attach --brief --iters "$ITERS" \
	>"$tmp/B.out" 2>&1 &
b=$!
# while they run (once both hold it): one model, resident once, two users
i=0
while [ $i -lt 300 ] && ! "$CTL" --socket "$sock" --json models | grep -q '"users": 2'; do
	i=$((i + 1))
	sleep 0.02
done
echo "radiancectl models, while A and B run:"
"$CTL" --socket "$sock" models
wait $a; ra=$?
wait $b; rb=$?
echo
echo "Every layer of the checkpoint on its captured activations (A's table; B ran the same"
echo "requests at the same time and prints only its summary). \"vs CPU ref\" checks the daemon"
echo "path (socket, rings, arena offsets, merging of both clients' requests) against the CPU"
echo "kernel run in the client itself: bit-exact expected on the CPU backend, within the bf16"
echo "floor on a GPU backend; this daemon runs $served, so: $expect."
echo "\"rel err vs fp32\" is what W4A8 itself costs against the original fp32 model (docs/accuracy.md)."
echo
cat "$tmp/A.out"
echo
cat "$tmp/B.out"

section "latency alone (no other client): M=1, 384x384"
"$CLIENT" --socket "$sock" --data "$DATA" --label solo --latency-only --iters "$ITERS" \
	>"$tmp/solo.out" 2>&1
rs=$?
cat "$tmp/solo.out"

section "radiancectl stats"
"$CTL" --socket "$sock" stats
rst=$?

WORKERS=${DEMO_WORKERS:-2}
section "sentence embeddings: examples/engine/run.py, $WORKERS worker processes (Python)"
echo "The all-MiniLM-L6-v2 encoder in numpy over the radiance Python package: every linear"
echo "layer from this daemon, the rest (embeddings, attention, GELU, LayerNorm, pooling) in"
echo "each worker; compared with the fp32 model's embeddings (docs/accuracy.md)."
echo
venv=$BUILD/pyenv
if sh tools/pyenv.sh "$venv"; then
	PYTHONPATH=python RADIANCE_LIBRARY=$BUILD/libradiance.so.0 "$venv/bin/python" \
		examples/engine/run.py --socket "$sock" --workers "$WORKERS" --data "$DATA" \
		--daemon-pid "$pid"
	reng=$?
else
	echo "demo: tools/pyenv.sh could not build $venv (PyPI is needed once)" >&2
	reng=1
fi

section "stopping radianced with SIGTERM"
kill -TERM "$pid"
wait "$pid"
rd=$?
pid=
[ -e "$sock" ] && sock_left=1 || sock_left=0
if [ -s "$tmp/radianced.log" ]; then
	echo "daemon log (warnings and errors):"
	sed 's/^/  /' "$tmp/radianced.log"
fi

section "checks (backend that served: $served)"
check "client A: every layer $expect against the CPU reference" $ra
check "client B: every layer $expect against the CPU reference" $rb
check "solo latency run" $rs
check "radiancectl stats" $rst
check "engine: $WORKERS workers, embeddings within the bounds against fp32" $reng
check "radianced exited 0 on SIGTERM" $rd
check "radianced removed its socket" $sock_left
echo
if [ $failures = 0 ]; then
	echo "demo: all checks passed"
else
	echo "demo: $failures check(s) FAILED"
	exit 1
fi
