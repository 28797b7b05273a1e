/*
 * The per-element bound of each accumulation model (numerics_bound.h) and an
 * emulation of Hopper's fp8 accumulation to test it with. Double precision
 * throughout: every product of an e4m3 value and an int4 weight, and every
 * sum of 128 of them, is exact in a double, so y* is exact up to its last
 * two operations (scale and bias), whose error is far below 2^-40 relative.
 */
#include "numerics_bound.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "numerics.h"

#define GROUP 128u
#define FP32_U 0x1p-24              /* unit roundoff of fp32 */

static int code_of(const uint32_t *qrow, uint32_t k)
{
	return (int)((qrow[k / 8] >> (4 * (k % 8))) & 0xFu) - 8;
}

/* One bf16 step (the spacing of bf16 values) at magnitude x >= 0. */
static double bf16_step(double x)
{
	int e;
	if (!(x >= 0x1p-126))
		return 0x1p-133;   /* subnormal bf16 spacing */
	frexp(x, &e);          /* x = f 2^e, f in [0.5, 1): 2^(e-1) <= x */
	return ldexp(1.0, e - 1 - 7);
}

/* floor(log2 x) for x > 0 */
static int ilog2(double x)
{
	int e;
	frexp(x, &e);
	return e - 1;
}

void radiance_w4a8_bound(const uint8_t *codes, float s, const uint32_t *qrow, const uint16_t *srow,
			 float bias, uint32_t k, enum radiance_acc acc, double *exact, double *allowed)
{
	const uint32_t G = k / GROUP;
	const double F = acc == RADIANCE_ACC_FP8_SM90 ? ldexp(1.0, -RADIANCE_FP8_SM90_BOUND_BITS) : 0;
	double y = 0, mag = 0, err = 0;
	for (uint32_t g = 0; g < G; g++) {
		const double sc = radiance_f16_to_f32(srow[g]);
		double P = 0, S = 0, A = 0, e = 0;
		for (uint32_t j = 0; j < GROUP / RADIANCE_FP8_SM90_STEP; j++) {
			double pmax = 0, Sj = 0;
			unsigned nz = 0;
			for (uint32_t i = 0; i < RADIANCE_FP8_SM90_STEP; i++) {
				const uint32_t kk = g * GROUP + j * RADIANCE_FP8_SM90_STEP + i;
				const double p = (double)radiance_e4m3_to_f32(codes[kk]) * code_of(qrow, kk);
				P += p;
				Sj += fabs(p);
				pmax = fabs(p) > pmax ? fabs(p) : pmax;
				nz += p != 0;
			}
			/* a step of zero products leaves the partial as it is */
			if (acc == RADIANCE_ACC_FP8_SM90 && nz) {
				/* the running partial is at most A (plus its own
				 * error, which 1% covers many times over) */
				const double M = pmax > A * 1.01 ? pmax : A * 1.01;
				A += Sj;
				e += F * ((nz + 1) * ldexp(1.0, ilog2(M)) + A);
			}
			S += Sj;
		}
		if (acc == RADIANCE_ACC_FP32)
			e = 4 * FP32_U * GROUP * S;
		y += sc * P;
		mag += fabs(sc) * S;
		err += fabs(sc) * e;
	}
	const double ds = s;
	*exact = y * ds + bias;
	if (isnan(*exact)) {
		*allowed = NAN;
		return;
	}
	/* the partials' error, the fp32 products, sums over groups, scale and
	 * bias (first order; the 1.01 covers the second) */
	const double e32 = FP32_U * ((G + 3) * fabs(ds) * mag + fabs(bias)) * 1.01;
	const double e = fabs(ds) * err * 1.01 + e32;
	*allowed = e + bf16_step(fabs(*exact) + e);
}

