/* sd_notify / sd_listen_fds wrappers; see notify.h. */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include "log.h"

int notify_socket_activated(void)
{
	return sd_listen_fds(0) > 0;
}

int notify_listen_fd(char *err, unsigned long errlen)
{
	int n = sd_listen_fds(1);
	if (n <= 0)
		return -1;
	int fd = SD_LISTEN_FDS_START;
	if (n > 1)
		log_warn("systemd passed %d sockets; using the first", n);
	if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
		snprintf(err, errlen, "socket activation: fd %d is not a listening Unix stream socket",
			 fd);
		return -EINVAL;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	return fd;
}

void notify_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void notify_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}

void notify_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

void notify_watchdog(void)
{
	sd_notify(0, "WATCHDOG=1");
}

uint64_t notify_watchdog_usec(void)
{
	uint64_t usec = 0;
	if (sd_watchdog_enabled(0, &usec) <= 0)
		return 0;
	return usec;
}
