/* A client's control-plane state and its shared-memory rings. */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "limit.h"
#include "log.h"
#include "map.h"
#include "proto_util.h"
#include "server.h"
#include "session_tensors.h"
#include "shm.h"
#include "shm_layout.h"
#include "text.h"
#include "wire.h"

/* ModelInfo of a resident model. Pointers go into the model (immutable);
 * the arrays are malloc'ed here and freed by model_info_free(). */
struct model_info {
	Rdw__ModelInfo mi;
	Rdw__LayerInfo *layers;
	Rdw__LayerInfo **layer_ptrs;
	Rdw__TensorInfo *tensors;
	Rdw__TensorInfo **tensor_ptrs;
};

static void model_info_free(struct model_info *info)
{
	free(info->layers);
	free(info->layer_ptrs);
	free(info->tensors);
	free(info->tensor_ptrs);
}

static int model_info_fill(struct model_info *info, struct radiance_resident *res, int detailed)
{
	const struct radiance_model *m = res->em.model;
	memset(info, 0, sizeof *info);
	rdw__model_info__init(&info->mi);
	info->mi.model_id = res->em.id;
	info->mi.name = res->name;
	info->mi.resident_bytes = m->resident_bytes;
	info->mi.preloaded = res->preloaded;
	info->mi.users = res->users;
	if (!detailed)
		return 0;
	size_t nl = m->n_layers, nt = m->n_other;
	info->layers = calloc(nl ? nl : 1, sizeof *info->layers);
	info->layer_ptrs = calloc(nl ? nl : 1, sizeof *info->layer_ptrs);
	info->tensors = calloc(nt ? nt : 1, sizeof *info->tensors);
	info->tensor_ptrs = calloc(nt ? nt : 1, sizeof *info->tensor_ptrs);
	if (!info->layers || !info->layer_ptrs || !info->tensors || !info->tensor_ptrs) {
		model_info_free(info);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nl; i++) {
		const struct radiance_layer *l = &m->layers[i];
		Rdw__LayerInfo *li = &info->layers[i];
		rdw__layer_info__init(li);
		li->index = (uint32_t)i;
		li->name = l->name;
		li->kind = l->kind == RADIANCE_LAYER_W4A8 ? RDW__LAYER_KIND__LAYER_KIND_W4A8
							  : RDW__LAYER_KIND__LAYER_KIND_BF16;
		li->n = l->n;
		li->k = l->k;
		li->has_bias = l->bias != NULL;
		li->bytes = l->bytes;
		info->layer_ptrs[i] = li;
	}
	for (size_t i = 0; i < nt; i++) {
		const struct radiance_tensor_info *t = &m->other[i];
		Rdw__TensorInfo *ti = &info->tensors[i];
		rdw__tensor_info__init(ti);
		ti->name = t->name;
		ti->dtype = (char *)t->dtype;
		ti->n_shape = t->ndim <= 8 ? t->ndim : 8;
		ti->shape = (uint64_t *)t->shape;
		info->tensor_ptrs[i] = ti;
	}
	info->mi.n_layers = nl;
	info->mi.layers = info->layer_ptrs;
	info->mi.n_other_tensors = nt;
	info->mi.other_tensors = info->tensor_ptrs;
	return 0;
}

static void send_model_info(struct radiance_session *s, uint64_t tag, struct radiance_resident *res)
{
	struct model_info info;
	if (model_info_fill(&info, res, 1) < 0) {
		session_reply_error(s, tag, ENOMEM, "out of memory describing model %u", res->em.id);
		return;
	}
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_MODEL_INFO;
	m.model_info = &info.mi;
	session_reply(s, &m, NULL, 0);
	model_info_free(&info);
}

/* ---- model references ---- */

static int session_has_model(struct radiance_session *s, struct radiance_resident *res)
{
	for (size_t i = 0; i < s->nmodels; i++)
		if (s->models[i] == res)
			return 1;
	return 0;
}

/* Records a reference the caller already took on res (registry_ref or a
 * load's waiter); a second reference to the same model is dropped again. */
static int session_add_model(struct radiance_session *s, struct radiance_resident *res)
{
	if (session_has_model(s, res)) {
		registry_unref(res);
		return 0;
	}
	if (s->nmodels == s->models_cap) {
		size_t cap = s->models_cap ? s->models_cap * 2 : 4;
		struct radiance_resident **v = realloc(s->models, cap * sizeof *v);
		if (!v)
			goto oom;
		s->models = v;
		s->models_cap = cap;
	}
	if (exec_refs_add(&s->refs, &res->em) < 0)
		goto oom;
	s->models[s->nmodels++] = res;
	log_info("session %llu: uses model %u '%s' (%u users)", (unsigned long long)s->id,
		 res->em.id, res->name, res->users);
	return 0;
oom:
	registry_unref(res);
	return -ENOMEM;
}

