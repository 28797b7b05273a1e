/* proto/shm_layout: the session segment's layout, computed for the daemon
 * and checked for the client, with the sizes a real session gets. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shm_layout.h"

/* The daemon's default session: 256 SQ and CQ entries, a 64 MiB arena. The
 * figures are written out: header page, 256 * 256-byte slots per ring. */
static void default_session(void **state)
{
	struct rshm_layout l;
	assert_int_equal(rshm_layout_compute(&l, 256, 256, 64u << 20, NULL, 0), 0);
	assert_int_equal(l.sq_entries, 256);
	assert_int_equal(l.cq_entries, 256);
	assert_int_equal(l.sq_offset, 4096);
	assert_int_equal(l.cq_offset, 4096 + 65536);
	assert_int_equal(l.arena_offset, 4096 + 2 * 65536);
	assert_int_equal(l.arena_bytes, 64u << 20);
	assert_int_equal(l.segment_bytes, 4096 + 2 * 65536 + (64u << 20));
}

/* Rings smaller than a page still take a whole page each; the arena rounds
 * up to a page. */
static void small_rings_round_up(void **state)
{
	struct rshm_layout l;
	assert_int_equal(rshm_layout_compute(&l, 1, 1, 1, NULL, 0), 0);
	assert_int_equal(l.sq_offset, 4096);
	assert_int_equal(l.cq_offset, 8192);
	assert_int_equal(l.arena_offset, 12288);
	assert_int_equal(l.arena_bytes, 4096);
	assert_int_equal(l.segment_bytes, 16384);

	assert_int_equal(rshm_layout_compute(&l, 16, 64, 5000, NULL, 0), 0);
	assert_int_equal(l.cq_offset, 8192);              /* 16 * 256 = 4096 */
	assert_int_equal(l.arena_offset, 8192 + 16384);   /* 64 * 256 */
	assert_int_equal(l.arena_bytes, 8192);
	assert_int_equal(l.segment_bytes, 32768);
}

/* The largest the protocol allows: 2^16 slots per ring and a 1 TiB arena. */
static void protocol_maximum(void **state)
{
	struct rshm_layout l;
	assert_int_equal(rshm_layout_compute(&l, 1u << 16, 1u << 16, 1ull << 40, NULL, 0), 0);
	assert_int_equal(l.cq_offset, 4096ull + (1ull << 24));
	assert_int_equal(l.arena_offset, 4096ull + (2ull << 24));
	assert_int_equal(l.segment_bytes, 4096ull + (2ull << 24) + (1ull << 40));
	assert_int_equal(l.sq_offset % RADIANCE_SHM_ALIGN, 0);
	assert_int_equal(l.cq_offset % RADIANCE_SHM_ALIGN, 0);
	assert_int_equal(l.arena_offset % RADIANCE_SHM_ALIGN, 0);
}

static void expect_refused(uint32_t sq, uint32_t cq, uint64_t arena, const char *text)
{
	struct rshm_layout l;
	memset(&l, 0xab, sizeof l);
	char why[160] = "";
	assert_int_equal(rshm_layout_compute(&l, sq, cq, arena, why, sizeof why), -EINVAL);
	if (!strstr(why, text))
		fail_msg("refusal of sq %u cq %u arena %llu says \"%s\", not \"%s\"", sq, cq,
			 (unsigned long long)arena, why, text);
	/* l is left as it was */
	assert_int_equal(l.segment_bytes, 0xababababababababull);
}

static void refusals(void **state)
{
	expect_refused(0, 16, 4096, "sq_entries 0 is not a power of two in 1..65536");
	expect_refused(3, 16, 4096, "sq_entries 3 is not a power of two");
	expect_refused(1u << 17, 1u << 17, 4096, "sq_entries 131072 ");
	expect_refused(16, 8, 4096, "cq_entries 8 is not a power of two in 16..65536");
	expect_refused(16, 24, 4096, "cq_entries 24 ");
	expect_refused(16, 1u << 17, 4096, "cq_entries 131072 ");
	expect_refused(16, 16, 0, "arena_bytes 0 is outside 1..1099511627776");
	expect_refused(16, 16, (1ull << 40) + 1, "arena_bytes 1099511627777 ");
	/* would wrap to 0 when rounded up to a page */
	expect_refused(16, 16, UINT64_MAX, "arena_bytes 18446744073709551615 ");
	expect_refused(16, 16, UINT64_MAX - 4094, "arena_bytes 18446744073709547521 ");
}

