/*
 * radianced against a hostile operator environment and hostile connection
 * patterns, as opposed to hostile messages (test_faults): what is at the
 * socket path, the descriptor limit, connections that never say Hello, the
 * session limit, signals, a socket path taken over by another daemon, and
 * what the daemon logs and exits with when its command line or a preload is
 * wrong. Each test starts its own daemon (or several) on the real binary.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon_harness.h"
#include "proto_util.h"
#include "raw_client.h"
#include "shm.h"
#include "cpu_fast.h"
#include "wire.h"

static struct h_ref ref;
static struct h_daemon da, db;   /* a test's daemons; teardown stops what is left */
static char dir[64];             /* a test's scratch directory; teardown removes it */

static int group_setup(void **state)
{
	return h_ref_load_some(&ref, h_good_layers);
}

static int group_teardown(void **state)
{
	h_ref_free(&ref);
	return 0;
}

static void rm_rf(const char *path);

static int stop_daemons(void **state)
{
	h_daemon_stop(&da);
	h_daemon_stop(&db);
	if (dir[0])
		rm_rf(dir);
	dir[0] = 0;
	return 0;
}

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "/tmp/radiance-hard-XXXXXX");
	assert_non_null(mkdtemp(dir));
}

/* The harness's start-up probe connects and hangs up; a test that counts
 * sessions waits until the daemon has seen that. */
static void settle(void)
{
	h_sleep_ms(200);
}

/* --- helpers --------------------------------------------------------------- */


/* The first line of the file containing needle, into out; 0 or -1. */
static int find_line(const char *path, const char *needle, char *out, size_t outlen)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char line[2048];
	int rc = -1;
	while (fgets(line, sizeof line, f)) {
		if (strstr(line, needle)) {
			snprintf(out, outlen, "%s", line);
			rc = 0;
			break;
		}
	}
	fclose(f);
	return rc;
}

/* Runs radianced --no-config --backend B ARGS... (NULL-terminated) to its
 * exit, at most timeout_s, stdout and stderr into log. Returns the wait
 * status, or -1 if it was still running (then killed). */
static int run_daemon(const char *log, double timeout_s, ...)
{
	const char *args[25];
	size_t n = 0;
	va_list ap;
	va_start(ap, timeout_s);
	for (const char *a; (a = va_arg(ap, const char *)) && n < 24;)
		args[n++] = a;
	va_end(ap);
	args[n] = NULL;
	return h_wait_exit(h_spawn_logged(log, args), timeout_s);
}

static void rm_rf(const char *path)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", path);
}

/* How many of pid's descriptors are open on path. */
static int count_fds_on(pid_t pid, const char *path)
{
	char dpath[64];
	snprintf(dpath, sizeof dpath, "/proc/%d/fd", (int)pid);
	DIR *dd = opendir(dpath);
	if (!dd)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dd))) {
		char link[400], target[256];
		snprintf(link, sizeof link, "%s/%s", dpath, e->d_name);
		ssize_t len = readlink(link, target, sizeof target - 1);
		if (len <= 0)
			continue;
		target[len] = 0;
		if (strcmp(target, path) == 0)
			n++;
	}
	closedir(dd);
	return n;
}

/* The daemon is alive, serves a good client, and exits 0 on SIGTERM. */
static void expect_healthy_then_stop(struct h_daemon *d)
{
	assert_true(h_daemon_alive(d));
	assert_int_equal(h_good_client(d->socket, &ref), 0);
	int st = h_daemon_stop(d);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* --- 1: what is at the socket path ------------------------------------------ */

static void socket_path_not_a_socket(void **state)
{
	char path[128], log[128], target[128];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(target, sizeof target, "%s/target.txt", dir);

	static const char *const kinds[] = { "file", "directory", "fifo", "symlink" };
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		snprintf(path, sizeof path, "%s/%s", dir, kinds[k]);
		FILE *f = fopen(target, "w");
		assert_non_null(f);
		fputs("precious\n", f);
		fclose(f);
		if (k == 0) {
			assert_int_equal(rename(target, path), 0);
		} else if (k == 1) {
			assert_int_equal(mkdir(path, 0755), 0);
		} else if (k == 2) {
			assert_int_equal(mkfifo(path, 0644), 0);
		} else {
			assert_int_equal(symlink(target, path), 0);
		}
		int st = run_daemon(log, 20.0, "--socket", path, NULL);
		struct stat sb;
		int still_there = lstat(path, &sb) == 0;
		char line[2048] = "";
		int said = find_line(log, "exists and is not a socket", line, sizeof line) == 0;
		if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) == 0 || !still_there || !said) {
			h_show_file(log);
			fail_msg("%s at the socket path: status 0x%x, %s, %s", kinds[k], st,
				 still_there ? "still there" : "DELETED",
				 said ? "explained" : "no 'exists and is not a socket' line");
		}
		assert_int_equal(WEXITSTATUS(st), 1);
		assert_non_null(strstr(line, path));
		if (k == 0 || k == 3) {
			/* the content survived (through the link, for the symlink) */
			char buf[32] = "";
			f = fopen(path, "r");
			assert_non_null(f);
			assert_non_null(fgets(buf, sizeof buf, f));
			fclose(f);
			assert_string_equal(buf, "precious\n");
		}
	}
}

