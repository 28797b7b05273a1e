/*
 * The CPU backend: the numerics of kernels/numerics.h serving real requests
 * on the fast path of kernels/cpu_fast.h (SIMD level picked once at create,
 * a pool of compute threads), which is bit-exact with the scalar reference
 * kernels/w4a8_cpu.c for W4A8 layers. Weights stay in the loader's canonical
 * host layout, so a layer "upload" is a handle onto the model's arrays. The
 * only memory it owns is the activation scratch, sized once at create for
 * max_rows x max_k, and the pool.
 */
#include "backend_impl.h"
#include "cpu_fast.h"
#include "cpu_pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct cpu_state {
	struct radiance_cpu_fast *fast;
	uint32_t max_k;
	char cpu_model[128];
};

struct radiance_backend_layer {
	const struct radiance_layer *layer;
};

static int cpu_create(const struct radiance_backend_options *opt, void **state, char *err,
		      size_t errlen)
{
	struct cpu_state *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "cpu backend: out of memory");
		return -ENOMEM;
	}
	s->max_k = opt->max_k ? opt->max_k : RADIANCE_GROUP_SIZE;
	struct radiance_cpu_fast_options fo = {
		.threads = opt->cpu_threads,
		.simd = RADIANCE_CPU_SIMD_AUTO,
		.max_rows = opt->max_rows,
		.max_k = s->max_k,
	};
	int rc = radiance_cpu_fast_create(&fo, &s->fast, err, errlen);
	if (rc < 0) {
		free(s);
		return rc;
	}
	radiance_cpu_model_name(s->cpu_model, sizeof s->cpu_model);
	const char *why;
	unsigned usable = radiance_cpu_usable_threads(&why);
	if (opt->cpu_threads > usable)
		log_warn("cpu_threads %u is more than the %u CPUs this process may run on (%s): "
			 "the threads will share them", opt->cpu_threads, usable, why);
	log_info("cpu backend: %s kernels, %u compute threads (%s; --cpu-threads sets it)",
		 radiance_cpu_simd_name(radiance_cpu_fast_simd(s->fast)),
		 radiance_cpu_fast_threads(s->fast), radiance_cpu_fast_threads_source(s->fast));
	*state = s;
	return 0;
}

static void cpu_destroy(void *state)
{
	struct cpu_state *s = state;
	if (!s)
		return;
	radiance_cpu_fast_destroy(s->fast);
	free(s);
}

static void cpu_info(void *state, struct radiance_backend_info *info)
{
	struct cpu_state *s = state;
	snprintf(info->name, sizeof info->name, "cpu");
	/* the SIMD level and threads travel with the device string to
	 * `radiancectl status` */
	snprintf(info->device, sizeof info->device, "%.90s (%s, %u threads)", s->cpu_model,
		 radiance_cpu_simd_name(radiance_cpu_fast_simd(s->fast)),
		 radiance_cpu_fast_threads(s->fast));
	info->scratch_bytes = radiance_cpu_fast_scratch_bytes(s->fast);
}

static int cpu_layer_upload(void *state, const struct radiance_layer *l,
			    struct radiance_backend_layer **out, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	if (l->k > s->max_k) {
		snprintf(err, errlen, "layer %s: K=%u exceeds the backend's max_k=%u", l->name, l->k,
			 s->max_k);
		return -E2BIG;
	}
	struct radiance_backend_layer *h = calloc(1, sizeof *h);
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	h->layer = l;
	*out = h;
	return 0;
}

static void cpu_layer_free(void *state, struct radiance_backend_layer *h)
{
	free(h);
}

static int cpu_register_host(void *state, void *base, size_t len, char *err, size_t errlen)
{
	return 0;
}

static void cpu_unregister_host(void *state, void *base)
{
}

static int cpu_linear(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	for (size_t i = 0; i < nrows; i++) {
		const struct radiance_rows *r = &rows[i];
		int rc;
		if (l->kind == RADIANCE_LAYER_W4A8)
			rc = radiance_cpu_fast_w4a8(s->fast, r->x, r->dtype, r->m, l->qweight, l->scales,
						    l->bias, l->n, l->k, r->y);
		else
			rc = radiance_cpu_fast_bf16(s->fast, r->x, r->dtype, r->m, l->weight, l->bias,
						    l->n, l->k, r->y);
		if (rc < 0) {
			/* backend.c checked rows against max_rows and upload K against max_k */
			snprintf(err, errlen, "layer %s: %u rows of K=%u refused by the cpu kernels: %s",
				 l->name, r->m, l->k, strerror(-rc));
			return rc;
		}
	}
	return 0;
}

const struct radiance_backend_ops radiance__backend_cpu_ops = {
	.name = "cpu",
	.create = cpu_create,
	.destroy = cpu_destroy,
	.info = cpu_info,
	.layer_upload = cpu_layer_upload,
	.layer_free = cpu_layer_free,
	.register_host = cpu_register_host,
	.unregister_host = cpu_unregister_host,
	.linear = cpu_linear,
};
