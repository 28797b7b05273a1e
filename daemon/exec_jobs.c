/* The executor's jobs (executor.h): the lists handed between the loop and
 * the executor thread, ring set-up and teardown (and the pinning of arenas
 * on libuv workers around them), model uploads and frees, and the budget
 * of a turn of jobs between two rounds. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "clock.h"
#include "exec_private.h"
#include "log.h"
#include "thread.h"

static void job_list_push(struct job_list *l, struct exec_job *job)
{
	job->next = NULL;
	if (l->tail)
		l->tail->next = job;
	else
		l->head = job;
	l->tail = job;
}

/* Empties the list; returns its jobs, chained by next. */
struct exec_job *job_list_take(struct job_list *l)
{
	struct exec_job *job = l->head;
	l->head = l->tail = NULL;
	return job;
}

/* Moves every job of src to the end of dst, in order. */
static void job_list_splice(struct job_list *dst, struct job_list *src)
{
	if (!src->head)
		return;
	if (dst->tail)
		dst->tail->next = src->head;
	else
		dst->head = src->head;
	dst->tail = src->tail;
	src->head = src->tail = NULL;
}

/* A single job slower than this is logged: one job is never cut short. */
#define JOB_SLOW_NS 50000000ull

/* ---- executor -> loop ---- */

void on_async_closed(uv_handle_t *h)
{
	free(h->data);
}

void post_done(struct radiance_executor *e, struct exec_job *job)
{
	pthread_mutex_lock(&e->lock);
	job_list_push(&e->done, job);
	pthread_mutex_unlock(&e->lock);
	if (!e->is_inline)
		uv_async_send(&e->async);
}

void on_async(uv_async_t *h)
{
	struct radiance_executor *e = h->data;
	pthread_mutex_lock(&e->lock);
	struct exec_job *job = job_list_take(&e->done);
	pthread_mutex_unlock(&e->lock);
	while (job) {
		struct exec_job *next = job->next;
		job->done(job);
		job = next;
	}
	if (!e->pin_running)
		return;
	pthread_mutex_lock(&e->pin_lock);
	struct exec_pin *p = e->pin_done.head;
	e->pin_done.head = e->pin_done.tail = NULL;
	pthread_mutex_unlock(&e->pin_lock);
	while (p) {
		struct exec_pin *next = p->next;   /* done may free p */
		p->done(p);
		p = next;
	}
}

/* ---- jobs ---- */

/* A registration slower than this is logged as a warning (else at debug):
 * on a GPU it page-locks the whole arena, and the log says what each one
 * cost (issue 8: the H200's chaos run). */
#define PIN_SLOW_NS 20000000ull

static void pin_log(const struct exec_ring *r, const char *what, uint64_t t0, uint64_t t1)
{
	enum rlog_level lvl = t1 - t0 > PIN_SLOW_NS ? RADIANCE_LOG_WARN : RADIANCE_LOG_DEBUG;
	/* the monotonic interval lets a test or a chaos run line it up with
	 * what clients saw meanwhile */
	rlog(lvl, "session %llu: %s its arena (%llu bytes) took %llu.%03llu ms "
	     "(monotonic %llu.%09llu to %llu.%09llu s)", (unsigned long long)r->session_id, what,
	     (unsigned long long)r->arena_bytes, (unsigned long long)((t1 - t0) / 1000000u),
	     (unsigned long long)((t1 - t0) / 1000u % 1000u), (unsigned long long)(t0 / 1000000000u),
	     (unsigned long long)(t0 % 1000000000u), (unsigned long long)(t1 / 1000000000u),
	     (unsigned long long)(t1 % 1000000000u));
}

/* Registers r's arena with the backend (GPU: page-locks and maps it). Any
 * thread: the backend allows it beside the executor's calls (backend.h). */
int ring_pin(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen)
{
	uint64_t t0 = rclock_ns();
	int rc = radiance_backend_register_host(e->backend, r->arena, r->arena_bytes, err, errlen);
	pin_log(r, rc < 0 ? "failing to register" : "registering", t0, rclock_ns());
	return rc;
}

void ring_unpin(struct radiance_executor *e, struct exec_ring *r)
{
	uint64_t t0 = rclock_ns();
	radiance_backend_unregister_host(e->backend, r->arena);
	pin_log(r, "unregistering", t0, rclock_ns());
}

/* ---- the pin thread ---- */

