/*
 * Checkpoint loader: files -> validated quant config -> safetensors maps ->
 * routing plan (header only) -> per layer: data checks + repack. See
 * checkpoint.h for the contract and docs/loader.md for the rules.
 *
 * Everything about the checkpoint is decided from the safetensors headers
 * before a single tensor byte is read (the plan), so a contradiction between
 * config and tensors costs nothing; only then are qzeros, g_idx and scales
 * read and checked, layer by layer, as each layer is repacked.
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "numerics.h"
#include "quant_config.h"
#include "safetensors.h"

#define CK_MAX_JSON (64u << 20)   /* config.json / index / quantization_config.json */
#define CK_CONFIG "config.json"
#define CK_QCONFIG "quantization_config.json"
#define CK_SINGLE "model.safetensors"
#define CK_INDEX "model.safetensors.index.json"

/* One tensor of the checkpoint, whichever shard holds it. */
struct ck_ref {
	const char *name;                       /* owned by the shard */
	const struct radiance_st_tensor *t;
	const struct radiance_st_file *f;
	bool used;                              /* claimed by a linear */
};

/* A linear layer decided from the headers; data not read yet. */
struct ck_plan {
	char *module;
	enum radiance_layer_kind kind;
	uint32_t n, k;
	const struct ck_ref *qweight, *scales, *qzeros, *g_idx, *weight, *bias;
	uint64_t src_bytes;                     /* checkpoint bytes read for it */
};

struct ck_loader {
	char *err;
	size_t errlen;
	json_t *config;                         /* config.json, or NULL */
	struct radiance_quant_config qc;
	bool have_qc;
	struct radiance_st_file **st;
	size_t n_st;
	struct ck_ref *refs;                    /* sorted by name */
	size_t n_refs;
	struct ck_plan *plans;
	size_t n_plans;
};

