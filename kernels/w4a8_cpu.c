/* CPU reference kernels; see w4a8_cpu.h and numerics.h for the definition. */
#include "w4a8_cpu.h"

#include <math.h>

static inline float load_x(const uint16_t *x, enum radiance_dtype dtype, size_t i)
{
	return radiance_x_to_f32(x[i], dtype);
}

float radiance_quant_row_e4m3(const uint16_t *x, enum radiance_dtype dtype, uint32_t k,
			      uint8_t *codes)
{
	float amax = 0.0f;
	for (uint32_t i = 0; i < k; i++) {
		float v = load_x(x, dtype, i);
		if (!isfinite(v)) {
			memset(codes, RADIANCE_E4M3_NAN, k);
			return NAN;
		}
		amax = fmaxf(amax, fabsf(v));
	}
	float s = fmaxf(amax / RADIANCE_E4M3_MAX, RADIANCE_MIN_SCALE);
	float inv = 1.0f / s;
	for (uint32_t i = 0; i < k; i++)
		codes[i] = radiance_e4m3_from_f32(load_x(x, dtype, i) * inv);
	return s;
}

/* 128-long dot product with eight independent fp32 accumulators: the
 * compiler vectorizes it without -ffast-math, and the summation order it
 * fixes is as good as any (the definition leaves the order open). */
static inline float dot_group(const float *a, const float *b)
{
	float acc[8] = { 0 };
	for (uint32_t t = 0; t < RADIANCE_GROUP_SIZE; t += 8)
		for (uint32_t i = 0; i < 8; i++)
			acc[i] += a[t + i] * b[t + i];
	return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* pair[b] = the two weights (low nibble first) of packed byte b, c - 8 each */
static void pair_table(float pair[256][2])
{
	for (int b = 0; b < 256; b++) {
		pair[b][0] = (float)((b & 0xF) - RADIANCE_ZERO_POINT);
		pair[b][1] = (float)((b >> 4) - RADIANCE_ZERO_POINT);
	}
}

static void unpack_group(const uint32_t *qw, const float pair[256][2], float *w)
{
	for (uint32_t i = 0; i < RADIANCE_GROUP_SIZE / RADIANCE_PACK; i++) {
		uint32_t word = qw[i];
		for (uint32_t b = 0; b < 4; b++) {
			const float *p = pair[(word >> (8 * b)) & 0xFF];
			w[8 * i + 2 * b] = p[0];
			w[8 * i + 2 * b + 1] = p[1];
		}
	}
}

/* Layout of the caller's scratch for m rows of k: e4m3 codes [m][k], the
 * per-token scales [m], the decoded activations [m][k] fp32 and the row
 * accumulators [m] fp32, each 64-byte aligned. */
static size_t align64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

struct cpu_scratch {
	uint8_t *codes;
	float *s;
	float *xf;
	float *acc;
};

static size_t scratch_layout(uint32_t m, uint32_t k, void *base, struct cpu_scratch *sc)
{
	size_t off_s = align64((size_t)m * k);
	size_t off_xf = off_s + align64((size_t)m * sizeof(float));
	size_t off_acc = off_xf + align64((size_t)m * k * sizeof(float));
	size_t total = off_acc + align64((size_t)m * sizeof(float));
	if (sc) {
		sc->codes = base;
		sc->s = (float *)((uint8_t *)base + off_s);
		sc->xf = (float *)((uint8_t *)base + off_xf);
		sc->acc = (float *)((uint8_t *)base + off_acc);
	}
	return total;
}

static void gemm_decoded(const float *xf, const float *s, uint32_t m, const uint32_t *qweight,
			 const uint16_t *scales, const float *bias, uint32_t n, uint32_t k,
			 uint16_t *y, float *acc)
{
	float w[RADIANCE_GROUP_SIZE];
	float pair[256][2];
	const uint32_t groups = k / RADIANCE_GROUP_SIZE;
	const uint32_t words = k / RADIANCE_PACK;

	pair_table(pair);
	for (uint32_t j = 0; j < n; j++) {
		const uint32_t *qrow = qweight + (size_t)j * words;
		const uint16_t *srow = scales + (size_t)j * groups;
		for (uint32_t r = 0; r < m; r++)
			acc[r] = 0.0f;
		/* unpack each group once and use it for every row */
		for (uint32_t g = 0; g < groups; g++) {
			unpack_group(qrow + g * (RADIANCE_GROUP_SIZE / RADIANCE_PACK), pair, w);
			float scale = radiance_f16_to_f32(srow[g]);
			for (uint32_t r = 0; r < m; r++)
				acc[r] += dot_group(xf + (size_t)r * k + (size_t)g * RADIANCE_GROUP_SIZE, w) *
					  scale;
		}
		float b = bias ? bias[j] : 0.0f;
		for (uint32_t r = 0; r < m; r++)
			y[(size_t)r * n + j] = radiance_bf16_from_f32(acc[r] * s[r] + b);
	}
}

static void decode_codes(const uint8_t *codes, size_t count, float *xf)
{
	float lut[256];
	for (int c = 0; c < 256; c++)
		lut[c] = radiance_e4m3_to_f32((uint8_t)c);
	for (size_t i = 0; i < count; i++)
		xf[i] = lut[codes[i]];
}

void radiance_cpu_w4a8_gemm(const uint8_t *codes, const float *s, uint32_t m,
			    const uint32_t *qweight, const uint16_t *scales, const float *bias,
			    uint32_t n, uint32_t k, uint16_t *y)
{
	/* the reference entry point without a scratch: one row at a time */
	float xf[k ? k : 1];
	float acc;
	for (uint32_t r = 0; r < m; r++) {
		decode_codes(codes + (size_t)r * k, k, xf);
		gemm_decoded(xf, s + r, 1, qweight, scales, bias, n, k, y + (size_t)r * n, &acc);
	}
}

size_t radiance_cpu_w4a8_scratch_bytes(uint32_t m, uint32_t k)
{
	return scratch_layout(m, k, NULL, NULL);
}

void radiance_cpu_w4a8(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
		       const uint32_t *qweight, const uint16_t *scales, const float *bias,
		       uint32_t n, uint32_t k, uint16_t *y, void *scratch)
{
	struct cpu_scratch sc;
	scratch_layout(m, k, scratch, &sc);
	for (uint32_t r = 0; r < m; r++)
		sc.s[r] = radiance_quant_row_e4m3(x + (size_t)r * k, dtype, k, sc.codes + (size_t)r * k);
	decode_codes(sc.codes, (size_t)m * k, sc.xf);
	gemm_decoded(sc.xf, sc.s, m, qweight, scales, bias, n, k, y, sc.acc);
}

void radiance_cpu_bf16(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
		       const uint16_t *weight, const float *bias, uint32_t n, uint32_t k,
		       uint16_t *y)
{
	for (uint32_t r = 0; r < m; r++) {
		const uint16_t *xr = x + (size_t)r * k;
		for (uint32_t j = 0; j < n; j++) {
			const uint16_t *wr = weight + (size_t)j * k;
			float acc = 0.0f;
			for (uint32_t t = 0; t < k; t++)
				acc += load_x(xr, dtype, t) * radiance_bf16_to_f32(wr[t]);
			y[(size_t)r * n + j] = radiance_bf16_from_f32(acc + (bias ? bias[j] : 0.0f));
		}
	}
}