static void stale_socket_replaced_live_one_kept(void **state)
{
	/* a socket file nobody listens on is a leftover: replaced */
	char path[128], log[128];
	make_dir();
	snprintf(path, sizeof path, "%s/stale.sock", dir);
	snprintf(log, sizeof log, "%s/second.log", dir);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	assert_true(strlen(path) < sizeof sa.sun_path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);   /* no listen(), no unlink: stale */

	/* the harness waits for its own socket name: start by hand instead */
	fflush(NULL);
	pid_t self = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		h_die_with_parent(self);
		int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(lfd, 1);
		dup2(lfd, 2);
		const char *bin = h_env("RADIANCED", "build/radianced");
		execl(bin, bin, "--no-config", "--backend", h_env("RADIANCE_TEST_BACKEND", "cpu"),
		      "--socket", path, (char *)NULL);
		_exit(127);
	}
	int up = 0;
	for (int i = 0; i < 1000 && !up; i++) {
		int c = h_try_connect(path);
		if (c >= 0) {
			close(c);
			up = 1;
		} else {
			h_sleep_ms(10);
		}
	}
	if (!up)
		h_show_file(log);
	assert_true(up);

	/* a second daemon on the live socket refuses and leaves it alone */
	char log2[128];
	snprintf(log2, sizeof log2, "%s/third.log", dir);
	int st = run_daemon(log2, 20.0, "--socket", path, NULL);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(h_count_lines(log2, "another daemon is listening"), 1);
	assert_int_equal(h_good_client(path, &ref), 0);

	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	struct stat sb;
	assert_int_equal(lstat(path, &sb), -1);   /* its own socket: removed */
}

/* --- 2: the descriptor limit ------------------------------------------------ */

static void accept_at_fd_limit(void **state)
{
	struct h_daemon *d = &da;
	const char *const extra[] = { "--max-sessions", "1000", NULL };
	assert_int_equal(h_daemon_start_argv(d, extra), 0);
	settle();
	int base = h_count_fds(d->pid);
	int nulls = count_fds_on(d->pid, "/dev/null");   /* stdin and the reserve */
	assert_true(base > 0);
	/* Room for a good client later (socket, checkpoint files, doorbells,
	 * memfd and the copies queued with RingReady), not for 80 more. */
	struct rlimit rl = { (rlim_t)base + 24, (rlim_t)base + 24 };
	assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &rl, NULL), 0);

	enum { N = 80 };
	struct raw w[N];
	int n = 0;
	for (; n < N; n++)
		if (raw_open_at(&w[n], d->socket) < 0)
			break;
	assert_true(n > 40);
	h_sleep_ms(1000);
	assert_true(h_daemon_alive(d));

	/* No log flood: before the fix, a million "accept: Too many open files"
	 * lines in 3 s, the loop spinning on the readable listening socket. */
	int lines = h_count_lines(d->log, "accept");
	if (lines > 3) {
		fprintf(stderr, "%d accept lines in the log in 1 s\n", lines);
		fail();
	}
	assert_int_equal(h_count_lines(d->log, "Too many open files"), 1);
	/* The last connections were not left hanging in the backlog: closed,
	 * with an Error saying why when it got through. */
	for (int i = n - 10; i < n; i++) {
		int code;
		int rc = raw_read_to_end(&w[i], 3000, &code, NULL, 0);
		assert_int_not_equal(rc, -ETIMEDOUT);
		assert_true(code == 0 || code == EMFILE);
	}
	for (int i = 0; i < n; i++)
		raw_close(&w[i]);
	/* Descriptors free again: the daemon says so and serves. */
	int fds = -1;
	for (int i = 0; i < 200; i++) {
		fds = h_count_fds(d->pid);
		if (fds <= base)
			break;
		h_sleep_ms(10);
	}
	assert_true(fds <= base);   /* nothing leaked */
	assert_int_equal(count_fds_on(d->pid, "/dev/null"), nulls);   /* the reserve is back */
	assert_int_equal(h_good_client(d->socket, &ref), 0);
	assert_int_equal(h_count_lines(d->log, "accepting connections again"), 1);
	expect_healthy_then_stop(d);
}

