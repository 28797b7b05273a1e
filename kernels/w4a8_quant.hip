/*
 * Per-token activation quantization to e4m3 (numerics.h), one block per row.
 *
 * The codes must equal the CPU's bit for bit, so nothing here depends on the
 * vendor's float behaviour: amax is the integer maximum of the |x| bit
 * patterns (monotonic for finite floats, immune to denormal flushing), s and
 * 1/s are correctly rounded divisions, x * (1/s) is one correctly rounded
 * multiply (never fused), and the e4m3 conversion is integer code
 * (rad_e4m3_from_f32). A row holding Inf or NaN gets s = NaN and codes 0x7F.
 *
 * A row of at most QUANT_ONCE_BYTES is read once: every thread issues all of
 * its 16-byte loads at once into registers, takes its amax from them and,
 * once the block knows the scale, quantizes the same registers (each thread
 * codes exactly the pieces it loaded, so the row needs no shared-memory
 * staging). Rows read in place from registered host memory (the daemon's
 * zero-copy launches) cost one PCIe round trip this way, not one per
 * unrolled step of an amax pass and again of a quantize pass. Longer rows
 * take two passes over x (the second mostly from L2).
 *
 * The rows come from a list of sources (radiance__gpu_quant_rows): block r
 * finds the source holding stacked row r, so one launch reads several
 * requests' rows where they lie.
 */
#include <errno.h>

#include "w4a8_quant.h"

extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);   /* gpu_runtime.hip */

/* threads per row: 256, or 1024 for a few long rows (decode): one block per
 * row is then latency-bound on its loads (~10 us for k = 17408 at 256) */
#define QUANT_THREADS 256
#define QUANT_THREADS_WIDE 1024
/* rows of up to this many bytes (k <= 24576) are read once: 3 pieces of 16
 * bytes a thread at 1024 threads; many rows (prefill) take 256 threads of
 * 4 pieces up to k = 8192 and 512 threads of 6 above (12 pieces at 256
 * spilled in the fp16 build for sm_90a) */
#define QUANT_ONCE_BYTES (48u << 10)
#define QUANT_ONCE_PIECES(T) (QUANT_ONCE_BYTES / 16 / (T))
#define QUANT_THREADS_MID 512
#define QUANT_SHORT_PIECES 4

/* The source of stacked row `row`: sources are taken in order, m[i] rows
 * each. Unrolled with constant indices so the list stays in the kernel's
 * parameter space (a computed index would copy it to the stack). */
__device__ __forceinline__ const uint16_t *quant_row_src(const struct radiance__gpu_quant_src &S, uint32_t row,
							  uint32_t k)
{
	const void *p = S.x[0];
	uint32_t r = row;
	bool found = r < S.m[0];
#pragma unroll
	for (int i = 1; i < RADIANCE__GPU_QUANT_SRC_MAX; i++) {
		if (!found) {
			r -= S.m[i - 1];
			p = S.x[i];
			found = r < S.m[i];
		}
	}
	return (const uint16_t *)p + (size_t)r * k;
}

/* The block's amax and bad flags reduced (within each warp, then across
 * the warps: two barriers); thread 0 stores the row's scale. Every thread
 * gets 1/s and whether the row holds Inf or NaN. */
template <int T>
__device__ __forceinline__ float quant_scale(uint32_t amax, uint32_t bad, float *s, uint32_t row, bool &nan_row)
{
	RAD_NO_CONTRACT
	constexpr uint32_t W = T / 32;
	__shared__ uint32_t red_max[W];
	__shared__ uint32_t red_bad[W];
	__shared__ float row_inv;
	__shared__ uint32_t row_bad;
	const uint32_t tid = RAD_TID();
	amax = rad_warp_max_u32(amax);
	bad = rad_warp_or_u32(bad);
	if (tid % 32 == 0) {
		red_max[tid / 32] = amax;
		red_bad[tid / 32] = bad;
	}
	RAD_SYNC();
	if (tid < 32) {
		amax = rad_warp_max_u32(tid < W ? red_max[tid] : 0u);
		bad = rad_warp_or_u32(tid < W ? red_bad[tid] : 0u);
		if (tid == 0) {
			float sc, inv;
			quant_row_scale(amax, bad, sc, inv);
			s[row] = sc;
			row_inv = inv;
			row_bad = bad;
		}
	}
	RAD_SYNC();
	nan_row = row_bad != 0;
	return row_inv;
}

/* U > 0: rows of at most U * T pieces of 16 bytes, read once into
 * registers. U == 0: any k, two passes over x. */
