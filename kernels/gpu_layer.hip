/*
 * One layer call on device buffers (w4a8_gpu.h): what the daemon's GPU
 * backend runs for a launch of stacked requests and what libradiance-gpu
 * runs on a client's stream over a mapped model, so both run the same
 * launches in the same order.
 *
 * Host code only; the kernels are in w4a8_quant.hip, w4a8_launch.hip (and the
 * kernel files it dispatches to), bf16_gpu.hip and gpu_blas.hip.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

#define BLAS_WORKSPACE_BYTES (32u << 20)   /* cuBLAS's recommendation for Hopper */
#define BF16_CHUNK_ROWS 1024u              /* rows of one bf16-layer GEMM */

extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);   /* gpu_runtime.hip */

static int scratch_alloc(struct radiance__gpu_scratch *s, void **p, size_t bytes)
{
	int rc = radiance__gpu_malloc(p, bytes);
	if (rc == 0)
		s->bytes += bytes;
	return rc;
}

extern "C" void radiance__gpu_scratch_destroy(struct radiance__gpu_scratch *s)
{
	radiance__blas_destroy(s->blas);
	radiance__gpu_free(s->blas_ws);
	radiance__gpu_free(s->hilo);
	radiance__gpu_free(s->counters);
	radiance__gpu_free(s->f32);
	radiance__gpu_free(s->s);
	radiance__gpu_free(s->codes);
	memset(s, 0, sizeof *s);
}

extern "C" int radiance__gpu_scratch_create(struct radiance__gpu_scratch *s, uint32_t max_rows,
					    uint32_t max_decode_rows, uint32_t max_n, uint32_t max_k,
					    int bf16_layers, void *stream)
{
	int rc;
	memset(s, 0, sizeof *s);
	s->max_rows = max_rows ? max_rows : 1;
	s->max_decode_rows = max_decode_rows && max_decode_rows < 64 ? max_decode_rows : 64;
	s->max_n = max_n ? max_n : 1;
	s->max_k = max_k ? max_k : 1;
	const size_t rows_pad = ((size_t)s->max_rows + 63) & ~(size_t)63;
	const size_t partials = radiance__w4a8_partials_bytes(s->max_decode_rows, s->max_n);
	s->bf16_chunk = s->max_rows < BF16_CHUNK_ROWS ? s->max_rows : BF16_CHUNK_ROWS;
	/* fp16 activations of bf16 layers take two rows each (hi, lo) */
	const size_t f32_rows = bf16_layers ? 2 * (size_t)((s->bf16_chunk + 1) / 2) : 0;
	s->f32_bytes = f32_rows * s->max_n * sizeof(float);
	if (s->f32_bytes < partials)
		s->f32_bytes = partials;
	s->counters_n = radiance__w4a8_counters_needed(s->max_n);

	if ((rc = scratch_alloc(s, (void **)&s->codes, rows_pad * s->max_k)) ||
	    (rc = scratch_alloc(s, (void **)&s->s, rows_pad * sizeof(float))) ||
	    (rc = scratch_alloc(s, (void **)&s->f32, s->f32_bytes)) ||
	    (rc = scratch_alloc(s, (void **)&s->counters, s->counters_n * sizeof(uint32_t))))
		goto fail;
	if (bf16_layers && ((rc = scratch_alloc(s, (void **)&s->hilo, f32_rows * s->max_k * 2)) ||
			    (rc = scratch_alloc(s, &s->blas_ws, BLAS_WORKSPACE_BYTES))))
		goto fail;
	if ((rc = radiance__gpu_memset_async(s->counters, 0, s->counters_n * sizeof(uint32_t), stream)) ||
	    (rc = radiance__gpu_stream_sync(stream)))
		goto fail;
	/* no BLAS (or it failed to start): bf16 layers take the portable kernel */
	if (bf16_layers && radiance__blas_create(&s->blas, stream, s->blas_ws, BLAS_WORKSPACE_BYTES) != 0)
		s->blas = NULL;
	return 0;
fail:
	radiance__gpu_scratch_destroy(s);
	return rc;
}

