# Sourced by the shell tests: ok/bad count and print the checks, show
# indents a file into the log, script_done prints the summary line that
# tests/run.sh counts ("NAME: N passed, N failed") and exits 1 on failures.
passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
show() { sed 's/^/    | /' "$1"; }
script_done() {
	echo "$1: $passed passed, $failed failed"
	[ $failed = 0 ]
	exit
}
