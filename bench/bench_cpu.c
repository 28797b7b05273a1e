/*
 * CPU backend benchmark: the fast path (kernels/cpu_fast.h, as the daemon's
 * CPU backend runs it) on the 27B model's layer shapes and MiniLM's, against
 * a read-bandwidth probe over the same bytes with the same threads, and
 * optionally the scalar reference (kernels/w4a8_cpu.h) as a peer.
 *
 *   bench_cpu [--threads N] [--ms 1,4,16,64,256] [--set 27b|minilm|all]
 *             [--simd scalar|avx2|avx2-int16|avx512|neon] [--reference] [--header] [--quick]
 *
 * Weights are random (no checkpoint needed), generated in-process. For the
 * 27B shapes the weights rotate over enough copies that each call reads
 * them from DRAM (a working set of 4x the last-level cache, at least 128
 * MiB: working_set()), as
 * when a whole model is served; the MiniLM shapes (a ~10 MB model) stay in
 * cache, as they do when that model is served. Each time is the median of
 * its repetitions (at least 3; about 0.5 s in all for small M).
 * Prints CSV rows: date,cpu,threads,shape,m,us,gbps,probe_us,
 * fraction_of_probe,peer,peer_us,simd,cpu_us,fma_us,fraction_of_fma,peak_us,
 * fraction_of_peak: simd is the level that ran
 * (--simd asks for one as the daemon's cpu_simd option does, default the daemon's
 * choice), cpu_us the median CPU time of the process per call (all its
 * threads, spinning included: without the time spent waiting for a core
 * that other jobs held), fma_us the time m x n x k multiply-adds take as
 * 8-lane fp32 FMAs on the same threads at the rate measured just before
 * the shape's rows (the compute roof of the avx2 kernels; empty without
 * AVX2+FMA), fraction_of_fma = fma_us / us; peak_us the same at the rate of
 * twelve chains a thread in registers (the FMA units' issue rate: eight
 * chains with a load each, as above, reach about 0.6 of it on Zen 3),
 * fraction_of_peak = peak_us
 * / us.
 * bench/cpu_peers.py adds the numpy peer and writes bench/results/.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_fast.h"
#include "cpu_pool.h"
#include "numerics.h"
#include "w4a8_cpu.h"

struct shape {
	uint32_t n, k;
	int rotate;   /* weights from DRAM (27B) or hot in cache (MiniLM) */
};

static const struct shape shapes_27b[] = {
	{ 16384, 5120, 1 }, { 14336, 5120, 1 }, { 5120, 6144, 1 }, { 34816, 5120, 1 },
	{ 5120, 17408, 1 },
};
static const struct shape shapes_minilm[] = { { 384, 384, 0 }, { 1536, 384, 0 }, { 384, 1536, 0 } };

#define WORKING_SET_MIN ((size_t)128 << 20)

/* Bytes the rotated weights of a 27B shape span: 4x the largest cache the
 * kernel reports for cpu0 (a server's L3 can be 300 MiB), at least
 * WORKING_SET_MIN. */
static size_t working_set(void)
{
	size_t llc = 0;
	for (int i = 0; i < 8; i++) {
		char path[96], buf[32];
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		FILE *f = fopen(path, "r");
		if (!f)
			break;
		if (fgets(buf, sizeof buf, f)) {
			char *end;
			unsigned long long v = strtoull(buf, &end, 10);
			v <<= *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
			if (v > llc)
				llc = (size_t)v;
		}
		fclose(f);
	}
	return 4 * llc > WORKING_SET_MIN ? 4 * llc : WORKING_SET_MIN;
}

struct copy {
	uint8_t *buf;        /* qweight then scales, one allocation (what the probe reads) */
	uint32_t *qweight;
	uint16_t *scales;
};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng >> 33);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process (every thread, a pool thread's spin
 * included): on a machine shared with other jobs, what a call costs
 * without the time its threads waited for a core. */
static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the read probe: sum every 64-bit word of the bytes, split by chunks ---- */

struct probe_job {
	const uint8_t *buf;
	size_t bytes;
	uint64_t sums[256];
};
#define PROBE_CHUNK (256u << 10)

static void probe_task(void *arg, uint32_t t)
{
	struct probe_job *j = arg;
	size_t off = (size_t)t * PROBE_CHUNK;
	size_t len = j->bytes - off < PROBE_CHUNK ? j->bytes - off : PROBE_CHUNK;
	const uint64_t *p = (const uint64_t *)(j->buf + off);
	uint64_t a = 0, b = 0, c = 0, d = 0;
	size_t n = len / 8, i = 0;
	for (; i + 4 <= n; i += 4) {
		a += p[i];
		b += p[i + 1];
		c += p[i + 2];
		d += p[i + 3];
	}
	for (; i < n; i++)
		a += p[i];
	j->sums[t % 256] += a + b + c + d;   /* keeps the loads live */
}

