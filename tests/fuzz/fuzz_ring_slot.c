/*
 * Fuzz target: the data plane as the executor sees it. The client owns the
 * SQ/CQ memory and can write anything there at any time; this drives the
 * executor's real round (serve_pass -> collect_ring -> sched_round ->
 * launch on the CPU backend) over two rings whose slots, SQ tail and CQ
 * head come from the input. Requests above 3 rows run in pieces, so some
 * stay queued from one pass to the next.
 *
 * collect_ring(), the function that pops a slot, decodes the LinearRequest
 * and validates it against the session's models and arena, is static, and
 * the public path to it is a thread fed through eventfds. So this file
 * includes daemon/executor.c and calls the pass directly, on the fuzzer's
 * thread, with no executor thread running: deterministic, and every line
 * is the product's. (The harness therefore tracks struct radiance_executor's
 * fields: if executor.c is reorganised, adjust setup() below.)
 *
 * Each ring's arena is a heap block of exactly arena_bytes, so a request
 * that validation lets through with a range outside the arena is caught by
 * ASan when the backend reads x or writes y. The activations are bytes
 * from a PRNG seeded by the input (NaN/Inf bf16 and fp16 values included):
 * the client controls them too.
 *
 * Input (consumed from the front; missing bytes read as 0):
 *   g   geometry: sq_entries = 1 << (g & 3), cq_entries = sq << (g>>2 & 1),
 *       max_inflight = (g & 8) ? 2 : 1024
 *   a   arena_bytes = 256 * (a % 32 + 1)
 *   s   arena fill seed (0: zeros)
 *   then rounds, until the input ends or both rings are broken:
 *   r   bits 0-3: slots to publish (0..15); bit 4: no pass after this round
 *       (stage slots on both rings, so one pass merges their rows); bit 5:
 *       then set the SQ tail to the daemon's head + the next 4 bytes (le32);
 *       bit 6: set the CQ head to the daemon's CQ tail minus the next byte;
 *       bit 7: ring 1 instead of ring 0
 *   per published slot (at most sq_entries written; more only moves tail):
 *       l   the slot's length word: l, or when l == 255 the next 4 bytes
 *       min(l, 252) payload bytes: a serialized LinearRequest, or not
 *   after each round (unless bit 4): one executor pass over both rings,
 *   then the client consumes every CQ entry (rring_pop + decode);
 *   a round with bit 4 that ends the input still gets its pass.
 *
 * Models: id 1 (W4A8 16x128 with bias, bf16 8x16, W4A8 8x256) and id 2
 * (bf16 24x8 with bias) are referenced by both rings; id 3 exists but is
 * referenced by neither.
 */
#include "../../daemon/executor.c"

#include "fuzz_common.h"

#define FZ_RINGS 2
#define FZ_MAX_ROWS 8u

struct reader {
	const uint8_t *p;
	size_t n;
};

static uint8_t rd8(struct reader *r)
{
	if (!r->n)
		return 0;
	r->n--;
	return *r->p++;
}

static uint32_t rd32(struct reader *r)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)rd8(r) << (8 * i);
	return v;
}

static struct radiance_executor *E;
static uv_loop_t loop;
static struct stats_counters global_stats;
static struct radiance_model models[3];
static struct exec_model emodels[3];
static struct exec_refs refs;

struct fz_ring {
	struct exec_ring r;
	struct radiance_shm_header *h;
	uint8_t *sq_slots, *cq_slots;
	struct rring client_cq;   /* the client's consumer view */
	uint32_t client_tail;            /* the client's SQ producer counter */
	struct stats_counters stats;
	int broken_seen;
	int head_forged;                 /* this input moved the CQ head itself */
};
static struct fz_ring rings[FZ_RINGS];

static void fz_on_async(uv_async_t *h)
{
}

static void on_broken(struct exec_job *job)
{
}

static void *xalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
	FUZZ_CHECK(p);
	memset(p, 0, n);
	return p;
}

