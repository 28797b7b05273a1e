/*
 * radiancectl against the real daemon: every command, human and --json
 * output (parsed with jansson), progress lines when stderr is not a TTY,
 * load --hold, the documented exit codes (0 ok, 1 failed, 2 usage,
 * 3 cannot reach the daemon), and what it says when things go wrong: usage
 * errors, a socket path that is not a socket, name clashes, files that are
 * not files, the daemon going away, its session limit, an unload the caller
 * may not do; with --json each of those also as an {"error": ...} object on
 * stdout.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
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
	snprintf(cmd, sizeof cmd, "timeout 60 %s %s >%s 2>%s </dev/null",
		 h_env("RADIANCECTL", "build/radiancectl"),
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

/* After a failed `radiancectl --json ...`: stdout is exactly one document,
 * {"error": {"code": code, "errno": errnum, "message": ..., "hint": ...}},
 * whose message contains msg and is a line of stderr (the text stays there
 * too), and whose hint contains hint (NULL: no hint at all). */
static void assert_json_error(const char *code, int errnum, const char *msg, const char *hint)
{
	json_error_t je;
	json_t *j = json_loads(out, 0, &je);
	if (!j)
		fprintf(stderr, "stdout is not one JSON document (%s): \"%s\"\n", je.text, out);
	assert_non_null(j);
	assert_int_equal(json_object_size(j), 1);
	json_t *e = json_object_get(j, "error");
	assert_true(json_is_object(e));
	const char *got_code = json_string_value(json_object_get(e, "code"));
	const char *got_msg = json_string_value(json_object_get(e, "message"));
	assert_non_null(got_code);
	assert_non_null(got_msg);
	assert_string_equal(got_code, code);
	assert_true(json_is_integer(json_object_get(e, "errno")));
	assert_int_equal(json_integer_value(json_object_get(e, "errno")), errnum);
	if (!strstr(got_msg, msg))
		fprintf(stderr, "message \"%s\" lacks \"%s\"\n", got_msg, msg);
	assert_non_null(strstr(got_msg, msg));
	char line[4096];
	snprintf(line, sizeof line, "radiancectl: %s\n", got_msg);
	assert_non_null(strstr(err, line));
	json_t *h = json_object_get(e, "hint");
	if (hint) {
		assert_non_null(json_string_value(h));
		assert_non_null(strstr(json_string_value(h), hint));
		assert_non_null(strstr(err, json_string_value(h)));
	} else {
		assert_null(h);
	}
	json_decref(j);
}

/* How many resident models `radiancectl --json models` lists. */
static size_t count_models(void)
{
	json_t *j = ctl_json("--socket %s --json models", "");
	size_t n = json_array_size(json_object_get(j, "models"));
	json_decref(j);
	return n;
}

