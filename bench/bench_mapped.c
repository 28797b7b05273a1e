/*
 * Mapped weights against the rings and against the weights in-process
 * (docs/mapped.md; results in bench/results/mapped-*.{csv,md}).
 *
 *   bench_mapped gen DIR [BLOCKS]     write a synthetic AutoRound checkpoint of
 *                                     BLOCKS (16) blocks of the 27B shapes
 *   bench_mapped run SOCKET DIR OUT   per-call and 64-layer decode-step times:
 *                                     in-process, mapped, rings -> OUT.csv
 *   bench_mapped hold SOCKET DIR mapped|private SECONDS
 *                                     one engine process for the memory figure:
 *                                     maps the model (or allocates and fills a
 *                                     private copy of its size), prints
 *                                     "ready", sleeps
 *   bench_mapped rwprobe SOCKET DIR   can a session that maps a model change
 *                                     its weights for everybody? (imports the
 *                                     fd read-write and writes)
 *   bench_mapped copyprobe SOCKET     small copies to and from a session arena
 *
 * The synthetic model (bench_w4a8.c's 27B hybrid): per block a linear-
 * attention input projection 16384x5120, a full-attention qkv 14336x5120,
 * an out projection 5120x6144, gate_up 34816x5120 and down 5120x17408,
 * ~235 MB; 16 blocks, 3.8 GB, so that rotating through the blocks reads
 * every shape from DRAM (the smallest, 5120x6144, 16 x 16 MB = 4x the
 * H200's L2). A decode step of the 64-layer model runs layer i from block
 * i % BLOCKS: qkv of full attention when i % 4 == 3, else the linear
 * attention's, then out, gate_up, down: 256 calls.
 *
 * Timing: per call, the wall time of launch(es) + stream synchronize, p50
 * and p99 over 200 calls after 20 warm-up calls; for the rings, the time an
 * engine with device activations pays: x device -> arena (pinned), submit,
 * wait, y arena -> device. "kernel" rows: device time of 20 back-to-back
 * calls between events, median of 7. The in-process copies are d2d copies
 * of the mapped arrays, so in-process and mapped compute the same bits
 * (checked).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef RADIANCE_GPU
#include "gpu/gpu-private.h"
#include "map.h"
#include "numerics.h"
#include "radiance.h"
#include "w4a8_gpu.h"
#include "bench_stats.h"
#include "synth_checkpoint.h"

#define NSHAPES 5
#define CALLS 200
#define WARM 20
#define MAX_M 16u


/* ---- gen ---- */

static uint64_t rnd64(void)
{
	return synth_rnd64();
}

/* bench_w4a8.c's 27B hybrid shapes */
static const struct synth_shape shapes[NSHAPES] = {
	{16384, 5120, "linear_attn.in_proj"},
	{14336, 5120, "self_attn.qkv_proj"},
	{5120, 6144, "self_attn.o_proj"},
	{34816, 5120, "mlp.gate_up_proj"},
	{5120, 17408, "mlp.down_proj"},
};

static int gen(const char *dir, uint32_t blocks)
{
	char err[512];
	uint64_t bytes = 0;
	double t0 = now_us();
	if (synth_checkpoint_write(dir, shapes, NSHAPES, blocks, &bytes, err, sizeof err) < 0)
		DIE("gen: %s", err);
	printf("gen: %s: %u blocks, %.2f GB in %.1f s\n", dir, blocks, (double)bytes / 1e9, (now_us() - t0) / 1e6);
	return 0;
}

/* ---- shared setup ---- */

static struct radiance *connect_to(const char *socket, uint64_t arena)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 600000;
	o.arena_bytes = arena;
	o.client_name = "bench_mapped";
	struct radiance *r = radiance_connect(socket, &o);
	if (!r)
		DIE("connect %s: %s", socket, strerror(errno));
	return r;
}

static uint32_t load(struct radiance *r, const char *dir)
{
	uint32_t id;
	double t0 = now_us();
	if (radiance_load_model(r, dir, NULL, &id) < 0)
		DIE("load %s: %s", dir, radiance_error_message(r));
	fprintf(stderr, "bench_mapped: model %u resident (%.1f s)\n", id, (now_us() - t0) / 1e6);
	return id;
}

