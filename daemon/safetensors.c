/* safetensors reader; the rules are listed in safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "checkpoint_files.h"
#include "io.h"
#include "log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "radiance reads safetensors (little-endian) elements as they are stored: little-endian hosts only"
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
	if (f->fd >= 0)
		close(f->fd);
	free(f->image);
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
		rlog_errf(err, errlen, "%s: __metadata__ is a JSON %s, expected an object of string -> string",
			       f->name, json_kind(m));
		return -EINVAL;
	}
	f->meta = calloc(json_object_size(m) + 1, sizeof *f->meta);
	if (!f->meta)
		return -ENOMEM;
	json_object_foreach(m, key, v) {
		if (!json_is_string(v)) {
			rlog_errf(err, errlen, "%s: __metadata__[\"%s\"] is a JSON %s, expected a string",
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
		rlog_errf(err, errlen, "%s: tensor \"%s\": %s[%zu] is a JSON %s, expected a non-negative integer",
			       fname, tname, what, idx, json_kind(j));
		return -EINVAL;
	}
	json_int_t i = json_integer_value(j);
	if (i < 0) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": %s[%zu] is %" JSON_INTEGER_FORMAT
			       ", expected a non-negative integer", fname, tname, what, idx, i);
		return -EINVAL;
	}
	*v = (uint64_t)i;
	return 0;
}

/* One header entry into t. An end past the data section is not refused
 * here but left in *oob (the first such tensor): check_coverage decides
 * whether the file is truncated or the offset is bad. */
static int parse_tensor(struct radiance_st_file *f, struct radiance_st_tensor *t, const char *key,
			json_t *e, const struct radiance_st_tensor **oob, char *err, size_t errlen)
{
	char sb[128];
	json_t *dt, *sh, *off;
	int rc;

	t->name = strdup(key);
	if (!t->name)
		return -ENOMEM;
	if (!json_is_object(e)) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": entry is a JSON %s, expected an object with dtype, shape and data_offsets",
			       f->name, key, json_kind(e));
		return -EINVAL;
	}

	dt = json_object_get(e, "dtype");
	if (!dt || !json_is_string(dt)) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": dtype is %s%s, expected a dtype name string",
			       f->name, key, dt ? "a JSON " : "missing", dt ? json_kind(dt) : "");
		return -EINVAL;
	}
	int d = radiance_st_dtype_from_name(json_string_value(dt));
	if (d < 0) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": unknown dtype \"%s\", expected one of BOOL U8 I8 "
			       "F8_E5M2 F8_E4M3 F8_E8M0 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64 C64 F4 F6_E2M3 F6_E3M2",
			       f->name, key, json_string_value(dt));
		return -EINVAL;
	}
	t->dtype = (enum radiance_st_dtype)d;

	sh = json_object_get(e, "shape");
	if (!sh || !json_is_array(sh)) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": shape is %s%s, expected an array of non-negative integers",
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
			rlog_errf(err, errlen, "%s: tensor \"%s\": data_offsets has %zu elements, expected 2 [begin, end]",
				       f->name, key, json_array_size(off));
		else
			rlog_errf(err, errlen, "%s: tensor \"%s\": data_offsets is %s%s, expected [begin, end]",
				       f->name, key, off ? "a JSON " : "missing", off ? json_kind(off) : "");
		return -EINVAL;
	}
	if ((rc = get_uint(json_array_get(off, 0), &t->begin, f->name, key, "data_offsets", 0, err, errlen)) ||
	    (rc = get_uint(json_array_get(off, 1), &t->end, f->name, key, "data_offsets", 1, err, errlen)))
		return rc;
	if (t->begin > t->end) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed, expected begin <= end",
			       f->name, key, t->begin, t->end);
		return -EINVAL;
	}
	if (t->end > f->data_len && !*oob)
		*oob = t;

	uint64_t nbits;
	unsigned bits = radiance_st_dtype_bits(t->dtype);
	if (overflow || __builtin_mul_overflow(t->nelem, (uint64_t)bits, &nbits)) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": size of shape %s x %s overflows 64 bits",
			       f->name, key, shape_str(t, sb, sizeof sb), dtypes[t->dtype].name);
		return -EINVAL;
	}
	if (nbits % 8) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": shape %s of %u-bit %s is not a whole number of bytes",
			       f->name, key, shape_str(t, sb, sizeof sb), bits, dtypes[t->dtype].name);
		return -EINVAL;
	}
	if (t->end - t->begin != nbits / 8) {
		rlog_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
			       " bytes, expected %" PRIu64 " (shape %s x %s)",
			       f->name, key, t->begin, t->end, t->end - t->begin, nbits / 8,
			       shape_str(t, sb, sizeof sb), dtypes[t->dtype].name);
		return -EINVAL;
	}
	t->data = f->data && t->end <= f->data_len ? f->data + t->begin : NULL;
	return 0;
}