/* Waits up to 2 s for the last model to go; returns how many are left. */
static size_t wait_no_models(void)
{
	size_t n = 1;
	for (int i = 0; i < 200 && n; i++) {
		n = count_models();
		if (n)
			h_sleep_ms(10);
	}
	return n;
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

/* This uid weighs 7 (sched_uid_weights by number). */
static int start_weighted(void **state)
{
	static char list[32];
	snprintf(list, sizeof list, "%u:7", (unsigned)getuid());
	const char *args[] = { "--sched-uid-weights", list, NULL };
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
	assert_int_equal(ctl("tensors"), 2);
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

/* Where nothing can be reached, the reason fits the path: no daemon
 * (nothing there, or a socket nobody listens on) gets "is radianced
 * running?"; a path that is not a socket at all (a regular file or a
 * directory: connect() says ECONNREFUSED for those too) is named as such,
 * without sending the user to look for a daemon. --json adds the error
 * object on stdout, with the same text and exit status 3. */
static void connect_errors(void **state)
{
	char dir[] = "/tmp/radiancectl-notsock-XXXXXX", file[128], sock[128], cmd[512];
	assert_non_null(mkdtemp(dir));
	snprintf(file, sizeof file, "%s/file.sock", dir);
	snprintf(sock, sizeof sock, "%s/dead.sock", dir);
	snprintf(cmd, sizeof cmd, "echo not a socket >%s", file);
	assert_int_equal(system(cmd), 0);
	/* a socket file whose listener is gone */
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	assert_true(strlen(sock) < sizeof sa.sun_path);
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);

	const char *const not_sockets[] = { file, dir };
	for (size_t i = 0; i < 2; i++) {
		char said[300];
		snprintf(said, sizeof said, "cannot connect to %s: %s exists and is not a socket",
			 not_sockets[i], not_sockets[i]);
		assert_int_equal(ctl("--socket %s status", not_sockets[i]), 3);
		assert_non_null(strstr(err, said));
		assert_null(strstr(err, "is radianced running"));
		assert_null(strstr(err, "Connection refused"));
		assert_string_equal(out, "");
		assert_int_equal(ctl("--json --socket %s status", not_sockets[i]), 3);
		assert_json_error("ENOTSOCK", ENOTSOCK, said, NULL);
	}

	assert_int_equal(ctl("--socket %s models", sock), 3);
	assert_non_null(strstr(err, "Connection refused"));
	assert_non_null(strstr(err, "is radianced running?"));
	assert_int_equal(ctl("--json --socket %s models", sock), 3);
	assert_json_error("ECONNREFUSED", ECONNREFUSED, "Connection refused", "is radianced running?");

	assert_int_equal(ctl("--socket %s/missing.sock stats", dir), 3);
	assert_non_null(strstr(err, "is radianced running?"));
	assert_int_equal(ctl("--socket %s/missing.sock --json stats", dir), 3);
	assert_json_error("ENOENT", ENOENT, "/missing.sock", "is radianced running?");

	unlink(file);
	unlink(sock);
	assert_int_equal(rmdir(dir), 0);
}

/* A daemon that accepts connections but does not answer (SIGSTOPped here;
 * wedged, or a listener that is no daemon): radiancectl gives up after
 * --timeout (10 s by default) with exit status 3, the limit and a hint, and
 * stats --prometheus --output writes radiance_up 0. It used to wait for
 * ever: a wedged daemon hung radiance-metrics.service (a oneshot, no start
 * timeout) and the collector's file kept its last radiance_up 1. The
 * commands run under timeout(1) so that a hang fails the test (124). */
static void daemon_not_answering(void **state)
{
	char prom[160];
	snprintf(prom, sizeof prom, "%s/metrics.prom", daemon_.dir);
	assert_int_equal(ctl("--socket %s status", daemon_.socket), 0);
	assert_int_equal(kill(daemon_.pid, SIGSTOP), 0);

	double t0 = h_now();
	assert_int_equal(ctl("--socket %s --timeout 1 status", daemon_.socket), 3);
	double took = h_now() - t0;
	assert_true(took >= 0.9 && took < 8);
	assert_non_null(strstr(err, "no reply to hello within 1000 ms"));
	assert_non_null(strstr(err, "accepts connections but does not answer"));
	assert_int_equal(ctl("--json --socket %s -t 0.5 models", daemon_.socket), 3);
	assert_json_error("ETIMEDOUT", ETIMEDOUT, "within 500 ms", "does not answer");

	/* the default limit, as the metrics service runs it */
	t0 = h_now();
	assert_int_equal(ctl("--socket %s stats --prometheus --output %s", daemon_.socket, prom), 3);
	took = h_now() - t0;
	assert_true(took >= 9.5 && took < 25);
	assert_non_null(strstr(err, "within 10000 ms"));
	slurp(prom, out, sizeof out);
	assert_non_null(strstr(out, "\nradiance_up 0\n"));

	assert_int_equal(ctl("--socket %s --timeout x status", daemon_.socket), 2);
	assert_non_null(strstr(err, "--timeout 'x' is not a number of seconds"));
	assert_int_equal(ctl("--socket %s --timeout -1 status", daemon_.socket), 2);

	/* the daemon itself is unharmed by the connections given up on */
	assert_int_equal(kill(daemon_.pid, SIGCONT), 0);
	assert_int_equal(ctl("--socket %s --timeout 0 status", daemon_.socket), 0);
	assert_int_equal(ctl("--socket %s stats --prometheus --output %s", daemon_.socket, prom), 0);
	slurp(prom, out, sizeof out);
	assert_non_null(strstr(out, "\nradiance_up 1\n"));
	unlink(prom);
}

static int stop_continued(void **state)
{
	kill(daemon_.pid, SIGCONT);
	return stop(state);
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
	/* the figures of the text output's "requests:" line */
	assert_true(json_is_integer(json_object_get(j, "requests")));
	assert_true(json_is_integer(json_object_get(j, "errors")));
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
	assert_string_equal(out, "");
	assert_int_equal(ctl("--socket %s --json layers no-such-model", daemon_.socket), 1);
	assert_json_error("ENOENT", ENOENT, "no resident model \"no-such-model\"", NULL);

	/* the shared tensors: the inventory, with sizes and aligned offsets
	 * inside the memfd, which is the model's resident bytes beyond its
	 * layers' */
	j = ctl_json("--socket %s --json layers %s", "minilm-w4g128");
	json_t *inv = json_object_get(j, "other_tensors");
	json_int_t layer_bytes = 0, resident = json_integer_value(json_object_get(j, "resident_bytes"));
	json_t *l;
	size_t li;
	json_array_foreach(json_object_get(j, "layers"), li, l)
		layer_bytes += json_integer_value(json_object_get(l, "bytes"));
	json_t *t = ctl_json("--socket %s --json tensors %s", "minilm-w4g128");
	json_t *tensors = json_object_get(t, "tensors");
	assert_int_equal(json_array_size(tensors), json_array_size(inv));
	assert_int_equal(json_integer_value(json_object_get(t, "bytes")), resident - layer_bytes);
	json_int_t end = 0;
	for (size_t i = 0; i < json_array_size(tensors); i++) {
		json_t *x = json_array_get(tensors, i);
		assert_string_equal(json_string_value(json_object_get(x, "name")),
				    json_string_value(json_object_get(json_array_get(inv, i), "name")));
		json_int_t off = json_integer_value(json_object_get(x, "offset"));
		assert_int_equal(off % 64, 0);
		assert_true(off >= end);
		end = off + json_integer_value(json_object_get(x, "bytes"));
	}
	assert_true(end <= json_integer_value(json_object_get(t, "bytes")));
	json_decref(t);
	json_decref(j);
	assert_int_equal(ctl("--socket %s tensors minilm-w4g128", daemon_.socket), 0);
	assert_non_null(strstr(out, "29 shared tensors"));
	assert_non_null(strstr(out, "embeddings.word_embeddings.weight                        BF16  [30522, 384]"));
	assert_int_equal(ctl("--socket %s tensors no-such-model", daemon_.socket), 1);
	assert_non_null(strstr(err, "no resident model"));

	j = ctl_json("--socket %s --json stats", "");
	assert_non_null(json_object_get(json_object_get(j, "global"), "requests"));
	assert_true(json_integer_value(json_object_get(json_object_get(j, "global"), "uptime_ns")) > 0);
	assert_true(json_is_array(json_object_get(j, "sessions")));
	/* no sched_uid_weights: every uid weighs 1 (radiancectl's own session
	 * is in the list) */
	json_t *ses;
	size_t si;
	assert_true(json_array_size(json_object_get(j, "sessions")) >= 1);
	json_array_foreach(json_object_get(j, "sessions"), si, ses)
		assert_int_equal(json_integer_value(json_object_get(ses, "weight")), 1);
	json_decref(j);
	assert_int_equal(ctl("--socket %s stats", daemon_.socket), 0);
	assert_non_null(strstr(out, "all sessions"));
}

/* stats shows each session's uid and its sched_uid_weights weight: a client
 * of this uid (weight 7 by start_weighted) and radiancectl's own session,
 * in --json and in the text's UID and WEIGHT columns. */
static void stats_weights(void **state)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "weighed";
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	json_t *j = ctl_json("--socket %s --json stats", "");
	json_t *ses, *list = json_object_get(j, "sessions");
	size_t si;
	int seen = 0;
	assert_int_equal(json_array_size(list), 2);
	json_array_foreach(list, si, ses) {
		assert_int_equal(json_integer_value(json_object_get(ses, "uid")), getuid());
		assert_int_equal(json_integer_value(json_object_get(ses, "weight")), 7);
		seen += !strcmp(json_string_value(json_object_get(ses, "client_name")), "weighed");
	}
	assert_int_equal(seen, 1);
	json_decref(j);

	assert_int_equal(ctl("--socket %s stats", daemon_.socket), 0);
	assert_non_null(strstr(out, "UID WEIGHT"));
	assert_non_null(strstr(out, "\nSESSION NAME PID "));   /* every column has a header */
	/* the session rows in id order: "weighed" connected before radiancectl */
	const char *row = strstr(strstr(out, "all sessions"), "\n");
	unsigned long long prev = 0, id;
	int rows = 0;
	while (row && sscanf(row + 1, "%llu", &id) == 1) {
		assert_true(id > prev);
		prev = id;
		rows++;
		row = strchr(row + 1, '\n');
	}
	assert_int_equal(rows, 2);
	const char *line = strstr(out, " weighed pid ");
	assert_non_null(line);
	while (line > out && line[-1] != '\n')
		line--;
	unsigned uid = ~0u, weight = 0;
	assert_int_equal(sscanf(line + 28, "%u %u", &uid, &weight), 2);
	assert_int_equal(uid, getuid());
	assert_int_equal(weight, 7);
	/* the global row has neither */
	const char *all = strstr(out, "all sessions");
	assert_non_null(all);
	char u[8], w[8];
	assert_int_equal(sscanf(all + 28, "%7s %7s", u, w), 2);
	assert_string_equal(u, "-");
	assert_string_equal(w, "-");
	radiance_disconnect(r);
}

