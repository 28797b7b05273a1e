/*
 * A raw control-plane client for the tests that attack the real radianced
 * with hand-made traffic (test_faults, test_hardening, test_map, test_tensors, ...): frames and fds go out
 * exactly as given through common/transport and the generated protobuf-c
 * structs, with none of libradiance's checks in the way.
 *
 * Header-only (static functions) like daemon_harness.h; include it after
 * <cmocka.h>, whose asserts it uses.
 */
#ifndef RADIANCE_RAW_CLIENT_H
#define RADIANCE_RAW_CLIENT_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "daemon_harness.h"
#include "proto_util.h"
#include "shm.h"
#include "wire.h"

struct raw {
	struct rconn conn;
	uint64_t tag;
};

/* Connects to the daemon at path: 0, or -errno when it refused. */
static inline int raw_open_at(struct raw *w, const char *path)
{
	int fd = h_try_connect(path);
	if (fd < 0)
		return fd;
	assert_int_equal(rconn_init(&w->conn, fd, RADIANCE_MAX_FRAME, 256), 0);
	w->tag = 1;
	return 0;
}

static inline void raw_close(struct raw *w)
{
	rconn_finish(&w->conn);
}

/* Bytes exactly as given (no framing added), with fds on the first byte. */
static inline void raw_send_bytes(struct raw *w, const void *buf, size_t len, const int *fds,
				  size_t nfds)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 253)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		memset(ctl.b, 0, sizeof ctl.b);
		msg.msg_control = ctl.b;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	ssize_t n = sendmsg(w->conn.fd, &msg, MSG_NOSIGNAL);
	/* the daemon may already have hung up on an earlier fault */
	assert_true(n == (ssize_t)len || (n < 0 && (errno == EPIPE || errno == ECONNRESET)));
}

/* A frame around payload: length prefix + bytes. */
static inline void raw_send_frame(struct raw *w, const void *payload, uint32_t len, const int *fds,
				  size_t nfds)
{
	uint8_t *buf = malloc(4 + (size_t)len);
	memcpy(buf, &len, 4);   /* little-endian host */
	memcpy(buf + 4, payload, len);
	raw_send_bytes(w, buf, 4 + (size_t)len, fds, nfds);
	free(buf);
}

/* m with the next tag, framed. */
static inline void raw_send(struct raw *w, Rdw__ClientMessage *m, const int *fds, size_t nfds)
{
	m->tag = w->tag++;
	size_t len = protobuf_c_message_get_packed_size(&m->base);   /* > 0: tag >= 1 */
	uint8_t *buf = malloc(len);
	protobuf_c_message_pack(&m->base, buf);
	raw_send_frame(w, buf, (uint32_t)len, fds, nfds);
	free(buf);
}

/* client_name NULL: none (the field left empty). */
static inline void raw_send_hello(struct raw *w, uint32_t protocol_version, char *client_name,
				  const int *fds, size_t nfds)
{
	Rdw__Hello h = RDW__HELLO__INIT;
	h.protocol_version = protocol_version;
	if (client_name)
		h.client_name = client_name;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_HELLO;
	m.hello = &h;
	raw_send(w, &m, fds, nfds);
}

static inline void raw_send_list_models(struct raw *w, const int *fds, size_t nfds)
{
	Rdw__ListModels lm = RDW__LIST_MODELS__INIT;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_LIST_MODELS;
	m.list_models = &lm;
	raw_send(w, &m, fds, nfds);
}

/* A LoadModel named `name` (NULL: none) declaring n file names, whatever
 * fds go with it. */
static inline void raw_send_load_model_named(struct raw *w, char *name, char **names, size_t n,
					     const int *fds, size_t nfds)
{
	Rdw__LoadModel lm = RDW__LOAD_MODEL__INIT;
	if (name)
		lm.name = name;
	lm.n_file_names = n;
	lm.file_names = names;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL;
	m.load_model = &lm;
	raw_send(w, &m, fds, nfds);
}

static inline void raw_send_load_model(struct raw *w, char **names, size_t n, const int *fds,
				       size_t nfds)
{
	raw_send_load_model_named(w, NULL, names, n, fds, nfds);
}

