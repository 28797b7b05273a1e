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
#include "exec_private.h"
#include "proto_util.h"
#include "request.h"
#include "thread.h"

/* How long a decode launch in flight is polled spinning (executor_main);
 * the longest decode launch on the 27B shapes (M=64 on 34816x5120) takes
 * about 0.3 ms on the H200. */
#define EXEC_DECODE_SPIN_NS 2000000u

/* A round (jobs, a pass over the rings, an upload step) of an asynchronous
 * backend that took longer than this is logged (executor_main). */
#define EXEC_ROUND_SLOW_NS 10000000u

/* A session counts as busy for the gather window this long after its SQ
 * last gave a request. */
#define GATHER_RECENT_NS 2000000u
/* How often the idle executor looks at an SQ whose requests wait for CQ
 * room (idle_sleep): the extra wait, after it reaps, of a client that
 * submitted past its CQ space. A wake-up costs about spin_us (50 us) of a
 * core, 0.5% at 10 ms. */
#define EXEC_CQ_RECHECK_MS 10

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
void ring_drop_queue(struct exec_ring *r)
{
	for (size_t i = 0; i < EXEC_BATCH; i++)
		r->entries[i].in_use = 0;
	sched_flow_clear(&r->flow);
}

/* Posts en's one result (all its pieces ran, or it failed): the client
 * can see it from here on. */
void entry_post(struct radiance_executor *e, struct exec_entry *en, int status, const char *error,
		uint64_t end)
{
	uint64_t start = en->started ? en->t_start : end;
	post_result(e, en->ring, en->request_id, status, error, start - en->t_seen, end - start);
}

/* Counts en's posted result in the session's and the global stats and frees its slot. */
void entry_account(struct radiance_executor *e, struct exec_entry *en, int status, uint64_t end)
{
	struct exec_ring *r = en->ring;
	stats_record(r->stats, en->rows.m, en->bytes_in, en->bytes_out, end - en->t_seen, status);
	stats_record(e->opt.global_stats, en->rows.m, en->bytes_in, en->bytes_out, end - en->t_seen,
		     status);
	entry_release(r, en);
}

void entry_finish(struct radiance_executor *e, struct exec_entry *en, int status,
			 const char *error, uint64_t end)
{
	entry_post(e, en, status, error, end);
	entry_account(e, en, status, end);
}

/* One non-blocking write to our own end of the session's pipe: the client
 * holds only the read end, a different open file description, so nothing
 * it does can make this block. A full pipe (never drained) answers EAGAIN,
 * and a wakeup is pending anyway; a closed read end gives EPIPE (SIGPIPE is
 * ignored). */
void ring_doorbell(struct exec_ring *r)
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
		/* decided on a private copy, consumed only once the flow takes
		 * it: a request that would take the session above its rows in
		 * flight stays in the SQ until completions make room */
		int len = rring_peek(&r->sq, slot);
		if (len == 0)
			break;
		if (len < 0) {
			sq_violation(e, r);
			return;
		}
		Rdw__LinearRequest *req;
		if (request_decode(slot, (size_t)len, &e->bump, &req) < 0) {
			ring_violation(e, r, "SQ entry %u is not a LinearRequest (%d bytes)",
				       r->sq.local, len);
			return;
		}
		if (!sched_flow_can_take_rows(&e->sched, &r->flow, req->rows))
			break;
		rring_consume(&r->sq);
		uint64_t t_seen = rclock_ns();
		r->last_take_ns = t_seen;
		taken++;
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
size_t serve_pass(struct radiance_executor *e, struct exec_ring *only)
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
	n = sched_round(&e->sched, e->flows, nflows, e->batch, e->flow_scratch);
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

/* ---- the thread ---- */

/* Whether r's SQ entries wait only for CQ room: every CQ slot is taken by a
 * result the client has not reaped or by a request queued in the flow
 * (collect_ring takes nothing then). Only a client that breaks shm.h's
 * rule (at most cq_entries in flight) gets here; a corrupted head is not
 * this (collect_ring reports it). */
static int ring_waits_for_cq(struct exec_ring *r)
{
	int space = rring_space(&r->cq);
	return space >= 0 && (uint32_t)space <= r->flow.n;
}

