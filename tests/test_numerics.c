/*
 * kernels/numerics.h and the CPU backend against the definition:
 *   - e4m3: the worked cases, every one of the 256 codes round-tripped and
 *     every midpoint between neighbours rounded to the even code;
 *   - bf16 RNE and fp16 decode, including ties, NaN, Inf and subnormals
 *     (fp16 decode exhaustively against an independent ldexp formula);
 *   - per-token quant: Inf/NaN rows give NaN output rows, all-zero rows give
 *     exactly the bias;
 *   - the spec's end-to-end example (-36), padded to K = 128;
 *   - a W4A8 GEMM with codes varying along n and k against a double
 *     precision reference that quantizes activations with its own
 *     brute-force nearest-e4m3 search and dequantizes from the code table,
 *     not from the packed words.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "numerics.h"
#include "w4a8_cpu.h"

static float bits_f(uint32_t u)
{
	return radiance_f32_from_bits(u);
}

static bool bf16_is_nan(uint16_t h)
{
	return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu);
}

/* ---- e4m3 --------------------------------------------------------------- */

static void test_e4m3_cases(void **state)
{
	(void)state;
	static const struct {
		float x;
		uint8_t code;
	} cases[] = {
		{ 448.0f, 0x7E },           /* max finite */
		{ 1000.0f, 0x7E },          /* saturates */
		{ 464.0f, 0x7E },           /* the would-be midpoint to 480: saturates */
		{ 256.0f, 0x78 },
		{ 240.0f, 0x77 },
		{ 17.0f, 0x58 },            /* 16 + 1: tie between 16 and 18, to even 16 */
		{ 19.0f, 0x5A },            /* 18 + 1: tie between 18 and 20, to even 20 */
		{ 17.5f, 0x59 },            /* above the tie: 18 */
		{ 1.0f, 0x38 },
		{ 0x1p-6f, 0x08 },          /* smallest normal */
		{ 0x1p-9f, 0x01 },          /* smallest subnormal */
		{ 0x1p-10f, 0x00 },         /* half of it: tie, to even 0 */
		{ 3 * 0x1p-10f, 0x02 },     /* 1.5 subnormal steps: tie, to even 2 */
		{ 0x1.8p-10f, 0x01 },       /* 0.75 of a step: up */
		{ 0.0f, 0x00 },
		{ -0.0f, 0x80 },
		{ -448.0f, 0xFE },
		{ -1000.0f, 0xFE },
		{ -17.0f, 0xD8 },
		{ -0x1p-9f, 0x81 },
		{ INFINITY, 0x7E },         /* saturating: never reached by the per-token path */
		{ -INFINITY, 0xFE },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		uint8_t c = radiance_e4m3_from_f32(cases[i].x);
		if (c != cases[i].code)
			print_error("e4m3(%a) = 0x%02x, expected 0x%02x\n", (double)cases[i].x, c,
				    cases[i].code);
		assert_int_equal(c, cases[i].code);
	}
	assert_int_equal(radiance_e4m3_from_f32(NAN), 0x7F);
	assert_int_equal(radiance_e4m3_from_f32(-NAN), 0x7F);          /* canonical NaN, sign dropped */
	assert_int_equal(radiance_e4m3_from_f32(bits_f(0x7F800001u)), 0x7F);
}

/* The value of code c from the bit layout, in double, written independently
 * of numerics.h: S.EEEE.MMM, bias 7, subnormals at E = 0, S.1111.111 NaN. */
static double e4m3_value(uint8_t c)
{
	int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
	double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
	return s ? -v : v;
}

static void test_e4m3_all_codes(void **state)
{
	(void)state;
	for (int c = 0; c < 256; c++) {
		float v = radiance_e4m3_to_f32((uint8_t)c);
		if ((c & 0x7F) == 0x7F) {
			/* the two NaNs: decode to NaN, encode back to the one canonical 0x7F */
			assert_true(isnan(v));
			assert_int_equal(radiance_e4m3_from_f32(v), 0x7F);
			continue;
		}
		assert_true((double)v == e4m3_value((uint8_t)c));
		assert_int_equal(!!signbit(v), c >> 7);                     /* 0x80 is -0 */
		assert_int_equal(radiance_e4m3_from_f32(v), c);
	}
	assert_true(radiance_e4m3_to_f32(0x7E) == 448.0f);
	assert_true(radiance_e4m3_to_f32(0x01) == 0x1p-9f);

	/* every midpoint between neighbouring finite codes goes to the even one,
	 * and a hair above / below goes to the nearer one */
	for (int c = 0; c < 0x7E; c++) {
		float lo = radiance_e4m3_to_f32((uint8_t)c), hi = radiance_e4m3_to_f32((uint8_t)(c + 1));
		float mid = (lo + hi) / 2;                                   /* exact in fp32 */
		uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
		assert_int_equal(radiance_e4m3_from_f32(mid), even);
		assert_int_equal(radiance_e4m3_from_f32(-mid), even | 0x80);
		assert_int_equal(radiance_e4m3_from_f32(nextafterf(mid, 0.0f)), c);
		assert_int_equal(radiance_e4m3_from_f32(nextafterf(mid, 1000.0f)), c + 1);
	}
}

