/* The compute thread; see executor.h for the threading contract. */
#include "executor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "proto_util.h"
#include "request.h"

/* A FIFO of jobs handed between the loop and the executor thread, under
 * the executor's lock. */
struct job_list {
	struct exec_job *head, *tail;
};

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
static struct exec_job *job_list_take(struct job_list *l)
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

/* Jobs (ring set-up and teardown, model frees) run between two passes for
 * at most this long, at least one: a storm of connecting and dying clients
 * must not hold every other session's requests until the whole queue of
 * them is done (issue 8: three checked clients waited 3.1 s behind the ring
 * jobs of 1000 killed ones on the H200, when each job page-locked or
 * unlocked an arena; that runs on a libuv worker now, executor_pin). */
#define JOB_BUDGET_NS 2000000ull
/* A single job slower than this is logged: one job is never cut short. */
#define JOB_SLOW_NS 50000000ull

/* One asynchronous launch of the round in flight: its pieces are
 * pend_v[first .. first + n). */
struct exec_pending {
	uint64_t ticket;
	uint64_t start;          /* CLOCK_MONOTONIC ns, when it was queued */
	size_t first, n;
	int bulk;                /* prefill pieces (struct radiance_rows.bulk) */
	int done;
};

/* A session counts as busy for the gather window this long after its SQ
 * last gave a request. */
#define GATHER_RECENT_NS 2000000u

struct radiance_executor {
	uv_loop_t *loop;
	uv_async_t async;
	pthread_t thread;
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
	struct sched_flow **flows;            /* max_rings: this round's */
	struct sched_req **batch;             /* max_rings * EXEC_BATCH: this round's pieces */
	struct radiance_rows *rows;           /* max_rows */
	/* asynchronous launches (executor.h): the rounds in flight */
	int sync_only;                        /* the backend has none */
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

static void progress_bump(struct radiance_executor *e)
{
	/* one writer: a plain load and store, no read-modify-write */
	atomic_store_explicit(&e->progress, atomic_load_explicit(&e->progress, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

/* ---- model references ---- */

void exec_refs_init(struct exec_refs *r)
{
	pthread_mutex_init(&r->lock, NULL);
	r->v = NULL;
	r->n = r->cap = 0;
}

void exec_refs_finish(struct exec_refs *r)
{
	free(r->v);
	r->v = NULL;
	r->n = r->cap = 0;
	pthread_mutex_destroy(&r->lock);
}

int exec_refs_add(struct exec_refs *r, struct exec_model *m)
{
	int rc = 0;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < r->n; i++)
		if (r->v[i].model_id == m->id) {
			rc = -EEXIST;
			goto out;
		}
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 4;
		struct exec_ref *v = realloc(r->v, cap * sizeof *v);
		if (!v) {
			rc = -ENOMEM;
			goto out;
		}
		r->v = v;
		r->cap = cap;
	}
	r->v[r->n++] = (struct exec_ref){ m->id, m };
out:
	pthread_mutex_unlock(&r->lock);
	return rc;
}

int exec_refs_remove(struct exec_refs *r, uint32_t model_id)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < r->n; i++)
		if (r->v[i].model_id == model_id) {
			r->v[i] = r->v[--r->n];
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

struct exec_model *exec_refs_find(struct exec_refs *r, uint32_t model_id)
{
	struct exec_model *m = NULL;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < r->n; i++)
		if (r->v[i].model_id == model_id) {
			m = r->v[i].model;
			break;
		}
	pthread_mutex_unlock(&r->lock);
	return m;
}

void exec_ring_init(struct exec_ring *r, void (*broken_done)(struct exec_job *), void *user)
{
	memset(&r->broken, 0, sizeof r->broken);
	r->broken.kind = EXEC_JOB_NOTICE;
	r->broken.done = broken_done;
	r->broken.user = user;
	r->broken.ring = r;
	r->dead = 0;
	r->need_doorbell = 0;
	r->last_take_ns = 0;
	sched_flow_init(&r->flow);
	for (size_t i = 0; i < EXEC_BATCH; i++)
		r->entries[i].in_use = 0;
}

/* ---- executor -> loop ---- */

static void on_async_closed(uv_handle_t *h)
{
	free(h->data);
}

static void post_done(struct radiance_executor *e, struct exec_job *job)
{
	pthread_mutex_lock(&e->lock);
	job_list_push(&e->done, job);
	pthread_mutex_unlock(&e->lock);
	if (!e->is_inline)
		uv_async_send(&e->async);
}

static void on_async(uv_async_t *h)
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
}

static void ring_violation(struct radiance_executor *e, struct exec_ring *r, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void ring_violation(struct radiance_executor *e, struct exec_ring *r, const char *fmt, ...)
{
	if (r->dead)
		return;
	r->dead = 1;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->broken.err, sizeof r->broken.err, fmt, ap);
	va_end(ap);
	r->broken.status = -EPROTO;
	post_done(e, &r->broken);
}

