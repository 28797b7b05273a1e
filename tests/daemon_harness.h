/*
 * Test harness for the tests that drive the real radianced binary
 * (test_client_api, test_faults, test_radiancectl, ...): start it on a socket in a
 * fresh mkdtemp directory, wait for the socket, stop it, and compute CPU
 * reference outputs for the real checkpoint's captured activations.
 *
 * Header-only (static functions) because the Makefile builds each
 * tests/test_*.c into its own binary.
 *
 * Environment (exported by tests/run.sh):
 *   RADIANCED           the daemon binary (default build/radianced)
 *   RADIANCECTL         radiancectl (default build/radiancectl)
 *   RADIANCE_TEST_DATA  tests/data
 *   RADIANCE_TEST_BACKEND  --backend for the daemon (default cpu)
 *   RADIANCE_TEST_VERBOSE  set: print the daemon's log after every test
 */
#ifndef RADIANCE_DAEMON_HARNESS_H
#define RADIANCE_DAEMON_HARNESS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/prctl.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "radiance.h"
#include "reference.h"

/* --- the daemon ----------------------------------------------------------- */

struct h_daemon {
	pid_t pid;
	char dir[64];
	char socket[128];
	char log[128];
	int exit_status;      /* wait status once reaped, else -1 */
};

static inline int h_try_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

static inline void h_daemon_dump_log(const struct h_daemon *d)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return;
	char line[1024];
	fprintf(stderr, "---- radianced log (%s) ----\n", d->log);
	while (fgets(line, sizeof line, f))
		fputs(line, stderr);
	fprintf(stderr, "---- end of log ----\n");
	fclose(f);
}

/* In a child the harness forks to exec a daemon, right after fork(): the
 * kernel SIGKILLs it when the test process (parent, the process that forked)
 * ends, however it ends: a failed assertion's exit with no teardown run, a
 * crash, a SIGKILL from a timeout. execve keeps the setting (radianced is
 * not set-uid). The parent may have died between fork() and prctl(): then
 * getppid() is no longer it and the child goes at once. parent: getpid()
 * before the fork. Forks must come from the test's main thread: the signal
 * comes when the forking thread ends. */
static inline void h_die_with_parent(pid_t parent)
{
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		_exit(127);
}

/* Removes the daemon's mkdtemp directory and whatever a test left in it. */
static inline void h_daemon_cleanup(struct h_daemon *d)
{
	if (d->dir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", d->dir);
		d->dir[0] = '\0';
	}
}

/* Whether args (NULL-terminated, may be NULL) give option --name (or -c, or
 * --name=VALUE): radianced refuses an option given twice, so a default the
 * harness puts first is left out when the test gives its own. */
static inline bool h_args_give(const char *const *args, const char *name, char c)
{
	size_t n = strlen(name);
	for (size_t i = 0; args && args[i]; i++)
		if ((args[i][0] == '-' && args[i][1] == c && !args[i][2]) ||
		    (!strncmp(args[i], name, n) && (!args[i][n] || args[i][n] == '=')))
			return true;
	return false;
}

/* Starts radianced with the given extra arguments (NULL-terminated list,
 * may be empty) (--backend $RADIANCE_TEST_BACKEND and --log-level info unless
 * they give their own) and waits up to 10 s for its socket to accept. 0 or -1. */
