/*
 * libradiance-gpu (client/radiance_gpu.h): a model the daemon made
 * mappable, imported into this process, and the layer calls on it.
 *
 * Everything that can fail or allocate happens in radiance_gpu_map: the
 * daemon's description is checked (libradiance did the bounds; the W4A8
 * array sizes of this build's kernels are checked here), the allocation is
 * imported on the device with the daemon's PCI bus id, every layer's device
 * pointers are computed, and the scratch is sized for the model's largest
 * layer. radiance_gpu_linear is then a table lookup and the launches of
 * kernels/gpu_layer.hip, which the daemon's backend runs too.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu-private.h"
#include "map.h"

static _Thread_local char last_error[512];

const char *radiance_gpu_error_message(void)
{
	return last_error;
}

static int fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof last_error, fmt, ap);
	va_end(ap);
	return rc;
}

#ifdef RADIANCE_GPU_CUDA
#define VENDOR "cuda"
#else
#define VENDOR "hip"
#endif

/* Device pointers of every layer, and the largest N and K. */
static int layers_place(struct radiance_gpu_model *g, const struct radiance_mapping *m)
{
	g->layers = calloc(m->n_layers ? m->n_layers : 1, sizeof *g->layers);
	if (!g->layers)
		return fail(-ENOMEM, "out of memory");
	g->n_layers = m->n_layers;
	uint8_t *base = g->import.base;
	for (size_t i = 0; i < m->n_layers; i++) {
		const struct radiance_mapped_layer *ml = &m->layers[i];
		struct radiance__gpu_layer *l = &g->layers[i];
		l->bf16 = ml->kind == RADIANCE_LAYER_BF16;
		l->n = ml->n;
		l->k = ml->k;
		/* the arrays this build's kernels read must be the sizes the
		 * daemon laid out: a daemon with other kernels would be read past */
		if (!l->bf16 && (ml->k % 128 || ml->weight_bytes != radiance__w4a8_weight_bytes(ml->n, ml->k) ||
				 ml->scales_bytes != radiance__w4a8_scale_bytes(ml->n, ml->k)))
			return fail(-ENOTSUP, "layer %zu (%ux%u): the daemon's W4A8 arrays (%llu + %llu bytes) "
				    "are not this library's layout (%zu + %zu bytes)", i, ml->n, ml->k,
				    (unsigned long long)ml->weight_bytes, (unsigned long long)ml->scales_bytes,
				    radiance__w4a8_weight_bytes(ml->n, ml->k),
				    radiance__w4a8_scale_bytes(ml->n, ml->k));
		l->w = base + ml->weight_offset;
		l->sc = l->bf16 ? NULL : base + ml->scales_offset;
		l->bias = ml->bias_bytes ? (const float *)(const void *)(base + ml->bias_offset) : NULL;
		g->max_n = ml->n > g->max_n ? ml->n : g->max_n;
		g->max_k = ml->k > g->max_k ? ml->k : g->max_k;
		g->has_bf16 |= l->bf16;
	}
	return 0;
}

/* The steps that need the model's device current. */
static int map_on_device(struct radiance_gpu_model *g, const struct radiance_mapping *m)
{
	int rc;
	if ((rc = radiance__gpu_init(g->device, &g->dev)))
		return fail(rc, "device %d: %s", g->device, radiance__gpu_last_error());
	if (m->handle == RADIANCE_MAP_POSIX_FD) {
		rc = radiance__gpu_share_import_fd(g->device, m->fd, m->bytes, m->granularity, 1, &g->import);
		g->read_only = 1;
	} else {
		rc = radiance__gpu_share_import_ipc(m->ipc_handle, m->bytes, &g->import);
		g->read_only = 0;
	}
	if (rc)
		return fail(rc, "model %u: %s", m->model_id, radiance__gpu_last_error());
	if ((rc = layers_place(g, m)))
		return rc;
	/* the legacy default stream, once: nothing else runs then */
	if ((rc = radiance__gpu_scratch_create(&g->scratch, g->max_rows, 64, g->max_n, g->max_k, g->has_bf16,
					       NULL)))
		return fail(rc, "scratch for %u rows of up to %ux%u: %s", g->max_rows, g->max_n, g->max_k,
			    radiance__gpu_last_error());
	return 0;
}