/* Runs cmd under /bin/sh in a child (`exec` in cmd makes the child the
 * command itself, so signalling the pid reaches it). Returns the pid. */
static pid_t start_shell(const char *cmd)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void load_and_unload(void **state)
{
	/* not a TTY: plain progress lines on stderr, ending at 100% */
	assert_int_equal(ctl("--socket %s load %s", daemon_.socket, ckpt), 0);
	assert_non_null(strstr(err, "loading: 100%"));
	assert_non_null(strstr(out, "minilm-w4g128"));
	assert_non_null(strstr(out, "unloaded when radiancectl exits"));
	/* ... and it was: nobody else held it */
	assert_int_equal(count_models(), 0);

	json_t *j = ctl_json("--socket %s --json load %s", ckpt);
	assert_int_equal(json_integer_value(json_object_get(j, "layers")), 37);
	json_decref(j);
	assert_int_equal(ctl("--socket %s load --name other %s", daemon_.socket, ckpt), 0);
	assert_non_null(strstr(out, "\"other\""));
	/* "DIR/." is named after DIR: "." is no model name */
	assert_int_equal(ctl("--socket %s load %s/.", daemon_.socket, ckpt), 0);
	assert_non_null(strstr(out, "\"minilm-w4g128\""));
	assert_int_equal(ctl("--socket %s load /nonexistent/ckpt", daemon_.socket), 1);
	assert_int_equal(ctl("--socket %s --json load /nonexistent/ckpt", daemon_.socket), 1);
	assert_json_error("ENOENT", ENOENT, "cannot load /nonexistent/ckpt", NULL);

	/* --hold keeps it until SIGTERM */
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "exec %s --socket %s load --hold %s >/dev/null 2>&1",
		 h_env("RADIANCECTL", "build/radiancectl"), daemon_.socket, ckpt);
	pid_t holder = start_shell(cmd);
	size_t n = 0;
	for (int i = 0; i < 500 && n == 0; i++) {
		h_sleep_ms(10);
		n = count_models();
	}
	assert_int_equal(n, 1);
	/* a client-loaded model cannot be unloaded from outside */
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 1);
	assert_non_null(strstr(err, "not preloaded"));
	assert_int_equal(ctl("--socket %s --json unload minilm-w4g128", daemon_.socket), 1);
	assert_json_error("ENOENT", ENOENT, "is not preloaded", NULL);
	kill(holder, SIGTERM);
	int st;
	assert_int_equal(waitpid(holder, &st, 0), holder);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(wait_no_models(), 0);
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 1);
}

