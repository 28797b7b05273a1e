/*
 * Fuzz target: a whole client session against an in-process daemon.
 *
 * Each input gets a fresh daemon core exactly as server_run() builds it
 * (libuv loop, executor thread with the CPU backend, registry) minus the
 * listening socket: one end of a socketpair becomes a session
 * (session_create + server_session_update, as on_listen does), and the
 * input is the byte stream the client sends on the other end. So the real
 * server.c read path (session_read: rconn_read / next_frame), the
 * dispatch and every handler of daemon/session.c run on peer bytes: Hello,
 * LoadModel (through the registry and the loader on the threadpool, upload
 * on the executor), AttachModel, ReleaseModel, GetModel, ListModels,
 * OpenRing (memfd segment, RING_ADD on the executor), GetStats, and every
 * protocol-violation exit.
 *
 * Descriptors: a frame that decodes as a LoadModel naming 1..64 files is
 * sent with that many fds (SCM_RIGHTS), one memfd per name holding the tiny
 * checkpoint of fuzz_common.h (config.json, quantization_config.json,
 * model.safetensors, the index and its two shards; any other name gets an
 * empty file). The same name reuses the same memfd within one input, so a
 * second LoadModel of the same files takes the "already resident" path. A
 * LoadModel whose tag has bit 62 set is sent with one fd too many.
 *
 * The harness plays a well-behaved client otherwise: it reads every reply
 * (rconn on its end), checks that each decodes as a ServerMessage
 * carrying exactly the fds it declares (RingReady: 3), and closes them. It
 * half-closes its end only when the session is idle and has read all it was
 * sent, so what runs does not depend on thread timing. Then the daemon is
 * torn down as server_stop() does (registry_shutdown, registry_destroy,
 * executor_destroy) and uv_loop_close() must return 0: a handle, a thread
 * or a model left behind is a failure, and LeakSanitizer sees the rest.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "fuzz_common.h"
#include "log.h"
#include "proto_util.h"
#include "server.h"
#include "session.h"
#include "shm.h"
#include "wire.h"

static struct radiance_config cfg;
static struct fz_buf single, shard1, shard2;
static char *index_json;

static void setup(void)
{
	rlog_init(getenv("FUZZ_VERBOSE") ? RADIANCE_LOG_DEBUG : RADIANCE_LOG_SILENT);
	FUZZ_CHECK(config_init(&cfg) == 0);
	free(cfg.backend);
	cfg.backend = strdup("cpu");
	cfg.max_sessions = 4;
	cfg.max_arena_bytes = 1u << 20;
	cfg.arena_bytes = 64u << 10;
	cfg.max_rows = 16;
	cfg.max_inflight = 64;
	cfg.max_sq_entries = 64;
	cfg.sq_entries = 8;
	cfg.max_k = 1024;
	cfg.max_n = 1024;
	single = fz_model_single();
	shard1 = fz_safetensors(fz_shard1, FZ_N1);
	shard2 = fz_safetensors(fz_shard2, FZ_N2);
	index_json = fz_index_json();
}

/* ---- the client's files: one memfd per distinct name ---- */

struct named_fd {
	char *name;
	int fd;
};
struct files {
	struct named_fd *v;
	size_t n;
	int spare;   /* the extra fd of a bit-62 LoadModel */
};

static int file_fd(struct files *fs, const char *name)
{
	for (size_t i = 0; i < fs->n; i++)
		if (strcmp(fs->v[i].name, name) == 0)
			return fs->v[i].fd;
	const void *d = "";
	size_t len = 0;
	if (strcmp(name, "config.json") == 0) {
		d = fz_config_json;
		len = strlen(fz_config_json);
	} else if (strcmp(name, "quantization_config.json") == 0) {
		d = fz_quant_config_json;
		len = strlen(fz_quant_config_json);
	} else if (strcmp(name, "model.safetensors") == 0) {
		d = single.p;
		len = single.len;
	} else if (strcmp(name, "model.safetensors.index.json") == 0) {
		d = index_json;
		len = strlen(index_json);
	} else if (strcmp(name, FZ_SHARD1_NAME) == 0) {
		d = shard1.p;
		len = shard1.len;
	} else if (strcmp(name, FZ_SHARD2_NAME) == 0) {
		d = shard2.p;
		len = shard2.len;
	}
	struct named_fd *v = realloc(fs->v, (fs->n + 1) * sizeof *v);
	FUZZ_CHECK(v);
	fs->v = v;
	v[fs->n].name = strdup(name);
	FUZZ_CHECK(v[fs->n].name);
	v[fs->n].fd = fz_memfd("fuzz-file", d, len);
	return v[fs->n++].fd;
}

