/*
 * Request counters and a latency histogram, per session and global.
 *
 * Latency is queue + exec (daemon seeing the SQ entry to its result posted),
 * in ns, kept in a fixed histogram of log-spaced buckets: 4 per power of two
 * (relative bucket width <= 25%), so percentiles cost no allocation and no
 * sort, and a reported p50/p99 is the upper edge of its bucket, capped at the
 * exact max.
 *
 * Thread safety: the executor thread is the only writer (relaxed atomics);
 * any thread may read at any time and sees each counter torn-free (the set
 * of counters is not one atomic snapshot).
 */
#ifndef RADIANCE_STATS_H
#define RADIANCE_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "radiance.pb-c.h"

#define STATS_BUCKETS 256

struct stats_counters {
	atomic_uint_fast64_t requests;   /* every request decoded, good or not */
	atomic_uint_fast64_t rows;       /* rows of successful requests */
	atomic_uint_fast64_t bytes_in;   /* activation bytes read */
	atomic_uint_fast64_t bytes_out;  /* output bytes written */
	atomic_uint_fast64_t errors;     /* requests answered with status != 0 */
	atomic_uint_fast64_t latency_max;
	atomic_uint_fast64_t latency_sum;   /* ns, of every request */
	atomic_uint_fast64_t hist[STATS_BUCKETS];
};

/* Zeroes s (also fine on static storage). */
void stats_init(struct stats_counters *s);

/* One completed request: rows and bytes count only when status == 0;
 * latency_ns is recorded for every request. Executor thread only. */
void stats_record(struct stats_counters *s, uint32_t rows, uint64_t bytes_in, uint64_t bytes_out,
		  uint64_t latency_ns, int status);

/* Copies counters and p50/p99/max into out (a Rdw__Stats already
 * initialised with RDW__STATS__INIT); sessions/uptime are left as is. */
void stats_fill(struct stats_counters *s, Rdw__Stats *out);

/* The histogram at coarse bounds for exporters: le[i] = 2^(10+i) - 1 ns
 * (1.023 us, 2.047 us, ... 17.2 s), which are edges of the fine buckets, so
 * cum[i] (requests with latency <= le[i]) is exact. Fills at most n
 * entries and returns how many (STATS_COARSE when n allows). */
#define STATS_COARSE 25
size_t stats_histogram(struct stats_counters *s, uint64_t *le, uint64_t *cum, size_t n);

/* p in [0,1]: the latency at that quantile, 0 when nothing was recorded. */
uint64_t stats_percentile(struct stats_counters *s, double p);

/* Exposed for tests: bucket of a value and a bucket's upper edge. */
unsigned stats_bucket(uint64_t v);
uint64_t stats_bucket_upper(unsigned idx);

#endif
