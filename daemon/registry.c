/* Resident models: load off the loop, upload on the executor, refcount. */
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "io.h"
#include "limit.h"
#include "log.h"
#include "text.h"

/* Resident bytes charged to one uid. */
struct uid_charge {
	uid_t uid;
	uint64_t bytes;
};

struct radiance_registry {
	uv_loop_t *loop;
	struct radiance_executor *exec;
	uv_async_t progress_async;
	struct radiance_resident *list;
	uint32_t next_id;
	int shutting_down;
	void (*shutdown_cb)(void *user);
	void *shutdown_user;
	struct registry_limits limits;
	/* charges: taken by the loader thread (plan_check), given back on the loop */
	pthread_mutex_t charge_lock;
	uint64_t charged;                 /* all models */
	struct uid_charge *uids;          /* uids with bytes > 0 */
	size_t nuids, uids_cap;
};

static void check_shutdown(struct radiance_registry *reg)
{
	if (reg->shutting_down && !reg->list && reg->shutdown_cb) {
		void (*cb)(void *) = reg->shutdown_cb;
		reg->shutdown_cb = NULL;
		cb(reg->shutdown_user);
	}
}

/* ---- names ---- */

/* Layer and tensor names come from the checkpoint's safetensors headers and
 * are listed to every client (GetModel) and logged. */
static int check_tensor_names(const struct radiance_model *m, char *err, size_t errlen)
{
	char why[400];
	for (size_t i = 0; i < m->n_layers; i++)
		if (m->layers[i].name &&
		    rtext_check("the layer name", m->layers[i].name, 0, why, sizeof why) < 0)
			goto bad;
	for (size_t i = 0; i < m->n_other; i++)
		if (m->other[i].name &&
		    rtext_check("the tensor name", m->other[i].name, 0, why, sizeof why) < 0)
			goto bad;
	return 0;
bad:
	snprintf(err, errlen, "%s in the checkpoint", why);
	return -EINVAL;
}

/* ---- limits ---- */

/* The entry of uid, or NULL; under charge_lock. */
static struct uid_charge *uid_entry(struct radiance_registry *reg, uid_t uid)
{
	for (size_t i = 0; i < reg->nuids; i++)
		if (reg->uids[i].uid == uid)
			return &reg->uids[i];
	return NULL;
}

/* Charges res's model (bytes, named name) to the total and to its uid, or
 * says which limit it would cross. Loader thread. */
static int charge(struct radiance_resident *res, const char *name, uint64_t bytes,
		  uint64_t shared_bytes, char *err, size_t errlen)
{
	struct radiance_registry *reg = res->reg;
	const struct registry_limits *lim = &reg->limits;
	char shown[160], doing[400], whose[48], size[32], lin[32], shared[32];
	int rc = 0;

	rtext_escape(name, shown, sizeof shown);
	limit_format_bytes(bytes, size, sizeof size);
	limit_format_bytes(bytes - shared_bytes, lin, sizeof lin);
	limit_format_bytes(shared_bytes, shared, sizeof shared);
	/* the shared tensors are charged with the linears: say what is what */
	snprintf(doing, sizeof doing, "loading model '%s' (%s resident: %s of linear weights, %s of "
		 "shared tensors)", shown, size, lin, shared);
	pthread_mutex_lock(&reg->charge_lock);
	struct uid_charge *u = res->asked_by ? uid_entry(reg, res->uid) : NULL;
	uint64_t mine = (u ? u->bytes : 0) + bytes;
	/* the total first: when both are passed (the per-uid limit defaults to
	 * the total), the refusal names the limit the administrator set */
	if (lim->max_model_bytes && reg->charged + bytes > lim->max_model_bytes) {
		limit_refusal(err, errlen, doing, "all models'", "resident bytes",
			       reg->charged + bytes, "max_model_bytes", lim->max_model_bytes, 1);
		rc = -EDQUOT;
	} else if (res->asked_by && lim->max_model_bytes_per_uid &&
		   mine > lim->max_model_bytes_per_uid) {
		snprintf(whose, sizeof whose, "uid %u's", (unsigned)res->uid);
		limit_refusal(err, errlen, doing, whose, "resident model bytes", mine,
			       "max_model_bytes_per_uid", lim->max_model_bytes_per_uid, 1);
		rc = -EDQUOT;
	} else if (res->asked_by && !u) {
		if (reg->nuids == reg->uids_cap) {
			size_t cap = reg->uids_cap ? 2 * reg->uids_cap : 8;
			struct uid_charge *v = realloc(reg->uids, cap * sizeof *v);
			if (!v) {
				snprintf(err, errlen, "out of memory");
				rc = -ENOMEM;
				goto out;
			}
			reg->uids = v;
			reg->uids_cap = cap;
		}
		u = &reg->uids[reg->nuids++];
		*u = (struct uid_charge){ res->uid, 0 };
	}
	if (rc == 0) {
		if (u)
			u->bytes += bytes;
		reg->charged += bytes;
		res->charged = bytes;
	}
out:
	pthread_mutex_unlock(&reg->charge_lock);
	return rc;
}

