/*
 * radiancectl against the real daemon: every command, human and --json
 * output (parsed with jansson), progress lines when stderr is not a TTY,
 * load --hold, and the documented exit codes (0 ok, 1 failed, 2 usage,
 * 3 cannot reach the daemon).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon_harness.h"

static struct h_daemon daemon_;
static char ckpt[512];
static char out_path[128], err_path[128];
static char out[1 << 16], err[1 << 14];

static void slurp(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "r");
	size_t len = f ? fread(buf, 1, n - 1, f) : 0;
	buf[len] = '\0';
	if (f)
		fclose(f);
}

/* Runs radiancectl with the given arguments (a shell word list); returns
 * its exit status, stdout in out[], stderr in err[]. */
static int ctl(const char *fmt, ...)
{
	char args[1024], cmd[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s </dev/null", h_env("RADIANCECTL", "build/radiancectl"),
		 args, out_path, err_path);
	int st = system(cmd);
	slurp(out_path, out, sizeof out);
	slurp(err_path, err, sizeof err);
	if (getenv("RADIANCE_TEST_VERBOSE"))
		fprintf(stderr, "$ radiancectl %s -> %d\n%s%s", args, WEXITSTATUS(st), out, err);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_t *ctl_json(const char *fmt, const char *arg)
{
	char args[1024];
	snprintf(args, sizeof args, fmt, daemon_.socket, arg);
	assert_int_equal(ctl("%s", args), 0);
	json_error_t je;
	json_t *j = json_loads(out, 0, &je);
	if (!j)
		fprintf(stderr, "not JSON (%s): %s\n", je.text, out);
	assert_non_null(j);
	return j;
}

static int group_setup(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	snprintf(out_path, sizeof out_path, "/tmp/radiancectl-test-%d.out", (int)getpid());
	snprintf(err_path, sizeof err_path, "/tmp/radiancectl-test-%d.err", (int)getpid());
	return 0;
}

static int group_teardown(void **state)
{
	unlink(out_path);
	unlink(err_path);
	return 0;
}

static int start(void **state)
{
	return h_daemon_start(&daemon_);
}

static int start_preload(void **state)
{
	static const char *args[3] = { "--preload", ckpt, NULL };
	return h_daemon_start_argv(&daemon_, args);
}

static int stop(void **state)
{
	int alive = h_daemon_alive(&daemon_);
	int st = h_daemon_stop(&daemon_);
	return alive && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void usage_and_exit_codes(void **state)
{
	assert_int_equal(ctl("--help"), 0);
	assert_non_null(strstr(out, "Usage: radiancectl"));
	assert_non_null(strstr(out, "Exit status"));
	assert_int_equal(ctl("--version"), 0);
	assert_non_null(strstr(out, RADIANCE_VERSION));
	assert_int_equal(ctl(""), 2);
	assert_int_equal(ctl("frobnicate"), 2);
	assert_non_null(strstr(err, "unknown command"));
	assert_int_equal(ctl("layers"), 2);
	assert_int_equal(ctl("status extra"), 2);
	assert_int_equal(ctl("--name x status"), 2);
	assert_int_equal(ctl("--bogus-option status"), 2);
	/* nobody listening */
	assert_int_equal(ctl("--socket /nonexistent/radiance.sock status"), 3);
	assert_non_null(strstr(err, "cannot connect to /nonexistent/radiance.sock"));
	/* RADIANCE_SOCKET is the default socket */
	setenv("RADIANCE_SOCKET", "/nonexistent/env.sock", 1);
	assert_int_equal(ctl("models"), 3);
	assert_non_null(strstr(err, "/nonexistent/env.sock"));
	unsetenv("RADIANCE_SOCKET");
}

static void status_models_layers_stats(void **state)
{
	/* daemon with the checkpoint preloaded */
	assert_int_equal(ctl("--socket %s status", daemon_.socket), 0);
	assert_non_null(strstr(out, "backend:"));
	assert_non_null(strstr(out, "1 resident"));

	json_t *j = ctl_json("--socket %s --json status", "");
	assert_string_equal(json_string_value(json_object_get(j, "backend")),
			    h_env("RADIANCE_TEST_BACKEND", "cpu"));
	assert_int_equal(json_integer_value(json_object_get(j, "protocol_version")), 1);
	assert_true(json_integer_value(json_object_get(j, "sessions")) >= 1);
	assert_true(json_integer_value(json_object_get(j, "max_rows")) >= 1);
	assert_int_equal(json_integer_value(json_object_get(j, "models")), 1);
	json_decref(j);

	j = ctl_json("--socket %s --json models", "");
	json_t *models = json_object_get(j, "models");
	assert_int_equal(json_array_size(models), 1);
	json_t *m = json_array_get(models, 0);
	assert_string_equal(json_string_value(json_object_get(m, "name")), "minilm-w4g128");
	assert_true(json_is_true(json_object_get(m, "preloaded")));
	json_int_t id = json_integer_value(json_object_get(m, "model_id"));
	json_decref(j);

	assert_int_equal(ctl("--socket %s models", daemon_.socket), 0);
	assert_non_null(strstr(out, "minilm-w4g128"));

	j = ctl_json("--socket %s --json layers %s", "minilm-w4g128");
	json_t *layers = json_object_get(j, "layers");
	assert_int_equal(json_array_size(layers), 37);
	json_t *l0 = json_array_get(layers, 0);
	assert_int_equal(json_integer_value(json_object_get(l0, "index")), 0);
	assert_int_equal(json_integer_value(json_object_get(l0, "k")), 384);
	assert_string_equal(json_string_value(json_object_get(l0, "kind")), "w4a8");
	assert_string_equal(json_string_value(json_object_get(json_array_get(layers, 36), "kind")),
			    "bf16");   /* the pooler stays at 16 bits */
	assert_true(json_array_size(json_object_get(j, "other_tensors")) > 0);
	json_decref(j);

	/* by id too; an unknown model fails with 1 */
	char idstr[16];
	snprintf(idstr, sizeof idstr, "%d", (int)id);
	j = ctl_json("--socket %s --json layers %s", idstr);
	json_decref(j);
	assert_int_equal(ctl("--socket %s layers minilm-w4g128", daemon_.socket), 0);
	assert_non_null(strstr(out, "encoder.layer.5.output.dense"));
	assert_int_equal(ctl("--socket %s layers no-such-model", daemon_.socket), 1);
	assert_non_null(strstr(err, "no resident model"));

	j = ctl_json("--socket %s --json stats", "");
	assert_non_null(json_object_get(json_object_get(j, "global"), "requests"));
	assert_true(json_integer_value(json_object_get(json_object_get(j, "global"), "uptime_ns")) > 0);
	assert_true(json_is_array(json_object_get(j, "sessions")));
	json_decref(j);
	assert_int_equal(ctl("--socket %s stats", daemon_.socket), 0);
	assert_non_null(strstr(out, "all sessions"));
}

static void load_and_unload(void **state)
{
	/* not a TTY: plain progress lines on stderr, ending at 100% */
	assert_int_equal(ctl("--socket %s load %s", daemon_.socket, ckpt), 0);
	assert_non_null(strstr(err, "loading: 100%"));
	assert_non_null(strstr(out, "minilm-w4g128"));
	assert_non_null(strstr(out, "unloaded when radiancectl exits"));
	/* ... and it was: nobody else held it */
	json_t *j = ctl_json("--socket %s --json models", "");
	assert_int_equal(json_array_size(json_object_get(j, "models")), 0);
	json_decref(j);

	j = ctl_json("--socket %s --json load %s", ckpt);
	assert_int_equal(json_integer_value(json_object_get(j, "layers")), 37);
	json_decref(j);
	assert_int_equal(ctl("--socket %s load --name other %s", daemon_.socket, ckpt), 0);
	assert_non_null(strstr(out, "\"other\""));
	assert_int_equal(ctl("--socket %s load /nonexistent/ckpt", daemon_.socket), 1);

	/* --hold keeps it until SIGTERM */
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "exec %s --socket %s load --hold %s >/dev/null 2>&1",
		 h_env("RADIANCECTL", "build/radiancectl"), daemon_.socket, ckpt);
	fflush(NULL);
	pid_t holder = fork();
	assert_true(holder >= 0);
	if (holder == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	size_t n = 0;
	for (int i = 0; i < 500 && n == 0; i++) {
		h_sleep_ms(10);
		j = ctl_json("--socket %s --json models", "");
		n = json_array_size(json_object_get(j, "models"));
		json_decref(j);
	}
	assert_int_equal(n, 1);
	/* a client-loaded model cannot be unloaded from outside */
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 1);
	assert_non_null(strstr(err, "not preloaded"));
	kill(holder, SIGTERM);
	int st;
	assert_int_equal(waitpid(holder, &st, 0), holder);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	for (int i = 0; i < 200 && n; i++) {
		j = ctl_json("--socket %s --json models", "");
		n = json_array_size(json_object_get(j, "models"));
		json_decref(j);
		if (n)
			h_sleep_ms(10);
	}
	assert_int_equal(n, 0);
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 1);
}

/* The daemon's hold on a preloaded model is dropped by unload (root here);
 * the model goes once no session uses it. */
static void unload_preloaded(void **state)
{
	json_t *j = ctl_json("--socket %s --json models", "");
	assert_int_equal(json_array_size(json_object_get(j, "models")), 1);
	json_decref(j);
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 0);
	assert_non_null(strstr(out, "unloaded"));
	size_t n = 1;
	for (int i = 0; i < 200 && n; i++) {
		j = ctl_json("--socket %s --json models", "");
		n = json_array_size(json_object_get(j, "models"));
		json_decref(j);
		if (n)
			h_sleep_ms(10);
	}
	assert_int_equal(n, 0);
	/* gone: a second unload finds nothing */
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(usage_and_exit_codes),
		cmocka_unit_test_setup_teardown(status_models_layers_stats, start_preload, stop),
		cmocka_unit_test_setup_teardown(load_and_unload, start, stop),
		cmocka_unit_test_setup_teardown(unload_preloaded, start_preload, stop),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
