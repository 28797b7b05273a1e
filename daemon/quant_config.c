/* AutoRound quantization config parsing and routing; see quant_config.h. */
#include "quant_config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* A JSON value as compact text for messages ("8", "\"fp\"", "false").
 * Static-size buffer, truncated. */
static const char *dump(const json_t *v, char *buf, size_t len)
{
	if (!v) {
		snprintf(buf, len, "missing");
		return buf;
	}
	char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
	snprintf(buf, len, "%s", s ? s : "?");
	free(s);
	return buf;
}

/* An integer, or a real holding an integer (some writers emit 4.0). */
static bool get_int(const json_t *v, long long *out)
{
	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return true;
	}
	if (json_is_real(v)) {
		double d = json_real_value(v);
		if (d >= -1e15 && d <= 1e15 && d == (double)(long long)d) {
			*out = (long long)d;
			return true;
		}
	}
	return false;
}

/* quant_method as compared: lower case, '_' read as '-'; false when too
 * long to be any method we know. */
static bool method_fold(const char *m, char *buf, size_t len)
{
	size_t n = strlen(m);
	if (n >= len)
		return false;
	for (size_t i = 0; i <= n; i++)
		buf[i] = m[i] == '_' ? '-' : (char)tolower((unsigned char)m[i]);
	return true;
}

static bool method_ok(const char *m)
{
	char buf[64];
	return method_fold(m, buf, sizeof buf) &&
	       (strcmp(buf, "auto-round") == 0 || strcmp(buf, "intel/auto-round") == 0);
}

static bool packing_ok(const char *p)
{
	return strcmp(p, "auto_round:auto_gptq") == 0 || strcmp(p, "auto_round:gptq") == 0;
}

static bool int_data_type(const char *d)
{
	return strcmp(d, "int") == 0 || strcmp(d, "int_sym") == 0;
}

static bool float_data_type(const char *d)
{
	return strcmp(d, "fp") == 0 || strcmp(d, "float") == 0;
}

static bool has_regex_char(const char *s)
{
	return strpbrk(s, "^$*+?[]{}()|\\") != NULL;
}

/* Patterns in extra_config come from whoever sends the checkpoint, and glibc's
 * regcomp/regexec have exponential cases (stacked repetition: "a+++..."
 * doubles regcomp's memory per '+'; backreferences make regexec exponential
 * in the name's length). Module patterns need neither, so only a tame subset
 * is compiled: at most 256 characters, no backreference, no {m,n}, no
 * repetition operator applied to another, at most 4 repeated groups. NULL
 * when tame, else what is wrong. */
static const char *untamed_regex(const char *s)
{
	size_t len = strlen(s), repeated_groups = 0;
	if (len > 256)
		return "longer than 256 characters";
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '\\') {
			if (s[i + 1] >= '0' && s[i + 1] <= '9')
				return "a backreference";
			if (s[i + 1])
				i++;   /* an escaped character is a literal */
			continue;
		}
		if (s[i] == '{' || s[i] == '}')
			return "a {m,n} bound";
		if (strchr("*+?", s[i])) {
			if (i > 0 && strchr("*+?", s[i - 1]) && (i < 2 || s[i - 2] != '\\'))
				return "a repetition operator applied to another";
			if (i > 0 && s[i - 1] == ')' && ++repeated_groups > 4)
				return "more than 4 repeated groups";
		}
	}
	return NULL;
}

void radiance_quant_config_finish(struct radiance_quant_config *c)
{
	for (size_t i = 0; i < c->n_blocks; i++)
		free(c->blocks[i]);
	for (size_t i = 0; i < c->n_overrides; i++) {
		if (c->overrides[i].is_regex)
			regfree(&c->overrides[i].re);
		free(c->overrides[i].key);
	}
	free(c->blocks);
	free(c->overrides);
	free(c->source);
	free(c->quant_method);
	free(c->packing_format);
	memset(c, 0, sizeof *c);
}

static int add_block(struct radiance_quant_config *c, const char *s, size_t len)
{
	while (len && isspace((unsigned char)*s)) {
		s++;
		len--;
	}
	while (len && (isspace((unsigned char)s[len - 1]) || s[len - 1] == '.'))
		len--;
	if (!len)
		return 0;
	char **nb = realloc(c->blocks, (c->n_blocks + 1) * sizeof *nb);
	if (!nb)
		return -ENOMEM;
	c->blocks = nb;
	c->blocks[c->n_blocks] = strndup(s, len);
	if (!c->blocks[c->n_blocks])
		return -ENOMEM;
	c->n_blocks++;
	return 0;
}

