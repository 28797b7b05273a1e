/*
 * The CPU fast path's AVX2+FMA kernels (built with -mavx2 -mfma -mf16c, see
 * the Makefile; called only where cpu_fast.c found those at run time).
 *
 * W4A8 is bit-exact with the scalar reference kernels/w4a8_cpu.c, because it
 * performs the same fp32 operations in the same order:
 *  - the reference's dot_group() keeps eight accumulators, lane i summing the
 *    products of k = 8t + i for t = 0..15 in turn; here one ymm accumulator
 *    holds those eight lanes, one qweight word (k = 8t .. 8t+7) per step.
 *    Each product e4m3 * (c - 8) is exact in fp32 (at most 4 x 4 significant
 *    bits), so the fused multiply-add rounds exactly where the reference's
 *    separate add does;
 *  - the eight lanes are reduced as ((a0+a4)+(a1+a5)) + ((a2+a6)+(a3+a7));
 *  - the group sums are scaled and added one group after the other, multiply
 *    and add rounded separately (no FMA there: that product is inexact);
 *  - y = bf16_rne(acc * s + bias), again unfused.
 * The activations are quantized with the same steps as
 * radiance_quant_row_e4m3(); e4m3 rounding is done on the fp32 bits. The
 * kernel's weights are (c - 8) * 2^28 (an int4 nibble at the top of an int32
 * lane, converted) and its activations e4m3 * 2^-28: both scalings are
 * exact, so every product is the reference's.
 *
 * bf16 linears are bit-exact with radiance_cpu_bf16() as well: a lane per
 * output column, each summing its products in K order with the multiply and
 * the add rounded separately, as the reference's scalar loop does.
 */
#include "cpu_simd.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* 8 elements of x (bf16 or fp16 bits) to fp32, exactly (F16C ignores DAZ). */
INLINE __m256 load_x8(const uint16_t *x, enum radiance_dtype dtype)
{
	__m128i h = _mm_loadu_si128((const __m128i *)x);
	if (dtype == RADIANCE_DTYPE_FP16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The e4m3 value radiance_e4m3_from_f32() rounds f to, as fp32 (what the
 * reference's decode table gives for that code). */
INLINE __m256 e4m3_round(__m256 f)
{
	const __m256i b = _mm256_castps_si256(f);
	const __m256i sign = _mm256_and_si256(b, _mm256_set1_epi32((int)0x80000000u));
	const __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
	/* normal range: RNE on the 20 mantissa bits e4m3 drops */
	__m256i r = _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF),
		_mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1))));
	__m256i sat = _mm256_cmpgt_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(0x43E));
	__m256i vn = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFF00000u));
	vn = _mm256_blendv_epi8(vn, _mm256_set1_epi32(0x43E00000), sat);   /* 448 */
	/* below 2^-6: a multiple of 2^-9, rounded to nearest even */
	__m256 q = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f));
	q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256i vs = _mm256_castps_si256(_mm256_mul_ps(q, _mm256_set1_ps(0x1p-9f)));
	__m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C800000), a);
	__m256i v = _mm256_or_si256(_mm256_blendv_epi8(vn, vs, sub), sign);
	/* NaN: code 0x7F, which decodes to the positive quiet NaN */
	__m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
	v = _mm256_blendv_epi8(v, _mm256_castps_si256(_mm256_set1_ps(NAN)), nan);
	return _mm256_castsi256_ps(v);
}

float radiance__quant_row_avx2(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
	const __m256i expmask = _mm256_set1_epi32(0x7F800000);
	__m256 amax = _mm256_setzero_ps();
	__m256i bad = _mm256_setzero_si256();
	for (uint32_t i = 0; i < k; i += 8) {
		__m256 v = load_x8(x + i, dtype);
		__m256i e = _mm256_and_si256(_mm256_castps_si256(v), expmask);
		bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, expmask));
		amax = _mm256_max_ps(amax, _mm256_and_ps(v, absmask));
	}
	if (!_mm256_testz_si256(bad, bad)) {
		const __m256 nan = _mm256_set1_ps(NAN);
		for (uint32_t i = 0; i < k; i += 8)
			_mm256_store_ps(xf + i, nan);
		return NAN;
	}
	/* max is exact in any order; no NaN can be left here */
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
	float am = _mm_cvtss_f32(m4);
	float s = fmaxf(am / RADIANCE_E4M3_MAX, RADIANCE_MIN_SCALE);
	float inv = 1.0f / s;
	const __m256 vinv = _mm256_set1_ps(inv);
	for (uint32_t i = 0; i < k; i += 8)
		_mm256_store_ps(xf + i, _mm256_mul_ps(e4m3_round(_mm256_mul_ps(load_x8(x + i, dtype), vinv)),
						      _mm256_set1_ps(0x1p-28f)));
	return s;
}

void radiance__widen_row_avx2(const uint16_t *x, enum radiance_dtype dtype, uint32_t k, float *xf)
{
	uint32_t i = 0;
	for (; i + 8 <= k; i += 8)
		_mm256_storeu_ps(xf + i, load_x8(x + i, dtype));
	for (; i < k; i++)
		xf[i] = radiance_x_to_f32(x[i], dtype);
}