/* Gives res's charge back (a freed model, a failed load). */
static void uncharge(struct radiance_resident *res)
{
	struct radiance_registry *reg = res->reg;
	pthread_mutex_lock(&reg->charge_lock);
	if (res->charged) {
		reg->charged -= res->charged;
		struct uid_charge *u = res->asked_by ? uid_entry(reg, res->uid) : NULL;
		if (u && (u->bytes -= res->charged) == 0)
			*u = reg->uids[--reg->nuids];
		res->charged = 0;
	}
	pthread_mutex_unlock(&reg->charge_lock);
}

/* radiance_plan_check_fn: shapes, then the charge, before the loader
 * allocates anything for a layer. Loader thread. */
static int plan_check(void *user, const char *model_name, const struct radiance_layer *layers,
		      size_t n_layers, uint64_t resident_bytes, char *err, size_t errlen)
{
	struct radiance_resident *res = user;
	const struct registry_limits *lim = &res->reg->limits;
	uint64_t layer_bytes = 0;
	for (size_t i = 0; i < n_layers; i++) {
		const struct radiance_layer *l = &layers[i];
		layer_bytes += l->bytes;
		bool n_over = lim->max_n && l->n > lim->max_n;
		if (!n_over && !(lim->max_k && l->k > lim->max_k))
			continue;
		char shown[160], where[96];
		rtext_escape(l->name, shown, sizeof shown);
		limit_option(n_over ? "max_n" : "max_k", where, sizeof where);
		snprintf(err, errlen, "layer '%s' has %s = %u, above %s = %u (%s), the largest the "
			 "backend is sized for; refused before anything was allocated for it", shown,
			 n_over ? "N" : "K", n_over ? l->n : l->k, n_over ? "max_n" : "max_k",
			 n_over ? lim->max_n : lim->max_k, where);
		return -E2BIG;
	}
	/* resident_bytes is the layers' plus the shared tensors' memfd */
	return charge(res, model_name, resident_bytes,
		      resident_bytes > layer_bytes ? resident_bytes - layer_bytes : 0, err, errlen);
}

static void files_close(struct radiance_resident *res)
{
	for (size_t i = 0; i < res->nfiles; i++) {
		if (res->files[i].fd >= 0)
			close(res->files[i].fd);
		free((char *)res->files[i].name);
	}
	free(res->files);
	res->files = NULL;
	res->nfiles = 0;
}

static void unlink_resident(struct radiance_resident *res)
{
	struct radiance_resident **p = &res->reg->list;
	while (*p && *p != res)
		p = &(*p)->next;
	if (*p)
		*p = res->next;
}

static void resident_free(struct radiance_resident *res)
{
	struct radiance_registry *reg = res->reg;
	unlink_resident(res);
	uncharge(res);
	files_close(res);
	radiance_model_destroy((struct radiance_model *)res->em.model);
	free(res->em.handles);
	free(res->name);
	free(res->dir);
	free(res->want_name);
	free(res);
	check_shutdown(reg);
}

/* Answers every waiter with an error and frees the resident. */
static void resident_fail(struct radiance_resident *res)
{
	struct registry_waiter *w = res->waiters;
	res->waiters = NULL;
	/* a failed preload is fatal; the server says so, naming the directory */
	if (!res->preloaded) {
		char name[80];
		if (res->name)
			snprintf(name, sizeof name, " '%.64s'", res->name);
		else
			snprintf(name, sizeof name, " (no name yet)");
		log_warn("session %llu: loading model %u%s failed: %s",
			 (unsigned long long)res->asked_by, res->em.id, name, res->err);
	}
	while (w) {
		struct registry_waiter *next = w->next;
		w->res = NULL;
		w->done(w, NULL, res->status, res->err);
		w = next;
	}
	resident_free(res);
}