static int add_blocks_str(struct radiance_quant_config *c, const char *s)
{
	int rc;
	for (;;) {
		const char *comma = strchr(s, ',');
		size_t len = comma ? (size_t)(comma - s) : strlen(s);
		if ((rc = add_block(c, s, len)))
			return rc;
		if (!comma)
			return 0;
		s = comma + 1;
	}
}

static int parse_blocks(struct radiance_quant_config *c, const json_t *v, const char *key,
			char *err, size_t errlen)
{
	char vb[160];
	size_t i;
	json_t *e;
	int rc;

	if (!v || json_is_null(v))
		return 0;
	if (json_is_string(v))
		return add_blocks_str(c, json_string_value(v));
	if (!json_is_array(v))
		goto bad;
	json_array_foreach(v, i, e) {
		if (json_is_string(e)) {
			rc = add_blocks_str(c, json_string_value(e));
		} else if (json_is_array(e)) {
			/* multimodal configs nest one list per tower */
			size_t j;
			json_t *s;
			rc = 0;
			json_array_foreach(e, j, s) {
				if (!json_is_string(s))
					goto bad;
				if ((rc = add_blocks_str(c, json_string_value(s))))
					break;
			}
		} else {
			goto bad;
		}
		if (rc)
			return rc;
	}
	return 0;
bad:
	rlog_errf(err, errlen, "%s: quantization_config.%s is %s, expected a string of comma-separated "
		       "module prefixes or an array of them", c->source, key, dump(v, vb, sizeof vb));
	return -EINVAL;
}

/* One extra_config entry. A module held at 16 bits is fine whatever else the
 * entry says; a module still quantized must match the kernel exactly. */
static int parse_override(struct radiance_quant_config *c, const char *key, const json_t *v,
			  char *err, size_t errlen)
{
	struct radiance_quant_override *o = &c->overrides[c->n_overrides];
	const json_t *bits_j, *gs_j, *sym_j, *dt_j;
	char vb[160];
	long long bits = c->bits, gs;
	const char *dt = NULL;

	if (!json_is_object(v)) {
		rlog_errf(err, errlen, "%s: quantization_config.extra_config[\"%s\"] is %s, expected an object "
			       "(layer \"%s\")", c->source, key, dump(v, vb, sizeof vb), key);
		return -EINVAL;
	}
	bits_j = json_object_get(v, "bits");
	gs_j = json_object_get(v, "group_size");
	sym_j = json_object_get(v, "sym");
	dt_j = json_object_get(v, "data_type");
	if (bits_j && !json_is_null(bits_j) && !get_int(bits_j, &bits)) {
		rlog_errf(err, errlen, "%s: layer \"%s\": quantization_config.extra_config[\"%s\"].bits is %s, "
			       "expected an integer", c->source, key, key, dump(bits_j, vb, sizeof vb));
		return -EINVAL;
	}
	if (dt_j && !json_is_null(dt_j)) {
		if (!json_is_string(dt_j)) {
			rlog_errf(err, errlen, "%s: layer \"%s\": quantization_config.extra_config[\"%s\"].data_type "
				       "is %s, expected a string", c->source, key, key, dump(dt_j, vb, sizeof vb));
			return -EINVAL;
		}
		dt = json_string_value(dt_j);
	}

	o->held_16bit = bits >= 16 || (dt && float_data_type(dt));
	if (!o->held_16bit) {
		if (bits != 4) {
			rlog_errf(err, errlen, "%s: layer \"%s\": quantization_config.extra_config[\"%s\"].bits is %lld, "
				       "expected 4 (int4 kernels) or >= 16 (kept as a bf16 linear)",
				       c->source, key, key, bits);
			return -EINVAL;
		}
		if (gs_j && !json_is_null(gs_j) && (!get_int(gs_j, &gs) || gs != 128)) {
			rlog_errf(err, errlen, "%s: layer \"%s\": quantization_config.extra_config[\"%s\"].group_size "
				       "is %s, expected 128", c->source, key, key, dump(gs_j, vb, sizeof vb));
			return -EINVAL;
		}
		if (sym_j && !json_is_null(sym_j) && !json_is_true(sym_j)) {
			rlog_errf(err, errlen, "%s: layer \"%s\": quantization_config.extra_config[\"%s\"].sym is %s, "
				       "expected true", c->source, key, key, dump(sym_j, vb, sizeof vb));
			return -EINVAL;
		}
		if (dt && !int_data_type(dt)) {
			rlog_errf(err, errlen, "%s: layer \"%s\": quantization_config.extra_config[\"%s\"].data_type "
				       "is \"%s\", expected \"int\" (or \"fp\"/\"float\" with bits >= 16)",
				       c->source, key, key, dt);
			return -EINVAL;
		}
	}

	o->key = strdup(key);
	if (!o->key)
		return -ENOMEM;
	if (has_regex_char(key)) {
		const char *why = untamed_regex(key);
		if (why) {
			rlog_errf(err, errlen, "%s: quantization_config.extra_config key \"%.300s\" is refused: "
				       "it has %s (radiance compiles module names and simple patterns only: "
				       "no backreferences, {m,n} bounds or stacked repetition)", c->source, key, why);
			free(o->key);
			return -EINVAL;
		}
		size_t n = strlen(key) + 5;
		char *pat = malloc(n);
		if (!pat) {
			free(o->key);
			return -ENOMEM;
		}
		snprintf(pat, n, "^(%s)$", key);
		int r = regcomp(&o->re, pat, REG_EXTENDED | REG_NOSUB);
		free(pat);
		if (r) {
			rlog_errf(err, errlen, "%s: quantization_config.extra_config key \"%s\" is neither a module "
				       "name nor a valid POSIX extended regular expression", c->source, key);
			free(o->key);
			return r == REG_ESPACE ? -ENOMEM : -EINVAL;
		}
		o->is_regex = true;
	}
	c->n_overrides++;
	return 0;
}

