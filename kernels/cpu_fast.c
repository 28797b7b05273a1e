/* The CPU fast path: level choice, work split and the scalar fallback; see
 * cpu_fast.h. The SIMD kernels are in cpu_avx2.c, cpu_avx512.c (x86-64) and
 * cpu_neon.c (aarch64). */
#include "cpu_fast.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_pool.h"
#include "cpu_simd.h"
#include "w4a8_cpu.h"

/* Below this many multiply-adds a call runs on the calling thread alone:
 * waking the pool costs more than it saves (e.g. M=1 on a 384x384 layer). */
#define PAR_MIN_MACS (1u << 19)
/* Rows of one GEMM task: 8 for the micro-kernels that unpack weights in
 * registers (they take at most 8 rows at once); W4A8 on fp32 activations
 * with at least RADIANCE__DEQ_MIN_ROWS rows unpacks a tile's weights once
 * and streams them to every block of 4 rows (cpu_avx2.c, w4a8_deq_tiles),
 * so its tasks are taller. */
#define TASK_ROWS 8
#define W4A8_TASK_ROWS RADIANCE__TILE_MAX_ROWS
/* Weight bytes of one task's column chunk when there are several row
 * blocks: small enough to stay in L2 while every row block passes over it. */
#define CHUNK_BYTES (256u << 10)

struct radiance_cpu_fast {
	enum radiance_cpu_simd simd;
	const char *simd_note;
	struct radiance_cpu_pool *pool;
	unsigned threads;
	const char *threads_source;
	uint32_t max_rows, max_k, ldx, ldg;
	void *scratch;             /* avx2, neon: xf [max_rows][ldx] fp32, or, avx2-int16,
	                              xh, xl [max_rows][ldx] int16 (W4A8) or, avx512,
	                              xb bf16 [max_rows rounded up to even][ldx] in
	                              the same bytes, then lof [max_rows][ldg], s [max_rows];
	                              scalar: per-task reference scratch */
	size_t scratch_bytes;
	size_t task_scratch;       /* scalar: bytes of one task's region */
	uint32_t task_rows;        /* scalar: rows of one task */
};

static size_t align64(size_t v)
{
	return (v + 63) & ~(size_t)63;
}

const char *radiance_cpu_simd_name(enum radiance_cpu_simd simd)
{
	switch (simd) {
	case RADIANCE_CPU_SIMD_SCALAR:
		return "scalar";
	case RADIANCE_CPU_SIMD_AVX2:
		return "avx2+fma";
	case RADIANCE_CPU_SIMD_AVX2_INT16:
		return "avx2-int16";
	case RADIANCE_CPU_SIMD_AVX512:
		return "avx512+bf16";
	case RADIANCE_CPU_SIMD_NEON:
		return "neon";
	default:
		return "auto";
	}
}

static int cpu_has(enum radiance_cpu_simd simd)
{
	if (simd == RADIANCE_CPU_SIMD_SCALAR)
		return 1;
#if defined(__x86_64__)
	/* libgcc's and compiler-rt's checks include the OS's XSAVE support
	 * (for AVX-512: the opmask and zmm state in XCR0) */
	__builtin_cpu_init();
	int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		   __builtin_cpu_supports("f16c");
	if (simd == RADIANCE_CPU_SIMD_AVX2 || simd == RADIANCE_CPU_SIMD_AVX2_INT16)
		return avx2;
	if (simd == RADIANCE_CPU_SIMD_AVX512)
		return avx2 && __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi") &&
		       __builtin_cpu_supports("avx512bf16");
#endif
#if defined(__aarch64__)
	/* Advanced SIMD is part of the AArch64 Linux ABI */
	if (simd == RADIANCE_CPU_SIMD_NEON)
		return 1;
#endif
	return 0;
}

#if defined(__x86_64__)
/* The avx512 kernels' bit-exactness rests on how vdpbf16ps rounds (two fp32
 * additions, element 2i+1 first, each rounded to nearest even: Intel's
 * definition). Before the level is used it is run here on a W4A8 layer
 * against the reference, bit for bit: rows of every pair/single kernel
 * shape, x from 2^-9 to 448 times e4m3 steps (sums that round at nearly
 * every addition), so another rounding order or a fused pair would show.
 * 0 when it matches. Runs once per process (about 0.3 ms). */