static void model_free(struct radiance_gpu_model *g)
{
	radiance__gpu_scratch_destroy(&g->scratch);
	radiance__gpu_share_unimport(&g->import);
	free(g->layers);
	free(g);
}

int radiance_gpu_map(struct radiance *r, uint32_t model_id, const struct radiance_gpu_options *opt,
		     struct radiance_gpu_model **out)
{
	struct radiance_gpu_options o = RADIANCE_GPU_OPTIONS_INIT;
	struct radiance_mapping *m = NULL;
	struct radiance_gpu_model *g = NULL;
	int rc, prev = -1;

	last_error[0] = 0;
	if (!out)
		return fail(-EINVAL, "out is NULL");
	*out = NULL;
	if (opt) {
		if (opt->size < sizeof o.size + sizeof o.max_rows)
			return fail(-EINVAL, "radiance_gpu_options.size %u is too small", opt->size);
		memcpy(&o, opt, opt->size < sizeof o ? opt->size : sizeof o);
		if (opt->size < offsetof(struct radiance_gpu_options, prefill) + sizeof o.prefill)
			o.prefill = RADIANCE_GPU_PREFILL_AUTO;
		if (o.prefill > RADIANCE_GPU_PREFILL_FAST)
			return fail(-EINVAL, "radiance_gpu_options.prefill %u is not AUTO (0), EXACT (1) or "
				    "FAST (2)", o.prefill);
	}
	if ((rc = radiance_map_model(r, model_id, RADIANCE_MAP_LAYOUT_VERSION, &m)) < 0)
		return fail(rc, "%s", radiance_error_message(r));
	if (m->handle == RADIANCE_MAP_TEST_MEMFD) {
		rc = fail(-ENOTSUP, "model %u is mapped as a test memfd (RADIANCE_FAKE_SHARE=1 on a cpu "
			  "daemon): no device memory to import", model_id);
		goto unmap_daemon;
	}
	if (strcmp(m->vendor, VENDOR) != 0) {
		rc = fail(-ENOTSUP, "model %u is laid out for %s kernels; this libradiance-gpu is built for %s",
			  model_id, m->vendor, VENDOR);
		goto unmap_daemon;
	}
	g = calloc(1, sizeof *g);
	if (!g) {
		rc = fail(-ENOMEM, "out of memory");
		goto unmap_daemon;
	}
	g->model_id = model_id;
	g->max_rows = o.max_rows ? o.max_rows : 64;
	g->mapped_bytes = m->bytes;
	if ((rc = radiance__gpu_device_by_pci_bus_id(m->pci_bus_id, &g->device)) < 0) {
		rc = fail(rc, "model %u is on the device at PCI %s, which this process does not see: %s",
			  model_id, m->pci_bus_id, radiance__gpu_last_error());
		goto free_model;
	}
	/* the caller's current device is theirs: put it back */
	if (radiance__gpu_get_device(&prev) != 0)
		prev = -1;
	rc = map_on_device(g, m);
	if (prev >= 0)
		radiance__gpu_set_device(prev);
	if (rc)
		goto free_model;
	/* the daemon's policy for the same value */
	g->scratch.settings.prefill = radiance__w4a8_prefill_choose(&g->dev, o.prefill);
	radiance_mapping_free(m);   /* closes the fd: the import holds the memory */
	*out = g;
	return 0;

free_model:
	if (g) {
		if (prev >= 0 || radiance__gpu_get_device(&prev) == 0)
			radiance__gpu_set_device(g->device);
		model_free(g);
		if (prev >= 0)
			radiance__gpu_set_device(prev);
	}
unmap_daemon:
	radiance_mapping_free(m);
	radiance_unmap_model(r, model_id);   /* best effort: the refusal's text stays ours */
	return rc;
}