static int get_string_key(struct radiance_quant_config *c, const json_t *qc, const char *key,
			  const char *expected, char **out, char *err, size_t errlen)
{
	char vb[160];
	const json_t *v = json_object_get(qc, key);
	if (!v || !json_is_string(v)) {
		rlog_errf(err, errlen, "%s: quantization_config.%s is %s, expected %s", c->source, key,
			       dump(v, vb, sizeof vb), expected);
		return -EINVAL;
	}
	*out = strdup(json_string_value(v));
	return *out ? 0 : -ENOMEM;
}

static int get_required_int(struct radiance_quant_config *c, const json_t *qc, const char *key,
			    long long expected, const char *why, char *err, size_t errlen)
{
	char vb[160];
	long long i;
	const json_t *v = json_object_get(qc, key);
	if (!v || !get_int(v, &i) || i != expected) {
		rlog_errf(err, errlen, "%s: quantization_config.%s is %s, expected %lld (%s)", c->source, key,
			       dump(v, vb, sizeof vb), expected, why);
		return -EINVAL;
	}
	return 0;
}

int radiance_quant_config_init(struct radiance_quant_config *c, const json_t *qc,
			       const char *source, char *err, size_t errlen)
{
	char vb[160];
	const json_t *v;
	int rc;

	memset(c, 0, sizeof *c);
	c->source = strdup(source ? source : "quantization_config");
	if (!c->source)
		return -ENOMEM;
	if (!json_is_object(qc)) {
		rlog_errf(err, errlen, "%s: quantization_config is %s, expected an object", c->source,
			       dump(qc, vb, sizeof vb));
		rc = -EINVAL;
		goto fail;
	}

	rc = get_string_key(c, qc, "quant_method", "\"auto-round\"", &c->quant_method, err, errlen);
	if (rc)
		goto fail;
	if (!method_ok(c->quant_method)) {
		rlog_errf(err, errlen, "%s: quantization_config.quant_method is \"%s\", expected \"auto-round\" "
			       "(or \"intel/auto-round\")", c->source, c->quant_method);
		rc = -EINVAL;
		goto fail;
	}
	rc = get_string_key(c, qc, "packing_format", "\"auto_round:auto_gptq\"", &c->packing_format,
			    err, errlen);
	if (rc)
		goto fail;
	if (!packing_ok(c->packing_format)) {
		rlog_errf(err, errlen, "%s: quantization_config.packing_format is \"%s\": that packing is not "
			       "supported, expected \"auto_round:auto_gptq\" (alias \"auto_round:gptq\")",
			       c->source, c->packing_format);
		rc = -EINVAL;
		goto fail;
	}
	if ((rc = get_required_int(c, qc, "bits", 4, "the kernels are int4", err, errlen)) ||
	    (rc = get_required_int(c, qc, "group_size", 128, "the kernels' K groups are 128 wide",
				   err, errlen)))
		goto fail;
	c->bits = 4;
	c->group_size = 128;
	v = json_object_get(qc, "sym");
	if (!json_is_true(v)) {
		rlog_errf(err, errlen, "%s: quantization_config.sym is %s, expected true (the kernels fold the "
			       "constant zero point 8; asymmetric zero points are not carried)",
			       c->source, dump(v, vb, sizeof vb));
		rc = -EINVAL;
		goto fail;
	}
	c->sym = true;
	v = json_object_get(qc, "data_type");
	if (v && !json_is_null(v) && (!json_is_string(v) || !int_data_type(json_string_value(v)))) {
		rlog_errf(err, errlen, "%s: quantization_config.data_type is %s, expected \"int\"", c->source,
			       dump(v, vb, sizeof vb));
		rc = -EINVAL;
		goto fail;
	}

	const char *bkey = "block_name_to_quantize";
	v = json_object_get(qc, bkey);
	if (!v || json_is_null(v)) {
		bkey = "to_quant_block_names";
		v = json_object_get(qc, bkey);
	}
	if ((rc = parse_blocks(c, v, bkey, err, errlen)))
		goto fail;

	v = json_object_get(qc, "extra_config");
	if (v && !json_is_null(v)) {
		const char *key;
		json_t *e;
		if (!json_is_object(v)) {
			rlog_errf(err, errlen, "%s: quantization_config.extra_config is %s, expected an object of "
				       "per-module overrides", c->source, dump(v, vb, sizeof vb));
			rc = -EINVAL;
			goto fail;
		}
		c->overrides = calloc(json_object_size(v) + 1, sizeof *c->overrides);
		if (!c->overrides) {
			rc = -ENOMEM;
			goto fail;
		}
		json_object_foreach((json_t *)v, key, e) {
			if ((rc = parse_override(c, key, e, err, errlen)))
				goto fail;
		}
	}
	return 0;

fail:
	if (rc == -ENOMEM)
		rlog_errf(err, errlen, "%s: out of memory parsing quantization_config", c->source);
	radiance_quant_config_finish(c);
	return rc;
}