/* The checks every layer call starts with (0, or -E2BIG / -EINVAL). */
static int layer_check(const struct radiance__gpu_scratch *s, const struct radiance__gpu_layer *l,
		       enum radiance_dtype dtype, uint64_t m)
{
	if (m > s->max_rows || l->n > s->max_n || l->k > s->max_k)
		return radiance__gpu_fail_text(-E2BIG, "%llu rows of a %ux%u layer exceed the scratch (%u rows, %ux%u)",
					       (unsigned long long)m, l->n, l->k, s->max_rows, s->max_n, s->max_k);
	if (dtype != RADIANCE_DTYPE_BF16 && dtype != RADIANCE_DTYPE_FP16)
		return radiance__gpu_fail_text(-EINVAL, "activation dtype %d is not bf16 or fp16", (int)dtype);
	return 0;
}

/* The GEMM arguments of layer l on m rows of (codes, scales) into y, with
 * the scratch's partials, counters and settings: what every W4A8 layer call
 * here launches (y_rows, x left for the caller). */
static struct radiance__w4a8_args layer_args(const struct radiance__gpu_scratch *s, const struct radiance__gpu_layer *l,
					     const uint8_t *codes, const float *scales, uint32_t m, uint16_t *y,
					     enum radiance__w4a8_path force)
{
	struct radiance__w4a8_args a = {};
	a.codes = codes;
	a.s = scales;
	a.m = m;
	a.n = l->n;
	a.k = l->k;
	a.w = l->w;
	a.sc = l->sc;
	a.bias = l->bias;
	a.y = y;
	a.partials = s->f32;
	a.partials_bytes = s->f32_bytes;
	a.counters = s->counters;
	a.counters_n = s->counters_n;
	a.path = force;
	a.max_decode_rows = s->max_decode_rows;
	a.pdl = 1;
	a.settings = &s->settings;
	return a;
}

/* Quant of the sources' rows + W4A8 GEMM (m > 0 rows in all). fuse: the
 * one source is device memory, so the streaming GEMV may quantize it itself
 * where the planner says (plan.fused: no quant launch); sources read in
 * place from host memory are quantized once, by the quant kernel. */
static int layer_run_w4a8(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
			  const struct radiance__gpu_layer *l, const struct radiance__gpu_quant_src *src,
			  enum radiance_dtype dtype, uint32_t m, uint16_t *y, uint16_t *const *y_rows, void *stream,
			  enum radiance__w4a8_path force, int fuse, const char **path)
{
	struct radiance__w4a8_args a = layer_args(s, l, s->codes, s->s, m, y, force);
	a.y_rows = y_rows;
	if (fuse && src->n == 1) {
		a.x = src->x[0];
		a.x_dtype = dtype;
	}
	struct radiance__w4a8_plan plan;
	radiance__w4a8_plan(dev, &a, &plan);
	*path = radiance__w4a8_path_name(plan.path);
	int rc = plan.fused ? 0 : radiance__gpu_quant_rows(src, dtype, l->k, plan.order, s->codes, s->s, stream);
	return rc ? rc : radiance__w4a8_gemm(dev, &a, stream);
}

