/*
 * The session segment's layout, computed (daemon) and checked (client) in
 * one place: proto/shm_layout.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "shm_layout.h"

static bool is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

__attribute__((format(printf, 4, 5)))
static int refuse(int err, char *why, size_t whylen, const char *fmt, ...)
{
	if (why && whylen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return err;
}

int rshm_layout_compute(struct rshm_layout *l, uint32_t sq_entries, uint32_t cq_entries,
			uint64_t arena_bytes, char *why, size_t whylen)
{
	if (!is_pow2(sq_entries) || sq_entries > RADIANCE_SHM_MAX_ENTRIES)
		return refuse(-EINVAL, why, whylen, "sq_entries %u is not a power of two in 1..%u",
			      sq_entries, RADIANCE_SHM_MAX_ENTRIES);
	if (!is_pow2(cq_entries) || cq_entries > RADIANCE_SHM_MAX_ENTRIES || cq_entries < sq_entries)
		return refuse(-EINVAL, why, whylen, "cq_entries %u is not a power of two in %u..%u",
			      cq_entries, sq_entries, RADIANCE_SHM_MAX_ENTRIES);
	/* Checked before rounding up, so the sums below cannot wrap: at most
	 * 4 KiB + 2 * 2^16 * 256 + 2^40 bytes. */
	if (arena_bytes == 0 || arena_bytes > RADIANCE_SHM_MAX_ARENA_BYTES)
		return refuse(-EINVAL, why, whylen, "arena_bytes %llu is outside 1..%llu",
			      (unsigned long long)arena_bytes,
			      (unsigned long long)RADIANCE_SHM_MAX_ARENA_BYTES);
	struct rshm_layout out = {
		.sq_entries = sq_entries,
		.cq_entries = cq_entries,
		.sq_offset = RADIANCE_SHM_HEADER_BYTES,
		.arena_bytes = align_up(arena_bytes, RADIANCE_SHM_ALIGN),
	};
	out.cq_offset = out.sq_offset +
			align_up((uint64_t)sq_entries * RADIANCE_SLOT_BYTES, RADIANCE_SHM_ALIGN);
	out.arena_offset = out.cq_offset +
			   align_up((uint64_t)cq_entries * RADIANCE_SLOT_BYTES, RADIANCE_SHM_ALIGN);
	out.segment_bytes = out.arena_offset + out.arena_bytes;
	*l = out;
	return 0;
}

void rshm_layout_write_header(void *segment, const struct rshm_layout *l)
{
	struct radiance_shm_header *h = segment;
	h->magic = RADIANCE_SHM_MAGIC;
	h->version = RADIANCE_SHM_VERSION;
	h->header_bytes = RADIANCE_SHM_HEADER_BYTES;
	h->segment_bytes = l->segment_bytes;
	h->slot_bytes = RADIANCE_SLOT_BYTES;
	h->sq_offset = l->sq_offset;
	h->cq_offset = l->cq_offset;
	h->arena_offset = l->arena_offset;
	h->arena_bytes = l->arena_bytes;
	h->sq.entries = l->sq_entries;
	h->cq.entries = l->cq_entries;
}

int rshm_layout_import(struct rshm_layout *l, const void *segment, uint64_t segment_bytes,
		       char *why, size_t whylen)
{
	if (segment_bytes < RADIANCE_SHM_HEADER_BYTES)
		return refuse(-EPROTO, why, whylen, "segment of %llu bytes is smaller than its header (%u)",
			      (unsigned long long)segment_bytes, RADIANCE_SHM_HEADER_BYTES);
	/* One snapshot of the words before the rings, then the two entry
	 * counts; the ring words themselves (head, tail, sleeping) belong to
	 * the ring code and may already be moving. */
	struct radiance_shm_header h;
	memcpy(&h, segment, offsetof(struct radiance_shm_header, sq));
	const struct radiance_shm_header *live = segment;
	uint32_t sq = __atomic_load_n(&live->sq.entries, __ATOMIC_RELAXED);
	uint32_t cq = __atomic_load_n(&live->cq.entries, __ATOMIC_RELAXED);

	if (h.magic != RADIANCE_SHM_MAGIC)
		return refuse(-EPROTO, why, whylen, "magic %#llx, not %#llx",
			      (unsigned long long)h.magic, (unsigned long long)RADIANCE_SHM_MAGIC);
	if (h.version != RADIANCE_SHM_VERSION)
		return refuse(-EPROTO, why, whylen, "version %u, not %u", h.version, RADIANCE_SHM_VERSION);
	if (h.header_bytes != RADIANCE_SHM_HEADER_BYTES || h.slot_bytes != RADIANCE_SLOT_BYTES)
		return refuse(-EPROTO, why, whylen, "header_bytes %u and slot_bytes %u, not %u and %u",
			      h.header_bytes, h.slot_bytes, RADIANCE_SHM_HEADER_BYTES, RADIANCE_SLOT_BYTES);
	if (h.segment_bytes != segment_bytes)
		return refuse(-EPROTO, why, whylen, "segment_bytes %llu differs from RingReady's %llu",
			      (unsigned long long)h.segment_bytes, (unsigned long long)segment_bytes);
	struct rshm_layout want;
	char reason[128];
	if (rshm_layout_compute(&want, sq, cq, h.arena_bytes, reason, sizeof reason) < 0)
		return refuse(-EPROTO, why, whylen, "%s", reason);
	if (h.arena_bytes != want.arena_bytes || h.sq_offset != want.sq_offset ||
	    h.cq_offset != want.cq_offset || h.arena_offset != want.arena_offset ||
	    h.segment_bytes != want.segment_bytes)
		return refuse(-EPROTO, why, whylen,
			      "offsets sq %llu cq %llu arena %llu (%llu bytes) in %llu bytes, "
			      "not sq %llu cq %llu arena %llu (%llu bytes) in %llu bytes",
			      (unsigned long long)h.sq_offset, (unsigned long long)h.cq_offset,
			      (unsigned long long)h.arena_offset, (unsigned long long)h.arena_bytes,
			      (unsigned long long)h.segment_bytes, (unsigned long long)want.sq_offset,
			      (unsigned long long)want.cq_offset, (unsigned long long)want.arena_offset,
			      (unsigned long long)want.arena_bytes, (unsigned long long)want.segment_bytes);
	*l = want;
	return 0;
}
