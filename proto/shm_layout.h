/*
 * The one computation and the one check of a session segment's layout
 * (proto/shm.h): the daemon computes a layout and writes it into the header
 * of the memfd it creates; the client imports the header it is handed and
 * accepts it only if it is exactly the layout the daemon would have
 * computed for the same ring sizes and arena. PipeWire keeps
 * pw_mempool_alloc and pw_mempool_import in one file for the same reason:
 * the writer and the reader cannot drift apart.
 *
 * Limits are protocol limits, the same for both sides; the daemon's
 * configuration (max_sq_entries, max_arena_bytes) only narrows them.
 */
#ifndef RADIANCE_SHM_LAYOUT_H
#define RADIANCE_SHM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h"

#define RADIANCE_SHM_MAX_ENTRIES (1u << 16)       /* largest SQ or CQ, slots */
#define RADIANCE_SHM_MAX_ARENA_BYTES (1ull << 40) /* largest arena, bytes */

/* Where everything of one segment lies; offsets and sizes in bytes. */
struct rshm_layout {
	uint32_t sq_entries;      /* power of two, 1..RADIANCE_SHM_MAX_ENTRIES */
	uint32_t cq_entries;      /* power of two, sq_entries..RADIANCE_SHM_MAX_ENTRIES */
	uint64_t sq_offset;       /* RADIANCE_SHM_HEADER_BYTES */
	uint64_t cq_offset;       /* after the SQ, RADIANCE_SHM_ALIGN-aligned */
	uint64_t arena_offset;    /* after the CQ, RADIANCE_SHM_ALIGN-aligned */
	uint64_t arena_bytes;     /* a multiple of RADIANCE_SHM_ALIGN */
	uint64_t segment_bytes;   /* arena_offset + arena_bytes: the memfd's size */
};

/* Computes the layout of a segment with sq_entries and cq_entries slots and
 * an arena of at least arena_bytes (rounded up to RADIANCE_SHM_ALIGN).
 * Returns 0, or -EINVAL when an entry count is not a power of two in its
 * range (cq_entries below sq_entries included) or arena_bytes is outside
 * 1..RADIANCE_SHM_MAX_ARENA_BYTES; then why (whylen bytes, may be NULL)
 * names the field and its value. Thread-safe; l is written only on success. */
int rshm_layout_compute(struct rshm_layout *l, uint32_t sq_entries, uint32_t cq_entries,
			uint64_t arena_bytes, char *why, size_t whylen);

/* Writes l into the header at the start of segment (at least
 * l->segment_bytes bytes, zeroed: the ring words start at 0). */
void rshm_layout_write_header(void *segment, const struct rshm_layout *l);

/* Reads the header of a mapped segment of segment_bytes bytes (the size
 * RingReady announced and the caller mapped), once, and checks it: magic,
 * version, header and slot sizes, segment_bytes equal to the announced one,
 * and offsets exactly those rshm_layout_compute() gives for its entries and
 * arena. Returns 0 and fills l, or -EPROTO with why (may be NULL) naming
 * the first field that is wrong and its value. The segment can change
 * under the caller at any time: use l afterwards, never the header. */
int rshm_layout_import(struct rshm_layout *l, const void *segment, uint64_t segment_bytes,
		       char *why, size_t whylen);

#endif
