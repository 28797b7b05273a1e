/*
 * The executor's scheduling policy: which rows of which sessions' requests
 * run in the next round, and in which launches. Pure bookkeeping (no rings,
 * no backend, no threads, no allocation), so it is tested on its own
 * (tests/test_sched.c); the executor embeds these structs and applies the
 * decisions.
 *
 * Terms. A flow is one session's queue of accepted requests: taken from its
 * SQ, not yet completed, in the order taken. A request's cost is
 * rows x N x K of its layer (multiply-accumulates: what a launch spends on
 * it on any backend). A piece is a run of a request's rows that goes into
 * one launch. A request of more than chunk_rows rows ("prefill") runs in
 * pieces of at most chunk_rows rows and completes when its last piece has
 * run; one of at most chunk_rows rows ("decode") runs whole. Rows are
 * independent (per-token quantization, one accumulator per row), so the
 * pieces' outputs are those of the whole request.
 *
 * A round is weighted deficit round robin (Shreedhar and Varghese) over
 * the flows with queued work ("busy" flows). Shares go to owners first (the
 * executor: the peer uid), then to the owner's busy flows in equal parts:
 * flow i of owner u, with weight w_u and b_u busy flows, has the share
 *     s_i = w_u / b_u,
 * and the flow with the largest share gets a quantum of credit
 *     Q = chunk_rows x the largest N x K among the flows' first requests,
 * the others q_i = Q x s_i / s_max (rounded up). So the flows
 * with the largest share can run one piece of the biggest layer per round,
 * and an owner opening more sessions gets no more device time, only split
 * further. A flow hands out pieces in its queue order while their cost fits
 * its credit, at most one piece per request per round (a request's pieces
 * run in row order, one a round), and stops at a request that still has
 * rows left. Credit left over carries to the next round, capped at the
 * larger of q_i and the cost of its next piece: a flow whose quantum is
 * smaller than its next piece saves up for it over several rounds, but no
 * flow can save up a burst while the others wait. A flow whose queue
 * empties loses its credit. Over many rounds each busy flow so gets
 * device work (cost) in proportion to q_i, within one piece: an owner of
 * weight 2 twice what one of weight 1 gets, a session of small requests as
 * many of them as cost the same as another's big ones.
 *
 * The round's pieces are then ordered for launching: decode before
 * prefill, and within each by group (model, layer), keeping flow order, so
 * that requests of different sessions for one layer share a launch (at most
 * max_rows rows): sched_launch_len().
 *
 * Admission (sched_flow_can_take, sched_flow_can_take_rows): a flow holds
 * the requests taken from its SQ until they complete (queued and running),
 * at most SCHED_QUEUE of them and at most session_rows rows together; an
 * empty flow always takes one, so a request of more rows than session_rows
 * still runs (alone). A request that does not fit stays in the SQ until
 * enough of the flow's requests complete: backpressure, never a refusal.
 *
 * Thread safety: none; the executor thread owns every flow.
 */
#ifndef RADIANCE_SCHED_H
#define RADIANCE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#define SCHED_QUEUE 32u     /* most requests a flow holds (and an SQ gives per round) */

struct sched_params {
	uint32_t chunk_rows;     /* largest piece; a request above it is prefill (>= 1) */
	uint32_t session_rows;   /* a flow takes no more once it holds this many rows (>= 1) */
	uint32_t max_rows;       /* most rows of one launch (>= 1) */
};

/* One accepted request. The caller sets group, row_cost and rows
 * (sched_flow_push); the rest is the scheduler's. */
struct sched_req {
	uint64_t group;          /* requests with equal group may share a launch:
	                            the executor uses (model id << 32) | layer */
	uint64_t row_cost;       /* cost of one row: N x K (>= 1) */
	uint32_t rows;           /* M (>= 1) */
	uint32_t next;           /* rows handed out so far, 0..rows */
	uint32_t piece_row;      /* the current round's piece: first row ... */
	uint32_t piece_rows;     /* ... and how many (0: none this round) */
};