static int avx512_known_answer(void)
{
	enum { M = 9, N = 21, K = 384 };
	static uint16_t x[M * K], scales[N * (K / 128)], y[M * N], ref[M * N];
	static uint32_t qweight[N * (K / 8)];
	static float s[M];
	static uint16_t xb[(M + 1) * K] __attribute__((aligned(64)));
	static uint8_t scratch[1 << 16] __attribute__((aligned(64)));
	uint32_t seed = 12345;
	for (size_t i = 0; i < (size_t)M * K; i++) {
		seed = seed * 1664525u + 1013904223u;
		/* bf16 bits: sign, exponents 2^-12 .. 2^11, any mantissa */
		uint32_t e = 115 + (seed >> 8) % 24;
		x[i] = (uint16_t)(((seed >> 31) << 15) | (e << 7) | ((seed >> 16) & 0x7F));
	}
	for (size_t i = 0; i < (size_t)N * (K / 8); i++) {
		seed = seed * 1664525u + 1013904223u;
		qweight[i] = seed;
	}
	for (size_t i = 0; i < (size_t)N * (K / 128); i++)
		scales[i] = (uint16_t)(0x2000 + i * 37 % 0x1800);   /* fp16, 2^-7 .. 2^-1 */
	if (radiance_cpu_w4a8_scratch_bytes(M, K) > sizeof scratch)
		return -1;
	radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, M, qweight, scales, NULL, N, K, ref, scratch);
	for (uint32_t r = 0; r < M; r++)
		s[r] = radiance__quant_row_avx512(x + (size_t)r * K, RADIANCE_DTYPE_BF16, K, r, K, xb);
	struct radiance__w4a8_tile t = {
		.xb = xb, .s = s, .ldx = K, .k = K, .n = N, .r0 = 0, .r1 = M, .n0 = 0, .n1 = N,
		.qweight = qweight, .scales = scales, .y = y,
	};
	radiance__w4a8_tile_avx512(&t);
	return memcmp(y, ref, sizeof y) ? -1 : 0;
}
#endif

/* The level AUTO takes, and in *note why it passed over a better one. */
static enum radiance_cpu_simd auto_simd(const char **note)
{
	*note = "";
#if defined(__x86_64__)
	static int kat = 1;   /* 1: not run yet; else its result */
	if (cpu_has(RADIANCE_CPU_SIMD_AVX512)) {
		if (kat == 1)
			kat = avx512_known_answer();
		if (kat == 0)
			return RADIANCE_CPU_SIMD_AVX512;
		*note = "the CPU has AVX-512 BF16, but its dot products did not give the reference's "
			"bits (known-answer check), so avx2 was taken";
	}
#endif
	if (cpu_has(RADIANCE_CPU_SIMD_NEON))
		return RADIANCE_CPU_SIMD_NEON;
	return cpu_has(RADIANCE_CPU_SIMD_AVX2) ? RADIANCE_CPU_SIMD_AVX2 : RADIANCE_CPU_SIMD_SCALAR;
}

static int pick_simd(enum radiance_cpu_simd want, enum radiance_cpu_simd *out, const char **note,
		     char *err, size_t errlen)
{
	*note = "";
	if (want == RADIANCE_CPU_SIMD_AUTO) {
		*out = auto_simd(note);
		return 0;
	}
	if (want != RADIANCE_CPU_SIMD_SCALAR && want != RADIANCE_CPU_SIMD_AVX2 &&
	    want != RADIANCE_CPU_SIMD_AVX2_INT16 && want != RADIANCE_CPU_SIMD_AVX512 &&
	    want != RADIANCE_CPU_SIMD_NEON) {
		snprintf(err, errlen, "SIMD level %d is not one this build knows", (int)want);
		return -EINVAL;
	}
	if (!cpu_has(want)) {
		snprintf(err, errlen, "this CPU (or build) has no %s", radiance_cpu_simd_name(want));
		return -ENOTSUP;
	}
	if (want == RADIANCE_CPU_SIMD_AVX512 && auto_simd(note) != RADIANCE_CPU_SIMD_AVX512) {
		snprintf(err, errlen, "avx512+bf16 on this CPU gave other bits than the reference "
			 "(known-answer check); use avx2");
		return -ENOTSUP;
	}
	*out = want;
	return 0;
}

/* The scratch for f's level, threads, max_rows and max_k. */
static void scratch_plan(struct radiance_cpu_fast *f)
{
	if (f->simd == RADIANCE_CPU_SIMD_SCALAR) {
		/* the reference kernels on row slices, one scratch region per task */
		f->task_rows = (f->max_rows + f->threads - 1) / f->threads;
		f->task_scratch = align64(radiance_cpu_w4a8_scratch_bytes(f->task_rows, f->max_k));
		f->scratch_bytes = f->task_scratch * f->threads;
	} else {
		f->scratch_bytes = align64((size_t)f->max_rows * f->ldx * sizeof(float)) +
				   align64((size_t)f->max_rows * f->ldg) +
				   align64((size_t)f->max_rows * sizeof(float));
	}
}