/* Next server message: 1 (*out set), 0 on EOF, -ECONNRESET, -ETIMEDOUT. */
static inline int raw_recv(struct raw *w, Rdw__ServerMessage **out, int timeout_ms)
{
	*out = NULL;
	for (;;) {
		const uint8_t *data;
		size_t len;
		int rc = rconn_next_frame(&w->conn, &data, &len);
		if (rc == 1) {
			*out = rproto_unpack_server(data, len);
			assert_non_null(*out);
			rconn_close_fds(&w->conn);
			return 1;
		}
		assert_int_equal(rc, 0);
		struct pollfd p = { .fd = w->conn.fd, .events = POLLIN };
		if (poll(&p, 1, timeout_ms) == 0)
			return -ETIMEDOUT;
		rc = rconn_read(&w->conn);
		if (rc == 0 || rc == -ECONNRESET)
			return rc;
		if (rc == -EAGAIN)
			continue;
		assert_true(rc > 0);
	}
}

/* The reply to the last message sent comes within 10 s and is a msg_case. */
static inline void raw_expect_reply(struct raw *w, Rdw__ServerMessage__MsgCase msg_case)
{
	Rdw__ServerMessage *reply;
	assert_int_equal(raw_recv(w, &reply, 10000), 1);
	/* copy what the checks need, free, then check: a failed check must
	 * not leave the message to LeakSanitizer and hide the real failure */
	uint64_t tag = reply->tag;
	int got = reply->msg_case;
	char text[256] = "";
	if (got == RDW__SERVER_MESSAGE__MSG_ERROR)
		snprintf(text, sizeof text, "Error %d '%s'", reply->error->code,
			 reply->error->message ? reply->error->message : "");
	rdw__server_message__free_unpacked(reply, NULL);
	if (got != (int)msg_case)
		fail_msg("expected message case %d, got %d %s", (int)msg_case, got, text);
	assert_int_equal(tag, w->tag - 1);
}

/* What a client reads in the daemon's Welcome: the numbers, copied out so
 * the message is freed before any check (as raw_expect_reply). */
struct raw_welcome {
	uint32_t protocol_version, max_rows, map_layout_version, tensors_version,
		max_request_layers;
	uint64_t session_id;
};

/* Hello at this build's protocol version; the reply must be a Welcome to it
 * within 10 s, whose numbers go to *out. */
static inline void raw_hello_welcome(struct raw *w, struct raw_welcome *out)
{
	*out = (struct raw_welcome){ 0 };
	raw_send_hello(w, RADIANCE_PROTOCOL_VERSION, "raw", NULL, 0);
	Rdw__ServerMessage *reply;
	assert_int_equal(raw_recv(w, &reply, 10000), 1);
	int got = reply->msg_case;
	uint64_t tag = reply->tag;
	if (got == RDW__SERVER_MESSAGE__MSG_WELCOME) {
		const Rdw__Welcome *wl = reply->welcome;
		*out = (struct raw_welcome){
			.protocol_version = wl->protocol_version,
			.max_rows = wl->max_rows,
			.map_layout_version = wl->map_layout_version,
			.tensors_version = wl->tensors_version,
			.max_request_layers = wl->max_request_layers,
			.session_id = wl->session_id,
		};
	}
	rdw__server_message__free_unpacked(reply, NULL);
	if (got != RDW__SERVER_MESSAGE__MSG_WELCOME)
		fail_msg("expected a Welcome (message case %d), got case %d",
			 (int)RDW__SERVER_MESSAGE__MSG_WELCOME, got);
	assert_int_equal(tag, w->tag - 1);
}

static inline void raw_hello(struct raw *w)
{
	raw_send_hello(w, RADIANCE_PROTOCOL_VERSION, "raw", NULL, 0);
	raw_expect_reply(w, RDW__SERVER_MESSAGE__MSG_WELCOME);
}

/* Sends m; the reply must be Error(code) with `says` in its text. */
static inline void raw_send_refused(struct raw *w, Rdw__ClientMessage *m, int code, const char *says)
{
	raw_send(w, m, NULL, 0);
	Rdw__ServerMessage *reply;
	assert_int_equal(raw_recv(w, &reply, 10000), 1);
	int got = reply->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR ? reply->error->code : -1;
	char text[512] = "";
	if (got >= 0)
		snprintf(text, sizeof text, "%s", reply->error->message ? reply->error->message : "");
	rdw__server_message__free_unpacked(reply, NULL);
	if (got != code || !strstr(text, says))
		fail_msg("expected Error %d '...%s...', got %d '%s'", code, says, got, text);
}

