/* The loop: listening socket, per-connection polls, signals, watchdog. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "limit.h"
#include "log.h"
#include "notify.h"
#include "proto_util.h"
#include "listen.h"
#include "session.h"
#include "session_tensors.h"
#include "thread.h"
#include "wire.h"

/* A connection refused at the session limit lingers this long at most (to
 * read what it sent, so closing does not reset it), and at most this many
 * linger at once; beyond that they are closed right after the Error. */
#define REFUSED_LINGER_MS 2000
#define REFUSED_MAX 64
/* After an accept() error the listening socket is left alone this long. */
#define ACCEPT_RETRY_MS 100
/* One log line per this for conditions a peer can repeat at will. */
#define LOG_INTERVAL_NS (5ull * 1000000000ull)
/* Descriptors one session may hold: RADIANCE_MAX_FDS received and not yet
 * handed to a loader (a busy session reads no further), its socket, the SQ
 * doorbell eventfd, the CQ doorbell pipe's write end, and while RingReady is
 * queued the memfd and the pipe's read end, and the memfd dups of unsent
 * MapTensors and MapModel replies (session.h). Plus what the
 * daemon itself holds (libuv, threads, the GPU runtime, a preload's files,
 * lingering refused connections). docs/daemon.md does the arithmetic for
 * LimitNOFILE=. */
#define FDS_PER_SESSION (RADIANCE_MAX_FDS + 5u + SESSION_FD_REPLIES_MAX_QUEUED)
#define FDS_DAEMON (256u + REFUSED_MAX)

static void server_stop(struct radiance_server *srv, int exit_code, const char *reason);
static void signals_stop(struct radiance_server *srv);

/* 1 when a rate-limited message may be logged now; *missed is how many
 * were held back since the last one. */
static int ratelimit_pass(struct log_ratelimit *rl, uint64_t *missed)
{
	uint64_t now = rclock_ns();
	if (now < rl->next_ns) {
		rl->suppressed++;
		return 0;
	}
	rl->next_ns = now + LOG_INTERVAL_NS;
	*missed = rl->suppressed;
	rl->suppressed = 0;
	return 1;
}

/* ---- sessions ---- */

static void registry_empty(void *user);

void server_session_gone(struct radiance_session *s)
{
	struct radiance_server *srv = s->server;
	if (s->prev)
		s->prev->next = s->next;
	else
		srv->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	srv->nsessions--;
	srv->nclosing--;
	log_debug("session %llu: freed", (unsigned long long)s->id);
	if (srv->stopping && srv->nsessions == 0)
		registry_shutdown(srv->reg, registry_empty, srv);
}

/* ---- refusing ---- */

static int queue_error(struct rconn *c, int code, const char *text)
{
	Rdw__Error e = RDW__ERROR__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	e.code = code;
	e.message = (char *)text;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_ERROR;
	m.error = &e;
	return rproto_queue_server(c, &m, NULL, 0);
}

/* Best effort: the Error, then close. If the client already sent something
 * (its Hello), the close resets the connection and it may never read the
 * Error; refuse_gracefully() avoids that where it can afford to. */
static void refuse_now(int fd, int code, const char *text)
{
	struct rconn c;
	if (rconn_init(&c, fd, RADIANCE_MAX_FRAME, 1) < 0) {
		close(fd);
		return;
	}
	if (queue_error(&c, code, text) == 0)
		rconn_flush(&c);
	rconn_finish(&c);
}

/* A connection told Error(EBUSY): shut down for writing once the Error is
 * out, then read and drop what the client sends until it hangs up. Closing
 * a Unix socket with unread data makes the peer's next read fail with
 * ECONNRESET, which can come before the Error it has not read yet. */
struct refused_conn {
	struct radiance_server *srv;
	struct refused_conn *prev, *next;
	struct rconn conn;
	uv_poll_t poll;
	uv_timer_t timer;
	int handles;       /* open libuv handles; freed at 0 */
	int closing;
	int shut;          /* the Error is out and SHUT_WR done */
};

static void on_refused_handle_closed(uv_handle_t *h)
{
	struct refused_conn *r = h->data;
	if (--r->handles == 0) {
		rconn_finish(&r->conn);
		free(r);
	}
}

