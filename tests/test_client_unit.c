/*
 * libradiance without a daemon: the arena allocator, the checkpoint file
 * list LoadModel sends (checked against the loader's own list), the default
 * socket path rules, error texts, connect failures (a path that is not a
 * socket named as such), and how the daemon's reasons reach the caller when
 * it refuses a connection or ends a session (a scripted fake daemon in a
 * child process).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "client-private.h"
#include "io.h"
#include "proto_util.h"
#include "radiance.h"
#include "raw_client.h"
#include "wire.h"

/* --- arena ---------------------------------------------------------------- */

static void arena_first_fit_and_merge(void **state)
{
	static uint8_t mem[4096] __attribute__((aligned(64)));
	struct radiance__client_arena a;
	assert_int_equal(radiance__client_arena_init(&a, mem, sizeof mem), 0);

	uint8_t *p1 = radiance__client_arena_alloc(&a, 100);   /* rounds to 128 */
	uint8_t *p2 = radiance__client_arena_alloc(&a, 64);
	uint8_t *p3 = radiance__client_arena_alloc(&a, 1);
	assert_ptr_equal(p1, mem);
	assert_ptr_equal(p2, mem + 128);
	assert_ptr_equal(p3, mem + 192);
	assert_int_equal(radiance__client_arena_largest_free(&a), 4096 - 256);

	/* freeing the middle block leaves a hole that a fitting request reuses */
	assert_int_equal(radiance__client_arena_free(&a, p2), 0);
	assert_ptr_equal(radiance__client_arena_alloc(&a, 50), mem + 128);
	assert_int_equal(radiance__client_arena_free(&a, mem + 128), 0);

	/* double free, interior pointers and foreign pointers are refused */
	assert_int_equal(radiance__client_arena_free(&a, p2), -EINVAL);
	assert_int_equal(radiance__client_arena_free(&a, p1 + 64), -EINVAL);
	assert_int_equal(radiance__client_arena_free(&a, mem + sizeof mem), -EINVAL);
	assert_int_equal(radiance__client_arena_free(&a, &a), -EINVAL);

	/* everything freed: one extent again, the whole arena allocatable */
	assert_int_equal(radiance__client_arena_free(&a, p1), 0);
	assert_int_equal(radiance__client_arena_free(&a, p3), 0);
	assert_int_equal(a.n, 1);
	assert_ptr_equal(radiance__client_arena_alloc(&a, sizeof mem), mem);
	assert_null(radiance__client_arena_alloc(&a, 1));
	assert_null(radiance__client_arena_alloc(&a, 0));
	radiance__client_arena_finish(&a);
}

static void arena_random_stress(void **state)
{
	enum { BYTES = 1 << 20, SLOTS = 64 };
	uint8_t *mem = aligned_alloc(64, BYTES);
	struct radiance__client_arena a;
	assert_int_equal(radiance__client_arena_init(&a, mem, BYTES), 0);
	uint8_t *ptr[SLOTS] = { 0 };
	size_t len[SLOTS] = { 0 };
	unsigned seed = 12345;
	for (int it = 0; it < 20000; it++) {
		seed = seed * 1103515245u + 12345u;
		int i = (int)((seed >> 8) % SLOTS);
		if (ptr[i]) {
			/* contents survived: no overlap with any other block */
			for (size_t j = 0; j < len[i]; j++)
				assert_int_equal(ptr[i][j], (uint8_t)i);
			assert_int_equal(radiance__client_arena_free(&a, ptr[i]), 0);
			ptr[i] = NULL;
		} else {
			len[i] = 1 + (seed >> 12) % 40000;
			ptr[i] = radiance__client_arena_alloc(&a, len[i]);
			if (ptr[i]) {
				assert_int_equal((uintptr_t)ptr[i] % 64, 0);
				assert_true(ptr[i] + len[i] <= mem + BYTES);
				memset(ptr[i], i, len[i]);
			}
		}
	}
	for (int i = 0; i < SLOTS; i++)
		if (ptr[i])
			assert_int_equal(radiance__client_arena_free(&a, ptr[i]), 0);
	assert_int_equal(a.n, 1);
	assert_int_equal(radiance__client_arena_largest_free(&a), BYTES);
	radiance__client_arena_finish(&a);
	free(mem);
}