template <int FP16, int ORDER, int T, int U>
__global__ void __launch_bounds__(T)
rad_quant_rows(struct radiance__gpu_quant_src S, uint32_t k, uint8_t *codes, float *s)
{
	/* the GEMM that follows may start now and prefetch its weights; it
	 * waits for this grid to finish before it reads a code */
	rad_grid_launch();
	const uint32_t tid = RAD_TID();
	const uint32_t row = RAD_BID_X();
	const uint16_t *xr = quant_row_src(S, row, k);
	uint8_t *cr = codes + (size_t)row * k;
	const uint32_t pieces = k / 8;
	uint32_t amax = 0, bad = 0;
	bool nan_row;

	if constexpr (U > 0) {
		rad_u4 v[U];
		/* every load of the row in flight before the first is used */
#pragma unroll
		for (int u = 0; u < U; u++) {
			const uint32_t p = tid + (uint32_t)u * T;
			v[u] = p < pieces ? rad_ld16(xr + (size_t)p * 8) : rad_u4{0, 0, 0, 0};
		}
#pragma unroll
		for (int u = 0; u < U; u++)
			quant_amax<FP16>(v[u], amax, bad);   /* zero padding leaves amax and bad alone */
		const float inv = quant_scale<T>(amax, bad, s, row, nan_row);
#pragma unroll
		for (int u = 0; u < U; u++) {
			const uint32_t p = tid + (uint32_t)u * T;
			if (p < pieces)
				quant_store<FP16, ORDER>(v[u], inv, nan_row, p * 8, cr);
		}
	} else {
#pragma unroll 4
		for (uint32_t p = tid; p < pieces; p += T)
			quant_amax<FP16>(rad_ld16(xr + (size_t)p * 8), amax, bad);
		const float inv = quant_scale<T>(amax, bad, s, row, nan_row);
#pragma unroll 2
		for (uint32_t p = tid; p < pieces; p += T)
			quant_store<FP16, ORDER>(rad_ld16(xr + (size_t)p * 8), inv, nan_row, p * 8, cr);
	}
}

template <int F, int O, int T, int U>
static void quant_launch1(const struct radiance__gpu_quant_src &S, uint32_t m, uint32_t k, uint8_t *codes, float *s,
			  hipStream_t st)
{
	hipLaunchKernelGGL((rad_quant_rows<F, O, T, U>), dim3(m), dim3(T), 0, st, S, k, codes, s);
}

template <int F, int O>
static void quant_launch(const struct radiance__gpu_quant_src &S, uint32_t m, uint32_t k, uint8_t *codes, float *s,
			 hipStream_t st)
{
	const uint32_t pieces = k / 8;
	if (m <= 64 && k >= 4096) {
		if (pieces <= QUANT_ONCE_PIECES(QUANT_THREADS_WIDE) * QUANT_THREADS_WIDE)
			quant_launch1<F, O, QUANT_THREADS_WIDE, QUANT_ONCE_PIECES(QUANT_THREADS_WIDE)>(S, m, k, codes, s, st);
		else
			quant_launch1<F, O, QUANT_THREADS_WIDE, 0>(S, m, k, codes, s, st);
	} else if (pieces <= QUANT_SHORT_PIECES * QUANT_THREADS) {
		quant_launch1<F, O, QUANT_THREADS, QUANT_SHORT_PIECES>(S, m, k, codes, s, st);
	} else if (pieces <= QUANT_ONCE_PIECES(QUANT_THREADS_MID) * QUANT_THREADS_MID) {
		quant_launch1<F, O, QUANT_THREADS_MID, QUANT_ONCE_PIECES(QUANT_THREADS_MID)>(S, m, k, codes, s, st);
	} else {
		quant_launch1<F, O, QUANT_THREADS, 0>(S, m, k, codes, s, st);
	}
}

template <int F, int O>
static int quant_preload_order(unsigned *count)
{
	RAD_PRELOAD((rad_quant_rows<F, O, QUANT_THREADS_WIDE, QUANT_ONCE_PIECES(QUANT_THREADS_WIDE)>), count);
	RAD_PRELOAD((rad_quant_rows<F, O, QUANT_THREADS_WIDE, 0>), count);
	RAD_PRELOAD((rad_quant_rows<F, O, QUANT_THREADS, QUANT_SHORT_PIECES>), count);
	RAD_PRELOAD((rad_quant_rows<F, O, QUANT_THREADS_MID, QUANT_ONCE_PIECES(QUANT_THREADS_MID)>), count);
	RAD_PRELOAD((rad_quant_rows<F, O, QUANT_THREADS, 0>), count);
	return 0;
}

/* Codes made elsewhere (radiance__gpu_codes_reorder): natural [m][k] e4m3
 * into the WGMMA order, one thread per 8-byte piece, the permutation of
 * quant_store. */
