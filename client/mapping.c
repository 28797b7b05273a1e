/*
 * Mapped weights, the protocol half (MapModel / UnmapModel): the daemon's
 * description of a model's device allocation, checked, and its fd. Mapping
 * it into a GPU context is libradiance-gpu's (client/gpu/), so this library
 * stays free of any GPU runtime.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client-private.h"
#include "map.h"
#include "proto_util.h"

void radiance_mapping_free(struct radiance_mapping *m)
{
	if (!m)
		return;
	if (m->fd >= 0)
		close(m->fd);
	free((void *)m->layers);
	free((char *)m->layout);
	free((char *)m->vendor);
	free((char *)m->pci_bus_id);
	free(m);
}

/* Every layer of the held model, with its N and K, each array inside the
 * allocation, aligned, and of the size its kind implies where this library
 * knows it (bf16 weights, biases, canonical test arrays). A daemon that
 * answers otherwise is broken: the kernels would read past the weights. */
static int check_mapping(struct radiance *r, const Rdw__ModelMapping *pb,
			 const struct radiance_model_info *info)
{
	if (pb->n_layers != info->n_layers)
		return radiance__client_break(r, -EPROTO, "mapping of model %u has %zu layers, the model %zu",
					      info->model_id, pb->n_layers, info->n_layers);
	if (pb->bytes == 0 || pb->granularity == 0 || pb->bytes % pb->granularity)
		return radiance__client_break(r, -EPROTO, "mapping of model %u: %llu bytes with granularity %llu",
					      info->model_id, (unsigned long long)pb->bytes,
					      (unsigned long long)pb->granularity);
	for (size_t i = 0; i < pb->n_layers; i++) {
		const Rdw__MappedLayer *ml = pb->layers[i];
		const struct radiance_layer_info *l = &info->layers[i];
		const int w4 = l->kind == RADIANCE_LAYER_W4A8;
		const int canonical = pb->handle == RDW__MAP_HANDLE__MAP_HANDLE_TEST_MEMFD;
		const uint64_t arrays[3][2] = {
			{ ml->weight_offset, ml->weight_bytes },
			{ ml->scales_offset, ml->scales_bytes },
			{ ml->bias_offset, ml->bias_bytes },
		};
		const char *why = NULL;
		if (ml->index != i || ml->n != l->n || ml->k != l->k || (uint32_t)ml->kind != (uint32_t)l->kind)
			why = "index, kind, N or K differ from the model's";
		else if (!ml->weight_bytes || (w4 && !ml->scales_bytes) || (!w4 && ml->scales_bytes))
			why = "an array is missing or extra for its kind";
		else if (!w4 && ml->weight_bytes != (uint64_t)l->n * l->k * 2)
			why = "the bf16 weight is not N x K x 2 bytes";
		else if (w4 && canonical && (ml->weight_bytes != (uint64_t)l->n * (l->k / 8) * 4 ||
					     ml->scales_bytes != (uint64_t)l->n * (l->k / 128) * 2))
			why = "the canonical W4A8 arrays have the wrong size";
		else if ((ml->bias_bytes != 0) != l->has_bias ||
			 (ml->bias_bytes && ml->bias_bytes != (uint64_t)l->n * 4))
			why = "the bias is not N fp32 values (or not where the model has one)";
		for (int a = 0; !why && a < 3; a++) {
			if (!arrays[a][1])
				continue;
			if (arrays[a][0] % RADIANCE_MAP_ALIGN)
				why = "an array is not 256-byte aligned";
			else if (arrays[a][0] > pb->bytes || arrays[a][1] > pb->bytes - arrays[a][0])
				why = "an array ends past the allocation";
		}
		if (why)
			return radiance__client_break(r, -EPROTO, "mapping of model %u, layer %zu (%s): %s",
						      info->model_id, i, l->name, why);
	}
	return 0;
}

static int mapping_from_pb(const Rdw__ModelMapping *pb, struct radiance_mapping **out)
{
	struct radiance_mapping *m = calloc(1, sizeof *m);
	if (!m)
		return -ENOMEM;
	m->fd = -1;
	struct radiance_mapped_layer *l = calloc(pb->n_layers ? pb->n_layers : 1, sizeof *l);
	m->layers = l;
	m->layout = strdup(pb->layout ? pb->layout : "");
	m->vendor = strdup(pb->vendor ? pb->vendor : "");
	m->pci_bus_id = strdup(pb->pci_bus_id ? pb->pci_bus_id : "");
	if (!l || !m->layout || !m->vendor || !m->pci_bus_id) {
		radiance_mapping_free(m);
		return -ENOMEM;
	}
	m->model_id = pb->model_id;
	m->layout_version = pb->layout_version;
	m->handle = (enum radiance_map_handle)pb->handle;
	if (pb->ipc_handle.len == sizeof m->ipc_handle)
		memcpy(m->ipc_handle, pb->ipc_handle.data, sizeof m->ipc_handle);
	m->bytes = pb->bytes;
	m->granularity = pb->granularity;
	m->n_layers = pb->n_layers;
	for (size_t i = 0; i < pb->n_layers; i++) {
		const Rdw__MappedLayer *p = pb->layers[i];
		l[i] = (struct radiance_mapped_layer){
			.index = p->index,
			.kind = (enum radiance_layer_kind)p->kind,
			.n = p->n,
			.k = p->k,
			.weight_offset = p->weight_offset,
			.weight_bytes = p->weight_bytes,
			.scales_offset = p->scales_offset,
			.scales_bytes = p->scales_bytes,
			.bias_offset = p->bias_offset,
			.bias_bytes = p->bias_bytes,
		};
	}
	*out = m;
	return 0;
}

