/*
 * The data plane: the session's shared segment (proto/shm.h), the arena
 * allocator on top of it, submissions into the SQ and completions out of the
 * CQ, and the synchronous radiance_linear() built from them.
 *
 * The segment header is read once, checked, and copied: after that only the
 * private copies are used, since the daemon's memory is as untrusted to us as
 * ours is to it. The client never has more than cq_entries requests in
 * flight, which is what lets the daemon never find the CQ full.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "client-private.h"
#include "proto_util.h"
#include "shm_layout.h"

/* [off, off + len) inside [lo, hi), without overflow. */
static bool within(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi)
{
	return off >= lo && off <= hi && len <= hi - off;
}

/* --- segment -------------------------------------------------------------- */

void radiance__client_rings_close(struct radiance *r)
{
	if (r->segment)
		munmap(r->segment, r->segment_bytes);
	r->segment = NULL;
	if (r->sq_doorbell >= 0)
		close(r->sq_doorbell);
	if (r->cq_doorbell >= 0)
		close(r->cq_doorbell);
	r->sq_doorbell = r->cq_doorbell = -1;
	radiance__client_arena_finish(&r->arena);
	free(r->stash);
	r->stash = NULL;
	r->stash_cap = r->stash_head = r->stash_len = 0;
	free(r->pending);
	r->pending = NULL;
	r->n_pending = 0;
	r->in_flight = 0;
	r->rings_open = false;
}


int radiance__client_rings_abandon(struct radiance *r, int err, const char *why)
{
	if (!r->rings_open)
		return 0;   /* nothing in flight; what is kept aside was abandoned before */
	struct radiance__client_stashed *old = r->stash;
	uint32_t head = r->stash_head, len = r->stash_len, cap = r->stash_cap;
	uint64_t *pending = r->pending;
	uint32_t n_pending = r->n_pending;
	r->stash = NULL;
	r->pending = NULL;
	r->n_pending = 0;
	radiance__client_rings_close(r);
	int rc = 0;
	struct radiance__client_stashed s = { .status = err };
	snprintf(s.error, sizeof s.error, "%s", why);
	for (uint32_t i = 0; i < len && rc == 0; i++) {
		s.request_id = old[(head + i) % cap].request_id;
		rc = radiance__client_stash_push(r, &s);
	}
	for (uint32_t i = 0; i < n_pending && rc == 0; i++) {
		s.request_id = pending[i];
		rc = radiance__client_stash_push(r, &s);
	}
	free(old);
	free(pending);
	return rc;
}

