/*
 * Per-token activation quantization to e4m3 (numerics.h), one block per row.
 *
 * The codes must equal the CPU's bit for bit, so nothing here depends on the
 * vendor's float behaviour: amax is the integer maximum of the |x| bit
 * patterns (monotonic for finite floats, immune to denormal flushing), s and
 * 1/s are correctly rounded divisions, x * (1/s) is one correctly rounded
 * multiply (never fused), and the e4m3 conversion is integer code
 * (rad_e4m3_from_f32). A row holding Inf or NaN gets s = NaN and codes 0x7F.
 */
#include <errno.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

/* threads per row: 256, or 1024 for a few long rows (decode): one block per
 * row is then latency-bound on its loads (~10 us for k = 17408 at 256) */
#define QUANT_THREADS 256
#define QUANT_THREADS_WIDE 1024

template <int FP16>
__device__ __forceinline__ float quant_load(uint32_t bits16)
{
	return FP16 ? rad_f16_to_f32(bits16) : rad_bf16_to_f32(bits16);
}

template <int FP16, int ORDER, int QUANT_THREADS_T>
__global__ void __launch_bounds__(QUANT_THREADS_T)
rad_quant_rows(const uint16_t *x, uint32_t k, uint8_t *codes, float *s)
{
	RAD_NO_CONTRACT
	/* the GEMM that follows may start now and prefetch its weights; it
	 * waits for this grid to finish before it reads a code */
	rad_grid_launch();
	__shared__ uint32_t red_max[QUANT_THREADS_T];
	__shared__ uint32_t red_bad[QUANT_THREADS_T];
	__shared__ float row_inv;
	const uint32_t tid = RAD_TID();
	const uint32_t row = RAD_BID_X();
	const uint16_t *xr = x + (size_t)row * k;
	uint8_t *cr = codes + (size_t)row * k;

	uint32_t amax = 0, bad = 0;
#pragma unroll 4
	for (uint32_t i = tid * 8; i < k; i += QUANT_THREADS_T * 8) {
		rad_u4 v = rad_ld16(xr + i);
		uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
		for (int j = 0; j < 4; j++) {
#pragma unroll
			for (int h = 0; h < 2; h++) {
				uint32_t a = rad_f32_bits(quant_load<FP16>((w[j] >> (16 * h)) & 0xFFFFu)) &
					     0x7FFFFFFFu;
				bad |= a >= 0x7F800000u;
				amax = a > amax ? a : amax;
			}
		}
	}
	red_max[tid] = amax;
	red_bad[tid] = bad;
	RAD_SYNC();
	for (uint32_t n = QUANT_THREADS_T / 2; n > 0; n >>= 1) {
		if (tid < n) {
			uint32_t o = red_max[tid + n];
			red_max[tid] = o > red_max[tid] ? o : red_max[tid];
			red_bad[tid] |= red_bad[tid + n];
		}
		RAD_SYNC();
	}
	if (tid == 0) {
		float sc, inv;
		if (red_bad[0]) {
			sc = rad_bits_f32(0x7FC00000u);
			inv = sc;
		} else {
			sc = RAD_FDIV(rad_bits_f32(red_max[0]), 448.0f);
			sc = sc > RAD_MIN_SCALE ? sc : RAD_MIN_SCALE;
			inv = RAD_FDIV(1.0f, sc);
		}
		s[row] = sc;
		row_inv = inv;
	}
	RAD_SYNC();
	const float inv = row_inv;
	const bool nan_row = red_bad[0] != 0;
#pragma unroll 2
	for (uint32_t i = tid * 8; i < k; i += QUANT_THREADS_T * 8) {
		rad_u4 v = rad_ld16(xr + i);
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
}

extern "C" int radiance__gpu_quant(const void *x, enum radiance_dtype dtype, uint32_t m, uint32_t k,
				   enum radiance__codes_order order, uint8_t *codes, float *s, void *stream)
{
	if (k % 8 || (dtype != RADIANCE_DTYPE_BF16 && dtype != RADIANCE_DTYPE_FP16) ||
	    (order == RADIANCE_CODES_WGMMA && k % RAD_GROUP))
		return -EINVAL;
	if (m == 0)
		return 0;
	const uint16_t *xs = (const uint16_t *)x;
	hipStream_t st = (hipStream_t)stream;
	const int fp16 = dtype == RADIANCE_DTYPE_FP16;
	const int wide = m <= 64 && k >= 4096;
#define QUANT_LAUNCH(F, O)                                                                               \
	do {                                                                                             \
		if (wide)                                                                                \
			hipLaunchKernelGGL((rad_quant_rows<F, O, QUANT_THREADS_WIDE>), dim3(m),                 \
					   dim3(QUANT_THREADS_WIDE), 0, st, xs, k, codes, s);                   \
		else                                                                                     \
			hipLaunchKernelGGL((rad_quant_rows<F, O, QUANT_THREADS>), dim3(m), dim3(QUANT_THREADS), \
					   0, st, xs, k, codes, s);                                             \
	} while (0)
	switch (order) {
	case RADIANCE_CODES_WGMMA:
		if (fp16) QUANT_LAUNCH(1, 1); else QUANT_LAUNCH(0, 1);
		break;
	default:
		if (fp16) QUANT_LAUNCH(1, 0); else QUANT_LAUNCH(0, 0);
		break;
	}
#undef QUANT_LAUNCH
	return radiance__gpu_check_launch("quant kernel");
}
