/*
 * Checkpoint loader: files -> validated quant config -> safetensors headers
 * -> routing plan (header only) -> per layer: read, data checks, repack. See
 * checkpoint.h for the contract and docs/loader.md for the rules.
 *
 * Everything about the checkpoint is decided from the safetensors headers
 * before a single tensor byte is read (the plan), so a contradiction between
 * config and tensors costs nothing; only then is each layer's data copied
 * out of its file (pread, into private memory), its qzeros, g_idx and scales
 * checked on that copy, and the copy repacked.
 *
 * This file runs a load; each stage lives in its own checkpoint_*.c
 * (checkpoint_private.h says which).
 */
#include "checkpoint.h"

#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "checkpoint_private.h"

/* The last component of config.json's _name_or_path ("org/name/" ->
 * "name", as rcheckpoint_dir_name cuts a directory), or "model" where it has
 * none: missing, empty, all slashes, or "." or ".." (transformers writes
 * "./" for a model saved from the current directory). */
static char *default_name(const json_t *config)
{
	const json_t *v = config ? json_object_get(config, "_name_or_path") : NULL;
	if (json_is_string(v)) {
		size_t len;
		const char *last = rcheckpoint_dir_name(json_string_value(v), &len);
		if (len && !rcheckpoint_dot_name(last, len))
			return strndup(last, len);
	}
	return strdup("model");
}

static void loader_finish(struct ck_loader *L)
{
	for (size_t i = 0; i < L->n_plans; i++)
		free(L->plans[i].module);
	free(L->plans);
	free(L->refs);
	free(L->scratch);
	for (size_t i = 0; i < L->n_st; i++)
		radiance_st_close(L->st[i]);
	free(L->st);
	if (L->have_qc)
		radiance_quant_config_finish(&L->qc);
	json_decref(L->config);
#ifdef __GLIBC__
	/* A load's buffers (the scratch grows to its largest tensor) come from
	 * the loader thread's malloc arena, which keeps freed memory for the
	 * next allocation; loads are rare and the daemon lives long, so hand
	 * it back now rather than keep tens of MB per loader thread. */
	malloc_trim(0);
#endif
}

int radiance_checkpoint_load(const struct radiance_file *files, size_t nfiles, const char *name,
			     radiance_progress_fn progress, void *user,
			     struct radiance_model **out, char *err, size_t errlen)
{
	return radiance_checkpoint_load_checked(files, nfiles, name, NULL, progress, user, out, err,
						errlen);
}

int radiance_checkpoint_load_checked(const struct radiance_file *files, size_t nfiles,
				     const char *name, radiance_plan_check_fn check,
				     radiance_progress_fn progress, void *user,
				     struct radiance_model **out, char *err, size_t errlen)
{
	struct ck_loader L = { .err = err, .errlen = errlen };
	struct radiance_model *m = NULL;
	const struct radiance_file *f;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!out || (!files && nfiles)) {
		ck_err(&L, "radiance_checkpoint_load: NULL argument");
		return -EINVAL;
	}
	*out = NULL;
	for (size_t i = 0; i < nfiles; i++) {
		if (!files[i].name || files[i].fd < 0) {
			ck_err(&L, "file %zu: %s, expected a basename and an open fd", i,
			       files[i].name ? "negative fd" : "NULL name");
			return -EINVAL;
		}
		for (size_t j = 0; j < i; j++)
			if (strcmp(files[i].name, files[j].name) == 0) {
				ck_err(&L, "%s: given twice, expected each checkpoint file once", files[i].name);
				return -EINVAL;
			}
	}

	if ((f = ck_find_file(files, nfiles, CK_CONFIG)) && (rc = radiance__ck_read_json(&L, f->fd, CK_CONFIG, &L.config)))
		goto out;
	if ((rc = radiance__ck_load_quant_config(&L, files, nfiles)))
		goto out;

	if ((rc = radiance__ck_open_weights(&L, files, nfiles)) || (rc = radiance__ck_plan_layers(&L)))
		goto out;

	m = calloc(1, sizeof *m);
	if (m)
		m->tensors_fd = -1;   /* before anything can fail: destroy closes it */
	if (!m || !(m->layers = calloc(L.n_plans, sizeof *m->layers))) {
		rc = ck_nomem(&L, "model");
		goto out;
	}
	m->name = name ? strdup(name) : default_name(L.config);
	if (!m->name) {
		rc = ck_nomem(&L, "model name");
		goto out;
	}
	m->group_size = RADIANCE_GROUP_SIZE;
	m->bits = 4;
	if ((rc = radiance__ck_build_other(&L, m)) ||
	    (check && (rc = radiance__ck_check_plan(&L, m->name, m->tensors_bytes, check, user))))
		goto out;

	uint64_t total = 0, done = 0;
	for (size_t i = 0; i < L.n_plans; i++)
		total += L.plans[i].src_bytes;
	for (size_t i = 0; i < m->n_other; i++)
		total += m->other[i].bytes;
	if (progress)
		progress(user, 0, total);
	for (size_t i = 0; i < L.n_plans; i++) {
		struct radiance_layer *l = &m->layers[i];
		m->n_layers = i + 1;       /* so destroy frees a half-built layer */
		if ((rc = radiance__ck_build_layer(&L, &L.plans[i], l)))
			goto out;
		l->name = L.plans[i].module;
		L.plans[i].module = NULL;
		m->resident_bytes += l->bytes;
		done += L.plans[i].src_bytes;
		if (progress && done < total)
			progress(user, done, total);
	}
	if ((rc = radiance__ck_build_tensors(&L, m)))
		goto out;
	m->resident_bytes += m->tensors_bytes;
	if (progress)
		progress(user, total, total);
	*out = m;
	m = NULL;
out:
	radiance_model_destroy(m);
	loader_finish(&L);
	return rc;
}
