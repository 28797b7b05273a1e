/* The loop: listening socket, per-connection polls, signals, watchdog. */
#include "server.h"

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"
#include "proto_util.h"
#include "session.h"

/* Stop reading a client's requests while this much of its replies is
 * unsent: a client that never reads cannot make us buffer without bound. */
#define OUT_HIGH_WATER (8u << 20)
#define FRAMES_PER_WAKE 32

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void server_stop(struct radiance_server *srv, int exit_code);

/* ---- sessions ---- */

static void session_read(struct radiance_session *s)
{
	for (int i = 0; i < 2 * FRAMES_PER_WAKE; i++) {
		if (s->state == SESSION_CLOSING || s->busy ||
		    radiance_conn_pending(&s->conn) >= OUT_HIGH_WATER)
			return;
		int rc = radiance_conn_read(&s->conn);
		if (rc == -EAGAIN)
			return;
		if (rc == 0) {
			session_close(s, 0, "client hung up");
			return;
		}
		if (rc == -EMSGSIZE) {
			session_close(s, 1, "frame length 0 or above %u bytes", RADIANCE_MAX_FRAME);
			return;
		}
		if (rc == -EPROTO) {
			session_close(s, 1, "more than %u fds queued, or a truncated control message",
				      RADIANCE_MAX_FDS);
			return;
		}
		if (rc < 0) {
			session_close(s, 0, "receive failed: %s", strerror(-rc));
			return;
		}
		const uint8_t *data;
		size_t len;
		while (s->state != SESSION_CLOSING && !s->busy &&
		       (rc = radiance_conn_next_frame(&s->conn, &data, &len)) == 1)
			session_handle_frame(s, data, len);
		if (rc < 0 && s->state != SESSION_CLOSING) {
			session_close(s, 1, "frame length 0 or above %u bytes", RADIANCE_MAX_FRAME);
			return;
		}
	}
}

static void session_flush(struct radiance_session *s)
{
	if (s->state == SESSION_CLOSING || !radiance_conn_pending(&s->conn))
		return;
	int rc = radiance_conn_flush(&s->conn);
	if (rc < 0 && rc != -EAGAIN)
		session_close(s, 0, "send failed: %s", strerror(-rc));
}

static void on_session_poll(uv_poll_t *h, int status, int events)
{
	struct radiance_session *s = h->data;
	if (status < 0) {
		session_close(s, 0, "poll: %s", uv_strerror(status));
		return;
	}
	if (events & UV_WRITABLE)
		session_flush(s);
	if (s->state != SESSION_CLOSING && s->busy && (events & UV_DISCONNECT)) {
		session_close(s, 0, "client hung up with a request pending");
		return;
	}
	if (events & (UV_READABLE | UV_DISCONNECT))
		session_read(s);
	session_flush(s);
	server_session_update(s);
}

void server_session_update(struct radiance_session *s)
{
	if (s->state == SESSION_CLOSING)
		return;
	size_t pending = radiance_conn_pending(&s->conn);
	int events = 0;
	if (s->busy)
		events |= UV_DISCONNECT;
	else if (pending < OUT_HIGH_WATER)
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
	log_debug("session %llu: freed", (unsigned long long)s->id);
	if (srv->stopping && srv->nsessions == 0)
		registry_shutdown(srv->reg, registry_empty, srv);
}

/* ---- accepting ---- */

static void refuse(int fd, int code, const char *text)
{
	struct radiance_conn c;
	if (radiance_conn_init(&c, fd, RADIANCE_MAX_FRAME, 1) < 0) {
		close(fd);
		return;
	}
	Radiance__Error e = RADIANCE__ERROR__INIT;
	Radiance__ServerMessage m = RADIANCE__SERVER_MESSAGE__INIT;
	e.code = code;
	e.message = (char *)text;
	m.msg_case = RADIANCE__SERVER_MESSAGE__MSG_ERROR;
	m.error = &e;
	if (radiance_proto_queue_server(&c, &m, NULL, 0) == 0)
		radiance_conn_flush(&c);
	radiance_conn_finish(&c);
}

static void on_listen(uv_poll_t *h, int status, int events)
{
	struct radiance_server *srv = h->data;
	for (int i = 0; i < 64 && !srv->stopping; i++) {
		int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
				return;
			/* EMFILE and friends: the pending connection stays queued; say so
			 * once per wake rather than spin silently */
			log_error("accept: %s", strerror(errno));
			return;
		}
		if (srv->nsessions >= srv->cfg->max_sessions) {
			char text[128];
			snprintf(text, sizeof text, "too many sessions (the limit is %u)",
				 srv->cfg->max_sessions);
			log_warn("refusing a connection: %s", text);
			refuse(fd, EBUSY, text);
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
		server_session_update(s);
	}
}