static void ck_err(struct ck_loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void ck_err(struct ck_loader *L, const char *fmt, ...)
{
	va_list ap;
	if (!L->err || !L->errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(L->err, L->errlen, fmt, ap);
	va_end(ap);
}

static int ck_nomem(struct ck_loader *L, const char *what)
{
	ck_err(L, "out of memory (%s)", what);
	return -ENOMEM;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n > m && strcmp(s + n - m, suffix) == 0;
}

static bool is_float_dtype(enum radiance_st_dtype d)
{
	return d == RADIANCE_ST_BF16 || d == RADIANCE_ST_F16 || d == RADIANCE_ST_F32;
}

/* Embeddings are 2-D float `.weight`s too, but a lookup table, not a linear:
 * any name containing "embed" (word/position/token_type embeddings,
 * embed_tokens, embed_positions, ...) and GPT-2's "wte"/"wpe" components. */
static bool is_embedding(const char *name)
{
	const char *p;
	for (p = name; *p; p++)
		if (strncasecmp(p, "embed", 5) == 0)
			return true;
	for (p = name; p; p = strchr(p, '.')) {
		if (*p == '.')
			p++;
		if ((strncmp(p, "wte", 3) == 0 || strncmp(p, "wpe", 3) == 0) &&
		    (p[3] == '.' || p[3] == '\0'))
			return true;
	}
	return false;
}

static const char *shape_str(const struct radiance_st_tensor *t, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (uint32_t i = 0; i < t->ndim && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	return buf;
}

static const struct radiance_file *find_file(const struct radiance_file *files, size_t n,
					     const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (files[i].name && strcmp(files[i].name, name) == 0)
			return &files[i];
	return NULL;
}

/* Reads a whole small JSON file through pread (the fd's position is shared
 * with whoever sent it) and parses it; it must be a JSON object. */
static int read_json_fd(struct ck_loader *L, int fd, const char *fname, json_t **out)
{
	struct stat st;
	json_error_t jerr;
	char *buf;
	size_t got = 0;
	int rc = 0;

	*out = NULL;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		ck_err(L, "%s: fstat: %s", fname, strerror(-rc));
		return rc == -EBADF ? -EINVAL : -EIO;
	}
	if (!S_ISREG(st.st_mode)) {
		ck_err(L, "%s: not a regular file, expected a JSON file", fname);
		return -EINVAL;
	}
	if ((uint64_t)st.st_size > CK_MAX_JSON) {
		ck_err(L, "%s: %lld bytes, expected a JSON file of at most %u bytes", fname,
		       (long long)st.st_size, CK_MAX_JSON);
		return -EINVAL;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		return ck_nomem(L, fname);
	while (got < (size_t)st.st_size) {
		ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			ck_err(L, "%s: read failed at byte %zu of %lld: %s", fname, got,
			       (long long)st.st_size, r < 0 ? strerror(errno) : "file shrank");
			rc = -EIO;
			goto out;
		}
		got += (size_t)r;
	}
	*out = json_loadb(buf, got, JSON_REJECT_DUPLICATES, &jerr);
	if (!*out) {
		ck_err(L, "%s: not valid JSON: %s (line %d, column %d), expected a JSON object", fname,
		       jerr.text, jerr.line, jerr.column);
		rc = -EINVAL;
	} else if (!json_is_object(*out)) {
		ck_err(L, "%s: top level is not a JSON object", fname);
		json_decref(*out);
		*out = NULL;
		rc = -EINVAL;
	}
out:
	free(buf);
	return rc;
}

/* config.json's quantization_config and quantization_config.json: the first
 * is what engines read; the second is what AutoRound also writes. When both
 * exist they must agree, or the checkpoint is ambiguous. */
static int load_quant_config(struct ck_loader *L, const struct radiance_file *files, size_t n)
{
	const struct radiance_file *qf = find_file(files, n, CK_QCONFIG);
	json_t *qjson = NULL;
	struct radiance_quant_config other;
	const json_t *inner = L->config ? json_object_get(L->config, "quantization_config") : NULL;
	int rc;

	if (inner && json_is_null(inner))
		inner = NULL;
	if (qf && (rc = read_json_fd(L, qf->fd, CK_QCONFIG, &qjson)))
		return rc;
	if (!inner && !qjson) {
		if (L->config)
			ck_err(L, "%s: no \"quantization_config\" and %s was not given, expected the "
			       "quantization config of an AutoRound int4 checkpoint", CK_CONFIG, CK_QCONFIG);
		else
			ck_err(L, "neither %s nor %s was given, expected the quantization config of an "
			       "AutoRound int4 checkpoint", CK_CONFIG, CK_QCONFIG);
		return -ENOENT;
	}
	if (inner) {
		rc = radiance_quant_config_init(&L->qc, inner, CK_CONFIG, L->err, L->errlen);
		if (rc)
			goto out;
		L->have_qc = true;
		if (qjson) {
			rc = radiance_quant_config_init(&other, qjson, CK_QCONFIG, L->err, L->errlen);
			if (rc)
				goto out;
			rc = radiance_quant_config_compare(&L->qc, &other, L->err, L->errlen);
			radiance_quant_config_finish(&other);
		}
	} else {
		rc = radiance_quant_config_init(&L->qc, qjson, CK_QCONFIG, L->err, L->errlen);
		L->have_qc = rc == 0;
	}
out:
	json_decref(qjson);
	return rc;
}

static bool shard_name_ok(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int add_shard(struct ck_loader *L, const struct radiance_file *file)
{
	struct radiance_st_file **st = realloc(L->st, (L->n_st + 1) * sizeof *st);
	if (!st)
		return ck_nomem(L, "shard list");
	L->st = st;
	int rc = radiance_st_open_fd(file->fd, file->name, &L->st[L->n_st], L->err, L->errlen);
	if (rc)
		return rc;
	L->n_st++;
	return 0;
}

/* The index names every tensor's shard; the shards must hold exactly those
 * tensors, so a stale index or a shard from another export is caught. */
static int open_sharded(struct ck_loader *L, const struct radiance_file *files, size_t nfiles,
			const struct radiance_file *idx)
{
	json_t *root, *wm, *v;
	const char *key;
	int rc;

	if ((rc = read_json_fd(L, idx->fd, CK_INDEX, &root)))
		return rc;
	wm = json_object_get(root, "weight_map");
	if (!json_is_object(wm)) {
		ck_err(L, "%s: \"weight_map\" is %s, expected an object of tensor name -> shard file",
		       CK_INDEX, wm ? "not an object" : "missing");
		rc = -EINVAL;
		goto out;
	}
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
			ck_err(L, "%s: weight_map[\"%s\"] is not a shard file name, expected a basename "
			       "such as \"model-00001-of-00002.safetensors\"", CK_INDEX, key);
			rc = -EINVAL;
			goto out;
		}
		const char *shard = json_string_value(v);
		bool open = false;
		for (size_t i = 0; i < L->n_st && !open; i++)
			open = strcmp(L->st[i]->name, shard) == 0;
		if (open)
			continue;
		const struct radiance_file *f = find_file(files, nfiles, shard);
		if (!f) {
			ck_err(L, "%s: shard \"%s\" (holding tensor \"%s\") is missing, expected it among "
			       "the checkpoint files", CK_INDEX, shard, key);
			rc = -ENOENT;
			goto out;
		}
		if ((rc = add_shard(L, f)))
			goto out;
	}
	json_object_foreach(wm, key, v) {
		const char *shard = json_string_value(v);
		for (size_t i = 0; i < L->n_st; i++) {
			if (strcmp(L->st[i]->name, shard) != 0)
				continue;
			if (!radiance_st_find(L->st[i], key)) {
				ck_err(L, "%s: lists tensor \"%s\" in shard \"%s\", but that shard has no such "
				       "tensor", CK_INDEX, key, shard);
				rc = -EINVAL;
				goto out;
			}
		}
	}
	for (size_t i = 0; i < L->n_st; i++) {
		for (size_t j = 0; j < L->st[i]->n_tensors; j++) {
			const char *tn = L->st[i]->tensors[j].name;
			v = json_object_get(wm, tn);
			if (!v || strcmp(json_string_value(v), L->st[i]->name) != 0) {
				ck_err(L, "%s: holds tensor \"%s\", but %s %s%s%s", L->st[i]->name, tn, CK_INDEX,
				       v ? "puts it in shard \"" : "does not list it",
				       v ? json_string_value(v) : "", v ? "\"" : "");
				rc = -EINVAL;
				goto out;
			}
		}
	}
out:
	json_decref(root);
	return rc;
}

static int cmp_ref(const void *a, const void *b)
{
	return strcmp(((const struct ck_ref *)a)->name, ((const struct ck_ref *)b)->name);
}

static int build_refs(struct ck_loader *L)
{
	size_t n = 0;
	for (size_t i = 0; i < L->n_st; i++)
		n += L->st[i]->n_tensors;
	L->refs = calloc(n + 1, sizeof *L->refs);
	if (!L->refs)
		return ck_nomem(L, "tensor table");
	for (size_t i = 0; i < L->n_st; i++)
		for (size_t j = 0; j < L->st[i]->n_tensors; j++) {
			struct ck_ref *r = &L->refs[L->n_refs++];
			r->t = &L->st[i]->tensors[j];
			r->f = L->st[i];
			r->name = r->t->name;
		}
	qsort(L->refs, L->n_refs, sizeof *L->refs, cmp_ref);
	for (size_t i = 1; i < L->n_refs; i++)
		if (strcmp(L->refs[i - 1].name, L->refs[i].name) == 0) {
			ck_err(L, "tensor \"%s\" appears in both %s and %s, expected it once",
			       L->refs[i].name, L->refs[i - 1].f->name, L->refs[i].f->name);
			return -EINVAL;
		}
	return 0;
}

static struct ck_ref *find_ref(struct ck_loader *L, const char *module, const char *suffix)
{
	char name[1024];
	struct ck_ref key;
	if ((size_t)snprintf(name, sizeof name, "%s%s", module, suffix) >= sizeof name)
		return NULL;
	key.name = name;
	return bsearch(&key, L->refs, L->n_refs, sizeof key, cmp_ref);
}

static struct ck_plan *new_plan(struct ck_loader *L, const char *tensor, const char *suffix)
{
	struct ck_plan *p = realloc(L->plans, (L->n_plans + 1) * sizeof *p);
	if (!p)
		return NULL;
	L->plans = p;
	p = &L->plans[L->n_plans];
	memset(p, 0, sizeof *p);
	p->module = strndup(tensor, strlen(tensor) - strlen(suffix));
	if (!p->module)
		return NULL;
	L->n_plans++;
	return p;
}

/* dtype and shape of one tensor of a layer, with the message engines'
 * users need: file, layer, tensor, found, expected. */
static int expect_tensor(struct ck_loader *L, const struct ck_plan *p, const struct ck_ref *r,
			 const char *what, bool dtype_ok, const char *dtypes_expected, uint32_t ndim,
			 const uint64_t *shape, const char *shape_expected)
{
	char sb[96];
	if (!dtype_ok) {
		ck_err(L, "%s: layer \"%s\": %s \"%s\" has dtype %s, expected %s", r->f->name, p->module,
		       what, r->name, radiance_st_dtype_name(r->t->dtype), dtypes_expected);
		return -EINVAL;
	}
	bool ok = r->t->ndim == ndim;
	for (uint32_t i = 0; ok && i < ndim; i++)
		ok = r->t->shape[i] == shape[i];
	if (!ok) {
		ck_err(L, "%s: layer \"%s\": %s \"%s\" has shape %s, expected %s", r->f->name, p->module,
		       what, r->name, shape_str(r->t, sb, sizeof sb), shape_expected);
		return -EINVAL;
	}
	return 0;
}

static int plan_bias(struct ck_loader *L, struct ck_plan *p)
{
	char ex[64];
	struct ck_ref *b = find_ref(L, p->module, ".bias");
	if (!b)
		return 0;
	uint64_t shape[1] = { p->n };
	snprintf(ex, sizeof ex, "[%u] ([N])", p->n);
	int rc = expect_tensor(L, p, b, "bias", is_float_dtype(b->t->dtype), "BF16, F16 or F32", 1,
			       shape, ex);
	if (rc)
		return rc;
	b->used = true;
	p->bias = b;
	p->src_bytes += b->t->end - b->t->begin;
	return 0;
}

static int plan_w4a8(struct ck_loader *L, struct ck_ref *qw)
{
	char sb[96], ex[96];
	struct ck_plan *p = new_plan(L, qw->name, ".qweight");
	struct ck_ref *r;
	int rc;

	if (!p)
		return ck_nomem(L, "layer plan");
	p->kind = RADIANCE_LAYER_W4A8;
	if (qw->t->dtype != RADIANCE_ST_I32) {
		ck_err(L, "%s: layer \"%s\": qweight \"%s\" has dtype %s, expected I32 (eight int4 codes "
		       "packed per int32)", qw->f->name, p->module, qw->name,
		       radiance_st_dtype_name(qw->t->dtype));
		return -EINVAL;
	}
	if (qw->t->ndim != 2 || !qw->t->shape[0] || !qw->t->shape[1]) {
		ck_err(L, "%s: layer \"%s\": qweight \"%s\" has shape %s, expected a non-empty "
		       "[K/8, N]", qw->f->name, p->module, qw->name, shape_str(qw->t, sb, sizeof sb));
		return -EINVAL;
	}
	uint64_t k = qw->t->shape[0] * RADIANCE_PACK, n = qw->t->shape[1];
	if (k > UINT32_MAX || n > UINT32_MAX) {
		ck_err(L, "%s: layer \"%s\": qweight \"%s\" shape %s gives K = %" PRIu64 ", N = %" PRIu64
		       ", expected both below 2^32", qw->f->name, p->module, qw->name,
		       shape_str(qw->t, sb, sizeof sb), k, n);
		return -EINVAL;
	}
	if (k % RADIANCE_GROUP_SIZE) {
		ck_err(L, "%s: layer \"%s\": K = %" PRIu64 " (8 x %" PRIu64 " qweight rows) is not a "
		       "multiple of %d, expected whole %d-wide groups along K", qw->f->name, p->module, k,
		       qw->t->shape[0], RADIANCE_GROUP_SIZE, RADIANCE_GROUP_SIZE);
		return -EINVAL;
	}
	p->k = (uint32_t)k;
	p->n = (uint32_t)n;
	p->qweight = qw;
	qw->used = true;
	uint64_t groups = k / RADIANCE_GROUP_SIZE;

	if ((r = find_ref(L, p->module, ".weight"))) {
		ck_err(L, "%s: layer \"%s\": has both \"%s\" and \"%s\", expected either an int4 layer "
		       "or a 16-bit one", qw->f->name, p->module, qw->name, r->name);
		return -EINVAL;
	}
	static const char *const parts[] = { ".scales", ".qzeros" };
	for (int i = 0; i < 2; i++) {
		r = find_ref(L, p->module, parts[i]);
		if (!r) {
			ck_err(L, "%s: layer \"%s\": has a qweight but no \"%s%s\", expected qweight, "
			       "scales and qzeros for an int4 layer", qw->f->name, p->module, p->module,
			       parts[i]);
			return -EINVAL;
		}
		if (i == 0) {
			uint64_t shape[2] = { groups, n };
			snprintf(ex, sizeof ex, "[%" PRIu64 ", %" PRIu64 "] ([K/128, N])", groups, n);
			rc = expect_tensor(L, p, r, "scales", r->t->dtype == RADIANCE_ST_F16, "F16",
					   2, shape, ex);
			p->scales = r;
		} else {
			uint64_t shape[2] = { groups, (n + 7) / 8 };
			snprintf(ex, sizeof ex, "[%" PRIu64 ", %" PRIu64 "] ([K/128, ceil(N/8)])", groups,
				 (n + 7) / 8);
			rc = expect_tensor(L, p, r, "qzeros", r->t->dtype == RADIANCE_ST_I32, "I32",
					   2, shape, ex);
			p->qzeros = r;
		}
		if (rc)
			return rc;
		r->used = true;
	}
	if ((r = find_ref(L, p->module, ".g_idx"))) {
		uint64_t shape[1] = { k };
		snprintf(ex, sizeof ex, "[%" PRIu64 "] ([K])", k);
		rc = expect_tensor(L, p, r, "g_idx",
				   r->t->dtype == RADIANCE_ST_I32 || r->t->dtype == RADIANCE_ST_I64,
				   "I32 or I64", 1, shape, ex);
		if (rc)
			return rc;
		r->used = true;
		p->g_idx = r;
	}
	p->src_bytes = (qw->t->end - qw->t->begin) + (p->scales->t->end - p->scales->t->begin) +
		       (p->qzeros->t->end - p->qzeros->t->begin) +
		       (p->g_idx ? p->g_idx->t->end - p->g_idx->t->begin : 0);
	return plan_bias(L, p);
}

static int plan_bf16(struct ck_loader *L, struct ck_ref *w)
{
	struct ck_plan *p = new_plan(L, w->name, ".weight");
	char sb[96];

	if (!p)
		return ck_nomem(L, "layer plan");
	p->kind = RADIANCE_LAYER_BF16;
	if (w->t->shape[0] == 0 || w->t->shape[1] == 0 || w->t->shape[0] > UINT32_MAX ||
	    w->t->shape[1] > UINT32_MAX) {
		ck_err(L, "%s: layer \"%s\": weight \"%s\" has shape %s, expected [N, K] with N and K "
		       "in 1 .. 2^32-1", w->f->name, p->module, w->name, shape_str(w->t, sb, sizeof sb));
		return -EINVAL;
	}
	p->n = (uint32_t)w->t->shape[0];
	p->k = (uint32_t)w->t->shape[1];
	p->weight = w;
	w->used = true;
	p->src_bytes = w->t->end - w->t->begin;
	return plan_bias(L, p);
}

/* Where the quantized blocks are, for messages. */
static const char *blocks_desc(const struct radiance_quant_config *qc, char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < qc->n_blocks && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s\"%s\"", i ? ", " : "", qc->blocks[i]);
	return buf;
}