static void idle_sleep(struct radiance_executor *e)
{
	size_t slept = 0;
	int wake = 0, cq_wait = 0;
	for (; slept < e->nrings; slept++) {
		struct exec_ring *r = e->rings[slept];
		if (r->dead)
			continue;
		if (!rring_prepare_sleep(&r->sq)) {
			/* an SQ that waits for its CQ is no work: looping on it
			 * would spend a core for as long as the client does not
			 * reap, and reaping rings no doorbell, so look again in
			 * EXEC_CQ_RECHECK_MS */
			if (ring_waits_for_cq(r)) {
				cq_wait = 1;
				continue;
			}
			wake = 1;
			break;
		}
	}
	if (!wake && !e->backlog.head && !atomic_load(&e->jobs_pending) && !atomic_load(&e->stop)) {
		struct epoll_event evs[16];
		atomic_store(&e->idle, 1);
		int n = epoll_wait(e->epfd, evs, 16, cq_wait ? EXEC_CQ_RECHECK_MS : -1);
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
		const uint64_t t0 = rclock_ns();
		e->round_sync_ns = 0;
		size_t n = run_jobs(e, JOB_BUDGET_NS);
		const uint64_t t1 = rclock_ns();
		n += serve_pass(e, NULL);
		const uint64_t t2 = rclock_ns();
		if (e->uploading && upload_step(e)) {
			const uint64_t took = rclock_ns() - t2;
			if (took > EXEC_QUEUE_SLOW_NS)
				log_warn("executor: one step of a model upload took %.3f ms (allocating the model "
					 "%.3f ms of it); every session waited for it", took / 1e6,
					 e->upload_alloc_ns / 1e6);
			n++;
		}
		progress_bump(e);
		uint64_t t = rclock_ns();
		/* a round of a backend that queues (a GPU) takes microseconds besides
		 * the launches it ran synchronously (several layers in one
		 * request); one that took long kept every session's new requests
		 * unseen */
		if (e->info.queues && !e->sync_only && t - t0 - e->round_sync_ns > EXEC_ROUND_SLOW_NS) {
			log_warn("executor: a round took %.3f ms (jobs %.3f, requests %.3f); "
				 "no session's new requests were seen meanwhile",
				 (t - t0) / 1e6, (t1 - t0) / 1e6, (t2 - t1) / 1e6);
		}
		if (n) {
			last_work = t;
			continue;
		}
		if (e->pend_n) {
			/* a launch in flight: poll its completion word. A decode
			 * launch (tens of microseconds; its client spins for the
			 * result) is polled spinning, up to EXEC_DECODE_SPIN_NS:
			 * a 20 us sleep would add up to that to every decode
			 * result. Prefill pieces alone: spinning at first, then
			 * in short sleeps (a long piece need not hold a core). */
			if (t - last_work < (e->pend_decode ? EXEC_DECODE_SPIN_NS : spin_ns))
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
	free(e->flow_scratch);
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
	if (e->pin_running) {
		pthread_cond_destroy(&e->pin_cond);
		pthread_mutex_destroy(&e->pin_lock);
		e->pin_running = 0;
	}
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
	e->opt.backend.pin_pace = executor_pin_pace;
	e->opt.backend.pin_pace_arg = e;
	e->ctl_efd = e->epfd = -1;
	e->sched = (struct sched_params){
		.chunk_rows = opt->chunk_rows && opt->chunk_rows != EXEC_CHUNK_AUTO ? opt->chunk_rows
									    : opt->backend.max_rows,
		.session_rows = opt->session_rows ? opt->session_rows : opt->backend.max_rows,
		.max_rows = opt->backend.max_rows,
	};
	e->rings = calloc(opt->max_rings, sizeof *e->rings);
	e->flows = calloc(opt->max_rings, sizeof *e->flows);
	e->flow_scratch = calloc(opt->max_rings, sizeof *e->flow_scratch);
	e->batch = calloc((size_t)opt->max_rings * EXEC_BATCH, sizeof *e->batch);
	/* a launch of several layers takes one row set per layer */
	e->rows = calloc((size_t)opt->backend.max_rows * RADIANCE_MAX_REQUEST_LAYERS, sizeof *e->rows);
	/* the asynchronous launches in flight, and their pieces */
	e->pend_cap = (size_t)2 * opt->max_rings * EXEC_BATCH;
	e->pend = calloc(e->pend_cap, sizeof *e->pend);
	e->pend_v = calloc(e->pend_cap, sizeof *e->pend_v);
	e->pend_last = calloc(e->pend_cap, 1);
	if (!e->rings || !e->flows || !e->flow_scratch || !e->batch || !e->rows || !e->pend ||
	    !e->pend_v || !e->pend_last) {
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
	rc = -rthread_create(&e->thread, executor_main, e);
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
	rc = pin_thread_start(e);
	if (rc < 0) {
		snprintf(err, errlen, "executor: pthread_create (pin thread): %s", strerror(-rc));
		atomic_store(&e->stop, 1);
		rdoorbell_ring(e->ctl_efd);
		pthread_join(e->thread, NULL);
		goto fail_async;
	}
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
	/* what the pin thread has queued runs first, while the backend is
	 * there: an arena still registered must not be unmapped */
	pin_thread_stop(e);
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
