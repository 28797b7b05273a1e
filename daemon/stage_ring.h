/*
 * Staging rows as a ring: which rows of a staging buffer a launch gets,
 * and which earlier launch's event it must wait for before it may write
 * them. Pure bookkeeping (no device, no allocation), so it is tested on
 * its own (tests/test_stage_ring.c); the GPU backend's bulk lane
 * (daemon/backend_gpu.c) embeds one ring per staging buffer, x and y, and
 * owns the events: one per slot, STAGE_RING_SLOTS of them.
 *
 * Terms. A range is a run of rows [first, first + rows) of the buffer. A
 * record is a range still possibly in use on the device, with its slot:
 * the index of the event (the guard) that the caller records on one
 * stream once the range's last reader or writer is queued. Every guard
 * of one ring is recorded on the same stream, in the order the ranges
 * were taken, so the device passing one guard means every older record's
 * work is done as well.
 *
 * Taking a range (reserve, then commit): the range starts at the ring's
 * head, or at row 0 when it would run past the end (ranges are never
 * split: a kernel reads them as one [rows][width] array), or where the
 * caller says. The newest record that overlaps it must be waited for
 * (t.wait: its slot); that record and every older one are retired, since
 * the wait covers them. When every slot is live and none overlaps, the
 * oldest is waited for to free one. A range that overlaps no record needs
 * no wait (t.wait < 0).
 *
 * Thread safety: none; one ring is used by one thread at a time (the
 * executor's, through linear_start).
 */
#ifndef RADIANCE_STAGE_RING_H
#define RADIANCE_STAGE_RING_H

#include <stdint.h>

#define STAGE_RING_SLOTS 16u           /* records (and guard events) of one ring */
#define STAGE_RING_NEXT UINT32_MAX     /* reserve's `at`: wherever the ring puts it */

struct stage_range {
	uint32_t first, rows;
};

struct stage_ring {
	uint32_t rows;           /* rows of the buffer (>= 1) */
	uint32_t align;          /* every range starts at a multiple of it (>= 1) */
	uint32_t head;           /* where the next range starts unless it wraps */
	uint32_t tail;           /* the oldest record's slot */
	uint32_t live;           /* records, 0..STAGE_RING_SLOTS */
	struct stage_range rec[STAGE_RING_SLOTS];   /* by slot */
};

/* A reservation: valid for the ring as it was when reserved (commit it
 * before reserving on that ring again, or drop it). */
struct stage_take {
	uint32_t first, rows;    /* the range */
	int wait;                /* the slot whose guard must be waited for before
	                            the range is written; -1: none */
	uint32_t slot;           /* the slot whose guard the caller records for it */
	uint32_t retire;         /* records that commit retires (the oldest ones) */
};

/* An empty ring over `rows` rows whose ranges start at multiples of
 * `align` (0 is taken as 1). */
void stage_ring_init(struct stage_ring *r, uint32_t rows, uint32_t align);

/* Reserves `rows` rows, at `at` (a multiple of align) or, with
 * STAGE_RING_NEXT, at the head or row 0 (see above). Changes nothing in r.
 * 0; -EINVAL when rows is 0 or `at` is not a multiple of align; -E2BIG
 * when the range does not fit in the buffer. */
int stage_ring_reserve(const struct stage_ring *r, uint32_t rows, uint32_t at, struct stage_take *t);

/* Takes the range of t (from stage_ring_reserve on r as r is now): retires
 * the records the wait covers, adds t's record and moves the head past it. */
void stage_ring_commit(struct stage_ring *r, const struct stage_take *t);

/* The device has finished everything the records stood for (the streams
 * were synchronized): no later range waits for them. The head stays. */
void stage_ring_reset(struct stage_ring *r);

#endif
