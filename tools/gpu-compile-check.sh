#!/bin/sh
# The GPU compile check (CI has no GPU). Compiles every kernels/*.hip
#   - for AMD gfx1201 with Debian's clang-19 and HIP headers (-nogpulib: Debian
#     ships no gfx1201 device libraries), then checks the device code:
#       * the fp8 WMMA instruction v_wmma_f32_16x16x16_fp8_fp8 is in the W4A8
#         matrix-core kernel (kernels/w4a8_mma.hip), every kernel has no
#         scratch (private segment 0, no VGPR/SGPR spills), and VGPR/SGPR
#         counts are reported per kernel;
#       * the host side and the fat object link (needs lld-19);
#   - for NVIDIA sm_90a with nvcc when it is installed (registers, spills and
#     stack per kernel reported; compile errors fail the check). Without nvcc
#     that half is skipped, or fails when RADIANCE_REQUIRE_NVCC=1.
# Exits non-zero if any check fails; the last line is "gpu-compile-check: ...".
# Deps: sh tools/install-deps.sh
set -u
cd "$(dirname "$0")/.." || exit 2
CLANG=${CLANG:-clang++-19}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${HIP_ARCH:-gfx1201}
out=$(mktemp -d /tmp/radiance-gpu-check.XXXXXX)
trap 'rm -rf "$out"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "  ok    $*"; }
bad() { fail=$((fail + 1)); echo "  FAIL  $*"; }

echo "== AMD $ARCH with $CLANG"
if ! command -v "$CLANG" >/dev/null 2>&1; then
	bad "$CLANG not found (sh tools/install-deps.sh)"
else
	wmma_total=0
	for src in kernels/*.hip; do
		name=$(basename "$src" .hip)
		s="$out/$name-$ARCH.s"
		if ! "$CLANG" -x hip --offload-arch="$ARCH" -nogpulib -O3 -std=c++17 -Ikernels -Idaemon \
			--cuda-device-only -S "$src" -o "$s" 2>"$out/$name.err"; then
			bad "$name: device compile failed"
			sed 's/^/        /' "$out/$name.err" | head -20
			continue
		fi
		if ! "$CLANG" -x hip --offload-arch="$ARCH" -nogpulib -O3 -std=c++17 -fPIC -Ikernels -Idaemon \
			-c "$src" -o "$out/$name.o" 2>"$out/$name.err"; then
			bad "$name: fat object (host + device) failed"
			sed 's/^/        /' "$out/$name.err" | head -20
			continue
		fi
		# per kernel: name, VGPRs, SGPRs, scratch, spills from the code object metadata
		awk -v file="$name" '
			/^[ ]+\.name:/            { kname = $2 }
			/^[ ]+\.private_segment_fixed_size:/ { scratch = $2 }
			/^[ ]+\.sgpr_count:/      { sgpr = $2 }
			/^[ ]+\.sgpr_spill_count:/ { sspill = $2 }
			/^[ ]+\.vgpr_count:/      { vgpr = $2 }
			/^[ ]+\.vgpr_spill_count:/ {
				vspill = $2
				printf "%s %s %s %s %s %s %s\n", file, kname, vgpr, sgpr, scratch, vspill, sspill
			}' "$s" >"$out/$name.meta"
		while read -r f k vgpr sgpr scratch vspill sspill; do
			if [ "$scratch" = 0 ] && [ "$vspill" = 0 ] && [ "$sspill" = 0 ]; then
				ok "$f: $k: VGPRs $vgpr, SGPRs $sgpr, scratch 0, no spills"
			else
				bad "$f: $k: VGPRs $vgpr, SGPRs $sgpr, scratch $scratch bytes, spills VGPR $vspill SGPR $sspill"
			fi
		done <"$out/$name.meta"
		[ -s "$out/$name.meta" ] || ok "$name: compiled (host code only, no kernels)"
		n=$(grep -c 'v_wmma_f32_16x16x16_fp8_fp8' "$s")
		wmma_total=$((wmma_total + n))
		if [ "$name" = w4a8_mma ]; then
			if [ "$n" -gt 0 ]; then
				ok "$name: $n v_wmma_f32_16x16x16_fp8_fp8 instructions"
			else
				bad "$name: no v_wmma_f32_16x16x16_fp8_fp8 in the W4A8 matrix-core kernel"
			fi
		fi
	done
	echo "  ($wmma_total fp8 WMMA instructions in all $ARCH code)"
fi

echo "== NVIDIA sm_90a with $NVCC"
if [ ! -x "$NVCC" ]; then
	if [ "${RADIANCE_REQUIRE_NVCC:-0}" = 1 ]; then
		bad "nvcc not found"
	else
		echo "  skip  nvcc not installed (set RADIANCE_REQUIRE_NVCC=1 to make that a failure)"
	fi
else
	for src in kernels/*.hip; do
		name=$(basename "$src" .hip)
		if "$NVCC" -x cu -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC \
			-Ikernels -Idaemon -DRADIANCE_GPU_CUDA=1 -Xptxas -v -c "$src" -o "$out/$name.cu.o" \
			>"$out/$name.nv" 2>&1; then
			ok "$name: compiled for sm_90a"
			# "Compiling entry function 'X'" then "N bytes stack frame, ..." then "Used R registers"
			awk '/Compiling entry function/ { k = $7 }
			     /bytes stack frame/ { st = $1; sp = $5 }
			     /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1);
				printf "          %s: %s registers, %s B stack, %s B spill stores\n", k, r, st, sp }' \
				"$out/$name.nv" | sed "s/'//g"
		else
			bad "$name: nvcc failed"
			grep -E 'error' "$out/$name.nv" | head -10 | sed 's/^/        /'
		fi
	done
fi

echo "gpu-compile-check: $pass passed, $fail failed"
[ "$fail" = 0 ]
