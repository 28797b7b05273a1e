/*
 * The service benchmark (issue 13, docs/daemon.md "Service benchmark"):
 * the daemon's ring path against the same layers run in this process, on
 * realistic shapes, every case in one invocation so that the ratios come
 * from one run.
 *
 *   bench_serve gen DIR SET [BLOCKS]
 *       write a synthetic AutoRound checkpoint (bench/synth_checkpoint.h)
 *       of BLOCKS blocks of the shapes of SET into DIR (made, with its
 *       parents, mode 0755, when it does not exist):
 *       27b     the 27B hybrid's layers 16384x5120, 14336x5120, 5120x6144,
 *               34816x5120, 5120x17408 (BLOCKS 16: 3.8 GB, so rotating
 *               through the blocks reads every shape from DRAM)
 *       minilm  384x384, 1536x384, 384x1536 (make check)
 *   bench_serve run SOCKET DIR SET OUT [options]
 *       against the daemon on SOCKET (started by the caller: bench/serve_run.sh,
 *       tests/test_serve.sh) with DIR loaded; writes OUT.csv and OUT.md.
 *
 * In-process: the cpu backend (radiance_backend_* on the loaded checkpoint)
 * with --inproc cpu; with --inproc gpu (GPU builds) the model's device
 * arrays, mapped from the daemon and copied into this process, run by
 * radiance__gpu_layer_run on device activations: quant + GEMM + a stream
 * synchronize per call, as an engine holding its own weights pays.
 * Through the daemon: a client with x and y in its arena, radiance_submit
 * then radiance_wait (spinning first), per request.
 *
 * Cases:
 *   a  per shape and M: in-process and daemon p50/p99 over --calls calls
 *      rotating through the blocks, after --warm calls; the results of
 *      block 0 compared (cpu: bit-identical to in-process and to the
 *      reference kernel; gpu: relative error against in-process <= 1e-2)
 *   b  a whole decode step at M=1, layer order, each request waiting for
 *      the previous: 27b 64 layers x 4 linears (attention input, which is
 *      qkv every fourth layer, out, gate_up, down) = 256 requests; minilm
 *      6 layers x 3. In-process: the same calls, one synchronize at the end.
 *   c  1, 2, 4, 8 clients (threads, a session each) in lockstep (a spinning
 *      barrier between iterations) at M=1 on one layer: total requests/s,
 *      per-request p50/p99, launches per request from the daemon's stats
 *   d  a decode client's M=1 latency alone and while another client streams
 *      --prefill-m requests on the same model, and the prefill client's
 *      throughput alone and meanwhile
 *
 * Options: --inproc cpu|gpu, --calls N (200), --warm N (20), --ms LIST
 * (1,4,16,64,256,2048), --step-reps N (15), --iters N (lockstep iterations,
 * 2000), --decode-calls N (2000), --prefill-m M (2048), --cases abcd,
 * --label TEXT (appended to every case name, e.g. "copies"), --note TEXT
 * (a line in OUT.md: how the daemon was started), --spin-us US (every
 * client's radiance_options.spin_us: 0 the library's default, -1 never).
 *
 * Exit: 0, 1 when a result was wrong or a call failed, 2 for usage.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "model.h"
#include "numerics.h"
#include "radiance.h"
#include "bench_stats.h"
#include "synth_checkpoint.h"
#include "w4a8_cpu.h"
#ifdef RADIANCE_GPU
#include "gpu/gpu-private.h"
#include "radiance_gpu.h"
#include "w4a8_gpu.h"
#endif

/* ---- shape sets ---- */

#define MAX_SHAPES 5

struct shape_set {
	const char *name;
	size_t n;
	struct synth_shape s[MAX_SHAPES];
	uint32_t step_layers;              /* case b */
	uint32_t per_layer;                /* requests per step layer */
	uint32_t blocks;                   /* gen's default */
};

static const struct shape_set sets[] = {
	{"27b", 5,
	 {{16384, 5120, "linear_attn.in_proj"},
	  {14336, 5120, "self_attn.qkv_proj"},
	  {5120, 6144, "self_attn.o_proj"},
	  {34816, 5120, "mlp.gate_up_proj"},
	  {5120, 17408, "mlp.down_proj"}},
	 64, 4, 16},
	{"minilm", 3,
	 {{384, 384, "attention.self.query"}, {1536, 384, "intermediate.dense"}, {384, 1536, "output.dense"}},
	 6, 3, 2},
};

static const struct shape_set *set_by_name(const char *name)
{
	for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
		if (strcmp(sets[i].name, name) == 0)
			return &sets[i];
	DIE("unknown shape set '%s' (27b or minilm)", name);
}

/* shape index of request j of step layer l */
static int step_shape(const struct shape_set *S, uint32_t l, uint32_t j)
{
	if (S->per_layer == 4)   /* 27b: qkv of full attention every fourth layer */
		return j == 0 ? (l % 4 == 3 ? 1 : 0) : (int)j + 1;
	return (int)j;
}

/* ---- the bench ---- */

struct client {
	struct radiance *r;
	uint32_t id;
	uint16_t *x, *y;          /* arena */
	uint64_t queue_ns, exec_ns;   /* the daemon's account of the last call (its completion) */
	double t_submitted;       /* now_us() when the last call's radiance_submit returned */
};

struct bench {
	const struct shape_set *S;
	uint32_t blocks;
	int gpu;                  /* in-process on the GPU */
	int prefill_fast;         /* in-process prefill is the fp8 wgmma kernel */
	char device[128];
	uint32_t max_m, max_n, max_k;
	uint32_t *li;             /* [blocks * nshapes] layer index in the model */
	uint16_t *hx;             /* host activations [max_m][max_k], random */
	uint16_t *hy;             /* host output [max_m][max_n] of the in-process call */
	/* cpu in-process */
	struct radiance_model *model;
	struct radiance_backend *be;
	struct radiance_backend_layer **handles;
#ifdef RADIANCE_GPU
	struct radiance_gpu_model *g;
	struct radiance__gpu_device dev;
	struct radiance__gpu_scratch scratch;
	struct radiance__gpu_layer *own;
	void *stream;
	uint16_t *dx, *dy;
#endif
	struct client main;
	int failures;
	int32_t spin_us;          /* every client's radiance_options.spin_us (0: the library's default) */
};

