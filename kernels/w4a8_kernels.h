/*
 * What the W4A8 kernel files share (C++ only, kernels/*.hip): the kernel
 * parameters, the bf16 epilogue of the definition, and the launchers the
 * dispatcher (w4a8_launch.hip) calls with the plan of w4a8_plan.c. Each
 * launcher is asynchronous on `stream` and returns 0 or -errno
 * (radiance__gpu_check_launch's text names the kernel).
 */
#ifndef RADIANCE_W4A8_KERNELS_H
#define RADIANCE_W4A8_KERNELS_H

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

#define GEMM_WARPS RADIANCE_W4A8_GEMM_WARPS
#define GEMM_THREADS (GEMM_WARPS * 32)

/* One launch's arguments, by value (device pointers and sizes). */
struct gemm_params {
	const uint8_t *codes;
	const float *s;
	const rad_u4 *w;
	const uint8_t *sc;
	const float *bias;
	uint16_t *y;
	float *partials;
	uint32_t *counters;
	uint32_t m, n, k, groups, ntiles, wn, wk;
	const void *x;            /* fused quant (plan.fused): args.x, and whether fp16 */
	uint32_t x_fp16;
};

static inline uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

__device__ __forceinline__ uint16_t out_bf16(float acc, float s, const float *bias, uint32_t n)
{
	RAD_NO_CONTRACT
	float b = bias ? bias[n] : 0.0f;
	return (uint16_t)rad_bf16_from_f32(RAD_FADD(RAD_FMUL(acc, s), b));
}

/* w4a8_mma.hip: the matrix-core kernel (decode and tiled), plan.tok/wk/split */
int radiance__w4a8_mma_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream,
			      int pdl);
/* w4a8_gemv.hip (NVIDIA): the streaming decode kernel, plan.tok/ntw/cg/stages/split;
 * -EINVAL for an instance that is not built */
int radiance__w4a8_gemv_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream,
			       int pdl);
/* w4a8_portable.hip: one thread per output, the CPU reference's order */
int radiance__w4a8_portable_launch(const gemm_params &p, void *stream);
/* w4a8_wgmma.hip: the sm_90a prefill with `tile` (128 or 96) tokens per block;
 * -ENOTSUP where it is not built */
extern "C" int radiance__w4a8_wgmma_launch(const uint8_t *codes, const float *s, const void *w,
					   const void *sc, const float *bias, uint16_t *y, uint32_t m,
					   uint32_t n, uint32_t k, uint32_t tile, void *stream);

#endif
