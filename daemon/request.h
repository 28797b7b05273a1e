/*
 * A request as the executor takes it from an SQ: decoded from the slot's
 * bytes and validated against the session's models and arena.
 *
 * The slot is the client's memory; radiance_ring_pop() has already copied
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

/* What a request is checked against: one session's view. */
struct request_ctx {
	struct exec_refs *refs;      /* the session's model references */
	uint64_t arena_bytes;        /* the session's arena */
	uint32_t max_rows;           /* the backend's largest M */
};

/* A valid request: every index in range, every range inside the arena. */
struct request {
	uint64_t request_id;
	struct exec_model *model;    /* valid while the session holds the reference */
	uint32_t layer;              /* an index into model->model->layers */
	uint32_t rows;               /* M, 1..max_rows */
	enum radiance_dtype dtype;   /* of x */
	uint64_t input_offset;       /* arena offset of x [rows][K] */
	uint64_t output_offset;      /* arena offset of y [rows][N] bf16 */
	uint64_t bytes_in;           /* rows x K x 2 */
	uint64_t bytes_out;          /* rows x N x 2 */
	uint64_t row_cost;           /* N x K: the scheduler's cost of one row */
	uint64_t group;              /* requests of equal group may share a launch */
};

/* Decodes a slot's payload of len bytes. *out lives in bump's buffer until
 * its next reset (nothing to free). 0, or -EPROTO when the bytes are not a
 * LinearRequest. */
int request_decode(const uint8_t *payload, size_t len, struct radiance_proto_bump *bump,
		   Radiance__LinearRequest **out);

/* Checks req against ctx. 0 with *out filled; otherwise the positive errno
 * status the client's result carries, with err naming what was wrong, where
 * and the values:
 *   ENOENT  the session holds no model model_id, or layer is out of range;
 *   EINVAL  rows outside 1..max_rows, a dtype that is not bf16 or fp16,
 *           offsets not RADIANCE_ARENA_ALIGN-aligned, x and y overlapping;
 *   EFAULT  x or y (its whole extent) outside the arena. */
int request_check(const struct request_ctx *ctx, const Radiance__LinearRequest *req,
		  struct request *out, char *err, size_t errlen);

#endif
