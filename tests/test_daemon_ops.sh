#!/bin/sh
# radianced start-up as an operator sees it, against the real binaries:
#   1. a second daemon on a live socket fails before it touches a backend
#      (no backend line, no scratch allocated: its --backend gpu, which this
#      build cannot give, is never reached) with a message naming the socket,
#      and the first keeps serving;
#   2. backend auto falling back to the CPU is a [warn] naming the reason
#      and the option that makes it fatal; require_gpu (config key, or
#      --require-gpu) makes the daemon exit 1 with the reason instead, and
#      creates no socket; require_gpu=no and a bad value behave as documented.
# Env: BUILD (default build), RADIANCED, RADIANCECTL.
set -u
BUILD=${RADIANCE_BUILD:-${BUILD:-build}}
RADIANCED=${RADIANCED:-$BUILD/radianced}
RADIANCECTL=${RADIANCECTL:-$BUILD/radiancectl}
. "$(dirname "$0")/script_lib.sh"
tmp=$(mktemp -d)
first=""
cleanup() {
	stop_first
	rm -rf "$tmp"
}
trap cleanup EXIT


# stop_first: the daemon started in the background, if any
stop_first() {
	[ -n "$first" ] && kill "$first" 2>/dev/null && wait "$first" 2>/dev/null
	first=""
}

# wait_up SOCKET: 0 once radiancectl status answers there (at most ~10 s)
wait_up() {
	i=0
	while [ $i -lt 200 ]; do
		"$RADIANCECTL" --socket "$1" status >/dev/null 2>&1 && return 0
		sleep 0.05
		i=$((i + 1))
	done
	return 1
}

if "$RADIANCED" --version | grep -q . && "$RADIANCED" --help | grep -q -- '--require-gpu'; then
	ok "radianced --help lists --require-gpu"
else
	bad "radianced --help does not list --require-gpu"
fi

# --- 1. a second daemon on a live socket ----------------------------------
sock=$tmp/r.sock
"$RADIANCED" --no-config --backend cpu --socket "$sock" >"$tmp/first.log" 2>&1 &
first=$!
if ! wait_up "$sock"; then
	bad "first daemon did not come up"
	show "$tmp/first.log"
else
	"$RADIANCED" --no-config --backend gpu --socket "$sock" >"$tmp/second.log" 2>&1
	rc=$?
	if [ $rc = 1 ] && grep -q "\[error\].*another daemon is listening on $sock" "$tmp/second.log"; then
		ok "second daemon exits 1: $(grep -o 'another daemon.*' "$tmp/second.log")"
	else
		bad "second daemon: exit $rc, expected 1 and 'another daemon is listening on $sock'"
		show "$tmp/second.log"
	fi
	# it stopped before the backend: nothing about one, no scratch
	if grep -Eq "backend|scratch" "$tmp/second.log"; then
		bad "second daemon got as far as the backend:"
		show "$tmp/second.log"
	else
		ok "second daemon never initialised a backend (no backend or scratch line in its log)"
	fi
	if "$RADIANCECTL" --socket "$sock" status >"$tmp/status" 2>&1 && grep -q 'backend: *cpu' "$tmp/status"; then
		ok "first daemon keeps serving on $sock"
	else
		bad "first daemon no longer answers:"
		show "$tmp/status"
	fi
	kill "$first"
	wait "$first"
	rc=$?
	first=""
	[ $rc = 0 ] && ok "first daemon exits 0 on SIGTERM" || bad "first daemon exit $rc"
	[ -e "$sock" ] && bad "first daemon left $sock behind" || ok "its socket is gone"
fi

# --- 2. backend auto without a GPU ----------------------------------------
# 2a. fallback: a warning naming the reason and the knob
sock=$tmp/auto.sock
"$RADIANCED" --no-config --backend auto --socket "$sock" >"$tmp/auto.log" 2>&1 &
first=$!
if wait_up "$sock"; then
	line=$(grep 'backend auto:' "$tmp/auto.log")
	case $line in
	*"[warn]"*"using cpu"*"require_gpu"*)
		case $line in
		*"this build has no GPU backend"* | *"no GPU device answered"*)
			ok "auto fell back with a warning: ${line#*] }" ;;
		*) bad "the fallback warning names no reason: $line" ;;
		esac ;;
	*) bad "no [warn] 'backend auto: ... using cpu ... require_gpu' line:"; show "$tmp/auto.log" ;;
	esac
	"$RADIANCECTL" --socket "$sock" status 2>&1 | grep -q 'backend: *cpu' &&
		ok "and serves from the cpu backend" || bad "status does not say cpu"
