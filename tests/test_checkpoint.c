/*
 * Checkpoint loader: a tiny handmade AutoRound checkpoint (written by the
 * test into a fresh temp dir), loaded whole, single-file and sharded, with
 * routing, repacked values and progress checked exactly; then one refusal
 * per rule, each a one-line mutation of that checkpoint, checking the
 * return code and that the message names the layer and the cause.
 *
 * The tiny model (blocks "encoder.layer"):
 *   encoder.layer.0.attention.self.query   int4, N 16, K 256, F16 bias
 *   encoder.layer.0.attention.self.key     int4, N 12 (qzeros padding), K 128,
 *                                          identity g_idx, no bias
 *   encoder.layer.0.output.dense           extra_config bits 16: BF16 [8, 128] + BF16 bias
 *   encoder.layer.0.intermediate.dense     extra_config regex, data_type float: F16 [16, 40]
 *   pooler.dense                           outside the blocks: F32 [4, 16] + F32 bias
 *   embeddings.word_embeddings.weight      F32 [10, 16]: an embedding, in `other`
 *   embeddings.LayerNorm.{weight,bias}     F32 [16], embeddings.position_ids I64 [1, 8],
 *   encoder.layer.0.output.LayerNorm.weight BF16 [16]: all in `other`
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "checkpoint.h"
#include "numerics.h"
#include "safetensors.h"
#include "st_writer.h"

#define Q "encoder.layer.0.attention.self.query"
#define KEY "encoder.layer.0.attention.self.key"
#define OUT "encoder.layer.0.output.dense"
#define INTER "encoder.layer.0.intermediate.dense"
#define POOL "pooler.dense"

struct fixture {
	char *dir;
	int fds;
	struct stw w;
	json_t *config;            /* config.json, with quantization_config */
	char err[2048];
	char path[4096];
};

/* ---- the tiny checkpoint ---------------------------------------------- */

/* Codes vary along both n and k, and across groups, so any transposition or
 * nibble-order slip changes some value. */
static uint32_t code_of(uint32_t n, uint32_t k)
{
	return (n * 3u + k * 7u + (k / 128u) * 5u + (k * k) / 13u) % 16u;
}

static uint16_t scale_of(uint32_t n, uint32_t g)
{
	return (uint16_t)(0x2C00u + n * 37u + g * 11u);   /* distinct finite fp16 */
}

static void add_w4(struct stw *w, const char *module, uint32_t n, uint32_t k)
{
	stw_add_w4(w, module, n, k, code_of, scale_of);
}

static uint16_t bf16_of(uint32_t i)
{
	return (uint16_t)(0x3E00u + (i * 29u) % 0x400u);
}

static uint16_t f16_of(uint32_t i)
{
	return (uint16_t)(0x3000u + (i * 53u) % 0x1000u);
}

static float f32_of(uint32_t i)
{
	/* values off the bf16 grid, ties included: i % 5 == 0 puts the value
	 * exactly half a bf16 ulp (2^-8 near 1) above a grid point, whose
	 * mantissa is even (i % 10 == 0: rounds down) or odd (else: rounds up) */
	float base = 1.0f + (float)(i % 7) / 8.0f;
	if (i % 5 == 0)
		return base + (i % 10 == 0 ? 0x1p-8f : 3 * 0x1p-8f);
	return base * (1.0f + (float)i * 1e-3f);
}

static void build_model(struct stw *w)
{
	uint16_t b16[16 * 128];
	float f32[16 * 16];
	int64_t pos[8];
	uint32_t gidx[128] = { 0 };

	stw_init(w);
	add_w4(w, Q, 16, 256);
	for (uint32_t i = 0; i < 16; i++)
		b16[i] = (uint16_t)(0x3C00u + i);                   /* F16 bias */
	stw_add(w, Q ".bias", "F16", 1, (uint64_t[]){ 16 }, b16, 32);
	add_w4(w, KEY, 12, 128);
	stw_add(w, KEY ".g_idx", "I32", 1, (uint64_t[]){ 128 }, gidx, sizeof gidx);

	for (uint32_t i = 0; i < 8 * 128; i++)
		b16[i] = bf16_of(i);
	stw_add(w, OUT ".weight", "BF16", 2, (uint64_t[]){ 8, 128 }, b16, 8 * 128 * 2);
	for (uint32_t i = 0; i < 8; i++)
		b16[i] = (uint16_t)(0xBF80u + i);                   /* BF16 bias */
	stw_add(w, OUT ".bias", "BF16", 1, (uint64_t[]){ 8 }, b16, 16);

	for (uint32_t i = 0; i < 16 * 40; i++)
		b16[i] = f16_of(i);
	stw_add(w, INTER ".weight", "F16", 2, (uint64_t[]){ 16, 40 }, b16, 16 * 40 * 2);

	for (uint32_t i = 0; i < 64; i++)
		f32[i] = f32_of(i);
	stw_add(w, POOL ".weight", "F32", 2, (uint64_t[]){ 4, 16 }, f32, 64 * 4);
	for (uint32_t i = 0; i < 4; i++)
		f32[i] = -0.5f * (float)i;
	stw_add(w, POOL ".bias", "F32", 1, (uint64_t[]){ 4 }, f32, 16);

	for (uint32_t i = 0; i < 160; i++)
		f32[i] = (float)i;
	stw_add(w, "embeddings.word_embeddings.weight", "F32", 2, (uint64_t[]){ 10, 16 }, f32, 640);
	stw_add(w, "embeddings.LayerNorm.weight", "F32", 1, (uint64_t[]){ 16 }, f32, 64);
	stw_add(w, "embeddings.LayerNorm.bias", "F32", 1, (uint64_t[]){ 16 }, f32, 64);
	for (int i = 0; i < 8; i++)
		pos[i] = i;
	stw_add(w, "embeddings.position_ids", "I64", 2, (uint64_t[]){ 1, 8 }, pos, sizeof pos);
	stw_add(w, "encoder.layer.0.output.LayerNorm.weight", "BF16", 1, (uint64_t[]){ 16 }, b16, 32);
}

static json_t *build_config(void)
{
	json_error_t e;
	json_t *c = json_loads(
		"{\"architectures\": [\"BertModel\"], \"_name_or_path\": \"org/tiny-bert/\","
		" \"torch_dtype\": \"float16\","
		" \"quantization_config\": {"
		"  \"quant_method\": \"auto-round\", \"packing_format\": \"auto_round:auto_gptq\","
		"  \"bits\": 4, \"group_size\": 128, \"sym\": true, \"data_type\": \"int\","
		"  \"block_name_to_quantize\": \"encoder.layer\","
		"  \"extra_config\": {"
		"   \"encoder.layer.0.output.dense\": {\"bits\": 16, \"data_type\": \"float\"},"
		"   \"encoder\\\\.layer\\\\.[0-9]+\\\\.intermediate\\\\.dense\": {\"data_type\": \"fp\"}"
		"  }}}", 0, &e);
	assert_non_null(c);
	return c;
}

static json_t *qc(struct fixture *fx)
{
	return json_object_get(fx->config, "quantization_config");
}

static json_t *extra(struct fixture *fx)
{
	return json_object_get(qc(fx), "extra_config");
}

static struct stw_tensor *tensor(struct fixture *fx, const char *name)
{
	struct stw_tensor *t = stw_get(&fx->w, name);
	assert_non_null(t);
	return t;
}

static void write_config(struct fixture *fx)
{
	assert_int_equal(json_dump_file(fx->config, path_join(fx->path, sizeof fx->path, fx->dir,
							      "config.json"), 0), 0);
}

