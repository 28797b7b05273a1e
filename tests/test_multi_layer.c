/*
 * Several layers in one request (radiance_linear_multi,
 * radiance_submit_multi) against the real radianced binary on the real
 * checkpoint: q, k and v of one attention block on one x, and two layers of
 * one K and different N. Each output is compared with the single-layer
 * result of the same daemon (bit for bit: the per-token quantization of x
 * is deterministic, so quantizing it once changes nothing) and with the CPU
 * reference of tests/reference.h computed here from the locally loaded
 * checkpoint (to the bf16 floor, as every backend is held to).
 *
 * Also: the client's refusals, each naming what and where; the daemon's own
 * checks are daemon/request.c's, tested in test_request; and a client
 * against a daemon that predates the feature (raw_client.h's fake one,
 * whose Welcome has no max_request_layers) gets -ENOTSUP,
 * "not supported by this daemon", with nothing sent.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon_harness.h"
#include "raw_client.h"
#include "shm.h"

#define L0 "encoder.layer.0."
static const char *const Q = L0 "attention.self.query";            /* 384 x 384 */
static const char *const K_ = L0 "attention.self.key";
static const char *const V = L0 "attention.self.value";
static const char *const UP = L0 "intermediate.dense";             /* 1536 x 384 */
static const char *const AO = L0 "attention.output.dense";         /* 384 x 384 */
static const char *const DOWN = L0 "output.dense";                 /* 384 x 1536 */

static struct h_ref ref;
static struct h_daemon daemon_;
static char ckpt[512];

static int group_setup(void **state)
{
	static const char *const only[] = { L0 "attention.self.query", NULL };
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	return h_ref_load_some(&ref, only);
}

static int group_teardown(void **state)
{
	h_ref_free(&ref);
	return 0;
}

static int start(void **state)
{
	/* max_rows 16: the captured x's rows run in several requests */
	static const char *const args[] = { "--max-rows", "16", NULL };
	return h_daemon_start_argv(&daemon_, args);
}

static int stop(void **state)
{
	return h_daemon_stop_clean(&daemon_);
}

static struct radiance *open_model(uint32_t *id)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "test-multi";
	o.timeout_ms = 30000;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	int rc = radiance_load_model(r, ckpt, NULL, id);
	if (rc < 0)
		fail_msg("load: %s", radiance_error_message(r));
	return r;
}

static uint32_t layer_index(struct radiance *r, uint32_t id, const char *name)
{
	int i = radiance_find_layer(radiance_held_model(r, id), name);
	if (i < 0)
		fail_msg("the daemon's model has no layer %s", name);
	return (uint32_t)i;
}

static const struct radiance_layer *local_layer(const char *name)
{
	long i = radiance_model_find_layer(ref.model, name);
	assert_true(i >= 0);
	return &ref.model->layers[i];
}

/* names[0..n) on x [m][K] of dt, in one request: each output equals the
 * single-layer request's bits and the reference's to the bf16 floor. */
static void check_multi(struct radiance *r, uint32_t id, const char *const *names, uint32_t n,
			const uint16_t *x, uint32_t m, enum radiance_elem dt)
{
	uint32_t idx[RADIANCE_MAX_LAYERS_PER_REQUEST];
	void *y[RADIANCE_MAX_LAYERS_PER_REQUEST];
	for (uint32_t j = 0; j < n; j++) {
		idx[j] = layer_index(r, id, names[j]);
		y[j] = malloc((size_t)m * local_layer(names[j])->n * 2);
		assert_non_null(y[j]);
	}
	int rc = radiance_linear_multi(r, id, idx, n, m, dt, x, y);
	if (rc < 0)
		fail_msg("radiance_linear_multi: %s (%s)", radiance_strerror(rc),
			 radiance_error_message(r));
	for (uint32_t j = 0; j < n; j++) {
		const struct radiance_layer *l = local_layer(names[j]);
		size_t mn = (size_t)m * l->n;
		uint16_t *one = malloc(mn * 2), *want = malloc(mn * 2);
		assert_non_null(one);
		assert_non_null(want);
		assert_int_equal(radiance_linear(r, id, idx[j], m, dt, x, one), 0);
		assert_memory_equal(y[j], one, mn * 2);
		h_reference(l, x, dt == RADIANCE_BF16 ? RADIANCE_DTYPE_BF16 : RADIANCE_DTYPE_FP16, m,
			    want);
		size_t exact;
		double ulps;
		size_t bad = h_compare_bf16(y[j], want, mn, &exact, &ulps);
		if (bad)
			fail_msg("%s: %zu of %zu beyond one bf16 ulp of the reference (max %.1f)",
				 names[j], bad, mn, ulps);
		free(one);
		free(want);
		free(y[j]);
	}
}

