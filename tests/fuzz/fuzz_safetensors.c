/*
 * Fuzz target: a safetensors file image as a client sends it with LoadModel.
 *
 * 1. radiance_st_parse() on the bytes (the header rules of daemon/safetensors.h),
 *    then, on success, the invariants the loader relies on: every tensor
 *    inside the data section, its byte size = product(shape) x dtype bits / 8,
 *    sorted by name, findable, first and last data byte readable (ASan sees
 *    any escape from the exactly-sized input buffer).
 * 2. When it parses, the whole loader (radiance_checkpoint_load) on it as
 *    model.safetensors, beside the tiny checkpoint's valid config.json: the
 *    routing plan, the per-layer dtype/shape checks, the qzeros/g_idx/scales
 *    data checks and the repack all read tensor data the peer chose.
 */
#include <stdint.h>
#include <stddef.h>

#include "checkpoint.h"
#include "fuzz_common.h"
#include "safetensors.h"

static int cfg_fd = -1, st_fd = -1;

static void check_file(const struct radiance_st_file *f, const uint8_t *data, size_t size)
{
	FUZZ_CHECK(f->header_len + 8 + f->data_len == size);
	FUZZ_CHECK(f->data == data + 8 + f->header_len);
	uint64_t covered = 0;
	for (size_t i = 0; i < f->n_tensors; i++) {
		const struct radiance_st_tensor *t = &f->tensors[i];
		FUZZ_CHECK(t->begin <= t->end && t->end <= f->data_len);
		FUZZ_CHECK(t->ndim == 0 || t->shape);
		uint64_t nelem = 1;
		for (uint32_t d = 0; d < t->ndim; d++)
			nelem *= t->shape[d];
		FUZZ_CHECK(nelem == t->nelem);
		unsigned bits = radiance_st_dtype_bits(t->dtype);
		FUZZ_CHECK(bits > 0);
		FUZZ_CHECK((unsigned __int128)t->nelem * bits == (unsigned __int128)(t->end - t->begin) * 8);
		if (i)
			FUZZ_CHECK(strcmp(f->tensors[i - 1].name, t->name) < 0);
		FUZZ_CHECK(radiance_st_find(f, t->name) == t);
		if (t->end > t->begin) {
			volatile uint8_t sink;
			sink = ((const uint8_t *)t->data)[0];
			sink = ((const uint8_t *)t->data)[t->end - t->begin - 1];
			(void)sink;
		}
		covered += t->end - t->begin;
	}
	FUZZ_CHECK(covered == f->data_len);
	for (size_t i = 0; i < f->n_meta; i++)
		FUZZ_CHECK(radiance_st_meta_get(f, f->meta[i].key) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct radiance_st_file *f = NULL;
	char err[512] = "";

	int rc = radiance_st_parse(data, size, "fuzz.safetensors", &f, err, sizeof err);
	if (rc) {
		FUZZ_CHECK(f == NULL);
		FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM);
		FUZZ_CHECK(err[0] != '\0');
		return 0;
	}
	FUZZ_CHECK(f != NULL);
	check_file(f, data, size);
	radiance_st_close(f);

	/* The same bytes through the loader, as a client's model.safetensors. */
	if (cfg_fd < 0) {
		cfg_fd = fz_memfd("config.json", fz_config_json, sizeof fz_config_json - 1);
		st_fd = fz_memfd("model.safetensors", "", 0);
	}
	fz_memfd_set(st_fd, data, size);
	struct radiance_file files[] = {
		{ "config.json", cfg_fd },
		{ "model.safetensors", st_fd },
	};
	struct radiance_model *m = NULL;
	rc = radiance_checkpoint_load(files, 2, NULL, NULL, NULL, &m, err, sizeof err);
	if (rc == 0) {
		FUZZ_CHECK(m && m->n_layers > 0);
		for (size_t i = 0; i < m->n_layers; i++) {
			const struct radiance_layer *l = &m->layers[i];
			FUZZ_CHECK(l->name && l->n && l->k);
			if (l->kind == RADIANCE_LAYER_W4A8)
				FUZZ_CHECK(l->qweight && l->scales && l->k % 128 == 0);
			else
				FUZZ_CHECK(l->weight);
		}
		radiance_model_destroy(m);
	} else {
		FUZZ_CHECK(m == NULL);
		FUZZ_CHECK(err[0] != '\0');
	}
	return 0;
}
