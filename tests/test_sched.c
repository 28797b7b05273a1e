/*
 * Scheduling: fairness between sessions, prefill in pieces, the watchdog.
 *
 * Three levels:
 *   - the policy (daemon/scheduler.h) on its own, with real values: which
 *     pieces each round hands out, the DRR credit after each round, the
 *     launch order and grouping, admission; and that a request run in
 *     pieces gives the bits of the whole request on the CPU kernel;
 *   - the real executor thread on the CPU backend, with rings in this
 *     process's memory: a request in pieces posts one result; the CQ room
 *     reservation holds; a ring removed or broken mid-request, or a model
 *     released mid-request, is never touched again (the arena is made
 *     PROT_NONE, the model freed); the liveness the watchdog reads stands
 *     still while the executor is wedged and moves with every piece;
 *   - the real daemon: one client floods the biggest layer with max-row
 *     requests while another does M=1 requests and a third connects and
 *     sets up its ring. Their worst latencies must stay within a few
 *     pieces' time, measured in the same test on the quiet daemon; every
 *     result bit for bit the CPU kernel's; and a daemon under a systemd
 *     watchdog (NOTIFY_SOCKET, WATCHDOG_USEC) keeps feeding it through the
 *     flood.
 *
 * The bounds are ratios to times measured here (on a loaded machine and
 * under sanitizers both sides slow down together) and loose: before the
 * scheduler, the waits were the whole flood's pass, about a hundred times
 * the bound.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include <cmocka.h>

#include "executor.h"
#include "scheduler.h"
#include "stats.h"

#include "daemon_harness.h"
#include "log.h"
#include "proto_util.h"
#include "st_writer.h"

/* ---- values ------------------------------------------------------------ */

static uint32_t rng_state = 0x2545F491u;

static uint32_t rnd(void)
{
	uint32_t x = rng_state;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return rng_state = x;
}

/* bf16 activations in about [-4, 4], sign and exponent varied */
static void fill_x(uint16_t *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (uint16_t)(0x3C00u + rnd() % 0x0500u) | (uint16_t)((rnd() & 1u) << 15);
}

static uint32_t code_mix(uint32_t n, uint32_t k)
{
	return (n * 2654435761u ^ k * 40503u ^ (k >> 7) * 97u) >> 7 & 0xFu;
}

static uint16_t scale_mix(uint32_t n, uint32_t g)
{
	return (uint16_t)(0x1C00u + (n * 37u + g * 11u) % 0x0400u);   /* ~2^-8 .. 2^-7 */
}

/* A W4A8 layer in the canonical host layout (daemon/model.h), for the
 * in-process tests that bypass the loader. */
static void layer_init(struct radiance_layer *l, const char *name, uint32_t n, uint32_t k)
{
	memset(l, 0, sizeof *l);
	l->name = strdup(name);
	l->kind = RADIANCE_LAYER_W4A8;
	l->n = n;
	l->k = k;
	l->qweight = malloc((size_t)n * k / 2);
	l->scales = malloc((size_t)n * k / 128 * 2);
	l->bias = malloc((size_t)n * sizeof(float));
	assert_non_null(l->qweight);
	assert_non_null(l->scales);
	assert_non_null(l->bias);
	for (size_t i = 0; i < (size_t)n * k / 8; i++)
		l->qweight[i] = rnd();
	for (uint32_t j = 0; j < n; j++) {
		for (uint32_t g = 0; g < k / 128; g++)
			l->scales[(size_t)j * (k / 128) + g] = scale_mix(j, g);
		l->bias[j] = (float)(j % 7) - 3.0f;
	}
	l->bytes = (uint64_t)n * k / 2;
}

static void cpu_ref(const struct radiance_layer *l, const uint16_t *x, uint32_t m, uint16_t *y)
{
	h_reference(l, x, RADIANCE_DTYPE_BF16, m, y);
}

static double median(double *v, size_t n)
{
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n ? v[n / 2] : 0;
}

static double maxof(const double *v, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		if (v[i] > m)
			m = v[i];
	return m;
}

/* ---- the policy -------------------------------------------------------- */

#define C_BIG ((uint64_t)2048 * 2048)    /* row cost of a 2048 x 2048 layer */
#define C_SMALL ((uint64_t)384 * 384)
#define G_BIG ((uint64_t)1 << 32 | 0)    /* (model 1, layer 0) */
#define G_SMALL ((uint64_t)1 << 32 | 1)

/* sched_round's scratch: room for every test's flows */
static struct sched_flow *scr[16];

static const struct sched_params P = { .chunk_rows = 256, .session_rows = 1024, .max_rows = 512 };

static void check_piece(const struct sched_req *r, uint32_t row, uint32_t rows)
{
	assert_int_equal(r->piece_row, row);
	assert_int_equal(r->piece_rows, rows);
}

/* A request of 600 rows: pieces of 256, 256 and 88 rows, one a round, in row
 * order; only the last is the last piece. */
static void test_policy_chunks(void **state)
{
	struct sched_flow f;
	struct sched_req r, *out[SCHED_QUEUE];
	struct sched_flow *flows[] = { &f };
	sched_flow_init(&f);
	sched_flow_push(&f, &r, G_BIG, C_BIG, 600);
	assert_true(sched_req_chunked(&P, &r));

	assert_int_equal(sched_round(&P, flows, 1, out, scr), 1);
	assert_ptr_equal(out[0], &r);
	check_piece(&r, 0, 256);
	assert_false(sched_req_last_piece(&r));
	assert_int_equal(f.deficit, 0);   /* a quantum is one chunk of this layer */

	assert_int_equal(sched_round(&P, flows, 1, out, scr), 1);
	check_piece(&r, 256, 256);
	assert_false(sched_req_last_piece(&r));

	assert_int_equal(sched_round(&P, flows, 1, out, scr), 1);
	check_piece(&r, 512, 88);
	assert_true(sched_req_last_piece(&r));
	assert_int_equal(f.deficit, 0);   /* nothing left: no credit kept */

	/* handed out but not completed: nothing more to hand out */
	assert_int_equal(sched_round(&P, flows, 1, out, scr), 0);
	assert_int_equal(sched_flow_remove(&f, &r), 0);
	assert_int_equal(f.n, 0);
	assert_int_equal(f.rows, 0);
	assert_int_equal(sched_flow_remove(&f, &r), -ENOENT);
}

/* A flood session first in round-robin order, two decode sessions after
 * it: the decode requests launch first, those of one layer together across
 * sessions; the flood gets one chunk. */
static void test_policy_decode_first_merged(void **state)
{
	struct sched_flow a, b, c;
	struct sched_req fl[3], b1, b2, c1, c2, *out[3 * SCHED_QUEUE];
	struct sched_flow *flows[] = { &a, &b, &c };
	sched_flow_init(&a);
	sched_flow_init(&b);
	sched_flow_init(&c);
	for (int i = 0; i < 2; i++)
		sched_flow_push(&a, &fl[i], G_BIG, C_BIG, 512);
	assert_false(sched_flow_can_take(&P, &a));   /* 1024 rows: its quota */
	sched_flow_push(&b, &b1, G_BIG, C_BIG, 1);
	sched_flow_push(&b, &b2, G_BIG, C_BIG, 1);
	sched_flow_push(&c, &c1, G_SMALL, C_SMALL, 1);
	sched_flow_push(&c, &c2, G_BIG, C_BIG, 16);

	size_t n = sched_round(&P, flows, 3, out, scr);
	assert_int_equal(n, 5);
	assert_ptr_equal(out[0], &b1);
	assert_ptr_equal(out[1], &b2);
	assert_ptr_equal(out[2], &c2);
	assert_ptr_equal(out[3], &c1);
	assert_ptr_equal(out[4], &fl[0]);
	check_piece(&b1, 0, 1);
	check_piece(&c2, 0, 16);
	check_piece(&fl[0], 0, 256);
	assert_int_equal(fl[1].piece_rows, 0);   /* one piece per flow this round */
	/* launches: B's two and C's 16 rows on the big layer, C's small-layer
	 * row, the flood's chunk */
	assert_int_equal(sched_launch_len(&P, out, n, 0), 3);
	assert_int_equal(sched_launch_len(&P, out, n, 3), 1);
	assert_int_equal(sched_launch_len(&P, out, n, 4), 1);
	/* credit: the flood spent its quantum, the others emptied */
	assert_int_equal(a.deficit, 0);
	assert_int_equal(b.deficit, 0);
	assert_int_equal(c.deficit, 0);
}

/* DRR credit with real numbers: requests of 200 rows against one chunk
 * (256 rows) of the same layer a round. Credit (in units of C_BIG) runs
 * 256 -> 56, 312 -> 112, 368 -> 168, 424 -> 24: 1, 1, 1 and 2 requests,
 * 1000 rows against the flood's 1024 in four rounds. */
static void test_policy_deficit(void **state)
{
	struct sched_flow a, s;
	struct sched_req fl[2], sr[10], *out[2 * SCHED_QUEUE];
	struct sched_flow *flows[] = { &a, &s };
	const struct sched_params p = { .chunk_rows = 256, .session_rows = 1u << 20, .max_rows = 512 };
	sched_flow_init(&a);
	sched_flow_init(&s);
	for (int i = 0; i < 2; i++)
		sched_flow_push(&a, &fl[i], G_BIG, C_BIG, 512);
	for (int i = 0; i < 10; i++)
		sched_flow_push(&s, &sr[i], G_BIG, C_BIG, 200);
	const size_t want_s[4] = { 1, 1, 1, 2 };
	const uint64_t want_credit[4] = { 56, 112, 168, 24 };
	size_t s_rows = 0, a_rows = 0;
	for (int round = 0; round < 4; round++) {
		size_t n = sched_round(&p, flows, 2, out, scr), ns = 0;
		for (size_t i = 0; i < n; i++) {
			if (out[i] >= &sr[0] && out[i] <= &sr[9]) {
				ns++;
				s_rows += out[i]->piece_rows;
				/* 200 rows is decode: it runs before the chunk */
				assert_true(i < n - 1);
			} else {
				a_rows += out[i]->piece_rows;
				assert_int_equal(out[i]->piece_rows, 256);
			}
		}
		assert_int_equal(ns, want_s[round]);
		assert_int_equal(n, ns + 1);
		assert_int_equal(s.deficit, want_credit[round] * C_BIG);
		/* complete what ran, as the executor does */
		for (size_t i = 0; i < n; i++)
			if (sched_req_last_piece(out[i]))
				assert_int_equal(sched_flow_remove(out[i] >= &sr[0] && out[i] <= &sr[9] ?
								   &s : &a, out[i]), 0);
	}
	assert_int_equal(s_rows, 1000);
	assert_int_equal(a_rows, 1024);
}

/* The quantum follows the biggest layer queued: a session of small-layer
 * requests gets as many as cost one chunk of the big layer (all it has,
 * here), not one. */
static void test_policy_cost_fair(void **state)
{
	struct sched_flow a, s;
	struct sched_req fl, sr[SCHED_QUEUE], *out[2 * SCHED_QUEUE];
	struct sched_flow *flows[] = { &a, &s };
	const struct sched_params p = { .chunk_rows = 256, .session_rows = 1u << 20, .max_rows = 512 };
	sched_flow_init(&a);
	sched_flow_init(&s);
	sched_flow_push(&a, &fl, G_BIG, C_BIG, 512);
	for (uint32_t i = 0; i < SCHED_QUEUE; i++)
		sched_flow_push(&s, &sr[i], G_SMALL, C_SMALL, 256);
	assert_false(sched_flow_can_take(&p, &s));   /* SCHED_QUEUE requests */
	/* one chunk of the big layer, 256 x 2048^2 = 1073741824, buys 28 of the
	 * small requests (256 x 384^2 = 37748736 each) */
	size_t n = sched_round(&p, flows, 2, out, scr);
	uint64_t q = 256 * C_BIG, per = 256 * C_SMALL;
	size_t fit = (size_t)(q / per);
	assert_int_equal(fit, 28);
	assert_int_equal(n, fit + 1);
	assert_int_equal(s.deficit, q - fit * per);
	/* the small ones share launches of at most max_rows rows: 2 each */
	assert_int_equal(sched_launch_len(&p, out, n, 0), 2);
}