static void out_of_bounds(const struct radiance_st_file *f, const struct radiance_st_tensor *t,
			  char *err, size_t errlen)
{
	rlog_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] out of bounds, "
		  "expected end <= %" PRIu64 " (the data section's size)",
		  f->name, t->name, t->begin, t->end, f->data_len);
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
 * the cause. oob: the first tensor that ends past the data section, if any.
 * When the tensors line up and only run past the end, the header is whole
 * and consistent and the file is shorter than it says: truncated (`head -c`,
 * an interrupted copy), said as such rather than as the first tensor past
 * the cut. Otherwise oob is a bad offset, named before a hole or overlap
 * it may have made. */
static int check_coverage(struct radiance_st_file *f, const struct radiance_st_tensor *oob,
			  char *err, size_t errlen)
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
		if (t->begin != pos && oob) {
			out_of_bounds(f, oob, err, errlen);
			rc = -EINVAL;
			goto out;
		}
		if (t->begin < pos) {
			rlog_errf(err, errlen, "%s: tensors \"%s\" [%" PRIu64 ", %" PRIu64 ") and \"%s\" [%" PRIu64
			       ", %" PRIu64 ") overlap, expected disjoint data_offsets",
			       f->name, prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
			rc = -EINVAL;
			goto out;
		}
		if (t->begin > pos) {
			if (prev)
				rlog_errf(err, errlen, "%s: hole in the data section: bytes [%" PRIu64 ", %" PRIu64
					       ") between \"%s\" and \"%s\" belong to no tensor, expected contiguous tensors",
				       f->name, pos, t->begin, prev->name, t->name);
			else
				rlog_errf(err, errlen, "%s: hole in the data section: bytes [0, %" PRIu64
					       ") before \"%s\" belong to no tensor, expected the first tensor at offset 0",
				       f->name, t->begin, t->name);
			rc = -EINVAL;
			goto out;
		}
		pos = t->end;
		prev = t;
	}
	if (pos > f->data_len) {
		rlog_errf(err, errlen, "%s: truncated: the file is %" PRIu64 " bytes, its header needs %" PRIu64
			  " (8 + a %" PRIu64 "-byte header + %" PRIu64 " bytes of tensor data); the copy or "
			  "download was cut short", f->name, f->size, f->data_offset + pos, f->header_len, pos);
		rc = -EINVAL;
	} else if (pos != f->data_len) {
		rlog_errf(err, errlen, "%s: the data section is %" PRIu64 " bytes but the tensors cover %" PRIu64
			       ": %" PRIu64 " trailing bytes belong to no tensor, expected the last tensor to end the file",
			       f->name, f->data_len, pos, f->data_len - pos);
		rc = -EINVAL;
	}
out:
	free(order);
	return rc;
}

/* The 8-byte header length N of a file of `size` bytes, from the first
 * `have` bytes p of it (have >= 8 unless size < 8), checked against the cap
 * and the file size. */
static int check_prefix(const struct radiance_st_file *f, const uint8_t *p, size_t have,
			uint64_t size, uint64_t *n_out, char *err, size_t errlen)
{
	uint64_t n = 0;

	if (rcheckpoint_lfs_pointer(p, have, f->name, "the tensor data", err, errlen))
		return -EINVAL;
	if (size < 8) {
		rlog_errf(err, errlen, "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
			       f->name, size);
		return -EINVAL;
	}
	for (int i = 7; i >= 0; i--)
		n = n << 8 | p[i];
	if (n > RADIANCE_ST_MAX_HEADER) {
		rlog_errf(err, errlen, "%s: header length %" PRIu64 " is too large, expected at most %llu bytes",
			       f->name, n, RADIANCE_ST_MAX_HEADER);
		return -EINVAL;
	}
	if (n > size - 8) {
		rlog_errf(err, errlen, "%s: header length %" PRIu64 " runs past the end of the file, expected at most %"
			       PRIu64 " (file is %" PRIu64 " bytes)", f->name, n, size - 8, size);
		return -EINVAL;
	}
	*n_out = n;
	return 0;
}

