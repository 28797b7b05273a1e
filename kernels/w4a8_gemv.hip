/*
 * The streaming decode kernel rad_w4a8_gemv (path DECODE on sm_90, m <= 16,
 * when w4a8_plan.c picks it): the swap-AB f16 MMAs of w4a8_mma.h, weights
 * through per-warp bulk-copy (TMA) rings, split-K from the planner; 1.1-1.65x
 * the matrix-core kernel there (docs/gpu.md). NVIDIA only; on AMD this file
 * compiles to nothing.
 */
#include <errno.h>

#include "w4a8_mma.h"
#include "w4a8_quant.h"

#ifdef RAD_HAVE_BULK
/*
 * GEMV (decode, sm_90; 8 or 16 tokens a launch, 32 or 64 when forced): the same swap-AB f16 MMAs as the kernel
 * above, organised for bytes in flight and few instructions per weight byte.
 * A block is GV_WARPS independent warps in columns of wk (plan.wk: 1, 2 or
 * 4); a column owns NTW adjacent n-tiles and one split's K range, which its
 * wk warps share out, each its own part (their partials added in shared
 * memory at the end, in warp order, so that a column's warps, and not
 * global split-K, give most of the parallelism). A warp's weight tiles and
 * scale blocks stream through a private ring of `stages` shared-memory
 * slots, a slot holding CG consecutive groups of its NTW tiles (NTW x CG KiB
 * of weights), filled by 1-D
 * bulk copies (TMA, one per tile and one per tile's scales: [n_tile][group]
 * makes a tile's groups contiguous) that complete on one mbarrier per slot.
 * No lane computes an address per 16 bytes and the ring costs no registers,
 * so nearly all of shared memory is in flight. Per group the warp converts
 * its activations once (e4m3 -> f16) for its NTW tiles, unpacks each weight
 * word into f16 pairs (lop3 magic number, the zero point in the f16
 * subtraction), and runs NT x NTW independent MMA chains (two per tile when
 * there are few), scaled in fp32 per group. Split-K partials and the
 * last-block fixup are those of the kernel above, per block of GV_WARPS /
 * wk x NTW tiles.
 */
#define GV_WARPS RADIANCE_W4A8_GEMV_WARPS
#define GV_THREADS (GV_WARPS * 32)
#define GV_MAX_STAGES RADIANCE_W4A8_GEMV_MAX_STAGES
#define GV_BAR_BYTES (GV_WARPS * GV_MAX_STAGES * 8)
#define GV_SLOT(NTW, CG) ((uint32_t)(NTW) * (CG) * (RAD_TILE_BYTES + RAD_SCALE_BYTES))
static_assert(GV_SLOT(1, 1) == RADIANCE_W4A8_GEMV_SLOT_BYTES(1, 1), "w4a8_plan.h's ring slot size");
/* resident blocks asked of the register allocator: 7 for the 8-token,
 * one-tile instances (72 registers), 2 for 8 MMA chains (32 tokens and two
 * tiles, 64 tokens and one: their accumulators and two sets of activation
 * fragments), the rest 3 or 4 */
#define GV_MINB(TOK, NTW)                                                                          \
	((TOK) == 8 && (NTW) == 1 ? 7 : (TOK) / 8 * (NTW) >= 8 ? 2 : (TOK) / 8 * (NTW) >= 4 ? 3 : 4)

#define GV_FQ_ROWS RADIANCE_W4A8_FUSE_MAX_ROWS

/* Fused quant (FQ instances, plan.fused): the block's first nt threads (its
 * active warps) quantize x's m rows themselves, exactly as rad_quant_rows
 * does: each row's amax over all of k (every block reads the whole row,
 * from L2 after the first), then the codes of the block's K range [g0, g0 +
 * L) groups into shared memory, fc + t * fstride, in the natural order; s
 * and 1/s into fs, finv. The weights are in flight meanwhile. */