static void write_ckpt(struct fixture *fx)
{
	write_config(fx);
	assert_int_equal(stw_write(&fx->w, path_join(fx->path, sizeof fx->path, fx->dir,
						     "model.safetensors")), 0);
}

/* Splits the tensors in two shards at tensor `split` and writes the index. */
static void write_sharded(struct fixture *fx, size_t split)
{
	const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
	json_t *idx = json_pack("{s:{s:i}, s:{}}", "metadata", "total_size", 0, "weight_map");
	json_t *wm = json_object_get(idx, "weight_map");
	for (size_t i = 0; i < fx->w.n; i++)
		json_object_set_new(wm, fx->w.t[i].name, json_string(i < split ? s1 : s2));
	write_config(fx);
	assert_int_equal(stw_write_range(&fx->w, 0, split, path_join(fx->path, sizeof fx->path,
								   fx->dir, s1)), 0);
	assert_int_equal(stw_write_range(&fx->w, split, fx->w.n - split,
					 path_join(fx->path, sizeof fx->path, fx->dir, s2)), 0);
	assert_int_equal(json_dump_file(idx, path_join(fx->path, sizeof fx->path, fx->dir,
						       "model.safetensors.index.json"), 0), 0);
	json_decref(idx);
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	assert_non_null(fx);
	fx->dir = tmpdir_create();
	fx->fds = count_open_fds();
	build_model(&fx->w);
	fx->config = build_config();
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	assert_int_equal(count_open_fds(), fx->fds);
	stw_finish(&fx->w);
	json_decref(fx->config);
	tmpdir_remove(fx->dir);
	free(fx);
	return 0;
}

static int load(struct fixture *fx, struct radiance_model **m)
{
	fx->err[0] = '\0';
	int rc = radiance_checkpoint_load_dir(fx->dir, NULL, NULL, NULL, m, fx->err, sizeof fx->err);
	if (rc)
		print_message("  -> %s\n", fx->err);
	return rc;
}

/* Loads, expects rc and every needle in the message. */
static void expect_refused(struct fixture *fx, int want, const char *n1, const char *n2)
{
	struct radiance_model *m = (void *)1;
	int rc = load(fx, &m);
	assert_int_equal(rc, want);
	assert_null(m);
	if (n1)
		assert_non_null(strstr(fx->err, n1));
	if (n2)
		assert_non_null(strstr(fx->err, n2));
}

/* ---- valid ------------------------------------------------------------ */

struct progress_log {
	uint64_t done[64], total[64];
	int n;
};

static void on_progress(void *user, uint64_t done, uint64_t total)
{
	struct progress_log *p = user;
	assert_true(p->n < 64);
	p->done[p->n] = done;
	p->total[p->n] = total;
	p->n++;
}

static const struct radiance_layer *layer(const struct radiance_model *m, const char *name)
{
	long i = radiance_model_find_layer(m, name);
	assert_true(i >= 0);
	return &m->layers[i];
}