bool radiance_quant_config_in_blocks(const struct radiance_quant_config *c, const char *module,
				     const char **block)
{
	if (block)
		*block = NULL;
	if (!c->n_blocks)
		return true;
	for (size_t i = 0; i < c->n_blocks; i++) {
		size_t n = strlen(c->blocks[i]);
		if (strncmp(module, c->blocks[i], n) == 0 && (module[n] == '\0' || module[n] == '.')) {
			if (block)
				*block = c->blocks[i];
			return true;
		}
	}
	return false;
}

const struct radiance_quant_override *
radiance_quant_config_override(const struct radiance_quant_config *c, const char *module)
{
	for (size_t i = 0; i < c->n_overrides; i++)
		if (strcmp(c->overrides[i].key, module) == 0)
			return &c->overrides[i];
	for (size_t i = 0; i < c->n_overrides; i++)
		if (c->overrides[i].is_regex && regexec(&c->overrides[i].re, module, 0, NULL, 0) == 0)
			return &c->overrides[i];
	return NULL;
}

static bool block_listed(const struct radiance_quant_config *c, const char *b)
{
	for (size_t i = 0; i < c->n_blocks; i++)
		if (strcmp(c->blocks[i], b) == 0)
			return true;
	return false;
}

/* ---- config.json against quantization_config.json ----------------------- */

/* How a key is compared: as the loader reads it, so that spellings it takes
 * for the same thing agree and nothing else does. */
enum compare_as {
	AS_JSON,           /* the value itself (sym, and anything odd) */
	AS_METHOD,         /* quant_method: case, '_' for '-', "intel/" prefix */
	AS_PACKING,        /* packing_format: "auto_round:gptq" is "auto_round:auto_gptq" */
	AS_INT,            /* bits, group_size: 4 and 4.0 */
	AS_DATA_TYPE,      /* absent, "int" and "int_sym" are int */
};

