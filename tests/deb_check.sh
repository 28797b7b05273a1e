#!/bin/sh
# make check-deb: the Debian packages, built and used as an administrator
# would (Debian 12, as root; needs network access to the Debian mirror):
#   1. dpkg-buildpackage -us -uc -b in a copy of the working tree builds
#      radiance, libradiance0 and libradiance-dev;
#   2. lintian on the .changes: no errors (warnings and info are printed);
#   3. a clean Debian 12 root (debootstrap minbase + systemd) boots under
#      systemd-nspawn (/work/shared/systemd-test.md); installing the three
#      packages (apt-get install ./*.deb) creates the radiance user (sysusers), /run/radiance
#      (tmpfiles) and enables and starts radianced.socket;
#   4. a preload of the shipped checkpoint is configured, and
#      `radiancectl status` (as root, then as a member of group radiance)
#      starts radianced.service through socket activation; examples/linear,
#      built from the installed libradiance-dev's files (pkg-config),
#      runs a layer of the checkpoint against it; the journal shows the
#      daemon ran as user radiance and why it serves from the CPU; the
#      radiance-metrics.service writes its textfile;
#   5. the per-GPU template: radianced@0.socket creates radiance-0.sock, and
#      radianced@0 fails naming the missing GPU (it requires it); with the
#      documented drop-in RADIANCED_REQUIRE_GPU=no it serves, and
#      radiancectl --device 0 and RADIANCE_DEVICE=0 examples/linear reach
#      it (the same output as from radianced.service).
# Env: DEB_CHECK_DIR (work dir, default build-debcheck/), ROOTFS (a
#      debootstrapped root to copy instead of bootstrapping one; the first
#      bootstrap is kept in DEB_CHECK_DIR/rootfs for the next run).
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
work=${DEB_CHECK_DIR:-$top/build-debcheck}
passed=0
failed=0
nspawn=""
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
finish() {
	echo "deb_check: $passed passed, $failed failed"
	[ $failed = 0 ]
	exit
}

if [ "$(id -u)" != 0 ]; then
	echo "FAIL: run as root (debootstrap, systemd-nspawn, dpkg in the container)"
	exit 1
fi
RADIANCE_DEPS_DEB=1 sh "$top/tools/install-deps.sh" || exit 1

# --- 1. build ---------------------------------------------------------------
ver=$(dpkg-parsechangelog -l "$top/debian/changelog" -S Version)
src=$work/src
rm -rf "$src"
mkdir -p "$src/radiance-$ver"
(cd "$top" && git ls-files -co --exclude-standard | grep -v -e '^build/' -e '^build-' |
	tar -cf - -T -) | tar -xf - -C "$src/radiance-$ver"