/* Registrations and unregistrations run one at a time, on a thread of
 * their own. The H200 chaos run (2026-12-01) showed the CUDA driver
 * serializing them anyway, 25-48 ms per 64 MiB arena, while the executor's
 * launches waited behind them for the same driver lock: with four libuv
 * workers queued on it the executor lost the lock for up to 0.9 s. They
 * ran on libuv's threadpool before, where they also waited behind
 * checkpoint loads (a new session's first request 12 s behind four), and
 * held workers that loads wanted. */

/* After a registration, before the next: until the executor has gone once
 * round its loop (its progress counter moved twice: the iteration that was
 * held in the driver, then a whole one), or is idle, or PIN_ROUND_WAIT_NS.
 * The driver lock is not fair; without this the next registration, queued
 * already, could take it again at once and keep the executor's launches
 * waiting for several in a row (seen on the H200: waits of 0.5 s). */
#define PIN_ROUND_WAIT_NS 20000000ull

/* Until the executor's progress counter moved twice since `before`, or it
 * is idle or stopping, or `most` ns went by; polling every `poll` ns. */
static void pin_wait_round(struct radiance_executor *e, uint_fast64_t before, uint64_t most, long poll)
{
	uint64_t t0 = rclock_ns();
	while (!atomic_load(&e->idle) && !atomic_load(&e->stop) &&
	       atomic_load_explicit(&e->progress, memory_order_relaxed) - before < 2 &&
	       rclock_ns() - t0 < most) {
		struct timespec ts = { 0, poll };
		nanosleep(&ts, NULL);
	}
}

static void pin_let_executor_run(struct radiance_executor *e, uint_fast64_t before)
{
	pin_wait_round(e, before, PIN_ROUND_WAIT_NS, 200000);
}

/* Between two pieces of one registration or unregistration (backend.h,
 * pin_pace), likewise, for at most PIN_PIECE_WAIT_NS: a 50 us sleep hands
 * the driver's lock to the executor if it waits for it, and the rest of its
 * round runs before the next piece takes the lock again. With the sleep
 * alone each of the round's driver calls (launches, copies, the completion
 * word) could wait for a piece of its own, about a millisecond each on the
 * H200. */
#define PIN_PIECE_WAIT_NS 2000000ull

void executor_pin_pace(void *arg)
{
	struct radiance_executor *e = arg;
	uint_fast64_t before = atomic_load_explicit(&e->progress, memory_order_relaxed);
	struct timespec ts = { 0, 50000 };
	nanosleep(&ts, NULL);
	pin_wait_round(e, before, PIN_PIECE_WAIT_NS, 50000);
}

/* The caller holds e->pin_lock. */
static void pin_list_push(struct pin_list *l, struct exec_pin *p)
{
	p->next = NULL;
	if (l->tail)
		l->tail->next = p;
	else
		l->head = p;
	l->tail = p;
}

static void *pin_main(void *arg)
{
	struct radiance_executor *e = arg;
	pthread_mutex_lock(&e->pin_lock);
	for (;;) {
		while (!e->pin_queued.head && !e->alloc_head && !e->pin_stop)
			pthread_cond_wait(&e->pin_cond, &e->pin_lock);
		struct exec_model *m = e->alloc_head;
		if (m) {
			/* a model's allocation first: a load waits for it */
			e->alloc_head = m->alloc_next;
			if (!e->alloc_head)
				e->alloc_tail = NULL;
			pthread_mutex_unlock(&e->pin_lock);
			const uint64_t t0 = rclock_ns();
			m->alloc_rc = radiance_backend_share_create(e->backend, m->model, &m->alloc_share,
								    m->alloc_err, sizeof m->alloc_err);
			m->alloc_ns = rclock_ns() - t0;
			atomic_store_explicit(&m->alloc_state, EXEC_ALLOC_DONE, memory_order_release);
			rdoorbell_ring(e->ctl_efd);   /* upload_step goes on */
			pthread_mutex_lock(&e->pin_lock);
			continue;
		}
		struct exec_pin *p = e->pin_queued.head;
		if (!p)
			break;   /* stopping, and nothing queued */
		e->pin_queued.head = p->next;
		if (!e->pin_queued.head)
			e->pin_queued.tail = NULL;
		pthread_mutex_unlock(&e->pin_lock);

		uint_fast64_t before = atomic_load_explicit(&e->progress, memory_order_relaxed);
		if (p->unpin)
			ring_unpin(e, p->ring);
		else
			p->status = ring_pin(e, p->ring, p->err, sizeof p->err);
		pin_let_executor_run(e, before);

		pthread_mutex_lock(&e->pin_lock);
		pin_list_push(&e->pin_done, p);
		pthread_mutex_unlock(&e->pin_lock);
		uv_async_send(&e->async);
		pthread_mutex_lock(&e->pin_lock);
	}
	pthread_mutex_unlock(&e->pin_lock);
	return NULL;
}