static int route(struct ck_loader *L)
{
	const struct radiance_quant_config *qc = &L->qc;
	char bd[256], sb[96];
	int rc;

	/* Quantized layers first: a qweight makes a module int4, and the config
	 * must agree that it is. */
	for (size_t i = 0; i < L->n_refs; i++) {
		struct ck_ref *r = &L->refs[i];
		if (!ends_with(r->name, ".qweight"))
			continue;
		char module[1024];
		snprintf(module, sizeof module, "%.*s", (int)(strlen(r->name) - 8), r->name);
		const struct radiance_quant_override *ov = radiance_quant_config_override(qc, module);
		if (ov && ov->held_16bit) {
			ck_err(L, "%s: layer \"%s\": %s extra_config[\"%s\"] holds it at 16 bits, but the "
			       "checkpoint has its qweight \"%s\", expected a 16-bit weight",
			       r->f->name, module, qc->source, ov->key, r->name);
			return -EINVAL;
		}
		if (!ov && !radiance_quant_config_in_blocks(qc, module, NULL)) {
			ck_err(L, "%s: layer \"%s\": has a qweight but lies outside the quantized blocks "
			       "(%s block_name_to_quantize: %s) and extra_config does not list it, expected a "
			       "16-bit weight", r->f->name, module, qc->source,
			       blocks_desc(qc, bd, sizeof bd));
			return -EINVAL;
		}
		if ((rc = plan_w4a8(L, r)))
			return rc;
	}
	for (size_t i = 0; i < L->n_refs; i++) {
		struct ck_ref *r = &L->refs[i];
		static const char *const parts[] = { ".scales", ".qzeros", ".g_idx" };
		for (int j = 0; j < 3 && !r->used; j++) {
			if (!ends_with(r->name, parts[j]))
				continue;
			ck_err(L, "%s: layer \"%.*s\": has \"%s\" but no qweight, expected qweight, scales "
			       "and qzeros for an int4 layer", r->f->name,
			       (int)(strlen(r->name) - strlen(parts[j])), r->name, r->name);
			return -EINVAL;
		}
	}
	/* Then the 16-bit linears: 2-D float `.weight`s that are not embeddings. */
	for (size_t i = 0; i < L->n_refs; i++) {
		struct ck_ref *r = &L->refs[i];
		if (r->used || !ends_with(r->name, ".weight") || r->t->ndim != 2 || is_embedding(r->name))
			continue;
		char module[1024];
		const char *block;
		snprintf(module, sizeof module, "%.*s", (int)(strlen(r->name) - 7), r->name);
		const struct radiance_quant_override *ov = radiance_quant_config_override(qc, module);
		bool held = ov && ov->held_16bit;
		bool in = radiance_quant_config_in_blocks(qc, module, &block) && qc->n_blocks;
		if (!held && (in || ov)) {
			if (ov)
				ck_err(L, "%s: layer \"%s\": %s extra_config[\"%s\"] quantizes it to 4 bits, "
				       "but the checkpoint has a %s weight %s and no qweight, expected qweight, "
				       "scales and qzeros", r->f->name, module, qc->source, ov->key,
				       radiance_st_dtype_name(r->t->dtype), shape_str(r->t, sb, sizeof sb));
			else
				ck_err(L, "%s: layer \"%s\": inside the quantized block \"%s\" and not held at "
				       "16 bits by extra_config, but the checkpoint has a %s weight %s and no "
				       "qweight, expected qweight, scales and qzeros", r->f->name, module,
				       block, radiance_st_dtype_name(r->t->dtype),
				       shape_str(r->t, sb, sizeof sb));
			return -EINVAL;
		}
		if (!is_float_dtype(r->t->dtype)) {
			ck_err(L, "%s: layer \"%s\": weight \"%s\" has dtype %s, expected BF16, F16 or F32 "
			       "for a 16-bit linear", r->f->name, module, r->name,
			       radiance_st_dtype_name(r->t->dtype));
			return -EINVAL;
		}
		if ((rc = plan_bf16(L, r)))
			return rc;
	}
	if (!L->n_plans) {
		ck_err(L, "%s: no linear layer found (no qweight and no 2-D float weight outside "
		       "embeddings), expected an AutoRound int4 checkpoint",
		       L->n_st ? L->st[0]->name : CK_SINGLE);
		return -EINVAL;
	}
	return 0;
}