static void layer_w4a8(struct radiance_layer *l, const char *name, uint32_t n, uint32_t k, int bias)
{
	l->name = (char *)name;
	l->kind = RADIANCE_LAYER_W4A8;
	l->n = n;
	l->k = k;
	l->qweight = xalloc((size_t)n * k / 8 * 4);
	l->scales = xalloc((size_t)n * k / 128 * 2);
	for (size_t i = 0; i < (size_t)n * k / 8; i++)
		l->qweight[i] = 0x9E3779B9u * (uint32_t)(i + 1);
	for (size_t i = 0; i < (size_t)n * k / 128; i++)
		l->scales[i] = 0x2C00;   /* 1/16 */
	if (bias) {
		l->bias = xalloc(n * sizeof(float));
		for (uint32_t i = 0; i < n; i++)
			l->bias[i] = (float)i;
	}
}

static void layer_bf16(struct radiance_layer *l, const char *name, uint32_t n, uint32_t k, int bias)
{
	l->name = (char *)name;
	l->kind = RADIANCE_LAYER_BF16;
	l->n = n;
	l->k = k;
	l->weight = xalloc((size_t)n * k * 2);
	for (size_t i = 0; i < (size_t)n * k; i++)
		l->weight[i] = (uint16_t)(0x3C00 + (i % 64));
	if (bias) {
		l->bias = xalloc(n * sizeof(float));
		for (uint32_t i = 0; i < n; i++)
			l->bias[i] = -(float)i;
	}
}

static void setup(void)
{
	char err[256];
	rlog_init(getenv("FUZZ_VERBOSE") ? RADIANCE_LOG_DEBUG : RADIANCE_LOG_SILENT);
	FUZZ_CHECK(uv_loop_init(&loop) == 0);
	E = calloc(1, sizeof *E);
	FUZZ_CHECK(E);
	E->loop = &loop;
	E->opt.backend = (struct radiance_backend_options){
		.kind = "cpu", .max_rows = FZ_MAX_ROWS, .max_decode_rows = FZ_MAX_ROWS,
		.max_n = 64, .max_k = 256,
	};
	E->opt.max_rings = FZ_RINGS;
	E->opt.global_stats = &global_stats;
	E->sched = (struct sched_params){ .chunk_rows = 3, .session_rows = FZ_MAX_ROWS,
					  .max_rows = FZ_MAX_ROWS };
	stats_init(&global_stats);
	pthread_mutex_init(&E->lock, NULL);
	FUZZ_CHECK(uv_async_init(&loop, &E->async, fz_on_async) == 0);
	E->async.data = E;
	E->ctl_efd = E->epfd = -1;
	E->rings = calloc(FZ_RINGS, sizeof *E->rings);
	E->flows = calloc(FZ_RINGS, sizeof *E->flows);
	E->batch = calloc((size_t)FZ_RINGS * EXEC_BATCH, sizeof *E->batch);
	E->rows = calloc(FZ_MAX_ROWS, sizeof *E->rows);
	FUZZ_CHECK(E->rings && E->flows && E->batch && E->rows);
	FUZZ_CHECK(radiance_backend_create(&E->opt.backend, &E->backend, err, sizeof err) == 0);

	static struct radiance_layer l1[3], l2[1], l3[1];
	layer_w4a8(&l1[0], "m1.w4a8_16x128", 16, 128, 1);
	layer_bf16(&l1[1], "m1.bf16_8x16", 8, 16, 0);
	layer_w4a8(&l1[2], "m1.w4a8_8x256", 8, 256, 0);
	layer_bf16(&l2[0], "m2.bf16_24x8", 24, 8, 1);
	layer_bf16(&l3[0], "m3.bf16_8x8", 8, 8, 0);
	struct radiance_layer *ls[3] = { l1, l2, l3 };
	size_t nl[3] = { 3, 1, 1 };
	exec_refs_init(&refs);
	for (int i = 0; i < 3; i++) {
		models[i] = (struct radiance_model){ .name = (char *)"fuzz", .layers = ls[i],
						     .n_layers = nl[i], .group_size = 128, .bits = 4 };
		emodels[i].id = (uint32_t)i + 1;
		emodels[i].model = &models[i];
		emodels[i].handles = calloc(nl[i], sizeof *emodels[i].handles);
		FUZZ_CHECK(emodels[i].handles);
		for (size_t j = 0; j < nl[i]; j++)
			FUZZ_CHECK(radiance_backend_layer_upload(E->backend, &ls[i][j],
								 &emodels[i].handles[j], err,
								 sizeof err) == 0);
		emodels[i].uploaded = nl[i];
		if (i < 2)
			FUZZ_CHECK(exec_refs_add(&refs, &emodels[i]) == 0);
	}
	for (int i = 0; i < FZ_RINGS; i++) {
		rings[i].r.sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		/* the CQ doorbell is a pipe, as the daemon makes it; its read
		 * end stays open and unread for the process's life (a full
		 * pipe is what a client that never drains it gives) */
		int cq_pipe[2];
		FUZZ_CHECK(pipe2(cq_pipe, O_NONBLOCK | O_CLOEXEC) == 0);
		rings[i].r.cq_wfd = cq_pipe[1];
		FUZZ_CHECK(rings[i].r.sq_efd >= 0);
		rings[i].h = xalloc(sizeof *rings[i].h);
	}
}

