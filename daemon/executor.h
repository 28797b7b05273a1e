/*
 * The executor: one thread that owns the compute backend and serves every
 * session's SQ.
 *
 * Threads and hand-off. The libuv loop thread owns sessions; the executor
 * thread owns the backend (all but arena pinning) and a private list of the
 * rings it serves. They meet in exactly two places:
 *   - jobs: the loop submits a struct exec_job (add or remove a ring, upload
 *     or free a model's layers, ping); the executor runs it between rounds
 *     over the rings and hands it back, and job->done runs on the loop
 *     thread (through a uv_async), in submission order.
 *   - a session's model references (struct exec_refs), which the loop
 *     changes and the executor reads per request, under the refs' mutex.
 * The executor holds pointers into a session's shared memory from the moment
 * it takes a request from the SQ until that request completes, the ring
 * dies or RING_REMOVE runs (which drops whatever is still queued), and into
 * models only while some request uses them (MODEL_FREE first fails the
 * requests still queued for the model); jobs run between rounds. So when a
 * RING_REMOVE job's done runs, the executor will never touch that ring's
 * memory again (the loop may munmap it); when a MODEL_FREE job's done runs,
 * nothing uses the model any more. The loop never frees either earlier.
 *
 * A round (daemon/scheduler.h has the policy): for each ring in round-robin
 * order, take requests from the SQ into the ring's flow (its queue of
 * requests being served) while the flow admits more (at most EXEC_BATCH
 * requests and sched.session_rows rows, the next request's included: one
 * that does not fit stays in the SQ) and the CQ has room for the result
 * of every queued request as well (the CQ cannot overflow); copy each slot
 * out, decode and validate it; invalid ones get an error result at once.
 * Then weighted deficit round robin hands each flow at most about one
 * chunk of the biggest layer queued (sched.chunk_rows rows x N x K), less
 * by its share (the ring's flow owner and weight, which the loop sets
 * before RING_ADD: peer uid and its sched_uid_weights): requests of more
 * than chunk_rows rows run in pieces of chunk_rows, one a round, and post
 * one result when the last has run. The round's pieces run decode first,
 * grouped by (model, layer) across sessions into launches of stacked rows
 * (at most max_rows); after each launch its results are posted and CQ
 * doorbells rung for clients that sleep. Between rounds the jobs run, so a
 * flood of big requests delays ring set-up, uploads and other sessions'
 * requests by about one chunk per busy session, not by the flood. Requests
 * in flight at the same time are independent, so the order of a session's
 * completions is not the order of submission.
 *
 * Liveness (the systemd watchdog): the thread counts its progress (every
 * launch, job and round) and says when it is asleep waiting for work;
 * exec_watch_alive() judges it stuck when neither happened for a whole
 * watchdog interval, however busy the rings are.
 *
 * Asynchronous launches (a GPU backend: radiance_backend_linear_start):
 * a round's launches are queued on the device one after the other and the
 * executor goes on serving: it takes new requests from the SQs into their
 * flows while the round runs, and posts each launch's results as soon as
 * the device's completion word for it is in host memory (polled, never a
 * blocking synchronize). The next round starts once the last launch of
 * this one is done, so requests that arrived meanwhile (other sessions'
 * decode tokens) merge into the next round's launches instead of each
 * queueing a launch of its own. Before any job runs, the launches in
 * flight are waited for: a job never sees a ring or model a launch still
 * uses.
 *
 * Gather window (gather_us): when two or more sessions have submitted
 * within the last 2 ms and some of them have nothing queued yet, the start
 * of a round waits up to gather_us for them (polling their SQs), so that
 * clients in lockstep share a launch. A session alone never waits.
 *
 * Idle: spin ~50 us, then set `sleeping` on every SQ, re-check, and
 * epoll_wait on all SQ doorbells plus a control eventfd. An SQ whose
 * requests wait only for CQ room (a client that submitted past its CQ
 * space and does not reap) is not work: the executor sleeps anyway, with a
 * 10 ms timeout to look at that CQ again (reaping rings no doorbell),
 * rather than polling it in a loop. While launches
 * are in flight and nothing else happens the thread polls their
 * completion: spinning while a decode launch is among them (up to 2 ms,
 * executor.c EXEC_DECODE_SPIN_NS), else spinning for spin_us, then in
 * 20 us sleeps.
 *
 * A ring that violates the protocol (corrupted head/tail, undecodable slot)
 * is no longer served; its queued requests are dropped and the executor
 * posts the ring's `broken` notice job (job->done on the loop, with the
 * reason in job->err) and the loop ends that session. Nobody else is
 * affected.
 *
 * Pinning (executor_pin): a ring's arena is registered with the backend
 * (a GPU page-locks and maps it: tens of ms for a big arena) before its
 * RING_ADD job is submitted, and unregistered after its RING_REMOVE job is
 * done, both on a libuv worker thread, so the executor never stops serving
 * the other rings for them: RING_ADD and RING_REMOVE only add the SQ
 * doorbell to the executor's epoll set and take it off. RING_REMOVE waits
 * for every launch in flight before it detaches (as every job does), so once
 * its done has run no launch reads or writes the arena and unregistering it
 * needs no synchronization with the device's queues.
 *
 * Memory: everything the executor uses while serving is allocated at create
 * or by the loop before RING_ADD; a round does not allocate.
 */