/* Reduces eight accumulators, each as the reference's dot_group() does
 * (((a0+a4)+(a1+a5)) + ((a2+a6)+(a3+a7))), into one vector whose lanes hold
 * accumulators 0, 2, 4, 6, 1, 3, 5, 7. */
INLINE __m256 hsum8(const __m256 *acc)
{
	__m256 s[4];
	for (int i = 0; i < 4; i++) {
		__m256 lo = _mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x20);
		__m256 hi = _mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x31);
		s[i] = _mm256_add_ps(lo, hi);
	}
	return _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
}

static const int lane_slot[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };

/* gacc + p * scale_g, lane by lane in the order hsum8 leaves (slot s = row
 * s / C, column s % C), multiply and add rounded separately. */
INLINE __m256 add_scaled(__m256 gacc, __m256 p, const uint16_t *const *sc, uint32_t g,
			 const int R, const int C)
{
	uint16_t h[8];
	for (int l = 0; l < 8; l++) {
		int slot = lane_slot[l];
		h[l] = slot < R * C ? sc[slot % C][g] : 0;
	}
	__m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
	return _mm256_add_ps(gacc, _mm256_mul_ps(p, scale));
}

/* c ^ 8 read as a signed nibble is c - 8: the flip each qweight word gets
 * before w4_lanes. */
#define W4_FLIP 0x88888888u

/* One flipped qweight word broadcast to every lane (k = 8t .. 8t+7) to its
 * eight weights: lane l takes nibble l, moved to bits 28..31 with the rest
 * cleared and converted, so (c - 8) * 2^28 exactly (x carries the 2^-28). */
INLINE __m256 w4_lanes(__m256i word)
{
	const __m256i shifts = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
	const __m256i top = _mm256_set1_epi32((int)0xF0000000u);
	return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_sllv_epi32(word, shifts), top));
}

/* y[row][col] = bf16(sum * s[row] + bias[col]), the multiply and the add
 * rounded separately, as the reference. */
INLINE void w4a8_put(const struct radiance__w4a8_tile *t, uint32_t row, uint32_t col, float sum)
{
	float b = t->bias ? t->bias[col] : 0.0f;
	t->y[(size_t)row * t->n + col] = radiance_bf16_from_f32(sum * t->s[row] + b);
}

/* After groups up to g1: the running sums kept for the next K block, or,
 * after the last group, y = bf16(acc * s + bias) unfused. */
INLINE void w4a8_finish(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t j0,
			uint32_t g1, __m256 *state, __m256 gacc, const int R, const int C)
{
	if (g1 < t->k / RADIANCE_GROUP_SIZE) {
		*state = gacc;
		return;
	}
	float out[8];
	_mm256_storeu_ps(out, gacc);
	for (int l = 0; l < 8; l++) {
		int slot = lane_slot[l];
		if (slot >= R * C)
			continue;
		w4a8_put(t, r0 + (uint32_t)(slot / C), j0 + (uint32_t)(slot % C), out[l]);
	}
}

/* R rows from r0 by C columns from j0 (R * C <= 8 accumulators: enough
 * independent FMA chains to cover the FMA latency). */
INLINE void w4a8_micro(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t j0,
		       uint32_t g0, uint32_t g1, __m256 *state, const int R, const int C)
{
	const uint32_t words = t->k / RADIANCE_PACK, groups = t->k / RADIANCE_GROUP_SIZE;
	const __m256i flip = _mm256_set1_epi32((int)W4_FLIP);
	const uint32_t *q[8];
	const uint16_t *sc[8];
	const float *xr[8];
	for (int c = 0; c < C; c++) {
		q[c] = t->qweight + (size_t)(j0 + c) * words;
		sc[c] = t->scales + (size_t)(j0 + c) * groups;
	}
	for (int r = 0; r < R; r++)
		xr[r] = t->xf + (size_t)(r0 + r) * t->ldx;

	/* the running group sums of groups before g0 (a K block ago) */
	__m256 gacc = g0 == 0 ? _mm256_setzero_ps() : *state;
	for (uint32_t g = g0; g < g1; g++) {
		__m256 acc[8];
		for (int i = 0; i < 8; i++)
			acc[i] = _mm256_setzero_ps();
		/* Each column's group is one 64-byte line. The next C columns' rows
		 * are short streams (k/2 bytes) that the hardware prefetcher would
		 * only pick up part way: fetch their line of this group now. A
		 * prefetch past the last column is harmless (it cannot fault). */
		for (int c = 0; c < C; c++)
			_mm_prefetch((const char *)(q[c] + (size_t)C * words + g * 16), _MM_HINT_T0);
		/* flip the group's words once (W4_FLIP) */
		uint32_t fl[8][16] __attribute__((aligned(32)));
		for (int c = 0; c < C; c++) {
			const __m256i *src = (const __m256i *)(q[c] + g * 16);
			_mm256_store_si256((__m256i *)fl[c], _mm256_xor_si256(_mm256_loadu_si256(src), flip));
			_mm256_store_si256((__m256i *)fl[c] + 1,
					   _mm256_xor_si256(_mm256_loadu_si256(src + 1), flip));
		}
		for (int s = 0; s < RADIANCE_GROUP_SIZE / RADIANCE_PACK; s++) {
			/* one column's weights at a time, used by every row at once:
			 * eight accumulators, one weight vector and the constants
			 * fit the sixteen ymm registers */
			for (int c = 0; c < C; c++) {
				__m256 w = w4_lanes(_mm256_set1_epi32((int)fl[c][s]));
				for (int r = 0; r < R; r++) {
					__m256 xv = _mm256_load_ps(xr[r] + g * RADIANCE_GROUP_SIZE + 8 * s);
					acc[r * C + c] = _mm256_fmadd_ps(xv, w, acc[r * C + c]);
				}
			}
		}
		gacc = add_scaled(gacc, hsum8(acc), sc, g, R, C);
	}
	w4a8_finish(t, r0, j0, g1, state, gacc, R, C);
}

