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
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
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
		"group = radiance\n"
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
	assert_string_equal(cfg.socket_group, "radiance");
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
	if (rc != want || !strstr(err, needle1) || (needle2 && !strstr(err, needle2)))
		fail_msg("got %d '%s', wanted %d with '%s' and '%s'", rc, err, want, needle1,
			 needle2 ? needle2 : "");
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

int main(void)
{
	radiance_log_init(RADIANCE_LOG_ERROR);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_file_then_command_line),
		cmocka_unit_test(test_help_and_version),
		cmocka_unit_test(test_bad_command_line),
		cmocka_unit_test(test_bad_file),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