static void on_model_freed(struct exec_job *job)
{
	struct radiance_resident *res = job->user;
	log_info("model %u '%s' unloaded", res->em.id, res->name);
	resident_free(res);
}

/* Hands the model to the executor (upload or free), done called back on
 * the loop. */
static void model_job(struct radiance_resident *res, enum exec_job_kind kind,
		      void (*done)(struct exec_job *job))
{
	memset(&res->job, 0, sizeof res->job);
	res->job.kind = kind;
	res->job.model = &res->em;
	res->job.done = done;
	res->job.user = res;
	executor_submit(res->reg->exec, &res->job);
}

static void unload(struct radiance_resident *res)
{
	res->state = RESIDENT_UNLOADING;
	model_job(res, EXEC_JOB_MODEL_FREE, on_model_freed);
}

/* Hands every waiter a reference (or nothing, on error). */
static void answer_waiters(struct radiance_resident *res)
{
	struct registry_waiter *w = res->waiters;
	res->waiters = NULL;
	while (w) {
		struct registry_waiter *next = w->next;
		w->res = NULL;
		res->users++;
		w->done(w, res, 0, NULL);
		w = next;
	}
}

static void maybe_unload(struct radiance_resident *res)
{
	/* waiters on a READY model are attaches being answered (answer_later) */
	if (res->state == RESIDENT_READY && res->users == 0 && !res->waiters &&
	    (!res->preloaded || res->reg->shutting_down))
		unload(res);
}

static void on_uploaded(struct exec_job *job)
{
	struct radiance_resident *res = job->user;
	if (job->status < 0) {
		res->status = job->status;
		snprintf(res->err, sizeof res->err, "%s: %s", res->name, job->err);
		resident_fail(res);
		return;
	}
	res->state = RESIDENT_READY;
	log_info("model %u '%s' resident: %zu layers, %llu bytes%s", res->em.id, res->name,
		 res->em.model->n_layers, (unsigned long long)res->em.model->resident_bytes,
		 res->preloaded ? " (preloaded)" : "");
	answer_waiters(res);
	maybe_unload(res);
}

/* A usable resident other than `self` loaded from the same files (identity:
 * device, inode, size and mtime of every file), or NULL. Only identity makes
 * two loads the same checkpoint: a name alone never does. */
static struct radiance_resident *find_same_files(struct radiance_registry *reg,
						 const struct radiance_resident *self,
						 const char *identity)
{
	for (struct radiance_resident *r = reg->list; r; r = r->next) {
		if (r == self || r->state == RESIDENT_UNLOADING)
			continue;
		if (identity && *identity && strcmp(r->identity, identity) == 0)
			return r;
	}
	return NULL;
}

/* A usable resident other than `self` that already goes by `name`. */
static struct radiance_resident *find_named(struct radiance_registry *reg,
					    const struct radiance_resident *self, const char *name)
{
	for (struct radiance_resident *r = reg->list; r; r = r->next) {
		if (r == self || r->state == RESIDENT_UNLOADING)
			continue;
		if (name && r->name && strcmp(r->name, name) == 0)
			return r;
	}
	return NULL;
}

/* Moves res's waiters to `other` (the same checkpoint, found late). */
static void merge_into(struct radiance_resident *res, struct radiance_resident *other)
{
	struct registry_waiter *w = res->waiters;
	res->waiters = NULL;
	while (w) {
		struct registry_waiter *next = w->next;
		if (other->state == RESIDENT_READY) {
			w->res = NULL;
			other->users++;
			w->done(w, other, 0, NULL);
		} else {
			w->res = other;
			w->next = other->waiters;
			other->waiters = w;
		}
		w = next;
	}
	if (res->preloaded)
		other->preloaded = true;
	resident_free(res);
}

/* ---- threadpool side ---- */

static void on_progress(void *user, uint64_t done, uint64_t total)
{
	struct radiance_resident *res = user;
	atomic_store(&res->total_bytes, total);
	atomic_store(&res->done_bytes, done);
	uv_async_send(&res->reg->progress_async);
}

