/*
 * Helpers shared by the fuzz targets (tests/fuzz/fuzz_*.c): a tiny, valid
 * AutoRound checkpoint built in memory (safetensors image, config.json,
 * quantization_config.json, a sharded index and its two shards), and
 * memfds to hand files to the loader the way a client hands them to the
 * daemon. Header-only: every target is its own binary.
 *
 * Not product code: on an impossible setup failure (memfd_create failing)
 * a target aborts, which the fuzzer reports as a crash of the harness.
 */
#ifndef RADIANCE_FUZZ_COMMON_H
#define RADIANCE_FUZZ_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FUZZ_CHECK(cond)                                                                 \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__,  \
				__LINE__, #cond);                                        \
			abort();                                                         \
		}                                                                        \
	} while (0)

/* ---- an in-memory safetensors writer ---- */

struct fz_tensor {
	const char *name;
	const char *dtype;
	unsigned ndim;
	uint64_t shape[4];
	size_t nbytes;
	uint32_t fill;        /* 32-bit pattern the data is filled with */
	unsigned fill_bytes;  /* 2 or 4: width of the pattern */
};

struct fz_buf {
	uint8_t *p;
	size_t len;
};

/* Header padded with spaces to a multiple of 8 as the reference writer does,
 * tensors contiguous in the order given. */
static inline struct fz_buf fz_safetensors(const struct fz_tensor *t, size_t n)
{
	size_t cap = 256 + n * 256, hl = 0, off = 0, data = 0;
	char *h = malloc(cap);
	FUZZ_CHECK(h);
	hl += (size_t)snprintf(h + hl, cap - hl, "{");
	for (size_t i = 0; i < n; i++) {
		hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
				       i ? "," : "", t[i].name, t[i].dtype);
		for (unsigned d = 0; d < t[i].ndim; d++)
			hl += (size_t)snprintf(h + hl, cap - hl, "%s%llu", d ? "," : "",
					       (unsigned long long)t[i].shape[d]);
		hl += (size_t)snprintf(h + hl, cap - hl, "],\"data_offsets\":[%zu,%zu]}", off,
				       off + t[i].nbytes);
		off += t[i].nbytes;
		FUZZ_CHECK(hl < cap);
	}
	hl += (size_t)snprintf(h + hl, cap - hl, "}");
	while (hl % 8)
		h[hl++] = ' ';
	data = off;
	struct fz_buf b = { malloc(8 + hl + data), 8 + hl + data };
	FUZZ_CHECK(b.p);
	for (int i = 0; i < 8; i++)
		b.p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b.p + 8, h, hl);
	uint8_t *d = b.p + 8 + hl;
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j + t[i].fill_bytes <= t[i].nbytes; j += t[i].fill_bytes)
			memcpy(d + j, &t[i].fill, t[i].fill_bytes);
		d += t[i].nbytes;
	}
	free(h);
	return b;
}

/* ---- the tiny checkpoint ----
 *
 * Shard 1 (the int4 layer with every optional part):
 *   model.layers.0.self_attn.q_proj: K 128, N 16, qweight/scales/qzeros,
 *     g_idx I32 [128] (all 0 = k/128), bias F32 [16]
 * Shard 2 (the rest):
 *   model.layers.0.mlp.down_proj: K 256, N 8 (two groups, matched by a regex
 *     extra_config entry)
 *   model.layers.1.self_attn.o_proj.weight BF16 [8, 16]: inside the blocks,
 *     held at 16 bits by extra_config
 *   lm_head.weight F16 [8, 16]: a 16-bit linear outside the blocks
 *   model.embed_tokens.weight BF16 [4, 16]: an embedding (inventory only)
 *   model.norm.weight F32 [16]: inventory only
 * model.safetensors holds all of them.
 */
#define FZ_QZ 0x77777777u
#define FZ_ONE_F16 0x3C00u
#define FZ_ONE_BF16 0x3F80u

static const struct fz_tensor fz_shard1[] = {
	{ "model.layers.0.self_attn.q_proj.qweight", "I32", 2, { 16, 16 }, 16 * 16 * 4, 0x89ABCDEFu, 4 },
	{ "model.layers.0.self_attn.q_proj.scales", "F16", 2, { 1, 16 }, 16 * 2, FZ_ONE_F16, 2 },
	{ "model.layers.0.self_attn.q_proj.qzeros", "I32", 2, { 1, 2 }, 2 * 4, FZ_QZ, 4 },
	{ "model.layers.0.self_attn.q_proj.g_idx", "I32", 1, { 128 }, 128 * 4, 0, 4 },
	{ "model.layers.0.self_attn.q_proj.bias", "F32", 1, { 16 }, 16 * 4, 0x3F000000u, 4 },
};