#define W4A8_MICRO(R, C) \
	static void w4a8_micro_##R##_##C(const struct radiance__w4a8_tile *t, uint32_t r0, \
					 uint32_t j0, uint32_t g0, uint32_t g1, __m256 *state) \
	{ w4a8_micro(t, r0, j0, g0, g1, state, R, C); }
W4A8_MICRO(1, 8) W4A8_MICRO(2, 4) W4A8_MICRO(3, 2) W4A8_MICRO(4, 2) W4A8_MICRO(5, 1)
W4A8_MICRO(6, 1) W4A8_MICRO(7, 1) W4A8_MICRO(8, 1) W4A8_MICRO(1, 1) W4A8_MICRO(2, 1)
W4A8_MICRO(3, 1) W4A8_MICRO(4, 1)

typedef void (*w4a8_micro_fn)(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t j0,
			      uint32_t g0, uint32_t g1, __m256 *state);
/* by rows: rows x cols_for(rows) columns, and rows x 1 for column tails */
static const w4a8_micro_fn w4a8_wide[9] = {
	NULL, w4a8_micro_1_8, w4a8_micro_2_4, w4a8_micro_3_2, w4a8_micro_4_2,
	w4a8_micro_5_1, w4a8_micro_6_1, w4a8_micro_7_1, w4a8_micro_8_1,
};
static const w4a8_micro_fn w4a8_one[9] = {
	NULL, w4a8_micro_1_1, w4a8_micro_2_1, w4a8_micro_3_1, w4a8_micro_4_1,
	w4a8_micro_5_1, w4a8_micro_6_1, w4a8_micro_7_1, w4a8_micro_8_1,
};

/* Columns of one micro-kernel call by its rows (1..8); and its tails. */
static const uint32_t fp32_cols[9] = { 0, 8, 4, 2, 2, 1, 1, 1, 1 };

/* Rows in blocks of at most 8; with several rows, K in blocks whose
 * activations (rows x 128 x groups, budget / rows groups) fit in 16 KiB of
 * L1, every column of the tile passing over one K block before the next. A
 * column's groups are still summed in order, so the result is unchanged. */
static void w4a8_tiles(const struct radiance__w4a8_tile *t, const w4a8_micro_fn *wide,
		       const w4a8_micro_fn *one, const uint32_t *cols_for, uint32_t budget)
{
	const uint32_t groups = t->k / RADIANCE_GROUP_SIZE;
	__m256 state[RADIANCE__TILE_MAX_COLS];
	for (uint32_t r = t->r0; r < t->r1; r += 8) {
		uint32_t rows = t->r1 - r < 8 ? t->r1 - r : 8;
		uint32_t cols = cols_for[rows];
		uint32_t gstep = rows == 1 ? groups : budget / rows;
		for (uint32_t g0 = 0; g0 < groups; g0 += gstep) {
			uint32_t g1 = g0 + gstep < groups ? g0 + gstep : groups;
			uint32_t j = t->n0;
			/* one K block (gstep == groups) needs no running state */
			const int blocked = gstep < groups;
			for (; j + cols <= t->n1; j += cols)
				wide[rows](t, r, j, g0, g1, blocked ? &state[j - t->n0] : NULL);
			for (; j < t->n1; j++)
				one[rows](t, r, j, g0, g1, blocked ? &state[j - t->n0] : NULL);
		}
	}
}

/* ---- W4A8 for several row blocks: weights unpacked once per tile ----------
 *
 * With many rows the micro-kernels above unpack each column's weights again
 * for every block of rows, and an 8 x 1 tile loads nine vectors for eight
 * FMAs on eight accumulators (too few chains to cover the FMA latency). Here
 * a tile's weights are unpacked once per K block into an L1 buffer of fp32
 * ((c - 8) * 2^28, the same values) for DEQ_COLS columns, and a 4-row by
 * 3-column micro-kernel streams them to every block of 4 rows: per 8 k,
 * seven loads for twelve FMAs on twelve accumulators. Every output keeps
 * w4a8_micro's accumulators (lane i sums k = 8t + i), reduction
 * (hsum8) and group order, so the result is the same bits. Rows past a
 * multiple of 4 go through w4a8_tiles. */