static uint32_t layer_index(const struct bench *B, uint32_t b, int s)
{
	return B->li[b * B->S->n + (uint32_t)s];
}

/* One in-process call; sync: wait for it (GPU). */
static void inproc_call(struct bench *B, uint32_t li, uint32_t m, int sync)
{
#ifdef RADIANCE_GPU
	if (B->gpu) {
		GCHECK(radiance__gpu_layer_run(&B->dev, &B->scratch, &B->own[li], B->dx, RADIANCE_DTYPE_BF16, m, B->dy,
					       B->stream, RADIANCE_W4A8_AUTO, NULL));
		if (sync)
			GCHECK(radiance__gpu_stream_sync(B->stream));
		return;
	}
#endif
	(void)sync;
	char err[256];
	struct radiance_rows rows = {.x = B->hx, .y = B->hy, .m = m, .dtype = RADIANCE_DTYPE_BF16};
	if (radiance_backend_linear(B->be, &B->model->layers[li], B->handles[li], &rows, 1, err, sizeof err) < 0)
		DIE("in-process linear: %s", err);
}

static void inproc_sync(struct bench *B)
{
#ifdef RADIANCE_GPU
	if (B->gpu)
		GCHECK(radiance__gpu_stream_sync(B->stream));
#endif
	(void)B;
}

/* The in-process call's output into B->hy. */
static void inproc_fetch(struct bench *B, uint32_t m, uint32_t n)
{
#ifdef RADIANCE_GPU
	if (B->gpu) {
		GCHECK(radiance__gpu_d2h_async(B->hy, B->dy, (size_t)m * n * 2, B->stream));
		GCHECK(radiance__gpu_stream_sync(B->stream));
	}
#endif
	(void)B, (void)m, (void)n;
}

static void daemon_call(struct client *c, uint32_t li, uint32_t m)
{
	struct radiance_completion cp;
	int rc = radiance_submit(c->r, c->id, li, m, RADIANCE_BF16, c->x, c->y, NULL);
	if (rc < 0)
		DIE("submit layer %u m %u: %s", li, m, radiance_error_message(c->r));
	c->t_submitted = now_us();
	rc = radiance_wait(c->r, &cp, 60000);
	if (rc != 1 || cp.status)
		DIE("wait layer %u m %u: %d/%d %s", li, m, rc, cp.status,
		    rc == 1 && cp.error ? cp.error : radiance_error_message(c->r));
	c->queue_ns = cp.queue_ns;
	c->exec_ns = cp.exec_ns;
}

static void stats_now(struct client *c, uint64_t *requests, uint64_t *launches)
{
	struct radiance_stats_reply *s;
	if (radiance_get_stats(c->r, &s) < 0)
		DIE("get_stats: %s", radiance_error_message(c->r));
	*requests = s->global.requests;
	*launches = s->launches;
	radiance_stats_free(s);
}

/* A session with the model loaded and x, y of m rows of the largest K and N in its arena. */
static void client_open(struct bench *B, struct client *c, const char *socket, const char *dir, uint32_t m,
			const char *name)
{
	const size_t xb = (size_t)m * B->max_k * 2, yb = (size_t)m * B->max_n * 2, arena = xb + yb;
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 600000;
	o.arena_bytes = arena + (1u << 20);
	o.client_name = name;
	o.spin_us = B->spin_us;
	c->r = radiance_connect(socket, &o);
	if (!c->r)
		DIE("connect %s: %s", socket, strerror(errno));
	if (radiance_load_model(c->r, dir, NULL, &c->id) < 0)
		DIE("load %s: %s", dir, radiance_error_message(c->r));
	c->x = radiance_arena_alloc(c->r, xb);
	c->y = radiance_arena_alloc(c->r, yb);
	if (!c->x || !c->y)
		DIE("arena of %zu bytes: %s", arena, radiance_error_message(c->r));
}

static void client_close(struct client *c)
{
	radiance_disconnect(c->r);
	c->r = NULL;
}

/* ---- results check ---- */

/* Compares the daemon's y with the in-process one (B->hy) and, on the cpu,
 * with the reference kernel. */
static void check_result(struct bench *B, int s, uint32_t m, const uint16_t *yd)
{
	const uint32_t n = B->S->s[s].n, k = B->S->s[s].k;
	const size_t cnt = (size_t)m * n;
	double num = 0, den = 0;
	size_t differ = 0;
	for (size_t i = 0; i < cnt; i++) {
		double a = radiance_bf16_to_f32(yd[i]), b = radiance_bf16_to_f32(B->hy[i]);
		differ += yd[i] != B->hy[i];
		num += (a - b) * (a - b);
		den += b * b;
	}
	double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	const int ok = B->gpu ? rel <= 1e-2 && isfinite(rel) : differ == 0;
	if (!ok) {
		fprintf(stderr, "bench_serve: %ux%u m=%u: daemon and in-process differ: %zu of %zu values, rel %.3e\n", n,
			k, m, differ, cnt, rel);
		B->failures++;
	}
	if (B->model && m <= 16) {
		/* the reference kernel: the daemon's cpu backend matches it bit for bit */
		const struct radiance_layer *l = &B->model->layers[layer_index(B, 0, s)];
		uint16_t *ref = malloc(cnt * 2);
		void *scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(m, k) + 63) & ~(size_t)63);
		if (!ref || !scratch)
			DIE("out of memory");
		radiance_cpu_w4a8(B->hx, RADIANCE_DTYPE_BF16, m, l->qweight, l->scales, l->bias, n, k, ref, scratch);
		size_t bad = 0;
		for (size_t i = 0; i < cnt; i++)
			bad += ref[i] != yd[i];
		if (bad && !B->gpu) {
			fprintf(stderr, "bench_serve: %ux%u m=%u: daemon differs from the reference in %zu of %zu values\n",
				n, k, m, bad, cnt);
			B->failures++;
		}
		free(ref);
		free(scratch);
	}
}

/* ---- output ---- */