/* The session survives: a ListModels round trip still works. */
static inline void raw_expect_alive(struct raw *w)
{
	raw_send_list_models(w, NULL, 0);
	raw_expect_reply(w, RDW__SERVER_MESSAGE__MSG_MODEL_LIST);
}

/* Reads up to the end: 0 at a clean EOF, -ECONNRESET, -ETIMEDOUT. The last
 * Error's code and text go to *code and text (may be NULL). */
static inline int raw_read_to_end(struct raw *w, int timeout_ms, int *code, char *text,
				  size_t textlen)
{
	*code = 0;
	if (text)
		text[0] = 0;
	for (;;) {
		Rdw__ServerMessage *m;
		int rc = raw_recv(w, &m, timeout_ms);
		if (rc <= 0)
			return rc;
		if (m->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR) {
			*code = m->error->code;
			if (text)
				snprintf(text, textlen, "%s", m->error->message ? m->error->message : "");
		}
		rdw__server_message__free_unpacked(m, NULL);
	}
}

/* The daemon ends this session: maybe an Error first, then EOF within 5 s.
 * Returns the Error's code (0 if it sent none). */
static inline int raw_expect_closed(struct raw *w)
{
	int code;
	assert_int_not_equal(raw_read_to_end(w, 5000, &code, NULL, 0), -ETIMEDOUT);
	return code;
}

/* Loads the checkpoint directory dir (config.json, quantization_config.json,
 * model.safetensors) on w and returns its model id; fails the test unless
 * the load succeeds. */
/* The cap on unsent replies that carry a descriptor (MapTensors, MapModel:
 * SESSION_FD_REPLIES_MAX_QUEUED, 8): sends m n times without reading, then
 * reads the n replies. Each must be `answer` (its fds closed) or
 * Error(EBUSY) "still unsent"; at least 8 are answered and some refused,
 * and daemon_pid never held more than 8 descriptors beyond those it held
 * before (sampled before each read). `what` names m in the printed figures.
 * Returns the number answered. */
static inline int raw_expect_fd_replies_capped(struct raw *w, pid_t daemon_pid, Rdw__ClientMessage *m, int n,
					       Rdw__ServerMessage__MsgCase answer, const char *what)
{
	int before = h_count_fds(daemon_pid);
	for (int i = 0; i < n; i++)
		raw_send(w, m, NULL, 0);
	int answered = 0, busy = 0, most_fds = 0;
	for (int i = 0; i < n; i++) {
		int held = h_count_fds(daemon_pid) - before;
		most_fds = held > most_fds ? held : most_fds;
		Rdw__ServerMessage *reply;
		assert_int_equal(raw_recv(w, &reply, 20000), 1);
		if (reply->msg_case == answer)
			answered++;
		else if (reply->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR &&
			 reply->error->code == EBUSY && strstr(reply->error->message, "still unsent"))
			busy++;
		else
			fail_msg("%s reply %d: message case %d", what, i, reply->msg_case);
		rdw__server_message__free_unpacked(reply, NULL);
		rconn_close_fds(&w->conn);
	}
	printf("# %d pipelined %s: %d answered, %d EBUSY; the daemon held at most %d "
	       "descriptors more meanwhile\n", n, what, answered, busy, most_fds);
	assert_int_equal(answered + busy, n);
	assert_true(answered >= 8 && busy > 0);
	assert_true(most_fds <= 8);
	return answered;
}

