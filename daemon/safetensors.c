/* safetensors reader; the rules are listed in safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "radiance reads safetensors (little-endian) in place: little-endian hosts only"
#endif

static const struct {
	const char *name;
	unsigned bits;
} dtypes[RADIANCE_ST_DTYPE_COUNT] = {
	[RADIANCE_ST_BOOL] = { "BOOL", 8 },
	[RADIANCE_ST_U8] = { "U8", 8 },
	[RADIANCE_ST_I8] = { "I8", 8 },
	[RADIANCE_ST_F8_E5M2] = { "F8_E5M2", 8 },
	[RADIANCE_ST_F8_E4M3] = { "F8_E4M3", 8 },
	[RADIANCE_ST_F8_E8M0] = { "F8_E8M0", 8 },
	[RADIANCE_ST_I16] = { "I16", 16 },
	[RADIANCE_ST_U16] = { "U16", 16 },
	[RADIANCE_ST_F16] = { "F16", 16 },
	[RADIANCE_ST_BF16] = { "BF16", 16 },
	[RADIANCE_ST_I32] = { "I32", 32 },
	[RADIANCE_ST_U32] = { "U32", 32 },
	[RADIANCE_ST_F32] = { "F32", 32 },
	[RADIANCE_ST_F64] = { "F64", 64 },
	[RADIANCE_ST_I64] = { "I64", 64 },
	[RADIANCE_ST_U64] = { "U64", 64 },
	[RADIANCE_ST_C64] = { "C64", 64 },
	[RADIANCE_ST_F4] = { "F4", 4 },
	[RADIANCE_ST_F6_E2M3] = { "F6_E2M3", 6 },
	[RADIANCE_ST_F6_E3M2] = { "F6_E3M2", 6 },
};

const char *radiance_st_dtype_name(enum radiance_st_dtype d)
{
	return (unsigned)d < RADIANCE_ST_DTYPE_COUNT ? dtypes[d].name : "?";
}

unsigned radiance_st_dtype_bits(enum radiance_st_dtype d)
{
	return (unsigned)d < RADIANCE_ST_DTYPE_COUNT ? dtypes[d].bits : 0;
}

int radiance_st_dtype_from_name(const char *name)
{
	for (int i = 0; i < RADIANCE_ST_DTYPE_COUNT; i++)
		if (strcmp(dtypes[i].name, name) == 0)
			return i;
	return -1;
}

static const char *json_kind(const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT: return "object";
	case JSON_ARRAY: return "array";
	case JSON_STRING: return "string";
	case JSON_INTEGER: return "integer";
	case JSON_REAL: return "real number";
	case JSON_TRUE: return "true";
	case JSON_FALSE: return "false";
	case JSON_NULL: return "null";
	}
	return "value";
}

/* "[2, 3]" for messages; truncated with "..." if long. */
static const char *shape_str(const struct radiance_st_tensor *t, char *buf, size_t len)
{
	size_t o = 0;
	o += (size_t)snprintf(buf + o, len - o, "[");
	for (uint32_t i = 0; i < t->ndim && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	if (o >= len - 1 && len > 4)
		memcpy(buf + len - 4, "...", 4);
	return buf;
}

static void file_free(struct radiance_st_file *f)
{
	for (size_t i = 0; i < f->n_tensors; i++) {
		free(f->tensors[i].name);
		free(f->tensors[i].shape);
	}
	for (size_t i = 0; i < f->n_meta; i++) {
		free(f->meta[i].key);
		free(f->meta[i].value);
	}
	free(f->tensors);
	free(f->meta);
	free(f->name);
	free(f);
}

void radiance_st_close(struct radiance_st_file *f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->map_len);
	file_free(f);
}

static int cmp_name(const void *a, const void *b)
{
	const struct radiance_st_tensor *x = a, *y = b;
	return strcmp(x->name, y->name);
}

const struct radiance_st_tensor *radiance_st_find(const struct radiance_st_file *f,
						  const char *name)
{
	struct radiance_st_tensor key = { .name = (char *)name };
	if (!f->n_tensors)
		return NULL;
	return bsearch(&key, f->tensors, f->n_tensors, sizeof key, cmp_name);
}

const char *radiance_st_meta_get(const struct radiance_st_file *f, const char *key)
{
	for (size_t i = 0; i < f->n_meta; i++)
		if (strcmp(f->meta[i].key, key) == 0)
			return f->meta[i].value;
	return NULL;
}

