/*
 * What each W4A8 path guarantees against the exact definition of
 * kernels/numerics.h, as a computable bound per output element
 * (docs/numerics.md "Contract"). Plain C, used by the CPU tests
 * (tests/test_numerics_bound.c), the GPU tests (tests/test_gpu.c), the
 * daemon's numerics gate (daemon/backend_gpu.c) and tools/radiance-numerics.
 *
 * The exact value of output (m, n) is, in real arithmetic on the e4m3 codes,
 *
 *   y*  = s_m * sum_g scale_g * P_g + bias_n,   P_g = sum_{k in g} q_k * w_k
 *
 * (q_k the e4m3 value of code k, w_k = c_k - 8, each product exact in fp32).
 * A path may reorder and round the fp32 sums as the definition allows; the
 * bound adds, per group g, the worst error of P_g under the path's
 * accumulation, to the first-order fp32 error of the rest, and one bf16
 * step of the output:
 *
 *   e       = 1.01 (|s_m| sum_g |scale_g| e_g + 2^-24 ((G + 3) |s_m| sum_g |scale_g| S_g + |bias|))
 *   allowed = e + bf16_step(|y*| + e)
 *
 * (1.01: second-order terms; bf16_step(x) = 2^(floor(log2 x) - 7), the
 * spacing of bf16 values at x, 2^-133 below the normal range)
 *
 * with S_g = sum_{k in g} |q_k * w_k| and e_g:
 *   RADIANCE_ACC_FP32 (CPU, portable, f16 tensor cores with fp32
 *     accumulation, gfx12 fp8 WMMA): e_g = 4 * 2^-24 * 128 * S_g: four times
 *     the bound of 127 IEEE fp32 additions in any order, which also covers
 *     tensor cores that align each k16 step's products to the largest and
 *     truncate with at least 23 fraction bits (8 steps x 17 addends x 2^-23
 *     = 2^-24 * 272 < 512: the NVIDIA f16 MMA as published measurements
 *     model it);
 *   RADIANCE_ACC_FP8_SM90 (Hopper fp8 wgmma / mma.sync): each k32 step j
 *     aligns its 32 products and the running partial to the largest exponent
 *     E_j and keeps bits down to 2^(E_j - F), truncating, then truncates the
 *     sum to F fraction bits (an e8mF result); F = 13 was measured
 *     (DeepSeek-V3 3.5.2, SageAttention2's FP22 accumulator), the bound takes
 *     F = RADIANCE_FP8_SM90_BOUND_BITS = 12, one bit of margin. So, over the
 *     steps j with any nonzero product (nz_j of them; the partial is the
 *     other addend),
 *       e_g = sum_j 2^-F ((nz_j + 1) 2^E_j + A_j),
 *     E_j = floor(log2 max(max_{k in step j} |q_k w_k|, A_{j-1})), A_j the
 *     sum of |q_k w_k| over steps 1..j (A_j bounds the partial after j): each
 *     aligned addend loses less than 2^(E_j - F), the truncated sum less than
 *     2^-F of its magnitude.
 *
 * Thread safety: pure functions.
 */
#ifndef RADIANCE_NUMERICS_BOUND_H
#define RADIANCE_NUMERICS_BOUND_H

#include <stddef.h>
#include <stdint.h>

enum radiance_acc {
	RADIANCE_ACC_FP32 = 0,       /* fp32 accumulation in any order */
	RADIANCE_ACC_FP8_SM90 = 1,   /* Hopper fp8 tensor cores: 14-bit aligned, truncating */
};

#define RADIANCE_FP8_SM90_BITS 13         /* fraction bits measured on sm_90 */
#define RADIANCE_FP8_SM90_BOUND_BITS 12   /* what the bound assumes (one bit of margin) */
#define RADIANCE_FP8_SM90_STEP 32         /* products aligned together (one k32 wgmma step) */

/* The norm bound of the contract: the relative Frobenius difference of a
 * layer's outputs from the CPU reference, every path (the bf16 floor). */
#define RADIANCE_NORM_BOUND 2e-3

/* One output element: codes [k] (e4m3, natural order) and s of its token
 * row, qrow [k/8] and srow [k/128] (fp16 bits) of its output row in the
 * canonical layout (daemon/model.h), bias (0 without one); k % 128 == 0.
 * *exact gets y* (NaN when s is), *allowed the bound above (NaN then too). */
void radiance_w4a8_bound(const uint8_t *codes, float s, const uint32_t *qrow, const uint16_t *srow,
			 float bias, uint32_t k, enum radiance_acc acc, double *exact, double *allowed);

/* A layer's outputs y [m][n] (bf16) against the bound. */
struct radiance_bound_report {
	size_t checked;            /* finite elements compared */
	size_t outside;            /* |y - y*| > allowed */
	size_t nan_mismatch;       /* y NaN where y* is not, or the other way */
	double worst;              /* max |y - y*| / allowed (<= 1: all inside) */
	size_t worst_at;           /* its index m * n + n */
	double worst_y, worst_exact, worst_allowed;
	double rel_frob;           /* ||y - y*|| / ||y*||, finite elements */
};

/* codes [m][k], s [m] (as radiance_quant_row_e4m3 gives them), qweight
 * [n][k/8], scales [n][k/128], bias [n] or NULL, y [m][n] bf16. 0, or
 * -EINVAL for k not a multiple of 128 (report zeroed). */
int radiance_w4a8_bound_check(const uint8_t *codes, const float *s, const uint32_t *qweight,
			      const uint16_t *scales, const float *bias, uint32_t m, uint32_t n, uint32_t k,
			      enum radiance_acc acc, const uint16_t *y, struct radiance_bound_report *r);

/* Emulation of one group's partial P_g on the Hopper fp8 model with `bits`
 * fraction bits (RADIANCE_FP8_SM90_BITS for the measured hardware): 128
 * products (each exact in fp32), in k32 steps, the partial carried from step
 * to step in the tensor core's e8m<bits> format. For tests: the bound must
 * hold for it. */
float radiance_fp8_sm90_group(const float *products, unsigned bits);

/* y [m][n] bf16 as the fp8 path computes it on that model: each group's
 * partial by radiance_fp8_sm90_group, then acc += P_g * scale_g (fp32, in
 * group order), y = bf16(acc * s_m + bias). Arguments as bound_check. */
int radiance_w4a8_fp8_sm90_emulate(const uint8_t *codes, const float *s, const uint32_t *qweight,
				   const uint16_t *scales, const float *bias, uint32_t m, uint32_t n,
				   uint32_t k, unsigned bits, uint16_t *y);

#endif