/* Maps the segment and checks the header against proto/shm.h. */
static int map_segment(struct radiance *r, int memfd, uint64_t segment_bytes)
{
	struct stat st;
	if (fstat(memfd, &st) < 0)
		return radiance__client_break(r, -errno, "fstat(segment): %s", strerror(errno));
	if (segment_bytes < RADIANCE_SHM_HEADER_BYTES || segment_bytes > (uint64_t)st.st_size ||
	    segment_bytes > SIZE_MAX)
		return radiance__client_break(r, -EPROTO, "segment of %llu bytes, memfd of %lld",
				       (unsigned long long)segment_bytes, (long long)st.st_size);
	void *p = mmap(NULL, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return radiance__client_break(r, -errno, "mmap(segment): %s", strerror(errno));
	r->segment = p;
	r->segment_bytes = segment_bytes;

	struct rshm_layout l;
	char why[384];
	if (rshm_layout_import(&l, p, segment_bytes, why, sizeof why) < 0)
		return radiance__client_break(r, -EPROTO, "bad shared segment header: %s", why);

	struct radiance_shm_header *sh = p;
	r->sq_entries = l.sq_entries;
	r->cq_entries = l.cq_entries;
	rring_init(&r->sq, &sh->sq, r->segment + l.sq_offset, l.sq_entries);
	rring_init(&r->cq, &sh->cq, r->segment + l.cq_offset, l.cq_entries);
	/* A fresh segment starts at 0/0; adopt what is there in case the
	 * daemon started elsewhere, and let the ring code range-check it. */
	r->sq.local = __atomic_load_n(&sh->sq.tail, __ATOMIC_ACQUIRE);
	r->cq.local = __atomic_load_n(&sh->cq.head, __ATOMIC_ACQUIRE);
	if (radiance__client_arena_init(&r->arena, r->segment + l.arena_offset, l.arena_bytes) < 0)
		return radiance__client_fail(r, -ENOMEM, "out of memory");
	return 0;
}

static int open_rings(struct radiance *r)
{
	int rc0 = radiance__client_usable(r);
	if (rc0 < 0)
		return rc0;
	if (r->rings_open)
		return 0;
	Rdw__OpenRing open = RDW__OPEN_RING__INIT;
	open.sq_entries = r->want_sq;
	open.cq_entries = r->want_cq;
	open.arena_bytes = r->want_arena;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_OPEN_RING;
	msg.open_ring = &open;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_RING_READY) {
		rc = radiance__client_break(r, -EPROTO, "open_ring answered with %s",
				     rproto_server_name(reply));
		rdw__server_message__free_unpacked(reply, NULL);
		return rc;
	}
	uint64_t segment_bytes = reply->ring_ready->segment_bytes;
	rdw__server_message__free_unpacked(reply, NULL);

	int fds[RADIANCE_RING_READY_FDS];
	if (rconn_take_fds(&r->conn, fds, RADIANCE_RING_READY_FDS) < 0)
		return radiance__client_break(r, -EPROTO, "ring_ready without its descriptors");
	rconn_close_fds(&r->conn);
	r->sq_doorbell = fds[RADIANCE_FD_SQ_DOORBELL];
	r->cq_doorbell = fds[RADIANCE_FD_CQ_DOORBELL];
	rc = map_segment(r, fds[RADIANCE_FD_SEGMENT], segment_bytes);
	close(fds[RADIANCE_FD_SEGMENT]);   /* the mapping keeps it alive */
	if (rc < 0) {
		radiance__client_rings_close(r);
		return rc;
	}
	r->pending = calloc(r->cq_entries, sizeof *r->pending);
	if (!r->pending) {
		radiance__client_rings_close(r);
		return radiance__client_fail(r, -ENOMEM, "out of memory");
	}
	r->rings_open = true;
	if ((rc = radiance__client_watch(r, r->cq_doorbell)) < 0) {
		radiance__client_rings_close(r);
		return radiance__client_fail(r, rc, "epoll_ctl(CQ doorbell): %s", strerror(-rc));
	}
	if (r->epfd >= 0)
		rring_prepare_sleep(&r->cq);   /* radiance_get_fd(): ring on completions */
	radiance__client_log(r, LOG_DEBUG, "rings open: sq %u, cq %u, arena %llu bytes",
		      r->sq_entries, r->cq_entries, (unsigned long long)r->arena.bytes);
	return 0;
}

int radiance_open_rings(struct radiance *r)
{
	RADIANCE__GUARDED(r, open_rings(r));
}

int radiance_get_ring_info(const struct radiance *r, struct radiance_ring_info *info)
{
	if (!r->rings_open)
		return -ENOTCONN;
	*info = (struct radiance_ring_info){
		.sq_entries = r->sq_entries,
		.cq_entries = r->cq_entries,
		.arena_bytes = r->arena.bytes,
		.arena = r->arena.base,
	};
	return 0;
}

/* --- arena ---------------------------------------------------------------- */

static void *arena_alloc(struct radiance *r, size_t bytes)
{
	int rc = open_rings(r);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	if (bytes == 0) {
		radiance__client_fail(r, -EINVAL, "radiance_arena_alloc: 0 bytes asked for");
		errno = EINVAL;
		return NULL;
	}
	void *p = radiance__client_arena_alloc(&r->arena, bytes);
	if (!p) {
		radiance__client_fail(r, -ENOMEM, "arena: no free extent of %zu bytes (largest %llu)", bytes,
			       (unsigned long long)radiance__client_arena_largest_free(&r->arena));
		errno = ENOMEM;
	}
	return p;
}