static int cmp_plan(const void *a, const void *b)
{
	return strverscmp(((const struct ck_plan *)a)->module, ((const struct ck_plan *)b)->module);
}

static int cmp_other(const void *a, const void *b)
{
	return strverscmp(((const struct radiance_tensor_info *)a)->name,
			  ((const struct radiance_tensor_info *)b)->name);
}

static void *alloc_array(size_t count, size_t size)
{
	void *p = NULL;
	size_t bytes = count * size;
	if (count && bytes / count != size)
		return NULL;
	if (posix_memalign(&p, 64, bytes ? bytes : 64))
		return NULL;
	return p;
}

/* dst[c][r] = src[r][c] for elements of esz bytes; src unaligned. Tiled so
 * both sides stay in cache on layers far bigger than L2. Inlined at each call
 * with a constant esz, so the memcpy is a plain load and store. */
static inline __attribute__((always_inline)) void
transpose(void *dst, const uint8_t *src, uint64_t rows, uint64_t cols, size_t esz)
{
	enum { T = 32 };
	uint8_t *d = dst;
	for (uint64_t r0 = 0; r0 < rows; r0 += T)
		for (uint64_t c0 = 0; c0 < cols; c0 += T) {
			uint64_t r1 = r0 + T < rows ? r0 + T : rows, c1 = c0 + T < cols ? c0 + T : cols;
			for (uint64_t r = r0; r < r1; r++)
				for (uint64_t c = c0; c < c1; c++)
					memcpy(d + (c * rows + r) * esz, src + (r * cols + c) * esz, esz);
		}
}