/* At its fd limit the daemon loses descriptors a client sends (the kernel
 * truncates the control message). That is the daemon's condition, not the
 * client's protocol violation: the client gets Error(EMFILE) saying so, and
 * once descriptors are free again everyone is served. */
static void fds_lost_at_fd_limit(void **state)
{
	struct h_daemon *d = &da;
	assert_int_equal(h_daemon_start(d), 0);
	settle();
	struct raw w;
	assert_int_equal(raw_open_at(&w, d->socket), 0);
	raw_hello(&w);
	struct rlimit saved;
	assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, NULL, &saved), 0);
	int base = h_count_fds(d->pid);
	struct rlimit low = { (rlim_t)base + 4, saved.rlim_max };
	assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &low, NULL), 0);

	enum { NF = 20 };
	int fds[NF];
	char *names[NF];
	for (int i = 0; i < NF; i++) {
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		assert_true(fds[i] >= 0);
		names[i] = "model.safetensors";
	}
	raw_send_load_model(&w, names, NF, fds, NF);
	for (int i = 0; i < NF; i++)
		close(fds[i]);
	int code;
	char text[256];
	/* the rest of the frame is unread when the daemon closes: EOF or a
	 * reset, after the Error */
	int rc = raw_read_to_end(&w, 5000, &code, text, sizeof text);
	raw_close(&w);
	assert_true(rc == 0 || rc == -ECONNRESET);
	assert_int_equal(code, EMFILE);
	assert_non_null(strstr(text, "open-file limit"));

	assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, &saved, NULL), 0);
	assert_int_equal(h_good_client(d->socket, &ref), 0);
	assert_int_equal(h_count_lines(d->log, "this daemon is at its open-file limit"), 1);
	assert_int_equal(h_count_lines(d->log, "protocol violation"), 0);
	expect_healthy_then_stop(d);
}

static void soft_fd_limit_raised(void **state)
{
	struct rlimit saved, low;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
	if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 256)
		skip();
	low = saved;
	low.rlim_cur = 256;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	struct h_daemon *d = &da;
	int rc = h_daemon_start(d);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
	assert_int_equal(rc, 0);
	struct rlimit got;
	assert_int_equal(prlimit(d->pid, RLIMIT_NOFILE, NULL, &got), 0);
	assert_true(got.rlim_cur == saved.rlim_max);
	expect_healthy_then_stop(d);
}

/* --- 3: connections that never say Hello ------------------------------------ */

static void hello_timeout(void **state)
{
	struct h_daemon *d = &da;
	/* one uid takes every slot: no per-uid limit below max_sessions */
	const char *const extra[] = { "--max-sessions", "4", "--max-sessions-per-uid", "0",
				      "--hello-timeout-ms", "300", NULL };
	assert_int_equal(h_daemon_start_argv(d, extra), 0);
	settle();
	double t0 = h_now();
	struct raw idle[4];
	for (int i = 0; i < 4; i++)
		assert_int_equal(raw_open_at(&idle[i], d->socket), 0);
	/* every slot is taken by a connection that says nothing */
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 5000;
	h_sleep_ms(50);
	struct radiance *r = radiance_connect(d->socket, &o);
	if (r)
		radiance_disconnect(r);
	assert_null(r);
	assert_int_equal(errno, EBUSY);

	/* ... until the handshake timeout frees them, each with an Error */
	for (int i = 0; i < 4; i++) {
		int code;
		char text[256];
		assert_int_equal(raw_read_to_end(&idle[i], 5000, &code, text, sizeof text), 0);
		assert_int_equal(code, ETIMEDOUT);
		assert_non_null(strstr(text, "no Hello within 300 ms"));
		raw_close(&idle[i]);
	}
	assert_true(h_now() - t0 >= 0.29);

	/* a session that did say Hello is not timed out */
	struct raw w;
	assert_int_equal(raw_open_at(&w, d->socket), 0);
	raw_hello(&w);
	h_sleep_ms(600);
	raw_expect_alive(&w);
	raw_close(&w);
	assert_int_equal(h_good_client(d->socket, &ref), 0);
	/* one line per timed-out session, no more */
	assert_int_equal(h_count_lines(d->log, "no Hello within 300 ms"), 4);
	expect_healthy_then_stop(d);
}