static uint32_t xorshift(uint32_t *s)
{
	uint32_t x = *s;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return *s = x;
}

/* The client's side after a pass: take every result off the CQ. */
static void consume_cq(struct fz_ring *fr)
{
	uint8_t buf[RADIANCE_SLOT_BYTES];
	for (;;) {
		int n = rring_pop(&fr->client_cq, buf);
		if (n <= 0)
			break;     /* empty, or the (corrupted) head made it -EPROTO */
		Rdw__LinearResult *res = rdw__linear_result__unpack(NULL, (size_t)n, buf);
		FUZZ_CHECK(res);   /* the daemon's own results always decode */
		int st = res->status;
		FUZZ_CHECK(st == 0 || st == ENOENT || st == EINVAL || st == EFAULT || st == EBUSY ||
			   st == EIO || st == E2BIG);
		rdw__linear_result__free_unpacked(res, NULL);
	}
}

/* One executor pass over both rings, then the client reads its results. */
static void pass(void)
{
	uint32_t before[FZ_RINGS], cq_before[FZ_RINGS], queued[FZ_RINGS];
	for (int i = 0; i < FZ_RINGS; i++) {
		before[i] = rings[i].r.sq.local;
		cq_before[i] = rings[i].r.cq.local;
		queued[i] = rings[i].r.flow.n;
	}
	serve_pass(E, NULL);
	for (int i = 0; i < FZ_RINGS; i++) {
		struct exec_ring *r = &rings[i].r;
		uint32_t taken = r->sq.local - before[i];
		uint32_t posted = r->cq.local - cq_before[i];
		FUZZ_CHECK(taken <= EXEC_BATCH);
		FUZZ_CHECK(r->flow.n <= EXEC_BATCH);
		/* one result per request, when its last piece ran: what was
		 * queued or taken is now posted or still queued, unless the
		 * ring broke on the way */
		FUZZ_CHECK(r->dead || posted + r->flow.n == queued[i] + taken);
		FUZZ_CHECK(posted <= queued[i] + taken);
		/* a queued request always has its CQ slot (unless the client
		 * took slots back by moving the CQ head backwards) */
		if (!r->dead && !rings[i].head_forged) {
			int space = rring_space(&r->cq);
			FUZZ_CHECK(space < 0 || (uint32_t)space >= r->flow.n);
		}
		consume_cq(&rings[i]);
	}
}

/* Passes until every live ring's queue is empty: a queued request always
 * completes (each pass runs at least one piece of every queue). */
