/*
 * W4A8 GEMM on the device weight layout of kernels/numerics_gpu.h:
 *   y[m][n] = bf16( sum_g (sum_{k in g} e4m3(q[m][k]) * v[n][k]) * scale[g][n] * s[m] + bias[n] )
 *
 * Paths (radiance__w4a8_plan picks one; docs/gpu.md has the measurements):
 *
 *   DECODE / TILED: the matrix-core kernel rad_w4a8_mma<TOK>. Swap-AB: the
 *     weights are the 16-row A operand and the tokens the B operand, so a
 *     decode step with m = 1..8 wastes nothing on the 16-row side. A block
 *     is 8 warps = WN n-tiles x WK K-slices; every warp streams its n-tile's
 *     1 KiB (tile, group) blocks along its K range with 16-byte streaming
 *     loads, two batches of four groups in flight, and applies each group's
 *     fp32 scale right after the group's four k32 MMAs. Warps of one block
 *     that share a K range read the same activation bytes, so those hit L1.
 *     K-parallelism comes first from WK (reduced in shared memory, free),
 *     then from a global split-K whose fp32 partials go to the backend's
 *     scratch and are summed by the last-arriving block of each column (no
 *     second launch). TILED is the same kernel with a grid dimension over
 *     64-token tiles: the portable matrix-core prefill (sm_89, gfx12).
 *     NVIDIA: mma.sync m16n8k32 e4m3; AMD gfx12: v_wmma_f32_16x16x16_fp8_fp8.
 *
 *   DECODE on sm_90, m <= 16: the streaming kernel rad_w4a8_gemv (below):
 *     the same MMAs, weights through per-warp bulk-copy (TMA) rings, split-K
 *     from plan_gemv; 1.1-1.65x the kernel above there (docs/gpu.md).
 *
 *   WGMMA: sm_90a prefill (w4a8_wgmma.hip).
 *
 *   PORTABLE: one thread per output, fp32 FMA-free dot products in the CPU
 *     reference's order: bit-identical to radiance_cpu_w4a8_gemm on any GPU.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

#define GEMM_THREADS 256
#define GEMM_WARPS 8

struct gemm_params {
	const uint8_t *codes;
	const float *s;
	const rad_u4 *w;
	const uint8_t *sc;
	const float *bias;
	uint16_t *y;
	float *partials;
	uint32_t *counters;
	uint32_t m, n, k, groups, ntiles, wn, wk;
};

extern "C" int radiance__w4a8_wgmma_launch(const uint8_t *codes, const float *s, const void *w,
					   const void *sc, const float *bias, uint16_t *y, uint32_t m,
					   uint32_t n, uint32_t k, int sm_count, void *stream);

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

/* 4 e4m3 codes -> two f16x2 (exact: every e4m3 value is an f16) */
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t &b0, uint32_t &b1)
{
	asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n"
	    " cvt.rn.f16x2.e4m3x2 %0, lo;\n cvt.rn.f16x2.e4m3x2 %1, hi;}"
	    : "=r"(b0), "=r"(b1) : "r"(w));
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

/* ------------------------------------------------------------ epilogue */

__device__ __forceinline__ uint16_t out_bf16(float acc, float s, const float *bias, uint32_t n)
{
	RAD_NO_CONTRACT
	float b = bias ? bias[n] : 0.0f;
	return (uint16_t)rad_bf16_from_f32(RAD_FADD(RAD_FMUL(acc, s), b));
}

/* ------------------------------------------------- the matrix-core kernel */

#ifdef RAD_NVIDIA
#define MMA_MIN_BLOCKS(TOK) ((TOK) <= 8 ? 3 : 2)
#else
#define MMA_MIN_BLOCKS(TOK) 2
#endif

