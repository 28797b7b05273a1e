/*
 * The bulk lane's staging rings (daemon/stage_ring.h): which rows a piece
 * gets and which earlier piece's guard it must wait for. Cases with the
 * values written out (wrap-around, a piece as big as the buffer, waits
 * required and not, every slot live, an older record retired by a newer
 * one's wait, the errors), then long random runs checked against a model
 * that keeps, for every row, which take last used it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stage_ring.h"

/* reserve + commit, asserting success; returns the take */
static struct stage_take take(struct stage_ring *r, uint32_t rows, uint32_t at)
{
	struct stage_take t;
	assert_int_equal(stage_ring_reserve(r, rows, at, &t), 0);
	stage_ring_commit(r, &t);
	return t;
}

static void test_first_takes_need_no_wait(void **state)
{
	(void)state;
	struct stage_ring r;
	stage_ring_init(&r, 2048, 64);
	for (uint32_t i = 0; i < 8; i++) {
		struct stage_take t = take(&r, 256, STAGE_RING_NEXT);
		assert_int_equal(t.first, 256 * i);
		assert_int_equal(t.rows, 256);
		assert_int_equal(t.wait, -1);
		assert_int_equal(t.slot, i);
	}
	assert_int_equal(r.live, 8);
	assert_int_equal(r.head, 0);   /* 2048 of 2048: the next one starts over */
}

static void test_wrap_around(void **state)
{
	(void)state;
	struct stage_ring r;
	stage_ring_init(&r, 1024, 64);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(take(&r, 256, STAGE_RING_NEXT).wait, -1);
	/* the fifth reuses the first's rows: wait for the first only */
	struct stage_take t = take(&r, 256, STAGE_RING_NEXT);
	assert_int_equal(t.first, 0);
	assert_int_equal(t.wait, 0);
	assert_int_equal(t.slot, 4);
	assert_int_equal(r.live, 4);
	t = take(&r, 256, STAGE_RING_NEXT);
	assert_int_equal(t.first, 256);
	assert_int_equal(t.wait, 1);

	/* a range that would run past the end starts at 0 (never split), and
	 * the gap at the end is left unused */
	stage_ring_init(&r, 1000, 64);
	assert_int_equal(take(&r, 300, STAGE_RING_NEXT).first, 0);
	assert_int_equal(take(&r, 300, STAGE_RING_NEXT).first, 320);   /* aligned up from 300 */
	t = take(&r, 300, STAGE_RING_NEXT);
	assert_int_equal(t.first, 640);
	assert_int_equal(t.wait, -1);
	assert_int_equal(r.head, 960);
	t = take(&r, 300, STAGE_RING_NEXT);   /* 960 + 300 > 1000 */
	assert_int_equal(t.first, 0);
	assert_int_equal(t.wait, 0);
	t = take(&r, 100, STAGE_RING_NEXT);   /* [320, 420): the second's rows */
	assert_int_equal(t.first, 320);
	assert_int_equal(t.wait, 1);
	/* [448, 512): still the second's rows, retired by the wait before:
	 * nothing left to wait for */
	t = take(&r, 64, STAGE_RING_NEXT);
	assert_int_equal(t.first, 448);
	assert_int_equal(t.wait, -1);
}

static void test_piece_as_big_as_buffer(void **state)
{
	(void)state;
	struct stage_ring r;
	stage_ring_init(&r, 512, 64);
	take(&r, 100, STAGE_RING_NEXT);
	take(&r, 100, STAGE_RING_NEXT);
	struct stage_take t = take(&r, 100, STAGE_RING_NEXT);
	assert_int_equal(t.first, 256);
	/* the whole buffer: waits for the newest (covering the others) */
	t = take(&r, 512, STAGE_RING_NEXT);
	assert_int_equal(t.first, 0);
	assert_int_equal(t.wait, 2);
	assert_int_equal(r.live, 1);
	/* and again: waits for that one */
	struct stage_take u = take(&r, 512, STAGE_RING_NEXT);
	assert_int_equal(u.first, 0);
	assert_int_equal(u.wait, (int)t.slot);
	assert_int_equal(r.live, 1);
	/* one more row than the buffer: refused */
	struct stage_take v;
	assert_int_equal(stage_ring_reserve(&r, 513, STAGE_RING_NEXT, &v), -E2BIG);
}

static void test_newer_wait_retires_older(void **state)
{
	(void)state;
	struct stage_ring r;
	stage_ring_init(&r, 1024, 64);
	take(&r, 256, STAGE_RING_NEXT);   /* slot 0: [0, 256) */
	take(&r, 256, STAGE_RING_NEXT);   /* slot 1: [256, 512) */
	take(&r, 256, STAGE_RING_NEXT);   /* slot 2: [512, 768) */
	/* at 256: overlaps slot 1 only; waiting for it covers slot 0 too */
	struct stage_take t = take(&r, 256, 256);
	assert_int_equal(t.first, 256);
	assert_int_equal(t.wait, 1);
	assert_int_equal(t.retire, 2);
	assert_int_equal(r.live, 2);
	/* so slot 0's rows are free now */
	t = take(&r, 256, 0);
	assert_int_equal(t.wait, -1);
	/* and slot 2's are not */
	t = take(&r, 64, 512);
	assert_int_equal(t.wait, 2);
}

