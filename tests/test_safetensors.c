/*
 * safetensors reader: every refusal of the reference's rules, each with a
 * small handmade file in a fresh temp dir, plus valid round trips. Each test
 * checks the return code and that the message names the cause, and that no
 * fd is left open.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "safetensors.h"
#include "st_writer.h"

struct fixture {
	char *dir;
	int fds;
	char path[4096];
	char err[1024];
};

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	assert_non_null(fx);
	fx->dir = tmpdir_create();
	fx->fds = count_open_fds();
	path_join(fx->path, sizeof fx->path, fx->dir, "t.safetensors");
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	assert_int_equal(count_open_fds(), fx->fds);
	tmpdir_remove(fx->dir);
	free(fx);
	return 0;
}

/* Writes header (exact bytes, length field = its length unless len_field is
 * given) and data_len zero bytes, opens it, expects -EINVAL and `needle` in
 * the message. */
static void expect_refused_len(struct fixture *fx, uint64_t len_field, const char *header,
			       size_t data_len, const char *needle)
{
	struct radiance_st_file *f = (void *)1;
	uint8_t *data = calloc(1, data_len + 1);
	assert_non_null(data);
	assert_int_equal(stw_write_raw(fx->path, len_field, header, strlen(header), data, data_len), 0);
	free(data);
	fx->err[0] = '\0';
	int rc = radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err);
	print_message("  -> %s\n", fx->err);
	assert_int_equal(rc, -EINVAL);
	assert_null(f);
	assert_non_null(strstr(fx->err, needle));
	assert_non_null(strstr(fx->err, "t.safetensors"));   /* names the file */
}

static void expect_refused(struct fixture *fx, const char *header, size_t data_len,
			   const char *needle)
{
	expect_refused_len(fx, strlen(header), header, data_len, needle);
}

static void test_valid_round_trip(void **state)
{
	struct fixture *fx = *state;
	struct stw w;
	struct radiance_st_file *f;
	float a[6] = { 0.0f, 1.0f, -2.5f, 3.0f, 4.0f, 1e30f };
	int32_t b[4] = { 0x77777777, -1, 7, 0 };
	uint16_t c = 0x3F80;

	stw_init(&w);
	w.meta_json = "{\"format\":\"pt\",\"note\":\"radiance\"}";
	stw_add(&w, "attn.0", "F32", 2, (uint64_t[]){ 2, 3 }, a, sizeof a);
	stw_add(&w, "q.qweight", "I32", 1, (uint64_t[]){ 4 }, b, sizeof b);
	stw_add(&w, "scalar", "BF16", 0, NULL, &c, sizeof c);
	stw_add(&w, "empty", "F16", 2, (uint64_t[]){ 0, 5 }, NULL, 0);
	stw_add(&w, "nib", "F4", 1, (uint64_t[]){ 4 }, "\x12\x34", 2);
	assert_int_equal(stw_write(&w, fx->path), 0);
	stw_finish(&w);

	/* from an fd: header only, tensor bytes through radiance_st_read */
	int rc = radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err);
	assert_int_equal(rc, 0);
	assert_int_equal(f->n_tensors, 5);
	float a2[6];
	int32_t b2[4];
	assert_null(radiance_st_find(f, "attn.0")->data);
	assert_int_equal(radiance_st_read(f, radiance_st_find(f, "attn.0"), a2, fx->err,
					  sizeof fx->err), 0);
	assert_memory_equal(a2, a, sizeof a);
	assert_int_equal(radiance_st_read(f, radiance_st_find(f, "q.qweight"), b2, fx->err,
					  sizeof fx->err), 0);
	assert_memory_equal(b2, b, sizeof b);
	radiance_st_close(f);

	/* the whole image in memory: .data and the element readers */
	rc = radiance_st_load_path(fx->path, &f, fx->err, sizeof fx->err);
	assert_int_equal(rc, 0);
	assert_int_equal(f->n_tensors, 5);
	assert_string_equal(radiance_st_meta_get(f, "format"), "pt");
	assert_string_equal(radiance_st_meta_get(f, "note"), "radiance");
	assert_null(radiance_st_meta_get(f, "absent"));

	const struct radiance_st_tensor *t = radiance_st_find(f, "attn.0");
	assert_non_null(t);
	assert_int_equal(t->dtype, RADIANCE_ST_F32);
	assert_int_equal(t->ndim, 2);
	assert_int_equal(t->shape[0], 2);
	assert_int_equal(t->shape[1], 3);
	assert_int_equal(t->nelem, 6);
	for (int i = 0; i < 6; i++)
		assert_true(radiance_st_get_f32(t, (uint64_t)i) == a[i]);
	t = radiance_st_find(f, "q.qweight");
	assert_non_null(t);
	assert_int_equal(radiance_st_get_u32(t, 0), 0x77777777u);
	assert_int_equal((int32_t)radiance_st_get_u32(t, 1), -1);
	t = radiance_st_find(f, "scalar");
	assert_int_equal(t->ndim, 0);
	assert_int_equal(t->nelem, 1);
	assert_int_equal(radiance_st_get_u16(t, 0), 0x3F80);
	t = radiance_st_find(f, "empty");
	assert_int_equal(t->nelem, 0);
	assert_int_equal(t->end - t->begin, 0);
	t = radiance_st_find(f, "nib");
	assert_int_equal(t->dtype, RADIANCE_ST_F4);
	assert_int_equal(t->end - t->begin, 2);
	assert_null(radiance_st_find(f, "attn"));
	radiance_st_close(f);
}

