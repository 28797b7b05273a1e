/*
 * safetensors reader: reads a file's header and validates it the way the
 * format's reference implementation (huggingface/safetensors, Rust,
 * Metadata::validate and SafeTensors::read_metadata) does, before any tensor
 * byte is touched:
 *
 *   - the file holds at least the 8-byte little-endian header length N;
 *   - N <= RADIANCE_ST_MAX_HEADER (100,000,000 bytes, the reference's cap) and
 *     8 + N <= file size;
 *   - the header is UTF-8 JSON (jansson), a JSON object, and its first byte
 *     is '{' (the reference's InvalidHeaderStart);
 *   - optional "__metadata__" is an object of string -> string;
 *   - every other key is a tensor: an object with "dtype" (a known dtype
 *     name), "shape" (array of non-negative integers) and "data_offsets"
 *     ([begin, end], non-negative integers, begin <= end, end within the data
 *     section);
 *   - byte size == product(shape) * dtype bits / 8, every product checked for
 *     overflow, and whole bytes for the sub-byte dtypes (F4, F6_*);
 *   - sorted by offset, the tensors cover the data section exactly: no two
 *     overlap, no hole between them and no trailing bytes after the last one.
 *
 * A file cut short whose header is whole (its tensors line up and end past
 * the end of the file) is refused as "<file>: truncated: the file is N
 * bytes, its header needs M (...)" rather than as the first tensor past the
 * cut being out of bounds.
 *
 * Stricter than the reference in one way: duplicate keys in the header JSON
 * are refused (the reference keeps one of them silently). Unknown keys inside
 * a tensor entry are ignored, as the reference does.
 *
 * A Git LFS pointer (the text a clone without LFS leaves in place of the
 * file) is refused as such: "<file> is a Git LFS pointer (oid sha256:...,
 * size N), not the tensor data: run `git lfs pull` in the checkpoint's
 * repository".
 *
 * Reading tensor data. A file opened from an fd (radiance_st_open_fd,
 * radiance_st_open_path) is never mapped: its header is read with pread into
 * private memory at open, the reader keeps a dup of the fd, and each
 * tensor's bytes are copied out with radiance_st_read() when the caller
 * wants them. Whoever else holds the file (the client that sent it) may
 * shrink or rewrite it at any moment; through a mapping a shrink would raise
 * SIGBUS in the reader, through pread it is a short read, which
 * radiance_st_read() reports as an error naming the file, the tensor and
 * both sizes. What was copied cannot change under the caller, so check the
 * copy and use the copy. radiance_st_tensor.data is NULL for such files.
 * A file image already in memory (radiance_st_parse, radiance_st_load_path)
 * has .data pointing into that memory instead.
 *
 * .data has no alignment guarantee (the header length is arbitrary), so
 * read elements with memcpy or the radiance_st_get_* helpers. Safetensors is
 * little-endian; radiance builds only for little-endian hosts.
 *
 * Thread safety: no global state. A radiance_st_file is immutable after open
 * and may be read from any number of threads (radiance_st_read uses pread,
 * never the fd's file position); open/close are reentrant.
 */
#ifndef RADIANCE_SAFETENSORS_H
#define RADIANCE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

/* The reference rejects headers larger than this (HeaderTooLarge). */
#define RADIANCE_ST_MAX_HEADER 100000000ull

enum radiance_st_dtype {
	RADIANCE_ST_BOOL,
	RADIANCE_ST_U8,
	RADIANCE_ST_I8,
	RADIANCE_ST_F8_E5M2,
	RADIANCE_ST_F8_E4M3,
	RADIANCE_ST_F8_E8M0,
	RADIANCE_ST_I16,
	RADIANCE_ST_U16,
	RADIANCE_ST_F16,
	RADIANCE_ST_BF16,
	RADIANCE_ST_I32,
	RADIANCE_ST_U32,
	RADIANCE_ST_F32,
	RADIANCE_ST_F64,
	RADIANCE_ST_I64,
	RADIANCE_ST_U64,
	RADIANCE_ST_C64,
	RADIANCE_ST_F4,
	RADIANCE_ST_F6_E2M3,
	RADIANCE_ST_F6_E3M2,
	RADIANCE_ST_DTYPE_COUNT
};

struct radiance_st_tensor {
	char *name;
	enum radiance_st_dtype dtype;
	uint32_t ndim;
	uint64_t *shape;           /* [ndim]; NULL when ndim == 0 (a scalar) */
	uint64_t nelem;            /* product(shape), 1 for a scalar */
	uint64_t begin, end;       /* data_offsets, relative to the data section */
	const void *data;          /* in-memory images only (parse, load_path): end - begin
				    * bytes, unaligned; NULL for a file opened from an fd */
};

struct radiance_st_meta {
	char *key;
	char *value;
};

