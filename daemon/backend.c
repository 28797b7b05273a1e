/* Backend selection and dispatch; the numerics live in the backends. */
#include "backend_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "map.h"

struct radiance_backend {
	const struct radiance_backend_ops *ops;
	void *state;
	uint32_t max_rows;   /* what the backend sized its staging for */
	uint32_t max_n, max_k;   /* largest layer it takes, 0: the backend's own check */
};

#ifndef RADIANCE_GPU
#define NO_GPU_BUILD_REASON "this build has no GPU backend (make GPU=cuda or GPU=hip adds one)"
#endif

/* Says once, at start, what "auto" chose and why, and which GPU-only
 * options do nothing on the CPU: otherwise `--backend auto --device 7` on a
 * machine without a GPU serves from the CPU without a word. A fall-back to
 * the CPU is a warning: on a GPU host it means the daemon serves ~100x
 * slower than it should (require_gpu makes it fatal instead). no_gpu is the
 * reason the GPU backend was not taken. */
static void backend_log_choice(const char *kind, const struct radiance_backend_options *opt,
			       const struct radiance_backend_ops *ops, const char *no_gpu)
{
	const int cpu = ops == &radiance__backend_cpu_ops;
	if (strcmp(kind, "auto") == 0) {
		if (!cpu)
			log_info("backend auto: using the %s backend", ops->name);
		else
			log_warn("backend auto: %s, using cpu (require_gpu = yes makes this fatal, "
				 "backend = cpu silences it)", no_gpu);
	}
	if (!cpu)
		return;
	if (opt->device >= 0)
		log_warn("device %d has no effect: the backend is cpu (device picks a GPU)",
			 opt->device);
	if (opt->numerics_gate)
		log_warn("numerics_gate has no effect: the backend is cpu (the gate checks GPU "
			 "launches against the CPU reference)");
	if (opt->prefill != RADIANCE_BACKEND_PREFILL_AUTO)
		log_warn("prefill = %s has no effect: the backend is cpu (it chooses the GPU's "
			 "prefill kernel; the CPU computes the definition exactly)",
			 opt->prefill == RADIANCE_BACKEND_PREFILL_FAST ? "fast" : "exact");
	if (opt->wgmma_tile)
		log_warn("wgmma_tile %u has no effect: the backend is cpu", opt->wgmma_tile);
}

int radiance_backend_create(const struct radiance_backend_options *opt,
			    struct radiance_backend **out, char *err, size_t errlen)
{
	const char *kind = opt->kind ? opt->kind : "auto";
	const struct radiance_backend_ops *order[2];
	size_t n = 0;

	if (strcmp(kind, "cpu") == 0) {
		order[n++] = &radiance__backend_cpu_ops;
	} else if (strcmp(kind, "gpu") == 0 || strcmp(kind, "auto") == 0) {
#ifdef RADIANCE_GPU
		order[n++] = &radiance__backend_gpu_ops;
#else
		/* the caller's message already names the backend it asked for */
		if (strcmp(kind, "gpu") == 0) {
			snprintf(err, errlen, "this build has no GPU backend (rebuild with make "
				 "GPU=cuda or GPU=hip)");
			return -ENODEV;
		}
		if (opt->require_gpu) {
			snprintf(err, errlen, "require_gpu is set and %s", NO_GPU_BUILD_REASON);
			return -ENODEV;
		}
#endif
		if (strcmp(kind, "auto") == 0 && !opt->require_gpu)
			order[n++] = &radiance__backend_cpu_ops;
	} else {
		snprintf(err, errlen, "'%s' is not a backend (expected auto, cpu or gpu)", kind);
		return -EINVAL;
	}

