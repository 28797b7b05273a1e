/*
 * Fuzz target: one SQ entry decoded and checked (daemon/request.h), on its
 * own: request_decode() then request_check() against one session's models
 * and an arena, as the executor calls them for every entry it takes. No
 * rings, no backend: the round around them is fuzz_ring_slot's.
 *
 * Input: a  arena_bytes = 256 * (a % 64 + 1)
 *        r  max_rows = r % 16 + 1
 *        the rest (at most 252 bytes, a slot's payload): the entry.
 *
 * Model 1 (referenced): 0 W4A8 16x128, 1 W4A8 32x128, 2 bf16 8x128,
 * 3 W4A8 8x256, 4 bf16 8x16. Model 2 exists, referenced by nobody.
 *
 * Checked: a refusal has a documented status (ENOENT, EINVAL, EFAULT) and
 * a message; an acceptance names 1..RADIANCE_MAX_REQUEST_LAYERS distinct
 * layers of the model with one K, rows in 1..max_rows, aligned offsets,
 * x and every output inside the arena and none overlapping another, and
 * sizes, cost and group that follow from them.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "request.h"

static struct radiance_layer layers1[5] = {
	{ .name = (char *)"w4a8_16x128", .kind = RADIANCE_LAYER_W4A8, .n = 16, .k = 128 },
	{ .name = (char *)"w4a8_32x128", .kind = RADIANCE_LAYER_W4A8, .n = 32, .k = 128 },
	{ .name = (char *)"bf16_8x128", .kind = RADIANCE_LAYER_BF16, .n = 8, .k = 128 },
	{ .name = (char *)"w4a8_8x256", .kind = RADIANCE_LAYER_W4A8, .n = 8, .k = 256 },
	{ .name = (char *)"bf16_8x16", .kind = RADIANCE_LAYER_BF16, .n = 8, .k = 16 },
};
static struct radiance_layer layers2[1] = {
	{ .name = (char *)"other", .kind = RADIANCE_LAYER_BF16, .n = 8, .k = 8 },
};
static struct radiance_model m1 = { .name = (char *)"one", .layers = layers1, .n_layers = 5 };
static struct radiance_model m2 = { .name = (char *)"two", .layers = layers2, .n_layers = 1 };
static struct exec_model em1 = { .id = 1, .model = &m1 }, em2 = { .id = 2, .model = &m2 };
static struct exec_refs refs;
static struct rproto_bump bump;
static int ready;

static int overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
	return a < b + bn && b < a + an;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!ready) {
		exec_refs_init(&refs);
		FUZZ_CHECK(exec_refs_add(&refs, &em1) == 0);
		(void)em2;   /* exists, referenced by nobody: model_id 2 is ENOENT */
		ready = 1;
	}
	if (size < 2)
		return 0;
	const struct request_ctx ctx = {
		.refs = &refs,
		.arena_bytes = 256u * (data[0] % 64u + 1u),
		.max_rows = data[1] % 16u + 1u,
	};
	size_t len = size - 2 > RADIANCE_SLOT_BYTES - 4 ? RADIANCE_SLOT_BYTES - 4 : size - 2;
	/* the executor decodes a private copy of the slot */
	uint8_t slot[RADIANCE_SLOT_BYTES];
	memcpy(slot, data + 2, len);
	Rdw__LinearRequest *req;
	if (request_decode(slot, len, &bump, &req) < 0)
		return 0;
	struct request q;
	char err[192] = "";
	int status = request_check(&ctx, req, &q, err, sizeof err);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "status %d%s%s\n", status, status ? ": " : "", err);
	if (status) {
		FUZZ_CHECK(status == ENOENT || status == EINVAL || status == EFAULT);
		FUZZ_CHECK(err[0]);
		return 0;
	}
	FUZZ_CHECK(q.model == &em1 && q.request_id == req->request_id);
	FUZZ_CHECK(q.n_layers >= 1 && q.n_layers <= RADIANCE_MAX_REQUEST_LAYERS);
	FUZZ_CHECK(q.n_layers == 1 + req->n_extra_layers);
	FUZZ_CHECK(q.rows >= 1 && q.rows <= ctx.max_rows);
	FUZZ_CHECK(q.dtype == RADIANCE_DTYPE_BF16 || q.dtype == RADIANCE_DTYPE_FP16);
	FUZZ_CHECK(q.input_offset % RADIANCE_ARENA_ALIGN == 0);
	uint32_t k = m1.layers[q.layers[0] < m1.n_layers ? q.layers[0] : 0].k;
	uint64_t in_bytes = (uint64_t)q.rows * k * 2, out_sum = 0, n_sum = 0;
	FUZZ_CHECK(q.bytes_in == in_bytes);
	FUZZ_CHECK(q.input_offset + in_bytes <= ctx.arena_bytes);
	for (uint32_t i = 0; i < q.n_layers; i++) {
		FUZZ_CHECK(q.layers[i] < m1.n_layers);
		const struct radiance_layer *l = &m1.layers[q.layers[i]];
		FUZZ_CHECK(l->k == k);
		uint64_t off = q.output_offsets[i], bytes = (uint64_t)q.rows * l->n * 2;
		FUZZ_CHECK(off % RADIANCE_ARENA_ALIGN == 0);
		FUZZ_CHECK(off <= ctx.arena_bytes && bytes <= ctx.arena_bytes - off);
		FUZZ_CHECK(!overlap(q.input_offset, in_bytes, off, bytes));
		for (uint32_t j = 0; j < i; j++) {
			FUZZ_CHECK(q.layers[j] != q.layers[i]);
			uint64_t bj = (uint64_t)q.rows * m1.layers[q.layers[j]].n * 2;
			FUZZ_CHECK(!overlap(q.output_offsets[j], bj, off, bytes));
		}
		out_sum += bytes;
		n_sum += l->n;
	}
	FUZZ_CHECK(q.bytes_out == out_sum);
	FUZZ_CHECK(q.row_cost == n_sum * k);
	FUZZ_CHECK(q.group >> 32 == 1);
	FUZZ_CHECK(q.n_layers == 1 ? q.group == ((uint64_t)1 << 32 | q.layers[0])
				   : (q.group & 0x80000000u) != 0);
	return 0;
}
