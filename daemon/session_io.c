/*
 * A session's socket: reading and framing what the client sends, handing
 * each frame to session_handle_frame(), queueing replies and flushing them
 * as the socket takes them. See session.h.
 */
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "proto_util.h"
#include "server.h"
#include "wire.h"

#define FRAMES_PER_WAKE 32

/* ---- reading ---- */

/* The client vanished while we still owed it replies. A Unix socket whose
 * peer closed with our replies unread in its receive queue has sk_err
 * ECONNRESET, which epoll reports as EPOLLERR and libuv's uv_poll as
 * UV_EBADF ("bad file descriptor"); a send to a peer that closed fails with
 * EPIPE. Either way it is the client's exit, not a daemon fault: say so. */
static void session_went_away(struct radiance_session *s, int e)
{
	size_t unsent = rconn_pending_frames(&s->conn);
	if (e == ECONNRESET && unsent == 0)
		session_close(s, 0, "client went away with its replies unread (ECONNRESET)");
	else if (e == ECONNRESET)
		session_close(s, 0, "client went away with %zu replies unsent and earlier ones "
			      "unread (ECONNRESET)", unsent);
	else
		session_close(s, 0, "client went away with %zu replies unsent (%s)", unsent,
			      e == EPIPE ? "EPIPE" : strerror(e));
}

static void session_read(struct radiance_session *s)
{
	for (int i = 0; i < 2 * FRAMES_PER_WAKE; i++) {
		if (s->state == SESSION_CLOSING || s->busy || s->server->stopping ||
		    rconn_pending(&s->conn) >= SESSION_OUT_HIGH_WATER)
			return;
		int rc = rconn_read(&s->conn);
		if (rc == -EAGAIN)
			return;
		if (rc == 0) {
			session_close(s, 0, "client hung up");
			return;
		}
		if (rc == -EMSGSIZE) {
			session_close(s, 1, "frame length %u is outside 1..%u bytes",
				      rconn_bad_length(&s->conn), RADIANCE_MAX_FRAME);
			return;
		}
		if (rc == -EPROTO) {
			session_close(s, 1, "more than %u fds queued", RADIANCE_MAX_FDS);
			return;
		}
		if (rc == -EMFILE) {
			/* Our limit, not the client's fault: say so to both. */
			session_send_error(s, EMFILE, "the daemon is at its open-file limit and lost "
					   "the descriptors this client sent; try again later");
			session_close(s, 0, "lost the client's descriptors: this daemon is at its "
				      "open-file limit (raise LimitNOFILE= or lower max_sessions)");
			return;
		}
		if (rc == -ECONNRESET) {
			session_went_away(s, ECONNRESET);
			return;
		}
		if (rc < 0) {
			session_close(s, 0, "receive failed: %s", strerror(-rc));
			return;
		}
		const uint8_t *data;
		size_t len;
		while (s->state != SESSION_CLOSING && !s->busy &&
		       (rc = rconn_next_frame(&s->conn, &data, &len)) == 1)
			session_handle_frame(s, data, len);
		if (rc < 0 && s->state != SESSION_CLOSING) {
			session_close(s, 1, "frame length %u is outside 1..%u bytes",
				      rconn_bad_length(&s->conn), RADIANCE_MAX_FRAME);
			return;
		}
	}
}

static void session_flush(struct radiance_session *s)
{
	if (s->state == SESSION_CLOSING || !rconn_pending(&s->conn))
		return;
	int rc = rconn_flush(&s->conn);
	if (rc == -EPIPE || rc == -ECONNRESET)
		session_went_away(s, -rc);
	else if (rc < 0 && rc != -EAGAIN)
		session_close(s, 0, "send failed: %s", strerror(-rc));
}

