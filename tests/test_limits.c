/*
 * The administrator's limits against the real radianced (docs/daemon.md,
 * "Limits"): resident model bytes of all models and per uid, arena bytes of
 * all sessions and per uid, sessions per uid, and layer shapes above max_n
 * / max_k refused before anything is allocated. Each refusal must name the
 * limit, its value and the option that sets it; each charge must come back
 * when what it paid for is freed.
 *
 * Two uids: the peer credential is what the daemon counts, so the other uid
 * is a forked child that setuid()s to 65534 before it connects. That needs
 * root (CI runs as root); without it those steps are skipped, saying so.
 * The daemon's socket is then group 65534 (mode 0660) and its directory
 * 0711, so the child can reach it; checkpoint copies are world-readable.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
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

#include <cmocka.h>

#include "daemon_harness.h"

#define OTHER_UID 65534

static struct h_ref ref;
static struct h_daemon daemon_;
static char ckpt[512];
static uint64_t model_bytes;   /* resident bytes of the checkpoint, computed here */
static char copies[64];        /* directory of the checkpoint copies */

static int group_setup(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	if (h_ref_load_some(&ref, h_good_layers) < 0)
		return -1;
	model_bytes = ref.model->resident_bytes;
	snprintf(copies, sizeof copies, "/tmp/radiance-limits-XXXXXX");
	if (!mkdtemp(copies) || chmod(copies, 0755) < 0)
		return -1;
	fprintf(stderr, "the checkpoint holds %llu resident bytes\n",
		(unsigned long long)model_bytes);
	return 0;
}

static int group_teardown(void **state)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", copies);
	h_ref_free(&ref);
	return system(cmd) == 0 ? 0 : -1;
}

static int stop(void **state)
{
	return h_daemon_stop_clean(&daemon_);
}

static int is_root(void)
{
	return geteuid() == 0;
}

/* The daemon with extra arguments; as root, reachable by OTHER_UID too. */
static void start_with(const char *const *extra)
{
	const char *argv[24];
	size_t n = 0;
	for (; extra[n]; n++)
		argv[n] = extra[n];
	if (is_root()) {
		argv[n++] = "--group";
		argv[n++] = "65534";
	}
	argv[n] = NULL;
	assert_int_equal(h_daemon_start_argv(&daemon_, argv), 0);
	if (is_root())
		assert_int_equal(chmod(daemon_.dir, 0711), 0);
}

/* A copy of the checkpoint (other inodes: another model to the daemon) in
 * copies/name, world-readable. */
static void copy_checkpoint(const char *name, char *out, size_t n)
{
	char cmd[2048];
	snprintf(out, n, "%s/%s", copies, name);
	snprintf(cmd, sizeof cmd, "mkdir -p -m 0755 '%s' && cp '%s'/config.json "
		 "'%s'/quantization_config.json '%s'/model.safetensors '%s'/ && chmod 0644 '%s'/*",
		 out, ckpt, ckpt, ckpt, out, out);
	assert_int_equal(system(cmd), 0);
}

static struct radiance *connect_named(const char *name)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = name;
	o.timeout_ms = 30000;
	o.arena_bytes = 2 << 20;
	return radiance_connect(daemon_.socket, &o);
}

static void count_progress(void *user, uint64_t done, uint64_t total)
{
	int *calls = user;
	if (done > 0)
		(*calls)++;
}

/* Loads dir under name; rc, and how many progress reports had done > 0
 * (a load refused at its plan reads and repacks nothing). */
static int load_named(struct radiance *r, const char *dir, const char *name, uint32_t *id,
		      int *progressed)
{
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	int calls = 0;
	lo.name = name;
	lo.progress = count_progress;
	lo.progress_user = &calls;
	int rc = radiance_load_model(r, dir, &lo, id);
	if (progressed)
		*progressed = calls;
	return rc;
}

/* The error text has every needle (NULL-terminated); prints it if not. */
static void assert_says(const char *text, ...)
{
	va_list ap;
	va_start(ap, text);
	for (const char *n; (n = va_arg(ap, const char *));) {
		if (!strstr(text, n)) {
			va_end(ap);
			fail_msg("wanted \"%s\" in: %s", n, text);
		}
	}
	va_end(ap);
}

/* What a child of the other uid does, and what it must see. */
enum job_kind { JOB_LOAD, JOB_ATTACH_THEN_LOAD, JOB_OPEN_RINGS, JOB_CONNECT };