struct row {
	char kase[64], shape[48];
	uint32_t m, clients;
	double inproc, p50, p99, rps, lpr;   /* NAN: empty */
	double queue50, exec50;              /* the daemon's queue and execution p50, us (completions) */
	double inproc_p99;                   /* md only */
};

static struct row rows[512];
static size_t nrows;
static const char *label = "";

static struct row *add_row(const char *kase, const char *shape, uint32_t m, uint32_t clients)
{
	if (nrows == sizeof rows / sizeof rows[0])
		DIE("too many rows");
	struct row *r = &rows[nrows++];
	*r = (struct row){.m = m, .clients = clients, .inproc = NAN, .p50 = NAN, .p99 = NAN, .rps = NAN, .lpr = NAN,
			  .inproc_p99 = NAN, .queue50 = NAN, .exec50 = NAN};
	snprintf(r->kase, sizeof r->kase, "%s%s%s", kase, label[0] ? " " : "", label);
	snprintf(r->shape, sizeof r->shape, "%s", shape);
	return r;
}

static void put_num(FILE *f, double v, const char *fmt)
{
	if (!isnan(v))
		fprintf(f, fmt, v);
}

static const struct row *find_row(const char *kase_prefix, const char *shape, uint32_t m, uint32_t clients)
{
	for (size_t i = 0; i < nrows; i++)
		if (strncmp(rows[i].kase, kase_prefix, strlen(kase_prefix)) == 0 &&
		    (!shape || strcmp(rows[i].shape, shape) == 0) && rows[i].m == m &&
		    (!clients || rows[i].clients == clients))
			return &rows[i];
	return NULL;
}

/* a target line: met when value <= limit (or >= when at_least) */
static void target(FILE *md, const char *what, double value, double limit, int at_least, const char *unit)
{
	if (isnan(value)) {
		fprintf(md, "| %s | not measured | %s %.2f%s | - |\n", what, at_least ? ">=" : "<=", limit, unit);
		return;
	}
	const int met = at_least ? value >= limit : value <= limit;
	fprintf(md, "| %s | %.2f%s | %s %.2f%s | %s", what, value, unit, at_least ? ">=" : "<=", limit, unit,
		met ? "met" : "missed");
	if (!met)
		fprintf(md, " by %.2f%s", at_least ? limit - value : value - limit, unit);
	fprintf(md, " |\n");
}

static void write_out(struct bench *B, const char *out, const char *note)
{
	char date[16], path[4096];
	time_t now = time(NULL);
	strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
	snprintf(path, sizeof path, "%s.csv", out);
	FILE *csv = fopen(path, "w");
	snprintf(path, sizeof path, "%s.md", out);
	FILE *md = fopen(path, "w");
	if (!csv || !md)
		DIE("%s: %s", path, strerror(errno));
	fprintf(csv, "date,gpu,case,shape,m,clients,inproc_us,daemon_p50_us,daemon_p99_us,requests_per_s,"
		     "launches_per_request,daemon_queue_p50_us,daemon_exec_p50_us\n");
	fprintf(md, "# Service benchmark, %s\n\n", date);
	fprintf(md, "bench/bench_serve.c, shape set %s (%u blocks), in-process on %s, device: %s.\n", B->S->name,
		B->blocks,
		!B->gpu ? "the cpu backend"
		: B->prefill_fast
			? "the GPU (device activations, quant + GEMM + synchronize; prefill fast, the daemon's default here)"
			: "the GPU (device activations, quant + GEMM + synchronize; prefill exact, the daemon's default here)",
		B->device);
	if (note && note[0])
		fprintf(md, "%s\n", note);
	fprintf(md, "\n| case | shape | m | clients | in-process p50 us | in-process p99 us | daemon p50 us | "
		    "daemon p99 us | requests/s | launches/request | daemon queue p50 us | daemon exec p50 us |\n"
		    "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (size_t i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		/* the gpu field: no commas in it */
		char dev[128];
		snprintf(dev, sizeof dev, "%s", B->device);
		for (char *p = dev; *p; p++)
			if (*p == ',')
				*p = ' ';
		fprintf(csv, "%s,%s,%s,%s,%u,%u,", date, dev, r->kase, r->shape, r->m, r->clients);
		put_num(csv, r->inproc, "%.2f");
		fputc(',', csv);
		put_num(csv, r->p50, "%.2f");
		fputc(',', csv);
		put_num(csv, r->p99, "%.2f");
		fputc(',', csv);
		put_num(csv, r->rps, "%.1f");
		fputc(',', csv);
		put_num(csv, r->lpr, "%.3f");
		fputc(',', csv);
		put_num(csv, r->queue50, "%.2f");
		fputc(',', csv);
		put_num(csv, r->exec50, "%.2f");
		fputc('\n', csv);
		fprintf(md, "| %s | %s | %u | %u | ", r->kase, r->shape, r->m, r->clients);
		const double v[8] = {r->inproc, r->inproc_p99, r->p50, r->p99, r->rps, r->lpr, r->queue50, r->exec50};
		for (int j = 0; j < 8; j++) {
			if (isnan(v[j]))
				fprintf(md, "- | ");
			else
				fprintf(md, j == 5 ? "%.3f | " : j == 4 ? "%.0f | " : "%.1f | ", v[j]);
		}
		fprintf(md, "\n");
	}
	fprintf(md, "\n## Targets (issue 13, H200)\n\n| target | measured | limit | |\n|---|---|---|---|\n");
	for (size_t s = 0; s < B->S->n; s++) {
		char shape[48], what[128];
		snprintf(shape, sizeof shape, "%ux%u", B->S->s[s].n, B->S->s[s].k);
		static const uint32_t tm[2] = {1, 16};
		static const double add[2] = {5, 10};
		for (int t = 0; t < 2; t++) {
			const struct row *r = find_row("a", shape, tm[t], 1);
			snprintf(what, sizeof what, "a %s M=%u: daemon p50 - in-process p50", shape, tm[t]);
			target(md, what, r ? r->p50 - r->inproc : NAN, add[t], 0, " us");
			snprintf(what, sizeof what, "a %s M=%u: daemon p99 / p50", shape, tm[t]);
			target(md, what, r ? r->p99 / r->p50 : NAN, 2, 0, "x");
		}
	}
	const struct row *b = find_row("b", NULL, 1, 1);
	target(md, "b decode step: daemon / in-process", b ? b->p50 / b->inproc : NAN, 1.4, 0, "x");
	const struct row *c1 = find_row("c", NULL, 1, 1), *c8 = find_row("c", NULL, 1, 8);
	target(md, "c 8 clients lockstep: requests/s over 1 client's", c1 && c8 ? c8->rps / c1->rps : NAN, 6, 1, "x");
	const struct row *da = find_row("d decode alone", NULL, 1, 1), *dw = find_row("d decode with prefill", NULL, 1, 2);
	const struct row *pa = NULL, *pw = NULL;
	for (size_t i = 0; i < nrows; i++) {
		if (strncmp(rows[i].kase, "d prefill alone", 15) == 0)
			pa = &rows[i];
		if (strncmp(rows[i].kase, "d prefill with decode", 21) == 0)
			pw = &rows[i];
	}
	target(md, "d decode p99 with prefill / alone", da && dw ? dw->p99 / da->p99 : NAN, 2, 0, "x");
	target(md, "d prefill throughput drop with decode", pa && pw ? 100.0 * (1 - pw->rps / pa->rps) : NAN, 10, 0,
	       " %");
	fclose(csv);
	fclose(md);
}