template <int FP16>
__device__ __forceinline__ void gv_quant(const gemm_params &P, uint32_t g0, uint32_t L, uint8_t *fc,
					 uint32_t fstride, uint32_t nt, float *fs, float *finv, uint32_t *fnan,
					 uint32_t (*red)[GV_FQ_ROWS][2])
{
	const uint32_t tid = RAD_TID(), lane = tid & 31u, warp = tid >> 5;
	const uint16_t *x = (const uint16_t *)P.x;
	const uint32_t pieces = P.k / 8;
	uint32_t amax[GV_FQ_ROWS], bad[GV_FQ_ROWS];
#pragma unroll
	for (int t = 0; t < GV_FQ_ROWS; t++) {
		amax[t] = 0;
		bad[t] = 0;
		if ((uint32_t)t < P.m) {
			const uint16_t *xr = x + (size_t)t * P.k;
#pragma unroll 4
			for (uint32_t p = tid; p < pieces; p += nt)
				quant_amax<FP16>(rad_ld16(xr + (size_t)p * 8), amax[t], bad[t]);
		}
	}
#pragma unroll
	for (int t = 0; t < GV_FQ_ROWS; t++) {
		const uint32_t a = rad_warp_max_u32(amax[t]);
		const uint32_t b = rad_warp_or_u32(bad[t]);
		if (lane == 0) {
			red[warp][t][0] = a;
			red[warp][t][1] = b;
		}
	}
	rad_bar_sync(1, nt);
	if (tid < P.m) {
		uint32_t a = 0, b = 0;
		for (uint32_t w = 0; w < nt / 32; w++) {
			a = red[w][tid][0] > a ? red[w][tid][0] : a;
			b |= red[w][tid][1];
		}
		quant_row_scale(a, b, fs[tid], finv[tid]);
		fnan[tid] = b != 0;
	}
	rad_bar_sync(1, nt);
	const uint32_t lp = L * (RAD_GROUP / 8);
	for (uint32_t t = 0; t < P.m; t++) {
		const uint16_t *xr = x + (size_t)t * P.k + (size_t)g0 * RAD_GROUP;
		const float inv = finv[t];
		const bool nan_row = fnan[t] != 0;
#pragma unroll 2
		for (uint32_t p = tid; p < lp; p += nt)
			quant_store<FP16, RADIANCE_CODES_NATURAL>(rad_ld16(xr + (size_t)p * 8), inv, nan_row, p * 8,
								 fc + (size_t)t * fstride);
	}
	rad_bar_sync(1, nt);
}