/* The daemon's hold on a preloaded model is dropped by unload (root here);
 * the model goes once no session uses it. */
static void unload_preloaded(void **state)
{
	assert_int_equal(count_models(), 1);
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 0);
	assert_non_null(strstr(out, "unloaded"));
	assert_int_equal(wait_no_models(), 0);
	/* gone: a second unload finds nothing */
	assert_int_equal(ctl("--socket %s unload minilm-w4g128", daemon_.socket), 1);
}

/* Usage errors are one line and a pointer to --help (exit 2), without
 * argv[0]'s path and without the whole usage text. */
static void usage_errors_are_one_line(void **state)
{
	static const char *const cases[][2] = {
		{ "--bogus status", "unknown option '--bogus'" },
		{ "layers -1", "unknown option '-1'" },
		{ "-x status", "unknown option '-x'" },
		{ "--json=1 status", "option '--json' takes no argument" },
		{ "status --socket", "option '--socket' needs an argument" },
		{ "--socket '' status", "--socket needs a path" },
		{ "load --name '' /some/dir", "--name needs a model name" },
		{ "load --name a/b /some/dir", "--name \"a/b\" has a '/' at byte 1; a model name is" },
		{ "load --name ' ' /some/dir", "--name \" \" begins with a space" },
		{ "load --name .. /some/dir", "--name \"..\" is a directory's name" },
		{ "layers ''", "layers needs a model name or id" },
		{ "", "no command given" },
		{ "frobnicate", "unknown command \"frobnicate\"" },
		{ "status extra", "status takes no arguments" },
		{ "layers", "layers takes one argument" },
		{ "--hold status", "--name and --hold belong to load" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		int rc = ctl("%s", cases[i][0]);
		if (rc != 2 || !strstr(err, cases[i][1]))
			fprintf(stderr, "radiancectl %s -> %d: %s", cases[i][0], rc, err);
		assert_int_equal(rc, 2);
		assert_non_null(strstr(err, cases[i][1]));
		assert_int_equal(strncmp(err, "radiancectl: ", 13), 0);
		assert_non_null(strstr(err, "Try 'radiancectl --help'"));
		assert_null(strstr(err, "Usage:"));
		/* exactly two lines */
		char *nl = strchr(err, '\n');
		assert_non_null(nl);
		nl = strchr(nl + 1, '\n');
		assert_non_null(nl);
		assert_int_equal(nl[1], '\0');
		assert_string_equal(out, "");
	}
}

/* stats: singular/plural, and p50/p99 as the bucket bounds they are. */
static void stats_format(void **state)
{
	struct h_ref ref;
	static const char *const one[] = { "encoder.layer.0.attention.self.query", NULL };
	assert_int_equal(h_ref_load_some(&ref, one), 0);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(h_check_layer(r, id, &ref.layers[0], RADIANCE_BF16, NULL), 0);
	radiance_disconnect(r);
	h_ref_free(&ref);
	assert_int_equal(ctl("--socket %s stats", daemon_.socket), 0);
	assert_null(strstr(out, "1 live sessions"));
	assert_non_null(strstr(out, "live session"));
	assert_non_null(strstr(out, "upper bounds of histogram buckets"));
	/* the global row had requests: "<=N" whole microseconds */
	const char *all = strstr(out, "all sessions");
	assert_non_null(all);
	assert_non_null(strstr(all, "<="));
	assert_null(strstr(all, ".1 "));   /* no fake tenths on p50/p99 */

	/* status --json carries the figures of status's text, the request and
	 * error counts among them (the 10 layers above, none refused) */
	assert_int_equal(ctl("--socket %s status", daemon_.socket), 0);
	const char *line = strstr(out, "requests:");
	assert_non_null(line);
	unsigned long long requests = 0, errors = 1;
	assert_int_equal(sscanf(line, "requests: %llu (%llu errors)", &requests, &errors), 2);
	assert_int_equal(requests, 10);
	assert_int_equal(errors, 0);
	json_t *j = ctl_json("--socket %s --json status", "");
	assert_true(json_is_integer(json_object_get(j, "requests")));
	assert_true(json_is_integer(json_object_get(j, "errors")));
	assert_int_equal(json_integer_value(json_object_get(j, "requests")), requests);
	assert_int_equal(json_integer_value(json_object_get(j, "errors")), errors);
	json_decref(j);
}

/* A checkpoint file that is not a regular file is named, quickly (a FIFO
 * must not hang the open). */
static void load_not_regular_file(void **state)
{
	char dir[128], cmd[2048];
	snprintf(dir, sizeof dir, "%s/fifo-ckpt", daemon_.dir);
	snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/ && mkfifo %s/model.safetensors",
		 dir, ckpt, dir, dir);
	assert_int_equal(system(cmd), 0);
	double t = h_now();
	assert_int_equal(ctl("--socket %s load %s", daemon_.socket, dir), 1);
	assert_true(h_now() - t < 5.0);
	assert_non_null(strstr(err, "model.safetensors is not a regular file"));
}