/* --- 4: the session limit answers EBUSY, never a reset ---------------------- */

/* The one home of the session limit (--max-sessions). */
static void log_keep(void *user, int priority, const char *msg)
{
	if (priority <= LOG_WARNING)
		snprintf(user, 512, "%s", msg);
}

static void session_limit_refusal_is_clean(void **state)
{
	struct h_daemon *d = &da;
	const char *const extra[] = { "--max-sessions", "1", NULL };
	assert_int_equal(h_daemon_start_argv(d, extra), 0);
	settle();
	struct radiance *holder = radiance_connect(d->socket, NULL);
	assert_non_null(holder);

	/* Each connection has its Hello queued before the daemon looks at it:
	 * closing such a socket unread would reset it. Several rounds, as the
	 * reset raced with the client's read. */
	enum { N = 40 };
	for (int round = 0; round < 3; round++) {
		struct raw w[N];
		for (int i = 0; i < N; i++) {
			assert_int_equal(raw_open_at(&w[i], d->socket), 0);
			raw_send_hello(&w[i], RADIANCE_PROTOCOL_VERSION, "hardening", NULL, 0);
		}
		for (int i = 0; i < N; i++) {
			int code;
			char text[256];
			int rc = raw_read_to_end(&w[i], 5000, &code, text, sizeof text);
			if (rc != 0 || code != EBUSY)
				fail_msg("round %d connection %d: rc %d (%s), error %d '%s'", round, i,
					 rc, strerror(rc < 0 ? -rc : 0), code, text);
			assert_string_equal(text, "too many sessions (the limit is 1)");
			raw_close(&w[i]);
		}
		/* the daemon drains at most 64 refused connections at once (past
		 * that it closes at once, and a reset is allowed): let this round's
		 * drains see their hang-ups before the next 40 arrive */
		h_sleep_ms(300);
	}
	/* through the library too: EBUSY, and the daemon's reason reaches the
	 * log callback (radiance_connect has no handle to carry it) */
	for (int i = 0; i < 10; i++) {
		char said[512] = "";
		struct radiance_options o = RADIANCE_OPTIONS_INIT;
		o.log = log_keep;
		o.log_user = said;
		errno = 0;
		struct radiance *r = radiance_connect(d->socket, &o);
		assert_null(r);
		assert_int_equal(errno, EBUSY);
		if (!strstr(said, "too many sessions (the limit is 1)"))
			fail_msg("connect %d: the log callback got \"%s\"", i, said);
	}
	/* 130 refusals, a handful of log lines */
	int lines = h_count_lines(d->log, "refusing a connection");
	assert_true(lines >= 1 && lines <= 3);
	radiance_disconnect(holder);
	settle();
	expect_healthy_then_stop(d);
}

/* --- 5: signals -------------------------------------------------------------- */

static void sighup_does_not_kill(void **state)
{
	struct h_daemon *d = &da;
	assert_int_equal(h_daemon_start(d), 0);
	struct radiance *r = radiance_connect(d->socket, NULL);
	assert_non_null(r);
	static const int sigs[] = { SIGHUP, SIGUSR1, SIGUSR2, SIGHUP };
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
		assert_int_equal(kill(d->pid, sigs[i]), 0);
		h_sleep_ms(100);
		assert_true(h_daemon_alive(d));
	}
	/* the connected client did not notice */
	struct radiance_stats_reply *s;
	assert_int_equal(radiance_get_stats(r, &s), 0);
	radiance_stats_free(s);
	radiance_disconnect(r);
	assert_int_equal(h_count_lines(d->log, "reloading the configuration is not supported"), 2);

	/* and SIGTERM still stops it cleanly, removing the socket */
	char socket_path[sizeof d->socket];
	memcpy(socket_path, d->socket, sizeof socket_path);
	assert_int_equal(h_good_client(d->socket, &ref), 0);
	kill(d->pid, SIGTERM);
	assert_true(h_daemon_wait(d, 10.0));
	assert_true(WIFEXITED(d->exit_status));
	assert_int_equal(WEXITSTATUS(d->exit_status), 0);
	struct stat sb;
	assert_int_equal(lstat(socket_path, &sb), -1);
	h_daemon_stop(d);
}