static float load_float(const struct radiance_st_tensor *t, uint64_t i)
{
	switch (t->dtype) {
	case RADIANCE_ST_BF16: return radiance_bf16_to_f32(radiance_st_get_u16(t, i));
	case RADIANCE_ST_F16: return radiance_f16_to_f32(radiance_st_get_u16(t, i));
	default: return radiance_st_get_f32(t, i);
	}
}

/* The kernels fold a constant zero point of 8 into the unpack: every qzeros
 * nibble of a real column must be 7 (GPTQ stores zero - 1). Columns past N in
 * the last word of a row are padding and not checked. */
static int verify_qzeros(struct ck_loader *L, const struct ck_plan *p)
{
	const struct radiance_st_tensor *t = p->qzeros->t;
	uint64_t words = (p->n + 7) / 8, groups = p->k / RADIANCE_GROUP_SIZE, bad = 0, first = 0;
	uint32_t first_v = 0, tail = p->n % 8;
	uint32_t last_mask = tail ? (uint32_t)((1ull << (4 * tail)) - 1) : 0xFFFFFFFFu;

	for (uint64_t g = 0; g < groups; g++)
		for (uint64_t w = 0; w < words; w++) {
			uint32_t mask = w == words - 1 ? last_mask : 0xFFFFFFFFu;
			uint32_t v = radiance_st_get_u32(t, g * words + w);
			if ((v & mask) != (0x77777777u & mask)) {
				if (!bad++) {
					first = g * words + w;
					first_v = v;
				}
			}
		}
	if (bad) {
		ck_err(L, "%s: layer \"%s\": %" PRIu64 " of %" PRIu64 " qzeros words differ from "
		       "0x77777777 (first: qzeros[%" PRIu64 "][%" PRIu64 "] = 0x%08" PRIx32 "), expected "
		       "every zero point 8 (stored as 7): the kernels support symmetric int4 only",
		       p->qzeros->f->name, p->module, bad, groups * words, first / words, first % words,
		       first_v);
		return -EINVAL;
	}
	return 0;
}

/* g_idx maps k to its group; GPTQ act-order (desc_act) permutes it. The
 * kernels read groups as contiguous 128-wide slabs of K, so only the
 * identity k / 128 is accepted. */
static int verify_g_idx(struct ck_loader *L, const struct ck_plan *p)
{
	const struct radiance_st_tensor *t = p->g_idx->t;
	for (uint64_t k = 0; k < p->k; k++) {
		int64_t v;
		if (t->dtype == RADIANCE_ST_I64)
			memcpy(&v, (const uint8_t *)t->data + k * 8, 8);
		else
			v = (int32_t)radiance_st_get_u32(t, k);
		if (v != (int64_t)(k / RADIANCE_GROUP_SIZE)) {
			ck_err(L, "%s: layer \"%s\": g_idx[%" PRIu64 "] = %" PRId64 ", expected %" PRIu64
			       " (k / 128): act-order (desc_act) checkpoints are not supported, groups must "
			       "be contiguous along K", p->g_idx->f->name, p->module, k, v,
			       k / RADIANCE_GROUP_SIZE);
			return -EINVAL;
		}
	}
	return 0;
}

static int verify_scales(struct ck_loader *L, const struct ck_plan *p)
{
	const struct radiance_st_tensor *t = p->scales->t;
	uint64_t count = t->nelem, bad = 0, first = 0;
	uint16_t first_v = 0;
	for (uint64_t i = 0; i < count; i++) {
		uint16_t h = radiance_st_get_u16(t, i);
		if ((h & 0x7C00u) == 0x7C00u && !bad++) {
			first = i;
			first_v = h;
		}
	}
	if (bad) {
		ck_err(L, "%s: layer \"%s\": %" PRIu64 " of %" PRIu64 " scales are not finite (first: "
		       "scales[%" PRIu64 "][%" PRIu64 "] = 0x%04x, %s), expected finite fp16 scales",
		       p->scales->f->name, p->module, bad, count, first / p->n, first % p->n, first_v,
		       first_v & 0x3FF ? "NaN" : "Inf");
		return -EINVAL;
	}
	return 0;
}