template <int TOK, int NTW, int CG, int FQ>
__global__ void __launch_bounds__(GV_THREADS, GV_MINB(TOK, NTW)) rad_w4a8_gemv(gemm_params P, uint32_t stages,
												  uint32_t wk_arg)
{
	const uint32_t wk = FQ ? 1u : wk_arg;   /* fused quant: one warp per K range */
	constexpr int NT = TOK / 8;                 /* 8-token tiles */
	constexpr uint32_t GV_TILES = NTW * CG;      /* tile-groups per slot */
	constexpr uint32_t SLOT = GV_SLOT(NTW, CG);
	/* y staged through a column's first warp's ring ([TOK][NTW x 16] bf16),
	 * which has at least one slot */
	static_assert(TOK * NTW * RAD_TILE_N * 2 <= SLOT, "y staging must fit one ring slot");
	constexpr int CH = NT * NTW >= 4 ? 1 : 2;    /* MMA chains per (tile, token tile) */
	extern __shared__ __align__(16) uint8_t dsmem[];
	__shared__ uint32_t last_block;
	/* fused quant: the rows' scales, 1/s, NaN flags, per-warp reductions */
	__shared__ float fq_s[FQ ? GV_FQ_ROWS : 1], fq_inv[FQ ? GV_FQ_ROWS : 1];
	__shared__ uint32_t fq_nan[FQ ? GV_FQ_ROWS : 1], fq_red[FQ ? GV_WARPS : 1][GV_FQ_ROWS][2];
	const uint32_t tid = RAD_TID(), lane = tid & 31u, warp = tid >> 5;
	/* wk warps (consecutive) share a column of NTW tiles, each a part of
	 * the block's K range [gb0, gb0 + LB); the planner keeps every part
	 * non-empty */
	const uint32_t cols = GV_WARPS / wk, wcol = warp / wk, wsub = warp % wk;
	const uint32_t tile0 = (RAD_BID_X() * cols + wcol) * NTW;
	const uint32_t split = RAD_BID_Y(), nsplit = RAD_NBLK_Y();
	const uint32_t G = P.groups;
	const uint32_t gb0 = G * split / nsplit, LB = G * (split + 1) / nsplit - gb0;
	const uint32_t g0 = gb0 + LB * wsub / wk, g1 = gb0 + LB * (wsub + 1) / wk;
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

		/* fused: the codes of our K range, in shared memory after the
		 * rings, made by this block's active warps (all with our K range:
		 * never wk > 1) */
		uint8_t *fcodes = dsmem + GV_BAR_BYTES + GV_WARPS * stages * SLOT;
		const uint32_t fstride = L * RAD_GROUP + 16u;   /* +16: rows on other banks */
		if constexpr (FQ != 0) {
			const uint32_t left = P.ntiles - RAD_BID_X() * GV_WARPS * NTW;
			const uint32_t nact = left >= GV_WARPS * NTW ? GV_WARPS : (left + NTW - 1) / NTW;
			if (P.x_fp16)
				gv_quant<1>(P, g0, L, fcodes, fstride, nact * 32u, fq_s, fq_inv, fq_nan, fq_red);
			else
				gv_quant<0>(P, g0, L, fcodes, fstride, nact * 32u, fq_s, fq_inv, fq_nan, fq_red);
		}

		const uint8_t *abase[NT];
#pragma unroll
		for (int it = 0; it < NT; it++) {
			uint32_t t = (uint32_t)it * 8u + (lane >> 2);
			t = t < P.m ? t : P.m - 1;      /* rows past m: a valid row, output dropped */
			abase[it] = FQ ? fcodes + (size_t)t * fstride + (lane & 3u) * 32u
				       : P.codes + (size_t)t * P.k + (lane & 3u) * 32u + (size_t)g0 * RAD_GROUP;
		}
		/* activations of group gi (clamped to the range), two named
		 * sets: the next group's load is in flight while one computes */
		afrag A0[NT], A1[NT];
		auto aload = [&](afrag (&a)[NT], uint32_t gi) {
			gi = gi < L ? gi : L - 1;
#pragma unroll
			for (int it = 0; it < NT; it++) {
				const uint8_t *ap = abase[it] + (size_t)gi * RAD_GROUP;
				if constexpr (FQ != 0) {
					a[it].lo = *(const rad_u4 *)ap;        /* shared memory */
					a[it].hi = *(const rad_u4 *)(ap + 16);
				} else {
					afrag_load(a[it], ap);
				}
			}
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

	/* wk > 1: the column's warps add their partials into its first warp's
	 * (in wsub order), through their rings (every copy into them has
	 * landed): [NTW][NT][4] floats a lane, lane-major */
	const bool lead = wsub == 0;
	if (wk > 1) {
		float *mine = (float *)(dsmem + GV_BAR_BYTES + warp * stages * SLOT);
		if (active && !lead)
#pragma unroll
			for (int j = 0; j < NTW; j++)
#pragma unroll
				for (int it = 0; it < NT; it++)
#pragma unroll
					for (int q = 0; q < 4; q++)
						mine[((j * NT + it) * 4 + q) * 32 + lane] = acc[j][it][q];
		RAD_SYNC();
		if (active && lead)
			for (uint32_t o = 1; o < wk; o++) {
				const float *other = (const float *)(dsmem + GV_BAR_BYTES + (warp + o) * stages * SLOT);
#pragma unroll
				for (int j = 0; j < NTW; j++)
#pragma unroll
					for (int it = 0; it < NT; it++)
#pragma unroll
						for (int q = 0; q < 4; q++)
							acc[j][it][q] += other[((j * NT + it) * 4 + q) * 32 + lane];
			}
		RAD_SYNC();
	}

	if (nsplit == 1) {
		/* y through shared memory: each column's first warp puts its
		 * bf16 outputs, [token][NTW x 16 n], in its own ring, then the
		 * block stores whole 16-byte pieces of each row, consecutive
		 * threads along n (y_store8) */
		constexpr uint32_t WN = NTW * RAD_TILE_N;           /* n of a warp */
		uint16_t *stg = (uint16_t *)(dsmem + GV_BAR_BYTES + warp * stages * SLOT);
		if (active && lead)
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
							stg[t * WN + j * RAD_TILE_N + r] =
								out_bf16(acc[j][it][q], FQ ? fq_s[t] : P.s[t], P.bias, n);
					}
		RAD_SYNC();
		constexpr uint32_t PW = WN / 8;                      /* pieces of a row: column */
		const uint32_t PB = cols * PW;                        /* and block */
		const uint32_t n0 = RAD_BID_X() * cols * WN, mt = P.m < (uint32_t)TOK ? P.m : (uint32_t)TOK;
		for (uint32_t idx = tid; idx < mt * PB; idx += GV_THREADS) {
			const uint32_t t = idx / PB, c = idx % PB, nb = n0 + c * 8;
			if (nb >= P.n)
				continue;
			const uint8_t *src = dsmem + GV_BAR_BYTES + (c / PW) * wk * stages * SLOT +
					     (t * WN + c % PW * 8) * sizeof(uint16_t);
			y_store8(P, t, nb, *(const rad_u4 *)src);
		}
		return;
	}

	/* global split-K: partials [split][m][n]; the last block of this block
	 * column (the same tiles, every split) sums them in split order
	 * (deterministic) and writes y */
	if (active && lead)
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
	const uint32_t bn = cols * NTW * RAD_TILE_N;
	splitk_fixup(P, RAD_BID_X() * bn, bn, nsplit, tid, GV_THREADS, FQ ? fq_s : P.s);
	if (tid == 0)
		P.counters[RAD_BID_X()] = 0;
}