/* --- 6: the socket path now belongs to another daemon ----------------------- */

static void stop_leaves_another_daemons_socket(void **state)
{
	struct h_daemon *a = &da, *b = &db;
	assert_int_equal(h_daemon_start(a), 0);
	assert_int_equal(h_daemon_start(b), 0);
	/* what `rm S; start B on S` leaves: A's path is B's socket now */
	assert_int_equal(rename(b->socket, a->socket), 0);
	kill(a->pid, SIGTERM);
	assert_true(h_daemon_wait(a, 10.0));
	assert_true(WIFEXITED(a->exit_status));
	assert_int_equal(WEXITSTATUS(a->exit_status), 0);
	struct stat sb;
	assert_int_equal(lstat(a->socket, &sb), 0);
	assert_true(S_ISSOCK(sb.st_mode));
	assert_int_equal(h_count_lines(a->log, "is no longer the socket this daemon bound"), 1);
	/* B still answers there */
	assert_int_equal(h_good_client(a->socket, &ref), 0);
	/* give B its own name back; it removes that at exit */
	assert_int_equal(rename(a->socket, b->socket), 0);
	h_daemon_stop(a);
	assert_int_equal(h_good_client(b->socket, &ref), 0);
	kill(b->pid, SIGTERM);
	assert_true(h_daemon_wait(b, 10.0));
	assert_true(WIFEXITED(b->exit_status));
	assert_int_equal(WEXITSTATUS(b->exit_status), 0);
	assert_int_equal(lstat(b->socket, &sb), -1);
	h_daemon_stop(b);
}

/* --- systemd: notify, watchdog, socket activation still work ------------------ */

/* Datagrams on the notify socket until one contains want (1) or timeout (0);
 * every message seen is appended to seen. */
static int notify_wait(int fd, const char *want, char *seen, size_t seenlen, int timeout_ms)
{
	double deadline = h_now() + timeout_ms / 1000.0;
	while (h_now() < deadline) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 50) <= 0)
			continue;
		char buf[512];
		ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = 0;
		size_t used = strlen(seen);
		snprintf(seen + used, seenlen - used, "%s|", buf);
		if (strstr(buf, want))
			return 1;
	}
	return 0;
}

static void systemd_notify_and_watchdog(void **state)
{
	make_dir();
	char path[128];
	snprintf(path, sizeof path, "%s/notify", dir);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, path, strlen(path) + 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", "200000", 1);   /* fed every 100 ms */
	int rc = h_daemon_start(&da);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	assert_int_equal(rc, 0);
	char seen[8192] = "";
	assert_true(notify_wait(fd, "READY=1", seen, sizeof seen, 20000));
	assert_non_null(strstr(seen, "STATUS=serving on"));
	/* the watchdog keeps being fed while clients come and go: about 30
	 * feeds in 3 s; 5 leaves room for a loaded sanitizer machine, where
	 * the loop can be off the CPU for most of a second (CI saw fewer than
	 * 5 in a 1 s window under ThreadSanitizer) */
	int fed = 0;
	double start = h_now(), end = start + 3.0;
	while (h_now() < end) {
		seen[0] = 0;
		fed += notify_wait(fd, "WATCHDOG=1", seen, sizeof seen, 300);
	}
	if (fed < 5)
		fprintf(stderr, "watchdog fed %d times in %.2f s\n", fed, h_now() - start);
	assert_true(fed >= 5);
	assert_int_equal(h_good_client(da.socket, &ref), 0);
	kill(da.pid, SIGHUP);   /* ignored, and not a stop */
	seen[0] = 0;
	assert_true(notify_wait(fd, "WATCHDOG=1", seen, sizeof seen, 5000));
	assert_null(strstr(seen, "STOPPING=1"));
	kill(da.pid, SIGTERM);
	seen[0] = 0;
	assert_true(notify_wait(fd, "STOPPING=1", seen, sizeof seen, 10000));
	assert_true(h_daemon_wait(&da, 10.0));
	assert_true(WIFEXITED(da.exit_status));
	assert_int_equal(WEXITSTATUS(da.exit_status), 0);
	close(fd);
}

