/* common/transport: framing and SCM_RIGHTS over socketpair(). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport.h"
#include "shm.h"
#include "wire.h"

struct fixture {
	int open_fds_before;
	struct rconn a, b;   /* a sends, b receives (both directions work) */
};

static int count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;   /* the DIR's own fd */
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	int sv[2];
	f->open_fds_before = count_open_fds();
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(rconn_init(&f->a, sv[0], RADIANCE_MAX_FRAME, 8), 0);
	assert_int_equal(rconn_init(&f->b, sv[1], RADIANCE_MAX_FRAME, 8), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	rconn_finish(&f->a);
	rconn_finish(&f->b);
	rconn_finish(&f->b);   /* twice is harmless */
	/* every fd a test made must be gone */
	assert_int_equal(count_open_fds(), f->open_fds_before);
	free(f);
	return 0;
}

/* Reads until a frame is complete (or an error); returns next_frame's answer. */
static int recv_frame(struct rconn *c, const uint8_t **data, size_t *len)
{
	for (int spins = 0; spins < 100000; spins++) {
		int rc = rconn_next_frame(c, data, len);
		if (rc != 0)
			return rc;
		rc = rconn_read(c);
		if (rc == -EAGAIN)
			continue;
		if (rc <= 0)
			return rc;
	}
	return -ETIMEDOUT;
}

static void test_roundtrip(void **state)
{
	struct fixture *f = *state;
	const uint8_t *d;
	size_t len;
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"hello", 5, NULL, 0), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"world!", 6, NULL, 0), 0);
	assert_int_equal(rconn_pending(&f->a), 4 + 5 + 4 + 6);
	assert_int_equal(rconn_flush(&f->a), 0);
	assert_int_equal(rconn_pending(&f->a), 0);
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_int_equal(len, 5);
	assert_memory_equal(d, "hello", 5);
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_int_equal(len, 6);
	assert_memory_equal(d, "world!", 6);
	assert_int_equal(rconn_read(&f->b), -EAGAIN);
	assert_int_equal(rconn_next_frame(&f->b, &d, &len), 0);
}

static void test_fd_passing_attribution(void **state)
{
	struct fixture *f = *state;
	const uint8_t *d;
	size_t len;
	int p[2];
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	int two[2] = { p[0], p[1] };
	/* A without fds, B with two, C without: all in one flush */
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"A", 1, NULL, 0), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"BB", 2, two, 2), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"C", 1, NULL, 0), 0);
	close(p[0]);
	close(p[1]);   /* the conn holds dups */
	assert_int_equal(rconn_flush(&f->a), 0);

	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_memory_equal(d, "A", 1);
	assert_int_equal(rconn_queued_fds(&f->b), 0);
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_memory_equal(d, "BB", 2);
	assert_int_equal(rconn_queued_fds(&f->b), 2);
	int got[3];
	assert_int_equal(rconn_take_fds(&f->b, got, 3), -EBADMSG);
	assert_int_equal(rconn_queued_fds(&f->b), 2);
	assert_int_equal(rconn_take_fds(&f->b, got, 2), 0);
	assert_int_equal(rconn_queued_fds(&f->b), 0);
	/* the received pipe works end to end, and in order */
	assert_int_equal(write(got[1], "x", 1), 1);
	char c = 0;
	assert_int_equal(read(got[0], &c, 1), 1);
	assert_int_equal(c, 'x');
	assert_true(fcntl(got[0], F_GETFD) & FD_CLOEXEC);
	close(got[0]);
	close(got[1]);
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_memory_equal(d, "C", 1);
	assert_int_equal(rconn_queued_fds(&f->b), 0);
}

static void test_close_fds_and_finish_close_queued(void **state)
{
	struct fixture *f = *state;
	const uint8_t *d;
	size_t len;
	int p[2];
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"x", 1, p, 2), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"y", 1, p, 1), 0);
	/* a second conn keeps unsent fds queued: finish must close them */
	assert_int_equal(rconn_queue(&f->b, (const uint8_t *)"z", 1, p, 2), 0);
	close(p[0]);
	close(p[1]);
	assert_int_equal(rconn_flush(&f->a), 0);
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_int_equal(rconn_queued_fds(&f->b), 2);
	rconn_close_fds(&f->b);
	assert_int_equal(rconn_queued_fds(&f->b), 0);
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_int_equal(rconn_queued_fds(&f->b), 1);
	/* leave it queued: teardown's finish closes it, and the fd count proves it */
}

