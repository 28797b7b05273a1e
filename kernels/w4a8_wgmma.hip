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

/* cp.async of group gi into its stage: the activation tile (swizzled for
 * the B descriptor), the block's 8 weight tiles and their scales. */
template <int BT>
__device__ __forceinline__ void wg_load_stage(const wg_ctx &c, uint32_t gi)
{
	const uint32_t base = smem_addr(c.smem + (gi % WG_STAGES) * WG_STAGE(BT));
	const uint8_t *a = c.codes + (size_t)gi * RAD_GROUP;
	cp_async16(base + c.a_dst, a);
	cp_async16(base + c.a_dst + 4096, a + c.a_step[0]);
	cp_async16(base + c.a_dst + 8192, a + c.a_step[1]);
	if (BT > 96)
		cp_async16(base + c.a_dst + 12288, a + c.a_step[2]);
	const uint8_t *wp = c.w + (size_t)gi * c.w_gstride;
	cp_async16(base + WG_ACT(BT) + c.w_dst, wp);
	cp_async16(base + WG_ACT(BT) + c.w_dst + 4 * RAD_TILE_BYTES, wp + c.w_step);
	if (c.tid < 16)
		cp_async16(base + WG_ACT(BT) + c.s_dst, c.sc + (size_t)gi * c.s_gstride);
}

/* This warp's weights of group gi (from its stage) as wgmma A fragments,
 * and the two row scales (x 2^9) of its rows g and g + 8. */
template <int BT>
__device__ __forceinline__ void wg_unpack(const wg_ctx &c, uint32_t gi, uint32_t warp, uint32_t lane,
					  uint32_t (&A)[4][4], float &slo, float &shi)
{
	const uint8_t *st = c.smem + (gi % WG_STAGES) * WG_STAGE(BT) + WG_ACT(BT);
	const rad_u4 wa = *(const rad_u4 *)(st + warp * RAD_TILE_BYTES + lane * 16);
	const rad_u4 wb = *(const rad_u4 *)(st + warp * RAD_TILE_BYTES + 512 + lane * 16);
	const uint32_t sv = *(const uint32_t *)(st + WG_W_BYTES + warp * RAD_SCALE_BYTES + (lane >> 2) * 4);
	const uint32_t w0[4] = {wa.x, wa.y, wa.z, wa.w};
	const uint32_t w1[4] = {wb.x, wb.y, wb.z, wb.w};
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
#endif

template <int BT>
__global__ void __launch_bounds__(256, 1)
rad_w4a8_wgmma(const uint8_t *codes, const float *s, const uint8_t *w, const uint8_t *sc, const float *bias,
	       uint16_t *y, uint32_t m, uint32_t n, uint32_t k)
{
#ifdef RAD_WGMMA_OK
	extern __shared__ uint8_t smem_raw[];
	const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
	const uint32_t G = k / RAD_GROUP, ntiles = (n + 15) / 16;
	const uint32_t tok0 = blockIdx.x * BT;
	const uint32_t nt0 = blockIdx.y * (WG_BN / 16);
	const uint32_t nt = nt0 + warp;        /* warp w: rows 16w.. of the block */

	wg_ctx c;
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

	if (nt >= ntiles)
		return;
	const uint32_t g = lane >> 2, t4 = lane & 3u;
#pragma unroll
	for (int i = 0; i < BT / 2; i++) {
		const uint32_t row = nt * 16u + g + 8u * ((uint32_t)(i & 3) >> 1);
		const uint32_t tok = tok0 + (uint32_t)(i >> 2) * 8u + 2u * t4 + (uint32_t)(i & 1);
		if (row < n && tok < m) {
			const float b = bias ? bias[row] : 0.0f;
			y[(size_t)tok * n + row] = (uint16_t)rad_bf16_from_f32(__fadd_rn(__fmul_rn(acc[i], s[tok]), b));
		}
	}
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
					 WG_SMEM(96)) != cudaSuccess)
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
#endif
