/*
 * Integration tests against the real radianced binary ($RADIANCED) on the
 * CPU backend: several client processes at once on the real checkpoint's
 * captured activations; load deduplication; the async API's contract; fd
 * and memory leak bounds over many sessions; SIGTERM.
 *
 * These are transport tests. The results are compared bit for bit with the
 * CPU kernel (kernels/w4a8_cpu.c, tests/reference.h) run here on the
 * locally loaded checkpoint, the same function the daemon's CPU backend
 * runs: a match proves the socket, the rings, the arena offsets, the
 * merging of requests and the result routing, not the numerics. The
 * numerics are checked against independent references elsewhere:
 * tests/test_numerics.c (a double-precision GEMM with its own e4m3
 * search), tests/test_numerics_ref.py (ml_dtypes and numpy), and
 * tests/python/test_numerics.py (the daemon's results against numpy).
 *
 * Each test gets its own daemon on a socket in a fresh mkdtemp directory
 * (per-test setup/teardown); the reference is computed once per binary.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon_harness.h"

static struct h_ref ref;
static struct h_daemon daemon_;
static char ckpt[512];

static int group_setup(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	double t = h_now();
	if (h_ref_load(&ref) < 0)
		return -1;
	fprintf(stderr, "reference: %zu layers in %.2f s\n", ref.n_layers, h_now() - t);
	return 0;
}

static int group_teardown(void **state)
{
	h_ref_free(&ref);
	return 0;
}

static int start(void **state)
{
	return h_daemon_start(&daemon_);
}

static int start_small_rows(void **state)
{
	static const char *const args[] = { "--max-rows", "16", "--sq-entries", "8", NULL };
	return h_daemon_start_argv(&daemon_, args);
}

static int start_preload(void **state)
{
	static const char *args[3] = { "--preload", ckpt, NULL };
	return h_daemon_start_argv(&daemon_, args);
}

static int stop(void **state)
{
	/* every test leaves a daemon that still runs and exits cleanly */
	return h_daemon_stop_clean(&daemon_);
}

static struct radiance *connect_named(const char *name)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = name;
	o.timeout_ms = 30000;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	if (!r)
		fprintf(stderr, "connect: %s\n", radiance_strerror(errno));
	return r;
}

/* --- several processes at once -------------------------------------------- */

/* One child's work: every captured layer synchronously, then all of them
 * again asynchronously with arena buffers (as many in flight as the CQ
 * allows). Returns the number of failures. */
static int child_run(int which, uint32_t expect_model)
{
	char name[32];
	snprintf(name, sizeof name, "test-child-%d", which);
	struct radiance *r = connect_named(name);
	if (!r)
		return 1;
	int fails = 0;
	uint32_t id;
	int rc = (which % 2) ? radiance_attach_model(r, ref.model_name, &id)
			     : radiance_load_model(r, ckpt, NULL, &id);
	if (rc < 0) {
		fprintf(stderr, "child %d: %s: %s\n", which, which % 2 ? "attach" : "load",
			radiance_error_message(r));
		radiance_disconnect(r);
		return 1;
	}
	if (id != expect_model) {
		fprintf(stderr, "child %d: model_id %u, the parent's is %u (not deduplicated)\n", which,
			id, expect_model);
		fails++;
	}
	enum radiance_elem dt = which == 2 ? RADIANCE_FP16 : RADIANCE_BF16;

	for (size_t i = 0; i < ref.n_layers; i++)
		if (h_check_layer(r, id, &ref.layers[i], dt, NULL) != 0)
			fails++;

	/* async: x and y of every layer in the arena, submitted back to back */
	const struct radiance_model_info *mi = radiance_held_model(r, id);
	size_t n = ref.n_layers;
	void **x = calloc(n, sizeof *x), **y = calloc(n, sizeof *y);
	int *layer = calloc(n, sizeof *layer);
	uint64_t *rid = calloc(n, sizeof *rid);
	for (size_t i = 0; i < n; i++) {
		const struct h_layer *hl = &ref.layers[i];
		layer[i] = radiance_find_layer(mi, hl->name);
		x[i] = radiance_arena_alloc(r, (size_t)hl->m * hl->k * 2);
		y[i] = radiance_arena_alloc(r, (size_t)hl->m * hl->n * 2);
		if (layer[i] < 0 || !x[i] || !y[i]) {
			fprintf(stderr, "child %d: arena/layer setup failed for %s\n", which, hl->name);
			fails++;
			goto out;
		}
		memcpy(x[i], dt == RADIANCE_BF16 ? hl->x_bf16 : hl->x_fp16, (size_t)hl->m * hl->k * 2);
		memset(y[i], 0xFF, (size_t)hl->m * hl->n * 2);
	}
	size_t submitted = 0, reaped = 0;
	while (reaped < n) {
		while (submitted < n) {
			const struct h_layer *hl = &ref.layers[submitted];
			rc = radiance_submit(r, id, (uint32_t)layer[submitted], hl->m, dt, x[submitted],
					     y[submitted], &rid[submitted]);
			if (rc == -EAGAIN)
				break;
			if (rc < 0) {
				fprintf(stderr, "child %d: submit: %s\n", which, radiance_error_message(r));
				fails++;
				goto out;
			}
			submitted++;
		}
		struct radiance_completion c;
		rc = radiance_wait(r, &c, 20000);
		if (rc != 1 || c.status != 0) {
			fprintf(stderr, "child %d: wait: %s / status %d %s\n", which, radiance_strerror(rc),
				rc == 1 ? c.status : 0, rc == 1 && c.error ? c.error : "");
			fails++;
			goto out;
		}
		size_t i = 0;
		while (i < submitted && rid[i] != c.request_id)
			i++;
		if (i == submitted) {
			fprintf(stderr, "child %d: completion for unknown id %llu\n", which,
				(unsigned long long)c.request_id);
			fails++;
			goto out;
		}
		const struct h_layer *hl = &ref.layers[i];
		if (h_compare_bf16(y[i], dt == RADIANCE_BF16 ? hl->ref_bf16 : hl->ref_fp16,
				   (size_t)hl->m * hl->n, NULL, NULL)) {
			fprintf(stderr, "child %d: async %s differs from the reference\n", which, hl->name);
			fails++;
		}
		reaped++;
	}
	if (radiance_in_flight(r) != 0)
		fails++;
out:
	for (size_t i = 0; i < n; i++) {
		radiance_arena_free(r, x[i]);
		radiance_arena_free(r, y[i]);
	}
	free(x);
	free(y);
	free(layer);
	free(rid);
	radiance_disconnect(r);
	return fails;
}