static void refused_close(struct refused_conn *r)
{
	if (r->closing)
		return;
	r->closing = 1;
	struct radiance_server *srv = r->srv;
	if (r->prev)
		r->prev->next = r->next;
	else
		srv->refused = r->next;
	if (r->next)
		r->next->prev = r->prev;
	srv->nrefused--;
	uv_close((uv_handle_t *)&r->poll, on_refused_handle_closed);
	uv_close((uv_handle_t *)&r->timer, on_refused_handle_closed);
}

static void on_refused_timer(uv_timer_t *t)
{
	refused_close(t->data);
}

/* Reads and drops what is there, closing any fds that came with it.
 * 1 at EOF or on an error, 0 when the socket is drained for now. */
static int refused_drain(struct refused_conn *r)
{
	for (int i = 0; i < 16; i++) {
		char buf[4096];
		union {
			char b[CMSG_SPACE(sizeof(int) * RADIANCE_SCM_MAX_FD)];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
		struct msghdr msg = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = ctl.b, .msg_controllen = sizeof ctl.b,
		};
		ssize_t n = recvmsg(r->conn.fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : 1;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t j = 0; j < k; j++) {
				int fd;
				memcpy(&fd, CMSG_DATA(cm) + j * sizeof(int), sizeof fd);
				close(fd);
			}
		}
		if (n == 0)
			return 1;
	}
	return 0;
}

static void on_refused_poll(uv_poll_t *h, int status, int events)
{
	struct refused_conn *r = h->data;
	if (status < 0) {
		refused_close(r);
		return;
	}
	if (!r->shut) {
		int rc = rconn_flush(&r->conn);
		if (rc < 0 && rc != -EAGAIN) {
			refused_close(r);
			return;
		}
		if (rc == 0) {
			shutdown(r->conn.fd, SHUT_WR);
			r->shut = 1;
			uv_poll_start(&r->poll, UV_READABLE | UV_DISCONNECT, on_refused_poll);
		}
	}
	if ((events & (UV_READABLE | UV_DISCONNECT)) && refused_drain(r))
		refused_close(r);
}

static void refuse_gracefully(struct radiance_server *srv, int fd, int code, const char *text)
{
	struct refused_conn *r = srv->nrefused < REFUSED_MAX ? calloc(1, sizeof *r) : NULL;
	if (!r) {
		refuse_now(fd, code, text);
		return;
	}
	r->srv = srv;
	if (rconn_init(&r->conn, fd, RADIANCE_MAX_FRAME, 1) < 0) {
		free(r);
		refuse_now(fd, code, text);
		return;
	}
	if (queue_error(&r->conn, code, text) < 0 || uv_poll_init(srv->loop, &r->poll, fd) < 0) {
		rconn_finish(&r->conn);   /* closes fd */
		free(r);
		return;
	}
	uv_timer_init(srv->loop, &r->timer);
	r->poll.data = r->timer.data = r;
	r->handles = 2;
	r->next = srv->refused;
	if (srv->refused)
		srv->refused->prev = r;
	srv->refused = r;
	srv->nrefused++;
	uv_timer_start(&r->timer, on_refused_timer, REFUSED_LINGER_MS, 0);
	uv_poll_start(&r->poll, UV_WRITABLE | UV_READABLE | UV_DISCONNECT, on_refused_poll);
}

/* ---- accepting ---- */

static void on_listen(uv_poll_t *h, int status, int events);

static void on_accept_retry(uv_timer_t *t)
{
	struct radiance_server *srv = t->data;
	if (srv->stopping)
		return;
	int rc = uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
	if (rc < 0) {
		log_error("poll on the listening socket: %s", uv_strerror(rc));
		server_stop(srv, 1, "the listening socket failed");
	}
}

/* A level-triggered poll on a socket accept() keeps failing on would spin:
 * leave it alone for a moment. */
static void accept_pause(struct radiance_server *srv)
{
	uv_poll_stop(&srv->listen_poll);
	uv_timer_start(&srv->accept_retry, on_accept_retry, ACCEPT_RETRY_MS, 0);
}

/* Out of descriptors: what waits in the backlog stays there and keeps the
 * listening socket readable. Give up the reserve descriptor to accept and
 * close it (with an Error, best effort), take the reserve back, pause. */