#ifndef RADIANCE_EXECUTOR_H
#define RADIANCE_EXECUTOR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "model.h"
#include "ring.h"
#include "scheduler.h"
#include "shm.h"
#include "stats.h"

/* chunk_rows: 256 rows on a GPU backend, 32 on the CPU. Measured on the
 * 2-core CPU machine (2026-12-01): with 256, a flood of M=512 requests on a
 * 1536x384 layer held another client's M=1 requests at p50 12 ms, p99 35 ms;
 * with 32, p50 0.48 ms and p99 2.2 ms, the flood's throughput no lower. A
 * GPU runs 256 rows in about the time of 32, and smaller pieces cost it
 * tensor-core efficiency. */
#define EXEC_CHUNK_AUTO UINT32_MAX

#define EXEC_BATCH SCHED_QUEUE  /* most requests of one SQ queued at once */

struct radiance_executor;

/* A model as the executor sees it: embedded in the registry's entry. */
struct exec_model {
	uint32_t id;
	const struct radiance_model *model;
	struct radiance_backend_layer **handles;   /* [model->n_layers], filled by UPLOAD */
	size_t uploaded;                           /* executor-private progress */
	/* The one exportable allocation holding every layer (NULL when the
	 * backend does not share: docs/mapped.md). Made by UPLOAD before the
	 * first layer, freed by FREE; the loop reads it only while the model is
	 * READY, once the UPLOAD job's done has run. */
	struct radiance_backend_share *share;
	/* The allocation is made on the pin thread (exec_jobs.c, upload_step):
	 * next to arena registrations, never two driver-heavy calls at once,
	 * and the executor serves meanwhile. alloc_state EXEC_ALLOC_DONE
	 * (release) publishes alloc_rc, alloc_share, alloc_err, alloc_ns. */
	struct exec_model *alloc_next;             /* the pin thread's queue */
	atomic_int alloc_state;                    /* enum exec_alloc_state */
	int alloc_rc;
	struct radiance_backend_share *alloc_share;
	uint64_t alloc_ns;
	char alloc_err[200];
};

enum exec_alloc_state {
	EXEC_ALLOC_NONE,    /* not asked (or taken by upload_step) */
	EXEC_ALLOC_ASKED,   /* queued or running on the pin thread */
	EXEC_ALLOC_DONE,
};

/* A session's model references: model_id -> exec_model. The loop adds and
 * removes under `lock`; the executor looks up under it. */
struct exec_ref {
	uint32_t model_id;
	struct exec_model *model;
};

struct exec_refs {
	pthread_mutex_t lock;
	struct exec_ref *v;
	size_t n, cap;
};

void exec_refs_init(struct exec_refs *r);
void exec_refs_finish(struct exec_refs *r);
/* Loop thread. add: 0, -EEXIST (already referenced), -ENOMEM. remove: 0 or -ENOENT. */
int exec_refs_add(struct exec_refs *r, struct exec_model *m);
int exec_refs_remove(struct exec_refs *r, uint32_t model_id);
/* Any thread; the pointer is valid while the reference is held. */
struct exec_model *exec_refs_find(struct exec_refs *r, uint32_t model_id);

/* One request taken from an SQ, queued in its ring's flow until its last
 * piece has run. */
struct exec_entry {
	struct sched_req s;              /* the scheduler's view; in ring->flow */
	int in_use;
	int started;                     /* a piece has run: t_start is set */
	struct exec_ring *ring;
	struct exec_model *model;
	uint32_t n_layers;               /* several: one x, one output each (request.h) */
	uint32_t layers[RADIANCE_MAX_REQUEST_LAYERS];
	uint16_t *ys[RADIANCE_MAX_REQUEST_LAYERS];   /* y of each layer; ys[0] == rows.y */
	uint64_t request_id;
	uint64_t t_seen;                 /* CLOCK_MONOTONIC ns */
	uint64_t t_start;                /* its first piece's launch */
	uint64_t bytes_in, bytes_out;
	struct radiance_rows rows;       /* the whole request (layer 0): x, y point into the arena */
};