static void transport_several_clients_real_checkpoint(void **state)
{
	enum { CHILDREN = 3 };
	/* The parent loads first, so children that attach find the model. */
	struct radiance *r = connect_named("test-parent");
	assert_non_null(r);
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	const struct radiance_model_info *mi = radiance_held_model(r, id);
	assert_non_null(mi);
	assert_int_equal(mi->n_layers, ref.n_layers);
	assert_string_equal(mi->name, ref.model_name);

	pid_t pids[CHILDREN];
	fflush(NULL);
	for (int i = 0; i < CHILDREN; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			/* A handle is never used across fork: the child only
			 * frees its copy (closing its copies of the fds; the
			 * parent's session is untouched), then connects its
			 * own. Exit with the failure count. */
			radiance_disconnect(r);
			int fails = child_run(i, id);
			exit(fails > 100 ? 100 : fails);
		}
	}
	/* While they run, the daemon sees all the sessions. */
	struct radiance_stats_reply *st;
	assert_int_equal(radiance_get_stats(r, &st), 0);
	assert_true(st->global.sessions >= 1);
	radiance_stats_free(st);

	for (int i = 0; i < CHILDREN; i++) {
		int status;
		assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			fprintf(stderr, "child %d: status 0x%x\n", i, status);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	assert_int_equal(radiance_get_stats(r, &st), 0);
	/* 3 children x (sync + async) x every layer */
	assert_true(st->global.requests >= CHILDREN * 2 * ref.n_layers);
	assert_int_equal(st->global.errors, 0);
	radiance_stats_free(st);
	radiance_disconnect(r);
}

/* --- models --------------------------------------------------------------- */

/* The daemon notices a disconnect asynchronously: poll up to 2 s for the
 * model list (count models; users of the first) to settle at what we want. */
static void wait_models(struct radiance *r, size_t count, uint32_t users)
{
	struct radiance_model_list *l = NULL;
	for (int i = 0; i < 200; i++) {
		radiance_model_list_free(l);
		assert_int_equal(radiance_list_models(r, &l), 0);
		if (l->count == count && (count == 0 || l->models[0].users == users))
			break;
		h_sleep_ms(10);
	}
	assert_int_equal(l->count, count);
	if (count)
		assert_int_equal(l->models[0].users, users);
	radiance_model_list_free(l);
}

static void wait_sessions(struct radiance *r, uint32_t want)
{
	struct radiance_stats_reply *st = NULL;
	for (int i = 0; i < 200; i++) {
		radiance_stats_free(st);
		assert_int_equal(radiance_get_stats(r, &st), 0);
		if (st->global.sessions == want)
			break;
		h_sleep_ms(10);
	}
	assert_int_equal(st->global.sessions, want);
	radiance_stats_free(st);
}

static void load_twice_is_resident_once(void **state)
{
	struct radiance *a = connect_named("a"), *b = connect_named("b");
	assert_non_null(a);
	assert_non_null(b);
	uint32_t ida, idb;
	assert_int_equal(radiance_load_model(a, ckpt, NULL, &ida), 0);
	assert_int_equal(radiance_load_model(b, ckpt, NULL, &idb), 0);
	assert_int_equal(ida, idb);

	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(a, &l), 0);
	assert_int_equal(l->count, 1);
	assert_int_equal(l->models[0].model_id, ida);
	assert_int_equal(l->models[0].users, 2);
	assert_false(l->models[0].preloaded);
	assert_true(l->models[0].resident_bytes > 0);
	radiance_model_list_free(l);

	/* the full description, layers included, for anyone who asks */
	struct radiance_model_info *m;
	assert_int_equal(radiance_get_model(b, ida, &m), 0);
	assert_int_equal(m->n_layers, ref.n_layers);
	for (size_t i = 0; i < m->n_layers; i++) {
		const struct h_layer *hl = h_ref_find(&ref, m->layers[i].name);
		assert_non_null(hl);
		assert_int_equal(m->layers[i].n, hl->n);
		assert_int_equal(m->layers[i].k, hl->k);
		assert_int_equal(m->layers[i].index, i);
	}
	radiance_model_info_free(m);

	/* b leaves: one user; a releases: nobody holds it, it is unloaded */
	radiance_disconnect(b);
	wait_models(a, 1, 1);
	assert_int_equal(radiance_release_model(a, ida), 0);
	assert_null(radiance_held_model(a, ida));
	assert_int_equal(radiance_list_models(a, &l), 0);
	assert_int_equal(l->count, 0);
	radiance_model_list_free(l);
	/* releasing what we no longer hold is the daemon's ENOENT, not sticky */
	assert_int_equal(radiance_release_model(a, ida), -ENOENT);
	assert_int_equal(radiance_get_error(a), 0);
	radiance_disconnect(a);
}

/* Copies the checkpoint to dir/minilm-w4g128 with one bias value changed:
 * another checkpoint with the same directory name. */
static void make_modified_copy(const char *dir, char *out, size_t n)
{
	char cmd[4096];
	snprintf(out, n, "%s/" H_CHECKPOINT, dir);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/config.json '%s'/quantization_config.json "
		 "'%s'/model.safetensors '%s'/", out, ckpt, ckpt, ckpt, out);
	assert_int_equal(system(cmd), 0);
	char path[1024];
	snprintf(path, sizeof path, "%s/model.safetensors", out);
	FILE *f = fopen(path, "r+b");
	assert_non_null(f);
	uint64_t hlen;
	assert_int_equal(fread(&hlen, 8, 1, f), 1);
	char *hdr = calloc(1, hlen + 1);
	assert_int_equal(fread(hdr, 1, hlen, f), hlen);
	json_t *j = json_loads(hdr, 0, NULL);
	assert_non_null(j);
	json_t *t = json_object_get(j, "encoder.layer.0.attention.self.query.bias");
	json_int_t begin = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
	uint16_t one = 0x3C00;   /* fp16 1.0 */
	assert_int_equal(fseek(f, (long)(8 + hlen + (uint64_t)begin), SEEK_SET), 0);
	assert_int_equal(fwrite(&one, 2, 1, f), 1);
	fclose(f);
	json_decref(j);
	free(hdr);
}

/* Two different checkpoints that happen to share a name (here: the same
 * directory name, the library's default) must not be served as one: the
 * daemon dedupes by file identity only, and refuses the name clash with
 * -EEXIST (not sticky). Under another name the copy loads as its own model,
 * with its own bias; the original's files under another name attach to the
 * original, which keeps its name. */