static int parse_meta(struct radiance_st_file *f, json_t *m, char *err, size_t errlen)
{
	const char *key;
	json_t *v;

	if (!json_is_object(m)) {
		radiance__errf(err, errlen, "%s: __metadata__ is a JSON %s, expected an object of string -> string",
			       f->name, json_kind(m));
		return -EINVAL;
	}
	f->meta = calloc(json_object_size(m) + 1, sizeof *f->meta);
	if (!f->meta)
		return -ENOMEM;
	json_object_foreach(m, key, v) {
		if (!json_is_string(v)) {
			radiance__errf(err, errlen, "%s: __metadata__[\"%s\"] is a JSON %s, expected a string",
				       f->name, key, json_kind(v));
			return -EINVAL;
		}
		struct radiance_st_meta *e = &f->meta[f->n_meta];
		e->key = strdup(key);
		e->value = strdup(json_string_value(v));
		f->n_meta++;
		if (!e->key || !e->value)
			return -ENOMEM;
	}
	return 0;
}

/* A JSON value that must be a non-negative integer: 0 and *v, or -EINVAL
 * with the message "<what> is ..., expected a non-negative integer". */
static int get_uint(const json_t *j, uint64_t *v, const char *fname, const char *tname,
		    const char *what, size_t idx, char *err, size_t errlen)
{
	if (!json_is_integer(j)) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": %s[%zu] is a JSON %s, expected a non-negative integer",
			       fname, tname, what, idx, json_kind(j));
		return -EINVAL;
	}
	json_int_t i = json_integer_value(j);
	if (i < 0) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": %s[%zu] is %" JSON_INTEGER_FORMAT
			       ", expected a non-negative integer", fname, tname, what, idx, i);
		return -EINVAL;
	}
	*v = (uint64_t)i;
	return 0;
}

static int parse_tensor(struct radiance_st_file *f, struct radiance_st_tensor *t, const char *key,
			json_t *e, char *err, size_t errlen)
{
	char sb[128];
	json_t *dt, *sh, *off;
	int rc;

	t->name = strdup(key);
	if (!t->name)
		return -ENOMEM;
	if (!json_is_object(e)) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": entry is a JSON %s, expected an object with dtype, shape and data_offsets",
			       f->name, key, json_kind(e));
		return -EINVAL;
	}

	dt = json_object_get(e, "dtype");
	if (!dt || !json_is_string(dt)) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": dtype is %s%s, expected a dtype name string",
			       f->name, key, dt ? "a JSON " : "missing", dt ? json_kind(dt) : "");
		return -EINVAL;
	}
	int d = radiance_st_dtype_from_name(json_string_value(dt));
	if (d < 0) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": unknown dtype \"%s\", expected one of BOOL U8 I8 "
			       "F8_E5M2 F8_E4M3 F8_E8M0 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64 C64 F4 F6_E2M3 F6_E3M2",
			       f->name, key, json_string_value(dt));
		return -EINVAL;
	}
	t->dtype = (enum radiance_st_dtype)d;

	sh = json_object_get(e, "shape");
	if (!sh || !json_is_array(sh)) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": shape is %s%s, expected an array of non-negative integers",
			       f->name, key, sh ? "a JSON " : "missing", sh ? json_kind(sh) : "");
		return -EINVAL;
	}
	t->ndim = (uint32_t)json_array_size(sh);
	if (t->ndim) {
		t->shape = calloc(t->ndim, sizeof *t->shape);
		if (!t->shape)
			return -ENOMEM;
	}
	t->nelem = 1;
	bool overflow = false;
	for (uint32_t i = 0; i < t->ndim; i++) {
		rc = get_uint(json_array_get(sh, i), &t->shape[i], f->name, key, "shape", i, err, errlen);
		if (rc)
			return rc;
		if (__builtin_mul_overflow(t->nelem, t->shape[i], &t->nelem))
			overflow = true;
	}

	off = json_object_get(e, "data_offsets");
	if (!off || !json_is_array(off) || json_array_size(off) != 2) {
		if (off && json_is_array(off))
			radiance__errf(err, errlen, "%s: tensor \"%s\": data_offsets has %zu elements, expected 2 [begin, end]",
				       f->name, key, json_array_size(off));
		else
			radiance__errf(err, errlen, "%s: tensor \"%s\": data_offsets is %s%s, expected [begin, end]",
				       f->name, key, off ? "a JSON " : "missing", off ? json_kind(off) : "");
		return -EINVAL;
	}
	if ((rc = get_uint(json_array_get(off, 0), &t->begin, f->name, key, "data_offsets", 0, err, errlen)) ||
	    (rc = get_uint(json_array_get(off, 1), &t->end, f->name, key, "data_offsets", 1, err, errlen)))
		return rc;
	if (t->begin > t->end) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed, expected begin <= end",
			       f->name, key, t->begin, t->end);
		return -EINVAL;
	}
	if (t->end > f->data_len) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] out of bounds, "
			       "expected end <= %" PRIu64 " (the data section's size)",
			       f->name, key, t->begin, t->end, f->data_len);
		return -EINVAL;
	}

	uint64_t nbits;
	unsigned bits = radiance_st_dtype_bits(t->dtype);
	if (overflow || __builtin_mul_overflow(t->nelem, (uint64_t)bits, &nbits)) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": size of shape %s x %s overflows 64 bits",
			       f->name, key, shape_str(t, sb, sizeof sb), dtypes[t->dtype].name);
		return -EINVAL;
	}
	if (nbits % 8) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": shape %s of %u-bit %s is not a whole number of bytes",
			       f->name, key, shape_str(t, sb, sizeof sb), bits, dtypes[t->dtype].name);
		return -EINVAL;
	}
	if (t->end - t->begin != nbits / 8) {
		radiance__errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
			       " bytes, expected %" PRIu64 " (shape %s x %s)",
			       f->name, key, t->begin, t->end, t->end - t->begin, nbits / 8,
			       shape_str(t, sb, sizeof sb), dtypes[t->dtype].name);
		return -EINVAL;
	}
	t->data = f->data + t->begin;
	return 0;
}

