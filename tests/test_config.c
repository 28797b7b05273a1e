/* daemon/config: defaults, config file, command line, and errors that name
 * the option or key and the value. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "config.h"
#include "limit.h"
#include "log.h"

static char tmpdir[64];

static int group_setup(void **state)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/radiance-config-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int group_teardown(void **state)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static const char *write_file(const char *name, const char *text)
{
	static char path[128];
	snprintf(path, sizeof path, "%s/%s", tmpdir, name);
	FILE *f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	return path;
}

/* config_load over a NULL-terminated argument list. */
static int load(struct radiance_config *cfg, char *err, size_t errlen, ...)
{
	char *argv[32] = { "radianced" };
	int argc = 1;
	va_list ap;
	va_start(ap, errlen);
	for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	err[0] = 0;
	return config_load(cfg, argc, argv, err, errlen);
}

static void test_defaults(void **state)
{
	struct radiance_config cfg;
	char err[512];
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_string_equal(cfg.backend, "auto");
	assert_null(cfg.config_path);
	assert_null(cfg.socket_group);
	assert_int_equal(cfg.n_preload, 0);
	assert_int_equal(cfg.max_rows, 512);
	assert_int_equal(cfg.max_sessions, 64);
	assert_int_equal(cfg.log_level, RADIANCE_LOG_INFO);
	assert_int_equal(cfg.hello_timeout_ms, 5000);
	assert_int_equal(cfg.socket_gid, (gid_t)-1);
	if (geteuid() == 0)
		assert_string_equal(cfg.socket_path, RADIANCE_DEFAULT_ROOT_SOCKET);
	else
		assert_string_equal(cfg.socket_path, "/run/user/1234/radiance.sock");
	config_finish(&cfg);
}

