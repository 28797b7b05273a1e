/*
 * The connection: socket path, handshake, the control-plane round trip,
 * sticky errors and the opt-in log. Models live in models.c, the data plane
 * in data.c, stats in stats.c.
 *
 * The socket is non-blocking and every wait is a poll() with the handle's
 * timeout, so a daemon that stops answering cannot hang a client forever
 * unless it asked for that (timeout_ms 0).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "client-private.h"
#include "proto_util.h"
#include "text.h"
#include "wire.h"

#ifndef RADIANCE_VERSION
#define RADIANCE_VERSION "unknown"
#endif

const char *radiance_version(void)
{
	return RADIANCE_VERSION;
}

uint32_t radiance_protocol_version(void)
{
	return RADIANCE_PROTOCOL_VERSION;
}

const char *radiance_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
	case EPROTO:
		return "protocol error (the daemon or the client broke the wire contract)";
	case ECONNRESET:
		return "the daemon closed the connection";
	case ETIMEDOUT:
		return "timed out waiting for the daemon";
	case EAGAIN:
		return "too many requests in flight (reap a completion first)";
	case ENOTCONN:
		return "the data plane (rings) is not open";
	case EFAULT:
		return "buffer not inside the shared arena";
	case ENOTSOCK:
		return "not a socket (the path names another kind of file)";
	case EBADFD:
		return "handle used in a forked child (it belongs to the parent)";
	case EDQUOT:
		return "a limit of the daemon would be exceeded (the message names it)";
	case ESHUTDOWN:
		return "the daemon is stopping (every completion it owed was delivered first)";
	case EBUSY:
		return "busy: another thread is inside a call on this handle, requests are in "
		       "flight, or the daemon is at a session limit (the message says which)";
	case EDEADLK:
		return "called from inside a callback (log, load progress) of a call on the same "
		       "handle";
	}
	const char *s = strerrordesc_np(err);
	return s ? s : "unknown error";
}

/* --- logging and errors --------------------------------------------------- */

/* The address of a thread-local names the calling thread (unique among
 * live threads, and cheaper than pthread_self()). */
static _Thread_local char thread_token;
/* The handle a call on this thread was refused for (-EBUSY), and why:
 * radiance_error_message() on this thread reads this instead of the
 * handle, which the other thread is using. */
static _Thread_local const struct radiance *busy_handle;
static _Thread_local char busy_message[256];


static void vlog(struct radiance *r, int level, const char *fmt, va_list ap)
{
	if (!r->log || level > r->log_priority)
		return;
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	/* Only the thread inside a call on r marks it: another thread logs
	 * here when r refused it, and must not touch the field. */
	bool mine = atomic_load_explicit(&r->owner, memory_order_relaxed) ==
		    (uintptr_t)&thread_token;
	const char *outer = mine ? r->in_callback : NULL;
	if (mine)
		r->in_callback = "log";
	r->log(r->log_user, level, buf);
	if (mine)
		r->in_callback = outer;
}

void radiance__client_log(struct radiance *r, int level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(r, level, fmt, ap);
	va_end(ap);
}

int radiance__client_fail(struct radiance *r, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->message, sizeof r->message, fmt, ap);
	va_end(ap);
	radiance__client_log(r, LOG_INFO, "%s", r->message);
	return err;
}

int radiance__client_break(struct radiance *r, int err, const char *fmt, ...)
{
	if (r->error)
		return r->error;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->message, sizeof r->message, fmt, ap);
	va_end(ap);
	r->error = err;
	memcpy(r->broken, r->message, sizeof r->broken);
	radiance__client_log(r, LOG_ERR, "connection ended: %s", r->message);
	return err;
}

int radiance_get_error(const struct radiance *r)
{
	return r ? r->error : -EINVAL;
}

const char *radiance_error_message(const struct radiance *r)
{
	if (r && r == busy_handle)
		return busy_message;
	return r ? r->message : "";
}

/* --- fork ----------------------------------------------------------------- */

volatile unsigned radiance__fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
	radiance__fork_generation++;
}

/* glibc drops the handler when this library is dlclose()d */
static void atfork_register(void)
{
	pthread_atfork(NULL, NULL, on_fork_child);
}

int radiance__client_usable(struct radiance *r)
{
	if (r->error)
		return r->error;
	if (r->fork_generation != radiance__fork_generation)
		return radiance__client_break(r, -EBADFD, "this handle belongs to the process that "
					      "connected (pid %d); a forked child must "
					      "radiance_disconnect() it and connect anew",
					      r->pid);
	return 0;
}

