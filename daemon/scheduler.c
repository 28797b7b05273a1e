/* Deficit round robin over sessions, pieces of prefill requests; see scheduler.h. */
#include "scheduler.h"

#include <errno.h>
#include <string.h>

void sched_flow_init(struct sched_flow *f)
{
	memset(f, 0, sizeof *f);
	f->weight = 1;
}

void sched_flow_set_owner(struct sched_flow *f, uint64_t owner, uint32_t weight)
{
	f->owner = owner;
	f->weight = weight < 1 ? 1 : weight > SCHED_MAX_WEIGHT ? SCHED_MAX_WEIGHT : weight;
}

int sched_flow_can_take(const struct sched_params *p, const struct sched_flow *f)
{
	if (f->n == 0)
		return 1;
	return f->n < SCHED_QUEUE && f->rows < p->session_rows;
}

int sched_flow_can_take_rows(const struct sched_params *p, const struct sched_flow *f,
			     uint32_t rows)
{
	if (f->n == 0)
		return 1;
	return f->n < SCHED_QUEUE && f->rows + rows <= p->session_rows;
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
	uint64_t owner = f->owner;
	uint32_t weight = f->weight;
	sched_flow_init(f);
	sched_flow_set_owner(f, owner, weight);
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
	/* nothing left to hand out: the credit was for work it no longer has */
	const struct sched_req *h = flow_head(f);
	if (!h) {
		f->deficit = 0;
		return n;
	}
	/* what is carried over stays within one quantum, or the next piece
	 * when that costs more (a small share saves up for it): a flow cannot
	 * save up a burst while the others wait */
	uint64_t next = (uint64_t)piece_of(p, h) * h->row_cost;
	uint64_t cap = quantum > next ? quantum : next;
	if (f->deficit > cap)
		f->deficit = cap;
	return n;
}

/* Orders v[0..n) by owner: heapsort, in place, no allocation (the order
 * within an owner does not matter, only the runs). */
static void sort_by_owner(struct sched_flow **v, size_t n)
{
	for (size_t end = n, start = n / 2;;) {
		size_t root;
		if (start > 0) {
			root = --start;
		} else {
			if (end <= 1)
				return;
			struct sched_flow *t = v[0];
			v[0] = v[--end];
			v[end] = t;
			root = 0;
		}
		for (size_t child; (child = 2 * root + 1) < end; root = child) {
			if (child + 1 < end && v[child + 1]->owner > v[child]->owner)
				child++;
			if (v[root]->owner >= v[child]->owner)
				break;
			struct sched_flow *t = v[root];
			v[root] = v[child];
			v[child] = t;
		}
	}
}

/* Sets each busy flow's owner_busy (its owner's busy flows) and
 * owner_weight (the largest weight among them, should a caller give one
 * owner's flows different ones), and returns the largest share w / b as
 * *w_max / *b_max. */
static void count_owners(struct sched_flow *const *flows, size_t nflows,
			 struct sched_flow **scratch, uint64_t *w_max, uint64_t *b_max)
{
	size_t nb = 0;
	for (size_t i = 0; i < nflows; i++)
		if (flow_head(flows[i]))
			scratch[nb++] = flows[i];
	sort_by_owner(scratch, nb);
	*w_max = 0;
	*b_max = 1;
	for (size_t i = 0, j; i < nb; i = j) {
		uint32_t w = scratch[i]->weight;
		for (j = i + 1; j < nb && scratch[j]->owner == scratch[i]->owner; j++)
			if (scratch[j]->weight > w)
				w = scratch[j]->weight;
		for (size_t k = i; k < j; k++) {
			scratch[k]->owner_busy = (uint32_t)(j - i);
			scratch[k]->owner_weight = w;
		}
		/* w / b > w_max / b_max */
		uint64_t b = j - i;
		if (w * *b_max > *w_max * b) {
			*w_max = w;
			*b_max = b;
		}
	}
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
		   struct sched_req **out, struct sched_flow **scratch)
{
	uint64_t quantum = 0, w_max, b_max;
	for (size_t i = 0; i < nflows; i++) {
		const struct sched_req *h = flow_head(flows[i]);
		if (h && (uint64_t)p->chunk_rows * h->row_cost > quantum)
			quantum = (uint64_t)p->chunk_rows * h->row_cost;
	}
	count_owners(flows, nflows, scratch, &w_max, &b_max);
	size_t n = 0;
	for (size_t i = 0; i < nflows; i++) {
		struct sched_flow *f = flows[i];
		for (uint32_t j = 0; j < f->n; j++)
			f->q[j]->piece_rows = 0;
		f->quantum = 0;
		if (!flow_head(f)) {
			f->deficit = 0;
			continue;
		}
		/* Q x num / den with num / den = (w / b) / (w_max / b_max) <= 1,
		 * rounded up (a third of a chunk three times must buy the chunk),
		 * in 64 bits: Q may take 58 of them, num and den fewer than 32
		 * each (weights <= 1000, b <= flows) */
		uint64_t num = (uint64_t)f->owner_weight * b_max, den = (uint64_t)f->owner_busy * w_max;
		uint64_t rem = quantum % den * num;
		f->quantum = quantum / den * num + rem / den + (rem % den != 0);
		n += flow_round(p, f, f->quantum, out + n);
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