/* The ring functions say only that a ring is corrupted (-EPROTO): look
 * again to say how, with the values. The client may have rewritten the
 * words since; what is read now is what is reported. */
static void cq_violation(struct radiance_executor *e, struct exec_ring *r)
{
	uint32_t tail = r->cq.local;
	uint32_t head = __atomic_load_n(&r->cq.ctl->head, __ATOMIC_ACQUIRE);
	uint32_t behind = tail - head;
	if ((int32_t)behind < 0)
		ring_violation(e, r, "CQ head %u is %u entries ahead of tail %u (it may not pass "
			       "the tail)", head, head - tail, tail);
	else if (behind > r->cq.entries)
		ring_violation(e, r, "CQ head %u is %u entries behind tail %u (at most %u)", head,
			       behind, tail, r->cq.entries);
	else
		ring_violation(e, r, "CQ head corrupted (head %u, tail %u, %u entries; it changed "
			       "back since)", head, tail, r->cq.entries);
}

static void sq_violation(struct radiance_executor *e, struct exec_ring *r)
{
	uint32_t head = r->sq.local;
	uint32_t tail = __atomic_load_n(&r->sq.ctl->tail, __ATOMIC_ACQUIRE);
	uint32_t ahead = tail - head;
	uint32_t slot = head & r->sq.mask;
	const uint8_t *p = r->sq.slots + (size_t)slot * RADIANCE_SLOT_BYTES;
	uint32_t len = __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED);
	if ((int32_t)ahead < 0)
		ring_violation(e, r, "SQ tail %u is %u entries behind head %u (it may not go back)",
			       tail, head - tail, head);
	else if (ahead > r->sq.entries)
		ring_violation(e, r, "SQ tail %u is %u entries ahead of head %u (at most %u)", tail,
			       ahead, head, r->sq.entries);
	else if (len == 0 || len > RADIANCE_SLOT_BYTES - 4)
		ring_violation(e, r, "SQ slot %u (entry %u): length %u is outside 1..%u", slot, head,
			       len, RADIANCE_SLOT_BYTES - 4);
	else
		ring_violation(e, r, "SQ corrupted (head %u, tail %u, slot %u length %u; it changed "
			       "back since)", head, tail, slot, len);
}

/* ---- results ---- */

static void post_result(struct radiance_executor *e, struct exec_ring *r, uint64_t request_id,
			int status, const char *error, uint64_t queue_ns, uint64_t exec_ns)
{
	if (r->dead)
		return;
	Rdw__LinearResult res = RDW__LINEAR_RESULT__INIT;
	char text[192];
	res.request_id = request_id;
	res.status = status;
	res.queue_ns = queue_ns;
	res.exec_ns = exec_ns;
	if (status && error) {
		/* an error text always fits a slot: cut it rather than drop it */
		snprintf(text, sizeof text, "%s", error);
		res.error = text;
	}
	uint8_t buf[RADIANCE_SLOT_BYTES - 4];
	int len = rproto_pack_slot(&res.base, buf, sizeof buf);
	int rc = len < 0 ? len : rring_push(&r->cq, buf, (size_t)len);
	if (rc == -EPROTO) {
		cq_violation(e, r);
		return;
	}
	if (rc < 0) {
		/* cannot happen: CQ room is reserved before an SQ entry is taken */
		ring_violation(e, r, "cannot post a result: %s", strerror(-rc));
		return;
	}
	r->need_doorbell = 1;
}

