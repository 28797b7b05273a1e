/*
 * A session's mapped models (MapModel / UnmapModel, docs/mapped.md).
 *
 * MapModel hands a session the handle of a model's one exportable device
 * allocation (an fd through SCM_RIGHTS, or a legacy IPC handle) and the
 * layout of its layers inside it. The session must already hold the model
 * (LoadModel/AttachModel): that reference is what keeps the daemon's copy
 * alive, so while a model is mapped the session may not release it
 * (ReleaseModel answers EBUSY until as many UnmapModel as there were
 * MapModel, so that two mappings in one process are each undone on their
 * own); closing the session drops both. What a client process still has mapped after that stays alive on
 * its own (VMM memory is reference-counted by the driver), outside the
 * daemon's accounting.
 *
 * Thread safety: loop thread only, like session.c.
 */
#ifndef RADIANCE_SESSION_MAP_H
#define RADIANCE_SESSION_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "radiance.pb-c.h"

struct radiance_session;

struct session_map {
	uint32_t model_id;
	uint32_t count;           /* MapModels not yet undone by an UnmapModel */
};

struct session_maps {
	struct session_map *v;    /* models this session maps, each once */
	size_t n, cap;
};

void session_maps_finish(struct session_maps *m);
/* 1 when the session has model_id mapped. */
int session_maps_has(const struct session_maps *m, uint32_t model_id);

/* The MapModel / UnmapModel handlers: they reply (ModelMapping with its fd,
 * Ok, or Error) and never end the session. */
void session_handle_map(struct radiance_session *s, uint64_t tag, const Rdw__MapModel *mm);
void session_handle_unmap(struct radiance_session *s, uint64_t tag, const Rdw__UnmapModel *um);

#endif