static void same_name_other_checkpoint(void **state)
{
	char other[256];
	make_modified_copy(daemon_.dir, other, sizeof other);
	struct radiance *a = connect_named("orig"), *b = connect_named("copy");
	assert_non_null(a);
	assert_non_null(b);
	uint32_t ida, idb;
	assert_int_equal(radiance_load_model(a, ckpt, NULL, &ida), 0);
	assert_int_equal(radiance_load_model(b, other, NULL, &idb), -EEXIST);
	assert_int_equal(radiance_get_error(b), 0);
	assert_non_null(strstr(radiance_error_message(b), "load this one under another name"));
	assert_null(radiance_held_model(b, ida));

	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.name = "minilm-modified";
	assert_int_equal(radiance_load_model(b, other, &lo, &idb), 0);
	assert_int_not_equal(idb, ida);
	assert_string_equal(radiance_held_model(b, idb)->name, "minilm-modified");
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	fprintf(stderr, "the copy has its own bias, so it must differ from the reference:\n");
	assert_true(h_check_layer(b, idb, hl, RADIANCE_BF16, NULL) > 0);

	uint32_t idc;
	lo.name = "another-name";
	assert_int_equal(radiance_load_model(b, ckpt, &lo, &idc), 0);
	assert_int_equal(idc, ida);
	assert_string_equal(radiance_held_model(b, idc)->name, ref.model_name);
	assert_int_equal(h_check_layer(b, idc, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(a);
	radiance_disconnect(b);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%.256s'", other);
	assert_int_equal(system(cmd), 0);
}

static void attach_and_errors_are_not_sticky(void **state)
{
	struct radiance *r = connect_named("attach");
	assert_non_null(r);
	uint32_t id;
	assert_int_equal(radiance_attach_model(r, "no-such-model", &id), -ENOENT);
	assert_int_equal(radiance_get_error(r), 0);
	assert_true(strlen(radiance_error_message(r)) > 0);
	assert_int_equal(radiance_load_model(r, "/nonexistent", NULL, &id), -ENOENT);
	struct radiance_model_info *m;
	assert_int_equal(radiance_get_model(r, 4242, &m), -ENOENT);
	assert_null(m);
	/* ... and the handle still works */
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.3.attention.self.key");
	assert_non_null(hl);
	assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(r);
}

static void preloaded_model(void **state)
{
	struct radiance *r = connect_named("preload");
	assert_non_null(r);
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), 0);
	assert_int_equal(l->count, 1);
	assert_true(l->models[0].preloaded);
	assert_int_equal(l->models[0].users, 0);
	radiance_model_list_free(l);
	uint32_t id;
	assert_int_equal(radiance_attach_model(r, ref.model_name, &id), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.1.output.dense");
	assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
	/* a load of the same files attaches to the preloaded copy */
	uint32_t id2;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id2), 0);
	assert_int_equal(id2, id);
	radiance_disconnect(r);
	/* nobody holds it now, and it stays: preloaded */
	r = connect_named("preload-2");
	wait_models(r, 1, 0);
	/* a double release is an error and never touches the daemon's hold */
	assert_int_equal(radiance_attach_model(r, ref.model_name, &id), 0);
	assert_int_equal(radiance_release_model(r, id), 0);
	assert_int_equal(radiance_release_model(r, id), -ENOENT);
	wait_models(r, 1, 0);
	/* the explicit unload drops it (the tests run as root) ... */
	assert_int_equal(radiance_unload_preloaded(r, id), 0);
	wait_models(r, 0, 0);
	/* ... and there is nothing left to unload */
	assert_int_equal(radiance_unload_preloaded(r, id), -ENOENT);
	radiance_disconnect(r);
}

/* --- the data-plane API contract ------------------------------------------ */

