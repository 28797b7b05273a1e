/*
 * The monotonic clock, for latencies, deadlines and uptime. One copy for
 * the daemon, the client library, the tools and the tests.
 *
 * Thread safety: any thread. clock_gettime(CLOCK_MONOTONIC) does not fail
 * on Linux, so there is no error return.
 */
#ifndef RADIANCE_CLOCK_H
#define RADIANCE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds since an arbitrary point (boot, on Linux); never goes back. */
static inline uint64_t rclock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The same clock in milliseconds (poll() timeouts). */
static inline int64_t rclock_ms(void)
{
	return (int64_t)(rclock_ns() / 1000000u);
}

/* The same clock in seconds, as a double (tests, tools). */
static inline double rclock_s(void)
{
	return (double)rclock_ns() * 1e-9;
}

#endif
