/* Checkpoint loader, routing and planning: which tensors make which linear
 * layer, decided from the safetensors headers and the quantization config
 * before any tensor byte is read, so a contradiction costs nothing. The
 * rules are docs/loader.md's "Routing" and "int4 layer checks". */
#include <inttypes.h>
#include <stdlib.h>

#include "checkpoint_private.h"
#include "numerics.h"

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

static struct ck_ref *find_ref(struct ck_loader *L, const char *module, const char *suffix)
{
	char name[1024];
	struct ck_ref key;
	if ((size_t)snprintf(name, sizeof name, "%s%s", module, suffix) >= sizeof name)
		return NULL;
	key.name = name;
	return bsearch(&key, L->refs, L->n_refs, sizeof key, ck_cmp_ref);
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

static int cmp_plan(const void *a, const void *b)
{
	return strverscmp(((const struct ck_plan *)a)->module, ((const struct ck_plan *)b)->module);
}

int radiance__ck_plan_layers(struct ck_loader *L)
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
	qsort(L->plans, L->n_plans, sizeof *L->plans, cmp_plan);
	return 0;
}

uint64_t radiance__ck_plan_bytes(const struct ck_plan *p)
{
	uint64_t b = p->kind == RADIANCE_LAYER_W4A8
			     ? (uint64_t)p->n * (p->k / RADIANCE_PACK) * 4 +
				       (uint64_t)p->n * (p->k / RADIANCE_GROUP_SIZE) * 2
			     : (uint64_t)p->n * p->k * 2;
	return b + (p->bias ? (uint64_t)p->n * 4 : 0);
}

int radiance__ck_check_plan(struct ck_loader *L, const char *name, uint64_t extra_bytes,
			    radiance_plan_check_fn check, void *user)
{
	struct radiance_layer *v = calloc(L->n_plans + 1, sizeof *v);
	uint64_t total = extra_bytes;
	if (!v)
		return ck_nomem(L, "plan");
	for (size_t i = 0; i < L->n_plans; i++) {
		const struct ck_plan *p = &L->plans[i];
		v[i] = (struct radiance_layer){ .name = p->module, .kind = p->kind, .n = p->n,
						.k = p->k, .bytes = radiance__ck_plan_bytes(p) };
		total += v[i].bytes;
	}
	int rc = check(user, name, v, L->n_plans, total, L->err, L->errlen);
	free(v);
	return rc < 0 ? rc : 0;
}
