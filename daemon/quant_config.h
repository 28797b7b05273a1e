/*
 * AutoRound quantization config: what the checkpoint claims, checked against
 * what the W4A8 kernels support (int4, group 128, symmetric, GPTQ packing),
 * and the routing rule engines apply to it.
 *
 * Accepted (anything else is refused naming the key, the value found and the
 * value expected; for an extra_config entry, naming the layer too):
 *   quant_method     "auto-round" or "intel/auto-round" (older AutoRound
 *                    releases wrote the latter); compared case-insensitively
 *                    and with '_' for '-', the lenient part of the check.
 *   packing_format   "auto_round:auto_gptq" or its alias "auto_round:gptq"
 *                    (required: it is what fixes the tensor layout).
 *   bits 4, group_size 128, sym true (all three required).
 *   data_type        absent, "int" or "int_sym".
 *   block_name_to_quantize (or to_quant_block_names): a string, comma-
 *                    separated, or an array of strings (nested arrays are
 *                    flattened); absent or null means every module.
 *   extra_config     per-module overrides: an object whose keys are module
 *                    names or, when a key holds a regular-expression
 *                    character other than '.', a POSIX extended regular
 *                    expression matched against the whole module name (as
 *                    engines fullmatch). An entry with bits >= 16, or
 *                    data_type "fp"/"float", holds the module at 16 bits (a
 *                    bf16 linear). Any other entry must agree with the
 *                    kernel: bits 4, group_size 128, sym true, data_type int.
 *
 * Thread safety: no global state; a parsed config is immutable and may be
 * read concurrently.
 */
#ifndef RADIANCE_QUANT_CONFIG_H
#define RADIANCE_QUANT_CONFIG_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct radiance_quant_override {
	char *key;                 /* the extra_config key as written */
	bool is_regex;
	regex_t re;                /* "^(key)$", REG_EXTENDED | REG_NOSUB; valid if is_regex */
	bool held_16bit;           /* bits >= 16 or data_type fp/float */
};

struct radiance_quant_config {
	char *source;              /* e.g. "config.json" or "quantization_config.json" */
	char *quant_method;
	char *packing_format;
	uint32_t bits;             /* 4 */
	uint32_t group_size;       /* 128 */
	bool sym;                  /* true */
	char **blocks;             /* block_name_to_quantize prefixes */
	size_t n_blocks;           /* 0: every module counts as inside the blocks */
	struct radiance_quant_override *overrides;   /* extra_config, in file order */
	size_t n_overrides;
};

/* Parses and checks the quantization_config object `qc`; `source` names the
 * file it came from in messages. On success *c must be released with
 * radiance_quant_config_finish(). On failure *c holds nothing.
 * Returns 0, -EINVAL (unsupported or malformed: err names the key, the value
 * found and the value expected) or -ENOMEM. */
int radiance_quant_config_init(struct radiance_quant_config *c, const json_t *qc,
			       const char *source, char *err, size_t errlen);

void radiance_quant_config_finish(struct radiance_quant_config *c);

/* 0 when a and b (the same checkpoint's config.json and
 * quantization_config.json) agree on everything routing and the kernels
 * depend on; -EINVAL naming the first key they disagree on. */
int radiance_quant_config_compare(const struct radiance_quant_config *a,
				  const struct radiance_quant_config *b, char *err, size_t errlen);

/* Is module (e.g. "encoder.layer.0.attention.self.query") inside one of the
 * quantized blocks? A block prefix matches the module itself or the module
 * continued after a '.', so "model.layers" does not match
 * "model.layers_extra.0". True for every module when n_blocks == 0. If
 * `block` is not NULL it receives the matching prefix (NULL when n_blocks
 * is 0). */
bool radiance_quant_config_in_blocks(const struct radiance_quant_config *c, const char *module,
				     const char **block);

/* The extra_config entry for module: an exact key first, else the first
 * regular-expression key (in file order) that matches the whole name; NULL
 * when none applies. */
const struct radiance_quant_override *
radiance_quant_config_override(const struct radiance_quant_config *c, const char *module);

#endif
