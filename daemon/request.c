/* Decoding and validation of SQ entries; see request.h. */
#include "request.h"

#include <errno.h>
#include <stdio.h>

#include "shm.h"

int request_decode(const uint8_t *payload, size_t len, struct radiance_proto_bump *bump,
		   Radiance__LinearRequest **out)
{
	radiance_proto_bump_reset(bump);
	ProtobufCAllocator alloc = radiance_proto_bump_allocator(bump);
	*out = radiance__linear_request__unpack(&alloc, len, payload);
	return *out ? 0 : -EPROTO;
}

/* Range [off, off + rows*dim*2) inside an arena of arena_bytes, with every
 * product and sum overflow-checked; the byte count in *bytes. */
static int arena_range(uint64_t arena_bytes, uint64_t off, uint32_t rows, uint32_t dim,
		       uint64_t *bytes)
{
	uint64_t n, end;
	if (__builtin_mul_overflow((uint64_t)rows, (uint64_t)dim, &n) ||
	    __builtin_mul_overflow(n, (uint64_t)2, &n) || __builtin_add_overflow(off, n, &end) ||
	    end > arena_bytes)
		return -EFAULT;
	*bytes = n;
	return 0;
}

static int overlap(uint64_t a, uint64_t a_bytes, uint64_t b, uint64_t b_bytes)
{
	return a < b + b_bytes && b < a + a_bytes;
}

int request_check(const struct request_ctx *ctx, const Radiance__LinearRequest *req,
		  struct request *out, char *err, size_t errlen)
{
	struct exec_model *m = exec_refs_find(ctx->refs, req->model_id);
	if (!m) {
		snprintf(err, errlen, "model_id %u is not loaded by this session", req->model_id);
		return ENOENT;
	}
	if (req->layer >= m->model->n_layers) {
		snprintf(err, errlen, "layer %u out of range: model %u has %zu layers", req->layer,
			 m->id, m->model->n_layers);
		return ENOENT;
	}
	const struct radiance_layer *l = &m->model->layers[req->layer];
	if (req->rows == 0 || req->rows > ctx->max_rows) {
		snprintf(err, errlen, "rows %u outside 1..%u", req->rows, ctx->max_rows);
		return EINVAL;
	}
	if (req->dtype != RADIANCE__DTYPE__DTYPE_BF16 && req->dtype != RADIANCE__DTYPE__DTYPE_FP16) {
		snprintf(err, errlen, "dtype %d is not bf16 (1) or fp16 (2)", (int)req->dtype);
		return EINVAL;
	}
	if (req->input_offset % RADIANCE_ARENA_ALIGN || req->output_offset % RADIANCE_ARENA_ALIGN) {
		snprintf(err, errlen, "input_offset %llu / output_offset %llu not %u-byte aligned",
			 (unsigned long long)req->input_offset, (unsigned long long)req->output_offset,
			 RADIANCE_ARENA_ALIGN);
		return EINVAL;
	}
	uint64_t in_bytes, out_bytes;
	if (arena_range(ctx->arena_bytes, req->input_offset, req->rows, l->k, &in_bytes) < 0) {
		snprintf(err, errlen, "input [%llu, +%u rows x K=%u x 2) outside the arena of %llu bytes",
			 (unsigned long long)req->input_offset, req->rows, l->k,
			 (unsigned long long)ctx->arena_bytes);
		return EFAULT;
	}
	if (arena_range(ctx->arena_bytes, req->output_offset, req->rows, l->n, &out_bytes) < 0) {
		snprintf(err, errlen, "output [%llu, +%u rows x N=%u x 2) outside the arena of %llu bytes",
			 (unsigned long long)req->output_offset, req->rows, l->n,
			 (unsigned long long)ctx->arena_bytes);
		return EFAULT;
	}
	if (overlap(req->input_offset, in_bytes, req->output_offset, out_bytes)) {
		snprintf(err, errlen, "input and output ranges overlap");
		return EINVAL;
	}
	*out = (struct request){
		.request_id = req->request_id,
		.model = m,
		.layer = req->layer,
		.rows = req->rows,
		.dtype = (enum radiance_dtype)req->dtype,
		.input_offset = req->input_offset,
		.output_offset = req->output_offset,
		.bytes_in = in_bytes,
		.bytes_out = out_bytes,
		.row_cost = (uint64_t)l->n * l->k,
		.group = (uint64_t)m->id << 32 | req->layer,
	};
	return 0;
}