static void load_work(uv_work_t *work)
{
	struct radiance_resident *res = work->data;
	struct radiance_model *model = NULL;
	int rc;

	if (res->dir) {
		char **names = NULL;
		rc = rcheckpoint_list_files(res->dir, &names, res->err, sizeof res->err);
		if (rc < 0)
			goto out;
		res->files = calloc((size_t)rc, sizeof *res->files);
		if (!res->files) {
			for (int i = 0; i < rc; i++)
				free(names[i]);
			free(names);
			rc = -ENOMEM;
			snprintf(res->err, sizeof res->err, "out of memory");
			goto out;
		}
		res->nfiles = (size_t)rc;
		for (size_t i = 0; i < res->nfiles; i++) {
			res->files[i].name = names[i];
			res->files[i].fd = -1;
		}
		free(names);
		int dfd = open(res->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0) {
			rc = -errno;
			snprintf(res->err, sizeof res->err, "%s: %s", res->dir, strerror(errno));
			goto out;
		}
		for (size_t i = 0; i < res->nfiles; i++) {
			res->files[i].fd = openat(dfd, res->files[i].name, O_RDONLY | O_CLOEXEC);
			if (res->files[i].fd < 0) {
				rc = -errno;
				char path[PATH_MAX];
				rio_path_join(path, sizeof path, res->dir, res->files[i].name);
				rlog_errf(res->err, sizeof res->err, "%s: %s", path, strerror(-rc));
				close(dfd);
				goto out;
			}
		}
		close(dfd);
		rc = radiance_checkpoint_identity(res->files, res->nfiles, res->identity);
		if (rc < 0) {
			snprintf(res->err, sizeof res->err, "%s: identity: %s", res->dir, strerror(-rc));
			goto out;
		}
	}
	rc = radiance_checkpoint_load_checked(res->files, res->nfiles, res->want_name, plan_check,
					      on_progress, res, &model, res->err, sizeof res->err);
out:
	res->status = rc < 0 ? rc : 0;
	res->em.model = rc < 0 ? NULL : model;
}

/* ---- loop side ---- */

static void send_progress(struct radiance_resident *res, int force)
{
	uint64_t total = atomic_load(&res->total_bytes), done = atomic_load(&res->done_bytes);
	uint64_t t = rclock_ns();
	if (done == res->sent_bytes && res->sent_ns)
		return;
	if (!force && done != total && done - res->sent_bytes < total / 100 &&
	    t - res->sent_ns < 100000000ull)
		return;
	res->sent_bytes = done;
	res->sent_ns = t;
	for (struct registry_waiter *w = res->waiters; w; w = w->next)
		if (w->progress)
			w->progress(w, done, total);
}

static void on_progress_async(uv_async_t *h)
{
	struct radiance_registry *reg = h->data;
	for (struct radiance_resident *r = reg->list; r; r = r->next)
		if (r->state == RESIDENT_LOADING)
			send_progress(r, 0);
}

static void load_after(uv_work_t *work, int status)
{
	struct radiance_resident *res = work->data;
	struct radiance_registry *reg = res->reg;

	files_close(res);
	if (status == UV_ECANCELED) {
		res->status = -ECANCELED;
		snprintf(res->err, sizeof res->err, "load cancelled: the daemon is stopping");
	}
	if (res->status < 0) {
		resident_fail(res);
		return;
	}
	send_progress(res, 1);
	const struct radiance_model *m = res->em.model;
	if (!res->name) {
		/* config.json's text, which the client wrote: checked like a name it sent */
		const char *from = m->name ? m->name : "model";
		char why[400];
		if (rtext_check_model_name("the model name from config.json's _name_or_path", from,
					   REGISTRY_NAME_MAX, why, sizeof why) < 0) {
			res->status = -EINVAL;
			snprintf(res->err, sizeof res->err, "%s; give the load a name", why);
			resident_fail(res);
			return;
		}
		res->name = strdup(from);
		if (!res->name) {
			res->status = -ENOMEM;
			snprintf(res->err, sizeof res->err, "out of memory");
			resident_fail(res);
			return;
		}
	}
	if (check_tensor_names(m, res->err, sizeof res->err) < 0) {
		res->status = -EINVAL;
		resident_fail(res);
		return;
	}
	struct radiance_resident *other = find_same_files(reg, res, res->identity);
	if (other) {
		log_info("model '%s' is already resident as %u: attaching", res->name, other->em.id);
		merge_into(res, other);
		return;
	}
	other = find_named(reg, res, res->name);
	if (other) {
		/* same name, other files: attaching would compute with the wrong weights */
		res->status = -EEXIST;
		snprintf(res->err, sizeof res->err,
			 "a different checkpoint named '%s' is already resident as model %u; "
			 "load this one under another name", res->name, other->em.id);
		resident_fail(res);
		return;
	}
	if (reg->shutting_down && !res->waiters) {
		resident_free(res);
		return;
	}
	res->em.handles = calloc(m->n_layers ? m->n_layers : 1, sizeof *res->em.handles);
	if (!res->em.handles) {
		res->status = -ENOMEM;
		snprintf(res->err, sizeof res->err, "out of memory");
		resident_fail(res);
		return;
	}
	res->state = RESIDENT_UPLOADING;
	model_job(res, EXEC_JOB_MODEL_UPLOAD, on_uploaded);
}

