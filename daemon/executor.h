/*
 * The executor: one thread that owns the compute backend and serves every
 * session's SQ.
 *
 * Threads and hand-off. The libuv loop thread owns sessions; the executor
 * thread owns the backend and a private list of the rings it serves. They
 * meet in exactly two places:
 *   - jobs: the loop submits a struct exec_job (add or remove a ring, upload
 *     or free a model's layers, ping); the executor runs it between passes
 *     over the rings and hands it back, and job->done runs on the loop
 *     thread (through a uv_async), in submission order.
 *   - a session's model references (struct exec_refs), which the loop
 *     changes and the executor reads per request, under the refs' mutex.
 * The executor holds pointers into a session's shared memory and into
 * models only within one pass, and jobs run between passes. So when a
 * RING_REMOVE job's done runs, the executor will never touch that ring's
 * memory again (the loop may munmap it); when a MODEL_FREE job's done runs,
 * no pass uses the model any more. The loop never frees either earlier.
 *
 * A pass: for each ring in round-robin order, pop at most EXEC_BATCH
 * requests (never more than the CQ has room for: the CQ cannot overflow),
 * copy each slot out, decode and validate it; invalid ones get an error
 * result at once. The valid ones of all rings are grouped by (model, layer)
 * and each group runs as one backend launch of stacked rows (at most
 * max_rows); results are posted and CQ doorbells rung for clients that
 * sleep. Requests in flight at the same time are independent, so grouping
 * may reorder a session's completions. The seams for later work: a
 * priority (decode before prefill) is a sort key in group_and_run(); a
 * device-side merge of more rows is the backend's business.
 *
 * Idle: spin ~50 us, then set `sleeping` on every SQ, re-check, and
 * epoll_wait on all SQ doorbells plus a control eventfd.
 *
 * A ring that violates the protocol (corrupted head/tail, undecodable slot)
 * is no longer served; the executor posts the ring's `broken` notice job
 * (job->done on the loop, with the reason in job->err) and the loop ends
 * that session. Nobody else is affected.
 *
 * Memory: everything the executor uses while serving is allocated at create
 * or by the loop before RING_ADD; a pass does not allocate.
 */
#ifndef RADIANCE_EXECUTOR_H
#define RADIANCE_EXECUTOR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "model.h"
#include "ring.h"
#include "stats.h"

#define EXEC_BATCH 32u          /* most requests taken from one SQ per pass */

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

/* One request taken from an SQ, waiting in the pass's batch. */
struct exec_entry {
	struct exec_ring *ring;
	struct exec_model *model;
	uint32_t layer;
	uint64_t request_id;
	uint64_t t_seen;                 /* CLOCK_MONOTONIC ns */
	uint64_t bytes_in, bytes_out;
	struct radiance_rows rows;       /* x, y point into the ring's arena */
};

enum exec_job_kind {
	EXEC_JOB_RING_ADD,       /* register the arena, start serving job->ring */
	EXEC_JOB_RING_REMOVE,    /* stop serving job->ring, unregister its arena */
	EXEC_JOB_MODEL_UPLOAD,   /* upload every layer of job->model, one per step,
	                            into its shared allocation when the backend makes one */
	EXEC_JOB_MODEL_FREE,     /* free job->model's backend layers and shared allocation */
	EXEC_JOB_PING,           /* nothing: proves the thread is alive (watchdog) */
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
	struct radiance_ring sq, cq;   /* private geometry copies */
	int sq_efd;                    /* SQ doorbell: eventfd the client writes */
	int cq_wfd;                    /* CQ doorbell: write end of a pipe, ours alone */
	uint8_t *arena;
	uint64_t arena_bytes;
	uint32_t max_inflight;
	struct exec_refs *refs;
	struct radiance_stats *stats;
	struct exec_job broken;        /* set up by exec_ring_init; posted at most once */
	/* executor-private */
	int dead;
	int need_doorbell;
	struct exec_entry entries[EXEC_BATCH];
};

/* Prepares the private part and the broken notice (done/user as given). */
void exec_ring_init(struct exec_ring *r, void (*broken_done)(struct exec_job *), void *user);

struct executor_options {
	struct radiance_backend_options backend;
	uint32_t max_rings;           /* sessions that may hold a ring at once */
	uint32_t spin_us;             /* busy-poll before sleeping (50) */
	struct radiance_stats *global_stats;
};

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
 * and every model freed first. Loop thread; e is gone after the loop runs. */
void executor_destroy(struct radiance_executor *e);

#endif
