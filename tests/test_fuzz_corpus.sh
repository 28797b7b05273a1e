#!/bin/sh
# Replays the committed seed corpora through the fuzz targets built without
# libFuzzer ($BUILD/fuzz-replay/fuzz_<name>, tests/fuzz/replay.c), one
# process per input so a crash names its file. Runs in make check, under the
# sanitizers with SAN=address,undefined. docs/fuzzing.md has the details.
#
# Env: RADIANCE_BUILD (exported by tests/run.sh) or BUILD, default build;
#      FUZZ_CORPUS (default tests/fuzz/corpus).
# Output ends with "fuzz_corpus: N passed, N failed" (one per input).
set -u
BUILD=${RADIANCE_BUILD:-${BUILD:-build}}
CORPUS=${FUZZ_CORPUS:-tests/fuzz/corpus}
passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

for dir in "$CORPUS"/*/; do
	[ -d "$dir" ] || continue
	target=$(basename "$dir")
	bin=$BUILD/fuzz-replay/$target
	if [ ! -x "$bin" ]; then
		echo "FAIL: $target: $bin is missing (make all builds it)"
		failed=$((failed + 1))
		continue
	fi
	n=0
	for f in "$dir"*; do
		[ -f "$f" ] || continue
		n=$((n + 1))
		if timeout 60 "$bin" "$f" >"$log" 2>&1; then
			passed=$((passed + 1))
		else
			rc=$?
			failed=$((failed + 1))
			echo "FAIL: $target $f (exit $rc)"
			tail -n 30 "$log"
		fi
	done
	echo "$target: $n inputs replayed"
done

echo "fuzz_corpus: $passed passed, $failed failed"
[ "$failed" = 0 ]