static inline int h_daemon_start_argv(struct h_daemon *d, const char *const *extra)
{
	memset(d, 0, sizeof *d);
	d->exit_status = -1;
	snprintf(d->dir, sizeof d->dir, "/tmp/radiance-test-XXXXXX");
	if (!mkdtemp(d->dir)) {
		perror("mkdtemp");
		return -1;
	}
	snprintf(d->socket, sizeof d->socket, "%s/radiance.sock", d->dir);
	snprintf(d->log, sizeof d->log, "%s/radianced.log", d->dir);
	const char *bin = h_env("RADIANCED", "build/radianced");
	const char *argv[48] = { bin, "--no-config", "--socket", d->socket };
	int argc = 4;
	if (!h_args_give(extra, "--backend", 'b')) {
		argv[argc++] = "--backend";
		argv[argc++] = h_env("RADIANCE_TEST_BACKEND", "cpu");
	}
	if (!h_args_give(extra, "--log-level", 'l')) {
		argv[argc++] = "--log-level";
		argv[argc++] = "info";
	}
	for (size_t i = 0; extra && extra[i] && argc < 46; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;

	fflush(NULL);
	pid_t self = getpid();
	d->pid = fork();
	if (d->pid < 0) {
		perror("fork");
		return -1;
	}
	if (d->pid == 0) {
		h_die_with_parent(self);
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			dup2(null, 0);
		execv(bin, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	double deadline = h_now() + 10.0;
	while (h_now() < deadline) {
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->exit_status = st;
			fprintf(stderr, "radianced exited during startup (status 0x%x)\n", st);
			d->pid = 0;
			h_daemon_dump_log(d);
			h_daemon_cleanup(d);
			return -1;
		}
		int fd = h_try_connect(d->socket);
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		h_sleep_ms(10);
	}
	fprintf(stderr, "radianced: no socket at %s after 10 s\n", d->socket);
	h_daemon_dump_log(d);
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	d->pid = 0;
	h_daemon_cleanup(d);
	return -1;
}

static inline int h_daemon_start(struct h_daemon *d)
{
	return h_daemon_start_argv(d, NULL);
}

/* Waits up to timeout_s for the daemon to exit; 1 if it did (status in
 * d->exit_status), 0 if not. */
static inline int h_daemon_wait(struct h_daemon *d, double timeout_s)
{
	if (d->pid <= 0)
		return 1;
	double deadline = h_now() + timeout_s;
	do {
		int st;
		pid_t p = waitpid(d->pid, &st, WNOHANG);
		if (p == d->pid || (p < 0 && errno == ECHILD)) {
			d->exit_status = p == d->pid ? st : -1;
			d->pid = 0;
			return 1;
		}
		h_sleep_ms(5);
	} while (h_now() < deadline);
	return 0;
}

/* SIGTERM, then SIGKILL after 10 s; removes the directory. Returns the wait
 * status (or -1). Safe to call twice. */
static inline int h_daemon_stop(struct h_daemon *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		if (!h_daemon_wait(d, 10.0)) {
			fprintf(stderr, "radianced ignored SIGTERM for 10 s: SIGKILL\n");
			kill(d->pid, SIGKILL);
			h_daemon_wait(d, 5.0);
		}
	}
	if (getenv("RADIANCE_TEST_VERBOSE") ||
	    (d->exit_status != -1 && !(WIFEXITED(d->exit_status) && WEXITSTATUS(d->exit_status) == 0)))
		h_daemon_dump_log(d);
	h_daemon_cleanup(d);
	return d->exit_status;
}

/* Starts radianced --no-config --backend $RADIANCE_TEST_BACKEND (default
 * cpu, unless ARGS give a backend) ARGS... (args NULL-terminated, at most 24), umask 022, stdout and
 * stderr into log. Returns the pid. For runs that end by themselves (usage
 * errors, failed starts) or that a test stops itself; see h_wait_exit. */
static inline pid_t h_spawn_logged(const char *log, const char *const *args)
{
	const char *bin = h_env("RADIANCED", "build/radianced");
	const char *argv[32] = { bin, "--no-config" };
	int argc = 2;
	if (!h_args_give(args, "--backend", 'b')) {
		argv[argc++] = "--backend";
		argv[argc++] = h_env("RADIANCE_TEST_BACKEND", "cpu");
	}
	for (size_t i = 0; args[i] && argc < 28; i++)
		argv[argc++] = args[i];
	argv[argc] = NULL;
	fflush(NULL);
	pid_t self = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		h_die_with_parent(self);
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		umask(022);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* pid's wait status once it exits within timeout_s, else -1 (it is then
 * killed and reaped). */
static inline int h_wait_exit(pid_t pid, double timeout_s)
{
	double deadline = h_now() + timeout_s;
	int st;
	while (h_now() < deadline) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return st;
		h_sleep_ms(10);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* A file to stderr, control characters shown (cat -v): a failing test's
 * context. */
static inline void h_show_file(const char *path)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "cat -v '%s' >&2", path);
	if (system(cmd) != 0)
		fprintf(stderr, "(cannot show %s)\n", path);
}

/* Lines of the file at path that contain needle; -1 if it cannot be read. */
static inline int h_count_lines(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char line[2048];
	int n = 0;
	while (fgets(line, sizeof line, f))
		if (strstr(line, needle))
			n++;
	fclose(f);
	return n;
}

/* Is the daemon still running (not a zombie)? */
static inline int h_daemon_alive(struct h_daemon *d)
{
	if (d->pid <= 0)
		return 0;
	int st;
	pid_t p = waitpid(d->pid, &st, WNOHANG);
	if (p == d->pid) {
		d->exit_status = st;
		d->pid = 0;
		fprintf(stderr, "radianced died: status 0x%x\n", st);
		h_daemon_dump_log(d);
		return 0;
	}
	return 1;
}

/* A test's teardown: the daemon it leaves must still run and exit 0 on
 * SIGTERM. 0, or -1 saying which it did not. */
