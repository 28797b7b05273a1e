/*
 * A first-fit allocator for the shared arena. The bookkeeping lives in
 * private memory: the daemon writes outputs into the arena, and a daemon bug
 * there must not be able to corrupt the allocator. Arenas hold a handful of
 * activation buffers, so a sorted array and linear scans are plenty.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client-private.h"

int radiance__client_arena_init(struct radiance__client_arena *a, void *base, uint64_t bytes)
{
	memset(a, 0, sizeof *a);
	a->ext = malloc(8 * sizeof *a->ext);
	if (!a->ext)
		return -ENOMEM;
	a->cap = 8;
	a->base = base;
	a->bytes = bytes;
	a->ext[0] = (struct radiance__client_extent){ .off = 0, .len = bytes, .used = false };
	a->n = bytes ? 1 : 0;
	return 0;
}

void radiance__client_arena_finish(struct radiance__client_arena *a)
{
	free(a->ext);
	memset(a, 0, sizeof *a);
}

static int insert_at(struct radiance__client_arena *a, size_t i, struct radiance__client_extent e)
{
	if (a->n == a->cap) {
		size_t cap = a->cap * 2;
		struct radiance__client_extent *p = realloc(a->ext, cap * sizeof *p);
		if (!p)
			return -ENOMEM;
		a->ext = p;
		a->cap = cap;
	}
	memmove(a->ext + i + 1, a->ext + i, (a->n - i) * sizeof *a->ext);
	a->ext[i] = e;
	a->n++;
	return 0;
}

static void remove_at(struct radiance__client_arena *a, size_t i)
{
	memmove(a->ext + i, a->ext + i + 1, (a->n - i - 1) * sizeof *a->ext);
	a->n--;
}

void *radiance__client_arena_alloc(struct radiance__client_arena *a, size_t bytes)
{
	if (bytes == 0 || bytes > a->bytes)
		return NULL;
	uint64_t len = ((uint64_t)bytes + RADIANCE__ARENA_ALIGN - 1) & ~(uint64_t)(RADIANCE__ARENA_ALIGN - 1);
	for (size_t i = 0; i < a->n; i++) {
		struct radiance__client_extent *e = &a->ext[i];
		if (e->used || e->len < len)
			continue;
		if (e->len > len) {
			struct radiance__client_extent rest = { .off = e->off + len, .len = e->len - len };
			if (insert_at(a, i + 1, rest) < 0)
				return NULL;
			e = &a->ext[i];   /* insert_at may have moved the array */
			e->len = len;
		}
		e->used = true;
		return a->base + e->off;
	}
	return NULL;
}

int radiance__client_arena_free(struct radiance__client_arena *a, void *p)
{
	if (!a->base || (uint8_t *)p < a->base || (uint8_t *)p >= a->base + a->bytes)
		return -EINVAL;
	uint64_t off = (uint64_t)((uint8_t *)p - a->base);
	size_t lo = 0, hi = a->n;
	while (lo < hi) {   /* the extent starting at off */
		size_t mid = lo + (hi - lo) / 2;
		if (a->ext[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == a->n || a->ext[lo].off != off || !a->ext[lo].used)
		return -EINVAL;
	size_t i = lo;
	a->ext[i].used = false;
	if (i + 1 < a->n && !a->ext[i + 1].used) {
		a->ext[i].len += a->ext[i + 1].len;
		remove_at(a, i + 1);
	}
	if (i > 0 && !a->ext[i - 1].used) {
		a->ext[i - 1].len += a->ext[i].len;
		remove_at(a, i);
	}
	return 0;
}

uint64_t radiance__client_arena_largest_free(const struct radiance__client_arena *a)
{
	uint64_t best = 0;
	for (size_t i = 0; i < a->n; i++)
		if (!a->ext[i].used && a->ext[i].len > best)
			best = a->ext[i].len;
	return best;
}