static void session_drop_model(struct radiance_session *s, size_t i)
{
	struct radiance_resident *res = s->models[i];
	exec_refs_remove(&s->refs, res->em.id);
	s->models[i] = s->models[--s->nmodels];
	registry_unref(res);
}

/* ---- async completions ---- */

static void session_idle(struct radiance_session *s)
{
	s->busy = 0;
	session_update(s);
}

static void on_load_progress(struct registry_waiter *w, uint64_t done, uint64_t total)
{
	struct radiance_session *s = (struct radiance_session *)((char *)w -
				      offsetof(struct radiance_session, waiter));
	Rdw__LoadProgress p = RDW__LOAD_PROGRESS__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	p.done_bytes = done;
	p.total_bytes = total;
	m.tag = s->busy_tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS;
	m.load_progress = &p;
	session_reply(s, &m, NULL, 0);
}

static void on_load_done(struct registry_waiter *w, struct radiance_resident *res, int status,
			 const char *err)
{
	struct radiance_session *s = (struct radiance_session *)((char *)w -
				      offsetof(struct radiance_session, waiter));
	s->waiting = 0;
	if (status < 0) {
		session_reply_error(s, s->busy_tag, -status, "%s", err ? err : strerror(-status));
	} else if (session_add_model(s, res) < 0) {
		session_reply_error(s, s->busy_tag, ENOMEM, "out of memory");
	} else {
		send_model_info(s, s->busy_tag, res);
	}
	session_idle(s);
}

/* ---- handlers ---- */

