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

/* Compares qa and qb, the quantization_config objects of one checkpoint's
 * config.json and quantization_config.json (a_source, b_source name them),
 * on every key radiance_quant_config_init reads: quant_method,
 * packing_format, bits, group_size, sym, data_type, the block list
 * (block_name_to_quantize, else to_quant_block_names) and each extra_config
 * entry (present in both, and its bits, group_size, sym and data_type, a
 * field it lacks standing for the file's top-level value). Values are
 * compared as init reads them: the quant_method spellings init accepts,
 * the packing alias "auto_round:gptq", data_type absent/"int"/"int_sym",
 * 4 and 4.0, and block lists as sets of prefixes are each the same value.
 * Keys init does not read (autoround_version, ...) are not compared.
 * Meant to run before init on either, so a disagreement is reported as one
 * rather than as whichever file holds the unsupported value; a value init
 * would refuse for its type (a non-object entry, a malformed block list) is
 * left to init. AutoRound writes the same dict to both files, so neither
 * is authoritative: any disagreement is refused.
 * Returns 0, or -EINVAL with "<a> and <b> disagree on
 * quantization_config.<key> [(layer "<m>")]: <value> in <a>, <value> in <b>;
 * ..." (values as written; "missing"/"absent" when a file lacks them). */
int radiance_quant_config_compare(const json_t *qa, const char *a_source, const json_t *qb,
				  const char *b_source, char *err, size_t errlen);

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
