/* MapModel / UnmapModel: a session's access to a model's device allocation. */
#include "session_map.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "map.h"
#include "proto_util.h"
#include "server.h"
#include "session.h"

void session_maps_finish(struct session_maps *m)
{
	free(m->v);
	memset(m, 0, sizeof *m);
}

static struct session_map *maps_find(const struct session_maps *m, uint32_t model_id)
{
	for (size_t i = 0; i < m->n; i++)
		if (m->v[i].model_id == model_id)
			return &m->v[i];
	return NULL;
}

int session_maps_has(const struct session_maps *m, uint32_t model_id)
{
	return maps_find(m, model_id) != NULL;
}

/* Room for one more model, so that recording a mapping after its reply is
 * queued cannot fail. */
static int maps_reserve(struct session_maps *m)
{
	if (m->n < m->cap)
		return 0;
	size_t cap = m->cap ? 2 * m->cap : 4;
	struct session_map *v = realloc(m->v, cap * sizeof *v);
	if (!v)
		return -ENOMEM;
	m->v = v;
	m->cap = cap;
	return 0;
}

static void maps_add(struct session_maps *m, uint32_t model_id)
{
	struct session_map *e = maps_find(m, model_id);
	if (e)
		e->count++;
	else
		m->v[m->n++] = (struct session_map){ model_id, 1 };
}

struct radiance_resident *session_held_model(struct radiance_session *s, uint32_t model_id)
{
	for (size_t i = 0; i < s->nmodels; i++)
		if (s->models[i]->em.id == model_id)
			return s->models[i];
	return NULL;
}

static Rdw__MapHandle wire_handle(enum radiance_share_handle h)
{
	switch (h) {
	case RADIANCE_SHARE_HANDLE_POSIX_FD: return RDW__MAP_HANDLE__MAP_HANDLE_POSIX_FD;
	case RADIANCE_SHARE_HANDLE_IPC: return RDW__MAP_HANDLE__MAP_HANDLE_IPC;
	case RADIANCE_SHARE_HANDLE_TEST_MEMFD: return RDW__MAP_HANDLE__MAP_HANDLE_TEST_MEMFD;
	default: return RDW__MAP_HANDLE__MAP_HANDLE_UNSPECIFIED;
	}
}

/* The reply for one model; the arrays are malloc'ed here, the strings and
 * the handle point into sh (immutable while the model is READY). */
static int mapping_send(struct radiance_session *s, uint64_t tag, const struct radiance_resident *res,
			const struct radiance_backend_share *sh)
{
	const struct radiance_model *m = res->em.model;
	Rdw__MappedLayer *layers = calloc(m->n_layers ? m->n_layers : 1, sizeof *layers);
	Rdw__MappedLayer **ptrs = calloc(m->n_layers ? m->n_layers : 1, sizeof *ptrs);
	if (!layers || !ptrs) {
		free(layers);
		free(ptrs);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->n_layers; i++) {
		const struct radiance_layer *l = &m->layers[i];
		const struct radiance_share_layer *sl = &sh->layers[i];
		Rdw__MappedLayer *ml = &layers[i];
		rdw__mapped_layer__init(ml);
		ml->index = (uint32_t)i;
		ml->kind = l->kind == RADIANCE_LAYER_W4A8 ? RDW__LAYER_KIND__LAYER_KIND_W4A8
							  : RDW__LAYER_KIND__LAYER_KIND_BF16;
		ml->n = l->n;
		ml->k = l->k;
		ml->weight_offset = sl->weight_offset;
		ml->weight_bytes = sl->weight_bytes;
		ml->scales_offset = sl->scales_offset;
		ml->scales_bytes = sl->scales_bytes;
		ml->bias_offset = sl->bias_offset;
		ml->bias_bytes = sl->bias_bytes;
		ptrs[i] = ml;
	}
	Rdw__ModelMapping mm = RDW__MODEL_MAPPING__INIT;
	mm.model_id = res->em.id;
	mm.layout_version = RADIANCE_MAP_LAYOUT_VERSION;
	mm.layout = (char *)sh->layout;
	mm.handle = wire_handle(sh->handle);
	if (sh->handle == RADIANCE_SHARE_HANDLE_IPC) {
		mm.ipc_handle.data = (uint8_t *)sh->ipc_handle;
		mm.ipc_handle.len = RADIANCE_MAP_IPC_HANDLE_BYTES;
	}
	mm.bytes = sh->bytes;
	mm.granularity = sh->granularity;
	mm.vendor = (char *)sh->vendor;
	mm.pci_bus_id = (char *)sh->pci_bus_id;
	mm.n_layers = m->n_layers;
	mm.layers = ptrs;
	Rdw__ServerMessage msg = RDW__SERVER_MESSAGE__INIT;
	msg.tag = tag;
	msg.msg_case = RDW__SERVER_MESSAGE__MSG_MODEL_MAPPING;
	msg.model_mapping = &mm;
	/* the fd is dup'ed onto the frame: the backend keeps its own */
	const size_t nfds = rproto_mapping_fds(mm.handle);
	session_reply(s, &msg, nfds ? &sh->fd : NULL, nfds);
	free(layers);
	free(ptrs);
	return 0;
}

