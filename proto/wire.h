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

#endif
