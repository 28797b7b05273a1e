/* common/ring: SQ/CQ rings over an in-memory segment, incl. a hostile peer. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto_util.h"
#include "ring.h"

#define ENTRIES 8u

struct fixture {
	struct radiance_shm_ring ctl;
	uint8_t slots[ENTRIES * RADIANCE_SLOT_BYTES];
	struct rring prod, cons;
};

static int setup(void **state)
{
	struct fixture *f = aligned_alloc(64, sizeof(struct fixture) + 64 - sizeof(struct fixture) % 64);
	memset(f, 0, sizeof *f);
	rring_init(&f->prod, &f->ctl, f->slots, ENTRIES);
	rring_init(&f->cons, &f->ctl, f->slots, ENTRIES);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	free(*state);
	return 0;
}

static void test_push_pop_wrap(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[RADIANCE_SLOT_BYTES];
	assert_int_equal(rring_pop(&f->cons, buf), 0);
	for (uint32_t round = 0; round < 5; round++) {
		for (uint32_t i = 0; i < ENTRIES; i++) {
			uint32_t v = round * 100 + i;
			assert_int_equal(rring_space(&f->prod), (int)(ENTRIES - i));
			assert_int_equal(rring_push(&f->prod, &v, sizeof v), 0);
		}
		uint32_t x = 0;
		assert_int_equal(rring_push(&f->prod, &x, sizeof x), -EAGAIN);
		assert_int_equal(rring_ready(&f->cons), (int)ENTRIES);
		for (uint32_t i = 0; i < ENTRIES; i++) {
			uint32_t v;
			assert_int_equal(rring_pop(&f->cons, buf), 4);
			memcpy(&v, buf, 4);
			assert_int_equal(v, round * 100 + i);
		}
		assert_int_equal(rring_pop(&f->cons, buf), 0);
	}
	/* free-running counters crossing 2^32 */
	f->ctl.head = f->ctl.tail = UINT32_MAX - 2;
	f->prod.local = f->cons.local = UINT32_MAX - 2;
	for (uint32_t i = 0; i < 6; i++) {
		assert_int_equal(rring_push(&f->prod, &i, sizeof i), 0);
		uint32_t v;
		assert_int_equal(rring_pop(&f->cons, buf), 4);
		memcpy(&v, buf, 4);
		assert_int_equal(v, i);
	}
}

/* Peek copies the next payload and leaves it the producer's: the head in
 * shared memory and the free space stay until consume; a slot rewritten
 * after the peek changes nothing in the copy; empty and corrupt slots
 * answer as pop does. */
static void test_peek_consume(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[RADIANCE_SLOT_BYTES];
	uint32_t v = 7, w = 8, got;
	assert_int_equal(rring_peek(&f->cons, buf), 0);
	assert_int_equal(rring_push(&f->prod, &v, sizeof v), 0);
	assert_int_equal(rring_push(&f->prod, &w, sizeof w), 0);
	for (int i = 0; i < 2; i++) {
		memset(buf, 0, sizeof buf);
		assert_int_equal(rring_peek(&f->cons, buf), 4);
		memcpy(&got, buf, 4);
		assert_int_equal(got, 7);
		assert_int_equal(rring_ready(&f->cons), 2);
		assert_int_equal(f->ctl.head, 0);
		assert_int_equal(rring_space(&f->prod), (int)ENTRIES - 2);
	}
	/* the peer rewrites the peeked slot: the copy is what we decide on */
	memset(f->slots + 4, 0x55, 4);
	memcpy(&got, buf, 4);
	assert_int_equal(got, 7);
	rring_consume(&f->cons);
	assert_int_equal(f->ctl.head, 1);
	assert_int_equal(rring_ready(&f->cons), 1);
	assert_int_equal(rring_space(&f->prod), (int)ENTRIES - 1);
	assert_int_equal(rring_pop(&f->cons, buf), 4);
	memcpy(&got, buf, 4);
	assert_int_equal(got, 8);
	/* a slot length out of range: -EPROTO, nothing consumed */
	assert_int_equal(rring_push(&f->prod, &v, sizeof v), 0);
	uint32_t bad = RADIANCE_SLOT_BYTES;
	memcpy(f->slots + (size_t)(2 % ENTRIES) * RADIANCE_SLOT_BYTES, &bad, 4);
	assert_int_equal(rring_peek(&f->cons, buf), -EPROTO);
	assert_int_equal(f->ctl.head, 2);
}

