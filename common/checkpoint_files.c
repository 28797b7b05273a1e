/* The checkpoint directory rules; see checkpoint_files.h. */
#include "checkpoint_files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "log.h"
#include "text.h"

bool rcheckpoint_shard_name_ok(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

int rcheckpoint_single_beside_index(const json_t *weight_map, const char *where, char *err,
				    size_t errlen)
{
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)weight_map, key, v)
		if (json_is_string(v) && strcmp(json_string_value(v), RADIANCE_CHECKPOINT_SINGLE) == 0)
			return 0;
	rlog_errf(err, errlen, "%s: both %s and %s, and the index does not name %s as a shard: "
		  "which holds the weights is ambiguous (transformers would load %s, vLLM the "
		  "shards the index names); remove the one that is stale", where,
		  RADIANCE_CHECKPOINT_SINGLE, RADIANCE_CHECKPOINT_INDEX, RADIANCE_CHECKPOINT_SINGLE,
		  RADIANCE_CHECKPOINT_SINGLE);
	return -EINVAL;
}

const char *rcheckpoint_dir_name(const char *dir, size_t *len)
{
	size_t end = strlen(dir);
	while (end > 1 && dir[end - 1] == '/')
		end--;
	size_t start = end;
	while (start && dir[start - 1] != '/')
		start--;
	*len = end - start;
	return dir + start;
}

int rcheckpoint_dot_name(const char *s, size_t len)
{
	return (len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.');
}

#define LFS_VERSION "version https://git-lfs.github.com/spec/v1"

/* The value of the pointer line "key value", copied up to its end of line
 * (at most len - 1 bytes, only the characters an oid or a size holds), or
 * "?" when the line is missing. */
static const char *lfs_field(const char *p, size_t n, const char *key, char *out, size_t len)
{
	size_t klen = strlen(key);
	snprintf(out, len, "?");
	for (size_t i = 0; i + klen < n; i++) {
		if ((i && p[i - 1] != '\n') || memcmp(p + i, key, klen) != 0)
			continue;
		size_t o = 0;
		for (i += klen; i < n && o + 1 < len && p[i] && p[i] != '\n' &&
		     strchr("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:-_", p[i]); i++)
			out[o++] = p[i];
		out[o] = '\0';
		if (!o)
			snprintf(out, len, "?");
		break;
	}
	return out;
}

bool rcheckpoint_lfs_pointer(const void *buf, size_t len, const char *name, const char *what,
			     char *err, size_t errlen)
{
	char oid[80], size[24];
	const size_t vlen = sizeof LFS_VERSION - 1;
	if (len < vlen || memcmp(buf, LFS_VERSION, vlen) != 0)
		return false;
	/* the spec caps a pointer at 1024 bytes; its oid and size lines are all
	 * the message needs */
	if (len > 1024)
		len = 1024;
	lfs_field(buf, len, "oid ", oid, sizeof oid);
	lfs_field(buf, len, "size ", size, sizeof size);
	rlog_errf(err, errlen, "%s is a Git LFS pointer (oid %s, size %s), not %s: "
		  "run `git lfs pull` in the checkpoint's repository", name, oid, size, what);
	return true;
}

int rcheckpoint_read_json(int fd, const char *fname, json_t **out, char *err,
				  size_t errlen)
{
	struct stat st;
	json_error_t jerr;
	char *buf;
	int rc = 0;

	*out = NULL;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		rlog_errf(err, errlen, "%s: fstat: %s", fname, strerror(-rc));
		return rc == -EBADF ? -EINVAL : -EIO;
	}
	if (!S_ISREG(st.st_mode)) {
		rlog_errf(err, errlen, "%s: not a regular file, expected a JSON file", fname);
		return -EINVAL;
	}
	if ((uint64_t)st.st_size > RADIANCE_CHECKPOINT_MAX_JSON) {
		rlog_errf(err, errlen, "%s: %lld bytes, expected a JSON file of at most %u bytes",
			       fname, (long long)st.st_size, RADIANCE_CHECKPOINT_MAX_JSON);
		return -EINVAL;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		rlog_errf(err, errlen, "out of memory (%s)", fname);
		return -ENOMEM;
	}
	ssize_t r = rio_pread(fd, buf, (size_t)st.st_size, 0);
	if (r != (ssize_t)st.st_size) {
		if (r < 0)
			rlog_errf(err, errlen, "%s: read of %lld bytes failed: %s", fname,
				       (long long)st.st_size, strerror((int)-r));
		else
			rlog_errf(err, errlen,
				       "%s: file shrank to %zd bytes while loading (expected %lld)", fname,
				       r, (long long)st.st_size);
		rc = -EIO;
		goto out;
	}
	if (rcheckpoint_lfs_pointer(buf, (size_t)r, fname, "the JSON", err, errlen)) {
		rc = -EINVAL;
		goto out;
	}
	*out = json_loadb(buf, (size_t)r, JSON_REJECT_DUPLICATES, &jerr);
	if (!*out) {
		rlog_errf(err, errlen,
			       "%s: not valid JSON: %s (line %d, column %d), expected a JSON object",
			       fname, jerr.text, jerr.line, jerr.column);
		rc = -EINVAL;
	} else if (!json_is_object(*out)) {
		rlog_errf(err, errlen, "%s: top level is not a JSON object", fname);
		json_decref(*out);
		*out = NULL;
		rc = -EINVAL;
	}
out:
	free(buf);
	return rc;
}

