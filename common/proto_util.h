/*
 * Glue between protobuf-c messages (proto/radiance.proto) and the transport
 * and rings. Shared by daemon and client; as small as it can be.
 *
 * Thread safety: stateless functions; a conn is driven by one thread.
 */
#ifndef RADIANCE_PROTO_UTIL_H
#define RADIANCE_PROTO_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "radiance.pb-c.h"
#include "transport.h"

/* RingReady carries the segment memfd, the SQ doorbell, the CQ doorbell, in
 * this order. */
#define RADIANCE_RING_READY_FDS 3u
enum { RADIANCE_FD_SEGMENT = 0, RADIANCE_FD_SQ_DOORBELL = 1, RADIANCE_FD_CQ_DOORBELL = 2 };

/* Serializes m and queues it as one frame with nfds fds (dup'ed; the caller
 * keeps its own). 0, -EMSGSIZE when the packed message is empty or above
 * the conn's max_frame, -ENOMEM, or an error of rconn_queue(). */
int rproto_queue_client(struct rconn *c, const Rdw__ClientMessage *m,
				const int *fds, size_t nfds);
int rproto_queue_server(struct rconn *c, const Rdw__ServerMessage *m,
				const int *fds, size_t nfds);

/* Decodes a frame. NULL when the bytes are not a valid message (or out of
 * memory). Free with rdw__client_message__free_unpacked(m, NULL) /
 * rdw__server_message__free_unpacked(m, NULL). An empty oneof
 * (msg_case == ..._MSG__NOT_SET) decodes fine: the caller rejects it. */
Rdw__ClientMessage *rproto_unpack_client(const uint8_t *data, size_t len);
Rdw__ServerMessage *rproto_unpack_server(const uint8_t *data, size_t len);

/* How many fds a message declares it carries: LoadModel one per file name,
 * RingReady RADIANCE_RING_READY_FDS, ModelMapping rproto_mapping_fds()
 * of its handle, everything else 0. A frame that came with a different
 * number of fds is a protocol violation. */
size_t rproto_client_fds(const Rdw__ClientMessage *m);
size_t rproto_server_fds(const Rdw__ServerMessage *m);
/* 1 for the handles that travel as an fd (POSIX_FD, TEST_MEMFD), else 0. */
size_t rproto_mapping_fds(Rdw__MapHandle handle);

/* Short name of the message in the oneof, for logs ("hello", "load_model",
 * ..., "none"). Static strings. */
const char *rproto_client_name(const Rdw__ClientMessage *m);
const char *rproto_server_name(const Rdw__ServerMessage *m);

/* Serializes a ring slot payload (LinearRequest or LinearResult) into buf of
 * cap bytes (RADIANCE_SLOT_BYTES - 4 for a slot). Returns the length (>= 1)
 * or -EMSGSIZE when it does not fit. An all-default proto3 message packs to
 * 0 bytes but a slot needs >= 1, so that case is written as field 1
 * (request_id, a varint in both messages) explicitly set to 0: bytes 08 00,
 * which every decoder reads back as the same all-default message. */
int rproto_pack_slot(const ProtobufCMessage *m, uint8_t *buf, size_t cap);

/* protobuf-c allocates while it unpacks; a bump buffer keeps the hot path
 * (ring slots, both directions) off malloc. A slot is at most
 * RADIANCE_SLOT_BYTES - 4 bytes, and 16 KiB holds even a slot made only of
 * unknown fields (protobuf-c keeps each with ~40 bytes of overhead).
 * Embed one per thread (or on the stack), call rproto_bump_reset()
 * before each unpack and pass rproto_bump_allocator(): what the
 * unpack returns lives in the buffer until the next reset and is never
 * freed. An unpack that needs more than the buffer fails (NULL). */
#define RADIANCE_PROTO_BUMP_BYTES 16384

struct rproto_bump {
	size_t used;
	_Alignas(16) uint8_t buf[RADIANCE_PROTO_BUMP_BYTES];
};

static inline void rproto_bump_reset(struct rproto_bump *b)
{
	b->used = 0;
}

/* An allocator drawing 16-byte aligned blocks from b; its free does nothing.
 * b must outlive the unpack and what it returned. */
ProtobufCAllocator rproto_bump_allocator(struct rproto_bump *b);

#endif