/* A copy of the checkpoint (other inodes, same basename) in the daemon's
 * directory, its path in copy[n], and a session of the test's own to load
 * or attach with (radiance_disconnect it). */
static struct radiance *copy_checkpoint_and_connect(char *copy, size_t n)
{
	char cmd[4096];
	snprintf(copy, n, "%s/" H_CHECKPOINT, daemon_.dir);
	snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/quantization_config.json "
		 "%s/model.safetensors %s/", copy, ckpt, ckpt, ckpt, copy);
	assert_int_equal(system(cmd), 0);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	return r;
}

/* Names: other files under a resident model's name are refused with a hint;
 * the resident model's files under another name attach to it. */
static void load_name_clash(void **state)
{
	char copy[128];
	/* a session of our own keeps the original resident */
	struct radiance *r = copy_checkpoint_and_connect(copy, sizeof copy);
	uint32_t id;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);

	assert_int_equal(ctl("--socket %s load %s", daemon_.socket, copy), 1);
	assert_non_null(strstr(err, "a different checkpoint named"));
	assert_non_null(strstr(err, "load --name NAME"));
	assert_int_equal(ctl("--socket %s --json load %s", daemon_.socket, copy), 1);
	assert_json_error("EEXIST", EEXIST, "a different checkpoint named", "load --name NAME");
	assert_int_equal(ctl("--socket %s load --name other-name %s", daemon_.socket, ckpt), 0);
	assert_non_null(strstr(out, "already resident as \"" H_CHECKPOINT "\""));
	radiance_disconnect(r);
}