#define DEQ_COLS 12                        /* columns unpacked at once (x 3) */
#define DEQ_GROUPS 4                       /* groups of one K block */

/* hsum8's reduction of four accumulators v0..v3, each as the reference's
 * dot_group() does: lanes 0, 1, 4, 5 hold v0, v2, v1, v3 (the others copies). */
INLINE __m256 hsum4(const __m256 *v)
{
	__m256 s0 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20),
				  _mm256_permute2f128_ps(v[0], v[1], 0x31));
	__m256 s1 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20),
				  _mm256_permute2f128_ps(v[2], v[3], 0x31));
	__m256 h = _mm256_hadd_ps(s0, s1);
	return _mm256_hadd_ps(h, h);
}

/* Columns [j, j + ncols) of groups [g0, g1) to w[c][(g - g0) * 128 + k],
 * their fp32 scales to sc[c][g - g0]. */
static void deq_unpack(const struct radiance__w4a8_tile *t, uint32_t j, uint32_t ncols,
		       uint32_t g0, uint32_t g1, float *restrict w, float *restrict sc)
{
	const uint32_t words = t->k / RADIANCE_PACK, groups = t->k / RADIANCE_GROUP_SIZE;
	const __m256i flip = _mm256_set1_epi32((int)W4_FLIP);
	const uint32_t kb = (g1 - g0) * RADIANCE_GROUP_SIZE;
	for (uint32_t c = 0; c < ncols; c++) {
		const uint32_t *q = t->qweight + (size_t)(j + c) * words + g0 * 16;
		float *wc = w + (size_t)c * kb;
		for (uint32_t i = 0; i < (g1 - g0) * 16; i += 8) {
			/* eight words, each broadcast in turn: lane l takes nibble l */
			__m256i v8 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + i)), flip);
			for (int l = 0; l < 8; l++)
				_mm256_store_ps(wc + 8 * (i + (uint32_t)l),
						w4_lanes(_mm256_permutevar8x32_epi32(v8, _mm256_set1_epi32(l))));
		}
		for (uint32_t g = g0; g < g1; g++)
			sc[c * DEQ_GROUPS + (g - g0)] =
				radiance_f16_to_f32(t->scales[(size_t)(j + c) * groups + g]);
	}
}

/* Rows r .. r+3 by C (1..3) unpacked columns from w (each kb floats), groups
 * [g0, g1). state[0] holds the running sums of columns 0 and 1 (lanes 0-3:
 * rows 0-3 of column 0, 4-7: of column 1), state[1] those of column 2 (rows
 * 0-3 in lanes 0, 4, 1, 5: hsum4's order). */
INLINE void deq_micro(const struct radiance__w4a8_tile *t, uint32_t r, const float *w,
		      uint32_t kb, const float *sc, uint32_t g0, uint32_t g1, __m256 *state,
		      const int C)
{
	const float *x[4];
	for (int i = 0; i < 4; i++)
		x[i] = t->xf + (size_t)(r + (uint32_t)i) * t->ldx + g0 * RADIANCE_GROUP_SIZE;
	const __m256 z = _mm256_setzero_ps();
	__m256 g01 = g0 == 0 ? z : state[0], g2 = g0 == 0 ? z : state[1];
	for (uint32_t g = 0; g < g1 - g0; g++) {
		__m256 acc[12];   /* column c, row i: acc[4 * c + i] */
		for (int i = 0; i < 4 * C; i++)
			acc[i] = z;
		const float *wg = w + g * RADIANCE_GROUP_SIZE;
		const float *xg[4];
		for (int i = 0; i < 4; i++)
			xg[i] = x[i] + g * RADIANCE_GROUP_SIZE;
		for (int s = 0; s < RADIANCE_GROUP_SIZE; s += 8) {
			__m256 wv[3];
			for (int c = 0; c < C; c++)
				wv[c] = _mm256_load_ps(wg + (size_t)c * kb + s);
			for (int i = 0; i < 4; i++) {
				__m256 xv = _mm256_load_ps(xg[i] + s);
				/* one load for every column: kept from being folded
				 * into each FMA (more loads than FMAs can hide) */
				__asm__("" : "+x"(xv));
				for (int c = 0; c < C; c++)
					acc[4 * c + i] = _mm256_fmadd_ps(xv, wv[c], acc[4 * c + i]);
			}
		}
		/* hsum8 gives its inputs in lanes 0, 2, 4, 6, 1, 3, 5, 7: fed as
		 * below, the lanes come out rows 0-3 of column 0, then column 1 */
		__m256 in[8] = { acc[0], C > 1 ? acc[4] : z, acc[1], C > 1 ? acc[5] : z,
				 acc[2], C > 1 ? acc[6] : z, acc[3], C > 1 ? acc[7] : z };
		__m256 scale = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(sc[g])),
						    _mm_set1_ps(C > 1 ? sc[DEQ_GROUPS + g] : 0.0f), 1);
		g01 = _mm256_add_ps(g01, _mm256_mul_ps(hsum8(in), scale));
		if (C > 2)
			g2 = _mm256_add_ps(g2, _mm256_mul_ps(hsum4(acc + 8),
							     _mm256_set1_ps(sc[2 * DEQ_GROUPS + g])));
	}
	state[0] = g01;
	state[1] = g2;
}

