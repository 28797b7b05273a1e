/*
 * Weight repack (the canonical host layout of daemon/model.h, on the device,
 * into the device layout of numerics_gpu.h) and the bf16 dequantization the
 * bench's BLAS peer uses.
 */
#include <errno.h>

#include "w4a8_kernels.h"

/* One thread per device word: canonical qweight [n][k/8] -> tiles. */
__global__ void rad_repack_w(const uint32_t *qw, uint32_t n, uint32_t k, uint32_t ntiles, uint32_t *out)
{
	const uint32_t G = k / RAD_GROUP;
	const size_t total = (size_t)ntiles * G * 256;
	const size_t i = (size_t)RAD_BID_X() * 256 + RAD_TID();
	if (i >= total)
		return;
	const uint32_t wi = i % 16, row = (i / 16) % 16;
	const size_t tg = i / 256;
	const uint32_t g = tg % G, tile = (uint32_t)(tg / G);
	const uint32_t nn = tile * RAD_TILE_N + row;
	uint32_t o = 0x88888888u;   /* rows past n: code 8, the integer 0 */
	if (nn < n) {
		o = 0;
		const uint32_t c = qw[(size_t)nn * (k / 8) + g * 16 + wi];
		for (uint32_t p = 0; p < 8; p++)
			o |= ((c >> (4 * p)) & 0xFu) << (4 * rad_nibble_pos(p));
	}
	out[i] = o;
}

/* One thread per (tile, group, row): scales [n][k/128] fp16 -> scale blocks. */
__global__ void rad_repack_s(const uint16_t *sc, uint32_t n, uint32_t k, uint32_t ntiles, uint16_t *out)
{
	const uint32_t G = k / RAD_GROUP;
	const size_t total = (size_t)ntiles * G * 16;
	const size_t i = (size_t)RAD_BID_X() * 256 + RAD_TID();
	if (i >= total)
		return;
	const uint32_t row = i % 16;
	const size_t tg = i / 16;
	const uint32_t g = tg % G, tile = (uint32_t)(tg / G);
	const uint32_t nn = tile * RAD_TILE_N + row;
	const uint16_t v = nn < n ? sc[(size_t)nn * G + g] : 0;
#ifdef RAD_NVIDIA
	out[tg * 16 + (row & 7) * 2 + (row >> 3)] = v;
#else
	out[tg * 16 + row] = v;
#endif
}

__global__ void rad_dequant_bf16(const uint32_t *w, const uint8_t *sc, uint32_t n, uint32_t k, uint16_t *out)
{
	const size_t i = (size_t)RAD_BID_X() * 256 + RAD_TID();
	if (i >= (size_t)n * k)
		return;
	const uint32_t nn = (uint32_t)(i / k), kk = (uint32_t)(i % k);
	const uint32_t G = k / RAD_GROUP, tile = nn / 16, row = nn % 16, g = kk / RAD_GROUP;
	const uint32_t word = w[((size_t)tile * G + g) * 256 + row * 16 + (kk % RAD_GROUP) / 8];
	const float v = (float)rad_word_int(word, kk % 8);
	const float s = rad_scale_of_row(sc + ((size_t)tile * G + g) * RAD_SCALE_BYTES, row);
	out[i] = (uint16_t)rad_bf16_from_f32(v * s);
}

extern "C" int radiance__w4a8_repack_preload(unsigned *count)
{
	RAD_PRELOAD(rad_repack_w, count);
	RAD_PRELOAD(rad_repack_s, count);
	RAD_PRELOAD(rad_dequant_bf16, count);
	return 0;
}

extern "C" int radiance__w4a8_repack(const uint32_t *qweight, const uint16_t *scales, uint32_t n, uint32_t k,
				     void *w_dev, void *s_dev, void *stream)
{
	if (k % RAD_GROUP || n == 0)
		return -EINVAL;
	const uint32_t ntiles = ceil_div(n, RAD_TILE_N), G = k / RAD_GROUP;
	const size_t words = (size_t)ntiles * G * 256, rows = (size_t)ntiles * G * 16;
	hipLaunchKernelGGL(rad_repack_w, dim3(ceil_div(words, 256)), dim3(256), 0, (hipStream_t)stream,
			   qweight, n, k, ntiles, (uint32_t *)w_dev);
	hipLaunchKernelGGL(rad_repack_s, dim3(ceil_div(rows, 256)), dim3(256), 0, (hipStream_t)stream,
			   scales, n, k, ntiles, (uint16_t *)s_dev);
	return radiance__gpu_check_launch("weight repack");
}

extern "C" int radiance__w4a8_dequant_bf16(const void *w, const void *sc, uint32_t n, uint32_t k,
					   uint16_t *out, void *stream)
{
	hipLaunchKernelGGL(rad_dequant_bf16, dim3(ceil_div((size_t)n * k, 256)), dim3(256), 0,
			   (hipStream_t)stream, (const uint32_t *)w, (const uint8_t *)sc, n, k, out);
	return radiance__gpu_check_launch("dequant");
}