static void accept_without_fds(struct radiance_server *srv, int err)
{
	uint64_t closed = 0, missed;
	if (srv->reserve_fd >= 0) {
		close(srv->reserve_fd);
		srv->reserve_fd = -1;
		for (int i = 0; i < 1024; i++) {
			int fd = accept4(srv->listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
			if (fd < 0)
				break;
			refuse_now(fd, EMFILE, "the daemon is out of file descriptors; try again later");
			closed++;
		}
		srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	srv->fd_refused += closed;
	if (ratelimit_pass(&srv->emfile_log, &missed)) {
		struct rlimit rl = { 0, 0 };
		getrlimit(RLIMIT_NOFILE, &rl);
		log_warn("accept: %s (the limit is %llu): closing new connections until descriptors "
			 "are freed; %llu closed so far", strerror(err),
			 (unsigned long long)rl.rlim_cur, (unsigned long long)srv->fd_refused);
		srv->fd_refused = 0;
		srv->emfile_warned = 1;
	}
	accept_pause(srv);
}

/* When uid already holds max_sessions_per_uid live sessions, says so in
 * text (else leaves it empty). Closing sessions do not count, as for
 * max_sessions. */
static void uid_sessions_full(struct radiance_server *srv, uid_t uid, char *text, size_t len)
{
	uint64_t limit = srv->cfg->max_sessions_per_uid, n = 0;
	if (!limit)
		return;
	for (struct radiance_session *s = srv->sessions; s; s = s->next)
		n += s->uid == uid && s->state != SESSION_CLOSING;
	if (n < limit)
		return;
	char whose[48];
	snprintf(whose, sizeof whose, "uid %u's", (unsigned)uid);
	limit_refusal(text, len, "a new session", whose, "sessions", n + 1,
		       "max_sessions_per_uid", limit, 0);
}

static void on_listen(uv_poll_t *h, int status, int events)
{
	struct radiance_server *srv = h->data;
	uint64_t missed;
	for (int i = 0; i < 64 && !srv->stopping; i++) {
		int fd = accept4(srv->listener.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			int e = errno;
			if (e == EAGAIN || e == EINTR)
				return;
			if (e == ECONNABORTED)
				continue;
			if (e == EMFILE || e == ENFILE) {
				accept_without_fds(srv, e);
				return;
			}
			if (ratelimit_pass(&srv->emfile_log, &missed))
				log_error("accept: %s", strerror(e));
			accept_pause(srv);
			return;
		}
		if (srv->emfile_warned) {
			log_info("accepting connections again (%llu more were closed for lack of "
				 "descriptors)", (unsigned long long)srv->fd_refused);
			srv->emfile_warned = 0;
			srv->fd_refused = 0;
		}
		if (srv->reserve_fd < 0)   /* another thread took it last time */
			srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		struct ucred cred = { .pid = -1, .uid = (uid_t)-1 };
		socklen_t clen = sizeof cred;
		getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen);
		/* A session being closed no longer counts: its client has seen
		 * EOF and may reconnect before the close callbacks free it. */
		char text[320] = "";
		if (srv->nsessions - srv->nclosing >= srv->cfg->max_sessions)
			snprintf(text, sizeof text, "too many sessions (the limit is %u)",
				 srv->cfg->max_sessions);
		else
			uid_sessions_full(srv, cred.uid, text, sizeof text);
		if (text[0]) {
			if (ratelimit_pass(&srv->busy_log, &missed)) {
				if (missed)
					log_warn("refusing a connection from pid %d: %s (%llu more refused "
						 "since the last message)", (int)cred.pid, text,
						 (unsigned long long)missed);
				else
					log_warn("refusing a connection from pid %d: %s", (int)cred.pid,
						 text);
			}
			refuse_gracefully(srv, fd, EBUSY, text);
			continue;
		}
		struct radiance_session *s = session_create(srv, fd);
		if (!s) {
			log_error("cannot create a session: %s", strerror(errno));
			continue;
		}
		s->next = srv->sessions;
		if (srv->sessions)
			srv->sessions->prev = s;
		srv->sessions = s;
		srv->nsessions++;
		session_update(s);
	}
}

/* Raises the soft descriptor limit to the hard one (systemd's LimitNOFILE=
 * sets both) and warns when that is still short of what max_sessions
 * sessions may hold. */
static void raise_fd_limit(const struct radiance_config *cfg)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur != rl.rlim_max) {
		struct rlimit want = { rl.rlim_max, rl.rlim_max };
		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl = want;
		else
			log_warn("raising the descriptor limit to %llu: %s",
				 (unsigned long long)rl.rlim_max, strerror(errno));
	}
	uint64_t need = (uint64_t)cfg->max_sessions * FDS_PER_SESSION + FDS_DAEMON;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
		log_warn("the descriptor limit is %llu, but %u sessions may hold %llu (%u each, "
			 "plus %u): raise LimitNOFILE= or lower max_sessions",
			 (unsigned long long)rl.rlim_cur, cfg->max_sessions,
			 (unsigned long long)need, FDS_PER_SESSION, FDS_DAEMON);
	else
		log_debug("descriptor limit %llu", (unsigned long long)rl.rlim_cur);
}