static void test_file_then_command_line(void **state)
{
	struct radiance_config cfg;
	char err[512];
	const char *path = write_file("a.conf",
		"# comment\n"
		"socket = /tmp/x.sock\n"
		"group = root\n"
		"backend = cpu\n"
		"max_rows = 64\n"
		"max-sessions = 7\n"                  /* option spelling works too */
		"arena_bytes = 2M\n"
		"max_arena_bytes = 1GiB\n"
		"preload = /models/a /models/b\n"
		"[radianced]\n"
		"log_level = debug\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_string_equal(cfg.config_path, path);
	assert_string_equal(cfg.socket_path, "/tmp/x.sock");
	assert_string_equal(cfg.socket_group, "root");
	assert_int_equal(cfg.socket_gid, 0);
	assert_string_equal(cfg.backend, "cpu");
	assert_int_equal(cfg.max_rows, 64);
	assert_int_equal(cfg.max_sessions, 7);
	assert_int_equal(cfg.arena_bytes, 2u << 20);
	assert_int_equal(cfg.max_arena_bytes, 1u << 30);
	assert_int_equal(cfg.n_preload, 2);
	assert_string_equal(cfg.preload[0], "/models/a");
	assert_string_equal(cfg.preload[1], "/models/b");
	assert_int_equal(cfg.log_level, RADIANCE_LOG_DEBUG);
	config_finish(&cfg);

	/* the command line wins, and its --preload replaces the file's list */
	assert_int_equal(load(&cfg, err, sizeof err, "-c", path, "--max-rows", "128", "-s",
			      "/tmp/y.sock", "--preload", "/m/c", "-p", "/m/d", "-l", "warn", NULL), 0);
	assert_int_equal(cfg.max_rows, 128);
	assert_string_equal(cfg.socket_path, "/tmp/y.sock");
	assert_int_equal(cfg.n_preload, 2);
	assert_string_equal(cfg.preload[0], "/m/c");
	assert_string_equal(cfg.preload[1], "/m/d");
	assert_int_equal(cfg.log_level, RADIANCE_LOG_WARN);
	assert_int_equal(cfg.max_sessions, 7);
	config_finish(&cfg);
}

static void test_help_and_version(void **state)
{
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--version", NULL), 1);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "-h", NULL), 1);
	config_finish(&cfg);
	/* help wins even over a bad value later on the line */
	assert_int_equal(load(&cfg, err, sizeof err, "--help", "--max-rows", "x", NULL), 1);
	config_finish(&cfg);
}

/* Each bad input fails with -EINVAL and a message containing every needle. */
/* Whether err holds a control character (C0 or DEL): a config value echoed
 * raw, which could forge a log line or drive the terminal. */
static int has_control(const char *err)
{
	for (const unsigned char *p = (const unsigned char *)err; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return 1;
	return 0;
}

static void expect_error(int want, const char *needle1, const char *needle2, ...)
{
	struct radiance_config cfg;
	char err[512];
	char *argv[32] = { "radianced" };
	int argc = 1;
	va_list ap;
	va_start(ap, needle2);
	for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
		argv[argc++] = a;
	va_end(ap);
	int rc = config_load(&cfg, argc, argv, err, sizeof err);
	config_finish(&cfg);
	if (rc != want || !strstr(err, needle1) || (needle2 && !strstr(err, needle2)) ||
	    has_control(err))
		fail_msg("got %d '%s', wanted %d with '%s' and '%s' (and no control character)", rc,
			 err, want, needle1, needle2 ? needle2 : "");
}

/* A value, key, option or path with a newline or an ESC in it is shown
 * escaped (\xNN) in the error, never raw: it went to the terminal and the
 * journal as it was. */
static void test_control_characters_escaped(void **state)
{
	expect_error(-EINVAL, "--backend", "'cpu\\x0a[error] forged\\x1b[31m' is not a backend",
		     "--no-config", "--backend", "cpu\n[error] forged\x1b[31m", NULL);
	expect_error(-EINVAL, "--max-rows", "'1\\x0d2'", "--no-config", "--max-rows", "1\r2", NULL);
	expect_error(-EINVAL, "--sched-uid-weights", "'ro\\x1bot:2x' is not USER:WEIGHT",
		     "--no-config", "--sched-uid-weights", "ro\x1bot:2x", NULL);
	expect_error(-EINVAL, "--sched-uid-weights", "'no\\x0auser' is neither a user nor a uid",
		     "--no-config", "--sched-uid-weights", "no\nuser:2", NULL);
	expect_error(-EINVAL, "group 'no\\x1bsuch' does not exist", NULL, "--no-config",
		     "--group", "no\x1bsuch", "--socket", "/tmp/radiance-test.sock", NULL);
	expect_error(-EINVAL, "unknown option '--bo\\x1bgus'", NULL, "--no-config", "--bo\x1bgus",
		     NULL);
	expect_error(-EINVAL, "unexpected argument 'a\\x0ab'", NULL, "--no-config", "a\nb", NULL);
	expect_error(-EINVAL, "given twice ('x\\x0a', then 'y\\x1b')", NULL, "--no-config", "-s",
		     "x\n", "-s", "y\x1b", NULL);
	/* a config file: its value, its key, its section, its name */
	const char *p = write_file("esc1.conf", "backend = gpu\x1b[2J\n");
	expect_error(-EINVAL, ":1: backend: 'gpu\\x1b[2J' is not a backend", NULL, "--config", p,
		     NULL);
	p = write_file("esc2.conf", "max_r\x1bows = 1\n");
	expect_error(-EINVAL, ":1: unknown key 'max_r\\x1bows'", NULL, "--config", p, NULL);
	p = write_file("esc3.conf", "[radi\x07" "anced]\nmax_rows = 1\n");
	expect_error(-EINVAL, "unknown section [radi\\x07anced]", NULL, "--config", p, NULL);
	p = write_file("esc\nname.conf", "max_rows = many\n");
	expect_error(-EINVAL, "esc\\x0aname.conf:1: max_rows: 'many'", NULL, "--config", p, NULL);
}

static void test_bad_command_line(void **state)
{
	expect_error(-EINVAL, "--max-rows", "'0'", "--no-config", "--max-rows", "0", NULL);
	expect_error(-EINVAL, "--max-rows", "'12abc'", "--no-config", "--max-rows", "12abc", NULL);
	expect_error(-EINVAL, "--max-rows", "'-1'", "--no-config", "--max-rows", "-1", NULL);
	expect_error(-EINVAL, "--backend", "'tpu'", "--no-config", "-b", "tpu", NULL);
	expect_error(-EINVAL, "--log-level", "'loud'", "--no-config", "-l", "loud", NULL);
	expect_error(-EINVAL, "--max-sq-entries", "'100'", "--no-config", "--max-sq-entries", "100",
		     NULL);
	expect_error(-EINVAL, "--arena-bytes", "'12Q'", "--no-config", "--arena-bytes", "12Q", NULL);
	expect_error(-EINVAL, "--pin-piece-kib", "pin_piece_kib 6 is not a multiple of 4", "--no-config",
		     "--pin-piece-kib", "6", NULL);
	expect_error(-EINVAL, "unknown option", "--frobnicate", "--no-config", "--frobnicate", NULL);
	expect_error(-EINVAL, "needs a value", "--socket", "--no-config", "--socket", NULL);
	expect_error(-EINVAL, "unexpected argument", "stray", "--no-config", "stray", NULL);
	expect_error(-EINVAL, "arena_bytes", "max_arena_bytes", "--no-config", "--arena-bytes",
		     "1G", "--max-arena-bytes", "1M", NULL);
	expect_error(-ENOENT, "/nonexistent/radianced.conf", NULL, "--config",
		     "/nonexistent/radianced.conf", NULL);
}

static void test_bad_file(void **state)
{
	const char *p = write_file("bad1.conf", "max_rows = 8\nmax_rowz = 9\n");
	expect_error(-EINVAL, ":2", "unknown key 'max_rowz'", "--config", p, NULL);
	p = write_file("bad2.conf", "\n\nmax_rows = lots\n");
	expect_error(-EINVAL, ":3", "'lots'", "--config", p, NULL);
	p = write_file("bad3.conf", "[client]\nsocket = /x\n");
	expect_error(-EINVAL, "unknown section [client]", NULL, "--config", p, NULL);
	p = write_file("bad4.conf", "this line has no equals sign\n");
	expect_error(-EINVAL, ":1", "syntax", "--config", p, NULL);
	p = write_file("bad5.conf", "backend = \n");
	expect_error(-EINVAL, "backend", NULL, "--config", p, NULL);
}

/* docs/daemon.md: '#' and ';' start comments, also after a value */
static void test_inline_comments(void **state)
{
	struct radiance_config cfg;
	char err[512];
	const char *path = write_file("comments.conf",
		"socket = /tmp/x/c.sock  # trailing comment\n"
		"max_rows = 64 ; the other kind\n"
		"max_sessions = 9\t# after a tab\n"
		"preload = /m/a /m/b # not a third directory\n"
		"backend = cpu#no space: part of the value? no: a bad backend below\n");
	int rc = load(&cfg, err, sizeof err, "--config", path, NULL);
	/* "cpu#no" has no blank before '#': it stays, and is no backend */
	assert_int_equal(rc, -EINVAL);
	assert_non_null(strstr(err, "comments.conf:5"));
	assert_non_null(strstr(err, "'cpu#no space: part of the value? no: a bad backend below'"));
	config_finish(&cfg);

	path = write_file("comments2.conf",
		"socket = /tmp/x/c.sock  # trailing comment\n"
		"max_rows = 64 ; the other kind\n"
		"max_sessions = 9\t# after a tab\n"
		"preload = /m/a /m/b # not a third directory\n"
		"group = root # a comment\n"
		"log_level = debug#kept\n"
		"[radianced] # a section with a comment\n"
		"arena_bytes = 2M   ;\n");
	rc = load(&cfg, err, sizeof err, "--config", path, NULL);
	/* no blank before '#': "debug#kept" is the value, and no log level */
	assert_int_equal(rc, -EINVAL);
	assert_non_null(strstr(err, ":6: log_level: 'debug#kept'"));
	config_finish(&cfg);

	/* (a key may be set once: socket only on the last line here) */
	path = write_file("comments3.conf",
		"max_rows = 64 ; the other kind\n"
		"max_sessions = 9\t# after a tab\n"
		"preload = /m/a /m/b # not a third directory\n"
		"group = root # a comment\n"
		"arena_bytes = 2M   ;\n"
		"socket = /tmp/x/a#b.sock\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_string_equal(cfg.socket_path, "/tmp/x/a#b.sock");   /* '#' inside a value */
	assert_int_equal(cfg.max_rows, 64);
	assert_int_equal(cfg.max_sessions, 9);
	assert_int_equal(cfg.n_preload, 2);
	assert_string_equal(cfg.preload[1], "/m/b");
	assert_string_equal(cfg.socket_group, "root");
	assert_int_equal(cfg.arena_bytes, 2u << 20);
	config_finish(&cfg);

	/* a value that is all comment is empty */
	path = write_file("comments4.conf", "socket = # nothing\n");
	expect_error(-EINVAL, "comments4.conf:1: socket", "empty value", "--config", path, NULL);
}

static void test_config_file_kinds(void **state)
{
	/* a directory opens fine and reads as nothing: refuse it */
	expect_error(-EISDIR, "config file /tmp", "is a directory", "--config", "/tmp", NULL);
	expect_error(-EINVAL, "/dev/null", "not a regular file", "--config", "/dev/null", NULL);
	/* --no-config does not silently win over --config (or the reverse) */
	const char *path = write_file("ok.conf", "max_rows = 8\n");
	expect_error(-EINVAL, "--no-config", "contradict", "--no-config", "--config", path, NULL);
	expect_error(-EINVAL, "--no-config", "contradict", "-c", path, "--no-config", NULL);
	/* a line longer than libinih's buffer is an error, not two lines */
	char text[400];
	snprintf(text, sizeof text, "max_rows = 8\npreload = /%0300d\n", 0);
	path = write_file("long.conf", text);
	expect_error(-EINVAL, "long.conf:2", "longer than", "--config", path, NULL);
}

/* A directory with spaces: one --preload argument is one directory (it was
 * split at its spaces into two that did not exist); in the config file it
 * is written in double quotes. */
static void test_preload_paths_with_spaces(void **state)
{
	(void)state;
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--preload", "/m/my models/a", "-p", "/m/b",
			      NULL),
			 0);
	assert_int_equal(cfg.n_preload, 2);
	assert_string_equal(cfg.preload[0], "/m/my models/a");
	assert_string_equal(cfg.preload[1], "/m/b");
	config_finish(&cfg);

	const char *path = write_file("quoted.conf", "preload = \"/m/my models/a\"  /m/b \"/m/c d\"\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_int_equal(cfg.n_preload, 3);
	assert_string_equal(cfg.preload[0], "/m/my models/a");
	assert_string_equal(cfg.preload[1], "/m/b");
	assert_string_equal(cfg.preload[2], "/m/c d");
	config_finish(&cfg);

	path = write_file("open-quote.conf", "preload = /m/b \"/m/my models/a\n");
	expect_error(-EINVAL, "open-quote.conf:1", "no closing", "--config", path, NULL);
}

/* A NUL byte in the file is named as such (it read as a line too long). */
static void test_config_nul_byte(void **state)
{
	(void)state;
	char path[128];
	snprintf(path, sizeof path, "%s/nul.conf", tmpdir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	static const char text[] = "max_rows = 8\nmax_rows2 = 5\0junk\n";
	assert_int_equal(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
	fclose(f);
	expect_error(-EINVAL, "nul.conf:2", "NUL byte at column 14", "--config", path, NULL);
}

/* Errors about two values say where each came from. */
static void test_combined_errors_name_sources(void **state)
{
	const char *path = write_file("combo.conf", "# limits\nmax_sq_entries = 512\n\nsq_entries = 1024\n");
	expect_error(-EINVAL, "sq_entries 1024 (", "combo.conf:4) exceeds max_sq_entries 512 (",
		     "--config", path, NULL);
	expect_error(-EINVAL, "combo.conf:2)", NULL, "--config", path, NULL);
	expect_error(-EINVAL, "sq_entries 2048 (--sq-entries) exceeds max_sq_entries 1024 (default)",
		     NULL, "--no-config", "--sq-entries", "2048", NULL);
	expect_error(-EINVAL, "combo.conf:4) exceeds", "max_sq_entries 16 (--max-sq-entries)",
		     "--config", path, "--max-sq-entries", "16", NULL);
	expect_error(-EINVAL, "arena_bytes 2147483648 (--arena-bytes)",
		     "max_arena_bytes 1073741824 (default)", "--no-config", "--arena-bytes", "2G", NULL);
}

/* require_gpu asks for no CPU fall-back; backend = cpu asks for the CPU. A
 * radianced@N instance (--require-gpu) whose radianced-N.conf was copied from
 * a CPU host's (backend = cpu) used to serve from the CPU without a word.
 * Both places are named; backend gpu or auto with require_gpu stays legal,
 * as does backend cpu with require_gpu = no. */
static void test_require_gpu_with_cpu_backend(void **state)
{
	const char *path = write_file("reqgpu.conf", "# copied from a CPU host\nbackend = cpu\n");
	expect_error(-EINVAL, "require_gpu yes (--require-gpu) contradicts backend cpu (",
		     "reqgpu.conf:2)", "--config", path, "--require-gpu", NULL);
	expect_error(-EINVAL, "require_gpu yes (--require-gpu) contradicts backend cpu "
		     "(-b/--backend)", NULL, "--no-config", "-b", "cpu", "--require-gpu=yes", NULL);
	path = write_file("reqgpu2.conf", "require_gpu = yes\nbackend = cpu\n");
	expect_error(-EINVAL, "reqgpu2.conf:1) contradicts backend cpu (", "reqgpu2.conf:2)",
		     "--config", path, NULL);

	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "--backend", "auto", NULL), 0);
	assert_int_equal(cfg.require_gpu, 1);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "-b", "gpu", "--require-gpu",
			      NULL), 0);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "--require-gpu=no", NULL), 0);
	assert_string_equal(cfg.backend, "cpu");
	config_finish(&cfg);
}