void *radiance_arena_alloc(struct radiance *r, size_t bytes)
{
	int rc = radiance__client_enter(r, __func__);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	void *p = arena_alloc(r, bytes);
	int e = errno;
	radiance__client_leave(r);
	errno = e;
	return p;
}

void radiance_arena_free(struct radiance *r, void *p)
{
	if (!p)
		return;
	if (radiance__client_enter(r, __func__) < 0) {
		/* no return value to say it: the log callback is the only way */
		radiance__client_log(r, LOG_ERR, "%s (the block at %p stays allocated)",
				     radiance_error_message(r), p);
		return;
	}
	if (!r->rings_open || radiance__client_arena_free(&r->arena, p) < 0)
		radiance__client_log(r, LOG_WARNING, "radiance_arena_free(%p): not an arena block", p);
	radiance__client_leave(r);
}

/* --- submit --------------------------------------------------------------- */

static int check_buffer(struct radiance *r, const void *p, uint64_t bytes, uint64_t *off,
			const char *what)
{
	const uint8_t *b = p;
	if (!b || b < r->arena.base || b >= r->arena.base + r->arena.bytes ||
	    !within((uint64_t)(b - r->arena.base), bytes, 0, r->arena.bytes))
		return radiance__client_fail(r, -EFAULT, "%s (%llu bytes at %p) not inside the arena", what,
				      (unsigned long long)bytes, p);
	*off = (uint64_t)(b - r->arena.base);
	if (*off % RADIANCE_ARENA_ALIGN)
		return radiance__client_fail(r, -EINVAL, "%s not %u-byte aligned", what, RADIANCE_ARENA_ALIGN);
	return 0;
}

/* Opens the rings if need be and finds layer `layer` of held model
 * model_id: 0 with *out set, or the error (recorded on r). */
static int held_layer(struct radiance *r, uint32_t model_id, uint32_t layer,
		      const struct radiance_layer_info **out)
{
	int rc = open_rings(r);
	if (rc < 0)
		return rc;
	const struct radiance__client_held *h = radiance__client_find_held(r, model_id);
	if (!h)
		return radiance__client_fail(r, -ENOENT, "this session holds no model %u", model_id);
	if (layer >= h->info->n_layers)
		return radiance__client_fail(r, -ENOENT, "layer %u is out of range: model %u has "
					     "%zu layers, indexed from 0", layer, model_id,
					     h->info->n_layers);
	*out = &h->info->layers[layer];
	return 0;
}

_Static_assert(RADIANCE_MAX_LAYERS_PER_REQUEST == RADIANCE_MAX_REQUEST_LAYERS,
	       "the public limit is the wire's");

/* The layers of a request of several: the daemon takes them, and each
 * index is held, named once, of one K. 0 with l[0..n) set, or the error
 * (recorded on r). */
static int held_layers(struct radiance *r, uint32_t model_id, const uint32_t *layers, uint32_t n,
		       const struct radiance_layer_info **l)
{
	if (r->server.max_request_layers == 0)
		return radiance__client_fail(r, -ENOTSUP, "several layers in one request are not "
					     "supported by this daemon (radianced %s predates them)",
					     r->server.server_version);
	if (n == 0 || n > r->server.max_request_layers)
		return radiance__client_fail(r, -EINVAL, "%u layers in one request: 1..%u", n,
					     r->server.max_request_layers);
	if (!layers)
		return radiance__client_fail(r, -EINVAL, "layers is NULL");
	for (uint32_t i = 0; i < n; i++) {
		int rc = held_layer(r, model_id, layers[i], &l[i]);
		if (rc == -ENOENT) {
			char why[256];
			snprintf(why, sizeof why, "%s", radiance_error_message(r));
			return radiance__client_fail(r, rc, "layers[%u]: %s", i, why);
		}
		if (rc < 0)
			return rc;
		for (uint32_t j = 0; j < i; j++)
			if (layers[j] == layers[i])
				return radiance__client_fail(r, -EINVAL, "layers[%u] = %u (%s) repeats "
							     "layers[%u]", i, layers[i], l[i]->name, j);
		if (l[i]->k != l[0]->k)
			return radiance__client_fail(r, -EINVAL, "layers[%u] = %u (%s) has K=%u but "
						     "layers[0] = %u (%s) K=%u: the layers of one "
						     "request share x", i, layers[i], l[i]->name,
						     l[i]->k, layers[0], l[0]->name, l[0]->k);
	}
	return 0;
}

