/*
 * daemon/registry directly, on a real loop, executor and CPU backend, with
 * the shipped checkpoint: user references, deduplication by file identity,
 * unloading at the last reference, and the limits' charges (a model is
 * charged once, to the uid that loaded it, and the charge comes back when
 * it is freed, also for a load nobody waits for any more). No socket, no
 * session: the waiters here are the registry's only clients.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "checkpoint.h"
#include "executor.h"
#include "reference.h"
#include "registry.h"

static char ckpt[512], copy[128];
static uint64_t model_bytes;   /* the checkpoint's resident bytes, from a local load */

struct fixture {
	uv_loop_t loop;
	struct radiance_executor *exec;
	struct radiance_registry *reg;
	struct stats_counters stats;
	int empty;
	struct radiance_resident *refs[8];   /* references the test holds */
	int nrefs;
};

struct waiter {
	struct registry_waiter w;   /* first */
	int done, status;
	struct radiance_resident *res;
	char err[512];
};

static void on_done(struct registry_waiter *rw, struct radiance_resident *res, int status,
		    const char *err)
{
	struct waiter *w = (struct waiter *)rw;
	w->done = 1;
	w->status = status;
	w->res = res;
	snprintf(w->err, sizeof w->err, "%s", err ? err : "");
}

static int group_setup(void **state)
{
	char err[512];
	struct radiance_model *m;
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	if (radiance_checkpoint_load_dir(ckpt, NULL, NULL, NULL, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	model_bytes = m->resident_bytes;
	radiance_model_destroy(m);
	/* the same bytes in other inodes: another checkpoint to the registry */
	snprintf(copy, sizeof copy, "/tmp/radiance-registry-XXXXXX");
	if (!mkdtemp(copy))
		return -1;
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "cp '%s'/config.json '%s'/quantization_config.json "
		 "'%s'/model.safetensors '%s'/", ckpt, ckpt, ckpt, copy);
	return system(cmd) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
	char cmd[160];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", copy);
	return system(cmd) == 0 ? 0 : -1;
}

static int setup_with(void **state, const struct registry_limits *lim)
{
	struct fixture *f = calloc(1, sizeof *f);
	char err[512];
	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	stats_init(&f->stats);
	struct executor_options eo = {
		.backend = { .kind = "cpu", .device = -1, .max_rows = 16, .max_decode_rows = 16, .max_n = 4096,
			     .max_k = 4096 },
		.max_rings = 4,
		.spin_us = 10,
		.global_stats = &f->stats,
	};
	if (executor_create(&f->loop, &eo, &f->exec, err, sizeof err) < 0)
		fail_msg("executor: %s", err);
	assert_int_equal(registry_create(&f->loop, f->exec, lim, &f->reg), 0);
	*state = f;
	return 0;
}

static int setup(void **state)
{
	return setup_with(state, NULL);
}

static int setup_uid_limit(void **state)
{
	struct registry_limits lim = { .max_model_bytes_per_uid = model_bytes * 3 / 2 };
	return setup_with(state, &lim);
}

static int setup_max_n(void **state)
{
	struct registry_limits lim = { .max_n = 1024 };
	return setup_with(state, &lim);
}

static void on_empty(void *user)
{
	struct fixture *f = user;
	f->empty = 1;
}

/* Gives back one reference load() took. */
static void drop(struct fixture *f, struct radiance_resident *res)
{
	for (int i = 0; i < f->nrefs; i++)
		if (f->refs[i] == res) {
			f->refs[i] = f->refs[--f->nrefs];
			registry_unref(res);
			return;
		}
	fail_msg("no reference to drop");
}

/* Unloads everything, stops the executor, and checks that the loop has no
 * handle left. */
static int teardown(void **state)
{
	struct fixture *f = *state;
	while (f->nrefs)   /* what a failed test left */
		drop(f, f->refs[0]);
	registry_shutdown(f->reg, on_empty, f);
	while (!f->empty)
		uv_run(&f->loop, UV_RUN_ONCE);
	uint64_t total, mine;
	registry_charged(f->reg, 0, &total, &mine);
	assert_int_equal(total, 0);
	registry_destroy(f->reg);
	executor_destroy(f->exec);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	free(f);
	return 0;
}

/* Starts a load of dir's checkpoint for uid; returns registry_load_files's
 * code (the answer comes to w later). */
static int load_start(struct fixture *f, const char *dir, const char *name, uid_t uid,
		      struct waiter *w)
{
	static const char *const names[] = { "config.json", "quantization_config.json",
					     "model.safetensors" };
	struct radiance_file files[3];
	for (size_t i = 0; i < 3; i++) {
		char path[700];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		files[i] = (struct radiance_file){ names[i], open(path, O_RDONLY | O_CLOEXEC) };
		assert_true(files[i].fd >= 0);
	}
	memset(w, 0, sizeof *w);
	w->w.session_id = 1000 + uid;
	w->w.uid = uid;
	w->w.done = on_done;
	return registry_load_files(f->reg, files, 3, name, &w->w, w->err, sizeof w->err);
}

/* A load to its answer: the status. The reference it hands over is the
 * fixture's until drop(). */
static int load(struct fixture *f, const char *dir, const char *name, uid_t uid, struct waiter *w)
{
	int rc = load_start(f, dir, name, uid, w);
	if (rc < 0)
		return rc;
	while (!w->done)
		uv_run(&f->loop, UV_RUN_ONCE);
	if (w->status == 0)
		f->refs[f->nrefs++] = w->res;
	return w->status;
}


static uint64_t charged(struct fixture *f, uid_t uid, uint64_t *total)
{
	uint64_t mine;
	registry_charged(f->reg, uid, total, &mine);
	return mine;
}

/* Runs the loop until nothing is charged any more (the free job is done). */
static void wait_uncharged(struct fixture *f)
{
	uint64_t total = 1;
	for (int i = 0; i < 100000 && total; i++) {
		charged(f, 0, &total);
		if (total)
			uv_run(&f->loop, UV_RUN_NOWAIT);
		if (total)
			h_sleep_ms(1);
	}
	assert_int_equal(total, 0);
}

/* A second load of the same files is the same resident, one more user,
 * charged nothing more; the last unref unloads it and gives the charge
 * back. */
static void dedup_and_refcounts(void **state)
{
	struct fixture *f = *state;
	struct waiter a, b;
	uint64_t total;
	assert_int_equal(load(f, ckpt, NULL, 1000, &a), 0);
	assert_non_null(a.res);
	assert_int_equal(a.res->users, 1);
	assert_int_equal(a.res->state, RESIDENT_READY);
	assert_ptr_equal(registry_find_id(f->reg, a.res->em.id), a.res);
	/* no name asked, none in config.json: the registry's "model" */
	assert_string_equal(a.res->name, "model");
	assert_ptr_equal(registry_find_name(f->reg, "model"), a.res);
	assert_int_equal(charged(f, 1000, &total), model_bytes);
	assert_int_equal(total, model_bytes);

	assert_int_equal(load(f, ckpt, "another-name", 2000, &b), 0);
	assert_ptr_equal(b.res, a.res);                 /* by identity, not by name */
	assert_string_equal(b.res->name, "model");
	assert_int_equal(a.res->users, 2);
	assert_int_equal(charged(f, 2000, &total), 0);   /* attaching costs nothing */
	assert_int_equal(total, model_bytes);

	registry_ref(a.res);
	assert_int_equal(a.res->users, 3);
	uint32_t id = a.res->em.id;
	registry_unref(a.res);
	drop(f, b.res);
	assert_ptr_equal(registry_find_id(f->reg, id), a.res);   /* one user left */
	assert_int_equal(a.res->users, 1);
	assert_int_equal(charged(f, 1000, &total), model_bytes);
	drop(f, a.res);
	assert_null(registry_find_id(f->reg, id));   /* unloading: invisible at once */
	wait_uncharged(f);
	assert_int_equal(charged(f, 1000, &total), 0);
	assert_null(registry_next(f->reg, NULL));
}

/* Two loads of the same files while the first is still reading: the second
 * joins the first's waiters instead of starting another load; both answers
 * are the one resident with two users, charged once, to the first uid. */
static void loads_in_flight_join_one(void **state)
{
	struct fixture *f = *state;
	struct waiter a, b;
	uint64_t total;
	assert_int_equal(load_start(f, ckpt, "joined", 1000, &a), 0);
	assert_int_equal(load_start(f, ckpt, NULL, 2000, &b), 0);
	assert_int_equal(a.done + b.done, 0);   /* never answered from inside the call */
	while (!a.done || !b.done)
		uv_run(&f->loop, UV_RUN_ONCE);
	assert_int_equal(a.status, 0);
	assert_int_equal(b.status, 0);
	f->refs[f->nrefs++] = a.res;
	f->refs[f->nrefs++] = b.res;
	assert_ptr_equal(a.res, b.res);
	assert_int_equal(a.res->users, 2);
	assert_string_equal(a.res->name, "joined");
	assert_int_equal(charged(f, 1000, &total), model_bytes);
	assert_int_equal(charged(f, 2000, &total), 0);
	assert_int_equal(total, model_bytes);
	/* one resident in the list */
	assert_ptr_equal(registry_next(f->reg, NULL), a.res);
	assert_null(registry_next(f->reg, a.res));
	drop(f, a.res);
	assert_int_equal(b.res->users, 1);
	assert_ptr_equal(registry_find_name(f->reg, "joined"), b.res);
	drop(f, b.res);
	assert_null(registry_find_name(f->reg, "joined"));
	wait_uncharged(f);
}

/* The same bytes in other inodes are another checkpoint: no dedup, and the
 * name one of them holds is refused to the other, at once, naming it. */
static void other_files_same_name_refused(void **state)
{
	struct fixture *f = *state;
	struct waiter a, b;
	uint64_t total;
	assert_int_equal(load(f, ckpt, "m", 1000, &a), 0);
	assert_int_equal(load_start(f, copy, "m", 1000, &b), -EEXIST);
	assert_int_equal(b.done, 0);
	char want[160];
	snprintf(want, sizeof want, "a different checkpoint named 'm' is already resident as model %u",
		 a.res->em.id);
	if (!strstr(b.err, want))
		fail_msg("refusal says \"%s\", not \"%s\"", b.err, want);
	/* under another name it is a second resident, charged again */
	assert_int_equal(load(f, copy, "m2", 1000, &b), 0);
	assert_ptr_not_equal(b.res, a.res);
	assert_true(b.res->em.id != a.res->em.id);
	assert_int_equal(a.res->users, 1);
	assert_int_equal(b.res->users, 1);
	assert_int_equal(charged(f, 1000, &total), 2 * model_bytes);
	assert_int_equal(total, 2 * model_bytes);
	drop(f, a.res);
	drop(f, b.res);
	wait_uncharged(f);
}

/* A preloaded model outlives its last user until the daemon unpins it;
 * unpinned while used, it goes with the last user. A preload counts in the
 * total but is charged to no uid; a client attaching to it costs nothing. */
static void preloaded_until_unpinned(void **state)
{
	struct fixture *f = *state;
	struct waiter p, a;
	uint64_t total;
	char err[512];
	memset(&p, 0, sizeof p);
	p.w.done = on_done;
	assert_int_equal(registry_preload(f->reg, ckpt, &p.w, err, sizeof err), 0);
	while (!p.done)
		uv_run(&f->loop, UV_RUN_ONCE);
	assert_int_equal(p.status, 0);
	struct radiance_resident *res = p.res;
	assert_true(res->preloaded);
	assert_string_equal(res->name, H_CHECKPOINT);   /* the directory's name */
	assert_int_equal(res->users, 1);                 /* the waiter's reference */
	/* in the total, charged to no uid */
	assert_int_equal(charged(f, 0, &total), 0);
	assert_int_equal(total, model_bytes);
	registry_unref(res);
	assert_int_equal(res->users, 0);
	assert_ptr_equal(registry_find_name(f->reg, H_CHECKPOINT), res);   /* still resident */

	/* a client's load of the same files attaches to it */
	assert_int_equal(load(f, ckpt, NULL, 1000, &a), 0);
	assert_ptr_equal(a.res, res);
	assert_int_equal(res->users, 1);
	assert_int_equal(charged(f, 1000, &total), 0);
	assert_int_equal(total, model_bytes);
	uint32_t id = res->em.id;
	registry_unpin(res);
	assert_ptr_equal(registry_find_id(f->reg, id), res);   /* a user holds it */
	drop(f, a.res);
	assert_null(registry_find_id(f->reg, id));
	assert_null(registry_next(f->reg, NULL));
	wait_uncharged(f);
}

/* max_model_bytes_per_uid: the same uid's second checkpoint is refused with
 * the limit named; another uid's is not. */
static void per_uid_charge(void **state)
{
	struct fixture *f = *state;
	struct waiter a, b, c;
	uint64_t total;
	assert_int_equal(load(f, ckpt, NULL, 1000, &a), 0);
	assert_int_equal(load(f, copy, "copy", 1000, &b), -EDQUOT);
	assert_null(b.res);
	if (!strstr(b.err, "uid 1000's resident model bytes") ||
	    !strstr(b.err, "above max_model_bytes_per_uid = "))
		fail_msg("message: %s", b.err);
	assert_int_equal(charged(f, 1000, &total), model_bytes);   /* the refused load gave back */
	assert_int_equal(load(f, copy, "copy", 2000, &c), 0);
	assert_ptr_not_equal(c.res, a.res);
	assert_int_equal(charged(f, 2000, &total), model_bytes);
	assert_int_equal(total, 2 * model_bytes);
	drop(f, a.res);
	drop(f, c.res);
	wait_uncharged(f);
}

/* A layer above max_n is refused from the plan; nothing is charged. */
static void shape_refused_at_plan(void **state)
{
	struct fixture *f = *state;
	struct waiter a;
	uint64_t total;
	assert_int_equal(load(f, ckpt, NULL, 1000, &a), -E2BIG);
	if (!strstr(a.err, "has N = 1536, above max_n = 1024"))
		fail_msg("message: %s", a.err);
	assert_int_equal(charged(f, 1000, &total), 0);
	assert_int_equal(total, 0);
}

/* A waiter that goes away (its session closed) while the load runs: the
 * model still loads, then nobody uses it, so it is unloaded and its charge
 * given back. */
static void cancelled_load_gives_charge_back(void **state)
{
	struct fixture *f = *state;
	struct waiter a;
	assert_int_equal(load_start(f, ckpt, NULL, 1000, &a), 0);
	registry_cancel(&a.w);
	/* charged at the plan, given back once the unused model is freed */
	uint64_t total = 0;
	for (int i = 0; i < 100000 && !total; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		if (!charged(f, 1000, &total))
			h_sleep_ms(1);
	}
	assert_int_equal(total, model_bytes);
	wait_uncharged(f);
	assert_int_equal(a.done, 0);   /* never answered */
	assert_null(registry_next(f->reg, NULL));
}

/* The backend seam checks max_n and max_k for every backend (the CPU one
 * used to check only K, and the registry's plan check is the daemon's, not
 * every caller's). */
static void backend_checks_shapes(void **state)
{
	const struct radiance_backend_options o = { .kind = "cpu", .device = -1, .max_rows = 4,
						    .max_n = 64, .max_k = 256 };
	struct radiance_backend *b;
	struct radiance_backend_layer *h;
	char err[256];
	assert_int_equal(radiance_backend_create(&o, &b, err, sizeof err), 0);
	struct radiance_layer l = { .name = "wide", .kind = RADIANCE_LAYER_W4A8, .n = 128, .k = 128 };
	assert_int_equal(radiance_backend_layer_upload(b, &l, &h, err, sizeof err), -E2BIG);
	if (!strstr(err, "layer wide: N=128, K=128 exceeds the backend's max_n=64 / max_k=256"))
		fail_msg("message: %s", err);
	l = (struct radiance_layer){ .name = "deep", .kind = RADIANCE_LAYER_W4A8, .n = 64, .k = 384 };
	assert_int_equal(radiance_backend_layer_upload(b, &l, &h, err, sizeof err), -E2BIG);
	l = (struct radiance_layer){ .name = "fits", .kind = RADIANCE_LAYER_W4A8, .n = 64, .k = 256 };
	assert_int_equal(radiance_backend_layer_upload(b, &l, &h, err, sizeof err), 0);
	radiance_backend_layer_free(b, h);
	radiance_backend_destroy(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(dedup_and_refcounts, setup, teardown),
		cmocka_unit_test_setup_teardown(loads_in_flight_join_one, setup, teardown),
		cmocka_unit_test_setup_teardown(other_files_same_name_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(preloaded_until_unpinned, setup, teardown),
		cmocka_unit_test_setup_teardown(per_uid_charge, setup_uid_limit, teardown),
		cmocka_unit_test_setup_teardown(shape_refused_at_plan, setup_max_n, teardown),
		cmocka_unit_test_setup_teardown(cancelled_load_gives_charge_back, setup, teardown),
		cmocka_unit_test(backend_checks_shapes),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