/* --- checkpoint files ----------------------------------------------------- */

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void rm_dir(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void checkpoint_files_real(void **state)
{
	char dir[512], **names, err[256];
	snprintf(dir, sizeof dir, "%s/minilm-w4g128",
		 getenv("RADIANCE_TEST_DATA") ? getenv("RADIANCE_TEST_DATA") : "tests/data");
	assert_int_equal(rcheckpoint_list_files(dir, &names, err, sizeof err), 3);
	/* configs and weights only: tokenizer files stay home */
	assert_string_equal(names[0], "config.json");
	assert_string_equal(names[1], "quantization_config.json");
	assert_string_equal(names[2], "model.safetensors");
	assert_null(names[3]);
	rcheckpoint_files_free(names);
}

static void checkpoint_files_sharded(void **state)
{
	char dir[] = "/tmp/radiance-ckpt-XXXXXX", **names, err[256];
	assert_non_null(mkdtemp(dir));
	write_file(dir, "config.json", "{}");
	write_file(dir, "model.safetensors.index.json",
		   "{\"metadata\": {}, \"weight_map\": {\"b\": \"model-00002-of-00002.safetensors\","
		   " \"a\": \"model-00001-of-00002.safetensors\","
		   " \"c\": \"model-00001-of-00002.safetensors\"}}");
	write_file(dir, "model-00001-of-00002.safetensors", "");
	write_file(dir, "model-00002-of-00002.safetensors", "");
	write_file(dir, "tokenizer.json", "{}");
	assert_int_equal(rcheckpoint_list_files(dir, &names, err, sizeof err), 4);
	assert_string_equal(names[0], "config.json");
	assert_string_equal(names[1], "model.safetensors.index.json");
	assert_string_equal(names[2], "model-00001-of-00002.safetensors");
	assert_string_equal(names[3], "model-00002-of-00002.safetensors");
	assert_null(names[4]);
	rcheckpoint_files_free(names);

	/* a shard name with a path in it is refused (it would escape dir) */
	write_file(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"a\": \"../etc/passwd\"}}");
	assert_int_equal(rcheckpoint_list_files(dir, &names, err, sizeof err), -EINVAL);
	assert_null(names);

	/* a shard name is a plain basename: "..", "." and "" are refused too,
	 * and so is an index that names no shard at all */
	static const char *const bad[] = {
		"{\"weight_map\": {\"a\": \"..\"}}",
		"{\"weight_map\": {\"a\": \".\"}}",
		"{\"weight_map\": {\"a\": \"\"}}",
		"{\"weight_map\": {\"a\": 7}}",
		"{\"weight_map\": {}}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		write_file(dir, "model.safetensors.index.json", bad[i]);
		names = (void *)1;
		int rc = rcheckpoint_list_files(dir, &names, err, sizeof err);
		if (rc != -EINVAL)
			fprintf(stderr, "index %s: rc %d, \"%s\"\n", bad[i], rc, err);
		assert_int_equal(rc, -EINVAL);
		assert_null(names);
		assert_non_null(strstr(err, "model.safetensors.index.json"));
		assert_non_null(strstr(err, "weight_map"));
	}
	rm_dir(dir);
}

/* The model name a directory gives: its last component as written. */
static void checkpoint_dir_name(void **state)
{
	static const struct {
		const char *dir, *name;
	} cases[] = {
		{ "/models/minilm-w4g128", "minilm-w4g128" },
		{ "/models/minilm-w4g128///", "minilm-w4g128" },
		{ "minilm", "minilm" },
		{ "./a/b/", "b" },
		{ "/", "" },
		{ "", "" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		size_t len;
		const char *s = rcheckpoint_dir_name(cases[i].dir, &len);
		char got[64];
		snprintf(got, sizeof got, "%.*s", (int)len, s);
		assert_string_equal(got, cases[i].name);
	}
	assert_true(rcheckpoint_shard_name_ok("model-00001-of-00002.safetensors"));
	assert_true(rcheckpoint_shard_name_ok("..model"));
	assert_false(rcheckpoint_shard_name_ok(".."));
	assert_false(rcheckpoint_shard_name_ok("."));
	assert_false(rcheckpoint_shard_name_ok(""));
	assert_false(rcheckpoint_shard_name_ok("../x"));
	assert_false(rcheckpoint_shard_name_ok("sub/x"));
}

static void checkpoint_files_missing(void **state)
{
	char dir[] = "/tmp/radiance-ckpt-XXXXXX", **names, err[256];
	assert_non_null(mkdtemp(dir));
	assert_int_equal(rcheckpoint_list_files(dir, &names, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "config.json"));
	write_file(dir, "config.json", "{}");
	assert_int_equal(rcheckpoint_list_files(dir, &names, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "model.safetensors"));
	assert_int_equal(rcheckpoint_list_files("/nonexistent/dir", &names, err,
							   sizeof err),
			 -ENOENT);
	rm_dir(dir);
}

/* A directory given with a trailing '/' (or "/" itself: `radiancectl load
 * /`) is named with one '/' before the file in every message, and
 * rio_path_join, which every join site uses, puts exactly one there. */
static void checkpoint_files_trailing_slash(void **state)
{
	static const struct {
		const char *dir, *name, *want;
	} cases[] = {
		{ "/", "config.json", "/config.json" },
		{ "//", "config.json", "/config.json" },
		{ "ckpt/", "config.json", "ckpt/config.json" },
		{ "/m/ckpt///", "a", "/m/ckpt/a" },
		{ "/m/ckpt", "a", "/m/ckpt/a" },
		{ "", "a", "a" },
	};
	char got[64];
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		assert_int_equal(rio_path_join(got, sizeof got, cases[i].dir, cases[i].name), 0);
		assert_string_equal(got, cases[i].want);
	}
	assert_int_equal(rio_path_join(got, 8, "/models", "config.json"), -ENAMETOOLONG);
	assert_string_equal(got, "/models");

	char dir[] = "/tmp/radiance-ckpt-XXXXXX", slashed[64], want[96], **names, err[512];
	assert_non_null(mkdtemp(dir));
	snprintf(slashed, sizeof slashed, "%s//", dir);
	snprintf(want, sizeof want, "%s/config.json: not found", dir);
	assert_int_equal(rcheckpoint_list_files(slashed, &names, err, sizeof err), -ENOENT);
	assert_int_equal(strncmp(err, want, strlen(want)), 0);
	assert_null(strstr(err, "//"));
	/* the index's messages too */
	write_file(dir, "config.json", "{}");
	write_file(dir, "model.safetensors.index.json", "{\"weight_map\": {}}");
	assert_int_equal(rcheckpoint_list_files(slashed, &names, err, sizeof err), -EINVAL);
	snprintf(want, sizeof want, "%s/model.safetensors.index.json: empty weight_map", dir);
	assert_non_null(strstr(err, want));
	assert_null(strstr(err, "//"));
	rm_dir(dir);

	/* the root, as `radiancectl load /` gives it */
	assert_int_equal(rcheckpoint_list_files("/", &names, err, sizeof err), -ENOENT);
	assert_int_equal(strncmp(err, "/config.json: not found", 23), 0);
}

/* Something that is not a regular file where a checkpoint file should be
 * (a FIFO would hang an open(), /dev/zero never ends, a directory is not
 * a file) is named as such, not reported as missing. */
static void checkpoint_files_not_regular(void **state)
{
	static const char *const kinds[] = { "fifo", "dir", "devzero" };
	static const char *const files[] = { "model.safetensors", "quantization_config.json",
					     "config.json", "model.safetensors.index.json" };
	for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
		for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
			char dir[] = "/tmp/radiance-ckpt-XXXXXX", path[600], **names, err[512];
			assert_non_null(mkdtemp(dir));
			if (strcmp(files[f], "config.json"))
				write_file(dir, "config.json", "{}");
			snprintf(path, sizeof path, "%s/%s", dir, files[f]);
			if (!strcmp(kinds[k], "fifo"))
				assert_int_equal(mkfifo(path, 0600), 0);
			else if (!strcmp(kinds[k], "dir"))
				assert_int_equal(mkdir(path, 0700), 0);
			else
				assert_int_equal(symlink("/dev/zero", path), 0);
			int rc = rcheckpoint_list_files(dir, &names, err, sizeof err);
			if (rc != -EINVAL || !strstr(err, "is not a regular file") ||
			    !strstr(err, files[f]))
				fprintf(stderr, "%s as %s: rc %d, \"%s\"\n", files[f], kinds[k], rc, err);
			assert_int_equal(rc, -EINVAL);
			assert_non_null(strstr(err, files[f]));
			assert_non_null(strstr(err, "is not a regular file"));
			assert_null(names);
			rm_dir(dir);
		}
	}
}

