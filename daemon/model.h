/*
 * A loaded checkpoint as the daemon keeps it: every linear layer, repacked
 * once at load into the canonical host layout below, plus an inventory of the
 * tensors that belong to no linear (norms, embeddings) so nothing is skipped
 * silently. Produced by daemon/checkpoint.c, consumed by the backends.
 *
 * Canonical host layout (what the CPU backend reads; GPU backends repack it
 * again into their own device layout in layer_upload):
 *   W4A8 layer, N outputs, K inputs (K % 128 == 0):
 *     qweight  uint32 [N][K/8]   row n contiguous along K; word w holds the
 *                                codes of k = 8w..8w+7, code of k = 8w+j in
 *                                bits 4j..4j+3 (GPTQ's nibble order along K,
 *                                transposed from the checkpoint's [K/8, N]).
 *     scales   fp16   [N][K/128] bits as stored, transposed from [K/128, N].
 *   bf16 layer:
 *     weight   bf16   [N][K]     as torch's nn.Linear.weight [out, in];
 *                                fp16/fp32 checkpoint weights are converted
 *                                to bf16 (RNE) at load.
 *   bias (either kind, optional): fp32 [N], widened from the checkpoint dtype.
 *
 * Ownership: a struct radiance_model owns all of its memory; free it with
 * radiance_model_destroy(). Immutable after load, so any number of threads
 * may read it concurrently.
 */
#ifndef RADIANCE_MODEL_H
#define RADIANCE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "numerics.h"   /* enum radiance_dtype */
#include "radiance.h"   /* enum radiance_layer_kind */

/* enum radiance_layer_kind: client/radiance.h's, one name and one set of
 * values with the wire's LayerKind. */

struct radiance_layer {
	char *name;                /* module path, e.g. "encoder.layer.0.attention.self.query" */
	enum radiance_layer_kind kind;
	uint32_t n;                /* output features */
	uint32_t k;                /* input features */
	uint32_t *qweight;         /* W4A8: [n][k/8], else NULL */
	uint16_t *scales;          /* W4A8: fp16 [n][k/128], else NULL */
	uint16_t *weight;          /* BF16: bf16 [n][k], else NULL */
	float *bias;               /* [n] or NULL */
	uint64_t bytes;            /* resident bytes of this layer's host arrays */
};

/* A tensor that is not part of any linear layer (embeddings, norms, the
 * biases of what is no served linear). Its bytes, exactly as the
 * safetensors file stores them, sit in the model's shared memfd at offset. */
struct radiance_tensor_info {
	char *name;
	char dtype[8];             /* safetensors dtype string, e.g. "BF16" */
	uint32_t ndim;
	uint64_t shape[8];
	uint64_t bytes;
	uint64_t offset;           /* in tensors_fd, a multiple of RADIANCE_TENSORS_ALIGN */
};

struct radiance_model {
	char *name;                /* load_dir: the directory basename; from fds: config.json's "_name_or_path" basename, else "model" */
	struct radiance_layer *layers;
	size_t n_layers;
	struct radiance_tensor_info *other;   /* tensors of no linear, sorted by name */
	size_t n_other;
	/* The shared tensors: a memfd holding every other[i]'s bytes, sealed
	 * (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) once the
	 * loader filled it; tensors_bytes long (a multiple of 4096, 0 when
	 * n_other is 0). -1 when none was made (a model built by hand). The
	 * daemon hands out dups of it (MapTensors); closed by destroy. */
	int tensors_fd;
	uint64_t tensors_bytes;
	uint64_t resident_bytes;   /* sum of layers[i].bytes, plus tensors_bytes */
	uint32_t group_size;       /* 128, verified */
	uint32_t bits;             /* 4, verified */
};

/* Index of the layer called `name`, or -1. O(n_layers). */
long radiance_model_find_layer(const struct radiance_model *m, const char *name);

/* Frees everything the model owns and closes tensors_fd (when >= 0); NULL
 * is a no-op. */
void radiance_model_destroy(struct radiance_model *m);

#endif