static const struct fz_tensor fz_shard2[] = {
	{ "model.layers.0.mlp.down_proj.qweight", "I32", 2, { 32, 8 }, 32 * 8 * 4, 0x01234567u, 4 },
	{ "model.layers.0.mlp.down_proj.scales", "F16", 2, { 2, 8 }, 2 * 8 * 2, FZ_ONE_F16, 2 },
	{ "model.layers.0.mlp.down_proj.qzeros", "I32", 2, { 2, 1 }, 2 * 4, FZ_QZ, 4 },
	{ "model.layers.1.self_attn.o_proj.weight", "BF16", 2, { 8, 16 }, 8 * 16 * 2, FZ_ONE_BF16, 2 },
	{ "lm_head.weight", "F16", 2, { 8, 16 }, 8 * 16 * 2, FZ_ONE_F16, 2 },
	{ "model.embed_tokens.weight", "BF16", 2, { 4, 16 }, 4 * 16 * 2, FZ_ONE_BF16, 2 },
	{ "model.norm.weight", "F32", 1, { 16 }, 16 * 4, 0x3F800000u, 4 },
};

#define FZ_N1 (sizeof fz_shard1 / sizeof fz_shard1[0])
#define FZ_N2 (sizeof fz_shard2 / sizeof fz_shard2[0])

static inline struct fz_buf fz_model_single(void)
{
	struct fz_tensor all[FZ_N1 + FZ_N2];
	memcpy(all, fz_shard1, sizeof fz_shard1);
	memcpy(all + FZ_N1, fz_shard2, sizeof fz_shard2);
	return fz_safetensors(all, FZ_N1 + FZ_N2);
}

#define FZ_SHARD1_NAME "model-00001-of-00002.safetensors"
#define FZ_SHARD2_NAME "model-00002-of-00002.safetensors"

#define FZ_QUANT_CONFIG                                                                  \
	"{\"quant_method\":\"auto-round\",\"packing_format\":\"auto_round:auto_gptq\","  \
	"\"bits\":4,\"group_size\":128,\"sym\":true,\"data_type\":\"int\","              \
	"\"block_name_to_quantize\":\"model.layers\",\"extra_config\":{"                 \
	"\"model.layers.1.self_attn.o_proj\":{\"bits\":16,\"data_type\":\"fp\"},"        \
	"\"model\\\\.layers\\\\.[0-9]+\\\\.mlp\\\\.down_proj\":{\"bits\":4,"             \
	"\"group_size\":128,\"sym\":true}}}"

static const char fz_config_json[] =
	"{\"_name_or_path\":\"org/tiny-w4g128\",\"architectures\":[\"TinyForCausalLM\"],"
	"\"torch_dtype\":\"bfloat16\",\"quantization_config\":" FZ_QUANT_CONFIG "}";

static const char fz_quant_config_json[] = FZ_QUANT_CONFIG;

static inline char *fz_index_json(void)
{
	size_t cap = 4096, len = 0;
	char *s = malloc(cap);
	FUZZ_CHECK(s);
	len += (size_t)snprintf(s + len, cap - len, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
	for (size_t i = 0; i < FZ_N1 + FZ_N2; i++) {
		const struct fz_tensor *t = i < FZ_N1 ? &fz_shard1[i] : &fz_shard2[i - FZ_N1];
		len += (size_t)snprintf(s + len, cap - len, "%s\"%s\":\"%s\"", i ? "," : "", t->name,
					i < FZ_N1 ? FZ_SHARD1_NAME : FZ_SHARD2_NAME);
	}
	len += (size_t)snprintf(s + len, cap - len, "}}");
	FUZZ_CHECK(len < cap);
	return s;
}

/* ---- memfds ---- */

static inline int fz_memfd(const char *name, const void *data, size_t len)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	FUZZ_CHECK(fd >= 0);
	size_t done = 0;
	while (done < len) {
		ssize_t w = pwrite(fd, (const uint8_t *)data + done, len - done, (off_t)done);
		FUZZ_CHECK(w > 0);
		done += (size_t)w;
	}
	return fd;
}

/* Replaces a memfd's contents (the loader reads with pread, never
 * through the file position). */
static inline void fz_memfd_set(int fd, const void *data, size_t len)
{
	FUZZ_CHECK(ftruncate(fd, 0) == 0);
	size_t done = 0;
	while (done < len) {
		ssize_t w = pwrite(fd, (const uint8_t *)data + done, len - done, (off_t)done);
		FUZZ_CHECK(w > 0);
		done += (size_t)w;
	}
}

#endif