/* --- socket path, errors, connect ----------------------------------------- */

static void default_socket_path(void **state)
{
	char buf[256];
	setenv("RADIANCE_SOCKET", "/tmp/some/where.sock", 1);
	assert_int_equal(radiance_default_socket_path(buf, sizeof buf), 0);
	assert_string_equal(buf, "/tmp/some/where.sock");
	assert_int_equal(radiance_default_socket_path(buf, 5), -ENAMETOOLONG);
	unsetenv("RADIANCE_SOCKET");
	assert_int_equal(radiance_default_socket_path(buf, sizeof buf), 0);
	if (geteuid() == 0)
		assert_string_equal(buf, "/run/radiance/radiance.sock");
	else
		assert_non_null(strstr(buf, "radiance.sock"));
}

static void strerror_texts(void **state)
{
	assert_string_equal(radiance_strerror(0), "success");
	assert_string_equal(radiance_strerror(-EPROTO), radiance_strerror(EPROTO));
	assert_non_null(strstr(radiance_strerror(-ECONNRESET), "closed"));
	assert_non_null(strstr(radiance_strerror(-ENOENT), "No such file"));
	assert_non_null(radiance_strerror(-99999));
	assert_non_null(radiance_version());
	assert_string_equal(radiance_version(), RADIANCE_VERSION);
	/* what the public header offers is what the wire contract says */
	assert_int_equal(radiance_protocol_version(), RADIANCE_PROTOCOL_VERSION);
}