enum exec_job_kind {
	EXEC_JOB_RING_ADD,       /* start serving job->ring (its arena pinned already) */
	EXEC_JOB_RING_REMOVE,    /* stop serving job->ring (then unpin its arena) */
	EXEC_JOB_MODEL_UPLOAD,   /* upload every layer of job->model, one per step,
	                            into its shared allocation when the backend makes one */
	EXEC_JOB_MODEL_FREE,     /* free job->model's backend layers and shared allocation */
	EXEC_JOB_PING,           /* nothing: done once the jobs before it are, after
	                            at least one round (tests wait on it) */
	EXEC_JOB_DEFER,          /* nothing: its done runs on a later turn of the
	                            loop, after the jobs before it (the registry
	                            answers a waiter this way, never re-entrantly) */
	EXEC_JOB_NOTICE,         /* executor -> loop only: a ring broke (job->err) */
};

struct exec_job {
	enum exec_job_kind kind;
	struct exec_job *next;
	void (*done)(struct exec_job *job);   /* loop thread; may free the job */
	void *user;
	struct exec_ring *ring;
	struct exec_model *model;
	int drain;              /* RING_REMOVE: first run what the SQ already holds */
	int status;             /* 0 or -errno, set by the executor */
	char err[256];          /* why, when status != 0 */
};

/* A session's data plane, embedded in the session. The loop fills the
 * public part and the rings before RING_ADD and does not change it until
 * RING_REMOVE is done. */
struct exec_ring {
	uint64_t session_id;
	struct rring sq, cq;   /* private geometry copies */
	int sq_efd;                    /* SQ doorbell: eventfd the client writes */
	int cq_wfd;                    /* CQ doorbell: write end of a pipe, ours alone */
	uint8_t *arena;
	uint64_t arena_bytes;
	uint32_t max_inflight;
	struct exec_refs *refs;
	struct stats_counters *stats;
	struct exec_job broken;        /* set up by exec_ring_init; posted at most once */
	/* executor-private */
	int dead;
	int need_doorbell;
	uint64_t last_take_ns;         /* when the SQ last gave a request (the gather window) */
	struct sched_flow flow;        /* the queued entries, in the order taken */
	struct exec_entry entries[EXEC_BATCH];   /* slots; in_use ones are in flow */
};

/* Prepares the private part and the broken notice (done/user as given). */
void exec_ring_init(struct exec_ring *r, void (*broken_done)(struct exec_job *), void *user);

struct executor_options {
	struct radiance_backend_options backend;
	uint32_t max_rings;           /* sessions that may hold a ring at once */
	uint32_t spin_us;             /* busy-poll before sleeping (50) */
	uint32_t chunk_rows;          /* piece size of prefill requests (sched_params);
	                                 EXEC_CHUNK_AUTO: by backend, see executor.c */
	uint32_t session_rows;        /* rows one session may have in flight (sched_params) */
	uint32_t gather_us;           /* the gather window (executor.c, serve_pass); 0: none */
	struct stats_counters *global_stats;
};

/* Registering or unregistering a ring's arena with the backend, on a libuv
 * worker thread (executor.h, Pinning). Embedded in the session; the loop
 * fills nothing: executor_pin and executor_unpin set it up. */
struct exec_pin {
	struct exec_pin *next;                /* the pin thread's queue (exec_jobs.c) */
	struct radiance_executor *e;
	struct exec_ring *ring;
	int unpin;
	int status;                           /* 0 or -errno: set before done runs */
	char err[256];                        /* why, when status < 0 */
	void (*done)(struct exec_pin *p);     /* loop thread; may free p */
	void *user;
};

/* Queues the registration of r's arena (GPU: page-lock and map, the CPU
 * backend: nothing but test_pin_delay_us) on the executor's pin thread,
 * which runs registrations and unregistrations one at a time in the order
 * queued: not on libuv's threadpool, whose workers checkpoint loads take
 * (a ring set-up queued there waited seconds behind them). Loop thread;
 * r's arena and arena_bytes are set and stay until it is unpinned. Then
 * p->done runs on the loop thread with p->status 0 (registered: submit
 * RING_ADD, and executor_unpin it once it is no longer served), the
 * backend's -errno with p->err set, or -ECANCELED when executor_pin_cancel
 * took it back before it began (nothing registered). Returns 0. */