static void test_fd_cap(void **state)
{
	struct fixture *f = *state;
	int fds[9];
	for (int i = 0; i < 9; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	/* 9 fds on one sendmsg, above b's max_fds of 8: raw, since queue refuses */
	union {
		char buf[CMSG_SPACE(sizeof fds)];
		struct cmsghdr align;
	} ctl;
	uint8_t frame[5] = { 1, 0, 0, 0, 'q' };
	struct iovec iov = { frame, sizeof frame };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			      .msg_controllen = sizeof ctl.buf };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof fds);
	memcpy(CMSG_DATA(cm), fds, sizeof fds);
	assert_int_equal(sendmsg(f->a.fd, &msg, 0), (ssize_t)sizeof frame);
	for (int i = 0; i < 9; i++)
		close(fds[i]);
	assert_int_equal(rconn_read(&f->b), -EPROTO);
	assert_int_equal(rconn_queued_fds(&f->b), 0);
	/* queue refuses more than max_fds too */
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"q", 1, fds, 9), -EMSGSIZE);
	/* teardown checks that all 9 received dups were closed */
}

static void test_fd_cap_accumulated(void **state)
{
	struct fixture *f = *state;
	int fds[5];
	for (int i = 0; i < 5; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	/* two frames of 5 fds each: the second pushes the queue above 8 */
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"1", 1, fds, 5), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"2", 1, fds, 5), 0);
	for (int i = 0; i < 5; i++)
		close(fds[i]);
	assert_int_equal(rconn_flush(&f->a), 0);
	const uint8_t *d;
	size_t len;
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_int_equal(rconn_queued_fds(&f->b), 5);
	/* the receiver did not take them: the next frame's fds overflow */
	assert_int_equal(recv_frame(&f->b, &d, &len), -EPROTO);
	assert_int_equal(rconn_queued_fds(&f->b), 5);
}

static void test_oversize_and_zero_frame(void **state)
{
	struct fixture *f = *state;
	const uint8_t *d;
	size_t len;
	uint8_t big[4] = { 0x01, 0x00, 0x10, 0x00 };   /* RADIANCE_MAX_FRAME + 1 */
	assert_int_equal(write(f->a.fd, big, 4), 4);
	assert_int_equal(recv_frame(&f->b, &d, &len), -EMSGSIZE);
	assert_int_equal(rconn_read(&f->b), -EMSGSIZE);   /* sticky */

	struct rconn c, e;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	assert_int_equal(rconn_init(&c, sv[0], 16, 1), 0);
	assert_int_equal(rconn_init(&e, sv[1], 16, 1), 0);
	uint8_t zero[4] = { 0 };
	assert_int_equal(write(c.fd, zero, 4), 4);
	assert_int_equal(recv_frame(&e, &d, &len), -EMSGSIZE);
	/* the sender refuses oversize and empty frames */
	uint8_t buf[17] = { 0 };
	assert_int_equal(rconn_queue(&c, buf, 17, NULL, 0), -EMSGSIZE);
	assert_int_equal(rconn_queue(&c, buf, 0, NULL, 0), -EMSGSIZE);
	assert_int_equal(rconn_queue(&c, buf, 16, NULL, 0), 0);
	rconn_finish(&c);
	rconn_finish(&e);
}

static void test_eof(void **state)
{
	struct fixture *f = *state;
	const uint8_t *d;
	size_t len;
	/* half a frame, then the peer goes away */
	uint8_t part[6] = { 10, 0, 0, 0, 'a', 'b' };
	assert_int_equal(write(f->a.fd, part, sizeof part), (ssize_t)sizeof part);
	rconn_finish(&f->a);
	assert_int_equal(recv_frame(&f->b, &d, &len), 0);   /* EOF, no frame */
	assert_int_equal(rconn_read(&f->b), 0);
	/* writing to a closed peer: -EPIPE, and no SIGPIPE kills us */
	assert_int_equal(rconn_queue(&f->b, (const uint8_t *)"x", 1, NULL, 0), 0);
	assert_int_equal(rconn_flush(&f->b), -EPIPE);
}

