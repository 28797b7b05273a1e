/*
 * W4A8 prefill on Hopper (sm_90a): wgmma m64n128k32 e4m3 with the int4
 * weights as the register A operand and the activation codes as the shared
 * memory B operand.
 *
 * Why this shape: the weights must be unpacked from int4 in registers anyway
 * (rad_unpack8, a few integer ops per 8 weights), and wgmma can take A from
 * registers in exactly the mma.sync fragment layout the decode kernel
 * already produces, so the device weight layout is the decode one and the
 * unpacked bytes never touch shared memory. The activations, already e4m3,
 * are the K-major B operand: a 128-token x 128-byte tile per group, copied
 * with cp.async into the 128-byte swizzled layout wgmma's descriptor reads.
 *
 * Block: 2 warpgroups, 128 weight rows (64 each) x 128 tokens, one 128-group
 * per k-step (4 wgmma k32 steps), 4 activation stages. Weights go straight
 * from global memory to registers two groups ahead (each weight is used by one
 * warp of the block only, so shared memory would add nothing). Per group the
 * four wgmmas accumulate into a fresh fp32 partial (scale-d = 0 on the first)
 * and the group's fp32 scale is applied right after, as numerics.h defines.
 * The grid runs token tiles fastest, so the token tiles of one weight tile
 * are in flight together: weights come from DRAM once, activations stay in L2.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "w4a8_dequant.h"
#include "w4a8_kernels.h"

extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);   /* gpu_runtime.hip */

#ifdef RAD_NVIDIA

#define WG_BT 128                      /* tokens per block of v1 */
#define WG_BN 128                      /* weight rows per block: 8 warps x 16 */
#define WG_STAGES 5
#define WG_ACT(BT) ((BT) * RAD_GROUP)                       /* 16 or 12 KiB, 128B-swizzled */
#define WG_W_BYTES ((WG_BN / 16) * RAD_TILE_BYTES)          /* 8 KiB: 8 weight tiles */
#define WG_STAGE(BT) (WG_ACT(BT) + WG_W_BYTES + 1024)       /* + scales (256 B), 1 KiB aligned */
#define WG_SMEM(BT) (WG_STAGES * WG_STAGE(BT) + 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RAD_WGMMA_OK 1
#endif

#ifdef RAD_WGMMA_OK
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
/* Pin a register's value at this point of the program (CUTLASS's
 * warpgroup_fence_operand): keeps the compiler from moving the unpack or the
 * scale FMAs into the window between wgmma.fence and wgmma.wait, which would
 * make ptxas inject extra warpgroup arrives (C7519) and serialise, and keeps
 * reads of an accumulator after the wait that completes it. */
__device__ __forceinline__ void pin(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }

/* K-major, 128-byte swizzle: 8 rows x 128 bytes per 1 KiB atom (SBO), LBO
 * unused (1), layout type 1 (bits 62-63). */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr)
{
	return (uint64_t)((addr >> 4) & 0x3FFFu) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
	       ((uint64_t)1 << 62);
}

/* wgmma m64nNk32 e4m3 x e4m3 -> f32, A from registers, B from a descriptor;
 * overloads for N = 128 and N = 96 (by the accumulator array's size). */
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		"{%64,%65,%66,%67}, %69, p, 1, 1;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc));
}

__device__ __forceinline__ void wgmma_rs(float (&d)[48], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %52, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, "
		"{%48,%49,%50,%51}, %53, p, 1, 1;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc));
}

/* Per-thread copy assignment, kept small (registers are scarce here): the
 * thread's activation chunks are rows r0 + 32i (i < 4), 16-byte column cc;
 * its weight chunks tile (tid >> 6) + 4i (i < 2), offset (tid & 63) * 16. */
struct wg_ctx {
	const uint8_t *codes;      /* row tok0 + r0 (clamped), column cc */
	const uint8_t *w;          /* this thread's first weight chunk, group 0 */
	const uint8_t *sc;         /* threads 0..15: a scale chunk, group 0 */
	uint8_t *smem;
	uint32_t a_dst, w_dst, s_dst;
	uint32_t a_step[3];        /* byte steps to rows r0+32, +64, +96 (clamped at m) */
	uint32_t stage_bytes, act_bytes;
	uint32_t w_step;           /* bytes to the second weight chunk's tile */
	uint32_t w_gstride, s_gstride;   /* bytes from one group to the next */
	uint32_t tid, G;
};