template <int TOK>
__global__ void __launch_bounds__(GEMM_THREADS, MMA_MIN_BLOCKS(TOK)) rad_w4a8_mma(gemm_params P)
{
	constexpr int NACC = TOK / 2;
	constexpr int NT = TILES_OF(TOK);
	/* NVIDIA: each warp's weight ring (RING_WARP bytes), which after the
	 * warp's K loop holds its partial sums for the K-slice reduction;
	 * AMD: [8 warps][NACC][32 lanes] for that reduction only */
	extern __shared__ __align__(16) uint8_t dsmem[];
	float *red = (float *)dsmem;
	__shared__ uint32_t last_block;

	const uint32_t tid = RAD_TID();
	const uint32_t lane = tid & 31u, warp = tid >> 5;
	const uint32_t wn = warp % P.wn, wk = warp / P.wn;
	const uint32_t ntile = RAD_BID_X() * P.wn + wn;
	const uint32_t split = RAD_BID_Y(), nsplit = RAD_NBLK_Y();
	const uint32_t tok0 = RAD_BID_Z() * TOK;
	const uint32_t G = P.groups;
	const bool active = ntile < P.ntiles;

	/* this warp's groups: the block's split range, then its K slice */
	const uint32_t gs0 = G * split / nsplit, gs1 = G * (split + 1) / nsplit;
	const uint32_t g0 = gs0 + (gs1 - gs0) * wk / P.wk;
	const uint32_t g1 = gs0 + (gs1 - gs0) * (wk + 1) / P.wk;

	float acc[NACC];
#pragma unroll
	for (int i = 0; i < NACC; i++)
		acc[i] = 0.f;

	if (!(active && g0 < g1))
		rad_grid_wait();
	if (active && g0 < g1) {
		uint32_t aoff[NT];
#pragma unroll
		for (int it = 0; it < NT; it++) {
			uint32_t t = tok0 + act_token(lane, it);
			t = t < P.m ? t : P.m - 1;      /* rows past m: a valid row, output dropped */
			aoff[it] = t * P.k * ACT_BYTES + act_kofs(lane);
		}
#ifdef RAD_NVIDIA
		/* Weights and scales stream through this warp's ring of
		 * RING_STAGES groups: lane l copies and later reads its own two
		 * 16-byte chunks of each 1 KiB tile; lanes 0 and 1 copy the
		 * group's 32 scale bytes, which every lane reads after a
		 * __syncwarp. */
		uint8_t *ring = dsmem + (size_t)warp * RING_WARP;
		const uint32_t ring_s = smem_u32(ring);
		/* [n_tile][group] layout: this warp's groups are contiguous */
		const uint8_t *wsrc = (const uint8_t *)P.w + ((size_t)ntile * G + g0) * RAD_TILE_BYTES + lane * 16u;
		const uint8_t *ssrc = P.sc + ((size_t)ntile * G + g0) * RAD_SCALE_BYTES + (lane & 1u) * 16u;
		const size_t wstride = RAD_TILE_BYTES, sstride = RAD_SCALE_BYTES;
		const uint32_t L = g1 - g0;
		/* a ring slot holds GP groups: two for the 8-token tile,
		 * which then run two groups' MMA chains side by side */
		constexpr uint32_t GP = TOK <= 8 ? 2 : 1;
		constexpr uint32_t SLOTS = RING_STAGES / GP;
		const uint32_t NS = (L + GP - 1) / GP;
#define RING_ISSUE(sl)                                                                             \
	do {                                                                                      \
		_Pragma("unroll") for (uint32_t q_ = 0; q_ < GP; q_++) {                           \
			const uint32_t i_ = (sl) * GP + q_;                                       \
			if (i_ < L) {                                                             \
				const uint32_t d_ = ring_s + (i_ % RING_STAGES) * RING_STAGE;     \
				cp_async16(d_ + lane * 16u, wsrc + i_ * wstride);                 \
				cp_async16(d_ + 512u + lane * 16u, wsrc + i_ * wstride + 512);    \
				if (lane < 2)                                                     \
					cp_async16(d_ + RAD_TILE_BYTES + lane * 16u,              \
						   ssrc + i_ * sstride);                          \
			}                                                                         \
		}                                                                                 \
	} while (0)
#pragma unroll
		for (uint32_t sl = 0; sl < SLOTS - 1; sl++) {
			RING_ISSUE(sl);
			cp_async_commit();
		}
		/* the weights do not depend on the previous kernel (the quant):
		 * they are in flight before we wait for its codes */
		rad_grid_wait();
		/* activations of the next slot are loaded into registers while
		 * this slot computes (two named sets, no copies between them) */
		constexpr int NTL = TILES_OF(TOK) <= 2 ? TILES_OF(TOK) : 1;   /* prefetched tiles */
		afrag a0[GP][NTL], a1[GP][NTL];
		auto aload = [&](afrag (&a)[GP][NTL], uint32_t sl) {
#pragma unroll
			for (uint32_t q = 0; q < GP; q++) {
				const uint32_t gi = g0 + sl * GP + q < g1 ? g0 + sl * GP + q : g1 - 1;
#pragma unroll
				for (int it = 0; it < NTL; it++)
					afrag_load(a[q][it], P.codes + aoff[it] + gi * RAD_GROUP);
			}
		};
		auto step = [&](uint32_t sl, const afrag (&a)[GP][NTL]) {
			__syncwarp();                  /* slot (sl - 1) read by every lane */
			if (sl + SLOTS - 1 < NS)
				RING_ISSUE(sl + SLOTS - 1);
			cp_async_commit();
			cp_async_wait<SLOTS - 1>();
			__syncwarp();                  /* lanes 0/1's scale bytes visible */
			wfrag f[GP];
#pragma unroll
			for (uint32_t q = 0; q < GP; q++) {
				const uint8_t *stg = ring + ((sl * GP + q) % RING_STAGES) * RING_STAGE;
				f[q].a = *(const rad_u4 *)(stg + lane * 16u);
				f[q].b = *(const rad_u4 *)(stg + 512u + lane * 16u);
				f[q].s = *(const uint32_t *)(stg + RAD_TILE_BYTES + (lane >> 2) * 4u);
			}
			const uint32_t gi = g0 + sl * GP;
			if (NTL == TILES_OF(TOK))
				groups_mma<GP, NTL>(*(float(*)[NTL * 4])acc, f, a, (int)(g1 - gi));
			else
				for (uint32_t q = 0; q < GP && gi + q < g1; q++)
					group_mma<TOK>(acc, f[q], P.codes, aoff, (gi + q) * RAD_GROUP);
		};
		aload(a0, 0);
		for (uint32_t sl = 0; sl < NS; sl += 2) {
			if (sl + 1 < NS)
				aload(a1, sl + 1);
			step(sl, a0);
			if (sl + 1 >= NS)
				break;
			if (sl + 2 < NS)
				aload(a0, sl + 2);
			step(sl + 1, a1);
		}
#undef RING_ISSUE
		cp_async_wait<0>();
		__syncwarp();
#else
		const rad_u4 *wt = P.w + (size_t)ntile * G * (RAD_TILE_BYTES / 16);
		const uint32_t *st = (const uint32_t *)(P.sc + (size_t)ntile * G * RAD_SCALE_BYTES);
		const size_t gw = RAD_TILE_BYTES / 16, gs = RAD_SCALE_BYTES / 4;
		/* Two batches of U groups in flight per warp, in two named register
		 * sets that take turns (a copy from one set to the other would
		 * wait for the loads in flight and leave one batch in flight).
		 * U shrinks as the token tile (and the work per group) grows, to
		 * stay within 128 registers (two blocks per CU). */
		constexpr int U = TOK <= 16 ? 2 : 1;
		wfrag fa[U], fb[U];
		uint32_t gb = g0;
#define LOAD_BATCH(f, base)                                                                        \
	_Pragma("unroll") for (int u = 0; u < U; u++) if ((base) + u < g1)                          \
		wfrag_load(f[u], wt + (size_t)((base) + u) * gw, st + (size_t)((base) + u) * gs, lane)
#define RUN_BATCH(f, base)                                                                         \
	_Pragma("unroll") for (int u = 0; u < U; u++) if ((base) + u < g1)                          \
		group_mma<TOK>(acc, f[u], P.codes, aoff, ((base) + u) * RAD_GROUP)
		LOAD_BATCH(fa, gb);
		rad_grid_wait();
		while (gb < g1) {
			LOAD_BATCH(fb, gb + U);
			RUN_BATCH(fa, gb);
			gb += U;
			if (gb >= g1)
				break;
			LOAD_BATCH(fa, gb + U);
			RUN_BATCH(fb, gb);
			gb += U;
		}
#undef LOAD_BATCH
#undef RUN_BATCH
#endif
	}

	/* K slices of one block: summed in shared memory, in slice order */
	if (P.wk > 1) {
#ifdef RAD_NVIDIA
		constexpr uint32_t RED_WARP = RING_WARP / 4;   /* floats per warp region */
#else
		constexpr uint32_t RED_WARP = NACC * 32;
#endif
		if (wk > 0)
#pragma unroll
			for (int i = 0; i < NACC; i++)
				red[warp * RED_WARP + i * 32 + lane] = acc[i];
		RAD_SYNC();
		if (wk == 0)
			for (uint32_t q = 1; q < P.wk; q++)
#pragma unroll
				for (int i = 0; i < NACC; i++)
					acc[i] += red[(q * P.wn + wn) * RED_WARP + i * 32 + lane];
	}

	const uint32_t nbase = ntile * RAD_TILE_N;
	if (nsplit == 1) {
		if (wk == 0 && active)
#pragma unroll
			for (int i = 0; i < NACC; i++) {
				uint32_t r, t;
				acc_coord(i, lane, r, t);
				const uint32_t n = nbase + r, tk = tok0 + t;
				if (n < P.n && tk < P.m)
					P.y[(size_t)tk * P.n + n] = out_bf16(acc[i], P.s[tk], P.bias, n);
			}
		return;
	}

	/* global split-K: partials [split][m][n]; the last block of this column
	 * sums them in split order (deterministic) and writes y. m <= TOK here. */
	if (wk == 0 && active)
#pragma unroll
		for (int i = 0; i < NACC; i++) {
			uint32_t r, t;
			acc_coord(i, lane, r, t);
			const uint32_t n = nbase + r;
			if (n < P.n && t < P.m)
				P.partials[((size_t)split * P.m + t) * P.n + n] = acc[i];
		}
	RAD_FENCE_DEVICE();
	RAD_SYNC();
	if (tid == 0)
		last_block = rad_atomic_inc(&P.counters[RAD_BID_X()]) == nsplit - 1;
	RAD_SYNC();
	if (!last_block)
		return;
	RAD_FENCE_DEVICE();
	const uint32_t bn = P.wn * RAD_TILE_N, n0 = RAD_BID_X() * bn;
	for (uint32_t idx = tid; idx < bn * P.m; idx += GEMM_THREADS) {
		const uint32_t n = n0 + idx % bn, t = idx / bn;
		if (n >= P.n)
			continue;
		float v = 0.f;
		for (uint32_t sp = 0; sp < nsplit; sp++)
			v += rad_ld_cg(P.partials + ((size_t)sp * P.m + t) * P.n + n);
		P.y[(size_t)t * P.n + n] = out_bf16(v, P.s[t], P.bias, n);
	}
	if (tid == 0)
		P.counters[RAD_BID_X()] = 0;
}