int radiance_map_model(struct radiance *r, uint32_t model_id, uint32_t layout_version,
		       struct radiance_mapping **out)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	int rc = radiance__client_usable(r);
	if (rc < 0)
		return rc;
	/* an older daemon would end the session over the unknown message */
	if (r->server.map_layout_version == 0)
		return radiance__client_fail(r, -ENOTSUP, "radianced %s does not offer mapped weights (it "
					     "predates MapModel); update it, or use the rings",
					     r->server_version);
	if (r->server.map_layout_version != layout_version)
		return radiance__client_fail(r, -ENOTSUP, "radianced %s lays out mapped weights in version "
					     "%u, the caller reads version %u", r->server_version,
					     r->server.map_layout_version, layout_version);
	const struct radiance__client_held *held = radiance__client_find_held(r, model_id);
	if (!held)
		return radiance__client_fail(r, -ENOENT, "model %u is not held by this session (load or "
					     "attach it first)", model_id);

	Rdw__MapModel mm = RDW__MAP_MODEL__INIT;
	mm.model_id = model_id;
	mm.layout_version = layout_version;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_MAP_MODEL;
	msg.map_model = &mm;
	Rdw__ServerMessage *reply;
	if ((rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply)) < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_MODEL_MAPPING) {
		rc = radiance__client_break(r, -EPROTO, "map_model answered with %s",
					    rproto_server_name(reply));
		goto out;
	}
	const Rdw__ModelMapping *pb = reply->model_mapping;
	int fd = -1;
	if (rproto_mapping_fds(pb->handle) &&
	    rconn_take_fds(&r->conn, &fd, 1) < 0) {
		rc = radiance__client_break(r, -EPROTO, "model_mapping without its descriptor");
		goto out;
	}
	rconn_close_fds(&r->conn);
	if (pb->model_id != model_id || pb->layout_version != layout_version) {
		rc = radiance__client_break(r, -EPROTO, "map_model %u (layout %u) answered for model %u "
					    "(layout %u)", model_id, layout_version, pb->model_id,
					    pb->layout_version);
	} else if (pb->handle == RDW__MAP_HANDLE__MAP_HANDLE_IPC &&
		   pb->ipc_handle.len != RADIANCE_MAP_IPC_HANDLE_BYTES) {
		rc = radiance__client_break(r, -EPROTO, "IPC handle of %zu bytes, expected %u",
					    pb->ipc_handle.len, RADIANCE_MAP_IPC_HANDLE_BYTES);
	} else if (pb->handle != RDW__MAP_HANDLE__MAP_HANDLE_IPC && !rproto_mapping_fds(pb->handle)) {
		rc = radiance__client_break(r, -EPROTO, "mapping handle type %d is unknown", (int)pb->handle);
	} else if ((rc = check_mapping(r, pb, held->info)) == 0 && (rc = mapping_from_pb(pb, out)) < 0) {
		rc = radiance__client_fail(r, rc, "out of memory");
	}
	if (rc == 0) {
		(*out)->fd = fd;
		fd = -1;
		radiance__client_log(r, LOG_DEBUG, "model %u mapped: %s, %llu bytes, %s", model_id,
				     pb->handle == RDW__MAP_HANDLE__MAP_HANDLE_IPC ? "IPC handle" : "fd",
				     (unsigned long long)pb->bytes, pb->layout ? pb->layout : "");
	}
	if (fd >= 0)
		close(fd);
out:
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}

int radiance_unmap_model(struct radiance *r, uint32_t model_id)
{
	Rdw__UnmapModel um = RDW__UNMAP_MODEL__INIT;
	um.model_id = model_id;
	Rdw__ClientMessage msg = RDW__CLIENT_MESSAGE__INIT;
	msg.msg_case = RDW__CLIENT_MESSAGE__MSG_UNMAP_MODEL;
	msg.unmap_model = &um;
	Rdw__ServerMessage *reply;
	int rc = radiance__client_request(r, &msg, NULL, 0, NULL, NULL, &reply);
	if (rc < 0)
		return rc;
	if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_OK)
		rc = radiance__client_break(r, -EPROTO, "unmap_model answered with %s",
					    rproto_server_name(reply));
	rdw__server_message__free_unpacked(reply, NULL);
	return rc;
}