/* Submits layers[0..n) (l: their infos, checked) on x, y[j] for layer j.
 * user: radiance_submit(_multi)'s (tracked in pending), not
 * radiance_linear(_multi)'s. */
static int submit_layers(struct radiance *r, uint32_t model_id, const uint32_t *layers,
			 const struct radiance_layer_info *const *l, uint32_t n, uint32_t rows,
			 enum radiance_elem dtype, const void *x, void *const *y, uint64_t *request_id,
			 bool user)
{
	int rc;
	if (rows == 0 || rows > r->server.max_rows)
		return radiance__client_fail(r, -EINVAL, "rows %u outside 1..%u", rows, r->server.max_rows);
	if (dtype != RADIANCE_BF16 && dtype != RADIANCE_FP16)
		return radiance__client_fail(r, -EINVAL, "dtype %d", (int)dtype);
	uint64_t in_off, out_off[RADIANCE_MAX_REQUEST_LAYERS];
	if ((rc = check_buffer(r, x, (uint64_t)rows * l[0]->k * 2, &in_off, "x")) < 0)
		return rc;
	for (uint32_t i = 0; i < n; i++) {
		char what[16];
		snprintf(what, sizeof what, n == 1 ? "y" : "y[%u]", i);
		if ((rc = check_buffer(r, y[i], (uint64_t)rows * l[i]->n * 2, &out_off[i], what)) < 0)
			return rc;
	}
	if (r->in_flight >= r->cq_entries)
		return -EAGAIN;

	Rdw__LinearRequest req = RDW__LINEAR_REQUEST__INIT;
	req.request_id = r->next_request_id;
	req.model_id = model_id;
	req.layer = layers[0];
	req.rows = rows;
	req.dtype = (Rdw__DType)dtype;
	req.input_offset = in_off;
	req.output_offset = out_off[0];
	/* only a request of several layers carries the lists: a one-layer
	 * request is the bytes an older daemon knows */
	uint32_t extra[RADIANCE_MAX_REQUEST_LAYERS];
	for (uint32_t i = 1; i < n; i++)
		extra[i - 1] = layers[i];
	req.n_extra_layers = req.n_extra_output_offsets = n - 1;
	req.extra_layers = extra;
	req.extra_output_offsets = out_off + 1;
	uint8_t slot[RADIANCE_SLOT_BYTES - 4];
	int len = rproto_pack_slot(&req.base, slot, sizeof slot);
	if (len < 0)
		return radiance__client_fail(r, len, "request does not fit a slot");
	rc = rring_push(&r->sq, slot, (size_t)len);
	if (rc == -EAGAIN)
		return rc;
	if (rc < 0)
		return radiance__client_break(r, -EPROTO, "the SQ head in shared memory is out of range (only the daemon "
					      "writes it: a stray write in this process, or a daemon bug)");
	if (rring_needs_wakeup(&r->sq) && (rc = rdoorbell_ring(r->sq_doorbell)) < 0)
		return radiance__client_break(r, rc, "SQ doorbell: %s", strerror(-rc));
	r->in_flight++;
	if (user)
		r->pending[r->n_pending++] = r->next_request_id;
	if (request_id)
		*request_id = r->next_request_id;
	r->next_request_id++;
	return 0;
}

static int submit(struct radiance *r, uint32_t model_id, uint32_t layer, uint32_t rows,
		  enum radiance_elem dtype, const void *x, void *y, uint64_t *request_id, bool user)
{
	const struct radiance_layer_info *l;
	int rc = held_layer(r, model_id, layer, &l);
	if (rc < 0)
		return rc;
	return submit_layers(r, model_id, &layer, &l, 1, rows, dtype, x, &y, request_id, user);
}

