/*
 * Which files of a checkpoint directory LoadModel sends. The daemon reads
 * only the descriptors it is given, so this is the set its loader needs and
 * nothing else (no tokenizer, no README): the configs, and the safetensors
 * weights either whole or sharded through the index's weight_map.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "client-private.h"

struct names {
	char **v;
	size_t n, cap;
};

static int names_add(struct names *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], name) == 0)
			return 0;
	if (s->n + 2 > s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 8;
		char **p = realloc(s->v, cap * sizeof *p);
		if (!p)
			return -ENOMEM;
		s->v = p;
		s->cap = cap;
	}
	s->v[s->n] = strdup(name);
	if (!s->v[s->n])
		return -ENOMEM;
	s->v[++s->n] = NULL;
	return 0;
}

/* 0 when dir/name is a regular file (after symlinks), -EINVAL when it is
 * something else (a directory, a FIFO, a device such as a link to
 * /dev/zero), else -errno of stat (-ENOENT: missing). */
static int exists(const char *dir, const char *name)
{
	char path[4096];
	struct stat st;
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return -ENAMETOOLONG;
	if (stat(path, &st) < 0)
		return -errno;
	return S_ISREG(st.st_mode) ? 0 : -EINVAL;
}

/* The text for a failed exists(). */
static void file_error(char *err, size_t errlen, const char *dir, const char *name, int rc)
{
	if (rc == -EINVAL)
		snprintf(err, errlen, "%s/%s is not a regular file", dir, name);
	else
		snprintf(err, errlen, "%s/%s: %s", dir, name, strerror(-rc));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Shard names from model.safetensors.index.json's weight_map, sorted. */
static int add_shards(const char *dir, struct names *s, char *err, size_t errlen)
{
	char path[4096];
	json_error_t jerr;
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
	json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		snprintf(err, errlen, "%s: %s (line %d)", path, jerr.text, jerr.line);
		return -EINVAL;
	}
	int rc = 0;
	json_t *map = json_object_get(root, "weight_map");
	if (!json_is_object(map)) {
		snprintf(err, errlen, "%s: no weight_map object", path);
		rc = -EINVAL;
		goto out_root;
	}
	struct names shards = { 0 };
	const char *key;
	json_t *val;
	json_object_foreach(map, key, val) {
		const char *f = json_string_value(val);
		if (!f || !*f || strchr(f, '/')) {
			snprintf(err, errlen, "%s: weight_map[\"%s\"] is not a file name", path, key);
			rc = -EINVAL;
			goto out_shards;
		}
		if ((rc = names_add(&shards, f)) < 0)
			goto out_shards;
	}
	if (shards.n == 0) {
		snprintf(err, errlen, "%s: empty weight_map", path);
		rc = -EINVAL;
		goto out_shards;
	}
	qsort(shards.v, shards.n, sizeof *shards.v, cmp_str);
	for (size_t i = 0; i < shards.n && rc == 0; i++)
		rc = names_add(s, shards.v[i]);
out_shards:
	radiance__client_checkpoint_files_free(shards.v);
out_root:
	json_decref(root);
	return rc;
}

int radiance__client_checkpoint_files(const char *dir, char ***out, char *err, size_t errlen)
{
	struct names s = { 0 };
	int rc;
	char dummy[1];
	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof dummy;
	}
	err[0] = '\0';
	*out = NULL;

	if ((rc = exists(dir, "config.json")) < 0) {
		file_error(err, errlen, dir, "config.json", rc);
		goto fail;
	}
	if ((rc = names_add(&s, "config.json")) < 0)
		goto fail;
	/* optional, but when present it must be a file, not silently skipped */
	if ((rc = exists(dir, "quantization_config.json")) == -EINVAL) {
		file_error(err, errlen, dir, "quantization_config.json", rc);
		goto fail;
	}
	if (rc == 0 && (rc = names_add(&s, "quantization_config.json")) < 0)
		goto fail;
	int idx = exists(dir, "model.safetensors.index.json");
	int whole = exists(dir, "model.safetensors");
	if (idx == 0) {
		if ((rc = names_add(&s, "model.safetensors.index.json")) < 0 ||
		    (rc = add_shards(dir, &s, err, errlen)) < 0)
			goto fail;
	} else if (whole == 0) {
		if ((rc = names_add(&s, "model.safetensors")) < 0)
			goto fail;
	} else if (idx != -ENOENT) {
		file_error(err, errlen, dir, "model.safetensors.index.json", idx);
		rc = idx;
		goto fail;
	} else if (whole != -ENOENT) {
		file_error(err, errlen, dir, "model.safetensors", whole);
		rc = whole;
		goto fail;
	} else {
		snprintf(err, errlen, "%s: neither model.safetensors nor model.safetensors.index.json",
			 dir);
		rc = -ENOENT;
		goto fail;
	}
	*out = s.v;
	return 0;
fail:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	radiance__client_checkpoint_files_free(s.v);
	return rc;
}

void radiance__client_checkpoint_files_free(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}