/* The header JSON (n bytes at hdr) against the rules, into f; f->data_len
 * (and f->data for an image in memory) already set. */
static int parse_header(struct radiance_st_file *f, const uint8_t *hdr, uint64_t n, char *err,
			size_t errlen)
{
	json_error_t jerr;
	const char *key;
	json_t *root, *v;
	const struct radiance_st_tensor *oob = NULL;
	int rc = 0;

	root = json_loadb((const char *)hdr, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		rlog_errf(err, errlen, "%s: header is not valid JSON: %s (line %d, column %d), expected a JSON object",
			       f->name, jerr.text, jerr.line, jerr.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		rlog_errf(err, errlen, "%s: header is a JSON %s, expected an object", f->name, json_kind(root));
		rc = -EINVAL;
		goto out;
	}
	if (hdr[0] != '{') {
		rlog_errf(err, errlen, "%s: header starts with byte 0x%02x, expected '{'", f->name, hdr[0]);
		rc = -EINVAL;
		goto out;
	}
	f->tensors = calloc(json_object_size(root) + 1, sizeof *f->tensors);
	if (!f->tensors) {
		rc = -ENOMEM;
		goto out;
	}
	json_object_foreach(root, key, v) {
		if (strcmp(key, "__metadata__") == 0) {
			rc = parse_meta(f, v, err, errlen);
		} else {
			rc = parse_tensor(f, &f->tensors[f->n_tensors], key, v, &oob, err, errlen);
			f->n_tensors++;
		}
		if (rc)
			goto out;
	}
	rc = check_coverage(f, oob, err, errlen);
	if (rc)
		goto out;
	qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_name);
out:
	json_decref(root);
	return rc;
}

static struct radiance_st_file *file_new(const char *name)
{
	struct radiance_st_file *f = calloc(1, sizeof *f);
	if (!f)
		return NULL;
	f->fd = -1;
	f->name = strdup(name ? name : "safetensors");
	if (!f->name) {
		free(f);
		return NULL;
	}
	return f;
}

int radiance_st_parse(const void *buf, size_t len, const char *name,
		      struct radiance_st_file **out, char *err, size_t errlen)
{
	const uint8_t *p = buf;
	struct radiance_st_file *f;
	uint64_t n;
	int rc;

	*out = NULL;
	f = file_new(name);
	if (!f)
		return -ENOMEM;
	rc = check_prefix(f, p, len, len, &n, err, errlen);
	if (rc)
		goto fail;
	f->size = len;
	f->header_len = n;
	f->data_offset = 8 + n;
	f->data = p + 8 + n;
	f->data_len = len - 8 - n;
	rc = parse_header(f, p + 8, n, err, errlen);
	if (rc)
		goto fail;
	*out = f;
	return 0;

fail:
	if (rc == -ENOMEM)
		rlog_errf(err, errlen, "%s: out of memory reading the header", f->name);
	file_free(f);
	return rc;
}

/* A regular file's size, or -errno with the message. */
static int regular_size(int fd, const char *name, uint64_t *size, char *err, size_t errlen)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int rc = -errno;
		rlog_errf(err, errlen, "%s: fstat: %s", name, strerror(-rc));
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		rlog_errf(err, errlen, "%s: not a regular file, expected a safetensors file", name);
		return -EINVAL;
	}
	*size = (uint64_t)st.st_size;
	return 0;
}

/* pread of len bytes at off that must all be there: 0, or -EIO with
 * "<what>file shrank to N bytes while loading (expected M)" when the file
 * ended early (N from fstat: a read at or past the new end tells only that
 * the end is before it), or the read's errno text. */
static int read_exact(int fd, const char *name, const char *what, void *dst, uint64_t len,
		      uint64_t off, uint64_t size, char *err, size_t errlen)
{
	ssize_t r = rio_pread(fd, dst, (size_t)len, off);
	if (r == (ssize_t)len)
		return 0;
	if (r < 0) {
		rlog_errf(err, errlen, "%s: %sread of %" PRIu64 " bytes at byte %" PRIu64 " failed: %s",
			       name, what, len, off, strerror((int)-r));
		return -EIO;
	}
	struct stat st;
	uint64_t now = fstat(fd, &st) == 0 && (uint64_t)st.st_size < size ? (uint64_t)st.st_size
									   : off + (uint64_t)r;
	rlog_errf(err, errlen, "%s: %sfile shrank to %" PRIu64 " bytes while loading (expected %" PRIu64 ")",
		       name, what, now, size);
	return -EIO;
}