static struct radiance_resident *resident_new(struct radiance_registry *reg)
{
	struct radiance_resident *res = calloc(1, sizeof *res);
	if (!res)
		return NULL;
	res->reg = reg;
	res->em.id = reg->next_id++;
	if (reg->next_id == 0)
		reg->next_id = 1;
	res->state = RESIDENT_LOADING;
	res->work.data = res;
	atomic_init(&res->done_bytes, 0);
	atomic_init(&res->total_bytes, 0);
	res->next = reg->list;
	reg->list = res;
	return res;
}

static void add_waiter(struct radiance_resident *res, struct registry_waiter *w)
{
	w->res = res;
	w->next = res->waiters;
	res->waiters = w;
}

/* A READY model answers at once, but never from inside the caller's call:
 * a zero-delay idle would do; a tiny job through the executor keeps the
 * order of replies simple and costs one round trip. */
struct late_answer {
	struct exec_job job;
	struct registry_waiter *w;
	struct radiance_resident *res;
};

static void on_late_answer(struct exec_job *job)
{
	struct late_answer *la = job->user;
	struct registry_waiter *w = la->w;
	struct radiance_resident *res = la->res;
	free(la);
	if (!w)
		return;   /* cancelled meanwhile: registry_cancel cleared la->w */
	w->late = NULL;
	/* still waiting on it: take it off the list and answer */
	struct registry_waiter **p = &res->waiters;
	while (*p && *p != w)
		p = &(*p)->next;
	if (*p)
		*p = w->next;
	w->res = NULL;
	res->users++;
	w->done(w, res, 0, NULL);
	maybe_unload(res);
}

static int answer_later(struct radiance_resident *res, struct registry_waiter *w)
{
	struct late_answer *la = calloc(1, sizeof *la);
	if (!la)
		return -ENOMEM;
	la->w = w;
	la->res = res;
	la->job.kind = EXEC_JOB_DEFER;
	la->job.done = on_late_answer;
	la->job.user = la;
	w->late = la;
	/* park the waiter on the ready model so cancel and unload see it */
	add_waiter(res, w);
	executor_submit(res->reg->exec, &la->job);
	return 0;
}

/* Length and characters are rtext_check's (common/text.h). */
static int valid_file_name(const char *n)
{
	return !strchr(n, '/') && strcmp(n, ".") && strcmp(n, "..");
}