static inline uint32_t raw_load_dir(struct raw *w, const char *dir)
{
	char *names[] = { "config.json", "quantization_config.json", "model.safetensors" };
	int fds[3];
	for (int i = 0; i < 3; i++) {
		char p[600];
		snprintf(p, sizeof p, "%s/%s", dir, names[i]);
		fds[i] = open(p, O_RDONLY | O_CLOEXEC);
		assert_true(fds[i] >= 0);
	}
	raw_send_load_model(w, names, 3, fds, 3);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	Rdw__ServerMessage *reply;
	uint32_t id = 0;
	for (;;) {
		assert_int_equal(raw_recv(w, &reply, 20000), 1);
		int c = reply->msg_case;
		if (c == RDW__SERVER_MESSAGE__MSG_MODEL_INFO)
			id = reply->model_info->model_id;
		rdw__server_message__free_unpacked(reply, NULL);
		if (c != RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS) {
			assert_int_equal(c, RDW__SERVER_MESSAGE__MSG_MODEL_INFO);
			return id;
		}
	}
}

/* --- an older daemon ----------------------------------------------------- */

/* A radianced from before the optional features (mapped weights, shared
 * tensors, several layers in one request), forked: listens on path, answers
 * one Hello with a Welcome (server_version "0.1.0-old") that has none of
 * map_layout_version, tensors_version and max_request_layers, then reads
 * until EOF. Exits 0 when nothing but the Hello came, 3 when another
 * message did (a real old daemon would have ended the session over it).
 * Its Welcome names `backend` ("cuda" for raw_old_daemon). */
static inline pid_t raw_old_daemon_backend(const char *path, const char *backend)
{
	int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(ls >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(ls, 1), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid > 0) {
		close(ls);
		return pid;
	}
	int fd = accept(ls, NULL, NULL);
	struct rconn c;
	if (fd < 0 || rconn_init(&c, fd, RADIANCE_MAX_FRAME, 8) < 0)
		_exit(2);
	int frames = 0, other = 0;
	for (;;) {
		const uint8_t *data;
		size_t len;
		int rc = rconn_next_frame(&c, &data, &len);
		if (rc == 1) {
			Rdw__ClientMessage *m = rproto_unpack_client(data, len);
			if (!m)
				_exit(2);
			if (frames++ == 0 && m->msg_case == RDW__CLIENT_MESSAGE__MSG_HELLO) {
				Rdw__Welcome w = RDW__WELCOME__INIT;
				Rdw__ServerMessage sm = RDW__SERVER_MESSAGE__INIT;
				w.protocol_version = RADIANCE_PROTOCOL_VERSION;
				w.server_version = "0.1.0-old";
				w.backend = (char *)backend;
				w.device = "an old one";
				w.max_rows = 16;
				sm.tag = m->tag;
				sm.msg_case = RDW__SERVER_MESSAGE__MSG_WELCOME;
				sm.welcome = &w;
				if (rproto_queue_server(&c, &sm, NULL, 0) < 0 || rconn_flush(&c) < 0)
					_exit(2);
			} else {
				other = 1;
			}
			rdw__client_message__free_unpacked(m, NULL);
			continue;
		}
		rc = rconn_read(&c);
		if (rc <= 0)
			break;
	}
	_exit(other ? 3 : 0);
}

static inline pid_t raw_old_daemon(const char *path)
{
	return raw_old_daemon_backend(path, "cuda");
}

/* raw_old_daemon on a socket in a fresh mkdtemp directory. */
struct raw_old {
	char dir[32];
	char path[64];
	pid_t pid;
};

static inline void raw_old_start_backend(struct raw_old *o, const char *backend)
{
	snprintf(o->dir, sizeof o->dir, "/tmp/radiance-old-XXXXXX");
	assert_non_null(mkdtemp(o->dir));
	snprintf(o->path, sizeof o->path, "%s/old.sock", o->dir);
	o->pid = raw_old_daemon_backend(o->path, backend);
}

static inline void raw_old_start(struct raw_old *o)
{
	raw_old_start_backend(o, "cuda");
}

/* After the client has disconnected: the fake daemon must have exited 0
 * (nothing but the Hello reached it); removes its socket and directory. */
static inline void raw_old_reap(struct raw_old *o)
{
	int st;
	assert_int_equal(waitpid(o->pid, &st, 0), o->pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st) != 0)
		fail_msg("the old daemon exited %d: %s", WEXITSTATUS(st),
			 WEXITSTATUS(st) == 3 ? "a message after the Hello reached it"
					      : "its handshake failed");
	unlink(o->path);
	rmdir(o->dir);
}

#endif
