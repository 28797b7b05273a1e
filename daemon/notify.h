/*
 * systemd integration through libsystemd's sd-daemon: readiness, watchdog,
 * stopping, and socket activation. Every call is a no-op outside systemd
 * (no NOTIFY_SOCKET, no LISTEN_FDS), so the daemon runs the same by hand.
 *
 * Thread safety: loop thread.
 */
#ifndef RADIANCE_NOTIFY_H
#define RADIANCE_NOTIFY_H

#include <stdint.h>

/* The listening socket systemd passed (radianced.socket), or -1 when not
 * socket-activated. -EINVAL (err set) when fds were passed but the first is
 * not a listening Unix stream socket. The fd is made non-blocking and
 * close-on-exec; LISTEN_* variables are removed from the environment. */
int notify_listen_fd(char *err, unsigned long errlen);

/* 1 when systemd passed this process a socket (LISTEN_FDS), without taking
 * it: notify_listen_fd() still finds it. */
int notify_socket_activated(void);

/* READY=1 with a STATUS= line. */
void notify_ready(const char *status);
/* STATUS= only. */
void notify_status(const char *status);
/* STOPPING=1. */
void notify_stopping(void);
/* WATCHDOG=1. */
void notify_watchdog(void);
/* The watchdog interval systemd asked for (WatchdogSec), in microseconds,
 * or 0 when the watchdog is off. */
uint64_t notify_watchdog_usec(void);

#endif