static int submit_multi(struct radiance *r, uint32_t model_id, const uint32_t *layers, uint32_t n,
			uint32_t rows, enum radiance_elem dtype, const void *x, void *const *y,
			uint64_t *request_id)
{
	const struct radiance_layer_info *l[RADIANCE_MAX_REQUEST_LAYERS];
	int rc = held_layers(r, model_id, layers, n, l);
	if (rc < 0)
		return rc;
	if (!y)
		return radiance__client_fail(r, -EINVAL, "y is NULL");
	return submit_layers(r, model_id, layers, l, n, rows, dtype, x, y, request_id, true);
}

int radiance_submit_multi(struct radiance *r, uint32_t model_id, const uint32_t *layers,
			  uint32_t nlayers, uint32_t rows, enum radiance_elem dtype, const void *x,
			  void *const *y, uint64_t *request_id)
{
	RADIANCE__GUARDED(r, submit_multi(r, model_id, layers, nlayers, rows, dtype, x, y,
					  request_id));
}

int radiance_submit(struct radiance *r, uint32_t model_id, uint32_t layer, uint32_t rows,
		    enum radiance_elem dtype, const void *x, void *y, uint64_t *request_id)
{
	RADIANCE__GUARDED(r, submit(r, model_id, layer, rows, dtype, x, y, request_id, true));
}

unsigned radiance_in_flight(const struct radiance *r)
{
	return r->in_flight + r->stash_len;
}

/* --- completions ---------------------------------------------------------- */

/* Takes one result off the CQ. 1, 0 when empty, or a sticky error. */
int radiance__client_reap_one(struct radiance *r, struct radiance__client_stashed *out)
{
	uint8_t slot[RADIANCE_SLOT_BYTES];
	int len = rring_pop(&r->cq, slot);
	if (len == 0)
		return 0;
	if (len < 0)
		return radiance__client_break(r, -EPROTO, "the CQ in shared memory is corrupted (its entries and tail "
					      "are the daemon's: a stray write in this process, or a daemon bug)");
	struct rproto_bump bump;
	rproto_bump_reset(&bump);
	ProtobufCAllocator alloc = rproto_bump_allocator(&bump);
	Rdw__LinearResult *res = rdw__linear_result__unpack(&alloc, (size_t)len, slot);
	if (!res)
		return radiance__client_break(r, -EPROTO, "undecodable CQ entry (%d bytes)", len);
	if (r->in_flight == 0)
		return radiance__client_break(r, -EPROTO, "completion for nothing in flight");
	r->in_flight--;
	for (uint32_t i = r->n_pending; i-- > 0;) {
		if (r->pending[i] == res->request_id) {
			r->pending[i] = r->pending[--r->n_pending];
			break;
		}
	}
	out->request_id = res->request_id;
	out->status = res->status == 0 ? 0 : (res->status > 0 && res->status < 4096 ? -res->status : -EIO);
	out->queue_ns = res->queue_ns;
	out->exec_ns = res->exec_ns;
	snprintf(out->error, sizeof out->error, "%s", res->error ? res->error : "");
	return 1;   /* res lives in the bump buffer: nothing to free */
}

/* Waits for one result off the CQ: spin, then sleep on the CQ doorbell
 * while watching the control socket. timeout_ms -1: forever. 1, -ETIMEDOUT,
 * or a sticky error. */