static void test_payload_sizes(void **state)
{
	struct fixture *f = *state;
	uint8_t big[RADIANCE_SLOT_BYTES] = { 0 }, buf[RADIANCE_SLOT_BYTES];
	assert_int_equal(rring_push(&f->prod, big, 0), -EMSGSIZE);
	assert_int_equal(rring_push(&f->prod, big, RADIANCE_SLOT_BYTES - 3), -EMSGSIZE);
	memset(big, 0xab, sizeof big);
	assert_int_equal(rring_push(&f->prod, big, RADIANCE_SLOT_BYTES - 4), 0);
	assert_int_equal(rring_pop(&f->cons, buf), RADIANCE_SLOT_BYTES - 4);
	assert_memory_equal(buf, big, RADIANCE_SLOT_BYTES - 4);
}

static void test_corrupted_tail(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[RADIANCE_SLOT_BYTES];
	uint32_t v = 1;
	assert_int_equal(rring_push(&f->prod, &v, 4), 0);
	/* the peer writes a tail more than `entries` ahead of our head */
	f->ctl.tail = ENTRIES + 1;
	assert_int_equal(rring_ready(&f->cons), -EPROTO);
	assert_int_equal(rring_pop(&f->cons, buf), -EPROTO);
	/* or behind it (tail - head wraps to a huge count) */
	f->ctl.tail = (uint32_t)-1;
	assert_int_equal(rring_pop(&f->cons, buf), -EPROTO);
	/* exactly `entries` ahead is a full ring, legal */
	f->ctl.tail = ENTRIES;
	assert_int_equal(rring_ready(&f->cons), (int)ENTRIES);
	/* the consumer never re-reads head from shared memory */
	f->ctl.head = 12345;
	assert_int_equal(rring_pop(&f->cons, buf), 4);
	assert_int_equal(f->ctl.head, 1);
}

static void test_corrupted_slot_length(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[RADIANCE_SLOT_BYTES];
	uint32_t v = 1, bad;
	assert_int_equal(rring_push(&f->prod, &v, 4), 0);
	bad = 0;
	memcpy(f->slots, &bad, 4);
	assert_int_equal(rring_pop(&f->cons, buf), -EPROTO);
	bad = RADIANCE_SLOT_BYTES - 3;
	memcpy(f->slots, &bad, 4);
	assert_int_equal(rring_pop(&f->cons, buf), -EPROTO);
	bad = 0xffffffffu;
	memcpy(f->slots, &bad, 4);
	assert_int_equal(rring_pop(&f->cons, buf), -EPROTO);
	assert_int_equal(f->ctl.head, 0);   /* nothing consumed */
}

static void test_corrupted_head(void **state)
{
	struct fixture *f = *state;
	uint32_t v = 1;
	/* a consumer claiming to have read what was never produced */
	f->ctl.head = 3;
	assert_int_equal(rring_push(&f->prod, &v, 4), -EPROTO);
	assert_int_equal(rring_space(&f->prod), -EPROTO);
	/* the producer never re-reads tail */
	f->ctl.head = 0;
	f->ctl.tail = 7;
	assert_int_equal(rring_push(&f->prod, &v, 4), 0);
	assert_int_equal(f->ctl.tail, 1);
}

static void test_sleep_protocol(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[RADIANCE_SLOT_BYTES];
	uint32_t v = 9;
	assert_int_equal(rring_needs_wakeup(&f->prod), 0);
	assert_int_equal(rring_prepare_sleep(&f->cons), 1);
	assert_int_equal(f->ctl.sleeping, 1);
	assert_int_equal(rring_push(&f->prod, &v, 4), 0);
	assert_int_equal(rring_needs_wakeup(&f->prod), 1);
	rring_end_sleep(&f->cons);
	assert_int_equal(rring_needs_wakeup(&f->prod), 0);
	/* work present: prepare_sleep refuses and clears the flag */
	assert_int_equal(rring_prepare_sleep(&f->cons), 0);
	assert_int_equal(f->ctl.sleeping, 0);
	assert_int_equal(rring_pop(&f->cons, buf), 4);
}

