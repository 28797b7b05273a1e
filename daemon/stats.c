/* Counters and a log-spaced latency histogram; see stats.h. */
#include "stats.h"

#include <string.h>

void stats_init(struct stats_counters *s)
{
	atomic_init(&s->requests, 0);
	atomic_init(&s->rows, 0);
	atomic_init(&s->bytes_in, 0);
	atomic_init(&s->bytes_out, 0);
	atomic_init(&s->errors, 0);
	atomic_init(&s->latency_max, 0);
	atomic_init(&s->latency_sum, 0);
	for (unsigned i = 0; i < STATS_BUCKETS; i++)
		atomic_init(&s->hist[i], 0);
}

unsigned stats_bucket(uint64_t v)
{
	if (v < 4)
		return (unsigned)v;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);   /* >= 2 */
	unsigned sub = (unsigned)(v >> (e - 2)) & 3u;
	return 4u * (e - 1u) + sub;
}

uint64_t stats_bucket_upper(unsigned idx)
{
	if (idx < 4)
		return idx;
	unsigned e = idx / 4u + 1u, sub = idx % 4u;
	uint64_t lower = (uint64_t)(4u + sub) << (e - 2);
	return lower + ((uint64_t)1 << (e - 2)) - 1;
}

static void add(atomic_uint_fast64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

void stats_record(struct stats_counters *s, uint32_t rows, uint64_t bytes_in, uint64_t bytes_out,
		  uint64_t latency_ns, int status)
{
	add(&s->requests, 1);
	if (status) {
		add(&s->errors, 1);
	} else {
		add(&s->rows, rows);
		add(&s->bytes_in, bytes_in);
		add(&s->bytes_out, bytes_out);
	}
	add(&s->hist[stats_bucket(latency_ns)], 1);
	add(&s->latency_sum, latency_ns);
	/* single writer: a plain compare is enough */
	if (latency_ns > atomic_load_explicit(&s->latency_max, memory_order_relaxed))
		atomic_store_explicit(&s->latency_max, latency_ns, memory_order_relaxed);
}

size_t stats_histogram(struct stats_counters *s, uint64_t *le, uint64_t *cum, size_t n)
{
	size_t k = 0;
	uint64_t seen = 0;
	unsigned idx = 0;
	for (; k < n && k < STATS_COARSE; k++) {
		le[k] = ((uint64_t)1 << (10 + k)) - 1;
		/* the fine buckets up to and including the one ending at le[k] */
		for (; idx < STATS_BUCKETS && stats_bucket_upper(idx) <= le[k]; idx++)
			seen += atomic_load_explicit(&s->hist[idx], memory_order_relaxed);
		cum[k] = seen;
	}
	return k;
}

uint64_t stats_percentile(struct stats_counters *s, double p)
{
	uint64_t counts[STATS_BUCKETS], total = 0;
	for (unsigned i = 0; i < STATS_BUCKETS; i++) {
		counts[i] = atomic_load_explicit(&s->hist[i], memory_order_relaxed);
		total += counts[i];
	}
	if (total == 0)
		return 0;
	uint64_t rank = (uint64_t)(p * (double)total + 0.999999);
	if (rank < 1)
		rank = 1;
	uint64_t max = atomic_load_explicit(&s->latency_max, memory_order_relaxed);
	uint64_t seen = 0;
	for (unsigned i = 0; i < STATS_BUCKETS; i++) {
		seen += counts[i];
		if (seen >= rank) {
			uint64_t up = stats_bucket_upper(i);
			return up < max ? up : max;
		}
	}
	return max;
}

void stats_fill(struct stats_counters *s, Rdw__Stats *out)
{
	out->requests = atomic_load_explicit(&s->requests, memory_order_relaxed);
	out->rows = atomic_load_explicit(&s->rows, memory_order_relaxed);
	out->bytes_in = atomic_load_explicit(&s->bytes_in, memory_order_relaxed);
	out->bytes_out = atomic_load_explicit(&s->bytes_out, memory_order_relaxed);
	out->errors = atomic_load_explicit(&s->errors, memory_order_relaxed);
	out->latency_p50_ns = stats_percentile(s, 0.50);
	out->latency_p99_ns = stats_percentile(s, 0.99);
	out->latency_max_ns = atomic_load_explicit(&s->latency_max, memory_order_relaxed);
	out->latency_sum_ns = atomic_load_explicit(&s->latency_sum, memory_order_relaxed);
}
