/*
 * Fuzz target: libradiance (client/) against a daemon that says anything.
 *
 * The daemon's replies and its shared segment are the client's peer input:
 * this target plays a daemon whose every byte comes from the input. A
 * thread accepts the library's connection on a Unix socket and writes the
 * reply stream; the fuzzer's thread drives the public API through a whole
 * session: radiance_connect (handshake), list, load (from a real directory
 * holding the tiny checkpoint of fuzz_common.h, with LoadProgress), get,
 * attach, stats, open_rings (segment header checks), submit, poll (CQ
 * slots), release, disconnect. Each call reads the next replies, whatever
 * they are; a broken session just makes the rest fail fast.
 *
 * Input:
 *   u16 L (little-endian), then L bytes: the segment image, copied to the
 *   start of the memfd sent with every RingReady (header, then whatever the
 *   offsets point at: CQ slots, ring words);
 *   the rest: the reply stream as the daemon would write it (u32 length,
 *   ServerMessage). A frame that decodes as RingReady is sent with three
 *   fds: the segment memfd, sized to the RingReady's segment_bytes (capped
 *   at 1 MiB, so a size mismatch is possible and tested), and two eventfds.
 * After the stream the daemon half-closes and reads until the client hangs
 * up, so a missing reply is an EOF, never a timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "proto_util.h"
#include "radiance.h"
#include "shm.h"
#include "wire.h"

#define SEGMENT_MAX (1u << 20)

static char dir[64];
static char sock_path[96];
static char ckpt_dir[128];
static int listen_fd = -1;

struct daemon_side {
	const uint8_t *seg;
	size_t seg_len;
	const uint8_t *stream;
	size_t stream_len;
};

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	FUZZ_CHECK(f);
	FUZZ_CHECK(fwrite(data, 1, len, f) == len);
	FUZZ_CHECK(fclose(f) == 0);
}

/* The socket and the checkpoint live in a private /tmp directory, removed
 * at exit (a crash leaves it behind). */
static void cleanup(void)
{
	char p[256];
	if (listen_fd >= 0)
		close(listen_fd);
	unlink(sock_path);
	snprintf(p, sizeof p, "%s/config.json", ckpt_dir);
	unlink(p);
	snprintf(p, sizeof p, "%s/model.safetensors", ckpt_dir);
	unlink(p);
	rmdir(ckpt_dir);
	rmdir(dir);
}

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/radiance-fuzz-client-XXXXXX");
	FUZZ_CHECK(mkdtemp(dir));
	snprintf(sock_path, sizeof sock_path, "%s/s", dir);
	snprintf(ckpt_dir, sizeof ckpt_dir, "%s/tiny", dir);
	FUZZ_CHECK(mkdir(ckpt_dir, 0700) == 0);
	char p[256];
	struct fz_buf single = fz_model_single();
	snprintf(p, sizeof p, "%s/config.json", ckpt_dir);
	write_file(p, fz_config_json, strlen(fz_config_json));
	snprintf(p, sizeof p, "%s/model.safetensors", ckpt_dir);
	write_file(p, single.p, single.len);
	free(single.p);

	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	FUZZ_CHECK(listen_fd >= 0);
	FUZZ_CHECK(bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) == 0);
	FUZZ_CHECK(listen(listen_fd, 4) == 0);
	atexit(cleanup);
}

/* Sends all of [p, p+len) with fds on the first byte; 0, or -1 once the
 * client has gone. */
static int send_all(int fd, const uint8_t *p, size_t len, const int *fds, size_t nfds)
{
	size_t off = 0;
	while (off < len) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * 3)];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { (void *)(p + off), len - off };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (off == 0 && nfds) {
			memset(&ctl, 0, sizeof ctl);
			msg.msg_control = ctl.buf;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		off += (size_t)w;
	}
	return 0;
}

