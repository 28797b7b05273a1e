/*
 * Event-loop integration: radiance_get_fd() and radiance_dispatch(), after
 * libseat_get_fd()/libseat_dispatch() and wl_display_get_fd(). The fd is an
 * epoll set of the handle's own: the control socket (readable when the
 * daemon says something outside a reply: a Goodbye, an Error ending the
 * session, or EOF) and, once the rings are open, the CQ doorbell. The
 * doorbell is only rung while the CQ's `sleeping` word is set
 * (proto/shm.h), so radiance_dispatch() leaves it set: the daemon then
 * rings on the next completion and the set becomes readable. The set
 * outlives a radiance_reconnect(): the new socket and doorbell join it.
 */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "client-private.h"

int radiance__client_watch(struct radiance *r, int fd)
{
	if (r->epfd < 0 || fd < 0)
		return 0;
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int get_fd(struct radiance *r)
{
	if (r->epfd >= 0)
		return r->epfd;
	int rc = radiance__client_usable(r);
	if (rc < 0)
		return rc;
	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (r->epfd < 0)
		return radiance__client_fail(r, -errno, "epoll_create1: %s", strerror(errno));
	if ((rc = radiance__client_watch(r, r->conn.fd)) < 0 ||
	    (r->rings_open && (rc = radiance__client_watch(r, r->cq_doorbell)) < 0)) {
		close(r->epfd);
		r->epfd = -1;
		return radiance__client_fail(r, rc, "epoll_ctl: %s", strerror(-rc));
	}
	if (r->rings_open && !rring_prepare_sleep(&r->cq)) {
		/* completions are waiting already: make the set readable, so the
		 * caller's first wait returns and dispatches them */
		rdoorbell_ring(r->cq_doorbell);
	}
	return r->epfd;
}

int radiance_get_fd(struct radiance *r)
{
	RADIANCE__GUARDED(r, get_fd(r));
}

/* Moves every completion in the CQ to the stash. 0 or a sticky error. */
static int reap_all(struct radiance *r)
{
	for (;;) {
		struct radiance__client_stashed s;
		int rc = radiance__client_reap_one(r, &s);
		if (rc <= 0)
			return rc;
		if ((rc = radiance__client_stash_push(r, &s)) < 0)
			return rc;
	}
}

static int dispatch(struct radiance *r)
{
	int rc = radiance__client_usable(r);
	if (rc == 0 && r->rings_open) {
		rdoorbell_drain(r->cq_doorbell);
		do {
			rring_end_sleep(&r->cq);
			if ((rc = reap_all(r)) < 0)
				break;
			/* armed again; a completion that raced in is reaped first */
		} while (!rring_prepare_sleep(&r->cq));
	}
	if (rc == 0)
		rc = radiance__client_socket_event(r);   /* a Goodbye, an Error, EOF */
	if (rc == -ESHUTDOWN && r->rings_open && reap_all(r) < 0)
		rc = r->error;
	/* after a Goodbye what was drained is still delivered: the count first */
	if (r->stash_len)
		return (int)r->stash_len;
	return rc;
}

int radiance_dispatch(struct radiance *r)
{
	RADIANCE__GUARDED(r, dispatch(r));
}