/* The block's copy assignment (wg_ctx) for tokens tok0.. and weight tiles
 * nt0.. of an m x n x k launch. */
__device__ __forceinline__ void wg_setup(wg_ctx &c, uint8_t *smem_raw, const uint8_t *codes, const uint8_t *w,
					 const uint8_t *sc, uint32_t m, uint32_t n, uint32_t k, uint32_t tid,
					 uint32_t tok0, uint32_t nt0)
{
	const uint32_t G = k / RAD_GROUP, ntiles = (n + 15) / 16;
	c.codes = codes;
	c.smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
	c.tid = tid;
	c.G = G;
	{
		/* rows r0 + 32i have the same (r & 7), so one swizzled column
		 * serves all four; rows past m read row m - 1 (outputs dropped) */
		const uint32_t r0 = tid >> 3, cc = tid & 7u;
		uint32_t t[4];
		for (int i = 0; i < 4; i++)
			t[i] = tok0 + r0 + 32u * i < m ? tok0 + r0 + 32u * i : m - 1;   /* t[3]: BT 128 only */
		c.codes = codes + (size_t)t[0] * k + cc * 16u;
		for (int i = 0; i < 3; i++)
			c.a_step[i] = (t[i + 1] - t[0]) * k;
		c.a_dst = r0 * 128u + ((cc ^ (r0 & 7u)) << 4);
	}
	{
		const uint32_t ti = tid >> 6, off = (tid & 63u) * 16u;
		const uint32_t t0 = nt0 + ti < ntiles ? nt0 + ti : ntiles - 1;
		const uint32_t t1 = nt0 + ti + 4 < ntiles ? nt0 + ti + 4 : ntiles - 1;
		/* [n_tile][group] layout: a tile's groups are 1 KiB apart */
		c.w = w + (size_t)t0 * G * RAD_TILE_BYTES + off;
		c.w_step = (t1 - t0) * G * RAD_TILE_BYTES;
		c.w_gstride = RAD_TILE_BYTES;
		c.s_gstride = RAD_SCALE_BYTES;
		c.w_dst = ti * RAD_TILE_BYTES + off;
	}
	{
		const uint32_t ti = (tid >> 1) & 7u, tile = nt0 + ti < ntiles ? nt0 + ti : ntiles - 1;
		c.sc = sc + (size_t)tile * G * RAD_SCALE_BYTES + (tid & 1u) * 16u;
		c.s_dst = WG_W_BYTES + ti * RAD_SCALE_BYTES + (tid & 1u) * 16u;
	}
}

/* cp.async of group gi into its stage: the activation tile (swizzled for
 * the B descriptor), the block's 8 weight tiles and their scales. */
template <int BT>
__device__ __forceinline__ void wg_load_stage(const wg_ctx &c, uint32_t gi)
{
	const uint32_t base = smem_addr(c.smem + (gi % WG_STAGES) * WG_STAGE(BT));
	const uint8_t *a = c.codes + (size_t)gi * RAD_GROUP;
	cp_async16(base + c.a_dst, a);
	cp_async16(base + c.a_dst + 4096, a + c.a_step[0]);
	if (BT > 64)
		cp_async16(base + c.a_dst + 8192, a + c.a_step[1]);
	if (BT > 96)
		cp_async16(base + c.a_dst + 12288, a + c.a_step[2]);
	const uint8_t *wp = c.w + (size_t)gi * c.w_gstride;
	cp_async16(base + WG_ACT(BT) + c.w_dst, wp);
	cp_async16(base + WG_ACT(BT) + c.w_dst + 4 * RAD_TILE_BYTES, wp + c.w_step);
	if (c.tid < 16)
		cp_async16(base + WG_ACT(BT) + c.s_dst, c.sc + (size_t)gi * c.s_gstride);
}

/* This warp's words of group gi from its stage: row g's (w0) and row
 * g + 8's (w1) of lane (g, t), and the packed f16 scales of both (sv). */