/* A mapping process can read the weights and, with a read-write import
 * (the driver lets the importer choose its access), change them for every
 * session: measured on the H200, bench/results/mapped-2026-12-01.md. */
static int may_map(const struct radiance_session *s, char *why, size_t len)
{
	switch (s->server->cfg->map_allow) {
	case RADIANCE_MAP_ALLOW_ALL:
		return 1;
	case RADIANCE_MAP_ALLOW_NONE:
		snprintf(why, len, "mapping is off in this daemon (map_allow none)");
		return 0;
	default:
		if (s->uid == 0 || s->uid == geteuid())
			return 1;
		snprintf(why, len, "only root%s may map models (map_allow owner; peer uid %u): a mapping "
			 "process could change the weights other sessions use, see docs/mapped.md",
			 geteuid() ? " and the daemon's user" : "", (unsigned)s->uid);
		return 0;
	}
}

void session_handle_map(struct radiance_session *s, uint64_t tag, const Rdw__MapModel *mm)
{
	const struct radiance_backend_info *bi = executor_backend_info(s->server->exec);
	char why[320];
	if (!may_map(s, why, sizeof why)) {
		session_reply_error(s, tag, EPERM, "%s", why);
		return;
	}
	struct radiance_resident *res = session_held_model(s, mm->model_id);
	if (!res) {
		session_reply_error(s, tag, ENOENT, "model_id %u is not loaded by this session (load or "
				    "attach it before mapping it)", mm->model_id);
		return;
	}
	if (mm->layout_version != RADIANCE_MAP_LAYOUT_VERSION) {
		session_reply_error(s, tag, EPROTONOSUPPORT, "mapped-weights layout version %u is not "
				    "served (radianced %s lays out version %u)", mm->layout_version,
				    RADIANCE_VERSION, RADIANCE_MAP_LAYOUT_VERSION);
		return;
	}
	const struct radiance_backend_share *sh = res->em.share;
	if (!sh) {
		session_reply_error(s, tag, ENOTSUP, "model %u '%s' cannot be mapped: the %s backend "
				    "keeps it in memory other processes cannot map (%s); use the "
				    "rings (radiance_linear) instead", res->em.id, res->name, bi->name,
				    bi->share_why[0] ? bi->share_why : bi->share);
		return;
	}
	if (session_fd_reply_room(s, tag, "mapping") < 0)
		return;
	if (maps_reserve(&s->maps) < 0 || mapping_send(s, tag, res, sh) < 0) {
		session_reply_error(s, tag, ENOMEM, "out of memory describing the mapping of model %u",
				    res->em.id);
		return;
	}
	maps_add(&s->maps, res->em.id);
	log_info("session %llu: maps model %u '%s' (%s, %llu bytes, %u mappings)", (unsigned long long)s->id,
		 res->em.id, res->name, bi->share, (unsigned long long)sh->bytes,
		 maps_find(&s->maps, res->em.id)->count);
}

void session_handle_unmap(struct radiance_session *s, uint64_t tag, const Rdw__UnmapModel *um)
{
	struct session_maps *m = &s->maps;
	struct session_map *e = maps_find(m, um->model_id);
	if (!e) {
		session_reply_error(s, tag, ENOENT, "model_id %u is not mapped by this session",
				    um->model_id);
		return;
	}
	uint32_t left = --e->count;
	if (!left)
		*e = m->v[--m->n];
	log_info("session %llu: unmaps model %u (%u mappings left)", (unsigned long long)s->id, um->model_id,
		 left);
	session_reply_ok(s, tag);
}
