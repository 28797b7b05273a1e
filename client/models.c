/*
 * Models: load (the client opens the checkpoint files and passes their
 * descriptors), attach by name, release, and the descriptions the daemon
 * gives. A session's references are mirrored in r->held so requests can be
 * checked against N and K before they reach the ring.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_files.h"
#include "client-private.h"
#include "io.h"
#include "proto_util.h"
#include "wire.h"

/* --- descriptions --------------------------------------------------------- */

/* Frees what m points to, not m itself. */
static void model_clear(struct radiance_model_info *m)
{
	for (size_t i = 0; i < m->n_layers; i++)
		free((char *)m->layers[i].name);
	free((void *)m->layers);
	for (size_t i = 0; i < m->n_other; i++) {
		free((char *)m->other[i].name);
		free((char *)m->other[i].dtype);
		free((void *)m->other[i].shape);
	}
	free((void *)m->other);
	free((char *)m->name);
}

void radiance_model_info_free(struct radiance_model_info *m)
{
	if (!m)
		return;
	model_clear(m);
	free(m);
}

/* Fills *m (already zeroed) from pb; on failure the caller frees m. */
static int model_fill(struct radiance_model_info *m, const Rdw__ModelInfo *pb)
{
	m->model_id = pb->model_id;
	m->resident_bytes = pb->resident_bytes;
	m->preloaded = pb->preloaded;
	m->users = pb->users;
	if (!(m->name = strdup(pb->name ? pb->name : "")))
		return -ENOMEM;
	if (pb->n_layers) {
		struct radiance_layer_info *l = calloc(pb->n_layers, sizeof *l);
		if (!l)
			return -ENOMEM;
		m->layers = l;
		for (size_t i = 0; i < pb->n_layers; i++) {
			const Rdw__LayerInfo *p = pb->layers[i];
			l[i] = (struct radiance_layer_info){
				.index = p->index,
				.kind = (enum radiance_layer_kind)p->kind,
				.n = p->n,
				.k = p->k,
				.has_bias = p->has_bias,
				.bytes = p->bytes,
			};
			m->n_layers = i + 1;
			if (!(l[i].name = strdup(p->name ? p->name : "")))
				return -ENOMEM;
		}
	}
	if (pb->n_other_tensors) {
		struct radiance_other_tensor *t = calloc(pb->n_other_tensors, sizeof *t);
		if (!t)
			return -ENOMEM;
		m->other = t;
		for (size_t i = 0; i < pb->n_other_tensors; i++) {
			const Rdw__TensorInfo *p = pb->other_tensors[i];
			m->n_other = i + 1;
			uint64_t *shape = calloc(p->n_shape ? p->n_shape : 1, sizeof *shape);
			t[i].name = strdup(p->name ? p->name : "");
			t[i].dtype = strdup(p->dtype ? p->dtype : "");
			t[i].shape = shape;
			if (!shape || !t[i].name || !t[i].dtype)
				return -ENOMEM;
			t[i].ndim = (uint32_t)p->n_shape;
			if (p->n_shape)   /* a scalar has none, and p->shape is NULL */
				memcpy(shape, p->shape, p->n_shape * sizeof *shape);
		}
	}
	return 0;
}

