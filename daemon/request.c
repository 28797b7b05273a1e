/* Decoding and validation of SQ entries; see request.h. */
#include "request.h"

#include <errno.h>
#include <stdio.h>

#include "shm.h"

int request_decode(const uint8_t *payload, size_t len, struct rproto_bump *bump,
		   Rdw__LinearRequest **out)
{
	rproto_bump_reset(bump);
	ProtobufCAllocator alloc = rproto_bump_allocator(bump);
	*out = rdw__linear_request__unpack(&alloc, len, payload);
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

/* The group of a request of several layers: bit 31 set (no layer index
 * reaches it), then FNV-1a of the list in 31 bits. Equal lists, equal
 * groups; a collision only costs the launch a comparison. */
static uint64_t multi_group(uint32_t model_id, const uint32_t *layers, uint32_t n)
{
	uint32_t h = 2166136261u;
	for (uint32_t i = 0; i < n; i++)
		for (int b = 0; b < 4; b++) {
			h ^= (layers[i] >> (8 * b)) & 0xFFu;
			h *= 16777619u;
		}
	return (uint64_t)model_id << 32 | 0x80000000u | (h & 0x7FFFFFFFu);
}

int request_check(const struct request_ctx *ctx, const Rdw__LinearRequest *req,
		  struct request *out, char *err, size_t errlen)
{
	struct exec_model *m = exec_refs_find(ctx->refs, req->model_id);
	if (!m) {
		snprintf(err, errlen, "model_id %u is not loaded by this session", req->model_id);
		return ENOENT;
	}
	size_t extra = req->n_extra_layers;
	if (extra != req->n_extra_output_offsets) {
		snprintf(err, errlen, "extra_layers has %zu entries but extra_output_offsets %zu: "
			 "one output per layer", extra, req->n_extra_output_offsets);
		return EINVAL;
	}
	if (extra > RADIANCE_MAX_REQUEST_LAYERS - 1) {
		snprintf(err, errlen, "%zu layers in one request: at most %u", extra + 1,
			 RADIANCE_MAX_REQUEST_LAYERS);
		return EINVAL;
	}
	struct request q = {
		.request_id = req->request_id,
		.model = m,
		.rows = req->rows,
		.dtype = (enum radiance_dtype)req->dtype,
		.input_offset = req->input_offset,
		.n_layers = (uint32_t)extra + 1,
	};
	q.layers[0] = req->layer;
	q.output_offsets[0] = req->output_offset;
	for (size_t i = 0; i < extra; i++) {
		q.layers[i + 1] = req->extra_layers[i];
		q.output_offsets[i + 1] = req->extra_output_offsets[i];
	}
	/* one layer keeps the messages it always had; several name the position */
	for (uint32_t i = 0; i < q.n_layers; i++) {
		if (q.layers[i] >= m->model->n_layers) {
			if (q.n_layers == 1)
				snprintf(err, errlen, "layer %u out of range: model %u has %zu layers",
					 q.layers[i], m->id, m->model->n_layers);
			else
				snprintf(err, errlen, "layers[%u] = %u out of range: model %u has %zu "
					 "layers", i, q.layers[i], m->id, m->model->n_layers);
			return ENOENT;
		}
	}
	const struct radiance_layer *l0 = &m->model->layers[q.layers[0]];
	for (uint32_t i = 1; i < q.n_layers; i++) {
		const struct radiance_layer *l = &m->model->layers[q.layers[i]];
		for (uint32_t j = 0; j < i; j++)
			if (q.layers[j] == q.layers[i]) {
				snprintf(err, errlen, "layers[%u] = %u (%s) repeats layers[%u]", i,
					 q.layers[i], l->name, j);
				return EINVAL;
			}
		if (l->k != l0->k) {
			snprintf(err, errlen, "layers[%u] = %u (%s) has K=%u but layers[0] = %u (%s) "
				 "K=%u: the layers of one request share x", i, q.layers[i], l->name,
				 l->k, q.layers[0], l0->name, l0->k);
			return EINVAL;
		}
	}
	if (req->rows == 0 || req->rows > ctx->max_rows) {
		snprintf(err, errlen, "rows %u outside 1..%u", req->rows, ctx->max_rows);
		return EINVAL;
	}
	if (req->dtype != RDW__DTYPE__DTYPE_BF16 && req->dtype != RDW__DTYPE__DTYPE_FP16) {
		snprintf(err, errlen, "dtype %d is not bf16 (1) or fp16 (2)", (int)req->dtype);
		return EINVAL;
	}
	for (uint32_t i = 0; i < q.n_layers; i++)
		if (req->input_offset % RADIANCE_ARENA_ALIGN ||
		    q.output_offsets[i] % RADIANCE_ARENA_ALIGN) {
			if (q.n_layers == 1)
				snprintf(err, errlen, "input_offset %llu / output_offset %llu not "
					 "%u-byte aligned", (unsigned long long)req->input_offset,
					 (unsigned long long)req->output_offset, RADIANCE_ARENA_ALIGN);
			else
				snprintf(err, errlen, "input_offset %llu / output offset of layers[%u] "
					 "%llu not %u-byte aligned",
					 (unsigned long long)req->input_offset, i,
					 (unsigned long long)q.output_offsets[i], RADIANCE_ARENA_ALIGN);
			return EINVAL;
		}
	if (arena_range(ctx->arena_bytes, req->input_offset, req->rows, l0->k, &q.bytes_in) < 0) {
		snprintf(err, errlen, "input [%llu, +%u rows x K=%u x 2) outside the arena of %llu bytes",
			 (unsigned long long)req->input_offset, req->rows, l0->k,
			 (unsigned long long)ctx->arena_bytes);
		return EFAULT;
	}
	uint64_t out_bytes[RADIANCE_MAX_REQUEST_LAYERS];
	uint64_t n_sum = 0;
	for (uint32_t i = 0; i < q.n_layers; i++) {
		const struct radiance_layer *l = &m->model->layers[q.layers[i]];
		if (arena_range(ctx->arena_bytes, q.output_offsets[i], req->rows, l->n,
				&out_bytes[i]) < 0) {
			if (q.n_layers == 1)
				snprintf(err, errlen, "output [%llu, +%u rows x N=%u x 2) outside the "
					 "arena of %llu bytes", (unsigned long long)req->output_offset,
					 req->rows, l->n, (unsigned long long)ctx->arena_bytes);
			else
				snprintf(err, errlen, "output of layers[%u] [%llu, +%u rows x N=%u x 2) "
					 "outside the arena of %llu bytes", i,
					 (unsigned long long)q.output_offsets[i], req->rows, l->n,
					 (unsigned long long)ctx->arena_bytes);
			return EFAULT;
		}
		if (overlap(req->input_offset, q.bytes_in, q.output_offsets[i], out_bytes[i])) {
			if (q.n_layers == 1)
				snprintf(err, errlen, "input and output ranges overlap");
			else
				snprintf(err, errlen, "input and the output of layers[%u] overlap", i);
			return EINVAL;
		}
		for (uint32_t j = 0; j < i; j++)
			if (overlap(q.output_offsets[j], out_bytes[j], q.output_offsets[i], out_bytes[i])) {
				snprintf(err, errlen, "the outputs of layers[%u] and layers[%u] overlap",
					 j, i);
				return EINVAL;
			}
		q.bytes_out += out_bytes[i];
		n_sum += l->n;
	}
	q.row_cost = n_sum * l0->k;
	q.group = q.n_layers == 1 ? (uint64_t)m->id << 32 | q.layers[0]
				  : multi_group(m->id, q.layers, q.n_layers);
	*out = q;
	return 0;
}
