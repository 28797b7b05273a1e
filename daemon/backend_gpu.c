/*
 * The GPU backend (make GPU=cuda or GPU=hip): W4A8 layers on the kernels of
 * kernels/ (w4a8_gpu.h), bf16 layers on the vendor BLAS.
 *
 * Memory: everything a linear() needs is allocated once at create, sized from
 * the options (max_rows, max_decode_rows, max_n, max_k): activation staging,
 * e4m3 codes and per-token scales, output staging, the fp32 scratch that holds
 * split-K partials (and bf16-layer GEMM results), the split-K counters and
 * the BLAS workspace. Serving never allocates device memory.
 *
 * A launch (linear_start) is queued on its lane (below) and returns at
 * once: per run of requests of one activation dtype, the stacked rows'
 * quant and GEMM, then a completion word: the stream writes the launch's
 * ticket into a word of registered host memory (radiance__gpu_signal,
 * cuStreamWriteValue32 on CUDA) after everything before it, and
 * linear_done() only reads that word (and, every 4096th unfinished look,
 * asks the lane's streams whether the device faulted). linear() is linear_start
 * plus a spin on the word.
 *
 * Moving rows (docs/gpu.md has the measurements): a W4A8 launch of at most
 * zero_copy_rows rows whose rows all lie in registered arenas moves none of
 * them with the copy engine: the quant kernel reads every request's x in
 * place through the arenas' device mappings, all requests in one launch
 * (radiance__gpu_quant_rows), when none is above zero_copy_x_kib, else the
 * row-copy kernel (radiance__gpu_rows_copy) gathers x into the staging
 * buffer first; the GEMM writes every request's y in place (16-byte
 * stores of whole row pieces) when none is above zero_copy_y_kib, several
 * requests' only in the decode band, else y is scattered from the staging
 * buffer by one row-copy kernel, not one copy call per request. Bigger
 * launches, bf16 layers and rows outside registered memory
 * take async copies into and out of the staging buffers.
 *
 * Numerics gate (opt-in, numerics_gate = 1): the first launch of each
 * (layer, M) is recomputed by the CPU reference; the relative error and, for
 * W4A8 layers, every element against the contract's bound
 * (kernels/numerics_bound.h) are logged to stderr.
 *
 * Mapped weights (docs/mapped.md): each model's layers live in one
 * exportable allocation (kernels/gpu_share.hip): VMM with a POSIX fd where
 * the device has it, else a plain allocation with a legacy IPC handle, said
 * loudly at create. The share option (config share, --share,
 * RADIANCE_SHARE: vmm|ipc|none) overrides the choice (none: private
 * per-layer allocations, MapModel refused).
 */
#include "backend_impl.h"

#ifdef RADIANCE_GPU

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "numerics_bound.h"
#include "stage_ring.h"
#include "w4a8_cpu.h"
#include "w4a8_gpu.h"

struct registered {
	void *base;
	size_t len;
	void *dev;
	size_t piece;   /* registered in pieces of this many bytes; 0: as one range */
};

/* One piece's driver calls past this are logged: launches of every other
 * thread can wait for them (the driver's lock). */
#define PIECE_SLOW_NS (5u * 1000000u)

static void piece_slow(const char *what, const struct registered *r, uint64_t slowest)
{
	if (slowest > PIECE_SLOW_NS)
		log_warn("gpu backend: %s a host range (%zu bytes in %zu KiB pieces): one piece took %.3f ms "
			 "in the driver, and launches may have waited for it", what, r->len, r->piece >> 10,
			 slowest / 1e6);
}

/* pace runs between two pieces (backend.h, pin_pace) */
static void unregister_range(const struct registered *r, void (*pace)(void *), void *pace_arg)
{
	uint64_t slowest = 0;
	int rc = r->piece ? radiance__gpu_host_unregister_pieces(r->base, r->len, r->piece, &slowest, pace, pace_arg)
			  : radiance__gpu_host_unregister(r->base);
	if (rc)
		log_warn("gpu backend: unregistering a host range: %s", radiance__gpu_last_error());
	piece_slow("unregistering", r, slowest);
}

struct gate_seen {
	const struct radiance_layer *layer;
	uint32_t m;
};

/* A queue of launches with its own staging and scratch: lane 0 (decode,
 * the stream of greatest priority) and lane 1 (bulk, least priority;
 * uploads have a stream of their own, gpu_state.stream). The device's
 * block scheduler starts a lane-0 kernel's blocks ahead of the waiting
 * blocks of lane 1, so a decode token runs beside a prefill piece instead
 * of after it. */
#define LANE_DECODE 0
#define LANE_BULK 1
#define DECODE_LANE_ROWS 64u       /* most rows of a lane-0 launch */

/* The bulk lane is a pipeline of three streams (docs/gpu.md "Moving
 * rows"): copy-in (x, host to staging), the lane's stream (quant and GEMM:
 * everything that touches the scratch stays on it, in order) and copy-out
 * (y, staging to host, then the completion word, so that a ticket's word
 * follows its own y and the words of the lane come in ticket order). A
 * piece takes the next free rows of each staging buffer (stage_ring.h):
 * x rows are free again once the launch that read them ran on the lane's
 * stream (x_guard, recorded there), y rows once their copy-out ran
 * (y_guard, recorded on copy-out). So piece i+1's x copy and piece i-1's
 * y copy run beside piece i's GEMM. */
#define STAGE_ALIGN 64u            /* rows: x is padded to 64 rows, and every
				      range starts 128-byte aligned */

struct lane {
	void *stream;
	uint32_t rows;             /* staging rows */
	uint16_t *x;               /* [rows][max_k] staging (bf16/fp16 bits) */
	uint16_t *y;               /* [rows][max_n] bf16 staging */
	struct radiance__gpu_scratch scratch;   /* codes, scales, split-K, BLAS */
	uint32_t seq;              /* the last ticket handed out */
	/* the bulk lane's pipeline (NULL on the decode lane, which runs
	 * everything on its one stream from row 0) */
	void *in, *out;            /* copy-in and copy-out streams */
	void *x_ready, *y_ready;   /* in -> stream, stream -> out hand-offs */
	void *x_guard[STAGE_RING_SLOTS], *y_guard[STAGE_RING_SLOTS];
	struct stage_ring xs, ys;  /* which staging rows are whose */
};

