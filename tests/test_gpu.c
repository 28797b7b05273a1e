/*
 * GPU kernels and backend against the CPU reference (kernels/w4a8_cpu.c).
 *
 * Built in every configuration; without RADIANCE_GPU (the CPU-only build) or
 * without a usable device every test is skipped. With a GPU:
 *   - activation codes of the quant kernel equal the CPU's bit for bit, and
 *     the per-token scales too (special rows: zeros, Inf, NaN, denormals,
 *     huge, ties);
 *   - every W4A8 path (decode, tiled, wgmma and wgmma-exact where built,
 *     portable) at
 *     M in {1,2,3,5,8,13,16,17,33,64,65,128,512,2048} on shapes whose N is no
 *     multiple of any tile and whose K spans several groups, codes random
 *     along n and k; rows of y past M poisoned with NaN beforehand and
 *     checked untouched; the numerics contract (docs/numerics.md): every
 *     element within the bound of its path's accumulation against the exact
 *     value (kernels/numerics_bound.h: one bf16 step for the fp32 paths,
 *     the Hopper fp8 model's bound for wgmma) and the layer within the norm
 *     bound (2e-3) of the CPU reference; the paths but fp8 wgmma also within 2%
 *     (+1% of the RMS) of the CPU per element, the portable path bit-exact;
 *     a NaN row of x gives a NaN row of y;
 *   - forced split-K (the last-block fixup) and the policy's own choice;
 *   - the backend ops: stacked requests, mixed dtypes, bf16 layers with bf16
 *     and fp16 activations (BLAS), -E2BIG, untouched arena bytes;
 *   - the bulk lane's pipeline (copy-in, GEMM, copy-out on three streams,
 *     staging rows as rings): prefill requests of many pieces all queued
 *     before any is waited for, and decode launches in flight among them;
 *   - every layer of the shipped MiniLM checkpoint with its captured
 *     activations (tests/data), through the backend, with the defaults and
 *     (where wgmma runs) with prefill = fast, against the same contract.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifdef RADIANCE_GPU
#include <math.h>

#include "backend.h"
#include "checkpoint.h"
#include "safetensors.h"
#include "w4a8_cpu.h"
#include "w4a8_gpu.h"
#include "gpu_check.h"
#include "numerics_bound.h"

static struct radiance__gpu_device dev;
static int have_gpu;
static void *stream;

static void *dalloc(size_t bytes)
{
	void *p = NULL;
	assert_int_equal(radiance__gpu_malloc(&p, bytes), 0);
	return p;
}

static void h2d(void *d, const void *h, size_t n)
{
	assert_int_equal(radiance__gpu_h2d_async(d, h, n, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
}

static void d2h(void *h, const void *d, size_t n)
{
	assert_int_equal(radiance__gpu_d2h_async(h, d, n, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
}

static int setup(void **state)
{
	(void)state;
	if (radiance__gpu_init(0, &dev) == 0 && radiance__gpu_stream_create(&stream) == 0) {
		have_gpu = 1;
		printf("# GPU: %s (%s, %d SMs, cc %d.%d, fp8 mma %d, wgmma %d)\n", dev.name, dev.vendor,
		       dev.sm_count, dev.cc_major, dev.cc_minor, dev.fp8_mma, dev.wgmma);
	} else {
		printf("# no usable GPU (%s): every test is skipped\n", radiance__gpu_last_error());
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	radiance__gpu_stream_destroy(stream);
	return 0;
}

#define NEED_GPU()               \
	do {                     \
		if (!have_gpu)   \
			skip();  \
	} while (0)

/* ------------------------------------------------------------ quant */

/* Fills an m x k activation matrix with rows that probe every branch of the
 * e4m3 conversion; rows >= 8 are random with a per-row magnitude. */
static void fill_x(uint16_t *x, uint32_t m, uint32_t k, enum radiance_dtype dt, int special)
{
	for (uint32_t r = 0; r < m; r++) {
		uint16_t *xr = x + (size_t)r * k;
		float mag = ldexpf(1.0f, (int)(rnd() % 24) - 12);
		for (uint32_t i = 0; i < k; i++)
			xr[i] = to_dtype(nrand() * mag * (i % 97 == 5 ? 30.0f : 1.0f), dt);
		if (!special)
			continue;
		switch (r) {
		case 0: /* all zero (and negative zeros) */
			for (uint32_t i = 0; i < k; i++)
				xr[i] = (i & 1) ? 0x8000 : 0;
			break;
		case 1: xr[k / 3] = dt == RADIANCE_DTYPE_FP16 ? 0x7E00 : 0x7FC0; break;   /* NaN */
		case 2: xr[k - 1] = dt == RADIANCE_DTYPE_FP16 ? 0xFC00 : 0xFF80; break;   /* -Inf */
		case 3: /* denormals only: the scale floor */
			for (uint32_t i = 0; i < k; i++)
				xr[i] = (uint16_t)((rnd() & 0x8000) | (1 + rnd() % 0x3F));
			break;
		case 4: /* exact ties: amax 448 -> s = 1, values on e4m3 midpoints */
			for (uint32_t i = 0; i < k; i++) {
				static const float ties[] = {0.5f * 0x1p-9f, 1.5f * 0x1p-9f, 1.0625f, 1.1875f,
							     17.0f, 19.0f, 240.0f - 8.0f, 464.0f - 32.0f};
				xr[i] = to_dtype(ties[i % 8] * ((i & 8) ? -1.0f : 1.0f), dt);
			}
			xr[0] = to_dtype(448.0f, dt);
			break;
		case 5: /* one huge value: most codes subnormal or zero */
			xr[7] = to_dtype(dt == RADIANCE_DTYPE_FP16 ? 60000.0f : 3e30f, dt);
			break;
		default:
			break;
		}
	}
}

/* The quant of rows stacked from nsrc sources (ms[i] rows each, in their
 * own device allocations; radiance__gpu_quant for one source,
 * radiance__gpu_quant_rows for more) against the CPU, bit for bit: codes
 * in both orders and scales. */
static void check_quant_src(enum radiance_dtype dt, uint32_t k, const uint32_t *ms, size_t nsrc)
{
	uint32_t m = 0;
	for (size_t i = 0; i < nsrc; i++)
		m += ms[i];
	uint16_t *x = malloc((size_t)m * k * 2);
	uint8_t *codes = malloc((size_t)m * k), *ref = malloc((size_t)m * k);
	float *s = malloc(m * 4), *sref = malloc(m * 4);
	assert_non_null(x);
	fill_x(x, m, k, dt, 1);
	struct radiance__gpu_quant_src src = {.n = (uint32_t)nsrc};
	void *dx[RADIANCE__GPU_QUANT_SRC_MAX] = {0};
	assert_true(nsrc >= 1 && nsrc <= RADIANCE__GPU_QUANT_SRC_MAX);
	for (size_t i = 0, r0 = 0; i < nsrc; r0 += ms[i++]) {
		dx[i] = dalloc((size_t)(ms[i] ? ms[i] : 1) * k * 2);
		if (ms[i])
			h2d(dx[i], x + r0 * k, (size_t)ms[i] * k * 2);
		src.x[i] = dx[i];
		src.m[i] = ms[i];
	}
	void *dc = dalloc((size_t)m * k), *ds = dalloc(m * 4);
	const enum radiance__codes_order orders[] = {RADIANCE_CODES_NATURAL, RADIANCE_CODES_WGMMA};
	size_t bad = 0;
	for (uint32_t r = 0; r < m; r++)
		sref[r] = radiance_quant_row_e4m3(x + (size_t)r * k, dt, k, ref + (size_t)r * k);
	/* the wgmma order: the same codes, 4-byte words permuted per group */
	for (int oi = 0; oi < (k % 128 == 0 ? 2 : 1); oi++) {
		const enum radiance__codes_order order = orders[oi];
		assert_int_equal(radiance__gpu_memset_async(dc, 0x5A, (size_t)m * k, stream), 0);
		assert_int_equal(radiance__gpu_memset_async(ds, 0x5A, m * 4, stream), 0);
		if (nsrc == 1)
			assert_int_equal(radiance__gpu_quant(dx[0], dt, m, k, order, dc, ds, stream), 0);
		else
			assert_int_equal(radiance__gpu_quant_rows(&src, dt, k, order, dc, ds, stream), 0);
		d2h(codes, dc, (size_t)m * k);
		d2h(s, ds, m * 4);
		for (uint32_t r = 0; r < m; r++) {
			uint32_t a, b;
			memcpy(&a, &s[r], 4);
			memcpy(&b, &sref[r], 4);
			if (!(isnan(s[r]) && isnan(sref[r])) && a != b && bad++ < 8)
				printf("# quant dtype %d k %u order %d row %u: scale %a, CPU %a\n", dt, k, (int)order, r,
				       s[r], sref[r]);
		}
		for (size_t i = 0; i < (size_t)m * k / 4; i++) {
			size_t stored = i;
			if (order == RADIANCE_CODES_WGMMA) {
				const size_t grp = i / 32, w = i % 32, t = w / 8, j = (w % 8) / 2, r = w % 2;
				stored = grp * 32 + j * 8 + r * 4 + t;
			}
			if (memcmp(codes + stored * 4, ref + i * 4, 4) != 0 && bad++ < 8)
				printf("# quant dtype %d k %u order %d row %zu word %zu: codes %02x%02x%02x%02x, CPU "
				       "%02x%02x%02x%02x\n", dt, k, (int)order, i * 4 / k, i % (k / 4), codes[stored * 4],
				       codes[stored * 4 + 1], codes[stored * 4 + 2], codes[stored * 4 + 3], ref[i * 4],
				       ref[i * 4 + 1], ref[i * 4 + 2], ref[i * 4 + 3]);
		}
	}
	if (bad)
		printf("# quant dtype %d k %u, %zu sources, %u rows: %zu mismatches\n", dt, k, nsrc, m, bad);
	assert_int_equal(bad, 0);
	for (size_t i = 0; i < nsrc; i++)
		radiance__gpu_free(dx[i]);
	radiance__gpu_free(dc);
	radiance__gpu_free(ds);
	free(x);
	free(codes);
	free(ref);
	free(s);
	free(sref);
}

static void check_quant(enum radiance_dtype dt, uint32_t m, uint32_t k)
{
	check_quant_src(dt, k, &m, 1);
}

static void test_quant_codes(void **state)
{
	(void)state;
	NEED_GPU();
	check_quant(RADIANCE_DTYPE_BF16, 37, 1152);
	check_quant(RADIANCE_DTYPE_FP16, 37, 1152);
	check_quant(RADIANCE_DTYPE_BF16, 64, 5120);
	check_quant(RADIANCE_DTYPE_FP16, 3, 17408);
	check_quant(RADIANCE_DTYPE_BF16, 5, 1000);   /* k % 128 != 0: the natural order only */
}

/* Rows read once into registers (w4a8_quant.hip: up to 48 KiB a row, in
 * three block shapes) and the two-pass rows past that: k on both sides of
 * each limit, few rows (1024 threads a row for k >= 4096) and many (256 or
 * 512), both dtypes, both orders. */
static void test_quant_rows_once(void **state)
{
	(void)state;
	NEED_GPU();
	static const uint32_t ks[] = {128, 4096, 8192, 8320, 17408, 24576, 24704};
	static const uint32_t ms[] = {1, 3, 64, 70};
	for (int f = 0; f < 2; f++)
		for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
			for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
				check_quant(f ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16, ms[mi], ks[ki]);
}

/* One launch over rows of several sources (radiance__gpu_quant_rows), an
 * empty one among them, and the list's refusals. */
static void test_quant_sources(void **state)
{
	(void)state;
	NEED_GPU();
	static const uint32_t ms[] = {1, 2, 0, 5, 1, 1, 9, 1};
	static const uint32_t ks[] = {640, 5120, 17408, 24704};
	for (int f = 0; f < 2; f++)
		for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
			check_quant_src(f ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16, ks[ki], ms,
					sizeof ms / sizeof ms[0]);
	uint32_t many[RADIANCE__GPU_QUANT_SRC_MAX];
	for (size_t i = 0; i < RADIANCE__GPU_QUANT_SRC_MAX; i++)
		many[i] = 1 + (uint32_t)(i % 3);   /* 64 rows: 1024 threads a row */
	check_quant_src(RADIANCE_DTYPE_BF16, 4096, many, RADIANCE__GPU_QUANT_SRC_MAX);

	void *dx = dalloc(4096), *dc = dalloc(2048), *ds = dalloc(64);
	struct radiance__gpu_quant_src src = {.n = 1, .x = {(uint8_t *)dx + 8}, .m = {1}};
	assert_int_equal(radiance__gpu_quant_rows(&src, RADIANCE_DTYPE_BF16, 128, RADIANCE_CODES_NATURAL, dc, ds,
						  stream), -EINVAL);
	src.x[0] = dx;
	src.n = RADIANCE__GPU_QUANT_SRC_MAX + 1;
	assert_int_equal(radiance__gpu_quant_rows(&src, RADIANCE_DTYPE_BF16, 128, RADIANCE_CODES_NATURAL, dc, ds,
						  stream), -EINVAL);
	radiance__gpu_free(dx);
	radiance__gpu_free(dc);
	radiance__gpu_free(ds);
}

