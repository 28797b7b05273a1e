/* The listening socket: systemd's, or bound here; see listen.h. */
#include "listen.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"
#include "text.h"

/* connect()s to addr: 0 when something listens there, connect's errno
 * (ECONNREFUSED: nobody listens), or -errno when no probe socket. */
static int socket_probe(const struct sockaddr_un *addr)
{
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (probe < 0)
		return -errno;
	int e = connect(probe, (const struct sockaddr *)addr, sizeof *addr) < 0 ? errno : 0;
	close(probe);
	return e;
}

/* EAGAIN: it listens, its backlog is just full */
static int socket_listened(int probe_result)
{
	return probe_result == 0 || probe_result == EAGAIN || probe_result == EINPROGRESS;
}

/* Before the backend starts: a second daemon on a live socket must fail at
 * once, not after initialising a GPU and allocating scratch that the first
 * one may need. Anything else about the path (missing, stale, not a socket,
 * too long) is for listen_socket() to handle, which also checks again at
 * bind (another daemon may start meanwhile). Under socket activation the
 * socket is systemd's: nothing to check. */
int listener_check_free(const struct radiance_config *cfg, char *err, size_t errlen)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	if (notify_socket_activated() || strlen(cfg->socket_path) >= sizeof addr.sun_path ||
	    lstat(cfg->socket_path, &st) < 0 || !S_ISSOCK(st.st_mode))
		return 0;
	strcpy(addr.sun_path, cfg->socket_path);
	if (!socket_listened(socket_probe(&addr)))
		return 0;
	char shown[512];
	rtext_escape(cfg->socket_path, shown, sizeof shown);
	snprintf(err, errlen, "another daemon is listening on %s", shown);
	return -EADDRINUSE;
}

/* bind() found something at the path. Only a socket nobody listens on
 * (connect: ECONNREFUSED) is a leftover of ours to replace; a live daemon,
 * a file, a directory, a device or a symlink is left alone. */
static int remove_stale_socket(const struct sockaddr_un *addr, char *err, size_t errlen)
{
	const char *path = addr->sun_path;
	struct stat st, again;
	if (lstat(path, &st) < 0) {
		int e = errno;
		if (e == ENOENT)
			return 0;   /* gone meanwhile: bind again */
		snprintf(err, errlen, "bind %s: address in use, and lstat: %s", path, strerror(e));
		return -e;
	}
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s exists and is not a socket: not touching it (choose another "
			 "--socket)", path);
		return -EEXIST;
	}
	int e = socket_probe(addr);
	if (e < 0) {
		snprintf(err, errlen, "socket: %s", strerror(-e));
		return e;
	}
	if (socket_listened(e)) {
		snprintf(err, errlen, "another daemon is listening on %s", path);
		return -EADDRINUSE;
	}
	if (e != ECONNREFUSED) {
		snprintf(err, errlen, "%s is a socket we cannot probe (connect: %s): not removing it",
			 path, strerror(e));
		return -EADDRINUSE;
	}
	if (lstat(path, &again) < 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino) {
		snprintf(err, errlen, "%s changed while it was probed: not removing it", path);
		return -EADDRINUSE;
	}
	log_info("removing stale socket %s (nobody listens on it)", path);
	if (unlink(path) < 0 && errno != ENOENT) {
		e = errno;
		snprintf(err, errlen, "unlink stale socket %s: %s", path, strerror(e));
		return -e;
	}
	return 0;
}

/* Removes the socket file at exit if the path still is the socket we bound:
 * after `rm` and another daemon's start it is that daemon's. */
static void unlink_own_socket(struct radiance_listener *l)
{
	if (!l->created)
		return;
	l->created = 0;
	const char *path = l->path;
	struct stat st;
	if (lstat(path, &st) < 0) {
		if (errno != ENOENT)
			log_warn("lstat %s: %s", path, strerror(errno));
		return;
	}
	if (st.st_dev != l->dev || st.st_ino != l->ino) {
		log_warn("not removing %s: it is no longer the socket this daemon bound", path);
		return;
	}
	if (unlink(path) < 0)
		log_warn("unlink %s: %s", path, strerror(errno));
}

/* The socket systemd passed, or our own: bound with umask 0177 so it is
 * never reachable with wider permissions, then chgrp + 0660 if a group is
 * configured. A stale socket file (nobody answers) is replaced; anything
 * else at the path is an error. */
