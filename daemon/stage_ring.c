/* Staging rows as a ring of ranges guarded by events; see stage_ring.h. */
#include "stage_ring.h"

#include <errno.h>
#include <string.h>

void stage_ring_init(struct stage_ring *r, uint32_t rows, uint32_t align)
{
	memset(r, 0, sizeof *r);
	r->rows = rows;
	r->align = align ? align : 1;
}

int stage_ring_reserve(const struct stage_ring *r, uint32_t rows, uint32_t at, struct stage_take *t)
{
	uint32_t first;
	if (!rows)
		return -EINVAL;
	if (at == STAGE_RING_NEXT) {
		/* 64-bit: head + rows must not wrap around in the sum */
		first = (uint64_t)r->head + rows <= r->rows ? r->head : 0;
	} else {
		if (at % r->align)
			return -EINVAL;
		first = at;
	}
	if ((uint64_t)first + rows > r->rows)
		return -E2BIG;
	/* the newest overlapping record: waiting for it covers every older one */
	int newest = -1;
	for (uint32_t i = r->live; i-- > 0;) {
		const struct stage_range *q = &r->rec[(r->tail + i) % STAGE_RING_SLOTS];
		if (q->first < first + rows && first < q->first + q->rows) {
			newest = (int)i;
			break;
		}
	}
	if (newest < 0 && r->live == STAGE_RING_SLOTS)
		newest = 0;   /* every slot live: free the oldest */
	*t = (struct stage_take){
		.first = first,
		.rows = rows,
		.wait = newest < 0 ? -1 : (int)((r->tail + (uint32_t)newest) % STAGE_RING_SLOTS),
		.slot = (r->tail + r->live) % STAGE_RING_SLOTS,
		.retire = newest < 0 ? 0 : (uint32_t)newest + 1,
	};
	return 0;
}

void stage_ring_commit(struct stage_ring *r, const struct stage_take *t)
{
	r->tail = (r->tail + t->retire) % STAGE_RING_SLOTS;
	r->live -= t->retire;
	/* t->slot is the first after the live ones, counted before the retiring:
	 * the same slot, since retiring moves the tail and shrinks live alike */
	r->rec[t->slot] = (struct stage_range){ t->first, t->rows };
	r->live++;
	const uint64_t end = (uint64_t)t->first + t->rows;
	const uint64_t head = (end + r->align - 1) / r->align * r->align;
	r->head = head < r->rows ? (uint32_t)head : 0;
}

void stage_ring_reset(struct stage_ring *r)
{
	r->tail = r->live = 0;
}
