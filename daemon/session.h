/*
 * A client's state: handshake, the models it references, its shared-memory
 * segment and rings, its stats. Control messages are handled in session.c;
 * session_io.c reads the socket, calls session_handle_frame() for each
 * complete frame, and queues and flushes the replies. The server
 * (server.c) only accepts the connection and keeps the list.
 *
 * States: HANDSHAKE (only Hello is allowed, within cfg->hello_timeout_ms, or
 * the session ends with Error(ETIMEDOUT)) -> READY -> CLOSING. While the
 * daemon stops, a session reads nothing more until its SQ is drained
 * (session_stop). A session
 * is `busy` while a request awaits an asynchronous answer (LoadModel,
 * OpenRing, an attach): it then reads no further frames, so replies stay in
 * request order, but still notices a hang-up.
 *
 * Rings: OpenRing pins the arena (executor_pin, on the pin thread), then
 * hands the ring to the executor (EXEC_JOB_RING_ADD) and replies RingReady
 * when that is done.
 *
 * Teardown (session_close): the socket and every received fd are closed at
 * once, a pending load is cancelled (and a pin not yet begun), and the ring
 * is handed back through an EXEC_JOB_RING_REMOVE job; only when that job is
 * done (the executor will never touch the segment again) is the arena
 * unpinned (executor_unpin), and only when that is done is the segment
 * unmapped, the doorbells closed and the model references dropped. See
 * executor.h.
 *
 * Thread safety: loop thread only (the executor reads `ring`, `refs` and
 * writes `stats` under the rules of executor.h).
 */
#ifndef RADIANCE_SESSION_H
#define RADIANCE_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "executor.h"
#include "registry.h"
#include "session_map.h"
#include "stats.h"
#include "transport.h"

struct radiance_server;

enum session_state {
	SESSION_HANDSHAKE,
	SESSION_READY,
	SESSION_CLOSING,
};

enum session_ring_state {
	SESSION_RING_NONE,
	SESSION_RING_PINNING,    /* executor_pin in flight (the pin thread) */
	SESSION_RING_ADDING,     /* RING_ADD job in flight */
	SESSION_RING_ACTIVE,
	SESSION_RING_REMOVING,   /* RING_REMOVE job in flight */
	SESSION_RING_UNPINNING,  /* executor_unpin in flight; then the segment goes */
};

struct radiance_session {
	struct radiance_server *server;
	struct radiance_session *prev, *next;
	uint64_t id;
	enum session_state state;

	struct rconn conn;
	uv_poll_t poll;
	int poll_events;          /* what poll is started with now, -1 none */
	int out_full;             /* SESSION_OUT_HIGH_WATER of replies unsent: reading nothing */
	unsigned out_fulls;       /* times it got there (the first is logged as a warning) */
	int poll_closed;          /* uv_close finished */
	uv_timer_t hello_timer;   /* runs in HANDSHAKE */
	int timer_closed;         /* uv_close finished */

	pid_t pid;
	uid_t uid;
	gid_t gid;
	char client_name[64];

	int busy;
	uint64_t busy_tag;

	/* models */
	struct exec_refs refs;
	struct radiance_resident **models;
	size_t nmodels, models_cap;
	struct registry_waiter waiter;   /* a LoadModel in progress */
	int waiting;
	struct session_maps maps;        /* models mapped (session_map.c) */

	/* data plane */
	enum session_ring_state ring_state;
	struct exec_ring ring;
	struct exec_job ring_job;
	struct exec_pin pin;        /* the arena's registration and unregistration */
	void *segment;
	size_t segment_bytes;
	int memfd;
	int cq_rfd;                 /* CQ doorbell's read end until RingReady is queued */

	struct stats_counters stats;
};

/* Creates a session for an accepted connection fd (taken over) and starts
 * polling it. NULL with errno set on failure (fd closed). */
struct radiance_session *session_create(struct radiance_server *srv, int fd);

/* One complete frame with rconn_queued_fds() fds. Any reply is
 * queued on the conn; a protocol violation closes the session. */
void session_handle_frame(struct radiance_session *s, const uint8_t *data, size_t len);

/* Queues an Error(code, text) outside any reply (tag 0), e.g. just before
 * session_close() for a reason that is not the client's violation. Best
 * effort: session_close() flushes what the socket takes. */
void session_send_error(struct radiance_session *s, int code, const char *text);

/* ---- session_io.c ---- */

/* Takes over fd: the conn and the uv_poll on it (not started). 0, or
 * -errno with fd closed. */
int session_io_init(struct radiance_session *s, int fd);
/* The poll events s wants changed (something was queued, it became busy
 * or idle): restarts the poll. Nothing once CLOSING. */
void session_update(struct radiance_session *s);
/* For session_close(): flushes what the socket takes now, closes the
 * socket (the client sees EOF) and the poll handle (then
 * session_maybe_free()). */
void session_io_finish(struct radiance_session *s);

/* A client that sends requests and does not read the replies gets at most
 * this many bytes of them queued (one reply more at most: the last one read
 * before the mark); then the daemon reads none of its requests until it
 * has read enough of them to bring the queue below the mark again, and
 * logs that, once a session as a warning. So a session that never reads
 * holds about this much of the daemon's memory, and its sends block. */
#define SESSION_OUT_HIGH_WATER (8u << 20)

/* Replies, queued on the conn and flushed as the socket takes them: m with
 * nfds fds (dup'ed), an Error(code, text), an Ok. A reply that cannot be
 * queued closes the session. */
void session_reply(struct radiance_session *s, Rdw__ServerMessage *m, const int *fds, size_t nfds);
void session_reply_error(struct radiance_session *s, uint64_t tag, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void session_reply_ok(struct radiance_session *s, uint64_t tag);

/* Replies carrying a descriptor (MapTensors' memfd, MapModel's share) that
 * one session may have queued and not yet sent: a client that pipelines
 * them without reading gets Error(EBUSY) for the rest instead of making the
 * daemon hold one descriptor per request. Counted in server.c's
 * FDS_PER_SESSION. */
#define SESSION_FD_REPLIES_MAX_QUEUED 8u

/* 0 when one more reply carrying a descriptor may be queued on s; else
 * replies Error(EBUSY) to tag naming `what` and the limit, and returns
 * -EBUSY. */
int session_fd_reply_room(struct radiance_session *s, uint64_t tag, const char *what);

/* Ends the session (idempotent). reason is logged once; `violation` logs it
 * as a warning and first tries to send it as an Error(EPROTO). */
void session_close(struct radiance_session *s, int violation, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The daemon is stopping (server->stopping is set): read no more
 * requests, let the executor run what the SQ holds (every result posted to
 * the CQ), then queue a Goodbye(stop_reason, ESHUTDOWN) and close. A
 * session without rings says Goodbye at once. */
void session_stop(struct radiance_session *s);

/* Frees what is left once the poll and timer handles are closed and the ring is
 * removed; calls server_session_gone(). */
void session_maybe_free(struct radiance_session *s);

#endif