template <int BT>
__device__ __forceinline__ void wg_weights(const wg_ctx &c, uint32_t gi, uint32_t warp, uint32_t lane,
					   uint32_t (&w0)[4], uint32_t (&w1)[4], uint32_t &sv)
{
	const uint8_t *st = c.smem + (gi % WG_STAGES) * WG_STAGE(BT) + WG_ACT(BT);
	const rad_u4 wa = *(const rad_u4 *)(st + warp * RAD_TILE_BYTES + lane * 16);
	const rad_u4 wb = *(const rad_u4 *)(st + warp * RAD_TILE_BYTES + 512 + lane * 16);
	sv = *(const uint32_t *)(st + WG_W_BYTES + warp * RAD_SCALE_BYTES + (lane >> 2) * 4);
	w0[0] = wa.x, w0[1] = wa.y, w0[2] = wa.z, w0[3] = wa.w;
	w1[0] = wb.x, w1[1] = wb.y, w1[2] = wb.z, w1[3] = wb.w;
}

/* This warp's weights of group gi (from its stage) as wgmma A fragments,
 * and the two row scales (x 2^9) of its rows g and g + 8. */
template <int BT>
__device__ __forceinline__ void wg_unpack(const wg_ctx &c, uint32_t gi, uint32_t warp, uint32_t lane,
					  uint32_t (&A)[4][4], float &slo, float &shi)
{
	uint32_t w0[4], w1[4], sv;
	wg_weights<BT>(c, gi, warp, lane, w0, w1, sv);
#pragma unroll
	for (int j = 0; j < 4; j++) {
		rad_unpack8(w0[j], A[j][0], A[j][2]);
		rad_unpack8(w1[j], A[j][1], A[j][3]);
	}
	slo = rad_h2f(sv & 0xFFFFu) * RAD_WSCALE;
	shi = rad_h2f(sv >> 16) * RAD_WSCALE;
}

/* Issue group gi's four wgmmas into p (scale-d 0 on the first: a fresh
 * partial). Returns without waiting. */