size_t radiance_cpu_fast_scratch_bytes_for(const struct radiance_cpu_fast_options *opt)
{
	struct radiance_cpu_fast f = { 0 };
	char err[160];
	if (opt->max_rows == 0 || opt->max_k == 0 ||
	    pick_simd(opt->simd, &f.simd, &f.simd_note, err, sizeof err) < 0)
		return 0;
	f.threads = opt->threads ? opt->threads : radiance_cpu_usable_threads(NULL);
	f.max_rows = opt->max_rows;
	f.max_k = opt->max_k;
	f.ldx = (opt->max_k + 15) & ~15u;
	f.ldg = (opt->max_k + RADIANCE_GROUP_SIZE - 1) / RADIANCE_GROUP_SIZE;
	scratch_plan(&f);
	return f.scratch_bytes;
}

int radiance_cpu_fast_create(const struct radiance_cpu_fast_options *opt,
			     struct radiance_cpu_fast **out, char *err, size_t errlen)
{
	int rc;
	if (opt->max_rows == 0 || opt->max_k == 0) {
		snprintf(err, errlen, "cpu fast path: max_rows %u and max_k %u must be at least 1",
			 opt->max_rows, opt->max_k);
		return -EINVAL;
	}
	struct radiance_cpu_fast *f = calloc(1, sizeof *f);
	if (!f) {
		snprintf(err, errlen, "cpu fast path: out of memory");
		return -ENOMEM;
	}
	rc = pick_simd(opt->simd, &f->simd, &f->simd_note, err, errlen);
	if (rc < 0)
		goto fail_simd;
	if (opt->threads) {
		f->threads = opt->threads;
		f->threads_source = "cpu_threads";
	} else {
		f->threads = radiance_cpu_usable_threads(&f->threads_source);
	}
	f->max_rows = opt->max_rows;
	f->max_k = opt->max_k;
	f->ldx = (opt->max_k + 15) & ~15u;   /* rows of xf start 64-byte aligned */
	f->ldg = (opt->max_k + RADIANCE_GROUP_SIZE - 1) / RADIANCE_GROUP_SIZE;
	scratch_plan(f);
	f->scratch = aligned_alloc(64, f->scratch_bytes);
	if (!f->scratch) {
		snprintf(err, errlen, "cpu fast path: out of memory for %zu bytes (%.1f GiB) of "
			 "activation scratch, sized by max_rows %u x max_k %u; lower --max-rows "
			 "or --max-k", f->scratch_bytes, (double)f->scratch_bytes / (1u << 30),
			 opt->max_rows, opt->max_k);
		rc = -ENOMEM;
		goto fail_scratch;
	}
	rc = radiance_cpu_pool_create(f->threads, &f->pool);
	if (rc < 0) {
		snprintf(err, errlen, "cpu fast path: starting %u threads: %s", f->threads,
			 strerror(-rc));
		goto fail_pool;
	}
	*out = f;
	return 0;

fail_pool:
	free(f->scratch);
fail_scratch:
fail_simd:
	free(f);
	return rc;
}

void radiance_cpu_fast_destroy(struct radiance_cpu_fast *f)
{
	if (!f)
		return;
	radiance_cpu_pool_destroy(f->pool);
	free(f->scratch);
	free(f);
}

enum radiance_cpu_simd radiance_cpu_fast_simd(const struct radiance_cpu_fast *f)
{
	return f->simd;
}

const char *radiance_cpu_fast_simd_note(const struct radiance_cpu_fast *f)
{
	return f->simd_note;
}

unsigned radiance_cpu_fast_threads(const struct radiance_cpu_fast *f)
{
	return f->threads;
}

const char *radiance_cpu_fast_threads_source(const struct radiance_cpu_fast *f)
{
	return f->threads_source;
}

size_t radiance_cpu_fast_scratch_bytes(const struct radiance_cpu_fast *f)
{
	return f->scratch_bytes;
}

static unsigned width_for(const struct radiance_cpu_fast *f, uint32_t m, uint32_t n, uint32_t k)
{
	return (uint64_t)m * n * k < PAR_MIN_MACS ? 1 : f->threads;
}