static size_t gemv_smem(uint32_t ntw, uint32_t cg, uint32_t stages)
{
	return GV_BAR_BYTES + (size_t)GV_WARPS * stages * GV_SLOT(ntw, cg);
}

template <int TOK, int NTW, int CG, int FQ>
static void gemv_attr(void)
{
	static int set;
	if (!set) {
		cudaFuncSetAttribute(rad_w4a8_gemv<TOK, NTW, CG, FQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				     (int)(gemv_smem(NTW, CG, GV_MAX_STAGES) + (FQ ? RADIANCE_W4A8_FUSE_SMEM : 0)));
		cudaFuncSetAttribute(rad_w4a8_gemv<TOK, NTW, CG, FQ>, cudaFuncAttributePreferredSharedMemoryCarveout,
				     100);
		set = 1;
	}
}

/* resident blocks per SM of an instance at a ring depth (0: none fit); the
 * planner uses the unfused kernel's */
template <int TOK, int NTW, int CG>
static int gemv_occ(uint32_t stages)
{
	gemv_attr<TOK, NTW, CG, 0>();
	int nb = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, rad_w4a8_gemv<TOK, NTW, CG, 0>, GV_THREADS,
							  gemv_smem(NTW, CG, stages)) != cudaSuccess) {
		(void)cudaGetLastError();
		nb = 0;
	}
	return nb;
}

template <int TOK, int NTW, int CG, int FQ>
static void gemv_launch(const gemm_params &p, dim3 grid, uint32_t stages, uint32_t wk, hipStream_t st, int pdl)
{
	gemv_attr<TOK, NTW, CG, FQ>();
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute attr[1];
	attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	attr[0].val.programmaticStreamSerializationAllowed = 1;
	cfg.gridDim = grid;
	cfg.blockDim = dim3(GV_THREADS);
	/* fused: the codes of a block's K range after the rings */
	size_t smem = gemv_smem(NTW, CG, stages);
	if (FQ) {
		const uint32_t L = ceil_div(p.groups, grid.y);
		smem += (size_t)p.m * (L * RAD_GROUP + 16);
	}
	cfg.dynamicSmemBytes = smem;
	cfg.stream = st;
	cfg.attrs = attr;
	cfg.numAttrs = pdl ? 1 : 0;
	cudaLaunchKernelEx(&cfg, rad_w4a8_gemv<TOK, NTW, CG, FQ>, p, stages, wk);
}