/* The socket group is resolved while the configuration is read, so a typo
 * is a usage error (exit 2), not a failure after the backend started. */
static void test_group_resolved(void **state)
{
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "-g", "root", NULL), 0);
	assert_int_equal(cfg.socket_gid, 0);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--group", "4242", NULL), 0);
	assert_int_equal(cfg.socket_gid, 4242);
	config_finish(&cfg);
	expect_error(-EINVAL, "-g/--group", "group 'nosuchgroup-radiance' does not exist",
		     "--no-config", "-g", "nosuchgroup-radiance", NULL);
	const char *path = write_file("group.conf", "\ngroup = nosuchgroup-radiance\n");
	expect_error(-EINVAL, "group.conf:2", "group 'nosuchgroup-radiance' does not exist",
		     "--config", path, NULL);
	/* the command line overrides the file's bad group before it is looked up */
	struct radiance_config c2;
	assert_int_equal(load(&c2, err, sizeof err, "--config", path, "-g", "root", NULL), 0);
	config_finish(&c2);
}

/* A socket path longer than a Unix socket address holds (107 bytes and the
 * NUL) is a bad value found with the other options: refused by config_load
 * (exit 2) naming the option, where it was given and both lengths, not after
 * the backend started (exit 1). 107 bytes is accepted. */
