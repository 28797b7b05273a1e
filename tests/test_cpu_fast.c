/*
 * The CPU fast path (kernels/cpu_fast.h) against the scalar reference
 * (kernels/w4a8_cpu.h), which tests/test_numerics.c and test_numerics_ref
 * check against the definition and an independent numpy/ml_dtypes one:
 *   - W4A8: bit-exact with radiance_cpu_w4a8() on the levels scalar, avx2,
 *     avx512 and neon (each where this CPU has it; tests/test_cpu_neon.sh
 *     runs this file under qemu-aarch64 for neon), thread counts 1..4;
 *     avx2-int16 within its stated bound of a double computation of the definition and within one bf16 step of the
 *     reference where that is well-conditioned, NaN rows NaN, zero rows the
 *     bias's bits, the same bits at every thread count and for a row alone;
 *     all on odd N, K multiples of 128, M = 1..65, bf16
 *     and fp16 x, rows of NaN, +-Inf, zeros, -0 and subnormal-scale values,
 *     subnormal fp16 scales, with and without bias; and groups whose
 *     reference fp32 lane sums are inexact (the avx2 level's exact-integer
 *     kernel must fall back to fp32 there, and give the reference's bits);
 *   - bf16 linears: bit-exact with radiance_cpu_bf16() too (odd N and K,
 *     K from 1, NaN/Inf/zero rows), and the reference's outputs within the
 *     fp32 summation bound of a double reference (so the data is sane);
 *   - the pool: every task of a job runs exactly once, at every width, and
 *     over many small jobs back to back only while its call runs;
 *   - the usable-thread count follows sched_setaffinity;
 *   - errors: M over max_rows, K not a multiple of 128, a SIMD level the
 *     build does not know; the scalar level asked for (the daemon's
 *     cpu_simd = scalar) is the one created.
 */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu_fast.h"
#include "cpu_pool.h"
#include "numerics.h"
#include "w4a8_cpu.h"

#define MAX_M 65
#define MAX_K 1152
#define MAX_N 300

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

static double rnd_unit(void)   /* (-1, 1) */
{
	return ((double)rnd() / 2147483648.0) - 1.0;
}

static uint16_t to_x(float v, enum radiance_dtype dt)
{
	if (dt == RADIANCE_DTYPE_BF16)
		return radiance_bf16_from_f32(v);
	/* fp16 by way of a value already exactly representable: round to 11
	 * bits in the normal range, keep the range of fp16 */
	float a = fabsf(v);
	if (a > 60000.0f)
		a = 60000.0f;
	int e;
	float m = frexpf(a, &e);
	m = nearbyintf(m * 2048.0f) / 2048.0f;
	a = ldexpf(m, e);
	uint16_t h;
	if (a < 0x1p-14f) {   /* subnormal fp16: multiple of 2^-24 */
		h = (uint16_t)nearbyintf(a * 0x1p24f);
	} else {
		int ee;
		float mm = frexpf(a, &ee);   /* a = mm * 2^ee, mm in [0.5, 1) */
		uint32_t man = (uint32_t)nearbyintf((mm * 2.0f - 1.0f) * 1024.0f);
		uint32_t exp = (uint32_t)(ee - 1 + 15);
		if (man == 1024) {
			man = 0;
			exp++;
		}
		h = (uint16_t)((exp << 10) | man);
	}
	return (uint16_t)(h | (v < 0 ? 0x8000u : 0));
}

/* Row r of x: random values over a range that changes with the row, with
 * special rows: all zero, a NaN, +Inf, -Inf, -0 and tiny values. */
static void fill_x(uint16_t *x, uint32_t m, uint32_t k, enum radiance_dtype dt)
{
	const uint16_t inf = dt == RADIANCE_DTYPE_BF16 ? 0x7F80 : 0x7C00;
	const uint16_t nan = dt == RADIANCE_DTYPE_BF16 ? 0x7FC1 : 0x7E01;
	for (uint32_t r = 0; r < m; r++) {
		uint16_t *row = x + (size_t)r * k;
		float range = ldexpf(1.0f, (int)(r % 13) * 3 - 18);
		for (uint32_t i = 0; i < k; i++) {
			float v = (float)rnd_unit() * range;
			if (rnd() % 16 == 0)   /* a wide spread inside the row: subnormal e4m3 */
				v *= 1e-4f;
			row[i] = to_x(v, dt);
		}
		switch (r % 11) {
		case 3:
			memset(row, 0, k * sizeof *row);
			break;
		case 5:
			row[rnd() % k] = nan;
			break;
		case 7:
			row[rnd() % k] = inf;
			break;
		case 8:
			row[rnd() % k] = (uint16_t)(inf | 0x8000);
			break;
		case 9:
			for (uint32_t i = 0; i < k; i++)
				row[i] = (i % 2) ? 0x8000 : row[i];
			break;
		case 10:
			/* one sign, near the row's max (large group sums), and one in
			 * eight subnormal in e4m3 (multiples of 2^-9): partial sums
			 * past 2^15 cannot hold those bits in fp32 */
			for (uint32_t i = 0; i < k; i++)
				row[i] = to_x(range * (rnd() % 8 == 0 ? 1e-5f * (float)(1 + rnd() % 7)
						       : 0.8f + 0.2f * (float)(rnd() % 1000) / 1000.0f), dt);
			break;
		}
	}
}