static int cmp_offsets(const void *a, const void *b)
{
	const struct radiance_st_tensor *x = *(const struct radiance_st_tensor *const *)a;
	const struct radiance_st_tensor *y = *(const struct radiance_st_tensor *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The reference's coverage rule: sorted by offset, each tensor starts where
 * the previous one ended and the last one ends at the end of the file. It
 * reports all of these as InvalidOffset / MetadataIncompleteBuffer; we name
 * the cause. */
static int check_coverage(struct radiance_st_file *f, char *err, size_t errlen)
{
	const struct radiance_st_tensor **order;
	const struct radiance_st_tensor *prev = NULL;
	uint64_t pos = 0;
	int rc = 0;

	order = malloc((f->n_tensors + 1) * sizeof *order);
	if (!order)
		return -ENOMEM;
	for (size_t i = 0; i < f->n_tensors; i++)
		order[i] = &f->tensors[i];
	qsort(order, f->n_tensors, sizeof *order, cmp_offsets);
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct radiance_st_tensor *t = order[i];
		if (t->begin < pos) {
			radiance__errf(err, errlen, "%s: tensors \"%s\" [%" PRIu64 ", %" PRIu64 ") and \"%s\" [%" PRIu64
			       ", %" PRIu64 ") overlap, expected disjoint data_offsets",
			       f->name, prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
			rc = -EINVAL;
			goto out;
		}
		if (t->begin > pos) {
			if (prev)
				radiance__errf(err, errlen, "%s: hole in the data section: bytes [%" PRIu64 ", %" PRIu64
					       ") between \"%s\" and \"%s\" belong to no tensor, expected contiguous tensors",
				       f->name, pos, t->begin, prev->name, t->name);
			else
				radiance__errf(err, errlen, "%s: hole in the data section: bytes [0, %" PRIu64
					       ") before \"%s\" belong to no tensor, expected the first tensor at offset 0",
				       f->name, t->begin, t->name);
			rc = -EINVAL;
			goto out;
		}
		pos = t->end;
		prev = t;
	}
	if (pos != f->data_len) {
		radiance__errf(err, errlen, "%s: the data section is %" PRIu64 " bytes but the tensors cover %" PRIu64
			       ": %" PRIu64 " trailing bytes belong to no tensor, expected the last tensor to end the file",
			       f->name, f->data_len, pos, f->data_len - pos);
		rc = -EINVAL;
	}
out:
	free(order);
	return rc;
}

int radiance_st_parse(const void *buf, size_t len, const char *name,
		      struct radiance_st_file **out, char *err, size_t errlen)
{
	const uint8_t *p = buf;
	struct radiance_st_file *f;
	json_t *root = NULL;
	json_error_t jerr;
	uint64_t n = 0;
	int rc;

	*out = NULL;
	f = calloc(1, sizeof *f);
	if (!f)
		return -ENOMEM;
	f->name = strdup(name ? name : "safetensors");
	if (!f->name) {
		free(f);
		return -ENOMEM;
	}

	if (len < 8) {
		radiance__errf(err, errlen, "%s: file is %zu bytes, too short for the 8-byte header length",
			       f->name, len);
		rc = -EINVAL;
		goto fail;
	}
	for (int i = 7; i >= 0; i--)
		n = n << 8 | p[i];
	if (n > RADIANCE_ST_MAX_HEADER) {
		radiance__errf(err, errlen, "%s: header length %" PRIu64 " is too large, expected at most %llu bytes",
			       f->name, n, RADIANCE_ST_MAX_HEADER);
		rc = -EINVAL;
		goto fail;
	}
	if (n > len - 8) {
		radiance__errf(err, errlen, "%s: header length %" PRIu64 " runs past the end of the file, expected at most %zu (file is %zu bytes)",
			       f->name, n, len - 8, len);
		rc = -EINVAL;
		goto fail;
	}
	f->header_len = n;
	f->data = p + 8 + n;
	f->data_len = len - 8 - n;

	root = json_loadb((const char *)p + 8, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		radiance__errf(err, errlen, "%s: header is not valid JSON: %s (line %d, column %d), expected a JSON object",
			       f->name, jerr.text, jerr.line, jerr.column);
		rc = -EINVAL;
		goto fail;
	}
	if (!json_is_object(root)) {
		radiance__errf(err, errlen, "%s: header is a JSON %s, expected an object", f->name, json_kind(root));
		rc = -EINVAL;
		goto fail;
	}
	if (p[8] != '{') {
		radiance__errf(err, errlen, "%s: header starts with byte 0x%02x, expected '{'", f->name, p[8]);
		rc = -EINVAL;
		goto fail;
	}

	f->tensors = calloc(json_object_size(root) + 1, sizeof *f->tensors);
	if (!f->tensors) {
		rc = -ENOMEM;
		goto fail;
	}
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (strcmp(key, "__metadata__") == 0) {
			rc = parse_meta(f, v, err, errlen);
		} else {
			rc = parse_tensor(f, &f->tensors[f->n_tensors], key, v, err, errlen);
			f->n_tensors++;
		}
		if (rc)
			goto fail;
	}
	rc = check_coverage(f, err, errlen);
	if (rc)
		goto fail;
	qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_name);
	json_decref(root);
	*out = f;
	return 0;

fail:
	if (rc == -ENOMEM)
		radiance__errf(err, errlen, "%s: out of memory reading the header", f->name);
	json_decref(root);
	file_free(f);
	return rc;
}

