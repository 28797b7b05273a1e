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
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "proto_util.h"

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
	struct rproto_bump bump;   /* SQ slots unpack here, off malloc */
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

/* ---- decode and validate ---- */

/* Range [off, off + rows*dim*2) inside the arena, with every product and sum
 * overflow-checked; the byte count in *bytes. */
static int arena_range(const struct exec_ring *r, uint64_t off, uint32_t rows, uint32_t dim,
		       uint64_t *bytes)
{
	uint64_t n, end;
	if (__builtin_mul_overflow((uint64_t)rows, (uint64_t)dim, &n) ||
	    __builtin_mul_overflow(n, (uint64_t)2, &n) || __builtin_add_overflow(off, n, &end) ||
	    end > r->arena_bytes)
		return -EFAULT;
	*bytes = n;
	return 0;
}

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
	ProtobufCAllocator alloc = rproto_bump_allocator(&e->bump);

	while (taken < budget && sched_flow_can_take(&e->sched, &r->flow)) {
		int len = rring_pop(&r->sq, slot);
		if (len == 0)
			break;
		if (len < 0) {
			sq_violation(e, r);
			return;
		}
		uint64_t t_seen = rclock_ns();
		taken++;
		rproto_bump_reset(&e->bump);
		Rdw__LinearRequest *req =
			rdw__linear_request__unpack(&alloc, (size_t)len, slot);
		if (!req) {
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
		struct exec_model *m = exec_refs_find(r->refs, req->model_id);
		if (!m) {
			reject(e, r, id, t_seen, ENOENT, "model_id %u is not loaded by this session",
			       req->model_id);
			continue;
		}
		if (req->layer >= m->model->n_layers) {
			reject(e, r, id, t_seen, ENOENT, "layer %u out of range: model %u has %zu layers",
			       req->layer, m->id, m->model->n_layers);
			continue;
		}
		const struct radiance_layer *l = &m->model->layers[req->layer];
		if (req->rows == 0 || req->rows > e->opt.backend.max_rows) {
			reject(e, r, id, t_seen, EINVAL, "rows %u outside 1..%u", req->rows,
			       e->opt.backend.max_rows);
			continue;
		}
		if (req->dtype != RDW__DTYPE__DTYPE_BF16 && req->dtype != RDW__DTYPE__DTYPE_FP16) {
			reject(e, r, id, t_seen, EINVAL, "dtype %d is not bf16 (1) or fp16 (2)",
			       (int)req->dtype);
			continue;
		}
		if (req->input_offset % RADIANCE_ARENA_ALIGN || req->output_offset % RADIANCE_ARENA_ALIGN) {
			reject(e, r, id, t_seen, EINVAL,
			       "input_offset %llu / output_offset %llu not %u-byte aligned",
			       (unsigned long long)req->input_offset,
			       (unsigned long long)req->output_offset, RADIANCE_ARENA_ALIGN);
			continue;
		}
		uint64_t in_bytes, out_bytes;
		if (arena_range(r, req->input_offset, req->rows, l->k, &in_bytes) < 0) {
			reject(e, r, id, t_seen, EFAULT,
			       "input [%llu, +%u rows x K=%u x 2) outside the arena of %llu bytes",
			       (unsigned long long)req->input_offset, req->rows, l->k,
			       (unsigned long long)r->arena_bytes);
			continue;
		}
		if (arena_range(r, req->output_offset, req->rows, l->n, &out_bytes) < 0) {
			reject(e, r, id, t_seen, EFAULT,
			       "output [%llu, +%u rows x N=%u x 2) outside the arena of %llu bytes",
			       (unsigned long long)req->output_offset, req->rows, l->n,
			       (unsigned long long)r->arena_bytes);
			continue;
		}
		if (req->input_offset < req->output_offset + out_bytes &&
		    req->output_offset < req->input_offset + in_bytes) {
			reject(e, r, id, t_seen, EINVAL, "input and output ranges overlap");
			continue;
		}
		struct exec_entry *en = entry_alloc(r);
		*en = (struct exec_entry){
			.in_use = 1,
			.ring = r,
			.model = m,
			.layer = req->layer,
			.request_id = id,
			.t_seen = t_seen,
			.bytes_in = in_bytes,
			.bytes_out = out_bytes,
			.rows = {
				.x = r->arena + req->input_offset,
				.y = (uint16_t *)(void *)(r->arena + req->output_offset),
				.m = req->rows,
				.dtype = (enum radiance_dtype)req->dtype,
			},
		};
		sched_flow_push(&r->flow, &en->s, (uint64_t)m->id << 32 | req->layer,
				(uint64_t)l->n * l->k, req->rows);
	}
}