/* layer index of (block, shape) in the model */
static int layer_of(struct radiance *r, uint32_t id, uint32_t b, int s)
{
	char name[256];
	snprintf(name, sizeof name, "model.layers.%u.%s", b, shapes[s].module);
	int li = radiance_find_layer(radiance_held_model(r, id), name);
	if (li < 0)
		DIE("no layer %s", name);
	return li;
}

/* ---- run ---- */

struct bench {
	struct radiance *r;
	uint32_t id, blocks;
	struct radiance_gpu_model *g;
	struct radiance__gpu_device dev;
	struct radiance__gpu_scratch scratch;   /* the in-process engine's own */
	struct radiance__gpu_layer *own;        /* [blocks * NSHAPES] private copies */
	uint32_t *li;                           /* [blocks * NSHAPES] model layer index */
	void *stream, *ev0, *ev1;
	uint16_t *dx, *dy;                      /* device activations */
	uint16_t *ax, *ay;                      /* arena */
};

enum mode { INPROC, MAPPED, RINGS };

/* the rings call's parts, per call of the last per_call(RINGS): x out,
 * submit..completion, y in (each with its synchronize), the daemon's
 * queue + exec time from the completion */
static double part_out[WARM + CALLS], part_rt[WARM + CALLS], part_in[WARM + CALLS], part_daemon[WARM + CALLS];
static uint32_t part_i;

static void call(struct bench *B, enum mode md, uint32_t b, int s, uint32_t m)
{
	const uint32_t i = b * NSHAPES + (uint32_t)s;
	if (md == INPROC) {
		GCHECK(radiance__gpu_layer_run(&B->dev, &B->scratch, &B->own[i], B->dx, RADIANCE_DTYPE_BF16, m, B->dy,
					      B->stream, RADIANCE_W4A8_AUTO, NULL));
	} else if (md == MAPPED) {
		GCHECK(radiance_gpu_linear(B->g, B->li[i], B->dx, B->dy, m, RADIANCE_BF16, B->stream));
	} else {
		/* what an engine with device activations pays through the rings */
		const uint32_t n = shapes[s].n, k = shapes[s].k;
		const double t0 = now_us();
		GCHECK(radiance__gpu_d2h_async(B->ax, B->dx, (size_t)m * k * 2, B->stream));
		GCHECK(radiance__gpu_stream_sync(B->stream));
		const double t1 = now_us();
		uint64_t req;
		struct radiance_completion c;
		if (radiance_submit(B->r, B->id, B->li[i], m, RADIANCE_BF16, B->ax, B->ay, &req) < 0 ||
		    radiance_wait(B->r, &c, 10000) != 1 || c.status)
			DIE("rings: %s", radiance_error_message(B->r));
		const double t2 = now_us();
		GCHECK(radiance__gpu_h2d_async(B->dy, B->ay, (size_t)m * n * 2, B->stream));
		GCHECK(radiance__gpu_stream_sync(B->stream));
		if (part_i < WARM + CALLS) {
			part_out[part_i] = t1 - t0;
			part_rt[part_i] = t2 - t1;
			part_in[part_i] = now_us() - t2;
			part_daemon[part_i] = (double)(c.queue_ns + c.exec_ns) / 1e3;
			part_i++;
		}
	}
}

static struct timing per_call(struct bench *B, enum mode md, int s, uint32_t m)
{
	static double t[CALLS];
	for (uint32_t c = 0; c < WARM + CALLS; c++) {
		const double t0 = now_us();
		call(B, md, c % B->blocks, s, m);
		GCHECK(radiance__gpu_stream_sync(B->stream));
		if (c >= WARM)
			t[c - WARM] = now_us() - t0;
	}
	return summarize(t, CALLS);
}

