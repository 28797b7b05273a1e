/*
 * Shared-memory layout of a session's data plane, protocol version 1.
 *
 * The daemon creates one memfd per session, sized and laid out as below,
 * seals it (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) so a client can never
 * pull pages out from under the daemon, and passes it with RingReady. Both
 * sides map the whole segment MAP_SHARED.
 *
 *   offset 0             struct radiance_shm_header (RADIANCE_SHM_HEADER_BYTES)
 *   sq_offset            sq_entries slots of slot_bytes: the submission queue
 *   cq_offset            cq_entries slots of slot_bytes: the completion queue
 *   arena_offset         arena_bytes of activations and outputs, owned by the
 *                        client's allocator; the daemon only checks bounds
 *
 * All offsets are 4096-aligned. Every field is little-endian (native on the
 * hosts we serve; daemon and clients share one machine). The offsets, sizes
 * and their limits are computed (daemon) and checked (client) in one place,
 * proto/shm_layout.c (proto/shm_layout.h).
 *
 * Slot: uint32 length L (1 <= L <= slot_bytes - 4), then L bytes of a
 * serialized rdw.LinearRequest (SQ) or rdw.LinearResult (CQ).
 *
 * Rings, in the io_uring pattern: each ring has a head (consumer) and a tail
 * (producer), free-running uint32 counters; slot index = counter & (entries-1).
 * The producer fills slot[tail & mask], then stores tail + 1 with release
 * order; the consumer loads tail with acquire order, reads slots head..tail-1,
 * then stores head with release order. The SQ is produced by the client and
 * consumed by the daemon, the CQ the other way. A ring is full when
 * tail - head == entries. The client never submits more requests than it has
 * CQ space for (cq_entries >= sq_entries and at most cq_entries in flight), so
 * the daemon never finds the CQ full.
 *
 * Doorbells: each ring's `sleeping` word is set (seq_cst) by its consumer
 * before it blocks on the ring's doorbell, after which the consumer re-checks
 * the ring; a producer, after publishing tail (seq_cst), rings the doorbell
 * only when `sleeping` is set. Consumers spin briefly before sleeping.
 *
 * The client can write anything into this memory at any time: the daemon
 * copies a slot out before decoding it and treats every field as hostile.
 *
 * Refinements (daemon side, protocol still version 1):
 * - Requests in flight together are independent: the daemon groups them by
 *   (model, layer) across sessions into one launch, so completions may come
 *   in another order than submissions. Submit a request that reads another's
 *   output only after that one completed; match results by request_id.
 * - The daemon takes an SQ entry only when the CQ has room for its result
 *   (backpressure, never an overflow), and answers EBUSY when more than its
 *   max_inflight requests are submitted and not completed.
 * - Status values of LinearResult: ENOENT (model not referenced by this
 *   session, layer out of range), EINVAL (rows outside 1..max_rows, dtype,
 *   offsets not 16-aligned, input and output overlapping), EFAULT (a range
 *   outside the arena), EBUSY, or the backend's EIO/E2BIG.
 * - Protocol violations end the session (its socket closes after an
 *   Error(EPROTO) naming the reason, when the socket takes it): tail more
 *   than `entries` ahead of the daemon's head, a slot length outside
 *   1..slot_bytes-4, a slot that is not a LinearRequest, a CQ head not
 *   within `entries` of the daemon's tail.
 * - The SQ doorbell is an eventfd (EFD_NONBLOCK): the client writes the
 *   8-byte value 1; the daemon never reads it (edge-triggered epoll). The CQ
 *   doorbell is the read end of a non-blocking pipe; the daemon writes the
 *   8-byte value 1 to its own write end, never blocking (a full pipe counts
 *   as rung), and the client polls the read end and reads what is there.
 *   POLLHUP on it means the daemon closed the session's rings.
 * - The header's sq/cq `entries` and offsets are written once by the
 *   daemon before RingReady; the daemon itself never re-reads them.
 */
#ifndef RADIANCE_SHM_H
#define RADIANCE_SHM_H

#include <stdint.h>

#define RADIANCE_SHM_MAGIC 0x314D485345434E41ull   /* "ANCESHM1" little-endian */
#define RADIANCE_SHM_VERSION 1u
#define RADIANCE_SHM_HEADER_BYTES 4096u
#define RADIANCE_SHM_ALIGN 4096u
#define RADIANCE_SLOT_BYTES 256u          /* fixed slot size, both rings */
#define RADIANCE_ARENA_ALIGN 16u          /* input/output offsets are multiples */
/* Most layers one LinearRequest names (layer + extra_layers): q, k, v or
 * gate, up with room to spare. With 8, the largest request (every varint
 * at its widest) is 174 bytes, inside a slot's 252. */
#define RADIANCE_MAX_REQUEST_LAYERS 8u

/* One ring's control words; head and tail on separate cache lines. */
struct radiance_shm_ring {
	_Alignas(64) uint32_t head;       /* consumer's; atomic */
	_Alignas(64) uint32_t tail;       /* producer's; atomic */
	_Alignas(64) uint32_t sleeping;   /* consumer is (about to be) blocked; atomic */
	uint32_t entries;                 /* power of two; written once by the daemon */
};

struct radiance_shm_header {
	uint64_t magic;                   /* RADIANCE_SHM_MAGIC */
	uint32_t version;                 /* RADIANCE_SHM_VERSION */
	uint32_t header_bytes;            /* RADIANCE_SHM_HEADER_BYTES */
	uint64_t segment_bytes;           /* total size of the memfd */
	uint32_t slot_bytes;              /* RADIANCE_SLOT_BYTES */
	uint32_t reserved0;
	uint64_t sq_offset;
	uint64_t cq_offset;
	uint64_t arena_offset;
	uint64_t arena_bytes;
	struct radiance_shm_ring sq;
	struct radiance_shm_ring cq;
};

_Static_assert(sizeof(struct radiance_shm_header) <= RADIANCE_SHM_HEADER_BYTES,
	       "shm header must fit its page");

#endif