template <int BT>
__device__ __forceinline__ void wg_issue(const wg_ctx &c, uint32_t gi, uint32_t (&A)[4][4], float (&p)[BT / 2])
{
	const uint32_t base = smem_addr(c.smem + (gi % WG_STAGES) * WG_STAGE(BT));
#pragma unroll
	for (int j = 0; j < 4; j++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			pin(A[j][i]);
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		pin(p[i]);
	wgmma_fence();
	wgmma_rs(p, A[0], desc_sw128(base), 0);
	wgmma_rs(p, A[1], desc_sw128(base + 32), 1);
	wgmma_rs(p, A[2], desc_sw128(base + 64), 1);
	wgmma_rs(p, A[3], desc_sw128(base + 96), 1);
	wgmma_commit();
}

template <int BT>
__device__ __forceinline__ void wg_scale_add(float (&acc)[BT / 2], float (&p)[BT / 2], float slo, float shi)
{
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		pin(p[i]);
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		acc[i] += p[i] * ((i & 2) ? shi : slo);
}

/* Step gi: wait for its stage, refill the stage group gi - 2 used (both
 * warpgroups finished with it before this barrier), unpack, issue the
 * wgmmas into p_cur, then -- while they run -- wait for group gi - 1 and
 * fold its partial p_prev into acc with its scales. */
template <int BT>
__device__ __forceinline__ void wg_step(const wg_ctx &c, uint32_t gi, uint32_t warp, uint32_t lane,
					uint32_t (&A)[4][4], float (&p_cur)[BT / 2], float &s_lo, float &s_hi,
					float (&p_prev)[BT / 2], float prev_lo, float prev_hi, float (&acc)[BT / 2])
{
	cp_async_wait<WG_STAGES - 3>();
	fence_proxy_async();
	__syncthreads();
	if (gi + WG_STAGES - 2 < c.G)
		wg_load_stage<BT>(c, gi + WG_STAGES - 2);
	cp_async_commit();
	wg_unpack<BT>(c, gi, warp, lane, A, s_lo, s_hi);
	wg_issue<BT>(c, gi, A, p_cur);
	wgmma_wait<1>();
	wg_scale_add<BT>(acc, p_prev, prev_lo, prev_hi);
}
/* Accumulator i of lane's thread in warp tile nt (wgmma m64nN f32 D): the
 * weight row and the token within the block. */
__device__ __forceinline__ void wg_acc_coord(int i, uint32_t nt, uint32_t lane, uint32_t &row, uint32_t &tok)
{
	row = nt * 16u + (lane >> 2) + 8u * ((uint32_t)(i & 3) >> 1);
	tok = (uint32_t)(i >> 2) * 8u + 2u * (lane & 3u) + (uint32_t)(i & 1);
}

/* The epilogue: y = bf16(acc * s[token] + bias[row]) for warp tile nt's
 * rows (16 of them) and the block's tokens tok0.., within m x n. */
template <int BT>
__device__ __forceinline__ void wg_store(const float (&acc)[BT / 2], const float *s, const float *bias, uint16_t *y,
					 uint32_t m, uint32_t n, uint32_t tok0, uint32_t nt, uint32_t lane)
{
	if (nt * 16u >= n)
		return;
#pragma unroll
	for (int i = 0; i < BT / 2; i++) {
		uint32_t row, tok;
		wg_acc_coord(i, nt, lane, row, tok);
		tok += tok0;
		if (row < n && tok < m) {
			const float b = bias ? bias[row] : 0.0f;
			y[(size_t)tok * n + row] = (uint16_t)rad_bf16_from_f32(__fadd_rn(__fmul_rn(acc[i], s[tok]), b));
		}
	}
}
#endif

template <int BT>
__global__ void __launch_bounds__(256, 1)
rad_w4a8_wgmma(const uint8_t *codes, const float *s, const uint8_t *w, const uint8_t *sc, const float *bias,
	       uint16_t *y, uint32_t m, uint32_t n, uint32_t k)
{
#ifdef RAD_WGMMA_OK
	extern __shared__ uint8_t smem_raw[];
	const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
	const uint32_t G = k / RAD_GROUP;
	const uint32_t tok0 = blockIdx.x * BT;
	const uint32_t nt0 = blockIdx.y * (WG_BN / 16);   /* warp w: rows 16w.. of the block */

	wg_ctx c;
	wg_setup(c, smem_raw, codes, w, sc, m, n, k, tid, tok0, nt0);

#pragma unroll
	for (uint32_t st = 0; st < WG_STAGES - 2; st++) {
		if (st < G)
			wg_load_stage<BT>(c, st);
		cp_async_commit();
	}

	float acc[BT / 2], p0[BT / 2], p1[BT / 2];
	uint32_t A0[4][4], A1[4][4];
	float s0lo, s0hi, s1lo = 0.f, s1hi = 0.f;
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		acc[i] = 0.f;
	/* group 0 has no predecessor to fold in */
	cp_async_wait<WG_STAGES - 3>();
	fence_proxy_async();
	__syncthreads();
	if (WG_STAGES - 2 < G)
		wg_load_stage<BT>(c, WG_STAGES - 2);
	cp_async_commit();
	wg_unpack<BT>(c, 0, warp, lane, A0, s0lo, s0hi);
	wg_issue<BT>(c, 0, A0, p0);
	uint32_t gi = 1;
	for (; gi + 1 < G; gi += 2) {
		wg_step<BT>(c, gi, warp, lane, A1, p1, s1lo, s1hi, p0, s0lo, s0hi, acc);
		wg_step<BT>(c, gi + 1, warp, lane, A0, p0, s0lo, s0hi, p1, s1lo, s1hi, acc);
	}
	if (gi < G) {
		wg_step<BT>(c, gi, warp, lane, A1, p1, s1lo, s1hi, p0, s0lo, s0hi, acc);
		wgmma_wait<0>();
		wg_scale_add<BT>(acc, p1, s1lo, s1hi);
	} else {
		wgmma_wait<0>();
		wg_scale_add<BT>(acc, p0, s0lo, s0hi);
	}
	cp_async_wait<0>();

	wg_store<BT>(acc, s, bias, y, m, n, tok0, nt0 + warp, lane);
#else
	__trap();
#endif
}

/*
 * The exact prefill (prefill = exact on sm_90a): the same block, copies and
 * weight fragments as above, with wgmma m64nBTk16 f16 x f16 -> f32. Every
 * int4 weight and every e4m3 activation is an f16 value and the products of
 * two of them are exact, so this path is held to the fp32 contract like the
 * mma.sync ones (docs/numerics.md "Contract").
 *
 * The B operand must be f16 in shared memory, so each group's codes are
 * converted once per block (not once per warp, as the tiled kernel does) from
 * their cp.async stage into one of three f16 tiles, while the previous group's
 * wgmmas run. The f16 tile of a group is [k half][token][128 B], each half
 * 128-byte swizzled like the fp8 tile, and f16 step s (k16) of the group sits
 * at half s / 4, byte (s % 4) * 32 of each row. Which k it holds follows
 * from the A fragment: rad_unpack8_f16 of lane (g, t)'s word j gives the pairs
 * k = 32t + 8j + {0,1 | 2,3 | 4,5 | 6,7}; step s = 2j + e takes pairs 2e and
 * 2e + 1 as a0/a1 and a2/a3, so B position p (0..7) of step s must hold the
 * natural pair 16 (p & 3) + 4j + 2e + (p >> 2). In the WGMMA code order those
 * are the low halves of the four code words of 16-byte chunk s, then their
 * high halves: the conversion is local to one chunk (wgx_convert).
 *
 * A group's A fragments are 32 registers (twice the fp8 ones), so there is
 * one fp32 partial: group g's partial is folded into acc (times its scale)
 * just before group g + 1's wgmmas are issued into the same registers, while
 * group g + 1's weights are unpacked into the other A set beforehand. BT is
 * 128 or 64 tokens a block (the band, m <= 64). With a global split (grid z,
 * one token block), block z takes groups [z G / S, (z + 1) G / S), writes its
 * fp32 sums to the partials [split][m][n], and the last block of a 128-row
 * column adds them in split order and stores y (splitk_fixup, as the decode
 * kernels do).
 */
#define WGX_FBUF 3                                          /* f16 tiles */
#define WGX_F16(BT) ((BT) * RAD_GROUP * 2)                  /* 32 or 16 KiB */
#define WGX_SMEM(BT) (WG_STAGES * WG_STAGE(BT) + WGX_FBUF * WGX_F16(BT) + 1024)

#ifdef RAD_WGMMA_OK
/* wgmma m64n128k16 / m64n64k16 f16 x f16 -> f32, A from registers, B K-major
 * (no transpose) from a descriptor */
__device__ __forceinline__ void wgmma_rs_f16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		"{%64,%65,%66,%67}, %69, p, 1, 1, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc));
}