/* Resident bytes of the layer p plans: its repacked arrays and fp32 bias. */
static uint64_t plan_bytes(const struct ck_plan *p)
{
	uint64_t b = p->kind == RADIANCE_LAYER_W4A8
			     ? (uint64_t)p->n * (p->k / RADIANCE_PACK) * 4 +
				       (uint64_t)p->n * (p->k / RADIANCE_GROUP_SIZE) * 2
			     : (uint64_t)p->n * p->k * 2;
	return b + (p->bias ? (uint64_t)p->n * 4 : 0);
}

/* The plan as layers without arrays, for the caller's check. */
static int check_plan(struct ck_loader *L, const char *name, radiance_plan_check_fn check,
		      void *user)
{
	struct radiance_layer *v = calloc(L->n_plans + 1, sizeof *v);
	uint64_t total = 0;
	if (!v)
		return ck_nomem(L, "plan");
	for (size_t i = 0; i < L->n_plans; i++) {
		const struct ck_plan *p = &L->plans[i];
		v[i] = (struct radiance_layer){ .name = p->module, .kind = p->kind, .n = p->n,
						.k = p->k, .bytes = plan_bytes(p) };
		total += v[i].bytes;
	}
	int rc = check(user, name, v, L->n_plans, total, L->err, L->errlen);
	free(v);
	return rc < 0 ? rc : 0;
}

static int build_layer(struct ck_loader *L, struct ck_plan *p, struct radiance_layer *l)
{
	int rc;

	l->kind = p->kind;
	l->n = p->n;
	l->k = p->k;
	if (p->kind == RADIANCE_LAYER_W4A8) {
		uint64_t words = p->k / RADIANCE_PACK, groups = p->k / RADIANCE_GROUP_SIZE;
		if ((rc = verify_qzeros(L, p)) || (p->g_idx && (rc = verify_g_idx(L, p))) ||
		    (rc = verify_scales(L, p)))
			return rc;
		l->qweight = alloc_array((size_t)p->n * words, sizeof *l->qweight);
		l->scales = alloc_array((size_t)p->n * groups, sizeof *l->scales);
		if (!l->qweight || !l->scales)
			return ck_nomem(L, p->module);
		transpose(l->qweight, p->qweight->t->data, words, p->n, sizeof *l->qweight);
		transpose(l->scales, p->scales->t->data, groups, p->n, sizeof *l->scales);
	} else {
		const struct radiance_st_tensor *t = p->weight->t;
		uint64_t count = (uint64_t)p->n * p->k;
		l->weight = alloc_array((size_t)count, sizeof *l->weight);
		if (!l->weight)
			return ck_nomem(L, p->module);
		if (t->dtype == RADIANCE_ST_BF16) {
			memcpy(l->weight, t->data, (size_t)count * 2);
		} else {
			for (uint64_t i = 0; i < count; i++)
				l->weight[i] = radiance_bf16_from_f32(load_float(t, i));
		}
	}
	if (p->bias) {
		l->bias = alloc_array(p->n, sizeof *l->bias);
		if (!l->bias)
			return ck_nomem(L, p->module);
		for (uint32_t i = 0; i < p->n; i++)
			l->bias[i] = load_float(p->bias->t, i);
	}
	l->bytes = plan_bytes(p);
	return 0;
}

static int build_other(struct ck_loader *L, struct radiance_model *m)
{
	size_t n = 0;
	for (size_t i = 0; i < L->n_refs; i++)
		n += !L->refs[i].used;
	m->other = calloc(n + 1, sizeof *m->other);
	if (!m->other)
		return ck_nomem(L, "inventory");
	for (size_t i = 0; i < L->n_refs; i++) {
		const struct ck_ref *r = &L->refs[i];
		if (r->used)
			continue;
		if (r->t->ndim > 8) {
			ck_err(L, "%s: tensor \"%s\" has %u dimensions, expected at most 8", r->f->name,
			       r->name, r->t->ndim);
			return -EINVAL;
		}
		struct radiance_tensor_info *o = &m->other[m->n_other];
		o->name = strdup(r->name);
		if (!o->name)
			return ck_nomem(L, "inventory");
		m->n_other++;
		snprintf(o->dtype, sizeof o->dtype, "%s", radiance_st_dtype_name(r->t->dtype));
		o->ndim = r->t->ndim;
		for (uint32_t d = 0; d < r->t->ndim; d++)
			o->shape[d] = r->t->shape[d];
		o->bytes = r->t->end - r->t->begin;
	}
	qsort(m->other, m->n_other, sizeof *m->other, cmp_other);
	return 0;
}

static char *default_name(const json_t *config)
{
	const json_t *v = config ? json_object_get(config, "_name_or_path") : NULL;
	if (json_is_string(v)) {
		const char *s = json_string_value(v);
		size_t len = strlen(s);
		while (len && s[len - 1] == '/')
			len--;
		size_t start = len;
		while (start && s[start - 1] != '/')
			start--;
		if (len > start)
			return strndup(s + start, len - start);
	}
	return strdup("model");
}

static void loader_finish(struct ck_loader *L)
{
	for (size_t i = 0; i < L->n_plans; i++)
		free(L->plans[i].module);
	free(L->plans);
	free(L->refs);
	for (size_t i = 0; i < L->n_st; i++)
		radiance_st_close(L->st[i]);
	free(L->st);
	if (L->have_qc)
		radiance_quant_config_finish(&L->qc);
	json_decref(L->config);
}

int radiance_checkpoint_load(const struct radiance_file *files, size_t nfiles, const char *name,
			     radiance_progress_fn progress, void *user,
			     struct radiance_model **out, char *err, size_t errlen)
{
	return radiance_checkpoint_load_checked(files, nfiles, name, NULL, progress, user, out, err,
						errlen);
}