static void async_api_contract(void **state)
{
	/* daemon: --max-rows 16 --sq-entries 8 */
	struct radiance *r = connect_named("contract");
	assert_non_null(r);
	assert_int_equal(radiance_get_server_info(r)->max_rows, 16);
	assert_string_equal(radiance_get_server_info(r)->backend,
			    h_env("RADIANCE_TEST_BACKEND", "cpu"));
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	struct radiance_completion c;
	assert_int_equal(radiance_poll(r, &c), 0);
	assert_int_equal(radiance_wait(r, &c, 0), -ENOENT);   /* nothing in flight */

	assert_int_equal(radiance_open_rings(r), 0);
	struct radiance_ring_info ri;
	assert_int_equal(radiance_get_ring_info(r, &ri), 0);
	assert_int_equal(ri.sq_entries, 8);
	assert_true(ri.cq_entries >= 8);
	assert_true(ri.arena_bytes > 0);

	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	int layer = radiance_find_layer(radiance_held_model(r, id), hl->name);
	assert_true(layer >= 0);
	uint16_t *x = radiance_arena_alloc(r, 16 * 384 * 2);
	uint16_t *y = radiance_arena_alloc(r, 16 * 384 * 2);
	assert_non_null(x);
	assert_non_null(y);
	memcpy(x, hl->x_bf16, 16 * 384 * 2);
	uint16_t stack_buf[384];

	/* refused before reaching the ring */
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 0, RADIANCE_BF16, x, y, NULL), -EINVAL);
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 17, RADIANCE_BF16, x, y, NULL), -EINVAL);
	assert_int_equal(radiance_submit(r, id, 999, 1, RADIANCE_BF16, x, y, NULL), -ENOENT);
	assert_non_null(strstr(radiance_error_message(r), "layer 999 is out of range"));
	assert_int_equal(radiance_submit(r, id + 77, (uint32_t)layer, 1, RADIANCE_BF16, x, y, NULL),
			 -ENOENT);
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 1, RADIANCE_BF16, stack_buf, y, NULL),
			 -EFAULT);
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 1, RADIANCE_BF16, x + 1, y, NULL),
			 -EINVAL);
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 1, (enum radiance_elem)9, x, y, NULL),
			 -EINVAL);
	uint8_t *end = (uint8_t *)ri.arena + ri.arena_bytes;
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 16, RADIANCE_BF16, x,
					 (void *)(end - 16 * 384 * 2 + 16), NULL),
			 -EFAULT);
	assert_int_equal(radiance_get_error(r), 0);

	/* fill the CQ: the (cq_entries + 1)th submit is EAGAIN, never sent */
	uint64_t first = 0, rid;
	unsigned n = 0;
	int rc;
	while ((rc = radiance_submit(r, id, (uint32_t)layer, 1, RADIANCE_BF16, x, y, &rid)) == 0) {
		if (!n)
			first = rid;
		else
			assert_int_equal(rid, first + n);   /* ids increase by one */
		n++;
		assert_true(n <= ri.cq_entries);
	}
	assert_int_equal(rc, -EAGAIN);
	assert_int_equal(n, ri.cq_entries);
	assert_int_equal(radiance_in_flight(r), n);
	assert_int_equal(radiance_release_model(r, id), -EBUSY);
	/* a synchronous linear meanwhile makes room, and keeps the others'
	 * completions for wait */
	uint16_t yy[2 * 384];
	assert_int_equal(radiance_linear(r, id, (uint32_t)layer, 2, RADIANCE_BF16, hl->x_bf16, yy), 0);
	assert_int_equal(h_compare_bf16(yy, hl->ref_bf16, 2 * 384, NULL, NULL), 0);
	unsigned got = 0;
	while (radiance_in_flight(r) || got < n) {
		rc = radiance_wait(r, &c, 10000);
		assert_int_equal(rc, 1);
		assert_int_equal(c.status, 0);
		assert_null(c.error);
		assert_true(c.request_id >= first && c.request_id < first + n);
		got++;
	}
	assert_int_equal(got, n);
	assert_int_equal(radiance_wait(r, &c, 0), -ENOENT);

	/* Completions left unreaped do not limit submissions (only requests
	 * in the daemon do): fill the CQ, let a sync linear set all of them
	 * aside, fill it again, and again; then reap every one. */
	for (int round = 0; round < 3; round++) {
		for (unsigned i = 0; i < ri.cq_entries; i++)
			assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 1, RADIANCE_BF16, x, y, NULL), 0);
		assert_int_equal(radiance_linear(r, id, (uint32_t)layer, 2, RADIANCE_BF16, hl->x_bf16, yy), 0);
		assert_int_equal(radiance_in_flight(r), (round + 1u) * ri.cq_entries);
	}
	assert_int_equal(radiance_in_flight(r), 3 * ri.cq_entries);
	got = 0;
	while ((rc = radiance_wait(r, &c, 10000)) == 1) {
		assert_int_equal(c.status, 0);
		got++;
	}
	assert_int_equal(rc, -ENOENT);
	assert_int_equal(got, 3 * ri.cq_entries);
	assert_int_equal(radiance_in_flight(r), 0);
	/* every result is row 0 of the layer's reference (all used x row 0) */
	assert_int_equal(h_compare_bf16(y, hl->ref_bf16, 384, NULL, NULL), 0);

	/* radiance_linear splits M=36 > max_rows=16 into 16+16+4 */
	size_t mn = (size_t)hl->m * hl->n;
	uint16_t *yl = malloc(mn * 2);
	assert_int_equal(radiance_linear(r, id, (uint32_t)layer, hl->m, RADIANCE_BF16, hl->x_bf16, yl), 0);
	assert_int_equal(h_compare_bf16(yl, hl->ref_bf16, mn, NULL, NULL), 0);
	free(yl);

	/* a failed request: status in the completion, not sticky. The
	 * daemon refuses overlapping x and y. */
	assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 1, RADIANCE_BF16, x, x, &rid), 0);
	assert_int_equal(radiance_wait(r, &c, 10000), 1);
	assert_int_equal(c.request_id, rid);
	assert_int_equal(c.status, -EINVAL);
	assert_non_null(c.error);
	assert_int_equal(radiance_get_error(r), 0);

	radiance_arena_free(r, x);
	radiance_arena_free(r, y);
	assert_int_equal(radiance_release_model(r, id), 0);
	assert_int_equal(radiance_linear(r, id, (uint32_t)layer, 1, RADIANCE_BF16, hl->x_bf16, yy),
			 -ENOENT);
	radiance_disconnect(r);
}

static void stats_count_requests(void **state)
{
	struct radiance *r = connect_named("stats");
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.4.attention.output.dense");
	for (int i = 0; i < 5; i++)
		assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
	struct radiance_stats_reply *st;
	assert_int_equal(radiance_get_stats(r, &st), 0);
	assert_int_equal(st->session.requests, 5);
	assert_int_equal(st->session.rows, 5 * hl->m);
	assert_int_equal(st->session.bytes_in, 5ull * hl->m * hl->k * 2);
	assert_int_equal(st->session.bytes_out, 5ull * hl->m * hl->n * 2);
	assert_int_equal(st->session.errors, 0);
	assert_true(st->session.latency_p50_ns > 0);
	assert_true(st->session.latency_p99_ns >= st->session.latency_p50_ns);
	assert_true(st->session.latency_max_ns >= st->session.latency_p99_ns);
	assert_int_equal(st->global.sessions, 1);
	assert_true(st->global.uptime_ns > 0);
	radiance_stats_free(st);
	radiance_disconnect(r);
}

/* --- lifetimes ------------------------------------------------------------ */

static void no_leaks_over_many_sessions(void **state)
{
	/* A session holding a model keeps it resident across the cycles, so
	 * loads below are attachments (the cheap path we want to cycle). */
	struct radiance *holder = connect_named("holder");
	uint32_t id;
	assert_int_equal(radiance_load_model(holder, ckpt, NULL, &id), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");

	int fds0 = 0, self0 = h_count_fds(getpid());
	long rss0 = 0;
	for (int i = 0; i < 220; i++) {
		if (i == 20) {   /* after warm-up: allocator pools, lazily built state */
			fds0 = h_count_fds(daemon_.pid);
			rss0 = h_rss_kib(daemon_.pid);
		}
		struct radiance_options o = RADIANCE_OPTIONS_INIT;
		o.arena_bytes = 1 << 20;
		struct radiance *r = radiance_connect(daemon_.socket, &o);
		assert_non_null(r);
		assert_int_equal(radiance_open_rings(r), 0);
		if (i % 10 == 0) {   /* some cycles also load and compute */
			uint32_t mid;
			assert_int_equal(radiance_load_model(r, ckpt, NULL, &mid), 0);
			assert_int_equal(mid, id);
			assert_int_equal(h_check_layer(r, mid, hl, RADIANCE_BF16, NULL), 0);
		}
		radiance_disconnect(r);
	}
	/* the daemon notices the last disconnects asynchronously */
	int fds1 = -1;
	for (int t = 0; t < 200; t++) {
		fds1 = h_count_fds(daemon_.pid);
		if (fds1 <= fds0)
			break;
		h_sleep_ms(10);
	}
	long rss1 = h_rss_kib(daemon_.pid);
	fprintf(stderr, "daemon fds %d -> %d, VmRSS %ld -> %ld KiB over 200 sessions\n", fds0, fds1,
		rss0, rss1);
	assert_true(fds0 > 0);
	assert_true(fds1 <= fds0);
	/* and the library closed every fd it opened in this process */
	assert_int_equal(h_count_fds(getpid()), self0);
	/* 200 sessions with 1 MiB arenas: a leak of one arena each would be
	 * 200 MiB; allow a few MiB of allocator noise */
	assert_true(rss1 - rss0 < 16 * 1024);

	wait_sessions(holder, 1);
	radiance_disconnect(holder);
}

static void sigterm_exits_cleanly(void **state)
{
	struct radiance *r = connect_named("sigterm");
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	assert_int_equal(radiance_open_rings(r), 0);
	assert_int_equal(kill(daemon_.pid, SIGTERM), 0);
	assert_int_equal(h_daemon_wait(&daemon_, 10.0), 1);
	assert_true(WIFEXITED(daemon_.exit_status));
	assert_int_equal(WEXITSTATUS(daemon_.exit_status), 0);
	assert_int_equal(access(daemon_.socket, F_OK), -1);   /* socket removed */
	/* the client learns the daemon stopped and why, and that sticks */
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	uint16_t y[384];
	int rc = radiance_linear(r, id, 0, 1, RADIANCE_BF16, hl->x_bf16, y);
	assert_int_equal(rc, -ESHUTDOWN);
	assert_int_equal(radiance_get_error(r), -ESHUTDOWN);
	assert_string_equal(radiance_error_message(r), "daemon stopping: SIGTERM");
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), -ESHUTDOWN);
	radiance_disconnect(r);
}

