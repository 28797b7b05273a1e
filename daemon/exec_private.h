/*
 * Private to the executor's files (executor.c: model references, the
 * flows, a round and the thread; exec_launch.c: the launches and their
 * bookkeeping while in flight; exec_jobs.c: the jobs, the hand-off to the
 * loop and the pinning of arenas). daemon/executor.h has the contract;
 * nothing outside these three files includes this.
 *
 * Everything here runs on the executor thread (inline mode: the caller's),
 * except where a function says otherwise. The functions keep the names they
 * had as executor.c's statics (no prefix): they link inside the daemon
 * only, and nothing but these files declares them.
 */
#ifndef RADIANCE_EXEC_PRIVATE_H
#define RADIANCE_EXEC_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "proto_util.h"

/* A FIFO of jobs handed between the loop and the executor thread, under
 * the executor's lock. */
struct job_list {
	struct exec_job *head, *tail;
};

/* A FIFO of arena pins (executor_pin), under the executor's pin_lock. */
struct pin_list {
	struct exec_pin *head, *tail;
};

/* Jobs (ring set-up and teardown, model frees) run between two passes for
 * at most this long, at least one: a storm of connecting and dying clients
 * must not hold every other session's requests until the whole queue of
 * them is done (issue 8: three checked clients waited 3.1 s behind the ring
 * jobs of 1000 killed ones on the H200, when each job page-locked or
 * unlocked an arena; that runs on the pin thread now, executor_pin). */
#define JOB_BUDGET_NS 2000000ull

/* A device call of the executor that should take microseconds (queueing a
 * launch, asking whether one is done, uploading one layer) and took longer
 * than this is logged: another thread held the driver's lock meanwhile
 * (arena registrations on the H200: docs/daemon.md "Chaos test"). */
#define EXEC_QUEUE_SLOW_NS 10000000ull

/* One asynchronous launch of the round in flight: its pieces are
 * pend_v[first .. first + n). */
struct exec_pending {
	uint64_t ticket;
	uint64_t start;          /* CLOCK_MONOTONIC ns, when it was queued */
	size_t first, n;
	int bulk;                /* prefill pieces (struct radiance_rows.bulk) */
	int done;
};

struct radiance_executor {
	uv_loop_t *loop;
	uv_async_t async;
	pthread_t thread;

	/* the pin thread (exec_jobs.c, executor_pin): arena registrations and
	 * unregistrations, one at a time in queue order; finished ones come
	 * back through async */
	pthread_t pin_thread;
	int pin_running;           /* created (never in inline mode) */
	pthread_mutex_t pin_lock;  /* guards the fields below */
	pthread_cond_t pin_cond;
	int pin_stop;              /* run what is queued, then end */
	struct pin_list pin_queued;   /* not begun */
	struct pin_list pin_done;     /* over; their done not run yet */
	struct exec_model *alloc_head, *alloc_tail;   /* model allocations not begun (upload_step) */
	struct executor_options opt;
	struct radiance_backend *backend;
	struct radiance_backend_info info;

	/* start-up handshake */
	pthread_mutex_t lock;      /* guards jobs, done and started */
	pthread_cond_t cond;
	int started;               /* 1 ok, -errno failed */
	char start_err[256];

	struct job_list jobs;   /* loop -> executor */
	struct job_list backlog;   /* executor-private: taken, not run yet */
	struct job_list done;   /* executor -> loop */
	atomic_int jobs_pending;
	atomic_int stop;
	int ctl_efd;
	int epfd;

	/* watchdog: written by the executor, read by the loop */
	atomic_uint_fast64_t progress;
	atomic_int idle;

