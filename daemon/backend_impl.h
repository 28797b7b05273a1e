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
	/* Optional (NULL: this backend never shares). Same contract as the
	 * radiance_backend_share_* functions. */
	int (*share_create)(void *state, const struct radiance_model *m, struct radiance_backend_share **out,
			    char *err, size_t errlen);
	void (*share_destroy)(void *state, struct radiance_backend_share *s);
	int (*layer_upload_into)(void *state, struct radiance_backend_share *s, size_t index,
				 const struct radiance_layer *l, struct radiance_backend_layer **out, char *err,
				 size_t errlen);
	/* backend.c has checked every dtype and the total rows against max_rows. */
	int (*linear)(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen);
	/* Optional (NULL: backend.c runs linear once per layer). Layers of one
	 * K; rows[j * nrows + i] is request i's for layer j, x shared. Checked
	 * as for linear. */
	int (*linear_multi)(void *state, const struct radiance_layer *const *l,
			    struct radiance_backend_layer *const *h, size_t nlayers,
			    const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen);
	/* Optional (NULL: linear only). Same contract as radiance_backend_linear_start
	 * and _done; backend.c has checked the rows as for linear. */
	int (*linear_start)(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
			    const struct radiance_rows *rows, size_t nrows, uint64_t *ticket, char *err,
			    size_t errlen);
	int (*linear_done)(void *state, uint64_t ticket, char *err, size_t errlen);
};

/* Allocates s->layers and lays out m's layers: every array at the next
 * multiple of RADIANCE_MAP_ALIGN, weight, scales, bias in that order, layer
 * after layer, with the array sizes `sizes` gives (W4A8 weight and scales;
 * bf16 weights are n*k*2, biases n*4 bytes). *total gets the end of the last
 * array. 0 or -ENOMEM. */
int radiance__backend_share_layout(struct radiance_backend_share *s, const struct radiance_model *m,
				   void (*sizes)(const struct radiance_layer *l, uint64_t *weight,
						 uint64_t *scales),
				   uint64_t *total);

extern const struct radiance_backend_ops radiance__backend_cpu_ops;
#ifdef RADIANCE_GPU
extern const struct radiance_backend_ops radiance__backend_gpu_ops;
#endif

#endif