static void finish_queued(void)
{
	for (int n = 0; n < 4 * (int)EXEC_BATCH; n++) {
		int left = 0;
		for (int i = 0; i < FZ_RINGS; i++)
			left |= !rings[i].r.dead && rings[i].r.flow.n;
		if (!left)
			return;
		pass();
	}
	FUZZ_CHECK(!"queued requests did not complete");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct reader in = { data, size };
	if (!E)
		setup();

	uint8_t g = rd8(&in), a = rd8(&in), seed8 = rd8(&in);
	uint32_t sq_entries = 1u << (g & 3), cq_entries = sq_entries << ((g >> 2) & 1);
	uint32_t max_inflight = (g & 8) ? 2 : 1024;
	uint64_t arena_bytes = 256u * (a % 32u + 1u);
	uint32_t seed = seed8 ? 0x9E3779B9u * seed8 : 0;

	E->nrings = FZ_RINGS;
	E->rr = 0;
	job_list_take(&E->done);
	for (int i = 0; i < FZ_RINGS; i++) {
		struct fz_ring *fr = &rings[i];
		struct exec_ring *r = &fr->r;
		memset(fr->h, 0, sizeof *fr->h);
		fr->h->sq.entries = sq_entries;
		fr->h->cq.entries = cq_entries;
		fr->sq_slots = xalloc((size_t)sq_entries * RADIANCE_SLOT_BYTES);
		fr->cq_slots = xalloc((size_t)cq_entries * RADIANCE_SLOT_BYTES);
		rring_init(&r->sq, &fr->h->sq, fr->sq_slots, sq_entries);
		rring_init(&r->cq, &fr->h->cq, fr->cq_slots, cq_entries);
		rring_init(&fr->client_cq, &fr->h->cq, fr->cq_slots, cq_entries);
		fr->client_tail = 0;
		fr->head_forged = 0;
		r->session_id = (uint64_t)i + 1;
		r->arena = malloc(arena_bytes);   /* exact size: ASan guards both ends */
		FUZZ_CHECK(r->arena);
		for (uint64_t j = 0; j < arena_bytes; j += 4) {
			uint32_t v = seed ? xorshift(&seed) : 0;
			memcpy(r->arena + j, &v, 4);
		}
		r->arena_bytes = arena_bytes;
		r->max_inflight = max_inflight;
		r->refs = &refs;
		stats_init(&fr->stats);
		r->stats = &fr->stats;
		exec_ring_init(r, on_broken, fr);
		E->rings[i] = r;
	}

	for (int round = 0; round < 64 && in.n; round++) {
		uint8_t rh = rd8(&in);
		struct fz_ring *fr = &rings[rh >> 7];
		uint32_t n = rh & 0x0f;
		uint32_t written = n < sq_entries ? n : sq_entries;
		for (uint32_t i = 0; i < written; i++) {
			uint8_t *slot = fr->sq_slots + (size_t)((fr->client_tail + i) & (sq_entries - 1)) *
							       RADIANCE_SLOT_BYTES;
			uint8_t l = rd8(&in);
			uint32_t len = l == 255 ? rd32(&in) : l;
			memcpy(slot, &len, 4);
			uint32_t pl = l < RADIANCE_SLOT_BYTES - 4 ? l : RADIANCE_SLOT_BYTES - 4;
			for (uint32_t j = 0; j < pl; j++)
				slot[4 + j] = rd8(&in);
		}
		fr->client_tail += n;
		__atomic_store_n(&fr->h->sq.tail, fr->client_tail, __ATOMIC_RELEASE);
		if (rh & 0x20)
			__atomic_store_n(&fr->h->sq.tail, fr->r.sq.local + rd32(&in), __ATOMIC_RELEASE);
		if (rh & 0x40) {
			__atomic_store_n(&fr->h->cq.head, fr->r.cq.local - rd8(&in), __ATOMIC_RELEASE);
			fr->head_forged = 1;
		}

		if (rh & 0x10 && in.n)
			continue;
		pass();
		if (rings[0].r.dead && rings[1].r.dead)
			break;
	}
	finish_queued();

	/* A broken ring was reported exactly once, through its notice job. */
	size_t notices = 0;
	for (struct exec_job *j = E->done.head; j; j = j->next) {
		FUZZ_CHECK(j->kind == EXEC_JOB_NOTICE && j->status == -EPROTO && j->err[0]);
		notices++;
	}
	size_t dead = 0;
	for (int i = 0; i < FZ_RINGS; i++)
		dead += rings[i].r.dead != 0;
	FUZZ_CHECK(notices == dead);
	job_list_take(&E->done);

	for (int i = 0; i < FZ_RINGS; i++) {
		free(rings[i].r.arena);
		free(rings[i].sq_slots);
		free(rings[i].cq_slots);
		rings[i].r.arena = NULL;
	}
	return 0;
}