#define DEQ_MICRO(C) \
	static void deq_micro_##C(const struct radiance__w4a8_tile *t, uint32_t r, const float *w, \
				  uint32_t kb, const float *sc, uint32_t g0, uint32_t g1, \
				  __m256 *state) \
	{ deq_micro(t, r, w, kb, sc, g0, g1, state, C); }
DEQ_MICRO(1) DEQ_MICRO(2) DEQ_MICRO(3)

/* y of rows r .. r+3, columns j .. j+C-1 from their final sums (see
 * deq_micro): bf16(acc * s + bias), multiply and add rounded separately. */
static void deq_finish(const struct radiance__w4a8_tile *t, uint32_t r, uint32_t j,
		       const __m256 *state, int C)
{
	float out[16];
	_mm256_storeu_ps(out, state[0]);
	_mm256_storeu_ps(out + 8, state[1]);
	static const int lane[3][4] = { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 12, 9, 13 } };
	for (int c = 0; c < C; c++)
		for (int i = 0; i < 4; i++)
			w4a8_put(t, r + (uint32_t)i, j + (uint32_t)c, out[lane[c][i]]);
}

static void w4a8_deq_tiles(const struct radiance__w4a8_tile *t)
{
	const uint32_t groups = t->k / RADIANCE_GROUP_SIZE;
	const uint32_t rows4 = (t->r1 - t->r0) & ~3u;
	float w[DEQ_COLS * DEQ_GROUPS * RADIANCE_GROUP_SIZE] __attribute__((aligned(64)));
	float sc[DEQ_COLS * DEQ_GROUPS];
	/* running sums of (row block, column triple) over the K blocks */
	__m256 state[RADIANCE__TILE_MAX_ROWS / 4][DEQ_COLS / 3][2];
	for (uint32_t j = t->n0; j < t->n1; j += DEQ_COLS) {
		uint32_t nc = t->n1 - j < DEQ_COLS ? t->n1 - j : DEQ_COLS;
		for (uint32_t g0 = 0; g0 < groups; g0 += DEQ_GROUPS) {
			uint32_t g1 = g0 + DEQ_GROUPS < groups ? g0 + DEQ_GROUPS : groups;
			uint32_t kb = (g1 - g0) * RADIANCE_GROUP_SIZE;
			deq_unpack(t, j, nc, g0, g1, w, sc);
			for (uint32_t rb = 0; rb < rows4 / 4; rb++) {
				uint32_t r = t->r0 + 4 * rb, c = 0;
				for (; c + 3 <= nc; c += 3)
					deq_micro_3(t, r, w + (size_t)c * kb, kb, sc + c * DEQ_GROUPS,
						    g0, g1, state[rb][c / 3]);
				if (nc - c == 2)
					deq_micro_2(t, r, w + (size_t)c * kb, kb, sc + c * DEQ_GROUPS,
						    g0, g1, state[rb][c / 3]);
				else if (nc - c == 1)
					deq_micro_1(t, r, w + (size_t)c * kb, kb, sc + c * DEQ_GROUPS,
						    g0, g1, state[rb][c / 3]);
			}
		}
		for (uint32_t rb = 0; rb < rows4 / 4; rb++)
			for (uint32_t c = 0; c < nc; c += 3)
				deq_finish(t, t->r0 + 4 * rb, j + c, state[rb][c / 3],
					   nc - c < 3 ? (int)(nc - c) : 3);
	}
	if (rows4 < t->r1 - t->r0) {   /* the last rows, fewer than 4 */
		struct radiance__w4a8_tile rest = *t;
		rest.r0 = t->r0 + rows4;
		w4a8_tiles(&rest, w4a8_wide, w4a8_one, fp32_cols, 32);
	}
}

void radiance__w4a8_tile_avx2(const struct radiance__w4a8_tile *t)
{
	const uint32_t rows = t->r1 - t->r0;
	if (rows >= RADIANCE__DEQ_MIN_ROWS && rows <= RADIANCE__TILE_MAX_ROWS) {
		w4a8_deq_tiles(t);
		return;
	}
	w4a8_tiles(t, w4a8_wide, w4a8_one, fp32_cols, 32);   /* fp32 activations */
}

