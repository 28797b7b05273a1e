/*
 * The CPU fast path's AArch64 Advanced SIMD (NEON) kernels. Advanced SIMD
 * is part of every AArch64 Linux machine, so nothing is checked at run time;
 * cpu_fast.c takes this level wherever it is built for aarch64.
 *
 * Bit-exact with the scalar reference kernels/w4a8_cpu.c, for the reasons
 * cpu_avx2.c gives (the same fp32 operations in the same order); a 128-bit
 * register holds four fp32 lanes, so each of the reference's eight lane
 * accumulators of a group is lane i of a pair of registers:
 *  - the reference's dot_group() keeps eight accumulators, lane i summing
 *    the products of k = 8t + i for t = 0..15 in turn; here lanes 0..3 live
 *    in one register and 4..7 in another, one qweight word (k = 8t .. 8t+7)
 *    per step. Each product e4m3 * (c - 8) is exact in fp32 (at most 4 x 4
 *    significant bits), so the fused multiply-add (FMLA) rounds exactly
 *    where the reference's separate add does;
 *  - the two registers added give (a0+a4, a1+a5, a2+a6, a3+a7), and two
 *    pairwise adds (FADDP) the reference's ((a0+a4)+(a1+a5)) +
 *    ((a2+a6)+(a3+a7)), four outputs at once;
 *  - the group sums are scaled and added group after group, multiply and
 *    add rounded separately (that product is inexact: no FMA there);
 *  - y = bf16_rne(acc * s + bias), again unfused.
 * Weights are (c - 8) * 2^28 (a nibble moved to the top of an int32 lane,
 * converted) and activations e4m3 * 2^-28, as on avx2: both scalings exact.
 *
 * bf16 linears: a lane per output column, each summing its products in K
 * order (bf16 x bf16 and fp16 x bf16 products are exact in fp32, so FMLA is
 * the reference's multiply then add), as radiance_cpu_bf16().
 *
 * Tested under user-mode emulation (tests/test_cpu_neon.sh, qemu-aarch64):
 * correctness only; no ARM hardware has run or timed these kernels.
 */