/* ---- cases ---- */

static struct {
	uint32_t calls, warm, step_reps, iters, decode_calls, prefill_m;
	uint32_t ms[16];
	size_t nms;
	char cases[8];
} opt = {200, 20, 15, 2000, 2000, 2048, {1, 4, 16, 64, 256, 2048}, 6, "abcd"};

static void case_a(struct bench *B)
{
	const uint32_t total = opt.warm + opt.calls;
	double *ti = malloc(total * sizeof *ti), *td = malloc(total * sizeof *td);
	double *tq = malloc(total * sizeof *tq), *te = malloc(total * sizeof *te);
	for (size_t s = 0; s < B->S->n; s++)
		for (size_t mi = 0; mi < opt.nms; mi++) {
			const uint32_t m = opt.ms[mi], n = B->S->s[s].n, k = B->S->s[s].k;
			if (m > B->max_m)
				continue;
			/* results first: block 0, the same x both ways */
			memcpy(B->main.x, B->hx, (size_t)m * k * 2);
			inproc_call(B, layer_index(B, 0, (int)s), m, 1);
			inproc_fetch(B, m, n);
			daemon_call(&B->main, layer_index(B, 0, (int)s), m);
			check_result(B, (int)s, m, B->main.y);
			uint64_t r0, l0, r1, l1;
			/* interleaved in halves, so drift hits both alike */
			size_t ni = 0, nd = 0;
			stats_now(&B->main, &r0, &l0);
			double busy = 0;
			for (int half = 0; half < 2; half++) {
				for (uint32_t c = 0; c < total / 2; c++) {
					const double t0 = now_us();
					inproc_call(B, layer_index(B, c % B->blocks, (int)s), m, 1);
					const double t1 = now_us();
					if (c >= opt.warm / 2)
						ti[ni++] = t1 - t0;
				}
				for (uint32_t c = 0; c < total / 2; c++) {
					const double t0 = now_us();
					daemon_call(&B->main, layer_index(B, c % B->blocks, (int)s), m);
					const double t1 = now_us();
					if (c >= opt.warm / 2) {
						tq[nd] = B->main.queue_ns / 1e3;
						te[nd] = B->main.exec_ns / 1e3;
						td[nd++] = t1 - t0;
						busy += t1 - t0;
					}
				}
			}
			stats_now(&B->main, &r1, &l1);
			struct timing a = summarize(ti, ni), d = summarize(td, nd);
			char shape[48];
			snprintf(shape, sizeof shape, "%ux%u", n, k);
			struct row *r = add_row("a", shape, m, 1);
			r->inproc = a.p50;
			r->inproc_p99 = a.p99;
			r->p50 = d.p50;
			r->p99 = d.p99;
			r->rps = busy > 0 ? nd / busy * 1e6 : NAN;
			/* r1 - r0 holds the calls of both halves (warm-up included) */
			r->lpr = r1 > r0 ? (double)(l1 - l0) / (double)(r1 - r0) : NAN;
			r->queue50 = summarize(tq, nd).p50;
			r->exec50 = summarize(te, nd).p50;
			printf("a %-12s m=%-5u in-process p50 %9.2f p99 %9.2f | daemon p50 %9.2f p99 %9.2f (+%.2f us)\n",
			       shape, m, a.p50, a.p99, d.p50, d.p99, d.p50 - a.p50);
			fflush(stdout);
		}
	free(ti);
	free(td);
	free(tq);
	free(te);
}

static void case_b(struct bench *B)
{
	const uint32_t reps = opt.step_reps, warm = 2;
	double *ti = malloc((reps + warm) * sizeof *ti), *td = malloc((reps + warm) * sizeof *td);
	const uint32_t nreq = B->S->step_layers * B->S->per_layer;
	uint64_t r0, l0, r1, l1;
	memcpy(B->main.x, B->hx, (size_t)B->max_k * 2);
	for (uint32_t rep = 0; rep < reps + warm; rep++) {
		double t0 = now_us();
		for (uint32_t l = 0; l < B->S->step_layers; l++)
			for (uint32_t j = 0; j < B->S->per_layer; j++)
				inproc_call(B, layer_index(B, l % B->blocks, step_shape(B->S, l, j)), 1, 0);
		inproc_sync(B);
		ti[rep] = now_us() - t0;
		if (rep == warm)
			stats_now(&B->main, &r0, &l0);
		t0 = now_us();
		for (uint32_t l = 0; l < B->S->step_layers; l++)
			for (uint32_t j = 0; j < B->S->per_layer; j++)
				daemon_call(&B->main, layer_index(B, l % B->blocks, step_shape(B->S, l, j)), 1);
		td[rep] = now_us() - t0;
	}
	stats_now(&B->main, &r1, &l1);
	struct timing a = summarize(ti + warm, reps), d = summarize(td + warm, reps);
	char shape[48];
	snprintf(shape, sizeof shape, "step %ux%u requests", B->S->step_layers, B->S->per_layer);
	struct row *r = add_row("b", shape, 1, 1);
	r->inproc = a.p50;
	r->inproc_p99 = a.p99;
	r->p50 = d.p50;
	r->p99 = d.p99;
	r->rps = nreq / d.p50 * 1e6;
	r->lpr = r1 > r0 ? (double)(l1 - l0) / (double)(r1 - r0) : NAN;
	printf("b decode step (%u requests): in-process p50 %.1f us | daemon p50 %.1f p99 %.1f us (%.2fx)\n", nreq, a.p50,
	       d.p50, d.p99, d.p50 / a.p50);
	free(ti);
	free(td);
}