/* ---- the input as chunks: whole frames, then whatever is left ---- */

struct chunk {
	const uint8_t *p;
	size_t len, off;      /* off: bytes already sent */
	int fds[RADIANCE_MAX_FDS + 1];
	size_t nfds;
};

static size_t split(const uint8_t *data, size_t size, struct chunk *ch, size_t max,
		    struct files *fs)
{
	size_t n = 0, pos = 0;
	while (pos < size && n < max) {
		struct chunk *c = &ch[n++];
		memset(c, 0, sizeof *c);
		c->p = data + pos;
		uint32_t l = 0;
		if (size - pos >= 4)
			l = (uint32_t)data[pos] | (uint32_t)data[pos + 1] << 8 |
			    (uint32_t)data[pos + 2] << 16 | (uint32_t)data[pos + 3] << 24;
		if (size - pos < 4 || l == 0 || l > size - pos - 4 || n == max) {
			c->len = size - pos;   /* the rest, raw */
			break;
		}
		c->len = 4 + (size_t)l;
		pos += c->len;
		Rdw__ClientMessage *m = rproto_unpack_client(c->p + 4, l);
		if (!m)
			continue;
		if (m->msg_case == RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL && m->load_model &&
		    m->load_model->n_file_names >= 1 &&
		    m->load_model->n_file_names <= RADIANCE_MAX_FDS) {
			for (size_t i = 0; i < m->load_model->n_file_names; i++)
				c->fds[c->nfds++] = file_fd(fs, m->load_model->file_names[i]);
			if ((m->tag >> 62) & 1) {
				if (fs->spare < 0)
					fs->spare = fz_memfd("spare", "", 0);
				c->fds[c->nfds++] = fs->spare;
			}
		}
		rdw__client_message__free_unpacked(m, NULL);
	}
	return n;
}

/* Sends what the socket takes of chunk c; 1 when it is all sent. */
static int send_chunk(int fd, struct chunk *c)
{
	while (c->off < c->len) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * (RADIANCE_MAX_FDS + 1))];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { (void *)(c->p + c->off), c->len - c->off };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (c->off == 0 && c->nfds) {
			memset(&ctl, 0, sizeof ctl);
			msg.msg_control = ctl.buf;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * c->nfds);
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * c->nfds);
			memcpy(CMSG_DATA(cm), c->fds, sizeof(int) * c->nfds);
		}
		ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return 0;
			/* EPIPE / ECONNRESET: the daemon closed the session; the rest is moot */
			c->off = c->len;
			return 1;
		}
		c->off += (size_t)w;
	}
	return 1;
}

/* The client's receive side: every reply must decode and carry exactly the
 * fds it declares. Returns 0 once the daemon closed its end. */
static int drain_replies(struct rconn *cc)
{
	for (;;) {
		int rc = rconn_read(cc);
		if (rc == -EAGAIN)
			return 1;
		/* a violation closes the daemon's end with the client's bytes
		 * unread: the client then sees ECONNRESET instead of EOF */
		if (rc == 0 || rc == -ECONNRESET)
			return 0;
		FUZZ_CHECK(rc > 0);   /* the daemon never sends a bad length or too many fds */
		const uint8_t *d;
		size_t len;
		while ((rc = rconn_next_frame(cc, &d, &len)) == 1) {
			Rdw__ServerMessage *m = rproto_unpack_server(d, len);
			FUZZ_CHECK(m);
			FUZZ_CHECK(m->msg_case != RDW__SERVER_MESSAGE__MSG__NOT_SET);
			FUZZ_CHECK(rconn_queued_fds(cc) == rproto_server_fds(m));
			rconn_close_fds(cc);
			rdw__server_message__free_unpacked(m, NULL);
		}
		FUZZ_CHECK(rc == 0);
	}
}