/* Admission: an empty flow always takes (even a request above the quota);
 * otherwise below session_rows rows and SCHED_QUEUE requests. */
static void test_policy_admission(void **state)
{
	struct sched_flow f;
	struct sched_req r[SCHED_QUEUE + 1];
	sched_flow_init(&f);
	assert_true(sched_flow_can_take(&P, &f));
	sched_flow_push(&f, &r[0], G_BIG, C_BIG, 4096);
	assert_false(sched_flow_can_take(&P, &f));
	assert_int_equal(sched_flow_remove(&f, &r[0]), 0);
	sched_flow_push(&f, &r[0], G_BIG, C_BIG, 512);
	assert_true(sched_flow_can_take(&P, &f));
	sched_flow_push(&f, &r[1], G_BIG, C_BIG, 511);
	assert_true(sched_flow_can_take(&P, &f));   /* 1023 < 1024 */
	sched_flow_push(&f, &r[2], G_BIG, C_BIG, 1);
	assert_false(sched_flow_can_take(&P, &f));
	assert_int_equal(f.rows, 1024);
	/* removal from the middle keeps the order of the others */
	assert_int_equal(sched_flow_remove(&f, &r[1]), 0);
	assert_ptr_equal(f.q[0], &r[0]);
	assert_ptr_equal(f.q[1], &r[2]);
	assert_true(sched_flow_can_take(&P, &f));
	sched_flow_clear(&f);
	for (uint32_t i = 0; i < SCHED_QUEUE; i++) {
		assert_true(sched_flow_can_take(&P, &f));
		sched_flow_push(&f, &r[i], G_SMALL, C_SMALL, 1);
	}
	assert_false(sched_flow_can_take(&P, &f));

	/* by rows: a request is taken only when it fits the rows in flight,
	 * session_rows 1024: 1000 held take 24 more, not 25; an empty flow
	 * takes one of any size */
	sched_flow_clear(&f);
	assert_true(sched_flow_can_take_rows(&P, &f, 5000));
	sched_flow_push(&f, &r[0], G_BIG, C_BIG, 1000);
	assert_true(sched_flow_can_take(&P, &f));
	assert_true(sched_flow_can_take_rows(&P, &f, 24));
	assert_false(sched_flow_can_take_rows(&P, &f, 25));
	assert_false(sched_flow_can_take_rows(&P, &f, UINT32_MAX));
	sched_flow_push(&f, &r[1], G_BIG, C_BIG, 24);
	assert_false(sched_flow_can_take_rows(&P, &f, 1));
}

/* Keeps every flow of v[0..nf) flooding: run `rounds` rounds, count the
 * pieces (and rows) each flow is handed, complete each request at its last
 * piece and push a new one of `rows` rows in its place, as a client that
 * always has two requests queued. pool: 2 requests per flow. */
static void flood_rounds(const struct sched_params *p, struct sched_flow **v, size_t nf,
			 struct sched_req (*pool)[2], uint32_t rows, int rounds, uint64_t *pieces,
			 uint64_t *got_rows)
{
	struct sched_req *out[8 * SCHED_QUEUE];
	assert_true(nf <= 8);
	for (size_t i = 0; i < nf; i++) {
		pieces[i] = got_rows[i] = 0;
		for (int j = 0; j < 2; j++)
			sched_flow_push(v[i], &pool[i][j], G_BIG, C_BIG, rows);
	}
	for (int round = 0; round < rounds; round++) {
		size_t n = sched_round(p, v, nf, out, scr);
		for (size_t k = 0; k < n; k++) {
			size_t i = 0;
			while (i < nf && !(out[k] >= &pool[i][0] && out[k] <= &pool[i][1]))
				i++;
			assert_true(i < nf);
			pieces[i]++;
			got_rows[i] += out[k]->piece_rows;
			/* one piece per flow a round: each is one chunk, the most a
			 * quantum buys */
			assert_int_equal(out[k]->piece_rows, p->chunk_rows);
			if (sched_req_last_piece(out[k])) {
				assert_int_equal(sched_flow_remove(v[i], out[k]), 0);
				sched_flow_push(v[i], out[k], G_BIG, C_BIG, rows);
			}
		}
	}
	for (size_t i = 0; i < nf; i++)
		sched_flow_clear(v[i]);
}

/* Weights: three flooding owners of weights 1, 1 and 2 on one layer. The
 * weight-2 owner has the largest share: its quantum is one chunk, one
 * piece every round; the others get half a chunk a round, save it up and
 * run one piece every second round. Over 64 rounds: 64, 32 and 32 pieces,
 * the shares 2 : 1 : 1 exactly (DRR is within one piece at any time). And
 * sched_flow_clear keeps owner and weight. */
static void test_policy_weights(void **state)
{
	struct sched_flow f[3];
	struct sched_flow *v[] = { &f[0], &f[1], &f[2] };
	struct sched_req pool[3][2];
	uint64_t pieces[3], rows[3];
	const uint32_t weight[3] = { 1, 1, 2 };
	for (int i = 0; i < 3; i++) {
		sched_flow_init(&f[i]);
		assert_int_equal(f[i].weight, 1);
		sched_flow_set_owner(&f[i], 1000 + (uint64_t)i, weight[i]);
	}
	flood_rounds(&P, v, 3, pool, 4096, 64, pieces, rows);
	assert_int_equal(pieces[0], 32);
	assert_int_equal(pieces[1], 32);
	assert_int_equal(pieces[2], 64);
	assert_int_equal(rows[2], 64 * 256);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(f[i].owner, 1000 + (uint64_t)i);
		assert_int_equal(f[i].weight, weight[i]);
	}
	/* weights out of range are clamped, 0 to 1 */
	sched_flow_set_owner(&f[0], 1, 0);
	assert_int_equal(f[0].weight, 1);
	sched_flow_set_owner(&f[0], 1, SCHED_MAX_WEIGHT + 1);
	assert_int_equal(f[0].weight, SCHED_MAX_WEIGHT);

	/* one flow alone, however small its weight, gets every round: its
	 * share is the largest */
	sched_flow_set_owner(&f[0], 7, 1);
	flood_rounds(&P, v, 1, pool, 4096, 10, pieces, rows);
	assert_int_equal(pieces[0], 10);
}

/* Owners: one uid with three sessions and another with one, equal weights.
 * The uid's share is split among its busy sessions (a third each), so the
 * lone session gets as much device work as the three together: over 60
 * rounds 60 pieces, and 20 to each of the three (a third of a chunk a
 * round, saved up for 3 rounds). Opening more sessions buys no more. With
 * two of the three left, they run every second round. */
static void test_policy_owner_split(void **state)
{
	struct sched_flow f[4];
	struct sched_flow *v[] = { &f[0], &f[1], &f[2], &f[3] };
	struct sched_req pool[4][2];
	uint64_t pieces[4], rows[4];
	for (int i = 0; i < 4; i++) {
		sched_flow_init(&f[i]);
		sched_flow_set_owner(&f[i], i < 3 ? 1000 : 1001, 1);
	}
	flood_rounds(&P, v, 4, pool, 4096, 60, pieces, rows);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pieces[i], 20);
	assert_int_equal(pieces[3], 60);
	assert_int_equal(rows[0] + rows[1] + rows[2], rows[3]);

	struct sched_flow *w[] = { &f[1], &f[2], &f[3] };
	flood_rounds(&P, w, 3, pool, 4096, 60, pieces, rows);
	assert_int_equal(pieces[0], 30);
	assert_int_equal(pieces[1], 30);
	assert_int_equal(pieces[2], 60);
	/* the quantum the round gave: a chunk, and half of one */
	struct sched_req r[3], *out[3 * SCHED_QUEUE];
	for (int i = 0; i < 3; i++)
		sched_flow_push(w[i], &r[i], G_BIG, C_BIG, 4096);
	sched_round(&P, w, 3, out, scr);
	assert_int_equal(f[1].quantum, 128 * C_BIG);
	assert_int_equal(f[2].quantum, 128 * C_BIG);
	assert_int_equal(f[3].quantum, 256 * C_BIG);
	assert_int_equal(f[1].owner_busy, 2);
	assert_int_equal(f[3].owner_busy, 1);
	/* f[1] saved half a chunk for its next piece, no more */
	assert_int_equal(f[1].deficit, 128 * C_BIG);
	assert_int_equal(f[3].deficit, 0);

	/* weights differing within one owner: its largest counts. Owner 1000
	 * (weight 3, two busy) has share 3/2, the largest; owner 1001 (1, one
	 * busy) two thirds of that, rounded up */
	sched_flow_set_owner(&f[1], 1000, 3);
	sched_round(&P, w, 3, out, scr);
	assert_int_equal(f[2].owner_weight, 3);
	assert_int_equal(f[1].quantum, 256 * C_BIG);
	assert_int_equal(f[2].quantum, 256 * C_BIG);
	assert_int_equal(f[3].quantum, (2 * 256 * C_BIG + 2) / 3);
}

/* Launches hold at most max_rows rows: three sessions' 200-row requests on
 * one layer make a launch of two and one of one. */
static void test_policy_launch_max_rows(void **state)
{
	struct sched_flow f[3];
	struct sched_req r[3], *out[3 * SCHED_QUEUE];
	struct sched_flow *flows[] = { &f[0], &f[1], &f[2] };
	for (int i = 0; i < 3; i++) {
		sched_flow_init(&f[i]);
		sched_flow_push(&f[i], &r[i], G_BIG, C_BIG, 200);
	}
	size_t n = sched_round(&P, flows, 3, out, scr);
	assert_int_equal(n, 3);
	assert_int_equal(sched_launch_len(&P, out, n, 0), 2);
	assert_int_equal(sched_launch_len(&P, out, n, 2), 1);
}

/* Rows are independent on the CPU kernel: the pieces the policy hands out
 * for a 600-row request (chunk 256, and chunk 7 for uneven pieces) write
 * the bits the whole request does. */
static void test_pieces_bit_identical(void **state)
{
	struct radiance_layer l;
	layer_init(&l, "pieces", 256, 512);
	const uint32_t m = 600;
	uint16_t *x = malloc((size_t)m * l.k * 2), *whole = malloc((size_t)m * l.n * 2);
	uint16_t *pieces = malloc((size_t)m * l.n * 2);
	fill_x(x, (size_t)m * l.k);
	x[5 * l.k + 3] = 0x7FC0;                  /* a NaN row stays a NaN row */
	memset(x + (size_t)9 * l.k, 0, l.k * 2);  /* an all-zero row gives the bias */
	cpu_ref(&l, x, m, whole);
	const uint32_t chunks[] = { 256, 7 };
	for (size_t c = 0; c < 2; c++) {
		struct sched_params p = { .chunk_rows = chunks[c], .session_rows = 1024, .max_rows = 512 };
		struct sched_flow f;
		struct sched_req r, *out[SCHED_QUEUE];
		struct sched_flow *flows[] = { &f };
		sched_flow_init(&f);
		sched_flow_push(&f, &r, G_BIG, (uint64_t)l.n * l.k, m);
		memset(pieces, 0xAB, (size_t)m * l.n * 2);
		size_t rounds = 0;
		while (sched_round(&p, flows, 1, out, scr) == 1) {
			cpu_ref(&l, x + (size_t)r.piece_row * l.k, r.piece_rows,
				pieces + (size_t)r.piece_row * l.n);
			rounds++;
		}
		assert_int_equal(rounds, (m + chunks[c] - 1) / chunks[c]);
		assert_memory_equal(pieces, whole, (size_t)m * l.n * 2);
	}
	assert_true(isnan(radiance_bf16_to_f32(whole[5 * l.n])));
	assert_int_equal(whole[9 * l.n + 1], radiance_bf16_from_f32(l.bias[1]));
	free(x);
	free(whole);
	free(pieces);
	free(l.name);
	free(l.qweight);
	free(l.scales);
	free(l.bias);
}

