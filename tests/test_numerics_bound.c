/*
 * The numerics contract's bound (kernels/numerics_bound.h) on the CPU:
 *   - worked cases: the spec's -36 example (exact, one bf16 step allowed);
 *     a k32 step where alignment to 3584 shifts out 29 products of 0.1875
 *     (the emulation gives 0 for an exact 5.4375: outside the fp32 bound,
 *     inside the fp8 one); the emulation's truncation toward -inf of a
 *     negative addend, checked by hand;
 *   - real values: every W4A8 layer of the shipped MiniLM checkpoint with
 *     its captured activations (tests/data): the CPU reference is inside the
 *     fp32 bound everywhere; the emulation of Hopper's fp8 accumulation (13
 *     bits, as measured) is inside the fp8 bound everywhere, within the norm
 *     bound of the CPU reference, and outside the fp32 bound somewhere (so
 *     the two bounds tell the paths apart);
 *   - argument errors.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "model.h"
#include "numerics_bound.h"
#include "safetensors.h"
#include "w4a8_cpu.h"

/* qweight row of 128 codes c (canonical: k = 8w + p at bits 4p of word w) */
static void pack_row(const int *w, uint32_t *q)
{
	memset(q, 0, 16 * sizeof *q);
	for (int k = 0; k < 128; k++)
		q[k / 8] |= (uint32_t)(w[k] + 8) << (4 * (k % 8));
}

static void spec_example(void **state)
{
	(void)state;
	/* docs/numerics.md: codes 0..7 for k < 8, x = 1 there: y = -36 */
	int w[128] = {0};
	for (int k = 0; k < 8; k++)
		w[k] = k - 8;
	uint32_t q[16];
	pack_row(w, q);
	uint8_t codes[128] = {0};
	for (int k = 0; k < 8; k++)
		codes[k] = 0x7E;   /* 448 */
	const uint16_t sc = 0x3C00;   /* fp16 1.0 */
	double ex, al;
	radiance_w4a8_bound(codes, 1.0f / 448.0f, q, &sc, 0.0f, 128, RADIANCE_ACC_FP32, &ex, &al);
	/* 16128 x fp32(1/448): -36 to within the rounding of s */
	assert_true(ex == -16128.0 * (double)(1.0f / 448.0f));
	assert_true(fabs(ex + 36.0) < 36.0 * 0x1p-24);
	/* one bf16 step at 36 (2^(5-7)) plus the fp32 slack 2^-24 (4 x 128 + 4) 36 x 1.01 */
	assert_true(fabs(al - (0.25 + 0x1p-24 * 516 * 36 * 1.01)) < 1e-9);
	radiance_w4a8_bound(codes, 1.0f / 448.0f, q, &sc, 0.0f, 128, RADIANCE_ACC_FP8_SM90, &ex, &al);
	/* 8 products 448 (c - 8), the largest 3584: 2^-12 (9 * 2048 + 16128), times s */
	const double e8 = ((9.0 * 2048 + 16128) / 4096 / 448 + 0x1p-24 * 4 * 36) * 1.01;
	assert_true(fabs(al - (e8 + 0.25)) < 1e-9);
	/* a NaN scale (a row with Inf or NaN) has no bound */
	radiance_w4a8_bound(codes, NAN, q, &sc, 0.0f, 128, RADIANCE_ACC_FP32, &ex, &al);
	assert_true(isnan(ex) && isnan(al));
}

/* One k32 step: -3584 + 3136 + 448 = 0 and 29 x 0.1875 = 5.4375. Aligned
 * to 2^11 with 13 fraction bits the step's unit is 2^-2, so each 0.1875 is
 * shifted out: the tensor core returns 0. */