extern "C" int radiance__gpu_layer_run_rows(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
					    const struct radiance__gpu_layer *l,
					    const struct radiance__gpu_quant_src *src, enum radiance_dtype dtype,
					    uint16_t *y, const struct radiance__gpu_y_dst *ydst, void *stream,
					    enum radiance__w4a8_path force, const char **path)
{
	const char *unused;
	if (!path)
		path = &unused;
	*path = "";
	if (l->bf16)
		return radiance__gpu_fail_text(-EINVAL, "a bf16 layer's rows from a source list (W4A8 layers only)");
	if (src->n > RADIANCE__GPU_QUANT_SRC_MAX)
		return radiance__gpu_fail_text(-EINVAL, "%u row sources (at most %u)", src->n,
					       RADIANCE__GPU_QUANT_SRC_MAX);
	uint64_t m = 0;
	for (uint32_t i = 0; i < src->n; i++)
		m += src->m[i];
	int rc = layer_check(s, l, dtype, m);
	if (rc || m == 0)
		return rc;
	if (!ydst)
		return layer_run_w4a8(dev, s, l, src, dtype, (uint32_t)m, y, NULL, stream, force, 0, path);
	/* the destinations' rows, one pointer each (the GEMM's y_rows) */
	uint16_t *rowp[RADIANCE_W4A8_Y_ROWS_MAX];
	uint64_t my = 0;
	if (ydst->n > RADIANCE__GPU_ROWS_MAX)
		return radiance__gpu_fail_text(-EINVAL, "%u y destinations (at most %u)", ydst->n,
					       RADIANCE__GPU_ROWS_MAX);
	for (uint32_t i = 0; i < ydst->n; i++)
		my += ydst->m[i];
	if (my != m || m > RADIANCE_W4A8_Y_ROWS_MAX)
		return radiance__gpu_fail_text(-EINVAL, "y destinations of %llu rows for %llu rows of x (at most %u)",
					       (unsigned long long)my, (unsigned long long)m, RADIANCE_W4A8_Y_ROWS_MAX);
	uint32_t t = 0;
	for (uint32_t i = 0; i < ydst->n; i++)
		for (uint32_t r = 0; r < ydst->m[i]; r++)
			rowp[t++] = ydst->y[i] + (size_t)r * l->n;
	return layer_run_w4a8(dev, s, l, src, dtype, (uint32_t)m, NULL, rowp, stream, force, 0, path);
}

extern "C" int radiance__gpu_layer_run_fp8(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
					   const struct radiance__gpu_layer *l, const uint8_t *codes, const float *scales,
					   uint32_t m, uint16_t *y, void *stream, enum radiance__w4a8_path force,
					   const char **path)
{
	int rc;
	const char *unused;
	if (!path)
		path = &unused;
	*path = "";
	if (l->bf16)
		return radiance__gpu_fail_text(-EINVAL, "a bf16 layer takes activations, not e4m3 codes");
	if ((rc = layer_check(s, l, RADIANCE_DTYPE_BF16, m)))
		return rc;
	if ((uintptr_t)codes % 16 || (uintptr_t)scales % 4)
		return radiance__gpu_fail_text(-EINVAL, "codes %p (16-byte aligned) or scales %p (4) misaligned",
					       (const void *)codes, (const void *)scales);
	if (m == 0)
		return 0;
	struct radiance__w4a8_args a = layer_args(s, l, codes, scales, m, y, force);
	struct radiance__w4a8_plan plan;
	radiance__w4a8_plan(dev, &a, &plan);
	*path = radiance__w4a8_path_name(plan.path);
	/* the caller's codes are in natural order: a path that reads another
	 * (the wgmma prefill) gets them rewritten into the scratch */
	if (plan.order != RADIANCE_CODES_NATURAL) {
		if ((rc = radiance__gpu_codes_reorder(codes, m, l->k, plan.order, s->codes, stream)))
			return rc;
		a.codes = s->codes;
	}
	return radiance__w4a8_gemm(dev, &a, stream);
}