struct sched_flow {
	struct sched_req *q[SCHED_QUEUE];   /* queue order */
	uint32_t n;
	uint64_t rows;           /* sum of q[i]->rows */
	uint64_t deficit;        /* DRR credit, in cost units */
	/* the share, set by the caller after sched_flow_init and kept by
	 * sched_flow_clear (sched_flow_set_owner) */
	uint64_t owner;          /* flows of one owner share its weight */
	uint32_t weight;         /* the owner's, 1..SCHED_MAX_WEIGHT; the flows
	                            of one owner carry the same (else the
	                            largest counts) */
	/* the scheduler's, valid after a round */
	uint64_t quantum;        /* the credit this round gave (0: not busy) */
	uint32_t owner_busy;     /* busy flows of its owner this round */
	uint32_t owner_weight;   /* their largest weight */
};

#define SCHED_MAX_WEIGHT 1000u

/* An empty flow of owner 0, weight 1. */
void sched_flow_init(struct sched_flow *f);

/* Sets whose share f draws from: owner and its weight (0 is taken as 1,
 * above SCHED_MAX_WEIGHT as SCHED_MAX_WEIGHT). */
void sched_flow_set_owner(struct sched_flow *f, uint64_t owner, uint32_t weight);

/* May f take another request of some size now (room for a request, and
 * fewer than session_rows rows held)? */
int sched_flow_can_take(const struct sched_params *p, const struct sched_flow *f);

/* May f take a request of `rows` rows now: f is empty, or it has room for
 * a request and its rows plus these stay within session_rows? */
int sched_flow_can_take_rows(const struct sched_params *p, const struct sched_flow *f,
			     uint32_t rows);

/* Appends r (group, row_cost >= 1, rows >= 1) at the end of f's queue. f
 * must have room (sched_flow_can_take). r stays the caller's memory and
 * must outlive its time in the queue. */
void sched_flow_push(struct sched_flow *f, struct sched_req *r, uint64_t group, uint64_t row_cost,
		     uint32_t rows);

/* Takes r out of f's queue: it completed (its last piece ran, or it
 * failed) or is dropped. Order of the others is kept. -ENOENT when r is
 * not in f. */
int sched_flow_remove(struct sched_flow *f, struct sched_req *r);

/* Empties f (a ring that died or is removed): nothing of it runs again.
 * Its owner and weight stay. */
void sched_flow_clear(struct sched_flow *f);

/* Is r prefill (run in pieces)? */
static inline int sched_req_chunked(const struct sched_params *p, const struct sched_req *r)
{
	return r->rows > p->chunk_rows;
}

/* Has r's last piece been handed out (it completes when that piece runs)? */
static inline int sched_req_last_piece(const struct sched_req *r)
{
	return r->next == r->rows;
}

/* One round over flows[0..nflows) in that order (the caller rotates it
 * from round to round; a flow appears once). Sets each flow's quantum and
 * piece_row/piece_rows of each request handed a piece, advances its
 * `next`, and writes those requests to out (room for nflows x
 * SCHED_QUEUE), ordered for launching. scratch: room for nflows pointers,
 * the caller's memory, overwritten (the owners are counted in it, without
 * allocating). Returns how many; 0 only when no flow holds a request with
 * rows left. O(nflows log nflows + pieces^2). */
size_t sched_round(const struct sched_params *p, struct sched_flow *const *flows, size_t nflows,
		   struct sched_req **out, struct sched_flow **scratch);

/* Length of the launch that starts at v[i] in a sched_round() result of n:
 * v[i] and the requests after it of the same class (decode or prefill) and
 * group, while their pieces' rows sum to at most max_rows. >= 1. */
size_t sched_launch_len(const struct sched_params *p, struct sched_req *const *v, size_t n,
			size_t i);

#endif