static void fill_w4a8(uint32_t *qw, uint16_t *sc, float *bias, uint32_t n, uint32_t k)
{
	for (size_t i = 0; i < (size_t)n * k / 8; i++) {
		/* every 7th column of weights 5..7 (codes 13..15): with the one-sign
		 * rows, fp32 group sums past 2^24 ulps of their terms, where the
		 * summation order shows in the reference's bits */
		size_t j = i / (k / 8);
		qw[i] = j % 7 == 3 ? 0xDDDDDDDDu | (rnd() & 0x33333333u & 0x22222222u) : rnd();
	}
	for (size_t i = 0; i < (size_t)n * k / 128; i++) {
		/* fp16 scales: mostly around 0.01, some subnormal, some zero */
		uint32_t sel = rnd() % 16;
		sc[i] = sel == 0 ? 0 : sel == 1 ? (uint16_t)(1 + rnd() % 1023)
						: (uint16_t)(0x2000 + rnd() % 0x1000);
	}
	for (uint32_t j = 0; j < n; j++)
		bias[j] = (float)rnd_unit() * 4.0f;
}

/* every (level, thread count) make_levels can create: 5 levels x 4 */
#define MAX_LEVELS 20

struct level {
	enum radiance_cpu_simd simd;
	unsigned threads;
	struct radiance_cpu_fast *f;
};

static size_t make_levels(struct level *lv, size_t cap)
{
	size_t n = 0;
	/* RADIANCE_TEST_MAX_THREADS: fewer thread counts (tests/test_cpu_neon.sh
	 * runs the kernels under qemu-aarch64 on one thread) */
	const char *mt = getenv("RADIANCE_TEST_MAX_THREADS");
	const int want = mt ? atoi(mt) : 0;
	const unsigned max_threads = want > 0 && want < 4 ? (unsigned)want : 4;
	const enum radiance_cpu_simd levels[] = { RADIANCE_CPU_SIMD_SCALAR, RADIANCE_CPU_SIMD_AVX2,
						  RADIANCE_CPU_SIMD_AVX2_INT16, RADIANCE_CPU_SIMD_AVX512,
						  RADIANCE_CPU_SIMD_NEON };
	for (size_t s = 0; s < sizeof levels / sizeof levels[0]; s++)
		for (unsigned t = 1; t <= max_threads && n < cap; t++) {
			struct radiance_cpu_fast_options o = { .threads = t, .simd = levels[s],
							       .max_rows = MAX_M, .max_k = MAX_K };
			char err[256];
			struct radiance_cpu_fast *f;
			int rc = radiance_cpu_fast_create(&o, &f, err, sizeof err);
			/* a CPU with the level whose known-answer check fails is a
			 * kernel (or CPU) fault, not a missing level */
			if (rc == -ENOTSUP && strstr(err, "known-answer"))
				fail_msg("%s: %s", radiance_cpu_simd_name(levels[s]), err);
			if (rc == -ENOTSUP) {
				print_message("  %s not on this CPU: %s (untested here)\n",
					      radiance_cpu_simd_name(levels[s]), err);
				break;
			}
			assert_int_equal(rc, 0);
			assert_int_equal(radiance_cpu_fast_threads(f), t);
			lv[n++] = (struct level){ levels[s], t, f };
		}
	return n;
}

static void free_levels(struct level *lv, size_t n)
{
	for (size_t i = 0; i < n; i++)
		radiance_cpu_fast_destroy(lv[i].f);
}

/* The fp32 sum of K products and the bias is within gamma = (K + 1) * 2^-24
 * (to first order) times the sum of magnitudes of the exact sum, in any
 * order; bf16 rounding adds 2^-8 relative. */
static bool within_bf16_bound(uint16_t y, double exact, double mag, uint32_t k)
{
	double gamma = (double)(k + 1) * 0x1p-24 * 1.01;
	double err = gamma * mag;
	double v = radiance_bf16_to_f32(y);
	return fabs(v - exact) <= 0x1p-8 * (fabs(exact) + err) + err + 1e-37;
}

static bool bf16_is_nan(uint16_t y)
{
	return (y & 0x7FFF) > 0x7F80;
}