__device__ __forceinline__ void wgmma_rs_f16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
		"{%32,%33,%34,%35}, %37, p, 1, 1, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc));
}

/* This warp's weights of group gi as f16 A fragments of the group's 8 k16
 * steps, and the row scales of rows g and g + 8 (the int4 values are the
 * integers themselves here: no RAD_WSCALE). */
template <int BT>
__device__ __forceinline__ void wgx_unpack(const wg_ctx &c, uint32_t gi, uint32_t warp, uint32_t lane,
					   uint32_t (&A)[8][4], float &slo, float &shi)
{
	uint32_t w0[4], w1[4], sv;
	wg_weights<BT>(c, gi, warp, lane, w0, w1, sv);
#pragma unroll
	for (int j = 0; j < 4; j++) {
		uint32_t hg[4], h8[4];
		rad_unpack8_f16(w0[j], hg);
		rad_unpack8_f16(w1[j], h8);
#pragma unroll
		for (int e = 0; e < 2; e++) {
			A[2 * j + e][0] = hg[2 * e];
			A[2 * j + e][1] = h8[2 * e];
			A[2 * j + e][2] = hg[2 * e + 1];
			A[2 * j + e][3] = h8[2 * e + 1];
		}
	}
	slo = rad_h2f(sv & 0xFFFFu);
	shi = rad_h2f(sv >> 16);
}

/* Group gi's codes (its stage, WGMMA order, swizzled) -> f16 tile F. Thread
 * tid converts token tid % BT, chunks (tid / BT) * Q .. + Q - 1 (Q = 8 BT /
 * 256); chunk s gives f16 step s: 8 low-half pairs then 8 high-half pairs. */