/* One line at start with what clients are held to, and what "auto" came
 * from: a refusal later names the limit, this says where it stands. */
static void log_limits(const struct radiance_config *cfg)
{
	const uint64_t v[] = { cfg->max_model_bytes, cfg->max_model_bytes_per_uid,
			       cfg->max_total_arena_bytes, cfg->max_arena_bytes_per_uid };
	char b[4][32], mem[64] = "";
	for (size_t i = 0; i < 4; i++) {
		if (v[i])
			limit_format_bytes(v[i], b[i], sizeof b[i]);
		else
			snprintf(b[i], sizeof b[i], "none");
	}
	if (cfg->memory_bytes) {
		char m[32];
		limit_format_bytes(cfg->memory_bytes, m, sizeof m);
		snprintf(mem, sizeof mem, "; auto from %s %s", m, cfg->memory_from);
	}
	char per_uid[32] = "none";
	if (cfg->max_sessions_per_uid)
		snprintf(per_uid, sizeof per_uid, "%llu", (unsigned long long)cfg->max_sessions_per_uid);
	log_info("limits: model bytes %s (per uid %s), arena bytes %s (per uid %s), sessions "
		 "%u (per uid %s), layer N <= %u, K <= %u%s", b[0], b[1], b[2], b[3],
		 cfg->max_sessions, per_uid, cfg->max_n, cfg->max_k, mem);
}

static void start_serving(struct radiance_server *srv)
{
	int rc = uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
	if (rc < 0) {
		log_error("poll on the listening socket: %s", uv_strerror(rc));
		server_stop(srv, 1, "the listening socket failed");
		return;
	}
	srv->listening = 1;
	const struct radiance_backend_info *bi = executor_backend_info(srv->exec);
	char status[256];
	snprintf(status, sizeof status, "serving on %s (%s), %zu models preloaded", bi->name,
		 bi->device, srv->cfg->n_preload);
	log_info("ready: %s", status);
	notify_ready(status);
}

/* ---- preloads ---- */

struct preload {
	struct registry_waiter w;   /* first: the waiter is the preload */
	struct radiance_server *srv;
	char dir[];
};

static void on_preloaded(struct registry_waiter *w, struct radiance_resident *res, int status,
			 const char *err)
{
	struct preload *p = (struct preload *)w;
	struct radiance_server *srv = p->srv;
	srv->preloads_pending--;
	if (status < 0) {
		/* the loader's message usually starts with the directory: say it once */
		const char *why = err && *err ? err : strerror(-status);
		size_t n = strlen(p->dir);
		if (strncmp(why, p->dir, n) == 0 && (why[n] == '/' || why[n] == ':')) {
			why += n;
			why += strspn(why, "/");
			if (*why == ':')
				why += strspn(why, ": ");
		}
		log_error("preload %s failed: %s; stopping", p->dir, why);
		server_stop(srv, 1, "a preload failed");
	} else {
		/* preloaded models stay resident with no user */
		registry_unref(res);
		if (srv->preloads_pending == 0 && !srv->stopping)
			start_serving(srv);
	}
	free(p);
}

static int start_preloads(struct radiance_server *srv)
{
	const struct radiance_config *cfg = srv->cfg;
	for (size_t i = 0; i < cfg->n_preload; i++) {
		size_t len = strlen(cfg->preload[i]);
		struct preload *p = calloc(1, sizeof *p + len + 1);
		if (!p)
			return -ENOMEM;
		p->srv = srv;
		memcpy(p->dir, cfg->preload[i], len + 1);
		p->w.done = on_preloaded;
		srv->preloads_pending++;
		char err[512];
		int rc = registry_preload(srv->reg, p->dir, &p->w, err, sizeof err);
		if (rc < 0) {
			srv->preloads_pending--;
			free(p);
			log_error("%s; stopping", err);
			return rc;
		}
	}
	if (srv->preloads_pending == 0)
		start_serving(srv);
	return 0;
}