static void log_keep(void *user, int priority, const char *msg)
{
	if (priority <= LOG_WARNING)
		snprintf(user, 512, "%s", msg);
}

static void log_collect(void *user, int priority, const char *msg)
{
	(*(int *)user)++;
}

/* The spin a wait gets (struct radiance's spin_us, resolved at the
 * Welcome): the default follows the daemon's backend, an explicit one is
 * kept, -1 never spins. */
static int spin_after_welcome(const char *backend, int32_t spin_opt)
{
	struct raw_old d;
	raw_old_start_backend(&d, backend);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.spin_us = spin_opt;
	struct radiance *r = radiance_connect(d.path, &o);
	assert_non_null(r);
	assert_string_equal(radiance_get_server_info(r)->backend, backend);
	const int spin = r->spin_us;
	radiance_disconnect(r);
	raw_old_reap(&d);
	return spin;
}

static void default_spin_follows_backend(void **state)
{
	assert_int_equal(spin_after_welcome("cpu", 0), RADIANCE__DEFAULT_SPIN_US);
	assert_int_equal(spin_after_welcome("cuda", 0), RADIANCE__DEFAULT_SPIN_US_GPU);
	assert_int_equal(spin_after_welcome("hip", 0), RADIANCE__DEFAULT_SPIN_US_GPU);
	assert_int_equal(spin_after_welcome("cuda", 7), 7);
	assert_int_equal(spin_after_welcome("cpu", 500), 500);
	assert_int_equal(spin_after_welcome("cuda", -1), 0);
}