/* ------------------------------------------------------------- GEMM */

struct layer_data {
	uint32_t n, k;
	uint32_t *qweight;    /* canonical [n][k/8] */
	uint16_t *scales;     /* canonical [n][k/128] */
	float *bias;
	void *dw, *ds;        /* device layout */
	float *dbias;
};

static void layer_make(struct layer_data *L, uint32_t n, uint32_t k, int with_bias)
{
	L->n = n;
	L->k = k;
	L->qweight = malloc((size_t)n * k / 2);
	L->scales = malloc((size_t)n * (k / 128) * 2);
	L->bias = with_bias ? malloc(n * 4) : NULL;
	for (size_t i = 0; i < (size_t)n * k / 8; i++)
		L->qweight[i] = rnd() ^ (rnd() << 16);
	for (size_t i = 0; i < (size_t)n * (k / 128); i++)
		L->scales[i] = f32_to_f16((0.002f + 0.03f * frand()) * ((rnd() & 1) ? -1.0f : 1.0f));
	for (uint32_t i = 0; with_bias && i < n; i++)
		L->bias[i] = nrand() * 0.5f;
	void *tq = dalloc((size_t)n * k / 2), *ts = dalloc((size_t)n * (k / 128) * 2);
	L->dw = dalloc(radiance__w4a8_weight_bytes(n, k));
	L->ds = dalloc(radiance__w4a8_scale_bytes(n, k));
	h2d(tq, L->qweight, (size_t)n * k / 2);
	h2d(ts, L->scales, (size_t)n * (k / 128) * 2);
	assert_int_equal(radiance__w4a8_repack(tq, ts, n, k, L->dw, L->ds, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
	L->dbias = NULL;
	if (with_bias) {
		L->dbias = dalloc(n * 4);
		h2d(L->dbias, L->bias, n * 4);
	}
	radiance__gpu_free(tq);
	radiance__gpu_free(ts);
}

static void layer_drop(struct layer_data *L)
{
	radiance__gpu_free(L->dw);
	radiance__gpu_free(L->ds);
	radiance__gpu_free(L->dbias);
	free(L->qweight);
	free(L->scales);
	free(L->bias);
}

/* The contract (docs/numerics.md "Contract", kernels/numerics_bound.h):
 * every element of y within the bound of the path's accumulation (fp8-sm90
 * for wgmma, fp32 for the others), NaN exactly where the definition has
 * NaN, and the layer within the norm bound of the CPU reference. Returns 0
 * when all hold. */
static int check_bound(const char *what, const uint8_t *codes, const float *s, const uint32_t *qweight,
		       const uint16_t *scales, const float *bias, uint32_t m, uint32_t n, uint32_t k,
		       enum radiance_acc acc, const uint16_t *y, const uint16_t *ref)
{
	struct radiance_bound_report r;
	assert_int_equal(radiance_w4a8_bound_check(codes, s, qweight, scales, bias, m, n, k, acc, y, &r), 0);
	double num = 0, den = 0;
	for (size_t i = 0; i < (size_t)m * n; i++) {
		const double a = radiance_bf16_to_f32(y[i]), b = radiance_bf16_to_f32(ref[i]);
		if (isnan(a) || isnan(b))
			continue;
		num += (a - b) * (a - b);
		den += b * b;
	}
	const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	const int ok = r.outside == 0 && r.nan_mismatch == 0 && rel < RADIANCE_NORM_BOUND;
	if (!ok || getenv("RADIANCE_TEST_VERBOSE"))
		printf("# %s: bound %s: %zu of %zu outside, worst %.3f of allowed at [%zu][%zu] (y %g, exact %g, "
		       "allowed %.3g), NaN mismatches %zu, rel. to the CPU %.3e%s\n", what,
		       acc == RADIANCE_ACC_FP8_SM90 ? "fp8-sm90" : "fp32", r.outside, r.checked, r.worst,
		       r.worst_at / n, r.worst_at % n, r.worst_y, r.worst_exact, r.worst_allowed, r.nan_mismatch, rel,
		       ok ? "" : "  <-- FAIL");
	return ok ? 0 : -1;
}

static const char *path_str(enum radiance__w4a8_path p) { return radiance__w4a8_path_name(p); }

static int run_shape(uint32_t n, uint32_t k, const uint32_t *ms, size_t nms, int with_bias)
{
	struct layer_data L;
	int failures = 0;
	layer_make(&L, n, k, with_bias);
	const uint32_t pad = 3;
	const size_t part_bytes = radiance__w4a8_partials_bytes(64, n);
	float *partials = dalloc(part_bytes);
	const size_t ncnt = radiance__w4a8_counters_needed(n);
	uint32_t *counters = dalloc(ncnt * 4);
	assert_int_equal(radiance__gpu_memset_async(counters, 0, ncnt * 4, stream), 0);
	/* streaming-kernel launches by warps splitting K (1, 2, 4), and with 4
	 * tiles a warp and wk 4 */
	unsigned ran_wk[4] = {0}, ran_ntw4_wk4 = 0;

	for (size_t mi = 0; mi < nms; mi++) {
		const uint32_t m = ms[mi];
		const enum radiance_dtype dt = (mi & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
		uint16_t *x = malloc((size_t)m * k * 2), *ref = malloc((size_t)m * n * 2);
		uint16_t *y = malloc((size_t)(m + pad) * n * 2);
		uint8_t *codes = malloc((size_t)m * k), *gcodes = malloc((size_t)m * k);
		float *srow = malloc(m * sizeof *srow);
		void *scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(m, k) + 63) & ~(size_t)63);
		assert_non_null(scratch);
		fill_x(x, m, k, dt, 0);
		if (m >= 13)   /* a NaN row must come out as a NaN row */
			x[(size_t)5 * k + 3] = dt == RADIANCE_DTYPE_FP16 ? 0x7E00 : 0x7FC0;
		radiance_cpu_w4a8(x, dt, m, L.qweight, L.scales, L.bias, n, k, ref, scratch);
		for (uint32_t r = 0; r < m; r++)
			srow[r] = radiance_quant_row_e4m3(x + (size_t)r * k, dt, k, codes + (size_t)r * k);

		void *dx = dalloc((size_t)m * k * 2), *dc = dalloc((size_t)m * k), *ds = dalloc(m * 4);
		uint16_t *dy = dalloc((size_t)(m + pad) * n * 2);
		h2d(dx, x, (size_t)m * k * 2);
		assert_int_equal(radiance__gpu_quant(dx, dt, m, k, RADIANCE_CODES_NATURAL, dc, ds, stream), 0);
		d2h(gcodes, dc, (size_t)m * k);
		if (memcmp(gcodes, codes, (size_t)m * k) != 0) {
			printf("# n=%u k=%u m=%u: activation codes differ from the CPU's  <-- FAIL\n", n, k, m);
			failures++;
		}
		enum radiance__w4a8_path paths[] = {RADIANCE_W4A8_DECODE, RADIANCE_W4A8_TILED, RADIANCE_W4A8_WGMMA,
						    RADIANCE_W4A8_WGMMA_EXACT, RADIANCE_W4A8_PORTABLE, RADIANCE_W4A8_AUTO};
		for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
			const enum radiance__w4a8_path path = paths[pi];
			if (path == RADIANCE_W4A8_DECODE && m > 64)
				continue;
			if ((path == RADIANCE_W4A8_WGMMA || path == RADIANCE_W4A8_WGMMA_EXACT) && !dev.wgmma)
				continue;
			if ((path == RADIANCE_W4A8_DECODE || path == RADIANCE_W4A8_TILED || path == RADIANCE_W4A8_WGMMA ||
			     path == RADIANCE_W4A8_WGMMA_EXACT) && !dev.fp8_mma)
				continue;
			/* the decode path: the policy's split, then a forced 3-way split,
			 * then each decode kernel in several of its launch shapes (the
			 * streaming kernel serves m <= 16, and m <= 64 when forced: its policy with warps
			 * splitting K, then one warp per K range (wk 1) and 2 or 4
			 * warps splitting K (another summation order: against the CPU
			 * only)); the wgmma path in each of its kernel variants */
			static const struct {
				int kernel;
				uint32_t ntw, cg, stages, split, wk;
			} dec[] = {
				{0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 3, 0}, {1, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 2, 0},
				{2, 1, 1, 1, 0, 1}, {2, 1, 2, 2, 3, 1}, {2, 1, 4, 3, 5, 1}, {2, 2, 1, 2, 2, 1},
				{2, 2, 2, 1, 0, 1}, {2, 4, 1, 3, 1, 1}, {2, 2, 2, 8, 3, 1}, {2, 1, 1, 5, 7, 1},
				{2, 1, 2, 2, 1, 2}, {2, 1, 2, 2, 3, 4}, {2, 2, 2, 2, 0, 2}, {2, 4, 1, 3, 2, 2},
				{2, 1, 1, 5, 0, 4}, {2, 2, 1, 2, 2, 4}, {2, 1, 4, 3, 1, 4}, {2, 1, 2, 8, 1, 4},
				{2, 4, 1, 2, 0, 4}, {2, 1, 2, 1, 0, 1}, {2, 1, 2, 1, 0, 4},
			};
			const uint32_t ndec = sizeof dec / sizeof dec[0];   /* m <= 64 here */
			const uint32_t reps = path == RADIANCE_W4A8_DECODE      ? ndec
					      : path == RADIANCE_W4A8_WGMMA       ? 3u
					      : path == RADIANCE_W4A8_WGMMA_EXACT ? 2u
										  : 1u;
			/* the fp8 wgmma path's y of its first launch: the third (the
			 * same launch again) must give the same bits */
			uint16_t *yfirst = NULL;
			for (uint32_t rep = 0; rep < reps; rep++) {
				const int isdec = path == RADIANCE_W4A8_DECODE;
				/* wgmma-exact: the policy's split, then a forced 3-way one
				 * (taken where one token block holds m) */
				const uint32_t force = isdec ? dec[rep].split
						       : path == RADIANCE_W4A8_WGMMA_EXACT && rep ? 3u : 0u;
				/* wgmma: 128-token tiles, then 96, then 128 again */
				const struct radiance__w4a8_settings set = {
					.decode_kernel = isdec ? dec[rep].kernel : 0, .decode_ntw = isdec ? dec[rep].ntw : 0,
					.decode_cg = isdec ? dec[rep].cg : 0, .decode_stages = isdec ? dec[rep].stages : 0,
					.decode_wk = isdec ? dec[rep].wk : 0,
					.wgmma_tile = path == RADIANCE_W4A8_WGMMA ? (rep == 1 ? 96u : 128u) : 0u,
				};
				struct radiance__w4a8_args a = {
					.codes = dc, .s = ds, .m = m, .n = n, .k = k, .w = L.dw, .sc = L.ds,
					.bias = L.dbias, .y = dy, .partials = partials, .partials_bytes = part_bytes,
					.counters = counters, .counters_n = ncnt, .path = path, .max_decode_rows = 64,
					.split = force, .settings = &set,
				};
				struct radiance__w4a8_plan plan;
				radiance__w4a8_plan(&dev, &a, &plan);
				/* which warps-splitting-K launches of the streaming kernel
				 * ran (a forced wk is cut where the split leaves its warps
				 * less than a group each: the planner's rule, test_plan) */
				if (plan.path == RADIANCE_W4A8_DECODE && plan.ntw) {
					ran_wk[plan.wk < 4 ? plan.wk : 3]++;
					ran_ntw4_wk4 += plan.ntw == 4 && plan.wk == 4;
				}
				assert_int_equal(radiance__gpu_quant(dx, dt, m, k, plan.order, dc, ds, stream), 0);
				for (size_t i = 0; i < (size_t)(m + pad) * n; i++)
					y[i] = 0x7FC1;   /* poison */
				h2d(dy, y, (size_t)(m + pad) * n * 2);
				assert_int_equal(radiance__w4a8_gemm(&dev, &a, stream), 0);
				assert_int_equal(radiance__gpu_stream_sync(stream), 0);
				d2h(y, dy, (size_t)(m + pad) * n * 2);
				char what[160];
				snprintf(what, sizeof what, "n=%u k=%u m=%u %s %s tok=%u wk=%u ntw=%u cg=%u stages=%u split=%u variant=%u",
					 n, k, m, dt == RADIANCE_DTYPE_FP16 ? "fp16" : "bf16", path_str(plan.path), plan.tok,
					 plan.wk, plan.ntw, plan.cg, plan.stages, plan.split,
					 path == RADIANCE_W4A8_WGMMA || path == RADIANCE_W4A8_WGMMA_EXACT ? rep + 1 : 0u);
				size_t touched = 0;
				for (size_t i = (size_t)m * n; i < (size_t)(m + pad) * n; i++)
					touched += y[i] != 0x7FC1;
				if (touched) {
					printf("# %s: %zu output elements past row m were written  <-- FAIL\n", what,
					       touched);
					failures++;
				}
				/* the contract: wgmma within the fp8 bound and the norm
				 * bound; every other path within one bf16 step (the fp32
				 * bound), and the portable one bit for bit */
				const enum radiance_acc acc =
					plan.path == RADIANCE_W4A8_WGMMA ? RADIANCE_ACC_FP8_SM90 : RADIANCE_ACC_FP32;
				failures += check_bound(what, codes, srow, L.qweight, L.scales, L.bias, m, n, k, acc, y,
							ref) != 0;
				if (plan.path != RADIANCE_W4A8_WGMMA)
					failures += compare(what, y, ref, m, n, plan.path == RADIANCE_W4A8_PORTABLE) != 0;
				if (plan.path == RADIANCE_W4A8_WGMMA && rep == 0) {
					yfirst = malloc((size_t)m * n * 2);
					assert_non_null(yfirst);
					memcpy(yfirst, y, (size_t)m * n * 2);
				} else if (plan.path == RADIANCE_W4A8_WGMMA && rep == 2 && yfirst &&
					   memcmp(y, yfirst, (size_t)m * n * 2) != 0) {
					size_t ndiff = 0;
					for (size_t i = 0; i < (size_t)m * n; i++)
						ndiff += y[i] != yfirst[i];
					printf("# %s: %zu outputs differ from the same launch's first run  <-- FAIL\n", what,
					       ndiff);
					failures++;
				}
			}
			free(yfirst);
		}
		radiance__gpu_free(dx);
		radiance__gpu_free(dc);
		radiance__gpu_free(ds);
		radiance__gpu_free(dy);
		free(x);
		free(ref);
		free(y);
		free(codes);
		free(gcodes);
		free(srow);
		free(scratch);
	}
	/* the dec list's wk 2 and wk 4 entries must have run here wherever
	 * the streaming kernel did (on the H200's occupancy every test shape
	 * runs both, and 4 tiles a warp with wk 4 at m <= 8) */
	const unsigned ran = ran_wk[1] + ran_wk[2] + ran_wk[3];
	printf("# n=%u k=%u: streaming launches by wk: 1: %u, 2: %u, 4: %u (4 tiles a warp and wk 4: %u)\n", n, k,
	       ran_wk[1], ran_wk[2], ran_wk[3], ran_ntw4_wk4);
	if (ran && (!ran_wk[2] || !ran_wk[3])) {
		printf("# n=%u k=%u: no streaming launch with 2 or with 4 warps splitting K  <-- FAIL\n", n, k);
		failures++;
	}
	radiance__gpu_free(partials);
	radiance__gpu_free(counters);
	layer_drop(&L);
	return failures;
}

