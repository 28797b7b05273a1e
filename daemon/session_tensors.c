/* ListTensors / MapTensors: a model's shared tensors and their memfd. */
#include "session_tensors.h"

#include <errno.h>
#include <stdlib.h>

#include "log.h"
#include "registry.h"
#include "server.h"
#include "session.h"
#include "session_map.h"

/* The TensorList of res, sent as tensor_list or (with the memfd, dup'ed
 * onto the frame) tensor_mapping. Strings and shapes point into the model,
 * immutable while it is READY. */
static int tensors_send(struct radiance_session *s, uint64_t tag,
			const struct radiance_resident *res, int with_fd)
{
	const struct radiance_model *m = res->em.model;
	size_t n = m->n_other;
	Rdw__SharedTensor *t = calloc(n ? n : 1, sizeof *t);
	Rdw__SharedTensor **ptrs = calloc(n ? n : 1, sizeof *ptrs);
	if (!t || !ptrs) {
		free(t);
		free(ptrs);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		const struct radiance_tensor_info *o = &m->other[i];
		rdw__shared_tensor__init(&t[i]);
		t[i].name = o->name;
		t[i].dtype = (char *)o->dtype;
		t[i].n_shape = o->ndim;
		t[i].shape = (uint64_t *)o->shape;
		t[i].offset = o->offset;
		t[i].bytes = o->bytes;
		ptrs[i] = &t[i];
	}
	Rdw__TensorList tl = RDW__TENSOR_LIST__INIT;
	tl.model_id = res->em.id;
	tl.bytes = m->tensors_bytes;
	tl.n_tensors = n;
	tl.tensors = ptrs;
	Rdw__ServerMessage msg = RDW__SERVER_MESSAGE__INIT;
	msg.tag = tag;
	if (with_fd) {
		msg.msg_case = RDW__SERVER_MESSAGE__MSG_TENSOR_MAPPING;
		msg.tensor_mapping = &tl;
	} else {
		msg.msg_case = RDW__SERVER_MESSAGE__MSG_TENSOR_LIST;
		msg.tensor_list = &tl;
	}
	session_reply(s, &msg, with_fd ? &m->tensors_fd : NULL, with_fd ? 1 : 0);
	free(t);
	free(ptrs);
	return 0;
}

void session_handle_list_tensors(struct radiance_session *s, uint64_t tag,
				 const Rdw__ListTensors *lt)
{
	struct radiance_resident *res = registry_find_id(s->server->reg, lt->model_id);
	if (!res) {
		session_reply_error(s, tag, ENOENT, "no resident model has model_id %u", lt->model_id);
		return;
	}
	if (tensors_send(s, tag, res, 0) < 0)
		session_reply_error(s, tag, ENOMEM, "out of memory listing the tensors of model %u",
				    res->em.id);
}

void session_handle_map_tensors(struct radiance_session *s, uint64_t tag,
				const Rdw__MapTensors *mt)
{
	struct radiance_resident *res = session_held_model(s, mt->model_id);
	if (!res) {
		session_reply_error(s, tag, ENOENT, "model_id %u is not loaded by this session (load or "
				    "attach it before mapping its tensors)", mt->model_id);
		return;
	}
	const struct radiance_model *m = res->em.model;
	if (m->tensors_fd < 0) {   /* every loaded model has one; a broken invariant, not the client's */
		session_reply_error(s, tag, EIO, "model %u '%s' has no shared tensors memfd", res->em.id,
				    res->name);
		return;
	}
	if (session_fd_reply_room(s, tag, "mapping") < 0)
		return;
	if (tensors_send(s, tag, res, 1) < 0) {
		session_reply_error(s, tag, ENOMEM, "out of memory describing the tensors of model %u",
				    res->em.id);
		return;
	}
	log_info("session %llu: maps the %zu shared tensors of model %u '%s' (%llu bytes)",
		 (unsigned long long)s->id, m->n_other, res->em.id, res->name,
		 (unsigned long long)m->tensors_bytes);
}