template <int BT>
__device__ __forceinline__ void wgx_convert(const wg_ctx &c, uint32_t gi, uint8_t *F)
{
	constexpr uint32_t Q = 8u * BT / 256u;
	const uint8_t *st = c.smem + (gi % WG_STAGES) * WG_STAGE(BT);
	const uint32_t r = c.tid % BT, x = r & 7u;
#pragma unroll
	for (uint32_t q = 0; q < Q; q++) {
		const uint32_t ch = (c.tid / BT) * Q + q;
		const rad_u4 v = *(const rad_u4 *)(st + r * 128u + ((ch ^ x) << 4));
		rad_u4 lo, hi;
		e4m3x4_to_f16(v.x, lo.x, hi.x);
		e4m3x4_to_f16(v.y, lo.y, hi.y);
		e4m3x4_to_f16(v.z, lo.z, hi.z);
		e4m3x4_to_f16(v.w, lo.w, hi.w);
		uint8_t *row = F + (ch >> 2) * (BT * 128u) + r * 128u;
		*(rad_u4 *)(row + (((2u * (ch & 3u)) ^ x) << 4)) = lo;
		*(rad_u4 *)(row + (((2u * (ch & 3u) + 1u) ^ x) << 4)) = hi;
	}
}

/* Step gi: wait for group gi + 1's stage, refill the stage group gi - 1 used,
 * unpack gi's weights (group gi - 1's wgmmas still running), fold gi - 1's
 * partial, issue gi's 8 wgmmas on its f16 tile, and -- while they run --
 * convert group gi + 1's codes into the next f16 tile. After the barrier
 * every thread has waited for group gi - 2's wgmmas, the last readers of
 * the tile group gi + 1 goes to. */