static void connect_failures(void **state)
{
	errno = 0;
	assert_null(radiance_connect("/nonexistent/radiance.sock", NULL));
	assert_int_equal(errno, ENOENT);

	/* a socket file nobody listens on */
	char dir[] = "/tmp/radiance-sock-XXXXXX", path[128];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/s", dir);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	strcpy(sa.sun_path, path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);
	int logged = 0;
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.log = log_collect;
	o.log_user = &logged;
	o.connect_timeout_ms = -1;   /* one attempt */
	assert_null(radiance_connect(path, &o));
	assert_int_equal(errno, ECONNREFUSED);
	assert_true(logged > 0);   /* the log callback heard about it */
	/* retried until connect_timeout_ms, then the same code, saying so */
	char said2[512] = "";
	o.log = log_keep;
	o.log_user = said2;
	o.connect_timeout_ms = 100;
	assert_null(radiance_connect(path, &o));
	assert_int_equal(errno, ECONNREFUSED);
	assert_non_null(strstr(said2, "Connection refused (still, after"));
	assert_non_null(strstr(said2, "connect_timeout_ms"));
	unlink(path);
	rmdir(dir);

	char longp[300];
	memset(longp, 'a', sizeof longp - 1);
	longp[0] = '/';
	longp[sizeof longp - 1] = '\0';
	assert_null(radiance_connect(longp, NULL));
	assert_int_equal(errno, ENAMETOOLONG);

	/* options without size are refused rather than misread */
	struct radiance_options bad = { 0 };
	assert_null(radiance_connect(path, &bad));
	assert_int_equal(errno, EINVAL);

	/* out-of-range options are refused, naming the field, before any
	 * connect (timeout_ms -5 used to mean "wait forever") */
	char said[512];
	struct radiance_options neg = RADIANCE_OPTIONS_INIT;
	neg.log = log_keep;
	neg.log_user = said;
	neg.timeout_ms = -5;
	said[0] = 0;
	assert_null(radiance_connect("/nonexistent/radiance.sock", &neg));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(said, "timeout_ms below 0"));
	neg.timeout_ms = 0;
	neg.spin_us = -2;
	said[0] = 0;
	assert_null(radiance_connect("/nonexistent/radiance.sock", &neg));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(said, "spin_us below -1"));
	neg.spin_us = 0;
	neg.connect_timeout_ms = -2;
	said[0] = 0;
	assert_null(radiance_connect("/nonexistent/radiance.sock", &neg));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(said, "connect_timeout_ms below -1"));

	/* the getters take NULL */
	assert_int_equal(radiance_get_error(NULL), -EINVAL);
	assert_string_equal(radiance_error_message(NULL), "");

	/* NULL frees are no-ops */
	radiance_disconnect(NULL);
	radiance_model_info_free(NULL);
	radiance_model_list_free(NULL);
	radiance_stats_free(NULL);
}

/* connect() to a path that is not a socket says ECONNREFUSED, which reads
 * as "no daemon there": a regular file or a directory is ENOTSOCK instead,
 * and the log names the path as what is wrong. A socket nobody listens on
 * stays ECONNREFUSED (connect_failures). */
static void connect_not_a_socket(void **state)
{
	char dir[] = "/tmp/radiance-notsock-XXXXXX", file[128];
	assert_non_null(mkdtemp(dir));
	snprintf(file, sizeof file, "%s/radiance.sock", dir);
	write_file(dir, "radiance.sock", "not a socket\n");
	const char *const paths[] = { file, dir };
	for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
		char said[512] = "", want[300];
		struct radiance_options o = RADIANCE_OPTIONS_INIT;
		o.log = log_keep;
		o.log_user = said;
		errno = 0;
		assert_null(radiance_connect(paths[i], &o));
		if (errno != ENOTSOCK)
			fprintf(stderr, "%s: errno %d (%s), log \"%s\"\n", paths[i], errno,
				strerror(errno), said);
		assert_int_equal(errno, ENOTSOCK);
		snprintf(want, sizeof want, "cannot connect to %s: %s exists and is not a socket",
			 paths[i], paths[i]);
		assert_string_equal(said, want);
	}
	assert_non_null(strstr(radiance_strerror(-ENOTSOCK), "not a socket"));
	unlink(file);
	assert_int_equal(rmdir(dir), 0);
}

/* --- a scripted fake daemon ----------------------------------------------- */

enum fake_script {
	FAKE_REFUSE,          /* the daemon at its session limit: Error (tag 0), close */
	FAKE_REFUSE_HELLO,    /* the same, answering the Hello with its tag */
	FAKE_END_SESSION,     /* Welcome, then Error (tag 0) ending the session, close */
	FAKE_WELCOME,         /* Welcome, then wait for the client to hang up */
};

static void fake_send(int fd, Rdw__ServerMessage *m)
{
	struct rconn c;
	int dup_fd = dup(fd);   /* finish closes its fd: the script closes ours */
	if (dup_fd < 0 || rconn_init(&c, dup_fd, RADIANCE_MAX_FRAME, 1) < 0)
		_exit(3);
	if (rproto_queue_server(&c, m, NULL, 0) < 0 || rconn_flush(&c) < 0)
		_exit(4);
	rconn_finish(&c);
}

static void fake_error(int fd, uint64_t tag, int code, const char *text)
{
	Rdw__Error e = RDW__ERROR__INIT;
	e.code = code;
	e.message = (char *)text;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_ERROR;
	m.error = &e;
	fake_send(fd, &m);
}

/* Reads what the client sent (its Hello), waiting at most 200 ms. */
static void fake_drain(int fd)
{
	char buf[4096];
	struct timeval tv = { 0, 200000 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	(void)!read(fd, buf, sizeof buf);
}

/* A child that accepts `count` connections on listen_fd and plays script
 * on each; the parent gets its pid. */
static void fake_play(int listen_fd, enum fake_script script, int count);

static pid_t fake_daemon(int listen_fd, enum fake_script script, int count)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid > 0)
		return pid;
	fake_play(listen_fd, script, count);
	_exit(0);
}