/* ------------------------------------------- the streaming decode kernel */

#ifdef RAD_HAVE_BULK
/*
 * GEMV (decode, m <= 16, sm_90): the same swap-AB f16 MMAs as the kernel
 * above, organised for bytes in flight and few instructions per weight byte.
 * A block is GV_WARPS independent warps; each owns NTW adjacent n-tiles and
 * one split's K range. Its weight tiles and scale blocks stream through a
 * private ring of `stages` shared-memory slots, a slot holding CG consecutive
 * groups of its NTW tiles (NTW x CG KiB of weights), filled by 1-D
 * bulk copies (TMA, one per tile and one per tile's scales: [n_tile][group]
 * makes a tile's groups contiguous) that complete on one mbarrier per slot.
 * No lane computes an address per 16 bytes and the ring costs no registers,
 * so nearly all of shared memory is in flight. Per group the warp converts
 * its activations once (e4m3 -> f16) for its NTW tiles, unpacks each weight
 * word into f16 pairs (lop3 magic number, the zero point in the f16
 * subtraction), and runs NT x NTW independent MMA chains (two per tile when
 * there are few), scaled in fp32 per group. Split-K partials and the
 * last-block fixup are those of the kernel above, per block column of
 * GV_WARPS x NTW tiles.
 */
#define GV_WARPS 4
#define GV_THREADS (GV_WARPS * 32)
#define GV_MAX_STAGES 8
#define GV_BAR_BYTES (GV_WARPS * GV_MAX_STAGES * 8)
#define GV_SLOT(NTW, CG) ((uint32_t)(NTW) * (CG) * (RAD_TILE_BYTES + RAD_SCALE_BYTES))
#define GV_MINB(TOK, NTW) ((TOK) / 8 * (NTW) >= 4 ? 3 : 4)