int radiance_checkpoint_load_checked(const struct radiance_file *files, size_t nfiles,
				     const char *name, radiance_plan_check_fn check,
				     radiance_progress_fn progress, void *user,
				     struct radiance_model **out, char *err, size_t errlen)
{
	struct ck_loader L = { .err = err, .errlen = errlen };
	struct radiance_model *m = NULL;
	const struct radiance_file *f;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!out || (!files && nfiles)) {
		ck_err(&L, "radiance_checkpoint_load: NULL argument");
		return -EINVAL;
	}
	*out = NULL;
	for (size_t i = 0; i < nfiles; i++) {
		if (!files[i].name || files[i].fd < 0) {
			ck_err(&L, "file %zu: %s, expected a basename and an open fd", i,
			       files[i].name ? "negative fd" : "NULL name");
			return -EINVAL;
		}
		for (size_t j = 0; j < i; j++)
			if (strcmp(files[i].name, files[j].name) == 0) {
				ck_err(&L, "%s: given twice, expected each checkpoint file once", files[i].name);
				return -EINVAL;
			}
	}

	if ((f = find_file(files, nfiles, CK_CONFIG)) && (rc = read_json_fd(&L, f->fd, CK_CONFIG, &L.config)))
		goto out;
	if ((rc = load_quant_config(&L, files, nfiles)))
		goto out;

	/* With both, the index wins, as in vLLM (it loads the files the
	 * weight_map names) and in the client's file list. */
	if ((f = find_file(files, nfiles, CK_INDEX))) {
		rc = open_sharded(&L, files, nfiles, f);
	} else if ((f = find_file(files, nfiles, CK_SINGLE))) {
		rc = add_shard(&L, f);
	} else {
		ck_err(&L, "no weights: expected %s or %s among the checkpoint files", CK_SINGLE, CK_INDEX);
		rc = -ENOENT;
	}
	if (rc || (rc = build_refs(&L)) || (rc = route(&L)))
		goto out;
	qsort(L.plans, L.n_plans, sizeof *L.plans, cmp_plan);

	m = calloc(1, sizeof *m);
	if (!m || !(m->layers = calloc(L.n_plans, sizeof *m->layers))) {
		rc = ck_nomem(&L, "model");
		goto out;
	}
	m->name = name ? strdup(name) : default_name(L.config);
	if (!m->name) {
		rc = ck_nomem(&L, "model name");
		goto out;
	}
	m->group_size = RADIANCE_GROUP_SIZE;
	m->bits = 4;
	if ((rc = build_other(&L, m)) || (check && (rc = check_plan(&L, m->name, check, user))))
		goto out;

	uint64_t total = 0, done = 0;
	for (size_t i = 0; i < L.n_plans; i++)
		total += L.plans[i].src_bytes;
	if (progress)
		progress(user, 0, total);
	for (size_t i = 0; i < L.n_plans; i++) {
		struct radiance_layer *l = &m->layers[i];
		m->n_layers = i + 1;       /* so destroy frees a half-built layer */
		if ((rc = build_layer(&L, &L.plans[i], l)))
			goto out;
		l->name = L.plans[i].module;
		L.plans[i].module = NULL;
		m->resident_bytes += l->bytes;
		done += L.plans[i].src_bytes;
		if (progress)
			progress(user, done, total);
	}
	*out = m;
	m = NULL;
out:
	radiance_model_destroy(m);
	loader_finish(&L);
	return rc;
}

/* ---- directories ------------------------------------------------------- */

static int stat_regular(int dfd, const char *dir, const char *name, bool required, char *err,
			size_t errlen)
{
	struct stat st;
	if (fstatat(dfd, name, &st, 0) < 0) {
		int e = errno;
		if (e == ENOENT && !required)
			return 0;
		if (err && errlen)
			snprintf(err, errlen, "%s/%s: %s", dir, name,
				 e == ENOENT ? "not found, expected it in a checkpoint directory" : strerror(e));
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		if (err && errlen)
			snprintf(err, errlen, "%s/%s: not a regular file", dir, name);
		return -EINVAL;
	}
	return 1;
}

static int names_add(char ***names, size_t *n, const char *s)
{
	for (size_t i = 0; i < *n; i++)
		if (strcmp((*names)[i], s) == 0)
			return 0;
	char **nn = realloc(*names, (*n + 2) * sizeof *nn);
	if (!nn)
		return -ENOMEM;
	*names = nn;
	if (!(nn[*n] = strdup(s)))
		return -ENOMEM;
	nn[++*n] = NULL;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void names_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

int radiance_checkpoint_list_files(const char *dir, char ***names, char *err, size_t errlen)
{
	struct ck_loader L = { .err = err, .errlen = errlen };
	char **list = NULL;
	size_t n = 0, first_shard;
	json_t *idx = NULL;
	int dfd, rc;

	if (!names || !dir)
		return -EINVAL;
	*names = NULL;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = -errno;
		ck_err(&L, "%s: %s", dir, strerror(-rc));
		return rc;
	}
	if ((rc = stat_regular(dfd, dir, CK_CONFIG, true, err, errlen)) < 0)
		goto out;
	if ((rc = names_add(&list, &n, CK_CONFIG)))
		goto nomem;
	if ((rc = stat_regular(dfd, dir, CK_QCONFIG, false, err, errlen)) < 0)
		goto out;
	if (rc == 1 && (rc = names_add(&list, &n, CK_QCONFIG)))
		goto nomem;
	if ((rc = stat_regular(dfd, dir, CK_INDEX, false, err, errlen)) < 0)
		goto out;
	if (rc == 0) {
		if ((rc = stat_regular(dfd, dir, CK_SINGLE, false, err, errlen)) < 0)
			goto out;
		if (rc == 0) {
			ck_err(&L, "%s: no weights, expected %s or %s", dir, CK_SINGLE, CK_INDEX);
			rc = -ENOENT;
			goto out;
		}
		if ((rc = names_add(&list, &n, CK_SINGLE)))
			goto nomem;
		goto done;
	}
	if ((rc = names_add(&list, &n, CK_INDEX)))
		goto nomem;
	int ifd = openat(dfd, CK_INDEX, O_RDONLY | O_CLOEXEC);
	if (ifd < 0) {
		rc = -errno;
		ck_err(&L, "%s/%s: %s", dir, CK_INDEX, strerror(-rc));
		goto out;
	}
	rc = read_json_fd(&L, ifd, CK_INDEX, &idx);
	close(ifd);
	if (rc)
		goto out;
	json_t *wm = json_object_get(idx, "weight_map"), *v;
	const char *key;
	if (!json_is_object(wm)) {
		ck_err(&L, "%s/%s: \"weight_map\" is missing or not an object, expected tensor name -> "
		       "shard file", dir, CK_INDEX);
		rc = -EINVAL;
		goto out;
	}
	first_shard = n;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
			ck_err(&L, "%s/%s: weight_map[\"%s\"] is not a shard file name, expected a basename",
			       dir, CK_INDEX, key);
			rc = -EINVAL;
			goto out;
		}
		if ((rc = names_add(&list, &n, json_string_value(v))))
			goto nomem;
	}
	for (size_t i = first_shard; i < n; i++)
		if ((rc = stat_regular(dfd, dir, list[i], true, err, errlen)) < 0)
			goto out;
	qsort(list + first_shard, n - first_shard, sizeof *list, cmp_str);