/* ---- watchdog, signals, shutdown ---- */

/* Fed from the loop at half the interval, and only while the executor
 * makes progress (a launch, a job, a round) or sleeps waiting for work: a
 * compute thread wedged in a GPU call or a lock stops the feed after one
 * full interval, and systemd restarts us. A busy executor keeps it fed:
 * big requests run in pieces (sched_chunk_rows), each one progress. */
static void on_watchdog(uv_timer_t *t)
{
	struct radiance_server *srv = t->data;
	if (!srv->exec)
		return;
	struct exec_liveness l;
	executor_liveness(srv->exec, &l);
	uint64_t now = rclock_ns();
	if (exec_watch_alive(&srv->watch, &l, now, srv->watchdog_usec * 1000u))
		notify_watchdog();
	else
		log_error("the executor has made no progress for %llu ms (a launch, a job or a "
			  "lock that does not return): not feeding the watchdog",
			  (unsigned long long)((now - srv->watch.seen_ns) / 1000000u));
}

static void registry_empty(void *user)
{
	struct radiance_server *srv = user;
	log_debug("every model unloaded; stopping the executor");
	registry_destroy(srv->reg);
	srv->reg = NULL;
	executor_destroy(srv->exec);
	srv->exec = NULL;
}

static void server_stop(struct radiance_server *srv, int exit_code, const char *reason)
{
	if (exit_code && !srv->exit_code)
		srv->exit_code = exit_code;
	if (srv->stopping)
		return;
	srv->stopping = 1;
	snprintf(srv->stop_reason, sizeof srv->stop_reason, "%s", reason);
	notify_stopping();
	log_info("stopping (%s): %u sessions to close", reason, srv->nsessions);

	if (!uv_is_closing((uv_handle_t *)&srv->listen_poll))
		uv_close((uv_handle_t *)&srv->listen_poll, NULL);
	uv_close((uv_handle_t *)&srv->accept_retry, NULL);
	listener_close(&srv->listener);
	if (srv->reserve_fd >= 0)
		close(srv->reserve_fd);
	srv->reserve_fd = -1;
	uv_close((uv_handle_t *)&srv->watchdog, NULL);
	signals_stop(srv);

	while (srv->refused)
		refused_close(srv->refused);

	/* each one first drains its SQ, then says Goodbye and closes: see
	 * session_stop() */
	for (struct radiance_session *s = srv->sessions, *next; s; s = next) {
		next = s->next;
		session_stop(s);
	}
	if (srv->nsessions == 0)
		registry_shutdown(srv->reg, registry_empty, srv);
}

static void pool_start_work(uv_work_t *w) { (void)w; }

/*
 * Signals. SIGTERM and SIGINT stop the daemon; SIGHUP, SIGUSR1 and SIGUSR2
 * are logged and ignored (SIGHUP conventionally means "reload": there is
 * nothing to reload, the configuration is read at start only, but dying of
 * it -- the default action -- would drop every client). All five are
 * blocked in every thread from the moment the loop watches for them and read
 * from a signalfd: no handler runs, so none can be deferred or lost on the
 * way to the loop. (With libuv's handlers, ThreadSanitizer runs twice saw a
 * daemon log neither SIGHUP nor SIGTERM for 10 s while its loop kept feeding
 * the watchdog: a sanitizer defers a handler to its thread's next call into
 * the runtime.) Once stopping, SIGTERM and SIGINT are unblocked with their
 * default action, so a second one kills the daemon at once; the others are
 * set to SIG_IGN while sessions drain.
 */
static void signals_set(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
	sigaddset(set, SIGUSR1);
	sigaddset(set, SIGUSR2);
}

static void on_signal(struct radiance_server *srv, int signum)
{
	if (signum == SIGTERM || signum == SIGINT) {
		char name[16];
		log_info("%s received", strsignal(signum));
		snprintf(name, sizeof name, "SIG%s", sigabbrev_np(signum));
		server_stop(srv, 0, name);
	} else if (signum == SIGHUP) {
		log_warn("SIGHUP received: reloading the configuration is not supported; restart "
			 "radianced to apply changes (ignored)");
	} else {
		log_info("%s received: ignored", strsignal(signum));
	}
}