struct job {
	enum job_kind kind;
	const char *dir, *name;   /* JOB_LOAD, JOB_ATTACH_THEN_LOAD */
	int want;                 /* the last step's return code (JOB_CONNECT: errno) */
	const char *needle;       /* in the error text when want != 0 */
};

static int job_run(const struct job *j)
{
	if (j->kind == JOB_CONNECT) {
		struct radiance *r = connect_named("other-uid");
		int got = r ? 0 : errno;
		radiance_disconnect(r);
		if (got != j->want)
			fprintf(stderr, "uid %u: connect: errno %d, wanted %d\n", OTHER_UID, got, j->want);
		return got != j->want;
	}
	struct radiance *r = connect_named("other-uid");
	if (!r) {
		fprintf(stderr, "uid %u: connect: %s\n", OTHER_UID, strerror(errno));
		return 1;
	}
	int rc = 0;
	uint32_t id;
	if (j->kind == JOB_ATTACH_THEN_LOAD && (rc = radiance_attach_model(r, ref.model_name, &id)))
		fprintf(stderr, "uid %u: attach: %s\n", OTHER_UID, radiance_error_message(r));
	if (!rc && j->kind == JOB_OPEN_RINGS)
		rc = radiance_open_rings(r);
	else if (!rc)
		rc = load_named(r, j->dir, j->name, &id, NULL);
	int bad = rc != j->want || (j->want && !strstr(radiance_error_message(r), j->needle));
	if (bad)
		fprintf(stderr, "uid %u: got %d (%s), wanted %d with \"%s\"\n", OTHER_UID, rc,
			radiance_error_message(r), j->want, j->needle ? j->needle : "");
	radiance_disconnect(r);
	return bad;
}

/* Runs j as OTHER_UID in a child: 0 when it saw what it should, 1 when not,
 * -1 (and a line saying why) when this process is not root. */