__global__ void __launch_bounds__(256) rad_codes_wgmma_order(const uint8_t *in, uint8_t *out, uint64_t pieces)
{
	const uint64_t p = (uint64_t)RAD_BID_X() * 256 + RAD_TID();
	if (p >= pieces)
		return;
	const uint2 v = *(const uint2 *)(in + p * 8);
	/* natural words 8t+2j and 8t+2j+1 of the group -> 8j+t, 8j+4+t */
	const uint32_t q = (uint32_t)(p % (RAD_GROUP / 8)), t = q >> 2, j = q & 3u;
	uint32_t *gw = (uint32_t *)(out + (p - q) * 8);
	gw[j * 8 + t] = v.x;
	gw[j * 8 + 4 + t] = v.y;
}

/* every variant quant_launch picks from (keep the two in step) */
extern "C" int radiance__gpu_quant_preload(unsigned *count)
{
	RAD_PRELOAD(rad_codes_wgmma_order, count);
	int rc = quant_preload_order<0, 0>(count);
	if (!rc)
		rc = quant_preload_order<1, 0>(count);
	if (!rc)
		rc = quant_preload_order<0, 1>(count);
	if (!rc)
		rc = quant_preload_order<1, 1>(count);
	return rc;
}

extern "C" int radiance__gpu_quant_rows(const struct radiance__gpu_quant_src *src, enum radiance_dtype dtype,
					uint32_t k, enum radiance__codes_order order, uint8_t *codes, float *s,
					void *stream)
{
	if (k % 8 || (dtype != RADIANCE_DTYPE_BF16 && dtype != RADIANCE_DTYPE_FP16) ||
	    (order == RADIANCE_CODES_WGMMA && k % RAD_GROUP))
		return radiance__gpu_fail_text(-EINVAL, "quant: k %u, dtype %d, order %d (k %% 8, bf16/fp16, "
					       "k %% 128 for the wgmma order)", k, (int)dtype, (int)order);
	if (src->n > RADIANCE__GPU_QUANT_SRC_MAX)
		return radiance__gpu_fail_text(-EINVAL, "quant: %u sources (at most %u)", src->n,
					       RADIANCE__GPU_QUANT_SRC_MAX);
	/* the kernel walks the list up to the source of its row: unused
	 * entries hold 0 rows, so a row past the sum cannot be reached */
	struct radiance__gpu_quant_src S = {};
	uint64_t m = 0;
	for (uint32_t i = 0; i < src->n; i++) {
		if ((uintptr_t)src->x[i] & 15)
			return radiance__gpu_fail_text(-EINVAL, "quant: source %u at %p is not 16-byte aligned", i,
						       src->x[i]);
		S.x[i] = src->x[i];
		S.m[i] = src->m[i];
		m += src->m[i];
	}
	S.n = src->n;
	if (m == 0)
		return 0;
	if (m > 0x7FFFFFFFu)
		return radiance__gpu_fail_text(-EINVAL, "quant: %llu rows in one launch", (unsigned long long)m);
	hipStream_t st = (hipStream_t)stream;
	const int fp16 = dtype == RADIANCE_DTYPE_FP16;
	if (order == RADIANCE_CODES_WGMMA) {
		if (fp16) quant_launch<1, 1>(S, (uint32_t)m, k, codes, s, st);
		else quant_launch<0, 1>(S, (uint32_t)m, k, codes, s, st);
	} else {
		if (fp16) quant_launch<1, 0>(S, (uint32_t)m, k, codes, s, st);
		else quant_launch<0, 0>(S, (uint32_t)m, k, codes, s, st);
	}
	return radiance__gpu_check_launch("quant kernel");
}

extern "C" int radiance__gpu_quant(const void *x, enum radiance_dtype dtype, uint32_t m, uint32_t k,
				   enum radiance__codes_order order, uint8_t *codes, float *s, void *stream)
{
	struct radiance__gpu_quant_src src = {};
	src.n = 1;
	src.x[0] = x;
	src.m[0] = m;
	return radiance__gpu_quant_rows(&src, dtype, k, order, codes, s, stream);
}

extern "C" int radiance__gpu_codes_reorder(const uint8_t *in, uint32_t m, uint32_t k,
					   enum radiance__codes_order order, uint8_t *out, void *stream)
{
	if (order != RADIANCE_CODES_WGMMA || k % RAD_GROUP || ((uintptr_t)in | (uintptr_t)out) % 16)
		return radiance__gpu_fail_text(-EINVAL, "codes reorder: order %d, k %u, in %p, out %p (the WGMMA "
					       "order, k %% 128, 16-byte aligned)", (int)order, k, (const void *)in,
					       (void *)out);
	const uint64_t pieces = (uint64_t)m * k / 8;
	if (pieces == 0)
		return 0;
	hipLaunchKernelGGL(rad_codes_wgmma_order, dim3((unsigned)((pieces + 255) / 256)), dim3(256), 0,
			   (hipStream_t)stream, in, out, pieces);
	return radiance__gpu_check_launch("codes reorder kernel");
}