/* A model may be named with digits: "1" as the name of one model and the id
 * of another is refused as ambiguous (exit 1, EINVAL, both named), not
 * resolved to the name; each is still reached by its other handle. */
static void model_name_that_is_another_id(void **state)
{
	char copy[128];
	struct radiance *r = copy_checkpoint_and_connect(copy, sizeof copy);
	/* the preload's id, as text: the name the copy is loaded under */
	uint32_t pre;
	assert_int_equal(radiance_attach_model(r, H_CHECKPOINT, &pre), 0);
	char pre_id[16];
	snprintf(pre_id, sizeof pre_id, "%" PRIu32, pre);
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.name = pre_id;
	uint32_t id;
	assert_int_equal(radiance_load_model(r, copy, &lo, &id), 0);
	assert_int_not_equal(id, pre);

	const char *const cmds[] = { "layers", "tensors", "unload" };
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(ctl("--socket %s %s %s", daemon_.socket, cmds[i], pre_id), 1);
		char said[300];
		snprintf(said, sizeof said, "\"%s\" is ambiguous: the name of model %" PRIu32
			 " and the id of model %" PRIu32 " \"" H_CHECKPOINT "\"", pre_id, id, pre);
		assert_non_null(strstr(err, said));
		assert_int_equal(ctl("--json --socket %s %s %s", daemon_.socket, cmds[i], pre_id), 1);
		assert_json_error("EINVAL", EINVAL, said, "for the model named");
	}
	/* nothing was unloaded; each is reached by its other handle */
	assert_int_equal(count_models(), 2);
	assert_int_equal(ctl("--socket %s layers %" PRIu32, daemon_.socket, id), 0);
	char line[64];
	snprintf(line, sizeof line, "model %" PRIu32 " \"%s\"", id, pre_id);
	assert_non_null(strstr(out, line));
	assert_int_equal(ctl("--socket %s layers " H_CHECKPOINT, daemon_.socket), 0);
	snprintf(line, sizeof line, "model %" PRIu32 " \"" H_CHECKPOINT "\"", pre);
	assert_non_null(strstr(out, line));
	radiance_disconnect(r);
}