static void handle_hello(struct radiance_session *s, uint64_t tag, const Rdw__Hello *h)
{
	if (s->state != SESSION_HANDSHAKE) {
		session_close(s, 1, "a second Hello");
		return;
	}
	uv_timer_stop(&s->hello_timer);
	if (h->client_name) {
		size_t i = 0;
		for (; h->client_name[i] && i < sizeof s->client_name - 1; i++) {
			char c = h->client_name[i];
			s->client_name[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
		}
		s->client_name[i] = 0;
	}
	if (h->protocol_version != RADIANCE_PROTOCOL_VERSION) {
		session_reply_error(s, tag, EPROTONOSUPPORT,
				    "protocol version %u is not supported (radianced %s speaks %u)",
				    h->protocol_version, RADIANCE_VERSION, RADIANCE_PROTOCOL_VERSION);
		session_close(s, 0, "client '%s' speaks protocol %u, not %u", s->client_name,
			      h->protocol_version, RADIANCE_PROTOCOL_VERSION);
		return;
	}
	const struct radiance_backend_info *bi = executor_backend_info(s->server->exec);
	Rdw__Welcome w = RDW__WELCOME__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	w.protocol_version = RADIANCE_PROTOCOL_VERSION;
	w.server_version = RADIANCE_VERSION;
	w.backend = (char *)bi->name;
	w.device = (char *)bi->device;
	w.session_id = s->id;
	w.max_rows = s->server->cfg->max_rows;
	w.map_layout_version = RADIANCE_MAP_LAYOUT_VERSION;
	w.tensors_version = RADIANCE_TENSORS_VERSION;
	w.max_request_layers = RADIANCE_MAX_REQUEST_LAYERS;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_WELCOME;
	m.welcome = &w;
	s->state = SESSION_READY;
	log_info("session %llu: hello from '%s' (pid %d uid %u)", (unsigned long long)s->id,
		 s->client_name, (int)s->pid, (unsigned)s->uid);
	session_reply(s, &m, NULL, 0);
}

static void handle_load(struct radiance_session *s, uint64_t tag, const Rdw__LoadModel *lm,
			const int *fds, size_t nfds)
{
	struct radiance_file files[RADIANCE_MAX_FDS];
	char err[512];
	for (size_t i = 0; i < nfds; i++)
		files[i] = (struct radiance_file){ lm->file_names[i], fds[i] };
	memset(&s->waiter, 0, sizeof s->waiter);
	s->waiter.session_id = s->id;
	s->waiter.uid = s->uid;
	s->waiter.progress = on_load_progress;
	s->waiter.done = on_load_done;
	s->busy = 1;
	s->busy_tag = tag;
	s->waiting = 1;
	const char *name = lm->name && *lm->name ? lm->name : NULL;
	int rc = registry_load_files(s->server->reg, files, nfds, name, &s->waiter, err, sizeof err);
	if (rc < 0) {
		s->busy = 0;
		s->waiting = 0;
		session_reply_error(s, tag, -rc, "%s", err);
	}
}

static void handle_attach(struct radiance_session *s, uint64_t tag, const Rdw__AttachModel *a)
{
	const char *name = a->name ? a->name : "";
	char err[512];
	/* it goes into the log and the reply: never as the client wrote it */
	if (rtext_check_model_name("AttachModel.name", name, REGISTRY_NAME_MAX, err,
				   sizeof err) < 0) {
		session_reply_error(s, tag, EINVAL, "%s", err);
		return;
	}
	struct radiance_resident *res = registry_find_name(s->server->reg, name);
	if (!res) {
		session_reply_error(s, tag, ENOENT, "no model named '%s' is resident", name);
		return;
	}
	registry_ref(res);
	if (session_add_model(s, res) < 0) {
		session_reply_error(s, tag, ENOMEM, "out of memory");
		return;
	}
	send_model_info(s, tag, res);
}

static void handle_release(struct radiance_session *s, uint64_t tag,
			   const Rdw__ReleaseModel *rel)
{
	uint32_t model_id = rel->model_id;
	if (rel->drop_preload) {
		/* the daemon's own hold: for the people who could edit its config */
		struct radiance_resident *res = registry_find_id(s->server->reg, model_id);
		if (!res || !res->preloaded) {
			session_reply_error(s, tag, ENOENT, "model_id %u is not a preloaded model", model_id);
			return;
		}
		if (s->uid != 0 && s->uid != geteuid()) {
			session_reply_error(s, tag, EPERM, "model %u is preloaded; only root%s may unload it "
					    "(peer uid %u)", model_id, geteuid() ? " or the daemon's user" : "",
					    (unsigned)s->uid);
			return;
		}
		log_info("session %llu (uid %u): unloads preloaded model %u '%s'",
			 (unsigned long long)s->id, (unsigned)s->uid, model_id, res->name);
		registry_unpin(res);
		session_reply_ok(s, tag);
		return;
	}
	if (session_maps_has(&s->maps, model_id)) {
		session_reply_error(s, tag, EBUSY, "model %u is mapped by this session: unmap it first "
				    "(UnmapModel, radiance_gpu_unmap)", model_id);
		return;
	}
	for (size_t i = 0; i < s->nmodels; i++) {
		if (s->models[i]->em.id == model_id) {
			log_info("session %llu: releases model %u", (unsigned long long)s->id, model_id);
			session_drop_model(s, i);
			session_reply_ok(s, tag);
			return;
		}
	}
	session_reply_error(s, tag, ENOENT, "model_id %u is not loaded by this session", model_id);
}

static void handle_get_model(struct radiance_session *s, uint64_t tag, uint32_t model_id)
{
	struct radiance_resident *res = registry_find_id(s->server->reg, model_id);
	if (!res) {
		session_reply_error(s, tag, ENOENT, "no resident model has model_id %u", model_id);
		return;
	}
	send_model_info(s, tag, res);
}

static void handle_list(struct radiance_session *s, uint64_t tag)
{
	size_t n = 0;
	for (struct radiance_resident *r = registry_next(s->server->reg, NULL); r;
	     r = registry_next(s->server->reg, r))
		n++;
	struct model_info *infos = calloc(n ? n : 1, sizeof *infos);
	Rdw__ModelInfo **ptrs = calloc(n ? n : 1, sizeof *ptrs);
	if (!infos || !ptrs) {
		free(infos);
		free(ptrs);
		session_reply_error(s, tag, ENOMEM, "out of memory");
		return;
	}
	size_t i = 0;
	for (struct radiance_resident *r = registry_next(s->server->reg, NULL); r && i < n;
	     r = registry_next(s->server->reg, r), i++) {
		model_info_fill(&infos[i], r, 0);
		ptrs[i] = &infos[i].mi;
	}
	Rdw__ModelList list = RDW__MODEL_LIST__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	list.n_models = n;
	list.models = ptrs;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_MODEL_LIST;
	m.model_list = &list;
	session_reply(s, &m, NULL, 0);
	free(infos);
	free(ptrs);
}

static void stats_msg_fill(struct radiance_session *s, Rdw__Stats *out)
{
	rdw__stats__init(out);
	stats_fill(&s->stats, out);
}

static void handle_stats(struct radiance_session *s, uint64_t tag)
{
	struct radiance_server *srv = s->server;
	Rdw__Stats global, mine;
	rdw__stats__init(&global);
	/* the histogram before the counters: the executor keeps recording, and
	 * this way the buckets rarely run ahead of `requests` */
	uint64_t le[STATS_COARSE], cum[STATS_COARSE];
	global.n_latency_le_ns = global.n_latency_cumulative =
		stats_histogram(&srv->stats, le, cum, STATS_COARSE);
	global.latency_le_ns = le;
	global.latency_cumulative = cum;
	stats_fill(&srv->stats, &global);
	/* live ones: a closing session (its client gone, its ring being taken
	 * down and its arena unpinned) is not, as for max_sessions */
	global.sessions = srv->nsessions - srv->nclosing;
	global.uptime_ns = rclock_ns() - srv->start_ns;
	stats_msg_fill(s, &mine);
	mine.uptime_ns = global.uptime_ns;

	size_t n = srv->nsessions;
	Rdw__SessionStats *ss = calloc(n ? n : 1, sizeof *ss);
	Rdw__SessionStats **ssp = calloc(n ? n : 1, sizeof *ssp);
	Rdw__Stats *st = calloc(n ? n : 1, sizeof *st);
	if (!ss || !ssp || !st) {
		free(ss);
		free(ssp);
		free(st);
		session_reply_error(s, tag, ENOMEM, "out of memory");
		return;
	}
	size_t i = 0;
	for (struct radiance_session *o = srv->sessions; o && i < n; o = o->next) {
		if (o->state == SESSION_CLOSING)
			continue;
		rdw__session_stats__init(&ss[i]);
		stats_msg_fill(o, &st[i]);
		ss[i].session_id = o->id;
		ss[i].client_name = o->client_name;
		ss[i].pid = o->pid;
		ss[i].uid = o->uid;
		/* what its ring's flow was given (handle_open_ring); the list
		 * is not reloaded, so it is this session's for its lifetime */
		ss[i].weight = config_uid_weight(srv->cfg, o->uid);
		ss[i].stats = &st[i];
		ssp[i] = &ss[i];
		i++;
	}
	Rdw__StatsReply reply = RDW__STATS_REPLY__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	reply.global = &global;
	reply.session = &mine;
	reply.n_sessions = i;
	reply.sessions = ssp;
	m.tag = tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_STATS;
	m.stats = &reply;
	session_reply(s, &m, NULL, 0);
	free(ss);
	free(ssp);
	free(st);
}

/* ---- the shared-memory segment ---- */

static void segment_release(struct radiance_session *s)
{
	if (s->segment)
		munmap(s->segment, s->segment_bytes);
	s->segment = NULL;
	if (s->memfd >= 0)
		close(s->memfd);
	s->memfd = -1;
	if (s->ring.sq_efd >= 0)
		close(s->ring.sq_efd);
	if (s->ring.cq_wfd >= 0)
		close(s->ring.cq_wfd);
	if (s->cq_rfd >= 0)
		close(s->cq_rfd);
	s->ring.sq_efd = s->ring.cq_wfd = s->cq_rfd = -1;
}

/* The last message of a session when the daemon stops: after the drain,
 * so every result is in the CQ before the client reads this. Closing the
 * socket before the CQ doorbell (segment_release) lets the client find
 * the Goodbye when it sees the doorbell hang up. */
static void session_goodbye(struct radiance_session *s)
{
	Rdw__Goodbye g = RDW__GOODBYE__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	g.reason = s->server->stop_reason;
	g.code = ESHUTDOWN;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_GOODBYE;
	m.goodbye = &g;
	session_reply(s, &m, NULL, 0);
	session_close(s, 0, "the daemon is stopping (%s)", s->server->stop_reason);
}

/* Answers an OpenRing that failed (s->ring_job's status and err, `what`
 * before them), with nothing of the ring left: the session may ask again. */
static void ring_open_failed(struct radiance_session *s, const char *what)
{
	session_reply_error(s, s->busy_tag, -s->ring_job.status, "%s: %s", what, s->ring_job.err);
	session_idle(s);
	if (s->server->stopping)
		session_goodbye(s);
}

static void on_unpinned(struct exec_pin *p)
{
	struct radiance_session *s = p->user;
	segment_release(s);
	s->ring_state = SESSION_RING_NONE;
	log_debug("session %llu: ring released", (unsigned long long)s->id);
	/* not closing: the ring was never served (its RING_ADD failed, or the
	 * daemon began stopping while the arena was pinned); the OpenRing
	 * waits for its answer until now, so that it can be asked again */
	if (s->state != SESSION_CLOSING) {
		if (s->ring_job.status < 0)
			ring_open_failed(s, "cannot open the ring");
		else if (s->server->stopping)
			session_goodbye(s);
	}
	session_maybe_free(s);
}

/* Unregisters the arena off the loop and the executor; the segment goes in
 * on_unpinned. */
static void session_ring_unpin(struct radiance_session *s)
{
	s->ring_state = SESSION_RING_UNPINNING;
	executor_unpin(s->server->exec, &s->pin, &s->ring, on_unpinned, s);
}

static void on_ring_removed(struct exec_job *job)
{
	struct radiance_session *s = job->user;
	if (s->state != SESSION_CLOSING && s->server->stopping)
		session_goodbye(s);
	/* the executor will not touch the arena again, nor will any launch */
	session_ring_unpin(s);
}

/* Hands the ring to the executor to take off its list (EXEC_JOB_RING_REMOVE);
 * the arena is unpinned once the executor no longer reads it, and the
 * segment released after that (on_unpinned). Not exec_jobs.c's ring_remove,
 * which does the taking off. */
static void session_ring_release(struct radiance_session *s)
{
	memset(&s->ring_job, 0, sizeof s->ring_job);
	s->ring_job.kind = EXEC_JOB_RING_REMOVE;
	s->ring_job.ring = &s->ring;
	s->ring_job.drain = s->server->stopping;
	s->ring_job.done = on_ring_removed;
	s->ring_job.user = s;
	s->ring_state = SESSION_RING_REMOVING;
	executor_submit(s->server->exec, &s->ring_job);
}

static void on_ring_broken(struct exec_job *job)
{
	struct radiance_session *s = job->user;
	session_close(s, 1, "%s", job->err);
}

static void on_ring_added(struct exec_job *job)
{
	struct radiance_session *s = job->user;
	if (job->status < 0) {
		session_ring_unpin(s);   /* then on_unpinned answers, with job's status */
		return;
	}
	s->ring_state = SESSION_RING_ACTIVE;
	if (s->state == SESSION_CLOSING || s->server->stopping) {
		session_ring_release(s);   /* nothing to drain; then the Goodbye */
		return;
	}
	Rdw__RingReady rr = RDW__RING_READY__INIT;
	Rdw__ServerMessage m = RDW__SERVER_MESSAGE__INIT;
	int fds[RADIANCE_RING_READY_FDS];
	fds[RADIANCE_FD_SEGMENT] = s->memfd;
	fds[RADIANCE_FD_SQ_DOORBELL] = s->ring.sq_efd;
	fds[RADIANCE_FD_CQ_DOORBELL] = s->cq_rfd;
	rr.segment_bytes = s->segment_bytes;
	m.tag = s->busy_tag;
	m.msg_case = RDW__SERVER_MESSAGE__MSG_RING_READY;
	m.ring_ready = &rr;
	log_info("session %llu: ring open: sq %u, cq %u, arena %llu bytes; uid %u, weight %u",
		 (unsigned long long)s->id, s->ring.sq.entries, s->ring.cq.entries,
		 (unsigned long long)s->ring.arena_bytes, (unsigned)s->uid,
		 config_uid_weight(s->server->cfg, s->uid));
	session_reply(s, &m, fds, RADIANCE_RING_READY_FDS);
	/* the client has its own copies of the memfd and of the CQ doorbell's
	 * read end now (queued with the message); ours are not needed */
	close(s->memfd);
	s->memfd = -1;
	close(s->cq_rfd);
	s->cq_rfd = -1;
	session_idle(s);
}

static void on_pinned(struct exec_pin *p)
{
	struct radiance_session *s = p->user;
	if (p->status < 0) {
		/* nothing registered (or the pin was taken back: closing) */
		s->ring_state = SESSION_RING_NONE;
		segment_release(s);
		if (s->state == SESSION_CLOSING) {
			session_maybe_free(s);   /* may free s */
			return;
		}
		s->ring_job.status = p->status;
		snprintf(s->ring_job.err, sizeof s->ring_job.err, "%s", p->err);
		ring_open_failed(s, "cannot register the arena");
		return;
	}
	if (s->state == SESSION_CLOSING || s->server->stopping) {
		session_ring_unpin(s);   /* never served; on_unpinned says Goodbye */
		return;
	}
	s->ring_state = SESSION_RING_ADDING;
	executor_submit(s->server->exec, &s->ring_job);
}

/* Whether an arena of `arena` bytes for s would cross max_total_arena_bytes
 * or max_arena_bytes_per_uid (then why says which). Every mapped segment
 * counts, a closing session's too: its memory is in use until the ring is
 * removed. */
static int arena_over_limit(struct radiance_session *s, uint64_t arena, char *why, size_t len)
{
	const struct radiance_config *cfg = s->server->cfg;
	uint64_t total = arena, mine = arena;
	for (const struct radiance_session *o = s->server->sessions; o; o = o->next) {
		if (!o->segment)
			continue;
		total += o->ring.arena_bytes;
		if (o->uid == s->uid)
			mine += o->ring.arena_bytes;
	}
	char doing[64], whose[48], size[32];
	limit_format_bytes(arena, size, sizeof size);
	snprintf(doing, sizeof doing, "opening the rings with a %s arena", size);
	/* the total first, as for model bytes: the per-uid limit defaults to it */
	if (cfg->max_total_arena_bytes && total > cfg->max_total_arena_bytes) {
		limit_refusal(why, len, doing, "all sessions'", "arena bytes", total,
			       "max_total_arena_bytes", cfg->max_total_arena_bytes, 1);
		return 1;
	}
	if (cfg->max_arena_bytes_per_uid && mine > cfg->max_arena_bytes_per_uid) {
		snprintf(whose, sizeof whose, "uid %u's", (unsigned)s->uid);
		limit_refusal(why, len, doing, whose, "arena bytes", mine, "max_arena_bytes_per_uid",
			       cfg->max_arena_bytes_per_uid, 1);
		return 1;
	}
	return 0;
}

static void handle_open_ring(struct radiance_session *s, uint64_t tag, const Rdw__OpenRing *o)
{
	const struct radiance_config *cfg = s->server->cfg;
	if (s->ring_state != SESSION_RING_NONE) {
		session_reply_error(s, tag, EBUSY, "this session's ring is already open");
		return;
	}
	uint32_t sq = o->sq_entries ? o->sq_entries : cfg->sq_entries;
	uint32_t cq = o->cq_entries ? o->cq_entries : (sq > cfg->sq_entries ? sq : cfg->sq_entries);
	uint64_t arena = o->arena_bytes ? o->arena_bytes : cfg->arena_bytes;
	/* The configuration narrows the protocol's limits; the layout itself
	 * (and its own checks) is proto/shm_layout.c's, shared with the client. */
	if (sq > cfg->max_sq_entries || cq > cfg->max_sq_entries) {
		session_reply_error(s, tag, EINVAL, "%s %u exceeds max_sq_entries %u",
			   sq > cfg->max_sq_entries ? "sq_entries" : "cq_entries",
			   sq > cfg->max_sq_entries ? sq : cq, cfg->max_sq_entries);
		return;
	}
	if (arena > cfg->max_arena_bytes) {
		session_reply_error(s, tag, EINVAL, "arena_bytes %llu exceeds the limit of %llu",
				    (unsigned long long)arena, (unsigned long long)cfg->max_arena_bytes);
		return;
	}
	struct rshm_layout l;
	char why[512];
	if (rshm_layout_compute(&l, sq, cq, arena, why, sizeof why) < 0) {
		session_reply_error(s, tag, EINVAL, "%s", why);
		return;
	}
	if (arena_over_limit(s, l.arena_bytes, why, sizeof why)) {
		session_reply_error(s, tag, EDQUOT, "%s", why);
		return;
	}
	uint64_t total = l.segment_bytes;

	char name[64];
	snprintf(name, sizeof name, "radiance-session-%llu", (unsigned long long)s->id);
	s->memfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->memfd < 0)
		goto fail_errno;
	if (ftruncate(s->memfd, (off_t)total) < 0)
		goto fail_errno;
	s->segment = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd, 0);
	if (s->segment == MAP_FAILED) {
		s->segment = NULL;
		goto fail_errno;
	}
	s->segment_bytes = total;
	if (fcntl(s->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		goto fail_errno;
	s->ring.sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->ring.sq_efd < 0)
		goto fail_errno;
	/* The CQ doorbell is a pipe, not an eventfd: the daemon keeps the
	 * write end, an open file description the client never sees, so no
	 * flag or count the client controls can make the executor's write
	 * block. A full pipe (a client that never drains it) answers EAGAIN,
	 * which already means "woken". */
	int cq_pipe[2];
	if (pipe2(cq_pipe, O_NONBLOCK | O_CLOEXEC) < 0)
		goto fail_errno;
	s->cq_rfd = cq_pipe[0];
	s->ring.cq_wfd = cq_pipe[1];

	uint8_t *base = s->segment;
	rshm_layout_write_header(s->segment, &l);

	struct radiance_shm_header *h = s->segment;
	rring_init(&s->ring.sq, &h->sq, base + l.sq_offset, l.sq_entries);
	rring_init(&s->ring.cq, &h->cq, base + l.cq_offset, l.cq_entries);
	s->ring.session_id = s->id;
	s->ring.arena = base + l.arena_offset;
	s->ring.arena_bytes = l.arena_bytes;
	s->ring.max_inflight = cfg->max_inflight;
	s->ring.refs = &s->refs;
	s->ring.stats = &s->stats;
	exec_ring_init(&s->ring, on_ring_broken, s);
	/* device-time shares go by peer uid (docs/daemon.md, Scheduling) */
	sched_flow_set_owner(&s->ring.flow, s->uid, config_uid_weight(cfg, s->uid));

	memset(&s->ring_job, 0, sizeof s->ring_job);
	s->ring_job.kind = EXEC_JOB_RING_ADD;
	s->ring_job.ring = &s->ring;
	s->ring_job.done = on_ring_added;
	s->ring_job.user = s;
	/* first the arena is pinned, on a worker: the executor serves the
	 * other sessions meanwhile (executor.h, Pinning) */
	int rc = executor_pin(s->server->exec, &s->pin, &s->ring, on_pinned, s);
	if (rc < 0) {
		segment_release(s);
		session_reply_error(s, tag, -rc, "cannot register the arena: %s", uv_strerror(rc));
		return;
	}
	s->ring_state = SESSION_RING_PINNING;
	s->busy = 1;
	s->busy_tag = tag;
	return;

fail_errno: {
		int e = errno;
		segment_release(s);
		session_reply_error(s, tag, e, "cannot create the shared-memory segment (%llu bytes): %s",
				    (unsigned long long)total, strerror(e));
	}
}

