#!/bin/sh
# Install the Debian packages radiance builds and tests with, if any is missing.
# Runs as root on Debian 12 (apt-get); as another user it prints the command.
set -eu
PKGS="build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler
libjansson-dev libinih-dev libsystemd-dev libcmocka-dev systemd python3 python3-venv
clang-19 clang-tools-19 llvm-19 lld-19 libamdhip64-dev
gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
# make check compiles the HIP kernels for gfx1201 and inspects the code object
# (tests/test_gpu_compile.sh): clang-19, its offload bundler (clang-tools-19),
# the llvm-objcopy that bundler runs (llvm-19), lld-19 and the HIP headers.
# It also cross-compiles the CPU fast path for aarch64 and runs its NEON
# kernels under qemu-aarch64 (tests/test_cpu_neon.sh): the cross gcc, its
# libc and qemu-user.
# make fuzz (libFuzzer targets) wants clang-19 and its sanitizer runtimes.
if [ "${RADIANCE_DEPS_FUZZ:-0}" = 1 ]; then
	PKGS="$PKGS clang-19 libclang-rt-19-dev"
fi
# make check-deb (tests/deb_check.sh): the Debian packaging tools, lintian,
# and a Debian 12 root booted with systemd-nspawn.
if [ "${RADIANCE_DEPS_DEB:-0}" = 1 ]; then
	PKGS="$PKGS dpkg-dev debhelper help2man lintian debootstrap systemd-container procps"
fi
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "radiance: installing missing Debian packages:$missing"
if [ "$(id -u)" != 0 ]; then
	echo "radiance: not root; run: apt-get install -y$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
