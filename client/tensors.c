/*
 * Shared tensors (ListTensors / MapTensors): a model's tensors of no linear
 * layer, described by the daemon and, for a held model, mapped read-only
 * from the sealed memfd it passes. The reply is checked before any pointer
 * into the mapping is made, so a broken daemon cannot make a caller read
 * past the memfd.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client-private.h"
#include "proto_util.h"
#include "wire.h"

#define SEALS_NEEDED (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

void radiance_tensors_free(struct radiance_tensors *t)
{
	if (!t)
		return;
	if (t->base)
		munmap((void *)t->base, (size_t)t->bytes);
	if (t->fd >= 0)
		close(t->fd);
	for (size_t i = 0; i < t->count; i++) {
		free((char *)t->tensors[i].name);
		free((char *)t->tensors[i].dtype);
		free((void *)t->tensors[i].shape);
	}
	free((void *)t->tensors);
	free(t);
}

const struct radiance_tensor *radiance_find_tensor(const struct radiance_tensors *t,
						   const char *name)
{
	if (!t || !name)
		return NULL;
	for (size_t i = 0; i < t->count; i++)
		if (strcmp(t->tensors[i].name, name) == 0)
			return &t->tensors[i];
	return NULL;
}

/* Bytes per element of a safetensors dtype; 0 for the sub-byte ones and
 * names this library does not know (their size is not checked). */
static unsigned dtype_size(const char *d)
{
	static const struct { const char *name; unsigned size; } sizes[] = {
		{ "BOOL", 1 }, { "U8", 1 }, { "I8", 1 }, { "F8_E5M2", 1 }, { "F8_E4M3", 1 },
		{ "F8_E8M0", 1 }, { "I16", 2 }, { "U16", 2 }, { "F16", 2 }, { "BF16", 2 },
		{ "I32", 4 }, { "U32", 4 }, { "F32", 4 }, { "F64", 8 }, { "I64", 8 }, { "U64", 8 },
		{ "C64", 8 },
	};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		if (strcmp(d, sizes[i].name) == 0)
			return sizes[i].size;
	return 0;
}

/* Each tensor inside the memfd, aligned, as big as dtype and shape say. */
static int check_list(struct radiance *r, const Rdw__TensorList *pb, uint32_t model_id)
{
	if (pb->model_id != model_id)
		return radiance__client_break(r, -EPROTO, "tensors of model %u answered for model %u",
					      model_id, pb->model_id);
	for (size_t i = 0; i < pb->n_tensors; i++) {
		const Rdw__SharedTensor *t = pb->tensors[i];
		const char *name = t->name ? t->name : "";
		unsigned esz = dtype_size(t->dtype ? t->dtype : "");
		uint64_t count = 1;
		const char *why = NULL;
		for (size_t d = 0; d < t->n_shape && !why; d++) {
			if (t->shape[d] && count > UINT64_MAX / t->shape[d])
				why = "its shape overflows";
			count *= t->shape[d];
		}
		if (!why && esz && (count > UINT64_MAX / esz || count * esz != t->bytes))
			why = "its size is not product(shape) x the dtype's";
		else if (!why && t->offset % RADIANCE_TENSORS_ALIGN)
			why = "its offset is not 64-byte aligned";
		else if (!why && (t->offset > pb->bytes || t->bytes > pb->bytes - t->offset))
			why = "it ends past the memfd";
		if (why)
			return radiance__client_break(r, -EPROTO, "tensors of model %u, tensor %zu (%s): %s",
						      model_id, i, name, why);
	}
	return 0;
}

static int tensors_from_pb(const Rdw__TensorList *pb, struct radiance_tensors **out)
{
	struct radiance_tensors *t = calloc(1, sizeof *t);
	if (!t)
		return -ENOMEM;
	t->fd = -1;
	t->model_id = pb->model_id;
	t->bytes = pb->bytes;
	struct radiance_tensor *v = calloc(pb->n_tensors ? pb->n_tensors : 1, sizeof *v);
	if (!v) {
		free(t);
		return -ENOMEM;
	}
	t->tensors = v;
	for (size_t i = 0; i < pb->n_tensors; i++) {
		const Rdw__SharedTensor *p = pb->tensors[i];
		t->count = i + 1;
		v[i].name = strdup(p->name ? p->name : "");
		v[i].dtype = strdup(p->dtype ? p->dtype : "");
		if (p->n_shape) {   /* a scalar has none, and p->shape is NULL */
			uint64_t *shape = calloc(p->n_shape, sizeof *shape);
			if (shape)
				memcpy(shape, p->shape, p->n_shape * sizeof *shape);
			v[i].shape = shape;
		}
		if (!v[i].name || !v[i].dtype || (p->n_shape && !v[i].shape)) {
			radiance_tensors_free(t);
			return -ENOMEM;
		}
		v[i].ndim = (uint32_t)p->n_shape;
		v[i].bytes = p->bytes;
		v[i].offset = p->offset;
	}
	*out = t;
	return 0;
}