/* A barrier that spins (yielding): lockstep engines spin, and a sleeping
 * barrier would spread the submissions over its wake-up times. */
struct spin_barrier {
	atomic_uint count, gen;
	unsigned n;
};

static void spin_wait(struct spin_barrier *b)
{
	unsigned g = atomic_load(&b->gen);
	if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
		atomic_store(&b->count, 0);
		atomic_fetch_add(&b->gen, 1);
		return;
	}
	for (unsigned spins = 0; atomic_load(&b->gen) == g; spins++)
		if (spins > 256)
			sched_yield();
}

struct lock_arg {
	struct client *c;
	struct spin_barrier *bar;
	uint32_t li, iters, m;
	double *lat, *lq, *le;   /* per iteration: round trip, the daemon's queue and execution, us */
	double *ts, *tr;         /* per iteration: when submit returned and when the result came (now_us) */
	double t_end;
};

static void *lockstep_main(void *p)
{
	struct lock_arg *a = p;
	for (uint32_t i = 0; i < a->iters; i++) {
		spin_wait(a->bar);
		const double t0 = now_us();
		daemon_call(a->c, a->li, a->m);
		a->tr[i] = now_us();
		a->ts[i] = a->c->t_submitted;
		a->lat[i] = a->tr[i] - t0;
		a->lq[i] = a->c->queue_ns / 1e3;
		a->le[i] = a->c->exec_ns / 1e3;
	}
	spin_wait(a->bar);
	a->t_end = now_us();
	return NULL;
}

static void case_c(struct bench *B, const char *socket, const char *dir)
{
	static const uint32_t counts[4] = {1, 2, 4, 8};
	struct client cl[8];
	const int s = 0;
	const uint32_t k = B->S->s[s].k, n = B->S->s[s].n, li = layer_index(B, 0, s);
	for (int i = 0; i < 8; i++) {
		char name[32];
		snprintf(name, sizeof name, "bench_serve lockstep %d", i);
		client_open(B, &cl[i], socket, dir, 1, name);
		memcpy(cl[i].x, B->hx, (size_t)k * 2);
	}
	const struct row *ra = NULL;
	char shape[48];
	snprintf(shape, sizeof shape, "%ux%u", n, k);
	ra = find_row("a", shape, 1, 1);
	double *lat = malloc((size_t)8 * opt.iters * sizeof *lat);
	double *lq = malloc((size_t)8 * opt.iters * sizeof *lq), *le = malloc((size_t)8 * opt.iters * sizeof *le);
	double *ts = malloc((size_t)8 * opt.iters * sizeof *ts), *tr = malloc((size_t)8 * opt.iters * sizeof *tr);
	double *part = malloc((size_t)4 * opt.iters * sizeof *part);
	if (!lat || !lq || !le || !ts || !tr || !part)
		DIE("out of memory");
	for (int ci = 0; ci < 4; ci++) {
		const uint32_t nc = counts[ci];
		struct spin_barrier bar = {.n = nc + 1};
		struct lock_arg args[8];
		pthread_t th[8];
		uint64_t r0, l0, r1, l1;
		/* warm-up: a few lockstep rounds */
		for (uint32_t i = 0; i < nc; i++) {
			const size_t o = (size_t)i * opt.iters;
			args[i] = (struct lock_arg){&cl[i], &bar, li, opt.iters / 10 + 1, 1, lat + o, lq + o, le + o,
						    ts + o, tr + o, 0};
			pthread_create(&th[i], NULL, lockstep_main, &args[i]);
		}
		for (uint32_t it = 0; it < opt.iters / 10 + 2; it++)
			spin_wait(&bar);
		for (uint32_t i = 0; i < nc; i++)
			pthread_join(th[i], NULL);
		stats_now(&B->main, &r0, &l0);
		for (uint32_t i = 0; i < nc; i++) {
			args[i].iters = opt.iters;
			pthread_create(&th[i], NULL, lockstep_main, &args[i]);
		}
		spin_wait(&bar);
		const double t0 = now_us();
		for (uint32_t it = 0; it < opt.iters; it++)
			spin_wait(&bar);
		const double t1 = now_us();
		for (uint32_t i = 0; i < nc; i++)
			pthread_join(th[i], NULL);
		stats_now(&B->main, &r1, &l1);
		/* the lockstep clients' results: what the in-process call gives (case a ran it) */
		for (uint32_t i = 0; i < nc; i++) {
			memcpy(B->main.x, B->hx, (size_t)k * 2);
			inproc_call(B, li, 1, 1);
			inproc_fetch(B, 1, n);
			check_result(B, s, 1, cl[i].y);
		}
		struct timing d = summarize(lat, (size_t)nc * opt.iters);
		struct row *r = add_row("c", shape, 1, nc);
		r->inproc = ra ? ra->inproc : NAN;
		r->p50 = d.p50;
		r->p99 = d.p99;
		r->rps = (double)nc * opt.iters / (t1 - t0) * 1e6;
		r->lpr = r1 > r0 ? (double)(l1 - l0) / (double)(r1 - r0) : NAN;
		r->queue50 = summarize(lq, (size_t)nc * opt.iters).p50;
		r->exec50 = summarize(le, (size_t)nc * opt.iters).p50;
		printf("c %u clients lockstep m=1 %s: %.0f requests/s, p50 %.2f p99 %.2f us, %.3f launches/request\n", nc,
		       shape, r->rps, d.p50, d.p99, r->lpr);
		if (nc > 1) {
			/* where a round goes, medians over the rounds (not in the CSV):
			 * the clients' submits spread, the last submit to the first
			 * result (the daemon's gather, launch and completion), the
			 * results spread (the completions posted one by one), the
			 * last result to the next round's first submit (the barrier) */
			const uint32_t R = opt.iters - 1;
			double med[4];
			for (int q = 0; q < 4; q++) {
				for (uint32_t it = 0; it < R; it++) {
					double sf = INFINITY, sl = -INFINITY, rf = INFINITY, rl = -INFINITY, nf = INFINITY;
					for (uint32_t i = 0; i < nc; i++) {
						const size_t o = (size_t)i * opt.iters + it;
						sf = fmin(sf, ts[o]);
						sl = fmax(sl, ts[o]);
						rf = fmin(rf, tr[o]);
						rl = fmax(rl, tr[o]);
						nf = fmin(nf, ts[o + 1]);
					}
					part[it] = q == 0 ? sl - sf : q == 1 ? rf - sl : q == 2 ? rl - rf : nf - rl;
				}
				med[q] = summarize(part, R).p50;
			}
			printf("c %u clients lockstep rounds, medians: submits spread %.2f us, last submit to first "
			       "result %.2f, results spread %.2f, last result to the next first submit %.2f\n",
			       nc, med[0], med[1], med[2], med[3]);
		}
		fflush(stdout);
	}
	free(lat);
	free(lq);
	free(le);
	free(ts);
	free(tr);
	free(part);
	for (int i = 0; i < 8; i++)
		client_close(&cl[i]);
}