static const uint32_t all_m[] = {1, 2, 3, 5, 8, 13, 16, 17, 33, 64, 65, 128, 512, 2048};

static void test_w4a8_narrow(void **state)
{
	(void)state;
	NEED_GPU();
	/* N = 200: 12.5 tiles of 16, not a multiple of 64 or 128; 5 groups */
	assert_int_equal(run_shape(200, 640, all_m, sizeof all_m / sizeof all_m[0], 1), 0);
}

static void test_w4a8_splitk(void **state)
{
	(void)state;
	NEED_GPU();
	/* a narrow, deep layer: the policy splits K across blocks */
	assert_int_equal(run_shape(72, 4096, all_m, sizeof all_m / sizeof all_m[0], 0), 0);
}

static void test_w4a8_wide(void **state)
{
	(void)state;
	NEED_GPU();
	static const uint32_t ms[] = {1, 5, 16, 32, 33, 64, 65, 128, 300};
	assert_int_equal(run_shape(1000, 1152, ms, sizeof ms / sizeof ms[0], 1), 0);
}

static void test_w4a8_odd_n(void **state)
{
	(void)state;
	NEED_GPU();
	/* N = 100: not a multiple of 8, so every kernel stores y element by
	 * element at the end of a row (the streaming kernel with 1, 2 and 4
	 * warps splitting K among them); 6 groups */
	static const uint32_t ms[] = {1, 3, 8, 13, 16, 17, 32, 33, 65};
	assert_int_equal(run_shape(100, 768, ms, sizeof ms / sizeof ms[0], 1), 0);
}

/* Fused quant (plan.fused): the streaming GEMV quantizing x itself must give
 * the same y, bit for bit, as the quant kernel + the same GEMV launch, for
 * m = 1..4 rows (windows of the special rows: zero, NaN, -Inf, denormals,
 * e4m3 ties, one huge value), both dtypes, with and without split-K and a
 * partial last block column; codes and s are poisoned first (the fused
 * kernel must not read them), and y is checked against the CPU too. */
static void test_fused_quant(void **state)
{
	(void)state;
	NEED_GPU();
	if (!dev.gemv_blocks || !dev.fp8_mma) {
		printf("# no streaming decode kernel on this device: nothing to fuse\n");
		return;
	}
	static const uint32_t shapes[][2] = {{4096, 5120}, {72, 4096}, {200, 640}, {5120, 17408}, {1000, 1152}};
	int failures = 0, fused_runs = 0;
	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		const uint32_t n = shapes[si][0], k = shapes[si][1];
		struct layer_data L;
		layer_make(&L, n, k, si % 2 == 0);
		const size_t part_bytes = radiance__w4a8_partials_bytes(64, n);
		float *partials = dalloc(part_bytes);
		const size_t ncnt = radiance__w4a8_counters_needed(n);
		uint32_t *counters = dalloc(ncnt * 4);
		assert_int_equal(radiance__gpu_memset_async(counters, 0, ncnt * 4, stream), 0);
		uint16_t *x = malloc((size_t)6 * k * 2), *ref = malloc((size_t)4 * n * 2);
		uint16_t *y0 = malloc((size_t)4 * n * 2), *y1 = malloc((size_t)4 * n * 2);
		void *dx = dalloc((size_t)6 * k * 2), *dy = dalloc((size_t)4 * n * 2);
		uint8_t *dc = dalloc((size_t)4 * k);
		float *ds = dalloc(4 * 4);
		void *scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(4, k) + 63) & ~(size_t)63);
		assert_non_null(scratch);
		for (int d = 0; d < 2; d++) {
			const enum radiance_dtype dt = d ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
			fill_x(x, 6, k, dt, 1);
			h2d(dx, x, (size_t)6 * k * 2);
			for (uint32_t m = 1; m <= 4; m++)
				for (uint32_t r0 = 0; r0 <= 2; r0 += 2) {
					const uint16_t *xr = x + (size_t)r0 * k;
					const void *dxr = (const uint8_t *)dx + (size_t)r0 * k * 2;
					radiance_cpu_w4a8(xr, dt, m, L.qweight, L.scales, L.bias, n, k, ref, scratch);
					/* the policy's split, then a forced 3-way split; the
					 * unfused launch with one warp per K range, as the
					 * fused kernel runs */
					for (uint32_t force = 0; force <= 3; force += 3) {
						struct radiance__w4a8_settings set = {.decode_fuse_rows = -1, .decode_wk = 1};
						struct radiance__w4a8_args a = {
							.codes = dc, .s = ds, .m = m, .n = n, .k = k, .w = L.dw, .sc = L.ds,
							.bias = L.dbias, .y = dy, .partials = partials,
							.partials_bytes = part_bytes, .counters = counters, .counters_n = ncnt,
							.path = RADIANCE_W4A8_DECODE, .max_decode_rows = 64, .split = force,
							.pdl = 1, .settings = &set, .x = dxr, .x_dtype = dt,
						};
						struct radiance__w4a8_plan p0, p1;
						assert_int_equal(radiance__w4a8_plan(&dev, &a, &p0), 0);
						assert_int_equal(p0.fused, 0);
						assert_int_equal(radiance__gpu_quant(dxr, dt, m, k, p0.order, dc, ds, stream), 0);
						assert_int_equal(radiance__w4a8_gemm(&dev, &a, stream), 0);
						d2h(y0, dy, (size_t)m * n * 2);
						set.decode_fuse_rows = 4;
						assert_int_equal(radiance__w4a8_plan(&dev, &a, &p1), 0);
						char what[128];
						snprintf(what, sizeof what, "fused n=%u k=%u m=%u rows %u.. %s ntw=%u split=%u", n,
							 k, m, r0, d ? "fp16" : "bf16", p1.ntw, p1.split);
						if (!p1.fused) {
							printf("# %s: not fused (split > groups or codes past %u bytes)\n", what,
							       RADIANCE_W4A8_FUSE_SMEM);
							continue;
						}
						assert_int_equal(p1.split, p0.split);
						assert_int_equal(radiance__gpu_memset_async(dc, 0x55, (size_t)4 * k, stream), 0);
						assert_int_equal(radiance__gpu_memset_async(ds, 0xFF, 16, stream), 0);
						assert_int_equal(radiance__gpu_memset_async(dy, 0xFF, (size_t)4 * n * 2, stream),
								 0);
						assert_int_equal(radiance__w4a8_gemm(&dev, &a, stream), 0);
						assert_int_equal(radiance__gpu_stream_sync(stream), 0);
						d2h(y1, dy, (size_t)m * n * 2);
						fused_runs++;
						if (memcmp(y0, y1, (size_t)m * n * 2) != 0) {
							size_t i = 0;
							while (y0[i] == y1[i])
								i++;
							printf("# %s: differs from quant + GEMV at [%zu][%zu]: 0x%04x, not "
							       "0x%04x  <-- FAIL\n", what, i / n, i % n, y1[i], y0[i]);
							failures++;
						}
						failures += compare(what, y1, ref, m, n, 0) != 0;
					}
				}
		}
		free(scratch);
		free(x);
		free(ref);
		free(y0);
		free(y1);
		radiance__gpu_free(dx);
		radiance__gpu_free(dy);
		radiance__gpu_free(dc);
		radiance__gpu_free(ds);
		radiance__gpu_free(partials);
		radiance__gpu_free(counters);
		layer_drop(&L);
	}
	printf("# fused quant: %d launches compared\n", fused_runs);
	assert_true(fused_runs > 0);
	assert_int_equal(failures, 0);
}

/* A chain of layers queued back to back (docs/gpu.md "A decode step as an
 * engine queues it"), each layer's y the next one's x, quant + GEMM per
 * layer (at m = 1 the GEMV quantizing x itself), no synchronize in between,
 * every GEMM a programmatic dependent of the launch before it. Every
 * layer's y must equal the CPU's result on the x that layer really got (the
 * GPU's y of the layer before): a quant or fused GEMV that read its x, or a
 * quant that overwrote the codes, before the GEMV before it had finished,
 * or a GEMV that raced the one before on the shared split-K partials and
 * counters, gives other values (the y buffers start as NaN). */
static void test_layer_chain(void **state)
{
	(void)state;
	NEED_GPU();
	enum { LAYERS = 8 };
	static const uint32_t ms[] = {1, 4, 16};
	struct layer_data A, B;
	layer_make(&A, 4096, 5120, 1);   /* 5120 -> 4096 */
	layer_make(&B, 5120, 4096, 0);   /* 4096 -> 5120 */
	const size_t part_bytes = radiance__w4a8_partials_bytes(64, 5120);
	float *partials = dalloc(part_bytes);
	const size_t ncnt = radiance__w4a8_counters_needed(5120);
	uint32_t *counters = dalloc(ncnt * 4);
	assert_int_equal(radiance__gpu_memset_async(counters, 0, ncnt * 4, stream), 0);
	int failures = 0;
	for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
		const uint32_t m = ms[mi];
		uint16_t *x = malloc((size_t)m * 5120 * 2), *ref = malloc((size_t)m * 5120 * 2);
		uint16_t *got[LAYERS + 1];
		void *dbuf[LAYERS + 1];
		fill_x(x, m, 5120, RADIANCE_DTYPE_BF16, 0);
		for (int i = 0; i <= LAYERS; i++) {
			got[i] = malloc((size_t)m * 5120 * 2);
			dbuf[i] = dalloc((size_t)m * 5120 * 2);
			for (size_t e = 0; e < (size_t)m * 5120; e++)
				got[i][e] = 0x7FC1;
			h2d(dbuf[i], i ? got[i] : x, (size_t)m * 5120 * 2);
		}
		uint8_t *dc = dalloc((size_t)m * 5120);
		float *ds = dalloc(m * 4);
		for (int i = 0; i < LAYERS; i++) {
			const struct layer_data *L = i % 2 ? &B : &A;
			struct radiance__w4a8_args a = {
				.codes = dc, .s = ds, .m = m, .n = L->n, .k = L->k, .w = L->dw, .sc = L->ds,
				.bias = L->dbias, .y = dbuf[i + 1], .partials = partials, .partials_bytes = part_bytes,
				.counters = counters, .counters_n = ncnt, .max_decode_rows = 64, .pdl = 1,
				.x = dbuf[i], .x_dtype = RADIANCE_DTYPE_BF16,
			};
			struct radiance__w4a8_plan plan;
			assert_int_equal(radiance__w4a8_plan(&dev, &a, &plan), 0);
			/* m = 1: the GEMV quantizes the y before it itself */
			if (!plan.fused)
				assert_int_equal(radiance__gpu_quant(dbuf[i], RADIANCE_DTYPE_BF16, m, L->k, plan.order, dc,
								    ds, stream), 0);
			assert_int_equal(radiance__w4a8_gemm(&dev, &a, stream), 0);
		}
		assert_int_equal(radiance__gpu_stream_sync(stream), 0);
		memcpy(got[0], x, (size_t)m * 5120 * 2);
		for (int i = 1; i <= LAYERS; i++)
			d2h(got[i], dbuf[i], (size_t)m * (i % 2 ? 4096 : 5120) * 2);
		for (int i = 0; i < LAYERS; i++) {
			const struct layer_data *L = i % 2 ? &B : &A;
			void *scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(m, L->k) + 63) & ~(size_t)63);
			assert_non_null(scratch);
			radiance_cpu_w4a8(got[i], RADIANCE_DTYPE_BF16, m, L->qweight, L->scales, L->bias, L->n, L->k, ref,
					  scratch);
			free(scratch);
			char what[96];
			snprintf(what, sizeof what, "chain m=%u layer %d (%ux%u)", m, i, L->n, L->k);
			failures += compare(what, got[i + 1], ref, m, L->n, 0) != 0;
		}
		for (int i = 0; i <= LAYERS; i++) {
			free(got[i]);
			radiance__gpu_free(dbuf[i]);
		}
		radiance__gpu_free(dc);
		radiance__gpu_free(ds);
		free(x);
		free(ref);
	}
	radiance__gpu_free(partials);
	radiance__gpu_free(counters);
	layer_drop(&A);
	layer_drop(&B);
	assert_int_equal(failures, 0);
}