static int reap_wait(struct radiance *r, struct radiance__client_stashed *out, int timeout_ms)
{
	int rc = radiance__client_reap_one(r, out);
	if (rc != 0 || timeout_ms == 0)
		return rc ? rc : -ETIMEDOUT;
	uint64_t start = rclock_ns();
	uint64_t spin_end = start + (uint64_t)r->spin_us * 1000u;
	uint64_t deadline = timeout_ms > 0 ? start + (uint64_t)timeout_ms * 1000000u : UINT64_MAX;
	while (rclock_ns() < spin_end) {
		for (int i = 0; i < 64; i++)
			rring_cpu_relax();
		if ((rc = radiance__client_reap_one(r, out)) != 0)
			return rc;
	}
	for (;;) {
		if (rring_prepare_sleep(&r->cq)) {
			struct pollfd p[2] = {
				{ .fd = r->cq_doorbell, .events = POLLIN },
				{ .fd = r->conn.fd, .events = POLLIN },
			};
			int left = -1;
			if (deadline != UINT64_MAX) {
				uint64_t now = rclock_ns();
				left = now >= deadline ? 0 : (int)((deadline - now + 999999u) / 1000000u);
			}
			int n = poll(p, 2, left);
			int err = errno;
			rring_end_sleep(&r->cq);
			if (n < 0 && err != EINTR)
				return radiance__client_break(r, -err, "poll: %s", strerror(err));
			if (n > 0 && (p[0].revents & POLLIN))
				rdoorbell_drain(r->cq_doorbell);
			if (n > 0 && (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) &&
			    !(p[0].revents & POLLIN)) {
				/* the daemon closed its end of the doorbell pipe: the
				 * session is over (what it completed is still ours) */
				if ((rc = radiance__client_reap_one(r, out)) != 0)
					return rc;
				if (!p[1].revents)
					return radiance__client_break(r, -ECONNRESET,
								      "the daemon closed the CQ doorbell");
			}
			if (n > 0 && p[1].revents) {
				/* Results written before the daemon ended the
				 * session are still valid: take them first. */
				if ((rc = radiance__client_reap_one(r, out)) != 0)
					return rc;
				if ((rc = radiance__client_socket_event(r)) < 0)
					return rc == -ESHUTDOWN && radiance__client_reap_one(r, out) == 1 ? 1 : rc;
			}
		}
		if ((rc = radiance__client_reap_one(r, out)) != 0)
			return rc;
		if (rclock_ns() >= deadline)
			return -ETIMEDOUT;
	}
}

/* Keeps a completion for a later poll/wait. The stash grows: a caller may
 * leave completions unreaped while it submits more (only the requests in
 * flight are bounded by the CQ), so there is no fixed bound. */
int radiance__client_stash_push(struct radiance *r, const struct radiance__client_stashed *s)
{
	if (r->stash_len == r->stash_cap) {
		uint32_t cap = r->stash_cap ? 2 * r->stash_cap : 16;
		struct radiance__client_stashed *p = malloc((size_t)cap * sizeof *p);
		if (!p)
			return radiance__client_break(r, -ENOMEM, "out of memory keeping a completion");
		for (uint32_t i = 0; i < r->stash_len; i++)
			p[i] = r->stash[(r->stash_head + i) % r->stash_cap];
		free(r->stash);
		r->stash = p;
		r->stash_cap = cap;
		r->stash_head = 0;
	}
	r->stash[(r->stash_head + r->stash_len) % r->stash_cap] = *s;
	r->stash_len++;
	return 0;
}

static void deliver(struct radiance *r, const struct radiance__client_stashed *s,
		    struct radiance_completion *c)
{
	memset(c, 0, sizeof *c);
	c->request_id = s->request_id;
	c->status = s->status;
	c->queue_ns = s->queue_ns;
	c->exec_ns = s->exec_ns;
	if (s->status) {
		snprintf(r->completion_error, sizeof r->completion_error, "%s",
			 s->error[0] ? s->error : radiance_strerror(s->status));
		c->error = r->completion_error;
		radiance__client_fail(r, s->status, "request %llu: %s", (unsigned long long)s->request_id,
			       r->completion_error);
	}
}

static bool stash_pop(struct radiance *r, struct radiance_completion *c)
{
	if (!r->stash_len)
		return false;
	deliver(r, &r->stash[r->stash_head], c);
	r->stash_head = (r->stash_head + 1) % r->stash_cap;
	r->stash_len--;
	return true;
}

/* After a Goodbye (-ESHUTDOWN) the daemon has posted every result it
 * owed: what is stashed or in the CQ is still delivered, without waiting;
 * 1 with *c set, else the sticky error. */