/* The compared form of v (NULL or null: absent) as a string, pointing into
 * v, buf or a literal; NULL when it has none and is compared as JSON. */
static const char *canonical(const json_t *v, enum compare_as as, char *buf, size_t len)
{
	long long i;
	if (v && json_is_null(v))
		v = NULL;
	switch (as) {
	case AS_METHOD:
		if (json_is_string(v) && method_fold(json_string_value(v), buf, len))
			return strncmp(buf, "intel/", 6) == 0 ? buf + 6 : buf;
		return NULL;
	case AS_PACKING:
		if (!json_is_string(v))
			return NULL;
		return strcmp(json_string_value(v), "auto_round:gptq") == 0 ? "auto_round:auto_gptq"
									      : json_string_value(v);
	case AS_INT:
		if (!v || !get_int(v, &i))
			return NULL;
		snprintf(buf, len, "%lld", i);
		return buf;
	case AS_DATA_TYPE:
		if (!v || (json_is_string(v) && int_data_type(json_string_value(v))))
			return "int";
		return json_is_string(v) ? json_string_value(v) : NULL;
	case AS_JSON:
		break;
	}
	return NULL;
}

static bool same_value(const json_t *a, const json_t *b, enum compare_as as)
{
	char ba[64], bb[64];
	const char *ca = canonical(a, as, ba, sizeof ba), *cb = canonical(b, as, bb, sizeof bb);
	if (ca || cb)
		return ca && cb && strcmp(ca, cb) == 0;
	if (a && json_is_null(a))
		a = NULL;
	if (b && json_is_null(b))
		b = NULL;
	return a && b ? json_equal(a, b) : a == b;
}

struct compare_ctx {
	const char *a_src, *b_src;
	char *err;
	size_t errlen;
};

static int disagree(const struct compare_ctx *x, const char *what, const char *layer,
		    const char *in_a, const char *in_b)
{
	rlog_errf(x->err, x->errlen, "%s and %s disagree on quantization_config.%s%s%s%s: %s in %s, "
		       "%s in %s; expected the same in both (AutoRound writes one quantization config "
		       "to both files)", x->a_src, x->b_src, what, layer ? " (layer \"" : "",
		       layer ? layer : "", layer ? "\")" : "", in_a, x->a_src, in_b, x->b_src);
	return -EINVAL;
}

/* 0 when a and b agree in compared form, else the message, which shows
 * shown_a / shown_b (NULL: the value as written, or "missing"). */
static int differ(const struct compare_ctx *x, const char *what, const char *layer,
		  const json_t *a, const char *shown_a, const json_t *b, const char *shown_b,
		  enum compare_as as)
{
	char da[160], db[160];
	if (same_value(a, b, as))
		return 0;
	return disagree(x, what, layer, shown_a ? shown_a : dump(a, da, sizeof da),
			shown_b ? shown_b : dump(b, db, sizeof db));
}

/* The block list as init reads it: block_name_to_quantize, else
 * to_quant_block_names. */
static const json_t *blocks_value(const json_t *qc, const char **key)
{
	const json_t *v = json_object_get(qc, "block_name_to_quantize");
	*key = "block_name_to_quantize";
	if (!v || json_is_null(v)) {
		*key = "to_quant_block_names";
		v = json_object_get(qc, *key);
	}
	return v;
}

static void blocks_free(struct radiance_quant_config *c)
{
	for (size_t i = 0; i < c->n_blocks; i++)
		free(c->blocks[i]);
	free(c->blocks);
}

/* The two block lists as sets of prefixes (the order, a string or a list,
 * and repeats do not matter to routing). A list init would refuse is left
 * to init, so it is reported against its own file. */