static void *daemon_main(void *arg)
{
	struct daemon_side *d = arg;
	/* radiance_connect always connects first; the timeout only guards
	 * against a harness change that makes it give up before that */
	struct pollfd pf = { .fd = listen_fd, .events = POLLIN };
	if (poll(&pf, 1, 5000) != 1)
		return NULL;
	int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
	FUZZ_CHECK(fd >= 0);
	size_t pos = 0;
	while (pos < d->stream_len) {
		const uint8_t *p = d->stream + pos;
		size_t left = d->stream_len - pos, len = left;
		int fds[3] = { -1, -1, -1 };
		size_t nfds = 0;
		if (left >= 4) {
			uint32_t l = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
				     (uint32_t)p[3] << 24;
			if (l <= left - 4) {
				len = 4 + (size_t)l;
				Rdw__ServerMessage *m = l ? rproto_unpack_server(p + 4, l) : NULL;
				if (m && m->msg_case == RDW__SERVER_MESSAGE__MSG_RING_READY) {
					uint64_t want = m->ring_ready->segment_bytes;
					size_t size = want < SEGMENT_MAX ? (size_t)want : SEGMENT_MAX;
					fds[0] = fz_memfd("segment", "", 0);
					FUZZ_CHECK(ftruncate(fds[0], (off_t)size) == 0);
					size_t n = d->seg_len < size ? d->seg_len : size;
					if (n)
						FUZZ_CHECK(pwrite(fds[0], d->seg, n, 0) == (ssize_t)n);
					fds[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
					fds[2] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
					FUZZ_CHECK(fds[1] >= 0 && fds[2] >= 0);
					nfds = 3;
				}
				if (m)
					rdw__server_message__free_unpacked(m, NULL);
			}
		}
		int rc = send_all(fd, p, len, fds, nfds);
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		if (rc < 0)
			break;
		pos += len;
	}
	shutdown(fd, SHUT_WR);
	/* read (and drop, fds included) until the client hangs up */
	for (;;) {
		uint8_t buf[4096];
		union {
			char b[CMSG_SPACE(sizeof(int) * RADIANCE_MAX_FDS)];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { buf, sizeof buf };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
				      .msg_controllen = sizeof ctl.b };
		ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		for (struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm;
		     cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int rfd;
				memcpy(&rfd, CMSG_DATA(cm) + i * sizeof(int), sizeof rfd);
				close(rfd);
			}
		}
		if (n <= 0)
			break;
	}
	close(fd);
	return NULL;
}

static void log_stderr(void *user, int priority, const char *message)
{
	fprintf(stderr, "libradiance <%d>: %s\n", priority, message);
}

static void client_session(void)
{
	struct radiance_options opt = RADIANCE_OPTIONS_INIT;
	opt.client_name = "fuzz";
	if (getenv("FUZZ_VERBOSE")) {   /* the library's own account of the session */
		opt.log = log_stderr;
		opt.log_priority = 7;   /* LOG_DEBUG */
	}
	opt.sq_entries = 4;
	opt.cq_entries = 8;
	opt.arena_bytes = 65536;
	opt.spin_us = -1;
	opt.timeout_ms = 5000;   /* never reached: the fake daemon half-closes */
	struct radiance *r = radiance_connect(sock_path, &opt);
	if (!r)
		return;
	const struct radiance_server_info *si = radiance_get_server_info(r);
	FUZZ_CHECK(si);

	struct radiance_model_list *list = NULL;
	if (radiance_list_models(r, &list) == 0)
		radiance_model_list_free(list);

	uint32_t id = 0;
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	if (radiance_load_model(r, ckpt_dir, &lo, &id) == 0) {
		const struct radiance_model_info *held = radiance_held_model(r, id);
		FUZZ_CHECK(held && held->model_id == id);
		for (size_t i = 0; i < held->n_layers; i++)
			FUZZ_CHECK(radiance_find_layer(held, held->layers[i].name) >= 0);
	}
	struct radiance_model_info *info = NULL;
	if (radiance_get_model(r, id, &info) == 0)
		radiance_model_info_free(info);
	uint32_t id2 = 0;
	radiance_attach_model(r, "tiny-w4g128", &id2);

	struct radiance_stats_reply *st = NULL;
	if (radiance_get_stats(r, &st) == 0)
		radiance_stats_free(st);

	if (radiance_open_rings(r) == 0) {
		struct radiance_ring_info ri;
		FUZZ_CHECK(radiance_get_ring_info(r, &ri) == 0);
		void *x = radiance_arena_alloc(r, 4096);
		void *y = radiance_arena_alloc(r, 4096);
		if (x && y) {
			uint64_t rid;
			for (uint32_t layer = 0; layer < 2; layer++)
				radiance_submit(r, id, layer, 1, RADIANCE_BF16, x, y, &rid);
		}
		struct radiance_completion c;
		for (int i = 0; i < 16 && radiance_poll(r, &c) == 1; i++)
			;
		radiance_arena_free(r, y);
		radiance_arena_free(r, x);
	}
	radiance_release_model(r, id);
	radiance_disconnect(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	if (!ready) {
		ready = 1;
		setup();
	}
	struct daemon_side d = { 0 };
	size_t l = size >= 2 ? (size_t)(data[0] | data[1] << 8) : 0;
	if (size >= 2) {
		if (l > size - 2)
			l = size - 2;
		d.seg = data + 2;
		d.seg_len = l;
		d.stream = data + 2 + l;
		d.stream_len = size - 2 - l;
	}
	pthread_t t;
	FUZZ_CHECK(pthread_create(&t, NULL, daemon_main, &d) == 0);
	client_session();
	pthread_join(t, NULL);
	return 0;
}