/* Runs the pieces v[0..n) (one model, one layer, rows summing <= max_rows;
 * sched_launch_len) as one launch, posts the results of the requests whose
 * last piece this was (or that failed), and rings their doorbells at once,
 * so a decode result does not wait for the prefill pieces after it. */
static void launch(struct radiance_executor *e, struct sched_req **v, size_t n)
{
	size_t live = 0;
	for (size_t i = 0; i < n; i++)   /* skipping rings that died this round */
		if (!entry_of(v[i])->ring->dead)
			v[live++] = v[i];
	if (!live)
		return;
	struct exec_entry *first = entry_of(v[0]);
	struct exec_model *m = first->model;
	const struct radiance_layer *l = &m->model->layers[first->layer];
	char err[192] = "";
	for (size_t i = 0; i < live; i++) {
		struct exec_entry *en = entry_of(v[i]);
		/* x and y are 16-bit elements, rows apart by K and N */
		e->rows[i] = (struct radiance_rows){
			.x = (const uint16_t *)en->rows.x + (size_t)en->s.piece_row * l->k,
			.y = en->rows.y + (size_t)en->s.piece_row * l->n,
			.m = en->s.piece_rows,
			.dtype = en->rows.dtype,
		};
	}
	uint64_t start = rclock_ns();
	int rc = radiance_backend_linear(e->backend, l, m->handles[first->layer], e->rows, live, err,
					 sizeof err);
	uint64_t end = rclock_ns();
	if (rc < 0)
		log_warn("model %u layer %u (%s): launch of %zu requests failed: %s", m->id,
			 first->layer, l->name, live, err);
	for (size_t i = 0; i < live; i++) {
		struct exec_entry *en = entry_of(v[i]);
		if (!en->started) {
			en->started = 1;
			en->t_start = start;
		}
		/* a failed piece fails its request: it is answered now, and its
		 * later pieces never run */
		if (rc < 0 || sched_req_last_piece(&en->s))
			entry_finish(e, en, rc < 0 ? -rc : 0, err, end);
	}
	for (size_t i = 0; i < live; i++)
		ring_doorbell(entry_of(v[i])->ring);
	progress_bump(e);
}

/* One round over every ring (or only one). Returns the requests taken plus
 * the pieces run: 0 when there was nothing to do. */
static size_t serve_pass(struct radiance_executor *e, struct exec_ring *only)
{
	size_t work = 0, nflows = 0, nr = only ? 1 : e->nrings;
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
	size_t n = sched_round(&e->sched, e->flows, nflows, e->batch);
	for (size_t i = 0; i < n;) {
		size_t len = sched_launch_len(&e->sched, e->batch, n, i);
		launch(e, e->batch + i, len);
		i += len;
	}
	work += n;
	/* results of refused requests */
	if (only)
		ring_doorbell(only);
	else
		for (size_t i = 0; i < e->nrings; i++)
			ring_doorbell(e->rings[i]);
	return work;
}

/* ---- jobs ---- */

