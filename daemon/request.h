/*
 * A request as the executor takes it from an SQ: decoded from the slot's
 * bytes and validated against the session's models and arena.
 *
 * The slot is the client's memory; rring_pop() has already copied
 * it out, so what is decoded here cannot change under the checks. Nothing
 * here touches a ring, the backend or a thread: the executor calls it for
 * every entry it takes, and tests/fuzz/fuzz_request.c feeds it anything.
 *
 * Thread safety: none of its own; request_check() looks models up under
 * the session's refs lock (exec_refs_find).
 */
#ifndef RADIANCE_REQUEST_H
#define RADIANCE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "proto_util.h"
#include "shm.h"

/* What a request is checked against: one session's view. */
struct request_ctx {
	struct exec_refs *refs;      /* the session's model references */
	uint64_t arena_bytes;        /* the session's arena */
	uint32_t max_rows;           /* the backend's largest M */
};

/* A valid request: every index in range, every range inside the arena.
 * Layer 0 is LinearRequest.layer, layer i > 0 extra_layers[i-1]. */
struct request {
	uint64_t request_id;
	struct exec_model *model;    /* valid while the session holds the reference */
	uint32_t rows;               /* M, 1..max_rows */
	enum radiance_dtype dtype;   /* of x */
	uint64_t input_offset;       /* arena offset of x [rows][K] */
	uint32_t n_layers;           /* 1..RADIANCE_MAX_REQUEST_LAYERS */
	uint32_t layers[RADIANCE_MAX_REQUEST_LAYERS];          /* indexes into model->model->layers,
	                                                          distinct, one K */
	uint64_t output_offsets[RADIANCE_MAX_REQUEST_LAYERS];  /* y of each [rows][N_i] bf16 */
	uint64_t bytes_in;           /* rows x K x 2 */
	uint64_t bytes_out;          /* all outputs: rows x sum(N_i) x 2 */
	uint64_t row_cost;           /* sum(N_i) x K: the scheduler's cost of one row */
	uint64_t group;              /* requests of equal group may share a launch:
	                                (model id << 32) | layer for one layer; for
	                                several, bit 31 and a hash of the list, so
	                                the launch still compares the lists */
};

/* Decodes a slot's payload of len bytes. *out lives in bump's buffer until
 * its next reset (nothing to free). 0, or -EPROTO when the bytes are not a
 * LinearRequest. */
int request_decode(const uint8_t *payload, size_t len, struct rproto_bump *bump,
		   Rdw__LinearRequest **out);

/* Checks req against ctx. 0 with *out filled; otherwise the positive errno
 * status the client's result carries, with err naming what was wrong, where
 * (a layer by its position, layers[i]) and the values:
 *   ENOENT  the session holds no model model_id, or a layer index is out of
 *           range;
 *   EINVAL  rows outside 1..max_rows, a dtype that is not bf16 or fp16,
 *           offsets not RADIANCE_ARENA_ALIGN-aligned, x and an output or two
 *           outputs overlapping; and for several layers: more than
 *           RADIANCE_MAX_REQUEST_LAYERS, extra_layers and
 *           extra_output_offsets of different lengths, a layer whose K is
 *           not layers[0]'s, a layer named twice;
 *   EFAULT  x or an output (its whole extent) outside the arena. */
int request_check(const struct request_ctx *ctx, const Rdw__LinearRequest *req,
		  struct request *out, char *err, size_t errlen);

#endif