/* The socket systemd passed, or our own: bound with umask 0177 so it is
 * never reachable with wider permissions, then chgrp + 0660 if a group is
 * configured. A stale socket file (nobody answers) is replaced. */
static int listen_socket(struct radiance_server *srv, char *err, size_t errlen)
{
	const struct radiance_config *cfg = srv->cfg;
	int fd = notify_listen_fd(err, errlen);
	if (fd == -EINVAL)
		return -EINVAL;
	if (fd >= 0) {
		srv->listen_fd = fd;
		srv->activated = 1;
		log_info("listening on the socket systemd passed (fd %d)", fd);
		return 0;
	}

	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(cfg->socket_path) >= sizeof addr.sun_path) {
		snprintf(err, errlen, "socket path '%s' is longer than %zu bytes", cfg->socket_path,
			 sizeof addr.sun_path - 1);
		return -ENAMETOOLONG;
	}
	strcpy(addr.sun_path, cfg->socket_path);

	gid_t gid = (gid_t)-1;
	if (cfg->socket_group) {
		struct group *g = getgrnam(cfg->socket_group);
		if (!g) {
			snprintf(err, errlen, "socket group '%s' does not exist", cfg->socket_group);
			return -ENOENT;
		}
		gid = g->gr_gid;
	}

	/* /run/radiance may not exist when started by hand: make the last
	 * directory component (tmpfiles does it under systemd) */
	char dir[sizeof addr.sun_path];
	snprintf(dir, sizeof dir, "%s", cfg->socket_path);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (mkdir(dir, 0755) == 0)
			log_info("created %s", dir);
	}

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	mode_t old = umask(0177);
	int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
	if (rc < 0 && errno == EADDRINUSE) {
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int alive = probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof addr) == 0;
		if (probe >= 0)
			close(probe);
		if (alive) {
			umask(old);
			close(fd);
			snprintf(err, errlen, "another daemon is listening on %s", cfg->socket_path);
			return -EADDRINUSE;
		}
		log_info("removing stale socket %s", cfg->socket_path);
		unlink(cfg->socket_path);
		rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
	}
	umask(old);
	if (rc < 0) {
		int e = errno;
		close(fd);
		snprintf(err, errlen, "bind %s: %s", cfg->socket_path, strerror(e));
		return -e;
	}
	srv->socket_created = 1;
	srv->listen_fd = fd;
	if (gid != (gid_t)-1) {
		if (chown(cfg->socket_path, (uid_t)-1, gid) < 0 || chmod(cfg->socket_path, 0660) < 0) {
			int e = errno;
			snprintf(err, errlen, "socket %s: chgrp %s / chmod 0660: %s", cfg->socket_path,
				 cfg->socket_group, strerror(e));
			return -e;
		}
	}
	if (listen(fd, 128) < 0) {
		int e = errno;
		snprintf(err, errlen, "listen %s: %s", cfg->socket_path, strerror(e));
		return -e;
	}
	log_info("listening on %s (mode %s)", cfg->socket_path, gid != (gid_t)-1 ? "0660" : "0600");
	return 0;
}

static void start_serving(struct radiance_server *srv)
{
	int rc = uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
	if (rc < 0) {
		log_error("poll on the listening socket: %s", uv_strerror(rc));
		server_stop(srv, 1);
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
		log_error("preload %s: %s", p->dir, err);
		server_stop(srv, 1);
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
		int rc = registry_preload(srv->reg, p->dir, &p->w);
		if (rc < 0) {
			srv->preloads_pending--;
			free(p);
			log_error("preload %s: %s", cfg->preload[i], strerror(-rc));
			return rc;
		}
	}
	if (srv->preloads_pending == 0)
		start_serving(srv);
	return 0;
}

/* ---- watchdog, signals, shutdown ---- */

static void on_ping(struct exec_job *job)
{
	struct radiance_server *srv = job->user;
	srv->ping_pending = 0;
}

/* Fed from the loop at half the interval, and only while the executor
 * answers pings: a wedged compute thread (a hung GPU call) stops the feed
 * after one full interval, and systemd restarts us. */