/* ------------------------------------------------ per-row y destinations */

/* One destination of a launch's y rows: a buffer of `elems` bf16 words,
 * registered host memory or device memory (then `host` is its copy), the
 * rows at word `off` (which may leave them only 2-byte aligned). */
struct ybuf {
	uint16_t *host, *dev;
	size_t elems, off;
	int registered;
};

/* The launch of `a` (its plan already taken for plain y) again with per-row
 * destinations: the m rows cut into nparts parts of parts[i] rows, part i
 * in a buffer of its own (even parts in registered host memory, odd ones
 * in device memory), at a 16-byte offset that is no multiple of 64, or 2
 * bytes past it for part 1 when misalign (every row of the launch then
 * takes 2-byte stores). Every row bit for bit against yplain (the plain-y
 * run of the same plan), every other word of the buffers untouched.
 * Returns the failures. */
static int y_rows_run(const struct radiance__w4a8_args *plain, const uint16_t *yplain, const uint32_t *parts,
		      size_t nparts, int misalign, const char *what)
{
	const uint32_t m = plain->m, n = plain->n;
	struct ybuf b[8];
	uint16_t *rowp[RADIANCE_W4A8_Y_ROWS_MAX];
	uint32_t t = 0;
	int failures = 0;
	assert_true(nparts <= 8);
	for (size_t i = 0; i < nparts; i++) {
		b[i].off = (16 * (1 + 3 * i) + (misalign && i == 1 ? 2 : 0)) / 2;
		b[i].elems = (b[i].off + (size_t)parts[i] * n + 64 + 2047) & ~(size_t)2047;
		b[i].registered = (i & 1) == 0;
		b[i].host = aligned_alloc(4096, b[i].elems * 2);
		assert_non_null(b[i].host);
		for (size_t e = 0; e < b[i].elems; e++)
			b[i].host[e] = 0x7FC1;
		if (b[i].registered) {
			void *d = NULL;
			assert_int_equal(radiance__gpu_host_register(b[i].host, b[i].elems * 2, &d), 0);
			b[i].dev = d;
		} else {
			b[i].dev = dalloc(b[i].elems * 2);
			h2d(b[i].dev, b[i].host, b[i].elems * 2);
		}
		for (uint32_t r = 0; r < parts[i]; r++)
			rowp[t++] = b[i].dev + b[i].off + (size_t)r * n;
	}
	assert_int_equal(t, m);
	struct radiance__w4a8_args a = *plain;
	a.y = NULL;
	a.y_rows = rowp;
	assert_int_equal(radiance__w4a8_gemm(&dev, &a, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
	t = 0;
	for (size_t i = 0; i < nparts; i++) {
		if (!b[i].registered)
			d2h(b[i].host, b[i].dev, b[i].elems * 2);
		size_t differ = 0, touched = 0;
		for (uint32_t r = 0; r < parts[i]; r++, t++)
			differ += memcmp(b[i].host + b[i].off + (size_t)r * n, yplain + (size_t)t * n, (size_t)n * 2) != 0;
		for (size_t e = 0; e < b[i].elems; e++)
			if (e < b[i].off || e >= b[i].off + (size_t)parts[i] * n)
				touched += b[i].host[e] != 0x7FC1;
		if (differ || touched) {
			printf("# %s%s: part %zu of %zu (%u rows, %s, word offset %zu): %zu rows differ from plain y, "
			       "%zu words outside the rows written  <-- FAIL\n", what, misalign ? " misaligned" : "", i,
			       nparts, parts[i], b[i].registered ? "registered host" : "device", b[i].off, differ, touched);
			failures++;
		}
		if (b[i].registered)
			assert_int_equal(radiance__gpu_host_unregister(b[i].host), 0);
		else
			radiance__gpu_free(b[i].dev);
		free(b[i].host);
	}
	return failures;
}

/* Per-row y destinations (radiance__w4a8_args.y_rows, what the backend uses
 * to write several requests' y in place) on every path that takes them:
 * decode with the policy's split, a forced split (the last-block fixup),
 * the cp.async-ring kernel, the streaming kernel in several shapes (m <=
 * 64), tiled, portable and (sm_90a) the f16 wgmma kernel with the policy's
 * split and a forced one. Each run bit for bit against the same plan with
 * plain y, whose result is against the CPU reference and the contract's
 * bound; n = 200 leaves a half tile and no 16-byte piece past the last
 * whole one, n = 100 (n % 8 != 0) takes the 2-byte stores. */
static int y_rows_shape(uint32_t n, uint32_t k)
{
	static const uint32_t ms[] = {1, 3, 8, 16, 24, 40};
	static const uint32_t parts[][4] = {{1}, {1, 2}, {1, 3, 4}, {5, 1, 10}, {4, 20}, {1, 7, 2, 30}};
	static const uint32_t nparts[] = {1, 2, 3, 3, 2, 4};
	static const struct {
		enum radiance__w4a8_path path;
		int kernel;
		uint32_t ntw, cg, stages, split;
	} cfg[] = {
		{RADIANCE_W4A8_DECODE, 0, 0, 0, 0, 0}, {RADIANCE_W4A8_DECODE, 0, 0, 0, 0, 3},
		{RADIANCE_W4A8_DECODE, 1, 0, 0, 0, 0}, {RADIANCE_W4A8_DECODE, 1, 0, 0, 0, 2},
		{RADIANCE_W4A8_DECODE, 2, 1, 1, 1, 0}, {RADIANCE_W4A8_DECODE, 2, 2, 2, 2, 3},
		{RADIANCE_W4A8_DECODE, 2, 4, 1, 3, 0}, {RADIANCE_W4A8_DECODE, 2, 1, 2, 2, 5},
		{RADIANCE_W4A8_TILED, 0, 0, 0, 0, 0},  {RADIANCE_W4A8_PORTABLE, 0, 0, 0, 0, 0},
		{RADIANCE_W4A8_WGMMA_EXACT, 0, 0, 0, 0, 0}, {RADIANCE_W4A8_WGMMA_EXACT, 0, 0, 0, 0, 3},
	};
	struct layer_data L;
	int failures = 0;
	layer_make(&L, n, k, 1);
	const size_t part_bytes = radiance__w4a8_partials_bytes(64, n);
	float *partials = dalloc(part_bytes);
	const size_t ncnt = radiance__w4a8_counters_needed(n);
	uint32_t *counters = dalloc(ncnt * 4);
	assert_int_equal(radiance__gpu_memset_async(counters, 0, ncnt * 4, stream), 0);
	for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
		const uint32_t m = ms[mi];
		const enum radiance_dtype dt = (mi & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
		uint16_t *x = malloc((size_t)m * k * 2), *ref = malloc((size_t)m * n * 2);
		uint16_t *y = malloc((size_t)m * n * 2);
		uint8_t *codes = malloc((size_t)m * k);
		float *srow = malloc(m * sizeof *srow);
		void *scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(m, k) + 63) & ~(size_t)63);
		assert_non_null(scratch);
		fill_x(x, m, k, dt, 0);
		radiance_cpu_w4a8(x, dt, m, L.qweight, L.scales, L.bias, n, k, ref, scratch);
		for (uint32_t r = 0; r < m; r++)
			srow[r] = radiance_quant_row_e4m3(x + (size_t)r * k, dt, k, codes + (size_t)r * k);
		void *dx = dalloc((size_t)m * k * 2), *dc = dalloc((size_t)m * k), *ds = dalloc(m * 4);
		uint16_t *dy = dalloc((size_t)m * n * 2);
		h2d(dx, x, (size_t)m * k * 2);
		assert_int_equal(radiance__gpu_quant(dx, dt, m, k, RADIANCE_CODES_NATURAL, dc, ds, stream), 0);
		for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
			if (cfg[ci].path != RADIANCE_W4A8_PORTABLE && !dev.fp8_mma)
				continue;
			if (cfg[ci].kernel == 2 && m > 64)
				continue;
			if (cfg[ci].path == RADIANCE_W4A8_WGMMA_EXACT && (!dev.wgmma || k % 128))
				continue;
			const struct radiance__w4a8_settings set = {
				.decode_kernel = cfg[ci].kernel, .decode_ntw = cfg[ci].ntw, .decode_cg = cfg[ci].cg,
				.decode_stages = cfg[ci].stages,
			};
			const struct radiance__w4a8_args a = {
				.codes = dc, .s = ds, .m = m, .n = n, .k = k, .w = L.dw, .sc = L.ds, .bias = L.dbias,
				.y = dy, .partials = partials, .partials_bytes = part_bytes, .counters = counters,
				.counters_n = ncnt, .path = cfg[ci].path, .max_decode_rows = 64, .split = cfg[ci].split,
				.settings = &set,
			};
			struct radiance__w4a8_plan plan;
			assert_int_equal(radiance__w4a8_plan(&dev, &a, &plan), 0);
			assert_int_equal(plan.order, plan.path == RADIANCE_W4A8_WGMMA_EXACT ? RADIANCE_CODES_WGMMA
											    : RADIANCE_CODES_NATURAL);
			assert_int_equal(radiance__gpu_quant(dx, dt, m, k, plan.order, dc, ds, stream), 0);
			assert_int_equal(radiance__gpu_memset_async(dy, 0xFF, (size_t)m * n * 2, stream), 0);
			assert_int_equal(radiance__w4a8_gemm(&dev, &a, stream), 0);
			assert_int_equal(radiance__gpu_stream_sync(stream), 0);
			d2h(y, dy, (size_t)m * n * 2);
			char what[160];
			snprintf(what, sizeof what, "y rows: n=%u k=%u m=%u %s tok=%u wk=%u ntw=%u cg=%u stages=%u split=%u",
				 n, k, m, path_str(plan.path), plan.tok, plan.wk, plan.ntw, plan.cg, plan.stages,
				 plan.split);
			/* the bound's exact sums once per m (big layers) */
			if (ci == 0)
				failures += check_bound(what, codes, srow, L.qweight, L.scales, L.bias, m, n, k,
							RADIANCE_ACC_FP32, y, ref) != 0;
			failures += compare(what, y, ref, m, n, plan.path == RADIANCE_W4A8_PORTABLE) != 0;
			for (int mis = 0; mis < 2; mis++) {
				if (mis && nparts[mi] < 2)
					continue;
				failures += y_rows_run(&a, y, parts[mi], nparts[mi], mis, what);
			}
		}
		/* refused: more rows than the table holds, and the fp8 wgmma path */
		uint16_t *rowp[RADIANCE_W4A8_Y_ROWS_MAX + 1];
		for (uint32_t r = 0; r <= RADIANCE_W4A8_Y_ROWS_MAX; r++)
			rowp[r] = dy;
		struct radiance__w4a8_args bad = {
			.codes = dc, .s = ds, .m = RADIANCE_W4A8_Y_ROWS_MAX + 1, .n = n, .k = k, .w = L.dw,
			.sc = L.ds, .y_rows = rowp, .path = RADIANCE_W4A8_PORTABLE,
		};
		assert_int_equal(radiance__w4a8_gemm(&dev, &bad, stream), -EINVAL);
		if (dev.wgmma) {
			bad.m = m;
			bad.path = RADIANCE_W4A8_WGMMA;
			assert_int_equal(radiance__w4a8_gemm(&dev, &bad, stream), -EINVAL);
		}
		radiance__gpu_free(dx);
		radiance__gpu_free(dc);
		radiance__gpu_free(ds);
		radiance__gpu_free(dy);
		free(x);
		free(ref);
		free(y);
		free(codes);
		free(srow);
		free(scratch);
	}
	radiance__gpu_free(partials);
	radiance__gpu_free(counters);
	layer_drop(&L);
	return failures;
}

