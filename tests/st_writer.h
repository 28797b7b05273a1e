/*
 * Test helpers: write small safetensors files (well-formed through
 * struct stw, or byte-exact malformed ones through stw_write_raw), text
 * files, and throwaway directories. Header-only; every function is static.
 * Not for production: errors abort the test through assert().
 */
#ifndef RADIANCE_TESTS_ST_WRITER_H
#define RADIANCE_TESTS_ST_WRITER_H

#include <assert.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct stw_tensor {
	char *name;
	char dtype[16];
	uint32_t ndim;
	uint64_t shape[8];
	void *data;
	size_t nbytes;
};

/* A list of tensors, written in the order added, contiguous from offset 0. */
struct stw {
	struct stw_tensor *t;
	size_t n;
	const char *meta_json;     /* raw JSON for "__metadata__", or NULL */
};

static inline void stw_init(struct stw *w)
{
	memset(w, 0, sizeof *w);
}

static inline void stw_finish(struct stw *w)
{
	for (size_t i = 0; i < w->n; i++) {
		free(w->t[i].name);
		free(w->t[i].data);
	}
	free(w->t);
	memset(w, 0, sizeof *w);
}

/* Adds a copy of data (nbytes; NULL means zero-filled). Returns the entry,
 * valid until the next add. */
static inline struct stw_tensor *stw_add(struct stw *w, const char *name, const char *dtype,
					 uint32_t ndim, const uint64_t *shape, const void *data,
					 size_t nbytes)
{
	w->t = realloc(w->t, (w->n + 1) * sizeof *w->t);
	assert(w->t);
	struct stw_tensor *t = &w->t[w->n++];
	memset(t, 0, sizeof *t);
	t->name = strdup(name);
	snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
	t->ndim = ndim;
	for (uint32_t i = 0; i < ndim; i++)
		t->shape[i] = shape[i];
	t->nbytes = nbytes;
	t->data = calloc(1, nbytes + 1);
	assert(t->name && t->data);
	if (data)
		memcpy(t->data, data, nbytes);
	return t;
}

static inline struct stw_tensor *stw_get(struct stw *w, const char *name)
{
	for (size_t i = 0; i < w->n; i++)
		if (strcmp(w->t[i].name, name) == 0)
			return &w->t[i];
	return NULL;
}

static inline void stw_remove(struct stw *w, const char *name)
{
	struct stw_tensor *t = stw_get(w, name);
	assert(t);
	free(t->name);
	free(t->data);
	size_t i = (size_t)(t - w->t);
	memmove(&w->t[i], &w->t[i + 1], (w->n - i - 1) * sizeof *w->t);
	w->n--;
}

/* Writes an exact file: the 8-byte length field as given (which may lie),
 * then header_len bytes of header, then data. */
static inline int stw_write_raw(const char *path, uint64_t len_field, const char *header,
				size_t header_len, const void *data, size_t data_len)
{
	uint8_t le[8];
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(len_field >> (8 * i));
	fwrite(le, 1, 8, f);
	if (header_len)
		fwrite(header, 1, header_len, f);
	if (data_len)
		fwrite(data, 1, data_len, f);
	return fclose(f);
}

/* Writes the tensors [first, first + count) of w as one well-formed file
 * (header padded with spaces to a multiple of 8, as the reference does). */
static inline int stw_write_range(const struct stw *w, size_t first, size_t count, const char *path)
{
	size_t cap = 4096 + count * 256, len = 0, off = 0;
	char *h = malloc(cap);
	assert(h);
	len += (size_t)snprintf(h + len, cap - len, "{");
	if (w->meta_json)
		len += (size_t)snprintf(h + len, cap - len, "\"__metadata__\":%s", w->meta_json);
	for (size_t i = first; i < first + count; i++) {
		const struct stw_tensor *t = &w->t[i];
		if (len + 512 + strlen(t->name) > cap) {
			cap = cap * 2 + strlen(t->name);
			h = realloc(h, cap);
			assert(h);
		}
		len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
					(i > first || w->meta_json) ? "," : "", t->name, t->dtype);
		for (uint32_t d = 0; d < t->ndim; d++)
			len += (size_t)snprintf(h + len, cap - len, "%s%" PRIu64, d ? "," : "", t->shape[d]);
		len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
					off + t->nbytes);
		off += t->nbytes;
	}
	len += (size_t)snprintf(h + len, cap - len, "}");
	while (len % 8)
		h[len++] = ' ';
	uint8_t *data = malloc(off + 1);
	assert(data);
	off = 0;
	for (size_t i = first; i < first + count; i++) {
		memcpy(data + off, w->t[i].data, w->t[i].nbytes);
		off += w->t[i].nbytes;
	}
	int rc = stw_write_raw(path, len, h, len, data, off);
	free(data);
	free(h);
	return rc;
}