/* device time of one call: 20 back-to-back between events, median of 7 */
static double kernel_us(struct bench *B, enum mode md, int s, uint32_t m)
{
	double t[7];
	for (uint32_t c = 0; c < 5; c++)
		call(B, md, c % B->blocks, s, m);
	for (int rep = 0; rep < 7; rep++) {
		GCHECK(radiance__gpu_event_record(B->ev0, B->stream));
		for (uint32_t c = 0; c < 20; c++)
			call(B, md, (rep * 20 + c) % B->blocks, s, m);
		GCHECK(radiance__gpu_event_record(B->ev1, B->stream));
		float ms;
		GCHECK(radiance__gpu_event_elapsed(B->ev0, B->ev1, &ms));
		t[rep] = ms * 1000.0 / 20;
	}
	return summarize(t, 7).p50;
}

/* the 64-layer decode step: 256 calls, one synchronize at the end (the
 * rings synchronize on every call: each needs its result back) */
static void step(struct bench *B, enum mode md)
{
	for (uint32_t l = 0; l < 64; l++) {
		const uint32_t b = l % B->blocks;
		call(B, md, b, l % 4 == 3 ? 1 : 0, 1);
		call(B, md, b, 2, 1);
		call(B, md, b, 3, 1);
		call(B, md, b, 4, 1);
	}
}

static struct timing step_time(struct bench *B, enum mode md, void *graph)
{
	double t[15];
	for (int rep = 0; rep < 3 + 15; rep++) {
		const double t0 = now_us();
		if (graph)
			GCHECK(radiance__gpu_graph_launch(graph, B->stream));
		else
			step(B, md);
		GCHECK(radiance__gpu_stream_sync(B->stream));
		if (rep >= 3)
			t[rep - 3] = now_us() - t0;
	}
	return summarize(t, 15);
}

static void *capture_step(struct bench *B, enum mode md)
{
	void *exec = NULL;
	GCHECK(radiance__gpu_graph_begin(B->stream));
	step(B, md);
	GCHECK(radiance__gpu_graph_end(B->stream, &exec));
	return exec;
}