/* Distance in bf16 steps between two finite bf16 values (sign-magnitude
 * bits made monotonic). */
static uint32_t bf16_ulps(uint16_t a, uint16_t b)
{
	int32_t ia = a & 0x8000 ? -(int32_t)(a & 0x7FFF) : (int32_t)a;
	int32_t ib = b & 0x8000 ? -(int32_t)(b & 0x7FFF) : (int32_t)b;
	return (uint32_t)(ia > ib ? ia - ib : ib - ia);
}

/* What differed from the reference on the avx2-int16 level, over the run. */
static size_t int16_outputs, int16_differ, int16_ill_conditioned;
static uint32_t int16_max_ulps;

/* avx2-int16 against the definition, computed here in double from the
 * reference's own codes and scales (radiance_quant_row_e4m3, which
 * tests/test_numerics.c and test_numerics_ref check against ml_dtypes):
 * its group sums are exact before one fp32 rounding, so the only fp32
 * error left is the scaled sum over G groups, the multiply by s_m and the
 * bias add: |y - exact| <= 2^-8 (|exact| + e) + e, e = (G + 3) 2^-24 T,
 * T = s_m sum_g |scale_g| sum_k |q_k (c_k - 8)| + |bias| (within_bf16_bound
 * with G + 2). The reference's own fp32 group sums round up to 18 times
 * more (15 in a lane, 3 in the tree): it must meet the same form with
 * G + 20, a check of the bound and the data. Where the reference is
 * well-conditioned (e <= 2^-12 |exact|, no cancellation) the two are at
 * most one bf16 step apart. Zero rows: the bias bits; NaN/Inf rows: NaN. */
static void check_w4a8_int16(const uint16_t *x, enum radiance_dtype dt, uint32_t m, uint32_t n,
			     uint32_t k, const uint32_t *qw, const uint16_t *sc, const float *bias,
			     const uint16_t *yref, const uint16_t *y, const char *what)
{
	static uint8_t codes[MAX_K];
	const uint32_t groups = k / 128;
	for (uint32_t r = 0; r < m; r++) {
		float s = radiance_quant_row_e4m3(x + (size_t)r * k, dt, k, codes);
		bool zero = true;
		for (uint32_t i = 0; i < k; i++)
			zero = zero && (codes[i] & 0x7F) == 0;
		for (uint32_t j = 0; j < n; j++) {
			size_t e = (size_t)r * n + j;
			uint16_t got = y[e], want = yref[e];
			if (isnan(s)) {
				if (!bf16_is_nan(got) || !bf16_is_nan(want))
					fail_msg("%s: m=%u n=%u k=%u row %u (Inf/NaN) y[%u] = %#06x, "
						 "reference %#06x: both must be NaN", what, m, n, k, r, j,
						 got, want);
				continue;
			}
			if (zero && got != want)
				fail_msg("%s: m=%u n=%u k=%u row %u (zeros) y[%u] = %#06x, reference "
					 "%#06x: must be the bias's bits", what, m, n, k, r, j, got, want);
			double acc = 0, mag = 0;
			bool finite_scales = true;
			for (uint32_t g = 0; g < groups; g++) {
				double scale = radiance_f16_to_f32(sc[(size_t)j * groups + g]);
				double p = 0, a = 0;
				for (uint32_t t = 0; t < 128; t++) {
					uint32_t kk = g * 128 + t;
					uint32_t c = (qw[((size_t)j * k + kk) / 8] >> (4 * (kk % 8))) & 0xF;
					double v = radiance_e4m3_to_f32(codes[kk]) * ((double)c - 8.0);
					p += v;
					a += fabs(v);
				}
				finite_scales = finite_scales && isfinite(scale);
				acc += p * scale;
				mag += a * fabs(scale);
			}
			double b = bias ? bias[j] : 0.0;
			double exact = acc * s + b, tm = mag * s + fabs(b);
			if (!finite_scales)
				continue;
			if (!within_bf16_bound(got, exact, tm, groups + 2))
				fail_msg("%s: m=%u n=%u k=%u y[%u][%u] = %#06x (%.9g), exact %.9g, "
					 "magnitude %.6g: off the bound", what, m, n, k, r, j, got,
					 radiance_bf16_to_f32(got), exact, tm);
			if (!within_bf16_bound(want, exact, tm, groups + 20))
				fail_msg("reference: m=%u n=%u k=%u y[%u][%u] = %#06x, exact %.9g: off "
					 "its bound (the test data or bound is wrong)", m, n, k, r, j, want,
					 exact);
			double err = (groups + 21) * 0x1p-24 * 1.01 * tm;
			int16_outputs++;
			if (got != want) {
				int16_differ++;
				if (err <= 0x1p-12 * fabs(exact)) {
					uint32_t d = bf16_ulps(got, want);
					if (d > int16_max_ulps)
						int16_max_ulps = d;
					if (d > 1)
						fail_msg("%s: m=%u n=%u k=%u y[%u][%u] = %#06x, reference %#06x: "
							 "%u bf16 steps apart (at most 1 where well-conditioned)",
							 what, m, n, k, r, j, got, want, d);
				} else {
					int16_ill_conditioned++;
				}
			}
		}
	}
}