/* In a child: accepts count connections on listen_fd, plays script on
 * each, exits. */
static void fake_play(int listen_fd, enum fake_script script, int count)
{
	for (int i = 0; i < count; i++) {
		int fd = accept(listen_fd, NULL, NULL);
		if (fd < 0)
			_exit(2);
		switch (script) {
		case FAKE_REFUSE:
			fake_error(fd, 0, EBUSY, "too many sessions (the limit is 1)");
			break;
		case FAKE_REFUSE_HELLO:
			fake_drain(fd);
			fake_error(fd, 1, EBUSY, "too many sessions (the limit is 1)");
			break;
		case FAKE_END_SESSION: {
			fake_drain(fd);
			Rdw__Welcome w = RDW__WELCOME__INIT;
			w.protocol_version = RADIANCE_PROTOCOL_VERSION;
			w.server_version = "fake";
			w.backend = "cpu";
			w.device = "none";
			w.session_id = 7;
			w.max_rows = 16;
			Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
			m.tag = 1;
			m.msg_case = RDW__SERVER_MESSAGE__MSG_WELCOME;
			m.welcome = &w;
			fake_send(fd, &m);
			fake_error(fd, 0, ESHUTDOWN, "the daemon is shutting down");
			break;
		}
		case FAKE_WELCOME: {
			fake_drain(fd);
			Rdw__Welcome w = RDW__WELCOME__INIT;
			w.protocol_version = RADIANCE_PROTOCOL_VERSION;
			w.server_version = "fake";
			w.session_id = 7;
			w.max_rows = 16;
			Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
			m.tag = 1;
			m.msg_case = RDW__SERVER_MESSAGE__MSG_WELCOME;
			m.welcome = &w;
			fake_send(fd, &m);
			char buf[256];
			struct timeval tv = { 10, 0 };
			setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
			while (read(fd, buf, sizeof buf) > 0)
				;
			break;
		}
		}
		close(fd);
	}
	_exit(0);
}

/* A listening socket at path: its fd, or -1. */
static int listen_at(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 16) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static int fake_listen(char *dir, char *path, size_t n)
{
	assert_non_null(mkdtemp(dir));
	snprintf(path, n, "%s/s", dir);
	int fd = listen_at(path);
	assert_true(fd >= 0);
	return fd;
}

static void fake_finish(int listen_fd, pid_t pid, char *dir, const char *path)
{
	int st;
	close(listen_fd);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	unlink(path);
	rmdir(dir);
}

/* A daemon that accepts (the kernel's backlog: a socket-activated daemon
 * still starting looks the same) but never answers: connect_timeout_ms
 * bounds the wait for the Welcome, and says which limit fired. */
static void connect_timeout_never_answers(void **state)
{
	char dir[] = "/tmp/radiance-fake-XXXXXX", path[128];
	int lfd = fake_listen(dir, path, sizeof path);
	char said[512] = "";
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.log = log_keep;
	o.log_user = said;
	o.timeout_ms = 60000;          /* the shorter limit governs */
	o.connect_timeout_ms = 300;
	errno = 0;
	assert_null(radiance_connect(path, &o));
	assert_int_equal(errno, ETIMEDOUT);
	assert_non_null(strstr(said, path));
	assert_non_null(strstr(said, "no Welcome from the daemon within 300 ms of connecting "
				     "(connect_timeout_ms)"));
	close(lfd);
	unlink(path);
	rmdir(dir);
}

/* The default connect waits for a socket that appears (a daemon being
 * restarted, not socket-activated): the path is missing at first. */
static void connect_waits_for_socket(void **state)
{
	char dir[] = "/tmp/radiance-fake-XXXXXX", path[128];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/s", dir);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		usleep(200 * 1000);
		int fd = listen_at(path);
		if (fd < 0)
			_exit(5);
		fake_play(fd, FAKE_WELCOME, 1);
		_exit(0);
	}
	char said[512] = "";
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.log = log_keep;
	o.log_user = said;
	struct radiance *r = radiance_connect(path, &o);   /* connect_timeout_ms 0: 30 s */
	if (!r)
		fprintf(stderr, "connect: %s (%s)\n", strerror(errno), said);
	assert_non_null(r);
	assert_int_equal(radiance_get_server_info(r)->session_id, 7);
	radiance_disconnect(r);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	unlink(path);
	rmdir(dir);
}