static void test_w4a8_y_rows(void **state)
{
	(void)state;
	NEED_GPU();
	/* split-K by the policy (deep), wide without, small, n % 16 == 8, n % 8
	 * != 0; kept small enough that the CPU references (every m, scalar)
	 * take seconds, not minutes */
	static const uint32_t shapes[][2] = {{1024, 8192}, {4096, 1024}, {384, 384}, {200, 640}, {100, 1152}};
	int failures = 0;
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		failures += y_rows_shape(shapes[i][0], shapes[i][1]);
	assert_int_equal(failures, 0);
}

/* ---------------------------------------------------------- backend */

/* A request of m rows at x and y (an arena's): x filled, y and the guard
 * row after it poisoned. */
static struct radiance_rows request_make(uint16_t *x, uint16_t *y, uint32_t m, const struct radiance_layer *l,
					 enum radiance_dtype dt, int special)
{
	fill_x(x, m, l->k, dt, special);
	for (size_t i = 0; i < (size_t)(m + 1) * l->n; i++)
		y[i] = 0x7FC1;
	return (struct radiance_rows){.x = x, .y = y, .m = m, .dtype = dt};
}

/* request_make for a request laid out at *off in buf (len bytes): x, then
 * y and its guard row, each at a multiple of 64 bytes; *off moves past. */
static struct radiance_rows request_at(uint8_t *buf, size_t len, size_t *off, uint32_t m,
				       const struct radiance_layer *l, enum radiance_dtype dt, int special)
{
	uint16_t *x = (uint16_t *)(buf + *off);
	*off += ((size_t)m * l->k * 2 + 63) & ~(size_t)63;
	uint16_t *y = (uint16_t *)(buf + *off);
	*off += ((size_t)(m + 1) * l->n * 2 + 63) & ~(size_t)63;   /* + a guard row */
	assert_true(*off <= len);
	return request_make(x, y, m, l, dt, special);
}

/* A gpu backend with opt, or the test fails saying why. */
static struct radiance_backend *backend_ok(const struct radiance_backend_options *opt)
{
	struct radiance_backend *be = NULL;
	char err[256] = "";
	const int rc = radiance_backend_create(opt, &be, err, sizeof err);
	if (rc)
		printf("# backend create: %s\n", err);
	assert_int_equal(rc, 0);
	return be;
}

/* An arena like a session's: len bytes, page-aligned, filled with 0xA5 and
 * registered with be (unregister and free it after). */
static uint8_t *arena_registered(struct radiance_backend *be, size_t len)
{
	char err[256] = "";
	uint8_t *arena = aligned_alloc(4096, len);
	assert_non_null(arena);
	memset(arena, 0xA5, len);
	const int rc = radiance_backend_register_host(be, arena, len, err, sizeof err);
	if (rc)
		printf("# register_host: %s\n", err);
	assert_int_equal(rc, 0);
	return arena;
}

/* Random bf16 weights [n][k] (small) and a bias [n], malloc'ed. */
static void bf16_make(uint32_t n, uint32_t k, uint16_t **w, float **bias)
{
	*w = malloc((size_t)n * k * 2);
	*bias = malloc(n * 4);
	assert_non_null(*w);
	assert_non_null(*bias);
	for (size_t i = 0; i < (size_t)n * k; i++)
		(*w)[i] = radiance_bf16_from_f32(nrand() * 0.05f);
	for (uint32_t i = 0; i < n; i++)
		(*bias)[i] = nrand();
}

static void linear_ok(struct radiance_backend *be, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows)
{
	char err[256] = "";
	const int rc = radiance_backend_linear(be, l, h, rows, nrows, err, sizeof err);
	if (rc)
		printf("# linear: %s\n", err);
	assert_int_equal(rc, 0);
}

/* The row after a request's y is untouched. */
static void guard_check(const struct radiance_rows *r, const struct radiance_layer *l)
{
	for (uint32_t i = 0; i < l->n; i++)
		assert_int_equal(r->y[(size_t)r->m * l->n + i], 0x7FC1);
}

/* The rows r of a launch of launch_m rows against the CPU reference: past
 * the decode band, a W4A8 launch is the default prefill, fast (fp8 wgmma)
 * where it runs, checked against the contract's fp8-sm90 bound; every
 * other within compare's tolerance. */
static void rows_verify(const char *what, const struct radiance_layer *l, const struct radiance_rows *r,
			uint32_t launch_m)
{
	const int w4a8 = l->kind == RADIANCE_LAYER_W4A8;
	uint16_t *ref = malloc((size_t)r->m * l->n * 2);
	assert_non_null(ref);
	if (!w4a8) {
		radiance_cpu_bf16(r->x, r->dtype, r->m, l->weight, l->bias, l->n, l->k, ref);
	} else {
		void *scr = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(r->m, l->k) + 63) & ~63ul);
		radiance_cpu_w4a8(r->x, r->dtype, r->m, l->qweight, l->scales, l->bias, l->n, l->k, ref, scr);
		free(scr);
	}
	if (w4a8 && launch_m > 64 && dev.wgmma) {
		uint8_t *codes = malloc((size_t)r->m * l->k);
		float *s = malloc(r->m * sizeof *s);
		for (uint32_t q = 0; q < r->m; q++)
			s[q] = radiance_quant_row_e4m3((const uint16_t *)r->x + (size_t)q * l->k, r->dtype, l->k,
						       codes + (size_t)q * l->k);
		assert_int_equal(check_bound(what, codes, s, l->qweight, l->scales, l->bias, r->m, l->n, l->k,
					     RADIANCE_ACC_FP8_SM90, r->y, ref),
				 0);
		free(codes);
		free(s);
	} else {
		assert_int_equal(compare(what, r->y, ref, r->m, l->n, 0), 0);
	}
	free(ref);
}

/* pin_piece_kib: the arena registered as one range (0) or in pieces of
 * that many KiB, which zero-copy kernels read across and copies are split
 * at (backend_gpu.c copy_host) */
static void backend_ops(uint32_t pin_piece_kib)
{
	NEED_GPU();
	const uint32_t n = 200, k = 640, nb = 136, kb = 300;
	struct layer_data L;
	layer_make(&L, n, k, 1);
	struct radiance_layer lw = {.name = "test.w4a8", .kind = RADIANCE_LAYER_W4A8, .n = n, .k = k,
				    .qweight = L.qweight, .scales = L.scales, .bias = L.bias};
	uint16_t *wb;
	float *bb;
	bf16_make(nb, kb, &wb, &bb);
	struct radiance_layer lb = {.name = "test.bf16", .kind = RADIANCE_LAYER_BF16, .n = nb, .k = kb,
				    .weight = wb, .bias = bb};

	struct radiance_backend_options opt = {.kind = "gpu", .device = 0, .max_rows = 160,
					       .max_decode_rows = 64, .max_n = 256, .max_k = 1024,
					       .zero_copy_rows = 64, .pin_piece_kib = pin_piece_kib};
	struct radiance_backend *be = backend_ok(&opt);
	char err[256] = "";
	struct radiance_backend_info info;
	radiance_backend_info(be, &info);
	printf("# backend %s on %s, %.1f MiB scratch\n", info.name, info.device, info.scratch_bytes / 1048576.0);
	struct radiance_backend_layer *hw = NULL, *hb = NULL;
	assert_int_equal(radiance_backend_layer_upload(be, &lw, &hw, err, sizeof err), 0);
	assert_int_equal(radiance_backend_layer_upload(be, &lb, &hb, err, sizeof err), 0);

	/* an arena like a session's: page-aligned, registered, requests inside */
	const size_t arena_len = 8u << 20;
	uint8_t *arena = arena_registered(be, arena_len);

	/* the last two groups are all bf16: one run of four requests, which
	 * the backend gathers from and scatters back to the arena in one kernel
	 * each (zero_copy_rows), and one launch of 120 rows (the prefill
	 * kernel); the others alternate dtypes, a launch per request */
	static const uint32_t groups[][4] = {{1, 5, 17, 0}, {64, 0, 0, 0}, {40, 60, 50, 0}, {3, 2, 1, 7},
					     {2, 9, 1, 4}, {70, 30, 20, 0}};
	for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
		for (int layer = 0; layer < 2; layer++) {
			const struct radiance_layer *l = layer ? &lb : &lw;
			struct radiance_rows rows[4];
			size_t nrows = 0, off = 0;
			for (size_t j = 0; j < 4 && groups[gi][j]; j++) {
				const uint32_t m = groups[gi][j];
				const enum radiance_dtype dt = gi < 4 && ((gi + j) & 1) ? RADIANCE_DTYPE_FP16
										  : RADIANCE_DTYPE_BF16;
				rows[nrows++] = request_at(arena, arena_len, &off, m, l, dt, 0);
			}
			linear_ok(be, l, layer ? hb : hw, rows, nrows);
			for (size_t j = 0; j < nrows; j++) {
				/* the rows of request j's launch (a run of one
				 * dtype): past the decode band, a W4A8 launch is
				 * the default prefill, fast (fp8 wgmma) where it runs */
				size_t j0 = j, j1 = j + 1;
				while (j0 > 0 && rows[j0 - 1].dtype == rows[j].dtype)
					j0--;
				while (j1 < nrows && rows[j1].dtype == rows[j].dtype)
					j1++;
				uint32_t launch_m = 0;
				for (size_t q = j0; q < j1; q++)
					launch_m += rows[q].m;
				const struct radiance_rows *r = &rows[j];
				char what[128];
				snprintf(what, sizeof what, "backend %s request %zu of %zu (m=%u, %s)", l->name, j, nrows,
					 r->m, r->dtype == RADIANCE_DTYPE_FP16 ? "fp16" : "bf16");
				rows_verify(what, l, r, launch_m);
				guard_check(r, l);
			}
		}
	}
	/* more rows than max_rows: refused, nothing run */
	struct radiance_rows big = {.x = arena, .y = (uint16_t *)(arena + (4u << 20)), .m = 161,
				    .dtype = RADIANCE_DTYPE_BF16};
	assert_int_equal(radiance_backend_linear(be, &lw, hw, &big, 1, err, sizeof err), -E2BIG);

	radiance_backend_unregister_host(be, arena);
	radiance_backend_layer_free(be, hw);
	radiance_backend_layer_free(be, hb);
	radiance_backend_destroy(be);
	free(arena);
	free(wb);
	free(bb);
	layer_drop(&L);
}

static void test_backend_ops(void **state)
{
	(void)state;
	backend_ops(0);
}

/* 16 KiB pieces: every request's rows cross several */
static void test_backend_ops_pieces(void **state)
{
	(void)state;
	backend_ops(16);
}

/* Zero-copy launches (run_mapped), each request of a group in an arena of
 * its own, registered apart. */
enum { ZC_ARENAS = 8 };

/* Where request j of group gi (m rows) lies in its arena, its dtype, and
 * whether its first rows are the special ones of fill_x. */
struct zc_place {
	size_t x_off, y_off;   /* bytes into the arena; a guard row before y and one after */
	enum radiance_dtype dt;
	int special;
};
typedef struct zc_place (*zc_place_fn)(size_t gi, size_t j, uint32_t m);

/* Two W4A8 layers (the first with a bias) and the arenas. */
struct zc_fixture {
	struct layer_data L[2];
	struct radiance_layer lw[2];
	uint8_t *arena[ZC_ARENAS];
	size_t arena_len;
};

static void zc_setup(struct zc_fixture *f, const uint32_t (*shapes)[2], char *const *names, size_t arena_len)
{
	for (int si = 0; si < 2; si++) {
		layer_make(&f->L[si], shapes[si][0], shapes[si][1], si == 0);
		f->lw[si] = (struct radiance_layer){.name = names[si], .kind = RADIANCE_LAYER_W4A8, .n = shapes[si][0],
						    .k = shapes[si][1], .qweight = f->L[si].qweight,
						    .scales = f->L[si].scales, .bias = f->L[si].bias};
	}
	f->arena_len = arena_len;
	for (int a = 0; a < ZC_ARENAS; a++) {
		f->arena[a] = aligned_alloc(4096, arena_len);
		assert_non_null(f->arena[a]);
	}
}

static void zc_drop(struct zc_fixture *f)
{
	for (int a = 0; a < ZC_ARENAS; a++)
		free(f->arena[a]);
	for (int si = 0; si < 2; si++)
		layer_drop(&f->L[si]);
}

/* A backend with opt; each group of requests through both layers in one
 * linear call, every request against the CPU reference and the rows
 * before and after each y untouched. */
