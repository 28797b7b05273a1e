/* Checkpoint identity: a hash of the files' (name, device, inode, size,
 * mtime), to tell "the same checkpoint loaded twice" without reading it. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"

static uint64_t fmix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static void fnv_bytes(uint64_t h[4], const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		for (int l = 0; l < 4; l++) {
			h[l] ^= b[i];
			h[l] *= 0x100000001b3ull;
		}
}

static void fnv_u64(uint64_t h[4], uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	fnv_bytes(h, b, 8);
}

static int cmp_file_ptr(const void *a, const void *b)
{
	return strcmp((*(const struct radiance_file *const *)a)->name,
		      (*(const struct radiance_file *const *)b)->name);
}

int radiance_checkpoint_identity(const struct radiance_file *files, size_t n, char out[65])
{
	const struct radiance_file **order;
	uint64_t h[4];

	if (!files || !n || !out)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!files[i].name)
			return -EINVAL;
	order = malloc(n * sizeof *order);
	if (!order)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		order[i] = &files[i];
	qsort(order, n, sizeof *order, cmp_file_ptr);
	/* four lanes from different offset bases, so the 256-bit output is not
	 * one 64-bit hash repeated */
	for (int l = 0; l < 4; l++)
		h[l] = 0xcbf29ce484222325ull ^ fmix64((uint64_t)l + 1);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (fstat(order[i]->fd, &st) < 0) {
			int e = errno;
			free(order);
			return -e;
		}
		fnv_bytes(h, order[i]->name, strlen(order[i]->name) + 1);
		fnv_u64(h, (uint64_t)st.st_dev);
		fnv_u64(h, (uint64_t)st.st_ino);
		fnv_u64(h, (uint64_t)st.st_size);
		fnv_u64(h, (uint64_t)st.st_mtim.tv_sec);
		fnv_u64(h, (uint64_t)st.st_mtim.tv_nsec);
	}
	free(order);
	for (int l = 0; l < 4; l++)
		snprintf(out + 16 * l, 17, "%016" PRIx64, fmix64(h[l] ^ (uint64_t)n));
	return 0;
}