/* 'T' once the kernel has stopped pid (SIGSTOP delivered). */
static int process_state(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : -1;
}

/* SIGSTOP, and wait until the daemon really is stopped: from here nothing
 * it was sent runs before SIGCONT. */
static void daemon_freeze(void)
{
	assert_int_equal(kill(daemon_.pid, SIGSTOP), 0);
	for (int t = 0; t < 500 && process_state(daemon_.pid) != 'T'; t++)
		h_sleep_ms(2);
	assert_int_equal(process_state(daemon_.pid), 'T');
}

/* Requests of the FFN's first layer (the largest) on its captured rows:
 * one input x in the arena, n outputs y[i] (0xff-filled), for a drain that
 * takes a while. */
struct ffn_batch {
	const struct h_layer *hl;
	uint32_t layer;
	size_t yb;
	uint16_t *x;
};

static void ffn_batch_init(struct ffn_batch *b, struct radiance *r, uint32_t id, uint16_t **y,
			   int n)
{
	b->hl = h_ref_find(&ref, "encoder.layer.0.intermediate.dense");
	assert_non_null(b->hl);
	int layer = radiance_find_layer(radiance_held_model(r, id), b->hl->name);
	assert_true(layer >= 0);
	b->layer = (uint32_t)layer;
	size_t xb = (size_t)b->hl->m * b->hl->k * 2;
	b->yb = (size_t)b->hl->m * b->hl->n * 2;
	b->x = radiance_arena_alloc(r, xb);
	assert_non_null(b->x);
	memcpy(b->x, b->hl->x_bf16, xb);
	for (int i = 0; i < n; i++) {
		y[i] = radiance_arena_alloc(r, b->yb);
		assert_non_null(y[i]);
		memset(y[i], 0xff, b->yb);
	}
}

static void ffn_batch_submit(const struct ffn_batch *b, struct radiance *r, uint32_t id,
			     uint16_t **y, uint64_t *ids, int n)
{
	for (int i = 0; i < n; i++) {
		memset(y[i], 0xff, b->yb);
		assert_int_equal(radiance_submit(r, id, b->layer, b->hl->m, RADIANCE_BF16, b->x, y[i],
						 &ids[i]), 0);
	}
}

/* Requests still in the SQ when SIGTERM comes are run, and every result
 * reaches the client before the Goodbye: the daemon is frozen (SIGSTOP)
 * while the client fills the SQ, so nothing has run when the stop begins. */
static void sigterm_delivers_drained_results(void **state)
{
	enum { N = 64 };
	struct radiance *r = connect_named("drained");
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	assert_int_equal(radiance_open_rings(r), 0);
	struct ffn_batch b;
	uint16_t *y[N];
	uint64_t ids[N];
	ffn_batch_init(&b, r, id, y, N);
	const struct h_layer *hl = b.hl;

	daemon_freeze();
	ffn_batch_submit(&b, r, id, y, ids, N);
	assert_int_equal(kill(daemon_.pid, SIGTERM), 0);
	assert_int_equal(kill(daemon_.pid, SIGCONT), 0);

	/* every request completes, in order, with the reference's values */
	for (int i = 0; i < N; i++) {
		struct radiance_completion c;
		int rc = radiance_wait(r, &c, 20000);
		if (rc != 1)
			fprintf(stderr, "completion %d of %d: %s (%s)\n", i, N, radiance_strerror(rc),
				radiance_error_message(r));
		assert_int_equal(rc, 1);
		assert_int_equal(c.status, 0);
		assert_true(c.request_id == ids[i]);
		size_t exact;
		double ulps;
		assert_int_equal(h_compare_bf16(y[i], hl->ref_bf16, (size_t)hl->m * hl->n, &exact,
						&ulps), 0);
	}
	/* nothing is owed any more; the next call learns why, and it sticks */
	assert_int_equal(radiance_in_flight(r), 0);
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), -ESHUTDOWN);
	assert_string_equal(radiance_error_message(r), "daemon stopping: SIGTERM");
	struct radiance_completion c;
	assert_int_equal(radiance_wait(r, &c, 20000), -ESHUTDOWN);
	assert_int_equal(h_daemon_wait(&daemon_, 20.0), 1);
	assert_true(WIFEXITED(daemon_.exit_status));
	assert_int_equal(WEXITSTATUS(daemon_.exit_status), 0);
	radiance_disconnect(r);
}

/* radiance_reconnect() against a daemon that is restarted: the client's
 * path is a symlink, repointed from the first daemon's socket to the
 * second's, as a restart at one path looks to a client. */