/* The reference's own serialization test vector, parsed from memory. */
static void test_reference_vector(void **state)
{
	(void)state;
	static const uint8_t bytes[] = {
		64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
		116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
		58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
		101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
		0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64
	};
	struct radiance_st_file *f;
	char err[256];
	assert_int_equal(radiance_st_parse(bytes, sizeof bytes, "vec", &f, err, sizeof err), 0);
	const struct radiance_st_tensor *t = radiance_st_find(f, "attn.0");
	assert_non_null(t);
	assert_int_equal(t->ndim, 3);
	for (int i = 0; i < 6; i++)
		assert_true(radiance_st_get_f32(t, (uint64_t)i) == (float)i);
	radiance_st_close(f);

	/* the empty file the reference writes: "{}" padded */
	static const uint8_t empty[] = { 8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32 };
	assert_int_equal(radiance_st_parse(empty, sizeof empty, "empty", &f, err, sizeof err), 0);
	assert_int_equal(f->n_tensors, 0);
	radiance_st_close(f);
}

static void test_too_short(void **state)
{
	struct fixture *fx = *state;
	struct radiance_st_file *f;
	assert_int_equal(write_text(fx->path, "abc"), 0);
	assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), -EINVAL);
	assert_non_null(strstr(fx->err, "too short"));
	assert_int_equal(write_text(fx->path, ""), 0);
	assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), -EINVAL);
	assert_non_null(strstr(fx->err, "0 bytes"));
}

static void test_header_too_large(void **state)
{
	expect_refused_len(*state, 100000001ull, "{}", 0, "too large");
	expect_refused_len(*state, UINT64_MAX, "{}", 0, "too large");
}

static void test_header_beyond_file(void **state)
{
	expect_refused_len(*state, 1000, "{}      ", 16, "runs past the end of the file");
}

static void test_not_json(void **state)
{
	expect_refused(*state, "{\"a\": {\"dtype\": \"F32\",,}}", 0, "not valid JSON");
	expect_refused(*state, "{\"a\": \"\xff\xfe\"}", 0, "not valid JSON");   /* not UTF-8 */
}

static void test_not_object(void **state)
{
	expect_refused(*state, "[1, 2]", 0, "is a JSON array, expected an object");
	expect_refused(*state, "\"str\"", 0, "is a JSON string, expected an object");
}

static void test_header_start(void **state)
{
	expect_refused(*state, " {}", 0, "expected '{'");
}

static void test_duplicate_key(void **state)
{
	expect_refused(*state,
		       "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		       "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
		       "duplicate");
}

static void test_unknown_dtype(void **state)
{
	expect_refused(*state, "{\"w\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
		       "unknown dtype \"F12\"");
	expect_refused(*state, "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		       "unknown dtype \"f32\"");
	expect_refused(*state, "{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		       "dtype is a JSON integer");
	expect_refused(*state, "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is missing");
}

static void test_bad_shape(void **state)
{
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", 8,
		       "shape[0] is -1, expected a non-negative integer");
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,8]}}", 8,
		       "shape[1] is a JSON real number");
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
		       "shape[0] is a JSON string");
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
		       "shape is a JSON integer");
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
		       "shape is missing");
}

static void test_bad_entry(void **state)
{
	expect_refused(*state, "{\"w\":[1,2]}", 0, "entry is a JSON array, expected an object");
	expect_refused(*state, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
		       "data_offsets has 3 elements, expected 2");
	expect_refused(*state, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "data_offsets is missing");
	expect_refused(*state, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
		       "data_offsets[0] is -1");
}

static void test_offsets_reversed(void **state)
{
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
		       "are reversed, expected begin <= end");
}

