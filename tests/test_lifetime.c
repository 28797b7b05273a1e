/*
 * The daemon's lifetime and what it holds, against the real radianced
 * binary ($RADIANCED) on the CPU backend: fd and memory leak bounds over
 * many sessions; SIGTERM (a clean exit; requests still in the SQ run and
 * their results reach the client before the Goodbye); the socket's
 * directory made at start and left at exit. Signals and the process's
 * limits against a hostile environment are test_hardening.
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
#include <unistd.h>

#include "daemon_fixture.h"

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

/* --- start-up: the socket's directory -------------------------------------- */

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

/* A test process that dies without its teardown (a failed assertion
 * outside cmocka's reach, a crash, a timeout's SIGKILL) takes its daemon
 * with it (h_die_with_parent): a stand-in test process starts one through
 * the harness and is SIGKILLed. This process is a subreaper meanwhile, so
 * the orphaned daemon becomes its child and how it ended can be read. */
static void daemon_dies_with_its_test(void **state)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	fflush(NULL);
	pid_t harness = fork();
	assert_true(harness >= 0);
	if (harness == 0) {
		close(p[0]);
		struct h_daemon hd;
		if (h_daemon_start(&hd) < 0 || write(p[1], &hd, sizeof hd) != sizeof hd)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	struct h_daemon d;
	ssize_t n = read(p[0], &d, sizeof d);
	close(p[0]);
	int up = n == sizeof d && d.pid > 0 && kill(d.pid, 0) == 0;
	kill(harness, SIGKILL);
	int hst;
	waitpid(harness, &hst, 0);
	/* gone within a few seconds (the kernel's SIGKILL is immediate);
	 * h_wait_exit kills and reaps it at the deadline, so a daemon that
	 * outlived its test fails here and is not left behind either */
	int st = up ? h_wait_exit(d.pid, 5.0) : -1;
	prctl(PR_SET_CHILD_SUBREAPER, 0);
	if (n == sizeof d)
		h_daemon_cleanup(&d);
	assert_true(up);
	assert_true(WIFSIGNALED(hst) && WTERMSIG(hst) == SIGKILL);
	if (st == -1)
		fail_msg("radianced (pid %d) still ran 5 s after its test process was SIGKILLed",
			 (int)d.pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGKILL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(no_leaks_over_many_sessions, start, stop),
		cmocka_unit_test_setup_teardown(sigterm_exits_cleanly, start, stop_after_sigterm),
		cmocka_unit_test_setup_teardown(sigterm_delivers_drained_results, start,
						stop_after_sigterm),
		cmocka_unit_test(socket_directory),
		cmocka_unit_test(daemon_dies_with_its_test),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