struct gpu_state {
	struct radiance__gpu_device dev;
	/* Uploads: a stream of their own (least priority), so that an upload's
	 * synchronize waits for its own copies, not for the prefill pieces
	 * queued on the bulk lane; and the canonical qweight/scales
	 * temporaries the repack reads, kept and grown to the largest layer
	 * seen (a cudaFree per layer synchronized the whole device). Used by
	 * one upload at a time (the executor's thread). */
	void *stream;
	void *up_q, *up_s;
	size_t up_q_bytes, up_s_bytes;
	uint32_t max_rows, max_n, max_k;
	struct lane lanes[2];
	uint64_t scratch_bytes;
	enum radiance__gpu_share_kind share;    /* how models are allocated */
	char share_why[192];
	char pci_bus_id[32];
	/* the registered arenas: added and removed by register_host and
	 * unregister_host on the loop's worker threads, looked up by the
	 * executor's launches (mapped), all under regs_lock, held only to
	 * change or search the table, never across a driver call */
	pthread_mutex_t regs_lock;
	struct registered *regs;
	size_t n_regs, cap_regs;
	uint32_t zero_copy_rows;
	size_t zc_x_bytes, zc_y_bytes;   /* zero_copy_x_kib, zero_copy_y_kib (run_mapped) */
	size_t pin_piece;   /* arenas page-locked in pieces of this many bytes (0: whole) */
	void (*pin_pace)(void *);   /* between two pieces (backend.h) */
	void *pin_pace_arg;
	volatile uint32_t *done_host;   /* the lanes' completion words (a registered page) */
	void *done_dev;                 /* its device address */
	uint32_t polls;                 /* unfinished looks since the last stream query */
	int gate;
	struct gate_seen *seen;
	size_t n_seen, cap_seen;
};

struct radiance_backend_layer {
	enum radiance_layer_kind kind;
	uint32_t n, k;
	void *w;                   /* W4A8: device layout; BF16: bf16 [n][k] */
	void *sc;                  /* W4A8 scale blocks */
	float *bias;               /* [n] or NULL */
	int pooled;                /* inside a model's shared allocation: not freed alone */
};

static int gpu_err(char *err, size_t errlen, int rc, const char *what)
{
	snprintf(err, errlen, "gpu backend: %s: %s", what, radiance__gpu_last_error());
	return rc;
}

/* Waits for everything queued on a lane's streams; the first error (0,
 * -EIO). Its staging rows are all free after. */
static int lane_sync(struct lane *ln)
{
	int rc = 0;
	void *const st[3] = { ln->in, ln->stream, ln->out };
	for (int i = 0; i < 3; i++) {
		int r = st[i] ? radiance__gpu_stream_sync(st[i]) : 0;
		rc = rc ? rc : r;
	}
	stage_ring_reset(&ln->xs);
	stage_ring_reset(&ln->ys);
	return rc;
}

static void gpu_destroy(void *state)
{
	struct gpu_state *g = state;
	if (!g)
		return;
	for (int i = 0; i < 2; i++) {
		struct lane *ln = &g->lanes[i];
		lane_sync(ln);
		radiance__gpu_scratch_destroy(&ln->scratch);
		radiance__gpu_free(ln->y);
		radiance__gpu_free(ln->x);
		for (unsigned j = 0; j < STAGE_RING_SLOTS; j++) {
			radiance__gpu_event_destroy(ln->x_guard[j]);
			radiance__gpu_event_destroy(ln->y_guard[j]);
		}
		radiance__gpu_event_destroy(ln->x_ready);
		radiance__gpu_event_destroy(ln->y_ready);
		radiance__gpu_stream_destroy(ln->out);
		radiance__gpu_stream_destroy(ln->in);
		radiance__gpu_stream_destroy(ln->stream);
	}
	if (g->stream) {
		radiance__gpu_stream_sync(g->stream);
		radiance__gpu_stream_destroy(g->stream);
	}
	radiance__gpu_free(g->up_q);
	radiance__gpu_free(g->up_s);
	if (g->done_dev)
		radiance__gpu_host_unregister((void *)g->done_host);
	free((void *)g->done_host);
	for (size_t i = 0; i < g->n_regs; i++)
		unregister_range(&g->regs[i], g->pin_pace, g->pin_pace_arg);
	free(g->regs);
	pthread_mutex_destroy(&g->regs_lock);
	free(g->seen);
	free(g);
}

/* Waits for both lanes: before memory a launch may use goes away. */
static void sync_lanes(struct gpu_state *g)
{
	for (int i = 0; i < 2; i++)
		lane_sync(&g->lanes[i]);
}

static int alloc_dev(struct gpu_state *g, void **p, size_t bytes)
{
	int rc = radiance__gpu_malloc(p, bytes);
	if (rc == 0)
		g->scratch_bytes += bytes;
	return rc;
}

/* Decides, once, how models are allocated, and says so: a model that
 * cannot be mapped turns every engine's MapModel into an error, and the
 * operator should know why before that. */
static void share_choose(struct gpu_state *g, const char *want)
{
	struct radiance__gpu_share_caps caps;
	radiance__gpu_share_caps(g->dev.ordinal, &caps);
	if (radiance__gpu_pci_bus_id(g->dev.ordinal, g->pci_bus_id, sizeof g->pci_bus_id) != 0)
		g->pci_bus_id[0] = 0;
	if (want && strcmp(want, "none") == 0) {
		g->share = RADIANCE_SHARE_NONE;
		snprintf(g->share_why, sizeof g->share_why, "share = none");
	} else if (want && strcmp(want, "ipc") == 0) {
		g->share = RADIANCE_SHARE_IPC;
		snprintf(g->share_why, sizeof g->share_why, "share = ipc");
	} else if (caps.vmm) {
		g->share = RADIANCE_SHARE_VMM;
		if (want && strcmp(want, "vmm") != 0 && strcmp(want, "auto") != 0)
			log_warn("share = %s is not vmm, ipc, none or auto: using vmm", want);
	} else {
		g->share = RADIANCE_SHARE_IPC;
		snprintf(g->share_why, sizeof g->share_why, "%s", caps.why);
		if (want && strcmp(want, "vmm") == 0)
			log_warn("share = vmm, but %s", caps.why);
	}
	if (g->share == RADIANCE_SHARE_VMM)
		log_info("gpu backend: models are mappable by clients (VMM, POSIX fd handles, "
			 "granularity %zu KiB)", caps.granularity >> 10);
	else if (g->share == RADIANCE_SHARE_IPC)
		log_warn("gpu backend: no VMM (%s): models are mappable through legacy IPC handles "
			 "only, which clients map read-write; see docs/mapped.md", g->share_why);
	else
		log_warn("gpu backend: models are not mappable (%s): MapModel is refused",
			 g->share_why);
}

/* The bulk lane's copy streams, hand-off events and staging rings (no
 * device memory: the staging buffers are shared out by rows). */