static void check_w4a8_shape(struct level *lv, size_t nlv, uint32_t m, uint32_t n, uint32_t k,
			     enum radiance_dtype dt, bool with_bias)
{
	static uint16_t yint[MAX_M * MAX_N], yrow[MAX_N];
	static uint16_t x[MAX_M * MAX_K], yref[MAX_M * MAX_N], y[MAX_M * MAX_N + 1];
	static uint32_t qw[MAX_N * MAX_K / 8];
	static uint16_t sc[MAX_N * MAX_K / 128];
	static float bias[MAX_N];
	static uint8_t scratch[MAX_M * MAX_K * 6 + 4096] __attribute__((aligned(64)));
	assert_true(radiance_cpu_w4a8_scratch_bytes(m, k) <= sizeof scratch);
	fill_x(x, m, k, dt);
	fill_w4a8(qw, sc, bias, n, k);
	radiance_cpu_w4a8(x, dt, m, qw, sc, with_bias ? bias : NULL, n, k, yref, scratch);
	bool have_int = false;
	for (size_t i = 0; i < nlv; i++) {
		memset(y, 0xA5, sizeof y);
		assert_int_equal(radiance_cpu_fast_w4a8(lv[i].f, x, dt, m, qw, sc,
							with_bias ? bias : NULL, n, k, y), 0);
		if (y[(size_t)m * n] != 0xA5A5)
			fail_msg("%s threads %u: m=%u n=%u k=%u wrote past the outputs",
				 radiance_cpu_simd_name(lv[i].simd), lv[i].threads, m, n, k);
		if (lv[i].simd == RADIANCE_CPU_SIMD_AVX2_INT16) {
			char what[64];
			snprintf(what, sizeof what, "avx2-int16 threads %u", lv[i].threads);
			if (!have_int) {
				check_w4a8_int16(x, dt, m, n, k, qw, sc, with_bias ? bias : NULL, yref, y,
						 what);
				memcpy(yint, y, (size_t)m * n * sizeof *y);
				have_int = true;
				/* a row's result does not depend on its batch: rows alone */
				for (uint32_t r = 0; r < m; r += 1 + m / 4) {
					assert_int_equal(radiance_cpu_fast_w4a8(lv[i].f, x + (size_t)r * k, dt,
										1, qw, sc,
										with_bias ? bias : NULL,
										n, k, yrow), 0);
					if (memcmp(yrow, yint + (size_t)r * n, n * sizeof *yrow) != 0)
						fail_msg("%s: m=%u n=%u k=%u row %u alone differs from the "
							 "batch", what, m, n, k, r);
				}
			} else if (memcmp(y, yint, (size_t)m * n * sizeof *y) != 0) {
				/* the same bits at every thread count */
				fail_msg("%s: m=%u n=%u k=%u differs from one thread", what, m, n, k);
			}
			continue;
		}
		for (size_t e = 0; e < (size_t)m * n; e++) {
			if (y[e] != yref[e]) {
				fail_msg("%s threads %u: m=%u n=%u k=%u %s bias %d: y[%zu][%zu] = %#06x, "
					 "reference %#06x", radiance_cpu_simd_name(lv[i].simd),
					 lv[i].threads, m, n, k, dt == RADIANCE_DTYPE_BF16 ? "bf16" : "fp16",
					 with_bias, e / n, e % n, y[e], yref[e]);
			}
		}
	}
}

static void test_w4a8(void **state)
{
	(void)state;
	struct level lv[MAX_LEVELS];
	size_t nlv = make_levels(lv, MAX_LEVELS);
	/* every M 1..65 on two shapes (odd N below and above the 8-column step) */
	for (uint32_t m = 1; m <= MAX_M; m++) {
		check_w4a8_shape(lv, nlv, m, 13, 256, m % 2 ? RADIANCE_DTYPE_BF16 : RADIANCE_DTYPE_FP16,
				 m % 3 != 0);
		check_w4a8_shape(lv, nlv, m, 67, 128, m % 2 ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16,
				 m % 4 != 0);
	}
	/* more N and K at a few M */
	const uint32_t shapes[][2] = { { 1, 128 }, { 7, 384 }, { 8, 128 }, { 9, 1024 }, { 31, 640 },
				       { 64, 512 }, { 129, 1152 }, { 257, 256 }, { 300, 128 } };
	const uint32_t ms[] = { 1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65 };
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
			check_w4a8_shape(lv, nlv, ms[i], shapes[s][0], shapes[s][1],
					 (s + i) % 2 ? RADIANCE_DTYPE_BF16 : RADIANCE_DTYPE_FP16,
					 (s + i) % 3 != 1);
	free_levels(lv, nlv);
	if (int16_outputs) {
		print_message("  avx2-int16: %zu finite outputs, %zu differ from the reference "
			      "(%zu of them ill-conditioned), at most %u bf16 step where "
			      "well-conditioned\n", int16_outputs, int16_differ, int16_ill_conditioned,
			      int16_max_ulps);
	}
}