static void check_model(struct fixture *fx, const struct radiance_model *m)
{
	(void)fx;
	assert_int_equal(m->n_layers, 5);
	assert_int_equal(m->bits, 4);
	assert_int_equal(m->group_size, 128);

	/* int4: canonical [N][K/8] words hold k = 8w..8w+7 in nibbles 0..7 */
	const struct radiance_layer *l = layer(m, Q);
	assert_int_equal(l->kind, RADIANCE_LAYER_W4A8);
	assert_int_equal(l->n, 16);
	assert_int_equal(l->k, 256);
	assert_null(l->weight);
	for (uint32_t n = 0; n < 16; n++)
		for (uint32_t k = 0; k < 256; k++)
			assert_int_equal((l->qweight[n * 32 + k / 8] >> (4 * (k % 8))) & 0xF, code_of(n, k));
	for (uint32_t n = 0; n < 16; n++)
		for (uint32_t g = 0; g < 2; g++)
			assert_int_equal(l->scales[n * 2 + g], scale_of(n, g));
	assert_non_null(l->bias);
	for (uint32_t n = 0; n < 16; n++)
		assert_true(l->bias[n] == radiance_f16_to_f32((uint16_t)(0x3C00u + n)));
	assert_int_equal(l->bytes, 16 * 32 * 4 + 16 * 2 * 2 + 16 * 4);

	l = layer(m, KEY);
	assert_int_equal(l->kind, RADIANCE_LAYER_W4A8);
	assert_int_equal(l->n, 12);
	assert_int_equal(l->k, 128);
	assert_null(l->bias);
	for (uint32_t n = 0; n < 12; n++)
		for (uint32_t k = 0; k < 128; k++)
			assert_int_equal((l->qweight[n * 16 + k / 8] >> (4 * (k % 8))) & 0xF, code_of(n, k));

	/* held at 16 bits by an exact extra_config key: BF16 copied */
	l = layer(m, OUT);
	assert_int_equal(l->kind, RADIANCE_LAYER_BF16);
	assert_int_equal(l->n, 8);
	assert_int_equal(l->k, 128);
	assert_null(l->qweight);
	assert_null(l->scales);
	for (uint32_t i = 0; i < 8 * 128; i++)
		assert_int_equal(l->weight[i], bf16_of(i));
	for (uint32_t i = 0; i < 8; i++)
		assert_true(l->bias[i] == radiance_bf16_to_f32((uint16_t)(0xBF80u + i)));
	assert_int_equal(l->bytes, 8 * 128 * 2 + 8 * 4);

	/* held by a regex key: F16 -> bf16 RNE */
	l = layer(m, INTER);
	assert_int_equal(l->kind, RADIANCE_LAYER_BF16);
	assert_int_equal(l->n, 16);
	assert_int_equal(l->k, 40);
	for (uint32_t i = 0; i < 16 * 40; i++)
		assert_int_equal(l->weight[i], radiance_bf16_from_f32(radiance_f16_to_f32(f16_of(i))));

	/* outside the blocks: F32 -> bf16 RNE; ties go to even */
	l = layer(m, POOL);
	assert_int_equal(l->kind, RADIANCE_LAYER_BF16);
	assert_int_equal(l->n, 4);
	assert_int_equal(l->k, 16);
	for (uint32_t i = 0; i < 64; i++)
		assert_int_equal(l->weight[i], radiance_bf16_from_f32(f32_of(i)));
	assert_int_equal(l->weight[0], 0x3F80);   /* 1 + 2^-8: tie, down to even 0x3F80 */
	assert_int_equal(l->weight[5], 0x3FD2);   /* 1.625 + 3 * 2^-8: tie, up to even 0x3FD2 */
	for (uint32_t i = 0; i < 4; i++)
		assert_true(l->bias[i] == -0.5f * (float)i);

	uint64_t resident = 0;
	for (size_t i = 0; i < m->n_layers; i++)
		resident += m->layers[i].bytes;
	assert_int_equal(m->resident_bytes, resident + m->tensors_bytes);

	/* everything else, listed, nothing dropped */
	static const char *const other[] = {
		"embeddings.LayerNorm.bias", "embeddings.LayerNorm.weight", "embeddings.position_ids",
		"embeddings.word_embeddings.weight", "encoder.layer.0.output.LayerNorm.weight",
	};
	assert_int_equal(m->n_other, 5);
	for (size_t i = 0; i < 5; i++)
		assert_string_equal(m->other[i].name, other[i]);
	assert_string_equal(m->other[2].dtype, "I64");
	assert_int_equal(m->other[2].ndim, 2);
	assert_int_equal(m->other[2].shape[1], 8);
	assert_int_equal(m->other[2].bytes, 64);
	assert_string_equal(m->other[3].dtype, "F32");
	assert_int_equal(m->other[3].shape[0], 10);
	assert_int_equal(m->other[3].shape[1], 16);
	assert_int_equal(radiance_model_find_layer(m, "embeddings.word_embeddings"), -1);

	/* the shared tensors: a sealed memfd holding each one's bytes as the
	 * checkpoint writer made them, aligned, in name order, one page */
	assert_true(m->tensors_fd >= 0);
	int seals = fcntl(m->tensors_fd, F_GET_SEALS);
	assert_int_equal(seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
			 F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	struct stat sb;
	assert_int_equal(fstat(m->tensors_fd, &sb), 0);
	assert_int_equal((uint64_t)sb.st_size, m->tensors_bytes);
	assert_int_equal(m->tensors_bytes, 4096);
	const uint8_t *base = mmap(NULL, m->tensors_bytes, PROT_READ, MAP_SHARED, m->tensors_fd, 0);
	assert_true(base != MAP_FAILED);
	uint64_t end = 0;
	for (size_t i = 0; i < m->n_other; i++) {
		const struct radiance_tensor_info *o = &m->other[i];
		const struct stw_tensor *src = stw_get(&fx->w, o->name);
		assert_non_null(src);
		assert_int_equal(o->bytes, src->nbytes);
		assert_int_equal(o->offset % 64, 0);
		assert_true(o->offset >= end);
		end = o->offset + o->bytes;
		assert_true(end <= m->tensors_bytes);
		if (memcmp(base + o->offset, src->data, src->nbytes) != 0)
			fail_msg("shared tensor %s differs from the checkpoint's bytes", o->name);
	}
	munmap((void *)base, m->tensors_bytes);
}

/* checkpoint bytes of every tensor: the linears' and the shared ones */
static uint64_t linear_bytes(struct fixture *fx)
{
	uint64_t b = 0;
	for (size_t i = 0; i < fx->w.n; i++)
		b += fx->w.t[i].nbytes;
	return b;
}

static void test_valid(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m;
	struct progress_log p = { .n = 0 };

	write_ckpt(fx);
	int rc = radiance_checkpoint_load_dir(fx->dir, "tiny", on_progress, &p, &m, fx->err,
					      sizeof fx->err);
	if (rc)
		print_message("%s\n", fx->err);
	assert_int_equal(rc, 0);
	assert_string_equal(m->name, "tiny");
	check_model(fx, m);

	assert_true(p.n >= 2);
	assert_int_equal(p.done[0], 0);
	for (int i = 0; i < p.n; i++) {
		assert_int_equal(p.total[i], linear_bytes(fx));
		if (i)
			assert_true(p.done[i] >= p.done[i - 1]);
	}
	assert_int_equal(p.done[p.n - 1], p.total[p.n - 1]);
	radiance_model_destroy(m);

	/* name from the directory when not given */
	assert_int_equal(radiance_checkpoint_load_dir(fx->dir, NULL, NULL, NULL, &m, fx->err,
						      sizeof fx->err), 0);
	assert_string_equal(m->name, strrchr(fx->dir, '/') + 1);
	radiance_model_destroy(m);
}

/* load from fds: name from _name_or_path, other files ignored, fds untouched */
static void test_valid_fds(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m;
	static const char *const names[] = { "config.json", "model.safetensors", "tokenizer.json" };
	struct radiance_file files[3];

	write_ckpt(fx);
	assert_int_equal(write_text(path_join(fx->path, sizeof fx->path, fx->dir, "tokenizer.json"),
				    "{}"), 0);
	for (int i = 0; i < 3; i++) {
		files[i].name = names[i];
		files[i].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, names[i]), O_RDONLY);
		assert_true(files[i].fd >= 0);
		lseek(files[i].fd, 3, SEEK_SET);
	}
	assert_int_equal(radiance_checkpoint_load(files, 3, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), 0);
	assert_string_equal(m->name, "tiny-bert");
	check_model(fx, m);
	radiance_model_destroy(m);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(lseek(files[i].fd, 0, SEEK_CUR), 3);   /* not moved, not closed */
		close(files[i].fd);
	}

	/* no _name_or_path: "model" */
	json_object_del(fx->config, "_name_or_path");
	write_ckpt(fx);
	for (int i = 0; i < 2; i++)
		files[i].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, names[i]), O_RDONLY);
	assert_int_equal(radiance_checkpoint_load(files, 2, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), 0);
	assert_string_equal(m->name, "model");
	radiance_model_destroy(m);
	for (int i = 0; i < 2; i++)
		close(files[i].fd);

	/* a relative path as the name (a model saved from ".": "./", "..", "a/.."):
	 * "model" too, not a name the registry refuses */
	static const char *const dotted[] = { "./", ".", "..", "a/../", "../." };
	for (size_t d = 0; d < sizeof dotted / sizeof dotted[0]; d++) {
		json_object_set_new(fx->config, "_name_or_path", json_string(dotted[d]));
		write_ckpt(fx);
		for (int i = 0; i < 2; i++)
			files[i].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, names[i]),
					   O_RDONLY);
		assert_int_equal(radiance_checkpoint_load(files, 2, NULL, NULL, NULL, &m, fx->err,
							  sizeof fx->err), 0);
		if (strcmp(m->name, "model") != 0)
			fail_msg("_name_or_path \"%s\" named the model \"%s\", want \"model\"",
				 dotted[d], m->name);
		radiance_model_destroy(m);
		for (int i = 0; i < 2; i++)
			close(files[i].fd);
	}
}

static void test_valid_sharded(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m;
	char **names;

	write_sharded(fx, 5);
	int n = rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err);
	assert_int_equal(n, 4);
	assert_string_equal(names[0], "config.json");
	assert_string_equal(names[1], "model.safetensors.index.json");
	assert_string_equal(names[2], "model-00001-of-00002.safetensors");
	assert_string_equal(names[3], "model-00002-of-00002.safetensors");
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
	assert_int_equal(load(fx, &m), 0);
	check_model(fx, m);
	radiance_model_destroy(m);
}

/* A model.safetensors beside the index was ignored without a word (the
 * index won), while transformers loads model.safetensors and vLLM the
 * index's shards: refused, from a directory and from a LoadModel's files,
 * unless the index names model.safetensors as a shard. */
static void test_single_beside_index(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m = (void *)1;
	char **names = (void *)1;

	write_sharded(fx, 5);
	assert_int_equal(write_text(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors"),
				    "stale"), 0);
	assert_int_equal(rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err), -EINVAL);
	assert_null(names);
	char want[600];
	snprintf(want, sizeof want, "%s: both model.safetensors and model.safetensors.index.json, "
		 "and the index does not name model.safetensors as a shard", fx->dir);
	if (!strstr(fx->err, want))
		fail_msg("\"%s\" lacks \"%s\"", fx->err, want);
	assert_non_null(strstr(fx->err, "remove the one that is stale"));
	expect_refused(fx, -EINVAL, want, NULL);

	/* the daemon's loader, from files a client sent */
	const char *fn[] = { "config.json", "model.safetensors.index.json",
			     "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
			     "model.safetensors" };
	struct radiance_file files[5];
	for (int i = 0; i < 5; i++) {
		files[i].name = fn[i];
		files[i].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, fn[i]), O_RDONLY);
		assert_true(files[i].fd >= 0);
	}
	assert_int_equal(radiance_checkpoint_load(files, 5, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), -EINVAL);
	assert_null(m);
	assert_non_null(strstr(fx->err, "the checkpoint files: both model.safetensors and "
			       "model.safetensors.index.json"));
	/* the same files less model.safetensors load */
	assert_int_equal(radiance_checkpoint_load(files, 4, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), 0);
	check_model(fx, m);
	radiance_model_destroy(m);
	for (int i = 0; i < 5; i++)
		close(files[i].fd);

	/* an index whose one shard is model.safetensors: both loaders read it */
	json_t *idx = json_pack("{s:{}}", "weight_map");
	for (size_t i = 0; i < fx->w.n; i++)
		json_object_set_new(json_object_get(idx, "weight_map"), fx->w.t[i].name,
				    json_string("model.safetensors"));
	assert_int_equal(json_dump_file(idx, path_join(fx->path, sizeof fx->path, fx->dir,
						       "model.safetensors.index.json"), 0), 0);
	json_decref(idx);
	assert_int_equal(stw_write_range(&fx->w, 0, fx->w.n, path_join(fx->path, sizeof fx->path,
									fx->dir, "model.safetensors")), 0);
	assert_int_equal(rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err), 3);
	assert_string_equal(names[1], "model.safetensors.index.json");
	assert_string_equal(names[2], "model.safetensors");
	rcheckpoint_files_free(names);
	assert_int_equal(load(fx, &m), 0);
	check_model(fx, m);
	radiance_model_destroy(m);
}

