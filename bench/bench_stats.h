/*
 * Timing helpers shared by the benchmarks: a monotonic clock in
 * microseconds and p50/p99 of a sample (sorted in place). Header-only
 * (static functions): every .c file in bench/ is its own binary.
 */
#ifndef RADIANCE_BENCH_STATS_H
#define RADIANCE_BENCH_STATS_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

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