/* ---- the scalar level: the reference on row slices -------------------------- */

struct scalar_job {
	struct radiance_cpu_fast *f;
	const uint16_t *x;
	enum radiance_dtype dtype;
	uint32_t m, n, k;
	const uint32_t *qweight;
	const uint16_t *scales;
	const uint16_t *weight;
	const float *bias;
	uint16_t *y;
};

static void scalar_task(void *arg, uint32_t task)
{
	const struct scalar_job *j = arg;
	uint32_t r0 = task * j->f->task_rows;
	uint32_t rows = j->m - r0 < j->f->task_rows ? j->m - r0 : j->f->task_rows;
	const uint16_t *x = j->x + (size_t)r0 * j->k;
	uint16_t *y = j->y + (size_t)r0 * j->n;
	if (j->qweight)
		radiance_cpu_w4a8(x, j->dtype, rows, j->qweight, j->scales, j->bias, j->n, j->k, y,
				  (uint8_t *)j->f->scratch + (size_t)task * j->f->task_scratch);
	else
		radiance_cpu_bf16(x, j->dtype, rows, j->weight, j->bias, j->n, j->k, y);
}

static void scalar_run(struct radiance_cpu_fast *f, struct scalar_job *j)
{
	uint32_t tasks = (j->m + f->task_rows - 1) / f->task_rows;
	radiance_cpu_pool_run(f->pool, width_for(f, j->m, j->n, j->k), tasks, scalar_task, j);
}

/* ---- the SIMD levels ---------------------------------------------------------- */

#if defined(__x86_64__) || defined(__aarch64__)
#define HAVE_SIMD_LEVELS 1
#endif

#ifdef HAVE_SIMD_LEVELS
struct fast_job {
	struct radiance_cpu_fast *f;
	enum radiance_cpu_simd simd;   /* this call's W4A8 kernels (w4a8_level) */
	const uint16_t *x;
	enum radiance_dtype dtype;
	uint32_t m, n, k;
	float *xf, *s;
	int16_t *xh, *xl;
	uint8_t *lof;
	uint32_t task_rows, row_blocks, chunk_cols;
	struct radiance__w4a8_tile w4a8;
	struct radiance__bf16_tile bf16;
};

static void quant_task(void *arg, uint32_t r)
{
	struct fast_job *j = arg;
#if defined(__aarch64__)
	j->s[r] = radiance__quant_row_neon(j->x + (size_t)r * j->k, j->dtype, j->k,
					   j->xf + (size_t)r * j->f->ldx);
#else
	if (j->simd == RADIANCE_CPU_SIMD_AVX512) {
		j->s[r] = radiance__quant_row_avx512(j->x + (size_t)r * j->k, j->dtype, j->k, r,
						     j->f->ldx, (uint16_t *)j->f->scratch);
		return;
	}
	if (j->simd != RADIANCE_CPU_SIMD_AVX2_INT16) {
		j->s[r] = radiance__quant_row_avx2(j->x + (size_t)r * j->k, j->dtype, j->k,
						   j->xf + (size_t)r * j->f->ldx);
		return;
	}
	j->s[r] = radiance__quant_row_i16_avx2(j->x + (size_t)r * j->k, j->dtype, j->k,
					       j->xh + (size_t)r * j->f->ldx,
					       j->xl + (size_t)r * j->f->ldx,
					       j->lof + (size_t)r * j->f->ldg);
#endif
}

static void widen_task(void *arg, uint32_t r)
{
	struct fast_job *j = arg;
#if defined(__aarch64__)
	radiance__widen_row_neon(j->x + (size_t)r * j->k, j->dtype, j->k,
				 j->xf + (size_t)r * j->f->ldx);
#else
	radiance__widen_row_avx2(j->x + (size_t)r * j->k, j->dtype, j->k,
				 j->xf + (size_t)r * j->f->ldx);
#endif
}

/* Task t: column chunk t / row_blocks, row block t % row_blocks, so one
 * thread's consecutive tasks pass over one chunk of weights. */
static void tile_bounds(const struct fast_job *j, uint32_t t, uint32_t *r0, uint32_t *r1,
			uint32_t *n0, uint32_t *n1)
{
	uint32_t rb = t % j->row_blocks, cc = t / j->row_blocks;
	*r0 = rb * j->task_rows;
	*r1 = *r0 + j->task_rows < j->m ? *r0 + j->task_rows : j->m;
	*n0 = cc * j->chunk_cols;
	*n1 = *n0 + j->chunk_cols < j->n ? *n0 + j->chunk_cols : j->n;
}