static int run(const char *socket, const char *dir, const char *out)
{
	struct bench B = {0};
	const uint64_t arena = 32u << 20;
	B.r = connect_to(socket, arena);
	B.id = load(B.r, dir);
	const struct radiance_model_info *mi = radiance_held_model(B.r, B.id);
	B.blocks = (uint32_t)(mi->n_layers / NSHAPES);
	struct radiance_gpu_options go = RADIANCE_GPU_OPTIONS_INIT;
	go.max_rows = MAX_M;
	double t0 = now_us();
	GCHECK(radiance_gpu_map(B.r, B.id, &go, &B.g));
	const double map_ms = (now_us() - t0) / 1e3;
	struct radiance_gpu_info info;
	radiance_gpu_get_info(B.g, &info);
	GCHECK(radiance__gpu_set_device(info.device));
	GCHECK(radiance__gpu_init(info.device, &B.dev));
	GCHECK(radiance__gpu_stream_create(&B.stream));
	GCHECK(radiance__gpu_event_create(&B.ev0));
	GCHECK(radiance__gpu_event_create(&B.ev1));
	fprintf(stderr, "bench_mapped: mapped %.2f GB (%s, read-only %d) in %.1f ms, scratch %.1f MiB; %u blocks\n",
		info.mapped_bytes / 1e9, info.handle, info.read_only, map_ms, info.scratch_bytes / 1048576.0,
		B.blocks);

	/* the in-process engine: its own copies of the very same arrays */
	const size_t nl = (size_t)B.blocks * NSHAPES;
	B.own = calloc(nl, sizeof *B.own);
	B.li = calloc(nl, sizeof *B.li);
	for (uint32_t b = 0; b < B.blocks; b++)
		for (int s = 0; s < NSHAPES; s++) {
			const uint32_t i = b * NSHAPES + (uint32_t)s;
			B.li[i] = (uint32_t)layer_of(B.r, B.id, b, s);
			const struct radiance__gpu_layer *ml = radiance__gpu_model_layer(B.g, B.li[i]);
			const size_t wb = radiance__w4a8_weight_bytes(ml->n, ml->k), sb = radiance__w4a8_scale_bytes(ml->n, ml->k);
			void *w, *sc;
			GCHECK(radiance__gpu_malloc(&w, wb));
			GCHECK(radiance__gpu_malloc(&sc, sb));
			GCHECK(radiance__gpu_d2d_async(w, ml->w, wb, B.stream));
			GCHECK(radiance__gpu_d2d_async(sc, ml->sc, sb, B.stream));
			B.own[i] = (struct radiance__gpu_layer){.n = ml->n, .k = ml->k, .w = w, .sc = sc};
		}
	GCHECK(radiance__gpu_scratch_create(&B.scratch, MAX_M, 64, 34816, 17408, 0, B.stream));
	GCHECK(radiance__gpu_malloc((void **)&B.dx, (size_t)MAX_M * 17408 * 2));
	GCHECK(radiance__gpu_malloc((void **)&B.dy, (size_t)MAX_M * 34816 * 2));
	/* activations: random bf16 around 1 */
	uint16_t *hx = malloc((size_t)MAX_M * 17408 * 2);
	for (size_t i = 0; i < (size_t)MAX_M * 17408; i++)
		hx[i] = radiance_bf16_from_f32(((float)(rnd64() & 0xFFFF) / 32768.0f - 1.0f));
	GCHECK(radiance__gpu_h2d_async(B.dx, hx, (size_t)MAX_M * 17408 * 2, B.stream));
	GCHECK(radiance__gpu_stream_sync(B.stream));
	B.ax = radiance_arena_alloc(B.r, (size_t)MAX_M * 17408 * 2);
	B.ay = radiance_arena_alloc(B.r, (size_t)MAX_M * 34816 * 2);
	struct radiance_ring_info ri;
	void *adev;
	if (!B.ax || !B.ay || radiance_get_ring_info(B.r, &ri) < 0)
		DIE("arena: %s", radiance_error_message(B.r));
	GCHECK(radiance__gpu_host_register(ri.arena, ri.arena_bytes, &adev));

	/* the same bits three ways */
	uint16_t *y3[3];
	for (int md = 0; md < 3; md++) {
		y3[md] = malloc((size_t)4 * 34816 * 2);
		call(&B, (enum mode)md, 1, 3, 4);
		GCHECK(radiance__gpu_d2h_async(y3[md], B.dy, (size_t)4 * 34816 * 2, B.stream));
		GCHECK(radiance__gpu_stream_sync(B.stream));
	}
	const int same = !memcmp(y3[0], y3[1], (size_t)4 * 34816 * 2) && !memcmp(y3[0], y3[2], (size_t)4 * 34816 * 2);
	fprintf(stderr, "bench_mapped: gate_up m=4: in-process, mapped and rings results %s\n",
		same ? "identical" : "DIFFER");

	char date[16], path[4096];
	time_t now = time(NULL);
	strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
	snprintf(path, sizeof path, "%s.csv", out);
	FILE *csv = fopen(path, "w");
	if (!csv)
		DIE("%s: %s", path, strerror(errno));
	fprintf(csv, "date,gpu,case,shape,m,processes,inproc_us,mapped_us,rings_us\n");
	printf("%-26s %-12s %3s %10s %10s %10s %9s\n", "case", "shape", "m", "inproc", "mapped", "rings", "mapped-in");
	static const uint32_t ms[] = {1, 4, 16};
	for (int s = 0; s < NSHAPES; s++)
		for (size_t mi_ = 0; mi_ < sizeof ms / sizeof ms[0]; mi_++) {
			const uint32_t m = ms[mi_];
			/* interleaved, so drift hits all three alike */
			struct timing a = per_call(&B, INPROC, s, m), b = per_call(&B, MAPPED, s, m);
			part_i = 0;
			struct timing c = per_call(&B, RINGS, s, m);
			const double p_out = summarize(part_out + WARM, CALLS).p50, p_rt = summarize(part_rt + WARM, CALLS).p50;
			const double p_in = summarize(part_in + WARM, CALLS).p50, p_d = summarize(part_daemon + WARM, CALLS).p50;
			struct timing a2 = per_call(&B, INPROC, s, m), b2 = per_call(&B, MAPPED, s, m);
			a.p50 = (a.p50 + a2.p50) / 2;
			b.p50 = (b.p50 + b2.p50) / 2;
			char shape[32];
			snprintf(shape, sizeof shape, "%ux%u", shapes[s].n, shapes[s].k);
			fprintf(csv, "%s,%s,call p50,%s,%u,2,%.2f,%.2f,%.2f\n", date, B.dev.name, shape, m, a.p50, b.p50, c.p50);
			fprintf(csv, "%s,%s,call p99,%s,%u,2,%.2f,%.2f,%.2f\n", date, B.dev.name, shape, m, a.p99, b.p99, c.p99);
			static const char *part[4] = {"x out (D2H + sync)", "submit to completion", "y in (H2D + sync)",
						      "in the daemon (queue + exec)"};
			const double pv[4] = {p_out, p_rt, p_in, p_d};
			for (int pi = 0; pi < 4; pi++)
				fprintf(csv, "%s,%s,rings part p50: %s,%s,%u,2,,,%.2f\n", date, B.dev.name, part[pi], shape, m,
					pv[pi]);
			printf("%-26s %-12s %3u %10.2f %10.2f %10.2f %+9.2f\n", "call p50 (wall, sync)", shape, m, a.p50,
			       b.p50, c.p50, b.p50 - a.p50);
			printf("%-26s %-12s %3u   rings: x out %.2f, round trip %.2f (daemon %.2f), y in %.2f\n",
			       "", shape, m, p_out, p_rt, p_d, p_in);
			const double ka = kernel_us(&B, INPROC, s, m), kb = kernel_us(&B, MAPPED, s, m);
			fprintf(csv, "%s,%s,device time,%s,%u,2,%.2f,%.2f,\n", date, B.dev.name, shape, m, ka, kb);
			printf("%-26s %-12s %3u %10.2f %10.2f %10s %+9.2f\n", "device time (20 calls)", shape, m, ka, kb, "",
			       kb - ka);
			fflush(stdout);
		}
	struct timing si = step_time(&B, INPROC, NULL), sm = step_time(&B, MAPPED, NULL);
	struct timing sr = step_time(&B, RINGS, NULL);
	fprintf(csv, "%s,%s,decode step 64 layers,27B synthetic,1,2,%.1f,%.1f,%.1f\n", date, B.dev.name, si.p50, sm.p50,
		sr.p50);
	printf("%-26s %-12s %3u %10.1f %10.1f %10.1f %+9.1f\n", "decode step (256 calls)", "27B", 1, si.p50, sm.p50,
	       sr.p50, sm.p50 - si.p50);
	void *gi = capture_step(&B, INPROC), *gm = capture_step(&B, MAPPED);
	struct timing gsi = step_time(&B, INPROC, gi), gsm = step_time(&B, MAPPED, gm);
	fprintf(csv, "%s,%s,decode step 64 layers (CUDA graph),27B synthetic,1,2,%.1f,%.1f,\n", date, B.dev.name,
		gsi.p50, gsm.p50);
	printf("%-26s %-12s %3u %10.1f %10.1f %10s %+9.1f\n", "decode step, graph", "27B", 1, gsi.p50, gsm.p50, "",
	       gsm.p50 - gsi.p50);
	fclose(csv);
	radiance__gpu_graph_destroy(gi);
	radiance__gpu_graph_destroy(gm);
	radiance__gpu_host_unregister(ri.arena);
	GCHECK(radiance_gpu_unmap(B.r, B.g));
	radiance_disconnect(B.r);
	return same ? 0 : 1;
}

