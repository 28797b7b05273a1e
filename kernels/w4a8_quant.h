/*
 * The per-token e4m3 quantization of one row, piece by piece (16 bytes = 8
 * values), for the kernels that quantize: rad_quant_rows
 * (kernels/w4a8_quant.hip, the quant launch) and the streaming decode GEMV
 * when it quantizes its own activations (kernels/w4a8_gemv.hip, fused for a
 * few rows). Both give the CPU's codes bit for bit (kernels/numerics.h:
 * amax is the integer maximum of the |x| bit patterns, s = amax / 448
 * correctly rounded and at least RAD_MIN_SCALE, one rounded multiply by 1/s,
 * integer e4m3 conversion; a row holding Inf or NaN gets s = NaN and codes
 * 0x7F). Device code only.
 */
#ifndef RADIANCE_W4A8_QUANT_H
#define RADIANCE_W4A8_QUANT_H

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

template <int FP16>
__device__ __forceinline__ float quant_load(uint32_t bits16)
{
	return FP16 ? rad_f16_to_f32(bits16) : rad_bf16_to_f32(bits16);
}

template <int FP16>
__device__ __forceinline__ void quant_amax(rad_u4 v, uint32_t &amax, uint32_t &bad)
{
	uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int j = 0; j < 4; j++) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			uint32_t a = rad_f32_bits(quant_load<FP16>((w[j] >> (16 * h)) & 0xFFFFu)) & 0x7FFFFFFFu;
			bad |= a >= 0x7F800000u;
			amax = a > amax ? a : amax;
		}
	}
}

/* Codes of the 8 elements at k = i..i+7 of row cr, in ORDER. */
template <int FP16, int ORDER>
__device__ __forceinline__ void quant_store(rad_u4 v, float inv, bool nan_row, uint32_t i, uint8_t *cr)
{
	RAD_NO_CONTRACT
	uint32_t w[4] = {v.x, v.y, v.z, v.w};
	uint32_t out[2] = {0, 0};
#pragma unroll
	for (int j = 0; j < 4; j++) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float f = quant_load<FP16>((w[j] >> (16 * h)) & 0xFFFFu);
			uint32_t c = nan_row ? RAD_E4M3_NAN : rad_e4m3_from_f32(RAD_FMUL(f, inv));
			out[j >> 1] |= c << (8 * ((j & 1) * 2 + h));
		}
	}
	if (ORDER == RADIANCE_CODES_WGMMA) {
		/* natural words 8t+2j and 8t+2j+1 of the group -> 8j+t, 8j+4+t */
		const uint32_t q = (i % RAD_GROUP) / 8, t = q >> 2, j = q & 3u;
		uint32_t *gw = (uint32_t *)(cr + (i - i % RAD_GROUP));
		gw[j * 8 + t] = out[0];
		gw[j * 8 + 4 + t] = out[1];
	} else {
		*(uint2 *)(cr + i) = make_uint2(out[0], out[1]);
	}
}

/* The row's scale s and 1/s from its amax bits and bad flag (NaN for both
 * when the row holds Inf or NaN). */
__device__ __forceinline__ void quant_row_scale(uint32_t amax, uint32_t bad, float &sc, float &inv)
{
	RAD_NO_CONTRACT
	if (bad) {
		sc = rad_bits_f32(0x7FC00000u);
		inv = sc;
	} else {
		sc = RAD_FDIV(rad_bits_f32(amax), 448.0f);
		sc = sc > RAD_MIN_SCALE ? sc : RAD_MIN_SCALE;
		inv = RAD_FDIV(1.0f, sc);
	}
}

#endif