static void reject(struct radiance_executor *e, struct exec_ring *r, uint64_t request_id,
		   uint64_t t_seen, int status, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void reject(struct radiance_executor *e, struct exec_ring *r, uint64_t request_id,
		   uint64_t t_seen, int status, const char *fmt, ...)
{
	char msg[192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	uint64_t lat = rclock_ns() - t_seen;
	post_result(e, r, request_id, status, msg, lat, 0);
	stats_record(r->stats, 0, 0, 0, lat, status);
	stats_record(e->opt.global_stats, 0, 0, 0, lat, status);
	log_debug("session %llu: request %llu refused: %s", (unsigned long long)r->session_id,
		  (unsigned long long)request_id, msg);
}

/* ---- the flows ---- */

static struct exec_entry *entry_of(struct sched_req *s)
{
	return (struct exec_entry *)((char *)s - offsetof(struct exec_entry, s));
}

/* A free slot for a request the flow admitted: there is one, as every slot
 * in use is queued in the flow and the flow holds at most EXEC_BATCH. */
static struct exec_entry *entry_alloc(struct exec_ring *r)
{
	for (size_t i = 0; i < EXEC_BATCH; i++)
		if (!r->entries[i].in_use)
			return &r->entries[i];
	return NULL;
}

static void entry_release(struct exec_ring *r, struct exec_entry *en)
{
	sched_flow_remove(&r->flow, &en->s);
	en->in_use = 0;
}

/* Forgets every queued request of r without answering it (the ring died or
 * is being removed): nothing of r's arena is touched again. */
static void ring_drop_queue(struct exec_ring *r)
{
	for (size_t i = 0; i < EXEC_BATCH; i++)
		r->entries[i].in_use = 0;
	sched_flow_clear(&r->flow);
}

/* Posts en's one result (all its pieces ran, or it failed) and frees its slot. */
static void entry_finish(struct radiance_executor *e, struct exec_entry *en, int status,
			 const char *error, uint64_t end)
{
	struct exec_ring *r = en->ring;
	uint64_t start = en->started ? en->t_start : end;
	post_result(e, r, en->request_id, status, error, start - en->t_seen, end - start);
	stats_record(r->stats, en->rows.m, en->bytes_in, en->bytes_out, end - en->t_seen, status);
	stats_record(e->opt.global_stats, en->rows.m, en->bytes_in, en->bytes_out, end - en->t_seen,
		     status);
	entry_release(r, en);
}

/* One non-blocking write to our own end of the session's pipe: the client
 * holds only the read end, a different open file description, so nothing
 * it does can make this block. A full pipe (never drained) answers EAGAIN,
 * and a wakeup is pending anyway; a closed read end gives EPIPE (SIGPIPE is
 * ignored). */
static void ring_doorbell(struct exec_ring *r)
{
	if (r->need_doorbell && !r->dead && rring_needs_wakeup(&r->cq))
		rdoorbell_ring(r->cq_wfd);
	r->need_doorbell = 0;
}

/* Takes what one SQ offers this round into the ring's flow. */
static void collect_ring(struct radiance_executor *e, struct exec_ring *r)
{
	int space = rring_space(&r->cq);
	if (space < 0) {
		cq_violation(e, r);
		return;
	}
	/* looked at every round, even when the flow takes nothing: a broken
	 * SQ ends the session now, not after its queued pieces ran */
	if (rring_ready(&r->sq) < 0) {
		sq_violation(e, r);
		return;
	}
	/* every queued request holds a CQ slot for its result; each request
	 * taken now, good or refused, needs one more */
	uint32_t room = (uint32_t)space > r->flow.n ? (uint32_t)space - r->flow.n : 0;
	uint32_t budget = room < EXEC_BATCH ? room : EXEC_BATCH;
	uint32_t taken = 0;
	uint8_t slot[RADIANCE_SLOT_BYTES];
	const struct request_ctx ctx = {
		.refs = r->refs,
		.arena_bytes = r->arena_bytes,
		.max_rows = e->opt.backend.max_rows,
	};

	while (taken < budget && sched_flow_can_take(&e->sched, &r->flow)) {
		int len = rring_pop(&r->sq, slot);
		if (len == 0)
			break;
		if (len < 0) {
			sq_violation(e, r);
			return;
		}
		uint64_t t_seen = rclock_ns();
		r->last_take_ns = t_seen;
		taken++;
		Rdw__LinearRequest *req;
		if (request_decode(slot, (size_t)len, &e->bump, &req) < 0) {
			ring_violation(e, r, "SQ entry %u is not a LinearRequest (%d bytes)",
				       r->sq.local - 1, len);
			return;
		}
		/* req lives in the bump arena: copy what we keep, nothing to free */
		uint64_t id = req->request_id;
		int ready = rring_ready(&r->sq);
		uint64_t inflight = (uint64_t)(ready > 0 ? ready : 0) + r->flow.n + 1;
		if (inflight > r->max_inflight) {
			reject(e, r, id, t_seen, EBUSY, "%llu requests in flight exceed the limit of %u",
			       (unsigned long long)inflight, r->max_inflight);
			continue;
		}
		struct request q;
		char why[192];
		int status = request_check(&ctx, req, &q, why, sizeof why);
		if (status) {
			reject(e, r, id, t_seen, status, "%s", why);
			continue;
		}
		struct exec_entry *en = entry_alloc(r);
		*en = (struct exec_entry){
			.in_use = 1,
			.ring = r,
			.model = q.model,
			.n_layers = q.n_layers,
			.request_id = id,
			.t_seen = t_seen,
			.bytes_in = q.bytes_in,
			.bytes_out = q.bytes_out,
			.rows = {
				.x = r->arena + q.input_offset,
				.m = q.rows,
				.dtype = q.dtype,
			},
		};
		for (uint32_t i = 0; i < q.n_layers; i++) {
			en->layers[i] = q.layers[i];
			en->ys[i] = (uint16_t *)(void *)(r->arena + q.output_offsets[i]);
		}
		en->rows.y = en->ys[0];
		sched_flow_push(&r->flow, &en->s, q.group, q.row_cost, q.rows);
	}
}

static int same_layers(const struct exec_entry *a, const struct exec_entry *b)
{
	return a->model == b->model && a->n_layers == b->n_layers &&
	       memcmp(a->layers, b->layers, a->n_layers * sizeof a->layers[0]) == 0;
}

/* The pieces v[0..n) of one launch ran (rc 0) or failed: posts the results
 * of the requests whose last piece this was (last[i], or NULL: as the
 * request stands now) or that failed, and rings their doorbells at once,
 * so a decode result does not wait for the prefill pieces after it. */
static void pieces_done(struct radiance_executor *e, struct sched_req **v, const uint8_t *last, size_t n,
			int rc, const char *err, uint64_t start, uint64_t end)
{
	for (size_t i = 0; i < n; i++) {
		struct exec_entry *en = entry_of(v[i]);
		if (!en->in_use)   /* its ring died meanwhile and dropped it */
			continue;
		if (!en->started) {
			en->started = 1;
			en->t_start = start;
		}
		/* a failed piece fails its request: it is answered now, and its
		 * later pieces never run (or, in flight already, fail as well:
		 * a device fault fails every later launch) */
		if (rc < 0 || (last ? last[i] : sched_req_last_piece(&en->s)))
			entry_finish(e, en, rc < 0 ? -rc : 0, err, end);
	}
	for (size_t i = 0; i < n; i++)
		ring_doorbell(entry_of(v[i])->ring);
	progress_bump(e);
}

/* Posts the results of the launches in flight that the device has
 * finished (bulk ones finish in order, and the others among themselves,
 * but a decode launch may overtake a prefill one), then closes the gaps.
 * Returns how many finished. */
static size_t reap(struct radiance_executor *e)
{
	size_t done = 0;
	int bulk_blocked = 0, decode_blocked = 0;
	for (size_t i = 0; i < e->pend_n && !(bulk_blocked && decode_blocked); i++) {
		struct exec_pending *p = &e->pend[i];
		if ((p->bulk ? bulk_blocked : decode_blocked))
			continue;
		char err[192] = "";
		int rc = radiance_backend_linear_done(e->backend, p->ticket, err, sizeof err);
		if (rc == 0) {
			/* the later ones of its kind are not done either */
			*(p->bulk ? &bulk_blocked : &decode_blocked) = 1;
			continue;
		}
		if (rc < 0)
			log_warn("a launch of %zu requests failed on the device: %s", p->n, err);
		pieces_done(e, e->pend_v + p->first, e->pend_last + p->first, p->n, rc < 0 ? rc : 0, err,
			    p->start, rclock_ns());
		p->done = 1;
		e->pend_decode -= !p->bulk;
		done++;
	}
	if (!done)
		return 0;
	/* keep the unfinished ones, in order, at the front */
	size_t n = 0, vn = 0;
	for (size_t i = 0; i < e->pend_n; i++) {
		struct exec_pending p = e->pend[i];
		if (p.done)
			continue;
		memmove(e->pend_v + vn, e->pend_v + p.first, p.n * sizeof *e->pend_v);
		memmove(e->pend_last + vn, e->pend_last + p.first, p.n);
		p.first = vn;
		vn += p.n;
		e->pend[n++] = p;
	}
	e->pend_n = n;
	e->pend_vn = vn;
	return done;
}

/* Waits for every launch in flight (a job is about to run). */
static void drain_pending(struct radiance_executor *e)
{
	while (e->pend_n)
		if (reap(e) == 0)
			rring_cpu_relax();
}

/* Runs the pieces v[0..live) (one model, the same layers, rows summing <=
 * max_rows) as one launch. A launch of one layer is queued on the device
 * when the backend can (results posted by reap); several layers, or a
 * backend without asynchronous launches, run here and are posted at once. */
static void launch_same(struct radiance_executor *e, struct sched_req **v, size_t live)
{
	struct exec_entry *first = entry_of(v[0]);
	struct exec_model *m = first->model;
	uint32_t nl = first->n_layers;
	/* nl >= 1 (request_check), which the compiler cannot see */
	const struct radiance_layer *ls[RADIANCE_MAX_REQUEST_LAYERS] = { 0 };
	struct radiance_backend_layer *hs[RADIANCE_MAX_REQUEST_LAYERS] = { 0 };
	for (uint32_t j = 0; j < nl; j++) {
		ls[j] = &m->model->layers[first->layers[j]];
		hs[j] = m->handles[first->layers[j]];
	}
	uint32_t k = ls[0]->k;
	char err[192] = "";
	/* e->rows[j * live + i]: request i's piece for layer j (x shared) */
	for (uint32_t j = 0; j < nl; j++)
		for (size_t i = 0; i < live; i++) {
			struct exec_entry *en = entry_of(v[i]);
			/* x and y are 16-bit elements, rows apart by K and N */
			e->rows[j * live + i] = (struct radiance_rows){
				.x = (const uint16_t *)en->rows.x + (size_t)en->s.piece_row * k,
				.y = en->ys[j] + (size_t)en->s.piece_row * ls[j]->n,
				.m = en->s.piece_rows,
				.dtype = en->rows.dtype,
				.bulk = sched_req_chunked(&e->sched, &en->s),
			};
		}
	uint64_t start = rclock_ns();
	e->launches++;
	int rc = -EOPNOTSUPP;
	if (nl == 1 && !e->sync_only) {
		uint64_t ticket = 0;
		rc = radiance_backend_linear_start(e->backend, ls[0], hs[0], e->rows, live, &ticket, err,
						   sizeof err);
		if (rc == 0) {
			stats_launch(e->opt.global_stats);
			struct exec_pending *p = &e->pend[e->pend_n++];
			*p = (struct exec_pending){ .ticket = ticket, .start = start, .first = e->pend_vn,
						    .n = live, .bulk = e->rows[0].bulk };
			e->pend_decode += !p->bulk;
			for (size_t i = 0; i < live; i++) {
				e->pend_v[e->pend_vn] = v[i];
				e->pend_last[e->pend_vn++] = (uint8_t)sched_req_last_piece(v[i]);
			}
			return;
		}
		if (rc == -EOPNOTSUPP)
			e->sync_only = 1;
	}
	if (rc == -EOPNOTSUPP) {
		/* a synchronous launch on the bulk stream must not overtake the
		 * launches still in flight that wrote rows it reads */
		drain_pending(e);
		rc = nl == 1 ? radiance_backend_linear(e->backend, ls[0], hs[0], e->rows, live, err,
						       sizeof err)
			     : radiance_backend_linear_multi(e->backend, ls, hs, nl, e->rows, live, err,
							     sizeof err);
	}
	uint64_t end = rclock_ns();
	stats_launch(e->opt.global_stats);
	if (rc < 0)
		log_warn("model %u layer %u (%s)%s: launch of %zu requests failed: %s", m->id,
			 first->layers[0], ls[0]->name, nl > 1 ? " and more" : "", live, err);
	pieces_done(e, v, NULL, live, rc, err, start, end);
}

/* The gather window (executor.h): while two or more sessions are busy and
 * some of them have nothing queued, wait up to gather_us for them, adding
 * the flows that fill to e->flows. */
static void gather(struct radiance_executor *e, size_t *nflows)
{
	uint64_t now = rclock_ns(), until = now + (uint64_t)e->opt.gather_us * 1000u;
	for (;;) {
		size_t busy = 0, waiting = 0;
		for (size_t i = 0; i < e->nrings; i++) {
			struct exec_ring *r = e->rings[i];
			if (r->dead || now - r->last_take_ns >= GATHER_RECENT_NS)
				continue;
			busy++;
			waiting += r->flow.n == 0;
		}
		if (busy < 2 || !waiting || now >= until)
			return;
		for (size_t i = 0; i < e->nrings; i++) {
			struct exec_ring *r = e->rings[i];
			if (r->dead || r->flow.n || now - r->last_take_ns >= GATHER_RECENT_NS)
				continue;
			collect_ring(e, r);
			if (r->dead)
				ring_drop_queue(r);
			else if (r->flow.n)
				e->flows[(*nflows)++] = &r->flow;
		}
		rring_cpu_relax();
		now = rclock_ns();
	}
}

/* Runs the pieces v[0..n) of one group (sched_launch_len), skipping rings
 * that died this round: one launch per run of requests for the same
 * layers (a group of several layers is a hash of the list: sched.c only
 * knows it is equal). */
static void launch(struct radiance_executor *e, struct sched_req **v, size_t n)
{
	size_t live = 0;
	for (size_t i = 0; i < n; i++)
		if (!entry_of(v[i])->ring->dead)
			v[live++] = v[i];
	for (size_t i = 0; i < live;) {
		size_t len = 1;
		while (i + len < live && same_layers(entry_of(v[i]), entry_of(v[i + len])))
			len++;
		launch_same(e, v + i, len);
		i += len;
	}
}

/* One round over every ring (or only one). Returns the requests taken plus
 * the pieces run: 0 when there was nothing to do. */
static size_t serve_pass(struct radiance_executor *e, struct exec_ring *only)
{
	size_t work = reap(e), nflows = 0, nr = only ? 1 : e->nrings;
	for (size_t i = 0; i < nr; i++) {
		struct exec_ring *r = only ? only : e->rings[(e->rr + i) % e->nrings];
		if (!r->dead) {
			uint32_t before = r->sq.local;
			collect_ring(e, r);
			work += r->sq.local - before;
		}
		if (r->dead)
			ring_drop_queue(r);
		else if (r->flow.n)
			e->flows[nflows++] = &r->flow;
	}
	if (!only)
		e->rr = e->nrings ? (e->rr + 1) % e->nrings : 0;
	/* a decode launch in flight: what came in waits in its flow and
	 * merges into the next round's launches. Prefill pieces in flight do
	 * not hold a round back: its decode launches overtake them on the
	 * device (backend.h), and its prefill pieces queue behind them. At
	 * most two rounds' worth of pieces are in flight. */
	size_t n = 0;
	if (e->pend_decode || e->pend_vn > e->pend_cap / 2 || e->pend_n > e->pend_cap / 2)
		goto doorbells;
	if (!only && e->opt.gather_us && nflows)
		gather(e, &nflows);
	n = sched_round(&e->sched, e->flows, nflows, e->batch);
	for (size_t i = 0; i < n;) {
		size_t len = sched_launch_len(&e->sched, e->batch, n, i);
		launch(e, e->batch + i, len);
		i += len;
	}
	work += n;
	/* what finished already (every launch of the cpu backend) is posted now */
	reap(e);
doorbells:
	/* results of refused requests */
	if (only)
		ring_doorbell(only);
	else
		for (size_t i = 0; i < e->nrings; i++)
			ring_doorbell(e->rings[i]);
	return work;
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
static int ring_pin(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen)
{
	uint64_t t0 = rclock_ns();
	int rc = radiance_backend_register_host(e->backend, r->arena, r->arena_bytes, err, errlen);
	pin_log(r, rc < 0 ? "failing to register" : "registering", t0, rclock_ns());
	return rc;
}

static void ring_unpin(struct radiance_executor *e, struct exec_ring *r)
{
	uint64_t t0 = rclock_ns();
	radiance_backend_unregister_host(e->backend, r->arena);
	pin_log(r, "unregistering", t0, rclock_ns());
}

/* libuv worker thread */
static void pin_work(uv_work_t *w)
{
	struct exec_pin *p = w->data;
	if (p->unpin)
		ring_unpin(p->e, p->ring);
	else
		p->status = ring_pin(p->e, p->ring, p->err, sizeof p->err);
}

static void pin_after(uv_work_t *w, int status)
{
	struct exec_pin *p = w->data;
	if (status == UV_ECANCELED)
		p->status = -ECANCELED;
	p->done(p);
}

static int pin_queue(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r, int unpin,
		     void (*done)(struct exec_pin *), void *user)
{
	*p = (struct exec_pin){ .e = e, .ring = r, .unpin = unpin, .done = done, .user = user };
	p->work.data = p;
	return uv_queue_work(e->loop, &p->work, pin_work, pin_after);
}

int executor_pin(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r,
		 void (*done)(struct exec_pin *), void *user)
{
	return pin_queue(e, p, r, 0, done, user);
}

int executor_pin_cancel(struct exec_pin *p)
{
	return uv_cancel((uv_req_t *)&p->work) == 0 ? 0 : -EBUSY;
}

void executor_unpin(struct radiance_executor *e, struct exec_pin *p, struct exec_ring *r,
		    void (*done)(struct exec_pin *), void *user)
{
	int rc = pin_queue(e, p, r, 1, done, user);
	if (rc < 0) {
		log_warn("session %llu: cannot hand the arena's unregistration to a worker (%s): "
			 "unregistering it on the loop thread", (unsigned long long)r->session_id,
			 uv_strerror(rc));
		ring_unpin(e, r);
		done(p);
	}
}

/* Starts serving r, whose arena is pinned: 0, or -errno with err set. */
static int ring_attach(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen)
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
static void ring_detach(struct radiance_executor *e, size_t i)
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

/* Uploads one layer of the oldest UPLOAD job; finishes the job when done.
 * One layer per step keeps other sessions served while a model loads. */
static void upload_step(struct radiance_executor *e)
{
	struct exec_job *job = e->uploading;
	struct exec_model *m = job->model;
	char err[200];
	if (m->uploaded == 0 && !m->share) {
		/* one exportable allocation for the whole model, before its first layer */
		int rc = radiance_backend_share_create(e->backend, m->model, &m->share, err, sizeof err);
		if (rc < 0) {
			job->status = rc;
			snprintf(job->err, sizeof job->err, "allocating the model: %s", err);
			e->uploading = job->next;
			post_done(e, job);
			return;
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
				return;
		}
	}
	e->uploading = job->next;
	post_done(e, job);
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
static size_t run_jobs(struct radiance_executor *e, uint64_t budget_ns)
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

/* ---- the thread ---- */

static void idle_sleep(struct radiance_executor *e)
{
	size_t slept = 0;
	int wake = 0;
	for (; slept < e->nrings; slept++) {
		struct exec_ring *r = e->rings[slept];
		if (r->dead)
			continue;
		if (!rring_prepare_sleep(&r->sq)) {
			wake = 1;
			break;
		}
	}
	if (!wake && !e->backlog.head && !atomic_load(&e->jobs_pending) && !atomic_load(&e->stop)) {
		struct epoll_event evs[16];
		atomic_store(&e->idle, 1);
		int n = epoll_wait(e->epfd, evs, 16, -1);
		atomic_store(&e->idle, 0);
		for (int i = 0; i < n; i++)
			if (!evs[i].data.ptr)
				rdoorbell_drain(e->ctl_efd);
	}
	for (size_t i = 0; i < slept && i < e->nrings; i++)
		rring_end_sleep(&e->rings[i]->sq);
}

/* Creates the backend on the calling thread (the one that will use it)
 * and settles what depends on it. */
static int backend_start(struct radiance_executor *e, char *err, size_t errlen)
{
	int rc = radiance_backend_create(&e->opt.backend, &e->backend, err, errlen);
	if (rc < 0)
		return rc;
	radiance_backend_info(e->backend, &e->info);
	/* before anyone reads it: the piece size the backend serves best */
	if (e->opt.chunk_rows == EXEC_CHUNK_AUTO) {
		uint32_t c = strcmp(e->info.name, "cpu") == 0 ? 32 : 256;
		e->sched.chunk_rows = c < e->sched.max_rows ? c : e->sched.max_rows;
	}
	return 0;
}

static void *executor_main(void *arg)
{
	struct radiance_executor *e = arg;
	char err[256] = "";
	int rc = backend_start(e, err, sizeof err);
	pthread_mutex_lock(&e->lock);
	e->started = rc == 0 ? 1 : rc;
	snprintf(e->start_err, sizeof e->start_err, "%s", err);
	pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		return NULL;

	uint64_t spin_ns = (uint64_t)e->opt.spin_us * 1000u;
	/* the 20 us sleeps while a launch runs should be 20 us, not 70 */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	uint64_t last_work = rclock_ns();
	while (!atomic_load(&e->stop)) {
		size_t n = run_jobs(e, JOB_BUDGET_NS);
		n += serve_pass(e, NULL);
		if (e->uploading) {
			upload_step(e);
			n++;
		}
		progress_bump(e);
		uint64_t t = rclock_ns();
		if (n) {
			last_work = t;
			continue;
		}
		if (e->pend_n) {
			/* a launch in flight: poll its completion word, spinning
			 * at first, then in short sleeps (a long prefill piece
			 * need not hold a core) */
			if (t - last_work < spin_ns)
				rring_cpu_relax();
			else
				nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
			continue;
		}
		if (t - last_work < spin_ns) {
			rring_cpu_relax();
			continue;
		}
		idle_sleep(e);
		last_work = rclock_ns();
	}
	while (run_jobs(e, UINT64_MAX))
		;
	radiance_backend_destroy(e->backend);
	e->backend = NULL;
	return NULL;
}

/* What executor_alloc sized by the options. */
static void executor_free_arrays(struct radiance_executor *e)
{
	free(e->rings);
	free(e->flows);
	free(e->batch);
	free(e->rows);
	free(e->pend);
	free(e->pend_v);
	free(e->pend_last);
}

/* Releases what executor_create made once the thread is gone, all but the
 * async handle, which frees e when libuv lets go of it. */
static void executor_release(struct radiance_executor *e)
{
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	close(e->ctl_efd);
	close(e->epfd);
	executor_free_arrays(e);
}

static void executor_free(struct radiance_executor *e)
{
	executor_free_arrays(e);
	free(e);
}

/* e with everything a round needs, sized by opt; no thread, fds or backend
 * yet. NULL when out of memory. */
static struct radiance_executor *executor_alloc(const struct executor_options *opt)
{
	struct radiance_executor *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->opt = *opt;
	e->ctl_efd = e->epfd = -1;
	e->sched = (struct sched_params){
		.chunk_rows = opt->chunk_rows && opt->chunk_rows != EXEC_CHUNK_AUTO ? opt->chunk_rows
									    : opt->backend.max_rows,
		.session_rows = opt->session_rows ? opt->session_rows : opt->backend.max_rows,
		.max_rows = opt->backend.max_rows,
	};
	e->rings = calloc(opt->max_rings, sizeof *e->rings);
	e->flows = calloc(opt->max_rings, sizeof *e->flows);
	e->batch = calloc((size_t)opt->max_rings * EXEC_BATCH, sizeof *e->batch);
	/* a launch of several layers takes one row set per layer */
	e->rows = calloc((size_t)opt->backend.max_rows * RADIANCE_MAX_REQUEST_LAYERS, sizeof *e->rows);
	/* the asynchronous launches in flight, and their pieces */
	e->pend_cap = (size_t)2 * opt->max_rings * EXEC_BATCH;
	e->pend = calloc(e->pend_cap, sizeof *e->pend);
	e->pend_v = calloc(e->pend_cap, sizeof *e->pend_v);
	e->pend_last = calloc(e->pend_cap, 1);
	if (!e->rings || !e->flows || !e->batch || !e->rows || !e->pend || !e->pend_v ||
	    !e->pend_last) {
		executor_free(e);
		return NULL;
	}
	return e;
}

int executor_create(uv_loop_t *loop, const struct executor_options *opt,
		    struct radiance_executor **out, char *err, size_t errlen)
{
	struct radiance_executor *e = executor_alloc(opt);
	int rc = -ENOMEM;
	if (!e)
		goto fail;
	e->loop = loop;
	e->ctl_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	e->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (e->ctl_efd < 0 || e->epfd < 0) {
		rc = -errno;
		snprintf(err, errlen, "executor: eventfd/epoll: %s", strerror(errno));
		goto fail_fds;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->ctl_efd, &ev);
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	rc = uv_async_init(loop, &e->async, on_async);
	if (rc < 0) {
		snprintf(err, errlen, "executor: uv_async_init: %s", uv_strerror(rc));
		goto fail_sync;
	}
	e->async.data = e;
	rc = -pthread_create(&e->thread, NULL, executor_main, e);
	if (rc < 0) {
		snprintf(err, errlen, "executor: pthread_create: %s", strerror(-rc));
		goto fail_async;
	}
	pthread_mutex_lock(&e->lock);
	while (!e->started)
		pthread_cond_wait(&e->cond, &e->lock);
	pthread_mutex_unlock(&e->lock);
	if (e->started < 0) {
		rc = e->started;
		snprintf(err, errlen, "%s", e->start_err);
		pthread_join(e->thread, NULL);
		goto fail_async;
	}
	pthread_setname_np(e->thread, "radiance-exec");
	*out = e;
	return 0;

fail_async:
	executor_release(e);
	/* the handle is part of e: e is freed once libuv lets go of it */
	e->async.data = e;
	uv_close((uv_handle_t *)&e->async, on_async_closed);
	return rc;
fail_sync:
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
fail_fds:
	if (e->ctl_efd >= 0)
		close(e->ctl_efd);
	if (e->epfd >= 0)
		close(e->epfd);
	executor_free(e);
fail:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "executor: out of memory");
	return rc;
}

const struct radiance_backend_info *executor_backend_info(const struct radiance_executor *e)
{
	return &e->info;
}

void executor_liveness(struct radiance_executor *e, struct exec_liveness *out)
{
	out->progress = atomic_load_explicit(&e->progress, memory_order_relaxed);
	/* asleep with a job queued is a wakeup lost, not idleness */
	out->idle = atomic_load(&e->idle) && !atomic_load(&e->jobs_pending);
}

int exec_watch_alive(struct exec_watch *w, const struct exec_liveness *l, uint64_t now_ns,
		     uint64_t timeout_ns)
{
	if (!w->started || l->progress != w->progress || l->idle) {
		w->started = 1;
		w->progress = l->progress;
		w->seen_ns = now_ns;
		return 1;
	}
	return now_ns - w->seen_ns < timeout_ns;
}

void executor_destroy(struct radiance_executor *e)
{
	atomic_store(&e->stop, 1);
	rdoorbell_ring(e->ctl_efd);
	pthread_join(e->thread, NULL);
	/* jobs finished in the last run_jobs still want their done callbacks */
	on_async(&e->async);
	executor_release(e);
	uv_close((uv_handle_t *)&e->async, on_async_closed);
}

/* ---- inline mode ---- */

int executor__create_inline(const struct executor_options *opt, struct radiance_executor **out,
			    char *err, size_t errlen)
{
	struct radiance_executor *e = executor_alloc(opt);
	if (!e) {
		snprintf(err, errlen, "executor: out of memory");
		return -ENOMEM;
	}
	e->is_inline = 1;
	pthread_mutex_init(&e->lock, NULL);
	int rc = backend_start(e, err, errlen);
	if (rc < 0) {
		pthread_mutex_destroy(&e->lock);
		executor_free(e);
		return rc;
	}
	*out = e;
	return 0;
}

void executor__destroy_inline(struct radiance_executor *e)
{
	while (e->nrings) {
		struct exec_ring *r = e->rings[e->nrings - 1];
		ring_detach(e, e->nrings - 1);
		ring_unpin(e, r);
	}
	radiance_backend_destroy(e->backend);
	pthread_mutex_destroy(&e->lock);
	executor_free(e);
}

int executor__ring_add(struct radiance_executor *e, struct exec_ring *r, char *err, size_t errlen)
{
	int rc = ring_pin(e, r, err, errlen);
	if (rc < 0)
		return rc;
	rc = ring_attach(e, r, err, errlen);
	if (rc < 0)
		ring_unpin(e, r);
	return rc;
}

int executor__ring_remove(struct radiance_executor *e, struct exec_ring *r)
{
	for (size_t i = 0; i < e->nrings; i++)
		if (e->rings[i] == r) {
			ring_detach(e, i);
			ring_unpin(e, r);
			return 0;
		}
	return -ENOENT;
}

size_t executor__serve(struct radiance_executor *e)
{
	return serve_pass(e, NULL);
}

struct exec_job *executor__take_done(struct radiance_executor *e)
{
	return job_list_take(&e->done);
}

uint64_t executor__launches(const struct radiance_executor *e)
{
	return e->launches;
}

const struct sched_params *executor__sched(const struct radiance_executor *e)
{
	return &e->sched;
}

struct radiance_backend *executor__backend(struct radiance_executor *e)
{
	return e->backend;
}
