/*
 * safetensors reader: maps a file read-only and validates its header the way
 * the format's reference implementation (huggingface/safetensors, Rust,
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
 * Stricter than the reference in one way: duplicate keys in the header JSON
 * are refused (the reference keeps one of them silently). Unknown keys inside
 * a tensor entry are ignored, as the reference does.
 *
 * Tensor data is never copied: radiance_st_tensor.data points into the
 * mapping. It has no alignment guarantee (the header length is arbitrary), so
 * read elements with memcpy or the radiance_st_get_* helpers. Safetensors is
 * little-endian; radiance builds only for little-endian hosts.
 *
 * Thread safety: no global state. A radiance_st_file is immutable after open
 * and may be read from any number of threads; open/close are reentrant.
 * The mapping is MAP_PRIVATE, PROT_READ; a file truncated by someone else
 * while mapped can raise SIGBUS on access (the daemon maps fds clients sent
 * and copies what it needs at load, then unmaps).
 */
#ifndef RADIANCE_SAFETENSORS_H
#define RADIANCE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
	const void *data;          /* into the mapping; unaligned; end - begin bytes */
};

struct radiance_st_meta {
	char *key;
	char *value;
};

struct radiance_st_file {
	char *name;                /* as given to open, used in error messages */
	void *map;                 /* whole file, PROT_READ, MAP_PRIVATE; NULL if empty */
	size_t map_len;
	uint64_t header_len;       /* N */
	const uint8_t *data;       /* data section: map + 8 + N */
	uint64_t data_len;
	struct radiance_st_tensor *tensors;   /* sorted by name (strcmp) */
	size_t n_tensors;
	struct radiance_st_meta *meta;        /* __metadata__, in file order */
	size_t n_meta;
};

/* Maps fd (from offset 0, whatever its file position; the position is not
 * changed and fd is not closed) and validates it as above. `name` is used in
 * error messages and copied. On success *out owns the mapping; the caller may
 * close fd at once.
 * Returns 0, or:
 *   -EINVAL  not a valid safetensors file (err says which rule, which tensor,
 *            what was found and what was expected), or fd not a regular file;
 *   -ENOMEM  out of memory (or the mapping failed for lack of it);
 *   -EIO / other -errno from fstat or mmap.
 * err (errlen bytes, may be NULL/0) receives a NUL-terminated message. */
int radiance_st_open_fd(int fd, const char *name, struct radiance_st_file **out, char *err,
			size_t errlen);

/* open(path, O_RDONLY | O_CLOEXEC) + radiance_st_open_fd + close. Error
 * messages name the path. Also returns -errno of open(). */
int radiance_st_open_path(const char *path, struct radiance_st_file **out, char *err,
			  size_t errlen);

/* Validates a whole file image already in memory (what open_fd does after
 * mmap). buf must stay valid and unchanged while *out is used; *out does not
 * own it (map is NULL). Same returns as radiance_st_open_fd. For tests and
 * fuzzing. */
int radiance_st_parse(const void *buf, size_t len, const char *name,
		      struct radiance_st_file **out, char *err, size_t errlen);

/* Unmaps and frees; NULL is a no-op. Pointers into the file die with it. */
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
