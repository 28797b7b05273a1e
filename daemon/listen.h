/*
 * The daemon's listening socket: the one systemd passed (socket
 * activation), or one bound at cfg->socket_path. Bound with umask 0177 so it
 * is never reachable with wider permissions, then chgrp + 0660 if
 * socket_group is set; the socket's own directory is created if missing (not
 * its parents). A stale socket file (nobody answers a connect) is replaced;
 * a live daemon, a file, a directory or a symlink at the path is an error.
 * At exit the file is removed only if the path is still the socket bound
 * here, not one another daemon bound since.
 *
 * Thread safety: the loop thread (these touch the umask and the file system).
 */
#ifndef RADIANCE_LISTEN_H
#define RADIANCE_LISTEN_H

#include <stddef.h>
#include <sys/types.h>

#include "config.h"

struct radiance_listener {
	int fd;                   /* listening, non-blocking; -1 when none */
	int activated;            /* the socket came from systemd */
	int created;              /* we bound it: unlink at exit ... */
	dev_t dev;                /* ... if the path is still this inode */
	ino_t ino;
	const char *path;         /* cfg->socket_path, borrowed */
};

/* Before the backend starts: -EADDRINUSE (err says so) when another daemon
 * already listens on cfg->socket_path, so a second daemon fails before it
 * initialises a GPU and allocates scratch the first one may need. Anything
 * else about the path is for listener_open(), which checks again at bind.
 * 0 under socket activation (the socket is systemd's). */
int listener_check_free(const struct radiance_config *cfg, char *err, size_t errlen);

/* Takes over systemd's socket or binds and listens on cfg->socket_path.
 * 0, or -errno with err saying what failed and where (l->fd then -1 or
 * still to be closed by listener_close()). cfg must outlive l. */
int listener_open(struct radiance_listener *l, const struct radiance_config *cfg, char *err,
		  size_t errlen);

/* Closes the socket and removes its file if we bound it (and the path is
 * still that socket). Idempotent. */
void listener_close(struct radiance_listener *l);

#endif
