/*
 * SQ/CQ rings in shared memory (proto/shm.h). Each side keeps its own counter
 * privately and only trusts what it reads from the peer after range checks:
 * the peer can write anything into the segment at any time.
 */
#include "ring.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

void rring_init(struct rring *r, struct radiance_shm_ring *ctl, uint8_t *slots,
			uint32_t entries)
{
	r->ctl = ctl;
	r->slots = slots;
	r->entries = entries;
	r->mask = entries - 1;
	r->local = 0;
}

int rring_space(struct rring *r)
{
	uint32_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);
	uint32_t used = r->local - head;
	if (used > r->entries)
		return -EPROTO;
	return (int)(r->entries - used);
}

int rring_push(struct rring *r, const void *payload, size_t len)
{
	if (len == 0 || len > RADIANCE_SLOT_BYTES - 4)
		return -EMSGSIZE;
	int space = rring_space(r);
	if (space < 0)
		return space;
	if (space == 0)
		return -EAGAIN;
	uint8_t *slot = r->slots + (size_t)(r->local & r->mask) * RADIANCE_SLOT_BYTES;
	uint32_t l = (uint32_t)len;
	memcpy(slot, &l, 4);
	memcpy(slot + 4, payload, len);
	r->local++;
	/* seq_cst, not just release: with the seq_cst `sleeping` accesses it
	 * forms the Dekker pair with prepare_sleep (no lost wakeup) */
	__atomic_store_n(&r->ctl->tail, r->local, __ATOMIC_SEQ_CST);
	return 0;
}

int rring_ready(struct rring *r)
{
	uint32_t tail = __atomic_load_n(&r->ctl->tail, __ATOMIC_ACQUIRE);
	uint32_t n = tail - r->local;
	if (n > r->entries)
		return -EPROTO;
	return (int)n;
}

int rring_peek(struct rring *r, void *buf)
{
	int n = rring_ready(r);
	if (n <= 0)
		return n;
	const uint8_t *slot = r->slots + (size_t)(r->local & r->mask) * RADIANCE_SLOT_BYTES;
	/* Read the length once, check it, then copy: the peer may rewrite the
	 * slot concurrently, but only our private copy is decoded. */
	uint32_t len = __atomic_load_n((const uint32_t *)slot, __ATOMIC_RELAXED);
	if (len == 0 || len > RADIANCE_SLOT_BYTES - 4)
		return -EPROTO;
	memcpy(buf, slot + 4, len);
	return (int)len;
}

void rring_consume(struct rring *r)
{
	r->local++;
	__atomic_store_n(&r->ctl->head, r->local, __ATOMIC_RELEASE);
}

int rring_pop(struct rring *r, void *buf)
{
	int len = rring_peek(r, buf);
	if (len > 0)
		rring_consume(r);
	return len;
}

int rring_prepare_sleep(struct rring *r)
{
	__atomic_store_n(&r->ctl->sleeping, 1, __ATOMIC_SEQ_CST);
	uint32_t tail = __atomic_load_n(&r->ctl->tail, __ATOMIC_SEQ_CST);
	if (tail != r->local) {
		/* Work (or corruption, which the next pop reports) arrived. */
		__atomic_store_n(&r->ctl->sleeping, 0, __ATOMIC_RELAXED);
		return 0;
	}
	return 1;
}

void rring_end_sleep(struct rring *r)
{
	__atomic_store_n(&r->ctl->sleeping, 0, __ATOMIC_RELAXED);
}

int rring_needs_wakeup(struct rring *r)
{
	return __atomic_load_n(&r->ctl->sleeping, __ATOMIC_SEQ_CST) != 0;
}

int rdoorbell_ring(int efd)
{
	uint64_t one = 1;
	ssize_t n;
	do
		n = write(efd, &one, sizeof one);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno != EAGAIN)
		return -errno;
	return 0;
}

int rdoorbell_drain(int efd)
{
	/* One read: an eventfd gives its whole 8-byte count, a pipe up to
	 * sizeof buf of the 8-byte words written to it (anything left makes the
	 * next poll return at once, so nothing is lost, and a single read never
	 * waits on a pipe that is empty but has a writer). */
	uint64_t buf[64];
	ssize_t n;
	do
		n = read(efd, buf, sizeof buf);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	if (n == sizeof(uint64_t) && buf[0] != 1)
		return buf[0] > INT_MAX ? INT_MAX : (int)buf[0];   /* an eventfd's count */
	return (int)(((size_t)n + sizeof(uint64_t) - 1) / sizeof(uint64_t));
}
