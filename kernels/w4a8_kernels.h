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

/* One launch's arguments, by value (device pointers and sizes). Row t of
 * y is at y + t*n, or at yrow[t] when y_rows (radiance__w4a8_args.y_rows:
 * several requests' y in place, t < RADIANCE_W4A8_Y_ROWS_MAX). */
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
	uint32_t y16;              /* n % 8 == 0 and every row starts 16-byte aligned */
	uint32_t y_rows;           /* 1: rows at yrow[] */
	uint16_t *yrow[RADIANCE_W4A8_Y_ROWS_MAX];
};

static inline uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

__device__ __forceinline__ uint16_t out_bf16(float acc, float s, const float *bias, uint32_t n)
{
	RAD_NO_CONTRACT
	float b = bias ? bias[n] : 0.0f;
	return (uint16_t)rad_bf16_from_f32(RAD_FADD(RAD_FMUL(acc, s), b));
}

__device__ __forceinline__ uint16_t *y_row(const gemm_params &P, uint32_t t)
{
	return P.y_rows ? P.yrow[t] : P.y + (size_t)t * P.n;
}

/* Outputs n0 .. n0+7 of row t (n0 % 8 == 0, n0 < n), bf16 two to a word,
 * the lower n in the low half: one 16-byte store where y allows it (y16),
 * else a 2-byte store per output below n. Whole pieces are what PCIe wants
 * when y is registered host memory (docs/gpu.md "Moving rows"). */
__device__ __forceinline__ void y_store8(const gemm_params &P, uint32_t t, uint32_t n0, const rad_u4 &v)
{
	uint16_t *row = y_row(P, t) + n0;
	if (P.y16) {
		*(rad_u4 *)row = v;
		return;
	}
	const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (uint32_t e = 0; e < 8; e++)
		if (n0 + e < P.n)
			row[e] = (uint16_t)(w[e >> 1] >> (16 * (e & 1)));
}

/* out_bf16 of v[e] for outputs n0 + e of row t, packed for y_store8; the
 * outputs at n and past it are 0 (bias and s are not read there). */
__device__ __forceinline__ rad_u4 out_bf16x8(const gemm_params &P, const float (&v)[8], uint32_t t, uint32_t n0,
					    const float *s)
{
	uint32_t w[4];
#pragma unroll
	for (uint32_t i = 0; i < 4; i++) {
		const uint32_t lo = n0 + 2 * i < P.n ? out_bf16(v[2 * i], s[t], P.bias, n0 + 2 * i) : 0u;
		const uint32_t hi = n0 + 2 * i + 1 < P.n ? out_bf16(v[2 * i + 1], s[t], P.bias, n0 + 2 * i + 1) : 0u;
		w[i] = lo | hi << 16;
	}
	const rad_u4 r = {w[0], w[1], w[2], w[3]};
	return r;
}

/* Global split-K, the last block of a column: outputs [n0, n0 + bn) (bn %
 * 8 == 0) of every row, each the sum of the partials [split][m][n] in split
 * order (deterministic), 8 outputs of a row per thread and pass, stored by
 * y_store8. */
__device__ __forceinline__ void splitk_fixup(const gemm_params &P, uint32_t n0, uint32_t bn, uint32_t nsplit,
					     uint32_t tid, uint32_t nthreads, const float *s)
{
	const uint32_t pieces = bn / 8;
	for (uint32_t idx = tid; idx < pieces * P.m; idx += nthreads) {
		const uint32_t nb = n0 + idx % pieces * 8, t = idx / pieces;
		if (nb >= P.n)
			continue;
		float v[8];
#pragma unroll
		for (int e = 0; e < 8; e++)
			v[e] = 0.f;
		for (uint32_t sp = 0; sp < nsplit; sp++) {
			const float *pp = P.partials + ((size_t)sp * P.m + t) * P.n + nb;
#pragma unroll
			for (uint32_t e = 0; e < 8; e++)
				if (nb + e < P.n)
					v[e] += rad_ld_cg(pp + e);
		}
		y_store8(P, t, nb, out_bf16x8(P, v, t, nb, s));
	}
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
/* Each file's part of radiance__gpu_preload (w4a8_gpu.h): loads the kernels
 * its launcher can pick, with the attributes their launches set; adds how
 * many to *count. 0 or -EIO. */
int radiance__w4a8_mma_preload(unsigned *count);
int radiance__w4a8_gemv_preload(unsigned *count);   /* NVIDIA (RAD_HAVE_BULK) */
int radiance__w4a8_portable_preload(unsigned *count);
/* w4a8_wgmma.hip, the sm_90a prefill, codes in the WGMMA order; -ENOTSUP
 * where it is not built. The fp8 wgmma kernel (prefill = fast) with `tile`
 * (128 or 96) tokens per block: */
extern "C" int radiance__w4a8_wgmma_launch(const uint8_t *codes, const float *s, const void *w,
					   const void *sc, const float *bias, uint16_t *y, uint32_t m,
					   uint32_t n, uint32_t k, uint32_t tile, void *stream);
/* the f16 wgmma kernel with fp32 accumulation (prefill = exact), plan.tok
 * (64 or 128) tokens per block and plan.split blocks along K (split > 1: one
 * token block, p.partials and p.counters as the decode kernels use them);
 * -EINVAL for another plan */
int radiance__w4a8_wgmma_exact_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream);

#endif