/* ---- dispatch ---- */

void session_handle_frame(struct radiance_session *s, const uint8_t *data, size_t len)
{
	size_t nfds = rconn_queued_fds(&s->conn);
	Rdw__ClientMessage *m = rproto_unpack_client(data, len);
	if (!m) {
		rconn_close_fds(&s->conn);
		session_close(s, 1, "undecodable message (%zu bytes)", len);
		return;
	}
	size_t declared = rproto_client_fds(m);
	if (declared != nfds) {
		rconn_close_fds(&s->conn);
		session_close(s, 1, "%s declares %zu fds but %zu came with it",
			      rproto_client_name(m), declared, nfds);
		goto out;
	}
	if (m->msg_case == RDW__CLIENT_MESSAGE__MSG__NOT_SET) {
		session_close(s, 1, "empty or unknown message (no known field of the oneof is set)");
		goto out;
	}
	if (s->state == SESSION_HANDSHAKE && m->msg_case != RDW__CLIENT_MESSAGE__MSG_HELLO) {
		rconn_close_fds(&s->conn);
		session_close(s, 1, "the first message must be hello, not %s",
			      rproto_client_name(m));
		goto out;
	}
	log_debug("session %llu: %s (tag %llu)", (unsigned long long)s->id,
		  rproto_client_name(m), (unsigned long long)m->tag);
	switch (m->msg_case) {
	case RDW__CLIENT_MESSAGE__MSG_HELLO:
		handle_hello(s, m->tag, m->hello);
		break;
	case RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL: {
		int fds[RADIANCE_MAX_FDS];
		rconn_take_fds(&s->conn, fds, nfds);
		handle_load(s, m->tag, m->load_model, fds, nfds);
		break;
	}
	case RDW__CLIENT_MESSAGE__MSG_ATTACH_MODEL:
		handle_attach(s, m->tag, m->attach_model);
		break;
	case RDW__CLIENT_MESSAGE__MSG_RELEASE_MODEL:
		handle_release(s, m->tag, m->release_model);
		break;
	case RDW__CLIENT_MESSAGE__MSG_GET_MODEL:
		handle_get_model(s, m->tag, m->get_model->model_id);
		break;
	case RDW__CLIENT_MESSAGE__MSG_LIST_MODELS:
		handle_list(s, m->tag);
		break;
	case RDW__CLIENT_MESSAGE__MSG_OPEN_RING:
		handle_open_ring(s, m->tag, m->open_ring);
		break;
	case RDW__CLIENT_MESSAGE__MSG_GET_STATS:
		handle_stats(s, m->tag);
		break;
	case RDW__CLIENT_MESSAGE__MSG_MAP_MODEL:
		session_handle_map(s, m->tag, m->map_model);
		break;
	case RDW__CLIENT_MESSAGE__MSG_UNMAP_MODEL:
		session_handle_unmap(s, m->tag, m->unmap_model);
		break;
	case RDW__CLIENT_MESSAGE__MSG_LIST_TENSORS:
		session_handle_list_tensors(s, m->tag, m->list_tensors);
		break;
	case RDW__CLIENT_MESSAGE__MSG_MAP_TENSORS:
		session_handle_map_tensors(s, m->tag, m->map_tensors);
		break;
	default:
		session_close(s, 1, "unknown message");
		break;
	}
out:
	rdw__client_message__free_unpacked(m, NULL);
}

