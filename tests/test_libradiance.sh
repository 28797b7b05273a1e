#!/bin/sh
# libradiance as a user gets it: the shared library exports exactly the
# functions of client/radiance.h (-fvisibility=hidden and client/libradiance.sym:
# nothing of the shared common/ code or the generated protobuf-c code), radiance.pc
# works with pkg-config, the header compiles alone as C and C++, and
# examples/linear.c builds and links against the .so and the .a.
set -u
BUILD=${RADIANCE_BUILD:-${BUILD:-build}}
so=$BUILD/libradiance.so.0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

[ -f "$so" ] || { echo "FAIL: $so missing"; exit 1; }

# 1. exports == header declarations; the version script takes radiance_* by
# pattern (libseat.syms), so what keeps everything else out is
# -fvisibility=hidden: nm -D must list radiance_* and the version node only.
cc -fpreprocessed -dD -E client/radiance.h 2>/dev/null |
	grep -oE '\bradiance_[a-z0-9_]+\(' | tr -d '(' | sort -u >"$tmp/header"
nm -D --defined-only "$so" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/exported"
if cmp -s "$tmp/header" "$tmp/exported"; then
	ok "$(wc -l <"$tmp/exported") exported functions, exactly the header's"
else
	bad "exports differ from the header (< header, > exported):"
	diff "$tmp/header" "$tmp/exported"
fi
leaked=$(nm -D --defined-only "$so" | awk '{ sub(/@.*/, "", $3); print $3 }' |
	grep -vE '^(radiance_[a-z][a-z0-9_]*|RADIANCE_0)$' || true)
[ -z "$leaked" ] && ok "nm -D: radiance_* and RADIANCE_0 only" || bad "other symbols exported: $leaked"
nm -D --defined-only "$so" | awk '$3 == "RADIANCE_0" { f = 1 } END { exit !f }' &&
	ok "version node RADIANCE_0" || bad "no version node RADIANCE_0"
globals=$(sed -n '/global:/,/local:/p' client/libradiance.sym | grep -vE 'global:|local:' | tr -d ' \t')
[ "$globals" = "radiance_*;" ] && ok "libradiance.sym exports radiance_* by pattern" ||
	bad "libradiance.sym's global list is not just radiance_*: $globals"
objdump -p "$so" | grep -q 'SONAME *libradiance.so.0' && ok "SONAME libradiance.so.0" || bad "SONAME"

# 2. pkg-config
pc=$BUILD/radiance.pc
if [ -f "$pc" ]; then
	grep -q '@' "$pc" && bad "radiance.pc has unsubstituted @VARS@"
	v=$(PKG_CONFIG_PATH=$BUILD pkg-config --modversion radiance 2>&1)
	[ -n "$v" ] && ok "pkg-config: radiance $v ($(PKG_CONFIG_PATH=$BUILD pkg-config --libs radiance))" ||
		bad "pkg-config cannot read radiance.pc"
else
	bad "$pc missing"
fi

# 3. the header alone, strict C11 and C++
printf '#include "radiance.h"\nint main(void) { return radiance_version() == 0; }\n' >"$tmp/h.c"
cc -std=c11 -Wall -Wextra -Werror -pedantic -Iclient -c "$tmp/h.c" -o "$tmp/h.o" &&
	ok "radiance.h compiles alone (C11, -pedantic)" || bad "radiance.h alone (C)"
if command -v c++ >/dev/null; then
	cp "$tmp/h.c" "$tmp/h.cc"
	c++ -std=c++17 -Wall -Wextra -Werror -Iclient -c "$tmp/h.cc" -o "$tmp/hpp.o" &&
		ok "radiance.h compiles as C++17" || bad "radiance.h as C++"
fi