/* --- one thread at a time ------------------------------------------------- */

int radiance__client_enter(struct radiance *r, const char *func)
{
	if (r->fork_generation != radiance__fork_generation)
		return radiance__client_usable(r);   /* -EBADFD; the child's own copy */
	uintptr_t me = (uintptr_t)&thread_token, seen = 0;
	if (atomic_compare_exchange_strong_explicit(&r->owner, &seen, me, memory_order_acquire,
						    memory_order_relaxed)) {
		r->depth = 1;
	} else if (seen == me && r->in_callback) {
		/* the caller's callback, inside one of our calls: nesting would
		 * run a second exchange in the middle of the first one's */
		busy_handle = r;
		snprintf(busy_message, sizeof busy_message, "%s: called from inside the %s "
			 "callback of a call on this handle: a callback must not call into the "
			 "handle that runs it", func, r->in_callback);
		return -EDEADLK;
	} else if (seen == me) {
		r->depth++;   /* a call inside a call, on the same thread */
	} else {
		busy_handle = r;
		snprintf(busy_message, sizeof busy_message, "%s: radiance handle used by two threads "
			 "at once: a handle is not thread-safe; use one per thread or lock", func);
		return -EBUSY;
	}
	if (busy_handle == r)
		busy_handle = NULL;
	return 0;
}

void radiance__client_leave(struct radiance *r)
{
	if (--r->depth == 0) {
		/* a refusal in a callback was for the callback: the message
		 * is the call's own again */
		if (busy_handle == r)
			busy_handle = NULL;
		atomic_store_explicit(&r->owner, 0, memory_order_release);
	}
}

/* --- socket path ---------------------------------------------------------- */

#define RUN_DIR "/run/radiance"