/* A refusal (the daemon at max_sessions) is EBUSY with the daemon's words,
 * whichever comes first: its Error, or its close under our Hello (EPIPE
 * then, with the Error still to read). */
static void connect_refused_by_daemon(void **state)
{
	static const enum fake_script scripts[] = { FAKE_REFUSE, FAKE_REFUSE_HELLO };
	for (size_t s = 0; s < 2; s++) {
		char dir[] = "/tmp/radiance-fake-XXXXXX", path[128];
		int lfd = fake_listen(dir, path, sizeof path);
		int rounds = scripts[s] == FAKE_REFUSE ? 20 : 2;
		pid_t pid = fake_daemon(lfd, scripts[s], rounds);
		for (int i = 0; i < rounds; i++) {
			char said[512] = "";
			struct radiance_options o = RADIANCE_OPTIONS_INIT;
			o.log = log_keep;
			o.log_user = said;
			o.timeout_ms = 5000;
			errno = 0;
			assert_null(radiance_connect(path, &o));
			if (errno != EBUSY || !strstr(said, "too many sessions (the limit is 1)"))
				fprintf(stderr, "script %zu round %d: errno %d, log \"%s\"\n", s, i, errno,
					said);
			assert_int_equal(errno, EBUSY);
			assert_non_null(strstr(said, "cannot connect to"));
			assert_non_null(strstr(said, path));
			assert_non_null(strstr(said, "refused the connection: too many sessions (the "
						      "limit is 1)"));
		}
		fake_finish(lfd, pid, dir, path);
	}
}

/* The daemon ends a session (an Error outside any reply) and closes: the
 * next request meets a closed socket (EPIPE) but reports the daemon's
 * reason, sticky. */
static void session_ended_by_daemon(void **state)
{
	char dir[] = "/tmp/radiance-fake-XXXXXX", path[128];
	int lfd = fake_listen(dir, path, sizeof path);
	pid_t pid = fake_daemon(lfd, FAKE_END_SESSION, 1);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 5000;
	struct radiance *r = radiance_connect(path, &o);
	assert_non_null(r);
	assert_string_equal(radiance_get_server_info(r)->server_version, "fake");
	fake_finish(lfd, pid, dir, path);   /* the fake has closed its end */
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), -ESHUTDOWN);
	assert_int_equal(radiance_get_error(r), -ESHUTDOWN);
	assert_string_equal(radiance_error_message(r),
			    "the daemon ended the session: the daemon is shutting down");
	assert_int_equal(radiance_list_models(r, &l), -ESHUTDOWN);
	radiance_disconnect(r);
}

static void find_layer(void **state)
{
	struct radiance_layer_info layers[2] = {
		{ .index = 0, .name = "a.q" },
		{ .index = 1, .name = "a.k" },
	};
	struct radiance_model_info m = { .n_layers = 2, .layers = layers };
	assert_int_equal(radiance_find_layer(&m, "a.k"), 1);
	assert_int_equal(radiance_find_layer(&m, "a.q"), 0);
	assert_int_equal(radiance_find_layer(&m, "a.v"), -ENOENT);
	assert_int_equal(radiance_find_layer(NULL, "a.v"), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(arena_first_fit_and_merge),
		cmocka_unit_test(arena_random_stress),
		cmocka_unit_test(checkpoint_files_real),
		cmocka_unit_test(checkpoint_dir_name),
		cmocka_unit_test(checkpoint_files_sharded),
		cmocka_unit_test(checkpoint_files_missing),
		cmocka_unit_test(checkpoint_files_trailing_slash),
		cmocka_unit_test(checkpoint_files_not_regular),
		cmocka_unit_test(default_socket_path),
		cmocka_unit_test(strerror_texts),
		cmocka_unit_test(connect_failures),
		cmocka_unit_test(connect_not_a_socket),
		cmocka_unit_test(connect_refused_by_daemon),
		cmocka_unit_test(default_spin_follows_backend),
		cmocka_unit_test(connect_timeout_never_answers),
		cmocka_unit_test(connect_waits_for_socket),
		cmocka_unit_test(session_ended_by_daemon),
		cmocka_unit_test(find_layer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