	/* executor-private */
	struct sched_params sched;
	struct exec_ring **rings;
	size_t nrings;
	size_t rr;                            /* round-robin start */
	struct exec_job *uploading;           /* UPLOAD jobs in progress, FIFO */
	uint64_t upload_alloc_ns;             /* the last upload step's model allocation
	                                         (its first layer's), 0 on other steps */
	struct sched_flow **flows;            /* max_rings: this round's */
	struct sched_flow **flow_scratch;     /* max_rings: sched_round's */
	struct sched_req **batch;             /* max_rings * EXEC_BATCH: this round's pieces */
	struct radiance_rows *rows;           /* max_rows */
	/* asynchronous launches (executor.h): the rounds in flight */
	int sync_only;                        /* the backend has none */
	uint64_t round_sync_ns;               /* this round's synchronous launches (executor_main) */
	struct exec_pending *pend;            /* pend_cap, in start order */
	size_t pend_n, pend_cap;
	size_t pend_decode;                   /* of them not bulk */
	struct sched_req **pend_v;            /* their pieces, pend_cap */
	uint8_t *pend_last;                   /* per piece: its request's last one */
	size_t pend_vn;
	struct rproto_bump bump;   /* SQ slots unpack here, off malloc */
	uint64_t launches;                    /* backend calls made: executor__launches() */
	int is_inline;                        /* executor__create_inline: no thread, async or fds */
};

static inline void progress_bump(struct radiance_executor *e)
{
	/* one writer: a plain load and store, no read-modify-write */
	atomic_store_explicit(&e->progress, atomic_load_explicit(&e->progress, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

static inline struct exec_entry *entry_of(struct sched_req *s)
{
	return (struct exec_entry *)((char *)s - offsetof(struct exec_entry, s));
}

/* ---- executor.c ---- */

/* One round over every ring (or only one). Returns the requests taken plus
 * the pieces run: 0 when there was nothing to do. */
size_t serve_pass(struct radiance_executor *e, struct exec_ring *only);
/* Posts en's one result (all its pieces ran, or it failed) and frees its
 * slot: entry_post, then entry_account. A launch's results are all posted
 * before any is accounted (pieces_done), so that the last client of a
 * merged launch does not wait for the others' bookkeeping. */
void entry_finish(struct radiance_executor *e, struct exec_entry *en, int status,
		  const char *error, uint64_t end);
void entry_post(struct radiance_executor *e, struct exec_entry *en, int status, const char *error,
		uint64_t end);
void entry_account(struct radiance_executor *e, struct exec_entry *en, int status, uint64_t end);
/* Rings r's CQ doorbell when results were posted and the client sleeps. */
void ring_doorbell(struct exec_ring *r);
/* Forgets every queued request of r without answering it. */
void ring_drop_queue(struct exec_ring *r);

/* ---- exec_launch.c ---- */

/* Posts the results of the launches in flight that finished; how many. */
size_t reap(struct radiance_executor *e);
/* Waits for every launch in flight (a job is about to run). */
void drain_pending(struct radiance_executor *e);
/* Runs pieces v[0..live) of one model and the same layers as one launch. */
void launch_same(struct radiance_executor *e, struct sched_req **v, size_t live);

/* ---- exec_jobs.c ---- */

/* Empties the list; returns its jobs, chained by next. */
struct exec_job *job_list_take(struct job_list *l);
/* Hands job back to the loop (its done runs there, in order). */
void post_done(struct radiance_executor *e, struct exec_job *job);
/* The uv_async: runs the done of every job and pin handed back. Loop
 * thread. */
void on_async(uv_async_t *h);
/* The backend's pin_pace (backend.h): between two pieces of an arena's
 * registration, waits for a round of the executor e. The pin thread. */
void executor_pin_pace(void *e);

/* Starts the pin thread (executor_create): 0 or -errno. */
int pin_thread_start(struct radiance_executor *e);
/* Runs what the pin thread has queued, ends it and frees its lock
 * (executor_destroy, before the backend goes). */
void pin_thread_stop(struct radiance_executor *e);
/* The uv_async's close callback: frees the executor (its data). */
void on_async_closed(uv_handle_t *h);
/* Registers r's arena with the backend, or unregisters it; any thread. */
int ring_pin(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen);
void ring_unpin(struct radiance_executor *e, struct exec_ring *r);
/* Starts serving r (pinned): 0 or -errno with err set. */
int ring_attach(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen);
/* Stops serving ring i, dropping what it has queued. */
void ring_detach(struct radiance_executor *e, size_t i);
/* One layer of the oldest model upload. */
int upload_step(struct radiance_executor *e);
/* Runs queued jobs for up to budget_ns (at least one); how many ran. */
size_t run_jobs(struct radiance_executor *e, uint64_t budget_ns);

#endif
