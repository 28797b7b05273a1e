/*
 * The SQ/CQ rings of proto/shm.h, one side's view. Shared by daemon and
 * client. A struct rring holds the producer's or consumer's PRIVATE
 * copies of the geometry (entries, slot base), taken when the segment was set
 * up, never re-read from shared memory: the peer can scribble over the
 * header at any time.
 *
 * Thread safety: one producer thread and one consumer thread per ring.
 */
#ifndef RADIANCE_RING_H
#define RADIANCE_RING_H

#include <stddef.h>
#include <stdint.h>

#include "shm.h"

/* A pause for either side spinning on a ring before it sleeps on the
 * doorbell: the CPU's spin-wait hint, where it has one. */
static inline void rring_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

struct rring {
	struct radiance_shm_ring *ctl;   /* head/tail/sleeping words in shared memory */
	uint8_t *slots;                  /* entries * RADIANCE_SLOT_BYTES */
	uint32_t entries;                /* private copy; power of two */
	uint32_t mask;
	uint32_t local;                  /* producer: our tail; consumer: our head */
};

/* Sets up one side's view of a ring in a freshly created segment (head and
 * tail 0; `local` starts at 0). entries must be a power of two, validated by
 * the caller. Either side uses the same init; the functions used pick the
 * role. Never reads shared memory. */
void rring_init(struct rring *r, struct radiance_shm_ring *ctl, uint8_t *slots,
			uint32_t entries);

/* Producer: copy a payload of len bytes (1..RADIANCE_SLOT_BYTES-4) into the
 * next slot and publish it. 0, -EAGAIN when full, -EMSGSIZE when too long or
 * empty, -EPROTO when the consumer's head is not within `entries` behind our
 * tail (the peer corrupted the ring).
 * Does not ring the doorbell: call rring_needs_wakeup() after. */
int rring_push(struct rring *r, const void *payload, size_t len);

/* Consumer: copy the next slot's payload out of shared memory into buf
 * (RADIANCE_SLOT_BYTES bytes) and consume it. Returns the payload length
 * (> 0), 0 when empty, -EPROTO when the peer corrupted the ring (tail ran
 * more than `entries` ahead of head, or a slot length out of range; the
 * session is then broken). */
int rring_pop(struct rring *r, void *buf);

/* Consumer: rring_pop without consuming: copies the next slot's payload
 * into buf and returns as rring_pop does, the slot staying the producer's
 * next to be consumed. Decide on the copy (the peer may rewrite the slot
 * meanwhile), then rring_consume() it or leave it for later. */
int rring_peek(struct rring *r, void *buf);

/* Consumer: consumes the slot a rring_peek() that returned > 0 copied. */
void rring_consume(struct rring *r);

/* Consumer: entries available (0 if none); -EPROTO as above. */
int rring_ready(struct rring *r);

/* Consumer: about to sleep. Sets `sleeping`, then re-checks: returns 1 when
 * it may sleep (still empty), 0 when work arrived (sleeping cleared). */
int rring_prepare_sleep(struct rring *r);
/* Consumer: woke up; clears `sleeping`. */
void rring_end_sleep(struct rring *r);
/* Producer, after a push: 1 when the consumer asked to be woken. The tail
 * store of push and this load, and prepare_sleep's store of `sleeping` and
 * its load of tail, are all seq_cst (Dekker), so a wakeup is never lost. */
int rring_needs_wakeup(struct rring *r);

/* Producer: slots free for pushing (entries - in flight); -EPROTO as push. */
int rring_space(struct rring *r);

/* Doorbell helpers over a non-blocking eventfd (the SQ doorbell, the
 * executor's control fd) or a non-blocking pipe (the CQ doorbell, whose
 * write end only the daemon holds). ring writes the 8-byte value 1: returns
 * 0 or -errno (a saturated counter or a full pipe, -EAGAIN, counts as rung:
 * 0). drain takes what one read gives: the eventfd's whole count, or up to
 * 64 rings from the pipe (more stay readable, so the next poll returns at
 * once); returns that number (capped at INT_MAX), 0 when nothing was
 * pending, or -errno. */
int rdoorbell_ring(int efd);
int rdoorbell_drain(int efd);

#endif