if (cd "$src/radiance-$ver" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1; then
	ok "dpkg-buildpackage -us -uc -b: $(cd "$src" && ls ./*.deb | grep -v dbgsym | tr '\n' ' ')"
else
	bad "dpkg-buildpackage failed (tail of $work/build.log):"
	tail -n 20 "$work/build.log" | sed 's/^/    | /'
	finish
fi
debs=""
for p in radiance libradiance0 libradiance-dev; do
	d=$src/${p}_${ver}_$(dpkg --print-architecture).deb
	[ -f "$d" ] && debs="$debs $d" || bad "$p: no $d"
done

# --- 2. lintian -------------------------------------------------------------
lintian --display-level ">=pedantic" "$src/radiance_${ver}_$(dpkg --print-architecture).changes" \
	>"$work/lintian.log" 2>&1
grep -v 'running with root privileges' "$work/lintian.log" | sed 's/^/    lintian: /'
nerr=$(grep -c '^E:' "$work/lintian.log")
nwarn=$(grep -c '^W:' "$work/lintian.log")
[ "$nerr" = 0 ] && ok "lintian: $nerr errors, $nwarn warnings, $(grep -c '^[IP]:' "$work/lintian.log") info/pedantic" ||
	bad "lintian: $nerr errors"

# --- 3. a clean Debian 12 with systemd --------------------------------------
root=$work/root
rm -rf "$root"
if [ -n "${ROOTFS:-}" ] || [ -d "$work/rootfs" ]; then
	cp -a "${ROOTFS:-$work/rootfs}" "$root"
else
	# the packages' shared-library dependencies come along: only
	# libradiance-dev's -dev dependencies come from the mirror
	if ! debootstrap --variant=minbase \
		--include=systemd,systemd-sysv,dbus,libuv1,libprotobuf-c1,libjansson4,libinih1 \
		bookworm "$work/rootfs.new" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1; then
		bad "debootstrap failed (tail of $work/debootstrap.log):"
		tail -n 10 "$work/debootstrap.log" | sed 's/^/    | /'
		finish
	fi
	mv "$work/rootfs.new" "$work/rootfs"
	cp -a "$work/rootfs" "$root"
fi
mkdir -p "$root/var/tmp/radiance-debs" "$root/srv/models"
cp $debs "$root/var/tmp/radiance-debs/"
cp -a "$top/tests/data/minilm-w4g128" "$root/srv/models/"

# examples/linear from the -dev package's files, as a user of the package
# builds it: pkg-config on its radiance.pc (the container has no compiler).
# Not under /tmp: the booted container mounts a tmpfs there.
dev=$work/dev
rm -rf "$dev"
for d in $debs; do dpkg-deb -x "$d" "$dev"; done
pcdir=$(dirname "$(find "$dev" -name radiance.pc)")
flags=$(PKG_CONFIG_SYSROOT_DIR=$dev PKG_CONFIG_LIBDIR=$pcdir pkg-config --cflags --libs radiance)
if cc -std=c11 -O2 "$dev/usr/share/doc/libradiance-dev/examples/linear.c" $flags -o "$root/usr/local/bin/linear" \
	2>"$work/cc.err"; then
	ok "examples/linear.c (from libradiance-dev) built with pkg-config: $flags"
else
	bad "examples/linear.c against libradiance-dev: $(cat "$work/cc.err")"
fi

systemd-nspawn -q --register=no --keep-unit -D "$root" --boot --console=pipe \
	>"$work/nspawn.log" 2>&1 &
nspawn=$!
# on any exit: power the container off, or kill it (nspawn and its init:
# killing nspawn alone leaves the container's systemd running)
stop_container() {
	[ -n "$nspawn" ] || return 0
	[ -n "$pid" ] && nsenter -t "$pid" -a systemctl poweroff >/dev/null 2>&1
	i=0
	while kill -0 "$nspawn" 2>/dev/null && [ $i -lt 30 ]; do
		sleep 0.5
		i=$((i + 1))
	done
	kill -9 "$nspawn" $pid 2>/dev/null
	nspawn=""
}
pid=""
trap 'stop_container' EXIT
trap 'exit 130' INT TERM
i=0
while [ $i -lt 100 ] && [ -z "$pid" ]; do
	sleep 0.2
	pid=$(pgrep -P "$nspawn" | head -n 1)
	i=$((i + 1))
done
if [ -z "$pid" ]; then
	bad "systemd-nspawn did not start a container:"
	sed 's/^/    | /' "$work/nspawn.log"
	finish
fi
inside() { nsenter -t "$pid" -a "$@"; }
state=""
i=0
while [ $i -lt 120 ]; do
	state=$(inside systemctl is-system-running 2>/dev/null)
	case $state in running | degraded) break ;; esac
	sleep 0.5
	i=$((i + 1))
done
case $state in
running) ok "Debian 12 container booted (systemctl is-system-running: $state)" ;;
*) bad "container state '$state'"; inside systemctl --failed --no-pager 2>&1 | sed 's/^/    | /' ;;
esac