static int after_goodbye(struct radiance *r, int err, struct radiance_completion *c)
{
	if (err != -ESHUTDOWN || !r->rings_open)
		return err;
	if (stash_pop(r, c))
		return 1;
	struct radiance__client_stashed s;
	if (r->in_flight && radiance__client_reap_one(r, &s) == 1) {
		deliver(r, &s, c);
		return 1;
	}
	/* a failed completion's text may have replaced why: say it again */
	memcpy(r->message, r->broken, sizeof r->message);
	return err;
}

static int poll_one(struct radiance *r, struct radiance_completion *c)
{
	int rc0 = radiance__client_usable(r);
	if (rc0 < 0)
		return after_goodbye(r, rc0, c);
	if (stash_pop(r, c))
		return 1;
	if (!r->rings_open)
		return 0;
	struct radiance__client_stashed s;
	int rc = radiance__client_reap_one(r, &s);
	if (rc == 1)
		deliver(r, &s, c);
	return rc;
}

int radiance_poll(struct radiance *r, struct radiance_completion *c)
{
	RADIANCE__GUARDED(r, poll_one(r, c));
}

static int wait_one(struct radiance *r, struct radiance_completion *c, int timeout_ms)
{
	int rc0 = radiance__client_usable(r);
	if (rc0 < 0)
		return after_goodbye(r, rc0, c);
	if (stash_pop(r, c))
		return 1;
	if (!r->rings_open || r->in_flight == 0)
		return -ENOENT;
	struct radiance__client_stashed s;
	int rc = reap_wait(r, &s, timeout_ms < 0 ? -1 : timeout_ms);
	if (rc == 1)
		deliver(r, &s, c);
	return rc;
}

int radiance_wait(struct radiance *r, struct radiance_completion *c, int timeout_ms)
{
	RADIANCE__GUARDED(r, wait_one(r, c, timeout_ms));
}

/* --- synchronous linear --------------------------------------------------- */

/* Submits, making room first by reaping (and stashing) others' completions. */
static int submit_room(struct radiance *r, uint32_t model_id, const uint32_t *layers,
		       const struct radiance_layer_info *const *l, uint32_t n, uint32_t rows,
		       enum radiance_elem dtype, const void *x, void *const *y, uint64_t *id)
{
	for (;;) {
		int rc = submit_layers(r, model_id, layers, l, n, rows, dtype, x, y, id, false);
		if (rc != -EAGAIN)
			return rc;
		if (r->in_flight == 0)
			return radiance__client_break(r, -EPROTO, "SQ full with nothing in flight");
		struct radiance__client_stashed s;
		if ((rc = reap_wait(r, &s, r->timeout_ms)) < 0 || (rc = radiance__client_stash_push(r, &s)) < 0)
			return rc;
	}
}

static int wait_for(struct radiance *r, uint64_t id, struct radiance__client_stashed *out)
{
	for (;;) {
		int rc = reap_wait(r, out, r->timeout_ms);
		if (rc < 0)
			return rc;
		if (out->request_id == id)
			return 0;
		if ((rc = radiance__client_stash_push(r, out)) < 0)
			return rc;
	}
}

static uint64_t arena_align(uint64_t v)
{
	return (v + RADIANCE__ARENA_ALIGN - 1) & ~(uint64_t)(RADIANCE__ARENA_ALIGN - 1);
}

/* radiance_linear(_multi) on layers[0..n) (l: their infos, checked). */
static int linear_layers(struct radiance *r, uint32_t model_id, const uint32_t *layers,
			 const struct radiance_layer_info *const *l, uint32_t n, uint32_t rows,
			 enum radiance_elem dtype, const void *x, void *const *y)
{
	int rc = 0;
	if (rows == 0 || !x || !y)
		return radiance__client_fail(r, -EINVAL, "rows 0 or NULL buffer");
	uint64_t in_row = (uint64_t)l[0]->k * 2, out_rows = 0;
	for (uint32_t j = 0; j < n; j++) {
		if (!y[j])
			return radiance__client_fail(r, -EINVAL, "rows 0 or NULL buffer");
		out_rows += (uint64_t)l[j]->n * 2;
	}
	uint64_t in_pad = arena_align(in_row);

