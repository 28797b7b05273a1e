/*
 * Matrix-instruction fragments of the W4A8 decode/tiled kernels, per vendor
 * (vLLM's Marlin keeps these in mma.h): which accumulator of a lane holds
 * which (row, token), the weight and activation fragments a lane loads, one
 * group's MMAs into fresh fp32 partials and their scaling, and the cp.async
 * ring of the NVIDIA kernel. NVIDIA: mma.sync m16n8k16 f16 (weights and
 * activations converted exactly, fp32 accumulation); AMD gfx12:
 * v_wmma_f32_16x16x16_fp8_fp8 (fp32 accumulation). Device code only.
 */
#ifndef RADIANCE_W4A8_MMA_H
#define RADIANCE_W4A8_MMA_H

#include "w4a8_dequant.h"
#include "w4a8_kernels.h"

/* ------------------------------------------------------------ fragments */

#ifdef RAD_NVIDIA
#define TOK_MIN 8
/* Coordinates (row in the 16-row tile, token in the block's token tile) of
 * accumulator i of this lane: mma.m16n8 C fragments, one per 8 tokens. */
__device__ __forceinline__ void acc_coord(int i, uint32_t lane, uint32_t &row, uint32_t &tok)
{
	row = (lane >> 2) + 8u * ((uint32_t)(i & 3) >> 1);
	tok = (uint32_t)(i >> 2) * 8u + 2u * (lane & 3u) + (uint32_t)(i & 1);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
					uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	/* not volatile: the compiler may interleave independent MMA chains */
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
	    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
	__trap();
#endif
}

/* Weights and scales of one (tile, group) as this lane needs them. */
struct wfrag {
	rad_u4 a, b;     /* rows g and g+8, words 4t..4t+3 */
	uint32_t s;      /* half2 scales of rows g, g+8 */
};

__device__ __forceinline__ void wfrag_load(wfrag &f, const rad_u4 *tile, const uint32_t *sblk, uint32_t lane)
{
	f.a = rad_ld_stream16(tile + lane);
	f.b = rad_ld_stream16(tile + 32 + lane);
	f.s = rad_ld4(sblk + (lane >> 2));
}

/* The lane's activations of one group and one 8-token tile: the 32 e4m3
 * codes at k = 32t..32t+31 of the group (token g of the tile). */
struct afrag {
	rad_u4 lo, hi;
};

__device__ __forceinline__ void afrag_load(afrag &a, const uint8_t *p)
{
	a.lo = rad_ld16(p);
	a.hi = rad_ld16(p + 16);
}

/* One group's MMAs for one 8-token tile, f16 operands (NVIDIA decode):
 * word s of rows g / g+8 unpacks to the A fragments of k16 steps 2s and
 * 2s+1; step j reads the lane's activation word j (k = 32t + 4j..+3).
 * Steps alternate between two partials so two MMA chains are in flight. */
__device__ __forceinline__ void tile_mma(float (&d)[4], float (&e)[4], const rad_u4 &wa, const rad_u4 &wb,
					 const afrag &a)
{
	const uint32_t ga[4] = {wa.x, wa.y, wa.z, wa.w}, gb[4] = {wb.x, wb.y, wb.z, wb.w};
	const uint32_t aw[8] = {a.lo.x, a.lo.y, a.lo.z, a.lo.w, a.hi.x, a.hi.y, a.hi.z, a.hi.w};
#pragma unroll
	for (int s = 0; s < 4; s++) {
		uint32_t hg[4], h8[4], b0, b1, b2, b3;
		rad_unpack8_f16(ga[s], hg);
		rad_unpack8_f16(gb[s], h8);
		e4m3x4_to_f16(aw[2 * s], b0, b1);
		e4m3x4_to_f16(aw[2 * s + 1], b2, b3);
		mma_f16(d, hg[0], h8[0], hg[1], h8[1], b0, b1);
		mma_f16(e, hg[2], h8[2], hg[3], h8[3], b2, b3);
	}
}

/* GP groups x NT token tiles with activations already in registers, into
 * fresh fp32 partials, then acc += partial * scale (fp32). */
template <int GP, int NT>
__device__ __forceinline__ void groups_mma(float (&acc)[NT * 4], const wfrag (&f)[GP], const afrag (&a)[GP][NT],
					   int n_valid)
{
#pragma unroll
	for (int q = 0; q < GP; q++) {
		if (q > 0 && q >= n_valid)
			break;
		const float slo = rad_h2f(f[q].s & 0xFFFFu), shi = rad_h2f(f[q].s >> 16);
#pragma unroll
		for (int it = 0; it < NT; it++) {
			float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
			tile_mma(d, e, f[q].a, f[q].b, a[q][it]);
			acc[it * 4 + 0] += (d[0] + e[0]) * slo;
			acc[it * 4 + 1] += (d[1] + e[1]) * slo;
			acc[it * 4 + 2] += (d[2] + e[2]) * shi;
			acc[it * 4 + 3] += (d[3] + e[3]) * shi;
		}
	}
}

