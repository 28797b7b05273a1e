/*
 * daemon/request.c on its own: an SQ entry's bytes decoded and checked
 * against one session's models and arena, with no ring, backend or thread.
 * Every refusal is checked for its status and for the text that names what
 * was wrong, where, and the values; every acceptance for the offsets,
 * sizes, cost and launch group the executor then uses.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "request.h"

/* Model 4: q, k, v 64 x 128, up 256 x 128, down 128 x 256 (layers 0..4). */
static struct radiance_layer layers[5] = {
	{ .name = (char *)"q", .kind = RADIANCE_LAYER_W4A8, .n = 64, .k = 128 },
	{ .name = (char *)"k", .kind = RADIANCE_LAYER_W4A8, .n = 64, .k = 128 },
	{ .name = (char *)"v", .kind = RADIANCE_LAYER_W4A8, .n = 64, .k = 128 },
	{ .name = (char *)"up", .kind = RADIANCE_LAYER_W4A8, .n = 256, .k = 128 },
	{ .name = (char *)"down", .kind = RADIANCE_LAYER_W4A8, .n = 128, .k = 256 },
};
static struct radiance_model model = { .name = (char *)"m", .layers = layers, .n_layers = 5 };
static struct exec_model em = { .id = 4, .model = &model };
static struct exec_refs refs;
static const struct request_ctx ctx = { .refs = &refs, .arena_bytes = 65536, .max_rows = 32 };

static int setup(void **state)
{
	exec_refs_init(&refs);
	return exec_refs_add(&refs, &em);
}

static int teardown(void **state)
{
	exec_refs_finish(&refs);
	return 0;
}

/* A request of rows 2 of x at 0 through layer list[0..n), outputs at 4096,
 * 8192, ... */
static Rdw__LinearRequest base(uint32_t *extra, uint64_t *extra_out, const uint32_t *list,
				    size_t n)
{
	Rdw__LinearRequest r = RDW__LINEAR_REQUEST__INIT;
	r.request_id = 77;
	r.model_id = 4;
	r.layer = list[0];
	r.rows = 2;
	r.dtype = RDW__DTYPE__DTYPE_BF16;
	r.input_offset = 0;
	r.output_offset = 4096;
	for (size_t i = 1; i < n; i++) {
		extra[i - 1] = list[i];
		extra_out[i - 1] = 4096 * (i + 1);
	}
	r.n_extra_layers = r.n_extra_output_offsets = n - 1;
	r.extra_layers = extra;
	r.extra_output_offsets = extra_out;
	return r;
}

/* Packs r into a slot and decodes it again, as the executor gets it. */
static int roundtrip(const Rdw__LinearRequest *r, struct request *q, char *err, size_t errlen)
{
	static struct rproto_bump bump;
	uint8_t slot[RADIANCE_SLOT_BYTES - 4];
	int len = rproto_pack_slot((const ProtobufCMessage *)&r->base, slot, sizeof slot);
	assert_true(len > 0);
	Rdw__LinearRequest *d;
	assert_int_equal(request_decode(slot, (size_t)len, &bump, &d), 0);
	err[0] = 0;
	return request_check(&ctx, d, q, err, errlen);
}

static void expect(const Rdw__LinearRequest *r, int status, const char *text)
{
	struct request q;
	char err[192];
	assert_int_equal(roundtrip(r, &q, err, sizeof err), status);
	if (!strstr(err, text))
		fail_msg("\"%s\" does not say \"%s\"", err, text);
}

static void test_one_layer(void **state)
{
	uint32_t ex[8];
	uint64_t eo[8];
	const uint32_t l[] = { 3 };
	Rdw__LinearRequest r = base(ex, eo, l, 1);
	struct request q;
	char err[192];
	assert_int_equal(roundtrip(&r, &q, err, sizeof err), 0);
	assert_int_equal(q.n_layers, 1);
	assert_int_equal(q.layers[0], 3);
	assert_int_equal(q.output_offsets[0], 4096);
	assert_int_equal(q.bytes_in, 2 * 128 * 2);
	assert_int_equal(q.bytes_out, 2 * 256 * 2);
	assert_int_equal(q.row_cost, 256 * 128);
	assert_int_equal(q.group, (uint64_t)4 << 32 | 3);   /* as before several layers */
	assert_ptr_equal(q.model, &em);
	r.layer = 5;
	expect(&r, ENOENT, "layer 5 out of range: model 4 has 5 layers");
	r.layer = 0;
	r.model_id = 9;
	expect(&r, ENOENT, "model_id 9 is not loaded by this session");
}

