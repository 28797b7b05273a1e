/*
 * The resident models: each checkpoint loaded once, shared by every session
 * that loads or attaches it, found by id, by name, or by the identity of its
 * files (daemon/checkpoint.h, radiance_checkpoint_identity). A model is
 * refcounted by sessions (users) and unloaded when its last user lets go,
 * unless it was preloaded from the daemon's config (until registry_unpin).
 *
 * Loading runs off the loop: the checkpoint is parsed and repacked on the
 * libuv threadpool (uv_queue_work), then its layers are uploaded to the
 * backend by the executor (an EXEC_JOB_MODEL_UPLOAD job: the backend is
 * single-threaded). Progress reaches waiters on the loop thread, throttled
 * to one report per 1% or 100 ms. A second load of the same checkpoint
 * (same file identity; a name alone never makes two loads the same) while
 * the first runs just waits for it.
 *
 * Unloading: the model's backend layers are freed by an EXEC_JOB_MODEL_FREE
 * job; the host copy is freed when that job is done (no pass can use it
 * then; see executor.h).
 *
 * Limits (struct registry_limits, docs/daemon.md "Limits"): once the loader
 * has planned a checkpoint from its headers, before anything is allocated
 * for a layer, every layer's N and K is checked against max_n and max_k
 * (-E2BIG) and the model's resident bytes are charged: to the total of all
 * models and, for a load a session started, to the uid of that session
 * (the peer credential), -EDQUOT when either would go above its limit. A
 * model is charged once, to the uid whose session loaded it, however many
 * sessions of whichever uids attach to it later (deduplicated loads
 * attach too, and cost nothing); a preload counts for the total only. The
 * charge is given back when the model is freed (or the load fails).
 *
 * Thread safety: loop thread only, except where noted.
 */
#ifndef RADIANCE_REGISTRY_H
#define RADIANCE_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "checkpoint.h"
#include "executor.h"
#include "text.h"   /* RTEXT_NAME_MAX */

struct radiance_registry;
struct radiance_resident;

enum resident_state {
	RESIDENT_LOADING,     /* parsing on the threadpool */
	RESIDENT_UPLOADING,   /* layers going to the backend */
	RESIDENT_READY,
	RESIDENT_UNLOADING,   /* backend layers being freed; invisible to lookups */
};

/* Someone waiting for a load (a session's LoadModel, or a preload). On
 * success the registry has taken one user reference for the waiter before
 * calling done. */
struct registry_waiter {
	uint64_t session_id;           /* who asks, for the log: a session, 0 for a preload */
	uid_t uid;                     /* the session's peer uid: charged for a load it starts */
	void (*progress)(struct registry_waiter *w, uint64_t done_bytes, uint64_t total_bytes);
	void (*done)(struct registry_waiter *w, struct radiance_resident *res, int status,
		     const char *err);
	/* private */
	struct radiance_resident *res;
	struct registry_waiter *next;
	void *late;                    /* a pending answer for a READY model */
};

struct radiance_resident {
	struct exec_model em;          /* em.id is the model_id clients use */
	char *name;
	char identity[65];             /* "" until known (preloads: after parsing) */
	enum resident_state state;
	uint32_t users;                /* sessions holding a reference */
	bool preloaded;
	struct radiance_registry *reg;
	struct radiance_resident *next;
	/* load */
	struct registry_waiter *waiters;
	struct radiance_file *files;   /* client-sent files (names owned), or NULL */
	size_t nfiles;
	char *dir;                     /* preload directory, or NULL */
	char *want_name;               /* name asked for, or NULL */
	uint64_t asked_by;             /* session that started the load, 0: a preload */
	uid_t uid;                     /* ... and its uid (not charged for a preload) */
	uint64_t charged;              /* resident bytes charged, under the registry's lock */
	uv_work_t work;
	int status;
	char err[512];
	_Atomic uint64_t done_bytes, total_bytes;   /* written by the loader thread */
	uint64_t sent_bytes, sent_ns;               /* progress throttle */
	struct exec_job job;
};

/* What loads are held to; 0 in a field: no limit. */
struct registry_limits {
	uint64_t max_model_bytes;          /* resident bytes of all models */
	uint64_t max_model_bytes_per_uid;  /* ... of the models one uid's sessions loaded */
	uint32_t max_n, max_k;             /* largest layer N and K the backend is sized for */
};

/* limits is copied; NULL: none. */
int registry_create(uv_loop_t *loop, struct radiance_executor *exec,
		    const struct registry_limits *limits, struct radiance_registry **out);
/* Frees the registry; registry_shutdown must have completed. */
void registry_destroy(struct radiance_registry *reg);

/* Longest model name (and file name) a client may give. */
#define REGISTRY_NAME_MAX RTEXT_NAME_MAX

/* Loads (or attaches to) the checkpoint whose files a client sent. Takes
 * ownership of files[i].fd (closed when no longer needed, on every path) and
 * copies the names. name may be NULL. w->done is always called later (never
 * from inside this call) unless registry_cancel() is called first.
 * Returns 0, or -errno (then w is not called and every fd is closed) with
 * err set: -EINVAL for a bad name or file name (rtext_check, common/text.h),
 * -ESHUTDOWN, -ENOMEM. */
int registry_load_files(struct radiance_registry *reg, const struct radiance_file *files,
			size_t nfiles, const char *name, struct registry_waiter *w, char *err,
			size_t errlen);

/* Loads a checkpoint directory at start; it is preloaded (never unloaded
 * before shutdown) and named after the directory. w as above. Returns 0, or
 * -errno with err set (a whole sentence naming the directory): -EINVAL when
 * the directory's name is not a valid model name (rtext_check, common/text.h),
 * -ENOMEM, or uv_queue_work's error. */
int registry_preload(struct radiance_registry *reg, const char *dir, struct registry_waiter *w,
		     char *err, size_t errlen);

/* The waiter no longer wants its answer (its session closed). */
void registry_cancel(struct registry_waiter *w);

/* READY residents only; NULL when none. */
struct radiance_resident *registry_find_id(struct radiance_registry *reg, uint32_t id);
struct radiance_resident *registry_find_name(struct radiance_registry *reg, const char *name);

/* Iterates READY residents: pass NULL first. */
struct radiance_resident *registry_next(struct radiance_registry *reg, struct radiance_resident *r);

/* Takes / drops a user reference. Dropping the last of a model that is not
 * preloaded unloads it. */
void registry_ref(struct radiance_resident *res);
void registry_unref(struct radiance_resident *res);

/* Drops the daemon's own hold on a preloaded model: it is unloaded now if no
 * session uses it, else when the last one lets go. */
void registry_unpin(struct radiance_resident *res);

/* Resident bytes charged now (loads past their plan included): of all
 * models, and of those uid loaded. Any thread. */
void registry_charged(struct radiance_registry *reg, uid_t uid, uint64_t *total,
		      uint64_t *of_uid);

/* Unloads everything (preloaded models too) once running loads finish;
 * every session must have dropped its references. cb runs on the loop when
 * nothing is resident or loading any more. */
void registry_shutdown(struct radiance_registry *reg, void (*cb)(void *user), void *user);

#endif