/* Three layers of one K on one x (x quantized once on the SIMD level):
 * each y the scalar reference's bits for that layer alone, at every level
 * and thread count, for several M and an N of 0 among them; on avx2-int16
 * (not bit-exact with the reference, checked above) the bits of that
 * level's own one-layer call. */
static void test_w4a8_multi_bit_exact(void **state)
{
	(void)state;
	struct level lv[MAX_LEVELS];
	size_t nlv = make_levels(lv, MAX_LEVELS);
	enum { NL = 3, K = 384 };
	const uint32_t ns[NL] = { 67, 0, 200 };
	static uint16_t x[MAX_M * K], yref[NL][MAX_M * 200], y[NL][MAX_M * 200];
	static uint32_t qw[NL][200 * K / 8];
	static uint16_t sc[NL][200 * K / 128];
	static float bias[NL][200];
	static uint8_t scratch[MAX_M * K * 6 + 4096] __attribute__((aligned(64)));
	const uint32_t ms[] = { 1, 3, 8, 9, 33, MAX_M };
	for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
		uint32_t m = ms[mi];
		enum radiance_dtype dt = mi % 2 ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
		fill_x(x, m, K, dt);
		struct radiance_cpu_fast_w4a8_layer ls[NL];
		for (int j = 0; j < NL; j++) {
			fill_w4a8(qw[j], sc[j], bias[j], ns[j], K);
			radiance_cpu_w4a8(x, dt, m, qw[j], sc[j], j == 1 ? NULL : bias[j], ns[j], K,
					  yref[j], scratch);
			ls[j] = (struct radiance_cpu_fast_w4a8_layer){ qw[j], sc[j],
								       j == 1 ? NULL : bias[j], ns[j],
								       y[j] };
		}
		for (size_t i = 0; i < nlv; i++) {
			static uint16_t yone[NL][MAX_M * 200];
			bool own = lv[i].simd == RADIANCE_CPU_SIMD_AVX2_INT16;
			for (int j = 0; j < NL && own; j++)
				assert_int_equal(radiance_cpu_fast_w4a8(lv[i].f, x, dt, m, qw[j], sc[j],
									j == 1 ? NULL : bias[j], ns[j],
									K, yone[j]), 0);
			memset(y, 0xA5, sizeof y);
			assert_int_equal(radiance_cpu_fast_w4a8_multi(lv[i].f, x, dt, m, K, ls, NL), 0);
			for (int j = 0; j < NL; j++)
				for (size_t e = 0; e < (size_t)m * ns[j]; e++)
					if (y[j][e] != (own ? yone[j][e] : yref[j][e]))
						fail_msg("%s threads %u: m=%u layer %d (n=%u): y[%zu][%zu] "
							 "= %#06x, reference %#06x",
							 radiance_cpu_simd_name(lv[i].simd), lv[i].threads,
							 m, j, ns[j], e / ns[j], e % ns[j], y[j][e],
							 own ? yone[j][e] : yref[j][e]);
			assert_int_equal(y[1][0], 0xA5A5);   /* N=0 writes nothing */
		}
	}
	free_levels(lv, nlv);
}

/* Groups where the reference's fp32 lane sums are not the exact sums: the
 * avx2 level (its exact-integer kernel at M > 1) must give the reference's
 * bits there too, not the exact ones. Row r's group r % 2 (the other zero):
 * lane 0 (k = 8t) sums 11 x 448 * 7 = 34496 (past 2^15, where fp32's step
 * is 2^-8), then 2^-9 * 1 (a tie: lost to round-to-even), then 4 x -448 * 7:
 * the reference's lane is 21952, the exact one 21952 + 2^-9; lane 4 (k = 8t
 * + 4) is 7 x -448 * 7 = -21952. So the reference's group sum is 0 and y =
 * 0, where exact sums give 2^-9 * scale. Scale 1, s = 448 / 448 = 1. */