/* ---- the executor, in process ------------------------------------------ */

#define XR_SQ 64u
#define XR_ARENA (16u << 20)

/* A session's data plane as the loop makes it, in one page-aligned mapping:
 * header page, SQ slots, CQ slots, arena (its own pages, so it can be made
 * PROT_NONE to prove nobody touches it). */
struct xring {
	struct exec_ring r;
	struct exec_refs refs;
	struct stats_counters stats;
	uint8_t *mem;
	size_t mem_bytes;
	struct radiance_shm_header *h;
	struct rring client_sq, client_cq;
	int cq_rfd;
	int broken;
	char broken_err[256];
	uint64_t next_id;
};

struct xjob {
	struct exec_job job;
	int done;
};

struct xfix {
	uv_loop_t loop;
	struct radiance_executor *e;
	struct radiance_model model;
	struct radiance_layer layers[1];
	struct exec_model em;
	int model_freed;
};

static void on_xjob_done(struct exec_job *job)
{
	((struct xjob *)job)->done = 1;
}

static void on_xring_broken(struct exec_job *job)
{
	struct xring *x = job->user;
	x->broken = 1;
	snprintf(x->broken_err, sizeof x->broken_err, "%s", job->err);
}

/* Runs the loop until *flag is set (the executor's jobs call back there);
 * 120 s is a hang guard, not a time limit of the test. */
static void x_wait_flag(struct xfix *fx, const int *flag)
{
	double deadline = h_now() + 120.0;
	while (!*flag) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		if (*flag)
			break;
		assert_true(h_now() < deadline);
		h_sleep_ms(1);
	}
}

static void x_job_submit(struct xfix *fx, struct xjob *j, enum exec_job_kind kind,
			 struct exec_ring *r, struct exec_model *m, int drain)
{
	*j = (struct xjob){ .job = { .kind = kind, .done = on_xjob_done, .ring = r, .model = m,
				     .drain = drain } };
	executor_submit(fx->e, &j->job);
}

static void x_job(struct xfix *fx, enum exec_job_kind kind, struct exec_ring *r,
		  struct exec_model *m, int drain, int *status)
{
	struct xjob j;
	x_job_submit(fx, &j, kind, r, m, drain);
	x_wait_flag(fx, &j.done);
	if (status)
		*status = j.job.status;
	else
		assert_int_equal(j.job.status, 0);
}

/* A ping round trip: the executor has finished at least one round since. */
static void x_ping(struct xfix *fx)
{
	x_job(fx, EXEC_JOB_PING, NULL, NULL, 0, NULL);
}

static void x_setup(struct xfix *fx, uint32_t n, uint32_t k, uint32_t max_rows, uint32_t chunk_rows,
		    uint32_t session_rows)
{
	char err[256];
	memset(fx, 0, sizeof *fx);
	assert_int_equal(uv_loop_init(&fx->loop), 0);
	struct executor_options o = {
		.backend = { .kind = "cpu", .device = -1, .max_rows = max_rows,
			     .max_decode_rows = 64, .max_n = n, .max_k = k },
		.max_rings = 4,
		.spin_us = 50,
		.chunk_rows = chunk_rows,
		.session_rows = session_rows,
	};
	static struct stats_counters global;
	stats_init(&global);
	o.global_stats = &global;
	int rc = executor_create(&fx->loop, &o, &fx->e, err, sizeof err);
	if (rc < 0)
		fail_msg("executor_create: %s", err);
	layer_init(&fx->layers[0], "big", n, k);
	fx->model = (struct radiance_model){ .name = (char *)"sched", .layers = fx->layers,
					     .n_layers = 1, .group_size = 128, .bits = 4 };
	fx->em.id = 7;
	fx->em.model = &fx->model;
	fx->em.handles = calloc(1, sizeof *fx->em.handles);
	assert_non_null(fx->em.handles);
	x_job(fx, EXEC_JOB_MODEL_UPLOAD, NULL, &fx->em, 0, NULL);
}

/* The model's memory, once its MODEL_FREE job is done. */
static void x_release_model_memory(struct xfix *fx)
{
	free(fx->em.handles);
	free(fx->layers[0].name);
	free(fx->layers[0].qweight);
	free(fx->layers[0].scales);
	free(fx->layers[0].bias);
	fx->model_freed = 1;
}

static void x_free_model(struct xfix *fx)
{
	if (fx->model_freed)
		return;
	x_job(fx, EXEC_JOB_MODEL_FREE, NULL, &fx->em, 0, NULL);
	x_release_model_memory(fx);
}

static void x_teardown(struct xfix *fx)
{
	x_free_model(fx);
	executor_destroy(fx->e);
	uv_run(&fx->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&fx->loop), 0);
}

/* The session's memory, fds and references (m: the model it holds, or
 * NULL), set up as the loop does before RING_ADD. */