static void reconnect_after_restart(void **state)
{
	enum { N = 3 };
	char link[192];
	snprintf(link, sizeof link, "%s/link.sock", daemon_.dir);
	assert_int_equal(symlink(daemon_.socket, link), 0);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "reconnect";
	o.timeout_ms = 30000;
	o.connect_timeout_ms = -1;   /* the failed reconnect below: at once */
	struct radiance *r = radiance_connect(link, &o);
	assert_non_null(r);
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	char *name = strdup(radiance_held_model(r, id)->name);
	uint64_t session0 = radiance_get_server_info(r)->session_id;
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	int layer = radiance_find_layer(radiance_held_model(r, id), hl->name);
	assert_true(layer >= 0);
	uint16_t *x = radiance_arena_alloc(r, 384 * 2), *y = radiance_arena_alloc(r, 384 * 2);
	assert_non_null(x);
	assert_non_null(y);
	memcpy(x, hl->x_bf16, 384 * 2);

	/* requests that never complete: the daemon is frozen, then killed */
	daemon_freeze();
	uint64_t ids[N];
	for (int i = 0; i < N; i++)
		assert_int_equal(radiance_submit(r, id, (uint32_t)layer, 1, RADIANCE_BF16, x, y,
						 &ids[i]), 0);
	assert_int_equal(kill(daemon_.pid, SIGKILL), 0);
	assert_int_equal(h_daemon_wait(&daemon_, 10.0), 1);
	daemon_.exit_status = -1;   /* killed on purpose: no log dump */
	struct radiance_completion c;
	assert_int_equal(radiance_wait(r, &c, 10000), -ECONNRESET);

	/* nobody listens yet: the reconnect fails, clearly, and may be retried */
	int rc = radiance_reconnect(r);
	assert_int_equal(rc, -ECONNREFUSED);
	assert_int_equal(radiance_get_error(r), -ECONNREFUSED);
	assert_non_null(strstr(radiance_error_message(r), link));

	struct h_daemon again;
	const char *args[] = { "--preload", ckpt, NULL };
	assert_int_equal(h_daemon_start_argv(&again, args), 0);
	assert_int_equal(unlink(link), 0);
	assert_int_equal(symlink(again.socket, link), 0);
	rc = radiance_reconnect(r);
	if (rc < 0)
		fprintf(stderr, "reconnect: %s\n", radiance_error_message(r));
	assert_int_equal(rc, 0);
	assert_int_equal(radiance_get_error(r), 0);
	assert_true(radiance_get_server_info(r)->session_id != 0);
	(void)session0;

	/* each request of the old session fails, by id, saying why */
	assert_int_equal(radiance_in_flight(r), N);
	for (int i = 0; i < N; i++) {
		assert_int_equal(radiance_wait(r, &c, 0), 1);
		assert_true(c.request_id == ids[i]);
		assert_int_equal(c.status, -ECANCELED);
		assert_non_null(strstr(c.error, "in flight when radiance_reconnect() replaced the "
				       "session (the daemon closed the connection)"));
		assert_non_null(strstr(c.error, "resubmit"));
	}
	assert_int_equal(radiance_in_flight(r), 0);
	assert_int_equal(radiance_wait(r, &c, 0), -ENOENT);

	/* the model is held again, by name, and computes the reference */
	uint32_t id2;
	assert_int_equal(radiance_attach_model(r, name, &id2), 0);
	assert_non_null(radiance_held_model(r, id2));
	assert_int_equal(h_check_layer(r, id2, hl, RADIANCE_BF16, NULL), 0);
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), 0);
	assert_int_equal(l->count, 1);
	assert_int_equal(l->models[0].users, 1);   /* one reference, ours */
	radiance_model_list_free(l);

	radiance_disconnect(r);
	free(name);
	assert_int_equal(h_daemon_stop(&again), 0);
}

/* Waits for fd in a real poll() loop, dispatches, and takes what is ready:
 * marks each completion in seen[] (by index into ids) after checking its
 * output y[i] against the reference. Returns radiance_dispatch()'s last
 * negative code once *got reaches want or dispatch fails. */
static int loop_collect(struct radiance *r, int fd, const uint64_t *ids, uint16_t *const *y,
			int n, const struct h_layer *hl, int *seen, int *got, int want)
{
	int wakeups = 0;
	while (*got < want) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int k = poll(&p, 1, 20000);
		assert_int_equal(k, 1);   /* a wake-up, not the 20 s bound */
		wakeups++;
		int ready = radiance_dispatch(r);
		if (ready < 0)
			return ready;
		struct radiance_completion c;
		int got_now = 0;
		while (radiance_poll(r, &c) == 1) {
			int i = 0;
			while (i < n && ids[i] != c.request_id)
				i++;
			assert_true(i < n);
			assert_int_equal(seen[i], 0);
			assert_int_equal(c.status, 0);
			size_t exact;
			double ulps;
			assert_int_equal(h_compare_bf16(y[i], hl->ref_bf16, (size_t)hl->m * hl->n,
							&exact, &ulps), 0);
			seen[i] = 1;
			got_now++;
		}
		/* dispatch counted what was ready then; poll also takes what
		 * completed since (a slow machine or a sanitizer makes that
		 * window wide) */
		assert_true(got_now >= ready);
		*got += got_now;
	}
	fprintf(stderr, "%d completions in %d wake-ups\n", want, wakeups);
	return 0;
}

/* radiance_get_fd() in a caller's own poll() loop with radiance_dispatch():
 * completions wake it, nothing else does, and a SIGTERM's drained results
 * come before the Goodbye's -ESHUTDOWN. */
static void event_loop_integration(void **state)
{
	enum { N = 16 };
	struct radiance *r = connect_named("loop");
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	int fd = radiance_get_fd(r);   /* before the rings exist: they join later */
	assert_true(fd >= 0);
	struct ffn_batch b;
	uint16_t *y[N];
	uint64_t ids[N];
	ffn_batch_init(&b, r, id, y, N);   /* opens the rings */
	const struct h_layer *hl = b.hl;
	assert_int_equal(radiance_get_fd(r), fd);   /* one fd for the handle's life */

	/* idle: the fd is not readable */
	struct pollfd p = { .fd = fd, .events = POLLIN };
	assert_int_equal(radiance_dispatch(r), 0);
	assert_int_equal(poll(&p, 1, 0), 0);

	int seen[N] = { 0 }, got = 0;
	ffn_batch_submit(&b, r, id, y, ids, N);
	assert_int_equal(loop_collect(r, fd, ids, y, N, hl, seen, &got, N), 0);
	assert_int_equal(radiance_in_flight(r), 0);
	/* everything taken: a dispatch finds nothing and re-arms, and the fd is
	 * quiet again (radiance_poll may have taken the last completions
	 * before their doorbell was read) */
	assert_int_equal(radiance_dispatch(r), 0);
	assert_int_equal(poll(&p, 1, 0), 0);

	/* a stop with requests queued: their results, then -ESHUTDOWN */
	memset(seen, 0, sizeof seen);
	got = 0;
	daemon_freeze();
	ffn_batch_submit(&b, r, id, y, ids, N);
	assert_int_equal(kill(daemon_.pid, SIGTERM), 0);
	assert_int_equal(kill(daemon_.pid, SIGCONT), 0);
	int rc = loop_collect(r, fd, ids, y, N, hl, seen, &got, N + 1);
	assert_int_equal(got, N);
	assert_int_equal(rc, -ESHUTDOWN);
	assert_string_equal(radiance_error_message(r), "daemon stopping: SIGTERM");
	assert_int_equal(h_daemon_wait(&daemon_, 20.0), 1);
	assert_int_equal(WEXITSTATUS(daemon_.exit_status), 0);
	radiance_disconnect(r);
}