template <int TOK, int NTW, int CG>
__global__ void __launch_bounds__(GV_THREADS, GV_MINB(TOK, NTW)) rad_w4a8_gemv(gemm_params P, uint32_t stages)
{
	constexpr int NT = TOK / 8;                 /* 8-token tiles */
	constexpr uint32_t GV_TILES = NTW * CG;      /* tile-groups per slot */
	constexpr uint32_t SLOT = GV_SLOT(NTW, CG);
	constexpr int CH = NT * NTW >= 4 ? 1 : 2;    /* MMA chains per (tile, token tile) */
	extern __shared__ __align__(16) uint8_t dsmem[];
	__shared__ uint32_t last_block;
	const uint32_t tid = RAD_TID(), lane = tid & 31u, warp = tid >> 5;
	const uint32_t tile0 = (RAD_BID_X() * GV_WARPS + warp) * NTW;
	const uint32_t split = RAD_BID_Y(), nsplit = RAD_NBLK_Y();
	const uint32_t G = P.groups;
	const uint32_t g0 = G * split / nsplit, g1 = G * (split + 1) / nsplit;
	const uint32_t L = g1 - g0;
	const bool active = tile0 < P.ntiles;

	float acc[NTW][NT][4];
#pragma unroll
	for (int j = 0; j < NTW; j++)
#pragma unroll
		for (int it = 0; it < NT; it++)
#pragma unroll
			for (int q = 0; q < 4; q++)
				acc[j][it][q] = 0.f;

	if (active && L > 0) {
		const uint32_t bar0 = rad_smem_u32(dsmem) + warp * (GV_MAX_STAGES * 8u);
		const uint8_t *ring = dsmem + GV_BAR_BYTES + warp * stages * SLOT;
		if (lane == 0)
			for (uint32_t s = 0; s < stages; s++)
				rad_mbar_init(bar0 + 8u * s, 1);
		rad_mbar_init_fence();
		__syncwarp();
		/* lane c < NTW copies tile c's weights of a slot's groups, lane
		 * NTW + c their scale blocks; tiles past the last are clamped
		 * (read, unused) */
		const bool cw = lane < (uint32_t)NTW;
		const uint32_t c = cw ? lane : (lane - NTW) % NTW;
		uint32_t ct = tile0 + c;
		ct = ct < P.ntiles ? ct : P.ntiles - 1;
		const uint32_t cunit = cw ? RAD_TILE_BYTES : RAD_SCALE_BYTES;
		const uint8_t *csrc = cw ? (const uint8_t *)P.w + ((size_t)ct * G + g0) * RAD_TILE_BYTES
					 : P.sc + ((size_t)ct * G + g0) * RAD_SCALE_BYTES;
		const uint32_t cdst = rad_smem_u32(ring) + (cw ? c * CG * RAD_TILE_BYTES
							      : GV_TILES * RAD_TILE_BYTES + c * CG * RAD_SCALE_BYTES);
		const bool copier = lane < 2u * NTW;
		const uint32_t nslots = (L + CG - 1) / CG;
		/* slot i holds groups g0 + CG i .. (at most CG, fewer in the last) */
		auto issue = [&](uint32_t i, uint32_t s) {
			const uint32_t nq = L - i * CG < (uint32_t)CG ? L - i * CG : (uint32_t)CG;
			if (copier)
				rad_bulk_g2s(cdst + s * SLOT, csrc + (size_t)i * CG * cunit, nq * cunit, bar0 + 8u * s);
			if (lane == 0)
				rad_mbar_arrive_tx(bar0 + 8u * s, nq * NTW * (RAD_TILE_BYTES + RAD_SCALE_BYTES));
		};
		const uint32_t pre = nslots < stages ? nslots : stages;
		for (uint32_t i = 0; i < pre; i++)
			issue(i, i);
		/* the weights do not depend on the quant kernel before us: they
		 * are in flight before we wait for its codes */
		rad_grid_wait();

		const uint8_t *abase[NT];
#pragma unroll
		for (int it = 0; it < NT; it++) {
			uint32_t t = (uint32_t)it * 8u + (lane >> 2);
			t = t < P.m ? t : P.m - 1;      /* rows past m: a valid row, output dropped */
			abase[it] = P.codes + (size_t)t * P.k + (lane & 3u) * 32u + (size_t)g0 * RAD_GROUP;
		}
		/* activations of group gi (clamped to the range), two named
		 * sets: the next group's load is in flight while one computes */
		afrag A0[NT], A1[NT];
		auto aload = [&](afrag (&a)[NT], uint32_t gi) {
			gi = gi < L ? gi : L - 1;
#pragma unroll
			for (int it = 0; it < NT; it++)
				afrag_load(a[it], abase[it] + (size_t)gi * RAD_GROUP);
		};
		/* one group: weights of its NTW tiles and their scales from the slot */
		auto group = [&](const uint8_t *sw, const uint8_t *ss, const afrag (&a)[NT]) {
			float d[NTW][NT][CH][4];
#pragma unroll
			for (int j = 0; j < NTW; j++)
#pragma unroll
				for (int it = 0; it < NT; it++)
#pragma unroll
					for (int e = 0; e < CH; e++)
#pragma unroll
						for (int q = 0; q < 4; q++)
							d[j][it][e][q] = 0.f;
			uint32_t wg[NTW][4], w8[NTW][4], sc[NTW];
#pragma unroll
			for (int j = 0; j < NTW; j++) {
				const rad_u4 x = *(const rad_u4 *)(sw + j * CG * RAD_TILE_BYTES);
				const rad_u4 y = *(const rad_u4 *)(sw + j * CG * RAD_TILE_BYTES + 512u);
				wg[j][0] = x.x, wg[j][1] = x.y, wg[j][2] = x.z, wg[j][3] = x.w;
				w8[j][0] = y.x, w8[j][1] = y.y, w8[j][2] = y.z, w8[j][3] = y.w;
				sc[j] = *(const uint32_t *)(ss + j * CG * RAD_SCALE_BYTES);
			}
#pragma unroll
			for (int w = 0; w < 4; w++) {
				/* activation words 2w, 2w+1: k = 32t + 8w .. +7 */
				uint32_t b[NT][4];
#pragma unroll
				for (int it = 0; it < NT; it++) {
					const uint32_t lo = w < 2 ? (w == 0 ? a[it].lo.x : a[it].lo.z)
								  : (w == 2 ? a[it].hi.x : a[it].hi.z);
					const uint32_t hi = w < 2 ? (w == 0 ? a[it].lo.y : a[it].lo.w)
								  : (w == 2 ? a[it].hi.y : a[it].hi.w);
					e4m3x4_to_f16(lo, b[it][0], b[it][1]);
					e4m3x4_to_f16(hi, b[it][2], b[it][3]);
				}
#pragma unroll
				for (int j = 0; j < NTW; j++) {
					uint32_t hg[4], h8[4];
					rad_unpack8_f16(wg[j][w], hg);
					rad_unpack8_f16(w8[j][w], h8);
#pragma unroll
					for (int it = 0; it < NT; it++) {
						mma_f16(d[j][it][0], hg[0], h8[0], hg[1], h8[1], b[it][0], b[it][1]);
						mma_f16(d[j][it][CH - 1], hg[2], h8[2], hg[3], h8[3], b[it][2], b[it][3]);
					}
				}
			}
#pragma unroll
			for (int j = 0; j < NTW; j++) {
				const float slo = rad_h2f(sc[j] & 0xFFFFu), shi = rad_h2f(sc[j] >> 16);
#pragma unroll
				for (int it = 0; it < NT; it++) {
					float v[4];
#pragma unroll
					for (int q = 0; q < 4; q++)
						v[q] = CH == 2 ? d[j][it][0][q] + d[j][it][CH - 1][q] : d[j][it][0][q];
					acc[j][it][0] += v[0] * slo;
					acc[j][it][1] += v[1] * slo;
					acc[j][it][2] += v[2] * shi;
					acc[j][it][3] += v[3] * shi;
				}
			}
		};
		/* this lane's bytes in slot 0: weights, scales */
		const uint8_t *lw = ring + lane * 16u;
		const uint8_t *ls = ring + GV_TILES * RAD_TILE_BYTES + (lane >> 2) * 4u;
		uint32_t s = 0, ph = 0;
		/* slot i; its first group's activations are in set P0 (group
		 * parity: CG even keeps it, CG odd alternates, hence two slots
		 * per iteration) */
		auto slot = [&](uint32_t i, auto &P0, auto &P1) {
			rad_mbar_wait(bar0 + 8u * s, ph);
			const uint32_t off = s * SLOT;
			const uint32_t nq = L - i * CG;
#pragma unroll
			for (int q = 0; q < CG; q++) {
				if (q > 0 && (uint32_t)q >= nq)
					break;
				if (q % 2 == 0) {
					aload(P1, i * CG + q + 1);
					group(lw + off + q * RAD_TILE_BYTES, ls + off + q * RAD_SCALE_BYTES, P0);
				} else {
					aload(P0, i * CG + q + 1);
					group(lw + off + q * RAD_TILE_BYTES, ls + off + q * RAD_SCALE_BYTES, P1);
				}
			}
			__syncwarp();                  /* every lane has read the slot */
			if (i + stages < nslots)
				issue(i + stages, s);
			if (++s == stages) {
				s = 0;
				ph ^= 1u;
			}
		};
		aload(A0, 0);
		for (uint32_t i = 0; i < nslots; i += 2) {
			slot(i, A0, A1);
			if (i + 1 >= nslots)
				break;
			if (CG % 2 == 0)
				slot(i + 1, A0, A1);
			else
				slot(i + 1, A1, A0);
		}
	} else {
		rad_grid_wait();
	}

	if (nsplit == 1) {
		if (active)
#pragma unroll
			for (int j = 0; j < NTW; j++)
#pragma unroll
				for (int it = 0; it < NT; it++)
#pragma unroll
					for (int q = 0; q < 4; q++) {
						uint32_t r, t;
						acc_coord(it * 4 + q, lane, r, t);
						const uint32_t n = (tile0 + j) * RAD_TILE_N + r;
						if (n < P.n && t < P.m)
							P.y[(size_t)t * P.n + n] = out_bf16(acc[j][it][q], P.s[t], P.bias, n);
					}
		return;
	}

	/* global split-K: partials [split][m][n]; the last block of this column
	 * sums them in split order (deterministic) and writes y */
	if (active)
#pragma unroll
		for (int j = 0; j < NTW; j++)
#pragma unroll
			for (int it = 0; it < NT; it++)
#pragma unroll
				for (int q = 0; q < 4; q++) {
					uint32_t r, t;
					acc_coord(it * 4 + q, lane, r, t);
					const uint32_t n = (tile0 + j) * RAD_TILE_N + r;
					if (n < P.n && t < P.m)
						P.partials[((size_t)split * P.m + t) * P.n + n] = acc[j][it][q];
				}
	RAD_FENCE_DEVICE();
	RAD_SYNC();
	if (tid == 0)
		last_block = rad_atomic_inc(&P.counters[RAD_BID_X()]) == nsplit - 1;
	RAD_SYNC();
	if (!last_block)
		return;
	RAD_FENCE_DEVICE();
	const uint32_t bn = GV_WARPS * NTW * RAD_TILE_N, n0 = RAD_BID_X() * bn;
	for (uint32_t idx = tid; idx < bn * P.m; idx += GV_THREADS) {
		const uint32_t n = n0 + idx % bn, t = idx / bn;
		if (n >= P.n)
			continue;
		float v = 0.f;
		for (uint32_t sp = 0; sp < nsplit; sp++)
			v += rad_ld_cg(P.partials + ((size_t)sp * P.m + t) * P.n + n);
		P.y[(size_t)t * P.n + n] = out_bf16(v, P.s[t], P.bias, n);
	}
	if (tid == 0)
		P.counters[RAD_BID_X()] = 0;
}