/* quantization_config.json alone; the older "intel/auto-round" spelling */
static void test_valid_quant_config_file(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m;
	char **names;

	json_t *q = json_deep_copy(qc(fx));
	json_object_set_new(q, "quant_method", json_string("intel/auto-round"));
	json_object_del(fx->config, "quantization_config");
	write_ckpt(fx);
	assert_int_equal(json_dump_file(q, path_join(fx->path, sizeof fx->path, fx->dir,
						     "quantization_config.json"), 0), 0);
	assert_int_equal(load(fx, &m), 0);
	check_model(fx, m);
	radiance_model_destroy(m);
	int n = rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err);
	assert_int_equal(n, 3);
	assert_string_equal(names[1], "quantization_config.json");
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);

	/* both present and agreeing */
	json_object_set(fx->config, "quantization_config", q);
	write_ckpt(fx);
	assert_int_equal(load(fx, &m), 0);
	radiance_model_destroy(m);

	/* both present, disagreeing on the blocks */
	json_object_set_new(q, "block_name_to_quantize", json_string("encoder"));
	assert_int_equal(json_dump_file(q, path_join(fx->path, sizeof fx->path, fx->dir,
						     "quantization_config.json"), 0), 0);
	expect_refused(fx, -EINVAL, "disagree", "block_name_to_quantize");
	json_decref(q);
}

/* "quantization_config": null in config.json tells an engine reading it
 * (transformers, vLLM: a None quantization_config) that the model is not
 * quantized, while quantization_config.json says int4: the two files
 * disagree, and neither wins, so the load is refused naming both. With no
 * quantization_config.json it is the missing config, said as null. */
static void test_quant_config_null(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m = (void *)1;
	json_t *q = json_deep_copy(qc(fx));

	json_object_set_new(fx->config, "quantization_config", json_null());
	write_ckpt(fx);
	assert_int_equal(json_dump_file(q, path_join(fx->path, sizeof fx->path, fx->dir,
						     "quantization_config.json"), 0), 0);
	json_decref(q);
	assert_int_equal(load(fx, &m), -EINVAL);
	assert_null(m);
	assert_string_equal(fx->err, "config.json and quantization_config.json disagree on "
			    "quantization_config: null in config.json (an engine reading it loads the "
			    "model unquantized), an object in quantization_config.json; expected the "
			    "same in both (AutoRound writes one quantization config to both files): set "
			    "config.json's \"quantization_config\" to the contents of "
			    "quantization_config.json, or remove the key");

	unlink(path_join(fx->path, sizeof fx->path, fx->dir, "quantization_config.json"));
	m = (void *)1;
	assert_int_equal(load(fx, &m), -ENOENT);
	assert_null(m);
	assert_string_equal(fx->err, "config.json: \"quantization_config\" is null and "
			    "quantization_config.json was not given, expected the quantization config "
			    "of an AutoRound int4 checkpoint");
}

/* config.json's quantization_config and quantization_config.json are one
 * dict written twice by AutoRound, so neither wins: a checkpoint whose two
 * files disagree on anything the loader reads is refused naming both files,
 * the key and both values. Spellings the loader reads as the same value
 * agree. */
static void test_quant_config_files_disagree(void **state)
{
	struct fixture *fx = *state;
	static const char *const files = "config.json and quantization_config.json disagree on "
					 "quantization_config.";
	static const char *const tail = "; expected the same in both (AutoRound writes one "
					"quantization config to both files)";
	static const struct {
		const char *key, *json;      /* set in quantization_config.json only; NULL json: delete */
		const char *said;            /* what the message says after "quantization_config." */
	} cases[] = {
		{ "bits", "8", "bits: 4 in config.json, 8 in quantization_config.json" },
		{ "bits", NULL, "bits: 4 in config.json, missing in quantization_config.json" },
		{ "group_size", "64", "group_size: 128 in config.json, 64 in quantization_config.json" },
		{ "sym", "false", "sym: true in config.json, false in quantization_config.json" },
		{ "quant_method", "\"gptq\"", "quant_method: \"auto-round\" in config.json, \"gptq\" in "
		  "quantization_config.json" },
		{ "packing_format", "\"auto_round:auto_awq\"", "packing_format: \"auto_round:auto_gptq\" in "
		  "config.json, \"auto_round:auto_awq\" in quantization_config.json" },
		{ "data_type", "\"mx_fp\"", "data_type: \"int\" in config.json, \"mx_fp\" in "
		  "quantization_config.json" },
		{ "block_name_to_quantize", "\"encoder\"", "block_name_to_quantize: \"encoder.layer\" in "
		  "config.json, \"encoder\" in quantization_config.json" },
	};
	char want[1024];
	const char *qpath = path_join(fx->path, sizeof fx->path, fx->dir, "quantization_config.json");
	char qp[4096];
	snprintf(qp, sizeof qp, "%s", qpath);

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *q = json_deep_copy(qc(fx));
		if (cases[i].json)
			json_object_set_new(q, cases[i].key, json_loads(cases[i].json, JSON_DECODE_ANY, NULL));
		else
			json_object_del(q, cases[i].key);
		write_ckpt(fx);
		assert_int_equal(json_dump_file(q, qp, 0), 0);
		json_decref(q);
		snprintf(want, sizeof want, "%s%s%s", files, cases[i].said, tail);
		expect_refused(fx, -EINVAL, want, NULL);
	}

	/* extra_config: an entry in one file only, and one whose bits differ */
	json_t *q = json_deep_copy(qc(fx));
	json_object_del(json_object_get(q, "extra_config"), OUT);
	assert_int_equal(json_dump_file(q, qp, 0), 0);
	expect_refused(fx, -EINVAL, "config.json and quantization_config.json disagree on "
		       "quantization_config.extra_config[\"" OUT "\"] (layer \"" OUT "\"): "
		       "{\"bits\":16,\"data_type\":\"float\"} in config.json, absent in "
		       "quantization_config.json", NULL);
	json_object_set_new(json_object_get(q, "extra_config"), OUT, json_pack("{si}", "bits", 8));
	assert_int_equal(json_dump_file(q, qp, 0), 0);
	expect_refused(fx, -EINVAL, "disagree on quantization_config.extra_config[\"" OUT "\"].bits "
		       "(layer \"" OUT "\"): 16 in config.json, 8 in quantization_config.json", NULL);
	/* a field an entry lacks is the file's top-level value */
	json_object_set_new(json_object_get(qc(fx), "extra_config"), KEY,
			    json_pack("{sisi}", "bits", 4, "group_size", 128));
	json_object_set_new(json_object_get(q, "extra_config"), OUT,
			    json_pack("{siss}", "bits", 16, "data_type", "float"));
	json_object_set_new(json_object_get(q, "extra_config"), KEY, json_pack("{si}", "bits", 4));
	json_object_set_new(q, "group_size", json_integer(64));   /* so the inherited one differs */
	json_object_set_new(qc(fx), "group_size", json_integer(64));
	write_ckpt(fx);
	assert_int_equal(json_dump_file(q, qp, 0), 0);
	expect_refused(fx, -EINVAL, "disagree on quantization_config.extra_config[\"" KEY "\"].group_size "
		       "(layer \"" KEY "\"): 128 in config.json, absent (so 64) in quantization_config.json",
		       NULL);
	json_decref(q);
	json_object_set_new(qc(fx), "group_size", json_integer(128));

	/* the same values spelled as the loader reads alike: they agree */
	q = json_deep_copy(qc(fx));
	json_object_set_new(q, "quant_method", json_string("Intel/Auto_Round"));
	json_object_set_new(q, "packing_format", json_string("auto_round:gptq"));
	json_object_set_new(q, "bits", json_real(4.0));
	json_object_del(q, "data_type");
	json_object_set_new(q, "block_name_to_quantize", json_pack("[s]", "encoder.layer"));
	json_object_set_new(json_object_get(q, "extra_config"), KEY, json_pack("{si}", "bits", 4));
	json_object_set_new(q, "autoround_version", json_string("0.0.1"));   /* not read */
	write_ckpt(fx);
	assert_int_equal(json_dump_file(q, qp, 0), 0);
	json_decref(q);
	struct radiance_model *m;
	assert_int_equal(load(fx, &m), 0);
	check_model(fx, m);
	radiance_model_destroy(m);
}