static void on_registry_empty(void *user)
{
	struct radiance_server *srv = user;
	registry_destroy(srv->reg);
	srv->reg = NULL;
	executor_destroy(srv->exec);
	srv->exec = NULL;
}

#define MAX_CHUNKS 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	static struct chunk chunks[MAX_CHUNKS];
	char err[512] = "";
	if (!ready) {
		ready = 1;
		setup();
	}

	uv_loop_t loop;
	struct radiance_server srv;
	memset(&srv, 0, sizeof srv);
	FUZZ_CHECK(uv_loop_init(&loop) == 0);
	srv.loop = &loop;
	srv.cfg = &cfg;
	srv.listen_fd = -1;
	stats_init(&srv.stats);
	struct executor_options eo = {
		.backend = {
			.kind = cfg.backend,
			.max_rows = cfg.max_rows,
			.max_decode_rows = cfg.max_rows,
			.max_n = cfg.max_n,
			.max_k = cfg.max_k,
		},
		.max_rings = cfg.max_sessions,
		.spin_us = 50,
		.global_stats = &srv.stats,
	};
	FUZZ_CHECK(executor_create(&loop, &eo, &srv.exec, err, sizeof err) == 0);
	FUZZ_CHECK(registry_create(&loop, srv.exec, NULL, &srv.reg) == 0);

	int sv[2];
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
	struct radiance_session *s = session_create(&srv, sv[0]);
	FUZZ_CHECK(s);
	s->next = srv.sessions;
	srv.sessions = s;
	srv.nsessions++;
	server_session_update(s);
	struct rconn cc;   /* the client's receive side; owns sv[1] */
	FUZZ_CHECK(rconn_init(&cc, sv[1], RADIANCE_MAX_FRAME, RADIANCE_MAX_FDS) == 0);

	struct files fs = { .v = NULL, .n = 0, .spare = -1 };
	size_t nchunks = split(data, size, chunks, MAX_CHUNKS, &fs), next = 0;
	int shut = 0, open = 1;
	while (srv.nsessions) {
		if (open)
			open = drain_replies(&cc);
		while (next < nchunks && send_chunk(sv[1], &chunks[next]))
			next++;
		if (next == nchunks && !shut) {
			/* half-close only when the session has read everything and is
			 * not waiting on a load or a ring: then the outcome is the
			 * input's, not the scheduler's */
			struct radiance_session *cur = srv.sessions;
			int queued = 0;
			if (cur->state != SESSION_CLOSING)
				FUZZ_CHECK(ioctl(sv[0], FIONREAD, &queued) == 0);
			if (cur->state == SESSION_CLOSING || (!cur->busy && queued == 0)) {
				shutdown(sv[1], SHUT_WR);
				shut = 1;
			}
		}
		uv_run(&loop, UV_RUN_ONCE);
	}
	while (open && drain_replies(&cc))
		;   /* the daemon closed its end: read what it sent up to EOF */

	/* server_stop()'s order: sessions are gone; unload, stop the executor */
	registry_shutdown(srv.reg, on_registry_empty, &srv);
	uv_run(&loop, UV_RUN_DEFAULT);
	FUZZ_CHECK(srv.reg == NULL && srv.exec == NULL);
	FUZZ_CHECK(uv_loop_close(&loop) == 0);

	rconn_finish(&cc);
	for (size_t i = 0; i < fs.n; i++) {
		close(fs.v[i].fd);
		free(fs.v[i].name);
	}
	free(fs.v);
	if (fs.spare >= 0)
		close(fs.spare);
	return 0;
}