/* An end past the data section in a header whose tensors do not line up
 * (here a hole before "w") is a bad offset, named with its tensor; when
 * they do line up, the file is truncated (test_truncated). */
static void test_offsets_out_of_bounds(void **state)
{
	expect_refused(*state, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		       "\"w\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[16,1016]}}", 8,
		       "t.safetensors: tensor \"w\": data_offsets [16, 1016] out of bounds, expected end <= 8 "
		       "(the data section's size)");
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[8,1008]}}", 8,
		       "t.safetensors: tensor \"w\": data_offsets [8, 1008] out of bounds, expected end <= 8");
}

/* A file cut short (`head -c`, an interrupted copy or download) whose
 * header is whole: its tensors line up and end past the end of the file.
 * Said as such, with the file's size and the size its header needs, at
 * several cuts: inside the first tensor, at a boundary between two, inside
 * the last, one byte short; from an fd and from memory. */
static void test_truncated(void **state)
{
	struct fixture *fx = *state;
	struct stw w;
	struct radiance_st_file *f = (void *)1;
	uint8_t a[1000], b[24], c[4000];

	for (size_t i = 0; i < sizeof c; i++)
		c[i] = (uint8_t)(i * 7);
	memcpy(a, c, sizeof a);
	memcpy(b, c, sizeof b);
	stw_init(&w);
	stw_add(&w, "a", "U8", 2, (uint64_t[]){ 10, 100 }, a, sizeof a);
	stw_add(&w, "b", "F32", 1, (uint64_t[]){ 6 }, b, sizeof b);
	stw_add(&w, "c", "I16", 1, (uint64_t[]){ 2000 }, c, sizeof c);
	assert_int_equal(stw_write(&w, fx->path), 0);
	stw_finish(&w);

	struct stat st;
	assert_int_equal(stat(fx->path, &st), 0);
	uint64_t size = (uint64_t)st.st_size;
	assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), 0);
	uint64_t hdr = f->header_len;
	assert_int_equal(f->data_len, 5024);
	assert_int_equal(size, 8 + hdr + 5024);
	radiance_st_close(f);

	uint8_t *image = malloc(size);
	assert_non_null(image);
	int fd = open(fx->path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, image, size, 0), (ssize_t)size);
	close(fd);

	uint64_t cuts[] = { 8 + hdr, 8 + hdr + 500, 8 + hdr + 1000, 8 + hdr + 1024 + 1, size - 1 };
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		char want[4400];
		assert_int_equal(truncate(fx->path, (off_t)cuts[i]), 0);
		snprintf(want, sizeof want, "%s: truncated: the file is %" PRIu64 " bytes, its header "
			 "needs %" PRIu64 " (8 + a %" PRIu64 "-byte header + 5024 bytes of tensor data); "
			 "the copy or download was cut short", fx->path, cuts[i], size, hdr);
		f = (void *)1;
		assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), -EINVAL);
		assert_null(f);
		assert_string_equal(fx->err, want);
		f = (void *)1;
		assert_int_equal(radiance_st_parse(image, (size_t)cuts[i], "m.safetensors", &f, fx->err,
						   sizeof fx->err), -EINVAL);
		assert_null(f);
		snprintf(want, sizeof want, "m.safetensors: truncated: the file is %" PRIu64 " bytes, its "
			 "header needs %" PRIu64 " (8 + a %" PRIu64 "-byte header + 5024 bytes of tensor "
			 "data); the copy or download was cut short", cuts[i], size, hdr);
		assert_string_equal(fx->err, want);
	}
	free(image);
}

static void test_size_mismatch(void **state)
{
	expect_refused(*state, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12,
		       "span 12 bytes, expected 8 (shape [2] x F32)");
	/* sub-byte dtypes must fill whole bytes */
	expect_refused(*state, "{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
		       "not a whole number of bytes");
}

static void test_overflow(void **state)
{
	expect_refused(*state,
		       "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}",
		       8, "overflows 64 bits");
	/* product fits, times the dtype size does not */
	expect_refused(*state,
		       "{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}",
		       8, "overflows 64 bits");
}

static void test_overlap(void **state)
{
	expect_refused(*state,
		       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
		       "\"a\" [0, 8) and \"b\" [4, 12) overlap");
	/* two views of the same bytes */
	expect_refused(*state,
		       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		       "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap");
}

static void test_hole(void **state)
{
	expect_refused(*state,
		       "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
		       "hole in the data section: bytes [4, 8) between \"a\" and \"b\"");
	expect_refused(*state, "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
		       "bytes [0, 4) before \"b\"");
	/* trailing bytes after the last tensor (the reference's MetadataIncompleteBuffer) */
	expect_refused(*state, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
		       "4 trailing bytes");
}

