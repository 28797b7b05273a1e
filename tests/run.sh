#!/bin/sh
# radiance test runner: runs every test binary (cmocka), script and Python
# test, each isolated in its own process, and ends with one summary line
# "check: N passed, N failed" (counting individual test cases).
#
# Env: BUILD (build dir, default build), RADIANCE_TEST_DATA (default tests/data),
#      TESTS (space-separated subset of names, e.g. "test_ring test_numerics";
#      test_python is the pytest suite of tests/python/).
set -u
BUILD=${BUILD:-build}
export RADIANCE_TEST_DATA=${RADIANCE_TEST_DATA:-tests/data}
export RADIANCED=${RADIANCED:-$BUILD/radianced}
export RADIANCECTL=${RADIANCECTL:-$BUILD/radiancectl}
export RADIANCE_BUILD=$BUILD
passed=0
failed=0
skipped=0
failed_names=""
skipped_names=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT

want() {
	[ -z "${TESTS:-}" ] && return 0
	for w in $TESTS; do [ "$w" = "$1" ] && return 0; done
	return 1
}

count() {   # name rc: add cmocka's per-binary counts, or 1 for a plain test
	name=$1 rc=$2
	# cmocka's "[  PASSED  ] N test(s)." or our scripts' "name: N passed, N failed"
	p=$(sed -n -e 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' \
		-e 's/^[a-z_-]*: \([0-9]*\) passed, [0-9]* failed.*/\1/p' "$log" | tail -n 1)
	f=$(sed -n -e 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' \
		-e 's/^[a-z_-]*: [0-9]* passed, \([0-9]*\) failed.*/\1/p' "$log" | tail -n 1)
	if [ -n "$p" ] || [ -n "$f" ]; then
		passed=$((passed + ${p:-0}))
		failed=$((failed + ${f:-0}))
		# a crash after some passes still fails the binary
		if [ "$rc" != 0 ] && [ "${f:-0}" = 0 ]; then failed=$((failed + 1)); fi
	elif [ "$rc" = 0 ]; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
	fi
	if [ "$rc" != 0 ]; then
		failed_names="$failed_names $name"
		echo "FAIL: $name (exit $rc)"
	fi
	# cmocka's " N SKIPPED TEST(S)": neither passed nor failed, but said
	s=$(sed -n 's/^ *\([0-9]*\) SKIPPED TEST.*/\1/p' "$log" | tail -n 1)
	if [ -n "$s" ] && [ "$s" != 0 ]; then
		skipped=$((skipped + s))
		skipped_names="$skipped_names $name"
	fi
}

for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	name=$(basename "$t")
	want "$name" || continue
	echo "== $name"
	"$t" >"$log" 2>&1
	rc=$?
	cat "$log"
	count "$name" $rc
done

for t in tests/test_*.sh; do
	[ -f "$t" ] || continue
	name=$(basename "$t" .sh)
	want "$name" || continue
	echo "== $name"
	sh "$t" >"$log" 2>&1
	rc=$?
	cat "$log"
	count "$name" $rc
done

# Python tests check our numerics against independent implementations
# (ml_dtypes, numpy) from PyPI, and the Python package (tests/python/,
# pytest), in a venv of their own: the pins of tests/requirements.txt,
# (re)installed by tools/pyenv.sh when they change.
venv=$BUILD/pyenv
if want test_python || ls tests/test_*.py >/dev/null 2>&1; then
	sh tools/pyenv.sh "$venv" || echo "FAIL: tools/pyenv.sh could not build $venv"
fi
if ls tests/test_*.py >/dev/null 2>&1; then
	for t in tests/test_*.py; do
		name=$(basename "$t" .py)
		want "$name" || continue
		echo "== $name"
		"$venv/bin/python" "$t" >"$log" 2>&1
		rc=$?
		cat "$log"
		count "$name" $rc
	done
fi

# tests/python/: pytest against the working tree's python/ and a daemon of
# its own per module; its closing line ("N passed, N skipped in Ts", or
# "N failed, N passed ...") is counted here
# A sanitizer build's libradiance needs its runtime loaded before anything
# else in the (uninstrumented) interpreter: preload it; CPython's own
# allocations at exit are not leaks of ours.
san_rt=$(ldd "$BUILD/libradiance.so.0" 2>/dev/null |
	sed -n 's/.*=> \(\/[^ ]*lib[at]san\.so[^ ]*\) .*/\1/p' | head -n 1)
if want test_python && [ -d tests/python ] && [ "${san_rt#*libtsan}" != "$san_rt" ]; then
	echo "== test_python"
	echo "test_python: skipped: not run under ThreadSanitizer (CPython is not instrumented)"
	skipped=$((skipped + 1))
	skipped_names="$skipped_names test_python"
elif want test_python && [ -d tests/python ]; then
	echo "== test_python"
	LD_PRELOAD=$san_rt ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} \
		PYTHONPATH=python RADIANCE_LIBRARY=$BUILD/libradiance.so.0 \
		"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests/python >"$log" 2>&1
	rc=$?
	cat "$log"
	line=$(grep -E '^[= ]*[0-9]+ (passed|failed|error|skipped).* in [0-9.]+s' "$log" | tail -n 1)
	num() { echo "$line" | sed -n "s/.*[^0-9]\([0-9][0-9]*\) $1.*/\1/p"; }
	line=" $line"
	p=$(num passed) f=$(num failed) e=$(num error) s=$(num skipped)
	passed=$((passed + ${p:-0}))
	failed=$((failed + ${f:-0} + ${e:-0}))
	if [ "$rc" != 0 ]; then
		[ "${f:-0}" = 0 ] && [ "${e:-0}" = 0 ] && failed=$((failed + 1))
		failed_names="$failed_names test_python"
		echo "FAIL: test_python (exit $rc)"
	fi
	if [ -n "$s" ] && [ "$s" != 0 ]; then
		skipped=$((skipped + s))
		skipped_names="$skipped_names test_python"
	fi
fi

[ -n "$failed_names" ] && echo "failed:$failed_names"
[ -n "$skipped_names" ] && echo "skipped ($skipped tests, the reason is in each one's log above):$skipped_names"
echo "check: $passed passed, $failed failed"
[ "$failed" = 0 ]
