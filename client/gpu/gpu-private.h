/*
 * libradiance-gpu internals, shared with its tests and the bench (which
 * link the objects, not the .so): nothing here is exported
 * (client/gpu/libradiance-gpu.sym).
 */
#ifndef RADIANCE_GPU_PRIVATE_H
#define RADIANCE_GPU_PRIVATE_H

#include "radiance_gpu.h"
#include "w4a8_gpu.h"

struct radiance_gpu_model {
	uint32_t model_id;
	int device;
	struct radiance__gpu_device dev;
	struct radiance__gpu_import import;
	int read_only;
	uint64_t mapped_bytes;
	struct radiance__gpu_layer *layers;   /* [n_layers], device pointers into import */
	size_t n_layers;
	uint32_t max_rows, max_n, max_k;
	int has_bf16;
	struct radiance__gpu_scratch scratch;
};

/* radiance_gpu_linear with the W4A8 path forced (tests: every kernel path
 * on mapped memory) and the path that ran in *path (may be NULL). */
int radiance__gpu_model_run(struct radiance_gpu_model *g, uint32_t layer, const void *x, void *y, uint32_t rows,
			    enum radiance_elem dtype, void *stream, enum radiance__w4a8_path force,
			    const char **path);

/* The device arrays of a layer (NULL when out of range). */
const struct radiance__gpu_layer *radiance__gpu_model_layer(const struct radiance_gpu_model *g, uint32_t layer);

#endif