static inline int h_daemon_stop_clean(struct h_daemon *d)
{
	int alive = h_daemon_alive(d);
	int st = h_daemon_stop(d);
	if (!alive || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "daemon %s; exit status 0x%x\n", alive ? "alive" : "had died", st);
		return -1;
	}
	return 0;
}

static inline int h_count_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	DIR *dir = opendir(path);
	if (!dir)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.')
			n++;
	closedir(dir);
	return n;
}

/* Whether this build runs under AddressSanitizer or ThreadSanitizer (so is
 * the daemon that make check SAN=... starts): their shadow memory and
 * quarantine make RSS figures meaningless. */
static inline int h_sanitized(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
	return 1;
#endif
#endif
	return 0;
}

/* VmRSS of pid in KiB, or -1. */
static inline long h_rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long kib = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* The state letter ('R' running, 'S' asleep, ...) and CPU time (utime +
 * stime, clock ticks) of pid's thread named `comm` (pthread_setname_np),
 * from /proc/PID/task/TID/stat. 0, or -1 when no such thread. */
static inline int h_thread_stat(pid_t pid, const char *comm, char *state, long long *ticks)
{
	char path[96], buf[512];
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *dir = opendir(path);
	if (!dir)
		return -1;
	int rc = -1;
	struct dirent *e;
	while (rc < 0 && (e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%.16s/stat", (int)pid, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[n] = 0;
		/* "TID (comm) S ...": comm may hold spaces, so from the last ')' */
		char *open = strchr(buf, '('), *close = strrchr(buf, ')');
		if (!open || !close || (size_t)(close - open - 1) != strlen(comm) ||
		    strncmp(open + 1, comm, strlen(comm)) != 0)
			continue;
		unsigned long long ut, st;
		if (sscanf(close + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
			   state, &ut, &st) == 3) {
			*ticks = (long long)(ut + st);
			rc = 0;
		}
	}
	closedir(dir);
	return rc;
}

/* Runs captured layer hl through the daemon on handle r (model_id held) and
 * compares with the CPU reference. Returns the number of elements beyond
 * the bf16 floor (0 = pass), or -1 when the request failed. */
static inline long h_check_layer(struct radiance *r, uint32_t model_id, const struct h_layer *hl,
				 enum radiance_elem dt, size_t *exact_out)
{
	const struct radiance_model_info *mi = radiance_held_model(r, model_id);
	int idx = radiance_find_layer(mi, hl->name);
	if (idx < 0) {
		fprintf(stderr, "daemon model lacks layer %s\n", hl->name);
		return -1;
	}
	size_t mn = (size_t)hl->m * hl->n;
	uint16_t *y = malloc(mn * 2);
	int rc = radiance_linear(r, model_id, (uint32_t)idx, hl->m, dt,
				 dt == RADIANCE_BF16 ? hl->x_bf16 : hl->x_fp16, y);
	if (rc < 0) {
		fprintf(stderr, "radiance_linear(%s): %s (%s)\n", hl->name, radiance_strerror(rc),
			radiance_error_message(r));
		free(y);
		return -1;
	}
	size_t exact;
	double ulps;
	size_t bad = h_compare_bf16(y, dt == RADIANCE_BF16 ? hl->ref_bf16 : hl->ref_fp16, mn, &exact,
				    &ulps);
	if (bad)
		fprintf(stderr, "%s (%s): %zu of %zu elements beyond 1 bf16 ulp (max %.1f ulps)\n",
			hl->name, dt == RADIANCE_BF16 ? "bf16" : "fp16", bad, mn, ulps);
	if (exact_out)
		*exact_out = exact;
	free(y);
	return (long)bad;
}

/* A well-behaved client: connects, loads the checkpoint (attaching to the
 * resident copy if there is one), checks three layers of different shapes
 * against the reference, disconnects. 0 when all is right, else -1. */
static inline int h_good_client(const char *socket, const struct h_ref *ref)
{
	char ckpt[512];
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = "good-client";
	o.timeout_ms = 20000;
	struct radiance *r = radiance_connect(socket, &o);
	if (!r) {
		fprintf(stderr, "good client: connect: %s\n", radiance_strerror(errno));
		return -1;
	}
	uint32_t id;
	int rc = radiance_load_model(r, ckpt, NULL, &id);
	if (rc < 0) {
		fprintf(stderr, "good client: load: %s\n", radiance_error_message(r));
		radiance_disconnect(r);
		return -1;
	}
	int ret = 0;
	for (size_t i = 0; h_good_layers[i]; i++) {
		const struct h_layer *hl = h_ref_find(ref, h_good_layers[i]);
		if (!hl || h_check_layer(r, id, hl, RADIANCE_BF16, NULL) != 0)
			ret = -1;
	}
	radiance_disconnect(r);
	return ret;
}

#endif