static void on_sigfd(uv_poll_t *h, int status, int events)
{
	struct radiance_server *srv = h->data;
	struct signalfd_siginfo si;
	(void)status;
	(void)events;
	while (!srv->stopping && read(srv->sigfd, &si, sizeof si) == (ssize_t)sizeof si)
		on_signal(srv, (int)si.ssi_signo);
}

static void on_sigpoll_closed(uv_handle_t *h)
{
	struct radiance_server *srv = h->data;
	close(srv->sigfd);
	srv->sigfd = -1;
}

/* Blocks the five signals in this (the loop's) thread -- every other thread
 * blocks them already (common/thread.h) -- and watches a signalfd for them.
 * 0, or -errno (logged; the mask is as before). */
static int signals_start(struct radiance_server *srv)
{
	sigset_t set;
	signals_set(&set);
	pthread_sigmask(SIG_BLOCK, &set, &srv->sig_old);
	srv->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (srv->sigfd < 0) {
		int e = errno;
		log_error("signalfd: %s", strerror(e));
		pthread_sigmask(SIG_SETMASK, &srv->sig_old, NULL);
		return -e;
	}
	uv_poll_init(srv->loop, &srv->sigpoll, srv->sigfd);
	srv->sigpoll.data = srv;
	uv_poll_start(&srv->sigpoll, UV_READABLE, on_sigfd);
	return 0;
}

static void signals_stop(struct radiance_server *srv)
{
	uv_close((uv_handle_t *)&srv->sigpoll, on_sigpoll_closed);
	signal(SIGHUP, SIG_IGN);
	signal(SIGUSR1, SIG_IGN);
	signal(SIGUSR2, SIG_IGN);
	sigset_t term;
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	sigaddset(&term, SIGINT);
	pthread_sigmask(SIG_UNBLOCK, &term, NULL);
}

static void on_walk(uv_handle_t *h, void *arg)
{
	log_error("handle still open at exit: %s%s", uv_handle_type_name(uv_handle_get_type(h)),
		  uv_is_closing(h) ? " (closing)" : "");
}

