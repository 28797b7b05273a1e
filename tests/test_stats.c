/* daemon/stats.c's coarse histogram for exporters (stats_histogram) and
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
	Radiance__Stats out = RADIANCE__STATS__INIT;
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
	Radiance__Stats out = RADIANCE__STATS__INIT;
	stats_fill(&s, &out);
	assert_int_equal(out.latency_sum_ns, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(histogram_counts_exactly),
		cmocka_unit_test(histogram_truncated_and_empty),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
