/*
 * Control-socket constants of protocol version 1: the version Hello
 * carries and the framing limits of common/transport.h. The messages are
 * proto/radiance.proto; the shared-memory data plane is proto/shm.h.
 */
#ifndef RADIANCE_WIRE_H
#define RADIANCE_WIRE_H

#define RADIANCE_PROTOCOL_VERSION 1u
#define RADIANCE_MAX_FRAME (1u << 20)     /* largest control frame, bytes */
#define RADIANCE_MAX_FDS 64u              /* most fds one control frame carries */

/* Shared tensors (ListTensors / MapTensors): the version Welcome's
 * tensors_version names, and the alignment of every tensor's offset in the
 * memfd (a cache line: any dtype's natural alignment). */
#define RADIANCE_TENSORS_VERSION 1u
#define RADIANCE_TENSORS_ALIGN 64u

#endif