static double probe_once(struct radiance_cpu_pool *pool, const uint8_t *buf, size_t bytes)
{
	static struct probe_job j;
	j.buf = buf;
	j.bytes = bytes;
	double t0 = now_s();
	radiance_cpu_pool_run(pool, 0, (uint32_t)((bytes + PROBE_CHUNK - 1) / PROBE_CHUNK),
			      probe_task, &j);
	return now_s() - t0;
}

/* ---- the compute roof: fp32 FMAs as the W4A8 kernels issue them ----------
 *
 * M > 1 is bound by multiply-adds, not by reading the weights: the avx2
 * kernels do one 8-lane FMA (one operand from L1) per 8 multiply-adds. This
 * measures how many of those the same threads get now (eight independent
 * chains per thread, the operand from a 2 KiB buffer), so each row can say
 * how close it is to that roof under the load of the moment: fma_us is
 * m * n * k multiply-adds at that rate. */

#define FMA_TASK (1u << 18)   /* FMAs a task: ~0.1 ms */

struct fma_job {
	float sums[256];
};

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static void fma_task(void *arg, uint32_t t)
{
	struct fma_job *j = arg;
	static const float src[512] __attribute__((aligned(64)));
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
	       a7 = a0, w = _mm256_set1_ps(1.0f + (float)t);
	for (uint32_t i = 0; i < FMA_TASK / 8; i++) {
		const float *p = src + (i % 8) * 64;
		a0 = _mm256_fmadd_ps(_mm256_load_ps(p), w, a0);
		a1 = _mm256_fmadd_ps(_mm256_load_ps(p + 8), w, a1);
		a2 = _mm256_fmadd_ps(_mm256_load_ps(p + 16), w, a2);
		a3 = _mm256_fmadd_ps(_mm256_load_ps(p + 24), w, a3);
		a4 = _mm256_fmadd_ps(_mm256_load_ps(p + 32), w, a4);
		a5 = _mm256_fmadd_ps(_mm256_load_ps(p + 40), w, a5);
		a6 = _mm256_fmadd_ps(_mm256_load_ps(p + 48), w, a6);
		a7 = _mm256_fmadd_ps(_mm256_load_ps(p + 56), w, a7);
		__asm__ volatile("" : "+x"(w));   /* one chain per accumulator, no folding */
	}
	__m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
				 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
	float out[8];
	_mm256_storeu_ps(out, s);
	j->sums[t % 256] += out[0];   /* keeps the chains live */
}

/* The FMA units' issue rate: twelve chains a thread, operands in registers
 * (eight chains are bound by the FMA latency, and a memory operand on
 * every FMA by the loads, on Zen 3). */
__attribute__((target("avx2,fma"))) static void fma12_task(void *arg, uint32_t t)
{
	struct fma_job *j = arg;
	__m256 a[12], w = _mm256_set1_ps(0.5f), b = _mm256_set1_ps((float)t);
	for (int c = 0; c < 12; c++)
		a[c] = _mm256_setzero_ps();
	for (uint32_t i = 0; i < FMA_TASK / 12; i++) {
#pragma GCC unroll 12
		for (int c = 0; c < 12; c++)
			a[c] = _mm256_fmadd_ps(a[c], w, b);
		__asm__ volatile("" : "+x"(w), "+x"(b));
	}
	__m256 s = a[0];
	for (int c = 1; c < 12; c++)
		s = _mm256_add_ps(s, a[c]);
	float out[8];
	_mm256_storeu_ps(out, s);
	j->sums[t % 256] += out[0];
}
#endif

/* Multiply-adds a second the threads get as 8-lane FMAs now, on eight
 * chains a thread or (peak) twelve (median of reps), or 0 where this CPU
 * has no AVX2+FMA. */
static double fma_rate(struct radiance_cpu_pool *pool, unsigned threads, int reps, int peak)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return 0;
	static struct fma_job j;
	double v[64];
	uint32_t tasks = 4 * threads;
	for (int r = 0; r < reps; r++) {
		double t0 = now_s();
		radiance_cpu_pool_run(pool, 0, tasks, peak ? fma12_task : fma_task, &j);
		v[r] = (double)tasks * (FMA_TASK / (peak ? 12 : 8)) * (peak ? 12 : 8) * 8 / (now_s() - t0);
	}
	return median(v, reps);
#else
	(void)pool;
	(void)threads;
	(void)reps;
	(void)peak;
	return 0;
