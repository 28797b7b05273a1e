/*
 * Fuzz target: the control-plane receive path, bytes as they arrive on a
 * client's (or the daemon's) Unix socket.
 *
 * The input is the raw byte stream. It goes through a socketpair into
 * rconn_read / rconn_next_frame exactly as server.c drives
 * them (read until a frame is complete, drain frames, repeat; stop on
 * EOF or any error). Each frame is then decoded:
 *   - as a ClientMessage with the daemon's helper (rproto_unpack_client)
 *     plus what session_handle_frame asks of it before dispatch
 *     (rproto_client_fds, rproto_client_name);
 *   - as a ServerMessage, as the client library does
 *     (rproto_unpack_server, _server_fds, _server_name);
 *   - a decoded message is packed again and queued with
 *     rproto_queue_client/_server on a second socketpair, flushed,
 *     read back through the transport and decoded again: the send side of
 *     the transport and the pack path must round-trip whatever the decoder
 *     accepted (FUZZ_CHECK).
 * Session-level validation (the handlers in daemon/session.c) is the job of
 * fuzz_session, which drives a real in-process daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "proto_util.h"
#include "shm.h"
#include "transport.h"
#include "wire.h"

/* Whether m or a message inside it kept unknown fields. protobuf-c 1.4.1
 * accepts a field number 0 written as a multi-byte varint (80 00) and keeps
 * it as an unknown field, but packs it back as the one-byte tag 00, which
 * its own decoder refuses: a quirk of the library (the check added by
 * protobuf-c PR #299 looks at the first tag byte only), not of radiance.
 * Messages with unknown fields are therefore exempt from the round-trip
 * check. */
static int has_unknown(const ProtobufCMessage *m)
{
	if (m->n_unknown_fields)
		return 1;
	const ProtobufCMessageDescriptor *d = m->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		const char *base = (const char *)m;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + f->quantifier_offset);
			ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
			for (size_t j = 0; j < n; j++)
				if (v[j] && has_unknown(v[j]))
					return 1;
		} else {
			if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF &&
			    *(const uint32_t *)(base + f->quantifier_offset) != f->id)
				continue;
			const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
			if (sub && has_unknown(sub))
				return 1;
		}
	}
	return 0;
}

/* Pack m, send it through a fresh conn pair, read it back, decode again. */
static void roundtrip(const ProtobufCMessage *msg, int client)
{
	int sv[2];
	struct rconn tx, rx;
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	FUZZ_CHECK(rconn_init(&tx, sv[0], RADIANCE_MAX_FRAME, RADIANCE_MAX_FDS) == 0);
	FUZZ_CHECK(rconn_init(&rx, sv[1], RADIANCE_MAX_FRAME, RADIANCE_MAX_FDS) == 0);
	int rc = client ? rproto_queue_client(&tx, (const Rdw__ClientMessage *)msg, NULL, 0)
			: rproto_queue_server(&tx, (const Rdw__ServerMessage *)msg, NULL, 0);
	size_t packed = protobuf_c_message_get_packed_size(msg);
	if (packed == 0 || packed > RADIANCE_MAX_FRAME) {
		FUZZ_CHECK(rc == -EMSGSIZE);
		goto out;
	}
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(rconn_pending(&tx) == packed + 4);
	/* a socketpair's buffer holds a frame of up to a few hundred KiB; the
	 * fuzzer's inputs are far smaller, so one flush sends it all */
	if (packed > 100000)
		goto out;
	FUZZ_CHECK(rconn_flush(&tx) == 0);
	const uint8_t *d;
	size_t len;
	for (;;) {
		rc = rconn_next_frame(&rx, &d, &len);
		if (rc == 1)
			break;
		FUZZ_CHECK(rc == 0);
		FUZZ_CHECK(rconn_read(&rx) > 0);
	}
	FUZZ_CHECK(len == packed);
	if (client) {
		Rdw__ClientMessage *again = rproto_unpack_client(d, len);
		FUZZ_CHECK(again || has_unknown(msg));
		if (again) {
			FUZZ_CHECK(again->msg_case == ((const Rdw__ClientMessage *)msg)->msg_case);
			rdw__client_message__free_unpacked(again, NULL);
		}
	} else {
		Rdw__ServerMessage *again = rproto_unpack_server(d, len);
		FUZZ_CHECK(again || has_unknown(msg));
		if (again) {
			FUZZ_CHECK(again->msg_case == ((const Rdw__ServerMessage *)msg)->msg_case);
			rdw__server_message__free_unpacked(again, NULL);
		}
	}
out:
	rconn_finish(&tx);
	rconn_finish(&rx);
}

static void handle_frame(const uint8_t *d, size_t len)
{
	Rdw__ClientMessage *cm = rproto_unpack_client(d, len);
	if (cm) {
		size_t nfds = rproto_client_fds(cm);
		if (cm->msg_case == RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL)
			FUZZ_CHECK(cm->load_model && nfds == cm->load_model->n_file_names);
		else
			FUZZ_CHECK(nfds == 0);
		FUZZ_CHECK(rproto_client_name(cm) != NULL);
		roundtrip(&cm->base, 1);
		rdw__client_message__free_unpacked(cm, NULL);
	}
	Rdw__ServerMessage *sm = rproto_unpack_server(d, len);
	if (sm) {
		size_t nfds = rproto_server_fds(sm);
		FUZZ_CHECK(nfds == 0 || nfds == RADIANCE_RING_READY_FDS);
		FUZZ_CHECK(rproto_server_name(sm) != NULL);
		roundtrip(&sm->base, 0);
		rdw__server_message__free_unpacked(sm, NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];
	struct rconn c;
	size_t sent = 0;
	int eof_sent = 0;

	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	FUZZ_CHECK(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);   /* the daemon's side */
	FUZZ_CHECK(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
	FUZZ_CHECK(rconn_init(&c, sv[0], RADIANCE_MAX_FRAME, RADIANCE_MAX_FDS) == 0);

	for (;;) {
		/* feed what the socket takes; EOF once everything is in */
		while (sent < size) {
			ssize_t w = send(sv[1], data + sent, size - sent, MSG_NOSIGNAL);
			if (w < 0) {
				FUZZ_CHECK(errno == EAGAIN);
				break;
			}
			sent += (size_t)w;
		}
		if (sent == size && !eof_sent) {
			shutdown(sv[1], SHUT_WR);
			eof_sent = 1;
		}
		int rc = rconn_read(&c);
		if (rc == -EAGAIN)
			continue;     /* the writer refills next time round */
		if (rc <= 0)
			break;        /* EOF, -EMSGSIZE, ...: the session would end */
		const uint8_t *d;
		size_t len;
		while ((rc = rconn_next_frame(&c, &d, &len)) == 1) {
			FUZZ_CHECK(len >= 1 && len <= RADIANCE_MAX_FRAME);
			FUZZ_CHECK(rconn_queued_fds(&c) == 0);
			handle_frame(d, len);
		}
		if (rc < 0) {
			FUZZ_CHECK(rc == -EMSGSIZE);
			break;
		}
	}
	rconn_finish(&c);
	close(sv[1]);
	return 0;
}