static void w4a8_task(void *arg, uint32_t t)
{
	struct fast_job *j = arg;
	struct radiance__w4a8_tile tile = j->w4a8;
	tile_bounds(j, t, &tile.r0, &tile.r1, &tile.n0, &tile.n1);
#if defined(__aarch64__)
	radiance__w4a8_tile_neon(&tile);
#else
	if (j->simd == RADIANCE_CPU_SIMD_AVX2_INT16)
		radiance__w4a8i_tile_avx2(&tile);
	else if (j->simd == RADIANCE_CPU_SIMD_AVX512)
		radiance__w4a8_tile_avx512(&tile);
	else
		radiance__w4a8_tile_avx2(&tile);
#endif
}

static void bf16_task(void *arg, uint32_t t)
{
	struct fast_job *j = arg;
	struct radiance__bf16_tile tile = j->bf16;
	tile_bounds(j, t, &tile.r0, &tile.r1, &tile.n0, &tile.n1);
#if defined(__aarch64__)
	radiance__bf16_tile_neon(&tile);
#else
	radiance__bf16_tile_avx2(&tile);
#endif
}

/* Splits M by row blocks of task_rows and N into column chunks: about
 * eight tasks per thread in all (a thread that loses its core to another
 * process takes fewer), and with several row blocks chunks of at most about
 * CHUNK_BYTES of weights (one thread's consecutive tasks reuse them). */
static uint32_t plan(struct fast_job *j, unsigned width, size_t weight_row_bytes)
{
	j->row_blocks = (j->m + j->task_rows - 1) / j->task_rows;
	uint32_t want = width * 8;
	uint32_t chunks = j->row_blocks >= want ? 1 : (want + j->row_blocks - 1) / j->row_blocks;
	uint32_t cols = (j->n + chunks - 1) / chunks;
	if (j->row_blocks > 1) {
		uint32_t fit = (uint32_t)(CHUNK_BYTES / (weight_row_bytes ? weight_row_bytes : 1));
		if (cols > fit)
			cols = fit;
	}
	cols = (cols + 7) & ~7u;
	if (cols < 8)
		cols = 8;
	if (j->m > 1 && cols > RADIANCE__TILE_MAX_COLS)
		cols = RADIANCE__TILE_MAX_COLS;
	if (cols > j->n)
		cols = j->n;
	j->chunk_cols = cols;
	return j->row_blocks * ((j->n + cols - 1) / cols);
}

/* The W4A8 kernels of an m-row call at f's level. avx512+bf16 has no
 * dequantizing kernel for many rows: from RADIANCE__DEQ_MIN_ROWS rows on,
 * avx2+fma's (unpack a tile's weights to fp32 once, then FMA over the rows)
 * was the faster on the one AVX-512 CPU measured (a Sapphire Rapids-class
 * Xeon, one thread: avx512 0.40-1.34x of avx2's speed at m = 64, 0.62-1.02x
 * at 256; 1.09-1.89x at m <= 16: bench/results/cpu-2026-12-07-h100host.md).
 * Both are bit-exact with the reference, so the switch changes no output. */
static enum radiance_cpu_simd w4a8_level(const struct radiance_cpu_fast *f, uint32_t m)
{
	if (f->simd == RADIANCE_CPU_SIMD_AVX512 && m >= RADIANCE__DEQ_MIN_ROWS)
		return RADIANCE_CPU_SIMD_AVX2;
	return f->simd;
}

static void prepare_rows(struct fast_job *j, unsigned width, radiance_cpu_task_fn fn)
{
	/* the per-token quant is a pass over m x k: parallel once it is large */
	unsigned w = (uint64_t)j->m * j->k >= 65536 && j->m >= 2 ? width : 1;
	radiance_cpu_pool_run(j->f->pool, w, j->m, fn, j);
}
#endif