int pin_thread_start(struct radiance_executor *e)
{
	pthread_mutex_init(&e->pin_lock, NULL);
	pthread_cond_init(&e->pin_cond, NULL);
	int rc = -rthread_create(&e->pin_thread, pin_main, e);
	if (rc < 0) {
		pthread_cond_destroy(&e->pin_cond);
		pthread_mutex_destroy(&e->pin_lock);
		return rc;
	}
	pthread_setname_np(e->pin_thread, "radiance-pin");
	e->pin_running = 1;
	return 0;
}

void pin_thread_stop(struct radiance_executor *e)
{
	if (!e->pin_running)
		return;
	pthread_mutex_lock(&e->pin_lock);
	e->pin_stop = 1;
	pthread_cond_signal(&e->pin_cond);
	pthread_mutex_unlock(&e->pin_lock);
	pthread_join(e->pin_thread, NULL);
}

static int pin_queue(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r, int unpin,
		     void (*done)(struct exec_pin *), void *user)
{
	*p = (struct exec_pin){ .e = e, .ring = r, .unpin = unpin, .done = done, .user = user };
	pthread_mutex_lock(&e->pin_lock);
	pin_list_push(&e->pin_queued, p);
	pthread_cond_signal(&e->pin_cond);
	pthread_mutex_unlock(&e->pin_lock);
	return 0;
}

int executor_pin(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r,
		 void (*done)(struct exec_pin *), void *user)
{
	return pin_queue(e, p, r, 0, done, user);
}

int executor_pin_cancel(struct exec_pin *p)
{
	struct radiance_executor *e = p->e;
	int rc = -EBUSY;
	pthread_mutex_lock(&e->pin_lock);
	/* still queued (the pin thread has not taken it): out of the queue
	 * and into the finished ones, unregistered */
	for (struct exec_pin **q = &e->pin_queued.head, *prev = NULL; *q; prev = *q, q = &(*q)->next) {
		if (*q != p)
			continue;
		*q = p->next;
		if (e->pin_queued.tail == p)
			e->pin_queued.tail = prev;
		p->status = -ECANCELED;
		pin_list_push(&e->pin_done, p);
		rc = 0;
		break;
	}
	pthread_mutex_unlock(&e->pin_lock);
	if (rc == 0)
		uv_async_send(&e->async);
	return rc;
}

void executor_unpin(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r,
		    void (*done)(struct exec_pin *), void *user)
{
	pin_queue(e, p, r, 1, done, user);
}

/* Starts serving r, whose arena is pinned: 0, or -errno with err set. */
int ring_attach(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen)
{
	if (e->nrings == e->opt.max_rings) {
		snprintf(err, errlen, "executor serves %u rings already", e->opt.max_rings);
		return -EBUSY;
	}
	/* Edge-triggered, and never read: the client holds the same open file
	 * description and could make it blocking (O_NONBLOCK is shared) and
	 * then steal the count, which would hang a read here. An eventfd write
	 * wakes an edge-triggered epoll every time, so nothing is lost. */
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = r };
	if (!e->is_inline && epoll_ctl(e->epfd, EPOLL_CTL_ADD, r->sq_efd, &ev) < 0) {
		int rc = -errno;
		snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
		return rc;
	}
	e->rings[e->nrings++] = r;
	return 0;
}

static void ring_add(struct radiance_executor *e, struct exec_job *job)
{
	job->status = ring_attach(e, job->ring, job->err, sizeof job->err);
}

/* Stops serving ring i: whatever is still queued is dropped unanswered.
 * Its arena stays pinned (the loop unpins it, executor_unpin). */
void ring_detach(struct radiance_executor *e, size_t i)
{
	struct exec_ring *r = e->rings[i];
	ring_drop_queue(r);
	if (!e->is_inline)
		epoll_ctl(e->epfd, EPOLL_CTL_DEL, r->sq_efd, NULL);
	e->rings[i] = e->rings[--e->nrings];
	e->rr = 0;
}