static void systemd_socket_activation(void **state)
{
	make_dir();
	char path[128], log[128];
	snprintf(path, sizeof path, "%s/activated.sock", dir);
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, path, strlen(path) + 1);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(lfd, 16), 0);
	fflush(NULL);
	pid_t self = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		h_die_with_parent(self);
		int out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(out, 1);
		dup2(out, 2);
		dup2(lfd, 3);
		char num[32];
		snprintf(num, sizeof num, "%d", (int)getpid());
		setenv("LISTEN_PID", num, 1);
		setenv("LISTEN_FDS", "1", 1);
		const char *bin = h_env("RADIANCED", "build/radianced");
		/* --socket names a path that must not be touched, and is not
		 * checked: too long to bind (129 bytes), it is no error here */
		char unused[160];
		snprintf(unused, sizeof unused, "/nonexistent/%0111d.sock", 0);
		execl(bin, bin, "--no-config", "--backend", h_env("RADIANCE_TEST_BACKEND", "cpu"),
		      "--socket", unused, (char *)NULL);
		_exit(127);
	}
	close(lfd);
	/* clients may connect before it is up: they wait in the backlog */
	assert_int_equal(h_good_client(path, &ref), 0);
	kill(pid, SIGTERM);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		h_show_file(log);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(h_count_lines(log, "listening on the socket systemd passed"), 1);
	/* systemd's socket stays: the daemon never unlinks what it did not bind */
	struct stat sb;
	assert_int_equal(lstat(path, &sb), 0);
	assert_true(S_ISSOCK(sb.st_mode));
}

/* --- 9, 11: command-line errors and log lines -------------------------------- */

static void bad_group_is_a_usage_error(void **state)
{
	char log[128], path[128];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(path, sizeof path, "%s/radiance.sock", dir);
	int st = run_daemon(log, 20.0, "--socket", path, "--group", "no-such-group-radiance",
			    NULL);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 2)
		h_show_file(log);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 2);
	assert_int_equal(h_count_lines(log, "group 'no-such-group-radiance' does not exist"), 1);
	/* refused before the backend started or the socket was bound */
	assert_int_equal(h_count_lines(log, "backend"), 0);
	struct stat sb;
	assert_int_equal(lstat(path, &sb), -1);
}

/* A socket path longer than sun_path holds is a bad value found before
 * anything starts: exit 2 naming the option, no backend, no socket. */
static void long_socket_path_is_a_usage_error(void **state)
{
	char log[128], path[200];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(path, sizeof path, "/tmp/%0119d.sock", 0);   /* 129 bytes */
	int st = run_daemon(log, 20.0, "-s", path, NULL);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 2)
		h_show_file(log);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 2);
	assert_int_equal(h_count_lines(log, "(-s/--socket) is 129 bytes, longer than the 107 a Unix "
				       "socket address holds"), 1);
	assert_int_equal(h_count_lines(log, "backend"), 0);
}

/* The command line refuses an option given twice, as the file a key. */
static void repeated_option_is_a_usage_error(void **state)
{
	char log[128], path[128];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(path, sizeof path, "%s/radiance.sock", dir);
	int st = run_daemon(log, 20.0, "--socket", path, "--max-rows", "4", "--max-rows", "8",
			    NULL);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 2)
		h_show_file(log);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 2);
	assert_int_equal(h_count_lines(log, "radianced: --max-rows is given twice ('4', then "
				       "'8')"), 1);
	struct stat sb;
	assert_int_equal(lstat(path, &sb), -1);
}

static void failed_preload_is_one_line(void **state)
{
	char log[128], path[128], missing[128];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(path, sizeof path, "%s/radiance.sock", dir);
	snprintf(missing, sizeof missing, "%s/no-such-checkpoint", dir);
	int st = run_daemon(log, 20.0, "--socket", path, "--preload", missing, NULL);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	/* one warning-or-worse line, naming the directory once */
	int problems = h_count_lines(log, "[warn]") + h_count_lines(log, "[error]");
	char line[2048];
	assert_int_equal(find_line(log, "[error]", line, sizeof line), 0);
	const char *first = strstr(line, missing);
	if (problems != 1 || !first || strstr(first + 1, missing) ||
	    !strstr(line, "No such file or directory")) {
		h_show_file(log);
		fail_msg("%d warn/error lines; the error line: %s", problems, line);
	}
}

/* --- 10: --help ---------------------------------------------------------------- */