/* a list of prefixes works like the comma-separated string */
static void test_valid_block_list(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m;
	json_object_set_new(qc(fx), "block_name_to_quantize",
			    json_pack("[ss]", "decoder.layers", "encoder.layer"));
	write_ckpt(fx);
	assert_int_equal(load(fx, &m), 0);
	check_model(fx, m);
	radiance_model_destroy(m);
	json_object_set_new(qc(fx), "block_name_to_quantize", json_string("decoder.layers, encoder.layer"));
	write_ckpt(fx);
	assert_int_equal(load(fx, &m), 0);
	radiance_model_destroy(m);
}

static void test_identity(void **state)
{
	struct fixture *fx = *state;
	static const char *const names[] = { "config.json", "model.safetensors" };
	struct radiance_file a[2], b[2];
	char ida[65], idb[65];

	write_ckpt(fx);
	for (int i = 0; i < 2; i++) {
		a[i].name = names[i];
		a[i].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, names[i]), O_RDONLY);
		b[1 - i] = a[i];
	}
	assert_int_equal(radiance_checkpoint_identity(a, 2, ida), 0);
	assert_int_equal(strlen(ida), 64);
	assert_int_equal(strspn(ida, "0123456789abcdef"), 64);
	/* order does not matter; a second open of the same files gives the same id */
	assert_int_equal(radiance_checkpoint_identity(b, 2, idb), 0);
	assert_string_equal(ida, idb);
	int fd2 = open(path_join(fx->path, sizeof fx->path, fx->dir, names[1]), O_RDONLY);
	b[0].fd = fd2;
	b[0].name = names[1];
	b[1] = a[0];
	assert_int_equal(radiance_checkpoint_identity(b, 2, idb), 0);
	assert_string_equal(ida, idb);
	close(fd2);
	/* a subset, or a rewritten file, is another checkpoint */
	assert_int_equal(radiance_checkpoint_identity(a, 1, idb), 0);
	assert_string_not_equal(ida, idb);
	/* the old inode stays open, so the rewrite is surely another inode even
	 * within one timestamp tick */
	int old = a[1].fd;
	unlink(path_join(fx->path, sizeof fx->path, fx->dir, names[1]));
	write_ckpt(fx);
	a[1].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, names[1]), O_RDONLY);
	assert_int_equal(radiance_checkpoint_identity(a, 2, idb), 0);
	assert_string_not_equal(ida, idb);
	close(old);
	close(a[0].fd);
	close(a[1].fd);
	assert_int_equal(radiance_checkpoint_identity(a, 0, idb), -EINVAL);
}

/* ---- refusals: quantization config -------------------------------------- */

static void test_packing_other(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(qc(fx), "packing_format", json_string("auto_round:auto_awq"));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "packing_format is \"auto_round:auto_awq\"", "auto_round:auto_gptq");
	json_object_set_new(qc(fx), "packing_format", json_string("auto_round:gptq"));   /* alias */
	write_ckpt(fx);
	struct radiance_model *m;
	assert_int_equal(load(fx, &m), 0);
	radiance_model_destroy(m);
	json_object_del(qc(fx), "packing_format");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "packing_format is missing", NULL);
}

static void test_quant_method(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(qc(fx), "quant_method", json_string("gptq"));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "quant_method is \"gptq\"", "auto-round");
}

static void test_bits_8(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(qc(fx), "bits", json_integer(8));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "config.json: quantization_config.bits is 8, expected 4", NULL);
}

static void test_group_size_64(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(qc(fx), "group_size", json_integer(64));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "group_size is 64, expected 128", NULL);
}

static void test_sym_false(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(qc(fx), "sym", json_false());
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "sym is false, expected true", NULL);
}

static void test_extra_config_bits_8(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(extra(fx), KEY, json_pack("{si}", "bits", 8));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" KEY "\"", "bits is 8, expected 4");
	json_object_set_new(extra(fx), KEY, json_pack("{sisi}", "bits", 4, "group_size", 32));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" KEY "\"", "group_size is 32, expected 128");
}

/* Keys are client input compiled as regular expressions: the patterns glibc
 * takes exponential memory or time on are refused by name (fuzzing found
 * "a+++..." doubling regcomp's memory per '+', and backreferences making
 * regexec exponential in the module name's length). */
static void test_extra_config_untamed_regex(void **state)
{
	struct fixture *fx = *state;
	static const struct { const char *key, *why; } bad[] = {
		{ "a++++++++++++++++++++++++", "a repetition operator applied to another" },
		{ "(.*)(.*)\\2\\1x", "a backreference" },
		{ "encoder\\.layer\\.[0-9]{1,3}\\.output", "a {m,n} bound" },
		{ "((a)+(b)+(c)+(d)+(e)+)", "more than 4 repeated groups" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_object_set_new(extra(fx), bad[i].key, json_pack("{si}", "bits", 16));
		write_ckpt(fx);
		expect_refused(fx, -EINVAL, "is refused", bad[i].why);
		json_object_del(extra(fx), bad[i].key);
	}
	/* with them gone, the fixture's own (tame) keys load */
	write_ckpt(fx);
	struct radiance_model *m = NULL;
	assert_int_equal(load(fx, &m), 0);
	radiance_model_destroy(m);
}

static void test_no_quant_config(void **state)
{
	struct fixture *fx = *state;
	json_object_del(fx->config, "quantization_config");
	write_ckpt(fx);
	expect_refused(fx, -ENOENT, "no \"quantization_config\"", "quantization_config.json");
}

/* ---- refusals: tensors vs the kernels ---------------------------------- */

static void test_qzeros_not_symmetric(void **state)
{
	struct fixture *fx = *state;
	uint32_t *qz = tensor(fx, Q ".qzeros")->data;
	qz[3] = 0x77777778u;
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": 1 of 4 qzeros words differ from 0x77777777",
		       "qzeros[1][1] = 0x77777778");
	/* all 8s: an asymmetric export, every word wrong */
	for (int i = 0; i < 4; i++)
		qz[i] = 0x88888888u;
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "4 of 4 qzeros words", NULL);
}