static void test_socket_path_too_long(void **state)
{
	struct radiance_config cfg;
	char err[512], longp[160], maxp[160], want[400];

	snprintf(longp, sizeof longp, "/tmp/%0119d.sock", 0);      /* 129 bytes */
	snprintf(maxp, sizeof maxp, "/tmp/%097d.sock", 0);         /* 107 bytes */
	assert_int_equal(strlen(longp), 129);
	assert_int_equal(strlen(maxp), 107);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "-s", maxp, NULL), 0);
	assert_string_equal(cfg.socket_path, maxp);
	config_finish(&cfg);

	snprintf(want, sizeof want, "socket '%s' (-s/--socket) is 129 bytes, longer than the 107 a "
		 "Unix socket address holds; choose a shorter path", longp);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "-s", longp, NULL), -EINVAL);
	config_finish(&cfg);
	assert_string_equal(err, want);
	snprintf(maxp, sizeof maxp, "/tmp/%098d.sock", 0);         /* one byte too many */
	assert_int_equal(strlen(maxp), 108);
	expect_error(-EINVAL, "(-s/--socket) is 108 bytes, longer than the 107", NULL, "--no-config",
		     "--socket", maxp, NULL);

	char text[200];
	snprintf(text, sizeof text, "# the socket\nsocket = %s\n", longp);
	const char *path = write_file("longsock.conf", text);
	snprintf(want, sizeof want, "socket '%s' (%s:2) is 129 bytes, longer than the 107 a Unix "
		 "socket address holds; choose a shorter path", longp, path);
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), -EINVAL);
	config_finish(&cfg);
	assert_string_equal(err, want);
	/* the command line's short one replaces it */
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "-s", "/tmp/r.sock", NULL), 0);
	config_finish(&cfg);

	if (geteuid() != 0) {   /* as root the default is /run/radiance/radiance.sock */
		char xdg[120];
		snprintf(xdg, sizeof xdg, "/tmp/%0100d", 0);   /* + /radiance.sock: 119 bytes */
		setenv("XDG_RUNTIME_DIR", xdg, 1);
		expect_error(-EINVAL, "(default: $XDG_RUNTIME_DIR/radiance.sock) is 119 bytes",
			     "pass --socket PATH", "--no-config", NULL);
		setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	}
}

static void test_hello_timeout_option(void **state)
{
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--hello-timeout-ms", "250",
			      NULL), 0);
	assert_int_equal(cfg.hello_timeout_ms, 250);
	config_finish(&cfg);
	const char *path = write_file("hello.conf", "hello_timeout_ms = 1500\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_int_equal(cfg.hello_timeout_ms, 1500);
	config_finish(&cfg);
	expect_error(-EINVAL, "--hello-timeout-ms", "'0'", "--no-config", "--hello-timeout-ms", "0",
		     NULL);
}

/* sched_uid_weights: user names or uids with weights, space- or
 * comma-separated; config_uid_weight answers 1 for a uid not listed; the
 * command line replaces the file's list; bad entries name themselves. */
