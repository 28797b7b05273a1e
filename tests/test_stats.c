/* daemon/stats.c: the fine buckets (stats_bucket, stats_bucket_upper)
 * against the documented bound (an upper edge at most 25% above the value,
 * docs/client.md) and an edge computed here bit by bit; the percentiles
 * they give; the coarse histogram for exporters (stats_histogram) and the
 * latency sum, against counts made here directly from the recorded values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "stats.h"

/* values at and around every coarse edge, both ends and beyond the last */
static const uint64_t values[] = {
	0, 1, 3, 4, 1000, 1023, 1024, 1025, 2047, 2048, 4095, 4096, 65535, 65536,
	99999, 131071, 131072, 1000000, 1073741823, 1073741824, 17179869183ull,
	17179869184ull, 1ull << 40, UINT64_MAX / 4,
};
#define NVALUES (sizeof values / sizeof values[0])

/* The bucket of v as the docs describe it, computed without stats.c's
 * arithmetic: below 4 one bucket per value; above, v's three leading bits
 * (the power of two and which quarter of it) with every lower bit set. */
static uint64_t ref_upper(uint64_t v)
{
	if (v < 4)
		return v;
	int top = 63;
	while (!(v >> top))
		top--;
	uint64_t low = (UINT64_C(1) << (top - 2)) - 1;   /* the bits below the quarter */
	return v | low;
}

static void check_bucket(uint64_t v)
{
	unsigned b = stats_bucket(v);
	assert_true(b < STATS_BUCKETS);
	uint64_t up = stats_bucket_upper(b);
	if (up != ref_upper(v))
		fail_msg("%llu: bucket %u ends at %llu, expected %llu", (unsigned long long)v, b,
			 (unsigned long long)up, (unsigned long long)ref_upper(v));
	/* v lies in its bucket: above the previous one's edge, at most this one's */
	assert_true(v <= up);
	if (b > 0 && stats_bucket_upper(b - 1) >= v)
		fail_msg("%llu: bucket %u, but bucket %u already ends at %llu", (unsigned long long)v,
			 b, b - 1, (unsigned long long)stats_bucket_upper(b - 1));
	/* the documented bound: at most 25% above (4 * (up - v) < v, no overflow) */
	if (v >= 4 && (up - v) > v / 4)
		fail_msg("%llu: edge %llu is %.2f%% above", (unsigned long long)v,
			 (unsigned long long)up, 100.0 * (double)(up - v) / (double)v);
}

static void bucket_edges_within_25_percent(void **state)
{
	/* figures the daemon sees (ns): the README's p50 68.0 us and 14.4 us */
	assert_int_equal(stats_bucket_upper(stats_bucket(68000)), 81919);     /* +20.5% */
	assert_int_equal(stats_bucket_upper(stats_bucket(14400)), 16383);     /* +13.8% */
	assert_int_equal(stats_bucket_upper(stats_bucket(1000)), 1023);
	/* the worst case is a bucket's first value: 1024 -> 1279 (+24.9%) */
	assert_int_equal(stats_bucket_upper(stats_bucket(1024)), 1279);
	assert_int_equal(stats_bucket_upper(stats_bucket(1279)), 1279);
	assert_int_equal(stats_bucket(1280), stats_bucket(1279) + 1);
	assert_int_equal(stats_bucket_upper(stats_bucket(1280)), 1535);
	for (uint64_t v = 0; v < (1u << 16); v++)
		check_bucket(v);
	/* every power of two, its neighbours and quarter points, to UINT64_MAX */
	for (int e = 2; e < 64; e++) {
		uint64_t p = UINT64_C(1) << e;
		uint64_t q = p >> 2;
		const uint64_t around[] = { p - 1, p, p + 1, p + q - 1, p + q, p + 2 * q - 1,
					    p + 3 * q, p + 3 * q + 1, 2 * p - 1 };
		for (size_t i = 0; i < sizeof around / sizeof around[0]; i++)
			check_bucket(around[i]);
	}
	check_bucket(UINT64_MAX);
	assert_int_equal(stats_bucket_upper(stats_bucket(UINT64_MAX)), UINT64_MAX);
	/* pseudo-random values over the whole range (xorshift64, fixed seed) */
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < 100000; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		check_bucket(x >> (i % 64));
	}
}