static int put_path(char *buf, size_t size, const char *a, const char *b)
{
	int n = snprintf(buf, size, "%s%s", a, b);
	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

int radiance_default_socket_path(char *buf, size_t size)
{
	const char *env = getenv("RADIANCE_SOCKET");
	if (env && *env)
		return put_path(buf, size, env, "");
	/* one daemon per GPU (radianced@N.socket): the device ordinal names it */
	const char *dev = getenv("RADIANCE_DEVICE");
	if (dev && *dev) {
		size_t len = strspn(dev, "0123456789");
		if (dev[len] || len > 4 || (len > 1 && dev[0] == '0') || atoi(dev) > 1024)
			return -EINVAL;
		char name[32];
		snprintf(name, sizeof name, "/radiance-%s.sock", dev);
		return put_path(buf, size, RUN_DIR, name);
	}
	if (geteuid() != 0) {
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		struct stat st;
		if (xdg && *xdg && put_path(buf, size, xdg, "/radiance.sock") == 0 &&
		    stat(buf, &st) == 0 && S_ISSOCK(st.st_mode))
			return 0;
	}
	return put_path(buf, size, RUN_DIR, "/radiance.sock");
}

/* --- framing -------------------------------------------------------------- */

/* poll() one fd, restarting on EINTR with what is left of timeout_ms (-1:
 * forever). 0 when ready, -ETIMEDOUT, or -errno. */
static int wait_fd(int fd, short events, int timeout_ms)
{
	int64_t deadline = timeout_ms >= 0 ? rclock_ms() + timeout_ms : 0;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		int left = timeout_ms >= 0 ? (int)(deadline - rclock_ms()) : -1;
		if (timeout_ms >= 0 && left < 0)
			left = 0;
		int n = poll(&p, 1, left);
		if (n > 0)
			return 0;
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

static int read_message(struct radiance *r, int timeout_ms, Rdw__ServerMessage **out);

static int error_code(const Rdw__Error *e)
{
	/* A positive errno on the wire; anything else is the daemon's bug, but
	 * the request still failed. */
	return (e && e->code > 0 && e->code < 4096) ? -e->code : -EIO;
}

/* An Error the daemon sent outside any reply: it ends the session (or,
 * before the handshake finished, refuses the connection, e.g. EBUSY "too
 * many sessions"). Sticky. */
static int daemon_ended(struct radiance *r, const Rdw__Error *e)
{
	const char *text = e->message && *e->message ? e->message
						     : radiance_strerror(error_code(e));
	if (!r->welcomed)
		return radiance__client_break(r, error_code(e), "the daemon refused the connection: %s",
					      text);
	return radiance__client_break(r, error_code(e), "the daemon ended the session: %s", text);
}

/* The daemon's last message when it stops: every result it owed is in
 * the CQ already (radiance_wait() still delivers them). Sticky. */
static int daemon_stopping(struct radiance *r, const Rdw__Goodbye *g)
{
	int code = (g->code > 0 && g->code < 4096) ? -g->code : -ESHUTDOWN;
	return radiance__client_break(r, code, "daemon stopping: %s",
				      g->reason && *g->reason ? g->reason : "no reason given");
}

/* A message outside any reply: the daemon ends the session (an Error, a
 * Goodbye), or broke the protocol. Returns the sticky error. */
static int unsolicited(struct radiance *r, const Rdw__ServerMessage *m)
{
	if (m->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR)
		return daemon_ended(r, m->error);
	if (m->msg_case == RDW__SERVER_MESSAGE__MSG_GOODBYE)
		return daemon_stopping(r, m->goodbye);
	return radiance__client_break(r, -EPROTO, "unsolicited %s from the daemon",
				      rproto_server_name(m));
}

/* The daemon closed its end while we were sending. What it wrote before
 * closing (an Error saying why) may still wait in our receive queue: read
 * it, so the reason reaches radiance_error_message() instead of EPIPE. */
static int daemon_gone(struct radiance *r)
{
	Rdw__ServerMessage *m;
	while (!r->error && read_message(r, 0, &m) == 0) {
		rconn_close_fds(&r->conn);
		if (m->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR ||
		    m->msg_case == RDW__SERVER_MESSAGE__MSG_GOODBYE)
			unsolicited(r, m);
		rdw__server_message__free_unpacked(m, NULL);
	}
	return radiance__client_break(r, -ECONNRESET, "the daemon closed the connection");
}

static int flush_all(struct radiance *r)
{
	for (;;) {
		int rc = rconn_flush(&r->conn);
		if (rc == 0)
			return 0;
		if (rc == -EPIPE || rc == -ECONNRESET)
			return daemon_gone(r);
		if (rc != -EAGAIN)
			return radiance__client_break(r, rc, "sending to the daemon: %s", strerror(-rc));
		rc = wait_fd(r->conn.fd, POLLOUT, r->timeout_ms);
		if (rc == -ETIMEDOUT)
			return radiance__client_break(r, rc, "the daemon does not read its socket");
		if (rc < 0)
			return radiance__client_break(r, rc, "poll: %s", strerror(-rc));
	}
}

/* Reads the next server message. timeout_ms -1 waits forever, 0 only takes
 * what is already there (-EAGAIN if nothing). Every protocol failure is
 * sticky; so is EOF. */
static int read_message(struct radiance *r, int timeout_ms, Rdw__ServerMessage **out)
{
	*out = NULL;
	for (;;) {
		const uint8_t *data;
		size_t len;
		int rc = rconn_next_frame(&r->conn, &data, &len);
		if (rc == 1) {
			Rdw__ServerMessage *m = rproto_unpack_server(data, len);
			if (!m)
				return radiance__client_break(r, -EPROTO, "undecodable message from the daemon (%zu bytes)",
						       len);
			if (m->msg_case == RDW__SERVER_MESSAGE__MSG__NOT_SET) {
				rdw__server_message__free_unpacked(m, NULL);
				return radiance__client_break(r, -EPROTO, "empty message from the daemon");
			}
			*out = m;
			return 0;
		}
		if (rc < 0)
			return radiance__client_break(r, -EPROTO, "bad frame length from the daemon");
		rc = rconn_read(&r->conn);
		if (rc > 0)
			continue;
		if (rc == 0)
			return radiance__client_break(r, -ECONNRESET, "the daemon closed the connection");
		if (rc == -EAGAIN) {
			if (timeout_ms == 0)
				return -EAGAIN;
			rc = wait_fd(r->conn.fd, POLLIN, timeout_ms);
			if (rc == -ETIMEDOUT)
				return radiance__client_fail(r, rc, "no reply from the daemon within %d ms", timeout_ms);
			if (rc < 0)
				return radiance__client_break(r, rc, "poll: %s", strerror(-rc));
			continue;
		}
		if (rc == -EPROTO)
			return radiance__client_break(r, rc, "the daemon sent too many file descriptors");
		if (rc == -EMFILE)
			return radiance__client_break(r, rc, "descriptors the daemon sent were lost: this "
						      "process is at its open-file limit (RLIMIT_NOFILE)");
		if (rc == -EPIPE || rc == -ECONNRESET)
			return radiance__client_break(r, -ECONNRESET, "the daemon closed the connection");
		return radiance__client_break(r, rc, "receiving from the daemon: %s", strerror(-rc));
	}
}

/* What msg asks for, in the terms of the API and of radiancectl ("unload
 * model 3 \"minilm\"", "load \"minilm\""), for the front of the daemon's
 * Error: the wire's message names (release_model) are not the caller's. */
static void request_what(const struct radiance *r, const Rdw__ClientMessage *m, char *out,
			 size_t outlen)
{
	char shown[RTEXT_NAME_MAX + 8];
	uint32_t id = 0;
	const char *verb = NULL;
	switch (m->msg_case) {
	case RDW__CLIENT_MESSAGE__MSG_HELLO:
		snprintf(out, outlen, "handshake");
		return;
	case RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL:
	case RDW__CLIENT_MESSAGE__MSG_ATTACH_MODEL: {
		const char *name = m->msg_case == RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL
					   ? m->load_model->name : m->attach_model->name;
		verb = m->msg_case == RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL ? "load" : "attach";
		if (!name || !*name) {
			snprintf(out, outlen, "%s", verb);
			return;
		}
		rtext_escape(name, shown, sizeof shown);
		snprintf(out, outlen, "%s \"%s\"", verb, shown);
		return;
	}
	case RDW__CLIENT_MESSAGE__MSG_RELEASE_MODEL:
		verb = m->release_model->drop_preload ? "unload model" : "release model";
		id = m->release_model->model_id;
		break;
	case RDW__CLIENT_MESSAGE__MSG_GET_MODEL:
		verb = "get model", id = m->get_model->model_id;
		break;
	case RDW__CLIENT_MESSAGE__MSG_MAP_MODEL:
		verb = "map model", id = m->map_model->model_id;
		break;
	case RDW__CLIENT_MESSAGE__MSG_UNMAP_MODEL:
		verb = "unmap model", id = m->unmap_model->model_id;
		break;
	case RDW__CLIENT_MESSAGE__MSG_LIST_TENSORS:
		verb = "list the tensors of model", id = m->list_tensors->model_id;
		break;
	case RDW__CLIENT_MESSAGE__MSG_MAP_TENSORS:
		verb = "map the tensors of model", id = m->map_tensors->model_id;
		break;
	case RDW__CLIENT_MESSAGE__MSG_LIST_MODELS:
		snprintf(out, outlen, "list models");
		return;
	case RDW__CLIENT_MESSAGE__MSG_OPEN_RING:
		snprintf(out, outlen, "open the rings");
		return;
	case RDW__CLIENT_MESSAGE__MSG_GET_STATS:
		snprintf(out, outlen, "get stats");
		return;
	default:
		snprintf(out, outlen, "request");
		return;
	}
	/* a model this session holds has a name it knows */
	const struct radiance__client_held *h = radiance__client_find_held(r, id);
	if (!h) {
		snprintf(out, outlen, "%s %u", verb, id);
		return;
	}
	rtext_escape(h->info->name, shown, sizeof shown);
	snprintf(out, outlen, "%s %u \"%s\"", verb, id, shown);
}

int radiance__client_request(struct radiance *r, Rdw__ClientMessage *msg, const int *fds,
		      size_t nfds, radiance_load_progress_fn progress, void *progress_user,
		      Rdw__ServerMessage **reply)
{
	*reply = NULL;
	int rc = radiance__client_usable(r);
	if (rc < 0)
		return rc;
	msg->tag = r->next_tag++;
	rc = rproto_queue_client(&r->conn, msg, fds, nfds);
	if (rc < 0)
		return radiance__client_fail(r, rc, "cannot queue %s: %s", rproto_client_name(msg),
				      strerror(-rc));
	if ((rc = flush_all(r)) < 0)
		return rc;
	for (;;) {
		Rdw__ServerMessage *m;
		if ((rc = read_message(r, r->timeout_ms, &m)) < 0) {
			if (rc == -ETIMEDOUT)
				/* The reply may still come and would then be out of
				 * step with the next request: the connection is over. */
				return radiance__client_break(r, rc, "no reply to %s within %d ms",
						       rproto_client_name(msg), r->timeout_ms);
			return rc;
		}
		size_t want_fds = rproto_server_fds(m);
		if (rconn_queued_fds(&r->conn) < want_fds) {
			rdw__server_message__free_unpacked(m, NULL);
			return radiance__client_break(r, -EPROTO, "reply declares %zu fds, fewer arrived", want_fds);
		}
		if (want_fds == 0)
			rconn_close_fds(&r->conn);   /* fds nobody declared */
		if (m->tag != msg->tag) {
			if (m->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR ||
			    m->msg_case == RDW__SERVER_MESSAGE__MSG_GOODBYE) {
				/* The daemon ends the session over something it
				 * noticed out of band (e.g. a corrupted ring) or
				 * because it stops, or refuses the connection
				 * before the handshake. */
				unsolicited(r, m);
			} else {
				rc = radiance__client_break(r, -EPROTO, "reply tag %llu to request tag %llu",
						     (unsigned long long)m->tag,
						     (unsigned long long)msg->tag);
			}
			rdw__server_message__free_unpacked(m, NULL);
			return r->error;
		}
		switch (m->msg_case) {
		case RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS:
			if (progress) {
				r->in_callback = "load progress";
				progress(progress_user, m->load_progress->done_bytes,
					 m->load_progress->total_bytes);
				r->in_callback = NULL;
			}
			rdw__server_message__free_unpacked(m, NULL);
			continue;
		case RDW__SERVER_MESSAGE__MSG_ERROR:
			if (!r->welcomed) {
				/* an Error answering the Hello: no session */
				rc = daemon_ended(r, m->error);
				rdw__server_message__free_unpacked(m, NULL);
				return rc;
			}
			char what[RTEXT_NAME_MAX + 64];
			request_what(r, msg, what, sizeof what);
			rc = radiance__client_fail(r, error_code(m->error), "%s: %s", what,
					    m->error->message && *m->error->message
						    ? m->error->message
						    : radiance_strerror(error_code(m->error)));
			rdw__server_message__free_unpacked(m, NULL);
			return rc;
		default:
			*reply = m;
			return 0;
		}
	}
}

int radiance__client_socket_event(struct radiance *r)
{
	if (r->error)
		return r->error;
	Rdw__ServerMessage *m;
	int rc = read_message(r, 0, &m);
	if (rc == -EAGAIN)
		return 0;
	if (rc < 0)
		return r->error ? r->error : rc;
	rconn_close_fds(&r->conn);
	unsolicited(r, m);
	rdw__server_message__free_unpacked(m, NULL);
	return r->error;
}

/* --- connect -------------------------------------------------------------- */

static char *dup_or_empty(const char *s)
{
	return strdup(s ? s : "");
}

static int handshake(struct radiance *r)
{
	Rdw__Hello hello = RDW__HELLO__INIT;
	hello.protocol_version = RADIANCE_PROTOCOL_VERSION;
	hello.client_name = r->client_name;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_HELLO;
	msg.hello = &hello;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_WELCOME) {
		rc = radiance__client_break(r, -EPROTO, "hello answered with %s",
				     rproto_server_name(reply));
		goto out;
	}
	const Rdw__Welcome *w = reply->welcome;
	if (w->protocol_version != RADIANCE_PROTOCOL_VERSION) {
		rc = radiance__client_break(r, -EPROTO, "daemon speaks protocol %u, this library %u",
				     w->protocol_version, RADIANCE_PROTOCOL_VERSION);
		goto out;
	}
	r->server_version = dup_or_empty(w->server_version);
	r->backend = dup_or_empty(w->backend);
	r->device = dup_or_empty(w->device);
	if (!r->server_version || !r->backend || !r->device) {
		rc = -ENOMEM;
		goto out;
	}
	r->welcomed = true;
	if (r->spin_opt == 0)
		r->spin_us = strcmp(r->backend, "cpu") == 0 ? RADIANCE__DEFAULT_SPIN_US : RADIANCE__DEFAULT_SPIN_US_GPU;
	r->server = (struct radiance_server_info){
		.protocol_version = w->protocol_version,
		.server_version = r->server_version,
		.backend = r->backend,
		.device = r->device,
		.session_id = w->session_id,
		.max_rows = w->max_rows,
		.map_layout_version = w->map_layout_version,
		.tensors_version = w->tensors_version,
		.max_request_layers = w->max_request_layers,
	};
	radiance__client_log(r, LOG_DEBUG, "session %llu: radianced %s, backend %s (%s), max_rows %u, waits spin %d us",
		      (unsigned long long)w->session_id, r->server_version, r->backend, r->device,
		      w->max_rows, (int)r->spin_us);
out:
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}

static int open_socket(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* Connect blocking (a Unix connect completes at once or fails), then
	 * go non-blocking for the poll()-driven exchanges. */
	int rc;
	do
		rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
	while (rc < 0 && errno == EINTR);
	if (rc < 0 || fcntl(fd, F_SETFL, O_NONBLOCK) < 0) {
		rc = -errno;
		close(fd);
		/* connect() to a regular file or a directory says ECONNREFUSED,
		 * which reads as "no daemon": a wrong --socket would send the
		 * user looking for a daemon that is not the problem. */
		struct stat st;
		if ((rc == -ECONNREFUSED || rc == -ENOTSOCK) && stat(path, &st) == 0 &&
		    !S_ISSOCK(st.st_mode))
			rc = -ENOTSOCK;
		return rc;
	}
	*out = fd;
	return 0;
}

/* Connects to r->socket_path and says Hello: a new session on r (whose
 * conn is closed). 0, or -errno with r->message saying why (sticky when
 * the handshake failed). */
/* Whether a failed connect may be the daemon not being there yet: no one
 * listens (ECONNREFUSED: a stale socket, replaced when the daemon starts)
 * or no socket (ENOENT) in a directory that exists (a missing directory is
 * a wrong path, said at once). */
static bool connect_may_retry(const char *path, int rc)
{
	if (rc == -ECONNREFUSED)
		return true;
	if (rc != -ENOENT)
		return false;
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash)
		return true;   /* relative, in the current directory */
	if (slash == dir)
		slash[1] = 0;
	else
		*slash = 0;
	struct stat st;
	return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

static int session_open(struct radiance *r)
{
	const char *path = r->socket_path;
	int64_t start = rclock_ms();
	int64_t deadline = r->connect_timeout_ms > 0 ? start + r->connect_timeout_ms : start;
	int fd = -1, rc, delay = 10, tries = 0;
	for (;;) {
		rc = open_socket(path, &fd);
		tries++;
		if (rc == 0 || !connect_may_retry(path, rc) || rclock_ms() >= deadline)
			break;
		if (tries == 1)
			radiance__client_log(r, LOG_INFO, "no daemon at %s yet (%s): retrying for up "
					     "to %d ms", path, strerror(-rc), r->connect_timeout_ms);
		int64_t left = deadline - rclock_ms();
		struct timespec ts = { 0, (long)(left < delay ? left : delay) * 1000000L };
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		delay = delay < 250 ? delay * 2 : 500;
	}
	if (rc == -ENOTSOCK)
		return radiance__client_fail(r, rc, "%s exists and is not a socket", path);
	/* Permission denied alone does not say what to change: the socket is
	 * owner-only unless the daemon was given a group. Said here, so every
	 * client (radiancectl, Python, a program's log callback) gets it. */
	if (rc == -EACCES)
		return radiance__client_fail(r, rc, "%s: uid %u may not connect (the socket's mode, "
					     "or a directory above it, keeps it out): members of "
					     "the group named by radianced's --group (config key "
					     "group), or by SocketGroup= of radianced.socket "
					     "(radiance) under socket activation, may",
					     strerror(EACCES), (unsigned)geteuid());
	if (rc < 0 && tries > 1)
		return radiance__client_fail(r, rc, "%s (still, after %d tries in %lld ms: "
					     "connect_timeout_ms)", strerror(-rc), tries,
					     (long long)(rclock_ms() - start));
	if (rc < 0)
		return radiance__client_fail(r, rc, "%s", strerror(-rc));
	if ((rc = rconn_init(&r->conn, fd, RADIANCE_MAX_FRAME, RADIANCE_MAX_FDS)) < 0) {
		close(fd);
		r->conn.fd = -1;
		return radiance__client_fail(r, rc, "%s", strerror(-rc));
	}
	if ((rc = radiance__client_watch(r, fd)) < 0)
		return radiance__client_fail(r, rc, "epoll_ctl(socket): %s", strerror(-rc));
	/* Under socket activation connect() succeeds at once and the Welcome
	 * comes once the daemon has started: that wait counts too. */
	int reply_ms = r->timeout_ms;
	int left = -1;
	if (r->connect_timeout_ms > 0) {
		int64_t l = deadline - rclock_ms();
		left = l > 0 ? (int)l : 1;
		if (reply_ms < 0 || left < reply_ms)
			r->timeout_ms = left;
	}
	rc = handshake(r);
	bool ours = r->timeout_ms != reply_ms;
	r->timeout_ms = reply_ms;
	if (rc == -ETIMEDOUT && ours) {
		r->error = 0;   /* restate the sticky error with the limit that fired */
		radiance__client_break(r, rc, "no Welcome from the daemon within %d ms of "
				       "connecting (connect_timeout_ms): it accepts connections but "
				       "does not answer (under socket activation: still starting?)",
				       r->connect_timeout_ms);
	}
	return rc;
}

struct radiance *radiance_connect(const char *socket_path, const struct radiance_options *opt)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int rc;

	if (opt) {
		if (opt->size < offsetof(struct radiance_options, log)) {
			errno = EINVAL;
			return NULL;
		}
		memcpy(&o, opt, opt->size < sizeof o ? opt->size : sizeof o);
	}
	if (!socket_path) {
		if ((rc = radiance_default_socket_path(path, sizeof path)) < 0) {
			/* no handle to ask why: the log callback is the only place
			 * the reason can go (a caller would otherwise say "cannot
			 * connect to : Invalid argument") */
			if (o.log) {
				char why[300];
				const char *dev = getenv("RADIANCE_DEVICE");
				if (rc == -EINVAL && dev)
					snprintf(why, sizeof why, "cannot connect: $RADIANCE_DEVICE is "
						 "'%.64s', not a GPU ordinal (0 to 1024, in decimal "
						 "without leading zeros), so there is no default socket",
						 dev);
				else
					snprintf(why, sizeof why, "cannot connect: the default socket "
						 "path ($RADIANCE_SOCKET) is too long for a Unix socket");
				o.log(o.log_user, LOG_WARNING, why);
			}
			errno = -rc;
			return NULL;
		}
		socket_path = path;
	}

	struct radiance *r = calloc(1, sizeof *r);
	if (!r) {
		errno = ENOMEM;
		return NULL;
	}
	r->conn.fd = -1;
	r->sq_doorbell = r->cq_doorbell = -1;
	r->epfd = -1;
	r->log = o.log;
	r->log_user = o.log_user;
	r->log_priority = o.log_priority > 0 ? o.log_priority : LOG_WARNING;
	if (o.spin_us < -1 || o.timeout_ms < 0 || o.connect_timeout_ms < -1) {
		radiance__client_log(r, LOG_WARNING, "cannot connect to %s: invalid options: %s",
				     socket_path, o.spin_us < -1 ?
				     "spin_us below -1 (0 = default, -1 = never spin)" :
				     o.timeout_ms < 0 ? "timeout_ms below 0 (0 = wait forever)" :
				     "connect_timeout_ms below -1 (0 = default 30000, -1 = one "
				     "attempt, no limit on the Welcome but timeout_ms)");
		rc = -EINVAL;
		goto err_free;
	}
	r->connect_timeout_ms = o.connect_timeout_ms == 0 ? RADIANCE_CONNECT_TIMEOUT_MS
							  : o.connect_timeout_ms;
	r->want_sq = o.sq_entries;
	r->want_cq = o.cq_entries;
	r->want_arena = o.arena_bytes;
	r->spin_opt = o.spin_us;
	r->spin_us = o.spin_us == 0 ? RADIANCE__DEFAULT_SPIN_US : (o.spin_us < 0 ? 0 : o.spin_us);
	r->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : -1;
	r->next_tag = 1;
	pthread_once(&atfork_once, atfork_register);
	r->fork_generation = radiance__fork_generation;
	r->pid = (int)getpid();
	r->next_request_id = 1;
	r->client_name = strdup(o.client_name && *o.client_name ? o.client_name : "libradiance");
	if (!r->client_name) {
		rc = -ENOMEM;
		goto err_free;
	}

	r->socket_path = strdup(socket_path);
	if (!r->socket_path) {
		rc = -ENOMEM;
		goto err_free;
	}
	if ((rc = session_open(r)) < 0) {
		radiance__client_log(r, LOG_WARNING, "cannot connect to %s: %s", socket_path,
				     r->message);
		goto err_free;
	}
	return r;

err_free:
	radiance_disconnect(r);
	errno = -rc;
	return NULL;
}