#include "cpu_simd.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* 4 elements of x (bf16 or fp16 bits) to fp32, exactly. */
INLINE float32x4_t load_x4(const uint16_t *x, enum radiance_dtype dtype)
{
	uint16x4_t h = vld1_u16(x);
	if (dtype == RADIANCE_DTYPE_FP16)
		return vcvt_f32_f16(vreinterpret_f16_u16(h));
	return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* The e4m3 value radiance_e4m3_from_f32() rounds f to, as fp32 (the value
 * the reference's decode table gives for that code); cpu_avx2.c e4m3_round
 * on four lanes. */
INLINE float32x4_t e4m3_round(float32x4_t f)
{
	const uint32x4_t b = vreinterpretq_u32_f32(f);
	const uint32x4_t sign = vandq_u32(b, vdupq_n_u32(0x80000000u));
	const uint32x4_t a = vandq_u32(b, vdupq_n_u32(0x7FFFFFFFu));
	/* normal range: RNE on the 20 mantissa bits e4m3 drops */
	uint32x4_t r = vaddq_u32(a, vaddq_u32(vdupq_n_u32(0x7FFFFu),
					      vandq_u32(vshrq_n_u32(a, 20), vdupq_n_u32(1))));
	uint32x4_t sat = vcgtq_u32(vshrq_n_u32(r, 20), vdupq_n_u32(0x43E));
	uint32x4_t vn = vbslq_u32(sat, vdupq_n_u32(0x43E00000u), vandq_u32(r, vdupq_n_u32(0xFFF00000u)));
	/* below 2^-6: a multiple of 2^-9, rounded to nearest even */
	float32x4_t q = vrndnq_f32(vmulq_f32(vreinterpretq_f32_u32(a), vdupq_n_f32(512.0f)));
	uint32x4_t vs = vreinterpretq_u32_f32(vmulq_f32(q, vdupq_n_f32(0x1p-9f)));
	uint32x4_t sub = vcltq_u32(a, vdupq_n_u32(0x3C800000u));
	uint32x4_t v = vorrq_u32(vbslq_u32(sub, vs, vn), sign);
	/* NaN: code 0x7F, which decodes to the positive quiet NaN */
	uint32x4_t nan = vcgtq_u32(a, vdupq_n_u32(0x7F800000u));
	return vreinterpretq_f32_u32(vbslq_u32(nan, vreinterpretq_u32_f32(vdupq_n_f32(NAN)), v));
}

float radiance__quant_row_neon(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf)
{
	const uint32x4_t expmask = vdupq_n_u32(0x7F800000u);
	float32x4_t amax = vdupq_n_f32(0.0f);
	uint32x4_t bad = vdupq_n_u32(0);
	for (uint32_t i = 0; i < k; i += 4) {
		float32x4_t v = load_x4(x + i, dtype);
		bad = vorrq_u32(bad, vceqq_u32(vandq_u32(vreinterpretq_u32_f32(v), expmask), expmask));
		amax = vmaxq_f32(amax, vabsq_f32(v));
	}
	if (vmaxvq_u32(bad)) {
		const float32x4_t nan = vdupq_n_f32(NAN);
		for (uint32_t i = 0; i < k; i += 4)
			vst1q_f32(xf + i, nan);
		return NAN;
	}
	/* max is exact in any order; no NaN can be left here */
	float am = vmaxvq_f32(amax);
	float s = fmaxf(am / RADIANCE_E4M3_MAX, RADIANCE_MIN_SCALE);
	float inv = 1.0f / s;
	const float32x4_t vinv = vdupq_n_f32(inv), down = vdupq_n_f32(0x1p-28f);
	for (uint32_t i = 0; i < k; i += 4)
		vst1q_f32(xf + i, vmulq_f32(e4m3_round(vmulq_f32(load_x4(x + i, dtype), vinv)), down));
	return s;
}

void radiance__widen_row_neon(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf)
{
	uint32_t i = 0;
	for (; i + 4 <= k; i += 4)
		vst1q_f32(xf + i, load_x4(x + i, dtype));
	for (; i < k; i++)
		xf[i] = radiance_x_to_f32(x[i], dtype);
}

/* ---- W4A8 ------------------------------------------------------------------ */

/* c ^ 8 read as a signed nibble is c - 8: the flip each qweight word gets. */
#define W4_FLIP 0x88888888u

/* A flipped qweight word (k = 8t .. 8t+7) to its eight weights, (c - 8) *
 * 2^28 each: lane l of lo takes nibble l, of hi nibble 4 + l, moved to bits
 * 28..31 with the rest cleared, then converted. */
INLINE void w4_lanes(uint32_t word, float32x4_t *lo, float32x4_t *hi)
{
	static const int32_t sh_lo[4] = { 28, 24, 20, 16 }, sh_hi[4] = { 12, 8, 4, 0 };
	const uint32x4_t w = vdupq_n_u32(word), top = vdupq_n_u32(0xF0000000u);
	*lo = vcvtq_f32_s32(vreinterpretq_s32_u32(vandq_u32(vshlq_u32(w, vld1q_s32(sh_lo)), top)));
	*hi = vcvtq_f32_s32(vreinterpretq_s32_u32(vandq_u32(vshlq_u32(w, vld1q_s32(sh_hi)), top)));
}

/* Four outputs' group sums from their lane pairs: output o of the result is
 * ((a0+a4)+(a1+a5)) + ((a2+a6)+(a3+a7)) of lo[o], hi[o], as dot_group(). */
INLINE float32x4_t tree4(const float32x4_t *lo, const float32x4_t *hi)
{
	float32x4_t s[4];
	for (int o = 0; o < 4; o++)
		s[o] = vaddq_f32(lo[o], hi[o]);
	return vpaddq_f32(vpaddq_f32(s[0], s[1]), vpaddq_f32(s[2], s[3]));
}

/* Most rows and columns of one micro-kernel call: R x C <= 8 outputs. */
#define MICRO_ROWS 4
#define MICRO_SLOTS 8

/* R rows from r0 by C columns from j0, groups [g0, g1) (a K block): output
 * slot r * C + c. The running group sums of earlier K blocks come from and
 * go to state[(column - n0) * MICRO_ROWS + row - r0] (NULL: one K block). */
INLINE void w4a8_micro(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t j0, uint32_t g0,
		       uint32_t g1, float *state, const int R, const int C)
{
	const uint32_t words = t->k / RADIANCE_PACK, groups = t->k / RADIANCE_GROUP_SIZE;
	const int S = R * C, Q = (S + 3) / 4;   /* slots, and quads of slots */
	const uint32_t *q[MICRO_SLOTS];
	const uint16_t *sc[MICRO_SLOTS];
	const float *xr[MICRO_ROWS];
	for (int c = 0; c < C; c++) {
		q[c] = t->qweight + (size_t)(j0 + c) * words;
		sc[c] = t->scales + (size_t)(j0 + c) * groups;
	}
	for (int r = 0; r < R; r++)
		xr[r] = t->xf + (size_t)(r0 + r) * t->ldx;

	float32x4_t gacc[2];
	for (int u = 0; u < Q; u++) {
		float v[4] = { 0, 0, 0, 0 };
		for (int l = 0; l < 4 && g0 > 0; l++) {
			int slot = 4 * u + l;
			if (slot < S)
				v[l] = state[(j0 - t->n0 + (uint32_t)(slot % C)) * MICRO_ROWS + slot / C];
		}
		gacc[u] = vld1q_f32(v);
	}
	for (uint32_t g = g0; g < g1; g++) {
		float32x4_t lo[MICRO_SLOTS], hi[MICRO_SLOTS];
		for (int i = 0; i < 4 * Q; i++)
			lo[i] = hi[i] = vdupq_n_f32(0.0f);
		for (int s = 0; s < RADIANCE_GROUP_SIZE / RADIANCE_PACK; s++) {
			float32x4_t xlo[MICRO_ROWS], xhi[MICRO_ROWS];
			for (int r = 0; r < R; r++) {
				const float *p = xr[r] + g * RADIANCE_GROUP_SIZE + 8 * s;
				xlo[r] = vld1q_f32(p);
				xhi[r] = vld1q_f32(p + 4);
			}
			for (int c = 0; c < C; c++) {
				float32x4_t wlo, whi;
				w4_lanes(q[c][g * 16 + (uint32_t)s] ^ W4_FLIP, &wlo, &whi);
				for (int r = 0; r < R; r++) {
					lo[r * C + c] = vfmaq_f32(lo[r * C + c], xlo[r], wlo);
					hi[r * C + c] = vfmaq_f32(hi[r * C + c], xhi[r], whi);
				}
			}
		}
		for (int u = 0; u < Q; u++) {
			uint16_t h[4] = { 0, 0, 0, 0 };
			for (int l = 0; l < 4; l++) {
				int slot = 4 * u + l;
				if (slot < S)
					h[l] = sc[slot % C][g];
			}
			float32x4_t scale = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
			gacc[u] = vaddq_f32(gacc[u], vmulq_f32(tree4(lo + 4 * u, hi + 4 * u), scale));
		}
	}
	for (int u = 0; u < Q; u++) {
		float v[4];
		vst1q_f32(v, gacc[u]);
		for (int l = 0; l < 4; l++) {
			int slot = 4 * u + l;
			if (slot >= S)
				continue;
			uint32_t row = r0 + (uint32_t)(slot / C), col = j0 + (uint32_t)(slot % C);
			if (g1 < groups) {
				state[(col - t->n0) * MICRO_ROWS + row - r0] = v[l];
				continue;
			}
			float b = t->bias ? t->bias[col] : 0.0f;
			t->y[(size_t)row * t->n + col] = radiance_bf16_from_f32(v[l] * t->s[row] + b);
		}
	}
}

#define W4A8_MICRO(R, C) \
	static void w4a8_micro_##R##_##C(const struct radiance__w4a8_tile *t, uint32_t r0, \
					 uint32_t j0, uint32_t g0, uint32_t g1, float *state) \
	{ w4a8_micro(t, r0, j0, g0, g1, state, R, C); }
W4A8_MICRO(1, 4) W4A8_MICRO(2, 4) W4A8_MICRO(3, 2) W4A8_MICRO(4, 2)
W4A8_MICRO(1, 1) W4A8_MICRO(2, 1) W4A8_MICRO(3, 1) W4A8_MICRO(4, 1)

typedef void (*w4a8_micro_fn)(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t j0,
			      uint32_t g0, uint32_t g1, float *state);
/* by rows (1..4): rows x cols[rows] columns, and rows x 1 for column tails */
static const w4a8_micro_fn w4a8_wide[MICRO_ROWS + 1] = {
	NULL, w4a8_micro_1_4, w4a8_micro_2_4, w4a8_micro_3_2, w4a8_micro_4_2,
};
static const w4a8_micro_fn w4a8_one[MICRO_ROWS + 1] = {
	NULL, w4a8_micro_1_1, w4a8_micro_2_1, w4a8_micro_3_1, w4a8_micro_4_1,
};
static const uint32_t wide_cols[MICRO_ROWS + 1] = { 0, 4, 4, 2, 2 };

/* Activations of one K block of several rows: rows x 128 x groups fp32 in
 * at most 16 KiB (L1), every column of the tile passing over one K block
 * before the next; a column's groups are still summed in order. */
#define K_BLOCK_FLOATS 4096

void radiance__w4a8_tile_neon(const struct radiance__w4a8_tile *t)
{
	const uint32_t groups = t->k / RADIANCE_GROUP_SIZE;
	float state[RADIANCE__TILE_MAX_COLS * MICRO_ROWS];
	for (uint32_t r = t->r0; r < t->r1; r += MICRO_ROWS) {
		uint32_t rows = t->r1 - r < MICRO_ROWS ? t->r1 - r : MICRO_ROWS;
		uint32_t cols = wide_cols[rows];
		uint32_t gstep = rows == 1 ? groups : K_BLOCK_FLOATS / (rows * RADIANCE_GROUP_SIZE);
		for (uint32_t g0 = 0; g0 < groups; g0 += gstep) {
			uint32_t g1 = g0 + gstep < groups ? g0 + gstep : groups;
			uint32_t j = t->n0;
			for (; j + cols <= t->n1; j += cols)
				w4a8_wide[rows](t, r, j, g0, g1, state);
			for (; j < t->n1; j++)
				w4a8_one[rows](t, r, j, g0, g1, state);
		}
	}
}

/* ---- bf16 linears ------------------------------------------------------------ */

/* Four columns' bf16 weights at k .. k+3 transposed: w[i] lane l = column
 * l at k + i, as fp32. */
INLINE void transpose4_bf16(const uint16_t *const *cols, uint32_t k, float32x4_t *w)
{
	uint32x4_t c[4];
	for (int l = 0; l < 4; l++)
		c[l] = vshll_n_u16(vld1_u16(cols[l] + k), 16);
	uint32x4_t t0 = vtrn1q_u32(c[0], c[1]), t1 = vtrn2q_u32(c[0], c[1]);
	uint32x4_t t2 = vtrn1q_u32(c[2], c[3]), t3 = vtrn2q_u32(c[2], c[3]);
	w[0] = vreinterpretq_f32_u64(vtrn1q_u64(vreinterpretq_u64_u32(t0), vreinterpretq_u64_u32(t2)));
	w[1] = vreinterpretq_f32_u64(vtrn1q_u64(vreinterpretq_u64_u32(t1), vreinterpretq_u64_u32(t3)));
	w[2] = vreinterpretq_f32_u64(vtrn2q_u64(vreinterpretq_u64_u32(t0), vreinterpretq_u64_u32(t2)));
	w[3] = vreinterpretq_f32_u64(vtrn2q_u64(vreinterpretq_u64_u32(t1), vreinterpretq_u64_u32(t3)));
}

/* bf16: R rows by eight columns from j (fewer at the end: the missing ones
 * read the last column again and write nothing), register b of a row
 * holding columns j + 4b .. j + 4b + 3. Each lane sums its column in K
 * order, as radiance_cpu_bf16(). */
INLINE void bf16_micro(const struct radiance__bf16_tile *t, uint32_t r0, uint32_t j, const int R)
{
	const uint32_t k = t->k;
	const int valid = t->n1 - j < 8 ? (int)(t->n1 - j) : 8;
	const uint16_t *wc[8];
	const float *xr[MICRO_ROWS];
	for (int l = 0; l < 8; l++)
		wc[l] = t->weight + (size_t)(j + (uint32_t)(l < valid ? l : valid - 1)) * k;
	for (int r = 0; r < R; r++)
		xr[r] = t->xf + (size_t)(r0 + r) * t->ldx;
	float32x4_t acc[MICRO_ROWS][2];
	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
	uint32_t e = 0;
	for (; e + 4 <= k; e += 4) {
		float32x4_t w[2][4];
		transpose4_bf16(wc, e, w[0]);
		transpose4_bf16(wc + 4, e, w[1]);
		for (int r = 0; r < R; r++) {
			float32x4_t xv = vld1q_f32(xr[r] + e);
			for (int b = 0; b < 2; b++) {
				float32x4_t a = acc[r][b];
				a = vfmaq_laneq_f32(a, w[b][0], xv, 0);
				a = vfmaq_laneq_f32(a, w[b][1], xv, 1);
				a = vfmaq_laneq_f32(a, w[b][2], xv, 2);
				a = vfmaq_laneq_f32(a, w[b][3], xv, 3);
				acc[r][b] = a;
			}
		}
	}
	for (; e < k; e++) {   /* K not a multiple of 4 */
		float w[8];
		for (int l = 0; l < 8; l++)
			w[l] = radiance_bf16_to_f32(wc[l][e]);
		for (int r = 0; r < R; r++)
			for (int b = 0; b < 2; b++)
				acc[r][b] = vfmaq_n_f32(acc[r][b], vld1q_f32(w + 4 * b), xr[r][e]);
	}
	for (int r = 0; r < R; r++) {
		float out[8];
		vst1q_f32(out, acc[r][0]);
		vst1q_f32(out + 4, acc[r][1]);
		uint16_t *y = t->y + (size_t)(r0 + (uint32_t)r) * t->n + j;
		for (int l = 0; l < valid; l++)
			y[l] = radiance_bf16_from_f32(out[l] + (t->bias ? t->bias[j + (uint32_t)l] : 0.0f));
	}
}

#define BF16_MICRO(R) \
	static void bf16_micro_##R(const struct radiance__bf16_tile *t, uint32_t r0, uint32_t j) \
	{ bf16_micro(t, r0, j, R); }
BF16_MICRO(1) BF16_MICRO(2) BF16_MICRO(3) BF16_MICRO(4)

typedef void (*bf16_micro_fn)(const struct radiance__bf16_tile *t, uint32_t r0, uint32_t j);
static const bf16_micro_fn bf16_micro_rows[MICRO_ROWS + 1] = {
	NULL, bf16_micro_1, bf16_micro_2, bf16_micro_3, bf16_micro_4,
};

void radiance__bf16_tile_neon(const struct radiance__bf16_tile *t)
{
	for (uint32_t r = t->r0; r < t->r1; r += MICRO_ROWS) {
		uint32_t rows = t->r1 - r < MICRO_ROWS ? t->r1 - r : MICRO_ROWS;
		for (uint32_t j = t->n0; j < t->n1; j += 8)
			bf16_micro_rows[rows](t, r, j);
	}
}

#endif
