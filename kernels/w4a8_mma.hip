/*
 * The matrix-core W4A8 kernel rad_w4a8_mma<TOK> (paths DECODE and TILED of
 * w4a8_plan.h). Swap-AB: the weights are the 16-row A operand and the tokens
 * the B operand, so a decode step with m = 1..8 wastes nothing on the 16-row
 * side. A block is 8 warps = WN n-tiles x WK K-slices; every warp streams its
 * n-tile's 1 KiB (tile, group) blocks along its K range, two batches of
 * groups in flight, and applies each group's fp32 scale right after the
 * group's MMAs. Warps of one block that share a K range read the same
 * activation bytes, so those hit L1. K-parallelism comes first from WK
 * (reduced in shared memory, free), then from a global split-K whose fp32
 * partials go to the backend's scratch and are summed by the last-arriving
 * block of each column (no second launch). TILED is the same kernel with a
 * grid dimension over 64-token tiles: the portable matrix-core prefill
 * (sm_89, gfx12). Fragments: w4a8_mma.h.
 */
#include <errno.h>

#include "w4a8_mma.h"

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
#ifdef RAD_NVIDIA
		/* y through shared memory: each K-slice-0 warp puts its tile's
		 * bf16 outputs, [token][16 n], in its own ring (its copies have
		 * landed; the reduction above reads only the other slices'
		 * regions), then the block stores whole 16-byte pieces of each
		 * row, consecutive threads along n (y_store8) */
		uint16_t *stg = (uint16_t *)(dsmem + (size_t)warp * RING_WARP);
		if (wk == 0 && active)
#pragma unroll
			for (int i = 0; i < NACC; i++) {
				uint32_t r, t;
				acc_coord(i, lane, r, t);
				const uint32_t n = nbase + r, tk = tok0 + t;
				if (n < P.n && tk < P.m)
					stg[t * RAD_TILE_N + r] = out_bf16(acc[i], P.s[tk], P.bias, n);
			}
		RAD_SYNC();
		const uint32_t pb = P.wn * (RAD_TILE_N / 8), n0 = RAD_BID_X() * P.wn * RAD_TILE_N;
		const uint32_t mt = P.m - tok0 < (uint32_t)TOK ? P.m - tok0 : (uint32_t)TOK;
		for (uint32_t idx = tid; idx < mt * pb; idx += GEMM_THREADS) {
			const uint32_t t = idx / pb, c = idx % pb, nb = n0 + c * 8;
			if (nb >= P.n)
				continue;
			/* piece c: warp c / 2 (K slice 0), its half c % 2 */
			const uint8_t *src = dsmem + (size_t)(c / 2) * RING_WARP +
					     (t * RAD_TILE_N + c % 2 * 8) * sizeof(uint16_t);
			y_store8(P, tok0 + t, nb, *(const rad_u4 *)src);
		}
#else
		/* a lane's accumulators it*8 + e are rows 8(lane/16) + e of one
		 * token: a whole 16-byte piece in registers */
		if (wk == 0 && active)
#pragma unroll
			for (int it = 0; it < NT; it++) {
				const uint32_t tk = tok0 + (uint32_t)it * 16u + (lane & 15u);
				const uint32_t nb = nbase + 8u * (lane >> 4);
				if (tk >= P.m || nb >= P.n)
					continue;
				float v[8];
#pragma unroll
				for (int e = 0; e < 8; e++)
					v[e] = acc[it * 8 + e];
				y_store8(P, tk, nb, out_bf16x8(P, v, tk, nb, P.s));
			}
#endif
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
	const uint32_t bn = P.wn * RAD_TILE_N;
	splitk_fixup(P, RAD_BID_X() * bn, bn, nsplit, tid, GEMM_THREADS, P.s);
	if (tid == 0)
		P.counters[RAD_BID_X()] = 0;
}

template <int TOK>
static void mma_attr(void)
{
#ifdef RAD_NVIDIA
	static int attr_set;
	if (!attr_set) {
		cudaFuncSetAttribute(rad_w4a8_mma<TOK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				     GEMM_WARPS * RING_WARP);
		attr_set = 1;
	}
#endif
}

template <int TOK>
static int mma_preload(unsigned *count)
{
	mma_attr<TOK>();
	RAD_PRELOAD(rad_w4a8_mma<TOK>, count);
	return 0;
}

/* the token tiles of radiance__w4a8_mma_launch's switch */
int radiance__w4a8_mma_preload(unsigned *count)
{
	int rc = 0;
#ifdef RAD_NVIDIA
	rc = mma_preload<8>(count);
#endif
	if (!rc)
		rc = mma_preload<16>(count);
	if (!rc)
		rc = mma_preload<32>(count);
	if (!rc)
		rc = mma_preload<64>(count);
	return rc;
}

template <int TOK>
static void launch_mma(const gemm_params &p, dim3 grid, size_t smem, hipStream_t st, int pdl)
{
	mma_attr<TOK>();
#ifdef RAD_NVIDIA
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

int radiance__w4a8_mma_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream,
			      int pdl)
{
	hipStream_t st = (hipStream_t)stream;
	dim3 grid(ceil_div(p.ntiles, p.wn), plan.split, ceil_div(p.m, plan.tok));
#ifdef RAD_NVIDIA
	const size_t smem = (size_t)GEMM_WARPS * RING_WARP;
#else
	const size_t smem = plan.wk > 1 ? (size_t)GEMM_WARPS * (plan.tok / 2) * 32 * sizeof(float) : 0;
#endif
	switch (plan.tok) {
#ifdef RAD_NVIDIA
	case 8: launch_mma<8>(p, grid, smem, st, pdl); break;
#endif
	case 16: launch_mma<16>(p, grid, smem, st, pdl); break;
	case 32: launch_mma<32>(p, grid, smem, st, pdl); break;
	default: launch_mma<64>(p, grid, smem, st, pdl); break;
	}
	return radiance__gpu_check_launch("w4a8 mma kernel");
}
