/*
 * Helpers of the GPU tests (test_gpu, test_gpu_map): a deterministic RNG,
 * fp16 rounding for test inputs, and the tolerance check of a GPU result
 * against the CPU reference. Header-only; every function is static.
 */
#ifndef RADIANCE_TESTS_GPU_CHECK_H
#define RADIANCE_TESTS_GPU_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static inline uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}
static inline float frand(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f; }   /* [0,1) */
static inline float nrand(void)
{
	float u = frand() + 1e-7f, v = frand();
	return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static inline uint16_t f32_to_f16(float f)   /* RNE, finite inputs in range */
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000u;
	float a = fabsf(f);
	if (a < 6.103515625e-05f) {   /* subnormal: multiples of 2^-24 */
		return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
	}
	uint32_t ua;
	memcpy(&ua, &a, 4);
	uint32_t exp = (ua >> 23) - 127 + 15, man = ua & 0x7FFFFF;
	uint32_t keep = man >> 13, rest = man & 0x1FFF;
	if (rest > 0x1000 || (rest == 0x1000 && (keep & 1)))
		keep++;
	if (keep == 0x400) {
		keep = 0;
		exp++;
	}
	return (uint16_t)(sign | (exp << 10) | keep);
}

static inline uint16_t to_dtype(float f, enum radiance_dtype dt)
{
	return dt == RADIANCE_DTYPE_FP16 ? f32_to_f16(f) : radiance_bf16_from_f32(f);
}

/* Compares y against ref (m x n bf16); returns 0 when within tolerance. */
static inline int compare(const char *what, const uint16_t *y, const uint16_t *ref, uint32_t m, uint32_t n, int exact)
{
	double num = 0, den = 0;
	size_t nan_bad = 0, elem_bad = 0, diff_bits = 0;
	for (size_t i = 0; i < (size_t)m * n; i++) {
		double b = radiance_bf16_to_f32(ref[i]);
		if (isfinite(b))   /* an Inf would make rms, and so the tolerance, Inf */
			den += b * b;
	}
	const double rms = sqrt(den / ((double)m * n + 1));
	for (size_t i = 0; i < (size_t)m * n; i++) {
		double a = radiance_bf16_to_f32(y[i]), b = radiance_bf16_to_f32(ref[i]);
		if (isnan(a) || isnan(b)) {
			nan_bad += isnan(a) != isnan(b);
			continue;
		}
		if (isinf(a) || isinf(b)) {
			/* a row of Infs (fill_x's fp16 values can overflow to Inf):
			 * equal or out of tolerance, never into rel_err (Inf - Inf) */
			diff_bits += y[i] != ref[i];
			if (a != b) {
				if (elem_bad < 3)
					printf("#   %s: y[%zu][%zu] = %g, CPU %g\n", what, i / n, i % n, a, b);
				elem_bad++;
			}
			continue;
		}
		diff_bits += y[i] != ref[i];
		num += (a - b) * (a - b);
		if (fabs(a - b) > 0.02 * fabs(b) + 0.01 * rms) {
			if (elem_bad < 3)
				printf("#   %s: y[%zu][%zu] = %g, CPU %g\n", what, i / n, i % n, a, b);
			elem_bad++;
		}
	}
	const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	const int ok = rel < 3e-3 && nan_bad == 0 && elem_bad == 0 && (!exact || diff_bits == 0);
	if (!ok || getenv("RADIANCE_TEST_VERBOSE"))
		printf("# %s: rel_err %.3e, elements out of tolerance %zu, NaN mismatches %zu, differing %zu%s\n", what,
		       rel, elem_bad, nan_bad, diff_bits, ok ? "" : "  <-- FAIL");
	return ok ? 0 : -1;
}

#endif