static void test_metadata_not_string(void **state)
{
	expect_refused(*state, "{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0,
		       "__metadata__[\"n\"] is a JSON integer, expected a string");
	expect_refused(*state, "{\"__metadata__\":[\"pt\"]}", 0,
		       "__metadata__ is a JSON array, expected an object");
}

static void test_not_regular_file(void **state)
{
	struct fixture *fx = *state;
	struct radiance_st_file *f;
	int p[2];
	assert_int_equal(pipe(p), 0);
	assert_int_equal(radiance_st_open_fd(p[0], "pipe", &f, fx->err, sizeof fx->err), -EINVAL);
	assert_non_null(strstr(fx->err, "not a regular file"));
	close(p[0]);
	close(p[1]);
	assert_int_equal(radiance_st_open_path("/nonexistent/x.safetensors", &f, fx->err,
					       sizeof fx->err), -ENOENT);
}

/* open_fd must not move the fd's position (the fd is shared with a client). */
static void test_fd_position_kept(void **state)
{
	struct fixture *fx = *state;
	struct stw w;
	struct radiance_st_file *f;
	stw_init(&w);
	stw_add(&w, "x", "U8", 1, (uint64_t[]){ 3 }, "abc", 3);
	assert_int_equal(stw_write(&w, fx->path), 0);
	stw_finish(&w);
	int fd = open(fx->path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(lseek(fd, 5, SEEK_SET), 5);
	assert_int_equal(radiance_st_open_fd(fd, "x", &f, fx->err, sizeof fx->err), 0);
	assert_int_equal(lseek(fd, 0, SEEK_CUR), 5);
	close(fd);
	/* the reader's own fd outlives the caller's */
	char abc[3];
	assert_int_equal(radiance_st_read(f, radiance_st_find(f, "x"), abc, fx->err, sizeof fx->err), 0);
	assert_memory_equal(abc, "abc", 3);
	radiance_st_close(f);
}

/* Whoever else holds the file can shrink it after the header was read: a
 * tensor read past the new end is -EIO naming the file, the tensor and both
 * sizes (through a mapping it would have been SIGBUS); tensors still wholly
 * inside read as before. */
static void test_read_after_shrink(void **state)
{
	struct fixture *fx = *state;
	struct stw w;
	struct radiance_st_file *f;
	stw_init(&w);
	stw_add(&w, "a", "U8", 1, (uint64_t[]){ 4 }, "abcd", 4);
	stw_add(&w, "b", "U8", 1, (uint64_t[]){ 8192 }, NULL, 8192);
	assert_int_equal(stw_write(&w, fx->path), 0);
	stw_finish(&w);
	assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), 0);
	uint64_t size = f->size, cut = f->data_offset + 100;
	assert_int_equal(truncate(fx->path, (off_t)cut), 0);

	char a[4], *b = malloc(8192), want[4400];
	assert_non_null(b);
	assert_int_equal(radiance_st_read(f, radiance_st_find(f, "a"), a, fx->err, sizeof fx->err), 0);
	assert_memory_equal(a, "abcd", 4);
	assert_int_equal(radiance_st_read(f, radiance_st_find(f, "b"), b, fx->err, sizeof fx->err), -EIO);
	snprintf(want, sizeof want, "%s: tensor \"b\": file shrank to %" PRIu64 " bytes while loading "
		 "(expected %" PRIu64 ")", fx->path, cut, size);
	assert_string_equal(fx->err, want);
	/* a read wholly past the new end (pread returns 0) says the same */
	assert_int_equal(truncate(fx->path, 10), 0);
	assert_int_equal(radiance_st_read(f, radiance_st_find(f, "b"), b, fx->err, sizeof fx->err), -EIO);
	snprintf(want, sizeof want, "%s: tensor \"b\": file shrank to 10 bytes while loading "
		 "(expected %" PRIu64 ")", fx->path, size);
	assert_string_equal(fx->err, want);
	free(b);
	radiance_st_close(f);
}

/* Part of a tensor, as the shared-tensors copy streams large ones: the
 * bytes at that offset, from an fd and from an image in memory alike; a
 * range outside the tensor is -EINVAL naming it; a part past a shrunken
 * end is -EIO as a whole read is. */