/* p50 and p99 are their buckets' upper edges, capped at the maximum seen. */
static void percentiles_are_bucket_edges(void **state)
{
	static struct stats_counters s;
	stats_init(&s);
	assert_int_equal(stats_percentile(&s, 0.5), 0);   /* nothing recorded */
	for (int i = 0; i < 98; i++)
		stats_record(&s, 1, 0, 0, 68000, 0);
	stats_record(&s, 1, 0, 0, 4815400, 0);
	stats_record(&s, 1, 0, 0, 16132100, 0);
	assert_int_equal(stats_percentile(&s, 0.5), 81919);
	assert_int_equal(stats_percentile(&s, 0.98), 81919);
	/* rank 99 is the 4.8154 ms request: its bucket [4.718592, 5.242879] ms */
	assert_int_equal(stats_percentile(&s, 0.99), 5242879);
	/* the top: the bucket edge (16.777215 ms) is above the max, so the max */
	assert_int_equal(stats_percentile(&s, 1.0), 16132100);
	Rdw__Stats out = RDW__STATS__INIT;
	stats_fill(&s, &out);
	assert_int_equal(out.latency_p50_ns, 81919);
	assert_int_equal(out.latency_p99_ns, 5242879);
	assert_int_equal(out.latency_max_ns, 16132100);
}

static void histogram_counts_exactly(void **state)
{
	static struct stats_counters s;
	stats_init(&s);
	uint64_t sum = 0;
	for (size_t i = 0; i < NVALUES; i++) {
		stats_record(&s, 1, 0, 0, values[i], 0);
		sum += values[i];
	}
	uint64_t le[STATS_COARSE + 4], cum[STATS_COARSE + 4];
	size_t n = stats_histogram(&s, le, cum, STATS_COARSE + 4);
	assert_int_equal(n, STATS_COARSE);
	for (size_t k = 0; k < n; k++) {
		/* 2^(10+k) - 1 ns: 1.023 us ... 17.18 s */
		assert_int_equal(le[k], (UINT64_C(1) << (10 + k)) - 1);
		uint64_t want = 0;
		for (size_t i = 0; i < NVALUES; i++)
			want += values[i] <= le[k];
		if (cum[k] != want)
			fail_msg("le %llu ns: %llu requests counted, %llu recorded at most that long",
				 (unsigned long long)le[k], (unsigned long long)cum[k],
				 (unsigned long long)want);
	}
	Rdw__Stats out = RDW__STATS__INIT;
	stats_fill(&s, &out);
	assert_int_equal(out.requests, NVALUES);
	assert_int_equal(out.latency_sum_ns, sum);
	/* beyond the last edge: counted in the total only */
	assert_true(cum[n - 1] < out.requests);
}

static void histogram_truncated_and_empty(void **state)
{
	static struct stats_counters s;
	stats_init(&s);
	uint64_t le[3], cum[3];
	assert_int_equal(stats_histogram(&s, le, cum, 3), 3);
	assert_int_equal(cum[0] + cum[1] + cum[2], 0);
	assert_int_equal(le[2], 4095);
	assert_int_equal(stats_histogram(&s, le, cum, 0), 0);
	Rdw__Stats out = RDW__STATS__INIT;
	stats_fill(&s, &out);
	assert_int_equal(out.latency_sum_ns, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bucket_edges_within_25_percent),
		cmocka_unit_test(percentiles_are_bucket_edges),
		cmocka_unit_test(histogram_counts_exactly),
		cmocka_unit_test(histogram_truncated_and_empty),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
