/*
 * Dequantization in registers, the conversions every W4A8 kernel makes before
 * its matrix instructions (vLLM's Marlin keeps the same in dequant.h): int4
 * weight words of the device layout (numerics_gpu.h) to f16x2 pairs for the
 * f16 HMMA paths or to e4m3 bytes for the fp8 paths, and e4m3 activation codes
 * to f16x2. Every conversion is exact (int4 and e4m3 values are f16 values).
 * Device code only; included by the kernel files.
 */
#ifndef RADIANCE_W4A8_DEQUANT_H
#define RADIANCE_W4A8_DEQUANT_H

#include "numerics_gpu.h"

/* One device word -> four f16x2 registers holding the integers of
 * k+0,1 | k+2,3 | k+4,5 | k+6,7 (low half first). 0x6400 | c is the f16
 * 1024 + c, and (1024 + 16 c) / 16 - 72 = c - 8: every step exact. Five
 * integer ops and four half2 ops per 8 weights, no conversion instruction
 * (Hopper runs fp8 mma.sync as f16 HMMA after F2FP conversions, which this
 * path avoids). */
__device__ __forceinline__ void rad_unpack8_f16(uint32_t w, uint32_t (&h)[4])
{
#ifdef RAD_NVIDIA
	const uint32_t top = w >> 8;
	uint32_t h0, h1, h2, h3;
	asm("lop3.b32 %0, %1, 0x000f000f, 0x64006400, 0xea;" : "=r"(h0) : "r"(w));
	asm("lop3.b32 %0, %1, 0x00f000f0, 0x64006400, 0xea;" : "=r"(h1) : "r"(w));
	asm("lop3.b32 %0, %1, 0x000f000f, 0x64006400, 0xea;" : "=r"(h2) : "r"(top));
	asm("lop3.b32 %0, %1, 0x00f000f0, 0x64006400, 0xea;" : "=r"(h3) : "r"(top));
	const uint32_t k1032 = 0x64086408u;   /* f16x2 1032 */
	const uint32_t k1_16 = 0x2c002c00u;   /* f16x2 1/16 */
	const uint32_t km72 = 0xd480d480u;    /* f16x2 -72 */
	asm("sub.f16x2 %0, %1, %2;" : "=r"(h[0]) : "r"(h0), "r"(k1032));
	asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h[1]) : "r"(h1), "r"(k1_16), "r"(km72));
	asm("sub.f16x2 %0, %1, %2;" : "=r"(h[2]) : "r"(h2), "r"(k1032));
	asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h[3]) : "r"(h3), "r"(k1_16), "r"(km72));
#else
	(void)w;
	h[0] = h[1] = h[2] = h[3] = 0;   /* unused on AMD (fp8 WMMA) */
#endif
}

/* One device word -> two registers of e4m3 bytes for the fp8 matrix
 * instructions: lo = k+0..3, hi = k+4..7 (byte i = k+i). */
__device__ __forceinline__ void rad_unpack8(uint32_t w, uint32_t &lo, uint32_t &hi)
{
	/* x: nibbles 0,2,4,6 (k+0,4,1,5); y: nibbles 1,3,5,7 (k+2,6,3,7) */
	const uint32_t x = w & 0x0F0F0F0Fu, y = (w >> 4) & 0x0F0F0F0Fu;
#ifdef RAD_NVIDIA
	uint32_t cl, ch;
	asm("prmt.b32 %0, %1, %2, 0x6420;" : "=r"(cl) : "r"(x), "r"(y));
	asm("prmt.b32 %0, %1, %2, 0x7531;" : "=r"(ch) : "r"(x), "r"(y));
	/* c -> e4m3 of (c - 8) * 2^-9, per byte: c >= 8 gives c ^ 8 (the
	 * subnormals 0x00..0x07); c < 8 gives 0x80 | (8 - c) = (c ^ 15) + 0x79
	 * (0x81..0x87 and 0x88 = -2^-6). n marks c < 8. */
	const uint32_t nl = ((cl >> 3) & 0x01010101u) ^ 0x01010101u;
	const uint32_t nh = ((ch >> 3) & 0x01010101u) ^ 0x01010101u;
	lo = (cl ^ (0x08080808u | nl * 7u)) + nl * 0x79u;
	hi = (ch ^ (0x08080808u | nh * 7u)) + nh * 0x79u;
#else
	/* v_perm_b32 picks byte sel of {S0:S1} (S1 = bytes 0..3) */
	const uint32_t cl = __builtin_amdgcn_perm(y, x, 0x06040200u);
	const uint32_t ch = __builtin_amdgcn_perm(y, x, 0x07050301u);
	/* e4m3 of the integers: c >= 8 -> table of 0..7 at c & 7; c < 8 ->
	 * table of -8..-1 at c; bit 3 of c selects */
	const uint32_t sl = cl & 0x07070707u, sh = ch & 0x07070707u;
	const uint32_t ml = ((cl >> 3) & 0x01010101u) * 0xFFu;
	const uint32_t mh = ((ch >> 3) & 0x01010101u) * 0xFFu;
	const uint32_t pl = __builtin_amdgcn_perm(0x4E4C4A48u, 0x44403800u, sl);
	const uint32_t nl = __builtin_amdgcn_perm(0xB8C0C4C8u, 0xCACCCED0u, sl);
	const uint32_t ph = __builtin_amdgcn_perm(0x4E4C4A48u, 0x44403800u, sh);
	const uint32_t nh = __builtin_amdgcn_perm(0xB8C0C4C8u, 0xCACCCED0u, sh);
	lo = (pl & ml) | (nl & ~ml);
	hi = (ph & mh) | (nh & ~mh);
#endif
}

#ifdef RAD_NVIDIA
/* 4 e4m3 codes -> two f16x2 (exact: every e4m3 value is an f16) */
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t &b0, uint32_t &b1)
{
	asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n"
	    " cvt.rn.f16x2.e4m3x2 %0, lo;\n cvt.rn.f16x2.e4m3x2 %1, hi;}"
	    : "=r"(b0), "=r"(b1) : "r"(w));
}
#endif

#endif
