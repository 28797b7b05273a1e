#!/bin/bash
# GPU chaos runs on the GPU host, from build-kit/ (tools/device-kit.sh):
#   bash bench/chaos_device.sh SEED...
# Each seed is one `tests/chaos.py --backend gpu` run of CLIENTS (1000)
# killers; its output, report and the daemon's log go into $OUT/chaos.tgz
# (the device tool brings back only a few files per call), one summary line
# per run (and the daemon's slow-driver warnings) to stdout.
# Env: OUT (chaos-out), CLIENTS, CHAOS_ARGS (more chaos.py options, e.g.
# --eager-modules), RUN_TIMEOUT (seconds per run, 120).
# Exit: 0 when every run passed, 1 otherwise.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-chaos-out}
. build-kit/unpack.sh
R=$(mktemp -d)/chaos
mkdir -p "$R" "$OUT"
rc=0
for s in "$@"; do
	# shellcheck disable=SC2086
	timeout "${RUN_TIMEOUT:-120}" python3 tests/chaos.py --backend gpu \
		--clients "${CLIENTS:-1000}" --seed "$s" ${CHAOS_ARGS:-} --json "$R/chaos-$s.json" \
		--daemon-log "$R/chaos-daemon-$s.log" >"$R/chaos-$s.txt" 2>&1 || rc=1
	echo "seed $s: $(grep -E '^chaos: (PASS|FAIL)' "$R/chaos-$s.txt" || tail -n 1 "$R/chaos-$s.txt")"
	grep -E 'VIOLATION' "$R/chaos-$s.txt" | head -n 3
	grep -hE 'upload took|piece took|allocating model' "$R/chaos-daemon-$s.log" 2>/dev/null | head -n 3
done
tar czf "$OUT/chaos.tgz" -C "$(dirname "$R")" chaos
exit $rc
