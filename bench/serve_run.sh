#!/bin/sh
# The service benchmark (bench/bench_serve.c) against a daemon of this
# build: writes the synthetic checkpoint, starts radianced on it, runs
# bench_serve once, stops the daemon.
#   serve_run.sh SET OUT [bench_serve run options...]
# SET: 27b (16 blocks, 3.8 GB, on the GPU backend) or minilm (2 blocks, cpu).
# Env: BUILD (build), BACKEND (gpu for 27b, cpu for minilm), BLOCKS,
#      CKPT (a checkpoint bench_serve gen wrote already: not written again),
#      DAEMON_ARGS (more radianced options; not one given here already,
#      --backend, --max-rows, ...: radianced refuses an option given twice),
#      WORK (where the checkpoint and socket go: a fresh directory under
#      /dev/shm, else TMPDIR).
# Exit: bench_serve's status (1 when a result was wrong), 1 when the daemon
# did not start.
set -u
SET=$1
OUT=$2
shift 2
B=${BUILD:-build}
case $SET in
27b) BACKEND=${BACKEND:-gpu}; MAXR=2048; MAXK=17408; MAXN=34816 ;;
*) BACKEND=${BACKEND:-cpu}; MAXR=512; MAXK=1536; MAXN=1536 ;;
esac
base=/dev/shm
[ -d /dev/shm ] && [ -w /dev/shm ] || base=${TMPDIR:-/tmp}
WORK=${WORK:-$(mktemp -d "$base/radiance-serve.XXXXXX")}
CK=${CKPT:-$WORK/ckpt}
mkdir -p "$CK"
daemon=""
cleanup() {
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
[ -n "${CKPT:-}" ] || "$B/bench/bench_serve" gen "$CK" "$SET" ${BLOCKS:-} || exit 1
# shellcheck disable=SC2086
"$B/radianced" --no-config --socket "$WORK/sock" --backend "$BACKEND" --log-level info \
	--max-rows $MAXR --max-k $MAXK --max-n $MAXN ${DAEMON_ARGS:-} >"$WORK/daemon.log" 2>&1 &
daemon=$!
i=0
while [ ! -S "$WORK/sock" ]; do
	i=$((i + 1))
	if [ $i -gt 300 ] || ! kill -0 "$daemon" 2>/dev/null; then
		echo "serve_run: radianced did not start:"
		cat "$WORK/daemon.log"
		exit 1
	fi
	sleep 0.1
done
"$B/bench/bench_serve" run "$WORK/sock" "$CK" "$SET" "$OUT" \
	--note "radianced --backend $BACKEND --max-rows $MAXR ${DAEMON_ARGS:-}" "$@"
rc=$?
kill "$daemon" 2>/dev/null
wait "$daemon" 2>/dev/null
daemon=""
grep -E 'warn|error|numerics gate' "$WORK/daemon.log" | head -20
exit $rc
