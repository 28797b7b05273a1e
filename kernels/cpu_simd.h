/*
 * Private to kernels/cpu_fast.c: the SIMD kernels behind the CPU fast path.
 * Each set lives in its own file, compiled with that instruction set enabled
 * (the Makefile's per-file flags), and is only called after cpu_fast.c has
 * checked at run time that the CPU has it.
 */
#ifndef RADIANCE_CPU_SIMD_H
#define RADIANCE_CPU_SIMD_H

#include <stdint.h>

#include "numerics.h"

/* Most columns of one W4A8 tile with more than one row (its K-blocked
 * running sums live on the stack: 32 bytes a column). */
#define RADIANCE__TILE_MAX_COLS 1024

/* Most rows of one W4A8 tile (cpu_avx2.c keeps running sums for each block
 * of 4 rows by 3 columns of its unpacked weights on the stack). */
#define RADIANCE__TILE_MAX_ROWS 64
/* Fewest rows of a W4A8 tile for which the avx2 level unpacks the tile's
 * weights once and streams them to every block of 4 rows (w4a8_deq_tiles):
 * each unpacked weight serves rows / 4 micro-kernel calls, and with fewer
 * rows the unpacking costs more than the loads it saves (measured with
 * bench_cpu: about 0.9x at M=16 on the 27B shapes, 1.1-1.3x at M >= 64 on
 * MiniLM's; docs/cpu.md). */
#define RADIANCE__DEQ_MIN_ROWS 32

/* One tile of a W4A8 GEMM: rows [r0, r1) (at most RADIANCE__TILE_MAX_ROWS)
 * by columns [n0, n1).
 * xf: e4m3 activations * 2^-28 fp32 [m][ldx]; s: per-token scales [m]. */
struct radiance__w4a8_tile {
	const float *xf;           /* avx2, neon */
	const int16_t *xh, *xl;    /* integer kernel: x as 8 * hi + lo (cpu_avx2.c) */
	const uint16_t *xb;        /* avx512: e4m3 values as bf16, rows in pairs (cpu_avx512.c) */
	const uint8_t *lof;        /* [m][ldg]: nonzero where a row's group has a lo */
	uint32_t ldg;
	const float *s;
	uint32_t ldx, k, n;
	uint32_t r0, r1, n0, n1;
	const uint32_t *qweight;   /* [n][k/8] */
	const uint16_t *scales;    /* fp16 [n][k/128] */
	const float *bias;         /* [n] or NULL */
	uint16_t *y;               /* bf16 [m][n] */
};

/* One tile of a bf16 linear, the same shape; xf is x widened to fp32. */
struct radiance__bf16_tile {
	const float *xf;
	uint32_t ldx, k, n;
	uint32_t r0, r1, n0, n1;
	const uint16_t *weight;    /* bf16 [n][k] */
	const float *bias;
	uint16_t *y;
};

#if defined(__x86_64__)
/* Per-token quant of one row of k (multiple of 8) elements, as
 * radiance_quant_row_e4m3(), writing the e4m3 values (not the codes) times
 * 2^-28 (exact) as fp32 to xf, the scaling radiance__w4a8_tile_avx2 expects. Returns s_m (NaN for a row holding Inf/NaN, xf all NaN then). */
float radiance__quant_row_avx2(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf);
/* x row widened to fp32 (exact), any k. */
void radiance__widen_row_avx2(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf);
void radiance__w4a8_tile_avx2(const struct radiance__w4a8_tile *t);
/* Per-token quant of one row of k (multiple of 128) to the integer kernel's
 * layout (cpu_avx2.c): hi/lo int16 [k] and a flag per group. Same codes and
 * s_m as radiance_quant_row_e4m3(); NaN for a row holding Inf/NaN (hi and
 * the flags zero then). */
float radiance__quant_row_i16_avx2(const uint16_t *x, enum radiance_dtype dtype, uint32_t k,
				   int16_t *xh, int16_t *xl, uint8_t *lof);
/* The W4A8 tile on 16-bit integer multiply-adds: within one bf16 rounding
 * (plus the reference's fp32 error) of the reference, not bit-exact. */
void radiance__w4a8i_tile_avx2(const struct radiance__w4a8_tile *t);
void radiance__bf16_tile_avx2(const struct radiance__bf16_tile *t);

/* Per-token quant of row r (k a multiple of 128) to the avx512 kernels'
 * layout (cpu_avx512.c): the e4m3 values as bf16, in dot-product order, row
 * pairs interleaved every 16 k; xb 64-byte aligned, ldx a multiple of 16.
 * Same e4m3 values and s_m as radiance_quant_row_e4m3(); NaN for a row
 * holding Inf/NaN (its values all NaN then). */
float radiance__quant_row_avx512(const uint16_t *x, enum radiance_dtype dtype, uint32_t k,
				 uint32_t r, uint32_t ldx, uint16_t *xb);
/* The W4A8 tile on bf16 dot products (vdpbf16ps): bit-exact with the
 * reference. t->r0 even. */
void radiance__w4a8_tile_avx512(const struct radiance__w4a8_tile *t);
#endif

#if defined(__aarch64__)
/* The AArch64 Advanced SIMD kernels (cpu_neon.c), in the avx2 kernels'
 * roles and layouts: the quant writes the e4m3 values times 2^-28 (exact) as
 * fp32 to xf and returns s_m (NaN for a row holding Inf/NaN, xf all NaN
 * then); the widen is exact, any k; both tiles are bit-exact with the
 * reference. */
float radiance__quant_row_neon(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf);
void radiance__widen_row_neon(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf);
void radiance__w4a8_tile_neon(const struct radiance__w4a8_tile *t);
void radiance__bf16_tile_neon(const struct radiance__bf16_tile *t);
#endif

#endif