# 4. examples/linear.c against the .so and the .a; without a daemon it
# reports the connect failure (naming the socket) and exits 1; bad
# arguments are usage errors (exit 2) before it connects. A sanitizer build's library needs
# the program built with the same sanitizers.
san=""
objdump -p "$so" | grep -q 'NEEDED.*libasan' && san="$san -fsanitize=address"
objdump -p "$so" | grep -q 'NEEDED.*libubsan' && san="$san -fsanitize=undefined"
if cc $san -std=c11 -Wall -Wextra -Werror -Iclient examples/linear.c -L"$BUILD" -lradiance \
	-o "$tmp/linear-so" 2>"$tmp/cc.err"; then
	RADIANCE_SOCKET=/nonexistent/radiance.sock LD_LIBRARY_PATH=$BUILD "$tmp/linear-so" /x >"$tmp/out" 2>&1
	rc=$?
	[ $rc = 1 ] && grep -q "cannot connect to /nonexistent/radiance.sock" "$tmp/out" &&
		ok "examples/linear.c links against libradiance.so, names the socket it cannot reach" ||
		bad "linear (shared) exit $rc: $(cat "$tmp/out")"
	# its arguments are checked before anything else happens
	LD_LIBRARY_PATH=$BUILD "$tmp/linear-so" --help >"$tmp/out" 2>&1
	rc=$?
	[ $rc = 0 ] && grep -q '^usage:' "$tmp/out" && ok "linear --help prints the usage" ||
		bad "linear --help exit $rc: $(cat "$tmp/out")"
	for rows in -3 0 2000000000 abc 12x; do
		RADIANCE_SOCKET=/nonexistent/radiance.sock LD_LIBRARY_PATH=$BUILD \
			"$tmp/linear-so" /x layer "$rows" >"$tmp/out" 2>&1
		rc=$?
		if [ $rc != 2 ] || ! grep -q "ROWS must be a whole number from 1 to" "$tmp/out"; then
			bad "linear with ROWS $rows: exit $rc: $(cat "$tmp/out")"
			rows=bad
			break
		fi
	done
	[ "$rows" != bad ] && ok "linear refuses bad ROWS (-3, 0, 2000000000, abc, 12x) with exit 2"
else
	bad "examples/linear.c does not build against the .so: $(cat "$tmp/cc.err")"
fi
if cc $san -std=c11 -Iclient examples/linear.c "$BUILD/libradiance.a" -lprotobuf-c -ljansson -lpthread \
	-o "$tmp/linear-a" 2>"$tmp/cc.err"; then
	ok "examples/linear.c links against libradiance.a"
else
	bad "examples/linear.c does not link against the .a: $(cat "$tmp/cc.err")"
fi

# 5. GPU builds: libradiance-gpu exports exactly client/radiance_gpu.h's
# functions, and its header compiles alone
gso=$BUILD/libradiance-gpu.so.0
if [ -f "$gso" ]; then
	cc -fpreprocessed -dD -E client/radiance_gpu.h 2>/dev/null |
		grep -oE '\bradiance_gpu_[a-z0-9_]+\(' | tr -d '(' | sort -u >"$tmp/gheader"
	nm -D --defined-only "$gso" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u >"$tmp/gexported"
	grep -oE '^\s*radiance_gpu_[a-z0-9_]+;' client/gpu/libradiance-gpu.sym | tr -d ' \t;' | sort -u >"$tmp/gscript"
	cmp -s "$tmp/gheader" "$tmp/gexported" && cmp -s "$tmp/gheader" "$tmp/gscript" &&
		ok "libradiance-gpu: $(wc -l <"$tmp/gexported") exported functions, exactly radiance_gpu.h's" ||
		{ bad "libradiance-gpu exports differ from radiance_gpu.h or the version script:"; diff "$tmp/gheader" "$tmp/gexported"; }
	# symbols added after the first release carry their own version node
	nm -D --defined-only "$gso" | grep -q ' T radiance_gpu_linear_fp8@@RADIANCE_GPU_1$' &&
		[ "$(nm -D --defined-only "$gso" | grep -c ' T radiance_gpu_[a-z0-9_]*@@RADIANCE_GPU_0$')" -eq \
		  "$(($(wc -l <"$tmp/gexported") - 1))" ] &&
		ok "libradiance-gpu: radiance_gpu_linear_fp8 at RADIANCE_GPU_1, the rest at RADIANCE_GPU_0" ||
		bad "libradiance-gpu symbol versions (nm -D)"
	objdump -p "$gso" | grep -q 'SONAME *libradiance-gpu.so.0' && ok "SONAME libradiance-gpu.so.0" ||
		bad "libradiance-gpu SONAME"
	printf '#include "radiance_gpu.h"\nint main(void) { return radiance_gpu_error_message() == 0; }\n' >"$tmp/g.c"
	cc -std=c11 -Wall -Wextra -Werror -pedantic -Iclient -c "$tmp/g.c" -o "$tmp/g.o" &&
		ok "radiance_gpu.h compiles alone (C11, -pedantic)" || bad "radiance_gpu.h alone"
	v=$(PKG_CONFIG_PATH=$BUILD pkg-config --modversion radiance-gpu 2>&1)
	[ -n "$v" ] && ok "pkg-config: radiance-gpu $v" || bad "pkg-config cannot read radiance-gpu.pc"
fi

exit $fail