static void test_g_idx_act_order(void **state)
{
	struct fixture *fx = *state;
	int32_t g[256];
	for (int k = 0; k < 256; k++)
		g[k] = k % 2;
	stw_add(&fx->w, Q ".g_idx", "I32", 1, (uint64_t[]){ 256 }, g, sizeof g);
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": g_idx[1] = 1, expected 0", "act-order");
}

static void test_k_not_multiple_of_128(void **state)
{
	struct fixture *fx = *state;
	struct stw_tensor *t = tensor(fx, KEY ".qweight");
	t->shape[0] = 20;                        /* K = 160 */
	t->nbytes = 20 * 12 * 4;
	t->data = realloc(t->data, t->nbytes);
	memset(t->data, 0x88, t->nbytes);
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" KEY "\": K = 160", "not a multiple of 128");
}

static void test_qweight_wrong_dtype(void **state)
{
	struct fixture *fx = *state;
	snprintf(tensor(fx, Q ".qweight")->dtype, 16, "F32");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": qweight \"" Q ".qweight\" has dtype F32",
		       "expected I32");
}

static void test_qweight_wrong_shape(void **state)
{
	struct fixture *fx = *state;
	struct stw_tensor *t = tensor(fx, Q ".qweight");
	t->ndim = 1;
	t->shape[0] = 32 * 16;
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "qweight \"" Q ".qweight\" has shape [512]", "[K/8, N]");
}

static void test_scales_wrong_shape(void **state)
{
	struct fixture *fx = *state;
	struct stw_tensor *t = tensor(fx, Q ".scales");
	t->shape[0] = 16;                        /* transposed: [N, K/128] */
	t->shape[1] = 2;
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "scales \"" Q ".scales\" has shape [16, 2]", "expected [2, 16]");
}

static void test_scales_wrong_dtype(void **state)
{
	struct fixture *fx = *state;
	snprintf(tensor(fx, Q ".scales")->dtype, 16, "BF16");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "scales \"" Q ".scales\" has dtype BF16", "expected F16");
}

static void test_scales_not_finite(void **state)
{
	struct fixture *fx = *state;
	uint16_t *s = tensor(fx, Q ".scales")->data;
	s[16 + 5] = 0x7C00;                      /* +Inf at [1][5] */
	s[20] = 0x7E00;                          /* NaN */
	s[0] = 0x0000;                           /* zero is legal */
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": 2 of 32 scales are not finite",
		       "scales[1][4] = 0x7e00, NaN");
}

static void test_missing_scales(void **state)
{
	struct fixture *fx = *state;
	stw_remove(&fx->w, Q ".scales");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": has a qweight but no \"" Q ".scales\"", NULL);
}

static void test_missing_qweight(void **state)
{
	struct fixture *fx = *state;
	stw_remove(&fx->w, Q ".qweight");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": has \"" Q ".qzeros\" but no qweight", NULL);
}

/* ---- refusals: config vs tensors --------------------------------------- */

static void test_16bit_module_has_qweight(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(extra(fx), Q, json_pack("{si}", "bits", 16));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\"", "holds it at 16 bits, but the checkpoint has its qweight");
}

static void test_qweight_outside_blocks(void **state)
{
	struct fixture *fx = *state;
	/* "encoder.layer.0" must not match "encoder.layer.01..."; here nothing matches */
	json_object_set_new(qc(fx), "block_name_to_quantize", json_string("encoder.layer.1"));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" KEY "\": has a qweight but lies outside the quantized blocks",
		       "\"encoder.layer.1\"");
}

static void test_float_weight_inside_blocks(void **state)
{
	struct fixture *fx = *state;
	json_object_del(extra(fx), OUT);
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" OUT "\": inside the quantized block \"encoder.layer\"",
		       "BF16 weight [8, 128] and no qweight");
}

static void test_both_qweight_and_weight(void **state)
{
	struct fixture *fx = *state;
	stw_add(&fx->w, Q ".weight", "BF16", 2, (uint64_t[]){ 16, 256 }, NULL, 16 * 256 * 2);
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"" Q "\": has both", NULL);
}

static void test_misc_refusals(void **state)
{
	struct fixture *fx = *state;
	json_object_set_new(qc(fx), "data_type", json_string("mx_fp"));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "data_type is \"mx_fp\", expected \"int\"", NULL);
	json_object_set_new(qc(fx), "data_type", json_string("int"));

	json_object_set_new(extra(fx), "(", json_pack("{si}", "bits", 16));
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "key \"(\" is neither a module name nor a valid", NULL);
	json_object_del(extra(fx), "(");

	tensor(fx, POOL ".bias")->shape[0] = 2;          /* 16 bytes: [2] F32 is 8 */
	snprintf(tensor(fx, POOL ".bias")->dtype, 16, "F64");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "layer \"pooler.dense\": bias \"pooler.dense.bias\" has dtype F64",
		       "expected BF16, F16 or F32");
	snprintf(tensor(fx, POOL ".bias")->dtype, 16, "F32");
	tensor(fx, POOL ".bias")->shape[0] = 4;

	snprintf(tensor(fx, POOL ".weight")->dtype, 16, "I32");
	write_ckpt(fx);
	expect_refused(fx, -EINVAL, "weight \"pooler.dense.weight\" has dtype I32",
		       "expected BF16, F16 or F32 for a 16-bit linear");
}

static void test_files_given_twice(void **state)
{
	struct fixture *fx = *state;
	struct radiance_model *m;
	write_ckpt(fx);
	int fd = open(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors"), O_RDONLY);
	struct radiance_file files[2] = { { "model.safetensors", fd }, { "model.safetensors", fd } };
	assert_int_equal(radiance_checkpoint_load(files, 2, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), -EINVAL);
	assert_non_null(strstr(fx->err, "given twice"));
	/* weights alone: no quantization config */
	assert_int_equal(radiance_checkpoint_load(files, 1, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), -ENOENT);
	assert_non_null(strstr(fx->err, "neither config.json nor quantization_config.json"));
	close(fd);
}

static void test_bad_shard_name(void **state)
{
	struct fixture *fx = *state;
	write_sharded(fx, 5);
	write_text(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"../etc/passwd\"}}");
	expect_refused(fx, -EINVAL, "weight_map[\"a\"] is not a shard file name", NULL);
}

/* ---- refusals: files ----------------------------------------------------- */

static void test_shard_missing(void **state)
{
	struct fixture *fx = *state;
	char **names = (void *)1;
	write_sharded(fx, 5);
	unlink(path_join(fx->path, sizeof fx->path, fx->dir, "model-00002-of-00002.safetensors"));
	assert_int_equal(rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err),
			 -ENOENT);
	assert_null(names);
	assert_non_null(strstr(fx->err, "model-00002-of-00002.safetensors"));

	/* from fds: the index names a shard that was not sent */
	static const char *const fn[] = { "config.json", "model.safetensors.index.json",
					  "model-00001-of-00002.safetensors" };
	struct radiance_file files[3];
	struct radiance_model *m;
	for (int i = 0; i < 3; i++) {
		files[i].name = fn[i];
		files[i].fd = open(path_join(fx->path, sizeof fx->path, fx->dir, fn[i]), O_RDONLY);
	}
	assert_int_equal(radiance_checkpoint_load(files, 3, NULL, NULL, NULL, &m, fx->err,
						  sizeof fx->err), -ENOENT);
	print_message("  -> %s\n", fx->err);
	assert_non_null(strstr(fx->err, "shard \"model-00002-of-00002.safetensors\""));
	assert_non_null(strstr(fx->err, "missing"));
	for (int i = 0; i < 3; i++)
		close(files[i].fd);
}