/* ---- bf16 and fp16 ------------------------------------------------------ */

static void test_bf16_rne(void **state)
{
	(void)state;
	static const struct {
		uint32_t f;
		uint16_t h;
	} cases[] = {
		{ 0x3F800000u, 0x3F80 },    /* 1.0 */
		{ 0x3F808000u, 0x3F80 },    /* 1 + 2^-8: tie, to even (down) */
		{ 0x3F818000u, 0x3F82 },    /* 1 + 3 * 2^-8: tie, to even (up) */
		{ 0x3F808001u, 0x3F81 },    /* just above the tie */
		{ 0x3F807FFFu, 0x3F80 },    /* just below */
		{ 0xBF818000u, 0xBF82 },    /* negative tie */
		{ 0x7F7FFFFFu, 0x7F80 },    /* FLT_MAX rounds to Inf */
		{ 0x7F800000u, 0x7F80 },    /* Inf */
		{ 0xFF800000u, 0xFF80 },    /* -Inf */
		{ 0x7F800001u, 0x7FC0 },    /* signalling NaN -> quiet */
		{ 0x7FC00000u, 0x7FC0 },
		{ 0xFFC00001u, 0xFFC0 },    /* NaN keeps its sign */
		{ 0x80000000u, 0x8000 },    /* -0 */
		{ 0x00000001u, 0x0000 },    /* tiny subnormal rounds to 0 */
		{ 0x00008000u, 0x0000 },    /* subnormal tie, to even 0 */
		{ 0x00018000u, 0x0002 },    /* subnormal tie, to even 2 */
		{ 0x00010000u, 0x0001 },    /* exact subnormal */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		uint16_t h = radiance_bf16_from_f32(bits_f(cases[i].f));
		if (h != cases[i].h)
			print_error("bf16(0x%08x) = 0x%04x, expected 0x%04x\n", cases[i].f, h, cases[i].h);
		assert_int_equal(h, cases[i].h);
	}
	/* every bf16 value round-trips through fp32 */
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = radiance_bf16_to_f32((uint16_t)h);
		if (isnan(f))
			assert_true(bf16_is_nan(radiance_bf16_from_f32(f)));
		else
			assert_int_equal(radiance_bf16_from_f32(f), h);
	}
}

static void test_f16_decode(void **state)
{
	(void)state;
	assert_true(radiance_f16_to_f32(0x3C00) == 1.0f);
	assert_true(radiance_f16_to_f32(0xC000) == -2.0f);
	assert_true(radiance_f16_to_f32(0x0001) == 0x1p-24f);            /* smallest subnormal */
	assert_true(radiance_f16_to_f32(0x03FF) == 1023 * 0x1p-24f);     /* largest subnormal */
	assert_true(radiance_f16_to_f32(0x0400) == 0x1p-14f);            /* smallest normal */
	assert_true(radiance_f16_to_f32(0x8001) == -0x1p-24f);
	assert_true(radiance_f16_to_f32(0x7BFF) == 65504.0f);
	assert_true(radiance_f16_to_f32(0x3555) == 0x1.554p-2f);
	assert_true(isinf(radiance_f16_to_f32(0x7C00)) && radiance_f16_to_f32(0x7C00) > 0);
	assert_true(isinf(radiance_f16_to_f32(0xFC00)) && radiance_f16_to_f32(0xFC00) < 0);
	assert_true(isnan(radiance_f16_to_f32(0x7E00)));
	assert_true(isnan(radiance_f16_to_f32(0x7C01)));
	float nz = radiance_f16_to_f32(0x8000);
	assert_true(nz == 0.0f && signbit(nz));
	/* exhaustively against the textbook formula */
	for (uint32_t h = 0; h < 0x10000u; h++) {
		int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
		float v = radiance_f16_to_f32((uint16_t)h);
		if (e == 31) {
			assert_true(m ? isnan(v) : isinf(v));
			continue;
		}
		double r = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
		assert_true((double)v == (s ? -r : r));
	}
}