/* q, k, v on the captured input of layer 0's attention (bf16 and fp16),
 * the order changed, and two layers of one K and different N. */
static void test_multi_qkv(void **state)
{
	uint32_t id;
	struct radiance *r = open_model(&id);
	assert_int_equal(radiance_get_server_info(r)->max_request_layers,
			 RADIANCE_MAX_LAYERS_PER_REQUEST);
	const struct h_layer *hq = h_ref_find(&ref, Q);
	assert_non_null(hq);
	assert_true(hq->m > 16);   /* split into several requests by max_rows */
	const char *const qkv[] = { Q, K_, V };
	check_multi(r, id, qkv, 3, hq->x_bf16, hq->m, RADIANCE_BF16);
	check_multi(r, id, qkv, 3, hq->x_fp16, hq->m, RADIANCE_FP16);
	const char *const vq[] = { V, Q };
	check_multi(r, id, vq, 2, hq->x_bf16, 3, RADIANCE_BF16);
	const char *const up_ao[] = { UP, AO };
	check_multi(r, id, up_ao, 2, hq->x_bf16, hq->m, RADIANCE_BF16);
	const char *const one[] = { K_ };
	check_multi(r, id, one, 1, hq->x_bf16, 1, RADIANCE_BF16);
	radiance_disconnect(r);
}

/* Several requests of three layers in flight at once, arena buffers: one
 * completion each, every output the single-layer bits. */
static void test_multi_async(void **state)
{
	uint32_t id;
	struct radiance *r = open_model(&id);
	const struct h_layer *hq = h_ref_find(&ref, Q);
	const uint32_t m = 4, nreq = 6;
	uint32_t idx[3] = { layer_index(r, id, Q), layer_index(r, id, K_), layer_index(r, id, UP) };
	const uint32_t n[3] = { 384, 384, 1536 };
	uint16_t *x[6], *y[6][3];
	uint64_t rid[6];
	for (uint32_t i = 0; i < nreq; i++) {
		x[i] = radiance_arena_alloc(r, (size_t)m * 384 * 2);
		assert_non_null(x[i]);
		memcpy(x[i], hq->x_bf16 + (size_t)i * m * 384, (size_t)m * 384 * 2);
		for (int j = 0; j < 3; j++) {
			y[i][j] = radiance_arena_alloc(r, (size_t)m * n[j] * 2);
			assert_non_null(y[i][j]);
		}
		void *ys[3] = { y[i][0], y[i][1], y[i][2] };
		assert_int_equal(radiance_submit_multi(r, id, idx, 3, m, RADIANCE_BF16, x[i], ys,
						       &rid[i]), 0);
	}
	assert_int_equal(radiance_in_flight(r), nreq);
	int seen[6] = { 0 };
	for (uint32_t i = 0; i < nreq; i++) {
		struct radiance_completion c;
		assert_int_equal(radiance_wait(r, &c, 30000), 1);
		assert_int_equal(c.status, 0);
		assert_true(c.request_id >= rid[0] && c.request_id <= rid[nreq - 1]);
		seen[c.request_id - rid[0]]++;
	}
	assert_int_equal(radiance_in_flight(r), 0);
	for (uint32_t i = 0; i < nreq; i++) {
		assert_int_equal(seen[i], 1);
		for (int j = 0; j < 3; j++) {
			uint16_t *one = malloc((size_t)m * n[j] * 2);
			assert_int_equal(radiance_linear(r, id, idx[j], m, RADIANCE_BF16, x[i], one), 0);
			assert_memory_equal(y[i][j], one, (size_t)m * n[j] * 2);
			free(one);
		}
	}
	radiance_disconnect(r);
}

static void expect_refusal(struct radiance *r, int rc, int want, const char *text)
{
	assert_int_equal(rc, want);
	const char *msg = radiance_error_message(r);
	if (!strstr(msg, text))
		fail_msg("message \"%s\" does not say \"%s\"", msg, text);
}

