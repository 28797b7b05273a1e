/* Deficit round robin over sessions, pieces of prefill requests; see scheduler.h. */
#include "scheduler.h"

#include <errno.h>
#include <string.h>

void sched_flow_init(struct sched_flow *f)
{
	memset(f, 0, sizeof *f);
}

int sched_flow_can_take(const struct sched_params *p, const struct sched_flow *f)
{
	if (f->n == 0)
		return 1;
	return f->n < SCHED_QUEUE && f->rows < p->session_rows;
}

void sched_flow_push(struct sched_flow *f, struct sched_req *r, uint64_t group, uint64_t row_cost,
		     uint32_t rows)
{
	r->group = group;
	r->row_cost = row_cost;
	r->rows = rows;
	r->next = 0;
	r->piece_row = r->piece_rows = 0;
	f->q[f->n++] = r;
	f->rows += rows;
}

int sched_flow_remove(struct sched_flow *f, struct sched_req *r)
{
	for (uint32_t i = 0; i < f->n; i++) {
		if (f->q[i] != r)
			continue;
		memmove(&f->q[i], &f->q[i + 1], (f->n - i - 1) * sizeof f->q[0]);
		f->n--;
		f->rows -= r->rows;
		if (f->n == 0)
			f->deficit = 0;
		return 0;
	}
	return -ENOENT;
}

void sched_flow_clear(struct sched_flow *f)
{
	sched_flow_init(f);
}

/* The flow's first request with rows left to hand out, or NULL. */
static struct sched_req *flow_head(const struct sched_flow *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		if (!sched_req_last_piece(f->q[i]))
			return f->q[i];
	return NULL;
}

static uint32_t piece_of(const struct sched_params *p, const struct sched_req *r)
{
	uint32_t left = r->rows - r->next;
	return left < p->chunk_rows ? left : p->chunk_rows;
}

/* Hands out f's pieces for this round into out; returns how many. */
static size_t flow_round(const struct sched_params *p, struct sched_flow *f, uint64_t quantum,
			 struct sched_req **out)
{
	size_t n = 0;
	f->deficit += quantum;
	for (uint32_t i = 0; i < f->n; i++) {
		struct sched_req *r = f->q[i];
		if (sched_req_last_piece(r))
			continue;   /* handed out, waiting for its launch */
		uint32_t rows = piece_of(p, r);
		uint64_t cost = (uint64_t)rows * r->row_cost;
		if (cost > f->deficit)
			break;
		f->deficit -= cost;
		r->piece_row = r->next;
		r->piece_rows = rows;
		r->next += rows;
		out[n++] = r;
		if (!sched_req_last_piece(r))
			break;   /* its next piece waits for the next round */
	}
	/* what is carried over stays below one quantum: a flow cannot save up
	 * a burst while the others wait */
	if (f->deficit > quantum)
		f->deficit = quantum;
	/* nothing left to hand out: the credit was for work it no longer has */
	if (!flow_head(f))
		f->deficit = 0;
	return n;
}

/* Launch order: decode before prefill, then by group; ties keep the order
 * they were handed out in (flow order, then queue order). */
static int launch_before(const struct sched_params *p, const struct sched_req *a,
			 const struct sched_req *b)
{
	int ca = sched_req_chunked(p, a), cb = sched_req_chunked(p, b);
	if (ca != cb)
		return ca < cb;
	return a->group < b->group;
}

size_t sched_round(const struct sched_params *p, struct sched_flow *const *flows, size_t nflows,
		   struct sched_req **out)
{
	uint64_t quantum = 0;
	for (size_t i = 0; i < nflows; i++) {
		const struct sched_req *h = flow_head(flows[i]);
		if (h && (uint64_t)p->chunk_rows * h->row_cost > quantum)
			quantum = (uint64_t)p->chunk_rows * h->row_cost;
	}
	size_t n = 0;
	for (size_t i = 0; i < nflows; i++) {
		for (uint32_t j = 0; j < flows[i]->n; j++)
			flows[i]->q[j]->piece_rows = 0;
		if (flow_head(flows[i]))
			n += flow_round(p, flows[i], quantum, out + n);
		else
			flows[i]->deficit = 0;
	}
	/* insertion sort: stable, no allocation; a round is small */
	for (size_t i = 1; i < n; i++) {
		struct sched_req *x = out[i];
		size_t j = i;
		while (j > 0 && launch_before(p, x, out[j - 1])) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = x;
	}
	return n;
}

size_t sched_launch_len(const struct sched_params *p, struct sched_req *const *v, size_t n,
			size_t i)
{
	uint64_t rows = v[i]->piece_rows;
	size_t j = i + 1;
	while (j < n && sched_req_chunked(p, v[j]) == sched_req_chunked(p, v[i]) &&
	       v[j]->group == v[i]->group && rows + v[j]->piece_rows <= p->max_rows) {
		rows += v[j]->piece_rows;
		j++;
	}
	return j - i;
}
