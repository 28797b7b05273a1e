/*
 * libradiance internals shared by the client library sources. Nothing here is
 * exported from libradiance.so (client/libradiance.sym lists the public
 * names); internal non-static names carry the radiance__ prefix.
 */
#ifndef RADIANCE_CLIENT_PRIVATE_H
#define RADIANCE_CLIENT_PRIVATE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <syslog.h>

#include "radiance.h"
#include "radiance.pb-c.h"
#include "ring.h"
#include "shm.h"
#include "transport.h"

/* A wait's spin when the caller asked for the default (spin_us 0), by the
 * daemon's backend (its Welcome): a CPU-backend daemon's compute threads
 * need the cores a spinning client would take, and its requests take
 * hundreds of microseconds or more, so waits sleep soon; a GPU daemon's
 * decode round trips take 25-110 us on the H200 (bench/results/serve-*),
 * past 30 us most of them, and a sleeping wait then pays the doorbell's
 * wake-up (about 13 us there) on each. */
#define RADIANCE__DEFAULT_SPIN_US 30
#define RADIANCE__DEFAULT_SPIN_US_GPU 200
#define RADIANCE__ARENA_ALIGN 64u   /* a cache line: no false sharing between buffers */

/* --- arena.c: first-fit allocator over the shared arena ------------------ */

/* One extent of the arena. The list is kept privately (never inside the
 * shared memory, where the daemon writes outputs) and sorted by offset;
 * neighbouring free extents are always merged. */
struct radiance__client_extent {
	uint64_t off;
	uint64_t len;
	bool used;
};

struct radiance__client_arena {
	uint8_t *base;
	uint64_t bytes;
	struct radiance__client_extent *ext;
	size_t n, cap;
};

int radiance__client_arena_init(struct radiance__client_arena *a, void *base, uint64_t bytes);
void radiance__client_arena_finish(struct radiance__client_arena *a);
/* NULL when no free extent fits (or bytes is 0 / absurd). */
void *radiance__client_arena_alloc(struct radiance__client_arena *a, size_t bytes);
/* 0, or -EINVAL when p is not the start of a used block. */
int radiance__client_arena_free(struct radiance__client_arena *a, void *p);
/* Bytes in the largest free extent. */
uint64_t radiance__client_arena_largest_free(const struct radiance__client_arena *a);

/* --- client.c / data.c --------------------------------------------------- */

struct radiance__client_held {
	uint32_t model_id;
	struct radiance_model_info *info; /* with layers */
};

/* A completion taken off the CQ while waiting for another request. */
struct radiance__client_stashed {
	uint64_t request_id;
	int status;
	uint64_t queue_ns, exec_ns;
	char error[RADIANCE_SLOT_BYTES];
};

struct radiance {
	_Atomic(uintptr_t) owner;         /* the thread inside a call on it, 0: none */
	unsigned depth;                   /* calls nested on that thread */
	const char *in_callback;          /* "log" or "load progress" while that
	                                     thread runs the caller's callback
	                                     (inside a call), else NULL: calls
	                                     from it are refused (-EDEADLK) */
	struct rconn conn;
	int error;                        /* sticky; 0 or -errno */
	unsigned fork_generation;         /* radiance__fork_generation at connect */
	int pid;                          /* getpid() at connect, for messages */
	char message[512];                /* radiance_error_message() */
	char broken[512];                 /* the sticky error's message */

	/* options, copied */
	char *socket_path;                /* for radiance_reconnect() */
	char *client_name;
	radiance_log_fn log;
	void *log_user;
	int log_priority;              /* syslog priority */
	uint32_t want_sq, want_cq;
	uint64_t want_arena;
	int32_t spin_us;               /* what waits spin: spin_opt resolved at the Welcome */
	int32_t spin_opt;              /* radiance_options.spin_us as given */
	int timeout_ms;                   /* -1: forever */
	int connect_timeout_ms;           /* -1: one attempt; else > 0 */

	uint64_t next_tag;
	bool welcomed;                    /* the handshake succeeded */
	struct radiance_server_info server;
	char *server_version, *backend, *device;

	struct radiance__client_held *held;
	size_t n_held, cap_held;

	/* data plane, once radiance_open_rings() succeeded */
	bool rings_open;
	uint8_t *segment;
	size_t segment_bytes;
	int sq_doorbell;                 /* eventfd we write */
	int cq_doorbell;                 /* read end of the daemon's pipe */
	struct rring sq, cq;
	uint32_t sq_entries, cq_entries;  /* private copies */
	struct radiance__client_arena arena;
	uint64_t next_request_id;
	unsigned in_flight;
	uint64_t *pending;               /* ids radiance_submit() put in flight, */
	uint32_t n_pending;              /* ... not reaped yet; cq_entries room */
	struct radiance__client_stashed *stash;  /* ring of stash_cap, grows */
	uint32_t stash_head, stash_len, stash_cap;
	char completion_error[RADIANCE_SLOT_BYTES];