	struct radiance_backend *b = calloc(1, sizeof *b);
	if (!b) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	struct radiance_backend_options o = *opt;
	if (!o.max_rows)
		o.max_rows = 1;
	if (o.device < 0)
		o.device = 0;
	b->max_rows = o.max_rows;
	b->max_n = o.max_n;
	b->max_k = o.max_k;
#ifdef RADIANCE_GPU
	char no_gpu[256] = "";
#else
	char no_gpu[256] = NO_GPU_BUILD_REASON;
#endif
	int rc = -ENODEV;
	for (size_t i = 0; i < n; i++) {
		rc = order[i]->create(&o, &b->state, err, errlen);
		if (rc == 0) {
			b->ops = order[i];
			*out = b;
			backend_log_choice(kind, opt, b->ops, no_gpu);
			return 0;
		}
		/* auto: a missing GPU falls through to the CPU; any other error is final */
		if (!(rc == -ENODEV && i + 1 < n))
			break;
		snprintf(no_gpu, sizeof no_gpu, "no GPU device answered (%s)",
			 err && errlen ? err : "no device");
	}
	if (rc == -ENODEV && opt->require_gpu && err && errlen) {
		char why[256];
		snprintf(why, sizeof why, "%s", err);
		snprintf(err, errlen, "require_gpu is set and no GPU device answered (%s)", why);
	}
	free(b);
	return rc;
}

void radiance_backend_destroy(struct radiance_backend *b)
{
	if (!b)
		return;
	b->ops->destroy(b->state);
	free(b);
}

void radiance_backend_info(const struct radiance_backend *b, struct radiance_backend_info *info)
{
	memset(info, 0, sizeof *info);
	b->ops->info(b->state, info);
}

int radiance_backend_layer_upload(struct radiance_backend *b, const struct radiance_layer *l,
				  struct radiance_backend_layer **out, char *err, size_t errlen)
{
	/* the daemon refuses these before it loads anything (registry.c);
	 * this is the backends' own guard, for every caller */
	if ((b->max_n && l->n > b->max_n) || (b->max_k && l->k > b->max_k)) {
		snprintf(err, errlen, "layer %s: N=%u, K=%u exceeds the backend's max_n=%u / max_k=%u",
			 l->name, l->n, l->k, b->max_n, b->max_k);
		return -E2BIG;
	}
	return b->ops->layer_upload(b->state, l, out, err, errlen);
}

void radiance_backend_layer_free(struct radiance_backend *b, struct radiance_backend_layer *h)
{
	if (h)
		b->ops->layer_free(b->state, h);
}

int radiance_backend_share_create(struct radiance_backend *b, const struct radiance_model *m,
				  struct radiance_backend_share **out, char *err, size_t errlen)
{
	*out = NULL;
	return b->ops->share_create ? b->ops->share_create(b->state, m, out, err, errlen) : 0;
}

void radiance_backend_share_destroy(struct radiance_backend *b, struct radiance_backend_share *s)
{
	if (s)
		b->ops->share_destroy(b->state, s);
}

int radiance_backend_layer_upload_into(struct radiance_backend *b, struct radiance_backend_share *s,
				       size_t index, const struct radiance_layer *l,
				       struct radiance_backend_layer **out, char *err, size_t errlen)
{
	if (!s)
		return b->ops->layer_upload(b->state, l, out, err, errlen);
	if (index >= s->n_layers) {
		snprintf(err, errlen, "layer %zu is outside the shared allocation's %zu layers", index,
			 s->n_layers);
		return -EINVAL;
	}
	return b->ops->layer_upload_into(b->state, s, index, l, out, err, errlen);
}

static uint64_t align_map(uint64_t v)
{
	return (v + RADIANCE_MAP_ALIGN - 1) & ~(uint64_t)(RADIANCE_MAP_ALIGN - 1);
}