static int as_other_uid(const struct job *j)
{
	if (!is_root()) {
		fprintf(stderr, "skipping the uid %u part: setuid needs root (CI runs as root)\n",
			OTHER_UID);
		return -1;
	}
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) < 0 || setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0) {
			perror("setuid");
			_exit(2);
		}
		_exit(job_run(j));
	}
	int st = h_wait_exit(pid, 60.0);
	assert_true(st != -1 && WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* Retries a load while the daemon is still freeing what paid for it (a
 * release or a disconnect is answered before the model is freed). */
static int load_when_freed(struct radiance *r, const char *dir, const char *name, uint32_t *id)
{
	int rc = -EDQUOT;
	for (int i = 0; i < 500 && rc == -EDQUOT; i++) {
		if (i)
			h_sleep_ms(10);
		rc = load_named(r, dir, name, id, NULL);
	}
	return rc;
}

/* --- resident model bytes --------------------------------------------------- */

/* max_model_bytes_per_uid: room for one copy of the checkpoint per uid. A
 * second model of the same uid is refused before anything of it is read;
 * another uid has its own budget, and a model it only attached to costs it
 * nothing (it is charged to the uid that loaded it). Released, the charge
 * comes back. */
static void model_bytes_per_uid(void **state)
{
	char limit[32], copy1[256], copy2[256];
	snprintf(limit, sizeof limit, "%llu", (unsigned long long)(model_bytes * 3 / 2));
	start_with((const char *const[]){ "--max-model-bytes", "0", "--max-model-bytes-per-uid",
					  limit, NULL });
	copy_checkpoint("copy1", copy1, sizeof copy1);
	copy_checkpoint("copy2", copy2, sizeof copy2);
	struct radiance *a = connect_named("a"), *b = connect_named("b");
	assert_non_null(a);
	assert_non_null(b);
	uint32_t ida, idb;
	int progressed = -1;
	assert_int_equal(load_named(a, ckpt, NULL, &ida, NULL), 0);
	assert_int_equal(load_named(b, copy1, "copy1", &idb, &progressed), -EDQUOT);
	char uid_whose[32];
	snprintf(uid_whose, sizeof uid_whose, "uid %u's", (unsigned)geteuid());
	const char *msg = radiance_error_message(b);
	assert_says(msg, "loading model 'copy1'", uid_whose, "resident model bytes",
		    "above max_model_bytes_per_uid = ",
		    "(max_model_bytes_per_uid in radianced.conf, or --max-model-bytes-per-uid)", NULL);
	assert_int_equal(progressed, 0);   /* refused at the plan: nothing read or repacked */
	assert_int_equal(radiance_get_error(b), 0);   /* not sticky */
	/* logged once, as it happened (counted before load_when_freed, whose
	 * retries while the release is still under way are refusals too) */
	assert_int_equal(h_count_lines(daemon_.log, "above max_model_bytes_per_uid"), 1);

	/* the other uid: copy1 fits its own budget, even after attaching to
	 * the model root loaded */
	int other = as_other_uid(&(struct job){ JOB_ATTACH_THEN_LOAD, copy1, "copy1", 0, NULL });
	if (other >= 0)
		assert_int_equal(other, 0);

	/* the charge comes back when the model is freed */
	assert_int_equal(radiance_release_model(a, ida), 0);
	assert_int_equal(load_when_freed(b, copy2, "copy2", &idb), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	assert_int_equal(h_check_layer(b, idb, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(a);
	radiance_disconnect(b);
}

/* max_model_bytes: all models together. Loading or attaching to what is
 * resident costs nothing; a second checkpoint is refused, whoever asks. */
static void model_bytes_total(void **state)
{
	char limit[32], copy1[256];
	snprintf(limit, sizeof limit, "%llu", (unsigned long long)(model_bytes * 3 / 2));
	start_with((const char *const[]){ "--max-model-bytes", limit, "--max-model-bytes-per-uid",
					  "0", NULL });
	copy_checkpoint("total1", copy1, sizeof copy1);
	struct radiance *a = connect_named("a"), *b = connect_named("b");
	uint32_t ida, idb;
	assert_int_equal(load_named(a, ckpt, NULL, &ida, NULL), 0);
	assert_int_equal(load_named(b, ckpt, NULL, &idb, NULL), 0);   /* the same files: shared */
	assert_int_equal(idb, ida);
	assert_int_equal(load_named(b, copy1, "total1", &idb, NULL), -EDQUOT);
	assert_says(radiance_error_message(b), "loading model 'total1'",
		    "would make all models' resident bytes", "above max_model_bytes = ",
		    "(max_model_bytes in radianced.conf, or --max-model-bytes)", NULL);
	int other = as_other_uid(&(struct job){ JOB_LOAD, copy1, "total1", -EDQUOT,
						"above max_model_bytes = " });
	if (other >= 0)
		assert_int_equal(other, 0);
	radiance_disconnect(a);
	radiance_disconnect(b);
	/* both references gone: the model is freed and the room is back */
	struct radiance *c = connect_named("c");
	uint32_t idc;
	assert_int_equal(load_when_freed(c, copy1, "total1", &idc), 0);
	radiance_disconnect(c);
}

/* --- layer shapes ----------------------------------------------------------- */

/* A layer above max_n (or max_k) is refused from the checkpoint's headers:
 * no layer is read, repacked or allocated, so no progress is reported.
 * (The CPU backend did not check N at all, and checked K only after the
 * repack.) The daemon goes on serving. */
static void shape_over_limit(const char *opt, const char *value, const char *needle)
{
	start_with((const char *const[]){ opt, value, NULL });
	struct radiance *r = connect_named("shape");
	uint32_t id;
	int progressed = -1;
	assert_int_equal(load_named(r, ckpt, NULL, &id, &progressed), -E2BIG);
	assert_says(radiance_error_message(r), needle, "refused before anything was allocated",
		    NULL);
	assert_int_equal(progressed, 0);
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), 0);
	assert_int_equal(l->count, 0);
	radiance_model_list_free(l);
	radiance_disconnect(r);
}

static void shape_over_max_n(void **state)
{
	/* the checkpoint's largest N is the intermediate dense layers' 1536 */
	shape_over_limit("--max-n", "1024", "has N = 1536, above max_n = 1024 (max_n in "
			 "radianced.conf, or --max-n)");
}

static void shape_over_max_k(void **state)
{
	shape_over_limit("--max-k", "256", "has K = 384, above max_k = 256 (max_k in "
			 "radianced.conf, or --max-k)");
}

/* --- arena bytes -------------------------------------------------------------- */

static void arena_bytes_per_uid(void **state)
{
	start_with((const char *const[]){ "--arena-bytes", "1M", "--max-arena-bytes-per-uid", "3M",
					  "--max-total-arena-bytes", "0", NULL });
	struct radiance *a = connect_named("a"), *b = connect_named("b");
	assert_int_equal(radiance_open_rings(a), 0);   /* 2M each (connect_named) */
	assert_int_equal(radiance_open_rings(b), -EDQUOT);
	char whose[64];
	snprintf(whose, sizeof whose, "would make uid %u's arena bytes 4M", (unsigned)geteuid());
	assert_says(radiance_error_message(b), "opening the rings with a 2M arena", whose,
		    "above max_arena_bytes_per_uid = 3M",
		    "(max_arena_bytes_per_uid in radianced.conf, or --max-arena-bytes-per-uid)", NULL);
	assert_int_equal(radiance_get_error(b), 0);
	int other = as_other_uid(&(struct job){ .kind = JOB_OPEN_RINGS, .want = 0 });
	if (other >= 0)
		assert_int_equal(other, 0);
	/* a's arena is freed with its session; b may then have its own */
	radiance_disconnect(a);
	int rc = -EDQUOT;
	for (int i = 0; i < 500 && rc == -EDQUOT; i++) {
		if (i)
			h_sleep_ms(10);
		rc = radiance_open_rings(b);
	}
	assert_int_equal(rc, 0);
	uint32_t id;
	assert_int_equal(load_named(b, ckpt, NULL, &id, NULL), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	assert_int_equal(h_check_layer(b, id, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(b);
}

static void arena_bytes_total(void **state)
{
	start_with((const char *const[]){ "--arena-bytes", "1M", "--max-arena-bytes-per-uid", "0",
					  "--max-total-arena-bytes", "3M", NULL });
	struct radiance *a = connect_named("a"), *b = connect_named("b");
	assert_int_equal(radiance_open_rings(a), 0);
	assert_int_equal(radiance_open_rings(b), -EDQUOT);
	assert_says(radiance_error_message(b), "would make all sessions' arena bytes 4M",
		    "above max_total_arena_bytes = 3M",
		    "(max_total_arena_bytes in radianced.conf, or --max-total-arena-bytes)", NULL);
	int other = as_other_uid(&(struct job){ .kind = JOB_OPEN_RINGS, .want = -EDQUOT,
						.needle = "above max_total_arena_bytes = 3M" });
	if (other >= 0)
		assert_int_equal(other, 0);
	radiance_disconnect(a);
	radiance_disconnect(b);
}

/* --- sessions ----------------------------------------------------------------- */

static void log_keep(void *user, int priority, const char *msg)
{
	if (priority <= LOG_WARNING)
		snprintf(user, 512, "%s", msg);
}

/* Sessions per uid: the one over is refused with EBUSY and the rule; the
 * other uid still connects; a freed slot is usable again. The start-up
 * line states the limits. */
static void sessions_per_uid(void **state)
{
	start_with((const char *const[]){ "--max-sessions-per-uid", "2", NULL });
	assert_int_equal(h_count_lines(daemon_.log, "limits: model bytes "), 1);
	assert_int_equal(h_count_lines(daemon_.log, "sessions 64 (per uid 2)"), 1);
	struct radiance *s[2];
	for (int i = 0; i < 2; i++) {
		/* the harness's start-up probe may not be closed yet */
		s[i] = NULL;
		for (int t = 0; t < 200 && !s[i]; t++, h_sleep_ms(10))
			s[i] = connect_named("mine");
		assert_non_null(s[i]);
	}
	char said[512] = "";
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.log = log_keep;
	o.log_user = said;
	errno = 0;
	assert_null(radiance_connect(daemon_.socket, &o));
	assert_int_equal(errno, EBUSY);
	char whose[64];
	snprintf(whose, sizeof whose, "a new session would make uid %u's sessions 3",
		 (unsigned)geteuid());
	assert_says(said, whose, "above max_sessions_per_uid = 2",
		    "(max_sessions_per_uid in radianced.conf, or --max-sessions-per-uid)", NULL);
	int other = as_other_uid(&(struct job){ .kind = JOB_CONNECT, .want = 0 });
	if (other >= 0)
		assert_int_equal(other, 0);
	radiance_disconnect(s[0]);
	struct radiance *again = NULL;
	for (int t = 0; t < 200 && !again; t++, h_sleep_ms(10))
		again = connect_named("again");
	assert_non_null(again);
	radiance_disconnect(again);
	radiance_disconnect(s[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(model_bytes_per_uid, stop),
		cmocka_unit_test_teardown(model_bytes_total, stop),
		cmocka_unit_test_teardown(shape_over_max_n, stop),
		cmocka_unit_test_teardown(shape_over_max_k, stop),
		cmocka_unit_test_teardown(arena_bytes_per_uid, stop),
		cmocka_unit_test_teardown(arena_bytes_total, stop),
		cmocka_unit_test_teardown(sessions_per_uid, stop),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