static void test_large_frame_partial_io(void **state)
{
	struct fixture *f = *state;
	int sz = 4096;
	setsockopt(f->a.fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	setsockopt(f->b.fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	size_t n = RADIANCE_MAX_FRAME;
	uint8_t *big = malloc(n);
	for (size_t i = 0; i < n; i++)
		big[i] = (uint8_t)(i * 131 + 7);
	int p[2];
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(rconn_queue(&f->a, big, n, NULL, 0), 0);
	assert_int_equal(rconn_queue(&f->a, (const uint8_t *)"tail", 4, p, 2), 0);
	close(p[0]);
	close(p[1]);
	const uint8_t *d;
	size_t len;
	int frames = 0, partial = 0;
	while (frames < 2) {
		int rc = rconn_flush(&f->a);
		if (rc == -EAGAIN)
			partial = 1;
		else
			assert_int_equal(rc, 0);
		rc = rconn_read(&f->b);
		assert_true(rc > 0 || rc == -EAGAIN);
		while (rconn_next_frame(&f->b, &d, &len) == 1) {
			if (frames == 0) {
				assert_int_equal(len, n);
				assert_memory_equal(d, big, n);
				assert_int_equal(rconn_queued_fds(&f->b), 0);
			} else {
				assert_int_equal(len, 4);
				assert_memory_equal(d, "tail", 4);
				assert_int_equal(rconn_queued_fds(&f->b), 2);
			}
			frames++;
		}
	}
	assert_true(partial);
	free(big);
}

/* rconn_pending_frames counts the frames not completely sent, also after
 * a flush stopped inside a frame and the next queue moved the unsent bytes
 * to the front of the buffer: it used to walk length prefixes from byte 0,
 * which is then the middle of a frame, and said 1 for 8 MiB of replies
 * (the daemon's "N replies unsent" and "does not read its socket" lines). */
static void test_pending_frames_after_partial_send(void **state)
{
	struct fixture *f = *state;
	int sz = 4096;
	setsockopt(f->a.fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	setsockopt(f->b.fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	enum { L = 100, N = 1000 };   /* 104 bytes a frame with its prefix */
	uint8_t body[L];
	for (size_t i = 0; i < L; i++)
		body[i] = (uint8_t)(0xA0 + i);   /* no byte of it reads as a small length */
	for (int i = 0; i < N; i++)
		assert_int_equal(rconn_queue(&f->a, body, L, NULL, 0), 0);
	assert_int_equal(rconn_pending_frames(&f->a), N);
	assert_int_equal(rconn_flush(&f->a), -EAGAIN);
	size_t unsent = rconn_pending(&f->a);
	assert_true(unsent < (size_t)N * (4 + L));
	if (unsent % (4 + L) == 0) {
		/* cut inside a frame, which is the case that matters */
		uint8_t sink[7];
		assert_int_equal(recv(f->b.fd, sink, sizeof sink, 0), (ssize_t)sizeof sink);
		int rc = rconn_flush(&f->a);
		assert_true(rc == -EAGAIN || rc == 0);
		unsent = rconn_pending(&f->a);
	}
	size_t want = (unsent + 4 + L - 1) / (4 + L);
	assert_int_equal(rconn_pending_frames(&f->a), want);
	/* the next queue compacts the buffer: still right */
	assert_int_equal(rconn_queue(&f->a, body, L, NULL, 0), 0);
	assert_int_equal(rconn_pending_frames(&f->a), want + 1);
	/* and every frame arrives whole, in order, as it went out */
	const uint8_t *d;
	size_t len;
	for (int got = 0; got < N + 1; got++) {
		int rc;
		while ((rc = rconn_next_frame(&f->b, &d, &len)) == 0) {
			rc = rconn_flush(&f->a);
			assert_true(rc == 0 || rc == -EAGAIN);
			rc = rconn_read(&f->b);
			assert_true(rc > 0 || rc == -EAGAIN);
		}
		assert_int_equal(rc, 1);
		assert_int_equal(len, L);
		assert_memory_equal(d, body, L);
		size_t left = rconn_pending(&f->a);
		assert_int_equal(rconn_pending_frames(&f->a), (left + 4 + L - 1) / (4 + L));
	}
	assert_int_equal(rconn_pending_frames(&f->a), 0);
}

static void test_blocking_split_writes(void **state)
{
	struct fixture *f = *state;
	int fl = fcntl(f->b.fd, F_GETFL);
	fcntl(f->b.fd, F_SETFL, fl & ~O_NONBLOCK);
	uint8_t part1[3] = { 3, 0, 0 };
	uint8_t part2[4] = { 0, 'a', 'b', 'c' };
	assert_int_equal(write(f->a.fd, part1, 3), 3);
	assert_int_equal(rconn_read(&f->b), 3);
	assert_int_equal(write(f->a.fd, part2, 4), 4);
	const uint8_t *d;
	size_t len;
	assert_int_equal(recv_frame(&f->b, &d, &len), 1);
	assert_int_equal(len, 3);
	assert_memory_equal(d, "abc", 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fd_passing_attribution, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_fds_and_finish_close_queued, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fd_cap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fd_cap_accumulated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversize_and_zero_frame, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eof, setup, teardown),
		cmocka_unit_test_setup_teardown(test_large_frame_partial_io, setup, teardown),
		cmocka_unit_test_setup_teardown(test_blocking_split_writes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pending_frames_after_partial_send, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
