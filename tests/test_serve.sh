#!/bin/sh
# The service benchmark on the cpu backend, small (MiniLM shapes, a few
# calls), so that it cannot rot: bench/serve_run.sh runs every case; its
# results are checked by bench_serve itself (the daemon's outputs against
# the in-process backend's and the reference kernel's, exit 1 when wrong),
# and here the CSV's form: the header exactly, every row's field count,
# numeric fields numeric, and each case present. No timing is asserted.
# Env: BUILD (default build).
set -u
BUILD=${RADIANCE_BUILD:-${BUILD:-build}}
. "$(dirname "$0")/script_lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

BUILD=$BUILD sh bench/serve_run.sh minilm "$tmp/serve" --calls 6 --warm 2 --ms 1,4,16,64 \
	--step-reps 2 --iters 10 --decode-calls 10 --prefill-m 64 >"$tmp/log" 2>&1
rc=$?
show "$tmp/log"
if [ $rc = 0 ]; then ok "bench_serve ran every case, results correct"; else bad "bench_serve exit $rc"; fi

csv=$tmp/serve.csv
hdr='date,gpu,case,shape,m,clients,inproc_us,daemon_p50_us,daemon_p99_us,requests_per_s,launches_per_request,daemon_queue_p50_us,daemon_exec_p50_us'
if [ -f "$csv" ] && [ "$(head -n 1 "$csv")" = "$hdr" ]; then ok "CSV header"; else bad "CSV header: $(head -n 1 "$csv" 2>&1)"; fi
[ -s "$csv" ] || bad "no CSV at $csv"
# 13 fields a row; m and clients whole numbers; the seven figures empty or numbers
badrows=$(tail -n +2 "$csv" 2>/dev/null | awk -F, '
	NF != 13 { print NR ": " NF " fields"; next }
	$5 !~ /^[0-9]+$/ || $6 !~ /^[0-9]+$/ { print NR ": m/clients"; next }
	{ for (i = 7; i <= 13; i++) if ($i != "" && $i !~ /^-?[0-9]+(\.[0-9]+)?$/) { print NR ": field " i " = " $i; next } }')
if [ -z "$badrows" ]; then ok "CSV rows well-formed"; else bad "CSV rows: $badrows"; fi
# the daemon's own account (queue, execution) is filled for cases a and c;
# each part of every call is within its round trip, so each median is
# within the round trip's median
qe=$(tail -n +2 "$csv" 2>/dev/null | awk -F, '($3 == "a" || $3 == "c") && ($12 == "" || $13 == "" || $12 > $8 + 0.01 || $13 > $8 + 0.01) { print NR }')
if [ -z "$qe" ]; then ok "queue and execution p50 each within the round trip p50"; else bad "queue/exec columns, rows: $qe"; fi
# case a: 3 shapes x 4 M; b: 1; c: 1, 2, 4, 8 clients; d: 4 rows
for want in "a:12" "b:1" "c:4" "d:4"; do
	c=${want%%:*} n=${want#*:}
	got=$(tail -n +2 "$csv" 2>/dev/null | awk -F, -v c="$c" 'substr($3, 1, 1) == c' | wc -l)
	if [ "$got" = "$n" ]; then ok "case $c: $got rows"; else bad "case $c: $got rows, want $n"; fi
done
# launches per request: counted, and at most 1 for one client's M=1
# requests (a request above sched_chunk_rows runs in several)
lpr=$(awk -F, '$3 == "a" && $5 == 1 { print $11 }' "$csv" 2>/dev/null | sort -n | tail -n 1)
if [ -n "$lpr" ] && awk -v v="$lpr" 'BEGIN { exit !(v > 0 && v <= 1) }'; then ok "launches/request $lpr"; else bad "launches/request '$lpr'"; fi
if grep -q '^| c 8 clients lockstep' "$tmp/serve.md" 2>/dev/null; then ok "targets table"; else bad "targets table"; fi

# gen makes DIR and its missing parents (mkdir -p, 0755 less the umask) and
# writes the checkpoint there; a file in the way is refused, named
gd=$tmp/gen/a/b/ckpt
if (umask 022 && "$BUILD/bench/bench_serve" gen "$gd" minilm 1) >"$tmp/gen.log" 2>&1 &&
	[ -s "$gd/config.json" ] && [ -s "$gd/model.safetensors" ]; then
	ok "gen into a directory that did not exist"
else
	bad "gen into a new directory: $(cat "$tmp/gen.log")"
fi
modes=$(stat -c %a "$tmp/gen" "$tmp/gen/a" "$tmp/gen/a/b" "$gd" 2>&1 | tr '\n' ' ')
if [ "$modes" = "755 755 755 755 " ]; then ok "gen's directories 0755"; else bad "gen's directories: $modes"; fi
: >"$tmp/file"
"$BUILD/bench/bench_serve" gen "$tmp/file/ckpt" minilm 1 >"$tmp/gen.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "cannot create the directory $tmp/file/ckpt: $tmp/file exists and is not a directory" "$tmp/gen.log"; then
	ok "gen under a file: refused, named"
else
	bad "gen under a file: exit $rc, $(cat "$tmp/gen.log")"
fi
script_done test_serve