static void alignment_loses_small_products(void **state)
{
	(void)state;
	int w[128] = {0};
	uint8_t codes[128] = {0};
	w[0] = -8, w[1] = 7, w[2] = 1;
	codes[0] = codes[1] = codes[2] = 0x7E;            /* 448 */
	const uint8_t c0_1875 = radiance_e4m3_from_f32(0.1875f);
	assert_true(radiance_e4m3_to_f32(c0_1875) == 0.1875f);
	for (int k = 3; k < 32; k++) {
		w[k] = 1;
		codes[k] = c0_1875;
	}
	uint32_t q[16];
	pack_row(w, q);
	float prod[128];
	for (int k = 0; k < 128; k++)
		prod[k] = radiance_e4m3_to_f32(codes[k]) * (float)w[k];
	assert_true(radiance_fp8_sm90_group(prod, RADIANCE_FP8_SM90_BITS) == 0.0f);
	/* with 22 fraction bits the unit is 2^-11: nothing is lost */
	assert_true(radiance_fp8_sm90_group(prod, 22) == 5.4375f);

	const uint16_t sc = 0x3C00;
	const float s = 1.0f;
	uint16_t y_emul, y_cpu;
	assert_int_equal(radiance_w4a8_fp8_sm90_emulate(codes, &s, q, &sc, NULL, 1, 1, 128,
							RADIANCE_FP8_SM90_BITS, &y_emul), 0);
	radiance_cpu_w4a8_gemm(codes, &s, 1, q, &sc, NULL, 1, 128, &y_cpu);
	assert_int_equal(y_emul, 0);
	assert_true(radiance_bf16_to_f32(y_cpu) == 5.4375f);   /* exact in bf16 */
	struct radiance_bound_report r;
	assert_int_equal(radiance_w4a8_bound_check(codes, &s, q, &sc, NULL, 1, 1, 128, RADIANCE_ACC_FP32, &y_cpu, &r), 0);
	assert_int_equal(r.outside, 0);
	assert_int_equal(r.checked, 1);
	assert_true(r.worst == 0.0);
	assert_int_equal(radiance_w4a8_bound_check(codes, &s, q, &sc, NULL, 1, 1, 128, RADIANCE_ACC_FP32, &y_emul, &r), 0);
	assert_int_equal(r.outside, 1);
	assert_true(r.worst_exact == 5.4375 && r.worst_y == 0.0);
	/* fp32 bound: one bf16 step at 5.4375 (2^-5) and 2^-24 (4 x 128 + 4) S x 1.01 */
	const double S = 3584 + 3136 + 448 + 5.4375;
	assert_true(fabs(r.worst_allowed - (0.03125 + 0x1p-24 * 516 * S * 1.01)) < 1e-12);
	assert_int_equal(radiance_w4a8_bound_check(codes, &s, q, &sc, NULL, 1, 1, 128, RADIANCE_ACC_FP8_SM90,
						   &y_emul, &r), 0);
	assert_int_equal(r.outside, 0);
	/* 32 nonzero products, the largest 3584: 2^-12 (33 * 2^11 + S), fp32
	 * slack, x 1.01, and the bf16 step at 5.4375 + 18.3 (2^-3) */
	const double want = ((33.0 * 2048 + S) / 4096 + 0x1p-24 * 4 * S) * 1.01 + 0.125;
	assert_true(fabs(r.worst_allowed - want) < 1e-9);
}

/* Truncation of a negative addend goes toward -inf (sign-filled shift):
 * -1.0625 aligned to 3136's unit 2^-2 becomes -1.25. */
static void emulation_truncates_toward_minus_inf(void **state)
{
	(void)state;
	float prod[128] = {0};
	prod[0] = 3136.0f;
	prod[1] = -1.0625f;
	assert_true(radiance_fp8_sm90_group(prod, 13) == 3134.75f);
	/* the result itself is cut to 13 fraction bits toward zero: 3136 +
	 * 1.75 = 3137.75, a unit of 2^-2 at 2^11, kept; 4095.875 -> 4095.75 */
	prod[1] = 1.75f;
	assert_true(radiance_fp8_sm90_group(prod, 13) == 3137.75f);
	/* partials carry from step to step: step 2 aligns to the partial */
	memset(prod, 0, sizeof prod);
	prod[0] = 3136.0f;
	prod[32] = 0.125f;
	assert_true(radiance_fp8_sm90_group(prod, 13) == 3136.0f);
	prod[32] = 0.25f;
	assert_true(radiance_fp8_sm90_group(prod, 13) == 3136.25f);
}