static void test_several_layers(void **state)
{
	uint32_t ex[8];
	uint64_t eo[8];
	const uint32_t l[] = { 0, 1, 2 };
	Rdw__LinearRequest r = base(ex, eo, l, 3);
	struct request q, q2;
	char err[192];
	assert_int_equal(roundtrip(&r, &q, err, sizeof err), 0);
	assert_int_equal(q.n_layers, 3);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(q.layers[i], i);
		assert_int_equal(q.output_offsets[i], 4096 * (i + 1));
	}
	assert_int_equal(q.bytes_in, 2 * 128 * 2);
	assert_int_equal(q.bytes_out, 3 * 2 * 64 * 2);
	assert_int_equal(q.row_cost, 3 * 64 * 128);
	assert_true(q.group >> 32 == 4 && (q.group & 0x80000000u));
	/* the same list, the same group; another order, another list */
	assert_int_equal(roundtrip(&r, &q2, err, sizeof err), 0);
	assert_int_equal(q2.group, q.group);
	const uint32_t l2[] = { 0, 2, 1 };
	r = base(ex, eo, l2, 3);
	assert_int_equal(roundtrip(&r, &q2, err, sizeof err), 0);
	assert_int_not_equal(q2.group, q.group);
	/* one K, different N */
	const uint32_t l3[] = { 3, 0 };
	r = base(ex, eo, l3, 2);
	assert_int_equal(roundtrip(&r, &q2, err, sizeof err), 0);
	assert_int_equal(q2.row_cost, (256 + 64) * 128);
}

static void test_several_refused(void **state)
{
	uint32_t ex[16];
	uint64_t eo[16];
	const uint32_t dk[] = { 0, 4 };
	Rdw__LinearRequest r = base(ex, eo, dk, 2);
	expect(&r, EINVAL, "layers[1] = 4 (down) has K=256 but layers[0] = 0 (q) K=128");
	const uint32_t rep[] = { 0, 1, 0 };
	r = base(ex, eo, rep, 3);
	expect(&r, EINVAL, "layers[2] = 0 (q) repeats layers[0]");
	const uint32_t oor[] = { 0, 1, 7 };
	r = base(ex, eo, oor, 3);
	expect(&r, ENOENT, "layers[2] = 7 out of range: model 4 has 5 layers");
	const uint32_t many[] = { 0, 1, 2, 3, 0, 1, 2, 3, 0 };
	r = base(ex, eo, many, 9);
	expect(&r, EINVAL, "9 layers in one request: at most 8");
	const uint32_t qk[] = { 0, 1 };
	r = base(ex, eo, qk, 2);
	r.n_extra_output_offsets = 0;
	expect(&r, EINVAL, "extra_layers has 1 entries but extra_output_offsets 0");
	r = base(ex, eo, qk, 2);
	eo[0] = 65536 - 96;
	expect(&r, EFAULT, "output of layers[1] [65440, +2 rows x N=64 x 2) outside the arena of "
			   "65536 bytes");
	r = base(ex, eo, qk, 2);
	eo[0] = 8;
	expect(&r, EINVAL, "output offset of layers[1] 8 not 16-byte aligned");
	r = base(ex, eo, qk, 2);
	eo[0] = 4096 + 128;   /* inside layers[0]'s 256 bytes */
	expect(&r, EINVAL, "the outputs of layers[0] and layers[1] overlap");
	r = base(ex, eo, qk, 2);
	eo[0] = 256;          /* inside x's 512 bytes */
	expect(&r, EINVAL, "input and the output of layers[1] overlap");
	r = base(ex, eo, qk, 2);
	r.rows = 33;
	expect(&r, EINVAL, "rows 33 outside 1..32");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_layer),
		cmocka_unit_test(test_several_layers),
		cmocka_unit_test(test_several_refused),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
