/* The executor's launches: one group of pieces queued on the device or
 * run at once, and the bookkeeping of those in flight until the device is
 * done with them (executor.h, Asynchronous launches). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "exec_private.h"
#include "log.h"

/* The pieces v[0..n) of one launch ran (rc 0) or failed: posts the results
 * of the requests whose last piece this was (last[i], or NULL: as the
 * request stands now) or that failed, and rings their doorbells at once,
 * so a decode result does not wait for the prefill pieces after it. Every
 * result is posted before any is counted in the stats and its slot freed:
 * clients of a merged launch spin on their CQs, and the last one's result
 * no longer waits for the others' bookkeeping (H200, 8 lockstep clients:
 * docs/daemon.md "Service benchmark"). */
/* Does piece i of a launch that ended with rc finish its request? A failed
 * piece fails its request: it is answered now, and its later pieces never
 * run (or, in flight already, fail as well: a device fault fails every
 * later launch). */
static int piece_finishes(const uint8_t *last, size_t i, int rc, const struct exec_entry *en)
{
	return rc < 0 || (last ? last[i] : sched_req_last_piece(&en->s));
}

static void pieces_done(struct radiance_executor *e, struct sched_req **v, const uint8_t *last, size_t n,
			int rc, const char *err, uint64_t start, uint64_t end)
{
	const int status = rc < 0 ? -rc : 0;
	for (size_t i = 0; i < n; i++) {
		struct exec_entry *en = entry_of(v[i]);
		if (!en->in_use)   /* its ring died meanwhile and dropped it */
			continue;
		if (!en->started) {
			en->started = 1;
			en->t_start = start;
		}
		if (piece_finishes(last, i, rc, en))
			entry_post(e, en, status, err, end);
	}
	/* the same requests (posting changed none of what picks them) */
	for (size_t i = 0; i < n; i++) {
		struct exec_entry *en = entry_of(v[i]);
		if (en->in_use && piece_finishes(last, i, rc, en))
			entry_account(e, en, status, end);
	}
	for (size_t i = 0; i < n; i++)
		ring_doorbell(entry_of(v[i])->ring);
	progress_bump(e);
}

/* Posts the results of the launches in flight that the device has
 * finished (bulk ones finish in order, and the others among themselves,
 * but a decode launch may overtake a prefill one), then closes the gaps.
 * Returns how many finished. */
size_t reap(struct radiance_executor *e)
{
	size_t done = 0;
	int bulk_blocked = 0, decode_blocked = 0;
	for (size_t i = 0; i < e->pend_n && !(bulk_blocked && decode_blocked); i++) {
		struct exec_pending *p = &e->pend[i];
		if ((p->bulk ? bulk_blocked : decode_blocked))
			continue;
		char err[192] = "";
		const uint64_t t0 = rclock_ns();
		int rc = radiance_backend_linear_done(e->backend, p->ticket, err, sizeof err);
		const uint64_t looked = rclock_ns() - t0;
		if (looked > EXEC_QUEUE_SLOW_NS)
			log_warn("executor: asking the device whether a launch is done took %.3f ms", looked / 1e6);
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
void drain_pending(struct radiance_executor *e)
{
	while (e->pend_n)
		if (reap(e) == 0)
			rring_cpu_relax();
}

/* Runs the pieces v[0..live) (one model, the same layers, rows summing <=
 * max_rows) as one launch. A launch of one layer is queued on the device
 * when the backend can (results posted by reap); several layers, or a
 * backend without asynchronous launches, run here and are posted at once. */
void launch_same(struct radiance_executor *e, struct sched_req **v, size_t live)
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
		/* queueing takes microseconds; longer, the driver kept the
		 * executor waiting (its lock, held by another thread) */
		const uint64_t queued = rclock_ns() - start;
		if (e->info.queues && queued > EXEC_QUEUE_SLOW_NS)
			log_warn("executor: queueing a launch of %s on the device took %.3f ms; every session "
				 "waited for it", ls[0]->name, queued / 1e6);
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
	e->round_sync_ns += end - start;
	stats_launch(e->opt.global_stats);
	if (rc < 0)
		log_warn("model %u layer %u (%s)%s: launch of %zu requests failed: %s", m->id,
			 first->layers[0], ls[0]->name, nl > 1 ? " and more" : "", live, err);
	pieces_done(e, v, NULL, live, rc, err, start, end);
}
