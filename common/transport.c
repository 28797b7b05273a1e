/*
 * Length-prefixed frames and SCM_RIGHTS fd queues over a Unix stream socket.
 * See transport.h for why reads stop at frame boundaries.
 */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void close_all(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

int rconn_init(struct rconn *c, int fd, uint32_t max_frame, uint32_t max_fds)
{
	memset(c, 0, sizeof *c);
	c->fd = -1;
	c->max_frame = max_frame ? max_frame : 1;
	c->max_fds = max_fds ? max_fds : 1;
	c->in_fds = calloc(c->max_fds, sizeof *c->in_fds);
	if (!c->in_fds)
		return -ENOMEM;
	c->fd = fd;
	return 0;
}

void rconn_finish(struct rconn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	if (c->in_fds)
		close_all(c->in_fds, c->in_nfds);
	c->in_nfds = 0;
	free(c->in_fds);
	c->in_fds = NULL;
	free(c->in);
	c->in = NULL;
	c->in_len = c->in_cap = c->in_consumed = 0;
	for (size_t i = 0; i < c->out_nbatches; i++) {
		close_all(c->out_batches[i].fds, c->out_batches[i].nfds);
		free(c->out_batches[i].fds);
	}
	free(c->out_batches);
	c->out_batches = NULL;
	c->out_nbatches = c->out_batches_cap = 0;
	free(c->out);
	c->out = NULL;
	c->out_len = c->out_cap = c->out_sent = 0;
	c->out_frames = c->out_head_end = 0;
}

static int frame_length(const struct rconn *c, const uint8_t *p, uint32_t *len)
{
	uint32_t l = get_le32(p);
	if (l == 0 || l > c->max_frame)
		return -EMSGSIZE;
	*len = l;
	return 0;
}

int rconn_read(struct rconn *c)
{
	/* Drop the frame next_frame handed out last time. */
	if (c->in_consumed) {
		memmove(c->in, c->in + c->in_consumed, c->in_len - c->in_consumed);
		c->in_len -= c->in_consumed;
		c->in_consumed = 0;
	}

	/* Read at most to the end of the current prefix or frame, never into the
	 * next frame, so fds are attributable to the frame they came with. */
	size_t want;
	if (c->in_len < 4) {
		want = 4 - c->in_len;
	} else {
		uint32_t l;
		if (frame_length(c, c->in, &l) < 0)
			return -EMSGSIZE;
		if (c->in_len >= 4 + (size_t)l)
			return 1;   /* a whole frame is waiting: call next_frame */
		want = 4 + (size_t)l - c->in_len;
	}
	if (c->in_len + want > c->in_cap) {
		size_t cap = c->in_cap ? c->in_cap : 4096;
		while (cap < c->in_len + want)
			cap *= 2;
		uint8_t *p = realloc(c->in, cap);
		if (!p)
			return -ENOMEM;
		c->in = p;
		c->in_cap = cap;
	}

	union {
		char buf[CMSG_SPACE(sizeof(int) * RADIANCE_SCM_MAX_FD)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = c->in + c->in_len, .iov_len = want };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = ctl.buf,
		.msg_controllen = sizeof ctl.buf,
	};
	ssize_t n;
	do
		n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return (errno == EWOULDBLOCK) ? -EAGAIN : -errno;

	int got[RADIANCE_SCM_MAX_FD];
	size_t ngot = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k && ngot < RADIANCE_SCM_MAX_FD; i++)
			memcpy(&got[ngot++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
	}
	if (c->in_nfds + ngot > c->max_fds) {
		close_all(got, ngot);
		return -EPROTO;
	}
	if (msg.msg_flags & MSG_CTRUNC) {
		/* ctl holds the kernel's per-message maximum, so the kernel
		 * dropped fds it could not install: our fd limit, not the peer */
		close_all(got, ngot);
		return -EMFILE;
	}
	if (ngot)
		memcpy(c->in_fds + c->in_nfds, got, ngot * sizeof(int));
	c->in_nfds += ngot;
	c->in_len += (size_t)n;
	return (int)n;
}

int rconn_next_frame(struct rconn *c, const uint8_t **data, size_t *len)
{
	size_t avail = c->in_len - c->in_consumed;
	uint32_t l;
	if (avail < 4)
		return 0;   /* also before the first read, while c->in is NULL */
	const uint8_t *p = c->in + c->in_consumed;
	if (frame_length(c, p, &l) < 0)
		return -EMSGSIZE;
	if (avail < 4 + (size_t)l)
		return 0;
	*data = p + 4;
	*len = l;
	c->in_consumed += 4 + (size_t)l;
	return 1;
}

uint32_t rconn_bad_length(const struct rconn *c)
{
	/* both read() and next_frame() leave the refused prefix at in_consumed */
	if (c->in_len < c->in_consumed + 4)
		return 0;
	return get_le32(c->in + c->in_consumed);
}

size_t rconn_queued_fds(const struct rconn *c)
{
	return c->in_nfds;
}

int rconn_take_fds(struct rconn *c, int *fds, size_t n)
{
	if (n > c->in_nfds)
		return -EBADMSG;
	memcpy(fds, c->in_fds, n * sizeof(int));
	memmove(c->in_fds, c->in_fds + n, (c->in_nfds - n) * sizeof(int));
	c->in_nfds -= n;
	return 0;
}

void rconn_close_fds(struct rconn *c)
{
	close_all(c->in_fds, c->in_nfds);
	c->in_nfds = 0;
}

/* Moves unsent bytes to the front so the buffer does not grow without bound. */
static void out_compact(struct rconn *c)
{
	if (c->out_sent == 0)
		return;
	memmove(c->out, c->out + c->out_sent, c->out_len - c->out_sent);
	for (size_t i = 0; i < c->out_nbatches; i++)
		c->out_batches[i].offset -= c->out_sent;
	/* flush leaves the oldest unsent frame ending past out_sent */
	c->out_head_end -= c->out_sent;
	c->out_len -= c->out_sent;
	c->out_sent = 0;
}

int rconn_queue(struct rconn *c, const uint8_t *data, size_t len,
			const int *fds, size_t nfds)
{
	if (len == 0 || len > c->max_frame || nfds > c->max_fds || nfds > RADIANCE_SCM_MAX_FD)
		return -EMSGSIZE;
	out_compact(c);
	if (c->out_len + 4 + len > c->out_cap) {
		size_t cap = c->out_cap ? c->out_cap : 4096;
		while (cap < c->out_len + 4 + len)
			cap *= 2;
		uint8_t *p = realloc(c->out, cap);
		if (!p)
			return -ENOMEM;
		c->out = p;
		c->out_cap = cap;
	}
	if (nfds) {
		if (c->out_nbatches == c->out_batches_cap) {
			size_t cap = c->out_batches_cap ? c->out_batches_cap * 2 : 4;
			struct radiance__fd_batch *b = realloc(c->out_batches, cap * sizeof *b);
			if (!b)
				return -ENOMEM;
			c->out_batches = b;
			c->out_batches_cap = cap;
		}
		int *dups = malloc(nfds * sizeof *dups);
		if (!dups)
			return -ENOMEM;
		for (size_t i = 0; i < nfds; i++) {
			dups[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
			if (dups[i] < 0) {
				int e = errno;
				close_all(dups, i);
				free(dups);
				return -e;
			}
		}
		c->out_batches[c->out_nbatches++] = (struct radiance__fd_batch){
			.offset = c->out_len, .fds = dups, .nfds = nfds,
		};
	}
	put_le32(c->out + c->out_len, (uint32_t)len);
	memcpy(c->out + c->out_len + 4, data, len);
	c->out_len += 4 + len;
	if (c->out_frames++ == 0)
		c->out_head_end = c->out_len;
	return 0;
}

int rconn_flush(struct rconn *c)
{
	while (c->out_sent < c->out_len) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * RADIANCE_SCM_MAX_FD)];
			struct cmsghdr align;
		} ctl;
		struct radiance__fd_batch *b = c->out_nbatches ? &c->out_batches[0] : NULL;
		size_t end = c->out_len;
		int attach = 0;
		if (b && b->offset > c->out_sent) {
			end = b->offset;     /* stop before the frame whose fds go with it */
		} else if (b) {
			attach = 1;
			if (c->out_nbatches > 1)
				end = c->out_batches[1].offset;
		}
		struct iovec iov = { .iov_base = c->out + c->out_sent, .iov_len = end - c->out_sent };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (attach) {
			memset(ctl.buf, 0, sizeof ctl.buf);
			msg.msg_control = ctl.buf;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * b->nfds);
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * b->nfds);
			memcpy(CMSG_DATA(cm), b->fds, sizeof(int) * b->nfds);
		}
		ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return (errno == EWOULDBLOCK) ? -EAGAIN : -errno;
		}
		if (attach) {
			/* The kernel now holds its own references. */
			close_all(b->fds, b->nfds);
			free(b->fds);
			memmove(c->out_batches, c->out_batches + 1,
				(c->out_nbatches - 1) * sizeof *c->out_batches);
			c->out_nbatches--;
		}
		c->out_sent += (size_t)n;
		/* frames now sent whole; the next one's prefix is still in
		 * the buffer (nothing is compacted during a flush) */
		while (c->out_frames && c->out_head_end <= c->out_sent) {
			if (--c->out_frames)
				c->out_head_end += 4 + get_le32(c->out + c->out_head_end);
		}
	}
	c->out_sent = c->out_len = 0;
	c->out_frames = c->out_head_end = 0;
	return 0;
}

size_t rconn_pending(const struct rconn *c)
{
	return c->out_len - c->out_sent;
}

size_t rconn_pending_frames(const struct rconn *c)
{
	return c->out_frames;
}