static void zero_copy_groups(const struct radiance_backend_options *opt, struct zc_fixture *f,
			     const uint32_t (*groups)[ZC_ARENAS], size_t ngroups, zc_place_fn place, const char *label)
{
	const struct radiance_layer *lw = f->lw;
	uint8_t **arena = f->arena;
	const size_t arena_len = f->arena_len;
	const int nl = 2;
	char err[256] = "";
	struct radiance_backend *be = NULL;
	int rc = radiance_backend_create(opt, &be, err, sizeof err);
	if (rc)
		printf("# backend create: %s\n", err);
	assert_int_equal(rc, 0);
	struct radiance_backend_layer *h[2];
	for (int si = 0; si < nl; si++)
		assert_int_equal(radiance_backend_layer_upload(be, &lw[si], &h[si], err, sizeof err), 0);
	for (int a = 0; a < ZC_ARENAS; a++) {
		memset(arena[a], 0xA5, arena_len);
		assert_int_equal(radiance_backend_register_host(be, arena[a], arena_len, err, sizeof err), 0);
	}
	for (size_t gi = 0; gi < ngroups; gi++) {
		for (int si = 0; si < nl; si++) {
			const struct radiance_layer *l = &lw[si];
			struct radiance_rows rows[ZC_ARENAS];
			size_t nrows = 0;
			for (size_t j = 0; j < ZC_ARENAS && groups[gi][j]; j++) {
				const uint32_t m = groups[gi][j];
				const struct zc_place pl = place(gi, j, m);
				uint16_t *x = (uint16_t *)(arena[j] + pl.x_off);
				uint16_t *y = (uint16_t *)(arena[j] + pl.y_off + (size_t)l->n * 2);
				for (uint32_t i = 0; i < l->n; i++)
					(y - l->n)[i] = 0x7FC1;   /* the guard row before y */
				rows[nrows++] = request_make(x, y, m, l, pl.dt, pl.special);
			}
			linear_ok(be, l, h[si], rows, nrows);
			for (size_t j = 0; j < nrows; j++) {
				const struct radiance_rows *r = &rows[j];
				uint16_t *ref = malloc((size_t)r->m * l->n * 2);
				void *scr = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(r->m, l->k) + 63) & ~63ul);
				radiance_cpu_w4a8(r->x, r->dtype, r->m, l->qweight, l->scales, l->bias, l->n, l->k, ref, scr);
				char what[192];
				snprintf(what, sizeof what, "%s, %s, group %zu request %zu of %zu (m=%u, %s)", label, l->name,
					 gi, j, nrows, r->m, r->dtype == RADIANCE_DTYPE_FP16 ? "fp16" : "bf16");
				assert_int_equal(compare(what, r->y, ref, r->m, l->n, 0), 0);
				guard_check(r, l);
				for (uint32_t i = 0; i < l->n; i++)
					assert_int_equal((r->y - l->n)[i], 0x7FC1);
				free(scr);
				free(ref);
			}
		}
	}
	for (int a = 0; a < ZC_ARENAS; a++)
		radiance_backend_unregister_host(be, arena[a]);
	for (int si = 0; si < nl; si++)
		radiance_backend_layer_free(be, h[si]);
	radiance_backend_destroy(be);
}

/* x at a 16-byte offset that is no multiple of 64, y at 2 MiB; group 3
 * alternates dtypes, request 2 of group 1 is fp16; the first request of
 * up to 5 rows: zero, NaN, -Inf, denormal and tie rows (no huge row, whose
 * outputs would set the tolerance of the others) */
static struct zc_place zc_place_requests(size_t gi, size_t j, uint32_t m)
{
	const int fp16 = (gi == 3 && (j & 1)) || (gi == 1 && j == 2);
	return (struct zc_place){.x_off = 16 * (1 + j), .y_off = (2u << 20) - 1024,
				 .dt = fp16 ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16, .special = j == 0 && m <= 5};
}

/* Zero-copy launches of several requests: with x limits that read every
 * request's x in place (radiance__gpu_quant_rows over the arenas'
 * mappings), that gather it first because one request is above the limit,
 * and 0 (always gather, always scatter); one request alone (y in place);
 * mixed dtypes (one launch per run); 64 rows, the most zero_copy_rows
 * allows (every launch stays in the decode band, whatever the prefill
 * setting). Rows of 10 KiB (k = 5120) and 34 KiB (k = 17408). */
/* The kernels are loaded when the backend is created (radiance__gpu_preload),
 * so the device memory in use does not grow while requests of every size
 * run (the driver loads a kernel, and takes device memory for its module,
 * at its first launch under lazy module loading, CUDA's default: a request
 * pays it, and a chaos run's device memory ended 2 MiB above its
 * baseline). First in the list, so that no other test has launched a
 * kernel in this process. RADIANCE_TEST_NO_PRELOAD=1 turns the load off
 * and expects the growth instead (that the check can see one). */
static void test_backend_kernels_loaded(void **state)
{
	(void)state;
	NEED_GPU();
	const int no_preload = getenv("RADIANCE_TEST_NO_PRELOAD") != NULL;
	const char *mode = getenv("CUDA_MODULE_LOADING");
	printf("# CUDA_MODULE_LOADING=%s, kernels %s\n", mode ? mode : "(unset: lazy)",
	       no_preload ? "left to the driver" : "loaded at create");
	static const uint32_t shapes[][2] = {{200, 640}, {320, 5120}};   /* n, k: the short and wide quants */
	struct layer_data L[2];
	struct radiance_layer l[2];
	struct radiance_backend_layer *h[2] = {NULL, NULL};
	const struct radiance_backend_options opt = {.kind = "gpu", .device = 0, .max_rows = 160,
						     .max_decode_rows = 64, .max_n = 512, .max_k = 5120,
						     .zero_copy_rows = 64, .zero_copy_x_kib = 40,
						     .zero_copy_y_kib = 1024, .test_no_preload = no_preload};
	struct radiance_backend *be = backend_ok(&opt);
	char err[256] = "";
	for (int i = 0; i < 2; i++) {
		layer_make(&L[i], shapes[i][0], shapes[i][1], i == 0);
		l[i] = (struct radiance_layer){.name = i ? "loaded.wide" : "loaded.short",
					       .kind = RADIANCE_LAYER_W4A8, .n = L[i].n, .k = L[i].k,
					       .qweight = L[i].qweight, .scales = L[i].scales, .bias = L[i].bias};
		assert_int_equal(radiance_backend_layer_upload(be, &l[i], &h[i], err, sizeof err), 0);
	}
	const size_t arena_len = 16u << 20;
	uint8_t *arena = arena_registered(be, arena_len);
	assert_int_equal(radiance__gpu_device_sync(), 0);
	size_t free0 = 0, free1 = 0, total = 0;
	assert_int_equal(radiance__gpu_mem_info(&free0, &total), 0);

	/* decode (M=1 alone and eight merged: per-row destinations), the
	 * matrix-core band, prefill (wgmma where it runs), both dtypes; x
	 * above 40 KiB gathered by the row-copy kernel */
	static const uint32_t groups[][8] = {{1}, {1, 1, 1, 1, 1, 1, 1, 1}, {5}, {40}, {3, 2, 1, 7}, {64}, {120},
					     {30, 90}};
	for (int i = 0; i < 2; i++)
		for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++)
			for (int fp16 = 0; fp16 < 2; fp16++) {
				struct radiance_rows rows[8];
				size_t nrows = 0, off = 0;
				uint32_t launch_m = 0;
				const enum radiance_dtype dt = fp16 ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
				for (size_t j = 0; j < 8 && groups[gi][j]; j++) {
					rows[nrows++] = request_at(arena, arena_len, &off, groups[gi][j], &l[i], dt, 0);
					launch_m += groups[gi][j];
				}
				linear_ok(be, &l[i], h[i], rows, nrows);
				for (size_t j = 0; j < nrows; j++) {
					char what[96];
					snprintf(what, sizeof what, "%s group %zu request %zu (m=%u, %s)", l[i].name, gi, j,
						 rows[j].m, fp16 ? "fp16" : "bf16");
					rows_verify(what, &l[i], &rows[j], launch_m);
				}
			}
	assert_int_equal(radiance__gpu_device_sync(), 0);
	assert_int_equal(radiance__gpu_mem_info(&free1, &total), 0);
	const double grew = ((double)free0 - (double)free1) / 1048576.0;
	printf("# device memory in use grew by %.2f MiB over the requests\n", grew);
	if (no_preload)
		assert_true(free1 < free0);
	else
		assert_true(free1 == free0);

	radiance_backend_unregister_host(be, arena);
	for (int i = 0; i < 2; i++) {
		radiance_backend_layer_free(be, h[i]);
		layer_drop(&L[i]);
	}
	radiance_backend_destroy(be);
	free(arena);
}

static void test_backend_zero_copy_requests(void **state)
{
	(void)state;
	NEED_GPU();
	static const uint32_t shapes[][2] = {{320, 5120}, {256, 17408}};   /* n, k */
	static char *const names[] = {"zc.k5120", "zc.k17408"};
	static const uint32_t limits[][2] = {{40, 64}, {16, 64}, {0, 0}};   /* x KiB, y KiB */
	static const uint32_t groups[][ZC_ARENAS] = {
		{1, 1, 1, 1, 1, 1, 1, 1},   /* lockstep clients at M=1 */
		{1, 3, 1, 2, 0, 0, 0, 0},   /* 3 rows of k = 17408: 102 KiB, above every limit */
		{5, 0, 0, 0, 0, 0, 0, 0},   /* one request: y in place */
		{1, 2, 1, 1, 0, 0, 0, 0},   /* alternating dtypes: four launches */
		{4, 60, 0, 0, 0, 0, 0, 0},  /* 64 rows: still zero-copy */
	};
	struct zc_fixture f;
	zc_setup(&f, shapes, names, 4u << 20);
	for (size_t li = 0; li < sizeof limits / sizeof limits[0]; li++) {
		const struct radiance_backend_options opt = {
			.kind = "gpu", .device = 0, .max_rows = 128, .max_decode_rows = 64, .max_n = 512,
			.max_k = 17408, .zero_copy_rows = 64, .zero_copy_x_kib = limits[li][0],
			.zero_copy_y_kib = limits[li][1], .pin_piece_kib = li == 1 ? 64 : 0};
		char label[64];
		snprintf(label, sizeof label, "zero-copy x %u KiB y %u KiB", limits[li][0], limits[li][1]);
		zero_copy_groups(&opt, &f, groups, sizeof groups / sizeof groups[0], zc_place_requests, label);
	}
	zc_drop(&f);
}

/* y at 16 (1 + 2j) bytes past a multiple of 64, 2 more for request 3 of
 * group 1 (only 2-byte aligned: that launch's 2-byte stores); bf16 */
static struct zc_place zc_place_y(size_t gi, size_t j, uint32_t m)
{
	(void)m;
	return (struct zc_place){.x_off = 64, .y_off = (512u << 10) + 16 * (1 + 2 * j) + (gi == 1 && j == 3 ? 2 : 0),
				 .dt = RADIANCE_DTYPE_BF16};
}

/* Several requests' y written in place by the GEMM (run_mapped with per-row
 * destinations): y at odd placements (zc_place_y); n = 200 (a half tile)
 * and n = 100 (n % 8 != 0: 2-byte stores). max_decode_rows 16: a launch of
 * 20 rows is out of the decode band and takes the staging buffer and the
 * scatter, 16 rows stay in place; the y limit of 2 KiB sends a request of
 * 9 rows of n = 200 (3.5 KiB) to the staging buffer too. */
static void test_backend_zero_copy_y_in_place(void **state)
{
	(void)state;
	NEED_GPU();
	static const uint32_t shapes[][2] = {{200, 640}, {100, 1152}};   /* n, k */
	static char *const names[] = {"yp.n200", "yp.n100"};
	static const uint32_t groups[][ZC_ARENAS] = {
		{1, 1, 1, 1, 1, 1, 1, 1},   /* lockstep clients at M=1 */
		{3, 1, 2, 5, 1, 0, 0, 0},   /* y of request 3 only 2-byte aligned */
		{8, 8, 0, 0, 0, 0, 0, 0},   /* 16 rows: the decode band's last */
		{10, 10, 0, 0, 0, 0, 0, 0}, /* 20 rows: past it, staged */
		{1, 9, 2, 0, 0, 0, 0, 0},   /* 9 rows of n = 200 above the y limit: staged */
	};
	struct zc_fixture f;
	zc_setup(&f, shapes, names, 1u << 20);
	const struct radiance_backend_options opt = {
		.kind = "gpu", .device = 0, .max_rows = 64, .max_decode_rows = 16, .max_n = 256, .max_k = 1152,
		.zero_copy_rows = 64, .zero_copy_x_kib = 64, .zero_copy_y_kib = 2};
	zero_copy_groups(&opt, &f, groups, sizeof groups / sizeof groups[0], zc_place_y, "y in place");
	zc_drop(&f);
}

/* ------------------------------------------------- the bulk pipeline */

/* One request run in pieces on the bulk lane, as the executor does: rows
 * [row, row + m) of x and y per piece. */
struct piece_req {
	struct radiance_rows whole;
	uint32_t piece;           /* rows per piece (the last one: what is left) */
};

static size_t pieces_of(const struct piece_req *q, struct radiance_rows *out, const struct radiance_layer *l)
{
	size_t n = 0;
	for (uint32_t row = 0; row < q->whole.m; row += q->piece) {
		const uint32_t m = q->whole.m - row < q->piece ? q->whole.m - row : q->piece;
		out[n++] = (struct radiance_rows){ .x = (const uint16_t *)q->whole.x + (size_t)row * l->k,
						   .y = q->whole.y + (size_t)row * l->n, .m = m,
						   .dtype = q->whole.dtype, .bulk = 1 };
	}
	return n;
}