static void test_uid_weights(void **state)
{
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.n_uid_weights, 0);
	assert_int_equal(config_uid_weight(&cfg, 0), 1);
	config_finish(&cfg);

	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--sched-uid-weights",
			      "root:3 1234:1000", NULL), 0);
	assert_int_equal(cfg.n_uid_weights, 2);
	assert_int_equal(config_uid_weight(&cfg, 0), 3);
	assert_int_equal(config_uid_weight(&cfg, 1234), 1000);
	assert_int_equal(config_uid_weight(&cfg, 1235), 1);
	config_finish(&cfg);

	const char *path = write_file("weights.conf", "sched_uid_weights = 7:2, 8:5  # two\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_int_equal(cfg.n_uid_weights, 2);
	assert_int_equal(config_uid_weight(&cfg, 7), 2);
	assert_int_equal(config_uid_weight(&cfg, 8), 5);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "--sched-uid-weights", "9:4",
			      NULL), 0);
	assert_int_equal(cfg.n_uid_weights, 1);
	assert_int_equal(config_uid_weight(&cfg, 7), 1);
	assert_int_equal(config_uid_weight(&cfg, 9), 4);
	config_finish(&cfg);

	expect_error(-EINVAL, "--sched-uid-weights", "'7:0' is not USER:WEIGHT", "--no-config",
		     "--sched-uid-weights", "7:0", NULL);
	expect_error(-EINVAL, "--sched-uid-weights", "'7:1001'", "--no-config",
		     "--sched-uid-weights", "7:1001", NULL);
	expect_error(-EINVAL, "--sched-uid-weights", "'7' is not USER:WEIGHT", "--no-config",
		     "--sched-uid-weights", "7", NULL);
	expect_error(-EINVAL, "'nosuchuser-radiance' is neither a user nor a uid", NULL,
		     "--no-config", "--sched-uid-weights", "nosuchuser-radiance:2", NULL);
	expect_error(-EINVAL, "uid 0 ('0') is given twice", NULL, "--no-config",
		     "--sched-uid-weights", "root:2 0:3", NULL);
	expect_error(-EINVAL, "empty value", NULL, "--no-config", "--sched-uid-weights", " , ",
		     NULL);
	path = write_file("weights2.conf", "\nsched_uid_weights = 7:x\n");
	expect_error(-EINVAL, "weights2.conf:2: sched_uid_weights", "'7:x'", "--config", path,
		     NULL);
}

/* systemd/radianced.conf parses, and so does every key it shows commented
 * out, with the values it claims are the defaults. */
static void test_shipped_config(void **state)
{
	FILE *in = fopen("systemd/radianced.conf", "r");
	assert_non_null(in);
	char text[8192] = "", line[512];
	size_t used = 0;
	while (fgets(line, sizeof line, in)) {
		const char *l = line;
		size_t k = strspn(line + 1, "abcdefghijklmnopqrstuvwxyz_");
		if (line[0] == '#' && k && strncmp(line + 1 + k, " = ", 3) == 0)
			l = line + 1;   /* "#key = value": the key, uncommented */
		used += (size_t)snprintf(text + used, sizeof text - used, "%s", l);
		assert_true(used < sizeof text);
	}
	fclose(in);
	struct radiance_config cfg, def;
	char err[512];
	/* the group the units create may not exist here */
	int rc = load(&cfg, err, sizeof err, "--config", "systemd/radianced.conf", "-g", "root",
		      NULL);
	if (rc != 0)
		fail_msg("systemd/radianced.conf: %s", err);
	config_finish(&cfg);
	const char *path = write_file("shipped.conf", text);
	rc = load(&cfg, err, sizeof err, "--config", path, "-g", "root", NULL);
	if (rc != 0)
		fail_msg("radianced.conf with every key uncommented: %s", err);
	assert_int_equal(config_init(&def), 0);
	assert_int_equal(cfg.max_sessions, def.max_sessions);
	assert_int_equal(cfg.max_arena_bytes, def.max_arena_bytes);
	assert_int_equal(cfg.arena_bytes, def.arena_bytes);
	assert_int_equal(cfg.max_rows, def.max_rows);
	assert_int_equal(cfg.max_inflight, def.max_inflight);
	assert_int_equal(cfg.max_sq_entries, def.max_sq_entries);
	assert_int_equal(cfg.sq_entries, def.sq_entries);
	assert_int_equal(cfg.max_k, def.max_k);
	assert_int_equal(cfg.max_n, def.max_n);
	assert_int_equal(cfg.hello_timeout_ms, def.hello_timeout_ms);
	assert_int_equal(cfg.zero_copy_rows, def.zero_copy_rows);
	assert_int_equal(cfg.zero_copy_x_kib, def.zero_copy_x_kib);
	assert_int_equal(cfg.zero_copy_y_kib, def.zero_copy_y_kib);
	assert_int_equal(cfg.log_level, def.log_level);
	assert_string_equal(cfg.backend, def.backend);
	assert_string_equal(cfg.socket_path, RADIANCE_DEFAULT_ROOT_SOCKET);
	config_finish(&def);
	config_finish(&cfg);
}

/* Each bad input fails with -EINVAL and a message containing every needle
 * (NULL-terminated), after the arguments (NULL-terminated). */
static void expect_error_all(const char *const *needles, ...)
{
	struct radiance_config cfg;
	char err[512];
	char *argv[32] = { "radianced" };
	int argc = 1;
	va_list ap;
	va_start(ap, needles);
	for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
		argv[argc++] = a;
	va_end(ap);
	int rc = config_load(&cfg, argc, argv, err, sizeof err);
	config_finish(&cfg);
	for (size_t i = 0; needles[i]; i++)
		if (rc != -EINVAL || !strstr(err, needles[i]))
			fail_msg("got %d '%s', wanted %d with '%s'", rc, err, -EINVAL, needles[i]);
}

/* Opening a FIFO for reading waits for a writer: the daemon hung there
 * before printing anything. config_load runs in a child so that a hang is a
 * failure here, not a stuck test run. */