else
	bad "auto daemon did not come up"
	show "$tmp/auto.log"
fi
stop_first

# 2b. require_gpu: fatal, with the reason, before any socket exists
check_required() {   # description, then radianced arguments
	what=$1
	shift
	rm -f "$tmp/req.log"
	"$RADIANCED" "$@" >"$tmp/req.log" 2>&1
	rc=$?
	if [ $rc = 1 ] && grep -q "\[error\].*require_gpu is set and" "$tmp/req.log" &&
		grep -Eq "this build has no GPU backend|no GPU device answered" "$tmp/req.log"; then
		ok "$what: exit 1: $(grep -o 'require_gpu is set.*' "$tmp/req.log")"
	else
		bad "$what: exit $rc, expected 1 and 'require_gpu is set and ...' with the reason"
		show "$tmp/req.log"
	fi
	grep -q "using cpu" "$tmp/req.log" && bad "$what: it still fell back to the cpu"
	[ -e "$tmp/req.sock" ] && bad "$what: left $tmp/req.sock behind"
}
check_required "--require-gpu" --no-config --socket "$tmp/req.sock" --require-gpu
check_required "--require-gpu=yes" --no-config --socket "$tmp/req.sock" --require-gpu=yes
printf 'backend = auto\nrequire_gpu = yes\n' >"$tmp/req.conf"
check_required "require_gpu = yes in the config file" --config "$tmp/req.conf" --socket "$tmp/req.sock"

# the command line wins over the file: --require-gpu=no serves from the cpu
sock=$tmp/no.sock
"$RADIANCED" --config "$tmp/req.conf" --require-gpu=no --socket "$sock" >"$tmp/no.log" 2>&1 &
first=$!
if wait_up "$sock"; then
	ok "--require-gpu=no overrides the file's require_gpu = yes"
else
	bad "--require-gpu=no did not start a daemon"
	show "$tmp/no.log"
fi
stop_first

# a bad value is a usage error naming it, exit 2
printf 'require_gpu = maybe\n' >"$tmp/bad.conf"
"$RADIANCED" --config "$tmp/bad.conf" --socket "$tmp/bad.sock" >"$tmp/bad.log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "bad.conf:1.*'maybe' is not yes or no" "$tmp/bad.log"; then
	ok "require_gpu = maybe: exit 2: $(cat "$tmp/bad.log")"
else
	bad "require_gpu = maybe: exit $rc"
	show "$tmp/bad.log"
fi

# require_gpu with backend = cpu contradict each other: exit 2, both named,
# no socket (a radianced@N whose file says backend = cpu served from the CPU)
printf 'backend = cpu\n' >"$tmp/cpu.conf"
"$RADIANCED" --config "$tmp/cpu.conf" --require-gpu --socket "$tmp/cpu.sock" >"$tmp/cpu.log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "require_gpu yes (--require-gpu) contradicts backend cpu (.*cpu.conf:1)" "$tmp/cpu.log" &&
	[ ! -e "$tmp/cpu.sock" ]; then
	ok "--require-gpu with backend = cpu: exit 2: $(cat "$tmp/cpu.log")"
else
	bad "--require-gpu with backend = cpu: exit $rc, expected 2 naming both"
	show "$tmp/cpu.log"
fi

# --- 3. a config value with an ESC in it is logged escaped -----------------
# (the socket's directory here: the daemon makes it, and names it twice)
escdir=$tmp/$(printf 'x\033[31my')
"$RADIANCED" --no-config --backend cpu --socket "$escdir/r.sock" >"$tmp/esc.log" 2>&1 &
first=$!
if wait_up "$escdir/r.sock"; then ok "daemon on a socket under $tmp/x<ESC>[31my"; else bad "daemon under the ESC directory did not come up"; fi
stop_first
if grep -qF "listening on $tmp/x\x1b[31my/r.sock" "$tmp/esc.log" &&
	grep -qF "created $tmp/x\x1b[31my for the socket" "$tmp/esc.log" &&
	! grep -q "$(printf '\033')" "$tmp/esc.log"; then
	ok "the socket path logged escaped (\\x1b), no raw ESC in the log"
else
	bad "the socket path with an ESC in the log:"
	show "$tmp/esc.log"
fi

script_done test_daemon_ops