static void xring_make(struct xring *x, uint32_t sq, uint32_t cq, struct exec_model *m)
{
	memset(x, 0, sizeof *x);
	size_t sq_off = RADIANCE_SHM_HEADER_BYTES, cq_off = sq_off + (size_t)sq * RADIANCE_SLOT_BYTES;
	size_t arena_off = (cq_off + (size_t)cq * RADIANCE_SLOT_BYTES + 4095) & ~(size_t)4095;
	x->mem_bytes = arena_off + XR_ARENA;
	x->mem = mmap(NULL, x->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(x->mem != MAP_FAILED);
	x->h = (struct radiance_shm_header *)(void *)x->mem;
	x->h->sq.entries = sq;
	x->h->cq.entries = cq;
	rring_init(&x->r.sq, &x->h->sq, x->mem + sq_off, sq);
	rring_init(&x->r.cq, &x->h->cq, x->mem + cq_off, cq);
	rring_init(&x->client_sq, &x->h->sq, x->mem + sq_off, sq);
	rring_init(&x->client_cq, &x->h->cq, x->mem + cq_off, cq);
	x->r.sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	int p[2];
	assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
	x->cq_rfd = p[0];
	x->r.cq_wfd = p[1];
	x->r.session_id = 1;
	x->r.arena = x->mem + arena_off;
	x->r.arena_bytes = XR_ARENA;
	x->r.max_inflight = 1024;
	exec_refs_init(&x->refs);
	if (m)
		assert_int_equal(exec_refs_add(&x->refs, m), 0);
	x->r.refs = &x->refs;
	stats_init(&x->stats);
	x->r.stats = &x->stats;
	exec_ring_init(&x->r, on_xring_broken, x);
	x->next_id = 1;
}

/* with_model: the session references the fixture's model (id 7). */
static void xring_open(struct xfix *fx, struct xring *x, uint32_t sq, uint32_t cq, int with_model)
{
	xring_make(x, sq, cq, with_model ? &fx->em : NULL);
	x_job(fx, EXEC_JOB_RING_ADD, &x->r, NULL, 0, NULL);
}

/* What the loop frees once RING_REMOVE is done. */
static void xring_free(struct xring *x)
{
	close(x->r.sq_efd);
	close(x->r.cq_wfd);
	close(x->cq_rfd);
	exec_refs_finish(&x->refs);
	munmap(x->mem, x->mem_bytes);
}

static void xring_close(struct xfix *fx, struct xring *x, int drain)
{
	int status;
	x_job(fx, EXEC_JOB_RING_REMOVE, &x->r, NULL, drain, &status);
	assert_int_equal(status, 0);
	xring_free(x);
}

static void *arena_at(struct xring *x, uint64_t off)
{
	return x->r.arena + off;
}

/* Submits rows of x at arena offset in_off through layer, y at out_off;
 * returns the id. */
static uint64_t xsubmit_layer(struct xring *x, uint32_t model_id, uint32_t layer, uint32_t rows,
			      uint64_t in_off, uint64_t out_off)
{
	Rdw__LinearRequest req = RDW__LINEAR_REQUEST__INIT;
	req.request_id = x->next_id++;
	req.model_id = model_id;
	req.layer = layer;
	req.rows = rows;
	req.dtype = RDW__DTYPE__DTYPE_BF16;
	req.input_offset = in_off;
	req.output_offset = out_off;
	uint8_t buf[RADIANCE_SLOT_BYTES - 4];
	int len = rproto_pack_slot(&req.base, buf, sizeof buf);
	assert_true(len > 0);
	assert_int_equal(rring_push(&x->client_sq, buf, (size_t)len), 0);
	rdoorbell_ring(x->r.sq_efd);
	return req.request_id;
}

static uint64_t xsubmit(struct xring *x, uint32_t model_id, uint32_t rows, uint64_t in_off,
			uint64_t out_off)
{
	return xsubmit_layer(x, model_id, 0, rows, in_off, out_off);
}

/* The next CQ entry (waiting for it; 120 s hang guard). */
static void xreap(struct xfix *fx, struct xring *x, uint64_t *id, int *status, char *err,
		  size_t errlen)
{
	uint8_t buf[RADIANCE_SLOT_BYTES];
	double deadline = h_now() + 120.0;
	int n;
	while ((n = rring_pop(&x->client_cq, buf)) == 0) {
		assert_true(h_now() < deadline);
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		h_sleep_ms(1);
	}
	assert_true(n > 0);
	Rdw__LinearResult *res = rdw__linear_result__unpack(NULL, (size_t)n, buf);
	assert_non_null(res);
	*id = res->request_id;
	*status = res->status;
	if (err)
		snprintf(err, errlen, "%s", res->error ? res->error : "");
	rdw__linear_result__free_unpacked(res, NULL);
}

static int cq_ready(struct xring *x)
{
	return rring_ready(&x->client_cq);
}

/* A 100-row request in pieces of 8, with three M=1 requests behind it:
 * four CQ entries, one per request, each output the CPU kernel's bits. */
static void test_exec_pieces_one_result(void **state)
{
	struct xfix fx;
	struct xring x;
	x_setup(&fx, 256, 512, 128, 8, 1024);
	xring_open(&fx, &x, XR_SQ, XR_SQ, 1);
	const struct radiance_layer *l = &fx.layers[0];
	const uint32_t rows[4] = { 100, 1, 1, 1 };
	uint64_t in[4], out[4], id[4];
	uint64_t off = 0;
	for (int i = 0; i < 4; i++) {
		in[i] = off;
		off += ((uint64_t)rows[i] * l->k * 2 + 63) & ~63ull;
		out[i] = off;
		off += ((uint64_t)rows[i] * l->n * 2 + 63) & ~63ull;
		fill_x(arena_at(&x, in[i]), (size_t)rows[i] * l->k);
	}
	for (int i = 0; i < 4; i++)
		id[i] = xsubmit(&x, fx.em.id, rows[i], in[i], out[i]);
	int seen[4] = { 0 };
	for (int i = 0; i < 4; i++) {
		uint64_t got;
		int status;
		char err[200];
		xreap(&fx, &x, &got, &status, err, sizeof err);
		assert_int_equal(status, 0);
		assert_true(got >= id[0] && got <= id[3]);
		seen[got - id[0]]++;
	}
	for (int i = 0; i < 4; i++)
		assert_int_equal(seen[i], 1);
	x_ping(&fx);
	x_ping(&fx);
	assert_int_equal(cq_ready(&x), 0);   /* nothing more: one entry per request */
	for (int i = 0; i < 4; i++) {
		uint16_t *want = malloc((size_t)rows[i] * l->n * 2);
		cpu_ref(l, arena_at(&x, in[i]), rows[i], want);
		assert_memory_equal(arena_at(&x, out[i]), want, (size_t)rows[i] * l->n * 2);
		free(want);
	}
	assert_int_equal(atomic_load(&x.stats.requests), 4);
	assert_int_equal(atomic_load(&x.stats.rows), 103);
	assert_false(x.broken);
	xring_close(&fx, &x, 0);
	x_teardown(&fx);
}

/* CQ of 4, never reaped: four requests in pieces complete and fill it; four
 * more wait in the SQ (not taken: no room for their results), however many
 * rounds run; once the client reaps, they complete. No overflow, no broken
 * ring. */
static void test_exec_cq_room(void **state)
{
	struct xfix fx;
	struct xring x;
	x_setup(&fx, 128, 256, 64, 2, 1024);
	xring_open(&fx, &x, 8, 4, 1);
	const struct radiance_layer *l = &fx.layers[0];
	uint64_t in = 0, out = 1u << 20;
	fill_x(arena_at(&x, in), (size_t)8 * l->k);
	for (int i = 0; i < 4; i++)
		xsubmit(&x, fx.em.id, 8, in, out);
	double deadline = h_now() + 120.0;
	while (cq_ready(&x) < 4) {
		assert_true(h_now() < deadline);
		h_sleep_ms(1);
	}
	for (int i = 0; i < 4; i++)
		xsubmit(&x, fx.em.id, 8, in, out);
	for (int i = 0; i < 3; i++)
		x_ping(&fx);
	assert_int_equal(cq_ready(&x), 4);
	assert_int_equal(__atomic_load_n(&x.h->sq.head, __ATOMIC_ACQUIRE), 4);
	for (int i = 0; i < 8; i++) {
		uint64_t id;
		int status;
		xreap(&fx, &x, &id, &status, NULL, 0);
		assert_int_equal(status, 0);
		assert_int_equal(id, (uint64_t)i + 1);   /* one session, one layer: in order */
	}
	assert_false(x.broken);
	xring_close(&fx, &x, 0);
	x_teardown(&fx);
}

/* Sentinel in y until the daemon writes it: 0xFFFF is a NaN bf16 no row of
 * these inputs (finite, with a finite bias) can produce. */
#define Y_UNWRITTEN 0xFFFFu

/* Waits until the executor has taken the SQ entries submitted so far (its
 * head, an atomic in shared memory; y is not read while it may be written). */
static void wait_taken(struct xring *x)
{
	double deadline = h_now() + 120.0;
	while (__atomic_load_n(&x->h->sq.head, __ATOMIC_ACQUIRE) != x->client_sq.local) {
		assert_true(h_now() < deadline);
		h_sleep_ms(1);
	}
}

/* Holds the executor still in the middle of a round, as a hung device call
 * or lock would: it blocks on the model-reference lock of session w (which
 * references no model), held here, while taking w's request. Whatever the
 * test then submits (a job, a broken SQ) takes effect at a known point:
 * the executor finishes this round (a piece of each running request) and
 * then runs the jobs. */
static void x_wedge(struct xring *w)
{
	pthread_mutex_lock(&w->refs.lock);
	xsubmit(w, 7, 1, 0, 4096);
	wait_taken(w);
}

static void x_unwedge(struct xfix *fx, struct xring *w)
{
	pthread_mutex_unlock(&w->refs.lock);
	uint64_t id;
	int status;
	char err[200];
	xreap(fx, w, &id, &status, err, sizeof err);
	assert_int_equal(status, ENOENT);
	assert_non_null(strstr(err, "model_id 7 is not loaded by this session"));
}

/* A request of 4096 rows in pieces of one row on session x. */
static uint16_t *long_request(struct xfix *fx, struct xring *x, uint64_t *id)
{
	const struct radiance_layer *l = &fx->layers[0];
	const uint32_t m = 4096;
	uint64_t in = 0, out = (uint64_t)m * l->k * 2;
	fill_x(arena_at(x, in), (size_t)m * l->k);
	uint16_t *y = arena_at(x, out);
	for (size_t i = 0; i < (size_t)m * l->n; i++)
		y[i] = Y_UNWRITTEN;
	uint64_t got = xsubmit(x, fx->em.id, m, in, out);
	if (id)
		*id = got;
	/* taken: its first piece runs in this round, before any job after it */
	wait_taken(x);
	return y;
}

/* The mid-request tests' set-up: an executor serving pieces of one row,
 * session x with a request of 4096 rows running, session w to wedge with. */
static uint16_t *mid_request_setup(struct xfix *fx, struct xring *x, struct xring *w, uint64_t *id)
{
	x_setup(fx, 512, 512, 4096, 1, 4096);
	xring_open(fx, x, XR_SQ, XR_SQ, 1);
	xring_open(fx, w, XR_SQ, XR_SQ, 0);
	return long_request(fx, x, id);
}

/* Rows of y [m][n] written (not the sentinel): a prefix of them. */
static uint32_t rows_written(const uint16_t *y, uint32_t m, uint32_t n)
{
	uint32_t r = 0;
	while (r < m && y[(size_t)r * n + n - 1] != Y_UNWRITTEN)
		r++;
	for (uint32_t i = r; i < m; i++)
		for (uint32_t j = 0; j < n; j++)
			assert_int_equal(y[(size_t)i * n + j], Y_UNWRITTEN);
	return r;
}

/* Removed mid-request (no drain): the ring gets no result, the rest of y is
 * never written, and with the arena PROT_NONE the executor goes on serving
 * (a touch would fault). */
static void test_exec_ring_removed_mid_request(void **state)
{
	struct xfix fx;
	struct xring x, w;
	uint16_t *y = mid_request_setup(&fx, &x, &w, NULL);
	x_wedge(&w);
	struct xjob j;
	x_job_submit(&fx, &j, EXEC_JOB_RING_REMOVE, &x.r, NULL, 0);
	x_unwedge(&fx, &w);
	x_wait_flag(&fx, &j.done);
	assert_int_equal(j.job.status, 0);
	assert_int_equal(mprotect(x.r.arena, XR_ARENA, PROT_NONE), 0);
	for (int i = 0; i < 3; i++)
		x_ping(&fx);
	/* the executor still serves the others */
	xsubmit(&w, 7, 1, 0, 4096);
	uint64_t id;
	int status;
	xreap(&fx, &w, &id, &status, NULL, 0);
	assert_int_equal(status, ENOENT);
	assert_int_equal(mprotect(x.r.arena, XR_ARENA, PROT_READ | PROT_WRITE), 0);
	uint32_t done = rows_written(y, 4096, 512);
	assert_true(done >= 1 && done < 4096);   /* it was mid-request */
	assert_int_equal(cq_ready(&x), 0);
	assert_false(x.broken);
	xring_free(&x);
	xring_close(&fx, &w, 0);
	x_teardown(&fx);
}

/* The client breaks its SQ (tail far ahead) while its request runs in
 * pieces: the ring is reported broken once, its queued request is dropped
 * (y does not change after the notice), and removal finds nothing to do. */
static void test_exec_ring_broken_mid_request(void **state)
{
	struct xfix fx;
	struct xring x, w;
	uint16_t *y = mid_request_setup(&fx, &x, &w, NULL);
	size_t ybytes = (size_t)4096 * 512 * 2;
	x_wedge(&w);
	__atomic_store_n(&x.h->sq.tail, x.client_sq.local + 1000, __ATOMIC_RELEASE);
	rdoorbell_ring(x.r.sq_efd);
	x_unwedge(&fx, &w);
	x_wait_flag(&fx, &x.broken);
	assert_non_null(strstr(x.broken_err, "entries ahead of head"));
	uint16_t *snap = malloc(ybytes);
	memcpy(snap, y, ybytes);
	for (int i = 0; i < 3; i++)
		x_ping(&fx);
	assert_memory_equal(y, snap, ybytes);
	free(snap);
	uint32_t done = rows_written(y, 4096, 512);
	assert_true(done >= 1 && done < 4096);
	assert_int_equal(cq_ready(&x), 0);
	xring_close(&fx, &x, 0);
	xring_close(&fx, &w, 0);
	x_teardown(&fx);
}

/* The session releases the model while its request runs in pieces, and
 * the model is freed (its memory too, right after the job): the request is
 * answered ENOENT saying how far it got, exactly the rows it says are
 * written, and the freed model is not touched again (ASan would say). */
static void test_exec_model_released_mid_request(void **state)
{
	struct xfix fx;
	struct xring x, w;
	uint64_t want;
	uint16_t *y = mid_request_setup(&fx, &x, &w, &want);
	x_wedge(&w);
	assert_int_equal(exec_refs_remove(&x.refs, fx.em.id), 0);
	struct xjob j;
	x_job_submit(&fx, &j, EXEC_JOB_MODEL_FREE, NULL, &fx.em, 0);
	x_unwedge(&fx, &w);
	x_wait_flag(&fx, &j.done);
	x_release_model_memory(&fx);
	uint64_t id;
	int status;
	char err[200];
	xreap(&fx, &x, &id, &status, err, sizeof err);
	assert_int_equal(id, want);
	assert_int_equal(status, ENOENT);
	unsigned ran = 0, of = 0;
	const char *p = strstr(err, "model 7 was released while the request was in flight (");
	assert_non_null(p);
	assert_int_equal(sscanf(strchr(p, '(') + 1, "%u of its %u rows had run", &ran, &of), 2);
	assert_int_equal(of, 4096);
	assert_int_equal(rows_written(y, 4096, 512), ran);
	assert_true(ran >= 1 && ran < 4096);
	for (int i = 0; i < 3; i++)
		x_ping(&fx);
	assert_int_equal(cq_ready(&x), 0);
	xring_close(&fx, &x, 0);
	xring_close(&fx, &w, 0);
	x_teardown(&fx);
}

/* The watchdog's view. Idle: alive however long. Wedged (the executor
 * blocks on a session's model-reference lock that this test holds, as it
 * would in a hung device call): its progress stands still and it is not
 * idle, so after one timeout it is reported dead, not before. Released, it
 * completes the request and is alive again. And every piece of a request
 * counts as progress, so a busy executor keeps the watchdog fed. */
/* ---- the executor's round, inline --------------------------------------- */

struct ireq {
	int ring;                /* which session */
	uint32_t layer, rows;
};

/* Submits v[0..n) (each session's x at offset 0 of its arena, filled here,
 * y at 1 MiB), runs one round inline, checks every result and output
 * against the CPU reference, and returns the launches the round made. A
 * session submits at most one request per call. */
static uint64_t iround(struct radiance_executor *e, struct xring *x, const struct radiance_layer *layers,
		       uint32_t model_id, const struct ireq *v, size_t n)
{
	const uint64_t out_off = 1u << 20;
	uint64_t id[8];
	assert_true(n <= 8);
	for (size_t i = 0; i < n; i++) {
		const struct radiance_layer *l = &layers[v[i].layer];
		fill_x(arena_at(&x[v[i].ring], 0), (size_t)v[i].rows * l->k);
		id[i] = xsubmit_layer(&x[v[i].ring], model_id, v[i].layer, v[i].rows, 0, out_off);
	}
	uint64_t before = executor__launches(e);
	executor__serve(e);
	uint64_t launches = executor__launches(e) - before;
	for (size_t i = 0; i < n; i++) {
		struct xring *r = &x[v[i].ring];
		const struct radiance_layer *l = &layers[v[i].layer];
		uint8_t buf[RADIANCE_SLOT_BYTES];
		int len = rring_pop(&r->client_cq, buf);
		assert_true(len > 0);   /* one round ran it whole: the result is there */
		Rdw__LinearResult *res = rdw__linear_result__unpack(NULL, (size_t)len, buf);
		assert_non_null(res);
		assert_int_equal(res->request_id, id[i]);
		assert_int_equal(res->status, 0);
		rdw__linear_result__free_unpacked(res, NULL);
		uint16_t *want = malloc((size_t)v[i].rows * l->n * 2);
		assert_non_null(want);
		cpu_ref(l, arena_at(r, 0), v[i].rows, want);
		assert_memory_equal(arena_at(r, out_off), want, (size_t)v[i].rows * l->n * 2);
		free(want);
	}
	return launches;
}

/* The grouping of executor.h, seen one round at a time: requests of
 * different sessions for one layer share a launch (rows stacked), another
 * layer's request gets its own, a group stops at max_rows, and requests of
 * several layers share one when they name the same layers in the same
 * order. Each output is the CPU reference's bits, so stacking put every
 * row where it belongs. */
static void test_exec_groups_sessions(void **state)
{
	char err[256];
	static struct stats_counters global;
	stats_init(&global);
	struct executor_options o = {
		.backend = { .kind = "cpu", .device = -1, .max_rows = 16, .max_decode_rows = 16,
			     .max_n = 256, .max_k = 512 },
		.max_rings = 4,
		.chunk_rows = 16,
		.session_rows = 1024,
		.global_stats = &global,
	};
	struct radiance_executor *e;
	if (executor__create_inline(&o, &e, err, sizeof err) < 0)
		fail_msg("executor__create_inline: %s", err);
	assert_int_equal(executor__sched(e)->max_rows, 16);
	struct radiance_layer layers[2];
	layer_init(&layers[0], "group.a", 256, 512);
	layer_init(&layers[1], "group.b", 128, 512);
	struct radiance_model model = { .name = (char *)"group", .layers = layers, .n_layers = 2,
					.group_size = 128, .bits = 4 };
	struct radiance_backend_layer *handles[2];
	struct exec_model em = { .id = 3, .model = &model, .handles = handles, .uploaded = 2 };
	for (int i = 0; i < 2; i++)
		assert_int_equal(radiance_backend_layer_upload(executor__backend(e), &layers[i],
							       &handles[i], err, sizeof err), 0);
	struct xring x[3];
	for (int i = 0; i < 3; i++) {
		xring_make(&x[i], XR_SQ, XR_SQ, &em);
		assert_int_equal(executor__ring_add(e, &x[i].r, err, sizeof err), 0);
	}

	/* sessions 0 and 1 on layer 0 (5 + 7 rows: one launch), 2 on layer 1 */
	const struct ireq r1[] = { { 0, 0, 5 }, { 1, 0, 7 }, { 2, 1, 3 } };
	assert_int_equal(iround(e, x, layers, em.id, r1, 3), 2);
	/* 9 + 9 rows of one layer exceed max_rows 16: two launches */
	const struct ireq r2[] = { { 0, 0, 9 }, { 1, 0, 9 } };
	assert_int_equal(iround(e, x, layers, em.id, r2, 2), 2);
	/* three sessions, one row each, one layer: one launch */
	const struct ireq r3[] = { { 0, 1, 1 }, { 1, 1, 1 }, { 2, 1, 1 } };
	assert_int_equal(iround(e, x, layers, em.id, r3, 3), 1);
	/* one session alone: one launch per request */
	const struct ireq r4[] = { { 2, 0, 2 } };
	assert_int_equal(iround(e, x, layers, em.id, r4, 1), 1);

	/* several layers: sessions 0 and 1 with [a, b] share a launch (one
	 * backend call for both layers of both), session 2's [b, a] is
	 * another list: its own launch */
	const uint64_t outs[2] = { 1u << 20, 2u << 20 };
	const uint32_t ab[2] = { 0, 1 }, ba[2] = { 1, 0 };
	const uint32_t *lists[3] = { ab, ab, ba };
	const uint32_t mrows[3] = { 3, 4, 2 };
	uint64_t mid[3];
	for (int i = 0; i < 3; i++) {
		fill_x(arena_at(&x[i], 0), (size_t)mrows[i] * 512);
		Rdw__LinearRequest req = RDW__LINEAR_REQUEST__INIT;
		uint32_t extra = lists[i][1];
		uint64_t extra_out = outs[1];
		req.request_id = mid[i] = x[i].next_id++;
		req.model_id = em.id;
		req.layer = lists[i][0];
		req.rows = mrows[i];
		req.dtype = RDW__DTYPE__DTYPE_BF16;
		req.output_offset = outs[0];
		req.n_extra_layers = req.n_extra_output_offsets = 1;
		req.extra_layers = &extra;
		req.extra_output_offsets = &extra_out;
		uint8_t buf[RADIANCE_SLOT_BYTES - 4];
		int len = rproto_pack_slot(&req.base, buf, sizeof buf);
		assert_true(len > 0);
		assert_int_equal(rring_push(&x[i].client_sq, buf, (size_t)len), 0);
	}
	uint64_t before = executor__launches(e);
	executor__serve(e);
	assert_int_equal(executor__launches(e) - before, 2);
	for (int i = 0; i < 3; i++) {
		uint8_t buf[RADIANCE_SLOT_BYTES];
		int len = rring_pop(&x[i].client_cq, buf);
		assert_true(len > 0);
		Rdw__LinearResult *res = rdw__linear_result__unpack(NULL, (size_t)len, buf);
		assert_non_null(res);
		assert_int_equal(res->request_id, mid[i]);
		assert_int_equal(res->status, 0);
		rdw__linear_result__free_unpacked(res, NULL);
		for (int j = 0; j < 2; j++) {
			const struct radiance_layer *l = &layers[lists[i][j]];
			uint16_t *want = malloc((size_t)mrows[i] * l->n * 2);
			assert_non_null(want);
			cpu_ref(l, arena_at(&x[i], 0), mrows[i], want);
			assert_memory_equal(arena_at(&x[i], outs[j]), want, (size_t)mrows[i] * l->n * 2);
			free(want);
		}
	}

	assert_null(executor__take_done(e));   /* no ring broke */
	for (int i = 0; i < 3; i++) {
		assert_int_equal(executor__ring_remove(e, &x[i].r), 0);
		assert_false(x[i].broken);
		xring_free(&x[i]);
	}
	for (int i = 0; i < 2; i++)
		radiance_backend_layer_free(executor__backend(e), handles[i]);
	executor__destroy_inline(e);
	for (int i = 0; i < 2; i++) {
		free(layers[i].name);
		free(layers[i].qweight);
		free(layers[i].scales);
		free(layers[i].bias);
	}
}

/* ---- shares and rows in flight, inline ---------------------------------- */

/* The requests one session has submitted and not yet seen answered; each
 * uses its own arena slot (x at slot x 256K, y at 4M + slot x 128K). */
#define FL_SLOTS 8
struct fl {
	uint64_t id[FL_SLOTS];     /* 0: slot free */
	uint32_t rows[FL_SLOTS];
	uint64_t submitted, completed, completed_rows;
};

static uint64_t fl_in(int slot)
{
	return (uint64_t)slot << 18;
}

static uint64_t fl_out(int slot)
{
	return (4u << 20) + ((uint64_t)slot << 17);
}

static size_t fl_outstanding(const struct fl *f)
{
	size_t n = 0;
	for (int i = 0; i < FL_SLOTS; i++)
		n += f->id[i] != 0;
	return n;
}

static void fl_submit(struct xring *x, struct fl *f, const struct radiance_layer *l,
		      uint32_t model_id, uint32_t rows)
{
	int slot = 0;
	while (slot < FL_SLOTS && f->id[slot])
		slot++;
	assert_true(slot < FL_SLOTS);
	fill_x(arena_at(x, fl_in(slot)), (size_t)rows * l->k);
	f->id[slot] = xsubmit_layer(x, model_id, 0, rows, fl_in(slot), fl_out(slot));
	f->rows[slot] = rows;
	f->submitted++;
}

/* Takes every result in x's CQ: each must answer an outstanding request
 * (once), with status 0 and the CPU kernel's bits. Returns how many. */
static size_t fl_reap(struct xring *x, struct fl *f, const struct radiance_layer *l)
{
	uint8_t buf[RADIANCE_SLOT_BYTES];
	size_t n = 0;
	int len;
	while ((len = rring_pop(&x->client_cq, buf)) > 0) {
		Rdw__LinearResult *res = rdw__linear_result__unpack(NULL, (size_t)len, buf);
		assert_non_null(res);
		if (res->status != 0)
			fail_msg("request %llu failed: status %u: %s",
				 (unsigned long long)res->request_id, res->status,
				 res->error ? res->error : "");
		int slot = 0;
		while (slot < FL_SLOTS && f->id[slot] != res->request_id)
			slot++;
		assert_true(slot < FL_SLOTS);   /* an outstanding request, answered once */
		rdw__linear_result__free_unpacked(res, NULL);
		uint16_t *want = malloc((size_t)f->rows[slot] * l->n * 2);
		assert_non_null(want);
		cpu_ref(l, arena_at(x, fl_in(slot)), f->rows[slot], want);
		assert_memory_equal(arena_at(x, fl_out(slot)), want, (size_t)f->rows[slot] * l->n * 2);
		free(want);
		f->id[slot] = 0;
		f->completed++;
		f->completed_rows += f->rows[slot];
		n++;
	}
	assert_int_equal(len, 0);
	return n;
}

/* An inline executor on the CPU backend with one 256 x 512 layer (model
 * id 3) and nr rings, ring i of owner owner[i] with weight weight[i] (as
 * session.c sets them from the peer uid and sched_uid_weights). */
struct ifix {
	struct radiance_executor *e;
	struct radiance_layer layer;
	struct radiance_model model;
	struct radiance_backend_layer *handle;
	struct exec_model em;
	struct xring x[4];
	size_t nr;
};

static void ifix_open(struct ifix *fx, uint32_t session_rows, size_t nr, const uint64_t *owner,
		      const uint32_t *weight)
{
	char err[256];
	static struct stats_counters global;
	stats_init(&global);
	struct executor_options o = {
		.backend = { .kind = "cpu", .device = -1, .max_rows = 256, .max_decode_rows = 16,
			     .max_n = 256, .max_k = 512 },
		.max_rings = 4,
		.chunk_rows = 16,
		.session_rows = session_rows,
		.global_stats = &global,
	};
	memset(fx, 0, sizeof *fx);
	if (executor__create_inline(&o, &fx->e, err, sizeof err) < 0)
		fail_msg("executor__create_inline: %s", err);
	layer_init(&fx->layer, "share", 256, 512);
	fx->model = (struct radiance_model){ .name = (char *)"share", .layers = &fx->layer,
					     .n_layers = 1, .group_size = 128, .bits = 4 };
	fx->em = (struct exec_model){ .id = 3, .model = &fx->model, .handles = &fx->handle,
				      .uploaded = 1 };
	assert_int_equal(radiance_backend_layer_upload(executor__backend(fx->e), &fx->layer,
						       &fx->handle, err, sizeof err), 0);
	fx->nr = nr;
	for (size_t i = 0; i < nr; i++) {
		xring_make(&fx->x[i], XR_SQ, XR_SQ, &fx->em);
		sched_flow_set_owner(&fx->x[i].r.flow, owner[i], weight[i]);
		assert_int_equal(executor__ring_add(fx->e, &fx->x[i].r, err, sizeof err), 0);
	}
}

static void ifix_close(struct ifix *fx)
{
	assert_null(executor__take_done(fx->e));   /* no ring broke */
	for (size_t i = 0; i < fx->nr; i++) {
		assert_int_equal(executor__ring_remove(fx->e, &fx->x[i].r), 0);
		assert_false(fx->x[i].broken);
		xring_free(&fx->x[i]);
	}
	radiance_backend_layer_free(executor__backend(fx->e), fx->handle);
	executor__destroy_inline(fx->e);
	free(fx->layer.name);
	free(fx->layer.qweight);
	free(fx->layer.scales);
	free(fx->layer.bias);
}

/* Device-time shares through the executor: three sessions flood the same
 * layer with 64-row requests (4 pieces of 16), always two queued, from
 * uids 1000 and 1001 at weight 1 and uid 1002 at weight 2. Over 48 passes
 * the rows they got done are in the ratio 1 : 1 : 2 within one request
 * (64 rows) each; the pieces of one pass share one launch. Then they stop
 * submitting: every request they made is answered once, with status 0 and
 * the CPU kernel's bits (fl_reap checks each). */
static void test_exec_shares(void **state)
{
	struct ifix fx;
	const uint64_t owner[3] = { 1000, 1001, 1002 };
	const uint32_t weight[3] = { 1, 1, 2 };
	ifix_open(&fx, 1024, 3, owner, weight);
	struct fl f[3] = { 0 };
	const int passes = 48;
	uint64_t launches = 0;
	for (int p = 0; p < passes; p++) {
		for (int i = 0; i < 3; i++)
			while (fl_outstanding(&f[i]) < 2)
				fl_submit(&fx.x[i], &f[i], &fx.layer, fx.em.id, 64);
		uint64_t before = executor__launches(fx.e);
		assert_true(executor__serve(fx.e) > 0);
		launches += executor__launches(fx.e) - before;
		for (int i = 0; i < 3; i++)
			fl_reap(&fx.x[i], &f[i], &fx.layer);
	}
	uint64_t total = f[0].completed_rows + f[1].completed_rows + f[2].completed_rows;
	print_message("shares over %d passes: rows %llu, %llu, %llu (weights 1, 1, 2); %llu launches\n",
		      passes, (unsigned long long)f[0].completed_rows,
		      (unsigned long long)f[1].completed_rows, (unsigned long long)f[2].completed_rows,
		      (unsigned long long)launches);
	/* one piece a pass for the weight-2 session, one every second pass
	 * for the others: 48 x 16 rows of work for it, 24 x 16 for each */
	assert_int_equal(total, 1536);
	for (int i = 0; i < 3; i++) {
		int64_t want = (int64_t)total * weight[i] / 4;
		int64_t got = (int64_t)f[i].completed_rows;
		assert_true(got >= want - 64 && got <= want + 64);
	}
	assert_int_equal(launches, passes);
	/* drain: nothing lost, nothing failed */
	for (int p = 0; p < 64 && fl_outstanding(&f[0]) + fl_outstanding(&f[1]) +
				      fl_outstanding(&f[2]); p++) {
		executor__serve(fx.e);
		for (int i = 0; i < 3; i++)
			fl_reap(&fx.x[i], &f[i], &fx.layer);
	}
	for (int i = 0; i < 3; i++) {
		assert_int_equal(fl_outstanding(&f[i]), 0);
		assert_int_equal(f[i].completed, f[i].submitted);
	}
	ifix_close(&fx);
}

/* Rows in flight (sched_session_rows 100): a session submits requests of
 * 40, 40, 40, 40, 150 and 10 rows at once. Before each pass the test works
 * out, from the results seen so far, what the rule allows: requests are
 * taken in order while the rows taken and not answered plus the next
 * request's stay within 100, or when nothing is held (the 150-row one then
 * runs alone). The executor's SQ head must be exactly there after the
 * pass: a session at its cap gets no more SQ entries taken until results
 * free rows, and the rest wait in the SQ, not refused. Every request is
 * answered once, status 0, the CPU kernel's bits. */
static void test_exec_rows_in_flight(void **state)
{
	struct ifix fx;
	const uint64_t owner[1] = { 1000 };
	const uint32_t weight[1] = { 1 };
	ifix_open(&fx, 100, 1, owner, weight);
	struct xring *x = &fx.x[0];
	struct fl f = { 0 };
	const uint32_t rows[6] = { 40, 40, 40, 40, 150, 10 };
	for (int i = 0; i < 6; i++)
		fl_submit(x, &f, &fx.layer, fx.em.id, rows[i]);
	uint32_t taken = 0, answered = 0, held_rows = 0;
	int waited = 0, alone = 0;
	for (int p = 0; p < 200 && f.completed < 6; p++) {
		/* the rule, on what the test knows */
		while (taken < 6 && (held_rows == 0 || held_rows + rows[taken] <= 100))
			held_rows += rows[taken++];
		waited += taken < 6;
		alone += held_rows > 100;
		executor__serve(fx.e);
		assert_int_equal(x->r.sq.local, taken);
		assert_int_equal(rring_ready(&x->r.sq), 6 - taken);
		size_t n = fl_reap(x, &f, &fx.layer);
		/* results come in the order taken */
		for (size_t i = 0; i < n; i++)
			held_rows -= rows[answered++];
		assert_int_equal(x->r.flow.rows, held_rows);
	}
	assert_int_equal(f.completed, 6);
	assert_int_equal(x->r.flow.n, 0);
	assert_true(waited > 0);   /* the cap held requests back ... */
	assert_true(alone > 0);    /* ... and the big one ran alone */
	print_message("rows in flight <= 100: %d passes with requests held in the SQ, %d with the "
		      "150-row request alone\n", waited, alone);
	ifix_close(&fx);
}

static void test_watchdog_liveness(void **state)
{
	struct xfix fx;
	struct xring x;
	const uint64_t T = 1000000000ull;   /* the timeout passed to the verdict */
	x_setup(&fx, 256, 256, 512, 1, 1024);
	xring_open(&fx, &x, XR_SQ, XR_SQ, 1);
	const struct radiance_layer *l = &fx.layers[0];
	struct exec_liveness lv;
	struct exec_watch w = { 0 };

	double deadline = h_now() + 120.0;
	do {
		assert_true(h_now() < deadline);
		h_sleep_ms(1);
		executor_liveness(fx.e, &lv);
	} while (!lv.idle);
	assert_true(exec_watch_alive(&w, &lv, 0, T));
	assert_true(exec_watch_alive(&w, &lv, 50 * T, T));

	/* wedge it */
	uint64_t in = 0, out = 1u << 20;
	fill_x(arena_at(&x, in), (size_t)512 * l->k);
	pthread_mutex_lock(&x.refs.lock);
	xsubmit(&x, fx.em.id, 1, in, out);
	while (__atomic_load_n(&x.h->sq.head, __ATOMIC_ACQUIRE) != 1) {
		assert_true(h_now() < deadline);
		h_sleep_ms(1);
	}
	/* popped: from here to the lock nothing counts as progress */
	struct exec_liveness l1, l2;
	executor_liveness(fx.e, &l1);
	assert_false(l1.idle);
	const uint64_t t0 = 100 * T;
	w = (struct exec_watch){ 0 };
	assert_true(exec_watch_alive(&w, &l1, t0, T));   /* a first look starts the clock */
	h_sleep_ms(20);
	executor_liveness(fx.e, &l2);
	assert_int_equal(l2.progress, l1.progress);
	assert_false(l2.idle);
	assert_true(exec_watch_alive(&w, &l2, t0 + T - 1, T));
	assert_false(exec_watch_alive(&w, &l2, t0 + T, T));
	assert_false(exec_watch_alive(&w, &l2, t0 + 5 * T, T));
	pthread_mutex_unlock(&x.refs.lock);

	uint64_t id;
	int status;
	xreap(&fx, &x, &id, &status, NULL, 0);
	assert_int_equal(status, 0);
	executor_liveness(fx.e, &l2);
	assert_true(l2.progress != l1.progress);
	assert_true(exec_watch_alive(&w, &l2, t0 + 6 * T, T));

	/* a 512-row request in pieces of one row: at least 512 steps */
	xsubmit(&x, fx.em.id, 512, in, out);
	xreap(&fx, &x, &id, &status, NULL, 0);
	assert_int_equal(status, 0);
	executor_liveness(fx.e, &l1);
	assert_true(l1.progress - l2.progress >= 512);
	xring_close(&fx, &x, 0);
	x_teardown(&fx);
}

/* ---- the daemon -------------------------------------------------------- */

/* The biggest layer a quick test affords on the CPU backend: 2048 x 2048
 * (about 0.6 ms a row here, 20 times that under TSan). The daemon runs
 * with max_rows 256 and pieces of 32 rows; the flood's requests are
 * max-row ones, 32 in flight: before the scheduler one pass took them all,
 * 256 pieces' time, while the others waited. */
#define BIG_N 2048u
#define BIG_K 2048u
#define CHUNK 32u
#define CHUNK_ARG "32"
#define FLOOD_ROWS 256u
#define FLOOD_ROWS_ARG "256"
#define FLOOD_DEPTH 32u
#define PROBES 16u
#define LAYER_NAME "encoder.layer.0.big.dense"
/* The bounds, in quiet-daemon measurements (see the file comment): an M=1
 * request under the flood should wait about one piece (a round holds one
 * piece of the flood, and decode runs first); the bound leaves room for
 * the machine's load to change between the quiet and the loaded phase. */
#define BOUND_CHUNKS 10.0
#define BOUND_QUIET 4.0
/* The watchdog test: WatchdogSec of this many pieces, but at least
 * WD_FLOOR_S (the loop feeds at half the interval: the floor keeps the
 * loop's and this thread's scheduling delays on a loaded machine small
 * against it; the flood's pass before the scheduler took 256 pieces, far
 * beyond either), watched this many intervals. */
#define WD_CHUNKS 8.0
#define WD_FLOOR_S 0.5
#define WD_WINDOW 2.5

static char *ckpt_dir;
static struct radiance_model *local;   /* the checkpoint loaded here, for the reference */
static const struct radiance_layer *big;
static uint16_t *flood_x, *flood_want;   /* [FLOOD_ROWS][BIG_K], [FLOOD_ROWS][BIG_N] */

static int group_setup(void **state)
{
	rlog_init(RADIANCE_LOG_WARN);
	ckpt_dir = tmpdir_create();
	struct stw w;
	stw_init(&w);
	stw_add_w4(&w, LAYER_NAME, BIG_N, BIG_K, code_mix, scale_mix);
	char path[4200], err[512];
	int rc = stw_write(&w, path_join(path, sizeof path, ckpt_dir, "model.safetensors"));
	stw_finish(&w);
	if (rc != 0)
		return -1;
	rc = write_text(path_join(path, sizeof path, ckpt_dir, "config.json"),
			"{\"architectures\": [\"BertModel\"],"
			" \"quantization_config\": {"
			"  \"quant_method\": \"auto-round\", \"packing_format\": \"auto_round:auto_gptq\","
			"  \"bits\": 4, \"group_size\": 128, \"sym\": true, \"data_type\": \"int\","
			"  \"block_name_to_quantize\": \"encoder.layer\"}}");
	if (rc != 0)
		return -1;
	if (radiance_checkpoint_load_dir(ckpt_dir, NULL, NULL, NULL, &local, err, sizeof err) < 0) {
		fprintf(stderr, "loading %s: %s\n", ckpt_dir, err);
		return -1;
	}
	long li = radiance_model_find_layer(local, LAYER_NAME);
	if (li < 0 || local->layers[li].kind != RADIANCE_LAYER_W4A8)
		return -1;
	big = &local->layers[li];
	flood_x = malloc((size_t)FLOOD_ROWS * BIG_K * 2);
	flood_want = malloc((size_t)FLOOD_ROWS * BIG_N * 2);
	if (!flood_x || !flood_want)
		return -1;
	fill_x(flood_x, (size_t)FLOOD_ROWS * BIG_K);
	cpu_ref(big, flood_x, FLOOD_ROWS, flood_want);   /* the whole request at once */
	return 0;
}

static int group_teardown(void **state)
{
	free(flood_x);
	free(flood_want);
	radiance_model_destroy(local);
	tmpdir_remove(ckpt_dir);
	return 0;
}

struct client {
	struct radiance *r;
	uint32_t id;
	uint32_t layer;
};

static void client_open(struct client *c, const char *socket, const char *name)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = name;
	o.timeout_ms = 600000;
	c->r = radiance_connect(socket, &o);
	if (!c->r)
		fail_msg("%s: connect: %s", name, radiance_strerror(errno));
	int rc = radiance_load_model(c->r, ckpt_dir, NULL, &c->id);
	if (rc < 0)
		fail_msg("%s: load: %s", name, radiance_error_message(c->r));
	int li = radiance_find_layer(radiance_held_model(c->r, c->id), LAYER_NAME);
	assert_true(li >= 0);
	c->layer = (uint32_t)li;
}