static void test_config_fifo_refused(void **state)
{
	char fifo[128];
	snprintf(fifo, sizeof fifo, "%s/fifo.conf", tmpdir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct radiance_config cfg;
		char err[512] = "";
		char *argv[] = { "radianced", "--config", fifo, NULL };
		int rc = config_load(&cfg, 3, argv, err, sizeof err);
		config_finish(&cfg);
		int ok = rc == -EINVAL && strstr(err, fifo) && strstr(err, "is not a regular file");
		if (!ok)
			fprintf(stderr, "config_load: %d '%s'\n", rc, err);
		_exit(ok ? 0 : 1);
	}
	int st = 0;
	pid_t done = 0;
	for (int i = 0; i < 500 && done == 0; i++) {   /* 5 s */
		done = waitpid(pid, &st, WNOHANG);
		if (done == 0)
			nanosleep(&(struct timespec){ .tv_nsec = 10000000 }, NULL);
	}
	if (done == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		unlink(fifo);
		fail_msg("config_load --config %s still blocked after 5 s", fifo);
	}
	unlink(fifo);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* A preload's model name is its directory's basename: two directories with
 * one basename would race for the name at start. */
static void test_preload_same_basename(void **state)
{
	char a[128], b[128], a_slash[160], a_dots[160], c[128];
	snprintf(a, sizeof a, "%s/a/minilm", tmpdir);
	snprintf(b, sizeof b, "%s/b/minilm", tmpdir);
	snprintf(c, sizeof c, "%s/b/other", tmpdir);
	char dir[128];
	snprintf(dir, sizeof dir, "%s/a", tmpdir);
	assert_int_equal(mkdir(dir, 0700), 0);
	snprintf(dir, sizeof dir, "%s/b", tmpdir);
	assert_int_equal(mkdir(dir, 0700), 0);
	assert_int_equal(mkdir(a, 0700), 0);
	assert_int_equal(mkdir(b, 0700), 0);
	assert_int_equal(mkdir(c, 0700), 0);

	/* command line: both paths, where each came from, and what to do */
	expect_error_all((const char *const[]){ a, b, "(-p/--preload)", "'minilm'", "basename",
						"rename one", NULL },
			 "--no-config", "-p", a, "--preload", b, NULL);
	/* config file: file:line of each */
	char text[512];
	snprintf(text, sizeof text, "preload = %s\n\n[radianced]\npreload = /m/x %s\n", a, b);
	const char *path = write_file("twins.conf", text);
	char at1[320], at4[320];
	snprintf(at1, sizeof at1, "%s (%s:1)", a, path);
	snprintf(at4, sizeof at4, "%s (%s:4)", b, path);
	expect_error_all((const char *const[]){ at1, at4, "basename", NULL }, "--config", path,
			 NULL);

	/* the same directory, however spelled, is one preload */
	struct radiance_config cfg;
	char err[512];
	snprintf(a_slash, sizeof a_slash, "%s/", a);
	snprintf(a_dots, sizeof a_dots, "%s/../minilm", a);
	int rc = load(&cfg, err, sizeof err, "--no-config", "-p", a, "-p", c, "-p", a_slash, "-p",
		      a_dots, NULL);
	if (rc != 0)
		fail_msg("%s", err);
	assert_int_equal(cfg.n_preload, 2);
	assert_string_equal(cfg.preload[0], a);
	assert_string_equal(cfg.preload[1], c);
	config_finish(&cfg);
	/* the command line's list replaces the file's: no clash between them */
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "-p", a, NULL), 0);
	assert_int_equal(cfg.n_preload, 1);
	config_finish(&cfg);
}

/* --preload '' preloaded nothing without a word, while --socket '' was an
 * error. */
static void test_preload_empty(void **state)
{
	expect_error(-EINVAL, "-p/--preload", "empty value", "--no-config", "--preload", "", NULL);
	expect_error(-EINVAL, "-p/--preload", "empty value", "--no-config", "-p", " \t", NULL);
	const char *p = write_file("empty-preload.conf", "max_rows = 8\npreload =\n");
	expect_error(-EINVAL, "empty-preload.conf:2: preload", "empty value", "--config", p, NULL);
	p = write_file("empty-preload2.conf", "preload = # none yet\n");
	expect_error(-EINVAL, "empty-preload2.conf:1: preload", "empty value", "--config", p, NULL);
}

/* A key set twice in the file silently took the last value. */
static void test_duplicate_key(void **state)
{
	const char *p = write_file("dup.conf", "max_rows = 8\nmax_rows = 9\n");
	expect_error(-EINVAL, "dup.conf:2: max_rows", "line 1", "--config", p, NULL);
	/* either spelling, in or out of the section, is the same key */
	p = write_file("dup2.conf", "# x\nsocket = /tmp/a.sock\n[radianced]\nmax-rows = 8\n"
		       "max_rows = 8\n");
	expect_error(-EINVAL, "dup2.conf:5: max_rows", "line 4", "--config", p, NULL);
	p = write_file("dup3.conf", "socket = /tmp/a.sock\n\nsocket = /tmp/b.sock\n");
	expect_error(-EINVAL, "dup3.conf:3: socket", "line 1", "--config", p, NULL);

	/* preload is a list: its lines add up */
	struct radiance_config cfg;
	char err[512];
	p = write_file("preloads.conf", "preload = /m/a\nmax_rows = 8\npreload = /m/b /m/c\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", p, NULL), 0);
	assert_int_equal(cfg.n_preload, 3);
	assert_string_equal(cfg.preload[2], "/m/c");
	config_finish(&cfg);
	/* the command line may still override a key the file set */
	p = write_file("once.conf", "max_rows = 8\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", p, "--max-rows", "16", NULL), 0);
	assert_int_equal(cfg.max_rows, 16);
	config_finish(&cfg);
}

/* An option given twice on the command line silently kept the last value,
 * while the file refuses a key given twice: refused, naming the option and
 * both values, before the config file is read. --preload adds up. */
