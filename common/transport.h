/*
 * Control-plane transport: length-prefixed frames over a Unix stream socket,
 * with file descriptors carried by SCM_RIGHTS. Knows bytes and fds, not
 * messages (proto/ and the callers know those). Shared by daemon and client.
 *
 * Frame: uint32 little-endian length L, 1 <= L <= max_frame, then L bytes.
 * A frame's fds travel with its first byte: the sender starts a new sendmsg()
 * at the first byte of every frame that carries fds and attaches them there.
 *
 * The receiver never reads across a frame boundary (one recvmsg() reads at
 * most the rest of the current length prefix or the rest of the current
 * frame's body). Because the kernel hands out a sendmsg's fds with the first
 * byte read of it, every fd queued when a frame completes arrived with that
 * frame's bytes: after rconn_next_frame() returns a frame, exactly
 * rconn_queued_fds() fds belong to it (the frames before it having
 * taken or dropped theirs). Compare that with what the message declares; a
 * mismatch is a protocol violation.
 *
 * A struct rconn is embedded by its owner (init/finish) and is not
 * thread-safe: one thread drives it. The socket is expected non-blocking for
 * the daemon (libuv uv_poll drives it); the client may use it blocking.
 * Fields are private to common/transport.c; read them only through the
 * functions below.
 */
#ifndef RADIANCE_TRANSPORT_H
#define RADIANCE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

/* The kernel's SCM_MAX_FD: the most fds one sendmsg can carry. Sizing a
 * control buffer for it means an over-limit sender's fds all reach us and get
 * closed, rather than being dropped half-way with MSG_CTRUNC. */
#define RADIANCE_SCM_MAX_FD 253

/* fds waiting to go out with the frame that starts at byte `offset` of the
 * send queue. */
struct radiance__fd_batch {
	size_t offset;
	int *fds;
	size_t nfds;
};

struct rconn {
	int fd;
	uint32_t max_frame;        /* largest accepted frame length */
	uint32_t max_fds;          /* most fds held queued; more is a protocol error */
	/* receive side */
	uint8_t *in;               /* buffered bytes; [in_consumed, in_len) not yet consumed */
	size_t in_len, in_cap;
	size_t in_consumed;        /* bytes of the frame handed out by next_frame */
	int *in_fds;               /* received fds not yet taken, in arrival order */
	size_t in_nfds;
	/* send side */
	uint8_t *out;
	size_t out_len, out_cap, out_sent;
	size_t out_frames;         /* frames not completely sent */
	size_t out_head_end;       /* end of the oldest of them (a compaction may have
	                              dropped its start: never re-read from byte 0) */
	struct radiance__fd_batch *out_batches;   /* in offset order; owned dups */
	size_t out_nbatches, out_batches_cap;
};

/* Takes over fd (closed by finish). max_frame is capped to RADIANCE_MAX_FRAME
 * semantics by the caller (any value >= 1 works); max_fds >= 1.
 * 0 or -ENOMEM (fd is then still the caller's). */
int rconn_init(struct rconn *c, int fd, uint32_t max_frame, uint32_t max_fds);
/* Closes the socket and every queued fd (received or pending send), frees
 * buffers. Safe to call twice. */
void rconn_finish(struct rconn *c);

/* Reads what the socket has, one recvmsg() bounded by the current frame (see
 * above). Returns bytes read (> 0), 0 at EOF, -EAGAIN when nothing is ready,
 * -EPROTO when more fds arrived than max_fds allows (in total queued),
 * -EMFILE when the kernel truncated the control message: the fds could not
 * all be installed, which (with a buffer for the kernel's per-message
 * maximum) means this process is at its descriptor limit (in both cases
 * every fd of that recvmsg is closed),
 * -EMSGSIZE when a length prefix is 0 or above max_frame, or another -errno.
 * Any error but -EAGAIN leaves the connection unusable. When a complete frame
 * is already buffered it reads nothing and returns 1: drain next_frame()
 * first. */
int rconn_read(struct rconn *c);

/* Pops the next complete frame. Returns 1 and sets *data and *len (valid until
 * the next read/next_frame call), 0 when more bytes are needed, -EMSGSIZE when
 * the length prefix is 0 or above max_frame (the connection is unusable). */
int rconn_next_frame(struct rconn *c, const uint8_t **data, size_t *len);

/* After read() or next_frame() returned -EMSGSIZE: the length prefix that
 * was refused (for the error message). */
uint32_t rconn_bad_length(const struct rconn *c);

/* Received fds not yet taken. Right after next_frame() returned 1, these are
 * the fds that came with that frame. */
size_t rconn_queued_fds(const struct rconn *c);

/* Takes the oldest n received fds into fds[] (the caller owns them now).
 * -EBADMSG when fewer than n are queued (nothing is taken). */
int rconn_take_fds(struct rconn *c, int *fds, size_t n);
/* Closes and drops every queued received fd (on any error after a frame). */
void rconn_close_fds(struct rconn *c);

/* Appends a frame (length prefix added here) and its fds to the send queue.
 * The fds are dup'ed (F_DUPFD_CLOEXEC); the caller keeps its own.
 * 0, -EMSGSIZE (len 0 or above max_frame, or nfds above max_fds), -ENOMEM, or
 * -errno from dup. Nothing is queued on error. */
int rconn_queue(struct rconn *c, const uint8_t *data, size_t len,
			const int *fds, size_t nfds);

/* Sends queued bytes (MSG_NOSIGNAL: no SIGPIPE). 0 when everything is sent,
 * -EAGAIN when the socket is full (call again when writable), or -errno
 * (e.g. -EPIPE). */
int rconn_flush(struct rconn *c);

/* Bytes waiting to be sent. */
size_t rconn_pending(const struct rconn *c);
/* Frames not completely sent (a frame partly sent counts), for messages. */
size_t rconn_pending_frames(const struct rconn *c);

#endif