/* ---- life cycle ---- */

static void on_timer_closed(uv_handle_t *h)
{
	struct radiance_session *s = h->data;
	s->timer_closed = 1;
	session_maybe_free(s);
}

/* A connection that never says Hello would hold one of max_sessions slots
 * (and up to RADIANCE_MAX_FDS descriptors) forever. */
static void on_hello_timeout(uv_timer_t *t)
{
	struct radiance_session *s = t->data;
	unsigned ms = s->server->cfg->hello_timeout_ms;
	if (s->state != SESSION_HANDSHAKE)
		return;
	session_reply_error(s, 0, ETIMEDOUT, "no Hello within %u ms", ms);
	session_close(s, 0, "no Hello within %u ms", ms);
}

struct radiance_session *session_create(struct radiance_server *srv, int fd)
{
	struct radiance_session *s = calloc(1, sizeof *s);
	if (!s) {
		close(fd);
		errno = ENOMEM;
		return NULL;
	}
	s->server = srv;
	s->memfd = -1;
	s->ring.sq_efd = s->ring.cq_wfd = s->cq_rfd = -1;
	s->poll_events = -1;
	s->id = ++srv->next_session_id;
	stats_init(&s->stats);
	exec_refs_init(&s->refs);
	snprintf(s->client_name, sizeof s->client_name, "?");