/* 1 when dir/name is a regular file (after symlinks), 0 when it is missing
 * and not required, else -errno with err set: -EINVAL for something that is
 * not a regular file (a directory, a FIFO that would hang an open, a link
 * to /dev/zero that never ends). */
static int stat_regular(int dfd, const char *dir, const char *name, bool required, char *err,
			size_t errlen)
{
	struct stat st;
	char path[PATH_MAX];
	if (fstatat(dfd, name, &st, 0) < 0) {
		int e = errno;
		/* A symlink to nothing (a Hugging Face cache snapshot whose blob is
		 * gone or was never downloaded) is there as far as `ls` shows: say
		 * so, with its target, rather than "not found" or "no weights". */
		char target[PATH_MAX];
		ssize_t tn = e == ENOENT ? readlinkat(dfd, name, target, sizeof target - 1) : -1;
		if (tn >= 0) {
			target[tn] = '\0';
			char shown[PATH_MAX * 4];   /* a link may hold any byte but NUL */
			rtext_escape(target, shown, sizeof shown);
			rio_path_join(path, sizeof path, dir, name);
			rlog_errf(err, errlen, "%s is a symlink to %s, which does not exist", path,
				  shown);
			return -ENOENT;
		}
		if (e == ENOENT && !required)
			return 0;
		rio_path_join(path, sizeof path, dir, name);
		rlog_errf(err, errlen, "%s: %s", path,
			       e == ENOENT ? "not found, expected it in a checkpoint directory"
					   : strerror(e));
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		rio_path_join(path, sizeof path, dir, name);
		rlog_errf(err, errlen, "%s is not a regular file", path);
		return -EINVAL;
	}
	return 1;
}