static void ring_add(struct radiance_executor *e, struct exec_job *job)
{
	struct exec_ring *r = job->ring;
	if (e->nrings == e->opt.max_rings) {
		job->status = -EBUSY;
		snprintf(job->err, sizeof job->err, "executor serves %u rings already", e->opt.max_rings);
		return;
	}
	int rc = radiance_backend_register_host(e->backend, r->arena, r->arena_bytes, job->err,
						sizeof job->err);
	if (rc < 0) {
		job->status = rc;
		return;
	}
	/* Edge-triggered, and never read: the client holds the same open file
	 * description and could make it blocking (O_NONBLOCK is shared) and
	 * then steal the count, which would hang a read here. An eventfd write
	 * wakes an edge-triggered epoll every time, so nothing is lost. */
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = r };
	if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, r->sq_efd, &ev) < 0) {
		job->status = -errno;
		snprintf(job->err, sizeof job->err, "epoll_ctl: %s", strerror(errno));
		radiance_backend_unregister_host(e->backend, r->arena);
		return;
	}
	e->rings[e->nrings++] = r;
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
		if (serve_pass(e, r) == 0)
			break;
	ring_drop_queue(r);
	epoll_ctl(e->epfd, EPOLL_CTL_DEL, r->sq_efd, NULL);
	radiance_backend_unregister_host(e->backend, r->arena);
	e->rings[i] = e->rings[--e->nrings];
	e->rr = 0;
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

static void run_jobs(struct radiance_executor *e)
{
	if (!atomic_load(&e->jobs_pending))
		return;
	pthread_mutex_lock(&e->lock);
	struct exec_job *job = job_list_take(&e->jobs);
	atomic_store(&e->jobs_pending, 0);
	pthread_mutex_unlock(&e->lock);
	while (job) {
		struct exec_job *next = job->next;
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
			job = next;
			continue;   /* done later, by upload_step */
		}
		case EXEC_JOB_MODEL_FREE:
			model_free(e, job->model);
			break;
		case EXEC_JOB_PING:
		case EXEC_JOB_NOTICE:
			break;
		}
		post_done(e, job);
		progress_bump(e);
		job = next;
	}
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
	if (!wake && !atomic_load(&e->jobs_pending) && !atomic_load(&e->stop)) {
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

static void *executor_main(void *arg)
{
	struct radiance_executor *e = arg;
	char err[256] = "";
	int rc = radiance_backend_create(&e->opt.backend, &e->backend, err, sizeof err);
	pthread_mutex_lock(&e->lock);
	if (rc == 0)
		radiance_backend_info(e->backend, &e->info);
	/* before the loop reads it: the piece size the backend serves best */
	if (rc == 0 && e->opt.chunk_rows == EXEC_CHUNK_AUTO) {
		uint32_t c = strcmp(e->info.name, "cpu") == 0 ? 32 : 256;
		e->sched.chunk_rows = c < e->sched.max_rows ? c : e->sched.max_rows;
	}
	e->started = rc == 0 ? 1 : rc;
	snprintf(e->start_err, sizeof e->start_err, "%s", err);
	pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		return NULL;

	uint64_t spin_ns = (uint64_t)e->opt.spin_us * 1000u;
	uint64_t last_work = rclock_ns();
	while (!atomic_load(&e->stop)) {
		run_jobs(e);
		size_t n = serve_pass(e, NULL);
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
		if (t - last_work < spin_ns) {
			rring_cpu_relax();
			continue;
		}
		idle_sleep(e);
		last_work = rclock_ns();
	}
	run_jobs(e);
	radiance_backend_destroy(e->backend);
	e->backend = NULL;
	return NULL;
}

/* Releases what executor_create made once the thread is gone, all but the
 * async handle, which frees e when libuv lets go of it. */
static void executor_release(struct radiance_executor *e)
{
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	close(e->ctl_efd);
	close(e->epfd);
	free(e->rings);
	free(e->flows);
	free(e->batch);
	free(e->rows);
}

int executor_create(uv_loop_t *loop, const struct executor_options *opt,
		    struct radiance_executor **out, char *err, size_t errlen)
{
	struct radiance_executor *e = calloc(1, sizeof *e);
	int rc = -ENOMEM;
	if (!e)
		goto fail;
	e->loop = loop;
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
	e->rows = calloc(opt->backend.max_rows, sizeof *e->rows);
	if (!e->rings || !e->flows || !e->batch || !e->rows)
		goto fail_alloc;
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
fail_alloc:
	free(e->rings);
	free(e->flows);
	free(e->batch);
	free(e->rows);
	free(e);
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