	int epfd;                        /* radiance_get_fd(): socket + CQ doorbell; -1 */
};

/* Incremented in the child of every fork() (pthread_atfork). A handle whose
 * fork_generation differs is used by a forked child: see
 * radiance__client_usable(). */
extern volatile unsigned radiance__fork_generation;

/* 0, or why r may not talk to the daemon or touch the rings now: its sticky
 * error, or -EBADFD when called in a forked child (the socket and the shared
 * rings are the parent's: a child using them would corrupt the parent's
 * session, and the parent would then blame the daemon). Sticky in the
 * child's copy of the handle only. */
int radiance__client_usable(struct radiance *r);


/* One thread at a time (radiance.h, "Thread safety"): every public call
 * that uses a handle brackets its work with these. enter returns 0 when
 * the calling thread holds r now (calls on one thread nest), -EBUSY when
 * another thread is inside a call on r, -EDEADLK when the call comes from
 * a callback r is running (then, in both, nothing of r but the owner word
 * was touched, and this thread's radiance_error_message(r) states the
 * rule, prefixed with func, until its outermost call on r ends), or
 * -EBADFD when r is used in a forked child.
 * leave only after enter returned 0. The owner word's acquire/release also
 * orders the handle's state between threads that take turns properly. */
int radiance__client_enter(struct radiance *r, const char *func);
void radiance__client_leave(struct radiance *r);

/* The body of a public int-returning call: call (an expression using r)
 * between enter and leave. */
#define RADIANCE__GUARDED(r, call)                                      \
	do {                                                            \
		int guard_rc_ = radiance__client_enter((r), __func__);  \
		if (guard_rc_ < 0)                                      \
			return guard_rc_;                               \
		guard_rc_ = (call);                                     \
		radiance__client_leave(r);                              \
		return guard_rc_;                                       \
	} while (0)

void radiance__client_log(struct radiance *r, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Records a non-sticky failure's text; returns err. */
int radiance__client_fail(struct radiance *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Ends the connection with err (the first such error sticks); returns the
 * sticky error. */
int radiance__client_break(struct radiance *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* One control round trip: assigns msg->tag, sends msg with fds, reads
 * until the reply with that tag. LoadProgress replies go to progress (may be
 * NULL). An Error reply returns its -code (text recorded, not sticky) and
 * *reply stays NULL. On 0 the caller owns *reply
 * (rdw__server_message__free_unpacked(*reply, NULL)). */
int radiance__client_request(struct radiance *r, Rdw__ClientMessage *msg, const int *fds,
		      size_t nfds, radiance_load_progress_fn progress, void *progress_user,
		      Rdw__ServerMessage **reply);

/* The control socket is readable while no request is outstanding: the daemon
 * only writes then to say it ends the session. Reads what is there and
 * breaks the connection accordingly. Returns the sticky error, or 0 if
 * nothing conclusive was read yet. */
int radiance__client_socket_event(struct radiance *r);

struct radiance__client_held *radiance__client_find_held(const struct radiance *r, uint32_t model_id);

/* data.c */
void radiance__client_rings_close(struct radiance *r);
/* Takes one result off the CQ: 1, 0 when empty, or a sticky error. */
int radiance__client_reap_one(struct radiance *r, struct radiance__client_stashed *out);
/* Keeps a completion for a later poll/wait: 0 or a sticky -ENOMEM. */
int radiance__client_stash_push(struct radiance *r, const struct radiance__client_stashed *s);

/* events.c: adds fd (EPOLLIN) to the set radiance_get_fd() returned, if
 * one was asked for. 0 or -errno. */
int radiance__client_watch(struct radiance *r, int fd);
/* For radiance_reconnect(): closes the rings and turns every request not
 * delivered yet (in flight, or completed and kept aside: its output was in
 * the arena that goes) into a completion of status err with text why, kept
 * for radiance_poll()/radiance_wait(). 0 or -ENOMEM (then they are lost). */
int radiance__client_rings_abandon(struct radiance *r, int err, const char *why);

/* models.c */
int radiance__client_attach(struct radiance *r, const char *name, uint32_t *model_id);

/* models.c */
int radiance__client_model_from_pb(const Rdw__ModelInfo *pb, struct radiance_model_info **out);

#endif