typedef void (*gemv_launch_fn)(const gemm_params &p, dim3 grid, uint32_t stages, uint32_t wk, hipStream_t st,
			       int pdl);

/* the fused-quant launcher of an instance: 8-token tiles only */
template <int TOK, int NTW, int CG>
static constexpr gemv_launch_fn gemv_fused_fn(void)
{
	if constexpr (TOK == 8)
		return gemv_launch<TOK, NTW, CG, 1>;
	else
		return nullptr;
}

/* loads an instance's kernels (radiance__gpu_preload), attributes set */
template <int TOK, int NTW, int CG>
static int gemv_preload(unsigned *count)
{
	gemv_attr<TOK, NTW, CG, 0>();
	RAD_PRELOAD((rad_w4a8_gemv<TOK, NTW, CG, 0>), count);
	if constexpr (TOK == 8) {
		gemv_attr<TOK, NTW, CG, 1>();
		RAD_PRELOAD((rad_w4a8_gemv<TOK, NTW, CG, 1>), count);
	}
	return 0;
}

/* the instances of RADIANCE_W4A8_GEMV_INSTANCES, in its order */
struct gemv_inst {
	uint32_t tok, ntw, cg;
	int (*occ)(uint32_t stages);
	gemv_launch_fn launch, launch_fused;
	int (*preload)(unsigned *count);
};
#define GV_INST(T, N, C)                                                                            \
	{T, N, C, gemv_occ<T, N, C>, gemv_launch<T, N, C, 0>, gemv_fused_fn<T, N, C>(), gemv_preload<T, N, C>},
static const struct gemv_inst gemv_insts[] = {RADIANCE_W4A8_GEMV_INSTANCES(GV_INST)};
#undef GV_INST
#define GV_NINST (sizeof gemv_insts / sizeof gemv_insts[0])
static_assert(GV_NINST == RADIANCE_W4A8_GEMV_NINST, "RADIANCE_W4A8_GEMV_NINST");

static int gemv_find(uint32_t tok, uint32_t ntw, uint32_t cg)
{
	for (size_t i = 0; i < GV_NINST; i++)
		if (gemv_insts[i].tok == tok && gemv_insts[i].ntw == ntw && gemv_insts[i].cg == cg)
			return (int)i;
	return -1;
}

extern "C" int radiance__w4a8_gemv_blocks(unsigned inst, uint32_t stages)
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

int radiance__w4a8_gemv_preload(unsigned *count)
{
	for (size_t i = 0; i < GV_NINST; i++) {
		int rc = gemv_insts[i].preload(count);
		if (rc)
			return rc;
	}
	return 0;
}

int radiance__w4a8_gemv_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream,
			       int pdl)
{
	const int i = gemv_find(plan.tok, plan.ntw, plan.cg);
	/* wk warps of a block split K: 1, 2 or 4, never fused, every part of
	 * every split's K range non-empty */
	const uint32_t wk = plan.wk ? plan.wk : 1;
	if (i < 0 || plan.stages < 1 || plan.stages > GV_MAX_STAGES || (plan.fused && !gemv_insts[i].launch_fused) ||
	    GV_WARPS % wk || (wk > 1 && (plan.fused || (uint64_t)wk * plan.split > p.groups)))
		return -EINVAL;
	/* wk > 1: a warp's ring holds its fp32 partials for the column's sum */
	if (wk > 1 && !RADIANCE_W4A8_GEMV_RING_HOLDS_PARTIALS(plan.ntw, plan.cg, plan.tok, plan.stages))
		return -EINVAL;
	(plan.fused ? gemv_insts[i].launch_fused : gemv_insts[i].launch)(
		p, dim3(ceil_div(p.ntiles, GV_WARPS / wk * plan.ntw), plan.split, 1), plan.stages, wk, (hipStream_t)stream,
		pdl);
	return radiance__gpu_check_launch("w4a8 gemv kernel");
}

#endif
