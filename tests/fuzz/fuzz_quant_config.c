/*
 * Fuzz target: the quantization config and the other JSON files of a
 * checkpoint a client sends with LoadModel. The input is one JSON text.
 *
 * 1. Direct: jansson parses it (as read_json_fd does) and
 *    radiance_quant_config_init() checks its "quantization_config" object
 *    (or the root, when there is none: the quantization_config.json form).
 *    On success, the routing helpers run on a fixed set of module names and
 *    the input is compared with itself (must agree) and with the tiny
 *    checkpoint's valid config, both ways (must give the same answer).
 * 2. Through the loader (radiance_checkpoint_load, files as memfds, as a
 *    client passes them), with the tiny valid checkpoint of fuzz_common.h:
 *    a. the input as config.json, weights model.safetensors;
 *    b. the input as quantization_config.json beside the valid config.json
 *       (both present: they must agree);
 *    c. the input as model.safetensors.index.json, weights the two shards.
 * The first call checks that the untouched tiny checkpoint loads in all
 * three layouts, so a harness bug cannot hide as "everything is refused".
 */
#include <stdint.h>
#include <stddef.h>

#include <jansson.h>

#include "checkpoint.h"
#include "fuzz_common.h"
#include "log.h"
#include "quant_config.h"

enum { F_CONFIG, F_QCONFIG, F_INDEX, F_SINGLE, F_SHARD1, F_SHARD2, F_INPUT, F_COUNT };
static int fds[F_COUNT];
static int ready;
static json_t *valid_qc;   /* the tiny checkpoint's quantization_config.json */

static const char *const modules[] = {
	"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj",
	"model.layers.1.self_attn.o_proj", "model.layers", "model.layers_extra.0", "lm_head",
	"model", "", ".", "model.layers.", "transformer.h.0.attn.c_attn",
	"model.layers.10.mlp.gate_proj", "encoder.layer.0.attention.self.query",
	/* module names come from the client's safetensors header: a long,
	 * repetitive one lets the fuzzer see regexec's cost on such names */
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};

static void setup(void)
{
	char err[512];
	rlog_init(RADIANCE_LOG_SILENT);
	struct fz_buf single = fz_model_single();
	struct fz_buf s1 = fz_safetensors(fz_shard1, FZ_N1);
	struct fz_buf s2 = fz_safetensors(fz_shard2, FZ_N2);
	char *index = fz_index_json();
	fds[F_CONFIG] = fz_memfd("config.json", fz_config_json, strlen(fz_config_json));
	fds[F_QCONFIG] = fz_memfd("quantization_config.json", fz_quant_config_json,
				  strlen(fz_quant_config_json));
	fds[F_INDEX] = fz_memfd("index", index, strlen(index));
	fds[F_SINGLE] = fz_memfd("model.safetensors", single.p, single.len);
	fds[F_SHARD1] = fz_memfd("shard1", s1.p, s1.len);
	fds[F_SHARD2] = fz_memfd("shard2", s2.p, s2.len);
	fds[F_INPUT] = fz_memfd("input", "", 0);
	free(single.p);
	free(s1.p);
	free(s2.p);
	free(index);

	json_error_t je;
	struct radiance_quant_config c;
	valid_qc = json_loads(fz_quant_config_json, 0, &je);
	FUZZ_CHECK(valid_qc);
	FUZZ_CHECK(radiance_quant_config_init(&c, valid_qc, "valid", err, sizeof err) == 0);
	radiance_quant_config_finish(&c);
}

/* Loads files[0..n) and checks the result's basic shape. Returns rc. */
static int load(const struct radiance_file *files, size_t n)
{
	char err[1024] = "";
	struct radiance_model *m = NULL;
	int rc = radiance_checkpoint_load(files, n, NULL, NULL, NULL, &m, err, sizeof err);
	if (rc == 0) {
		FUZZ_CHECK(m && m->n_layers > 0 && m->name);
		for (size_t i = 0; i < m->n_layers; i++)
			FUZZ_CHECK(m->layers[i].name && m->layers[i].n && m->layers[i].k);
		radiance_model_destroy(m);
	} else {
		FUZZ_CHECK(!m);
		FUZZ_CHECK(rc == -EINVAL || rc == -ENOENT || rc == -ENOMEM || rc == -EIO);
		FUZZ_CHECK(err[0]);
	}
	return rc;
}

static void run_loader(int input_fd)
{
	int cfg = input_fd >= 0 ? input_fd : fds[F_CONFIG];
	struct radiance_file a[] = {
		{ "config.json", cfg },
		{ "model.safetensors", fds[F_SINGLE] },
	};
	struct radiance_file b[] = {
		{ "config.json", fds[F_CONFIG] },
		{ "quantization_config.json", input_fd >= 0 ? input_fd : fds[F_QCONFIG] },
		{ "model.safetensors", fds[F_SINGLE] },
	};
	struct radiance_file c[] = {
		{ "config.json", fds[F_CONFIG] },
		{ "model.safetensors.index.json", input_fd >= 0 ? input_fd : fds[F_INDEX] },
		{ FZ_SHARD1_NAME, fds[F_SHARD1] },
		{ FZ_SHARD2_NAME, fds[F_SHARD2] },
	};
	int ra = load(a, 2), rb = load(b, 3), rc = load(c, 4);
	if (input_fd < 0)
		FUZZ_CHECK(ra == 0 && rb == 0 && rc == 0);
}

static void direct(const uint8_t *data, size_t size)
{
	char err[1024];
	json_error_t je;
	json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return;
	const json_t *qc = json_is_object(root) ? json_object_get(root, "quantization_config") : NULL;
	if (!qc)
		qc = root;
	struct radiance_quant_config c;
	int rc = radiance_quant_config_init(&c, qc, "fuzz.json", err, sizeof err);
	if (rc == 0) {
		FUZZ_CHECK(c.bits == 4 && c.group_size == 128 && c.sym);
		for (size_t i = 0; i < sizeof modules / sizeof modules[0]; i++) {
			const char *block;
			bool in = radiance_quant_config_in_blocks(&c, modules[i], &block);
			FUZZ_CHECK(!in || c.n_blocks == 0 || block);
			const struct radiance_quant_override *o = radiance_quant_config_override(&c, modules[i]);
			FUZZ_CHECK(!o || (o >= c.overrides && o < c.overrides + c.n_overrides));
		}
		/* every override key, as a module name, finds an override */
		for (size_t i = 0; i < c.n_overrides; i++)
			FUZZ_CHECK(radiance_quant_config_override(&c, c.overrides[i].key));
		radiance_quant_config_finish(&c);
	} else {
		FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM);
		FUZZ_CHECK(err[0]);
	}
	/* a config agrees with itself, and comparing is symmetric */
	FUZZ_CHECK(radiance_quant_config_compare(qc, "a.json", qc, "b.json", err, sizeof err) == 0);
	int ab = radiance_quant_config_compare(qc, "a.json", valid_qc, "valid", err, sizeof err);
	if (ab)
		FUZZ_CHECK(ab == -EINVAL && strstr(err, " disagree on quantization_config."));
	FUZZ_CHECK(radiance_quant_config_compare(valid_qc, "valid", qc, "a.json", err, sizeof err) == ab);
	json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!ready) {
		ready = 1;
		setup();
		run_loader(-1);
	}
	direct(data, size);
	fz_memfd_set(fds[F_INPUT], data, size);
	run_loader(fds[F_INPUT]);
	return 0;
}