static void test_all_slots_live(void **state)
{
	(void)state;
	struct stage_ring r;
	stage_ring_init(&r, 4096, 1);
	for (uint32_t i = 0; i < STAGE_RING_SLOTS; i++)
		assert_int_equal(take(&r, 1, STAGE_RING_NEXT).wait, -1);
	/* no overlap, but no slot either: the oldest is waited for and reused */
	struct stage_take t = take(&r, 1, STAGE_RING_NEXT);
	assert_int_equal(t.first, STAGE_RING_SLOTS);
	assert_int_equal(t.wait, 0);
	assert_int_equal(t.slot, 0);
	assert_int_equal(r.live, STAGE_RING_SLOTS);
	t = take(&r, 1, STAGE_RING_NEXT);
	assert_int_equal(t.wait, 1);
	assert_int_equal(t.slot, 1);
}

static void test_reset(void **state)
{
	(void)state;
	struct stage_ring r;
	stage_ring_init(&r, 256, 64);
	take(&r, 256, STAGE_RING_NEXT);
	stage_ring_reset(&r);   /* after a synchronize: nothing to wait for */
	struct stage_take t = take(&r, 256, STAGE_RING_NEXT);
	assert_int_equal(t.wait, -1);
	assert_int_equal(r.live, 1);
}

static void test_errors(void **state)
{
	(void)state;
	struct stage_ring r;
	struct stage_take t;
	stage_ring_init(&r, 300, 64);
	assert_int_equal(stage_ring_reserve(&r, 0, STAGE_RING_NEXT, &t), -EINVAL);
	assert_int_equal(stage_ring_reserve(&r, 301, STAGE_RING_NEXT, &t), -E2BIG);
	assert_int_equal(stage_ring_reserve(&r, 10, 32, &t), -EINVAL);    /* not aligned */
	assert_int_equal(stage_ring_reserve(&r, 237, 64, &t), -E2BIG);    /* 64 + 237 > 300 */
	assert_int_equal(stage_ring_reserve(&r, 236, 64, &t), 0);
	assert_int_equal(stage_ring_reserve(&r, 1, UINT32_MAX - 63, &t), -E2BIG);   /* no wrap in the sum */
	/* a refused reserve changed nothing */
	assert_int_equal(r.live, 0);
	assert_int_equal(r.head, 0);
}

/* Random takes against a model: owner[row] is the take that last used the
 * row; waited is the newest take whose guard some wait covered (a wait
 * covers every older take, the guards being on one stream in order). A
 * take must wait when a row it gets belongs to a take newer than waited,
 * for exactly the newest such take, unless it is made to free a slot. */
static void test_random_against_model(void **state)
{
	(void)state;
	srand(12345);
	for (int run = 0; run < 200; run++) {
		const uint32_t rows = 1 + (uint32_t)rand() % 3000;
		const uint32_t align = (uint32_t[]){ 1, 8, 64 }[rand() % 3];
		struct stage_ring r;
		stage_ring_init(&r, rows, align);
		int64_t *owner = malloc(rows * sizeof *owner);
		assert_non_null(owner);
		for (uint32_t i = 0; i < rows; i++)
			owner[i] = -1;
		int64_t slot_take[STAGE_RING_SLOTS];
		int64_t waited = -1;
		for (int64_t n = 0; n < 400; n++) {
			const uint32_t m = 1 + (uint32_t)rand() % (rand() % 4 ? rows / 4 + 1 : rows);
			uint32_t at = STAGE_RING_NEXT;
			if (rand() % 5 == 0) {
				const uint32_t room = m <= rows ? (rows - m) / align : 0;
				at = (uint32_t)(rand() % (room + 1)) * align;
			}
			struct stage_take t;
			const int rc = stage_ring_reserve(&r, m, at, &t);
			if (m > rows || (at != STAGE_RING_NEXT && at + m > rows)) {
				assert_int_equal(rc, -E2BIG);
				continue;
			}
			assert_int_equal(rc, 0);
			assert_true(t.first % align == 0);
			assert_true(t.first + t.rows <= rows);
			if (at == STAGE_RING_NEXT)
				assert_true(t.first == r.head || t.first == 0);
			else
				assert_int_equal(t.first, at);
			int64_t need = -1;
			for (uint32_t i = t.first; i < t.first + m; i++)
				need = owner[i] > need ? owner[i] : need;
			const int full = r.live == STAGE_RING_SLOTS;
			if (need > waited) {
				assert_true(t.wait >= 0);
				assert_int_equal(slot_take[t.wait], need);
			} else if (!full) {
				assert_int_equal(t.wait, -1);
			} else {
				assert_true(t.wait >= 0);
				assert_true(slot_take[t.wait] > waited);
			}
			if (t.wait >= 0 && slot_take[t.wait] > waited)
				waited = slot_take[t.wait];
			stage_ring_commit(&r, &t);
			assert_true(r.live >= 1 && r.live <= STAGE_RING_SLOTS);
			slot_take[t.slot] = n;
			for (uint32_t i = t.first; i < t.first + m; i++)
				owner[i] = n;
			if (rand() % 50 == 0) {   /* a synchronize */
				stage_ring_reset(&r);
				waited = n;
			}
		}
		free(owner);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_first_takes_need_no_wait),
		cmocka_unit_test(test_wrap_around),
		cmocka_unit_test(test_piece_as_big_as_buffer),
		cmocka_unit_test(test_newer_wait_retires_older),
		cmocka_unit_test(test_all_slots_live),
		cmocka_unit_test(test_reset),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_random_against_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