struct prefill_arg {
	struct client *c;
	uint32_t li, m;
	atomic_int stop;
	uint64_t done;
	double t0, t1;
};

static void *prefill_main(void *p)
{
	struct prefill_arg *a = p;
	a->t0 = now_us();
	while (!atomic_load(&a->stop)) {
		daemon_call(a->c, a->li, a->m);
		a->done++;
	}
	a->t1 = now_us();
	return NULL;
}

static void decode_run(struct bench *B, uint32_t li, double *lat, uint32_t calls)
{
	for (uint32_t i = 0; i < calls; i++) {
		const double t0 = now_us();
		daemon_call(&B->main, li, 1);
		lat[i] = now_us() - t0;
	}
}

static void case_d(struct bench *B, const char *socket, const char *dir)
{
	const int s = 0;
	const uint32_t k = B->S->s[s].k, n = B->S->s[s].n;
	const uint32_t pm = opt.prefill_m < B->max_m ? opt.prefill_m : B->max_m;
	const uint32_t li_d = layer_index(B, 0, s), li_p = layer_index(B, B->blocks > 1 ? 1 : 0, s);
	struct client pc;
	client_open(B, &pc, socket, dir, pm, "bench_serve prefill");
	for (uint32_t r = 0; r < pm; r++)
		memcpy(pc.x + (size_t)r * k, B->hx + (size_t)(r % B->max_m) * k, (size_t)k * 2);
	memcpy(B->main.x, B->hx, (size_t)k * 2);
	double *lat = malloc(opt.decode_calls * sizeof *lat);
	char shape[48];
	snprintf(shape, sizeof shape, "%ux%u", n, k);
	const struct row *ra = find_row("a", shape, 1, 1);

	decode_run(B, li_d, lat, opt.decode_calls / 10 + 1);
	decode_run(B, li_d, lat, opt.decode_calls);
	struct timing alone = summarize(lat, opt.decode_calls);
	struct row *r = add_row("d decode alone", shape, 1, 1);
	r->inproc = ra ? ra->inproc : NAN;
	r->p50 = alone.p50;
	r->p99 = alone.p99;

	/* prefill alone: for about as long as the decode run took */
	double span = 0;
	for (uint32_t i = 0; i < opt.decode_calls; i++)
		span += lat[i];
	struct prefill_arg pa = {.c = &pc, .li = li_p, .m = pm};
	pthread_t th;
	pthread_create(&th, NULL, prefill_main, &pa);
	usleep((useconds_t)(span > 200000 ? span : 200000));
	atomic_store(&pa.stop, 1);
	pthread_join(th, NULL);
	const double prefill_alone = pa.done / (pa.t1 - pa.t0) * 1e6;
	char pshape[64];
	snprintf(pshape, sizeof pshape, "%ux%u", n, k);
	r = add_row("d prefill alone", pshape, pm, 1);
	r->p50 = (pa.t1 - pa.t0) / (double)pa.done;
	r->rps = prefill_alone;

	/* together: the prefill client streams while the decode client runs */
	struct prefill_arg pw = {.c = &pc, .li = li_p, .m = pm};
	pthread_create(&th, NULL, prefill_main, &pw);
	usleep(20000);
	const double t0 = now_us();
	const uint64_t done0 = pw.done;
	decode_run(B, li_d, lat, opt.decode_calls);
	const double t1 = now_us();
	const uint64_t done1 = pw.done;
	atomic_store(&pw.stop, 1);
	pthread_join(th, NULL);
	struct timing with = summarize(lat, opt.decode_calls);
	r = add_row("d decode with prefill", shape, 1, 2);
	r->inproc = ra ? ra->inproc : NAN;
	r->p50 = with.p50;
	r->p99 = with.p99;
	r = add_row("d prefill with decode", pshape, pm, 2);
	/* the prefill requests completed while the decode client ran */
	r->rps = done1 > done0 ? (double)(done1 - done0) / (t1 - t0) * 1e6 : (double)pw.done / (pw.t1 - pw.t0) * 1e6;
	r->p50 = 1e6 / r->rps;
	printf("d decode m=1 %s: alone p50 %.2f p99 %.2f | with m=%u prefill p50 %.2f p99 %.2f us; prefill %.1f/s "
	       "alone, %.1f/s with decode\n",
	       shape, alone.p50, alone.p99, pm, with.p50, with.p99, prefill_alone, r->rps);
	free(lat);
	client_close(&pc);
}

/* ---- set-up ---- */