# apt resolves libradiance-dev's -dev dependencies from the mirror
if inside sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	/var/tmp/radiance-debs/*.deb' >"$work/dpkg.log" 2>&1; then
	ok "apt-get install ./radiance ./libradiance0 ./libradiance-dev (.deb)"
else
	bad "installing the packages failed:"
	sed 's/^/    | /' "$work/dpkg.log"
fi
inside getent passwd radiance >/dev/null && inside getent group radiance >/dev/null &&
	ok "user and group radiance exist: $(inside getent passwd radiance)" || bad "no radiance user/group"
g=$(inside id -nG radiance 2>&1)
case " $g " in *" render "*) r=1 ;; *) r=0 ;; esac
case " $g " in *" video "*) v=1 ;; *) v=0 ;; esac
[ $r$v = 11 ] && ok "radiance is in the GPU device groups: $g" || bad "radiance's groups: $g"
s=$(inside systemctl is-enabled radianced.socket 2>&1)/$(inside systemctl is-active radianced.socket 2>&1)
[ "$s" = "enabled/active" ] && ok "radianced.socket enabled and active after install" ||
	bad "radianced.socket: $s"
s=$(inside stat -c '%U:%G %a' /run/radiance/radiance.sock 2>&1)
[ "$s" = "root:radiance 660" ] && ok "/run/radiance/radiance.sock is root:radiance 0660" || bad "socket: $s"
s=$(inside systemctl is-enabled radiance-metrics.timer 2>&1)
[ "$s" = "disabled" ] && ok "radiance-metrics.timer installed, left disabled" || bad "metrics timer: $s"

# --- 4. a client, through socket activation ---------------------------------
inside sh -c 'printf "preload = /srv/models/minilm-w4g128\n" >>/etc/radiance/radianced.conf'
if inside timeout 60 radiancectl status >"$work/status.log" 2>&1 && grep -q 'backend: *cpu' "$work/status.log"; then
	ok "radiancectl status (root) started radianced via the socket: $(tr '\n' ' ' <"$work/status.log" | tr -s ' ')"
else
	bad "radiancectl status:"
	sed 's/^/    | /' "$work/status.log"
	inside journalctl -u radianced --no-pager -n 30 2>&1 | sed 's/^/    journal: /'
fi
inside timeout 60 radiancectl models >"$work/models.log" 2>&1 && grep -q 'minilm-w4g128' "$work/models.log" &&
	ok "the preload is resident: $(grep minilm "$work/models.log" | tr -s ' ')" ||
	{ bad "models:"; sed 's/^/    | /' "$work/models.log"; }
inside id -u rtest >/dev/null 2>&1 || inside useradd -M -G radiance rtest
inside setpriv --reuid=rtest --regid=rtest --init-groups timeout 60 radiancectl status >"$work/user.log" 2>&1 &&
	ok "a member of group radiance reaches the daemon too" ||
	{ bad "radiancectl as a member of group radiance:"; sed 's/^/    | /' "$work/user.log"; }
inside timeout 60 linear /srv/models/minilm-w4g128 encoder.layer.0.attention.self.query 4 >"$work/linear.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q 'y\[3\]' "$work/linear.log"; then
	ok "examples/linear ran a layer: $(grep -m1 'y\[0\]' "$work/linear.log" | tr -s ' ')"
else
	bad "examples/linear exit $rc:"
	sed 's/^/    | /' "$work/linear.log"
fi
inside journalctl -u radianced --no-pager -o cat >"$work/journal.log" 2>&1
inside sh -c 'stat -c %U /proc/$(systemctl show -p MainPID --value radianced)' >"$work/ps.log" 2>&1
grep -qx 'radiance' "$work/ps.log" && ok "radianced runs as user radiance" || bad "radianced user: $(cat "$work/ps.log")"
grep -q 'backend auto: .*using cpu' "$work/journal.log" &&
	ok "journal: $(grep -m1 'backend auto:' "$work/journal.log" | sed 's/^.*backend auto/backend auto/')" ||
	{ bad "no backend line in the journal:"; tail -n 20 "$work/journal.log" | sed 's/^/    | /'; }
inside sh -c 'mkdir -p /var/lib/prometheus/node-exporter && systemctl start radiance-metrics.service' \
	>"$work/metrics.log" 2>&1
if inside grep -qx 'radiance_up 1' /var/lib/prometheus/node-exporter/radiance.prom 2>/dev/null; then
	ok "radiance-metrics.service wrote radiance.prom: $(inside grep -c -v '^#' /var/lib/prometheus/node-exporter/radiance.prom) samples"
else
	bad "radiance-metrics.service:"
	sed 's/^/    | /' "$work/metrics.log"
	inside journalctl -u radiance-metrics --no-pager -n 10 2>&1 | sed 's/^/    journal: /'
fi

# --- 5. one daemon per GPU: the template units -----------------------------
# radianced@0 requires GPU 0, which this container lacks: it must fail
# naming the reason, not serve from the CPU
inside sh -c 'cp /etc/radiance/radianced.conf /etc/radiance/radianced-0.conf &&
	systemctl start radianced@0.socket' >"$work/inst.log" 2>&1
s=$(inside stat -c '%U:%G %a' /run/radiance/radiance-0.sock 2>&1)
[ "$s" = "root:radiance 660" ] && ok "radianced@0.socket: /run/radiance/radiance-0.sock root:radiance 0660" ||
	{ bad "radianced@0.socket: $s"; sed 's/^/    | /' "$work/inst.log"; }
inside timeout 10 radiancectl --device 0 status >"$work/inst.log" 2>&1
rc=$?
inside journalctl -u radianced@0 --no-pager -o cat >"$work/inst-journal.log" 2>&1
if [ $rc != 0 ] && grep -q "require_gpu is set and this build has no GPU backend" "$work/inst-journal.log" &&
	! grep -q "using cpu" "$work/inst-journal.log"; then
	ok "radianced@0 without a GPU fails (radiancectl --device 0: exit $rc): $(grep -m1 -o "backend 'auto': require_gpu is set.*" "$work/inst-journal.log")"
else
	bad "radianced@0 without a GPU: radiancectl exit $rc, journal:"
	tail -n 10 "$work/inst-journal.log" | sed 's/^/    | /'
fi
# the documented drop-in lets it fall back; then it serves GPU "0"'s socket
inside sh -c 'systemctl stop radianced@0.socket radianced@0.service;
	systemctl reset-failed radianced@0.service;
	mkdir -p /etc/systemd/system/radianced@0.service.d &&
	printf "[Service]\nEnvironment=RADIANCED_REQUIRE_GPU=no\n" >/etc/systemd/system/radianced@0.service.d/cpu.conf &&
	systemctl daemon-reload && systemctl start radianced@0.socket' >"$work/inst.log" 2>&1
if inside timeout 60 radiancectl --device 0 status >"$work/inst.log" 2>&1 && grep -q 'backend: *cpu' "$work/inst.log"; then
	ok "with RADIANCED_REQUIRE_GPU=no, radiancectl --device 0 reaches radianced@0 (backend cpu)"
else
	bad "radianced@0 with the drop-in:"
	sed 's/^/    | /' "$work/inst.log"
	inside journalctl -u radianced@0 --no-pager -n 10 -o cat 2>&1 | sed 's/^/    journal: /'
fi
inside env RADIANCE_DEVICE=0 timeout 60 linear /srv/models/minilm-w4g128 encoder.layer.0.attention.self.query 4 \
	>"$work/linear0.log" 2>&1
rc=$?
if [ $rc = 0 ] && cmp -s "$work/linear.log" "$work/linear0.log"; then
	ok "RADIANCE_DEVICE=0 examples/linear: the same output as from radianced.service"
else
	bad "RADIANCE_DEVICE=0 linear exit $rc:"
	diff "$work/linear.log" "$work/linear0.log" | sed 's/^/    | /'
fi

inside systemctl poweroff >/dev/null 2>&1
i=0
while kill -0 "$nspawn" 2>/dev/null && [ $i -lt 60 ]; do
	sleep 0.5
	i=$((i + 1))
done
if kill -0 "$nspawn" 2>/dev/null; then
	bad "the container did not power off"
else
	ok "container powered off"
	wait "$nspawn" 2>/dev/null
	nspawn=""
fi
finish