/* One client keeping FLOOD_DEPTH requests of FLOOD_ROWS rows in flight on
 * the big layer until told to stop. All of them read one x and write one y
 * (equal values, so overlapping writes are harmless); y is copied out
 * after a completion (later requests only write the same bits again) and
 * checked. Told to stop, it hangs up with its requests in flight: the
 * daemon drops them. */
struct flood {
	const char *socket;
	uint16_t *y;                 /* [FLOOD_ROWS][BIG_N], copied out at the end */
	atomic_int stop;
	atomic_uint completed;
	int failed;
	char why[256];
};

static void *flood_main(void *arg)
{
	struct flood *f = arg;
	struct client c;
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "flood";
	o.timeout_ms = 600000;
	c.r = radiance_connect(f->socket, &o);
	if (!c.r || radiance_load_model(c.r, ckpt_dir, NULL, &c.id) < 0) {
		f->failed = 1;
		snprintf(f->why, sizeof f->why, "connect/load failed");
		atomic_store(&f->completed, ~0u);
		if (c.r)
			radiance_disconnect(c.r);
		return NULL;
	}
	c.layer = (uint32_t)radiance_find_layer(radiance_held_model(c.r, c.id), LAYER_NAME);
	size_t xb = (size_t)FLOOD_ROWS * BIG_K * 2, yb = (size_t)FLOOD_ROWS * BIG_N * 2;
	void *ax = radiance_arena_alloc(c.r, xb), *ay = radiance_arena_alloc(c.r, yb);
	if (!ax || !ay) {
		f->failed = 1;
		snprintf(f->why, sizeof f->why, "arena_alloc: %s", strerror(errno));
		goto out;
	}
	memcpy(ax, flood_x, xb);
	for (unsigned i = 0; i < FLOOD_DEPTH; i++) {
		int rc = radiance_submit(c.r, c.id, c.layer, FLOOD_ROWS, RADIANCE_BF16, ax, ay, NULL);
		if (rc < 0) {
			f->failed = 1;
			snprintf(f->why, sizeof f->why, "submit: %s", radiance_strerror(rc));
			goto out;
		}
	}
	for (;;) {
		struct radiance_completion cp;
		int rc = radiance_wait(c.r, &cp, -1);
		if (rc < 0 || cp.status != 0) {
			f->failed = 1;
			snprintf(f->why, sizeof f->why, "wait: %s / status %d %s", radiance_strerror(rc),
				 cp.status, cp.error ? cp.error : "");
			goto out;
		}
		atomic_fetch_add(&f->completed, 1);
		if (atomic_load(&f->stop)) {
			memcpy(f->y, ay, yb);
			break;
		}
		rc = radiance_submit(c.r, c.id, c.layer, FLOOD_ROWS, RADIANCE_BF16, ax, ay, NULL);
		if (rc < 0) {
			f->failed = 1;
			snprintf(f->why, sizeof f->why, "submit: %s", radiance_strerror(rc));
			goto out;
		}
	}
out:
	radiance_disconnect(c.r);
	return NULL;
}