static int stop_after_sigterm(void **state)
{
	h_daemon_stop(&daemon_);   /* already exited: only removes the directory */
	return 0;
}

static void daemon_death_ends_waits(void **state)
{
	struct radiance *r = connect_named("orphan");
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	assert_int_equal(radiance_open_rings(r), 0);
	kill(daemon_.pid, SIGKILL);
	assert_int_equal(h_daemon_wait(&daemon_, 10.0), 1);
	daemon_.exit_status = -1;   /* killed on purpose: no log dump */
	/* a request that will never complete: the wait must see the socket
	 * close rather than sleep on the doorbell forever */
	uint16_t *x = radiance_arena_alloc(r, 384 * 2), *y = radiance_arena_alloc(r, 384 * 2);
	memset(x, 0, 384 * 2);
	assert_int_equal(radiance_submit(r, id, 0, 1, RADIANCE_BF16, x, y, NULL), 0);
	struct radiance_completion c;
	double t = h_now();
	assert_int_equal(radiance_wait(r, &c, -1), -ECONNRESET);
	assert_true(h_now() - t < 5.0);
	radiance_disconnect(r);
}

/* --- one handle, two threads ------------------------------------------------ */

/* Hanging is what used to happen (both threads blocked in radiance_linear
 * for ever): bound the test, and leave no daemon behind if it hangs. */
static void on_alarm(int sig)
{
	static const char msg[] = "test_daemon: a call on one handle from two threads hung "
				  "(SIGALRM after 120 s)\n";
	if (write(2, msg, sizeof msg - 1) < 0) {
		/* nothing more to do in a signal handler */
	}
	if (daemon_.pid > 0)
		kill(daemon_.pid, SIGKILL);
	_exit(1);
}

static void bound_test(unsigned seconds)
{
	signal(SIGALRM, on_alarm);
	alarm(seconds);
}

#define BUSY_RULE "radiance handle used by two threads at once: a handle is not thread-safe; " \
		  "use one per thread or lock"

struct in_use {
	struct radiance *r;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int loading, tried;
	int list_rc, linear_rc, alloc_errno;
	char list_msg[256];
};

/* The first progress report: the loader's thread is inside
 * radiance_load_model; hold it there until the other thread has tried. */
static void progress_waits(void *user, uint64_t done, uint64_t total)
{
	struct in_use *u = user;
	pthread_mutex_lock(&u->lock);
	if (!u->loading) {
		u->loading = 1;
		pthread_cond_broadcast(&u->cond);
		while (!u->tried)
			pthread_cond_wait(&u->cond, &u->lock);
	}
	pthread_mutex_unlock(&u->lock);
}

static void *try_while_loading(void *arg)
{
	struct in_use *u = arg;
	pthread_mutex_lock(&u->lock);
	while (!u->loading)
		pthread_cond_wait(&u->cond, &u->lock);
	pthread_mutex_unlock(&u->lock);
	struct radiance_model_list *l = NULL;
	u->list_rc = radiance_list_models(u->r, &l);
	snprintf(u->list_msg, sizeof u->list_msg, "%s", radiance_error_message(u->r));
	radiance_model_list_free(l);
	uint16_t x[384] = { 0 }, y[384];
	u->linear_rc = radiance_linear(u->r, 1, 0, 1, RADIANCE_BF16, x, y);
	errno = 0;
	if (!radiance_arena_alloc(u->r, 64))
		u->alloc_errno = errno;
	pthread_mutex_lock(&u->lock);
	u->tried = 1;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	return NULL;
}

/* A call made while another thread is inside one on the same handle fails
 * at once with -EBUSY and the rule, touching nothing; the handle goes on
 * working for the thread that had it. */
static void handle_in_use_is_ebusy(void **state)
{
	bound_test(120);
	struct in_use u = { .r = connect_named("two-threads") };
	assert_non_null(u.r);
	pthread_mutex_init(&u.lock, NULL);
	pthread_cond_init(&u.cond, NULL);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, try_while_loading, &u), 0);
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.progress = progress_waits;
	lo.progress_user = &u;
	uint32_t id;
	int rc = radiance_load_model(u.r, ckpt, &lo, &id);
	pthread_mutex_lock(&u.lock);
	u.loading = 1;   /* a load without progress reports would leave it waiting */
	pthread_cond_broadcast(&u.cond);
	pthread_mutex_unlock(&u.lock);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(rc, 0);
	assert_int_equal(u.list_rc, -EBUSY);
	if (!strstr(u.list_msg, "radiance_list_models: " BUSY_RULE))
		fail_msg("message: %s", u.list_msg);
	assert_int_equal(u.linear_rc, -EBUSY);
	assert_int_equal(u.alloc_errno, EBUSY);
	assert_int_equal(radiance_get_error(u.r), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	assert_int_equal(h_check_layer(u.r, id, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(u.r);
	pthread_cond_destroy(&u.cond);
	pthread_mutex_destroy(&u.lock);
	alarm(0);
}

struct hammer {
	struct radiance *r;
	uint32_t model_id;
	const struct h_layer *hl;
	int layer;
	int ok, busy, bad;
};

/* radiance_linear until 20 calls succeeded; each returns 0 with results
 * that match the reference, or -EBUSY with the rule. */
static void *hammer(void *arg)
{
	struct hammer *h = arg;
	size_t mn = (size_t)h->hl->m * h->hl->n;
	uint16_t *y = malloc(mn * 2);
	while (h->ok < 20 && h->bad == 0) {
		int rc = radiance_linear(h->r, h->model_id, (uint32_t)h->layer, h->hl->m,
					 RADIANCE_BF16, h->hl->x_bf16, y);
		if (rc == 0 && h_compare_bf16(y, h->hl->ref_bf16, mn, NULL, NULL) == 0) {
			h->ok++;
		} else if (rc == -EBUSY && strstr(radiance_error_message(h->r), BUSY_RULE)) {
			h->busy++;
			h_sleep_ms(1);   /* let the other thread finish its call */
		} else {
			fprintf(stderr, "%s: rc %d: %s\n", h->hl->name, rc,
				rc == 0 ? "wrong results" : radiance_strerror(rc));
			h->bad++;
		}
	}
	free(y);
	return NULL;
}

static void two_threads_hammer_one_handle(void **state)
{
	bound_test(120);
	struct radiance *r = connect_named("hammer");
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	const char *names[2] = { "encoder.layer.0.attention.self.query",
				 "encoder.layer.2.intermediate.dense" };
	struct hammer h[2];
	pthread_t t[2];
	for (int i = 0; i < 2; i++) {
		h[i] = (struct hammer){ .r = r, .model_id = id, .hl = h_ref_find(&ref, names[i]) };
		assert_non_null(h[i].hl);
		h[i].layer = radiance_find_layer(radiance_held_model(r, id), names[i]);
		assert_true(h[i].layer >= 0);
	}
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&t[i], NULL, hammer, &h[i]), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	fprintf(stderr, "two threads: %d+%d calls served, %d+%d refused with EBUSY\n", h[0].ok,
		h[1].ok, h[0].busy, h[1].busy);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(h[i].bad, 0);
		assert_int_equal(h[i].ok, 20);
	}
	assert_int_equal(radiance_get_error(r), 0);
	assert_int_equal(radiance_in_flight(r), 0);
	radiance_disconnect(r);
	alarm(0);
}