static void test_w4a8_inexact_reference_sums(void **state)
{
	(void)state;
	struct level lv[MAX_LEVELS];
	size_t nlv = make_levels(lv, MAX_LEVELS);
	enum { K = 256, N = 11, M = 9 };
	static uint16_t x[M * K], yref[M * N], y[M * N];
	static uint32_t qw[N * K / 8];
	static uint16_t sc[N * K / 128];
	static uint8_t scratch[M * K * 6 + 4096] __attribute__((aligned(64)));
	memset(x, 0, sizeof x);
	for (uint32_t r = 0; r < M; r++) {
		uint16_t *g = x + (size_t)r * K + (r % 2) * 128;
		for (int t = 0; t < 16; t++) {
			g[8 * t] = t < 11 ? 0x43E0 : t == 11 ? 0x3B00 : 0xC3E0;   /* 448, 2^-9, -448 */
			g[8 * t + 4] = t < 7 ? 0xC3E0 : 0;
		}
	}
	for (uint32_t j = 0; j < N; j++)
		for (uint32_t w = 0; w < K / 8; w++) {
			uint32_t t = w % 16;
			/* code 15 (+7) at nibbles 0 and 4, code 9 (+1) at t = 11's
			 * nibble 0; random where x is zero */
			uint32_t v = rnd() & 0xFFF0FFF0u;
			qw[(size_t)j * (K / 8) + w] = v | (t == 11 ? 0x9u : 0xFu) | 0xF0000u;
		}
	for (size_t i = 0; i < N * K / 128; i++)
		sc[i] = 0x3C00;   /* 1.0 */
	const uint32_t ms[] = { 1, 2, 5, M };
	for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
		uint32_t m = ms[mi];
		radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, m, qw, sc, NULL, N, K, yref, scratch);
		/* the case is what it says: the reference 0, the exact sum 2^-9 */
		for (size_t e = 0; e < (size_t)m * N; e++)
			assert_int_equal(yref[e], 0);
		for (size_t i = 0; i < nlv; i++) {
			if (lv[i].simd == RADIANCE_CPU_SIMD_AVX2_INT16) {
				/* exact group sums by design (docs/numerics.md): 2^-9 */
				assert_int_equal(radiance_cpu_fast_w4a8(lv[i].f, x, RADIANCE_DTYPE_BF16, m,
									qw, sc, NULL, N, K, y), 0);
				assert_int_equal(y[0], radiance_bf16_from_f32(0x1p-9f));
				continue;
			}
			memset(y, 0xA5, sizeof y);
			assert_int_equal(radiance_cpu_fast_w4a8(lv[i].f, x, RADIANCE_DTYPE_BF16, m, qw,
								sc, NULL, N, K, y), 0);
			for (size_t e = 0; e < (size_t)m * N; e++)
				if (y[e] != yref[e])
					fail_msg("%s threads %u: m=%u: y[%zu][%zu] = %#06x, reference %#06x "
						 "(the exact group sum's bits, not the reference's)",
						 radiance_cpu_simd_name(lv[i].simd), lv[i].threads, m,
						 e / N, e % N, y[e], yref[e]);
		}
	}
	free_levels(lv, nlv);
}

static void check_bf16_shape(struct level *lv, size_t nlv, uint32_t m, uint32_t n, uint32_t k,
			     enum radiance_dtype dt, bool integers)
{
	static uint16_t x[MAX_M * MAX_K], w[MAX_N * MAX_K], yref[MAX_M * MAX_N], y[MAX_M * MAX_N];
	static float bias[MAX_N];
	if (integers) {
		/* every product and partial sum an integer below 2^24: exact in any order */
		for (size_t i = 0; i < (size_t)m * k; i++)
			x[i] = to_x((float)((int)(rnd() % 9) - 4), dt);
		for (size_t i = 0; i < (size_t)n * k; i++)
			w[i] = radiance_bf16_from_f32((float)((int)(rnd() % 9) - 4));
		for (uint32_t j = 0; j < n; j++)
			bias[j] = (float)((int)(rnd() % 64) - 32);
	} else {
		fill_x(x, m, k, dt);
		for (size_t i = 0; i < (size_t)n * k; i++)
			w[i] = radiance_bf16_from_f32((float)rnd_unit() * 0.1f);
		for (uint32_t j = 0; j < n; j++)
			bias[j] = (float)rnd_unit();
	}
	radiance_cpu_bf16(x, dt, m, w, bias, n, k, yref);
	for (size_t i = 0; i < nlv; i++) {
		assert_int_equal(radiance_cpu_fast_bf16(lv[i].f, x, dt, m, w, bias, n, k, y), 0);
		for (uint32_t r = 0; r < m; r++)
			for (uint32_t j = 0; j < n; j++) {
				size_t e = (size_t)r * n + j;
				double exact = bias[j], mag = fabs(bias[j]);
				bool finite = true;
				for (uint32_t t = 0; t < k; t++) {
					float xv = dt == RADIANCE_DTYPE_BF16
							   ? radiance_bf16_to_f32(x[(size_t)r * k + t])
							   : radiance_f16_to_f32(x[(size_t)r * k + t]);
					double p = (double)xv * radiance_bf16_to_f32(w[(size_t)j * k + t]);
					finite = finite && isfinite(xv);
					exact += p;
					mag += fabs(p);
				}
				/* the reference's own bound: a test of the bound and the data */
				if (finite)
					assert_true(within_bf16_bound(yref[e], exact, mag, k));
				if (y[e] != yref[e])
					fail_msg("%s threads %u: m=%u n=%u k=%u %s y[%u][%u] = %#06x, "
						 "reference %#06x (exact %.9g)",
						 radiance_cpu_simd_name(lv[i].simd), lv[i].threads, m, n, k,
						 integers ? "integers" : "random", r, j, y[e], yref[e], exact);
			}
	}
}