/* The daemon stops under load --hold: a clear message, exit 3. With --json
 * stdout has the load's document, then the error object. */
static void hold_until_daemon_stops(bool json)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "exec %s --socket %s %s load --hold %s >%s 2>%s",
		 h_env("RADIANCECTL", "build/radiancectl"), daemon_.socket, json ? "--json" : "",
		 ckpt, out_path, err_path);
	pid_t holder = start_shell(cmd);
	/* wait until it holds the model (its stdout says so) */
	const char *holding = json ? "\"held\": true" : "holding model";
	for (int i = 0; i < 500; i++) {
		slurp(out_path, out, sizeof out);
		if (strstr(out, holding))
			break;
		h_sleep_ms(10);
	}
	assert_non_null(strstr(out, holding));
	assert_int_equal(kill(daemon_.pid, SIGTERM), 0);
	assert_int_equal(h_daemon_wait(&daemon_, 10.0), 1);
	int st;
	assert_int_equal(waitpid(holder, &st, 0), holder);
	slurp(err_path, err, sizeof err);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 3);
	assert_non_null(strstr(err, "the daemon stopped while holding model"));
	assert_non_null(strstr(err, "(daemon stopping: SIGTERM)"));
	assert_null(strstr(err, "Broken pipe"));
	if (!json)
		return;
	slurp(out_path, out, sizeof out);
	json_error_t je;
	json_t *load = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
	assert_non_null(load);
	assert_true(json_is_true(json_object_get(load, "held")));
	json_decref(load);
	memmove(out, out + je.position, strlen(out + je.position) + 1);
	assert_json_error("ESHUTDOWN", ESHUTDOWN, "the daemon stopped while holding model",
			  NULL);
}

static void hold_when_daemon_goes_away(void **state)
{
	hold_until_daemon_stops(false);
}

static void hold_json_when_daemon_goes_away(void **state)
{
	hold_until_daemon_stops(true);
}

/* A daemon's refusal of the connection reaches radiancectl: exit 3, its
 * words on stderr and in --json. The session limit is only the way to make
 * the daemon refuse; the limit itself is tested in test_hardening
 * (session_limit_refusal_is_clean). */
static void refusal_reaches_ctl(void **state)
{
	/* daemon: --max-sessions 1; wait for the harness's probe to be gone */
	struct radiance *r = NULL;
	for (int i = 0; i < 200 && !r; i++) {
		struct radiance_options o = RADIANCE_OPTIONS_INIT;
		if (!(r = radiance_connect(daemon_.socket, &o)))
			h_sleep_ms(10);
	}
	assert_non_null(r);
	assert_int_equal(ctl("--socket %s status", daemon_.socket), 3);
	assert_non_null(strstr(err, "too many sessions (the limit is 1)"));
	assert_int_equal(ctl("--json --socket %s status", daemon_.socket), 3);
	assert_json_error("EBUSY", EBUSY, "too many sessions (the limit is 1)", NULL);
	radiance_disconnect(r);
}

/* Whether radiancectl can be run as uid 65534 here (root, setpriv, a binary
 * that user may execute); its absolute path in bin[n]. When not, says why
 * for test and returns false (the caller skips). */
static bool nobody_can_run_ctl(const char *test, char *bin, size_t n)
{
	if (geteuid() != 0 || system("command -v setpriv >/dev/null 2>&1") != 0) {
		printf("# %s: needs root and setpriv to run radiancectl as uid 65534: skipped\n",
		       test);
		return false;
	}
	const char *ctlbin = h_env("RADIANCECTL", "build/radiancectl");
	char abs[PATH_MAX];
	if (!realpath(ctlbin, abs) || strlen(abs) >= n) {
		printf("# %s: cannot resolve %s: skipped\n", test, ctlbin);
		return false;
	}
	memcpy(bin, abs, strlen(abs) + 1);
	char probe[PATH_MAX + 100];
	snprintf(probe, sizeof probe, "setpriv --reuid=65534 --regid=65534 --clear-groups "
		 "test -x %s", bin);
	if (system(probe) != 0) {
		printf("# %s: uid 65534 cannot reach %s (a build tree under /root, say): "
		       "skipped\n", test, bin);
		return false;
	}
	return true;
}