/* ---- W4A8 on 16-bit integers ------------------------------------------------
 *
 * An e4m3 value v is X * 2^-9 with X an integer, |X| <= 448 * 2^9 (18 bits
 * with the sign): the smallest subnormal is 2^-9 and every e4m3 value is a
 * multiple of its own ulp. X is split exactly as X = 8 * hi + lo, hi =
 * floor(X / 8) (|hi| <= 28672, an int16) and lo = X mod 8 (0..7), nonzero
 * only for values below 2^-3 that are not multiples of 2^-6 (the tiny end of
 * a row: rare). The kernel sums a 128-group's products (c - 8) * X exactly,
 * in int32, with vpmaddwd (16 multiply-adds an instruction, twice the fp32
 * FMA's 8): sum(hi * w), times 8, plus sum(lo * w) only for groups (of a row)
 * that hold a nonzero lo. |group sum| <= 128 * 8 * 448 * 2^9 = 2^27.8 fits.
 * The exact group sum is rounded to fp32 once (p_g = fp32(P) * 2^-9, exact
 * scaling), then acc += p_g * scale_g group after group, multiply and add
 * rounded separately, and y = bf16(acc * s + bias), as the reference.
 *
 * So p_g is the correctly rounded group sum, where the reference's fp32 sum
 * rounds up to 19 times; the outputs agree with the reference to within one
 * bf16 rounding plus the reference's own fp32 error (the bound that
 * tests/test_cpu_fast.c checks, docs/numerics.md states). Because integer
 * sums do not depend on their order, the result of a row is the same bits
 * for every tile shape, M, thread count and batch it is merged into.
 *
 * Layout of x: per row, per 32 k (16 bytes of qweight), hi of the 16 even k
 * then of the 16 odd k (the order the nibble unpack below yields: byte b of
 * the 16 holds k = 2b in its low nibble, 2b + 1 in its high one); lo the
 * same; one flag byte per row and group, nonzero when the group has a lo.
 */

/* int32 version of hsum8: lanes hold accumulators 0, 2, 4, 6, 1, 3, 5, 7 */
INLINE __m256i hsum8_epi32(const __m256i *acc)
{
	__m256i s[4];
	for (int i = 0; i < 4; i++) {
		__m256i lo = _mm256_permute2x128_si256(acc[2 * i], acc[2 * i + 1], 0x20);
		__m256i hi = _mm256_permute2x128_si256(acc[2 * i], acc[2 * i + 1], 0x31);
		s[i] = _mm256_add_epi32(lo, hi);
	}
	return _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
}

float radiance__quant_row_i16_avx2(const uint16_t *x, enum radiance_dtype dtype, uint32_t k,
				   int16_t *xh, int16_t *xl, uint8_t *lof)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
	const __m256i expmask = _mm256_set1_epi32(0x7F800000);
	const uint32_t groups = k / RADIANCE_GROUP_SIZE;
	__m256 amax = _mm256_setzero_ps();
	__m256i bad = _mm256_setzero_si256();
	for (uint32_t i = 0; i < k; i += 8) {
		__m256 v = load_x8(x + i, dtype);
		__m256i e = _mm256_and_si256(_mm256_castps_si256(v), expmask);
		bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, expmask));
		amax = _mm256_max_ps(amax, _mm256_and_ps(v, absmask));
	}
	if (!_mm256_testz_si256(bad, bad)) {
		/* s = NaN makes every output of the row NaN (acc * s); the codes
		 * would all be 0x7F, whose products the integers cannot carry */
		memset(xh, 0, (size_t)k * sizeof *xh);
		memset(xl, 0, (size_t)k * sizeof *xl);   /* read when a tile's other row has a lo */
		memset(lof, 0, groups);
		return NAN;
	}
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
	float am = _mm_cvtss_f32(m4);
	float s = fmaxf(am / RADIANCE_E4M3_MAX, RADIANCE_MIN_SCALE);
	const __m256 vinv = _mm256_set1_ps(1.0f / s);
	for (uint32_t g = 0; g < groups; g++) {
		int any = 0;
		for (uint32_t c = 0; c < RADIANCE_GROUP_SIZE; c += 32) {
			const uint32_t base = g * RADIANCE_GROUP_SIZE + c;
			int32_t X[32] __attribute__((aligned(32)));
			for (int i = 0; i < 4; i++) {
				__m256 v = e4m3_round(_mm256_mul_ps(load_x8(x + base + 8 * i, dtype), vinv));
				/* exact: v is a multiple of 2^-9 below 2^9 */
				_mm256_store_si256((__m256i *)X + i,
						   _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(512.0f))));
			}
			for (int b = 0; b < 16; b++) {
				int32_t e = X[2 * b], o = X[2 * b + 1];
				xh[base + b] = (int16_t)(e >> 3);   /* floor: arithmetic shift */
				xh[base + 16 + b] = (int16_t)(o >> 3);
				xl[base + b] = (int16_t)(e & 7);
				xl[base + 16 + b] = (int16_t)(o & 7);
				any |= (e | o) & 7;
			}
		}
		lof[g] = any != 0;
	}
	return s;
}

/* One pass over group g's four chunks of 32 k for R rows by C columns,
 * R * C <= 8: each column's 32 weights unpacked once to two vectors of int16
 * (even k, odd k) and used by every row. A macro rather than a function so
 * that the compiler keeps acc[] in registers (through a pointer it spilled
 * them on every multiply-add). */