/* ---- per-token quant ---------------------------------------------------- */

static void test_quant_row_special(void **state)
{
	(void)state;
	uint16_t x[128];
	uint8_t codes[128];

	for (int i = 0; i < 128; i++)
		x[i] = radiance_bf16_from_f32((float)(i - 64) / 16.0f);
	float s = radiance_quant_row_e4m3(x, RADIANCE_DTYPE_BF16, 128, codes);
	assert_true(s == 4.0f / 448.0f);
	assert_int_equal(codes[0], 0xFE);                                   /* -4 = -amax -> -448 */
	assert_int_equal(codes[64], 0x00);

	x[77] = 0x7F80;                                                     /* +Inf */
	s = radiance_quant_row_e4m3(x, RADIANCE_DTYPE_BF16, 128, codes);
	assert_true(isnan(s));
	for (int i = 0; i < 128; i++)
		assert_int_equal(codes[i], 0x7F);
	x[77] = 0xFFC0;                                                     /* NaN */
	s = radiance_quant_row_e4m3(x, RADIANCE_DTYPE_BF16, 128, codes);
	assert_true(isnan(s));

	memset(x, 0, sizeof x);
	x[5] = 0x8000;                                                      /* -0 counts as zero */
	s = radiance_quant_row_e4m3(x, RADIANCE_DTYPE_BF16, 128, codes);
	assert_true(s == RADIANCE_MIN_SCALE);
	for (int i = 0; i < 128; i++)
		assert_int_equal(codes[i] & 0x7F, 0);

	/* fp16 input: 65504 is the row max and maps to 448 */
	memset(x, 0, sizeof x);
	x[3] = 0x7BFF;
	x[4] = 0xFBFF;
	s = radiance_quant_row_e4m3(x, RADIANCE_DTYPE_FP16, 128, codes);
	assert_true(s == 65504.0f / 448.0f);
	assert_int_equal(codes[3], 0x7E);
	assert_int_equal(codes[4], 0xFE);
}

static void fill_weights(uint32_t *qw, uint16_t *sc, uint32_t n, uint32_t k)
{
	for (uint32_t j = 0; j < n; j++) {
		for (uint32_t w = 0; w < k / 8; w++)
			qw[j * (k / 8) + w] = 0x9A6B2F18u ^ (j * 0x01010101u) ^ (w * 0x10203040u);
		for (uint32_t g = 0; g < k / 128; g++)
			sc[j * (k / 128) + g] = 0x2E00;                       /* 0.09375 */
	}
}

/* Rows: +Inf, all zero, ordinary; with and without bias. */
static void test_nonfinite_and_zero_rows(void **state)
{
	(void)state;
	enum { M = 3, N = 4, K = 256 };
	uint16_t x[M * K], y[M * N];
	uint32_t qw[N * K / 8];
	uint16_t sc[N * K / 128];
	float bias[N] = { 1.5f, -2.25f, 0.0f, 3.0f };    /* exact in bf16 */
	void *scratch = aligned_alloc(16, (radiance_cpu_w4a8_scratch_bytes(M, K) + 15) & ~(size_t)15);

	fill_weights(qw, sc, N, K);
	for (int i = 0; i < K; i++) {
		x[i] = radiance_bf16_from_f32((float)i / 100.0f);
		x[K + i] = (i & 1) ? 0x8000 : 0x0000;
		x[2 * K + i] = radiance_bf16_from_f32((float)(i % 17) - 8.0f);
	}
	x[100] = 0xFF80;                                                    /* -Inf in row 0 */

	radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, M, qw, sc, bias, N, K, y, scratch);
	for (int j = 0; j < N; j++) {
		assert_true(bf16_is_nan(y[j]));                                 /* the whole row */
		assert_int_equal(y[N + j], radiance_bf16_from_f32(bias[j]));    /* exactly the bias */
		assert_false(bf16_is_nan(y[2 * N + j]));
	}
	radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, M, qw, sc, NULL, N, K, y, scratch);
	for (int j = 0; j < N; j++) {
		assert_true(bf16_is_nan(y[j]));
		assert_int_equal(y[N + j] & 0x7FFF, 0);                         /* zeros */
	}
	free(scratch);
}