	/* One staging block for x then every y, as many rows as fit. */
	uint32_t chunk = rows < r->server.max_rows ? rows : r->server.max_rows;
	uint64_t fit = radiance__client_arena_largest_free(&r->arena) /
		       (in_pad + out_rows + (uint64_t)n * RADIANCE__ARENA_ALIGN);
	if (fit < chunk)
		chunk = (uint32_t)fit;
	if (chunk == 0)
		return radiance__client_fail(r, -ENOMEM, "the arena cannot hold one row of layer %u%s",
					     layers[0], n > 1 ? " and the others of the request" : "");
	uint64_t off[RADIANCE_MAX_REQUEST_LAYERS + 1];
	off[0] = 0;
	for (uint32_t j = 0; j < n; j++)
		off[j + 1] = off[j] + arena_align((uint64_t)chunk * (j ? l[j - 1]->n * 2 : in_row));
	uint64_t total = off[n] + (uint64_t)chunk * l[n - 1]->n * 2;
	uint8_t *stage = radiance__client_arena_alloc(&r->arena, total);
	if (!stage)
		return radiance__client_fail(r, -ENOMEM, "arena exhausted");
	void *ys[RADIANCE_MAX_REQUEST_LAYERS];
	for (uint32_t j = 0; j < n; j++)
		ys[j] = stage + off[j + 1];

	for (uint32_t done = 0; done < rows;) {
		uint32_t m = rows - done < chunk ? rows - done : chunk;
		uint64_t id;
		memcpy(stage, (const uint8_t *)x + done * in_row, m * in_row);
		if ((rc = submit_room(r, model_id, layers, l, n, m, dtype, stage, ys, &id)) < 0)
			break;
		struct radiance__client_stashed s;
		if ((rc = wait_for(r, id, &s)) < 0)
			break;
		if (s.status) {
			snprintf(r->completion_error, sizeof r->completion_error, "%s", s.error);
			rc = radiance__client_fail(r, s.status, "layer %u%s: %s", layers[0],
						   n > 1 ? " and the others of the request" : "",
						   s.error[0] ? s.error : radiance_strerror(s.status));
			break;
		}
		for (uint32_t j = 0; j < n; j++) {
			uint64_t out_row = (uint64_t)l[j]->n * 2;
			memcpy((uint8_t *)y[j] + done * out_row, ys[j], m * out_row);
		}
		done += m;
	}
	/* After a sticky error the request may still be running in the daemon;
	 * its memory then stays allocated until disconnect. */
	if (!r->error)
		radiance__client_arena_free(&r->arena, stage);
	return rc;
}

static int linear(struct radiance *r, uint32_t model_id, uint32_t layer, uint32_t rows,
		  enum radiance_elem dtype, const void *x, void *y)
{
	const struct radiance_layer_info *l;
	int rc = held_layer(r, model_id, layer, &l);
	if (rc < 0)
		return rc;
	return linear_layers(r, model_id, &layer, &l, 1, rows, dtype, x, &y);
}

static int linear_multi(struct radiance *r, uint32_t model_id, const uint32_t *layers, uint32_t n,
			uint32_t rows, enum radiance_elem dtype, const void *x, void *const *y)
{
	const struct radiance_layer_info *l[RADIANCE_MAX_REQUEST_LAYERS];
	int rc = held_layers(r, model_id, layers, n, l);
	if (rc < 0)
		return rc;
	return linear_layers(r, model_id, layers, l, n, rows, dtype, x, y);
}

int radiance_linear_multi(struct radiance *r, uint32_t model_id, const uint32_t *layers,
			  uint32_t nlayers, uint32_t rows, enum radiance_elem dtype, const void *x,
			  void *const *y)
{
	RADIANCE__GUARDED(r, linear_multi(r, model_id, layers, nlayers, rows, dtype, x, y));
}

int radiance_linear(struct radiance *r, uint32_t model_id, uint32_t layer, uint32_t rows,
		    enum radiance_elem dtype, const void *x, void *y)
{
	RADIANCE__GUARDED(r, linear(r, model_id, layer, rows, dtype, x, y));
}