static void ring_remove(struct radiance_executor *e, struct exec_job *job)
{
	struct exec_ring *r = job->ring;
	size_t i;
	for (i = 0; i < e->nrings; i++)
		if (e->rings[i] == r)
			break;
	if (i == e->nrings) {
		job->status = -ENOENT;
		return;
	}
	/* Drain: run what the client had already submitted, its queued
	 * requests to their last piece included (taking at most one SQ's
	 * worth, so a client that keeps submitting cannot hold us). Whatever
	 * is still queued after that is dropped unanswered: from here on,
	 * nothing of the ring is touched. */
	uint32_t first = r->sq.local;
	while (job->drain && !r->dead && r->sq.local - first < r->sq.entries)
		if (serve_pass(e, r) == 0 && !e->pend_n)
			break;
	drain_pending(e);
	ring_detach(e, i);
}

/* Fails the requests still queued for m: their session released it with
 * requests in flight, and m is about to go. */
static void model_cancel(struct radiance_executor *e, struct exec_model *m)
{
	uint64_t now = rclock_ns();
	for (size_t i = 0; i < e->nrings; i++) {
		struct exec_ring *r = e->rings[i];
		for (size_t j = 0; j < EXEC_BATCH; j++) {
			struct exec_entry *en = &r->entries[j];
			if (!en->in_use || en->model != m)
				continue;
			char msg[160];
			snprintf(msg, sizeof msg, "model %u was released while the request was in "
				 "flight (%u of its %u rows had run)", m->id, en->s.next, en->s.rows);
			entry_finish(e, en, ENOENT, msg, now);
		}
		ring_doorbell(r);
	}
}

static void model_free(struct radiance_executor *e, struct exec_model *m)
{
	model_cancel(e, m);
	for (size_t i = 0; i < m->model->n_layers; i++) {
		radiance_backend_layer_free(e->backend, m->handles[i]);
		m->handles[i] = NULL;
	}
	radiance_backend_share_destroy(e->backend, m->share);
	m->share = NULL;
	m->uploaded = 0;
}

/* Asks the pin thread for m's allocation. */
static void alloc_queue(struct radiance_executor *e, struct exec_model *m)
{
	atomic_store_explicit(&m->alloc_state, EXEC_ALLOC_ASKED, memory_order_relaxed);
	m->alloc_next = NULL;
	pthread_mutex_lock(&e->pin_lock);
	if (e->alloc_tail)
		e->alloc_tail->alloc_next = m;
	else
		e->alloc_head = m;
	e->alloc_tail = m;
	pthread_cond_signal(&e->pin_cond);
	pthread_mutex_unlock(&e->pin_lock);
}

/* Uploads one layer of the oldest UPLOAD job; finishes the job when done.
 * One layer per step keeps other sessions served while a model loads.
 * The model's one exportable allocation, before its first layer, is made
 * on the pin thread (inline mode, or a backend that shares nothing: here):
 * on the executor a VMM allocation took 31.6 ms of one step beside an arena
 * registration on the H200, every session waiting (docs/daemon.md, Chaos
 * test). Returns 1 when it did
 * something, 0 while that allocation is under way (the pin thread rings
 * the executor's doorbell when it is done). */