static void inproc_setup(struct bench *B, const char *dir)
{
	const size_t nl = (size_t)B->blocks * B->S->n;
	char err[512];
#ifdef RADIANCE_GPU
	if (B->gpu) {
		struct radiance_gpu_options go = RADIANCE_GPU_OPTIONS_INIT;
		go.max_rows = 16;
		GCHECK(radiance_gpu_map(B->main.r, B->main.id, &go, &B->g));
		struct radiance_gpu_info info;
		radiance_gpu_get_info(B->g, &info);
		GCHECK(radiance__gpu_set_device(info.device));
		GCHECK(radiance__gpu_init(info.device, &B->dev));
		GCHECK(radiance__gpu_stream_create(&B->stream));
		snprintf(B->device, sizeof B->device, "%s", B->dev.name);
		/* the in-process engine: its own copies of the very same arrays */
		const struct radiance_model_info *mi = radiance_held_model(B->main.r, B->main.id);
		B->own = calloc(mi->n_layers, sizeof *B->own);
		for (size_t i = 0; i < nl; i++) {
			const struct radiance__gpu_layer *ml = radiance__gpu_model_layer(B->g, B->li[i]);
			const size_t wb = radiance__w4a8_weight_bytes(ml->n, ml->k), sb = radiance__w4a8_scale_bytes(ml->n, ml->k);
			void *w, *sc;
			GCHECK(radiance__gpu_malloc(&w, wb));
			GCHECK(radiance__gpu_malloc(&sc, sb));
			GCHECK(radiance__gpu_d2d_async(w, ml->w, wb, B->stream));
			GCHECK(radiance__gpu_d2d_async(sc, ml->sc, sb, B->stream));
			B->own[B->li[i]] = (struct radiance__gpu_layer){.n = ml->n, .k = ml->k, .w = w, .sc = sc};
		}
		GCHECK(radiance__gpu_scratch_create(&B->scratch, B->max_m, 64, B->max_n, B->max_k, 0, B->stream));
		/* the daemon's default prefill (`prefill = auto`): fast where wgmma runs */
		B->scratch.settings.prefill = radiance__w4a8_prefill_choose(&B->dev, 0);
		B->prefill_fast = B->scratch.settings.prefill == RADIANCE_PREFILL_FAST;
		GCHECK(radiance__gpu_malloc((void **)&B->dx, (size_t)B->max_m * B->max_k * 2));
		GCHECK(radiance__gpu_malloc((void **)&B->dy, (size_t)B->max_m * B->max_n * 2));
		GCHECK(radiance__gpu_h2d_async(B->dx, B->hx, (size_t)B->max_m * B->max_k * 2, B->stream));
		GCHECK(radiance__gpu_stream_sync(B->stream));
		radiance_gpu_unmap(B->main.r, B->g);
		B->g = NULL;
		return;
	}
#endif
	const double t0 = now_us();
	if (radiance_checkpoint_load_dir(dir, NULL, NULL, NULL, &B->model, err, sizeof err) < 0)
		DIE("in-process load %s: %s", dir, err);
	struct radiance_backend_options bo = {
		.kind = "cpu", .device = -1, .max_rows = B->max_m, .max_decode_rows = 64, .max_n = B->max_n,
		.max_k = B->max_k,
	};
	if (radiance_backend_create(&bo, &B->be, err, sizeof err) < 0)
		DIE("in-process backend: %s", err);
	struct radiance_backend_info info;
	radiance_backend_info(B->be, &info);
	snprintf(B->device, sizeof B->device, "%s", info.device);
	B->handles = calloc(B->model->n_layers, sizeof *B->handles);
	for (size_t i = 0; i < nl; i++)
		if (radiance_backend_layer_upload(B->be, &B->model->layers[B->li[i]], &B->handles[B->li[i]], err,
						  sizeof err) < 0)
			DIE("in-process upload: %s", err);
	fprintf(stderr, "bench_serve: in-process model loaded (%.1f s)\n", (now_us() - t0) / 1e6);
}

static void inproc_teardown(struct bench *B)
{
	if (B->be) {
		for (size_t i = 0; i < B->model->n_layers; i++)
			if (B->handles[i])
				radiance_backend_layer_free(B->be, B->handles[i]);
		radiance_backend_destroy(B->be);
	}
	free(B->handles);
	radiance_model_destroy(B->model);
#ifdef RADIANCE_GPU
	if (B->gpu) {
		for (size_t i = 0; i < (size_t)B->blocks * B->S->n; i++) {
			radiance__gpu_free((void *)B->own[B->li[i]].w);
			radiance__gpu_free((void *)B->own[B->li[i]].sc);
		}
		free(B->own);
		radiance__gpu_scratch_destroy(&B->scratch);
		radiance__gpu_free(B->dx);
		radiance__gpu_free(B->dy);
		radiance__gpu_stream_destroy(B->stream);
	}
#endif
}

static uint32_t parse_u32(const char *opt_name, const char *v)
{
	char *end;
	errno = 0;
	unsigned long x = strtoul(v, &end, 10);
	if (errno || *end || end == v || x > UINT32_MAX)
		DIE("%s: '%s' is not a number", opt_name, v);
	return (uint32_t)x;
}