/* ---- hold: one engine process for the memory figure ---- */

static int hold(const char *socket, const char *dir, const char *how, int seconds)
{
	struct radiance *r = connect_to(socket, 0);
	const uint32_t id = load(r, dir);
	struct radiance_gpu_model *g = NULL;
	struct radiance_gpu_options go = RADIANCE_GPU_OPTIONS_INIT;
	go.max_rows = MAX_M;
	struct radiance__gpu_scratch scratch = {0};
	uint64_t own = 0;
	if (strcmp(how, "mapped") == 0) {
		GCHECK(radiance_gpu_map(r, id, &go, &g));
	} else {
		/* a private copy: every layer's arrays allocated and written here,
		 * the same sizes, plus the same scratch a mapping allocates */
		const struct radiance_model_info *mi = radiance_held_model(r, id);
		struct radiance__gpu_device dev;
		GCHECK(radiance__gpu_init(0, &dev));
		for (size_t i = 0; i < mi->n_layers; i++) {
			const struct radiance_layer_info *l = &mi->layers[i];
			void *w, *sc;
			const size_t wb = radiance__w4a8_weight_bytes(l->n, l->k), sb = radiance__w4a8_scale_bytes(l->n, l->k);
			GCHECK(radiance__gpu_malloc(&w, wb));
			GCHECK(radiance__gpu_malloc(&sc, sb));
			GCHECK(radiance__gpu_memset_async(w, 0x5A, wb, NULL));
			GCHECK(radiance__gpu_memset_async(sc, 0x11, sb, NULL));
			own += wb + sb;
		}
		GCHECK(radiance__gpu_scratch_create(&scratch, MAX_M, 64, 34816, 17408, 0, NULL));
		GCHECK(radiance__gpu_device_sync());
	}
	size_t fr, tot;
	GCHECK(radiance__gpu_mem_info(&fr, &tot));
	printf("ready pid %d %s: device free %.0f MiB of %.0f, own copy %.0f MiB\n", (int)getpid(), how, fr / 1048576.0,
	       tot / 1048576.0, own / 1048576.0);
	fflush(stdout);
	sleep((unsigned)seconds);
	if (g)
		radiance_gpu_unmap(r, g);
	radiance_disconnect(r);
	return 0;
}