static int lane_pipeline_create(struct lane *ln, size_t rows_pad)
{
	int rc;
	if ((rc = radiance__gpu_stream_create_priority(&ln->in, 0)) ||
	    (rc = radiance__gpu_stream_create_priority(&ln->out, 0)) ||
	    (rc = radiance__gpu_event_create_sync(&ln->x_ready)) ||
	    (rc = radiance__gpu_event_create_sync(&ln->y_ready)))
		return rc;
	for (unsigned j = 0; j < STAGE_RING_SLOTS; j++)
		if ((rc = radiance__gpu_event_create_sync(&ln->x_guard[j])) ||
		    (rc = radiance__gpu_event_create_sync(&ln->y_guard[j])))
			return rc;
	/* x has rows_pad rows: a range at a multiple of 64 rows keeps the
	 * padding a kernel may read inside the buffer */
	stage_ring_init(&ln->xs, (uint32_t)rows_pad, STAGE_ALIGN);
	stage_ring_init(&ln->ys, ln->rows, STAGE_ALIGN);
	return 0;
}

static int gpu_create(const struct radiance_backend_options *opt, void **state, char *err, size_t errlen)
{
	struct gpu_state *g = calloc(1, sizeof *g);
	int rc;
	if (!g) {
		snprintf(err, errlen, "gpu backend: out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&g->regs_lock, NULL);
	rc = radiance__gpu_init(opt->device, &g->dev);
	if (rc) {
		gpu_err(err, errlen, rc, "init");
		pthread_mutex_destroy(&g->regs_lock);
		free(g);
		return rc;
	}
	if (!opt->test_no_preload) {
		/* every kernel now, not at a request's first launch of it
		 * (lazy module loading, CUDA's default): no request pays a
		 * load, and the device memory in use stops growing here */
		size_t free0 = 0, free1 = 0, total = 0;
		unsigned nk = 0;
		const int mem0 = radiance__gpu_mem_info(&free0, &total);
		const uint64_t t0 = rclock_ns();
		rc = radiance__gpu_preload(&g->dev, &nk);
		if (rc) {
			gpu_err(err, errlen, rc, "loading the kernels");
			pthread_mutex_destroy(&g->regs_lock);
			free(g);
			return rc;
		}
		const double ms = (double)(rclock_ns() - t0) / 1e6;
		if (mem0 == 0 && radiance__gpu_mem_info(&free1, &total) == 0)
			log_info("gpu backend: %u kernels loaded in %.1f ms (device memory in use +%.1f MiB)", nk,
				 ms, ((double)free0 - (double)free1) / 1048576.0);
		else
			log_info("gpu backend: %u kernels loaded in %.1f ms", nk, ms);
	}
	g->max_rows = opt->max_rows;
	g->max_n = opt->max_n ? opt->max_n : 4096;
	g->max_k = opt->max_k ? opt->max_k : 4096;
	g->gate = opt->numerics_gate != 0;
	g->zero_copy_rows = opt->zero_copy_rows;
	g->zc_x_bytes = (size_t)opt->zero_copy_x_kib << 10;
	g->zc_y_bytes = (size_t)opt->zero_copy_y_kib << 10;
	{
		const size_t page = (size_t)sysconf(_SC_PAGESIZE);
		g->pin_piece = (size_t)opt->pin_piece_kib * 1024u / page * page;
	}
	g->pin_pace = opt->pin_pace;
	g->pin_pace_arg = opt->pin_pace_arg;

	const enum radiance__w4a8_prefill prefill = radiance__w4a8_prefill_choose(&g->dev, (unsigned)opt->prefill);
	g->lanes[LANE_DECODE].rows = g->max_rows < DECODE_LANE_ROWS ? g->max_rows : DECODE_LANE_ROWS;
	g->lanes[LANE_BULK].rows = g->max_rows;
	for (int i = 0; i < 2; i++) {
		struct lane *ln = &g->lanes[i];
		const size_t rows_pad = ((size_t)ln->rows + 63) & ~(size_t)63;
		if ((rc = radiance__gpu_stream_create_priority(&ln->stream, i == LANE_DECODE)))
			goto fail;
		if ((rc = alloc_dev(g, (void **)&ln->x, rows_pad * g->max_k * 2)) ||
		    (rc = alloc_dev(g, (void **)&ln->y, (size_t)ln->rows * g->max_n * 2)))
			goto fail;
		/* max_decode_rows above 64 is cut to 64, the decode kernel's largest token tile */
		if ((rc = radiance__gpu_scratch_create(&ln->scratch, ln->rows, opt->max_decode_rows, g->max_n,
						       g->max_k, 1, ln->stream)))
			goto fail;
		g->scratch_bytes += ln->scratch.bytes;
		ln->scratch.settings.prefill = prefill;
		ln->scratch.settings.wgmma_tile = opt->wgmma_tile;
		if (i == LANE_BULK && (rc = lane_pipeline_create(ln, rows_pad)))
			goto fail;
	}
	if ((rc = radiance__gpu_stream_create_priority(&g->stream, 0)))
		goto fail;
	/* the completion word: a page of host memory the device writes into */
	void *page = NULL;
	if (posix_memalign(&page, 4096, 4096) != 0) {
		rc = -ENOMEM;
		goto fail;
	}
	memset(page, 0, 4096);
	g->done_host = page;
	if ((rc = radiance__gpu_host_register(page, 4096, &g->done_dev))) {
		g->done_dev = NULL;
		goto fail;
	}
	if (opt->prefill == RADIANCE_BACKEND_PREFILL_FAST && !g->dev.wgmma)
		log_warn("gpu backend: prefill = fast, but %s has no sm_90a wgmma kernel: prefill "
			 "runs exact (f16 tensor cores)", g->dev.name);
	log_info("gpu backend: prefill (W4A8 launches above the decode band): %s",
		 prefill == RADIANCE_PREFILL_FAST ? "fast (sm_90a fp8 wgmma: the fp8 bound of docs/numerics.md)"
						  : "exact (f16 tensor cores, fp32 accumulation)");
	share_choose(g, opt->share);
	*state = g;
	return 0;
fail:
	gpu_err(err, errlen, rc, "allocating scratch at create");
	gpu_destroy(g);
	return rc;
}

static void gpu_info(void *state, struct radiance_backend_info *info)
{
	struct gpu_state *g = state;
	snprintf(info->name, sizeof info->name, "%s", g->dev.vendor);
	snprintf(info->device, sizeof info->device, "%s", g->dev.name);
	info->scratch_bytes = g->scratch_bytes;
	snprintf(info->share, sizeof info->share, "%s",
		 g->share == RADIANCE_SHARE_VMM ? "vmm" : g->share == RADIANCE_SHARE_IPC ? "ipc" : "none");
	snprintf(info->share_why, sizeof info->share_why, "%s", g->share_why);
	info->queues = 1;
}

static void layer_release(struct radiance_backend_layer *h)
{
	if (!h)
		return;
	if (!h->pooled) {
		radiance__gpu_free(h->w);
		radiance__gpu_free(h->sc);
		radiance__gpu_free(h->bias);
	}
	free(h);
}

/* The device arrays of a layer: its own allocations, or (sl not NULL) the
 * places the model's shared allocation has for them. */
static int layer_place(struct radiance_backend_layer *h, const struct radiance_layer *l,
		       const struct radiance__gpu_share *sh, const struct radiance_share_layer *sl)
{
	int rc;
	if (sl) {
		uint8_t *base = sh->base;
		h->pooled = 1;
		h->w = base + sl->weight_offset;
		h->sc = sl->scales_bytes ? base + sl->scales_offset : NULL;
		h->bias = sl->bias_bytes ? (float *)(void *)(base + sl->bias_offset) : NULL;
		return 0;
	}
	if (l->bias && (rc = radiance__gpu_malloc((void **)&h->bias, (size_t)l->n * sizeof(float))))
		return rc;
	if (l->kind == RADIANCE_LAYER_W4A8)
		return (rc = radiance__gpu_malloc(&h->w, radiance__w4a8_weight_bytes(l->n, l->k))) ? rc :
			radiance__gpu_malloc(&h->sc, radiance__w4a8_scale_bytes(l->n, l->k));
	return radiance__gpu_malloc(&h->w, (size_t)l->n * l->k * 2);
}

/* *p holds at least bytes of device memory (grown, never shrunk; *have
 * is its size). The old one is freed only after the upload stream is idle. */
static int upload_tmp(struct gpu_state *g, void **p, size_t *have, size_t bytes)
{
	if (*have >= bytes)
		return 0;
	int rc = radiance__gpu_stream_sync(g->stream);
	if (rc)
		return rc;
	radiance__gpu_free(*p);
	*p = NULL;
	*have = 0;
	if ((rc = radiance__gpu_malloc(p, bytes)))
		return rc;
	*have = bytes;
	return 0;
}

static int layer_upload(struct gpu_state *g, const struct radiance_layer *l, const struct radiance__gpu_share *sh,
			const struct radiance_share_layer *sl, struct radiance_backend_layer **out, char *err,
			size_t errlen)
{
	struct radiance_backend_layer *h = NULL;
	int rc;

	if (l->k > g->max_k || l->n > g->max_n) {
		snprintf(err, errlen, "layer %s: %ux%u (n x k) exceeds the backend's max_n=%u/max_k=%u", l->name,
			 l->n, l->k, g->max_n, g->max_k);
		return -E2BIG;
	}
	if (l->kind == RADIANCE_LAYER_W4A8 && (l->k % RADIANCE_GROUP_SIZE || !l->qweight || !l->scales)) {
		snprintf(err, errlen, "layer %s: W4A8 layer needs K %% 128 == 0, qweight and scales", l->name);
		return -EINVAL;
	}
	if (l->kind == RADIANCE_LAYER_BF16 && !l->weight) {
		snprintf(err, errlen, "layer %s: bf16 layer without weight", l->name);
		return -EINVAL;
	}
	h = calloc(1, sizeof *h);
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	h->kind = l->kind;
	h->n = l->n;
	h->k = l->k;
	if ((rc = layer_place(h, l, sh, sl)))
		goto fail;
	if (l->bias && (rc = radiance__gpu_h2d_async(h->bias, l->bias, (size_t)l->n * sizeof(float), g->stream)))
		goto fail;
	if (l->kind == RADIANCE_LAYER_W4A8) {
		const size_t qbytes = (size_t)l->n * (l->k / 8) * 4, sbytes = (size_t)l->n * (l->k / 128) * 2;
		/* canonical arrays go up once into temporaries and are repacked on
		 * the device into the layout the kernels stream */
		if ((rc = upload_tmp(g, &g->up_q, &g->up_q_bytes, qbytes)) ||
		    (rc = upload_tmp(g, &g->up_s, &g->up_s_bytes, sbytes)) ||
		    (rc = radiance__gpu_h2d_async(g->up_q, l->qweight, qbytes, g->stream)) ||
		    (rc = radiance__gpu_h2d_async(g->up_s, l->scales, sbytes, g->stream)) ||
		    (rc = radiance__w4a8_repack(g->up_q, g->up_s, l->n, l->k, h->w, h->sc, g->stream)))
			goto fail;
	} else if ((rc = radiance__gpu_h2d_async(h->w, l->weight, (size_t)l->n * l->k * 2, g->stream))) {
		goto fail;
	}
	if ((rc = radiance__gpu_stream_sync(g->stream)))
		goto fail;
	*out = h;
	return 0;
fail:
	gpu_err(err, errlen, rc, l->name);
	radiance__gpu_stream_sync(g->stream);
	layer_release(h);
	return rc;
}

static int gpu_layer_upload(void *state, const struct radiance_layer *l, struct radiance_backend_layer **out,
			    char *err, size_t errlen)
{
	return layer_upload(state, l, NULL, NULL, out, err, errlen);
}

/* ---- shared allocations ---- */

static void device_sizes(const struct radiance_layer *l, uint64_t *weight, uint64_t *scales)
{
	*weight = radiance__w4a8_weight_bytes(l->n, l->k);
	*scales = radiance__w4a8_scale_bytes(l->n, l->k);
}

static void gpu_share_destroy(void *state, struct radiance_backend_share *s)
{
	struct gpu_state *g = state;
	struct radiance__gpu_share *sh = s->priv;
	if (sh) {
		/* no launch may still read it; importers keep their own mappings */
		sync_lanes(g);
		radiance__gpu_share_free(sh);   /* closes the fd, which is s->fd */
		free(sh);
	}
	free(s->layers);
	free(s);
}

static int gpu_share_create(void *state, const struct radiance_model *m, struct radiance_backend_share **out,
			    char *err, size_t errlen)
{
	struct gpu_state *g = state;
	uint64_t total;
	if (g->share == RADIANCE_SHARE_NONE)
		return 0;
	struct radiance_backend_share *s = calloc(1, sizeof *s);
	struct radiance__gpu_share *sh = calloc(1, sizeof *sh);
	if (!s || !sh || radiance__backend_share_layout(s, m, device_sizes, &total) < 0) {
		free(s);
		free(sh);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->fd = -1;
	sh->fd = -1;
	/* the executor's pin thread calls this (backend.h): its device is its own setting */
	int rc = radiance__gpu_set_device(g->dev.ordinal);
	if (rc == 0)
		rc = radiance__gpu_share_alloc(g->dev.ordinal, g->share, total, sh);
	if (rc) {
		snprintf(err, errlen, "gpu backend: the model's %llu bytes of weights (%s): %s",
			 (unsigned long long)total, g->share == RADIANCE_SHARE_VMM ? "vmm" : "ipc",
			 radiance__gpu_last_error());
		free(sh);
		free(s->layers);
		free(s);
		return rc;
	}
	s->priv = sh;
	s->bytes = sh->bytes;
	s->granularity = sh->granularity;
	if (sh->kind == RADIANCE_SHARE_VMM) {
		s->handle = RADIANCE_SHARE_HANDLE_POSIX_FD;
		s->fd = sh->fd;
	} else {
		s->handle = RADIANCE_SHARE_HANDLE_IPC;
		memcpy(s->ipc_handle, sh->ipc, sizeof s->ipc_handle);
	}
	snprintf(s->vendor, sizeof s->vendor, "%s", g->dev.vendor);
	snprintf(s->pci_bus_id, sizeof s->pci_bus_id, "%s", g->pci_bus_id);
	snprintf(s->layout, sizeof s->layout, "%s w4a8 tiles 16x128 [n_tile][group], scale blocks 32 B%s",
		 g->dev.vendor, strcmp(g->dev.vendor, "cuda") == 0 ? " (half2 rows g, g+8)" : "");
	*out = s;
	return 0;
}

static int gpu_layer_upload_into(void *state, struct radiance_backend_share *s, size_t index,
				 const struct radiance_layer *l, struct radiance_backend_layer **out, char *err,
				 size_t errlen)
{
	return layer_upload(state, l, s->priv, &s->layers[index], out, err, errlen);
}

static void gpu_layer_free(void *state, struct radiance_backend_layer *h)
{
	struct gpu_state *g = state;
	sync_lanes(g);
	layer_release(h);
}

/* Any thread (backend.h): the executor's launches go on meanwhile. The
 * page-locking runs outside regs_lock; the range enters the table, where
 * mapped() finds it, once it is registered. */
static int gpu_register_host(void *state, void *base, size_t len, char *err, size_t errlen)
{
	struct gpu_state *g = state;
	void *dev = NULL;
	/* the device is the calling thread's own setting: a worker's is 0 */
	struct registered reg = { base, len, NULL, g->pin_piece && len > g->pin_piece ? g->pin_piece : 0 };
	int rc = radiance__gpu_set_device(g->dev.ordinal);
	if (rc == 0 && reg.piece) {
		uint64_t slowest = 0;
		rc = radiance__gpu_host_register_pieces(base, len, reg.piece, &dev, &slowest, g->pin_pace,
							 g->pin_pace_arg);
		if (rc == 0)
			piece_slow("registering", &reg, slowest);
		if (rc == -EXDEV) {   /* the device maps the pieces apart: one range, then */
			log_info("gpu backend: %s; registering %zu bytes as one range",
				 radiance__gpu_last_error(), len);
			reg.piece = 0;
		}
	}
	if (rc == 0 && !reg.piece)
		rc = radiance__gpu_host_register(base, len, &dev);
	if (rc)
		return gpu_err(err, errlen, rc, "registering a host range");
	reg.dev = dev;
	pthread_mutex_lock(&g->regs_lock);
	if (g->n_regs == g->cap_regs) {
		size_t cap = g->cap_regs ? 2 * g->cap_regs : 16;
		struct registered *r = realloc(g->regs, cap * sizeof *r);
		if (!r) {
			pthread_mutex_unlock(&g->regs_lock);
			unregister_range(&reg, g->pin_pace, g->pin_pace_arg);
			snprintf(err, errlen, "gpu backend: out of memory");
			return -ENOMEM;
		}
		g->regs = r;
		g->cap_regs = cap;
	}
	g->regs[g->n_regs++] = reg;
	pthread_mutex_unlock(&g->regs_lock);
	return 0;
}

/* Any thread. No launch reads or writes the range any more (backend.h:
 * the executor waits for every launch of a ring before it stops serving
 * it), so nothing needs the lanes synchronized: it leaves the table, then
 * the driver unlocks it. */
static void gpu_unregister_host(void *state, void *base)
{
	struct gpu_state *g = state;
	int found = 0;
	struct registered reg;
	pthread_mutex_lock(&g->regs_lock);
	for (size_t i = 0; i < g->n_regs; i++) {
		if (g->regs[i].base == base) {
			reg = g->regs[i];
			g->regs[i] = g->regs[--g->n_regs];
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&g->regs_lock);
	if (!found)
		return;
	if (radiance__gpu_set_device(g->dev.ordinal))
		log_warn("gpu backend: unregistering a host range: %s", radiance__gpu_last_error());
	else
		unregister_range(&reg, g->pin_pace, g->pin_pace_arg);
}

/* ------------------------------------------------------- numerics gate */

static int gate_first(struct gpu_state *g, const struct radiance_layer *l, uint32_t m)
{
	for (size_t i = 0; i < g->n_seen; i++)
		if (g->seen[i].layer == l && g->seen[i].m == m)
			return 0;
	if (g->n_seen == g->cap_seen) {
		size_t cap = g->cap_seen ? 2 * g->cap_seen : 64;
		struct gate_seen *s = realloc(g->seen, cap * sizeof *s);
		if (!s)
			return 0;
		g->seen = s;
		g->cap_seen = cap;
	}
	g->seen[g->n_seen++] = (struct gate_seen){l, m};
	return 1;
}

/* The CPU reference for the requests of one launch, the relative Frobenius
 * difference from it (the contract's norm bound, RADIANCE_NORM_BOUND), and for
 * W4A8 layers every element against the per-element bound of the path's
 * accumulation (kernels/numerics_bound.h, docs/numerics.md "Contract"):
 * fp8-sm90 for the wgmma path, fp32 for every other. The activations are
 * quantized once here, for the reference and the bound alike. */
static void gate_check(struct gpu_state *g, const struct radiance_layer *l, const struct radiance_rows *rows,
		       size_t nrows, uint32_t m_launch, const char *path)
{
	const int w4a8 = l->kind == RADIANCE_LAYER_W4A8;
	const enum radiance_acc acc = strcmp(path, "wgmma") == 0 ? RADIANCE_ACC_FP8_SM90 : RADIANCE_ACC_FP32;
	double num = 0, den = 0, max_abs = 0, worst = 0, worst_y = 0, worst_exact = 0, worst_allowed = 0;
	size_t nan_mismatch = 0, outside = 0, checked = 0;
	(void)g;
	for (size_t i = 0; i < nrows; i++) {
		const struct radiance_rows *r = &rows[i];
		size_t cnt = (size_t)r->m * l->n;
		uint16_t *ref = malloc(cnt * sizeof *ref);
		uint8_t *codes = w4a8 ? malloc((size_t)r->m * l->k) : NULL;
		float *s = w4a8 ? malloc((size_t)r->m * sizeof *s) : NULL;
		if (!ref || (w4a8 && (!codes || !s))) {
			free(ref);
			free(codes);
			free(s);
			fprintf(stderr, "radiance: numerics gate: layer %s: out of memory, skipped\n", l->name);
			return;
		}
		if (w4a8) {
			const size_t esz = 2;   /* bf16 and fp16 */
			for (uint32_t t = 0; t < r->m; t++)
				s[t] = radiance_quant_row_e4m3((const uint16_t *)((const char *)r->x + (size_t)t * l->k * esz),
							       r->dtype, l->k, codes + (size_t)t * l->k);
			radiance_cpu_w4a8_gemm(codes, s, r->m, l->qweight, l->scales, l->bias, l->n, l->k, ref);
			struct radiance_bound_report br;
			if (radiance_w4a8_bound_check(codes, s, l->qweight, l->scales, l->bias, r->m, l->n, l->k, acc,
						      r->y, &br) == 0) {
				outside += br.outside;
				checked += br.checked;
				if (br.worst > worst) {
					worst = br.worst;
					worst_y = br.worst_y;
					worst_exact = br.worst_exact;
					worst_allowed = br.worst_allowed;
				}
			}
		} else {
			radiance_cpu_bf16(r->x, r->dtype, r->m, l->weight, l->bias, l->n, l->k, ref);
		}
		for (size_t j = 0; j < cnt; j++) {
			double a = radiance_bf16_to_f32(r->y[j]), b = radiance_bf16_to_f32(ref[j]);
			if (isnan(a) || isnan(b)) {
				nan_mismatch += isnan(a) != isnan(b);
				continue;
			}
			num += (a - b) * (a - b);
			den += b * b;
			if (fabs(a - b) > max_abs)
				max_abs = fabs(a - b);
		}
		free(ref);
		free(codes);
		free(s);
	}
	double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	const int ok = rel < RADIANCE_NORM_BOUND && nan_mismatch == 0 && outside == 0;
	char bound[256] = "";
	if (w4a8)
		snprintf(bound, sizeof bound, ", bound %s: %zu of %zu outside, worst %.3f of allowed (y %g, exact %g, "
			 "allowed %.3g)", acc == RADIANCE_ACC_FP8_SM90 ? "fp8-sm90" : "fp32", outside, checked, worst,
			 worst_y, worst_exact, worst_allowed);
	fprintf(stderr,
		"radiance: numerics gate: layer %s (%ux%u, %s) m=%u path=%s: rel_err %.3e, max_abs %.3e, "
		"nan_mismatch %zu%s: %s\n",
		l->name, l->n, l->k, w4a8 ? "w4a8" : "bf16", m_launch, path, rel, max_abs, nan_mismatch, bound,
		ok ? "ok" : "OUT OF TOLERANCE");
}

/* --------------------------------------------------------------- linear */

/* Staging x [m][k] holds the stacked activations; results to staging y,
 * on the lane's stream. */
static int run_launch(struct gpu_state *g, struct lane *ln, struct radiance_backend_layer *h,
		      enum radiance_dtype dtype, uint32_t m, const uint16_t *x, uint16_t *y, const char **path)
{
	const struct radiance__gpu_layer l = {
		.bf16 = h->kind == RADIANCE_LAYER_BF16, .n = h->n, .k = h->k, .w = h->w, .sc = h->sc,
		.bias = h->bias,
	};
	return radiance__gpu_layer_run(&g->dev, &ln->scratch, &l, x, dtype, m, y, ln->stream,
				       RADIANCE_W4A8_AUTO, path);
}

/* The registered range that holds [p, p + bytes), or NULL. The caller
 * holds regs_lock. */
static const struct registered *registered_at(const struct gpu_state *g, const void *p, size_t bytes)
{
	const uint8_t *q = p;
	for (size_t i = 0; i < g->n_regs; i++) {
		const uint8_t *base = g->regs[i].base;
		if (q >= base && bytes <= g->regs[i].len && (size_t)(q - base) <= g->regs[i].len - bytes)
			return &g->regs[i];
	}
	return NULL;
}

/* An async copy between a staging buffer and host memory at host, split
 * where host crosses from one registered piece into the next: the driver
 * refuses one copy over two registrations (cudaMemcpyAsync: invalid
 * argument, seen on the H200 by bench/register_pieces_probe.cu). */
static int copy_host(struct gpu_state *g, void *dev, void *host, size_t bytes, int to_host, void *stream)
{
	size_t piece = 0, off = 0;
	pthread_mutex_lock(&g->regs_lock);
	const struct registered *r = registered_at(g, host, bytes);
	if (r) {
		piece = r->piece;
		off = (size_t)((const uint8_t *)host - (const uint8_t *)r->base);
	}
	pthread_mutex_unlock(&g->regs_lock);
	for (size_t done = 0; done < bytes;) {
		size_t n = bytes - done;
		if (piece && n > piece - (off + done) % piece)
			n = piece - (off + done) % piece;
		int rc = to_host ? radiance__gpu_d2h_async((uint8_t *)host + done, (const uint8_t *)dev + done, n, stream)
				 : radiance__gpu_h2d_async((uint8_t *)dev + done, (const uint8_t *)host + done, n, stream);
		if (rc)
			return rc;
		done += n;
	}
	return 0;
}

/* The device address of host memory p inside a registered range, or NULL.
 * The caller holds regs_lock. */
static void *mapped(const struct gpu_state *g, const void *p, size_t bytes)
{
	const struct registered *r = registered_at(g, p, bytes);
	return r ? (uint8_t *)r->dev + ((const uint8_t *)p - (const uint8_t *)r->base) : NULL;
}

/* Staging row `row` of a lane's x and y. A staging row is max_k (x) or
 * max_n (y) wide: ranges taken in rows (stage_ring) stay apart in memory
 * whatever layer each one's launch is for; the rows of one launch are
 * packed at its own k and n inside its range. */
static uint16_t *stage_x(const struct gpu_state *g, const struct lane *ln, uint32_t row)
{
	return ln->x + (size_t)row * g->max_k;
}

static uint16_t *stage_y(const struct gpu_state *g, const struct lane *ln, uint32_t row)
{
	return ln->y + (size_t)row * g->max_n;
}

/* Rows [i0, i1) of one dtype, m rows in all, in place through the arenas'
 * mappings (1 when it ran that way, 0 when they must be copied); what must
 * be gathered or scattered goes through the staging rows from x_row and
 * y_row. */
static int run_mapped(struct gpu_state *g, struct lane *ln, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t i0, size_t i1, uint32_t m, uint32_t x_row,
		      uint32_t y_row, const char **path, int *rc)
{
	const size_t xrow = (size_t)h->k * 2, yrow = (size_t)h->n * 2;
	uint16_t *const xs = stage_x(g, ln, x_row), *const ys = stage_y(g, ln, y_row);
	if (h->kind != RADIANCE_LAYER_W4A8 || m > g->zero_copy_rows || i1 - i0 > RADIANCE__GPU_ROWS_MAX)
		return 0;
	struct radiance__gpu_quant_src src = {0};
	struct radiance__gpu_rows_list in = {0}, out = {0};
	struct radiance__gpu_y_dst ydst = {0};
	uint32_t off = 0;
	size_t x_most = 0;
	int x_aligned = 1;
	/* a range these rows lie in stays registered while they are served
	 * (their ring is not removed before the launch is done): the
	 * addresses stay good once the lock is let go */
	pthread_mutex_lock(&g->regs_lock);
	for (size_t i = i0; i < i1; i++) {
		if (!rows[i].m)
			continue;
		const void *x = mapped(g, rows[i].x, rows[i].m * xrow);
		void *y = mapped(g, rows[i].y, rows[i].m * yrow);
		if (!x || !y) {
			pthread_mutex_unlock(&g->regs_lock);
			return 0;
		}
		src.x[src.n] = x;
		src.m[src.n++] = rows[i].m;
		in.src[in.n] = x;
		in.dst[in.n] = (uint8_t *)xs + (size_t)off * xrow;
		in.bytes[in.n++] = rows[i].m * xrow;
		out.src[out.n] = (uint8_t *)ys + (size_t)off * yrow;
		out.dst[out.n] = y;
		out.bytes[out.n++] = rows[i].m * yrow;
		ydst.y[ydst.n] = y;
		ydst.m[ydst.n++] = rows[i].m;
		off += rows[i].m;
		x_most = rows[i].m * xrow > x_most ? rows[i].m * xrow : x_most;
		x_aligned &= ((uintptr_t)x & 15) == 0;   /* the quant's 16-byte loads */
	}
	pthread_mutex_unlock(&g->regs_lock);
	const struct radiance__gpu_layer l = {
		.n = h->n, .k = h->k, .w = h->w, .sc = h->sc, .bias = h->bias,
	};
	/* x: the quant reads each row once, every request's rows at once, so
	 * the largest request's x sets what in place costs; above the limit
	 * the row-copy kernel, which spreads each request over many blocks,
	 * gathers all of them (the quant then reads device memory).
	 * y: the GEMM writes every request's y in place when none is above
	 * the limit, with whole 16-byte stores of each row (its epilogue
	 * stages the outputs in shared memory: its former 2-byte stores over
	 * PCIe cost 55-100 us more than a scatter of 16-byte stores on
	 * 34816x5120 at M=4..16); several requests only in the decode band,
	 * where the GEMM takes per-row destinations (the wgmma prefill does
	 * not). Else y goes through the staging buffer and one scatter.
	 * docs/gpu.md "Moving rows" has the measurements. */
	const int x_in_place = x_aligned && x_most <= g->zc_x_bytes;
	int y_in_place = ydst.n == 1 || m <= ln->scratch.max_decode_rows;
	for (uint32_t i = 0; i < out.n; i++)
		y_in_place &= out.bytes[i] <= g->zc_y_bytes;
	if (!x_in_place) {
		if ((*rc = radiance__gpu_rows_copy(&in, 0, ln->stream)))
			return 1;
		memset(&src, 0, sizeof src);
		src.n = 1;
		src.x[0] = xs;
		src.m[0] = m;
	}
	/* one request in place: its y as the plain [m][n] output (any path) */
	if ((*rc = radiance__gpu_layer_run_rows(&g->dev, &ln->scratch, &l, &src, rows[i0].dtype,
						y_in_place && ydst.n == 1 ? ydst.y[0] : ys,
						y_in_place && ydst.n > 1 ? &ydst : NULL, ln->stream,
						RADIANCE_W4A8_AUTO, path)))
		return 1;
	if (!y_in_place)
		*rc = radiance__gpu_rows_copy(&out, 1, ln->stream);
	return 1;
}

/* What the lane's stream queued so far comes before what copy-out queues next. */
static int stage_handoff_out(struct lane *ln)
{
	int rc = radiance__gpu_event_record(ln->y_ready, ln->stream);
	return rc ? rc : radiance__gpu_stream_wait_event(ln->out, ln->y_ready);
}

/* Rows [i0, i1) of one dtype, m rows in all, through the staging
 * buffers: each request's x copied in on `in` to staging rows from x_row,
 * the launch on the lane's stream, each y copied out on `out` from staging
 * rows from y_row. On the decode lane all three are its one stream and
 * both rows 0; on the bulk lane the caller orders the streams. */
static int launch_copied(struct gpu_state *g, struct lane *ln, struct radiance_backend_layer *h,
			 const struct radiance_rows *rows, size_t i0, size_t i1, uint32_t m, uint32_t x_row,
			 uint32_t y_row, void *in, void *out, const char **path)
{
	const size_t xrow = (size_t)h->k * 2, yrow = (size_t)h->n * 2;
	uint16_t *x = stage_x(g, ln, x_row), *y = stage_y(g, ln, y_row);
	uint32_t off = 0;
	int rc;
	for (size_t i = i0; i < i1; i++) {
		if (rows[i].m && (rc = copy_host(g, (uint8_t *)x + (size_t)off * xrow, (void *)rows[i].x,
						 rows[i].m * xrow, 0, in)))
			return rc;
		off += rows[i].m;
	}
	if (in != ln->stream &&
	    ((rc = radiance__gpu_event_record(ln->x_ready, in)) ||
	     (rc = radiance__gpu_stream_wait_event(ln->stream, ln->x_ready))))
		return rc;
	if ((rc = run_launch(g, ln, h, rows[i0].dtype, m, x, y, path)))
		return rc;
	if (out != ln->stream && (rc = stage_handoff_out(ln)))
		return rc;
	off = 0;
	for (size_t i = i0; i < i1; i++) {
		if (rows[i].m && (rc = copy_host(g, (uint8_t *)y + (size_t)off * yrow, rows[i].y,
						 rows[i].m * yrow, 1, out)))
			return rc;
		off += rows[i].m;
	}
	return 0;
}

/* Reserves m staging rows of a ring (stage_ring.h) and commits them;
 * t->wait is the slot whose guard must be waited for before they are
 * written. */
static int lane_stage_take(struct stage_ring *r, uint32_t m, struct stage_take *t)
{
	int rc = stage_ring_reserve(r, m, STAGE_RING_NEXT, t);
	if (rc)   /* backend.c keeps launches within max_rows: not seen */
		return radiance__gpu_fail_text(rc, "%u rows do not fit the bulk lane's %u staging rows", m,
					       r->rows);
	stage_ring_commit(r, t);
	return 0;
}

/* The bulk lane's launch of rows [i0, i1) of one dtype, m rows, in staging
 * rows of its own, x and y (stage_ring). The lane's stream waits for the
 * copy-out that last read its y rows before anything writes them; then
 * either run_mapped (zero-copy; a gather or scatter uses this launch's
 * rows), or: the x copy on copy-in, after the launch that last read those
 * x rows; the launch after the copy; the y copy on copy-out after the
 * launch. Each range's guard is recorded once its last user is queued:
 * x's on the lane's stream, y's on copy-out. */
static int launch_piped(struct gpu_state *g, struct lane *ln, struct radiance_backend_layer *h,
			const struct radiance_rows *rows, size_t i0, size_t i1, uint32_t m, const char **path)
{
	struct stage_take xt, yt;
	int rc = 0;
	if ((rc = lane_stage_take(&ln->xs, m, &xt)) || (rc = lane_stage_take(&ln->ys, m, &yt)))
		return rc;
	if (yt.wait >= 0 && (rc = radiance__gpu_stream_wait_event(ln->stream, ln->y_guard[yt.wait])))
		return rc;
	/* copy-in waits for the x rows' last reader whichever way this launch
	 * runs: taking the rows retired the older x records too, and a later
	 * copy on copy-in into their rows relies on this wait (a zero-copy
	 * launch's own gather on the lane's stream would not need it) */
	if (xt.wait >= 0 && (rc = radiance__gpu_stream_wait_event(ln->in, ln->x_guard[xt.wait])))
		return rc;
	if (run_mapped(g, ln, h, rows, i0, i1, m, xt.first, yt.first, path, &rc)) {
		/* the x rows' earlier readers ran on the lane's stream before it */
		if (rc || (rc = stage_handoff_out(ln)))
			return rc;
	} else {
		if ((rc = launch_copied(g, ln, h, rows, i0, i1, m, xt.first, yt.first, ln->in, ln->out, path)))
			return rc;
	}
	if ((rc = radiance__gpu_event_record(ln->x_guard[xt.slot], ln->stream)))
		return rc;
	return radiance__gpu_event_record(ln->y_guard[yt.slot], ln->out);
}

static int gpu_linear_start(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
			    const struct radiance_rows *rows, size_t nrows, uint64_t *ticket, char *err,
			    size_t errlen)
{
	struct gpu_state *g = state;
	int rc = 0;

	if (h->kind != l->kind || h->n != l->n || h->k != l->k) {
		snprintf(err, errlen, "layer %s: handle does not match the layer", l->name);
		return -EINVAL;
	}
	uint32_t total = 0;
	for (size_t i = 0; i < nrows; i++)
		total += rows[i].m;
	/* a prefill piece's lane must not depend on its size: its pieces run in order */
	const int lane = nrows && !rows[0].bulk && total <= g->lanes[LANE_DECODE].rows ? LANE_DECODE : LANE_BULK;
	struct lane *ln = &g->lanes[lane];
	for (size_t i0 = 0; i0 < nrows;) {
		/* one launch per run of requests with the same dtype */
		size_t i1 = i0;
		uint32_t m = 0;
		while (i1 < nrows && rows[i1].dtype == rows[i0].dtype)
			m += rows[i1++].m;
		const char *path = "";
		if (!m) {
			i0 = i1;
			continue;
		}
		if (ln->in)
			rc = launch_piped(g, ln, h, rows, i0, i1, m, &path);
		else if (!run_mapped(g, ln, h, rows, i0, i1, m, 0, 0, &path, &rc))
			rc = launch_copied(g, ln, h, rows, i0, i1, m, 0, 0, ln->stream, ln->stream, &path);
		if (rc)
			goto io;
		if (g->gate && gate_first(g, l, m)) {
			/* the first launch of (layer, M): checked here, synchronously */
			if ((rc = lane_sync(ln)))
				goto io;
			gate_check(g, l, rows + i0, i1 - i0, m, path);
		}
		i0 = i1;
	}
	/* after the last y copy of the launch, in ticket order: the copy-out
	 * stream on the bulk lane */
	if ((rc = radiance__gpu_signal((uint32_t *)g->done_dev + lane, ++ln->seq, ln->out ? ln->out : ln->stream)))
		goto io;
	*ticket = (uint64_t)lane << 32 | ln->seq;
	return 0;
io:
	snprintf(err, errlen, "gpu backend: layer %s: %s", l->name, radiance__gpu_last_error());
	lane_sync(ln);
	return rc == -EINVAL ? rc : -EIO;
}

static int gpu_linear_done(void *state, uint64_t ticket, char *err, size_t errlen)
{
	struct gpu_state *g = state;
	const int lane = (int)(ticket >> 32) & 1;
	/* tickets are a lane's 32-bit sequence numbers: compare by distance */
	if ((int32_t)(g->done_host[lane] - (uint32_t)ticket) >= 0) {
		__atomic_thread_fence(__ATOMIC_ACQUIRE);   /* y is read after the word */
		g->polls = 0;
		return 1;
	}
	if (++g->polls % 4096 == 0) {
		/* any of the lane's streams can hold the fault (a copy on copy-in
		 * or copy-out, a kernel on its own) */
		const struct lane *ln = &g->lanes[lane];
		void *const st[3] = { ln->stream, ln->in, ln->out };
		for (int i = 0; i < 3; i++)
			if (st[i] && radiance__gpu_stream_query(st[i]) < 0) {
				snprintf(err, errlen, "gpu backend: %s", radiance__gpu_last_error());
				return -EIO;
			}
	}
	return 0;
}

static int gpu_linear(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen)
{
	uint64_t ticket;
	int rc = gpu_linear_start(state, l, h, rows, nrows, &ticket, err, errlen);
	while (rc == 0 && (rc = gpu_linear_done(state, ticket, err, errlen)) == 0)
		;
	return rc < 0 ? rc : 0;
}

const struct radiance_backend_ops radiance__backend_gpu_ops = {
	.name = "gpu",
	.create = gpu_create,
	.destroy = gpu_destroy,
	.info = gpu_info,
	.layer_upload = gpu_layer_upload,
	.layer_free = gpu_layer_free,
	.register_host = gpu_register_host,
	.unregister_host = gpu_unregister_host,
	.share_create = gpu_share_create,
	.share_destroy = gpu_share_destroy,
	.layer_upload_into = gpu_layer_upload_into,
	.linear = gpu_linear,
	.linear_start = gpu_linear_start,
	.linear_done = gpu_linear_done,
};

#else
/* CPU-only build: the GPU backend is not compiled (ISO C wants a declaration). */
typedef int radiance__backend_gpu_unused;
#endif
