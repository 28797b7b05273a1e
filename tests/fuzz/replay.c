/*
 * Corpus replay without libFuzzer: calls a fuzz target's
 * LLVMFuzzerTestOneInput on files, so the seed corpora run as regression
 * tests with the normal compiler and sanitizer flags (make check,
 * make check SAN=address,undefined).
 *
 *   fuzz_<name> [-v] PATH...    PATH: a file, or a directory (every regular
 *                               file under it, recursively, in name order;
 *                               names starting with '.' are skipped)
 *
 * Each input is read into a heap block of exactly its size, as libFuzzer
 * does, so reads past the end are caught under ASan. Prints "ok PATH" per
 * input with -v and "replayed N inputs" at the end; exits 0, or 2 on a
 * usage or I/O error. A crashing input ends the process the way it would
 * end a fuzzer (abort, sanitizer report).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int verbose;
static size_t replayed;

/* The whole file in a malloc'ed block of exactly its size (1 byte when
 * empty, so the pointer is never NULL). NULL on error, with a message. */
static uint8_t *read_file(const char *path, size_t *len_out)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL, *exact = NULL;
	size_t cap = 0, len = 0;

	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return NULL;
	}
	for (;;) {
		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 4096;
			uint8_t *nb = realloc(buf, ncap);
			if (!nb)
				goto fail;
			buf = nb;
			cap = ncap;
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		if (n == 0)
			break;
		len += n;
	}
	if (ferror(f))
		goto fail;
	exact = malloc(len ? len : 1);
	if (!exact)
		goto fail;
	if (len)
		memcpy(exact, buf, len);
	free(buf);
	fclose(f);
	*len_out = len;
	return exact;
fail:
	fprintf(stderr, "replay: %s: read failed or out of memory\n", path);
	free(buf);
	fclose(f);
	return NULL;
}

static int run_file(const char *path)
{
	size_t len;
	uint8_t *data = read_file(path, &len);
	if (!data)
		return -1;
	if (verbose) {
		fprintf(stderr, "running %s (%zu bytes)\n", path, len);
		fflush(stderr);
	}
	LLVMFuzzerTestOneInput(data, len);
	free(data);
	replayed++;
	if (verbose)
		fprintf(stderr, "ok %s\n", path);
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode))
		return S_ISREG(st.st_mode) ? run_file(path) : 0;
	DIR *d = opendir(path);
	if (!d) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char **nn = realloc(names, (n + 1) * sizeof *nn);
		size_t len = strlen(path) + strlen(e->d_name) + 2;
		if (!nn || !(nn[n] = malloc(len))) {
			if (nn)
				names = nn;
			rc = -1;
			break;
		}
		names = nn;
		snprintf(names[n++], len, "%s/%s", path, e->d_name);
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof *names, cmp_name);
	for (size_t i = 0; i < n; i++) {
		if (rc == 0)
			rc = run_path(names[i]);
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	int i = 1, rc = 0;
	if (i < argc && strcmp(argv[i], "-v") == 0) {
		verbose = 1;
		i++;
	}
	if (i >= argc) {
		fprintf(stderr, "usage: %s [-v] FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (; i < argc && rc == 0; i++)
		rc = run_path(argv[i]);
	printf("replayed %zu inputs\n", replayed);
	return rc ? 2 : 0;
}