static int run(int argc, char **argv)
{
	const char *socket = argv[2], *dir = argv[3], *out = argv[5], *note = "";
	struct bench B = {.S = set_by_name(argv[4])};
#ifdef RADIANCE_GPU
	B.gpu = 1;
#endif
	for (int i = 6; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			DIE("%s needs a value", o);
		i++;
		if (strcmp(o, "--inproc") == 0) {
			B.gpu = strcmp(v, "gpu") == 0;
			if (!B.gpu && strcmp(v, "cpu") != 0)
				DIE("--inproc: cpu or gpu, not '%s'", v);
#ifndef RADIANCE_GPU
			if (B.gpu)
				DIE("--inproc gpu: this build has no GPU backend (make GPU=cuda)");
#endif
		} else if (strcmp(o, "--calls") == 0) {
			opt.calls = parse_u32(o, v);
		} else if (strcmp(o, "--warm") == 0) {
			opt.warm = parse_u32(o, v);
		} else if (strcmp(o, "--step-reps") == 0) {
			opt.step_reps = parse_u32(o, v);
		} else if (strcmp(o, "--iters") == 0) {
			opt.iters = parse_u32(o, v);
		} else if (strcmp(o, "--decode-calls") == 0) {
			opt.decode_calls = parse_u32(o, v);
		} else if (strcmp(o, "--prefill-m") == 0) {
			opt.prefill_m = parse_u32(o, v);
		} else if (strcmp(o, "--cases") == 0) {
			snprintf(opt.cases, sizeof opt.cases, "%s", v);
		} else if (strcmp(o, "--label") == 0) {
			label = v;
		} else if (strcmp(o, "--note") == 0) {
			note = v;
		} else if (strcmp(o, "--spin-us") == 0) {
			char *end;
			long sp = strtol(v, &end, 10);
			if (*end || end == v || sp < -1 || sp > 1000000)
				DIE("--spin-us: -1 (never spin), 0 (the library's default) or microseconds, not '%s'", v);
			B.spin_us = (int32_t)sp;
		} else if (strcmp(o, "--ms") == 0) {
			opt.nms = 0;
			char buf[256];
			snprintf(buf, sizeof buf, "%s", v);
			for (char *sv, *t = strtok_r(buf, ",", &sv); t && opt.nms < 16; t = strtok_r(NULL, ",", &sv))
				opt.ms[opt.nms++] = parse_u32(o, t);
		} else {
			DIE("unknown option %s", o);
		}
	}
	if (!opt.calls || !opt.step_reps || !opt.iters || !opt.decode_calls || !opt.prefill_m)
		DIE("--calls, --step-reps, --iters, --decode-calls and --prefill-m must be at least 1");
	B.max_m = 1;
	for (size_t i = 0; i < opt.nms; i++)
		if (opt.ms[i] > B.max_m)
			B.max_m = opt.ms[i];
	if (strchr(opt.cases, 'd') && opt.prefill_m > B.max_m)
		B.max_m = opt.prefill_m;
	for (size_t s = 0; s < B.S->n; s++) {
		if (B.S->s[s].n > B.max_n)
			B.max_n = B.S->s[s].n;
		if (B.S->s[s].k > B.max_k)
			B.max_k = B.S->s[s].k;
	}
	client_open(&B, &B.main, socket, dir, B.max_m, "bench_serve");
	const struct radiance_model_info *mi = radiance_held_model(B.main.r, B.main.id);
	B.blocks = (uint32_t)(mi->n_layers / B.S->n);
	if (B.blocks == 0 || mi->n_layers % B.S->n)
		DIE("%s has %zu layers: not blocks of the %zu shapes of set %s", dir, mi->n_layers, B.S->n, B.S->name);
	B.li = calloc((size_t)B.blocks * B.S->n, sizeof *B.li);
	for (uint32_t b = 0; b < B.blocks; b++)
		for (size_t s = 0; s < B.S->n; s++) {
			char name[256];
			snprintf(name, sizeof name, "model.layers.%u.%s", b, B.S->s[s].module);
			int li = radiance_find_layer(mi, name);
			if (li < 0)
				DIE("%s: no layer %s", dir, name);
			if (mi->layers[li].n != B.S->s[s].n || mi->layers[li].k != B.S->s[s].k)
				DIE("%s: layer %s is %ux%u, the set says %ux%u", dir, name, mi->layers[li].n,
				    mi->layers[li].k, B.S->s[s].n, B.S->s[s].k);
			B.li[b * B.S->n + s] = (uint32_t)li;
		}
	/* activations: random bf16 in [-1, 1) */
	B.hx = malloc((size_t)B.max_m * B.max_k * 2);
	B.hy = malloc((size_t)B.max_m * B.max_n * 2);
	if (!B.hx || !B.hy)
		DIE("out of memory");
	for (size_t i = 0; i < (size_t)B.max_m * B.max_k; i++)
		B.hx[i] = radiance_bf16_from_f32((float)(synth_rnd64() & 0xFFFF) / 32768.0f - 1.0f);
	inproc_setup(&B, dir);

	if (strchr(opt.cases, 'a'))
		case_a(&B);
	if (strchr(opt.cases, 'b'))
		case_b(&B);
	if (strchr(opt.cases, 'c'))
		case_c(&B, socket, dir);
	if (strchr(opt.cases, 'd'))
		case_d(&B, socket, dir);
	write_out(&B, out, note);
	printf("bench_serve: %zu rows in %s.csv and %s.md; %d wrong results\n", nrows, out, out, B.failures);
	inproc_teardown(&B);
	client_close(&B.main);
	free(B.li);
	free(B.hx);
	free(B.hy);
	return B.failures ? 1 : 0;
}

static int gen(const char *dir, const char *set, const char *blocks)
{
	const struct shape_set *S = set_by_name(set);
	const uint32_t nb = blocks ? parse_u32("BLOCKS", blocks) : S->blocks;
	char err[512];
	uint64_t bytes = 0;
	const double t0 = now_us();
	if (nb == 0)
		DIE("BLOCKS must be at least 1");
	if (synth_checkpoint_write(dir, S->s, S->n, nb, &bytes, err, sizeof err) < 0)
		DIE("gen: %s", err);
	printf("gen: %s: %s, %u blocks, %.3f GB in %.1f s\n", dir, S->name, nb, (double)bytes / 1e9,
	       (now_us() - t0) / 1e6);
	return 0;
}

int main(int argc, char **argv)
{
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "gen") == 0)
		return gen(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
	if (argc >= 6 && strcmp(argv[1], "run") == 0)
		return run(argc, argv);
	fprintf(stderr, "usage: bench_serve gen DIR 27b|minilm [BLOCKS]\n"
			"       bench_serve run SOCKET DIR 27b|minilm OUT [--inproc cpu|gpu] [--calls N] [--warm N]\n"
			"           [--ms 1,4,16,64,256,2048] [--step-reps N] [--iters N] [--decode-calls N]\n"
			"           [--prefill-m M] [--cases abcd] [--label TEXT] [--note TEXT] [--spin-us US]\n");
	return 2;
}