static int names_add(char ***names, size_t *n, const char *s)
{
	for (size_t i = 0; i < *n; i++)
		if (strcmp((*names)[i], s) == 0)
			return 0;
	char **nn = realloc(*names, (*n + 2) * sizeof *nn);
	if (!nn)
		return -ENOMEM;
	*names = nn;
	if (!(nn[*n] = strdup(s)))
		return -ENOMEM;
	nn[++*n] = NULL;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void rcheckpoint_files_free(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}

/* Adds the index's shards to the list, sorted after what is there; single:
 * whether model.safetensors is there too. */
static int add_shards(int dfd, const char *dir, bool single, char ***list, size_t *n,
		      char *err, size_t errlen)
{
	json_t *idx = NULL, *v;
	const char *key;
	size_t first_shard = *n;
	char index[PATH_MAX];   /* the index's path, for messages */
	int rc;

	rio_path_join(index, sizeof index, dir, RADIANCE_CHECKPOINT_INDEX);

	int ifd = openat(dfd, RADIANCE_CHECKPOINT_INDEX, O_RDONLY | O_CLOEXEC);
	if (ifd < 0) {
		rc = -errno;
		rlog_errf(err, errlen, "%s: %s", index, strerror(-rc));
		return rc;
	}
	rc = rcheckpoint_read_json(ifd, RADIANCE_CHECKPOINT_INDEX, &idx, err, errlen);
	close(ifd);
	if (rc)
		return rc;
	json_t *wm = json_object_get(idx, "weight_map");
	if (!json_is_object(wm)) {
		rlog_errf(err, errlen, "%s: \"weight_map\" is missing or not an object, "
			       "expected tensor name -> shard file", index);
		rc = -EINVAL;
		goto out;
	}
	if (json_object_size(wm) == 0) {
		rlog_errf(err, errlen, "%s: empty weight_map, expected tensor name -> shard "
			       "file", index);
		rc = -EINVAL;
		goto out;
	}
	if (single && (rc = rcheckpoint_single_beside_index(wm, dir, err, errlen)))
		goto out;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !rcheckpoint_shard_name_ok(json_string_value(v))) {
			rlog_errf(err, errlen, "%s: weight_map[\"%s\"] is not a shard file "
				       "name, expected a plain basename", index, key);
			rc = -EINVAL;
			goto out;
		}
		if ((rc = names_add(list, n, json_string_value(v))))
			goto out;
	}
	for (size_t i = first_shard; i < *n; i++)
		if ((rc = stat_regular(dfd, dir, (*list)[i], true, err, errlen)) < 0)
			goto out;
	rc = 0;
	qsort(*list + first_shard, *n - first_shard, sizeof **list, cmp_str);
out:
	json_decref(idx);
	return rc;
}

int rcheckpoint_list_files(const char *dir, char ***names, char *err, size_t errlen)
{
	char **list = NULL;
	size_t n = 0;
	int dfd, rc;

	if (!names || !dir)
		return -EINVAL;
	*names = NULL;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = -errno;
		rlog_errf(err, errlen, "%s: %s", dir, strerror(-rc));
		return rc;
	}
	if ((rc = stat_regular(dfd, dir, RADIANCE_CHECKPOINT_CONFIG, true, err, errlen)) < 0)
		goto out;
	if ((rc = names_add(&list, &n, RADIANCE_CHECKPOINT_CONFIG)))
		goto out;
	if ((rc = stat_regular(dfd, dir, RADIANCE_CHECKPOINT_QCONFIG, false, err, errlen)) < 0)
		goto out;
	if (rc == 1 && (rc = names_add(&list, &n, RADIANCE_CHECKPOINT_QCONFIG)))
		goto out;
	int index = stat_regular(dfd, dir, RADIANCE_CHECKPOINT_INDEX, false, err, errlen);
	if ((rc = index) < 0)
		goto out;
	int single = stat_regular(dfd, dir, RADIANCE_CHECKPOINT_SINGLE, false, err, errlen);
	if ((rc = single) < 0)
		goto out;
	if (index) {
		if ((rc = names_add(&list, &n, RADIANCE_CHECKPOINT_INDEX)) ||
		    (rc = add_shards(dfd, dir, single, &list, &n, err, errlen)))
			goto out;
	} else {
		if (!single) {
			rlog_errf(err, errlen, "%s: no weights, expected %s or %s", dir,
				       RADIANCE_CHECKPOINT_SINGLE, RADIANCE_CHECKPOINT_INDEX);
			rc = -ENOENT;
			goto out;
		}
		if ((rc = names_add(&list, &n, RADIANCE_CHECKPOINT_SINGLE)))
			goto out;
	}
	*names = list;
	list = NULL;
	rc = (int)n;
out:
	if (rc == -ENOMEM)
		rlog_errf(err, errlen, "out of memory listing %s", dir);
	rcheckpoint_files_free(list);
	close(dfd);
	return rc;
}
