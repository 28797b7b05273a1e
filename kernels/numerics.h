/*
 * radiance numerics: the one definition every backend follows.
 *
 * This header is the executable form of docs/numerics.md. The CPU backend
 * (kernels/w4a8_cpu.c) is built from these functions and is the reference
 * every GPU path is compared with; the GPU kernels re-implement the same
 * steps and must produce the same activation codes bit for bit.
 *
 * W4A8 linear, y[M, N] = x[M, K] * W^T + bias:
 *
 *   Weight. An AutoRound `auto_round:auto_gptq` int4 code c (0..15) means the
 *   integer c - 8 (symmetric, zero point 8; the checkpoint stores zero-1 = 7 in
 *   every qzeros nibble, verified at load). w[n][k] = (c - 8) * scales[k/128][n],
 *   scales fp16. The integers -8..7 are all exact in e4m3, so the zero point is
 *   folded into the unpack and never enters the matmul.
 *
 *   Activations. x is bf16 or fp16. Each row (token) m is quantized to OCP fp8
 *   e4m3 (e4m3fn: no infinities, max finite 448, NaN = S.1111.111) as vLLM's
 *   dynamic per-token quant does (scaled_fp8_quant, use_per_token_if_dynamic):
 *       amax_m = max_k |x[m][k]|                       (fp32)
 *       s_m    = max(amax_m / 448, 1 / (448 * 512))    (fp32)
 *       q[m][k]= e4m3_rne_sat(x[m][k] * (1 / s_m))     (fp32 multiply by the
 *                                                       fp32 reciprocal)
 *   e4m3_rne_sat rounds to nearest, ties to even, and saturates finite values
 *   beyond 448 to +-448. A row holding any Inf or NaN gets s_m = NaN and every
 *   code 0x7F, so its whole output row is NaN. An all-zero row gets
 *   s_m = 1/(448*512) and codes 0, so its output is exactly the bias (zeros
 *   without bias), never NaN.
 *
 *   Accumulate. In fp32: one partial sum per 128-group g,
 *       p_g = sum_{k in g} e4m3(q[m][k]) * (c[n][k] - 8)
 *   (each product is exact in fp32), then
 *       acc = sum_g p_g * scales[g][n]
 *       y   = bf16_rne(acc * s_m + bias[n])
 *   rounded once, to bf16, round-to-nearest-even. The order of the fp32 sums is
 *   not part of the definition: backends may differ in the last fp32 bits, so
 *   outputs agree to the bf16 rounding floor, not bit for bit.
 *
 *   bf16 linears (layers the checkpoint keeps at 16 bits): no fp8 step; x and
 *   the bf16 weight widened to fp32, fp32 accumulate, + bias, bf16 RNE.
 *
 * All functions here are pure, reentrant and thread-safe.
 */
#ifndef RADIANCE_NUMERICS_H
#define RADIANCE_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define RADIANCE_GROUP_SIZE 128      /* int4 group size along K */
#define RADIANCE_PACK 8              /* int4 codes per 32-bit word */
#define RADIANCE_ZERO_POINT 8        /* symmetric zero: code c means c - 8 */
#define RADIANCE_E4M3_MAX 448.0f     /* OCP e4m3fn largest finite value */
#define RADIANCE_E4M3_NAN 0x7F       /* the code a non-finite row gets */
/* vLLM's floor on the per-token scale: 1 / (448 * 512). */
#define RADIANCE_MIN_SCALE (1.0f / (448.0f * 512.0f))

/* Element types of activations crossing the ring (outputs are always bf16). */
enum radiance_dtype {
	RADIANCE_DTYPE_BF16 = 1,
	RADIANCE_DTYPE_FP16 = 2,
};

static inline float radiance_f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static inline uint32_t radiance_f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float radiance_bf16_to_f32(uint16_t h)
{
	return radiance_f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> bf16, round to nearest even; NaN becomes the quiet NaN 0x7FC0
 * (sign kept), Inf stays Inf, overflow rounds to Inf as IEEE does. */
static inline uint16_t radiance_bf16_from_f32(float f)
{
	uint32_t u = radiance_f32_bits(f);
	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7FFFu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* IEEE binary16 -> fp32, exact for every input (subnormals, Inf, NaN). */
static inline float radiance_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1Fu;
	uint32_t man = h & 0x3FFu;
	if (exp == 0x1F)
		return radiance_f32_from_bits(sign | 0x7F800000u | (man << 13));
	if (exp == 0) {
		/* zero or subnormal: man * 2^-24, exact in fp32 */
		float v = (float)man * 0x1p-24f;
		return sign ? -v : v;
	}
	return radiance_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* One activation element (bf16 or fp16 bits, as dtype says) -> fp32, exact. */
static inline float radiance_x_to_f32(uint16_t x, enum radiance_dtype dtype)
{
	return dtype == RADIANCE_DTYPE_FP16 ? radiance_f16_to_f32(x) : radiance_bf16_to_f32(x);
}

/* e4m3fn code -> fp32, exact. 0x7F / 0xFF are NaN. */
static inline float radiance_e4m3_to_f32(uint8_t c)
{
	uint32_t exp = (c >> 3) & 0xFu;
	uint32_t man = c & 0x7u;
	float v;
	if (exp == 0xF && man == 0x7)
		return NAN;
	if (exp == 0)
		v = (float)man * 0x1p-9f;               /* subnormal: man/8 * 2^-6 */
	else
		v = ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7);
	return (c & 0x80) ? -v : v;
}

/* fp32 -> e4m3fn: round to nearest even, saturate finite overflow to +-448,
 * NaN -> 0x7F, +-Inf -> +-448 (saturating, as a scaled finite input cannot be
 * Inf; the per-token path never passes Inf here). */
static inline uint8_t radiance_e4m3_from_f32(float f)
{
	uint32_t u = radiance_f32_bits(f);
	uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
	uint32_t a = u & 0x7FFFFFFFu;
	if (a > 0x7F800000u)
		return RADIANCE_E4M3_NAN;
	/* 464 is the midpoint between 448 and the (absent) 480: at or above it
	 * RNE would overflow, below it rounds to 448 at most. Saturate all. */
	if (a >= 0x43E00000u)                      /* 448.0f */
		return sign | 0x7E;
	if (a < 0x3C800000u) {                     /* below 2^-6: subnormal range */
		/* value / 2^-9 rounded to nearest even integer, 0..8 (8 = 2^-6,
		 * the smallest normal, code 0x08, which is also man=0 exp=1). */
		float q = radiance_f32_from_bits(a) * 512.0f;   /* exact scaling */
		float r = nearbyintf(q);                         /* FE_TONEAREST */
		return sign | (uint8_t)r;
	}
	/* normal: keep 3 mantissa bits, RNE on the 20 dropped bits */
	uint32_t exp = (a >> 23) - 127 + 7;        /* 1..15 */
	uint32_t man = a & 0x7FFFFFu;
	uint32_t keep = man >> 20;
	uint32_t rest = man & 0xFFFFFu;
	if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u)))
		keep++;
	if (keep == 8) {
		keep = 0;
		exp++;
	}
	if (exp > 15 || (exp == 15 && keep == 7))
		return sign | 0x7E;
	return sign | (uint8_t)((exp << 3) | keep);
}

#endif