int upload_step(struct radiance_executor *e)
{
	struct exec_job *job = e->uploading;
	struct exec_model *m = job->model;
	char err[200];
	e->upload_alloc_ns = 0;
	if (m->uploaded == 0 && !m->share) {
		int rc;
		switch (atomic_load_explicit(&m->alloc_state, memory_order_acquire)) {
		case EXEC_ALLOC_NONE:
			/* a backend that makes nothing has no call to wait for:
			 * the load must not queue behind a registration for it */
			if (e->pin_running && strcmp(e->info.share, "none") != 0) {
				alloc_queue(e, m);
				return 0;
			}
			const uint64_t t0 = rclock_ns();
			rc = radiance_backend_share_create(e->backend, m->model, &m->share, err, sizeof err);
			e->upload_alloc_ns = rclock_ns() - t0;
			break;
		case EXEC_ALLOC_ASKED:
			return 0;
		default:
			atomic_store_explicit(&m->alloc_state, EXEC_ALLOC_NONE, memory_order_relaxed);
			rc = m->alloc_rc;
			m->share = m->alloc_share;
			m->alloc_share = NULL;
			snprintf(err, sizeof err, "%s", m->alloc_err);
			if (m->alloc_ns > EXEC_QUEUE_SLOW_NS)
				log_info("executor: allocating model %u took %.3f ms on the pin thread "
					 "(the executor served meanwhile)", m->id, m->alloc_ns / 1e6);
			break;
		}
		if (rc < 0) {
			job->status = rc;
			snprintf(job->err, sizeof job->err, "allocating the model: %s", err);
			e->uploading = job->next;
			post_done(e, job);
			return 1;
		}
	}
	if (m->uploaded < m->model->n_layers) {
		const struct radiance_layer *l = &m->model->layers[m->uploaded];
		int rc = radiance_backend_layer_upload_into(e->backend, m->share, m->uploaded, l,
							    &m->handles[m->uploaded], err, sizeof err);
		if (rc < 0) {
			job->status = rc;
			snprintf(job->err, sizeof job->err, "uploading layer %zu (%s): %s", m->uploaded,
				 l->name, err);
			model_free(e, m);
		} else {
			m->uploaded++;
			if (m->uploaded < m->model->n_layers)
				return 1;
		}
	}
	e->uploading = job->next;
	post_done(e, job);
	return 1;
}

static const char *job_kind_name(enum exec_job_kind k)
{
	switch (k) {
	case EXEC_JOB_RING_ADD:
		return "ring set-up";
	case EXEC_JOB_RING_REMOVE:
		return "ring teardown";
	case EXEC_JOB_MODEL_UPLOAD:
		return "model upload";
	case EXEC_JOB_MODEL_FREE:
		return "model free";
	case EXEC_JOB_PING:
		return "ping";
	case EXEC_JOB_DEFER:
		return "deferral";
	case EXEC_JOB_NOTICE:
		return "notice";
	}
	return "job";
}

/* Runs queued jobs in order for up to budget_ns (at least one); the rest
 * wait in the backlog for the next call, after a pass. Returns how many
 * ran. */
size_t run_jobs(struct radiance_executor *e, uint64_t budget_ns)
{
	if (atomic_load(&e->jobs_pending)) {
		pthread_mutex_lock(&e->lock);
		job_list_splice(&e->backlog, &e->jobs);
		atomic_store(&e->jobs_pending, 0);
		pthread_mutex_unlock(&e->lock);
	}
	if (!e->backlog.head)
		return 0;
	/* no job sees a ring or a model that a launch in flight still uses */
	drain_pending(e);
	uint64_t t0 = rclock_ns(), t = t0;
	size_t ran = 0;
	struct exec_job *job;
	while ((job = e->backlog.head) && (ran == 0 || t - t0 < budget_ns)) {
		struct exec_job *next = job->next;
		e->backlog.head = next;
		if (!next)
			e->backlog.tail = NULL;
		uint64_t tj = t;
		ran++;
		job->status = 0;
		job->err[0] = 0;
		switch (job->kind) {
		case EXEC_JOB_RING_ADD:
			ring_add(e, job);
			break;
		case EXEC_JOB_RING_REMOVE:
			ring_remove(e, job);
			break;
		case EXEC_JOB_MODEL_UPLOAD: {
			job->next = NULL;
			job->model->uploaded = 0;
			struct exec_job **p = &e->uploading;
			while (*p)
				p = &(*p)->next;
			*p = job;
			t = rclock_ns();
			continue;   /* done later, by upload_step */
		}
		case EXEC_JOB_MODEL_FREE:
			model_free(e, job->model);
			break;
		case EXEC_JOB_PING:
		case EXEC_JOB_DEFER:
		case EXEC_JOB_NOTICE:
			break;
		}
		enum exec_job_kind kind = job->kind;
		post_done(e, job);
		progress_bump(e);
		t = rclock_ns();
		if (t - tj > JOB_SLOW_NS)
			log_warn("executor: a %s took %llu ms; every session's requests waited for it",
				 job_kind_name(kind), (unsigned long long)((t - tj) / 1000000u));
	}
	return ran;
}

void executor_submit(struct radiance_executor *e, struct exec_job *job)
{
	pthread_mutex_lock(&e->lock);
	job_list_push(&e->jobs, job);
	atomic_store(&e->jobs_pending, 1);
	pthread_mutex_unlock(&e->lock);
	rdoorbell_ring(e->ctl_efd);
}