	struct ucred cred;
	socklen_t clen = sizeof cred;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
		s->pid = cred.pid;
		s->uid = cred.uid;
		s->gid = cred.gid;
	} else {
		s->pid = -1;
		s->uid = s->gid = (uid_t)-1;
	}
	int rc = session_io_init(s, fd);
	if (rc < 0) {
		exec_refs_finish(&s->refs);
		free(s);
		errno = -rc;
		return NULL;
	}
	uv_timer_init(srv->loop, &s->hello_timer);
	s->hello_timer.data = s;
	uv_timer_start(&s->hello_timer, on_hello_timeout, srv->cfg->hello_timeout_ms, 0);
	log_info("session %llu: connected: pid %d uid %u gid %u", (unsigned long long)s->id,
		 (int)s->pid, (unsigned)s->uid, (unsigned)s->gid);
	return s;
}

void session_close(struct radiance_session *s, int violation, const char *fmt, ...)
{
	if (s->state == SESSION_CLOSING)
		return;
	char reason[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof reason, fmt, ap);
	va_end(ap);

	if (violation) {
		log_warn("session %llu (pid %d, '%s'): protocol violation: %s; closing",
			 (unsigned long long)s->id, (int)s->pid, s->client_name, reason);
		/* best effort: tell the client why, if the socket takes it now */
		session_reply_error(s, 0, EPROTO, "protocol violation: %s", reason);
	} else {
		log_info("session %llu (pid %d, '%s'): closing: %s", (unsigned long long)s->id,
			 (int)s->pid, s->client_name, reason);
	}
	s->state = SESSION_CLOSING;
	s->server->nclosing++;
	if (s->waiting) {
		registry_cancel(&s->waiter);
		s->waiting = 0;
	}
	session_io_finish(s);
	uv_close((uv_handle_t *)&s->hello_timer, on_timer_closed);
	if (s->ring_state == SESSION_RING_ACTIVE)
		session_ring_release(s);
	/* a pin not begun yet is taken back (on_pinned sees -ECANCELED); one
	 * running, and ADDING, finish and see CLOSING: on_pinned unpins,
	 * on_ring_added removes the ring */
	if (s->ring_state == SESSION_RING_PINNING)
		executor_pin_cancel(&s->pin);
}

void session_stop(struct radiance_session *s)
{
	if (s->state == SESSION_CLOSING)
		return;
	session_update(s);   /* reads nothing more: server->stopping */
	switch (s->ring_state) {
	case SESSION_RING_ACTIVE:
		session_ring_release(s);   /* drains: server->stopping */
		break;
	case SESSION_RING_NONE:
		session_goodbye(s);
		break;
	case SESSION_RING_PINNING:     /* on_pinned unpins it, on_unpinned says Goodbye */
	case SESSION_RING_ADDING:      /* on_ring_added releases it */
	case SESSION_RING_REMOVING:    /* on_ring_removed says Goodbye */
	case SESSION_RING_UNPINNING:   /* on_unpinned says Goodbye (or did, closing) */
		break;
	}
}

void session_maybe_free(struct radiance_session *s)
{
	if (s->state != SESSION_CLOSING || !s->poll_closed || !s->timer_closed ||
	    s->ring_state != SESSION_RING_NONE)
		return;
	session_maps_finish(&s->maps);   /* the mappings go with the references below */
	while (s->nmodels)
		session_drop_model(s, s->nmodels - 1);
	free(s->models);
	exec_refs_finish(&s->refs);
	segment_release(s);
	server_session_gone(s);
	free(s);
}