int radiance_cpu_fast_w4a8_multi(struct radiance_cpu_fast *f, const uint16_t *x,
				 enum radiance_dtype dtype, uint32_t m, uint32_t k,
				 const struct radiance_cpu_fast_w4a8_layer *layers, size_t nlayers)
{
	if (m > f->max_rows || k > f->max_k)
		return -E2BIG;
	if (k % RADIANCE_GROUP_SIZE)
		return -EINVAL;
	if (m == 0)
		return 0;
#ifdef HAVE_SIMD_LEVELS
	if (f->simd != RADIANCE_CPU_SIMD_SCALAR) {
		uint64_t n_all = 0;
		for (size_t i = 0; i < nlayers; i++)
			n_all += layers[i].n;
		if (n_all == 0)
			return 0;
		/* x quantized once into the scratch, for every layer */
		size_t xbytes = align64((size_t)f->max_rows * f->ldx * sizeof(float));
		struct fast_job j = {
			.f = f, .simd = w4a8_level(f, m), .x = x, .dtype = dtype, .m = m, .k = k,
			.task_rows = f->simd != RADIANCE_CPU_SIMD_AVX2_INT16 &&
					     m >= RADIANCE__DEQ_MIN_ROWS ? W4A8_TASK_ROWS : TASK_ROWS,
			.xf = f->scratch, .xh = f->scratch,
			.xl = (int16_t *)f->scratch + (size_t)f->max_rows * f->ldx,
			.lof = (uint8_t *)f->scratch + xbytes,
			.s = (float *)((uint8_t *)f->scratch + xbytes +
				       align64((size_t)f->max_rows * f->ldg)),
		};
		uint32_t n_width = n_all > UINT32_MAX ? UINT32_MAX : (uint32_t)n_all;
		prepare_rows(&j, width_for(f, m, n_width, k), quant_task);
		for (size_t i = 0; i < nlayers; i++) {
			const struct radiance_cpu_fast_w4a8_layer *l = &layers[i];
			if (l->n == 0)
				continue;
			unsigned width = width_for(f, m, l->n, k);
			j.n = l->n;
			j.w4a8 = (struct radiance__w4a8_tile){
				.xf = f->scratch, .xh = j.xh, .xl = j.xl, .lof = j.lof, .ldg = f->ldg,
				.xb = f->scratch,
				.s = j.s, .ldx = f->ldx, .k = k, .n = l->n,
				.qweight = l->qweight, .scales = l->scales, .bias = l->bias, .y = l->y,
			};
			uint32_t tasks = plan(&j, width, (size_t)k / 2);
			radiance_cpu_pool_run(f->pool, width, tasks, w4a8_task, &j);
		}
		return 0;
	}
#endif
	/* the reference level quantizes inside each call: the same bits */
	for (size_t i = 0; i < nlayers; i++) {
		const struct radiance_cpu_fast_w4a8_layer *l = &layers[i];
		if (l->n == 0)
			continue;
		struct scalar_job j = { .f = f, .x = x, .dtype = dtype, .m = m, .n = l->n, .k = k,
					.qweight = l->qweight, .scales = l->scales, .bias = l->bias,
					.y = l->y };
		scalar_run(f, &j);
	}
	return 0;
}

int radiance_cpu_fast_w4a8(struct radiance_cpu_fast *f, const uint16_t *x, enum radiance_dtype dtype,
			   uint32_t m, const uint32_t *qweight, const uint16_t *scales,
			   const float *bias, uint32_t n, uint32_t k, uint16_t *y)
{
	const struct radiance_cpu_fast_w4a8_layer l = { qweight, scales, bias, n, y };
	return radiance_cpu_fast_w4a8_multi(f, x, dtype, m, k, &l, 1);
}

int radiance_cpu_fast_bf16(struct radiance_cpu_fast *f, const uint16_t *x, enum radiance_dtype dtype,
			   uint32_t m, const uint16_t *weight, const float *bias, uint32_t n,
			   uint32_t k, uint16_t *y)
{
	if (m > f->max_rows || k > f->max_k)
		return -E2BIG;
	if (m == 0 || n == 0)
		return 0;
#ifdef HAVE_SIMD_LEVELS
	if (f->simd != RADIANCE_CPU_SIMD_SCALAR) {
		unsigned width = width_for(f, m, n, k);
		struct fast_job j = { .f = f, .x = x, .dtype = dtype, .m = m, .n = n, .k = k,
				      .task_rows = TASK_ROWS, .xf = f->scratch };
		j.bf16 = (struct radiance__bf16_tile){
			.xf = j.xf, .ldx = f->ldx, .k = k, .n = n,
			.weight = weight, .bias = bias, .y = y,
		};
		prepare_rows(&j, width, widen_task);
		uint32_t tasks = plan(&j, width, (size_t)k * 2);
		radiance_cpu_pool_run(f->pool, width, tasks, bf16_task, &j);
		return 0;
	}
#endif
	struct scalar_job j = { .f = f, .x = x, .dtype = dtype, .m = m, .n = n, .k = k,
				.weight = weight, .bias = bias, .y = y };
	scalar_run(f, &j);
	return 0;
}