static void flood_start(struct flood *f, pthread_t *t, const char *socket)
{
	memset(f, 0, sizeof *f);
	f->socket = socket;
	f->y = malloc((size_t)FLOOD_ROWS * BIG_N * 2);
	assert_non_null(f->y);
	assert_int_equal(pthread_create(t, NULL, flood_main, f), 0);
	/* in full swing: its first request done (before the scheduler, that
	 * took a whole pass of FLOOD_DEPTH requests) */
	double deadline = h_now() + 600.0;
	while (atomic_load(&f->completed) == 0) {
		assert_true(h_now() < deadline);
		h_sleep_ms(2);
	}
	if (f->failed)
		fail_msg("flood: %s", f->why);
}

/* Stops the flood and checks its output: 256 rows run in pieces of 32 give
 * the CPU kernel's bits for the whole request. */
static void flood_finish(struct flood *f, pthread_t t)
{
	atomic_store(&f->stop, 1);
	pthread_join(t, NULL);
	if (f->failed)
		fail_msg("flood: %s", f->why);
	assert_memory_equal(f->y, flood_want, (size_t)FLOOD_ROWS * BIG_N * 2);
	free(f->y);
}

/* One M-row request through radiance_linear, timed; y checked bit for bit. */
static double timed_linear(struct client *c, const uint16_t *x, uint32_t m, uint16_t *y,
			   const uint16_t *want)
{
	double t = h_now();
	int rc = radiance_linear(c->r, c->id, c->layer, m, RADIANCE_BF16, x, y);
	t = h_now() - t;
	if (rc < 0)
		fail_msg("linear(%u rows): %s (%s)", m, radiance_strerror(rc),
			 radiance_error_message(c->r));
	assert_memory_equal(y, want, (size_t)m * BIG_N * 2);
	return t;
}