/* ---- rwprobe ---- */

static int rwprobe(const char *socket, const char *dir)
{
	struct radiance *r = connect_to(socket, 0);
	const uint32_t id = load(r, dir);
	const struct radiance_layer_info *l = &radiance_held_model(r, id)->layers[0];
	uint16_t x[1024], before[4096], after[4096];
	for (uint32_t i = 0; i < l->k; i++)
		x[i] = radiance_bf16_from_f32(1.0f + (float)(i % 7) / 8.0f);
	if (radiance_linear(r, id, 0, 1, RADIANCE_BF16, x, before) < 0)
		DIE("rings: %s", radiance_error_message(r));
	struct radiance_mapping *m;
	if (radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION, &m) < 0)
		DIE("map: %s", radiance_error_message(r));
	int ord;
	GCHECK(radiance__gpu_device_by_pci_bus_id(m->pci_bus_id, &ord));
	GCHECK(radiance__gpu_set_device(ord));
	struct radiance__gpu_import imp;
	int rc = m->handle == RADIANCE_MAP_POSIX_FD
			 ? radiance__gpu_share_import_fd(ord, m->fd, m->bytes, m->granularity, 0, &imp)
			 : radiance__gpu_share_import_ipc(m->ipc_handle, m->bytes, &imp);
	if (rc) {
		printf("rwprobe: a read-write mapping of the daemon's allocation is refused: %s\n",
		       radiance__gpu_last_error());
		return 0;
	}
	rc = radiance__gpu_memset_async((uint8_t *)imp.base + m->layers[0].weight_offset, 0x00, 4096, NULL);
	if (!rc)
		rc = radiance__gpu_device_sync();
	if (radiance_linear(r, id, 0, 1, RADIANCE_BF16, x, after) < 0)
		DIE("rings: %s", radiance_error_message(r));
	const int changed = memcmp(before, after, (size_t)l->n * 2) != 0;
	printf("rwprobe: %s import mapped read-write: accepted; the write %s; the daemon's output for "
	       "other sessions %s\n", m->handle == RADIANCE_MAP_POSIX_FD ? "VMM fd" : "IPC",
	       rc ? "failed" : "succeeded", changed ? "CHANGED" : "is unchanged");
	radiance__gpu_share_unimport(&imp);
	radiance_mapping_free(m);
	radiance_disconnect(r);
	return 0;
}

/* ---- copyprobe: small copies to and from a session's arena ---- */