static void test_duplicate_option(void **state)
{
	expect_error(-EINVAL, "--max-rows is given twice ('4', then '8')", "give each option once",
		     "--no-config", "--max-rows", "4", "--max-rows", "8", NULL);
	/* the short and the long spelling are one option */
	expect_error(-EINVAL, "-s/--socket is given twice ('/tmp/a.sock', then '/tmp/b.sock')",
		     NULL, "--no-config", "-s", "/tmp/a.sock", "--socket", "/tmp/b.sock", NULL);
	expect_error(-EINVAL, "--require-gpu is given twice ('(no value)', then 'no')", NULL,
		     "--no-config", "--require-gpu", "--require-gpu=no", NULL);
	expect_error(-EINVAL, "--sched-uid-weights is given twice ('0:2', then '0:3')", NULL,
		     "--no-config", "--sched-uid-weights", "0:2", "--sched-uid-weights", "0:3", NULL);
	/* said before the file is read: not its absence */
	expect_error(-EINVAL, "-l/--log-level is given twice ('info', then 'debug')", NULL,
		     "--config", "/nonexistent/radianced.conf", "-l", "info", "-l", "debug", NULL);
	expect_error(-EINVAL, "--config is given twice ('/a.conf', then '/b.conf')", NULL,
		     "--config", "/a.conf", "-c", "/b.conf", NULL);

	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "-p", "/m/a", "--preload",
			      "/m/b", NULL), 0);
	assert_int_equal(cfg.n_preload, 2);
	config_finish(&cfg);
}

/* T is accepted, so the error names it with the others. */
static void test_byte_suffixes(void **state)
{
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--max-arena-bytes", "1T",
			      "--arena-bytes", "1TiB", NULL), 0);
	assert_true(cfg.max_arena_bytes == 1ull << 40);
	assert_true(cfg.arena_bytes == 1ull << 40);
	config_finish(&cfg);
	expect_error(-EINVAL, "--arena-bytes: '12Q'", "K, M, G, T", "--no-config",
		     "--arena-bytes", "12Q", NULL);
}

/* device is -1 unless given, so the CPU backend warns only when it was. */
static void test_device_unset(void **state)
{
	struct radiance_config cfg;
	char err[512];
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.device, -1);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "-d", "0", NULL), 0);
	assert_int_equal(cfg.device, 0);
	config_finish(&cfg);
}

/* docs/daemon.md "Limits": auto derives from the memory the daemon may
 * use and from max_sessions; a per-uid auto follows its total; 0 is no
 * limit; an arena limit below arena_bytes is refused, naming both. */
static void test_limits(void **state)
{
	struct radiance_config cfg;
	char err[512];
	const char *from;
	uint64_t mem = limit_memory_bytes(&from);
	assert_true(mem > 0);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.memory_bytes, mem);
	assert_int_equal(cfg.max_model_bytes, mem / 4 * 3);
	assert_int_equal(cfg.max_model_bytes_per_uid, mem / 4 * 3);
	/* never below arena_bytes, or a default OpenRing could not succeed */
	assert_int_equal(cfg.max_total_arena_bytes,
			 mem / 4 > cfg.arena_bytes ? mem / 4 : cfg.arena_bytes);
	assert_int_equal(cfg.max_sessions_per_uid, 64);
	config_finish(&cfg);

	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--max-model-bytes", "8G",
			      "--max-sessions", "9", "--max-total-arena-bytes", "0", NULL), 0);
	assert_int_equal(cfg.max_model_bytes, 8ull << 30);
	assert_int_equal(cfg.max_model_bytes_per_uid, 8ull << 30);
	assert_int_equal(cfg.max_total_arena_bytes, 0);
	assert_int_equal(cfg.max_arena_bytes_per_uid, 0);
	assert_int_equal(cfg.max_sessions_per_uid, 9);
	config_finish(&cfg);

	const char *path = write_file("limits.conf", "max_model_bytes = 0\n"
						     "max_model_bytes_per_uid = auto\n"
						     "max-sessions-per-uid = 0\n"
						     "max_arena_bytes_per_uid = 128M\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_int_equal(cfg.max_model_bytes, 0);
	assert_int_equal(cfg.max_model_bytes_per_uid, 0);
	assert_int_equal(cfg.max_sessions_per_uid, 0);
	assert_int_equal(cfg.max_arena_bytes_per_uid, 128ull << 20);
	config_finish(&cfg);

	expect_error(-EINVAL, "--max-model-bytes", "'lots'", "--no-config", "--max-model-bytes",
		     "lots", NULL);
	expect_error(-EINVAL, "--max-sessions-per-uid", "'2K'", "--no-config",
		     "--max-sessions-per-uid", "2K", NULL);
	expect_error(-EINVAL, "max_arena_bytes_per_uid 1048576 (--max-arena-bytes-per-uid)",
		     "arena_bytes 67108864 (default)", "--no-config", "--max-arena-bytes-per-uid",
		     "1M", NULL);
}

/* The zero-copy limits: defaults, file, command line over the file, range. */
static void test_zero_copy_limits(void **state)
{
	struct radiance_config cfg;
	char err[512];
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.zero_copy_rows, 64);
	assert_int_equal(cfg.zero_copy_x_kib, 1024);
	assert_int_equal(cfg.zero_copy_y_kib, 1024);
	config_finish(&cfg);

	const char *path = write_file("zc.conf", "zero_copy_x_kib = 40\nzero_copy_y_kib = 0\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_int_equal(cfg.zero_copy_x_kib, 40);
	assert_int_equal(cfg.zero_copy_y_kib, 0);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "--zero-copy-x-kib", "0",
			      "--zero-copy-y-kib", "256", NULL), 0);
	assert_int_equal(cfg.zero_copy_x_kib, 0);
	assert_int_equal(cfg.zero_copy_y_kib, 256);
	config_finish(&cfg);

	expect_error(-EINVAL, "--zero-copy-x-kib", "'-3'", "--no-config", "--zero-copy-x-kib", "-3", NULL);
	expect_error(-EINVAL, "--zero-copy-y-kib", "'2000000'", "--no-config", "--zero-copy-y-kib", "2000000",
		     NULL);
}

/* The kernel settings (cpu_simd, prefill, wgmma_tile): defaults, each from
 * the command line and the file without touching the others, and a value
 * outside the list named with the list. */