static int compare_blocks(const struct compare_ctx *x, const json_t *qa, const json_t *qb)
{
	struct radiance_quant_config a = { .source = (char *)x->a_src };
	struct radiance_quant_config b = { .source = (char *)x->b_src };
	const char *ka, *kb;
	const json_t *va = blocks_value(qa, &ka), *vb = blocks_value(qb, &kb);
	bool same = true;
	int rc = 0;

	if ((rc = parse_blocks(&a, va, ka, NULL, 0)) || (rc = parse_blocks(&b, vb, kb, NULL, 0))) {
		if (rc == -ENOMEM)
			rlog_errf(x->err, x->errlen, "out of memory comparing %s and %s", x->a_src,
				       x->b_src);
		else
			rc = 0;   /* init refuses it, naming its file */
		goto out;
	}
	for (size_t i = 0; same && i < a.n_blocks; i++)
		same = block_listed(&b, a.blocks[i]);
	for (size_t i = 0; same && i < b.n_blocks; i++)
		same = block_listed(&a, b.blocks[i]);
	if (!same) {
		char sa[160], sb[160];
		rc = disagree(x, ka, NULL, dump(va, sa, sizeof sa), dump(vb, sb, sizeof sb));
	}
out:
	blocks_free(&a);
	blocks_free(&b);
	return rc;
}

/* An extra_config entry's field as parse_override reads it: the entry's own
 * value, else the file's top-level one; *shown says which. */
static const json_t *entry_field(const json_t *qc, const json_t *entry, const char *field,
				 char *shown, size_t len)
{
	char t[160];
	const json_t *v = json_object_get(entry, field);
	if (v && !json_is_null(v)) {
		dump(v, shown, len);
		return v;
	}
	v = json_object_get(qc, field);
	snprintf(shown, len, "absent (so %s)", dump(v, t, sizeof t));
	return v;
}

/* extra_config[key] of both files (ea or eb NULL: absent from that file). */
static int compare_entry(const struct compare_ctx *x, const char *key, const json_t *qa,
			 const json_t *ea, const json_t *qb, const json_t *eb)
{
	static const struct {
		const char *field;
		enum compare_as as;
	} fields[] = {
		{ "bits", AS_INT }, { "group_size", AS_INT }, { "sym", AS_JSON },
		{ "data_type", AS_DATA_TYPE },
	};
	char what[400], sa[200], sb[200];
	int rc;

	snprintf(what, sizeof what, "extra_config[\"%.300s\"]", key);
	if (!ea || !eb)
		return disagree(x, what, key, ea ? dump(ea, sa, sizeof sa) : "absent",
				eb ? dump(eb, sb, sizeof sb) : "absent");
	if (!json_is_object(ea) || !json_is_object(eb))
		return 0;   /* init's to refuse, naming its file */
	for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
		char fwhat[420];
		snprintf(fwhat, sizeof fwhat, "%s.%s", what, fields[i].field);
		const json_t *fa = entry_field(qa, ea, fields[i].field, sa, sizeof sa);
		const json_t *fb = entry_field(qb, eb, fields[i].field, sb, sizeof sb);
		if ((rc = differ(x, fwhat, key, fa, sa, fb, sb, fields[i].as)))
			return rc;
	}
	return 0;
}

int radiance_quant_config_compare(const json_t *qa, const char *a_source, const json_t *qb,
				  const char *b_source, char *err, size_t errlen)
{
	static const struct {
		const char *key;
		enum compare_as as;
	} keys[] = {
		{ "quant_method", AS_METHOD }, { "packing_format", AS_PACKING }, { "bits", AS_INT },
		{ "group_size", AS_INT }, { "sym", AS_JSON }, { "data_type", AS_DATA_TYPE },
	};
	struct compare_ctx x = { a_source, b_source, err, errlen };
	const char *key;
	json_t *v;
	int rc;

	if (!json_is_object(qa) || !json_is_object(qb))
		return 0;   /* init refuses it, naming its file */
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		if ((rc = differ(&x, keys[i].key, NULL, json_object_get(qa, keys[i].key), NULL,
				 json_object_get(qb, keys[i].key), NULL, keys[i].as)))
			return rc;
	if ((rc = compare_blocks(&x, qa, qb)))
		return rc;
	const json_t *ea = json_object_get(qa, "extra_config"), *eb = json_object_get(qb, "extra_config");
	if ((ea && !json_is_null(ea) && !json_is_object(ea)) ||
	    (eb && !json_is_null(eb) && !json_is_object(eb)))
		return 0;   /* init's to refuse */
	json_object_foreach((json_t *)ea, key, v)
		if ((rc = compare_entry(&x, key, qa, v, qb, json_object_get(eb, key))))
			return rc;
	json_object_foreach((json_t *)eb, key, v)
		if (!json_object_get(ea, key) && (rc = compare_entry(&x, key, qa, NULL, qb, v)))
			return rc;
	return 0;
}
