/* Backend selection and dispatch; the numerics live in the backends. */
#include "backend_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct radiance_backend {
	const struct radiance_backend_ops *ops;
	void *state;
	uint32_t max_rows;   /* what the backend sized its staging for */
};

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
		if (strcmp(kind, "gpu") == 0) {
			snprintf(err, errlen, "backend 'gpu' requested but this build has no GPU "
				 "backend (rebuild with make GPU=cuda or GPU=hip)");
			return -ENODEV;
		}
#endif
		if (strcmp(kind, "auto") == 0)
			order[n++] = &radiance__backend_cpu_ops;
	} else {
		snprintf(err, errlen, "unknown backend '%s' (expected auto, cpu or gpu)", kind);
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
	b->max_rows = o.max_rows;
	int rc = -ENODEV;
	for (size_t i = 0; i < n; i++) {
		rc = order[i]->create(&o, &b->state, err, errlen);
		if (rc == 0) {
			b->ops = order[i];
			*out = b;
			return 0;
		}
		/* auto: a missing GPU falls through to the CPU; any other error is final */
		if (!(rc == -ENODEV && i + 1 < n))
			break;
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
	return b->ops->layer_upload(b->state, l, out, err, errlen);
}

void radiance_backend_layer_free(struct radiance_backend *b, struct radiance_backend_layer *h)
{
	if (h)
		b->ops->layer_free(b->state, h);
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

int radiance_backend_linear(struct radiance_backend *b, const struct radiance_layer *l,
			    struct radiance_backend_layer *h, const struct radiance_rows *rows,
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
	return b->ops->linear(b->state, l, h, rows, nrows, err, errlen);
}