extern "C" int radiance__gpu_layer_run_shared(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
					      const struct radiance__gpu_layer *const *l, uint32_t nl, const void *x,
					      enum radiance_dtype dtype, uint32_t m, uint16_t *const *y, void *stream)
{
	int rc;
	if (nl == 0 || nl > RADIANCE__GPU_SHARED_MAX)
		return radiance__gpu_fail_text(-EINVAL, "%u layers on one x (1..%u)", nl, RADIANCE__GPU_SHARED_MAX);
	for (uint32_t j = 0; j < nl; j++) {
		if ((rc = layer_check(s, l[j], dtype, m)))
			return rc;
		if (l[j]->k != l[0]->k)
			return radiance__gpu_fail_text(-EINVAL, "layer %u has K=%u, layer 0 K=%u", j, l[j]->k, l[0]->k);
	}
	if (m == 0)
		return 0;
	/* one quant serves every layer when all are W4A8 and all read the
	 * natural order (on sm_90a m <= 32: the wgmma kernels read another) */
	struct radiance__w4a8_args a[RADIANCE__GPU_SHARED_MAX];
	bool shared = true;
	for (uint32_t j = 0; j < nl && shared; j++) {
		if (l[j]->bf16) {
			shared = false;
			break;
		}
		a[j] = layer_args(s, l[j], s->codes, s->s, m, y[j], RADIANCE_W4A8_AUTO);
		/* planned as the single call would plan it (with x): a GEMV that
		 * would quantize x itself (decode_fuse_rows) is not shared, so
		 * the bits stay those of nl single calls */
		struct radiance__w4a8_args q = a[j];
		q.x = x;
		q.x_dtype = dtype;
		struct radiance__w4a8_plan plan;
		shared = radiance__w4a8_plan(dev, &q, &plan) == 0 && plan.order == RADIANCE_CODES_NATURAL &&
			 !plan.fused;
	}
	if (!shared) {
		for (uint32_t j = 0; j < nl; j++)
			if ((rc = radiance__gpu_layer_run(dev, s, l[j], x, dtype, m, y[j], stream, RADIANCE_W4A8_AUTO,
							  NULL)))
				return rc;
		return 0;
	}
	if ((rc = radiance__gpu_quant(x, dtype, m, l[0]->k, RADIANCE_CODES_NATURAL, s->codes, s->s, stream)))
		return rc;
	/* each GEMM waits (griddepcontrol.wait) for the one before it, which
	 * shares the split-K partials and counters, before it touches them */
	for (uint32_t j = 0; j < nl; j++)
		if ((rc = radiance__w4a8_gemm(dev, &a[j], stream)))
			return rc;
	return 0;
}

extern "C" int radiance__gpu_layer_run(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
				       const struct radiance__gpu_layer *l, const void *x, enum radiance_dtype dtype,
				       uint32_t m, uint16_t *y, void *stream, enum radiance__w4a8_path force,
				       const char **path)
{
	int rc;
	const char *unused;
	if (!path)
		path = &unused;
	*path = "";
	if ((rc = layer_check(s, l, dtype, m)))
		return rc;
	if (m == 0)
		return 0;
	if (!l->bf16) {
		struct radiance__gpu_quant_src src = {};
		src.n = 1;
		src.x[0] = x;
		src.m[0] = m;
		return layer_run_w4a8(dev, s, l, &src, dtype, m, y, NULL, stream, force, 1, path);
	}
	const uint16_t *xb = (const uint16_t *)x;
	if (!s->blas) {
		*path = "bf16-portable";
		return radiance__gpu_bf16_portable(xb, dtype, m, (const uint16_t *)l->w, l->bias, l->n, l->k, y,
						   stream);
	}
	*path = "bf16-blas";
	if ((rc = radiance__blas_set_stream(s->blas, stream)))
		return radiance__gpu_fail_text(rc, "BLAS set stream failed");
	const int hilo = dtype == RADIANCE_DTYPE_FP16;
	const uint32_t chunk = hilo ? (s->bf16_chunk + 1) / 2 : s->bf16_chunk;
	for (uint32_t r0 = 0; r0 < m; r0 += chunk) {
		const uint32_t rows = m - r0 < chunk ? m - r0 : chunk;
		const uint16_t *xr = xb + (size_t)r0 * l->k;
		if (hilo) {
			if ((rc = radiance__gpu_split_f16(xr, rows, l->k, s->hilo, stream)) ||
			    (rc = radiance__blas_bf16_f32(s->blas, s->hilo, 2 * rows, (const uint16_t *)l->w, l->n, l->k,
							  s->f32)))
				return rc;
		} else if ((rc = radiance__blas_bf16_f32(s->blas, xr, rows, (const uint16_t *)l->w, l->n, l->k,
							 s->f32))) {
			return rc;
		}
		if ((rc = radiance__gpu_bias_bf16(s->f32, rows, l->n, hilo, l->bias, y + (size_t)r0 * l->n, stream)))
			return rc;
	}
	return 0;
}
