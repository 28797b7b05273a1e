/*
 * File reads shared by the daemon's loader and the client library.
 *
 * Thread safety: stateless; pread never moves an fd's file position, so
 * several threads may read one fd at once.
 */
#ifndef RADIANCE_IO_H
#define RADIANCE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* pread(fd, buf, len, off) until len bytes, end of file or an error (EINTR
 * is retried): the bytes read (fewer than len at end of file), or -errno.
 * Never moves fd's file position. */
ssize_t rio_pread(int fd, void *buf, size_t len, uint64_t off);

#endif