int registry_load_files(struct radiance_registry *reg, const struct radiance_file *files,
			size_t nfiles, const char *name, struct registry_waiter *w, char *err,
			size_t errlen)
{
	char identity[65] = "";
	struct radiance_resident *res;
	int rc;

	if (reg->shutting_down) {
		rc = -ESHUTDOWN;
		snprintf(err, errlen, "the daemon is stopping");
		goto fail;
	}
	if (nfiles == 0) {
		rc = -EINVAL;
		snprintf(err, errlen, "LoadModel names no files");
		goto fail;
	}
	if (name && rtext_check_model_name("LoadModel.name", name, REGISTRY_NAME_MAX, err,
					   errlen) < 0) {
		rc = -EINVAL;
		goto fail;
	}
	for (size_t i = 0; i < nfiles; i++) {
		struct stat st;
		char field[48];
		snprintf(field, sizeof field, "LoadModel.file_names[%zu]", i);
		if (rtext_check(field, files[i].name ? files[i].name : "", REGISTRY_NAME_MAX,
					err, errlen) < 0) {
			rc = -EINVAL;
			goto fail;
		}
		if (!valid_file_name(files[i].name)) {
			rc = -EINVAL;
			snprintf(err, errlen, "%s '%s' is not a plain file name (it has a '/', or is "
				 "'.' or '..')", field, files[i].name);
			goto fail;
		}
		for (size_t j = 0; j < i; j++)
			if (strcmp(files[i].name, files[j].name) == 0) {
				rc = -EINVAL;
				snprintf(err, errlen, "file '%s' is named twice", files[i].name);
				goto fail;
			}
		/* the loader blocks a threadpool thread on reads: take regular files only */
		if (fstat(files[i].fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			rc = -EINVAL;
			snprintf(err, errlen, "file '%s': the fd is not a regular file", files[i].name);
			goto fail;
		}
	}
	rc = radiance_checkpoint_identity(files, nfiles, identity);
	if (rc < 0) {
		snprintf(err, errlen, "file identity: %s", strerror(-rc));
		goto fail;
	}

	if (!find_same_files(reg, NULL, identity) && name && (res = find_named(reg, NULL, name))) {
		rc = -EEXIST;
		snprintf(err, errlen, "a different checkpoint named '%s' is already resident as "
			 "model %u; load this one under another name", name, res->em.id);
		goto fail;
	}
	res = find_same_files(reg, NULL, identity);
	if (res) {
		for (size_t i = 0; i < nfiles; i++)
			close(files[i].fd);
		if (res->state == RESIDENT_READY)
			return answer_later(res, w);
		add_waiter(res, w);
		return 0;
	}

	res = resident_new(reg);
	if (!res) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	memcpy(res->identity, identity, sizeof identity);
	res->asked_by = w->session_id;
	res->uid = w->uid;
	res->files = calloc(nfiles, sizeof *res->files);
	if (!res->files || (name && !(res->want_name = strdup(name))) ||
	    (name && !(res->name = strdup(name)))) {
		resident_free(res);
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < nfiles; i++)
		res->files[res->nfiles++] = (struct radiance_file){ strdup(files[i].name), files[i].fd };
	for (size_t i = 0; i < nfiles; i++)
		if (!res->files[i].name) {
			resident_free(res);   /* closes the fds */
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	add_waiter(res, w);
	rc = uv_queue_work(reg->loop, &res->work, load_work, load_after);
	if (rc < 0) {
		res->waiters = NULL;
		w->res = NULL;
		resident_free(res);
		snprintf(err, errlen, "uv_queue_work: %s", uv_strerror(rc));
		return rc;
	}
	log_info("session %llu: loading model %u from %zu files%s%s%s",
		 (unsigned long long)res->asked_by, res->em.id, nfiles, name ? " as '" : "",
		 name ? name : "", name ? "'" : "");
	return 0;

fail:
	for (size_t i = 0; i < nfiles; i++)
		if (files[i].fd >= 0)
			close(files[i].fd);
	return rc;
}

int registry_preload(struct radiance_registry *reg, const char *dir, struct registry_waiter *w,
		     char *err, size_t errlen)
{
	char shown[300], why[400];
	rtext_escape(dir, shown, sizeof shown);
	/* named after the directory (config.c refuses two preloads that would
	 * share a name by the same rule), a name every client sees, so it is
	 * checked like one a client sends */
	size_t len;
	const char *last = rcheckpoint_dir_name(dir, &len);
	char *base = strndup(last, len);
	if (!base) {
		snprintf(err, errlen, "preload %s: out of memory", shown);
		return -ENOMEM;
	}
	if (rtext_check_model_name("its directory name (the model's name)", base,
				   REGISTRY_NAME_MAX, why, sizeof why) < 0) {
		snprintf(err, errlen, "preload %s: %s; rename the directory or link to it under a "
			 "plain name", shown, why);
		free(base);
		return -EINVAL;
	}
	struct radiance_resident *res = resident_new(reg);
	if (!res) {
		free(base);
		snprintf(err, errlen, "preload %s: out of memory", shown);
		return -ENOMEM;
	}
	res->preloaded = true;
	res->asked_by = w->session_id;
	res->dir = strdup(dir);
	res->want_name = base;
	res->name = strdup(base);
	if (!res->dir || !res->name) {
		resident_free(res);
		snprintf(err, errlen, "preload %s: out of memory", shown);
		return -ENOMEM;
	}
	add_waiter(res, w);
	int rc = uv_queue_work(reg->loop, &res->work, load_work, load_after);
	if (rc < 0) {
		res->waiters = NULL;
		w->res = NULL;
		resident_free(res);
		snprintf(err, errlen, "preload %s: uv_queue_work: %s", shown, uv_strerror(rc));
		return rc;
	}
	log_info("model %u: preloading %s", res->em.id, dir);
	return 0;
}

void registry_cancel(struct registry_waiter *w)
{
	struct radiance_resident *res = w->res;
	if (w->late) {
		((struct late_answer *)w->late)->w = NULL;
		w->late = NULL;
	}
	if (!res)
		return;
	struct registry_waiter **p = &res->waiters;
	while (*p && *p != w)
		p = &(*p)->next;
	if (*p)
		*p = w->next;
	w->res = NULL;
	maybe_unload(res);
}

struct radiance_resident *registry_find_id(struct radiance_registry *reg, uint32_t id)
{
	for (struct radiance_resident *r = reg->list; r; r = r->next)
		if (r->state == RESIDENT_READY && r->em.id == id)
			return r;
	return NULL;
}

struct radiance_resident *registry_find_name(struct radiance_registry *reg, const char *name)
{
	for (struct radiance_resident *r = reg->list; r; r = r->next)
		if (r->state == RESIDENT_READY && strcmp(r->name, name) == 0)
			return r;
	return NULL;
}

struct radiance_resident *registry_next(struct radiance_registry *reg, struct radiance_resident *r)
{
	for (r = r ? r->next : reg->list; r; r = r->next)
		if (r->state == RESIDENT_READY)
			return r;
	return NULL;
}

void registry_ref(struct radiance_resident *res)
{
	res->users++;
}

void registry_unref(struct radiance_resident *res)
{
	if (res->users > 0)
		res->users--;
	maybe_unload(res);
}

void registry_unpin(struct radiance_resident *res)
{
	res->preloaded = false;
	maybe_unload(res);
}

void registry_charged(struct radiance_registry *reg, uid_t uid, uint64_t *total,
		      uint64_t *of_uid)
{
	pthread_mutex_lock(&reg->charge_lock);
	const struct uid_charge *u = uid_entry(reg, uid);
	*total = reg->charged;
	*of_uid = u ? u->bytes : 0;
	pthread_mutex_unlock(&reg->charge_lock);
}

int registry_create(uv_loop_t *loop, struct radiance_executor *exec,
		    const struct registry_limits *limits, struct radiance_registry **out)
{
	struct radiance_registry *reg = calloc(1, sizeof *reg);
	if (!reg)
		return -ENOMEM;
	reg->loop = loop;
	reg->exec = exec;
	reg->next_id = 1;
	if (limits)
		reg->limits = *limits;
	int rc = uv_async_init(loop, &reg->progress_async, on_progress_async);
	if (rc < 0) {
		free(reg);
		return rc;
	}
	pthread_mutex_init(&reg->charge_lock, NULL);
	reg->progress_async.data = reg;
	*out = reg;
	return 0;
}

void registry_shutdown(struct radiance_registry *reg, void (*cb)(void *user), void *user)
{
	reg->shutting_down = 1;
	reg->shutdown_cb = cb;
	reg->shutdown_user = user;
	for (struct radiance_resident *r = reg->list, *next; r; r = next) {
		next = r->next;
		if (r->state == RESIDENT_LOADING)
			uv_cancel((uv_req_t *)&r->work);   /* runs load_after with UV_ECANCELED if queued */
		else
			maybe_unload(r);
	}
	check_shutdown(reg);
}

static void on_registry_closed(uv_handle_t *h)
{
	struct radiance_registry *reg = h->data;
	pthread_mutex_destroy(&reg->charge_lock);
	free(reg->uids);
	free(reg);
}

void registry_destroy(struct radiance_registry *reg)
{
	uv_close((uv_handle_t *)&reg->progress_async, on_registry_closed);
}
