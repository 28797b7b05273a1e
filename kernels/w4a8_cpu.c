/* CPU reference kernels; see w4a8_cpu.h and numerics.h for the definition. */
#include "w4a8_cpu.h"

#include <math.h>

static inline float load_x(const uint16_t *x, enum radiance_dtype dtype, size_t i)
{
	return dtype == RADIANCE_DTYPE_FP16 ? radiance_f16_to_f32(x[i]) : radiance_bf16_to_f32(x[i]);
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

void radiance_cpu_w4a8_gemm(const uint8_t *codes, const float *s, uint32_t m,
			    const uint32_t *qweight, const uint16_t *scales, const float *bias,
			    uint32_t n, uint32_t k, uint16_t *y)
{
	float lut[256];
	float w[RADIANCE_GROUP_SIZE];
	const uint32_t groups = k / RADIANCE_GROUP_SIZE;
	const uint32_t words = k / RADIANCE_PACK;

	for (int c = 0; c < 256; c++)
		lut[c] = radiance_e4m3_to_f32((uint8_t)c);

	for (uint32_t j = 0; j < n; j++) {
		const uint32_t *qrow = qweight + (size_t)j * words;
		const uint16_t *srow = scales + (size_t)j * groups;
		for (uint32_t r = 0; r < m; r++) {
			const uint8_t *xr = codes + (size_t)r * k;
			float acc = 0.0f;
			for (uint32_t g = 0; g < groups; g++) {
				const uint32_t *qw = qrow + g * (RADIANCE_GROUP_SIZE / RADIANCE_PACK);
				/* unpack the group once per (row, group): cheap next to the
				 * 128 multiply-adds and keeps the loop obvious */
				for (uint32_t t = 0; t < RADIANCE_GROUP_SIZE; t++)
					w[t] = (float)((int)((qw[t / RADIANCE_PACK] >> (4 * (t % RADIANCE_PACK))) & 0xF)
						       - RADIANCE_ZERO_POINT);
				const uint8_t *xg = xr + (size_t)g * RADIANCE_GROUP_SIZE;
				float p = 0.0f;
				for (uint32_t t = 0; t < RADIANCE_GROUP_SIZE; t++)
					p += lut[xg[t]] * w[t];
				acc += p * radiance_f16_to_f32(srow[g]);
			}
			float out = acc * s[r] + (bias ? bias[j] : 0.0f);
			y[(size_t)r * n + j] = radiance_bf16_from_f32(out);
		}
	}
}

size_t radiance_cpu_w4a8_scratch_bytes(uint32_t m, uint32_t k)
{
	size_t codes = ((size_t)m * k + 15) & ~(size_t)15;
	return codes + (size_t)m * sizeof(float);
}

void radiance_cpu_w4a8(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
		       const uint32_t *qweight, const uint16_t *scales, const float *bias,
		       uint32_t n, uint32_t k, uint16_t *y, void *scratch)
{
	uint8_t *codes = scratch;
	float *s = (float *)(codes + (((size_t)m * k + 15) & ~(size_t)15));
	for (uint32_t r = 0; r < m; r++)
		s[r] = radiance_quant_row_e4m3(x + (size_t)r * k, dtype, k, codes + (size_t)r * k);
	radiance_cpu_w4a8_gemm(codes, s, m, qweight, scales, bias, n, k, y);
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