/* The check of a call's layer index (0 or -ENOENT, its text set). */
static int layer_index_check(const struct radiance_gpu_model *g, uint32_t layer)
{
	if (layer >= g->n_layers)
		return fail(-ENOENT, "layer %u out of range: model %u has %zu layers", layer, g->model_id,
			    g->n_layers);
	return 0;
}

/* The checks of a call's row count (0 or the error, its text set). */
static int rows_check(const struct radiance_gpu_model *g, uint32_t rows)
{
	if (rows == 0)
		return fail(-EINVAL, "rows is 0");
	if (rows > g->max_rows)
		return fail(-E2BIG, "%u rows exceed the %u this mapping's scratch holds (radiance_gpu_options."
			    "max_rows)", rows, g->max_rows);
	return 0;
}

/* The checks of a call's rows, dtype and x/y alignment (0 or the error,
 * its text set). */
static int run_check(const struct radiance_gpu_model *g, const void *x, const void *y, uint32_t rows,
		     enum radiance_elem dtype)
{
	int rc = rows_check(g, rows);
	if (rc)
		return rc;
	if (dtype != RADIANCE_BF16 && dtype != RADIANCE_FP16)
		return fail(-EINVAL, "dtype %d is not RADIANCE_BF16 or RADIANCE_FP16", (int)dtype);
	if (((uintptr_t)x | (uintptr_t)y) % 16)
		return fail(-EINVAL, "x %p or y %p is not 16-byte aligned", x, y);
	return 0;
}

int radiance__gpu_model_run(struct radiance_gpu_model *g, uint32_t layer, const void *x, void *y, uint32_t rows,
			    enum radiance_elem dtype, void *stream, enum radiance__w4a8_path force,
			    const char **path)
{
	int rc = layer_index_check(g, layer);
	if (!rc)
		rc = run_check(g, x, y, rows, dtype);
	if (rc)
		return rc;
	rc = radiance__gpu_layer_run(&g->dev, &g->scratch, &g->layers[layer], x, (enum radiance_dtype)dtype,
					 rows, y, stream, force, path);
	if (rc)
		return fail(rc == -E2BIG || rc == -EINVAL ? rc : -EIO, "model %u layer %u: %s", g->model_id, layer,
			    radiance__gpu_last_error());
	return 0;
}

int radiance_gpu_linear(struct radiance_gpu_model *g, uint32_t layer, const void *x, void *y, uint32_t rows,
			enum radiance_elem dtype, void *stream)
{
	return radiance__gpu_model_run(g, layer, x, y, rows, dtype, stream, RADIANCE_W4A8_AUTO, NULL);
}

int radiance_gpu_linear_fp8(struct radiance_gpu_model *g, uint32_t layer, const void *codes, const float *scales,
			    void *y, uint32_t rows, void *stream)
{
	int rc = layer_index_check(g, layer);
	if (rc)
		return rc;
	if (g->layers[layer].bf16)
		return fail(-EINVAL, "layer %u of model %u is a bf16 layer: radiance_gpu_linear_fp8 serves W4A8 "
			    "layers (use radiance_gpu_linear)", layer, g->model_id);
	rc = rows_check(g, rows);
	if (rc)
		return rc;
	if (((uintptr_t)codes | (uintptr_t)y) % 16 || (uintptr_t)scales % 4)
		return fail(-EINVAL, "codes %p or y %p is not 16-byte aligned, or scales %p not 4-byte aligned",
			    codes, y, (const void *)scales);
	rc = radiance__gpu_layer_run_fp8(&g->dev, &g->scratch, &g->layers[layer], codes, scales, rows, y,
					     stream, RADIANCE_W4A8_AUTO, NULL);
	if (rc)
		return fail(rc == -E2BIG || rc == -EINVAL ? rc : -EIO, "model %u layer %u: %s", g->model_id, layer,
			    radiance__gpu_last_error());
	return 0;
}