void radiance_disconnect(struct radiance *r)
{
	if (!r)
		return;
	/* Freeing under another thread's call would be a use after free there:
	 * leak the handle instead, and say so. A forked child frees its copy. */
	if (r->fork_generation == radiance__fork_generation &&
	    radiance__client_enter(r, __func__) < 0) {
		radiance__client_log(r, LOG_ERR, "%s (not disconnected: the handle is leaked)",
				     busy_message);
		return;
	}
	radiance__client_rings_close(r);
	if (r->conn.fd >= 0 || r->conn.in_fds)
		rconn_finish(&r->conn);
	if (r->epfd >= 0)
		close(r->epfd);
	for (size_t i = 0; i < r->n_held; i++)
		radiance_model_info_free(r->held[i].info);
	free(r->held);
	free(r->server_version);
	free(r->backend);
	free(r->device);
	free(r->socket_path);
	free(r->client_name);
	free(r);
}

/* --- reconnect ------------------------------------------------------------ */

static void session_end(struct radiance *r)
{
	if (r->conn.fd >= 0 || r->conn.in_fds)
		rconn_finish(&r->conn);
	memset(&r->conn, 0, sizeof r->conn);
	r->conn.fd = -1;
	free(r->server_version);
	free(r->backend);
	free(r->device);
	r->server_version = r->backend = r->device = NULL;
	memset(&r->server, 0, sizeof r->server);
	r->welcomed = false;
	r->error = 0;
	r->broken[0] = 0;
}