int radiance__client_model_from_pb(const Rdw__ModelInfo *pb, struct radiance_model_info **out)
{
	struct radiance_model_info *m = calloc(1, sizeof *m);
	if (!m)
		return -ENOMEM;
	int rc = model_fill(m, pb);
	if (rc < 0) {
		radiance_model_info_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

int radiance_find_layer(const struct radiance_model_info *m, const char *name)
{
	if (!m || !name)
		return -ENOENT;
	for (size_t i = 0; i < m->n_layers; i++)
		if (strcmp(m->layers[i].name, name) == 0)
			return (int)m->layers[i].index;
	return -ENOENT;
}

/* --- held references ------------------------------------------------------ */

struct radiance__client_held *radiance__client_find_held(const struct radiance *r, uint32_t model_id)
{
	for (size_t i = 0; i < r->n_held; i++)
		if (r->held[i].model_id == model_id)
			return &r->held[i];
	return NULL;
}

const struct radiance_model_info *radiance_held_model(const struct radiance *r, uint32_t model_id)
{
	const struct radiance__client_held *h = radiance__client_find_held(r, model_id);
	return h ? h->info : NULL;
}

/* Layers must be indexed 0..n-1 in order: requests name them by index and
 * the client checks N and K through layers[index]. */
static int check_layers(struct radiance *r, const struct radiance_model_info *m)
{
	for (size_t i = 0; i < m->n_layers; i++)
		if (m->layers[i].index != i)
			return radiance__client_break(r, -EPROTO, "model %u: layer %zu has index %u", m->model_id,
					       i, m->layers[i].index);
	return 0;
}

static int get_model_pb(struct radiance *r, uint32_t model_id, Rdw__ServerMessage **reply)
{
	Rdw__GetModel get = RDW__GET_MODEL__INIT;
	get.model_id = model_id;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_GET_MODEL;
	msg.get_model = &get;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, reply);
	if (rc < 0)
		return rc;
	if ((*reply)->msg_case != RDW__SERVER_MESSAGE__MSG_MODEL_INFO) {
		rc = radiance__client_break(r, -EPROTO, "get_model answered with %s",
				     rproto_server_name(*reply));
		rdw__server_message__free_unpacked(*reply, NULL);
		*reply = NULL;
	}
	return rc;
}

/* A load or attach reply: record the reference (with the layer table,
 * fetched separately if the reply has none). */
static int hold(struct radiance *r, const Rdw__ModelInfo *pb, uint32_t *model_id)
{
	struct radiance_model_info *info;
	int rc = radiance__client_model_from_pb(pb, &info);
	if (rc < 0)
		return radiance__client_fail(r, rc, "out of memory");
	if (info->n_layers == 0) {
		Rdw__ServerMessage *reply;
		if ((rc = get_model_pb(r, pb->model_id, &reply)) < 0)
			goto err_info;
		radiance_model_info_free(info);
		rc = radiance__client_model_from_pb(reply->model_info, &info);
		rdw__server_message__free_unpacked(reply, NULL);
		if (rc < 0)
			return radiance__client_fail(r, rc, "out of memory");
	}
	if ((rc = check_layers(r, info)) < 0)
		goto err_info;

	/* The daemon holds one reference per session and model, however many
	 * loads or attaches name it: a second one only refreshes the info. */
	struct radiance__client_held *h = radiance__client_find_held(r, info->model_id);
	if (h) {
		radiance_model_info_free(h->info);
		h->info = info;
	} else {
		if (r->n_held == r->cap_held) {
			size_t cap = r->cap_held ? 2 * r->cap_held : 4;
			struct radiance__client_held *p = realloc(r->held, cap * sizeof *p);
			if (!p) {
				rc = radiance__client_fail(r, -ENOMEM, "out of memory");
				goto err_info;
			}
			r->held = p;
			r->cap_held = cap;
		}
		r->held[r->n_held++] = (struct radiance__client_held){
			.model_id = info->model_id, .info = info,
		};
	}
	if (model_id)
		*model_id = info->model_id;
	radiance__client_log(r, LOG_DEBUG, "holding model %u \"%s\": %zu layers, %llu bytes",
		      info->model_id, info->name, info->n_layers,
		      (unsigned long long)info->resident_bytes);
	return 0;

err_info:
	radiance_model_info_free(info);
	return rc;
}

static int expect_model_info(struct radiance *r, Rdw__ServerMessage *reply, const char *what)
{
	if (reply->msg_case == RDW__SERVER_MESSAGE__MSG_MODEL_INFO)
		return 0;
	return radiance__client_break(r, -EPROTO, "%s answered with %s", what,
			       rproto_server_name(reply));
}

/* --- load, attach, release ------------------------------------------------ */

static int load_model(struct radiance *r, const char *dir, const struct radiance_load_options *opt,
		      uint32_t *model_id)
{
	struct radiance_load_options o = RADIANCE_LOAD_OPTIONS_INIT;
	char err[512];
	char **names;
	char *base = NULL;   /* the default name */
	int rc;

	if (r->error)
		return r->error;
	if (!dir || !*dir)
		return radiance__client_fail(r, -EINVAL, "no checkpoint directory");
	if (opt) {
		if (opt->size < offsetof(struct radiance_load_options, progress))
			return radiance__client_fail(r, -EINVAL, "radiance_load_options.size not set");
		memcpy(&o, opt, opt->size < sizeof o ? opt->size : sizeof o);
	}
	if ((rc = rcheckpoint_list_files(dir, &names, err, sizeof err)) < 0)
		return radiance__client_fail(r, rc, "%s", err);

	size_t n = (size_t)rc;
	if (n > RADIANCE_MAX_FDS) {
		rc = radiance__client_fail(r, -E2BIG, "%s: %zu files, one message carries at most %u", dir, n,
				    RADIANCE_MAX_FDS);
		goto out_names;
	}
	int fds[RADIANCE_MAX_FDS];
	size_t nfds = 0;
	for (; nfds < n; nfds++) {
		char path[PATH_MAX];
		if (rio_path_join(path, sizeof path, dir, names[nfds]) < 0) {
			rc = radiance__client_fail(r, -ENAMETOOLONG, "%s: path longer than %zu bytes",
						   path, sizeof path - 1);
			goto out_fds;
		}
		/* O_NONBLOCK: a FIFO put there since the check above must not
		 * hang the open; it is refused just below. */
		fds[nfds] = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
		if (fds[nfds] < 0) {
			rc = radiance__client_fail(r, -errno, "%s: %s", path, strerror(errno));
			goto out_fds;
		}
		struct stat st;
		if (fstat(fds[nfds], &st) < 0 || !S_ISREG(st.st_mode) ||
		    fcntl(fds[nfds], F_SETFL, 0) < 0) {
			close(fds[nfds]);
			rc = radiance__client_fail(r, -EINVAL, "%s is not a regular file", path);
			goto out_fds;
		}
	}

	/* Default name: the directory's basename, as the daemon names preloaded
	 * checkpoints and radiance_checkpoint_load_dir() names local loads, so
	 * one checkpoint has one name however it got resident. "." and ".."
	 * are no model names (rtext_check_model_name): the directory they
	 * stand for names it. Not cut: a name too long is the daemon's to
	 * refuse, saying so. */
	if (!o.name || !*o.name) {
		size_t len;
		char *real = NULL;
		const char *last = rcheckpoint_dir_name(dir, &len);
		if (rcheckpoint_dot_name(last, len)) {
			if ((real = realpath(dir, NULL)))
				last = rcheckpoint_dir_name(real, &len);
		}
		base = strndup(last, len);
		free(real);
		if (!base) {
			rc = radiance__client_fail(r, -ENOMEM, "out of memory");
			goto out_fds;
		}
		o.name = base;
	}
	Rdw__LoadModel load = RDW__LOAD_MODEL__INIT;
	load.name = (char *)o.name;
	load.n_file_names = n;
	load.file_names = names;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL;
	msg.load_model = &load;
	Rdw__ServerMessage *reply;
	radiance__client_log(r, LOG_INFO, "loading %s (%zu files)", dir, n);
	rc = radiance__client_request(r, &msg, fds, nfds, o.progress, o.progress_user, &reply);
	if (rc == 0) {
		if ((rc = expect_model_info(r, reply, "load_model")) == 0)
			rc = hold(r, reply->model_info, model_id);
		rdw__server_message__free_unpacked(reply, NULL);
	}
out_fds:
	free(base);
	while (nfds > 0)
		close(fds[--nfds]);
out_names:
	rcheckpoint_files_free(names);
	return rc;
}

int radiance_load_model(struct radiance *r, const char *dir,
			const struct radiance_load_options *opt, uint32_t *model_id)
{
	RADIANCE__GUARDED(r, load_model(r, dir, opt, model_id));
}

int radiance__client_attach(struct radiance *r, const char *name, uint32_t *model_id)
{
	if (r->error)
		return r->error;
	if (!name || !*name)
		return radiance__client_fail(r, -EINVAL, "no model name");
	Rdw__AttachModel attach = RDW__ATTACH_MODEL__INIT;
	attach.name = (char *)name;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_ATTACH_MODEL;
	msg.attach_model = &attach;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if ((rc = expect_model_info(r, reply, "attach_model")) == 0)
		rc = hold(r, reply->model_info, model_id);
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}

int radiance_attach_model(struct radiance *r, const char *name, uint32_t *model_id)
{
	RADIANCE__GUARDED(r, radiance__client_attach(r, name, model_id));
}

static int release(struct radiance *r, uint32_t model_id, bool drop_preload)
{
	if (r->error)
		return r->error;
	struct radiance__client_held *h = drop_preload ? NULL : radiance__client_find_held(r, model_id);
	if (h && r->in_flight)
		return radiance__client_fail(r, -EBUSY, "%u requests in flight", r->in_flight);
	Rdw__ReleaseModel rel = RDW__RELEASE_MODEL__INIT;
	rel.model_id = model_id;
	rel.drop_preload = drop_preload;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_RELEASE_MODEL;
	msg.release_model = &rel;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_OK)
		rc = radiance__client_break(r, -EPROTO, "release_model answered with %s",
				     rproto_server_name(reply));
	rdw__server_message__free_unpacked(reply, NULL);
	if (rc == 0 && h) {
		radiance_model_info_free(h->info);
		*h = r->held[--r->n_held];
	}
	return rc;
}