int radiance_w4a8_bound_check(const uint8_t *codes, const float *s, const uint32_t *qweight,
			      const uint16_t *scales, const float *bias, uint32_t m, uint32_t n, uint32_t k,
			      enum radiance_acc acc, const uint16_t *y, struct radiance_bound_report *r)
{
	memset(r, 0, sizeof *r);
	if (k % GROUP || k == 0)
		return -EINVAL;
	double num = 0, den = 0;
	for (uint32_t t = 0; t < m; t++)
		for (uint32_t j = 0; j < n; j++) {
			double ex, al;
			radiance_w4a8_bound(codes + (size_t)t * k, s[t], qweight + (size_t)j * (k / 8),
					    scales + (size_t)j * (k / GROUP), bias ? bias[j] : 0.0f, k, acc, &ex, &al);
			const size_t i = (size_t)t * n + j;
			const double v = radiance_bf16_to_f32(y[i]);
			if (isnan(ex) || isnan(v)) {
				r->nan_mismatch += isnan(ex) != isnan(v);
				continue;
			}
			r->checked++;
			const double d = fabs(v - ex);
			num += d * d;
			den += ex * ex;
			if (d > al)
				r->outside++;
			const double q = d / al;
			if (q > r->worst) {
				r->worst = q;
				r->worst_at = i;
				r->worst_y = v;
				r->worst_exact = ex;
				r->worst_allowed = al;
			}
		}
	r->rel_frob = den > 0 ? sqrt(num / den) : sqrt(num);
	return 0;
}

float radiance_fp8_sm90_group(const float *products, unsigned bits)
{
	double acc = 0;
	for (uint32_t j = 0; j < GROUP / RADIANCE_FP8_SM90_STEP; j++) {
		const float *p = products + j * RADIANCE_FP8_SM90_STEP;
		double M = fabs(acc);
		for (uint32_t i = 0; i < RADIANCE_FP8_SM90_STEP; i++)
			M = fabs((double)p[i]) > M ? fabs((double)p[i]) : M;
		if (M == 0)
			continue;
		/* align to the largest exponent: bits below 2^(E - bits) are
		 * shifted out, sign-filled (two's complement: toward -inf) */
		const double ulp = ldexp(1.0, ilog2(M) - (int)bits);
		double sum = floor(acc / ulp) * ulp;
		for (uint32_t i = 0; i < RADIANCE_FP8_SM90_STEP; i++)
			sum += floor((double)p[i] / ulp) * ulp;
		/* the result kept in e8m<bits>, truncated (toward zero) */
		if (sum != 0) {
			const double u = ldexp(1.0, ilog2(fabs(sum)) - (int)bits);
			sum = trunc(sum / u) * u;
		}
		acc = sum;
	}
	return (float)acc;
}

int radiance_w4a8_fp8_sm90_emulate(const uint8_t *codes, const float *s, const uint32_t *qweight,
				   const uint16_t *scales, const float *bias, uint32_t m, uint32_t n,
				   uint32_t k, unsigned bits, uint16_t *y)
{
	if (k % GROUP || k == 0)
		return -EINVAL;
	const uint32_t G = k / GROUP;
	float prod[GROUP];
	for (uint32_t t = 0; t < m; t++)
		for (uint32_t j = 0; j < n; j++) {
			const uint8_t *c = codes + (size_t)t * k;
			const uint32_t *q = qweight + (size_t)j * (k / 8);
			float acc = 0;
			for (uint32_t g = 0; g < G; g++) {
				for (uint32_t i = 0; i < GROUP; i++)
					prod[i] = radiance_e4m3_to_f32(c[g * GROUP + i]) * (float)code_of(q, g * GROUP + i);
				const float P = radiance_fp8_sm90_group(prod, bits);
				acc += P * radiance_f16_to_f32(scales[(size_t)j * G + g]);
			}
			y[(size_t)t * n + j] = radiance_bf16_from_f32(acc * s[t] + (bias ? bias[j] : 0.0f));
		}
	return 0;
}