/* A file that is a symlink to nothing, as in a Hugging Face cache snapshot
 * (snapshots/REV/model.safetensors -> ../../blobs/SHA) whose blob was
 * removed or never finished downloading: `ls` shows the name, so the
 * message names the link and its target. model.safetensors used to be
 * reported as "no weights, expected model.safetensors or ...". */
static void test_dangling_symlink(void **state)
{
	struct fixture *fx = *state;
	char **names = (void *)1;
	char target[PATH_MAX];
	write_ckpt(fx);
	static const char *const files[] = { "model.safetensors", "config.json",
					     "quantization_config.json" };
	for (size_t i = 0; i < 3; i++) {
		const char *path = path_join(fx->path, sizeof fx->path, fx->dir, files[i]);
		unlink(path);
		assert_int_equal(symlink("../../blobs/4d7a2146e2393", path), 0);
		names = (void *)1;
		assert_int_equal(rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err),
				 -ENOENT);
		assert_null(names);
		print_message("  -> %s\n", fx->err);
		snprintf(target, sizeof target, "%s/%s is a symlink to ../../blobs/4d7a2146e2393, "
			 "which does not exist", fx->dir, files[i]);
		if (!strstr(fx->err, target))
			fail_msg("got '%s', wanted '%s'", fx->err, target);
		assert_null(strstr(fx->err, "no weights"));
		unlink(path_join(fx->path, sizeof fx->path, fx->dir, files[i]));
		write_ckpt(fx);   /* restores the file (quantization_config.json: none) */
	}
	assert_int_equal(rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err), 2);
	rcheckpoint_files_free(names);

	/* a shard of an index, likewise */
	unlink(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors"));
	write_sharded(fx, 5);
	const char *shard = path_join(fx->path, sizeof fx->path, fx->dir,
				"model-00002-of-00002.safetensors");
	unlink(shard);
	assert_int_equal(symlink("/nonexistent/blob", shard), 0);
	assert_int_equal(rcheckpoint_list_files(fx->dir, &names, fx->err, sizeof fx->err),
			 -ENOENT);
	assert_non_null(strstr(fx->err, "model-00002-of-00002.safetensors is a symlink to "
				       "/nonexistent/blob, which does not exist"));
}

static void test_index_lists_absent_tensor(void **state)
{
	struct fixture *fx = *state;
	write_sharded(fx, 5);
	json_error_t e;
	path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors.index.json");
	json_t *idx = json_load_file(fx->path, 0, &e);
	json_object_set_new(json_object_get(idx, "weight_map"), "encoder.layer.0.ghost.weight",
			    json_string("model-00001-of-00002.safetensors"));
	assert_int_equal(json_dump_file(idx, fx->path, 0), 0);
	json_decref(idx);
	expect_refused(fx, -EINVAL, "lists tensor \"encoder.layer.0.ghost.weight\" in shard "
		       "\"model-00001-of-00002.safetensors\"", "no such tensor");
}

static void test_shard_holds_unlisted_tensor(void **state)
{
	struct fixture *fx = *state;
	write_sharded(fx, 5);
	json_error_t e;
	path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors.index.json");
	json_t *idx = json_load_file(fx->path, 0, &e);
	json_object_del(json_object_get(idx, "weight_map"), "pooler.dense.bias");
	assert_int_equal(json_dump_file(idx, fx->path, 0), 0);
	json_decref(idx);
	expect_refused(fx, -EINVAL, "holds tensor \"pooler.dense.bias\"", "does not list it");
}

