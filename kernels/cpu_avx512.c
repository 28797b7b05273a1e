/*
 * The CPU fast path's AVX-512 W4A8 kernels: bf16 dot products (vdpbf16ps),
 * built with -mavx512f -mavx512bw -mavx512vbmi -mavx512bf16 (the Makefile's
 * SIMD_AVX512) and called only where cpu_fast.c found those at run time and
 * its known-answer check passed.
 *
 * Bit-exact with the scalar reference kernels/w4a8_cpu.c, as the avx2 level
 * is, by the same argument: the same fp32 operations in the same order.
 *  - Every e4m3 value and every int4 weight (c - 8) is exact in bf16, and
 *    every product of the two is exact in fp32 (at most 4 x 4 significant
 *    bits). Every partial sum is a multiple of 2^-9 or zero, so never
 *    subnormal: vdpbf16ps's DAZ/FTZ change nothing.
 *  - vdpbf16ps adds to each fp32 lane two products, element 2i+1 first and
 *    then element 2i, each rounded to nearest even (Intel SDM: "FP32 FMA with
 *    daz in, ftz out and RNE rounding", twice in that order; the known-answer
 *    check in cpu_fast.c confirms it on the CPU at hand). A lane here is one
 *    of the reference's dot_group() accumulators (one output, lane i summing
 *    k = 8t + i over t in turn), its element 2i+1 holding step t and 2i step
 *    t + 1: so one instruction performs the reference's next two additions
 *    of that accumulator, in order.
 *  - Each zmm holds two outputs' eight accumulators: two columns of one row
 *    (one row alone: w4a8_row) or one column of two rows (row pairs:
 *    w4a8_pairs). tree8() reduces eight such registers, 16 outputs, with the
 *    reference's ((a0+a4)+(a1+a5)) + ((a2+a6)+(a3+a7)).
 *  - The group sums are scaled and added group after group, multiply and add
 *    rounded separately; y = bf16_rne(acc * s + bias), unfused.
 *
 * Activations (radiance__quant_row_avx512): the e4m3 values as bf16, in the
 * order the dot products take them: per 16 k (two steps t = 2u, 2u + 1), lane
 * i's 32 bits are bf16(x[16u + i]) << 16 | bf16(x[16u + 8 + i]). Rows are
 * stored in pairs, so that one 64-byte load gives two rows' 16 k: row r's
 * chunk c (k = 16c ..) is at xb + (r / 2) * 2 * ldx + 32 * c + 16 * (r & 1).
 *
 * Weights: the 16 nibbles of two consecutive qweight words (one 64-bit
 * load) are moved to the 16-bit elements above by vpmultishiftqb and turned
 * into bf16 (c - 8) by vpermw, a 16-entry table (repeated, so that the bit
 * above the nibble does not matter).
 */
#include "cpu_simd.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* 16 elements of x (bf16 or fp16 bits) to fp32, exactly (vcvtph2ps does
 * not take MXCSR.DAZ). */
INLINE __m512 load_x16(const uint16_t *x, enum radiance_dtype dtype)
{
	__m256i h = _mm256_loadu_si256((const __m256i *)x);
	if (dtype == RADIANCE_DTYPE_FP16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The e4m3 value radiance_e4m3_from_f32() rounds f to, as fp32: the avx2
 * level's e4m3_round on 16 lanes. */
INLINE __m512 e4m3_round16(__m512 f)
{
	const __m512i b = _mm512_castps_si512(f);
	const __m512i sign = _mm512_and_si512(b, _mm512_set1_epi32((int)0x80000000u));
	const __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
	/* normal range: RNE on the 20 mantissa bits e4m3 drops, 448 at most */
	__m512i r = _mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF),
		_mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1))));
	__mmask16 sat = _mm512_cmpgt_epi32_mask(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(0x43E));
	__m512i vn = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFF00000u));
	vn = _mm512_mask_mov_epi32(vn, sat, _mm512_set1_epi32(0x43E00000));
	/* below 2^-6: a multiple of 2^-9, rounded to nearest even */
	__m512 q = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f));
	q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512i vs = _mm512_castps_si512(_mm512_mul_ps(q, _mm512_set1_ps(0x1p-9f)));
	__mmask16 sub = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(0x3C800000), a);
	__m512i v = _mm512_or_si512(_mm512_mask_mov_epi32(vn, sub, vs), sign);
	return _mm512_castsi512_ps(v);
}