struct radiance_st_file {
	char *name;                /* as given to open, used in error messages */
	int fd;                    /* private dup (O_CLOEXEC) of the fd opened; -1 in memory */
	void *image;               /* the file image load_path read, owned; else NULL */
	uint64_t size;             /* file size at open: 8 + N + data_len */
	uint64_t header_len;       /* N */
	uint64_t data_offset;      /* 8 + N: where the data section starts in the file */
	const uint8_t *data;       /* in memory: the data section (image + 8 + N); else NULL */
	uint64_t data_len;
	struct radiance_st_tensor *tensors;   /* sorted by name (strcmp) */
	size_t n_tensors;
	struct radiance_st_meta *meta;        /* __metadata__, in file order */
	size_t n_meta;
};

/* Reads the header of the safetensors file open on fd (from offset 0,
 * whatever its file position; the position is not changed and fd is not
 * closed) with pread, and validates it as above. No tensor byte is read:
 * use radiance_st_read(). `name` is used in error messages and copied. On
 * success *out holds a dup of fd (closed by radiance_st_close), so the
 * caller may close fd at once.
 * Returns 0, or:
 *   -EINVAL  not a valid safetensors file (err says which rule, which tensor,
 *            what was found and what was expected), a Git LFS pointer in its
 *            place, or fd not a regular file;
 *   -EIO     the file shrank while its header was read, or a read failed;
 *   -ENOMEM  out of memory;
 *   other -errno from fstat or the dup (-EMFILE).
 * err (errlen bytes, may be NULL/0) receives a NUL-terminated message. */
int radiance_st_open_fd(int fd, const char *name, struct radiance_st_file **out, char *err,
			size_t errlen);

/* open(path, O_RDONLY | O_CLOEXEC) + radiance_st_open_fd + close. Error
 * messages name the path. Also returns -errno of open(). */
int radiance_st_open_path(const char *path, struct radiance_st_file **out, char *err,
			  size_t errlen);

/* Validates a whole file image already in memory. buf must stay valid and
 * unchanged while *out is used; *out does not own it (fd is -1, image NULL),
 * and every tensor's .data points into it. Same returns as
 * radiance_st_open_fd, less -EIO. For tests and fuzzing. */
int radiance_st_parse(const void *buf, size_t len, const char *name,
		      struct radiance_st_file **out, char *err, size_t errlen);

/* Reads the whole file at path into private memory *out owns, then
 * radiance_st_parse: every tensor's .data is valid until radiance_st_close.
 * Memory is the file's size, so for small files a caller reads at random
 * (the tests' captured activations); a checkpoint goes through open_fd and
 * radiance_st_read a tensor at a time. Returns as radiance_st_open_path. */
int radiance_st_load_path(const char *path, struct radiance_st_file **out, char *err,
			  size_t errlen);

/* Copies tensor t of f (t from f->tensors) into dst, which holds
 * t->end - t->begin bytes: with pread for a file opened from an fd, memcpy
 * for an image in memory. Returns 0, or -EIO when the file is shorter now
 * than at open ("<file>: tensor "<t>": file shrank to N bytes while loading
 * (expected M)") or the read failed (the message names the offset and the
 * errno text). Safe from any thread, also on one f at once. */
int radiance_st_read(const struct radiance_st_file *f, const struct radiance_st_tensor *t,
		     void *dst, char *err, size_t errlen);

/* As radiance_st_read, for bytes [off, off + len) of t's data only (a
 * caller streaming a large tensor through a small buffer). -EINVAL when the
 * range is not inside t; otherwise returns as radiance_st_read. */
int radiance_st_read_part(const struct radiance_st_file *f, const struct radiance_st_tensor *t,
			  uint64_t off, uint64_t len, void *dst, char *err, size_t errlen);

/* Closes the dup'ed fd, frees; NULL is a no-op. Pointers into the file die
 * with it. */
void radiance_st_close(struct radiance_st_file *f);

/* The tensor called `name`, or NULL. O(log n). */
const struct radiance_st_tensor *radiance_st_find(const struct radiance_st_file *f,
						  const char *name);

/* The __metadata__ value for key, or NULL. */
const char *radiance_st_meta_get(const struct radiance_st_file *f, const char *key);

/* "BF16", "F8_E4M3", ... (a static string), or "?" when out of range. */
const char *radiance_st_dtype_name(enum radiance_st_dtype d);

/* Bits of one element (4 for F4, 6 for F6_*, 16 for BF16, ...), 0 when out
 * of range. */
unsigned radiance_st_dtype_bits(enum radiance_st_dtype d);

/* The dtype called `name` (case-sensitive, as the format spells it), or -1. */
int radiance_st_dtype_from_name(const char *name);

/* Element readers for tensor data (little-endian, unaligned-safe). */
static inline uint16_t radiance_st_get_u16(const struct radiance_st_tensor *t, uint64_t i)
{
	uint16_t v;
	memcpy(&v, (const uint8_t *)t->data + i * 2, sizeof v);
	return v;
}

static inline uint32_t radiance_st_get_u32(const struct radiance_st_tensor *t, uint64_t i)
{
	uint32_t v;
	memcpy(&v, (const uint8_t *)t->data + i * 4, sizeof v);
	return v;
}

static inline float radiance_st_get_f32(const struct radiance_st_tensor *t, uint64_t i)
{
	float v;
	memcpy(&v, (const uint8_t *)t->data + i * 4, sizeof v);
	return v;
}

#endif