/* The spec's example: one word 0x76543210 (codes 0..7 -> -8..-1), scale
 * 1.0, x = eight 1.0: sum(-8..-1) = -36. K must be 128, so the rest of the
 * row is x = 0 against code 8 (weight 0). */
static void test_end_to_end_minus_36(void **state)
{
	(void)state;
	enum { K = 128 };
	uint16_t x[K] = { 0 }, y[1];
	uint32_t qw[K / 8];
	uint16_t sc[1] = { 0x3C00 };
	uint8_t scratch[2048] __attribute__((aligned(16)));

	assert_true(radiance_cpu_w4a8_scratch_bytes(1, K) <= sizeof scratch);
	for (int i = 0; i < K / 8; i++)
		qw[i] = 0x88888888u;
	qw[0] = 0x76543210u;
	for (int i = 0; i < 8; i++)
		x[i] = 0x3F80;
	radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, 1, qw, sc, NULL, 1, K, y, scratch);
	assert_true(radiance_bf16_to_f32(y[0]) == -36.0f);
	assert_int_equal(y[0], 0xC210);
	/* fp16 activations, same answer */
	for (int i = 0; i < 8; i++)
		x[i] = 0x3C00;
	radiance_cpu_w4a8(x, RADIANCE_DTYPE_FP16, 1, qw, sc, NULL, 1, K, y, scratch);
	assert_true(radiance_bf16_to_f32(y[0]) == -36.0f);
}

/* ---- W4A8 against an independent double reference ----------------------- */

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint32_t rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

static double rnd_unit(void)   /* (-1, 1) */
{
	return ((double)rnd() / 2147483648.0) - 1.0;
}

/* Nearest e4m3 code by brute force over all finite codes, ties to the even
 * code, saturating at +-448: the definition, not the bit tricks. */
static uint8_t e4m3_nearest(float q)
{
	int best = 0;
	double bd = INFINITY;
	double v = fmin(fmax((double)q, -448.0), 448.0);
	for (int c = 0; c < 256; c++) {
		if ((c & 0x7F) == 0x7F)
			continue;
		double d = fabs(e4m3_value((uint8_t)c) - v);
		if (d < bd || (d == bd && !(c & 1) && (best & 1))) {
			bd = d;
			best = c;
		}
	}
	if (e4m3_value((uint8_t)best) == 0.0)               /* keep the sign of zero */
		best = signbit(q) ? 0x80 : 0x00;
	return (uint8_t)best;
}

static double rel_frobenius(const uint16_t *y, const double *ref, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)radiance_bf16_to_f32(y[i]) - ref[i];
		num += d * d;
		den += ref[i] * ref[i];
	}
	return sqrt(num / den);
}

