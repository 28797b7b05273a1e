#!/bin/sh
# `make install` staged into two DESTDIRs with different prefixes, from the
# same build (the build's own radiance.pc is for the default prefix):
#   - every file lands under DESTDIR/PREFIX, or DESTDIR/SYSCONFDIR (/etc for
#     PREFIX=/usr, PREFIX/etc otherwise, or as given), nothing elsewhere;
#   - no installed file names the stage directory;
#   - radiance.pc, the units and radiancectl's paths say this prefix;
#   - pkg-config --cflags --libs against the staged .pc (PKG_CONFIG_SYSROOT_DIR
#     = the stage) compiles and links examples/linear.c, which then runs
#     from the staged libradiance.so; --static links the staged .a;
#   - a second install keeps an edited radianced.conf.
# Env: BUILD (default build).
set -u
BUILD=${RADIANCE_BUILD:-${BUILD:-build}}
top=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/script_lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT


# sanitizer builds: a program linked to the library needs the same runtime
san=""
objdump -p "$BUILD/libradiance.so.0" 2>/dev/null | grep -q 'NEEDED.*libasan' && san="$san -fsanitize=address"
objdump -p "$BUILD/libradiance.so.0" 2>/dev/null | grep -q 'NEEDED.*libubsan' && san="$san -fsanitize=undefined"

