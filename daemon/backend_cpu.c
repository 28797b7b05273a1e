/*
 * The CPU backend: the reference numerics (kernels/w4a8_cpu.c) serving real
 * requests. Weights stay in the loader's canonical host layout, so a layer
 * "upload" is a handle onto the model's arrays. The only memory it owns is
 * the activation-code scratch, sized once at create for max_rows x max_k.
 */
#include "backend_impl.h"
#include "w4a8_cpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_state {
	void *scratch;
	size_t scratch_bytes;
	uint32_t max_rows;
	uint32_t max_k;
	char cpu_model[128];
};

struct radiance_backend_layer {
	const struct radiance_layer *layer;
};

static void read_cpu_model(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	snprintf(out, len, "cpu");
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "model name", 10) == 0) {
			char *p = strchr(line, ':');
			if (p) {
				p += 1 + strspn(p + 1, " \t");
				p[strcspn(p, "\n")] = 0;
				snprintf(out, len, "%s", p);
			}
			break;
		}
	}
	fclose(f);
}

static int cpu_create(const struct radiance_backend_options *opt, void **state, char *err,
		      size_t errlen)
{
	struct cpu_state *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "cpu backend: out of memory");
		return -ENOMEM;
	}
	s->max_rows = opt->max_rows;
	s->max_k = opt->max_k ? opt->max_k : RADIANCE_GROUP_SIZE;
	s->scratch_bytes = radiance_cpu_w4a8_scratch_bytes(s->max_rows, s->max_k);
	s->scratch = aligned_alloc(64, (s->scratch_bytes + 63) & ~(size_t)63);
	if (!s->scratch) {
		/* the size is the operator's choice: say which options make it */
		snprintf(err, errlen, "cpu backend: out of memory for %zu bytes (%.1f GiB) of "
			 "activation scratch, sized by max_rows %u x max_k %u (about 5 bytes "
			 "each); lower --max-rows or --max-k", s->scratch_bytes,
			 (double)s->scratch_bytes / (1u << 30), s->max_rows, s->max_k);
		free(s);
		return -ENOMEM;
	}
	read_cpu_model(s->cpu_model, sizeof s->cpu_model);
	*state = s;
	return 0;
}

static void cpu_destroy(void *state)
{
	struct cpu_state *s = state;
	if (!s)
		return;
	free(s->scratch);
	free(s);
}

static void cpu_info(void *state, struct radiance_backend_info *info)
{
	struct cpu_state *s = state;
	snprintf(info->name, sizeof info->name, "cpu");
	snprintf(info->device, sizeof info->device, "%s", s->cpu_model);
	info->scratch_bytes = s->scratch_bytes;
}

static int cpu_layer_upload(void *state, const struct radiance_layer *l,
			    struct radiance_backend_layer **out, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	/* the scratch is sized for max_k (backend.c checks the option; this
	 * is the CPU's own default when the option is 0) */
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
		if (l->kind == RADIANCE_LAYER_W4A8)
			radiance_cpu_w4a8(r->x, r->dtype, r->m, l->qweight, l->scales, l->bias, l->n,
					  l->k, r->y, s->scratch);
		else
			radiance_cpu_bf16(r->x, r->dtype, r->m, l->weight, l->bias, l->n, l->k, r->y);
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
