/*
 * libradiance's API against the real radianced binary ($RADIANCED) on the
 * CPU backend: several client processes at once on the real checkpoint's
 * captured activations; the async API's contract; GetStats' counts;
 * radiance_get_fd() in a caller's poll() loop; what a client sees when the
 * daemon dies or restarts (waits end, radiance_reconnect); one handle used
 * by two threads; a callback calling into its own handle. The library
 * without a daemon is test_client_unit.
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
 * One daemon per test, the reference once per binary (daemon_fixture.h).
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
#include <syslog.h>
#include <unistd.h>

#include "daemon_fixture.h"

static int start_small_rows(void **state)
{
	static const char *const args[] = { "--max-rows", "16", "--sq-entries", "8", NULL };
	return h_daemon_start_argv(&daemon_, args);
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
	static const char msg[] = "test_client_api: a call on one handle from two threads hung "
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

#define CALLBACK_RULE "a callback must not call into the handle that runs it"

struct reentry {
	struct radiance *r;   /* set once connected: the log callback tries only then */
	int progress_calls, log_tries;
	int attach_rc, list_rc, alloc_errno, log_list_rc;
	char attach_msg[256], log_msg[256];
};

/* A load progress callback that calls into the handle running it: each
 * call must be refused (-EDEADLK) without touching the handle; a
 * radiance_disconnect() from there must not free it under the load. */
static void progress_reenters(void *user, uint64_t done, uint64_t total)
{
	struct reentry *u = user;
	if (u->progress_calls++)
		return;
	uint32_t id;
	u->attach_rc = radiance_attach_model(u->r, ref.model_name, &id);
	snprintf(u->attach_msg, sizeof u->attach_msg, "%s", radiance_error_message(u->r));
	struct radiance_model_list *l = NULL;
	u->list_rc = radiance_list_models(u->r, &l);
	radiance_model_list_free(l);
	errno = 0;
	if (!radiance_arena_alloc(u->r, 64))
		u->alloc_errno = errno;
	radiance_disconnect(u->r);
}

static void log_reenters(void *user, int priority, const char *message)
{
	struct reentry *u = user;
	if (!u->r || u->log_tries++)
		return;
	struct radiance_model_list *l = NULL;
	u->log_list_rc = radiance_list_models(u->r, &l);
	snprintf(u->log_msg, sizeof u->log_msg, "%s", radiance_error_message(u->r));
	radiance_model_list_free(l);
}

/* radiance.h: callbacks run inside a call and must not call into the
 * same handle. Such a call is refused at once with -EDEADLK, not sticky;
 * the outer call completes as if nothing had happened. (It used to nest:
 * the attach read the load's reply, the session broke with EPROTO, and a
 * disconnect from the callback freed the handle under the load.) */
static void callback_reentry_is_edeadlk(void **state)
{
	bound_test(120);
	struct reentry u = { 0 };
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "reentry";
	o.timeout_ms = 30000;
	o.log = log_reenters;
	o.log_user = &u;
	o.log_priority = LOG_DEBUG;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	u.r = r;
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.progress = progress_reenters;
	lo.progress_user = &u;
	uint32_t id;
	int rc = radiance_load_model(r, ckpt, &lo, &id);
	assert_int_equal(rc, 0);
	assert_true(u.progress_calls > 0);
	assert_int_equal(u.attach_rc, -EDEADLK);
	if (!strstr(u.attach_msg, "radiance_attach_model: ") ||
	    !strstr(u.attach_msg, CALLBACK_RULE))
		fail_msg("message: %s", u.attach_msg);
	assert_int_equal(u.list_rc, -EDEADLK);
	assert_int_equal(u.alloc_errno, EDEADLK);
	/* the log callback: a call that logs (this failing attach logs its
	 * message at LOG_INFO) runs it inside the call */
	u.log_tries = 0;
	assert_int_equal(radiance_attach_model(r, "no-such-model", &id), -ENOENT);
	assert_true(u.log_tries > 0);
	assert_int_equal(u.log_list_rc, -EDEADLK);
	if (!strstr(u.log_msg, "radiance_list_models: ") || !strstr(u.log_msg, CALLBACK_RULE))
		fail_msg("message: %s", u.log_msg);
	/* after the callback, the outer call's own message again */
	if (!strstr(radiance_error_message(r), "no-such-model"))
		fail_msg("message after the call: %s", radiance_error_message(r));
	u.r = NULL;
	assert_int_equal(radiance_get_error(r), 0);
	uint32_t mid;
	assert_int_equal(radiance_attach_model(r, ref.model_name, &mid), 0);
	assert_int_equal(mid, id);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(r);
	alarm(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(transport_several_clients_real_checkpoint, start, stop),
		cmocka_unit_test_setup_teardown(async_api_contract, start_small_rows, stop),
		cmocka_unit_test_setup_teardown(stats_count_requests, start, stop),
		cmocka_unit_test_setup_teardown(daemon_death_ends_waits, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(reconnect_after_restart, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(event_loop_integration, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(handle_in_use_is_ebusy, start, stop),
		cmocka_unit_test_setup_teardown(two_threads_hammer_one_handle, start, stop),
		cmocka_unit_test_setup_teardown(callback_reentry_is_edeadlk, start, stop),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
