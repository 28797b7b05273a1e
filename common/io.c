/* File reads and writes; see io.h. */
#include "io.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

ssize_t rio_pread(int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;
	while (got < len) {
		ssize_t r = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

int rio_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int rio_path_join(char *out, size_t outlen, const char *dir, const char *name)
{
	size_t len = strlen(dir);
	while (len && dir[len - 1] == '/')
		len--;
	/* "" stays relative; "/" (len 0 now) is the root, so keeps its '/' */
	const char *sep = dir[0] ? "/" : "";
	int n = snprintf(out, outlen, "%.*s%s%s", (int)len, dir, sep, name);
	return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}