static inline int stw_write(const struct stw *w, const char *path)
{
	return stw_write_range(w, 0, w->n, path);
}

/* The three GPTQ tensors of one int4 group-128 layer, as the auto_gptq
 * packing lays them out: module.qweight [K/8][N] int32, module.scales
 * [K/128][N] fp16 bits, module.qzeros [K/128][ceil(N/8)] int32. The arrays
 * are copied; the caller keeps them. */
static inline void stw_add_gptq(struct stw *w, const char *module, uint32_t n, uint32_t k,
				const uint32_t *qw, const uint16_t *sc, const uint32_t *qz)
{
	char name[256];
	uint32_t words = k / 8, groups = k / 128, zw = (n + 7) / 8;
	snprintf(name, sizeof name, "%s.qweight", module);
	stw_add(w, name, "I32", 2, (uint64_t[]){ words, n }, qw, (size_t)words * n * 4);
	snprintf(name, sizeof name, "%s.scales", module);
	stw_add(w, name, "F16", 2, (uint64_t[]){ groups, n }, sc, (size_t)groups * n * 2);
	snprintf(name, sizeof name, "%s.qzeros", module);
	stw_add(w, name, "I32", 2, (uint64_t[]){ groups, zw }, qz, (size_t)groups * zw * 4);
}

/* A W4A8 layer in the checkpoint's (AutoRound auto_gptq) layout, as
 * module.qweight I32 [K/8, N] (code of k = 8w+j in bits 4j..4j+3 of word w),
 * module.scales F16 [K/128, N] and module.qzeros I32 [K/128, ceil(N/8)],
 * all 7s (zero point 8; padding nibbles past N are 0, as some exporters
 * leave them). code(n, k) gives each int4 code (0..15), scale(n, g) each
 * group's fp16 bits. */
static inline void stw_add_w4(struct stw *w, const char *module, uint32_t n, uint32_t k,
			      uint32_t (*code)(uint32_t n, uint32_t k),
			      uint16_t (*scale)(uint32_t n, uint32_t g))
{
	uint32_t words = k / 8, groups = k / 128, zw = (n + 7) / 8;
	uint32_t *qw = calloc((size_t)words * n, 4);
	uint16_t *sc = calloc((size_t)groups * n, 2);
	uint32_t *qz = calloc((size_t)groups * zw, 4);
	assert(qw && sc && qz);
	for (uint32_t wd = 0; wd < words; wd++)
		for (uint32_t j = 0; j < n; j++) {
			uint32_t v = 0;
			for (uint32_t b = 0; b < 8; b++)
				v |= (code(j, wd * 8 + b) & 0xFu) << (4 * b);
			qw[(size_t)wd * n + j] = v;
		}
	for (uint32_t g = 0; g < groups; g++) {
		for (uint32_t j = 0; j < n; j++)
			sc[(size_t)g * n + j] = scale(j, g);
		for (uint32_t z = 0; z < zw; z++) {
			uint32_t cols = n - z * 8 < 8 ? n - z * 8 : 8;
			qz[(size_t)g * zw + z] = cols == 8 ? 0x77777777u :
				(uint32_t)((1ull << (4 * cols)) - 1) & 0x77777777u;
		}
	}
	stw_add_gptq(w, module, n, k, qw, sc, qz);
	free(qw);
	free(sc);
	free(qz);
}

static inline int write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

/* dir + "/" + name in a static-per-call buffer the caller provides. */
static inline const char *path_join(char *buf, size_t len, const char *dir, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
	return buf;
}

/* A fresh directory under $TMPDIR (or /tmp); malloc'ed path. */
static inline char *tmpdir_create(void)
{
	const char *base = getenv("TMPDIR");
	char *p = malloc(4096);
	assert(p);
	snprintf(p, 4096, "%s/radiance-test-XXXXXX", base && *base ? base : "/tmp");
	assert(mkdtemp(p));
	return p;
}

/* Removes the (flat) directory and frees its path. */
static inline void tmpdir_remove(char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char buf[4096];
	if (d) {
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				unlink(path_join(buf, sizeof buf, dir, e->d_name));
		closedir(d);
	}
	rmdir(dir);
	free(dir);
}

/* Open file descriptors of this process, for "every fd closed" checks. */
static inline int count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;   /* the DIR's own fd */
}

#endif