static void help_text(void **state)
{
	char cmd[512], line[512];
	snprintf(cmd, sizeof cmd, "%s --help", h_env("RADIANCED", "build/radianced"));
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	int col = -1, options = 0, signals = 0, exits = 0, logs = 0;
	while (fgets(line, sizeof line, p)) {
		assert_true(strlen(line) <= 80);   /* 79 and the newline */
		if (strncmp(line, "Signals:", 8) == 0)
			signals = 1;
		if (strncmp(line, "Exit status:", 12) == 0)
			exits = 1;
		if (strstr(line, "stderr") && strstr(line, "journal"))
			logs = 1;
		if (strncmp(line, "  -", 3) != 0 && strncmp(line, "      --", 8) != 0)
			continue;
		/* the help column starts after the option and at least two spaces */
		char *gap = strstr(line + strspn(line, " "), "  ");
		assert_non_null(gap);
		int c = (int)(gap - line) + (int)strspn(gap, " ");
		if (col < 0)
			col = c;
		if (c != col)
			fail_msg("help column %d, not %d: %s", c, col, line);
		options++;
	}
	assert_int_equal(pclose(p), 0);
	assert_true(options >= 15);
	assert_true(signals && exits && logs);
}

/* --- 12: what the backend choice and its sizing say ------------------------- */

/* `--backend auto --device 7 --numerics-gate 1` on a machine without a GPU
 * served from the CPU without a word. */
static void auto_backend_says_why(void **state)
{
#ifdef RADIANCE_GPU
	skip();   /* a GPU build may really pick a GPU, and has no device 7 */
#endif
	const char *args[] = { "--backend", "auto", "--device", "7", "--numerics-gate", "1", NULL };
	assert_int_equal(h_daemon_start_argv(&da, args), 0);
	char line[2048];
	assert_int_equal(h_count_lines(da.log, "backend auto:"), 1);
	assert_int_equal(find_line(da.log, "backend auto:", line, sizeof line), 0);
	if (!strstr(line, "[warn]") || !strstr(line, "this build has no GPU backend") ||
	    !strstr(line, "using cpu"))
		fail_msg("the backend auto line: %s", line);
	assert_int_equal(find_line(da.log, "device 7 has no effect", line, sizeof line), 0);
	assert_non_null(strstr(line, "[warn]"));
	assert_int_equal(find_line(da.log, "numerics_gate has no effect", line, sizeof line), 0);
	assert_non_null(strstr(line, "[warn]"));
	expect_healthy_then_stop(&da);

	/* neither option given, cpu asked for: nothing to explain or warn about */
	assert_int_equal(h_daemon_start_argv(&db, (const char *[]){ "--backend", "cpu", NULL }), 0);
	assert_int_equal(h_count_lines(db.log, "backend auto"), 0);
	assert_int_equal(h_count_lines(db.log, "has no effect"), 0);
	assert_int_equal(h_count_lines(db.log, "[warn]"), 0);
	expect_healthy_then_stop(&db);
}

/* It said "backend 'gpu': backend 'gpu' requested but ...". */
static void gpu_backend_missing_said_once(void **state)
{
#ifdef RADIANCE_GPU
	skip();   /* this build has the GPU backend */
#endif
	char log[128], path[128], line[2048];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(path, sizeof path, "%s/radiance.sock", dir);
	int st = run_daemon(log, 20.0, "--socket", path, "--backend", "gpu", NULL);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(find_line(log, "[error]", line, sizeof line), 0);
	const char *first = strstr(line, "backend 'gpu'");
	if (!first || strstr(first + 1, "backend 'gpu'") || strstr(line, "requested") ||
	    !strstr(line, "this build has no GPU backend (rebuild with make GPU=cuda"))
		fail_msg("the error line: %s", line);
}

/* "cpu backend: out of memory for scratch" named neither a size nor the
 * options behind it. The address-space limit makes the allocation fail on
 * any machine (a sanitizer's allocator is told the same through its
 * options, as it does not run under RLIMIT_AS). */