/* unload by a user who may not: says who may, exit 1. */
static void unload_not_permitted(void **state)
{
	char bin[1024];
	if (!nobody_can_run_ctl("unload_not_permitted", bin, sizeof bin))
		skip();
	/* let uid 65534 reach the socket (the daemon, as root, allows it) */
	assert_int_equal(chmod(daemon_.dir, 0711), 0);
	assert_int_equal(chmod(daemon_.socket, 0666), 0);
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "setpriv --reuid=65534 --regid=65534 --clear-groups %s --socket %s "
		 "unload " H_CHECKPOINT " >%s 2>%s </dev/null", bin, daemon_.socket, out_path, err_path);
	int st = system(cmd);
	slurp(err_path, err, sizeof err);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_non_null(strstr(err, "not allowed to unload model"));
	assert_non_null(strstr(err, "only root or the user radianced runs as"));
	assert_non_null(strstr(err, "uid 65534"));
	/* still there */
	assert_int_equal(count_models(), 1);
}

/* A user the socket's mode keeps out: Permission denied, exit 3, and
 * libradiance's message says what lets a user in (the daemon's group), with
 * no "is radianced running?" hint. */
static void connect_permission_denied(void **state)
{
	char bin[1024];
	if (!nobody_can_run_ctl("connect_permission_denied", bin, sizeof bin))
		skip();
	/* the directory lets uid 65534 through; the socket (0600, root) does not */
	assert_int_equal(chmod(daemon_.dir, 0711), 0);
	for (int json = 0; json < 2; json++) {
		char cmd[2048];
		snprintf(cmd, sizeof cmd, "setpriv --reuid=65534 --regid=65534 --clear-groups %s "
			 "--socket %s %s status >%s 2>%s </dev/null", bin, daemon_.socket,
			 json ? "--json" : "", out_path, err_path);
		int st = system(cmd);
		slurp(out_path, out, sizeof out);
		slurp(err_path, err, sizeof err);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 3);
		assert_non_null(strstr(err, "Permission denied"));
		assert_null(strstr(err, "is radianced running"));
		assert_non_null(strstr(err, "uid 65534 may not connect"));
		assert_non_null(strstr(err, "--group"));
		if (json)
			assert_json_error("EACCES", EACCES, "Permission denied: uid 65534 may not "
					  "connect", NULL);
	}
}

static int start_one_session(void **state)
{
	static const char *const args[] = { "--max-sessions", "1", NULL };
	return h_daemon_start_argv(&daemon_, args);
}

static int stop_after_sigterm(void **state)
{
	h_daemon_stop(&daemon_);   /* already exited: only removes the directory */
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(usage_and_exit_codes),
		cmocka_unit_test(connect_errors),
		cmocka_unit_test_setup_teardown(daemon_not_answering, start, stop_continued),
		cmocka_unit_test_setup_teardown(status_models_layers_stats, start_preload, stop),
		cmocka_unit_test_setup_teardown(load_and_unload, start, stop),
		cmocka_unit_test_setup_teardown(unload_preloaded, start_preload, stop),
		cmocka_unit_test(usage_errors_are_one_line),
		cmocka_unit_test_setup_teardown(stats_format, start, stop),
		cmocka_unit_test_setup_teardown(stats_weights, start_weighted, stop),
		cmocka_unit_test_setup_teardown(load_not_regular_file, start, stop),
		cmocka_unit_test_setup_teardown(load_name_clash, start, stop),
		cmocka_unit_test_setup_teardown(hold_when_daemon_goes_away, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(hold_json_when_daemon_goes_away, start,
						stop_after_sigterm),
		cmocka_unit_test_setup_teardown(refusal_reaches_ctl, start_one_session, stop),
		cmocka_unit_test_setup_teardown(unload_not_permitted, start_preload, stop),
		cmocka_unit_test_setup_teardown(model_name_that_is_another_id, start_preload, stop),
		cmocka_unit_test_setup_teardown(connect_permission_denied, start, stop),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
