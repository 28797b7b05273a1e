/*
 * Device-side mirror of kernels/numerics.h, plus the device weight layout the
 * GPU kernels share. Every conversion here is written with integer operations
 * (or operations that are exact), so the activation codes are the CPU's bit
 * for bit on any vendor, whatever its fp32 denormal or rounding-mode defaults.
 *
 * Device weight layout (what layer_upload produces from the canonical host
 * layout of daemon/model.h; see docs/gpu.md):
 *
 *   W4A8 weights: tiles of 16 output rows x one 128-group, 1 KiB each,
 *   ordered [n_tile][group]; inside a tile, [row 0..15][word 0..15] where word
 *   w holds k = 8w..8w+7 of the group. A warp streaming one tile along K
 *   reads contiguous memory, and every lane's 16-byte load is one row's four
 *   (NVIDIA) or eight (AMD, two loads) consecutive words. ([group][n_tile],
 *   one contiguous front per split, measured the same for decode on the H200
 *   and 9% slower for the wgmma prefill.)
 *
 *   Inside a word the nibbles keep the checkpoint's codes c (v = c - 8) but
 *   are permuted: canonical nibble p (k = 8w + p) goes to nibble
 *   (p >> 1) + 4 (p & 1), so k and k+1 sit in the two 16-bit halves and
 *   the int4 -> f16x2 magic-number conversion (0x6400 | c = 1024 + c) gives
 *   the mma.m16n8k16 f16 operand pairs directly: the NVIDIA decode path,
 *   whose activations are the e4m3 values as f16 (exact), runs native f16
 *   HMMA and subtracts the zero point in that conversion.
 *   The fp8 paths (sm_90a wgmma prefill, gfx12 WMMA) gather the bytes with a
 *   byte permute and map c to e4m3: NVIDIA to the bit pattern of v * 2^-9
 *   (subnormals 0x00..0x07, 0x81..0x87 and 0x88 = -2^-6; wgmma honours e4m3
 *   subnormals on sm_90, and the 2^9 is folded into the fp32 group scale,
 *   exact); AMD to the normal e4m3 codes of the integers themselves through
 *   v_perm_b32 tables, since subnormal handling of gfx12 fp8 WMMA is
 *   unverified. Either way the zero point never enters the matmul.
 *
 *   Scales: 32 bytes per (n_tile, group), same order as the tiles. NVIDIA:
 *   8 words, word g = half2(scale of row g, scale of row g + 8), the two rows
 *   an mma.sync C fragment lane holds. AMD: 16 halves in row order (a WMMA C
 *   lane holds rows 8h..8h+7). Rows past N have zero codes and zero scales.
 */
#ifndef RADIANCE_NUMERICS_GPU_H
#define RADIANCE_NUMERICS_GPU_H

#include "gpu_compat.h"

#define RAD_GROUP 128
#define RAD_TILE_N 16
#define RAD_TILE_BYTES 1024     /* one (n_tile, group) weight tile */
#define RAD_SCALE_BYTES 32      /* one (n_tile, group) scale block */
#define RAD_E4M3_NAN 0x7Fu
#define RAD_MIN_SCALE (1.0f / (448.0f * 512.0f))

/* fp8 paths: the weight bytes rad_unpack8 makes are v * RAD_WSCALE^-1 */
#ifdef RAD_NVIDIA
#define RAD_WSCALE 512.0f       /* weights are v * 2^-9 (e4m3 subnormals) */
#else
#define RAD_WSCALE 1.0f
#endif

/* ------------------------------------------------------------ conversions */

__device__ __forceinline__ float rad_bf16_to_f32(uint32_t h)
{
	return rad_bits_f32(h << 16);
}

