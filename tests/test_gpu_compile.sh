#!/bin/sh
# The GPU compile check as part of make check: CI has no GPU, so it compiles
# kernels/*.hip for gfx1201 (Debian's clang-19) and inspects the code object
# (fp8 WMMA present, no scratch or spills, register counts), and for sm_90a
# with nvcc where installed. See tools/gpu-compile-check.sh.
exec sh tools/gpu-compile-check.sh