static void test_no_weights(void **state)
{
	struct fixture *fx = *state;
	write_config(fx);
	expect_refused(fx, -ENOENT, "no weights", NULL);
	/* a broken weights file is the safetensors reader's message, -EINVAL */
	write_text(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors"), "garbage!");
	expect_refused(fx, -EINVAL, "model.safetensors: header length", NULL);
}

/* A checkpoint cloned without Git LFS: a shard is the LFS pointer text. The
 * message says so, with the oid and size, and what to run. */
static void test_shard_is_lfs_pointer(void **state)
{
	struct fixture *fx = *state;
	write_sharded(fx, 5);
	write_text(path_join(fx->path, sizeof fx->path, fx->dir, "model-00002-of-00002.safetensors"),
		   "version https://git-lfs.github.com/spec/v1\n"
		   "oid sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"
		   "size 1342177280\n");
	expect_refused(fx, -EINVAL, "model-00002-of-00002.safetensors is a Git LFS pointer (oid "
		       "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, size "
		       "1342177280), not the tensor data: run `git lfs pull` in the checkpoint's "
		       "repository", NULL);
}

/* The same clone without Git LFS, when a JSON file is the pointer (a
 * repository whose .gitattributes tracks *.json, or every file, with LFS):
 * each of config.json, quantization_config.json and the index is named as an
 * LFS pointer, not "not valid JSON: '[' or '{' expected near 'version'". */
static void test_json_file_is_lfs_pointer(void **state)
{
	struct fixture *fx = *state;
	static const char ptr[] = "version https://git-lfs.github.com/spec/v1\n"
				  "oid sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\n"
				  "size 24815\n";
	static const char *const names[] = { "config.json", "quantization_config.json",
					     "model.safetensors.index.json" };
	char want[512];

	for (int i = 0; i < 3; i++) {
		json_t *q = json_deep_copy(qc(fx));
		if (i == 2)
			write_sharded(fx, 5);
		else
			write_ckpt(fx);
		assert_int_equal(json_dump_file(q, path_join(fx->path, sizeof fx->path, fx->dir,
							     "quantization_config.json"), 0), 0);
		json_decref(q);
		assert_int_equal(write_text(path_join(fx->path, sizeof fx->path, fx->dir, names[i]), ptr),
				 0);
		snprintf(want, sizeof want, "%s is a Git LFS pointer (oid sha256:2c26b46b68ffc68ff99b453c1d"
			 "30413413422d706483bfa0f98a5e886266e7ae, size 24815), not the JSON: run `git lfs "
			 "pull` in the checkpoint's repository", names[i]);
		expect_refused(fx, -EINVAL, want, NULL);
		/* the fd path (LoadModel) reads the file itself, not the listing */
		if (i < 2) {
			struct radiance_file files[3] = {
				{ "config.json", -1 }, { "quantization_config.json", -1 },
				{ "model.safetensors", -1 },
			};
			for (int j = 0; j < 3; j++) {
				files[j].fd = open(path_join(fx->path, sizeof fx->path, fx->dir,
							     files[j].name), O_RDONLY | O_CLOEXEC);
				assert_true(files[j].fd >= 0);
			}
			struct radiance_model *m = (void *)1;
			fx->err[0] = '\0';
			assert_int_equal(radiance_checkpoint_load(files, 3, NULL, NULL, NULL, &m, fx->err,
								  sizeof fx->err), -EINVAL);
			assert_null(m);
			assert_string_equal(fx->err, want);
			for (int j = 0; j < 3; j++)
				close(files[j].fd);
		}
		unlink(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors"));
		unlink(path_join(fx->path, sizeof fx->path, fx->dir, "model.safetensors.index.json"));
		unlink(path_join(fx->path, sizeof fx->path, fx->dir, "model-00001-of-00002.safetensors"));
		unlink(path_join(fx->path, sizeof fx->path, fx->dir, "model-00002-of-00002.safetensors"));
	}
}

/* ---- a weights file that shrinks while it loads --------------------------- */

struct shrink {
	int fd;                    /* O_RDWR on model.safetensors */
	int at;                    /* the progress call that truncates */
	off_t len;                 /* to this many bytes */
	int calls;
};

static void shrink_on_progress(void *user, uint64_t done, uint64_t total)
{
	struct shrink *s = user;
	(void)done;
	(void)total;
	if (s->calls++ == s->at)
		assert_int_equal(ftruncate(s->fd, s->len), 0);
}

static uint32_t shrink_rand(uint32_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 17;
	*x ^= *x << 5;
	return *x;
}

/* Whoever sent a checkpoint file can shrink it while the daemon loads it.
 * The loader copies tensor bytes out with pread, so a shrink is a short read
 * and an error for that load, never a SIGBUS through a mapping (which kills
 * the daemon with every session in it). The progress callback runs between
 * layers, so truncating from it hits an exact point of the load: 150 times,
 * after a random number of layers, to a random length (fixed seed). Every
 * load must either succeed with exactly the right layers, when every tensor
 * still to be read lies below the new end, or fail with -EIO and the message
 * naming such a tensor, the new size and the size at open. */
static void test_file_shrinks_while_loading(void **state)
{
	struct fixture *fx = *state;
	char st_path[4096], cfg_path[4096];
	struct radiance_model *m;
	struct radiance_st_file *st;
	struct stat sb;

	write_ckpt(fx);
	path_join(st_path, sizeof st_path, fx->dir, "model.safetensors");
	path_join(cfg_path, sizeof cfg_path, fx->dir, "config.json");
	assert_int_equal(stat(st_path, &sb), 0);
	size_t size = (size_t)sb.st_size;
	uint8_t *bytes = malloc(size);
	assert_non_null(bytes);
	int fd = open(st_path, O_RDONLY);
	assert_int_equal(pread(fd, bytes, size, 0), (ssize_t)size);
	close(fd);
	/* where each tensor lies in the file, and the order layers load in */
	assert_int_equal(radiance_st_open_path(st_path, &st, fx->err, sizeof fx->err), 0);
	uint64_t base = 8 + st->header_len;
	assert_int_equal(load(fx, &m), 0);
	size_t n_layers = m->n_layers;

	uint32_t seed = 0x5eed1234u;
	int loaded = 0, shrank = 0;
	for (int it = 0; it < 150; it++) {
		struct shrink s = { .at = (int)(shrink_rand(&seed) % (n_layers + 2)),
				    .len = (off_t)(shrink_rand(&seed) % size) };
		s.fd = open(st_path, O_RDWR | O_TRUNC);
		assert_true(s.fd >= 0);
		assert_int_equal(pwrite(s.fd, bytes, size, 0), (ssize_t)size);
		struct radiance_file files[2] = {
			{ "config.json", open(cfg_path, O_RDONLY) },
			{ "model.safetensors", open(st_path, O_RDONLY) },
		};
		struct radiance_model *got = NULL;
		int rc = radiance_checkpoint_load(files, 2, NULL, shrink_on_progress, &s, &got,
						  fx->err, sizeof fx->err);
		/* the tensors of the layers after the truncation that lie past the
		 * new end: any of them may be the one the load trips on */
		bool fits = true, named = false;
		for (size_t j = (size_t)s.at; j < n_layers; j++) {
			size_t ml = strlen(m->layers[j].name);
			for (size_t t = 0; t < st->n_tensors; t++) {
				const struct radiance_st_tensor *x = &st->tensors[t];
				if (strncmp(x->name, m->layers[j].name, ml) || x->name[ml] != '.' ||
				    strchr(x->name + ml + 1, '.') || base + x->end <= (uint64_t)s.len)
					continue;
				fits = false;
				char want[512];
				snprintf(want, sizeof want, "model.safetensors: tensor \"%s\": file shrank to "
					 "%lld bytes while loading (expected %zu)", x->name,
					 (long long)s.len, size);
				named = named || strcmp(fx->err, want) == 0;
			}
		}
		/* the shared tensors are read after the last layer's progress
		 * call (call n_layers), before the final one (n_layers + 1) */
		for (size_t j = 0; s.at <= (int)n_layers && j < m->n_other; j++) {
			const struct radiance_st_tensor *x = NULL;
			for (size_t t = 0; t < st->n_tensors && !x; t++)
				if (strcmp(st->tensors[t].name, m->other[j].name) == 0)
					x = &st->tensors[t];
			assert_non_null(x);
			if (base + x->end <= (uint64_t)s.len || x->end == x->begin)
				continue;
			fits = false;
			char want[512];
			snprintf(want, sizeof want, "model.safetensors: tensor \"%s\": file shrank to "
				 "%lld bytes while loading (expected %zu)", x->name, (long long)s.len, size);
			named = named || strcmp(fx->err, want) == 0;
		}
		if (fits) {
			if (rc)
				print_message("truncated at call %d to %lld: %s\n", s.at,
					      (long long)s.len, fx->err);
			assert_int_equal(rc, 0);
			check_model(fx, got);
			radiance_model_destroy(got);
			loaded++;
		} else {
			if (rc != -EIO || !named)
				print_message("truncated at call %d to %lld: rc %d, %s\n", s.at,
					      (long long)s.len, rc, fx->err);
			assert_int_equal(rc, -EIO);
			assert_null(got);
			assert_true(named);
			shrank++;
		}
		close(files[0].fd);
		close(files[1].fd);
		close(s.fd);
	}
	print_message("  150 truncations: %d loads whole, %d refused as shrunk\n", loaded, shrank);
	/* the seed gives both outcomes (a change of fixture that lost one
	 * would make half of this test vacuous) */
	assert_true(loaded > 0);
	assert_true(shrank > 0);
	radiance_st_close(st);
	radiance_model_destroy(m);
	free(bytes);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_valid),
		T(test_valid_fds),
		T(test_valid_sharded),
		T(test_single_beside_index),
		T(test_dangling_symlink),
		T(test_valid_quant_config_file),
		T(test_valid_block_list),
		T(test_quant_config_files_disagree),
		T(test_identity),
		T(test_packing_other),
		T(test_quant_method),
		T(test_bits_8),
		T(test_group_size_64),
		T(test_sym_false),
		T(test_extra_config_bits_8),
		T(test_extra_config_untamed_regex),
		T(test_no_quant_config),
		T(test_qzeros_not_symmetric),
		T(test_g_idx_act_order),
		T(test_k_not_multiple_of_128),
		T(test_qweight_wrong_dtype),
		T(test_qweight_wrong_shape),
		T(test_scales_wrong_shape),
		T(test_scales_wrong_dtype),
		T(test_scales_not_finite),
		T(test_missing_scales),
		T(test_missing_qweight),
		T(test_16bit_module_has_qweight),
		T(test_qweight_outside_blocks),
		T(test_float_weight_inside_blocks),
		T(test_both_qweight_and_weight),
		T(test_misc_refusals),
		T(test_files_given_twice),
		T(test_bad_shard_name),
		T(test_shard_missing),
		T(test_index_lists_absent_tensor),
		T(test_shard_holds_unlisted_tensor),
		T(test_no_weights),
		T(test_shard_is_lfs_pointer),
		T(test_json_file_is_lfs_pointer),
		T(test_quant_config_null),
		T(test_file_shrinks_while_loading),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