/* Row r's chunk c (16 bf16, k = 16c ..) in the paired layout above. */
INLINE uint16_t *x_chunk(uint16_t *xb, uint32_t ldx, uint32_t r, uint32_t c)
{
	return xb + (size_t)(r / 2) * 2 * ldx + 32 * (size_t)c + 16 * (r & 1);
}

float radiance__quant_row_avx512(const uint16_t *x, enum radiance_dtype dtype, uint32_t k,
				 uint32_t r, uint32_t ldx, uint16_t *xb)
{
	const __m512i expmask = _mm512_set1_epi32(0x7F800000);
	__m512 amax = _mm512_setzero_ps();
	__mmask16 bad = 0;
	for (uint32_t i = 0; i < k; i += 16) {
		__m512 v = load_x16(x + i, dtype);
		__m512i e = _mm512_and_si512(_mm512_castps_si512(v), expmask);
		bad |= _mm512_cmpeq_epi32_mask(e, expmask);
		amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
	}
	if (bad) {
		/* the reference's codes are all 0x7F then, its decoded NaN */
		const __m256i nan = _mm256_set1_epi16(0x7FC0);
		for (uint32_t c = 0; c < k / 16; c++)
			_mm256_store_si256((__m256i *)x_chunk(xb, ldx, r, c), nan);
		return NAN;
	}
	/* max is exact in any order; no NaN is left here */
	float am = _mm512_reduce_max_ps(amax);
	float s = fmaxf(am / RADIANCE_E4M3_MAX, RADIANCE_MIN_SCALE);
	const __m512 vinv = _mm512_set1_ps(1.0f / s);
	const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
	for (uint32_t c = 0; c < k / 16; c++) {
		__m512i v = _mm512_castps_si512(e4m3_round16(_mm512_mul_ps(load_x16(x + 16 * c, dtype), vinv)));
		/* an e4m3 value's fp32 bits end in 20 zeros: its bf16 is the top half */
		__m256i t0 = _mm512_castsi512_si256(v), t1 = _mm512_extracti64x4_epi64(v, 1);
		__m256i o = _mm256_or_si256(_mm256_and_si256(t0, hi16), _mm256_srli_epi32(t1, 16));
		_mm256_store_si256((__m256i *)x_chunk(xb, ldx, r, c), o);
	}
	return s;
}

/* vpmultishiftqb's control: in each 64-bit lane q (two qweight words, t and
 * t + 1), fp32 lanes 2q and 2q + 1 (reference lanes i = 2q mod 8, i + 1)
 * take nibble i of word t + 1 in their low element and of word t in their
 * high one. Only the low 5 bits of each 16-bit element are used after. */
INLINE __m512i nibble_ctl(void)
{
	uint8_t b[64];
	for (int q = 0; q < 8; q++) {
		int i = (2 * q) & 7;
		const uint8_t v[8] = { (uint8_t)(32 + 4 * i), 0, (uint8_t)(4 * i), 0,
				       (uint8_t)(32 + 4 * i + 4), 0, (uint8_t)(4 * i + 4), 0 };
		memcpy(b + 8 * q, v, 8);
	}
	return _mm512_loadu_si512(b);
}

/* bf16 bits of c - 8 for c = 0..15, twice (vpermw reads 5 bits). */
static const uint16_t w4_bf16[32] __attribute__((aligned(64))) = {
	0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
	0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
	0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
	0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
};

/* The bf16 weights of a vector of (word t, word t + 1) pairs. */
INLINE __m512i w4_bf16x32(__m512i pairs, __m512i ctl, __m512i table)
{
	return _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(ctl, pairs), table);
}