static uint64_t start_ok(struct radiance_backend *be, const struct radiance_layer *l,
			 struct radiance_backend_layer *h, const struct radiance_rows *rows, size_t nrows)
{
	char err[256] = "";
	uint64_t ticket = 0;
	const int rc = radiance_backend_linear_start(be, l, h, rows, nrows, &ticket, err, sizeof err);
	if (rc)
		printf("# linear_start: %s\n", err);
	assert_int_equal(rc, 0);
	return ticket;
}

static void done_wait(struct radiance_backend *be, uint64_t ticket)
{
	char err[256] = "";
	int rc;
	while ((rc = radiance_backend_linear_done(be, ticket, err, sizeof err)) == 0)
		;
	if (rc < 0)
		printf("# linear_done: %s\n", err);
	assert_int_equal(rc, 1);
}

#define PIPE_MAX_PIECES 64

/* Several prefill requests of four and more pieces each, every piece of
 * every request queued on the bulk lane before the first is waited for
 * (the staging rows are shared out as rings: pieces of 256 rows fill the
 * 1024 rows and wrap; pieces of 200 wrap with a gap at the end; one piece
 * as big as the buffer; a last piece of 40 rows, which runs zero-copy
 * (run_mapped) in the arena and as copies out of unregistered memory),
 * W4A8 and bf16 layers, bf16 and fp16 activations. The zero-copy piece
 * with x gathered and y scattered through its own staging rows (limits 0),
 * and with both in place (the daemon's default limits: the GEMM's stores
 * to host memory on the lane's stream, the completion word on copy-out).
 * Every piece against the CPU reference and the guard row after every
 * request's y. */