/* numerics.h radiance_f16_to_f32, exact for every input. */
__device__ __forceinline__ float rad_f16_to_f32(uint32_t h)
{
	uint32_t sign = (h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1Fu;
	uint32_t man = h & 0x3FFu;
	if (exp == 0x1F)
		return rad_bits_f32(sign | 0x7F800000u | (man << 13));
	if (exp == 0) {
		/* man * 2^-24: an integer below 2^10 times a power of two, exact */
		float v = (float)man * 0x1p-24f;
		return sign ? -v : v;
	}
	return rad_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* numerics.h radiance_bf16_from_f32: RNE, NaN -> quiet NaN keeping the sign. */
__device__ __forceinline__ uint32_t rad_bf16_from_f32(float f)
{
	uint32_t u = rad_f32_bits(f);
	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return ((u >> 16) | 0x0040u) & 0xFFFFu;
	u += 0x7FFFu + ((u >> 16) & 1u);
	return u >> 16;
}

/* numerics.h radiance_e4m3_to_f32, exact. */
__device__ __forceinline__ float rad_e4m3_to_f32(uint32_t c)
{
	uint32_t exp = (c >> 3) & 0xFu;
	uint32_t man = c & 0x7u;
	float v;
	if (exp == 0xF && man == 0x7)
		return rad_bits_f32(0x7FC00000u);
	if (exp == 0)
		v = (float)man * 0x1p-9f;
	else
		v = rad_bits_f32(((exp + 120u) << 23) | (man << 20));
	return (c & 0x80u) ? -v : v;
}

/* numerics.h radiance_e4m3_from_f32 with integer operations only. The
 * subnormal branch there is nearbyintf(|f| * 512): here the same
 * round-to-nearest-even of the 24-bit significand shifted right. */
__device__ __forceinline__ uint32_t rad_e4m3_from_f32(float f)
{
	uint32_t u = rad_f32_bits(f);
	uint32_t sign = (u >> 24) & 0x80u;
	uint32_t a = u & 0x7FFFFFFFu;
	if (a > 0x7F800000u)
		return RAD_E4M3_NAN;
	if (a >= 0x43E00000u)                      /* >= 448: saturate */
		return sign | 0x7Eu;
	if (a < 0x3C800000u) {                     /* below 2^-6 */
		uint32_t e = a >> 23;
		if (e == 0)                        /* fp32 denormal: far below 2^-10 */
			return sign;
		uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
		uint32_t sh = 141u - e;            /* |f| * 512 = m * 2^-(sh) ; sh >= 21 */
		if (sh >= 32u)
			return sign;
		uint32_t q = m >> sh;
		uint32_t rest = m & ((1u << sh) - 1u);
		uint32_t half = 1u << (sh - 1u);
		if (rest > half || (rest == half && (q & 1u)))
			q++;
		return sign | q;
	}
	uint32_t exp = (a >> 23) - 127u + 7u;
	uint32_t man = a & 0x7FFFFFu;
	uint32_t keep = man >> 20;
	uint32_t rest = man & 0xFFFFFu;
	if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u)))
		keep++;
	if (keep == 8u) {
		keep = 0;
		exp++;
	}
	if (exp > 15u || (exp == 15u && keep == 7u))
		return sign | 0x7Eu;
	return sign | (exp << 3) | keep;
}

/* ------------------------------------------------------ weight encoding */

/* Canonical nibble position p (k = 8w + p) -> device nibble position:
 * 0,1,2,3,4,5,6,7 -> 0,4,1,5,2,6,3,7, so the pairs (k, k+1) sit in the two
 * 16-bit halves of the word (nibbles q and q + 4), as the int4 -> f16x2
 * magic-number conversion (rad_unpack8_f16) takes them. */
__host__ __device__ __forceinline__ uint32_t rad_nibble_pos(uint32_t p)
{
	return (p >> 1) + 4u * (p & 1u);
}

/* The integer weight (-8..7) at canonical offset p (0..7) of a device word:
 * nibbles hold the checkpoint's codes c unchanged, v = c - 8. */
__device__ __forceinline__ int rad_word_int(uint32_t w, uint32_t p)
{
	return (int)((w >> (4u * rad_nibble_pos(p))) & 0xFu) - 8;
}

/* fp16 scale of row r (0..15) of a (tile, group) scale block. */
__device__ __forceinline__ float rad_scale_of_row(const uint8_t *blk, uint32_t r)
{
	const uint16_t *h = (const uint16_t *)blk;
#ifdef RAD_NVIDIA
	return rad_f16_to_f32(h[(r & 7u) * 2u + (r >> 3)]);
#else
	return rad_f16_to_f32(h[r]);
#endif
}

#endif