#define W4A8I_PASS(X, R, C)                                                              \
	_Pragma("GCC unroll 1")                                                          \
	for (int ch = 0; ch < RADIANCE_GROUP_SIZE / 32; ch++) {                         \
		__m256i we[4], wo[4];                                                    \
		for (int c = 0; c < (C); c++) {                                          \
			__m256i v = _mm256_cvtepu8_epi16(                                \
				_mm_loadu_si128((const __m128i *)(q[c] + g * 64 + ch * 16)));  \
			we[c] = _mm256_sub_epi16(_mm256_and_si256(v, lo4), eight);       \
			wo[c] = _mm256_sub_epi16(_mm256_srli_epi16(v, 4), eight);        \
		}                                                                        \
		for (int r = 0; r < (R); r++) {                                          \
			const int16_t *xp = (X)[r] + g * RADIANCE_GROUP_SIZE + ch * 32;  \
			__m256i xe = _mm256_load_si256((const __m256i *)xp);             \
			__m256i xo = _mm256_load_si256((const __m256i *)(xp + 16));      \
			for (int c = 0; c < (C); c++)                                    \
				acc[r * (C) + c] = _mm256_add_epi32(acc[r * (C) + c],    \
					_mm256_add_epi32(_mm256_madd_epi16(xe, we[c]),   \
							 _mm256_madd_epi16(xo, wo[c]))); \
		}                                                                        \
	}

INLINE void w4a8i_micro(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t j0,
			uint32_t g0, uint32_t g1, __m256 *state, const int R, const int C)
{
	const uint32_t groups = t->k / RADIANCE_GROUP_SIZE;
	const size_t row_bytes = t->k / 2;
	const __m256i lo4 = _mm256_set1_epi16(0x0F);
	const __m256i eight = _mm256_set1_epi16(8);
	const uint8_t *q[4];
	const uint16_t *sc[4];
	const int16_t *xh[8], *xl[8];
	const uint8_t *lof[8];
	for (int c = 0; c < C; c++) {
		q[c] = (const uint8_t *)t->qweight + (size_t)(j0 + c) * row_bytes;
		sc[c] = t->scales + (size_t)(j0 + c) * groups;
	}
	for (int r = 0; r < R; r++) {
		xh[r] = t->xh + (size_t)(r0 + r) * t->ldx;
		xl[r] = t->xl + (size_t)(r0 + r) * t->ldx;
		lof[r] = t->lof + (size_t)(r0 + r) * t->ldg;
	}
	__m256 gacc = g0 == 0 ? _mm256_setzero_ps() : *state;
	for (uint32_t g = g0; g < g1; g++) {
		__m256i acc[8];
		for (int i = 0; i < 8; i++)
			acc[i] = _mm256_setzero_si256();
		/* the next C columns' line of this group (see w4a8_micro) */
		for (int c = 0; c < C; c++)
			_mm_prefetch((const char *)(q[c] + C * row_bytes + g * 64), _MM_HINT_T0);
		W4A8I_PASS(xh, R, C)
		int any = 0;
		for (int r = 0; r < R; r++)
			any |= lof[r][g];
		for (int i = 0; i < R * C; i++)
			acc[i] = _mm256_slli_epi32(acc[i], 3);
		if (any) {   /* rows without a lo have zeros there: they add nothing */
			W4A8I_PASS(xl, R, C)
		}
		__m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(hsum8_epi32(acc)), _mm256_set1_ps(0x1p-9f));
		gacc = add_scaled(gacc, p, sc, g, R, C);
	}
	w4a8_finish(t, r0, j0, g1, state, gacc, R, C);
}

#define W4A8I_MICRO(R, C) \
	static void w4a8i_micro_##R##_##C(const struct radiance__w4a8_tile *t, uint32_t r0, \
					  uint32_t j0, uint32_t g0, uint32_t g1, __m256 *state) \
	{ w4a8i_micro(t, r0, j0, g0, g1, state, R, C); }
W4A8I_MICRO(1, 4) W4A8I_MICRO(2, 3) W4A8I_MICRO(3, 2) W4A8I_MICRO(4, 2) W4A8I_MICRO(5, 1)
W4A8I_MICRO(6, 1) W4A8I_MICRO(7, 1) W4A8I_MICRO(8, 1) W4A8I_MICRO(1, 1) W4A8I_MICRO(2, 1)
W4A8I_MICRO(3, 1) W4A8I_MICRO(4, 1)

static const w4a8_micro_fn w4a8i_wide[9] = {
	NULL, w4a8i_micro_1_4, w4a8i_micro_2_3, w4a8i_micro_3_2, w4a8i_micro_4_2,
	w4a8i_micro_5_1, w4a8i_micro_6_1, w4a8i_micro_7_1, w4a8i_micro_8_1,
};
static const w4a8_micro_fn w4a8i_one[9] = {
	NULL, w4a8i_micro_1_1, w4a8i_micro_2_1, w4a8i_micro_3_1, w4a8i_micro_4_1,
	w4a8i_micro_5_1, w4a8i_micro_6_1, w4a8i_micro_7_1, w4a8i_micro_8_1,
};