int radiance_gpu_linear_multi(struct radiance_gpu_model *g, const uint32_t *layers, uint32_t nlayers,
			      const void *x, void *const *y, uint32_t rows, enum radiance_elem dtype,
			      void *stream)
{
	if (nlayers == 0 || nlayers > RADIANCE_MAX_LAYERS_PER_REQUEST)
		return fail(-EINVAL, "%u layers in one call: 1..%u", nlayers,
			    RADIANCE_MAX_LAYERS_PER_REQUEST);
	if (!layers || !y)
		return fail(-EINVAL, "layers or y is NULL");
	/* everything checked before the first launch is enqueued */
	for (uint32_t i = 0; i < nlayers; i++) {
		if (layers[i] >= g->n_layers)
			return fail(-ENOENT, "layers[%u] = %u out of range: model %u has %zu layers", i,
				    layers[i], g->model_id, g->n_layers);
		for (uint32_t j = 0; j < i; j++)
			if (layers[j] == layers[i])
				return fail(-EINVAL, "layers[%u] = %u repeats layers[%u]", i, layers[i], j);
		if (g->layers[layers[i]].k != g->layers[layers[0]].k)
			return fail(-EINVAL, "layers[%u] = %u has K=%u but layers[0] = %u K=%u: the "
				    "layers of one call share x", i, layers[i], g->layers[layers[i]].k,
				    layers[0], g->layers[layers[0]].k);
		if ((uintptr_t)y[i] % 16)
			return fail(-EINVAL, "y[%u] %p is not 16-byte aligned", i, y[i]);
	}
	int rc = run_check(g, x, y[0], rows, dtype);
	if (rc)
		return rc;
	_Static_assert(RADIANCE_MAX_LAYERS_PER_REQUEST <= RADIANCE__GPU_SHARED_MAX,
		       "radiance__gpu_layer_run_shared takes every layer of one call");
	const struct radiance__gpu_layer *lp[RADIANCE_MAX_LAYERS_PER_REQUEST];
	uint16_t *yp[RADIANCE_MAX_LAYERS_PER_REQUEST];
	for (uint32_t i = 0; i < nlayers; i++) {
		lp[i] = &g->layers[layers[i]];
		yp[i] = y[i];
	}
	/* one quant of x for all of them where the layers allow (w4a8_gpu.h) */
	rc = radiance__gpu_layer_run_shared(&g->dev, &g->scratch, lp, nlayers, x, (enum radiance_dtype)dtype, rows,
					    yp, stream);
	if (rc)
		return fail(rc == -E2BIG || rc == -EINVAL ? rc : -EIO, "model %u, %u layers on one x: %s", g->model_id,
			    nlayers, radiance__gpu_last_error());
	return 0;
}

void radiance_gpu_get_info(const struct radiance_gpu_model *g, struct radiance_gpu_info *info)
{
	*info = (struct radiance_gpu_info){
		.model_id = g->model_id,
		.device = g->device,
		.handle = g->import.kind == RADIANCE_SHARE_VMM ? "vmm" : "ipc",
		.read_only = g->read_only,
		.mapped_bytes = g->mapped_bytes,
		.scratch_bytes = g->scratch.bytes,
		.max_rows = g->max_rows,
		.n_layers = g->n_layers,
	};
}

int radiance_gpu_unmap(struct radiance *r, struct radiance_gpu_model *g)
{
	if (!g)
		return 0;
	uint32_t id = g->model_id;
	int prev = -1;
	if (radiance__gpu_get_device(&prev) == 0)
		radiance__gpu_set_device(g->device);
	model_free(g);
	if (prev >= 0)
		radiance__gpu_set_device(prev);
	if (!r)
		return 0;
	int rc = radiance_unmap_model(r, id);
	return rc < 0 ? fail(rc, "%s", radiance_error_message(r)) : 0;
}

const struct radiance__gpu_layer *radiance__gpu_model_layer(const struct radiance_gpu_model *g, uint32_t layer)
{
	return layer < g->n_layers ? &g->layers[layer] : NULL;
}
