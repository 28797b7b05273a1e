/*
 * Helpers shared by the benchmarks: a monotonic clock in microseconds,
 * p50/p99 of a sample (sorted in place), and the fatal-error macros (a
 * benchmark that cannot go on says why, named after its binary, and exits
 * 1). Header-only (static functions, macros): every .c file in bench/ is
 * its own binary.
 */
#ifndef RADIANCE_BENCH_STATS_H
#define RADIANCE_BENCH_STATS_H

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* "<binary>: <printf-style message>" on stderr, then exit(1). */
#define DIE(...)                                                      \
	do {                                                          \
		fprintf(stderr, "%s: ", program_invocation_short_name); \
		fprintf(stderr, __VA_ARGS__);                         \
		fputc('\n', stderr);                                  \
		exit(1);                                              \
	} while (0)

#ifdef RADIANCE_GPU
/* A GPU call (kernels/w4a8_gpu.h or libradiance-gpu, 0 or -errno) that must
 * succeed: DIE with the call, its code and both layers' last words
 * (radiance__gpu_last_error(), radiance_gpu_error_message()); the file
 * includes w4a8_gpu.h and radiance_gpu.h. */
#define GCHECK(call)                                                                          \
	do {                                                                                  \
		int rc_ = (call);                                                             \
		if (rc_)                                                                      \
			DIE("%s failed (%d): %s / %s", #call, rc_, radiance__gpu_last_error(), \
			    radiance_gpu_error_message());                                    \
	} while (0)
#endif

static inline double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static inline int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

struct timing {
	double p50, p99;    /* t[n/2] and t[ceil(0.99 n) - 1] (nearest rank) of the sorted
	                       sample; NAN when n is 0 */
};

/* Sorts t[0..n) and returns its p50 and p99. */
static inline struct timing summarize(double *t, size_t n)
{
	if (n == 0)
		return (struct timing){NAN, NAN};
	qsort(t, n, sizeof *t, cmp_double);
	const size_t i99 = (size_t)ceil((double)n * 0.99) - 1;
	return (struct timing){t[n / 2], t[i99 < n ? i99 : n - 1]};
}

#endif