static void test_bf16_bit_exact(void **state)
{
	(void)state;
	struct level lv[MAX_LEVELS];
	size_t nlv = make_levels(lv, MAX_LEVELS);
	const uint32_t shapes[][2] = { { 1, 1 }, { 5, 7 }, { 9, 8 }, { 17, 100 }, { 33, 387 },
				       { 64, 384 }, { 129, 1152 }, { 300, 31 } };
	const uint32_t ms[] = { 1, 2, 3, 5, 8, 9, 16, 33, 65 };
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
			for (int integers = 0; integers < 2; integers++)
				check_bf16_shape(lv, nlv, ms[i], shapes[s][0], shapes[s][1],
						 (s + i) % 2 ? RADIANCE_DTYPE_BF16 : RADIANCE_DTYPE_FP16,
						 integers);
	free_levels(lv, nlv);
}

struct count_job {
	atomic_uint *hits;
};

static void count_task(void *arg, uint32_t t)
{
	struct count_job *j = arg;
	atomic_fetch_add(&j->hits[t], 1);
}

static void test_pool_runs_each_task_once(void **state)
{
	(void)state;
	enum { MAX_TASKS = 700 };
	static atomic_uint hits[MAX_TASKS];
	for (unsigned threads = 1; threads <= 4; threads++) {
		struct radiance_cpu_pool *p;
		assert_int_equal(radiance_cpu_pool_create(threads, &p), 0);
		assert_int_equal(radiance_cpu_pool_threads(p), threads);
		for (uint32_t count = 0; count < MAX_TASKS; count += 1 + count / 3)
			for (unsigned width = 0; width <= threads + 1; width++) {
				for (uint32_t t = 0; t < MAX_TASKS; t++)
					atomic_store(&hits[t], 0);
				struct count_job j = { hits };
				radiance_cpu_pool_run(p, width, count, count_task, &j);
				for (uint32_t t = 0; t < MAX_TASKS; t++)
					if (atomic_load(&hits[t]) != (t < count ? 1u : 0u))
						fail_msg("threads %u width %u count %u: task %u ran %u times",
							 threads, width, count, t, atomic_load(&hits[t]));
			}
		radiance_cpu_pool_destroy(p);
	}
	assert_int_equal(radiance_cpu_pool_create(0, &(struct radiance_cpu_pool *){ NULL }), -EINVAL);
}

/* Many small jobs back to back, so that pool threads wake late, find the job
 * they woke for gone and the slot it used reused: every task of every job
 * runs once, on its own job's arg, while its radiance_cpu_pool_run() call is
 * still running (never after it returned). */
struct live_job {
	atomic_int live;
	atomic_uint hits[3];
	atomic_uint late;
};

static void live_task(void *arg, uint32_t t)
{
	struct live_job *j = arg;
	/* a few microseconds, so that pool threads claim some of the tasks
	 * while the caller runs its first one */
	for (volatile int i = 0; i < 2000; i++)
		;
	if (!atomic_load(&j->live))
		atomic_fetch_add(&j->late, 1);
	atomic_fetch_add(&j->hits[t], 1);
}

static void test_pool_back_to_back_jobs(void **state)
{
	(void)state;
	static struct live_job jobs[3];
	for (unsigned threads = 2; threads <= 4; threads++) {
		struct radiance_cpu_pool *p;
		assert_int_equal(radiance_cpu_pool_create(threads, &p), 0);
		for (unsigned n = 0; n < 20000; n++) {
			struct live_job *j = &jobs[n % 3];
			uint32_t count = 2 + n % 2;
			for (int t = 0; t < 3; t++)
				atomic_store(&j->hits[t], 0);
			atomic_store(&j->late, 0);
			atomic_store(&j->live, 1);
			radiance_cpu_pool_run(p, 0, count, live_task, j);
			atomic_store(&j->live, 0);
			for (uint32_t t = 0; t < 3; t++)
				if (atomic_load(&j->hits[t]) != (t < count ? 1u : 0u))
					fail_msg("threads %u job %u: task %u ran %u times", threads, n, t,
						 atomic_load(&j->hits[t]));
		}
		radiance_cpu_pool_destroy(p);
		for (int i = 0; i < 3; i++)
			if (atomic_load(&jobs[i].late))
				fail_msg("threads %u: a task ran after its job returned", threads);
	}
}