static const uint32_t int16_cols[9] = { 0, 4, 3, 2, 2, 1, 1, 1, 1 };

void radiance__w4a8i_tile_avx2(const struct radiance__w4a8_tile *t)
{
	w4a8_tiles(t, w4a8i_wide, w4a8i_one, int16_cols, 64);   /* int16 hi activations */
}

/* Eight rows of eight bf16 (row l = column j + l at k .. k+7) transposed to
 * eight fp32 vectors, w[i] lane l = column j + l at k + i. */
INLINE void transpose8_bf16(const uint16_t *const *rows, uint32_t k, __m256 *w)
{
	__m128i r[8], t[8], u[8];
	for (int l = 0; l < 8; l++)
		r[l] = _mm_loadu_si128((const __m128i *)(rows[l] + k));
	for (int l = 0; l < 4; l++) {
		t[2 * l] = _mm_unpacklo_epi16(r[2 * l], r[2 * l + 1]);
		t[2 * l + 1] = _mm_unpackhi_epi16(r[2 * l], r[2 * l + 1]);
	}
	for (int h = 0; h < 2; h++) {   /* rows 0-3, then 4-7 */
		u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h + 0], t[4 * h + 2]);   /* k 0, 1 */
		u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h + 0], t[4 * h + 2]);   /* k 2, 3 */
		u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);   /* k 4, 5 */
		u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);   /* k 6, 7 */
	}
	for (int i = 0; i < 4; i++) {
		__m128i lo = _mm_unpacklo_epi64(u[i], u[4 + i]);
		__m128i hi = _mm_unpackhi_epi64(u[i], u[4 + i]);
		w[2 * i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
		w[2 * i + 1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
	}
}

/* bf16: R rows by a block of eight columns from j (fewer at the end: the
 * missing ones read the last column again and write nothing), lane l being
 * column j + l. Each lane sums its column in K order, multiply and add
 * rounded separately, as radiance_cpu_bf16() does: bit for bit the
 * reference. */
INLINE void bf16_micro(const struct radiance__bf16_tile *t, uint32_t r0, uint32_t j, const int R)
{
	const uint32_t k = t->k;
	const int valid = t->n1 - j < 8 ? (int)(t->n1 - j) : 8;
	const uint16_t *wr[8];
	const float *xr[8];
	for (int l = 0; l < 8; l++)
		wr[l] = t->weight + (size_t)(j + (uint32_t)(l < valid ? l : valid - 1)) * k;
	for (int r = 0; r < R; r++)
		xr[r] = t->xf + (size_t)(r0 + r) * t->ldx;
	__m256 acc[8];
	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	uint32_t e = 0;
	for (; e + 8 <= k; e += 8) {
		__m256 w[8];
		transpose8_bf16(wr, e, w);
		for (int r = 0; r < R; r++) {
			__m256 a = acc[r];
			for (int i = 0; i < 8; i++)
				a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_broadcast_ss(xr[r] + e + i), w[i]));
			acc[r] = a;
		}
	}
	for (; e < k; e++) {   /* K not a multiple of 8 */
		float w[8];
		for (int l = 0; l < 8; l++)
			w[l] = radiance_bf16_to_f32(wr[l][e]);
		__m256 wv = _mm256_loadu_ps(w);
		for (int r = 0; r < R; r++)
			acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_broadcast_ss(xr[r] + e), wv));
	}
	for (int r = 0; r < R; r++) {
		float out[8];
		_mm256_storeu_ps(out, acc[r]);
		uint16_t *y = t->y + (size_t)(r0 + (uint32_t)r) * t->n + j;
		for (int l = 0; l < valid; l++)
			y[l] = radiance_bf16_from_f32(out[l] + (t->bias ? t->bias[j + (uint32_t)l] : 0.0f));
	}
}

#define BF16_MICRO(R) \
	static void bf16_micro_##R(const struct radiance__bf16_tile *t, uint32_t r0, uint32_t j) \
	{ bf16_micro(t, r0, j, R); }
BF16_MICRO(1) BF16_MICRO(2) BF16_MICRO(3) BF16_MICRO(4)
BF16_MICRO(5) BF16_MICRO(6) BF16_MICRO(7) BF16_MICRO(8)

typedef void (*bf16_micro_fn)(const struct radiance__bf16_tile *t, uint32_t r0, uint32_t j);
static const bf16_micro_fn bf16_micro_rows[9] = {
	NULL, bf16_micro_1, bf16_micro_2, bf16_micro_3, bf16_micro_4,
	bf16_micro_5, bf16_micro_6, bf16_micro_7, bf16_micro_8,
};

void radiance__bf16_tile_avx2(const struct radiance__bf16_tile *t)
{
	for (uint32_t r = t->r0; r < t->r1; r += 8) {
		uint32_t rows = t->r1 - r < 8 ? t->r1 - r : 8;
		for (uint32_t j = t->n0; j < t->n1; j += 8)
			bf16_micro_rows[rows](t, r, j);
	}
}

#endif
