/* protobuf-c <-> frames and slots. */
#include "proto_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int queue_packed(struct rconn *c, const ProtobufCMessage *m, const int *fds,
			size_t nfds)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	if (len == 0 || len > c->max_frame)
		return -EMSGSIZE;
	uint8_t stackbuf[512];
	uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
	if (!buf)
		return -ENOMEM;
	protobuf_c_message_pack(m, buf);
	int rc = rconn_queue(c, buf, len, fds, nfds);
	if (buf != stackbuf)
		free(buf);
	return rc;
}

int rproto_queue_client(struct rconn *c, const Rdw__ClientMessage *m,
				const int *fds, size_t nfds)
{
	return queue_packed(c, &m->base, fds, nfds);
}

int rproto_queue_server(struct rconn *c, const Rdw__ServerMessage *m,
				const int *fds, size_t nfds)
{
	return queue_packed(c, &m->base, fds, nfds);
}

Rdw__ClientMessage *rproto_unpack_client(const uint8_t *data, size_t len)
{
	return rdw__client_message__unpack(NULL, len, data);
}

Rdw__ServerMessage *rproto_unpack_server(const uint8_t *data, size_t len)
{
	return rdw__server_message__unpack(NULL, len, data);
}

size_t rproto_client_fds(const Rdw__ClientMessage *m)
{
	if (m->msg_case == RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL && m->load_model)
		return m->load_model->n_file_names;
	return 0;
}

size_t rproto_mapping_fds(Rdw__MapHandle handle)
{
	return handle == RDW__MAP_HANDLE__MAP_HANDLE_POSIX_FD ||
	       handle == RDW__MAP_HANDLE__MAP_HANDLE_TEST_MEMFD;
}

size_t rproto_server_fds(const Rdw__ServerMessage *m)
{
	if (m->msg_case == RDW__SERVER_MESSAGE__MSG_RING_READY)
		return RADIANCE_RING_READY_FDS;
	if (m->msg_case == RDW__SERVER_MESSAGE__MSG_MODEL_MAPPING && m->model_mapping)
		return rproto_mapping_fds(m->model_mapping->handle);
	return 0;
}

const char *rproto_client_name(const Rdw__ClientMessage *m)
{
	switch (m->msg_case) {
	case RDW__CLIENT_MESSAGE__MSG_HELLO: return "hello";
	case RDW__CLIENT_MESSAGE__MSG_LOAD_MODEL: return "load_model";
	case RDW__CLIENT_MESSAGE__MSG_ATTACH_MODEL: return "attach_model";
	case RDW__CLIENT_MESSAGE__MSG_RELEASE_MODEL: return "release_model";
	case RDW__CLIENT_MESSAGE__MSG_GET_MODEL: return "get_model";
	case RDW__CLIENT_MESSAGE__MSG_LIST_MODELS: return "list_models";
	case RDW__CLIENT_MESSAGE__MSG_OPEN_RING: return "open_ring";
	case RDW__CLIENT_MESSAGE__MSG_GET_STATS: return "get_stats";
	case RDW__CLIENT_MESSAGE__MSG_MAP_MODEL: return "map_model";
	case RDW__CLIENT_MESSAGE__MSG_UNMAP_MODEL: return "unmap_model";
	default: return "none";
	}
}

const char *rproto_server_name(const Rdw__ServerMessage *m)
{
	switch (m->msg_case) {
	case RDW__SERVER_MESSAGE__MSG_WELCOME: return "welcome";
	case RDW__SERVER_MESSAGE__MSG_ERROR: return "error";
	case RDW__SERVER_MESSAGE__MSG_MODEL_INFO: return "model_info";
	case RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS: return "load_progress";
	case RDW__SERVER_MESSAGE__MSG_MODEL_LIST: return "model_list";
	case RDW__SERVER_MESSAGE__MSG_RING_READY: return "ring_ready";
	case RDW__SERVER_MESSAGE__MSG_STATS: return "stats";
	case RDW__SERVER_MESSAGE__MSG_OK: return "ok";
	case RDW__SERVER_MESSAGE__MSG_MODEL_MAPPING: return "model_mapping";
	default: return "none";
	}
}

int rproto_pack_slot(const ProtobufCMessage *m, uint8_t *buf, size_t cap)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	if (len == 0) {
		if (cap < 2)
			return -EMSGSIZE;
		buf[0] = 0x08;   /* field 1, varint */
		buf[1] = 0x00;
		return 2;
	}
	if (len > cap)
		return -EMSGSIZE;
	protobuf_c_message_pack(m, buf);
	return (int)len;
}

static void *bump_alloc(void *data, size_t size)
{
	struct rproto_bump *b = data;
	size_t at = (b->used + 15) & ~(size_t)15;
	if (size > sizeof b->buf || at > sizeof b->buf - size)
		return NULL;
	b->used = at + size;
	return b->buf + at;
}

static void bump_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

ProtobufCAllocator rproto_bump_allocator(struct rproto_bump *b)
{
	return (ProtobufCAllocator){ .alloc = bump_alloc, .free = bump_free, .allocator_data = b };
}