int listener_open(struct radiance_listener *l, const struct radiance_config *cfg, char *err,
		  size_t errlen)
{
	l->fd = -1;
	l->created = 0;
	l->activated = 0;
	l->path = cfg->socket_path;
	int fd = notify_listen_fd(err, errlen);
	if (fd == -EINVAL)
		return -EINVAL;
	if (fd >= 0) {
		l->fd = fd;
		l->activated = 1;
		log_info("listening on the socket systemd passed (fd %d)", fd);
		return 0;
	}

	/* the path and its directory as messages show them (a config value) */
	char shown[512], shown_dir[512] = "";
	rtext_escape(cfg->socket_path, shown, sizeof shown);
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(cfg->socket_path) >= sizeof addr.sun_path) {
		snprintf(err, errlen, "socket path '%s' is longer than %zu bytes", shown,
			 sizeof addr.sun_path - 1);
		return -ENAMETOOLONG;
	}
	strcpy(addr.sun_path, cfg->socket_path);
	gid_t gid = cfg->socket_gid;   /* resolved by config_load */

	/* /run/radiance may not exist when started by hand: make the socket's
	 * own directory (tmpfiles does it under systemd), 0755 less the umask,
	 * owned by whoever runs us, and left in place at exit (docs/daemon.md).
	 * Only that one: a typo higher up the path fails instead of growing a
	 * tree of directories. Why mkdir failed is kept for bind's error. */
	char dir[sizeof addr.sun_path];
	int mkdir_err = 0;
	snprintf(dir, sizeof dir, "%s", cfg->socket_path);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		rtext_escape(dir, shown_dir, sizeof shown_dir);
		if (mkdir(dir, 0755) == 0)
			log_info("created %s for the socket (it stays after exit)", shown_dir);
		else if (errno != EEXIST)
			mkdir_err = errno;
	}

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	mode_t old = umask(0177);
	int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
	if (rc < 0 && errno == EADDRINUSE) {
		rc = remove_stale_socket(&addr, err, errlen);
		if (rc < 0) {
			umask(old);
			close(fd);
			return rc;
		}
		rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
	}
	umask(old);
	if (rc < 0) {
		int e = errno;
		close(fd);
		if ((e == ENOENT || e == ENOTDIR) && mkdir_err == ENOENT) {
			/* bind's "No such file or directory" does not say which */
			char *up = strrchr(dir, '/');
			if (up && up != dir)
				*up = 0;
			else if (up)
				snprintf(dir, sizeof dir, "/");
			else
				snprintf(dir, sizeof dir, ".");
			rtext_escape(dir, shown_dir, sizeof shown_dir);
			snprintf(err, errlen, "bind %s: the directory %s does not exist; the daemon "
				 "creates only the socket's own directory, not its parents (create %s "
				 "first, or choose another --socket)", shown, shown_dir, shown_dir);
		} else if ((e == ENOENT || e == ENOTDIR) && mkdir_err) {
			snprintf(err, errlen, "bind %s: cannot create its directory %s: %s",
				 shown, shown_dir, strerror(mkdir_err));
		} else {
			snprintf(err, errlen, "bind %s: %s", shown, strerror(e));
		}
		return -e;
	}
	l->fd = fd;
	struct stat st;
	if (lstat(cfg->socket_path, &st) == 0) {
		l->created = 1;
		l->dev = st.st_dev;
		l->ino = st.st_ino;
	} else {
		log_warn("lstat %s after bind: %s (it will not be removed at exit)", shown,
			 strerror(errno));
	}
	if (gid != (gid_t)-1) {
		if (chown(cfg->socket_path, (uid_t)-1, gid) < 0 || chmod(cfg->socket_path, 0660) < 0) {
			int e = errno;
			char group[256];
			rtext_escape(cfg->socket_group, group, sizeof group);
			snprintf(err, errlen, "socket %s: chgrp %s / chmod 0660: %s", shown, group,
				 strerror(e));
			return -e;
		}
	}
	if (listen(fd, 128) < 0) {
		int e = errno;
		snprintf(err, errlen, "listen %s: %s", shown, strerror(e));
		return -e;
	}
	log_info("listening on %s (mode %s)", shown, gid != (gid_t)-1 ? "0660" : "0600");
	return 0;
}

void listener_close(struct radiance_listener *l)
{
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	unlink_own_socket(l);
}