/* --- start-up: the socket's directory, a preload's name --------------------- */


/* docs/daemon.md: the daemon creates the socket's own directory (0755 less
 * the umask, owned by its user), leaves it at exit, and creates no other:
 * with two levels missing it names the missing one. */
static void socket_directory(void **state)
{
	char base[64] = "/tmp/radiance-sockdir-XXXXXX";
	assert_non_null(mkdtemp(base));
	char log[128], sock[160], sub[128];
	snprintf(log, sizeof log, "%s/radianced.log", base);
	snprintf(sub, sizeof sub, "%s/new", base);
	snprintf(sock, sizeof sock, "%s/r.sock", sub);
	pid_t pid = h_spawn_logged(log, (const char *const[]){ "--socket", sock, NULL });
	int fd = -1;
	for (int i = 0; i < 1000 && (fd = h_try_connect(sock)) < 0; i++)
		h_sleep_ms(10);
	if (fd < 0)
		h_show_file(log);
	assert_true(fd >= 0);
	close(fd);
	struct stat st;
	assert_int_equal(stat(sub, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0755);
	assert_int_equal(st.st_uid, geteuid());
	assert_int_equal(h_count_lines(log, "created "), 1);
	assert_int_equal(kill(pid, SIGTERM), 0);
	int status = h_wait_exit(pid, 20.0);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(access(sock, F_OK), -1);   /* the socket goes ... */
	assert_int_equal(stat(sub, &st), 0);        /* ... its directory stays */

	/* two levels missing: exit 1, naming the directory that is missing */
	char deep[160], want[512], missing[128];
	snprintf(missing, sizeof missing, "%s/nux/sub", base);
	snprintf(deep, sizeof deep, "%s/deeper/r.sock", missing);
	pid = h_spawn_logged(log, (const char *const[]){ "--socket", deep, NULL });
	status = h_wait_exit(pid, 20.0);
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 1)
		h_show_file(log);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 1);
	snprintf(want, sizeof want, "bind %s: the directory %s does not exist; the daemon creates "
		 "only the socket's own directory", deep, missing);
	if (h_count_lines(log, want) != 1)
		h_show_file(log);
	assert_int_equal(h_count_lines(log, want), 1);
	snprintf(want, sizeof want, "%s/nux", base);
	assert_int_equal(access(want, F_OK), -1);   /* nothing created on the way */

	snprintf(want, sizeof want, "rm -rf '%s'", base);
	assert_int_equal(system(want), 0);
}

/* A preload is named after its directory, a name every client sees: one
 * with a control character is refused at start, in one log line that
 * shows it escaped. */
static void preload_name_with_control_character(void **state)
{
	char base[64] = "/tmp/radiance-preload-XXXXXX";
	assert_non_null(mkdtemp(base));
	char log[128], sock[128], link[160];
	snprintf(log, sizeof log, "%s/radianced.log", base);
	snprintf(sock, sizeof sock, "%s/r.sock", base);
	snprintf(link, sizeof link, "%s/evil\x1b[2Kname", base);
	assert_int_equal(symlink(ckpt, link), 0);
	pid_t pid = h_spawn_logged(log, (const char *const[]){ "--socket", sock, "--preload", link,
							     NULL });
	int status = h_wait_exit(pid, 20.0);
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 1)
		h_show_file(log);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 1);
	char want[300];
	snprintf(want, sizeof want, "preload %s/evil\\x1b[2Kname: its directory name (the model's "
		 "name) \"evil\\x1b[2Kname\" has a control character (0x1b) at byte 4", base);
	if (h_count_lines(log, want) != 1)
		h_show_file(log);
	assert_int_equal(h_count_lines(log, want), 1);
	assert_int_equal(h_count_lines(log, "[error]"), 1);
	assert_int_equal(h_count_lines(log, "\x1b"), 0);
	assert_int_equal(access(sock, F_OK), -1);

	snprintf(want, sizeof want, "rm -rf '%s'", base);
	assert_int_equal(system(want), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(transport_several_clients_real_checkpoint, start, stop),
		cmocka_unit_test_setup_teardown(load_twice_is_resident_once, start, stop),
		cmocka_unit_test_setup_teardown(same_name_other_checkpoint, start, stop),
		cmocka_unit_test_setup_teardown(attach_and_errors_are_not_sticky, start, stop),
		cmocka_unit_test_setup_teardown(preloaded_model, start_preload, stop),
		cmocka_unit_test_setup_teardown(async_api_contract, start_small_rows, stop),
		cmocka_unit_test_setup_teardown(stats_count_requests, start, stop),
		cmocka_unit_test_setup_teardown(no_leaks_over_many_sessions, start, stop),
		cmocka_unit_test_setup_teardown(sigterm_exits_cleanly, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(sigterm_delivers_drained_results, start,
						stop_after_sigterm),
		cmocka_unit_test_setup_teardown(daemon_death_ends_waits, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(reconnect_after_restart, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(event_loop_integration, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(handle_in_use_is_ebusy, start, stop),
		cmocka_unit_test_setup_teardown(two_threads_hammer_one_handle, start, stop),
		cmocka_unit_test(socket_directory),
		cmocka_unit_test(preload_name_with_control_character),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
