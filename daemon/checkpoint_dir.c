/* Checkpoint directories: the files of one a client must send, and loading
 * one from its path. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_private.h"

static int stat_regular(int dfd, const char *dir, const char *name, bool required, char *err,
			size_t errlen)
{
	struct stat st;
	if (fstatat(dfd, name, &st, 0) < 0) {
		int e = errno;
		if (e == ENOENT && !required)
			return 0;
		if (err && errlen)
			snprintf(err, errlen, "%s/%s: %s", dir, name,
				 e == ENOENT ? "not found, expected it in a checkpoint directory" : strerror(e));
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		if (err && errlen)
			snprintf(err, errlen, "%s/%s: not a regular file", dir, name);
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

static void names_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

int radiance_checkpoint_list_files(const char *dir, char ***names, char *err, size_t errlen)
{
	struct ck_loader L = { .err = err, .errlen = errlen };
	char **list = NULL;
	size_t n = 0, first_shard;
	json_t *idx = NULL;
	int dfd, rc;

	if (!names || !dir)
		return -EINVAL;
	*names = NULL;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = -errno;
		ck_err(&L, "%s: %s", dir, strerror(-rc));
		return rc;
	}
	if ((rc = stat_regular(dfd, dir, CK_CONFIG, true, err, errlen)) < 0)
		goto out;
	if ((rc = names_add(&list, &n, CK_CONFIG)))
		goto nomem;
	if ((rc = stat_regular(dfd, dir, CK_QCONFIG, false, err, errlen)) < 0)
		goto out;
	if (rc == 1 && (rc = names_add(&list, &n, CK_QCONFIG)))
		goto nomem;
	if ((rc = stat_regular(dfd, dir, CK_INDEX, false, err, errlen)) < 0)
		goto out;
	if (rc == 0) {
		if ((rc = stat_regular(dfd, dir, CK_SINGLE, false, err, errlen)) < 0)
			goto out;
		if (rc == 0) {
			ck_err(&L, "%s: no weights, expected %s or %s", dir, CK_SINGLE, CK_INDEX);
			rc = -ENOENT;
			goto out;
		}
		if ((rc = names_add(&list, &n, CK_SINGLE)))
			goto nomem;
		goto done;
	}
	if ((rc = names_add(&list, &n, CK_INDEX)))
		goto nomem;
	int ifd = openat(dfd, CK_INDEX, O_RDONLY | O_CLOEXEC);
	if (ifd < 0) {
		rc = -errno;
		ck_err(&L, "%s/%s: %s", dir, CK_INDEX, strerror(-rc));
		goto out;
	}
	rc = radiance__ck_read_json(&L, ifd, CK_INDEX, &idx);
	close(ifd);
	if (rc)
		goto out;
	json_t *wm = json_object_get(idx, "weight_map"), *v;
	const char *key;
	if (!json_is_object(wm)) {
		ck_err(&L, "%s/%s: \"weight_map\" is missing or not an object, expected tensor name -> "
		       "shard file", dir, CK_INDEX);
		rc = -EINVAL;
		goto out;
	}
	first_shard = n;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !ck_shard_name_ok(json_string_value(v))) {
			ck_err(&L, "%s/%s: weight_map[\"%s\"] is not a shard file name, expected a basename",
			       dir, CK_INDEX, key);
			rc = -EINVAL;
			goto out;
		}
		if ((rc = names_add(&list, &n, json_string_value(v))))
			goto nomem;
	}
	for (size_t i = first_shard; i < n; i++)
		if ((rc = stat_regular(dfd, dir, list[i], true, err, errlen)) < 0)
			goto out;
	qsort(list + first_shard, n - first_shard, sizeof *list, cmp_str);
done:
	*names = list;
	list = NULL;
	rc = (int)n;
	goto out;
nomem:
	ck_err(&L, "out of memory listing %s", dir);
	rc = -ENOMEM;
out:
	if (list)
		names_free(list, n);
	json_decref(idx);
	close(dfd);
	return rc;
}

const char *radiance_checkpoint_dir_name(const char *dir, size_t *len)
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

static char *dir_basename(const char *dir)
{
	char *real = realpath(dir, NULL);
	size_t len;
	const char *s = radiance_checkpoint_dir_name(real ? real : dir, &len);
	char *b = len ? strndup(s, len) : strdup("model");
	free(real);
	return b;
}

int radiance_checkpoint_load_dir(const char *dir, const char *name, radiance_progress_fn progress,
				 void *user, struct radiance_model **out, char *err, size_t errlen)
{
	struct radiance_file *files = NULL;
	char **names = NULL, *base = NULL;
	int n, rc, dfd;

	if (!out || !dir)
		return -EINVAL;
	*out = NULL;
	n = radiance_checkpoint_list_files(dir, &names, err, errlen);
	if (n < 0)
		return n;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int open_errno = errno;
	files = calloc((size_t)n + 1, sizeof *files);
	for (int i = 0; files && i < n; i++)
		files[i].fd = -1;
	if (!name)
		name = base = dir_basename(dir);
	if (dfd < 0 || !files || !name) {
		rc = dfd < 0 ? -open_errno : -ENOMEM;
		if (err && errlen)
			snprintf(err, errlen, "%s: %s", dir, strerror(-rc));
		goto out;
	}
	for (int i = 0; i < n; i++) {
		files[i].name = names[i];
		files[i].fd = openat(dfd, names[i], O_RDONLY | O_CLOEXEC);
		if (files[i].fd < 0) {
			rc = -errno;
			if (err && errlen)
				snprintf(err, errlen, "%s/%s: %s", dir, names[i], strerror(-rc));
			goto out;
		}
	}
	rc = radiance_checkpoint_load(files, (size_t)n, name, progress, user, out, err, errlen);
out:
	for (int i = 0; files && i < n; i++)
		if (files[i].fd >= 0)
			close(files[i].fd);
	if (dfd >= 0)
		close(dfd);
	free(files);
	free(base);
	names_free(names, (size_t)n);
	return rc;
}