/* The fd is what the daemon says: a memfd (seals are a memfd's), sealed
 * so that nobody can write, shrink or grow it, holding at least `bytes`. */
static int check_fd(struct radiance *r, int fd, uint32_t model_id, uint64_t bytes)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & SEALS_NEEDED) != SEALS_NEEDED)
		return radiance__client_break(r, -EPROTO, "tensors of model %u: the fd is not a memfd "
					      "sealed against writes, shrinking and growing (seals %#x)",
					      model_id, seals < 0 ? 0 : seals);
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < bytes)
		return radiance__client_break(r, -EPROTO, "tensors of model %u: the memfd holds %lld "
					      "bytes, %llu announced", model_id, (long long)st.st_size,
					      (unsigned long long)bytes);
	return 0;
}

static int tensors_request(struct radiance *r, uint32_t model_id, int map,
			   struct radiance_tensors **out)
{
	if (!out)
		return radiance__client_fail(r, -EINVAL, "the result pointer is NULL");
	*out = NULL;
	int rc = radiance__client_usable(r);
	if (rc < 0)
		return rc;
	/* an older daemon would end the session over the unknown message */
	if (r->server.tensors_version == 0)
		return radiance__client_fail(r, -ENOTSUP, "radianced %s does not serve shared tensors "
					     "(it predates ListTensors and MapTensors); update it, or "
					     "read them from the checkpoint", r->server_version);
	if (map && !radiance__client_find_held(r, model_id))
		return radiance__client_fail(r, -ENOENT, "model %u is not held by this session (load or "
					     "attach it first)", model_id);

	Rdw__ListTensors lt = RDW__LIST_TENSORS__INIT;
	Rdw__MapTensors mt = RDW__MAP_TENSORS__INIT;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	if (map) {
		mt.model_id = model_id;
		msg.msg_case = RDW__CLIENT_MESSAGE__MSG_MAP_TENSORS;
		msg.map_tensors = &mt;
	} else {
		lt.model_id = model_id;
		msg.msg_case = RDW__CLIENT_MESSAGE__MSG_LIST_TENSORS;
		msg.list_tensors = &lt;
	}
	Rdw__ServerMessage *reply;
	if ((rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply)) < 0)
		return rc;
	int fd = -1;
	const Rdw__TensorList *pb = map ? reply->tensor_mapping : reply->tensor_list;
	if (reply->msg_case != (map ? RDW__SERVER_MESSAGE__MSG_TENSOR_MAPPING
				    : RDW__SERVER_MESSAGE__MSG_TENSOR_LIST)) {
		rc = radiance__client_break(r, -EPROTO, "%s answered with %s",
					    map ? "map_tensors" : "list_tensors",
					    rproto_server_name(reply));
		goto out;
	}
	if (map && rconn_take_fds(&r->conn, &fd, 1) < 0) {
		rc = radiance__client_break(r, -EPROTO, "tensor_mapping without its descriptor");
		goto out;
	}
	rconn_close_fds(&r->conn);
	if ((rc = check_list(r, pb, model_id)) < 0 || (map && (rc = check_fd(r, fd, model_id, pb->bytes)) < 0))
		goto out;
	struct radiance_tensors *t;
	if ((rc = tensors_from_pb(pb, &t)) < 0) {
		rc = radiance__client_fail(r, rc, "out of memory");
		goto out;
	}
	if (map && pb->bytes) {
		void *base = mmap(NULL, (size_t)pb->bytes, PROT_READ, MAP_SHARED, fd, 0);
		if (base == MAP_FAILED) {
			rc = radiance__client_fail(r, -errno, "mapping the %llu bytes of model %u's tensors: %s",
						   (unsigned long long)pb->bytes, model_id, strerror(errno));
			radiance_tensors_free(t);
			goto out;
		}
		t->base = base;
		for (size_t i = 0; i < t->count; i++)
			((struct radiance_tensor *)t->tensors)[i].data = (const uint8_t *)base + t->tensors[i].offset;
	}
	if (map) {
		t->fd = fd;
		fd = -1;
		radiance__client_log(r, LOG_DEBUG, "model %u: %zu shared tensors mapped, %llu bytes",
				     model_id, t->count, (unsigned long long)t->bytes);
	}
	*out = t;
out:
	if (fd >= 0)
		close(fd);
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}

int radiance_list_tensors(struct radiance *r, uint32_t model_id, struct radiance_tensors **out)
{
	RADIANCE__GUARDED(r, tensors_request(r, model_id, 0, out));
}

int radiance_map_tensors(struct radiance *r, uint32_t model_id, struct radiance_tensors **out)
{
	RADIANCE__GUARDED(r, tensors_request(r, model_id, 1, out));
}