int radiance_release_model(struct radiance *r, uint32_t model_id)
{
	RADIANCE__GUARDED(r, release(r, model_id, false));
}

int radiance_unload_preloaded(struct radiance *r, uint32_t model_id)
{
	RADIANCE__GUARDED(r, release(r, model_id, true));
}

/* --- queries -------------------------------------------------------------- */

static int get_model(struct radiance *r, uint32_t model_id, struct radiance_model_info **out)
{
	if (!out)
		return radiance__client_fail(r, -EINVAL, "the result pointer is NULL");
	*out = NULL;
	if (r->error)
		return r->error;
	Rdw__ServerMessage *reply;
	int rc = get_model_pb(r, model_id, &reply);
	if (rc < 0)
		return rc;
	rc = radiance__client_model_from_pb(reply->model_info, out);
	rdw__server_message__free_unpacked(reply, NULL);
	return rc < 0 ? radiance__client_fail(r, rc, "out of memory") : 0;
}

int radiance_get_model(struct radiance *r, uint32_t model_id, struct radiance_model_info **out)
{
	RADIANCE__GUARDED(r, get_model(r, model_id, out));
}

void radiance_model_list_free(struct radiance_model_list *list)
{
	if (!list)
		return;
	for (size_t i = 0; i < list->count; i++)
		model_clear(&list->models[i]);
	free(list->models);
	free(list);
}

static int list_models(struct radiance *r, struct radiance_model_list **out)
{
	if (!out)
		return radiance__client_fail(r, -EINVAL, "the result pointer is NULL");
	*out = NULL;
	if (r->error)
		return r->error;
	Rdw__ListModels list = RDW__LIST_MODELS__INIT;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_LIST_MODELS;
	msg.list_models = &list;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_MODEL_LIST) {
		rc = radiance__client_break(r, -EPROTO, "list_models answered with %s",
				     rproto_server_name(reply));
		goto out;
	}
	struct radiance_model_list *l = calloc(1, sizeof *l);
	const Rdw__ModelList *pl = reply->model_list;
	if (!l || (pl->n_models && !(l->models = calloc(pl->n_models, sizeof *l->models)))) {
		free(l);
		rc = radiance__client_fail(r, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < pl->n_models; i++) {
		l->count = i + 1;
		if ((rc = model_fill(&l->models[i], pl->models[i])) < 0) {
			radiance_model_list_free(l);
			rc = radiance__client_fail(r, rc, "out of memory");
			goto out;
		}
	}
	*out = l;
out:
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}

int radiance_list_models(struct radiance *r, struct radiance_model_list **out)
{
	RADIANCE__GUARDED(r, list_models(r, out));
}