/* A segment as the daemon writes it, imported as the client does. */
struct seg {
	struct rshm_layout l;
	struct radiance_shm_header *h;
	uint8_t *mem;
};

static int seg_setup(void **state)
{
	struct seg *s = calloc(1, sizeof *s);
	assert_int_equal(rshm_layout_compute(&s->l, 16, 32, 8192, NULL, 0), 0);
	s->mem = aligned_alloc(4096, s->l.segment_bytes);
	memset(s->mem, 0, s->l.segment_bytes);
	rshm_layout_write_header(s->mem, &s->l);
	s->h = (struct radiance_shm_header *)s->mem;
	*state = s;
	return 0;
}

static int seg_teardown(void **state)
{
	struct seg *s = *state;
	free(s->mem);
	free(s);
	return 0;
}

static void import_what_was_written(void **state)
{
	struct seg *s = *state;
	assert_int_equal(s->h->magic, RADIANCE_SHM_MAGIC);
	assert_int_equal(s->h->slot_bytes, 256);
	assert_int_equal(s->h->segment_bytes, 4096 + 4096 + 8192 + 8192);
	struct rshm_layout got;
	assert_int_equal(rshm_layout_import(&got, s->mem, s->l.segment_bytes, NULL, 0), 0);
	assert_memory_equal(&got, &s->l, sizeof got);
	/* the ring words may already be moving: they are not the layout's */
	s->h->sq.tail = 5;
	s->h->cq.head = 0x80000000u;
	assert_int_equal(rshm_layout_import(&got, s->mem, s->l.segment_bytes, NULL, 0), 0);
}

static void expect_import_refused(struct seg *s, uint64_t announced, const char *text)
{
	struct rshm_layout got;
	char why[384] = "";
	assert_int_equal(rshm_layout_import(&got, s->mem, announced, why, sizeof why), -EPROTO);
	if (!strstr(why, text))
		fail_msg("import refusal says \"%s\", not \"%s\"", why, text);
}

static void import_refusals(void **state)
{
	struct seg *s = *state;
	uint64_t n = s->l.segment_bytes;
	struct radiance_shm_header good = *s->h;

	expect_import_refused(s, 4095, "segment of 4095 bytes is smaller than its header (4096)");
	expect_import_refused(s, n + 4096, "segment_bytes 24576 differs from RingReady's 28672");
	s->h->magic ^= 1;
	expect_import_refused(s, n, "magic ");
	*s->h = good;
	s->h->version = 2;
	expect_import_refused(s, n, "version 2, not 1");
	*s->h = good;
	s->h->slot_bytes = 512;
	expect_import_refused(s, n, "slot_bytes 512");
	*s->h = good;
	s->h->sq.entries = 3;
	expect_import_refused(s, n, "sq_entries 3 is not a power of two");
	*s->h = good;
	s->h->cq.entries = 8;   /* below sq's 16 */
	expect_import_refused(s, n, "cq_entries 8 ");
	*s->h = good;
	/* aligned, inside the segment, but overlapping the SQ */
	s->h->cq_offset = 4096;
	expect_import_refused(s, n, "offsets sq 4096 cq 4096 arena 16384 (8192 bytes) in 24576 bytes, "
				    "not sq 4096 cq 8192 arena 16384");
	*s->h = good;
	/* the arena over the header page */
	s->h->arena_offset = 0;
	expect_import_refused(s, n, "arena 0 ");
	*s->h = good;
	/* an arena that would run past the end, and one that wraps */
	s->h->arena_bytes = 12288;
	expect_import_refused(s, n, "arena 16384 (12288 bytes)");
	s->h->arena_bytes = UINT64_MAX;
	expect_import_refused(s, n, "arena_bytes 18446744073709551615 is outside");
	*s->h = good;
	s->h->sq_offset = UINT64_MAX;
	expect_import_refused(s, n, "offsets sq 18446744073709551615 ");
	*s->h = good;
	struct rshm_layout got;
	assert_int_equal(rshm_layout_import(&got, s->mem, n, NULL, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(default_session),
		cmocka_unit_test(small_rings_round_up),
		cmocka_unit_test(protocol_maximum),
		cmocka_unit_test(refusals),
		cmocka_unit_test_setup_teardown(import_what_was_written, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(import_refusals, seg_setup, seg_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