/* Bad input is refused before anything is sent, with what and where. */
static void test_multi_refused(void **state)
{
	uint32_t id;
	struct radiance *r = open_model(&id);
	const struct radiance_model_info *mi = radiance_held_model(r, id);
	uint32_t q = layer_index(r, id, Q), k = layer_index(r, id, K_), down = layer_index(r, id, DOWN);
	uint16_t *x = radiance_arena_alloc(r, 2 * 1536 * 2);
	uint16_t *ya = radiance_arena_alloc(r, 2 * 1536 * 2), *yb = radiance_arena_alloc(r, 2 * 1536 * 2);
	assert_non_null(x);
	assert_non_null(ya);
	assert_non_null(yb);
	memset(x, 0, 2 * 1536 * 2);
	void *ys[9] = { ya, yb, ya, yb, ya, yb, ya, yb, ya };

	char text[160];
	uint32_t diff_k[2] = { q, down };
	snprintf(text, sizeof text, "layers[1] = %u (%s) has K=1536 but layers[0] = %u (%s) K=384",
		 down, DOWN, q, Q);
	expect_refusal(r, radiance_submit_multi(r, id, diff_k, 2, 1, RADIANCE_BF16, x, ys, NULL),
		       -EINVAL, text);
	uint32_t rep[3] = { q, k, q };
	expect_refusal(r, radiance_submit_multi(r, id, rep, 3, 1, RADIANCE_BF16, x, ys, NULL),
		       -EINVAL, "layers[2] = ");
	expect_refusal(r, radiance_submit_multi(r, id, rep, 3, 1, RADIANCE_BF16, x, ys, NULL),
		       -EINVAL, "repeats layers[0]");
	uint32_t many[9];
	for (uint32_t i = 0; i < 9; i++)
		many[i] = i;
	expect_refusal(r, radiance_submit_multi(r, id, many, 9, 1, RADIANCE_BF16, x, ys, NULL),
		       -EINVAL, "9 layers in one request: 1..8");
	expect_refusal(r, radiance_submit_multi(r, id, many, 0, 1, RADIANCE_BF16, x, ys, NULL),
		       -EINVAL, "0 layers in one request");
	uint32_t out_of_range[2] = { q, (uint32_t)mi->n_layers };
	snprintf(text, sizeof text, "layers[1]: layer %zu is out of range: model %u has %zu layers",
		 mi->n_layers, id, mi->n_layers);
	expect_refusal(r, radiance_submit_multi(r, id, out_of_range, 2, 1, RADIANCE_BF16, x, ys,
						NULL), -ENOENT, text);
	uint32_t qk[2] = { q, k };
	uint16_t y_heap[384 * 2];
	void *off_arena[2] = { ya, y_heap };
	expect_refusal(r, radiance_submit_multi(r, id, qk, 2, 1, RADIANCE_BF16, x, off_arena, NULL),
		       -EFAULT, "y[1]");
	expect_refusal(r, radiance_submit_multi(r, id, NULL, 2, 1, RADIANCE_BF16, x, ys, NULL),
		       -EINVAL, "layers is NULL");
	expect_refusal(r, radiance_linear_multi(r, id, qk, 2, 1, RADIANCE_BF16, x, NULL), -EINVAL,
		       "NULL");
	/* outputs that overlap: the daemon's check (request.c), answered as a status */
	void *same[2] = { ya, ya };
	uint64_t rid;
	assert_int_equal(radiance_submit_multi(r, id, qk, 2, 1, RADIANCE_BF16, x, same, &rid), 0);
	struct radiance_completion c;
	assert_int_equal(radiance_wait(r, &c, 30000), 1);
	assert_int_equal(c.request_id, rid);
	assert_int_equal(c.status, -EINVAL);
	assert_non_null(strstr(c.error, "the outputs of layers[0] and layers[1] overlap"));
	assert_int_equal(radiance_in_flight(r), 0);
	/* the session goes on */
	uint16_t one[384], two[2][384];
	void *yy[2] = { two[0], two[1] };
	assert_int_equal(radiance_linear_multi(r, id, qk, 2, 1, RADIANCE_BF16, x, yy), 0);
	assert_int_equal(radiance_linear(r, id, k, 1, RADIANCE_BF16, x, one), 0);
	assert_memory_equal(two[1], one, sizeof one);
	radiance_disconnect(r);
}

/* ---- a daemon from before several-layer requests ---- */

static void test_multi_old_daemon(void **state)
{
	struct raw_old old;
	raw_old_start(&old);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 10000;
	struct radiance *r = radiance_connect(old.path, &o);
	assert_non_null(r);
	assert_int_equal(radiance_get_server_info(r)->max_request_layers, 0);
	uint32_t layers[2] = { 0, 1 };
	uint16_t x[384] = { 0 }, y0[384], y1[384];
	void *y[2] = { y0, y1 };
	expect_refusal(r, radiance_linear_multi(r, 1, layers, 2, 1, RADIANCE_BF16, x, y), -ENOTSUP,
		       "not supported by this daemon (radianced 0.1.0-old");
	expect_refusal(r, radiance_submit_multi(r, 1, layers, 2, 1, RADIANCE_BF16, x, y, NULL),
		       -ENOTSUP, "not supported by this daemon");
	assert_int_equal(radiance_get_error(r), 0);   /* not sticky: the session goes on */
	radiance_disconnect(r);
	raw_old_reap(&old);   /* nothing was sent after the handshake */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_multi_qkv, start, stop),
		cmocka_unit_test_setup_teardown(test_multi_async, start, stop),
		cmocka_unit_test_setup_teardown(test_multi_refused, start, stop),
		cmocka_unit_test(test_multi_old_daemon),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