/* One group, activations loaded here (the wide token tiles). */
template <int TOK>
__device__ __forceinline__ void group_mma(float (&acc)[TOK / 2], const wfrag &f, const uint8_t *codes,
					  const uint32_t (&aoff)[TOK / 8], uint32_t kofs)
{
	const wfrag ff[1] = {f};
	afrag a[1][TOK / 8];
#pragma unroll
	for (int it = 0; it < TOK / 8; it++)
		afrag_load(a[0][it], codes + aoff[it] + kofs);
	groups_mma<1, TOK / 8>(acc, ff, a, 1);
}

/* cp.async (sm_80+): the decode kernel streams weights through a per-warp
 * shared-memory ring instead of registers, so loads in flight cost no
 * registers and three blocks fit on an SM. */
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

#define RING_STAGES 8                       /* groups in flight per warp */
#define RING_STAGE (RAD_TILE_BYTES + RAD_SCALE_BYTES)
#define RING_WARP (RING_STAGES * RING_STAGE)

__device__ __forceinline__ uint32_t act_token(uint32_t lane, int it) { return (uint32_t)it * 8u + (lane >> 2); }
#define ACT_BYTES 1u
__device__ __forceinline__ uint32_t act_kofs(uint32_t lane) { return (lane & 3u) * 32u; }
#define TILES_OF(TOK) ((TOK) / 8)

#else /* AMD gfx12 WMMA */
#define TOK_MIN 16
typedef int v2i __attribute__((ext_vector_type(2)));
typedef float v8f __attribute__((ext_vector_type(8)));

/* v_wmma_f32_16x16x16_fp8_fp8 (wave32, gfx12) fragments, as probed on gfx1201:
 * A lane l: row l&15, k = 8(l>>4)+0..7; B lane l: col l&15, same k;
 * C element e of lane l: row 8(l>>4)+e, col l&15. */
__device__ __forceinline__ void acc_coord(int i, uint32_t lane, uint32_t &row, uint32_t &tok)
{
	row = 8u * (lane >> 4) + (uint32_t)(i & 7);
	tok = (uint32_t)(i >> 3) * 16u + (lane & 15u);
}

struct wfrag {
	rad_u4 a, b;     /* row l&15, words 8h..8h+7 */
	rad_u4 s;        /* 8 fp16 scales of rows 8h..8h+7 */
};

__device__ __forceinline__ void wfrag_load(wfrag &f, const rad_u4 *tile, const uint32_t *sblk, uint32_t lane)
{
	const uint32_t r = lane & 15u, h = lane >> 4;
	f.a = rad_ld_stream16(tile + r * 4u + h * 2u);
	f.b = rad_ld_stream16(tile + r * 4u + h * 2u + 1u);
	f.s = rad_ld16(sblk + h * 4u);
}

template <int TOK>
__device__ __forceinline__ void group_mma(float (&acc)[TOK / 2], const wfrag &f, const uint8_t *codes,
					  const uint32_t (&aoff)[TOK / 16], uint32_t kofs)
{
	const uint32_t w[8] = {f.a.x, f.a.y, f.a.z, f.a.w, f.b.x, f.b.y, f.b.z, f.b.w};
	v2i A[8];
#pragma unroll
	for (int j = 0; j < 8; j++) {
		uint32_t lo, hi;
		rad_unpack8(w[j], lo, hi);
		A[j] = (v2i){(int)lo, (int)hi};
	}
	const uint32_t sw[4] = {f.s.x, f.s.y, f.s.z, f.s.w};
	float sc[8];
#pragma unroll
	for (int e = 0; e < 8; e++)
		sc[e] = rad_h2f((sw[e >> 1] >> (16 * (e & 1))) & 0xFFFFu) * RAD_WSCALE;
#pragma unroll
	for (int it = 0; it < TOK / 16; it++) {
		const uint8_t *p = codes + aoff[it] + kofs;
		rad_u4 b[4] = {rad_ld16(p), rad_ld16(p + 16), rad_ld16(p + 32), rad_ld16(p + 48)};
		const uint32_t bw[16] = {b[0].x, b[0].y, b[0].z, b[0].w, b[1].x, b[1].y, b[1].z, b[1].w,
					 b[2].x, b[2].y, b[2].z, b[2].w, b[3].x, b[3].y, b[3].z, b[3].w};
		v8f d = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int j = 0; j < 8; j++) {
			v2i B = {(int)bw[2 * j], (int)bw[2 * j + 1]};
			d = __builtin_amdgcn_wmma_f32_16x16x16_fp8_fp8_w32_gfx12(A[j], B, d);
		}
#pragma unroll
		for (int e = 0; e < 8; e++)
			acc[it * 8 + e] += d[e] * sc[e];
	}
}

__device__ __forceinline__ uint32_t act_token(uint32_t lane, int it) { return (uint32_t)it * 16u + (lane & 15u); }
#define ACT_BYTES 1u
__device__ __forceinline__ uint32_t act_kofs(uint32_t lane) { return (lane >> 4) * 64u; }
#define TILES_OF(TOK) ((TOK) / 16)
#endif

#endif