static void test_usable_threads_follow_affinity(void **state)
{
	(void)state;
	cpu_set_t set;
	assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
	unsigned n = radiance_cpu_usable_threads(NULL);
	assert_true(n >= 1 && n <= (unsigned)CPU_COUNT(&set));
	/* in a child pinned to one CPU the count is 1, said to come from affinity */
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		cpu_set_t one;
		CPU_ZERO(&one);
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set)) {
				CPU_SET(c, &one);
				break;
			}
		const char *why = NULL;
		if (sched_setaffinity(0, sizeof one, &one) != 0)
			_exit(2);
		_exit(radiance_cpu_usable_threads(&why) == 1 && why &&
		      strcmp(why, "sched_getaffinity") == 0 ? 0 : 1);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_errors(void **state)
{
	(void)state;
	char err[256] = "";
	struct radiance_cpu_fast *f = NULL;
	struct radiance_cpu_fast_options o = { .threads = 2, .simd = RADIANCE_CPU_SIMD_AUTO,
					       .max_rows = 4, .max_k = 256 };
	static uint16_t x[8 * 512], y[8 * 8];
	static uint32_t qw[8 * 512 / 8];
	static uint16_t sc[8 * 4];
	assert_int_equal(radiance_cpu_fast_create(&o, &f, err, sizeof err), 0);
	/* what create allocated is what the sizing function says (the daemon's
	 * out-of-memory message and test_hardening rely on it) */
	assert_int_equal(radiance_cpu_fast_scratch_bytes_for(&o), radiance_cpu_fast_scratch_bytes(f));
	assert_true(radiance_cpu_fast_scratch_bytes(f) >= 4 * 256 * 4);
	assert_int_equal(radiance_cpu_fast_w4a8(f, x, RADIANCE_DTYPE_BF16, 5, qw, sc, NULL, 8, 256, y),
			 -E2BIG);
	assert_int_equal(radiance_cpu_fast_w4a8(f, x, RADIANCE_DTYPE_BF16, 4, qw, sc, NULL, 8, 512, y),
			 -E2BIG);
	assert_int_equal(radiance_cpu_fast_w4a8(f, x, RADIANCE_DTYPE_BF16, 4, qw, sc, NULL, 8, 200, y),
			 -EINVAL);
	assert_int_equal(radiance_cpu_fast_bf16(f, x, RADIANCE_DTYPE_BF16, 5, x, NULL, 8, 8, y), -E2BIG);
	radiance_cpu_fast_destroy(f);

	o.simd = (enum radiance_cpu_simd)9;
	assert_int_equal(radiance_cpu_fast_create(&o, &f, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "SIMD level 9"));
	assert_int_equal(radiance_cpu_fast_scratch_bytes_for(&o), 0);
	o.simd = RADIANCE_CPU_SIMD_SCALAR;
	assert_int_equal(radiance_cpu_fast_create(&o, &f, err, sizeof err), 0);
	assert_int_equal(radiance_cpu_fast_simd(f), RADIANCE_CPU_SIMD_SCALAR);
	assert_int_equal(radiance_cpu_fast_scratch_bytes_for(&o), radiance_cpu_fast_scratch_bytes(f));
	radiance_cpu_fast_destroy(f);
	o.simd = RADIANCE_CPU_SIMD_AUTO;

	o.max_rows = 0;
	assert_int_equal(radiance_cpu_fast_create(&o, &f, err, sizeof err), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_w4a8),
		cmocka_unit_test(test_w4a8_multi_bit_exact),
		cmocka_unit_test(test_w4a8_inexact_reference_sums),
		cmocka_unit_test(test_bf16_bit_exact),
		cmocka_unit_test(test_pool_runs_each_task_once),
		cmocka_unit_test(test_pool_back_to_back_jobs),
		cmocka_unit_test(test_usable_threads_follow_affinity),
		cmocka_unit_test(test_errors),
	};
	/* RADIANCE_TEST_FILTER: run only the tests whose names match (cmocka's
	 * wildcards), e.g. a piece at a time under emulation */
	if (getenv("RADIANCE_TEST_FILTER"))
		cmocka_set_test_filter(getenv("RADIANCE_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
