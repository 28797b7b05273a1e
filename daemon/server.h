/*
 * The daemon's server: the libuv loop, accepting on the listening socket
 * (listen.c binds it or takes systemd's), SO_PEERCRED on accept, the
 * session limits, signals, the systemd watchdog, and the ordered shutdown.
 * It owns the executor (and through it the backend), the registry and every
 * session; each session does its own socket I/O (session_io.c).
 *
 * Connections: at most cfg->max_sessions at once, counting those still in
 * the handshake (which get cfg->hello_timeout_ms to send Hello). One over
 * the limit is answered Error(EBUSY) and closed gracefully: shut down for
 * writing, whatever it sent read and dropped until it hangs up (or 2 s), so
 * the client always reads the Error instead of a reset. At the descriptor
 * limit (EMFILE) a reserve descriptor is given up to accept and close the
 * waiting connections, so the listening socket cannot spin the loop.
 *
 * Signals: SIGTERM/SIGINT stop (below); SIGHUP, SIGUSR1, SIGUSR2 are logged
 * and ignored (no reload: the configuration is read at start only); SIGPIPE
 * is ignored; SIGQUIT keeps its default action (core dump).
 *
 * Shutdown (SIGTERM/SIGINT): stop accepting and remove the socket file (only
 * if the path is still the socket we bound, not one another daemon bound
 * since), STOPPING=1, stop every session (session_stop: its SQ is drained
 * by the executor, every result posted, then a Goodbye with the reason is
 * sent and the session closed), unload every model, stop the executor
 * (which destroys the backend), close every handle; uv_loop_close() must
 * then return 0.
 *
 * Thread safety: loop thread only.
 */
#ifndef RADIANCE_SERVER_H
#define RADIANCE_SERVER_H

#include <stdint.h>
#include <sys/types.h>
#include <signal.h>
#include <uv.h>

#include "config.h"
#include "executor.h"
#include "listen.h"
#include "registry.h"
#include "stats.h"

struct radiance_session;
struct refused_conn;

/* At most one log line per interval for a condition that a peer can repeat
 * at will; the lines in between are counted and the count reported. */
struct log_ratelimit {
	uint64_t next_ns;
	uint64_t suppressed;
};

struct radiance_server {
	uv_loop_t *loop;
	const struct radiance_config *cfg;
	struct radiance_executor *exec;
	struct radiance_registry *reg;
	struct stats_counters stats;          /* global, written by the executor */
	uint64_t start_ns;

	struct radiance_listener listener;    /* listen.c */
	uv_poll_t listen_poll;
	int listening;
	uv_timer_t accept_retry;              /* listening paused after an accept error */
	int reserve_fd;                       /* /dev/null, given up at EMFILE */
	uint64_t fd_refused;                  /* connections closed for lack of fds */
	int emfile_warned;                    /* ... and said so: say when it is over */
	struct log_ratelimit emfile_log, busy_log;

	struct radiance_session *sessions;    /* doubly linked */
	uint32_t nsessions;                   /* including those in the handshake */
	uint32_t nclosing;                    /* of those, closed but not yet freed */
	uint64_t next_session_id;
	struct refused_conn *refused;         /* told EBUSY, waiting for the hang-up */
	uint32_t nrefused;

	/* SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2: blocked in every thread and
	 * read from a signalfd by the loop (server.c, "Signals") */
	uv_poll_t sigpoll;
	int sigfd;
	sigset_t sig_old;                     /* the loop thread's mask before */
	uv_work_t pool_start;      /* starts libuv's threadpool with signals blocked */
	uv_timer_t watchdog;
	uint64_t watchdog_usec;
	struct exec_watch watch;              /* the executor's progress as last seen */

	size_t preloads_pending;
	int stopping;
	char stop_reason[64];                 /* said in every Goodbye */
	int exit_code;
};

/* Runs the daemon with cfg until a signal stops it or start-up fails.
 * Returns the process exit code: 0 after a clean stop, 1 on a start-up
 * failure (logged). */
int server_run(const struct radiance_config *cfg);

/* For session.c: a closing session finished tearing down; unlink and free. */
void server_session_gone(struct radiance_session *s);

#endif