static double copy_p50(void *dev, void *host, size_t bytes, int h2d, void *stream)
{
	double t[100];
	for (int i = 0; i < 110; i++) {
		const double t0 = now_us();
		GCHECK(h2d ? radiance__gpu_h2d_async(dev, host, bytes, stream) : radiance__gpu_d2h_async(host, dev, bytes, stream));
		GCHECK(radiance__gpu_stream_sync(stream));
		if (i >= 10)
			t[i - 10] = now_us() - t0;
	}
	return summarize(t, 100).p50;
}

/* The rings' y copies of 10240 bytes took ~150 us where 12288 took ~9:
 * the same copies from a session's arena (at the bench's offsets and
 * others), from malloc + register, and from cudaHostAlloc-like pinned
 * memory, in this process alone. */
static int copyprobe(const char *socket)
{
	struct radiance *r = connect_to(socket, 32u << 20);
	uint8_t *a = radiance_arena_alloc(r, 4u << 20);
	struct radiance_ring_info ri;
	if (!a || radiance_get_ring_info(r, &ri) < 0)
		DIE("arena: %s", radiance_error_message(r));
	void *adev, *stream, *dev, *pdev;
	GCHECK(radiance__gpu_init(0, &(struct radiance__gpu_device){0}));
	GCHECK(radiance__gpu_stream_create(&stream));
	GCHECK(radiance__gpu_malloc(&dev, 1u << 20));
	GCHECK(radiance__gpu_host_register(ri.arena, ri.arena_bytes, &adev));
	uint8_t *plain = aligned_alloc(4096, 4u << 20);
	memset(plain, 1, 4u << 20);
	GCHECK(radiance__gpu_host_register(plain, 4u << 20, &pdev));
	static const size_t sizes[] = {4096, 8192, 10240, 12288, 16384, 32768};
	static const size_t offs[] = {0, 557056, 557056 + 64, 1u << 20};
	printf("%-45s size:", "copyprobe (p50 us, copy + synchronize)");
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		printf(" %8zu", sizes[i]);
	printf("\n");
	for (int h2d = 0; h2d < 2; h2d++) {
		for (size_t o = 0; o < sizeof offs / sizeof offs[0] + 1; o++) {
			uint8_t *host = o < sizeof offs / sizeof offs[0] ? (uint8_t *)ri.arena + offs[o] : plain;
			char label[64];
			if (o < sizeof offs / sizeof offs[0])
				snprintf(label, sizeof label, "%s session arena + %zu", h2d ? "H2D" : "D2H", offs[o]);
			else
				snprintf(label, sizeof label, "%s malloc + cudaHostRegister", h2d ? "H2D" : "D2H");
			printf("%-50s", label);
			for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
				printf(" %8.2f", copy_p50(dev, host, sizes[i], h2d, stream));
			printf("\n");
		}
	}
	radiance__gpu_host_unregister(plain);
	radiance__gpu_host_unregister(ri.arena);
	radiance_disconnect(r);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "copyprobe") == 0)
		return copyprobe(argv[2]);
	if (argc >= 3 && strcmp(argv[1], "gen") == 0)
		return gen(argv[2], argc > 3 ? (uint32_t)atoi(argv[3]) : 16);
	if (argc == 5 && strcmp(argv[1], "run") == 0)
		return run(argv[2], argv[3], argv[4]);
	if (argc == 6 && strcmp(argv[1], "hold") == 0)
		return hold(argv[2], argv[3], argv[4], atoi(argv[5]));
	if (argc == 4 && strcmp(argv[1], "rwprobe") == 0)
		return rwprobe(argv[2], argv[3]);
	fprintf(stderr, "usage: bench_mapped gen DIR [BLOCKS] | run SOCKET DIR OUT | hold SOCKET DIR mapped|private "
			"SECONDS | rwprobe SOCKET DIR | copyprobe SOCKET\n");
	return 2;
}

#else
int main(void)
{
	fprintf(stderr, "bench_mapped: this build has no GPU backend (make GPU=cuda or GPU=hip)\n");
	return 77;
}
#endif