static void on_session_poll(uv_poll_t *h, int status, int events)
{
	struct radiance_session *s = h->data;
	if (status < 0) {
		/* UV_EBADF is how uv_poll reports EPOLLERR: the socket's own
		 * error says what happened */
		int e = 0;
		socklen_t len = sizeof e;
		if (status == UV_EBADF &&
		    getsockopt(s->conn.fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e)
			session_went_away(s, e);
		else
			session_close(s, 0, "poll: %s", uv_strerror(status));
		return;
	}
	if (events & UV_WRITABLE)
		session_flush(s);
	if (s->state != SESSION_CLOSING && s->busy && (events & UV_DISCONNECT)) {
		session_close(s, 0, "client hung up with a request pending");
		return;
	}
	if (s->state != SESSION_CLOSING && s->server->stopping && (events & UV_DISCONNECT)) {
		session_close(s, 0, "client hung up while the daemon was stopping");
		return;
	}
	if (events & (UV_READABLE | UV_DISCONNECT))
		session_read(s);
	session_flush(s);
	session_update(s);
}

/* The session's unsent replies crossed SESSION_OUT_HIGH_WATER, up (full)
 * or back down. A client can go back and forth at will, so only its first
 * time is a warning. */
static void session_out_full(struct radiance_session *s, int full, size_t pending)
{
	s->out_full = full;
	if (full && s->out_fulls++ == 0)
		log_warn("session %llu (pid %d, '%s'): %zu bytes of replies (%zu messages) unsent: "
			 "it does not read its socket; reading none of its requests until it does "
			 "(at most %u MiB of replies are queued for one session)",
			 (unsigned long long)s->id, (int)s->pid, s->client_name, pending,
			 rconn_pending_frames(&s->conn), SESSION_OUT_HIGH_WATER >> 20);
	else if (full)
		log_debug("session %llu: %zu bytes of replies unsent again (time %u): reading none "
			  "of its requests", (unsigned long long)s->id, pending, s->out_fulls);
	else if (s->out_fulls == 1)
		log_info("session %llu (pid %d, '%s'): reads its replies again (%zu bytes unsent); "
			 "reading its requests again", (unsigned long long)s->id, (int)s->pid,
			 s->client_name, pending);
}

void session_update(struct radiance_session *s)
{
	if (s->state == SESSION_CLOSING)
		return;
	size_t pending = rconn_pending(&s->conn);
	if ((pending >= SESSION_OUT_HIGH_WATER) != s->out_full)
		session_out_full(s, pending >= SESSION_OUT_HIGH_WATER, pending);
	int events = 0;
	if (s->busy || s->server->stopping)
		events |= UV_DISCONNECT;
	else if (!s->out_full)
		events |= UV_READABLE;
	if (pending)
		events |= UV_WRITABLE;
	if (events == s->poll_events)
		return;
	int rc = uv_poll_start(&s->poll, events, on_session_poll);
	if (rc < 0) {
		session_close(s, 0, "poll: %s", uv_strerror(rc));
		return;
	}
	s->poll_events = events;
}

/* ---- replies ---- */

void session_reply(struct radiance_session *s, Rdw__ServerMessage *m, const int *fds, size_t nfds)
{
	if (s->state == SESSION_CLOSING)
		return;
	int rc = rproto_queue_server(&s->conn, m, fds, nfds);
	if (rc == -EMSGSIZE && m->msg_case != RDW__SERVER_MESSAGE__MSG_ERROR) {
		Rdw__Error e = RDW__ERROR__INIT;
		Rdw__ServerMessage em = RDW__SERVER_MESSAGE__INIT;
		e.code = EMSGSIZE;
		e.message = "the reply does not fit in one frame";
		em.tag = m->tag;
		em.msg_case = RDW__SERVER_MESSAGE__MSG_ERROR;
		em.error = &e;
		rc = rproto_queue_server(&s->conn, &em, NULL, 0);
	}
	if (rc < 0) {
		session_close(s, 0, "cannot queue a reply: %s", strerror(-rc));
		return;
	}
	session_update(s);
}

void session_reply_error(struct radiance_session *s, uint64_t tag, int code, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	Rdw__Error e = RDW__ERROR__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	e.code = code;
	e.message = text;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_ERROR;
	m.error = &e;
	log_debug("session %llu: error %d: %s", (unsigned long long)s->id, code, text);
	session_reply(s, &m, NULL, 0);
}

void session_send_error(struct radiance_session *s, int code, const char *text)
{
	session_reply_error(s, 0, code, "%s", text);
}

void session_reply_ok(struct radiance_session *s, uint64_t tag)
{
	Rdw__Ok ok = RDW__OK__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_OK;
	m.ok = &ok;
	session_reply(s, &m, NULL, 0);
}

int session_fd_reply_room(struct radiance_session *s, uint64_t tag, const char *what)
{
	if (s->conn.out_nbatches < SESSION_FD_REPLIES_MAX_QUEUED)
		return 0;
	session_reply_error(s, tag, EBUSY, "%zu replies carrying a descriptor are still unsent to "
			    "this session (at most %u): read them before %s again",
			    s->conn.out_nbatches, SESSION_FD_REPLIES_MAX_QUEUED, what);
	return -EBUSY;
}

/* ---- life cycle ---- */

static void on_poll_closed(uv_handle_t *h)
{
	struct radiance_session *s = h->data;
	s->poll_closed = 1;
	session_maybe_free(s);
}

int session_io_init(struct radiance_session *s, int fd)
{
	if (rconn_init(&s->conn, fd, RADIANCE_MAX_FRAME, RADIANCE_MAX_FDS) < 0) {
		close(fd);
		return -ENOMEM;
	}
	int rc = uv_poll_init(s->server->loop, &s->poll, fd);
	if (rc < 0) {
		rconn_finish(&s->conn);   /* closes fd */
		return rc;
	}
	s->poll.data = s;
	return 0;
}

void session_io_finish(struct radiance_session *s)
{
	/* best effort: what the socket takes now (an Error saying why) */
	rconn_flush(&s->conn);
	/* closing the socket: the client sees EOF; queued fds are closed */
	uv_close((uv_handle_t *)&s->poll, on_poll_closed);
	rconn_finish(&s->conn);
}