int radiance_st_open_fd(int fd, const char *name, struct radiance_st_file **out, char *err,
			size_t errlen)
{
	struct radiance_st_file *f;
	uint8_t prefix[1024];
	uint8_t *hdr = NULL;
	uint64_t size, n;
	int rc;

	*out = NULL;
	f = file_new(name);
	if (!f)
		return -ENOMEM;
	if ((rc = regular_size(fd, f->name, &size, err, errlen)))
		goto fail;
	/* the length field, or the whole of an LFS pointer (at most 1024 bytes) */
	size_t have = size < sizeof prefix ? (size_t)size : sizeof prefix;
	if ((rc = read_exact(fd, f->name, "", prefix, have, 0, size, err, errlen)) ||
	    (rc = check_prefix(f, prefix, have, size, &n, err, errlen)))
		goto fail;
	f->size = size;
	f->header_len = n;
	f->data_offset = 8 + n;
	f->data_len = size - 8 - n;
	hdr = malloc(n + 1);
	if (!hdr) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = read_exact(fd, f->name, "header: ", hdr, n, 8, size, err, errlen)) ||
	    (rc = parse_header(f, hdr, n, err, errlen)))
		goto fail;
	/* our own fd for the tensor reads: the caller's may close first */
	f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (f->fd < 0) {
		rc = -errno;
		rlog_errf(err, errlen, "%s: dup: %s", f->name, strerror(-rc));
		goto fail;
	}
	free(hdr);
	*out = f;
	return 0;

fail:
	if (rc == -ENOMEM)
		rlog_errf(err, errlen, "%s: out of memory reading the header", f->name);
	free(hdr);
	file_free(f);
	return rc;
}

int radiance_st_open_path(const char *path, struct radiance_st_file **out, char *err,
			  size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc;

	*out = NULL;
	if (fd < 0) {
		rc = -errno;
		rlog_errf(err, errlen, "%s: open: %s", path, strerror(-rc));
		return rc;
	}
	rc = radiance_st_open_fd(fd, path, out, err, errlen);
	close(fd);
	return rc;
}

int radiance_st_load_path(const char *path, struct radiance_st_file **out, char *err,
			  size_t errlen)
{
	uint8_t *image = NULL;
	uint64_t size;
	int fd, rc;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		rlog_errf(err, errlen, "%s: open: %s", path, strerror(-rc));
		return rc;
	}
	if ((rc = regular_size(fd, path, &size, err, errlen)))
		goto out;
	if (size > SIZE_MAX - 1 || !(image = malloc((size_t)size + 1))) {
		rlog_errf(err, errlen, "%s: out of memory for a %" PRIu64 "-byte image", path, size);
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = read_exact(fd, path, "", image, size, 0, size, err, errlen)) ||
	    (rc = radiance_st_parse(image, (size_t)size, path, out, err, errlen)))
		goto out;
	(*out)->image = image;
	image = NULL;
out:
	free(image);
	close(fd);
	return rc;
}

int radiance_st_read_part(const struct radiance_st_file *f, const struct radiance_st_tensor *t,
			  uint64_t off, uint64_t len, void *dst, char *err, size_t errlen)
{
	char what[600];
	uint64_t size = t->end - t->begin;

	if (off > size || len > size - off) {
		rlog_errf(err, errlen, "%s: tensor \"%.500s\": bytes %" PRIu64 "+%" PRIu64
			  " are outside its %" PRIu64, f->name, t->name, off, len, size);
		return -EINVAL;
	}
	if (f->data) {
		memcpy(dst, f->data + t->begin + off, (size_t)len);
		return 0;
	}
	snprintf(what, sizeof what, "tensor \"%.500s\": ", t->name);
	return read_exact(f->fd, f->name, what, dst, len, f->data_offset + t->begin + off, f->size,
			  err, errlen);
}

int radiance_st_read(const struct radiance_st_file *f, const struct radiance_st_tensor *t,
		     void *dst, char *err, size_t errlen)
{
	return radiance_st_read_part(f, t, 0, t->end - t->begin, dst, err, errlen);
}