static void on_watchdog(uv_timer_t *t)
{
	struct radiance_server *srv = t->data;
	uint64_t now = now_ns();
	if (!srv->ping_pending) {
		memset(&srv->ping, 0, sizeof srv->ping);
		srv->ping.kind = EXEC_JOB_PING;
		srv->ping.done = on_ping;
		srv->ping.user = srv;
		srv->ping_pending = 1;
		srv->ping_sent_ns = now;
		executor_submit(srv->exec, &srv->ping);
		notify_watchdog();
	} else if (now - srv->ping_sent_ns < srv->watchdog_usec * 1000u) {
		notify_watchdog();
	} else {
		log_error("the executor has not answered for %llu ms: not feeding the watchdog",
			  (unsigned long long)((now - srv->ping_sent_ns) / 1000000u));
	}
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

static void server_stop(struct radiance_server *srv, int exit_code)
{
	if (exit_code && !srv->exit_code)
		srv->exit_code = exit_code;
	if (srv->stopping)
		return;
	srv->stopping = 1;
	notify_stopping();
	log_info("stopping: %u sessions to close", srv->nsessions);

	if (!uv_is_closing((uv_handle_t *)&srv->listen_poll))
		uv_close((uv_handle_t *)&srv->listen_poll, NULL);
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	srv->listen_fd = -1;
	if (srv->socket_created && unlink(srv->cfg->socket_path) < 0)
		log_warn("unlink %s: %s", srv->cfg->socket_path, strerror(errno));
	uv_close((uv_handle_t *)&srv->sigterm, NULL);
	uv_close((uv_handle_t *)&srv->sigint, NULL);
	uv_close((uv_handle_t *)&srv->watchdog, NULL);

	for (struct radiance_session *s = srv->sessions; s; s = s->next)
		session_close(s, 0, "the daemon is stopping");
	if (srv->nsessions == 0)
		registry_shutdown(srv->reg, registry_empty, srv);
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct radiance_server *srv = h->data;
	log_info("%s received", strsignal(signum));
	server_stop(srv, 0);
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
	srv.listen_fd = -1;
	srv.start_ns = now_ns();
	stats_init(&srv.stats);
	/* writes to a vanished client must fail with EPIPE, not kill us */
	signal(SIGPIPE, SIG_IGN);

	rc = uv_loop_init(&loop);
	if (rc < 0) {
		log_error("uv_loop_init: %s", uv_strerror(rc));
		return 1;
	}

	/* The backend (in the executor thread) first: it is the thing most likely
	 * to fail, and HIP/CUDA want initialising before other threads run. */
	struct executor_options eo = {
		.backend = {
			.kind = cfg->backend,
			.device = cfg->device,
			.max_rows = cfg->max_rows,
			.max_decode_rows = cfg->max_rows < 16 ? cfg->max_rows : 16,
			.max_n = cfg->max_n,
			.max_k = cfg->max_k,
		},
		.max_rings = cfg->max_sessions,
		.spin_us = 50,
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

	rc = registry_create(&loop, srv.exec, &srv.reg);
	if (rc < 0) {
		log_error("registry: %s", strerror(-rc));
		goto fail_exec;
	}
	rc = listen_socket(&srv, err, sizeof err);
	if (rc < 0) {
		log_error("%s", err);
		goto fail_socket;
	}
	uv_poll_init(&loop, &srv.listen_poll, srv.listen_fd);
	srv.listen_poll.data = &srv;
	uv_signal_init(&loop, &srv.sigterm);
	uv_signal_init(&loop, &srv.sigint);
	srv.sigterm.data = srv.sigint.data = &srv;
	uv_signal_start(&srv.sigterm, on_signal, SIGTERM);
	uv_signal_start(&srv.sigint, on_signal, SIGINT);
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
		server_stop(&srv, 1);

	uv_run(&loop, UV_RUN_DEFAULT);
	rc = uv_loop_close(&loop);
	if (rc < 0) {
		log_error("uv_loop_close: %s", uv_strerror(rc));
		uv_walk(&loop, on_walk, NULL);
		return 1;
	}
	log_info("stopped");
	return srv.exit_code;

fail_socket:
	if (srv.listen_fd >= 0)
		close(srv.listen_fd);
	if (srv.socket_created)
		unlink(cfg->socket_path);
	registry_destroy(srv.reg);
fail_exec:
	executor_destroy(srv.exec);
fail_loop:
	uv_run(&loop, UV_RUN_DEFAULT);   /* let closing handles finish */
	uv_loop_close(&loop);
	return 1;
}
