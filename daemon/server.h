/*
 * The daemon's server: the libuv loop, the listening socket (its own, or
 * systemd's under socket activation), one uv_poll per client connection
 * driving common/transport, SO_PEERCRED on accept, signals, the systemd
 * watchdog, and the ordered shutdown. It owns the executor (and through it
 * the backend), the registry and every session.
 *
 * Shutdown (SIGTERM/SIGINT): stop accepting and remove the socket file,
 * STOPPING=1, close every session (its SQ is drained by the executor before
 * its ring is removed), unload every model, stop the executor (which
 * destroys the backend), close every handle; uv_loop_close() must then
 * return 0.
 *
 * Thread safety: loop thread only.
 */
#ifndef RADIANCE_SERVER_H
#define RADIANCE_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "executor.h"
#include "registry.h"
#include "stats.h"

struct radiance_session;

struct radiance_server {
	uv_loop_t *loop;
	const struct radiance_config *cfg;
	struct radiance_executor *exec;
	struct radiance_registry *reg;
	struct radiance_stats stats;          /* global, written by the executor */
	uint64_t start_ns;

	int listen_fd;
	int activated;                        /* the socket came from systemd */
	int socket_created;                   /* we bound it: unlink at exit */
	uv_poll_t listen_poll;
	int listening;

	struct radiance_session *sessions;    /* doubly linked */
	uint32_t nsessions;
	uint64_t next_session_id;

	uv_signal_t sigterm, sigint, sigpipe;
	uv_timer_t watchdog;
	uint64_t watchdog_usec;
	struct exec_job ping;
	int ping_pending;
	uint64_t ping_sent_ns;

	size_t preloads_pending;
	int stopping;
	int exit_code;
};

/* Runs the daemon with cfg until a signal stops it or start-up fails.
 * Returns the process exit code: 0 after a clean stop, 1 on a start-up
 * failure (logged). */
int server_run(const struct radiance_config *cfg);

/* For session.c: the session's wanted poll events changed (something was
 * queued, it became busy or idle, or it is closing). */
void server_session_update(struct radiance_session *s);
/* For session.c: a closing session finished tearing down; unlink and free. */
void server_session_gone(struct radiance_session *s);

#endif