static int reconnect(struct radiance *r)
{
	/* a completion's text fits a CQ slot (RADIANCE_SLOT_BYTES) */
	char why[RADIANCE_SLOT_BYTES];
	snprintf(why, sizeof why, "in flight when radiance_reconnect() replaced the session "
		 "(%.120s): its output is lost; resubmit it",
		 r->error ? r->broken : "the session was still up");
	int lost = radiance__client_rings_abandon(r, -ECANCELED, why);
	session_end(r);

	/* the models to attach again, by name, in the new session */
	struct radiance__client_held *held = r->held;
	size_t n_held = r->n_held;
	r->held = NULL;
	r->n_held = r->cap_held = 0;

	int rc = session_open(r);
	if (rc < 0) {
		radiance__client_break(r, rc, "reconnecting to %s: %s", r->socket_path, r->message);
		/* the handle still remembers them for the next try */
		r->held = held;
		r->n_held = r->cap_held = n_held;
		return r->error;
	}
	char missing[256] = "";
	size_t nmissing = 0, used = 0;
	for (size_t i = 0; i < n_held; i++) {
		const char *name = held[i].info->name;
		uint32_t id;
		rc = radiance__client_attach(r, name, &id);
		if (rc < 0 && r->error) {
			rc = r->error;
			break;
		}
		if (rc < 0) {
			nmissing++;
			int k = snprintf(missing + used, sizeof missing - used, "%s'%s' (%s)",
					 used ? ", " : "", name, r->message);
			if (k > 0 && (size_t)k < sizeof missing - used)
				used += (size_t)k;
			rc = 0;
		} else if (id != held[i].model_id) {
			radiance__client_log(r, LOG_INFO, "model '%s' is model %u now (was %u)", name,
					     id, held[i].model_id);
		}
	}
	for (size_t i = 0; i < n_held; i++)
		radiance_model_info_free(held[i].info);
	free(held);
	if (rc < 0)
		return rc;
	radiance__client_log(r, LOG_INFO, "reconnected to %s: session %llu", r->socket_path,
			     (unsigned long long)r->server.session_id);
	if (nmissing)
		return radiance__client_fail(r, -ENOENT, "reconnected, but %zu models could not be "
					     "attached again: %s", nmissing, missing);
	if (lost < 0)
		return radiance__client_fail(r, lost, "reconnected, but out of memory keeping the "
					     "failed completions of the old session");
	return 0;
}

int radiance_reconnect(struct radiance *r)
{
	RADIANCE__GUARDED(r, reconnect(r));
}

const struct radiance_server_info *radiance_get_server_info(const struct radiance *r)
{
	return &r->server;
}
