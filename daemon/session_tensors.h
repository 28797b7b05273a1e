/*
 * The shared tensors of a model (ListTensors / MapTensors, the end of
 * proto/radiance.proto; docs/engines.md "Shared tensors"): the checkpoint's
 * tensors of no linear layer, held by the model in one sealed memfd
 * (daemon/model.h, tensors_fd). ListTensors describes them for any
 * resident model; MapTensors also hands a session that holds the model a
 * dup of that memfd. The seals (write, shrink, grow, seal) make the pages
 * read-only for every process, the daemon included, and the memfd is
 * charged once to the model (its resident_bytes) whoever maps it. A fd the
 * client received, and any mapping of it, keeps the pages after the model
 * is unloaded: that memory is then the client's, outside the daemon's
 * accounting.
 *
 * Thread safety: loop thread only, like session.c.
 */
#ifndef RADIANCE_SESSION_TENSORS_H
#define RADIANCE_SESSION_TENSORS_H

#include <stdint.h>

#include "radiance.pb-c.h"

struct radiance_session;

/* The handlers: they reply (TensorList, with the memfd for MapTensors, or
 * Error ENOENT / EBUSY / ENOMEM) and never end the session. */
void session_handle_list_tensors(struct radiance_session *s, uint64_t tag,
				 const Rdw__ListTensors *lt);
void session_handle_map_tensors(struct radiance_session *s, uint64_t tag,
				const Rdw__MapTensors *mt);

#endif
