/* Loading a checkpoint directory from its path; which files it sends is
 * common/checkpoint_files.c's. */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_private.h"
#include "io.h"
#include "log.h"

static char *dir_basename(const char *dir)
{
	char *real = realpath(dir, NULL);
	size_t len;
	const char *s = rcheckpoint_dir_name(real ? real : dir, &len);
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
	n = rcheckpoint_list_files(dir, &names, err, errlen);
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
			char path[PATH_MAX];
			rio_path_join(path, sizeof path, dir, names[i]);
			rlog_errf(err, errlen, "%s: %s", path, strerror(-rc));
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
	if (n > 0)
		rcheckpoint_files_free(names);
	return rc;
}