int radiance__backend_share_layout(struct radiance_backend_share *s, const struct radiance_model *m,
				   void (*sizes)(const struct radiance_layer *l, uint64_t *weight,
						 uint64_t *scales),
				   uint64_t *total)
{
	s->layers = calloc(m->n_layers ? m->n_layers : 1, sizeof *s->layers);
	if (!s->layers)
		return -ENOMEM;
	s->n_layers = m->n_layers;
	uint64_t off = 0;
	for (size_t i = 0; i < m->n_layers; i++) {
		const struct radiance_layer *l = &m->layers[i];
		struct radiance_share_layer *sl = &s->layers[i];
		uint64_t w = (uint64_t)l->n * l->k * 2, sc = 0;
		if (l->kind == RADIANCE_LAYER_W4A8)
			sizes(l, &w, &sc);
		sl->weight_offset = off;
		sl->weight_bytes = w;
		off = align_map(off + w);
		if (sc) {
			sl->scales_offset = off;
			sl->scales_bytes = sc;
			off = align_map(off + sc);
		}
		if (l->bias) {
			sl->bias_offset = off;
			sl->bias_bytes = (uint64_t)l->n * sizeof(float);
			off = align_map(off + sl->bias_bytes);
		}
	}
	*total = off;
	return 0;
}

int radiance_backend_register_host(struct radiance_backend *b, void *base, size_t len,
				   char *err, size_t errlen)
{
	return b->ops->register_host(b->state, base, len, err, errlen);
}

void radiance_backend_unregister_host(struct radiance_backend *b, void *base)
{
	b->ops->unregister_host(b->state, base);
}

/* What every launch must satisfy before a backend sees it. */
static int rows_check(const struct radiance_backend *b, const struct radiance_rows *rows,
		      size_t nrows, char *err, size_t errlen)
{
	uint64_t total = 0;
	for (size_t i = 0; i < nrows; i++) {
		if (rows[i].dtype != RADIANCE_DTYPE_BF16 && rows[i].dtype != RADIANCE_DTYPE_FP16) {
			snprintf(err, errlen, "unknown activation dtype %d", (int)rows[i].dtype);
			return -EINVAL;
		}
		total += rows[i].m;
	}
	if (total > b->max_rows) {
		snprintf(err, errlen, "%llu rows exceed the backend's max_rows=%u",
			 (unsigned long long)total, b->max_rows);
		return -E2BIG;
	}
	return 0;
}

int radiance_backend_linear(struct radiance_backend *b, const struct radiance_layer *l,
			    struct radiance_backend_layer *h, const struct radiance_rows *rows,
			    size_t nrows, char *err, size_t errlen)
{
	int rc = rows_check(b, rows, nrows, err, errlen);
	return rc < 0 ? rc : b->ops->linear(b->state, l, h, rows, nrows, err, errlen);
}

int radiance_backend_linear_multi(struct radiance_backend *b, const struct radiance_layer *const *l,
				  struct radiance_backend_layer *const *h, size_t nlayers,
				  const struct radiance_rows *rows, size_t nrows, char *err,
				  size_t errlen)
{
	int rc = rows_check(b, rows, nrows, err, errlen);
	if (rc < 0)
		return rc;
	for (size_t j = 1; j < nlayers; j++)
		if (l[j]->k != l[0]->k) {
			snprintf(err, errlen, "layer %s has K=%u, layer %s K=%u: one launch of several "
				 "layers needs one K", l[j]->name, l[j]->k, l[0]->name, l[0]->k);
			return -EINVAL;
		}
	if (b->ops->linear_multi)
		return b->ops->linear_multi(b->state, l, h, nlayers, rows, nrows, err, errlen);
	for (size_t j = 0; j < nlayers && rc == 0; j++)
		rc = b->ops->linear(b->state, l[j], h[j], rows + j * nrows, nrows, err, errlen);
	return rc;
}

int radiance_backend_linear_start(struct radiance_backend *b, const struct radiance_layer *l,
				  struct radiance_backend_layer *h, const struct radiance_rows *rows,
				  size_t nrows, uint64_t *ticket, char *err, size_t errlen)
{
	if (!b->ops->linear_start)
		return -EOPNOTSUPP;
	int rc = rows_check(b, rows, nrows, err, errlen);
	return rc < 0 ? rc : b->ops->linear_start(b->state, l, h, rows, nrows, ticket, err, errlen);
}

int radiance_backend_linear_done(struct radiance_backend *b, uint64_t ticket, char *err, size_t errlen)
{
	return b->ops->linear_done ? b->ops->linear_done(b->state, ticket, err, errlen) : 1;
}