int server_run(const struct radiance_config *cfg)
{
	struct radiance_server srv;
	uv_loop_t loop;
	char err[512] = "";
	int rc;

	memset(&srv, 0, sizeof srv);
	srv.loop = &loop;
	srv.cfg = cfg;
	srv.listener.fd = -1;
	srv.sigfd = -1;
	srv.start_ns = rclock_ns();
	stats_init(&srv.stats);
	/* writes to a vanished client must fail with EPIPE, not kill us */
	signal(SIGPIPE, SIG_IGN);
	srv.reserve_fd = -1;

	rc = uv_loop_init(&loop);
	if (rc < 0) {
		log_error("uv_loop_init: %s", uv_strerror(rc));
		return 1;
	}
	/* libuv's threadpool (model loads, registry.c) starts all its threads
	 * at the first uv_queue_work, each inheriting the caller's signal
	 * mask: start it now with the asynchronous signals blocked, so that, as
	 * our own threads (common/thread.h), they never take SIGTERM or SIGHUP.
	 * A ThreadSanitizer run saw a daemon with idle pool threads ignore
	 * SIGHUP and SIGTERM for 10 s. */
	sigset_t sig_old;
	rthread_block_async(&sig_old);
	rc = uv_queue_work(&loop, &srv.pool_start, pool_start_work, NULL);
	pthread_sigmask(SIG_SETMASK, &sig_old, NULL);
	if (rc < 0)
		log_warn("starting libuv's threadpool: %s", uv_strerror(rc));
	raise_fd_limit(cfg);
	srv.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (srv.reserve_fd < 0)
		log_warn("open /dev/null (the reserve descriptor): %s", strerror(errno));

	rc = listener_check_free(cfg, err, sizeof err);
	if (rc < 0) {
		log_error("%s", err);
		goto fail_loop;
	}
	/* The backend (in the executor thread) first: it is the thing most likely
	 * to fail, and HIP/CUDA want initialising before other threads run. */
	struct executor_options eo = {
		.backend = {
			.kind = cfg->backend,
			.device = cfg->device,
			.require_gpu = cfg->require_gpu != 0,
			.max_rows = cfg->max_rows,
			.max_decode_rows = cfg->decode_rows < cfg->max_rows ? cfg->decode_rows
									     : cfg->max_rows,
			.numerics_gate = cfg->numerics_gate != 0,
			.share = cfg->share,
			.fake_share = cfg->fake_share != 0,
			.test_pin_delay_us = cfg->test_pin_delay_us,
			.zero_copy_rows = cfg->zero_copy_rows,
			.zero_copy_x_kib = cfg->zero_copy_x_kib,
			.zero_copy_y_kib = cfg->zero_copy_y_kib,
			.pin_piece_kib = cfg->pin_piece_kib,
			.cpu_threads = cfg->cpu_threads,
			.cpu_simd = (int)cfg->cpu_simd,         /* auto, scalar, avx2 */
			.prefill = (int)cfg->prefill,           /* enum radiance_backend_prefill */
			.wgmma_tile = cfg->wgmma_tile == 1 ? 128u : cfg->wgmma_tile == 2 ? 96u : 0u,
			.max_n = cfg->max_n,
			.max_k = cfg->max_k,
		},
		.max_rings = cfg->max_sessions,
		.spin_us = 50,
		.chunk_rows = cfg->sched_chunk_rows ? cfg->sched_chunk_rows : EXEC_CHUNK_AUTO,
		.session_rows = cfg->sched_session_rows,
		.gather_us = cfg->sched_gather_us,
		.global_stats = &srv.stats,
	};
	rc = executor_create(&loop, &eo, &srv.exec, err, sizeof err);
	if (rc < 0) {
		log_error("backend '%s': %s", cfg->backend, err);
		goto fail_loop;
	}
	const struct radiance_backend_info *bi = executor_backend_info(srv.exec);
	log_info("radianced %s: backend %s on %s, %llu bytes of scratch", RADIANCE_VERSION, bi->name,
		 bi->device, (unsigned long long)bi->scratch_bytes);

	const struct registry_limits lim = {
		.max_model_bytes = cfg->max_model_bytes,
		.max_model_bytes_per_uid = cfg->max_model_bytes_per_uid,
		.max_n = cfg->max_n,
		.max_k = cfg->max_k,
	};
	log_limits(cfg);
	rc = registry_create(&loop, srv.exec, &lim, &srv.reg);
	if (rc < 0) {
		log_error("registry: %s", strerror(-rc));
		goto fail_exec;
	}
	rc = listener_open(&srv.listener, cfg, err, sizeof err);
	if (rc < 0) {
		log_error("%s", err);
		goto fail_socket;
	}
	if (signals_start(&srv) < 0)
		goto fail_socket;
	uv_poll_init(&loop, &srv.listen_poll, srv.listener.fd);
	srv.listen_poll.data = &srv;
	uv_timer_init(&loop, &srv.accept_retry);
	srv.accept_retry.data = &srv;
	uv_timer_init(&loop, &srv.watchdog);
	srv.watchdog.data = &srv;
	srv.watchdog_usec = notify_watchdog_usec();
	if (srv.watchdog_usec) {
		uint64_t ms = srv.watchdog_usec / 2000u;
		uv_timer_start(&srv.watchdog, on_watchdog, 0, ms ? ms : 1);
		log_info("systemd watchdog: %llu ms, fed every %llu ms",
			 (unsigned long long)(srv.watchdog_usec / 1000u), (unsigned long long)ms);
	}
	if (start_preloads(&srv) < 0)
		server_stop(&srv, 1, "a preload failed");

	uv_run(&loop, UV_RUN_DEFAULT);
	rc = uv_loop_close(&loop);
	if (rc < 0) {
		log_error("uv_loop_close: %s", uv_strerror(rc));
		uv_walk(&loop, on_walk, NULL);
		return 1;
	}
	pthread_sigmask(SIG_SETMASK, &srv.sig_old, NULL);
	log_info("stopped");
	return srv.exit_code;

fail_socket:
	listener_close(&srv.listener);
	registry_destroy(srv.reg);
fail_exec:
	executor_destroy(srv.exec);
fail_loop:
	if (srv.reserve_fd >= 0)
		close(srv.reserve_fd);
	uv_run(&loop, UV_RUN_DEFAULT);   /* let closing handles finish */
	uv_loop_close(&loop);
	return 1;
}