static void test_doorbell(void **state)
{
	int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	assert_true(efd >= 0);
	assert_int_equal(rdoorbell_drain(efd), 0);
	assert_int_equal(rdoorbell_ring(efd), 0);
	assert_int_equal(rdoorbell_ring(efd), 0);
	assert_int_equal(rdoorbell_drain(efd), 2);
	assert_int_equal(rdoorbell_drain(efd), 0);
	close(efd);
	assert_true(rdoorbell_ring(efd) < 0);

	/* the CQ doorbell: a pipe, rung on the write end, drained on the read */
	int p[2];
	assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
	assert_int_equal(rdoorbell_drain(p[0]), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(rdoorbell_ring(p[1]), 0);
	assert_int_equal(rdoorbell_drain(p[0]), 3);
	assert_int_equal(rdoorbell_drain(p[0]), 0);
	/* a full pipe counts as rung; draining it takes 64 rings per call */
	int size = fcntl(p[0], F_SETPIPE_SZ, 4096);
	assert_true(size >= 4096);
	for (int i = 0; i < size / 8 + 10; i++)
		assert_int_equal(rdoorbell_ring(p[1]), 0);
	int total = 0, n;
	while ((n = rdoorbell_drain(p[0])) > 0) {
		assert_true(n <= 64);
		total += n;
	}
	assert_int_equal(n, 0);
	assert_int_equal(total, size / 8);
	/* the writer gone: nothing pending, no error */
	close(p[1]);
	assert_int_equal(rdoorbell_drain(p[0]), 0);
	close(p[0]);
}

static void test_pack_slot(void **state)
{
	uint8_t buf[RADIANCE_SLOT_BYTES - 4];
	Rdw__LinearResult res = RDW__LINEAR_RESULT__INIT;
	int len = rproto_pack_slot(&res.base, buf, sizeof buf);
	assert_int_equal(len, 2);
	Rdw__LinearResult *back = rdw__linear_result__unpack(NULL, (size_t)len, buf);
	assert_non_null(back);
	assert_int_equal(back->request_id, 0);
	assert_int_equal(back->status, 0);
	rdw__linear_result__free_unpacked(back, NULL);

	Rdw__LinearRequest req = RDW__LINEAR_REQUEST__INIT;
	req.request_id = UINT64_MAX;
	req.model_id = UINT32_MAX;
	req.layer = UINT32_MAX;
	req.rows = UINT32_MAX;
	req.dtype = RDW__DTYPE__DTYPE_FP16;
	req.input_offset = UINT64_MAX;
	req.output_offset = UINT64_MAX;
	len = rproto_pack_slot(&req.base, buf, sizeof buf);
	assert_true(len > 0 && len < 64);   /* the largest request fits with room */
	/* an error text too long for a slot is refused, not truncated */
	char text[300];
	memset(text, 'e', sizeof text - 1);
	text[sizeof text - 1] = 0;
	res.error = text;
	assert_int_equal(rproto_pack_slot(&res.base, buf, sizeof buf), -EMSGSIZE);
}

/* One producer and one consumer thread, with the full sleep/doorbell
 * handshake: every message arrives once, in order, and no wakeup is lost. */
struct stress {
	struct fixture *f;
	int efd;
	uint32_t count;
};

static void *producer(void *arg)
{
	struct stress *s = arg;
	for (uint32_t i = 0; i < s->count;) {
		int rc = rring_push(&s->f->prod, &i, sizeof i);
		if (rc == -EAGAIN)
			continue;
		if (rc != 0)
			abort();
		if (rring_needs_wakeup(&s->f->prod))
			rdoorbell_ring(s->efd);
		i++;
	}
	return NULL;
}

static void test_threaded_stress(void **state)
{
	struct fixture *f = *state;
	struct stress s = { f, eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), 200000 };
	pthread_t t;
	uint8_t buf[RADIANCE_SLOT_BYTES];
	pthread_create(&t, NULL, producer, &s);
	uint32_t expect = 0, sleeps = 0;
	while (expect < s.count) {
		int rc = rring_pop(&f->cons, buf);
		assert_true(rc >= 0);
		if (rc > 0) {
			uint32_t v;
			memcpy(&v, buf, 4);
			assert_int_equal(v, expect);
			expect++;
			continue;
		}
		if (rring_prepare_sleep(&f->cons)) {
			struct pollfd p = { .fd = s.efd, .events = POLLIN };
			/* a lost wakeup would hang here: the timeout turns it into a failure */
			assert_int_equal(poll(&p, 1, 5000), 1);
			rdoorbell_drain(s.efd);
			rring_end_sleep(&f->cons);
			sleeps++;
		}
	}
	pthread_join(t, NULL);
	close(s.efd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_push_pop_wrap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peek_consume, setup, teardown),
		cmocka_unit_test_setup_teardown(test_payload_sizes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corrupted_tail, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corrupted_slot_length, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corrupted_head, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sleep_protocol, setup, teardown),
		cmocka_unit_test(test_doorbell),
		cmocka_unit_test(test_pack_slot),
		cmocka_unit_test_setup_teardown(test_threaded_stress, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