INLINE uint64_t load64(const uint32_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

INLINE __m512 dp(__m512 acc, __m512i w, __m512i x)
{
	return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

/* Reduces eight registers of two outputs each (lanes 0-7 and 8-15: the
 * eight accumulators of one output) with the reference's tree into 16 sums:
 * lane 4j + m is register 2m + (j >> 1), half j & 1. */
INLINE __m512 tree8(const __m512 *a)
{
	__m512 s[4];
	for (int m = 0; m < 4; m++) {
		/* block j of s[m]: a_i + a_(i+4), i = 0..3, of one output */
		__m512 lo = _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0));
		__m512 hi = _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1));
		s[m] = _mm512_add_ps(lo, hi);
	}
	__m512 h[2];
	for (int i = 0; i < 2; i++)   /* (e0 + e1), (e2 + e3) of s[2i], then of s[2i + 1] */
		h[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
				     _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
	return _mm512_add_ps(_mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(2, 0, 2, 0)),
			     _mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The register and half behind lane l of tree8's result. */
INLINE int tree_reg(int l)
{
	return 2 * (l & 3) + ((l >> 2) >> 1);
}

INLINE int tree_half(int l)
{
	return (l >> 2) & 1;
}

/* y[row][col] = bf16(sum * s[row] + bias[col]), multiply and add rounded
 * separately, as the reference. */
INLINE void put(const struct radiance__w4a8_tile *t, uint32_t row, uint32_t col, float sum)
{
	float b = t->bias ? t->bias[col] : 0.0f;
	t->y[(size_t)row * t->n + col] = radiance_bf16_from_f32(sum * t->s[row] + b);
}

/* gacc + p * scale, lane by lane (scale from the fp16 values h), multiply and
 * add rounded separately. */
INLINE __m512 add_scaled(__m512 gacc, __m512 p, const uint16_t *h)
{
	__m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
	return _mm512_add_ps(gacc, _mm512_mul_ps(p, scale));
}

/* ---- one row: register p holds columns 2p, 2p + 1 ----------------------------
 *
 * Row r by ncols (1 .. 2 * CP) columns from j0, all groups; x's 16 k are
 * broadcast to both halves. Columns past ncols repeat the last one and
 * write nothing. */
INLINE void w4a8_row(const struct radiance__w4a8_tile *t, uint32_t r, uint32_t j0,
		     uint32_t ncols, const int CP)
{
	const uint32_t words = t->k / RADIANCE_PACK, groups = t->k / RADIANCE_GROUP_SIZE;
	const __m512i ctl = nibble_ctl(), table = _mm512_load_si512(w4_bf16);
	const uint32_t *q[16];
	const uint16_t *sc[16];
	for (int c = 0; c < 2 * CP; c++) {
		uint32_t col = j0 + ((uint32_t)c < ncols ? (uint32_t)c : ncols - 1);
		q[c] = t->qweight + (size_t)col * words;
		sc[c] = t->scales + (size_t)col * groups;
	}
	const uint16_t *xr = x_chunk((uint16_t *)t->xb, t->ldx, r, 0);
	__m512 gacc = _mm512_setzero_ps();
	for (uint32_t g = 0; g < groups; g++) {
		__m512 acc[8];
		for (int i = 0; i < 8; i++)
			acc[i] = _mm512_setzero_ps();
		/* the next block's columns, this group (see cpu_avx2.c's w4a8_micro) */
		for (int c = 0; c < 2 * CP; c++)
			_mm_prefetch((const char *)(q[c] + (size_t)(2 * CP) * words + g * 16), _MM_HINT_T0);
		for (uint32_t u = 0; u < RADIANCE_GROUP_SIZE / 16; u++) {
			const uint32_t c = g * (RADIANCE_GROUP_SIZE / 16) + u;
			__m512i xv = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xr + 32 * (size_t)c)));
			for (int p = 0; p < CP; p++) {
				__m512i pairs = _mm512_mask_set1_epi64(
					_mm512_set1_epi64((long long)load64(q[2 * p] + 16 * g + 2 * u)), 0xF0,
					(long long)load64(q[2 * p + 1] + 16 * g + 2 * u));
				acc[p] = dp(acc[p], w4_bf16x32(pairs, ctl, table), xv);
			}
		}
		/* lane l = register tree_reg(l) (columns 2p, 2p + 1), half tree_half(l) */
		uint16_t h[16];
		for (int l = 0; l < 16; l++) {
			int c = 2 * tree_reg(l) + tree_half(l);
			h[l] = c < 2 * CP ? sc[c][g] : 0;
		}
		gacc = add_scaled(gacc, tree8(acc), h);
	}
	float out[16];
	_mm512_storeu_ps(out, gacc);
	for (int l = 0; l < 16; l++) {
		uint32_t c = (uint32_t)(2 * tree_reg(l) + tree_half(l));
		if (c < ncols)
			put(t, r, j0 + c, out[l]);
	}
}

#define W4A8_ROW(CP) \
	static void w4a8_row_##CP(const struct radiance__w4a8_tile *t, uint32_t r, uint32_t j0, \
				  uint32_t ncols) \
	{ w4a8_row(t, r, j0, ncols, CP); }