#endif
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_cpu [--threads N] [--ms 1,4,16,64,256] [--set 27b|minilm|all] "
			"[--reference] [--header] [--quick] [--simd auto|scalar|avx2|avx2-int16|avx512|neon]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	unsigned threads = 0;
	uint32_t ms[16] = { 1, 4, 16, 64, 256 };
	size_t nms = 5;
	const char *set = "all";
	int reference = 0, header = 0, quick = 0;
	enum radiance_cpu_simd simd = RADIANCE_CPU_SIMD_AUTO;   /* the daemon's cpu_simd */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
			threads = (unsigned)strtoul(argv[++i], NULL, 10);
		} else if (strcmp(argv[i], "--ms") == 0 && i + 1 < argc) {
			nms = 0;
			for (char *p = strtok(argv[++i], ","); p && nms < 16; p = strtok(NULL, ","))
				ms[nms++] = (uint32_t)strtoul(p, NULL, 10);
		} else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
			set = argv[++i];
		} else if (strcmp(argv[i], "--reference") == 0) {
			reference = 1;
		} else if (strcmp(argv[i], "--header") == 0) {
			header = 1;
		} else if (strcmp(argv[i], "--simd") == 0 && i + 1 < argc) {
			const char *v = argv[++i];
			if (strcmp(v, "auto") == 0)
				simd = RADIANCE_CPU_SIMD_AUTO;
			else if (strcmp(v, "scalar") == 0)
				simd = RADIANCE_CPU_SIMD_SCALAR;
			else if (strcmp(v, "avx2") == 0 || strcmp(v, "avx2+fma") == 0)
				simd = RADIANCE_CPU_SIMD_AVX2;
			else if (strcmp(v, "avx2-int16") == 0)
				simd = RADIANCE_CPU_SIMD_AVX2_INT16;
			else if (strcmp(v, "avx512") == 0 || strcmp(v, "avx512+bf16") == 0)
				simd = RADIANCE_CPU_SIMD_AVX512;
			else if (strcmp(v, "neon") == 0)
				simd = RADIANCE_CPU_SIMD_NEON;
			else
				usage();
		} else if (strcmp(argv[i], "--quick") == 0) {
			quick = 1;
		} else {
			usage();
		}
	}
	uint32_t max_m = 1;
	for (size_t i = 0; i < nms; i++)
		max_m = ms[i] > max_m ? ms[i] : max_m;

	char err[256], cpu[128], date[16];
	radiance_cpu_model_name(cpu, sizeof cpu);
	for (char *p = cpu; *p; p++)
		if (*p == ',')
			*p = ' ';
	time_t now = time(NULL);
	strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));

	struct radiance_cpu_fast *fast;
	struct radiance_cpu_fast_options fo = { .threads = threads, .simd = simd,
						.max_rows = max_m, .max_k = 17408 };
	if (radiance_cpu_fast_create(&fo, &fast, err, sizeof err) < 0) {
		fprintf(stderr, "bench_cpu: %s\n", err);
		return 1;
	}
	threads = radiance_cpu_fast_threads(fast);
	struct radiance_cpu_pool *pool;
	if (radiance_cpu_pool_create(threads, &pool) < 0) {
		fprintf(stderr, "bench_cpu: pool\n");
		return 1;
	}
	fprintf(stderr, "bench_cpu: %s, %s kernels, %u threads\n", cpu,
		radiance_cpu_simd_name(radiance_cpu_fast_simd(fast)), threads);
	if (header)
		printf("date,cpu,threads,shape,m,us,gbps,probe_us,fraction_of_probe,peer,peer_us,simd,cpu_us,"
		       "fma_us,fraction_of_fma,peak_us,fraction_of_peak\n");

	uint16_t *x = malloc((size_t)max_m * 17408 * 2);
	uint16_t *y = malloc((size_t)max_m * 34816 * 2);
	void *ref_scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(4, 17408) + 63) & ~63ul);
	if (!x || !y || !ref_scratch)
		return 1;
	for (size_t i = 0; i < (size_t)max_m * 17408; i++)
		x[i] = radiance_bf16_from_f32(((float)(rnd() % 2001) - 1000.0f) / 1000.0f);

	const size_t wset = working_set();
	for (int pass = 0; pass < 2; pass++) {
		const struct shape *sh = pass == 0 ? shapes_27b : shapes_minilm;
		size_t nsh = pass == 0 ? 5 : 3;
		if ((pass == 0 && strcmp(set, "minilm") == 0) || (pass == 1 && strcmp(set, "27b") == 0))
			continue;
		for (size_t s = 0; s < nsh; s++) {
			const uint32_t n = sh[s].n, k = sh[s].k;
			size_t qbytes = (size_t)n * k / 2, sbytes = (size_t)n * (k / 128) * 2;
			size_t bytes = qbytes + sbytes;
			size_t ncopies = sh[s].rotate ? (wset + bytes - 1) / bytes : 1;
			if (ncopies < 1)
				ncopies = 1;
			if (sh[s].rotate && ncopies < 2)
				ncopies = 2;
			struct copy *cp = calloc(ncopies, sizeof *cp);
			for (size_t c = 0; c < ncopies; c++) {
				cp[c].buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
				if (!cp[c].buf) {
					fprintf(stderr, "bench_cpu: out of memory\n");
					return 1;
				}
				cp[c].qweight = (uint32_t *)cp[c].buf;
				cp[c].scales = (uint16_t *)(cp[c].buf + qbytes);
				for (size_t i = 0; i < qbytes / 4; i++)
					cp[c].qweight[i] = rnd();
				for (size_t i = 0; i < sbytes / 2; i++)
					cp[c].scales[i] = (uint16_t)(0x2000 + rnd() % 0x1000);
			}
			/* the probe, over the same copies in the same rotation */
			double pt[64];
			int preps = quick ? 5 : 21;
			probe_once(pool, cp[0].buf, bytes);
			for (int r = 0; r < preps; r++)
				pt[r] = probe_once(pool, cp[(r + 1) % ncopies].buf, bytes);
			double probe_us = median(pt, preps) * 1e6;
			double macs_s = fma_rate(pool, threads, quick ? 5 : 11, 0);
			double peak_s = fma_rate(pool, threads, quick ? 5 : 11, 1);

			for (size_t mi = 0; mi < nms; mi++) {
				const uint32_t m = ms[mi];
				size_t it = 0;
				double t0 = now_s();
				radiance_cpu_fast_w4a8(fast, x, RADIANCE_DTYPE_BF16, m, cp[it % ncopies].qweight,
						       cp[it % ncopies].scales, NULL, n, k, y);
				it++;
				double first = now_s() - t0;
				int reps = (int)(0.5 / (first > 1e-7 ? first : 1e-7));
				if (quick)
					reps /= 5;
				reps = reps < 3 ? 3 : reps > 2001 ? 2001 : reps;
				double *tv = malloc(sizeof *tv * (size_t)reps * 2), *cv = tv + reps;
				if (!tv)
					return 1;
				for (int r = 0; r < reps; r++, it++) {
					double a = now_s(), c = cpu_s();
					radiance_cpu_fast_w4a8(fast, x, RADIANCE_DTYPE_BF16, m,
							       cp[it % ncopies].qweight,
							       cp[it % ncopies].scales, NULL, n, k, y);
					cv[r] = cpu_s() - c;
					tv[r] = now_s() - a;
				}
				double us = median(tv, reps) * 1e6, cpu_us = median(cv, reps) * 1e6;
				free(tv);
				char peer[64] = "";
				char peer_us[32] = "";
				if (reference && m <= 4) {
					/* the scalar reference, single-threaded, as the backend ran before */
					int rr = n * (uint64_t)k * m > (1u << 26) ? 3 : 51;
					double rt[51];
					for (int r = 0; r < rr; r++, it++) {
						double a = now_s();
						radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, m, cp[it % ncopies].qweight,
								  cp[it % ncopies].scales, NULL, n, k, y,
								  ref_scratch);
						rt[r] = now_s() - a;
					}
					snprintf(peer, sizeof peer, "scalar-reference-1thread");
					snprintf(peer_us, sizeof peer_us, "%.1f", median(rt, rr) * 1e6);
				}
				char fma_us[32] = "", fma_frac[32] = "";
				if (macs_s > 0) {
					double f = (double)m * n * k / macs_s * 1e6;
					snprintf(fma_us, sizeof fma_us, "%.1f", f);
					snprintf(fma_frac, sizeof fma_frac, "%.3f", f / us);
				}
				char peak_us[32] = "", peak_frac[32] = "";
				if (peak_s > 0) {
					double f = (double)m * n * k / peak_s * 1e6;
					snprintf(peak_us, sizeof peak_us, "%.1f", f);
					snprintf(peak_frac, sizeof peak_frac, "%.3f", f / us);
				}
				printf("%s,%s,%u,%ux%u,%u,%.1f,%.2f,%.1f,%.3f,%s,%s,%s,%.1f,%s,%s,%s,%s\n",
				       date, cpu, threads, n, k, m, us, (double)bytes / us * 1e-3, probe_us,
				       probe_us / us, peer, peer_us,
				       radiance_cpu_simd_name(radiance_cpu_fast_simd(fast)), cpu_us, fma_us,
				       fma_frac, peak_us, peak_frac);
				fflush(stdout);
			}
			for (size_t c = 0; c < ncopies; c++)
				free(cp[c].buf);
			free(cp);
		}
	}
	free(x);
	free(y);
	free(ref_scratch);
	radiance_cpu_pool_destroy(pool);
	radiance_cpu_fast_destroy(fast);
	return 0;
}