int radiance_st_open_fd(int fd, const char *name, struct radiance_st_file **out, char *err,
			size_t errlen)
{
	struct stat st;
	void *map;
	int rc;

	*out = NULL;
	if (!name)
		name = "safetensors";
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		radiance__errf(err, errlen, "%s: fstat: %s", name, strerror(-rc));
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		radiance__errf(err, errlen, "%s: not a regular file, expected a safetensors file", name);
		return -EINVAL;
	}
	if (st.st_size < 8) {   /* checked here: mmap refuses length 0 */
		radiance__errf(err, errlen, "%s: file is %lld bytes, too short for the 8-byte header length",
			       name, (long long)st.st_size);
		return -EINVAL;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		radiance__errf(err, errlen, "%s: %lld bytes do not fit the address space", name, (long long)st.st_size);
		return -ENOMEM;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = -errno;
		radiance__errf(err, errlen, "%s: mmap of %lld bytes: %s", name, (long long)st.st_size, strerror(-rc));
		return rc == -ENOMEM ? -ENOMEM : (rc == -EACCES || rc == -ENODEV ? -EINVAL : rc);
	}
	rc = radiance_st_parse(map, (size_t)st.st_size, name, out, err, errlen);
	if (rc) {
		munmap(map, (size_t)st.st_size);
		return rc;
	}
	(*out)->map = map;
	(*out)->map_len = (size_t)st.st_size;
	return 0;
}

int radiance_st_open_path(const char *path, struct radiance_st_file **out, char *err,
			  size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc;

	*out = NULL;
	if (fd < 0) {
		rc = -errno;
		radiance__errf(err, errlen, "%s: open: %s", path, strerror(-rc));
		return rc;
	}
	rc = radiance_st_open_fd(fd, path, out, err, errlen);
	close(fd);
	return rc;
}