/* A new client's connect (Hello, Welcome) and ring set-up (the RING_ADD job
 * the executor runs between rounds), timed. */
static double timed_setup(const char *socket)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "newcomer";
	o.timeout_ms = 600000;
	double t = h_now();
	struct radiance *r = radiance_connect(socket, &o);
	if (!r)
		fail_msg("newcomer: connect: %s", radiance_strerror(errno));
	int rc = radiance_open_rings(r);
	t = h_now() - t;
	if (rc < 0)
		fail_msg("newcomer: open_rings: %s", radiance_strerror(rc));
	radiance_disconnect(r);
	return t;
}

static void test_flood_decode_latency(void **state)
{
	struct h_daemon d;
	static const char *const args[] = { "--sched-chunk-rows", CHUNK_ARG, "--max-rows",
					    FLOOD_ROWS_ARG, NULL };
	assert_int_equal(h_daemon_start_argv(&d, args), 0);
	struct client probe;
	client_open(&probe, d.socket, "probe");

	uint16_t *x = malloc((size_t)PROBES * BIG_K * 2), *want = malloc((size_t)PROBES * BIG_N * 2);
	uint16_t *xc = malloc((size_t)CHUNK * BIG_K * 2), *wantc = malloc((size_t)CHUNK * BIG_N * 2);
	uint16_t *y = malloc((size_t)CHUNK * BIG_N * 2);
	fill_x(x, (size_t)PROBES * BIG_K);
	fill_x(xc, (size_t)CHUNK * BIG_K);
	cpu_ref(big, x, PROBES, want);   /* rows are independent: row i is probe i's */
	cpu_ref(big, xc, CHUNK, wantc);

	/* quiet: one piece's time, M=1 and set-up latencies */
	double chunk[5], quiet[PROBES], setup_quiet[3], loaded[PROBES], setup_loaded[3];
	for (int i = 0; i < 5; i++)
		chunk[i] = timed_linear(&probe, xc, CHUNK, y, wantc);
	for (unsigned i = 0; i < PROBES; i++)
		quiet[i] = timed_linear(&probe, x + (size_t)i * BIG_K, 1, y, want + (size_t)i * BIG_N);
	for (int i = 0; i < 3; i++)
		setup_quiet[i] = timed_setup(d.socket);
	double t_chunk = median(chunk, 5), q_max = maxof(quiet, PROBES);
	double s_max = maxof(setup_quiet, 3);
	double bound = BOUND_CHUNKS * t_chunk + BOUND_QUIET * q_max;
	double s_bound = BOUND_CHUNKS * t_chunk + BOUND_QUIET * s_max;

	struct flood f;
	pthread_t t;
	flood_start(&f, &t, d.socket);
	for (unsigned i = 0; i < PROBES; i++) {
		loaded[i] = timed_linear(&probe, x + (size_t)i * BIG_K, 1, y, want + (size_t)i * BIG_N);
		double setup = i < 3 ? setup_loaded[i] = timed_setup(d.socket) : 0;
		if (loaded[i] > bound || setup > s_bound)
			fail_msg("under the flood, M=1 request %u took %.1f ms (bound %.1f ms: %.0f x "
				 "%.1f ms a %u-row piece + %.0f x %.2f ms quiet M=1) and a new "
				 "client's connect + ring set-up %.1f ms (bound %.1f ms)", i,
				 loaded[i] * 1e3, bound * 1e3, BOUND_CHUNKS, t_chunk * 1e3, CHUNK,
				 BOUND_QUIET, q_max * 1e3, setup * 1e3, s_bound * 1e3);
	}
	unsigned done_during = atomic_load(&f.completed);
	flood_finish(&f, t);
	fprintf(stderr,
		"%u-row piece %.1f ms; M=1 quiet median %.2f max %.2f ms; under the flood (%u "
		"requests of %u rows done) median %.2f max %.2f ms (bound %.1f); set-up quiet max "
		"%.2f ms, under the flood max %.2f ms (bound %.1f)\n",
		CHUNK, t_chunk * 1e3, median(quiet, PROBES) * 1e3, q_max * 1e3, done_during,
		FLOOD_ROWS, median(loaded, PROBES) * 1e3, maxof(loaded, PROBES) * 1e3, bound * 1e3,
		s_max * 1e3, maxof(setup_loaded, 3) * 1e3, s_bound * 1e3);

	radiance_disconnect(probe.r);
	free(x);
	free(want);
	free(xc);
	free(wantc);
	free(y);
	int st = h_daemon_stop(&d);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- shares by uid on the real daemon ------------------------------------ */

/* Two flooding sessions of two uids, root weighing SHARE_W_ROOT and
 * SHARE_UID SHARE_W_OTHER (sched_uid_weights), each keeping SHARE_DEPTH
 * max-row requests of one piece (CHUNK rows, max_rows CHUNK: a request
 * is a launch, so a completion is a piece) in flight on the big layer. */
#define SHARE_UID 65534u
#define SHARE_W_ROOT 3u
#define SHARE_W_OTHER 1u
#define SHARE_WEIGHTS "0:3,65534:1"
#define SHARE_DEPTH 8u
/* requests of both served between the two snapshots; the other uid's
 * fraction of them must be within SHARE_TOL of its weight's */
#define SHARE_WINDOW 96u
#define SHARE_TOL 0.06
#define SHARE_MODEL "shares"

/* A forked client (as uid, unless 0) flooding SHARE_MODEL until stop_fd
 * becomes readable (its write end closed); every result checked bit for
 * bit. Exits 0, or 2..6 saying where it failed. */
static void share_child(const char *socket, uid_t uid, const char *name, int stop_fd)
{
	if (uid && (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
		    setresuid(uid, uid, uid) < 0))
		_exit(2);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = name;
	o.timeout_ms = 600000;
	struct radiance *r = radiance_connect(socket, &o);
	uint32_t id;
	if (!r || radiance_attach_model(r, SHARE_MODEL, &id) < 0) {
		fprintf(stderr, "%s: connect/attach: %s\n", name,
			r ? radiance_error_message(r) : strerror(errno));
		_exit(3);
	}
	int li = radiance_find_layer(radiance_held_model(r, id), LAYER_NAME);
	size_t xb = (size_t)CHUNK * BIG_K * 2, yb = (size_t)CHUNK * BIG_N * 2;
	void *ax = radiance_arena_alloc(r, xb), *ay = radiance_arena_alloc(r, yb);
	if (li < 0 || !ax || !ay)
		_exit(4);
	memcpy(ax, flood_x, xb);   /* rows are independent: want is flood_want's first rows */
	for (unsigned i = 0; i < SHARE_DEPTH; i++)
		if (radiance_submit(r, id, (uint32_t)li, CHUNK, RADIANCE_BF16, ax, ay, NULL) < 0)
			_exit(5);
	for (;;) {
		struct radiance_completion cp;
		int rc = radiance_wait(r, &cp, 100);   /* then a look at stop_fd */
		if (rc == -ETIMEDOUT)
			rc = 0;
		if (rc < 0 || (rc == 1 && (cp.status != 0 || memcmp(ay, flood_want, yb)))) {
			fprintf(stderr, "%s: wait %d, status %d %s\n", name, rc, rc == 1 ? cp.status : 0,
				rc == 1 && cp.error ? cp.error : "");
			_exit(6);
		}
		struct pollfd p = { .fd = stop_fd, .events = POLLIN };
		if (poll(&p, 1, 0) != 0)
			break;
		if (rc == 1 &&
		    radiance_submit(r, id, (uint32_t)li, CHUNK, RADIANCE_BF16, ax, ay, NULL) < 0)
			_exit(5);
	}
	radiance_disconnect(r);   /* with requests in flight: the daemon drops them */
	_exit(0);
}

/* The session of that name in the reply, or NULL. */
static const struct radiance_session_stats *share_find(const struct radiance_stats_reply *st,
						       const char *name, uint32_t *weight)
{
	for (size_t i = 0; i < st->n_sessions; i++)
		if (!strcmp(st->sessions[i].client_name, name)) {
			*weight = st->session_weights[i];
			return &st->sessions[i];
		}
	return NULL;
}

/* Two uids of weights 3 and 1 both flooding the daemon: between two
 * GetStats snapshots taken while both are busy, the rows the daemon's own
 * per-session counters say it served are in the ratio 3:1, within
 * SHARE_TOL of the other uid's fraction 1/4 (counts, no clock). The
 * stats list and the "ring open" log line carry each session's uid and
 * weight. Needs root (the second uid is a setuid child). */
static void test_daemon_uid_shares(void **state)
{
	if (geteuid() != 0) {
		printf("# daemon_uid_shares: needs root to run a client as uid %u: skipped\n",
		       SHARE_UID);
		skip();
	}
	struct h_daemon d;
	static const char *const args[] = { "--sched-chunk-rows", CHUNK_ARG, "--max-rows", CHUNK_ARG,
					    "--sched-uid-weights", SHARE_WEIGHTS, "--group", "65534",
					    NULL };
	assert_int_equal(h_daemon_start_argv(&d, args), 0);
	assert_int_equal(chmod(d.dir, 0711), 0);   /* the other uid reaches the socket */
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "share-control";
	o.timeout_ms = 600000;
	struct radiance *r = radiance_connect(d.socket, &o);
	assert_non_null(r);
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.name = SHARE_MODEL;
	uint32_t id;
	if (radiance_load_model(r, ckpt_dir, &lo, &id) < 0)
		fail_msg("load: %s", radiance_error_message(r));

	int stop[2];
	assert_int_equal(pipe2(stop, O_CLOEXEC), 0);
	static const char *const names[2] = { "share-root", "share-other" };
	const uid_t uids[2] = { 0, SHARE_UID };
	pid_t kids[2];
	for (int k = 0; k < 2; k++) {
		fflush(NULL);
		kids[k] = fork();
		assert_true(kids[k] >= 0);
		if (kids[k] == 0) {
			close(stop[1]);
			share_child(d.socket, uids[k], names[k], stop[0]);
		}
	}
	close(stop[0]);

	/* both busy (a request each done), then the window. A failure from
	 * here on is kept in why until the children and the daemon are gone,
	 * so that none of them floods the tests after this one. */
	uint64_t rows0[2] = { 0, 0 }, rows1[2] = { 0, 0 };
	uint32_t weight[2] = { 0, 0 };
	uint32_t uid_seen[2] = { ~0u, ~0u };
	char why[256] = "";
	int started = 0;
	double deadline = h_now() + 600.0;
	while (!why[0]) {
		struct radiance_stats_reply *st;
		int rc = radiance_get_stats(r, &st);
		if (rc < 0) {
			snprintf(why, sizeof why, "get_stats: %s", radiance_strerror(rc));
			break;
		}
		const struct radiance_session_stats *ss[2];
		for (int k = 0; k < 2; k++)
			ss[k] = share_find(st, names[k], &weight[k]);
		int both = ss[0] && ss[1] && ss[0]->stats.requests && ss[1]->stats.requests;
		for (int k = 0; both && k < 2; k++) {
			(started ? rows1 : rows0)[k] = ss[k]->stats.rows;
			uid_seen[k] = ss[k]->uid;
		}
		radiance_stats_free(st);
		if (both && started &&
		    rows1[0] + rows1[1] - rows0[0] - rows0[1] >= (uint64_t)SHARE_WINDOW * CHUNK)
			break;
		started |= both;
		for (int k = 0; k < 2; k++)
			if (waitpid(kids[k], NULL, WNOHANG) == kids[k]) {
				snprintf(why, sizeof why, "%s exited before the window was over",
					 names[k]);
				kids[k] = -1;
			}
		if (h_now() > deadline)
			snprintf(why, sizeof why, "no window of %u requests in 600 s", SHARE_WINDOW);
		h_sleep_ms(10);
	}
	close(stop[1]);
	for (int k = 0; k < 2; k++) {
		int wst = 0;
		if (kids[k] > 0 && (waitpid(kids[k], &wst, 0) != kids[k] || !WIFEXITED(wst) ||
				    WEXITSTATUS(wst) != 0) && !why[0])
			snprintf(why, sizeof why, "%s: exit status 0x%x", names[k], wst);
	}
	/* before the stop, which removes the log */
	char line[64];
	snprintf(line, sizeof line, "uid %u, weight %u", SHARE_UID, SHARE_W_OTHER);
	int logged[2] = { h_count_lines(d.log, "uid 0, weight 3"), h_count_lines(d.log, line) };
	radiance_disconnect(r);
	int st = h_daemon_stop(&d);
	if (why[0])
		fail_msg("%s", why);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

	uint64_t served[2] = { rows1[0] - rows0[0], rows1[1] - rows0[1] };
	double other = (double)served[1] / (double)(served[0] + served[1]);
	double want = (double)SHARE_W_OTHER / (SHARE_W_ROOT + SHARE_W_OTHER);
	fprintf(stderr, "weights %u:%u: rows served in the window: uid 0 %llu, uid %u %llu "
		"(fraction %.3f, want %.3f +- %.2f)\n", SHARE_W_ROOT, SHARE_W_OTHER,
		(unsigned long long)served[0], SHARE_UID, (unsigned long long)served[1], other, want,
		SHARE_TOL);
	if (other < want - SHARE_TOL || other > want + SHARE_TOL)
		fail_msg("uid %u got %.3f of the rows, not %.3f +- %.2f", SHARE_UID, other, want,
			 SHARE_TOL);
	assert_int_equal(uid_seen[0], 0);
	assert_int_equal(uid_seen[1], SHARE_UID);
	assert_int_equal(weight[0], SHARE_W_ROOT);
	assert_int_equal(weight[1], SHARE_W_OTHER);
	/* each session's "ring open" line, one each */
	assert_int_equal(logged[0], 1);
	assert_int_equal(logged[1], 1);
}

/* A datagram socket standing in for systemd's notify socket. */
static int notify_socket(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	assert_true(fd >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(path);
	assert_true(len < sizeof sa.sun_path);
	memcpy(sa.sun_path, path, len + 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	return fd;
}

/* Time of the next WATCHDOG=1 before `until`, or 0. */
static double next_feed(int fd, double until)
{
	char buf[512];
	for (;;) {
		double now = h_now();
		if (now >= until)
			return 0;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int to = (int)((until - now) * 1e3) + 1;
		if (poll(&p, 1, to) <= 0)
			continue;
		ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = 0;
		if (strstr(buf, "WATCHDOG=1"))
			return h_now();
	}
}

/* Under a systemd watchdog of WatchdogSec = 8 pieces' time (a piece timed
 * here with the CPU kernel the daemon runs), at least 0.5 s, the daemon
 * keeps feeding it while the executor works through the flood: no gap
 * between WATCHDOG=1 as long as the interval, and no "not feeding" in its
 * log. (Before, a pass of the flood's 32 requests took 256 pieces' time
 * without a feed.) */
static void test_watchdog_fed_under_flood(void **state)
{
	double tk[3];
	uint16_t *xc = malloc((size_t)CHUNK * BIG_K * 2), *yc = malloc((size_t)CHUNK * BIG_N * 2);
	fill_x(xc, (size_t)CHUNK * BIG_K);
	for (int i = 0; i < 3; i++) {
		double t = h_now();
		cpu_ref(big, xc, CHUNK, yc);
		tk[i] = h_now() - t;
	}
	free(xc);
	free(yc);
	double t_chunk = median(tk, 3), interval = WD_CHUNKS * t_chunk;
	if (interval < WD_FLOOR_S)
		interval = WD_FLOOR_S;

	char *dir = tmpdir_create(), path[4200], usec[32];
	int nfd = notify_socket(path_join(path, sizeof path, dir, "notify"));
	snprintf(usec, sizeof usec, "%llu", (unsigned long long)(interval * 1e6));
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", usec, 1);
	struct h_daemon d;
	static const char *const args[] = { "--sched-chunk-rows", CHUNK_ARG, "--max-rows",
					    FLOOD_ROWS_ARG, NULL };
	int rc = h_daemon_start_argv(&d, args);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	assert_int_equal(rc, 0);

	struct flood f;
	pthread_t t;
	flood_start(&f, &t, d.socket);
	/* from now on, WD_WINDOW intervals of flood */
	char drop[512];
	while (recv(nfd, drop, sizeof drop, 0) > 0)
		;
	double start = h_now(), last = start, worst = 0, end = start + WD_WINDOW * interval;
	int feeds = 0;
	for (double at; (at = next_feed(nfd, end)) != 0; last = at) {
		feeds++;
		if (at - last > worst)
			worst = at - last;
	}
	if (end - last > worst)
		worst = end - last;
	/* unread, the datagrams would fill the socket and block the daemon's
	 * sd_notify (systemd always reads them); closed, they fail at once */
	close(nfd);
	unsigned during = atomic_load(&f.completed);
	flood_finish(&f, t);
	fprintf(stderr, "watchdog %.0f ms (%.0f x %.1f ms a piece): %d feeds in %.0f ms of flood "
		"(%u requests done), longest gap %.0f ms\n", interval * 1e3, WD_CHUNKS, t_chunk * 1e3,
		feeds, WD_WINDOW * interval * 1e3, during, worst * 1e3);
	if (worst >= interval)
		fail_msg("the watchdog went %.0f ms without WATCHDOG=1 (its interval: %.0f ms)",
			 worst * 1e3, interval * 1e3);
	/* fed at half the interval; the gap above is the real check */
	assert_true(feeds >= (int)WD_WINDOW);
	assert_int_equal(h_count_lines(d.log, "not feeding the watchdog"), 0);
	assert_true(h_count_lines(d.log, "systemd watchdog:") == 1);
	int st = h_daemon_stop(&d);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	tmpdir_remove(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_policy_chunks),
		cmocka_unit_test(test_policy_decode_first_merged),
		cmocka_unit_test(test_policy_deficit),
		cmocka_unit_test(test_policy_cost_fair),
		cmocka_unit_test(test_policy_admission),
		cmocka_unit_test(test_policy_weights),
		cmocka_unit_test(test_policy_owner_split),
		cmocka_unit_test(test_policy_launch_max_rows),
		cmocka_unit_test(test_pieces_bit_identical),
		cmocka_unit_test(test_exec_pieces_one_result),
		cmocka_unit_test(test_exec_cq_room),
		cmocka_unit_test(test_exec_ring_removed_mid_request),
		cmocka_unit_test(test_exec_ring_broken_mid_request),
		cmocka_unit_test(test_exec_model_released_mid_request),
		cmocka_unit_test(test_exec_groups_sessions),
		cmocka_unit_test(test_exec_shares),
		cmocka_unit_test(test_exec_rows_in_flight),
		cmocka_unit_test(test_watchdog_liveness),
		cmocka_unit_test(test_flood_decode_latency),
		cmocka_unit_test(test_daemon_uid_shares),
		cmocka_unit_test(test_watchdog_fed_under_flood),
	};
	rlog_init(RADIANCE_LOG_WARN);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