int executor_pin(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r,
		 void (*done)(struct exec_pin *), void *user);

/* Takes a pin back that has not begun: 0 (its done will run with
 * -ECANCELED), or -EBUSY when it runs already or is over (its done runs
 * with its result). Loop thread. */
int executor_pin_cancel(struct exec_pin *p);

/* Queues the unregistration of r's arena, registered by executor_pin and
 * served by no ring (never added, or its RING_REMOVE job is done: no launch
 * uses it any more), on the pin thread; p->done runs on the loop thread
 * once the backend forgot the range, status 0: from then on the arena may
 * be unmapped. Never cancelled: an arena still registered must not be
 * unmapped. Loop thread. */
void executor_unpin(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r,
		    void (*done)(struct exec_pin *), void *user);

/* Starts the thread, which creates the backend; waits for that and returns
 * its result: 0, or the backend's -errno with err set. Loop thread. */
int executor_create(uv_loop_t *loop, const struct executor_options *opt,
		    struct radiance_executor **out, char *err, size_t errlen);

/* The backend's name and device (and how it shares models), known after create. */
const struct radiance_backend_info *executor_backend_info(const struct radiance_executor *e);

/* Queues a job; job->done runs later on the loop thread. Loop thread. */
void executor_submit(struct radiance_executor *e, struct exec_job *job);

/* Stops and joins the thread (which destroys the backend), then closes the
 * uv_async and frees e once libuv lets go of it. Every ring must be removed
 * and unpinned (no executor_pin or executor_unpin still pending) and every
 * model freed first. Loop thread; e is gone after the loop runs. */
void executor_destroy(struct radiance_executor *e);

/* What the watchdog looks at. */
struct exec_liveness {
	uint64_t progress;   /* moves whenever the thread finishes a launch, a job or a round */
	int idle;            /* asleep in epoll waiting for work, with no job queued */
};

/* A snapshot of e's liveness. Any thread (atomics). */
void executor_liveness(struct radiance_executor *e, struct exec_liveness *out);

/* The watchdog's memory between looks; zero it to start. */
struct exec_watch {
	int started;
	uint64_t progress;   /* as last seen */
	uint64_t seen_ns;    /* when it was last seen moving (or idle) */
};

/* The verdict at now_ns on a snapshot l: 1 (alive: feed the watchdog) when
 * the thread is idle, or its progress moved since the last look, or it
 * moved less than timeout_ns ago; 0 when it has been busy without progress
 * for timeout_ns or more (wedged in a launch, a device call or a lock). The
 * first look counts as a move. No I/O, no clock of its own: the caller
 * passes the time. */
int exec_watch_alive(struct exec_watch *w, const struct exec_liveness *l, uint64_t now_ns,
		     uint64_t timeout_ns);

/* ---- inline mode: the executor's round on the calling thread ----
 *
 * For tests and fuzz targets that drive rounds one at a time and look at
 * what each did: no thread, no uv_async, no doorbells, no epoll. Everything
 * below runs on the thread that called executor__create_inline (which
 * creates the backend there), never together with the threaded calls
 * above (executor_submit, executor_destroy). Jobs posted for the loop (a
 * ring's broken notice) collect until executor__take_done. */

/* 0, or the backend's -errno (err set), -ENOMEM. */
int executor__create_inline(const struct executor_options *opt, struct radiance_executor **out,
			    char *err, size_t errlen);
/* Stops serving every ring still added, unpins their arenas, and destroys
 * the backend and e. */
void executor__destroy_inline(struct radiance_executor *e);
/* Pins r's arena (here, on the calling thread) and does as a RING_ADD job:
 * 0, -EBUSY (max_rings), or the backend's -errno. */
int executor__ring_add(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen);
/* As a RING_REMOVE job without drain (queued requests are dropped), then
 * unpins the arena here. 0 or -ENOENT. */
int executor__ring_remove(struct radiance_executor *e, struct exec_ring *r);
/* One round over every ring: the requests taken plus the pieces run. */
size_t executor__serve(struct radiance_executor *e);
/* The jobs posted for the loop so far, chained by next, in order. */
struct exec_job *executor__take_done(struct radiance_executor *e);
/* Backend launches made so far (one per group of stacked requests). */
uint64_t executor__launches(const struct radiance_executor *e);
/* The backend it made, to upload layers with. */
struct radiance_backend *executor__backend(struct radiance_executor *e);
/* The scheduling parameters in force (chunk_rows resolved). */
const struct sched_params *executor__sched(const struct radiance_executor *e);

#endif
