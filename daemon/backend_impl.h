/* Private to the backends: the operations table behind daemon/backend.h. */
#ifndef RADIANCE_BACKEND_IMPL_H
#define RADIANCE_BACKEND_IMPL_H

#include "backend.h"

struct radiance_backend_ops {
	const char *name;
	/* Returns -ENODEV when this backend has no usable device (auto falls back).
	 * opt->max_rows is at least 1. */
	int (*create)(const struct radiance_backend_options *opt, void **state, char *err, size_t errlen);
	void (*destroy)(void *state);
	void (*info)(void *state, struct radiance_backend_info *info);
	int (*layer_upload)(void *state, const struct radiance_layer *l,
			    struct radiance_backend_layer **out, char *err, size_t errlen);
	void (*layer_free)(void *state, struct radiance_backend_layer *h);
	int (*register_host)(void *state, void *base, size_t len, char *err, size_t errlen);
	void (*unregister_host)(void *state, void *base);
	/* backend.c has checked every dtype and the total rows against max_rows. */
	int (*linear)(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen);
};

extern const struct radiance_backend_ops radiance__backend_cpu_ops;
#ifdef RADIANCE_GPU
extern const struct radiance_backend_ops radiance__backend_gpu_ops;
#endif

#endif