static void test_read_part(void **state)
{
	struct fixture *fx = *state;
	struct stw w;
	struct radiance_st_file *f, *img;
	stw_init(&w);
	stw_add(&w, "a", "U8", 1, (uint64_t[]){ 4 }, "wxyz", 4);
	stw_add(&w, "x", "U8", 1, (uint64_t[]){ 10 }, "0123456789", 10);
	assert_int_equal(stw_write(&w, fx->path), 0);
	stw_finish(&w);
	assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), 0);
	assert_int_equal(radiance_st_load_path(fx->path, &img, fx->err, sizeof fx->err), 0);
	for (int k = 0; k < 2; k++) {
		const struct radiance_st_file *g = k ? img : f;
		const struct radiance_st_tensor *x = radiance_st_find(g, "x");
		char part[10];
		assert_int_equal(radiance_st_read_part(g, x, 3, 4, part, fx->err, sizeof fx->err), 0);
		assert_memory_equal(part, "3456", 4);
		assert_int_equal(radiance_st_read_part(g, x, 0, 10, part, fx->err, sizeof fx->err), 0);
		assert_memory_equal(part, "0123456789", 10);
		assert_int_equal(radiance_st_read_part(g, x, 10, 0, part, fx->err, sizeof fx->err), 0);
		assert_int_equal(radiance_st_read_part(g, x, 7, 4, part, fx->err, sizeof fx->err), -EINVAL);
		assert_non_null(strstr(fx->err, "tensor \"x\": bytes 7+4 are outside its 10"));
		assert_int_equal(radiance_st_read_part(g, x, 11, 0, part, fx->err, sizeof fx->err), -EINVAL);
		assert_int_equal(radiance_st_read_part(g, x, 2, UINT64_MAX, part, fx->err, sizeof fx->err),
				 -EINVAL);
	}
	assert_int_equal(truncate(fx->path, (off_t)(f->data_offset + 6)), 0);
	char part[4];
	const struct radiance_st_tensor *x = radiance_st_find(f, "x");
	assert_int_equal(radiance_st_read_part(f, x, 0, 2, part, fx->err, sizeof fx->err), 0);
	assert_memory_equal(part, "01", 2);
	assert_int_equal(radiance_st_read_part(f, x, 2, 4, part, fx->err, sizeof fx->err), -EIO);
	assert_non_null(strstr(fx->err, "file shrank to"));
	radiance_st_close(img);
	radiance_st_close(f);
}

/* A clone without Git LFS leaves a pointer text in place of the file: named
 * as such with its oid and size, instead of "header length ... too large"
 * (the first 8 bytes "version " read as a length). */
static void test_lfs_pointer(void **state)
{
	struct fixture *fx = *state;
	struct radiance_st_file *f = (void *)1;
	static const char ptr[] =
		"version https://git-lfs.github.com/spec/v1\n"
		"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
		"size 29727712\n";
	static const char want[] =
		" is a Git LFS pointer (oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393, "
		"size 29727712), not the tensor data: run `git lfs pull` in the checkpoint's repository";
	char full[4400];
	assert_int_equal(write_text(fx->path, ptr), 0);
	assert_int_equal(radiance_st_open_path(fx->path, &f, fx->err, sizeof fx->err), -EINVAL);
	assert_null(f);
	snprintf(full, sizeof full, "%s%s", fx->path, want);
	assert_string_equal(fx->err, full);
	assert_int_equal(radiance_st_parse(ptr, sizeof ptr - 1, "p.safetensors", &f, fx->err,
					   sizeof fx->err), -EINVAL);
	snprintf(full, sizeof full, "p.safetensors%s", want);
	assert_string_equal(fx->err, full);
	/* a pointer missing its lines still says what it is */
	assert_int_equal(radiance_st_parse(ptr, 43, "q", &f, fx->err, sizeof fx->err), -EINVAL);
	assert_string_equal(fx->err, "q is a Git LFS pointer (oid ?, size ?), not the tensor data: run "
			    "`git lfs pull` in the checkpoint's repository");
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_valid_round_trip),
		T(test_reference_vector),
		T(test_too_short),
		T(test_header_too_large),
		T(test_header_beyond_file),
		T(test_not_json),
		T(test_not_object),
		T(test_header_start),
		T(test_duplicate_key),
		T(test_unknown_dtype),
		T(test_bad_shape),
		T(test_bad_entry),
		T(test_offsets_reversed),
		T(test_offsets_out_of_bounds),
		T(test_size_mismatch),
		T(test_overflow),
		T(test_overlap),
		T(test_hole),
		T(test_metadata_not_string),
		T(test_not_regular_file),
		T(test_fd_position_kept),
		T(test_read_after_shrink),
		T(test_read_part),
		T(test_lfs_pointer),
		T(test_truncated),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