static void pipeline_prefill(uint32_t zero_copy_kib)
{
	NEED_GPU();
	const uint32_t n = 512, k = 1024, nb = 136, kb = 320;
	struct layer_data L;
	layer_make(&L, n, k, 1);
	uint16_t *wb;
	float *bb;
	bf16_make(nb, kb, &wb, &bb);
	const struct radiance_layer layers[2] = {
		{.name = "pipe.w4a8", .kind = RADIANCE_LAYER_W4A8, .n = n, .k = k, .qweight = L.qweight,
		 .scales = L.scales, .bias = L.bias},
		{.name = "pipe.bf16", .kind = RADIANCE_LAYER_BF16, .n = nb, .k = kb, .weight = wb, .bias = bb},
	};
	struct radiance_backend_options opt = {.kind = "gpu", .device = 0, .max_rows = 1024, .max_decode_rows = 64,
					       .max_n = 512, .max_k = 1024, .zero_copy_rows = 64,
					       .zero_copy_x_kib = zero_copy_kib, .zero_copy_y_kib = zero_copy_kib};
	struct radiance_backend *be = backend_ok(&opt);
	char err[256] = "";
	struct radiance_backend_layer *h[2];
	for (int li = 0; li < 2; li++)
		assert_int_equal(radiance_backend_layer_upload(be, &layers[li], &h[li], err, sizeof err), 0);
	const size_t arena_len = 32u << 20;
	uint8_t *arena = aligned_alloc(4096, arena_len);
	const size_t plain_len = 8u << 20;
	uint8_t *plain = aligned_alloc(4096, plain_len);   /* never registered */
	assert_non_null(arena);
	assert_non_null(plain);
	memset(arena, 0xA5, arena_len);
	assert_int_equal(radiance_backend_register_host(be, arena, arena_len, err, sizeof err), 0);

	/* rows, piece, in the unregistered buffer */
	static const uint32_t reqs[][3] = {{1064, 256, 0}, {1000, 200, 0}, {1024, 1024, 0}, {700, 256, 1},
					   {1064, 256, 1}, {2048, 256, 0}};
	enum { NREQ = sizeof reqs / sizeof reqs[0] };
	for (int li = 0; li < 2; li++) {
		const struct radiance_layer *l = &layers[li];
		struct piece_req q[NREQ];
		struct radiance_rows pieces[PIPE_MAX_PIECES];
		uint64_t tickets[PIPE_MAX_PIECES];
		size_t np = 0, off = 0, poff = 0;
		for (size_t r = 0; r < NREQ; r++) {
			const uint32_t m = reqs[r][0];
			const enum radiance_dtype dt = (r & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
			q[r] = (struct piece_req){
				.whole = reqs[r][2] ? request_at(plain, plain_len, &poff, m, l, dt, 0)
						    : request_at(arena, arena_len, &off, m, l, dt, 0),
				.piece = reqs[r][1],
			};
			np += pieces_of(&q[r], pieces + np, l);
			assert_true(np <= PIPE_MAX_PIECES);
		}
		/* all queued, none waited for */
		for (size_t i = 0; i < np; i++)
			tickets[i] = start_ok(be, l, h[li], &pieces[i], 1);
		for (size_t i = 0; i < np; i++)
			done_wait(be, tickets[i]);
		for (size_t i = 0; i < np; i++) {
			char what[160];
			snprintf(what, sizeof what, "pipeline %s piece %zu of %zu (m=%u, %s)", l->name, i, np,
				 pieces[i].m, pieces[i].dtype == RADIANCE_DTYPE_FP16 ? "fp16" : "bf16");
			rows_verify(what, l, &pieces[i], pieces[i].m);
		}
		for (size_t r = 0; r < NREQ; r++)
			guard_check(&q[r].whole, l);
		printf("# %s, zero-copy limits %u KiB: %zu pieces of %d requests queued at once, all as the CPU\n",
		       l->name, zero_copy_kib, np, (int)NREQ);
	}
	radiance_backend_unregister_host(be, arena);
	for (int li = 0; li < 2; li++)
		radiance_backend_layer_free(be, h[li]);
	radiance_backend_destroy(be);
	free(arena);
	free(plain);
	free(wb);
	free(bb);
	layer_drop(&L);
}

static void test_backend_pipeline_prefill(void **state)
{
	(void)state;
	pipeline_prefill(0);
	pipeline_prefill(1024);
}

/* Decode-lane launches (zero-copy in the arena, and copies from
 * unregistered memory) queued between the pieces of two prefill requests
 * on the bulk lane, all in flight at once, then waited for in an order
 * other than the start order (decode first). Every result against the CPU
 * reference and every guard row. */
static void test_backend_pipeline_decode_mix(void **state)
{
	(void)state;
	NEED_GPU();
	const uint32_t n = 640, k = 2048;
	struct layer_data L;
	layer_make(&L, n, k, 1);
	const struct radiance_layer l = {.name = "mix.w4a8", .kind = RADIANCE_LAYER_W4A8, .n = n, .k = k,
					 .qweight = L.qweight, .scales = L.scales, .bias = L.bias};
	struct radiance_backend_options opt = {.kind = "gpu", .device = 0, .max_rows = 1024, .max_decode_rows = 64,
					       .max_n = 1024, .max_k = 2048, .zero_copy_rows = 64};
	struct radiance_backend *be = backend_ok(&opt);
	char err[256] = "";
	struct radiance_backend_layer *h = NULL;
	assert_int_equal(radiance_backend_layer_upload(be, &l, &h, err, sizeof err), 0);
	const size_t arena_len = 32u << 20;
	uint8_t *arena = aligned_alloc(4096, arena_len);
	const size_t plain_len = 4u << 20;
	uint8_t *plain = aligned_alloc(4096, plain_len);
	assert_non_null(arena);
	assert_non_null(plain);
	memset(arena, 0xA5, arena_len);
	assert_int_equal(radiance_backend_register_host(be, arena, arena_len, err, sizeof err), 0);

	size_t off = 0, poff = 0;
	struct piece_req q[2];
	struct radiance_rows pieces[PIPE_MAX_PIECES];
	size_t np = 0;
	for (int r = 0; r < 2; r++) {
		q[r] = (struct piece_req){
			.whole = request_at(arena, arena_len, &off, r ? 1000 : 1280, &l,
					    r ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16, 0),
			.piece = 256,
		};
		np += pieces_of(&q[r], pieces + np, &l);
	}
	/* decode requests: rows, in unregistered memory */
	static const uint32_t dec[][2] = {{1, 0}, {4, 1}, {16, 0}, {64, 0}, {3, 1}, {33, 0}, {1, 1}, {8, 0}, {64, 1}};
	enum { NDEC = sizeof dec / sizeof dec[0] };
	struct radiance_rows d[NDEC];
	for (size_t i = 0; i < NDEC; i++) {
		const enum radiance_dtype dt = (i & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
		d[i] = dec[i][1] ? request_at(plain, plain_len, &poff, dec[i][0], &l, dt, i == 0)
				 : request_at(arena, arena_len, &off, dec[i][0], &l, dt, i == 0);
	}
	/* interleaved: a decode launch after every piece, until they run out */
	uint64_t pt[PIPE_MAX_PIECES], dt[NDEC];
	for (size_t i = 0, j = 0; i < np || j < NDEC;) {
		if (i < np) {
			pt[i] = start_ok(be, &l, h, &pieces[i], 1);
			i++;
		}
		if (j < NDEC) {
			dt[j] = start_ok(be, &l, h, &d[j], 1);
			j++;
		}
	}
	for (size_t j = 0; j < NDEC; j++)
		done_wait(be, dt[j]);
	for (size_t i = np; i-- > 0;)   /* the last first: the bulk lane completes in order */
		done_wait(be, pt[i]);
	for (size_t i = 0; i < np; i++) {
		char what[160];
		snprintf(what, sizeof what, "mix: prefill piece %zu of %zu (m=%u)", i, np, pieces[i].m);
		rows_verify(what, &l, &pieces[i], pieces[i].m);
	}
	for (int r = 0; r < 2; r++)
		guard_check(&q[r].whole, &l);
	for (size_t j = 0; j < NDEC; j++) {
		char what[160];
		snprintf(what, sizeof what, "mix: decode launch %zu (m=%u%s)", j, d[j].m, dec[j][1] ? ", copied" : "");
		rows_verify(what, &l, &d[j], d[j].m);
		guard_check(&d[j], &l);
	}
	radiance_backend_unregister_host(be, arena);
	radiance_backend_layer_free(be, h);
	radiance_backend_destroy(be);
	free(arena);
	free(plain);
	layer_drop(&L);
}

/* Pieces of two layers of different k and n (W4A8 1024 -> 512, bf16 320
 * -> 136) queued in turn on the bulk lane, none waited for until all are:
 * each launch's staging rows are [max_k] / [max_n] wide, so the ranges of
 * the two layers' launches never share memory (rows at each layer's own k
 * would put a bf16 piece's rows 256..511 inside a W4A8 piece's rows
 * 0..255, with no guard between them). Every piece against the CPU. */
static void test_backend_pipeline_layers(void **state)
{
	(void)state;
	NEED_GPU();
	struct layer_data L;
	layer_make(&L, 512, 1024, 1);
	uint16_t *wb;
	float *bb;
	bf16_make(136, 320, &wb, &bb);
	const struct radiance_layer layers[2] = {
		{.name = "mixk.w4a8", .kind = RADIANCE_LAYER_W4A8, .n = 512, .k = 1024, .qweight = L.qweight,
		 .scales = L.scales, .bias = L.bias},
		{.name = "mixk.bf16", .kind = RADIANCE_LAYER_BF16, .n = 136, .k = 320, .weight = wb, .bias = bb},
	};
	struct radiance_backend_options opt = {.kind = "gpu", .device = 0, .max_rows = 1024, .max_decode_rows = 64,
					       .max_n = 512, .max_k = 1024, .zero_copy_rows = 64};
	struct radiance_backend *be = backend_ok(&opt);
	char err[256] = "";
	struct radiance_backend_layer *h[2];
	for (int li = 0; li < 2; li++)
		assert_int_equal(radiance_backend_layer_upload(be, &layers[li], &h[li], err, sizeof err), 0);
	const size_t arena_len = 32u << 20;
	uint8_t *arena = arena_registered(be, arena_len);
	size_t off = 0, np[2] = {0, 0};
	struct piece_req q[2];
	struct radiance_rows pieces[2][PIPE_MAX_PIECES / 2];
	uint64_t tickets[2][PIPE_MAX_PIECES / 2];
	for (int li = 0; li < 2; li++) {
		q[li] = (struct piece_req){
			.whole = request_at(arena, arena_len, &off, 2048, &layers[li],
					    li ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16, 0),
			.piece = 256,
		};
		np[li] = pieces_of(&q[li], pieces[li], &layers[li]);
	}
	for (size_t i = 0; i < np[0] || i < np[1]; i++)
		for (int li = 0; li < 2; li++)
			if (i < np[li])
				tickets[li][i] = start_ok(be, &layers[li], h[li], &pieces[li][i], 1);
	for (int li = 0; li < 2; li++)
		for (size_t i = 0; i < np[li]; i++)
			done_wait(be, tickets[li][i]);
	for (int li = 0; li < 2; li++) {
		for (size_t i = 0; i < np[li]; i++) {
			char what[160];
			snprintf(what, sizeof what, "two layers: %s piece %zu of %zu", layers[li].name, i, np[li]);
			rows_verify(what, &layers[li], &pieces[li][i], pieces[li][i].m);
		}
		guard_check(&q[li].whole, &layers[li]);
	}
	radiance_backend_unregister_host(be, arena);
	for (int li = 0; li < 2; li++)
		radiance_backend_layer_free(be, h[li]);
	radiance_backend_destroy(be);
	free(arena);
	free(wb);
	free(bb);
	layer_drop(&L);
}

/* NaN activations whose payload is only in their low bits (fp16
 * 0x7C01..0x7C07; bf16 0x7F81 and the like) through a bf16 layer: every
 * output of such a row is NaN, as on the CPU. For the BLAS GEMM an fp16 x
 * is split into bf16 hi + lo, and hi as the plain truncation of x turned
 * those NaNs into Inf: a row of +-Inf where the CPU has NaN (what
 * test_backend_pipeline_prefill's fp16 bf16-layer pieces met when a test
 * value overflowed fp16 into such a NaN). A quiet NaN and unchanged rows
 * beside them; both dtypes in one call (a launch each); on the decode
 * lane and as a bulk piece (the bulk lane's pipeline). */
static void test_backend_bf16_nan_payload(void **state)
{
	(void)state;
	NEED_GPU();
	const uint32_t n = 136, k = 320, m = 8;
	uint16_t *w;
	float *bias;
	bf16_make(n, k, &w, &bias);
	const struct radiance_layer l = {.name = "nan.bf16", .kind = RADIANCE_LAYER_BF16, .n = n, .k = k,
					 .weight = w, .bias = bias};
	struct radiance_backend_options opt = {.kind = "gpu", .device = 0, .max_rows = 128, .max_decode_rows = 64,
					       .max_n = 256, .max_k = 1024, .zero_copy_rows = 64};
	struct radiance_backend *be = backend_ok(&opt);
	char err[256] = "";
	struct radiance_backend_layer *h = NULL;
	assert_int_equal(radiance_backend_layer_upload(be, &l, &h, err, sizeof err), 0);
	const size_t len = 1u << 20;
	uint8_t *buf = aligned_alloc(4096, len);
	assert_non_null(buf);
	/* row r's NaN (0: none), one per row, at column (37 r + 5) % k */
	static const uint16_t nan_f16[] = {0, 0x7C01, 0xFC07, 0x7C04, 0x7E00, 0, 0x7C02, 0};
	static const uint16_t nan_bf16[] = {0, 0x7F81, 0xFF83, 0x7F82, 0x7FC0, 0, 0xFF81, 0};
	for (int bulk = 0; bulk < 2; bulk++) {
		struct radiance_rows rows[2];
		size_t off = 0;
		for (int d = 0; d < 2; d++) {
			const enum radiance_dtype dt = d ? RADIANCE_DTYPE_BF16 : RADIANCE_DTYPE_FP16;
			const uint16_t *nan = d ? nan_bf16 : nan_f16;
			rows[d] = request_at(buf, len, &off, m, &l, dt, 0);
			rows[d].bulk = bulk;
			for (uint32_t r = 0; r < m; r++)
				if (nan[r])
					((uint16_t *)rows[d].x)[(size_t)r * k + (37 * r + 5) % k] = nan[r];
		}
		linear_ok(be, &l, h, rows, 2);
		for (int d = 0; d < 2; d++) {
			const uint16_t *nan = d ? nan_bf16 : nan_f16;
			char what[128];
			snprintf(what, sizeof what, "bf16 layer, %s NaN payloads (%s)", d ? "bf16" : "fp16",
				 bulk ? "bulk piece" : "decode lane");
			rows_verify(what, &l, &rows[d], m);
			for (uint32_t r = 0; r < m; r++)
				for (uint32_t j = 0; j < n; j++) {
					const float v = radiance_bf16_to_f32(rows[d].y[(size_t)r * n + j]);
					if (isnan(v) != (nan[r] != 0))
						printf("# %s: row %u (x NaN 0x%04X): y[%u] = %g\n", what, r, nan[r], j, v);
					assert_int_equal(isnan(v) != 0, nan[r] != 0);
				}
			guard_check(&rows[d], &l);
		}
	}
	radiance_backend_layer_free(be, h);
	radiance_backend_destroy(be);
	free(buf);
	free(w);
	free(bias);
}

/* ------------------------------------------------------- checkpoint */

static void test_checkpoint_layers(void **state)
{
	(void)state;
	NEED_GPU();
	const char *data = getenv("RADIANCE_TEST_DATA") ? getenv("RADIANCE_TEST_DATA") : "tests/data";
	char dir[512], acts[512], err[512] = "";
	snprintf(dir, sizeof dir, "%s/minilm-w4g128", data);
	snprintf(acts, sizeof acts, "%s/minilm-acts.safetensors", data);
	struct radiance_model *model = NULL;
	struct radiance_st_file *st = NULL;
	int rc = radiance_checkpoint_load_dir(dir, NULL, NULL, NULL, &model, err, sizeof err);
	if (rc) {
		printf("# checkpoint %s not loadable (%s): skipped\n", dir, err);
		skip();
	}
	rc = radiance_st_load_path(acts, &st, err, sizeof err);
	if (rc) {
		printf("# activations %s not readable (%s): skipped\n", acts, err);
		radiance_model_destroy(model);
		skip();
	}
	uint32_t max_n = 0, max_k = 0, max_m = 1;
	for (size_t i = 0; i < model->n_layers; i++) {
		const struct radiance_layer *l = &model->layers[i];
		char name[512];
		snprintf(name, sizeof name, "%s.x", l->name);
		const struct radiance_st_tensor *t = radiance_st_find(st, name);
		max_n = l->n > max_n ? l->n : max_n;
		max_k = l->k > max_k ? l->k : max_k;
		if (t && t->ndim == 2 && t->shape[0] > max_m)
			max_m = (uint32_t)t->shape[0];
	}
	/* pass 0: the defaults (decode for these m <= 64);
	 * passes 1 and 2 where wgmma runs, with the decode band cut to 16 rows:
	 * prefill = fast (what auto picks there: the fp8 wgmma kernel for
	 * launches above 64 rows, the exact kernels below, all within the fp8
	 * bound), then prefill = exact (the f16 wgmma kernel from m = 33, the
	 * tiled one for m = 17..32) */
	size_t checked = 0, failed = 0;
	for (int pass = 0; pass < (dev.wgmma ? 3 : 1); pass++) {
		struct radiance_backend_options opt = {.kind = "gpu", .max_rows = max_m,
						       .max_decode_rows = pass ? 16 : 64, .max_n = max_n,
						       .max_k = max_k,
						       .prefill = pass == 1   ? RADIANCE_BACKEND_PREFILL_FAST
								  : pass == 2 ? RADIANCE_BACKEND_PREFILL_EXACT
									      : RADIANCE_BACKEND_PREFILL_AUTO};
		struct radiance_backend *be = NULL;
		assert_int_equal(radiance_backend_create(&opt, &be, err, sizeof err), 0);
		for (size_t i = 0; i < model->n_layers; i++) {
			const struct radiance_layer *l = &model->layers[i];
			char name[512];
			snprintf(name, sizeof name, "%s.x", l->name);
			const struct radiance_st_tensor *t = radiance_st_find(st, name);
			if (!t || t->dtype != RADIANCE_ST_F32 || t->ndim != 2 || t->shape[1] != l->k) {
				printf("# layer %s: no captured activations\n", l->name);
				continue;
			}
			const uint32_t m = (uint32_t)t->shape[0];
			uint16_t *x = malloc((size_t)m * l->k * 2), *y = malloc((size_t)m * l->n * 2);
			uint16_t *ref = malloc((size_t)m * l->n * 2);
			uint8_t *codes = malloc((size_t)m * l->k);
			float *s = malloc(m * sizeof *s);
			for (uint64_t j = 0; j < (uint64_t)m * l->k; j++)
				x[j] = radiance_bf16_from_f32(radiance_st_get_f32(t, j));
			struct radiance_backend_layer *h = NULL;
			assert_int_equal(radiance_backend_layer_upload(be, l, &h, err, sizeof err), 0);
			struct radiance_rows r = {.x = x, .y = y, .m = m, .dtype = RADIANCE_DTYPE_BF16};
			assert_int_equal(radiance_backend_linear(be, l, h, &r, 1, err, sizeof err), 0);
			char what[600];
			snprintf(what, sizeof what, "checkpoint %s (%s %ux%u, m=%u, %s)", l->name,
				 l->kind == RADIANCE_LAYER_W4A8 ? "w4a8" : "bf16", l->n, l->k, m,
				 pass == 1 ? "prefill fast" : pass == 2 ? "prefill exact" : "defaults");
			if (l->kind == RADIANCE_LAYER_W4A8) {
				for (uint32_t q = 0; q < m; q++)
					s[q] = radiance_quant_row_e4m3(x + (size_t)q * l->k, RADIANCE_DTYPE_BF16, l->k,
								       codes + (size_t)q * l->k);
				radiance_cpu_w4a8_gemm(codes, s, m, l->qweight, l->scales, l->bias, l->n, l->k, ref);
				failed += check_bound(what, codes, s, l->qweight, l->scales, l->bias, m, l->n, l->k,
						      pass == 1 ? RADIANCE_ACC_FP8_SM90 : RADIANCE_ACC_FP32, y, ref) != 0;
				if (pass != 1)
					failed += compare(what, y, ref, m, l->n, 0) != 0;
			} else {
				radiance_cpu_bf16(x, RADIANCE_DTYPE_BF16, m, l->weight, l->bias, l->n, l->k, ref);
				failed += compare(what, y, ref, m, l->n, 0) != 0;
			}
			checked++;
			radiance_backend_layer_free(be, h);
			free(x);
			free(y);
			free(ref);
			free(codes);
			free(s);
		}
		radiance_backend_destroy(be);
	}
	printf("# checkpoint: %zu layer runs checked against the CPU reference and the bound, %zu out of "
	       "tolerance\n", checked, failed);
	radiance_st_close(st);
	radiance_model_destroy(model);
	assert_true(checked > 0);
	assert_int_equal(failed, 0);
}

#else /* CPU-only build */

static int setup(void **state)
{
	(void)state;
	printf("# this build has no GPU backend (build with make GPU=cuda or GPU=hip): "
	       "every test is skipped\n");
	return 0;
}

static int teardown(void **state) { (void)state; return 0; }
static void test_quant_codes(void **state) { (void)state; skip(); }
static void test_backend_kernels_loaded(void **state) { (void)state; skip(); }
static void test_quant_rows_once(void **state) { (void)state; skip(); }
static void test_quant_sources(void **state) { (void)state; skip(); }
static void test_w4a8_narrow(void **state) { (void)state; skip(); }
static void test_w4a8_splitk(void **state) { (void)state; skip(); }
static void test_w4a8_wide(void **state) { (void)state; skip(); }
static void test_w4a8_odd_n(void **state) { (void)state; skip(); }
static void test_layer_chain(void **state) { (void)state; skip(); }
static void test_fused_quant(void **state) { (void)state; skip(); }
static void test_w4a8_y_rows(void **state) { (void)state; skip(); }
static void test_backend_ops(void **state) { (void)state; skip(); }
static void test_backend_ops_pieces(void **state) { (void)state; skip(); }
static void test_backend_zero_copy_requests(void **state) { (void)state; skip(); }
static void test_backend_zero_copy_y_in_place(void **state) { (void)state; skip(); }
static void test_backend_pipeline_prefill(void **state) { (void)state; skip(); }
static void test_backend_pipeline_decode_mix(void **state) { (void)state; skip(); }
static void test_checkpoint_layers(void **state) { (void)state; skip(); }
static void test_backend_bf16_nan_payload(void **state) { (void)state; skip(); }
static void test_backend_pipeline_layers(void **state) { (void)state; skip(); }

#endif

int main(void)
{
	const struct CMUnitTest tests[] = {
		/* first: no kernel launched in this process before it */
		cmocka_unit_test(test_backend_kernels_loaded),
		cmocka_unit_test(test_quant_codes),
		cmocka_unit_test(test_quant_rows_once),
		cmocka_unit_test(test_quant_sources),
		cmocka_unit_test(test_w4a8_narrow),
		cmocka_unit_test(test_w4a8_splitk),
		cmocka_unit_test(test_w4a8_wide),
		cmocka_unit_test(test_w4a8_odd_n),
		cmocka_unit_test(test_layer_chain),
		cmocka_unit_test(test_fused_quant),
		cmocka_unit_test(test_w4a8_y_rows),
		cmocka_unit_test(test_backend_ops),
		cmocka_unit_test(test_backend_ops_pieces),
		cmocka_unit_test(test_backend_zero_copy_requests),
		cmocka_unit_test(test_backend_zero_copy_y_in_place),
		cmocka_unit_test(test_backend_pipeline_prefill),
		cmocka_unit_test(test_backend_pipeline_decode_mix),
		cmocka_unit_test(test_checkpoint_layers),
		/* last: their random data leave the other tests' as they were */
		cmocka_unit_test(test_backend_bf16_nan_payload),
		cmocka_unit_test(test_backend_pipeline_layers),
	};
	/* RADIANCE_TEST_FILTER: run only the tests whose names match (cmocka's
	 * pattern: * and ?), e.g. on a device whose time is short */
	if (getenv("RADIANCE_TEST_FILTER"))
		cmocka_set_test_filter(getenv("RADIANCE_TEST_FILTER"));
	return cmocka_run_group_tests_name("test_gpu", tests, setup, teardown);
}