static void cpu_scratch_oom_names_size_and_options(void **state)
{
	char log[128], path[128], line[2048], bytes[64];
	make_dir();
	snprintf(log, sizeof log, "%s/radianced.log", dir);
	snprintf(path, sizeof path, "%s/radiance.sock", dir);
	/* what the CPU backend's fast path would allocate here (its level and
	 * threads are this process's too) */
	snprintf(bytes, sizeof bytes, "%zu bytes",
		 radiance_cpu_fast_scratch_bytes_for(&(struct radiance_cpu_fast_options){
			 .simd = RADIANCE_CPU_SIMD_AUTO, .max_rows = 65536, .max_k = 1u << 20 }));

	int sanitized = h_sanitized();
	struct rlimit old;
	char *saved[2] = { NULL, NULL };
	const char *vars[2] = { "ASAN_OPTIONS", "TSAN_OPTIONS" };
	assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
	if (sanitized) {
		for (int i = 0; i < 2; i++) {
			const char *v = getenv(vars[i]);
			char opts[1024];
			saved[i] = v ? strdup(v) : NULL;
			snprintf(opts, sizeof opts, "%s%sallocator_may_return_null=1:"
				 "max_allocation_size_mb=8192", v ? v : "", v && *v ? ":" : "");
			setenv(vars[i], opts, 1);
		}
	} else {
		struct rlimit lim = { 8ull << 30, old.rlim_max };
		if (old.rlim_max != RLIM_INFINITY && old.rlim_max < lim.rlim_cur)
			lim.rlim_cur = old.rlim_max;
		assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
	}
	int st = run_daemon(log, 20.0, "--socket", path, "--max-rows", "65536", "--max-k",
			    "1048576", NULL);
	if (sanitized) {
		for (int i = 0; i < 2; i++) {
			if (saved[i])
				setenv(vars[i], saved[i], 1);
			else
				unsetenv(vars[i]);
			free(saved[i]);
		}
	} else {
		assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
	}
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1)
		h_show_file(log);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(find_line(log, "[error]", line, sizeof line), 0);
	if (!strstr(line, bytes) || !strstr(line, "max_rows 65536") ||
	    !strstr(line, "max_k 1048576") || !strstr(line, "--max-rows") ||
	    !strstr(line, "--max-k"))
		fail_msg("wanted '%s', max_rows, max_k and the options in: %s", bytes, line);
}

/* --help says what a BYTES value may look like. */
static void help_names_byte_suffixes(void **state)
{
	char cmd[512], line[512];
	snprintf(cmd, sizeof cmd, "%s --help", h_env("RADIANCED", "build/radianced"));
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	int bytes_opts = 0, suffixes = 0;
	while (fgets(line, sizeof line, p)) {
		if (strstr(line, " BYTES "))   /* an option's argument */
			bytes_opts++;
		if (strstr(line, "BYTES") && strstr(line, "K, M, G or T") &&
		    strstr(line, "powers of 1024"))
			suffixes++;
	}
	assert_int_equal(pclose(p), 0);
	/* arena_bytes, max_arena_bytes and the four byte limits */
	assert_int_equal(bytes_opts, 6);
	assert_int_equal(suffixes, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(socket_path_not_a_socket, stop_daemons),
		cmocka_unit_test_teardown(stale_socket_replaced_live_one_kept, stop_daemons),
		cmocka_unit_test_teardown(accept_at_fd_limit, stop_daemons),
		cmocka_unit_test_teardown(fds_lost_at_fd_limit, stop_daemons),
		cmocka_unit_test_teardown(soft_fd_limit_raised, stop_daemons),
		cmocka_unit_test_teardown(hello_timeout, stop_daemons),
		cmocka_unit_test_teardown(session_limit_refusal_is_clean, stop_daemons),
		cmocka_unit_test_teardown(sighup_does_not_kill, stop_daemons),
		cmocka_unit_test_teardown(stop_leaves_another_daemons_socket, stop_daemons),
		cmocka_unit_test_teardown(systemd_notify_and_watchdog, stop_daemons),
		cmocka_unit_test_teardown(systemd_socket_activation, stop_daemons),
		cmocka_unit_test_teardown(bad_group_is_a_usage_error, stop_daemons),
		cmocka_unit_test_teardown(long_socket_path_is_a_usage_error, stop_daemons),
		cmocka_unit_test_teardown(repeated_option_is_a_usage_error, stop_daemons),
		cmocka_unit_test_teardown(failed_preload_is_one_line, stop_daemons),
		cmocka_unit_test_teardown(help_text, stop_daemons),
		cmocka_unit_test_teardown(auto_backend_says_why, stop_daemons),
		cmocka_unit_test_teardown(gpu_backend_missing_said_once, stop_daemons),
		cmocka_unit_test_teardown(cpu_scratch_oom_names_size_and_options, stop_daemons),
		cmocka_unit_test_teardown(help_names_byte_suffixes, stop_daemons),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