done:
	*names = list;
	list = NULL;
	rc = (int)n;
	goto out;
nomem:
	ck_err(&L, "out of memory listing %s", dir);
	rc = -ENOMEM;
out:
	if (list)
		names_free(list, n);
	json_decref(idx);
	close(dfd);
	return rc;
}

const char *radiance_checkpoint_dir_name(const char *dir, size_t *len)
{
	size_t end = strlen(dir);
	while (end > 1 && dir[end - 1] == '/')
		end--;
	size_t start = end;
	while (start && dir[start - 1] != '/')
		start--;
	*len = end - start;
	return dir + start;
}

static char *dir_basename(const char *dir)
{
	char *real = realpath(dir, NULL);
	size_t len;
	const char *s = radiance_checkpoint_dir_name(real ? real : dir, &len);
	char *b = len ? strndup(s, len) : strdup("model");
	free(real);
	return b;
}

int radiance_checkpoint_load_dir(const char *dir, const char *name, radiance_progress_fn progress,
				 void *user, struct radiance_model **out, char *err, size_t errlen)
{
	struct radiance_file *files = NULL;
	char **names = NULL, *base = NULL;
	int n, rc, dfd;

	if (!out || !dir)
		return -EINVAL;
	*out = NULL;
	n = radiance_checkpoint_list_files(dir, &names, err, errlen);
	if (n < 0)
		return n;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int open_errno = errno;
	files = calloc((size_t)n + 1, sizeof *files);
	for (int i = 0; files && i < n; i++)
		files[i].fd = -1;
	if (!name)
		name = base = dir_basename(dir);
	if (dfd < 0 || !files || !name) {
		rc = dfd < 0 ? -open_errno : -ENOMEM;
		if (err && errlen)
			snprintf(err, errlen, "%s: %s", dir, strerror(-rc));
		goto out;
	}
	for (int i = 0; i < n; i++) {
		files[i].name = names[i];
		files[i].fd = openat(dfd, names[i], O_RDONLY | O_CLOEXEC);
		if (files[i].fd < 0) {
			rc = -errno;
			if (err && errlen)
				snprintf(err, errlen, "%s/%s: %s", dir, names[i], strerror(-rc));
			goto out;
		}
	}
	rc = radiance_checkpoint_load(files, (size_t)n, name, progress, user, out, err, errlen);
out:
	for (int i = 0; files && i < n; i++)
		if (files[i].fd >= 0)
			close(files[i].fd);
	if (dfd >= 0)
		close(dfd);
	free(files);
	free(base);
	names_free(names, (size_t)n);
	return rc;
}

/* ---- identity ---------------------------------------------------------- */

static uint64_t fmix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static void fnv_bytes(uint64_t h[4], const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		for (int l = 0; l < 4; l++) {
			h[l] ^= b[i];
			h[l] *= 0x100000001b3ull;
		}
}

static void fnv_u64(uint64_t h[4], uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	fnv_bytes(h, b, 8);
}

static int cmp_file_ptr(const void *a, const void *b)
{
	return strcmp((*(const struct radiance_file *const *)a)->name,
		      (*(const struct radiance_file *const *)b)->name);
}

int radiance_checkpoint_identity(const struct radiance_file *files, size_t n, char out[65])
{
	const struct radiance_file **order;
	uint64_t h[4];

	if (!files || !n || !out)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!files[i].name)
			return -EINVAL;
	order = malloc(n * sizeof *order);
	if (!order)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		order[i] = &files[i];
	qsort(order, n, sizeof *order, cmp_file_ptr);
	/* four lanes from different offset bases, so the 256-bit output is not
	 * one 64-bit hash repeated */
	for (int l = 0; l < 4; l++)
		h[l] = 0xcbf29ce484222325ull ^ fmix64((uint64_t)l + 1);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (fstat(order[i]->fd, &st) < 0) {
			int e = errno;
			free(order);
			return -e;
		}
		fnv_bytes(h, order[i]->name, strlen(order[i]->name) + 1);
		fnv_u64(h, (uint64_t)st.st_dev);
		fnv_u64(h, (uint64_t)st.st_ino);
		fnv_u64(h, (uint64_t)st.st_size);
		fnv_u64(h, (uint64_t)st.st_mtim.tv_sec);
		fnv_u64(h, (uint64_t)st.st_mtim.tv_nsec);
	}
	free(order);
	for (int l = 0; l < 4; l++)
		snprintf(out + 16 * l, 17, "%016" PRIx64, fmix64(h[l] ^ (uint64_t)n));
	return 0;
}