static void minilm_layers(void **state)
{
	(void)state;
	const char *data = getenv("RADIANCE_TEST_DATA") ? getenv("RADIANCE_TEST_DATA") : "tests/data";
	char dir[512], acts[512], err[512] = "";
	snprintf(dir, sizeof dir, "%s/minilm-w4g128", data);
	snprintf(acts, sizeof acts, "%s/minilm-acts.safetensors", data);
	struct radiance_model *model = NULL;
	struct radiance_st_file *st = NULL;
	if (radiance_checkpoint_load_dir(dir, NULL, NULL, NULL, &model, err, sizeof err) != 0)
		fail_msg("checkpoint %s: %s", dir, err);
	if (radiance_st_load_path(acts, &st, err, sizeof err) != 0)
		fail_msg("activations %s: %s", acts, err);
	size_t layers = 0, emul_outside_fp32 = 0, elements = 0;
	double worst_cpu = 0, worst_emul = 0, max_rel = 0;
	for (size_t i = 0; i < model->n_layers; i++) {
		const struct radiance_layer *l = &model->layers[i];
		if (l->kind != RADIANCE_LAYER_W4A8)
			continue;
		char name[512];
		snprintf(name, sizeof name, "%s.x", l->name);
		const struct radiance_st_tensor *t = radiance_st_find(st, name);
		if (!t || t->dtype != RADIANCE_ST_F32 || t->ndim != 2 || t->shape[1] != l->k)
			fail_msg("layer %s: no captured activations", l->name);
		const uint32_t m = (uint32_t)t->shape[0], n = l->n, k = l->k;
		uint16_t *x = malloc((size_t)m * k * 2);
		uint8_t *codes = malloc((size_t)m * k);
		float *s = malloc(m * sizeof *s);
		uint16_t *ycpu = malloc((size_t)m * n * 2), *yemu = malloc((size_t)m * n * 2);
		assert_non_null(x && codes && s && ycpu && yemu);
		for (uint64_t j = 0; j < (uint64_t)m * k; j++)
			x[j] = radiance_bf16_from_f32(radiance_st_get_f32(t, j));
		for (uint32_t r = 0; r < m; r++)
			s[r] = radiance_quant_row_e4m3(x + (size_t)r * k, RADIANCE_DTYPE_BF16, k, codes + (size_t)r * k);
		radiance_cpu_w4a8_gemm(codes, s, m, l->qweight, l->scales, l->bias, n, k, ycpu);
		assert_int_equal(radiance_w4a8_fp8_sm90_emulate(codes, s, l->qweight, l->scales, l->bias, m, n, k,
								RADIANCE_FP8_SM90_BITS, yemu), 0);
		struct radiance_bound_report rc, re, rx;
		assert_int_equal(radiance_w4a8_bound_check(codes, s, l->qweight, l->scales, l->bias, m, n, k,
							   RADIANCE_ACC_FP32, ycpu, &rc), 0);
		assert_int_equal(radiance_w4a8_bound_check(codes, s, l->qweight, l->scales, l->bias, m, n, k,
							   RADIANCE_ACC_FP8_SM90, yemu, &re), 0);
		assert_int_equal(radiance_w4a8_bound_check(codes, s, l->qweight, l->scales, l->bias, m, n, k,
							   RADIANCE_ACC_FP32, yemu, &rx), 0);
		/* the emulation against the CPU reference, as the GPU tests measure */
		double num = 0, den = 0;
		for (size_t j = 0; j < (size_t)m * n; j++) {
			const double a = radiance_bf16_to_f32(yemu[j]), b = radiance_bf16_to_f32(ycpu[j]);
			num += (a - b) * (a - b);
			den += b * b;
		}
		const double rel = sqrt(num / den);
		if (getenv("RADIANCE_TEST_VERBOSE"))
			printf("# %s %ux%u m=%u: cpu worst %.3f of its bound, rel to exact %.2e; fp8 emulation "
			       "worst %.3f, rel to the CPU %.2e, %zu outside the fp32 bound\n", l->name, n, k, m,
			       rc.worst, rc.rel_frob, re.worst, rel, rx.outside);
		if (rc.outside || rc.nan_mismatch)
			fail_msg("%s: the CPU reference is outside the fp32 bound at %zu elements (worst: y %g, "
				 "exact %g, allowed %g)", l->name, rc.outside, rc.worst_y, rc.worst_exact,
				 rc.worst_allowed);
		if (re.outside || re.nan_mismatch)
			fail_msg("%s: the fp8 emulation is outside the fp8 bound at %zu elements (worst: y %g, "
				 "exact %g, allowed %g)", l->name, re.outside, re.worst_y, re.worst_exact,
				 re.worst_allowed);
		assert_true(rel < RADIANCE_NORM_BOUND);
		assert_int_equal(rc.checked, (size_t)m * n);
		worst_cpu = rc.worst > worst_cpu ? rc.worst : worst_cpu;
		worst_emul = re.worst > worst_emul ? re.worst : worst_emul;
		max_rel = rel > max_rel ? rel : max_rel;
		emul_outside_fp32 += rx.outside;
		elements += (size_t)m * n;
		layers++;
		free(x);
		free(codes);
		free(s);
		free(ycpu);
		free(yemu);
	}
	printf("# %zu W4A8 layers, %zu outputs: CPU reference at most %.3f of the fp32 bound; fp8 emulation at "
	       "most %.3f of the fp8 bound, rel. Frobenius to the CPU <= %.2e, %zu outputs outside the fp32 "
	       "bound\n", layers, elements, worst_cpu, worst_emul, max_rel, emul_outside_fp32);
	assert_true(layers >= 30);
	assert_true(emul_outside_fp32 > 0);
	radiance_st_close(st);
	radiance_model_destroy(model);
}

static void bad_arguments(void **state)
{
	(void)state;
	struct radiance_bound_report r = {.checked = 7};
	uint8_t codes[256] = {0};
	uint32_t q[32] = {0};
	uint16_t sc[2] = {0}, y[1] = {0};
	float s = 1.0f;
	assert_int_equal(radiance_w4a8_bound_check(codes, &s, q, sc, NULL, 1, 1, 200, RADIANCE_ACC_FP32, y, &r),
			 -EINVAL);
	assert_int_equal(r.checked, 0);
	assert_int_equal(radiance_w4a8_fp8_sm90_emulate(codes, &s, q, sc, NULL, 1, 1, 0, 13, y), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(spec_example),
		cmocka_unit_test(alignment_loses_small_products),
		cmocka_unit_test(emulation_truncates_toward_minus_inf),
		cmocka_unit_test(minilm_layers),
		cmocka_unit_test(bad_arguments),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