#endif

/* ------------------------------------------------------ portable kernel */

/* One thread per (token, output): the CPU reference's loop order and
 * roundings (separate multiply and add), so the result is bit-identical. */
__global__ void __launch_bounds__(256) rad_w4a8_portable(gemm_params P)
{
	RAD_NO_CONTRACT
	const uint32_t n = RAD_BID_X() * 256 + RAD_TID();
	const uint32_t t = RAD_BID_Y();
	if (n >= P.n)
		return;
	const uint32_t G = P.groups, tile = n / RAD_TILE_N, row = n % RAD_TILE_N;
	const uint8_t *xr = P.codes + (size_t)t * P.k;
	const uint32_t *wt = (const uint32_t *)P.w + (size_t)tile * G * 256 + row * 16;
	float acc = 0.f;
	for (uint32_t g = 0; g < G; g++) {
		const uint32_t *wg = wt + (size_t)g * 256;
		const uint8_t *xg = xr + (size_t)g * RAD_GROUP;
		/* eight partial sums, element i of the group into sum i % 8, then
		 * combined pairwise: the order of the CPU's dot_group() */
		float pa[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
		for (uint32_t wi = 0; wi < 16; wi++) {
			uint32_t w = wg[wi];
			for (uint32_t q = 0; q < 8; q++) {
				float xv = rad_e4m3_to_f32(xg[wi * 8 + q]);
				float wv = (float)rad_word_int(w, q);
				pa[q] = RAD_FADD(pa[q], RAD_FMUL(xv, wv));
			}
		}
		float p = RAD_FADD(RAD_FADD(RAD_FADD(pa[0], pa[4]), RAD_FADD(pa[1], pa[5])),
				   RAD_FADD(RAD_FADD(pa[2], pa[6]), RAD_FADD(pa[3], pa[7])));
		float sc = rad_scale_of_row(P.sc + ((size_t)tile * G + g) * RAD_SCALE_BYTES, row);
		acc = RAD_FADD(acc, RAD_FMUL(p, sc));
	}
	P.y[(size_t)t * P.n + n] = out_bf16(acc, P.s[t], P.bias, n);
}

/* ---------------------------------------------------- repack & dequant */

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

/* ------------------------------------------------------------------ host */

static uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

extern "C" size_t radiance__w4a8_weight_bytes(uint32_t n, uint32_t k)
{
	return (size_t)ceil_div(n, RAD_TILE_N) * (k / RAD_GROUP) * RAD_TILE_BYTES;
}

extern "C" size_t radiance__w4a8_scale_bytes(uint32_t n, uint32_t k)
{
	return (size_t)ceil_div(n, RAD_TILE_N) * (k / RAD_GROUP) * RAD_SCALE_BYTES;
}

extern "C" size_t radiance__w4a8_counters_needed(uint32_t n)
{
	return ceil_div(n, RAD_TILE_N);
}

extern "C" size_t radiance__w4a8_partials_bytes(uint32_t max_decode_rows, uint32_t max_n)
{
	(void)max_decode_rows;
	return (size_t)RADIANCE_W4A8_SPLIT_ROWS * max_n * sizeof(float);
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

/*
 * Split-K policy, per shape and m. Time is modelled as the bytes that must
 * move over the parallelism the grid gets:
 *   weights  N*K/2 (+ scales), read once;
 *   activations re-read from L2 by every block column: m*K*ntiles/WN, at
 *     about 0.4 of a DRAM byte (L2 serves ~2.5x HBM on Hopper) -- this is
 *     why WK (which shrinks WN) is not free for m >= 16;
 *   split-K partials written and read back: 2*S*m*N*4, so a split that fills
 *     the GPU for a narrow layer is pure extra traffic for a wide one, and
 *     grows with m;
 *   parallelism: warps / (16 per SM), quantised in waves.
 */
static void plan_split(const struct radiance__gpu_device *dev, uint32_t m, uint32_t n, uint32_t k, uint32_t tok,
		       uint32_t tokblocks, int allow_split, uint32_t force_split, uint32_t *wk_out,
		       uint32_t *split_out)
{
	const uint32_t ntiles = ceil_div(n, RAD_TILE_N), G = k / RAD_GROUP;
	/* resident warps per SM: 3 blocks of 8 for the 8-token tile on
	 * NVIDIA (64 KiB ring + < 85 registers), else 2 */
	const double per_sm = strcmp(dev->vendor, "cuda") == 0 && tok <= 8 ? 24.0 : 16.0;
	const double want = (double)(dev->sm_count > 0 ? dev->sm_count : 1) * per_sm;
	const double wbytes = (double)n * k * 0.515625;
	double best = 1e300;
	uint32_t best_wk = 1, best_s = 1;
	for (uint32_t wk = 1; wk <= 8; wk *= 2) {
		const uint32_t wn = GEMM_WARPS / wk;
		const uint32_t smax = allow_split ? 32u : 1u;
		for (uint32_t s = 1; s <= smax; s++) {
			if (force_split && s != force_split)
				continue;
			if (s > 1 && (uint64_t)s * m > RADIANCE_W4A8_SPLIT_ROWS)
				break;
			/* at least one full batch (4 groups) per warp unless forced */
			if (wk * s > G || (wk * s > 1 && G / (wk * s) < 4 && !force_split))
				continue;
			const double blocks = (double)ceil_div(ntiles, wn) * s * tokblocks;
			const double warps = blocks * GEMM_WARPS;
			const double waves = ceil(warps / want);
			const double eff = warps / (waves * want);
			/* idle warps of a block (ntiles not a multiple of wn) still cost slots */
			const double useful = (double)ntiles * wk * s * tokblocks / warps;
			const double act = 0.4 * (double)m * k * ntiles / wn;
			const double part = s > 1 ? 2.0 * s * m * (double)n * 4.0 : 0.0;
			/* every warp pays a start (first load latency) and an end
			 * (reduction, epilogue): about 2 KiB of streaming time */
			const double fixed = warps * 2048.0;
			const double cost = (wbytes + act + part + fixed) / (eff * useful);
			if (cost < best * 0.999) {
				best = cost;
				best_wk = wk;
				best_s = s;
			}
		}
	}
	*wk_out = best_wk;
	*split_out = best_s;
}

/* The sm_90a fp8 wgmma prefill is opt-in (RADIANCE_PREFILL=wgmma): Hopper's
 * fp8 tensor cores add each k32 step's products with about 14 bits of
 * alignment precision (truncating), not in fp32 as numerics.h defines; on
 * the MiniLM layers that is ~6e-4 relative Frobenius error but up to a few
 * hundred bf16 ulps on outputs near zero. The f16 HMMA path (the decode
 * kernel tiled over tokens) accumulates in fp32 and is the default. */
static int prefill_wgmma(void)
{
	static int v = -1;
	if (v < 0) {
		const char *e = getenv("RADIANCE_PREFILL");
		v = e && strcmp(e, "wgmma") == 0;
	}
	return v;
}

static struct {
	int kernel;
	uint32_t ntw, cg, stages;
} decode_ovr;

extern "C" void radiance__w4a8_set_decode(int kernel, uint32_t ntw, uint32_t cg, uint32_t stages)
{
	decode_ovr.kernel = kernel;
	decode_ovr.ntw = ntw;
	decode_ovr.cg = cg;
	decode_ovr.stages = stages;
}

#ifdef RAD_HAVE_BULK
static size_t gemv_smem(uint32_t ntw, uint32_t cg, uint32_t stages)
{
	return GV_BAR_BYTES + (size_t)GV_WARPS * stages * GV_SLOT(ntw, cg);
}

template <int TOK, int NTW, int CG>
static void gemv_attr(void)
{
	static int set;
	if (!set) {
		cudaFuncSetAttribute(rad_w4a8_gemv<TOK, NTW, CG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				     (int)gemv_smem(NTW, CG, GV_MAX_STAGES));
		cudaFuncSetAttribute(rad_w4a8_gemv<TOK, NTW, CG>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
		set = 1;
	}
}

/* resident blocks per SM of an instance at a ring depth (0: none fit) */
template <int TOK, int NTW, int CG>
static int gemv_occ(uint32_t stages)
{
	gemv_attr<TOK, NTW, CG>();
	int nb = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, rad_w4a8_gemv<TOK, NTW, CG>, GV_THREADS,
							  gemv_smem(NTW, CG, stages)) != cudaSuccess) {
		(void)cudaGetLastError();
		nb = 0;
	}
	return nb;
}

template <int TOK, int NTW, int CG>
static void gemv_launch(const gemm_params &p, dim3 grid, uint32_t stages, hipStream_t st, int pdl)
{
	gemv_attr<TOK, NTW, CG>();
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute attr[1];
	attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	attr[0].val.programmaticStreamSerializationAllowed = 1;
	cfg.gridDim = grid;
	cfg.blockDim = dim3(GV_THREADS);
	cfg.dynamicSmemBytes = gemv_smem(NTW, CG, stages);
	cfg.stream = st;
	cfg.attrs = attr;
	cfg.numAttrs = pdl ? 1 : 0;
	cudaLaunchKernelEx(&cfg, rad_w4a8_gemv<TOK, NTW, CG>, p, stages);
}

/* the instances: 8- and 16-token tiles, (n-tiles per warp, groups per slot) */
struct gemv_inst {
	uint32_t tok, ntw, cg;
	int (*occ)(uint32_t stages);
	void (*launch)(const gemm_params &p, dim3 grid, uint32_t stages, hipStream_t st, int pdl);
};
#define GV_INST(T, N, C) {T, N, C, gemv_occ<T, N, C>, gemv_launch<T, N, C>}
static const struct gemv_inst gemv_insts[] = {
	GV_INST(8, 1, 1),  GV_INST(8, 1, 2),  GV_INST(8, 1, 4),  GV_INST(8, 2, 1),  GV_INST(8, 2, 2),
	GV_INST(8, 4, 1),  GV_INST(16, 1, 1), GV_INST(16, 1, 2), GV_INST(16, 1, 4), GV_INST(16, 2, 1),
	GV_INST(16, 2, 2),
};
#define GV_NINST (sizeof gemv_insts / sizeof gemv_insts[0])

static int gemv_find(uint32_t tok, uint32_t ntw, uint32_t cg)
{
	for (size_t i = 0; i < GV_NINST; i++)
		if (gemv_insts[i].tok == tok && gemv_insts[i].ntw == ntw && gemv_insts[i].cg == cg)
			return (int)i;
	return -1;
}

static int gemv_blocks_per_sm(int inst, uint32_t stages)
{
	static int cache[GV_NINST][GV_MAX_STAGES + 1];
	int &c = cache[inst][stages];
	if (c == 0) {
		c = gemv_insts[inst].occ(stages);
		if (c <= 0)
			c = -1;
	}
	return c;
}

static int gemv_usable(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a)
{
	if (decode_ovr.kernel == 1 || a->m > 16 || strcmp(dev->vendor, "cuda") != 0 || dev->cc_major < 9)
		return 0;
	/* bulk copies need 16-byte aligned sources */
	return (((uintptr_t)a->w | (uintptr_t)a->sc) & 15u) == 0;
}

/*
 * Streaming decode policy, fitted to the H200 sweep (bench_w4a8 --sweep,
 * docs/gpu.md): time is a DRAM-bound term plus a fixed cost; a shallow ring
 * (2 slots of 2 groups, 1 tile per warp) and one wave of as many warps as fit
 * are best, a second wave costs ~20%, and split-K partials (2 S m N 4 bytes)
 * cost as much as weights. So: 1 n-tile per warp (2 when those columns alone
 * exceed a wave), 2 groups per slot, 2 slots; the split S is the largest that
 * keeps one wave, at most 8, at least 4 groups per warp, with the partial
 * traffic under a fifth of the weights'. An override (radiance__w4a8_set_decode,
 * args.split) replaces any of these.
 */
#define GV_DEF_CG 2u
#define GV_DEF_STAGES 2u
#define GV_MAX_SPLIT 8u
static void plan_gemv(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
		      struct radiance__w4a8_plan *plan)
{
	const uint32_t m = a->m, ntiles = ceil_div(a->n, RAD_TILE_N), G = a->k / RAD_GROUP;
	const uint32_t tok = m <= 8 ? 8 : 16;
	const int allow = a->partials && a->counters && a->counters_n >= radiance__w4a8_counters_needed(a->n);
	const uint32_t sms = dev->sm_count > 0 ? (uint32_t)dev->sm_count : 1u;
	uint32_t st = decode_ovr.stages ? decode_ovr.stages : GV_DEF_STAGES;
	st = st < 1 ? 1 : st > GV_MAX_STAGES ? GV_MAX_STAGES : st;
	const uint32_t cg = decode_ovr.cg ? decode_ovr.cg : GV_DEF_CG;
	/* the instance: the override's, else 1 tile per warp unless its
	 * columns exceed one wave */
	int inst = -1;
	uint64_t cap = 0;
	for (uint32_t ntw = 1; ntw <= 2 && inst < 0; ntw *= 2) {
		const uint32_t n = decode_ovr.ntw ? decode_ovr.ntw : ntw;
		const int i = gemv_find(tok, n, cg);
		if (i < 0)
			continue;
		const int bps = gemv_blocks_per_sm(i, st);
		if (bps <= 0)
			continue;
		cap = (uint64_t)bps * sms;
		if (decode_ovr.ntw || ntw == 2 || ceil_div(ntiles, GV_WARPS * n) <= cap)
			inst = i;
	}
	if (inst < 0) {
		inst = gemv_find(tok, 1, 2);
		st = GV_DEF_STAGES;
		cap = (uint64_t)sms;
	}
	const uint32_t cols = ceil_div(ntiles, GV_WARPS * gemv_insts[inst].ntw);
	uint32_t S = 1;
	if (allow && a->split) {
		S = a->split;
	} else if (allow) {
		const double wbytes = (double)a->n * a->k * 0.515625;
		S = (uint32_t)(cap / cols);
		S = S > GV_MAX_SPLIT ? GV_MAX_SPLIT : S;
		S = S > G / 4 ? G / 4 : S;
		S = S > RADIANCE_W4A8_SPLIT_ROWS / m ? RADIANCE_W4A8_SPLIT_ROWS / m : S;
		const uint32_t spart = (uint32_t)(0.2 * wbytes / (8.0 * m * a->n));
		S = S > spart ? spart : S;
		S = S < 1 ? 1 : S;
	}
	if (S > 1 && (size_t)S * m * a->n * sizeof(float) > a->partials_bytes)
		S = (uint32_t)(a->partials_bytes / ((size_t)m * a->n * sizeof(float)));
	S = S < 1 ? 1 : S;
	plan->tok = tok;
	plan->wk = 1;
	plan->ntw = gemv_insts[inst].ntw;
	plan->cg = gemv_insts[inst].cg;
	plan->stages = st;
	plan->split = S;
}
#endif

extern "C" void radiance__w4a8_plan(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
				    struct radiance__w4a8_plan *plan)
{
	const uint32_t maxdec = a->max_decode_rows ? a->max_decode_rows : 64;
	enum radiance__w4a8_path path = a->path;
	if (path == RADIANCE_W4A8_AUTO) {
		if (!dev->fp8_mma)
			path = RADIANCE_W4A8_PORTABLE;
		else if (a->m <= maxdec && a->m <= 64)
			path = RADIANCE_W4A8_DECODE;
		else
			path = dev->wgmma && prefill_wgmma() ? RADIANCE_W4A8_WGMMA : RADIANCE_W4A8_TILED;
	}
	if (path == RADIANCE_W4A8_DECODE && a->m > 64)
		path = RADIANCE_W4A8_TILED;
	if (path == RADIANCE_W4A8_WGMMA && !dev->wgmma)
		path = RADIANCE_W4A8_TILED;
	if ((path == RADIANCE_W4A8_DECODE || path == RADIANCE_W4A8_TILED || path == RADIANCE_W4A8_WGMMA) &&
	    !dev->fp8_mma)
		path = RADIANCE_W4A8_PORTABLE;
	plan->path = path;
	plan->order = RADIANCE_CODES_NATURAL;
	if (path == RADIANCE_W4A8_WGMMA)
		plan->order = RADIANCE_CODES_WGMMA;

	plan->tok = 0;
	plan->wk = 1;
	plan->split = 1;
	plan->ntw = 0;
	plan->stages = 0;
	plan->cg = 0;
	if (path != RADIANCE_W4A8_DECODE && path != RADIANCE_W4A8_TILED)
		return;
#ifdef RAD_HAVE_BULK
	if (path == RADIANCE_W4A8_DECODE && gemv_usable(dev, a)) {
		plan_gemv(dev, a, plan);
		return;
	}
#endif
	/* the smallest token tile that holds m (decode, and tiled m <= 64) */
	uint32_t tok = 64;
	if (a->m <= 64)
		for (tok = TOK_MIN; tok < a->m; tok *= 2)
			;
	plan->tok = tok;
	const uint32_t tokblocks = ceil_div(a->m, tok);
	const int allow = tokblocks == 1 && a->partials && a->counters &&
			  a->counters_n >= radiance__w4a8_counters_needed(a->n);
	plan_split(dev, a->m, a->n, a->k, tok, tokblocks, allow, allow ? a->split : 1, &plan->wk, &plan->split);
	if (plan->split > 1 &&
	    (size_t)plan->split * a->m * a->n * sizeof(float) > a->partials_bytes)
		plan->split = 1;
}

template <int TOK>
static void launch_mma(const gemm_params &p, dim3 grid, size_t smem, hipStream_t st, int pdl)
{
#ifdef RAD_NVIDIA
	static int attr_set;
	if (!attr_set) {
		cudaFuncSetAttribute(rad_w4a8_mma<TOK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				     GEMM_WARPS * RING_WARP);
		attr_set = 1;
	}
	if (pdl) {
		/* overlap the weight prefetch with the quant kernel before us */
		cudaLaunchConfig_t cfg = {};
		cudaLaunchAttribute attr[1];
		attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		attr[0].val.programmaticStreamSerializationAllowed = 1;
		cfg.gridDim = grid;
		cfg.blockDim = dim3(GEMM_THREADS);
		cfg.dynamicSmemBytes = smem;
		cfg.stream = st;
		cfg.attrs = attr;
		cfg.numAttrs = 1;
		cudaLaunchKernelEx(&cfg, rad_w4a8_mma<TOK>, p);
		return;
	}
#endif
	(void)pdl;
	hipLaunchKernelGGL(rad_w4a8_mma<TOK>, grid, dim3(GEMM_THREADS), smem, st, p);
}

extern "C" int radiance__w4a8_gemm(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
				   void *stream)
{
	if (a->k % RAD_GROUP || a->n == 0 || a->k == 0)
		return -EINVAL;
	if (a->m == 0)
		return 0;
	struct radiance__w4a8_plan plan;
	radiance__w4a8_plan(dev, a, &plan);
	hipStream_t st = (hipStream_t)stream;
	gemm_params p;
	p.codes = a->codes;
	p.s = a->s;
	p.w = (const rad_u4 *)a->w;
	p.sc = (const uint8_t *)a->sc;
	p.bias = a->bias;
	p.y = a->y;
	p.partials = a->partials;
	p.counters = a->counters;
	p.m = a->m;
	p.n = a->n;
	p.k = a->k;
	p.groups = a->k / RAD_GROUP;
	p.ntiles = ceil_div(a->n, RAD_TILE_N);
	p.wk = plan.wk;
	p.wn = GEMM_WARPS / plan.wk;

	switch (plan.path) {
	case RADIANCE_W4A8_PORTABLE:
		hipLaunchKernelGGL(rad_w4a8_portable, dim3(ceil_div(a->n, 256), a->m), dim3(256), 0, st, p);
		return radiance__gpu_check_launch("w4a8 portable kernel");
	case RADIANCE_W4A8_WGMMA:
		return radiance__w4a8_wgmma_launch(a->codes, a->s, a->w, a->sc, a->bias, a->y, a->m, a->n, a->k,
						   dev->sm_count, stream);
	default:
		break;
	}
#ifdef RAD_HAVE_BULK
	if (plan.ntw) {
		const int i = gemv_find(plan.tok, plan.ntw, plan.cg);
		if (i < 0)
			return -EINVAL;
		gemv_insts[i].launch(p, dim3(ceil_div(p.ntiles, GV_WARPS * plan.ntw), plan.split, 1), plan.stages, st,
				     a->pdl);
		return radiance__gpu_check_launch("w4a8 gemv kernel");
	}
#endif
	dim3 grid(ceil_div(p.ntiles, p.wn), plan.split, ceil_div(a->m, plan.tok));
#ifdef RAD_NVIDIA
	const size_t smem = (size_t)GEMM_WARPS * RING_WARP;
#else
	const size_t smem = plan.wk > 1 ? (size_t)GEMM_WARPS * (plan.tok / 2) * 32 * sizeof(float) : 0;
#endif
	switch (plan.tok) {
#ifdef RAD_NVIDIA
	case 8: launch_mma<8>(p, grid, smem, st, a->pdl); break;
#endif
	case 16: launch_mma<16>(p, grid, smem, st, a->pdl); break;
	case 32: launch_mma<32>(p, grid, smem, st, a->pdl); break;
	default: launch_mma<64>(p, grid, smem, st, a->pdl); break;
	}
	return radiance__gpu_check_launch("w4a8 mma kernel");
}