# stage NAME PREFIX SYSCONFDIR [make args...]: installs into $tmp/NAME and checks it
stage() {
	name=$1 prefix=$2 sysconf=$3
	shift 3
	dest=$tmp/$name
	if ! make -s --no-print-directory -C "$top" BUILD="$BUILD" DESTDIR="$dest" PREFIX="$prefix" \
		"$@" install >"$tmp/$name.log" 2>&1; then
		bad "$name: make install PREFIX=$prefix $* failed:"
		sed 's/^/    | /' "$tmp/$name.log"
		return
	fi
	ok "$name: make install DESTDIR=\$tmp/$name PREFIX=$prefix $*"

	# everything under the prefix or the config directory
	outside=$(cd "$dest" && find . ! -type d | sed 's|^\.||' |
		grep -v -e "^$prefix/" -e "^$sysconf/" || true)
	[ -z "$outside" ] && ok "$name: all $(cd "$dest" && find . ! -type d | wc -l) files under $prefix or $sysconf" ||
		bad "$name: files outside $prefix and $sysconf: $outside"
	# the stage is where they are now, not where they will be
	leak=$(grep -rl -- "$dest" "$dest" 2>/dev/null || true)
	[ -z "$leak" ] && ok "$name: no installed file names the stage" || bad "$name: name the stage: $leak"

	lib=$prefix/lib
	for arg in "$@"; do case $arg in LIBDIR=*) lib=${arg#LIBDIR=} ;; esac; done
	for f in "$prefix/sbin/radianced" "$prefix/bin/radiancectl" "$lib/libradiance.so.0" \
		"$lib/libradiance.so" "$lib/libradiance.a" "$prefix/include/radiance.h" \
		"$lib/pkgconfig/radiance.pc" "$prefix/lib/systemd/system/radianced.service" \
		"$prefix/lib/systemd/system/radianced.socket" "$prefix/lib/systemd/system/radianced@.service" \
		"$prefix/lib/systemd/system/radianced@.socket" \
		"$prefix/lib/systemd/system/radiance-metrics.service" \
		"$prefix/lib/systemd/system/radiance-metrics.timer" "$prefix/lib/sysusers.d/radiance.conf" \
		"$prefix/lib/tmpfiles.d/radiance.conf" "$sysconf/radiance/radianced.conf"; do
		[ -e "$dest$f" ] || bad "$name: $f not installed"
	done

	pc=$dest$lib/pkgconfig/radiance.pc
	if grep -qx "prefix=$prefix" "$pc" && grep -qx "libdir=$lib" "$pc" &&
		grep -qx "includedir=$prefix/include" "$pc"; then
		ok "$name: radiance.pc says prefix=$prefix libdir=$lib"
	else
		bad "$name: radiance.pc is not for $prefix:"
		sed 's/^/    | /' "$pc"
	fi
	unit=$dest$prefix/lib/systemd/system
	grep -qx "ExecStart=$prefix/sbin/radianced --config $sysconf/radiance/radianced.conf --socket /run/radiance/radiance.sock" "$unit/radianced.service" &&
		grep -q "^ExecStart=$prefix/sbin/radianced --config $sysconf/radiance/radianced-%i.conf " "$unit/radianced@.service" &&
		grep -q "^ExecStart=$prefix/bin/radiancectl " "$unit/radiance-metrics.service" &&
		ok "$name: units run $prefix/sbin/radianced with $sysconf/radiance/radianced.conf" ||
		bad "$name: unit paths: $(grep -h '^ExecStart' "$unit"/*.service)"

	# a client built from the staged .pc
	flags=$(PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_LIBDIR=$dest$lib/pkgconfig \
		pkg-config --cflags --libs radiance 2>&1)
	case $flags in
	*"-I$dest$prefix/include"*"-L$dest$lib"*"-lradiance"*) ok "$name: pkg-config: $flags" ;;
	*) bad "$name: pkg-config --cflags --libs radiance: $flags" ;;
	esac
	if cc $san -std=c11 -Wall -Werror "$top/examples/linear.c" $flags -o "$tmp/$name-linear" 2>"$tmp/cc.err"; then
		LD_LIBRARY_PATH=$dest$lib RADIANCE_SOCKET=$tmp/none.sock "$tmp/$name-linear" /x layer 1 >"$tmp/out" 2>&1
		rc=$?
		objdump -p "$tmp/$name-linear" | grep -q 'NEEDED *libradiance.so.0' &&
			[ $rc = 1 ] && grep -q "cannot connect to $tmp/none.sock" "$tmp/out" &&
			ok "$name: examples/linear.c compiled and linked with those flags runs from the staged .so" ||
			bad "$name: linear (exit $rc): $(cat "$tmp/out")"
	else
		bad "$name: examples/linear.c with the staged .pc: $(cat "$tmp/cc.err")"
	fi
	sflags=$(PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_LIBDIR=$dest$lib/pkgconfig \
		pkg-config --static --cflags --libs radiance 2>&1)
	if cc $san -std=c11 "$top/examples/linear.c" -static-libgcc $(echo "$sflags" | sed "s|-lradiance|$dest$lib/libradiance.a|") \
		-o "$tmp/$name-linear-a" 2>"$tmp/cc.err" &&
		! objdump -p "$tmp/$name-linear-a" | grep -q 'NEEDED *libradiance'; then
		ok "$name: pkg-config --static links the staged libradiance.a"
	else
		bad "$name: static link with '$sflags': $(cat "$tmp/cc.err")"
	fi
}

stage usr /usr /etc
stage opt /opt/radiance /opt/radiance/etc LIBDIR=/opt/radiance/lib64
stage optetc /opt/radiance /etc SYSCONFDIR=/etc

# the build's own radiance.pc was not touched: it is for the build's prefix
grep -qx 'prefix=/usr/local' "$BUILD/radiance.pc" && ok "$BUILD/radiance.pc still says the default prefix /usr/local" ||
	bad "$BUILD/radiance.pc changed: $(grep prefix= "$BUILD/radiance.pc")"

# an edited configuration survives a second install
conf=$tmp/usr/etc/radiance/radianced.conf
echo "max_rows = 7" >>"$conf"
make -s --no-print-directory -C "$top" BUILD="$BUILD" DESTDIR="$tmp/usr" PREFIX=/usr install >/dev/null 2>&1 &&
	grep -qx 'max_rows = 7' "$conf" && ok "a second install keeps the edited radianced.conf" ||
	bad "a second install replaced radianced.conf"

script_done test_install