template <int BT>
__device__ __forceinline__ void wgx_step(const wg_ctx &c, uint32_t gi, uint32_t warp, uint32_t lane, uint8_t *F,
					 uint32_t (&A)[8][4], float &s_lo, float &s_hi, float prev_lo, float prev_hi,
					 float (&p)[BT / 2], float (&acc)[BT / 2])
{
	cp_async_wait<WG_STAGES - 3>();
	__syncthreads();
	if (gi + WG_STAGES - 1 < c.G)
		wg_load_stage<BT>(c, gi + WG_STAGES - 1);
	cp_async_commit();
	wgx_unpack<BT>(c, gi, warp, lane, A, s_lo, s_hi);
	if (gi > 0) {
		wgmma_wait<0>();
		wg_scale_add<BT>(acc, p, prev_lo, prev_hi);
	}
	const uint32_t base = smem_addr(F + (gi % WGX_FBUF) * WGX_F16(BT));
#pragma unroll
	for (int j = 0; j < 8; j++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			pin(A[j][i]);
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		pin(p[i]);
	wgmma_fence();
#pragma unroll
	for (uint32_t st = 0; st < 8; st++)
		wgmma_rs_f16(p, A[st], desc_sw128(base + (st >> 2) * (BT * 128u) + (st & 3u) * 32u), st > 0);
	wgmma_commit();
	if (gi + 1 < c.G) {
		wgx_convert<BT>(c, gi + 1, F + ((gi + 1) % WGX_FBUF) * WGX_F16(BT));
		fence_proxy_async();
	}
}
#endif

template <int BT>
__global__ void __launch_bounds__(256, 1) rad_w4a8_wgmma_exact(const gemm_params P, uint32_t split)
{
#ifdef RAD_WGMMA_OK
	extern __shared__ uint8_t smem_raw[];
	__shared__ uint32_t last_block;
	const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
	const uint32_t tok0 = blockIdx.x * BT;
	const uint32_t nt0 = blockIdx.y * (WG_BN / 16);
	/* this split's groups [g0, g1): non-empty while split <= G */
	const uint32_t g0 = blockIdx.z * P.groups / split, g1 = (blockIdx.z + 1) * P.groups / split;

	wg_ctx c;
	wg_setup(c, smem_raw, P.codes, (const uint8_t *)P.w, P.sc, P.m, P.n, P.k, tid, tok0, nt0);
	c.codes += (size_t)g0 * RAD_GROUP;
	c.w += (size_t)g0 * c.w_gstride;
	c.sc += (size_t)g0 * c.s_gstride;
	c.G = g1 - g0;
	uint8_t *F = c.smem + WG_STAGES * WG_STAGE(BT);

	/* groups 0 .. STAGES - 2 in flight; group 0 converted before the loop */
#pragma unroll
	for (uint32_t st = 0; st < WG_STAGES - 1; st++) {
		if (st < c.G)
			wg_load_stage<BT>(c, st);
		cp_async_commit();
	}
	cp_async_wait<WG_STAGES - 2>();
	__syncthreads();
	wgx_convert<BT>(c, 0, F);
	fence_proxy_async();

	float acc[BT / 2], p[BT / 2];
	uint32_t A0[8][4], A1[8][4];
	float s0lo = 0.f, s0hi = 0.f, s1lo = 0.f, s1hi = 0.f;
#pragma unroll
	for (int i = 0; i < BT / 2; i++)
		acc[i] = p[i] = 0.f;
	uint32_t gi = 0;
	for (; gi + 1 < c.G; gi += 2) {
		wgx_step<BT>(c, gi, warp, lane, F, A0, s0lo, s0hi, s1lo, s1hi, p, acc);
		wgx_step<BT>(c, gi + 1, warp, lane, F, A1, s1lo, s1hi, s0lo, s0hi, p, acc);
	}
	if (gi < c.G)
		wgx_step<BT>(c, gi, warp, lane, F, A0, s0lo, s0hi, s1lo, s1hi, p, acc);
	wgmma_wait<0>();
	if (c.G & 1u)
		wg_scale_add<BT>(acc, p, s0lo, s0hi);
	else
		wg_scale_add<BT>(acc, p, s1lo, s1hi);
	cp_async_wait<0>();
	const uint32_t nt = nt0 + warp;
	if (split == 1) {
		/* y = bf16(acc * s + bias), row t at y_row(P, t) (y_rows too) */
#pragma unroll
		for (int i = 0; i < BT / 2; i++) {
			uint32_t row, tok;
			wg_acc_coord(i, nt, lane, row, tok);
			tok += tok0;
			if (row < P.n && tok < P.m)
				y_row(P, tok)[row] = out_bf16(acc[i], P.s[tok], P.bias, row);
		}
		return;
	}
	/* global split-K (one token block): this split's sums, then the last
	 * block of the 128-row column adds them up and stores y */
#pragma unroll
	for (int i = 0; i < BT / 2; i++) {
		uint32_t row, tok;   /* one token block: tok0 = 0 */
		wg_acc_coord(i, nt, lane, row, tok);
		if (row < P.n && tok < P.m)
			P.partials[((size_t)blockIdx.z * P.m + tok) * P.n + row] = acc[i];
	}
	__threadfence();
	__syncthreads();
	if (tid == 0)
		last_block = atomicAdd(&P.counters[blockIdx.y], 1u) == split - 1;
	__syncthreads();
	if (!last_block)
		return;
	__threadfence();
	splitk_fixup(P, blockIdx.y * WG_BN, WG_BN, split, tid, 256, P.s);
	if (tid == 0)
		P.counters[blockIdx.y] = 0;
#else
	__trap();
#endif
}

__global__ void rad_wgmma_probe_kernel(int *out)
{
#ifdef RAD_WGMMA_OK
	*out = 1;
#else
	*out = 0;
#endif
}

extern "C" int radiance__wgmma_probe(int *usable)
{
	int *d = NULL, h = 0;
	*usable = 0;
	if (cudaMalloc(&d, sizeof(int)) != cudaSuccess)
		return -EIO;
	rad_wgmma_probe_kernel<<<1, 1>>>(d);
	cudaError_t e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
	cudaFree(d);
	if (e != cudaSuccess)
		return -EIO;
	*usable = h;
	return 0;
}

static int wgmma_attr(void)
{
	static int attr_set;
	if (!attr_set) {
		if (cudaFuncSetAttribute(rad_w4a8_wgmma<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 WG_SMEM(128)) != cudaSuccess ||
		    cudaFuncSetAttribute(rad_w4a8_wgmma<96>, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 WG_SMEM(96)) != cudaSuccess ||
		    cudaFuncSetAttribute(rad_w4a8_wgmma_exact<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 WGX_SMEM(128)) != cudaSuccess ||
		    cudaFuncSetAttribute(rad_w4a8_wgmma_exact<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 WGX_SMEM(64)) != cudaSuccess)
			return radiance__gpu_check_launch("wgmma shared memory attribute");
		attr_set = 1;
	}
	return 0;
}

/* only where radiance__wgmma_probe found the kernel usable */
extern "C" int radiance__w4a8_wgmma_preload(unsigned *count)
{
	int rc = wgmma_attr();
	if (rc)
		return rc;
	RAD_PRELOAD(rad_w4a8_wgmma<128>, count);
	RAD_PRELOAD(rad_w4a8_wgmma<96>, count);
	RAD_PRELOAD(rad_w4a8_wgmma_exact<128>, count);
	RAD_PRELOAD(rad_w4a8_wgmma_exact<64>, count);
	return 0;
}

extern "C" int radiance__w4a8_wgmma_launch(const uint8_t *codes, const float *s, const void *w, const void *sc,
					   const float *bias, uint16_t *y, uint32_t m, uint32_t n, uint32_t k,
					   uint32_t tile, void *stream)
{
	int arc = wgmma_attr();
	if (arc)
		return arc;
	/* the token tile is the planner's (w4a8_plan.c: 96 when 128-token tiles
	 * leave SMs idle) */
	if (tile == 96) {
		dim3 g96((m + 95) / 96, (n + WG_BN - 1) / WG_BN);
		rad_w4a8_wgmma<96><<<g96, 256, WG_SMEM(96), (cudaStream_t)stream>>>(
			codes, s, (const uint8_t *)w, (const uint8_t *)sc, bias, y, m, n, k);
		return radiance__gpu_check_launch("w4a8 wgmma kernel (n96)");
	}
	dim3 grid((m + WG_BT - 1) / WG_BT, (n + WG_BN - 1) / WG_BN);
	rad_w4a8_wgmma<128><<<grid, 256, WG_SMEM(128), (cudaStream_t)stream>>>(
		codes, s, (const uint8_t *)w, (const uint8_t *)sc, bias, y, m, n, k);
	return radiance__gpu_check_launch("w4a8 wgmma kernel");
}

int radiance__w4a8_wgmma_exact_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream)
{
	int arc = wgmma_attr();
	if (arc)
		return arc;
	const uint32_t S = plan.split ? plan.split : 1u;
	if ((plan.tok != 64 && plan.tok != 128) || S > p.groups || (S > 1 && (p.m > plan.tok || !p.partials)))
		return radiance__gpu_fail_text(-EINVAL, "wgmma-exact launch: %u-token tiles, split %u, for %u x %u x %u",
					       plan.tok, S, p.m, p.n, p.k);
	dim3 grid((p.m + plan.tok - 1) / plan.tok, (p.n + WG_BN - 1) / WG_BN, S);
	if (plan.tok == 64)
		rad_w4a8_wgmma_exact<64><<<grid, 256, WGX_SMEM(64), (cudaStream_t)stream>>>(p, S);
	else
		rad_w4a8_wgmma_exact<128><<<grid, 256, WGX_SMEM(128), (cudaStream_t)stream>>>(p, S);
	return radiance__gpu_check_launch("w4a8 wgmma kernel (exact)");
}

#else /* AMD: no wgmma */

extern "C" int radiance__wgmma_probe(int *usable)
{
	*usable = 0;
	return 0;
}

extern "C" int radiance__w4a8_wgmma_preload(unsigned *count)
{
	(void)count;
	return 0;
}

extern "C" int radiance__w4a8_wgmma_launch(const uint8_t *codes, const float *s, const void *w, const void *sc,
					   const float *bias, uint16_t *y, uint32_t m, uint32_t n, uint32_t k,
					   uint32_t tile, void *stream)
{
	return -ENOTSUP;
}

int radiance__w4a8_wgmma_exact_launch(const gemm_params &p, const struct radiance__w4a8_plan &plan, void *stream)
{
	return -ENOTSUP;
}
#endif