W4A8_ROW(1) W4A8_ROW(2) W4A8_ROW(3) W4A8_ROW(4) W4A8_ROW(5) W4A8_ROW(6) W4A8_ROW(7) W4A8_ROW(8)

typedef void (*w4a8_row_fn)(const struct radiance__w4a8_tile *t, uint32_t r, uint32_t j0,
			    uint32_t ncols);
static const w4a8_row_fn w4a8_rows[9] = {
	NULL, w4a8_row_1, w4a8_row_2, w4a8_row_3, w4a8_row_4,
	w4a8_row_5, w4a8_row_6, w4a8_row_7, w4a8_row_8,
};

/* ---- row pairs: register c * P + p holds column c of rows 2p, 2p + 1 --------
 *
 * Rows r0 .. r0 + 2P - 1 by C columns from j0, groups [g0, g1): a K block.
 * The running group sums of earlier blocks live in state[col - n0][row - rb]
 * (rb: the 8-row block r0 is in), and after the last group the outputs are
 * written. */
INLINE void w4a8_pairs(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t rb,
		       uint32_t j0, uint32_t g0, uint32_t g1, float (*state)[8], const int P,
		       const int C)
{
	const int NB = (P * C + 7) / 8;   /* tree8 batches */
	const uint32_t words = t->k / RADIANCE_PACK, groups = t->k / RADIANCE_GROUP_SIZE;
	const __m512i ctl = nibble_ctl(), table = _mm512_load_si512(w4_bf16);
	const uint32_t *q[8];
	const uint16_t *sc[8];
	for (int c = 0; c < C; c++) {
		q[c] = t->qweight + (size_t)(j0 + c) * words;
		sc[c] = t->scales + (size_t)(j0 + c) * groups;
	}
	const uint16_t *xp = x_chunk((uint16_t *)t->xb, t->ldx, r0, 0);
	const size_t pair_stride = 2 * (size_t)t->ldx;

	/* lane l of batch b: register a = 8b + tree_reg(l) (column a / P, pair
	 * a % P), row half tree_half(l); a >= P * C is padding */
	__m512 gacc[2];
	for (int b = 0; b < NB; b++) {
		float v[16] = { 0 };
		if (g0 > 0)
			for (int l = 0; l < 16; l++) {
				int a = 8 * b + tree_reg(l);
				if (a < P * C)
					v[l] = state[j0 + (uint32_t)(a / P) - t->n0]
						    [r0 - rb + 2 * (uint32_t)(a % P) + (uint32_t)tree_half(l)];
			}
		gacc[b] = _mm512_loadu_ps(v);
	}
	for (uint32_t g = g0; g < g1; g++) {
		__m512 acc[16];
		for (int i = 0; i < 8 * NB; i++)
			acc[i] = _mm512_setzero_ps();
		for (int c = 0; c < C; c++)
			_mm_prefetch((const char *)(q[c] + (size_t)C * words + g * 16), _MM_HINT_T0);
		for (uint32_t u = 0; u < RADIANCE_GROUP_SIZE / 16; u++) {
			const size_t ch = 32 * ((size_t)g * (RADIANCE_GROUP_SIZE / 16) + u);
			__m512i xv[4];
			for (int p = 0; p < P; p++)
				xv[p] = _mm512_load_si512((const void *)(xp + (size_t)p * pair_stride + ch));
			for (int c = 0; c < C; c++) {
				__m512i w = w4_bf16x32(_mm512_set1_epi64((long long)load64(q[c] + 16 * g + 2 * u)),
						       ctl, table);
				for (int p = 0; p < P; p++)
					acc[c * P + p] = dp(acc[c * P + p], w, xv[p]);
			}
		}
		for (int b = 0; b < NB; b++) {
			uint16_t h[16];
			for (int l = 0; l < 16; l++) {
				int a = 8 * b + tree_reg(l);
				h[l] = a < P * C ? sc[a / P][g] : 0;
			}
			gacc[b] = add_scaled(gacc[b], tree8(acc + 8 * b), h);
		}
	}
	const int last = g1 == groups;
	for (int b = 0; b < NB; b++) {
		float v[16];
		_mm512_storeu_ps(v, gacc[b]);
		for (int l = 0; l < 16; l++) {
			int a = 8 * b + tree_reg(l);
			if (a >= P * C)
				continue;
			uint32_t row = r0 + 2 * (uint32_t)(a % P) + (uint32_t)tree_half(l);
			uint32_t col = j0 + (uint32_t)(a / P);
			if (last)
				put(t, row, col, v[l]);
			else
				state[col - t->n0][row - rb] = v[l];
		}
	}
}

