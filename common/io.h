/*
 * File reads and writes, and the joining of paths, shared by the daemon,
 * the client library and the tools.
 *
 * Thread safety: stateless; pread and pwrite never move an fd's file
 * position, so several threads may use one fd at once.
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

/* pwrite(fd, buf, len, off) until all len bytes are written (EINTR is
 * retried): 0, or -errno (-EIO for a write that wrote nothing). Never moves
 * fd's file position. */
int rio_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);

/* dir "/" name into out: one '/' between them however many dir ends with
 * ("/" and "ckpt/" give "/config.json" and "ckpt/config.json", not
 * "//config.json"); name alone when dir is empty. 0, or -ENAMETOOLONG when
 * out (outlen bytes) is too small: out then holds as much as fits, still
 * NUL-terminated, good for a message but not for an open(). */
int rio_path_join(char *out, size_t outlen, const char *dir, const char *name);

#endif