static void test_w4a8_vs_double(void **state)
{
	(void)state;
	enum { M = 6, N = 40, K = 512, G = K / 128 };
	static uint8_t code[N][K];
	static uint16_t x[M * K], y[M * N];
	static uint32_t qw[N * K / 8];
	static uint16_t sc[N * G];
	static double ref[M * N];
	static uint8_t my_codes[M * K], lib_codes[M * K];
	float bias[N], s_lib[M];

	/* codes depend on n and k (and are random), scales on n and g, some negative */
	for (int n = 0; n < N; n++)
		for (int k = 0; k < K; k++)
			code[n][k] = (uint8_t)((rnd() >> 7) % 16);
	for (int n = 0; n < N; n++) {
		for (int w = 0; w < K / 8; w++) {
			uint32_t v = 0;
			for (int j = 0; j < 8; j++)
				v |= (uint32_t)code[n][w * 8 + j] << (4 * j);
			qw[n * (K / 8) + w] = v;
		}
		for (int g = 0; g < G; g++)
			sc[n * G + g] = (uint16_t)(0x1C00u + rnd() % 0x1000u) | (rnd() % 5 == 0 ? 0x8000 : 0);
		bias[n] = (float)rnd_unit();
	}
	/* activations with an outlier channel and one small-magnitude row */
	for (int m = 0; m < M; m++)
		for (int k = 0; k < K; k++) {
			double v = rnd_unit() * 2.0 + (k == 17 ? 30.0 : 0.0);
			if (m == 3)
				v *= 1e-6;
			x[m * K + k] = radiance_bf16_from_f32((float)v);
		}

	/* reference: per-token quant by the definition, codes by brute force */
	for (int m = 0; m < M; m++) {
		float amax = 0;
		for (int k = 0; k < K; k++)
			amax = fmaxf(amax, fabsf(radiance_bf16_to_f32(x[m * K + k])));
		float s = fmaxf(amax / 448.0f, 1.0f / (448.0f * 512.0f));
		float inv = 1.0f / s;
		for (int k = 0; k < K; k++)
			my_codes[m * K + k] = e4m3_nearest(radiance_bf16_to_f32(x[m * K + k]) * inv);
		for (int n = 0; n < N; n++) {
			double acc = 0;
			for (int k = 0; k < K; k++)
				acc += e4m3_value(my_codes[m * K + k]) * (code[n][k] - 8) *
				       (double)radiance_f16_to_f32(sc[n * G + k / 128]);
			ref[m * N + n] = acc * s + bias[n];
		}
		/* the library's codes agree bit for bit */
		s_lib[m] = radiance_quant_row_e4m3(x + m * K, RADIANCE_DTYPE_BF16, K, lib_codes + m * K);
		assert_true(s_lib[m] == s);
	}
	assert_memory_equal(my_codes, lib_codes, sizeof my_codes);

	void *scratch = aligned_alloc(16, (radiance_cpu_w4a8_scratch_bytes(M, K) + 15) & ~(size_t)15);
	radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, M, qw, sc, bias, N, K, y, scratch);
	free(scratch);
	double rel = rel_frobenius(y, ref, M * N);
	print_message("  W4A8 M=%d N=%d K=%d: rel Frobenius vs double reference %.2e\n", M, N, K, rel);
	assert_true(rel < 4e-3);
	/* and per row, so the tiny row cannot hide behind the big ones */
	for (int m = 0; m < M; m++)
		assert_true(rel_frobenius(y + m * N, ref + m * N, N) < 4e-3);

	/* the bound is tight enough to see a layout slip: reverse the nibble
	 * order (k = 8w + 7 - j) in the words of output 0 */
	for (int w = 0; w < K / 8; w++) {
		uint32_t v = qw[w], r = 0;
		for (int j = 0; j < 8; j++)
			r |= ((v >> (4 * j)) & 0xFu) << (4 * (7 - j));
		qw[w] = r;
	}
	scratch = aligned_alloc(16, (radiance_cpu_w4a8_scratch_bytes(M, K) + 15) & ~(size_t)15);
	radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, M, qw, sc, bias, N, K, y, scratch);
	free(scratch);
	double num = 0, den = 0;
	for (int m = 0; m < M; m++) {
		double d = radiance_bf16_to_f32(y[m * N]) - ref[m * N];
		num += d * d;
		den += ref[m * N] * ref[m * N];
	}
	print_message("  nibble order reversed in one row: rel error of that output %.2e\n",
		      sqrt(num / den));
	assert_true(sqrt(num / den) > 10 * 4e-3);
}

static void test_bf16_linear_vs_double(void **state)
{
	(void)state;
	enum { M = 3, N = 17, K = 200 };
	static uint16_t x[M * K], w[N * K], y[M * N];
	static double ref[M * N];
	float bias[N];
	for (int i = 0; i < M * K; i++)
		x[i] = radiance_bf16_from_f32((float)rnd_unit());
	for (int i = 0; i < N * K; i++)
		w[i] = radiance_bf16_from_f32((float)rnd_unit() * 0.1f);
	for (int n = 0; n < N; n++)
		bias[n] = (float)rnd_unit();
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			double acc = bias[n];
			for (int k = 0; k < K; k++)
				acc += (double)radiance_bf16_to_f32(x[m * K + k]) *
				       radiance_bf16_to_f32(w[n * K + k]);
			ref[m * N + n] = acc;
		}
	radiance_cpu_bf16(x, RADIANCE_DTYPE_BF16, M, w, bias, N, K, y);
	assert_true(rel_frobenius(y, ref, M * N) < 4e-3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_e4m3_cases),
		cmocka_unit_test(test_e4m3_all_codes),
		cmocka_unit_test(test_bf16_rne),
		cmocka_unit_test(test_f16_decode),
		cmocka_unit_test(test_quant_row_special),
		cmocka_unit_test(test_nonfinite_and_zero_rows),
		cmocka_unit_test(test_end_to_end_minus_36),
		cmocka_unit_test(test_w4a8_vs_double),
		cmocka_unit_test(test_bf16_linear_vs_double),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