typedef void (*w4a8_pairs_fn)(const struct radiance__w4a8_tile *t, uint32_t r0, uint32_t rb,
			      uint32_t j0, uint32_t g0, uint32_t g1, float (*state)[8]);
#define W4A8_PAIRS(P, C) \
	static void w4a8_pairs_##P##_##C(const struct radiance__w4a8_tile *t, uint32_t r0, \
					 uint32_t rb, uint32_t j0, uint32_t g0, uint32_t g1, \
					 float (*state)[8]) \
	{ w4a8_pairs(t, r0, rb, j0, g0, g1, state, P, C); }
W4A8_PAIRS(1, 1) W4A8_PAIRS(1, 2) W4A8_PAIRS(1, 3) W4A8_PAIRS(1, 4)
W4A8_PAIRS(1, 5) W4A8_PAIRS(1, 6) W4A8_PAIRS(1, 7) W4A8_PAIRS(1, 8)
W4A8_PAIRS(2, 1) W4A8_PAIRS(2, 2) W4A8_PAIRS(2, 3) W4A8_PAIRS(2, 4)
W4A8_PAIRS(3, 1) W4A8_PAIRS(3, 2) W4A8_PAIRS(3, 3) W4A8_PAIRS(3, 4)
W4A8_PAIRS(4, 1) W4A8_PAIRS(4, 2) W4A8_PAIRS(4, 3) W4A8_PAIRS(4, 4)

/* [P][C]: C columns at once for P row pairs (P * C registers of sums) */
static const w4a8_pairs_fn w4a8_pairs_by[5][9] = {
	[1] = { NULL, w4a8_pairs_1_1, w4a8_pairs_1_2, w4a8_pairs_1_3, w4a8_pairs_1_4,
		w4a8_pairs_1_5, w4a8_pairs_1_6, w4a8_pairs_1_7, w4a8_pairs_1_8 },
	[2] = { NULL, w4a8_pairs_2_1, w4a8_pairs_2_2, w4a8_pairs_2_3, w4a8_pairs_2_4 },
	[3] = { NULL, w4a8_pairs_3_1, w4a8_pairs_3_2, w4a8_pairs_3_3, w4a8_pairs_3_4 },
	[4] = { NULL, w4a8_pairs_4_1, w4a8_pairs_4_2, w4a8_pairs_4_3, w4a8_pairs_4_4 },
};
static const uint32_t pairs_cols[5] = { 0, 8, 4, 4, 4 };

/* bf16 activations of one K block: 8 rows x 8 groups = 16 KiB, in L1 */
#define K_BLOCK_BUDGET 64

void radiance__w4a8_tile_avx512(const struct radiance__w4a8_tile *t)
{
	const uint32_t groups = t->k / RADIANCE_GROUP_SIZE;
	float state[RADIANCE__TILE_MAX_COLS][8];
	uint32_t r = t->r0;
	/* blocks of up to 8 rows in pairs; r0 is even (tasks start at multiples of 8) */
	for (; r + 2 <= t->r1; r += 8) {
		uint32_t P = (t->r1 - r) / 2 < 4 ? (t->r1 - r) / 2 : 4;
		uint32_t C = pairs_cols[P];
		uint32_t gstep = K_BLOCK_BUDGET / (2 * P);
		for (uint32_t g0 = 0; g0 < groups; g0 += gstep) {
			uint32_t g1 = g0 + gstep < groups ? g0 + gstep : groups;
			uint32_t j = t->n0;
			for (; j + C <= t->n1; j += C)
				w4a8_pairs_by[P][C](t, r, r, j, g0, g1, state);
			if (j < t->n1)
				w4a8_pairs_by[P][t->n1 - j](t, r, r, j, g0, g1, state);
		}
		if (P < 4) {
			r += 2 * P;
			break;
		}
	}
	if (r < t->r1) {   /* a last single row: two columns a register */
		for (uint32_t j = t->n0; j < t->n1; j += 16) {
			uint32_t nc = t->n1 - j < 16 ? t->n1 - j : 16;
			w4a8_rows[(nc + 1) / 2](t, r, j, nc);
		}
	}
}

#endif