static void test_kernel_settings(void **state)
{
	struct radiance_config cfg;
	char err[512];
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.cpu_simd, 0);
	assert_int_equal(cfg.prefill, RADIANCE_BACKEND_PREFILL_AUTO);
	assert_int_equal(cfg.wgmma_tile, 0);
	config_finish(&cfg);

	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--cpu-simd", "scalar", NULL), 0);
	assert_int_equal(cfg.cpu_simd, 1);
	assert_int_equal(cfg.prefill, RADIANCE_BACKEND_PREFILL_AUTO);
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--cpu-simd", "avx2", "--prefill", "fast",
			      "--wgmma-tile", "96", NULL), 0);
	assert_int_equal(cfg.cpu_simd, 2);
	assert_int_equal(cfg.prefill, RADIANCE_BACKEND_PREFILL_FAST);
	assert_int_equal(cfg.wgmma_tile, 2);
	config_finish(&cfg);

	const char *path = write_file("kernels.conf", "prefill = fast\nwgmma_tile = 128\ncpu_simd = auto\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), 0);
	assert_int_equal(cfg.prefill, RADIANCE_BACKEND_PREFILL_FAST);
	assert_int_equal(cfg.wgmma_tile, 1);
	assert_int_equal(cfg.cpu_simd, 0);
	config_finish(&cfg);
	/* the command line overrides the file */
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "--prefill", "exact", NULL), 0);
	assert_int_equal(cfg.prefill, RADIANCE_BACKEND_PREFILL_EXACT);
	assert_int_equal(cfg.wgmma_tile, 1);
	config_finish(&cfg);

	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--prefill", "wgmma", NULL), -EINVAL);
	assert_string_equal(err, "--prefill: 'wgmma' is not a prefill value (expected auto, exact or fast)");
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--cpu-simd", "sse9", NULL), -EINVAL);
	assert_string_equal(err, "--cpu-simd: 'sse9' is not a cpu_simd value (expected auto, scalar, avx2, avx2-int16, avx512 or neon)");
	config_finish(&cfg);
	path = write_file("tile.conf", "wgmma_tile = 64\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, NULL), -EINVAL);
	assert_non_null(strstr(err, "'64' is not a wgmma_tile value (expected auto, 128 or 96)"));
	config_finish(&cfg);
}

/* RADIANCE_NUMERICS_GATE, RADIANCE_SHARE and RADIANCE_FAKE_SHARE are the
 * fallbacks of numerics_gate, share and fake_share, read by config_load
 * alone: used when neither file nor command line sets the key, checked
 * like the key, and named as the origin of a bad value. */
static void test_env_fallbacks(void **state)
{
	struct radiance_config cfg;
	char err[512];
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	unsetenv("RADIANCE_NUMERICS_GATE");
	unsetenv("RADIANCE_SHARE");
	unsetenv("RADIANCE_FAKE_SHARE");
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.numerics_gate, 0);
	assert_null(cfg.share);
	assert_int_equal(cfg.fake_share, 0);
	config_finish(&cfg);

	setenv("RADIANCE_NUMERICS_GATE", "1", 1);
	setenv("RADIANCE_SHARE", "ipc", 1);
	setenv("RADIANCE_FAKE_SHARE", "1", 1);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), 0);
	assert_int_equal(cfg.numerics_gate, 1);
	assert_string_equal(cfg.share, "ipc");
	assert_int_equal(cfg.fake_share, 1);
	config_finish(&cfg);

	/* the command line (and the file) win over the environment */
	const char *path = write_file("share.conf", "share = none\n");
	assert_int_equal(load(&cfg, err, sizeof err, "--config", path, "--numerics-gate", "0",
			      "--fake-share", "0", NULL), 0);
	assert_int_equal(cfg.numerics_gate, 0);
	assert_string_equal(cfg.share, "none");
	assert_int_equal(cfg.fake_share, 0);
	config_finish(&cfg);

	setenv("RADIANCE_SHARE", "shm", 1);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", NULL), -EINVAL);
	assert_non_null(strstr(err, "environment RADIANCE_SHARE"));
	assert_non_null(strstr(err, "'shm' is not a share mode"));
	config_finish(&cfg);
	assert_int_equal(load(&cfg, err, sizeof err, "--no-config", "--share", "bogus", NULL),
			 -EINVAL);
	assert_non_null(strstr(err, "--share: 'bogus' is not a share mode"));
	config_finish(&cfg);

	unsetenv("RADIANCE_NUMERICS_GATE");
	unsetenv("RADIANCE_SHARE");
	unsetenv("RADIANCE_FAKE_SHARE");
}

int main(void)
{
	rlog_init(RADIANCE_LOG_ERROR);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_socket_path_too_long),
		cmocka_unit_test(test_file_then_command_line),
		cmocka_unit_test(test_help_and_version),
		cmocka_unit_test(test_bad_command_line),
		cmocka_unit_test(test_bad_file),
		cmocka_unit_test(test_control_characters_escaped),
		cmocka_unit_test(test_inline_comments),
		cmocka_unit_test(test_config_file_kinds),
		cmocka_unit_test(test_combined_errors_name_sources),
		cmocka_unit_test(test_require_gpu_with_cpu_backend),
		cmocka_unit_test(test_group_resolved),
		cmocka_unit_test(test_hello_timeout_option),
		cmocka_unit_test(test_uid_weights),
		cmocka_unit_test(test_shipped_config),
		cmocka_unit_test(test_config_fifo_refused),
		cmocka_unit_test(test_preload_same_basename),
		cmocka_unit_test(test_preload_empty),
		cmocka_unit_test(test_duplicate_key),
		cmocka_unit_test(test_duplicate_option),
		cmocka_unit_test(test_byte_suffixes),
		cmocka_unit_test(test_device_unset),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_env_fallbacks),
		cmocka_unit_test(test_kernel_settings),
		cmocka_unit_test(test_zero_copy_limits),
		cmocka_unit_test(test_preload_paths_with_spaces),
		cmocka_unit_test(test_config_nul_byte),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
