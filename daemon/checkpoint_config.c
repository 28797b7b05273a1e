/* Checkpoint loader, configs and shards: the JSON files (config.json,
 * quantization_config.json, the index) and the safetensors headers of the
 * weights. See checkpoint_private.h. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_private.h"

/* Reads a whole small JSON file through pread (the fd's position is shared
 * with whoever sent it) and parses it; it must be a JSON object. */
/* config.json's quantization_config and quantization_config.json: the first
 * is what engines read; the second is what AutoRound also writes, the same
 * dict (auto_round/export/export_to_autoround/export.py dumps
 * model.config.quantization_config into it after save_pretrained). So
 * neither is authoritative: when both exist they must say the same, or the
 * checkpoint is ambiguous and refused naming both values. Compared before
 * either is checked, so the message is about the disagreement. */
int radiance__ck_load_quant_config(struct ck_loader *L, const struct radiance_file *files,
				   size_t n)
{
	const struct radiance_file *qf = ck_find_file(files, n, CK_QCONFIG);
	json_t *qjson = NULL;
	const json_t *inner = L->config ? json_object_get(L->config, "quantization_config") : NULL;
	bool null = inner && json_is_null(inner);
	int rc;

	if (null)
		inner = NULL;
	if (qf && (rc = radiance__ck_read_json(L, qf->fd, CK_QCONFIG, &qjson)))
		return rc;
	/* A null is not an absent key: transformers and vLLM read a None
	 * quantization_config as "not quantized", so config.json says the
	 * opposite of quantization_config.json, and neither wins. */
	if (null && qjson) {
		ck_err(L, "%s and %s disagree on quantization_config: null in %s (an engine reading it "
		       "loads the model unquantized), an object in %s; expected the same in both "
		       "(AutoRound writes one quantization config to both files): set %s's "
		       "\"quantization_config\" to the contents of %s, or remove the key", CK_CONFIG,
		       CK_QCONFIG, CK_CONFIG, CK_QCONFIG, CK_CONFIG, CK_QCONFIG);
		rc = -EINVAL;
		goto out;
	}
	if (!inner && !qjson) {
		if (L->config)
			ck_err(L, "%s: %s and %s was not given, expected the quantization config of an "
			       "AutoRound int4 checkpoint", CK_CONFIG,
			       null ? "\"quantization_config\" is null" : "no \"quantization_config\"",
			       CK_QCONFIG);
		else
			ck_err(L, "neither %s nor %s was given, expected the quantization config of an "
			       "AutoRound int4 checkpoint", CK_CONFIG, CK_QCONFIG);
		return -ENOENT;
	}
	if (inner && qjson) {
		struct radiance_quant_config other;
		if ((rc = radiance_quant_config_compare(inner, CK_CONFIG, qjson, CK_QCONFIG, L->err,
							L->errlen)))
			goto out;
		/* what the comparison leaves to init (a malformed entry or block
		 * list) is refused naming the file that has it */
		if ((rc = radiance_quant_config_init(&other, qjson, CK_QCONFIG, L->err, L->errlen)))
			goto out;
		radiance_quant_config_finish(&other);
	}
	rc = radiance_quant_config_init(&L->qc, inner ? inner : qjson, inner ? CK_CONFIG : CK_QCONFIG,
					L->err, L->errlen);
	L->have_qc = rc == 0;
out:
	json_decref(qjson);
	return rc;
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

	if ((rc = radiance__ck_read_json(L, idx->fd, CK_INDEX, &root)))
		return rc;
	wm = json_object_get(root, "weight_map");
	if (!json_is_object(wm)) {
		ck_err(L, "%s: \"weight_map\" is %s, expected an object of tensor name -> shard file",
		       CK_INDEX, wm ? "not an object" : "missing");
		rc = -EINVAL;
		goto out;
	}
	/* a client that sent both, which libradiance never does */
	if (ck_find_file(files, nfiles, CK_SINGLE) &&
	    (rc = rcheckpoint_single_beside_index(wm, "the checkpoint files", L->err, L->errlen)))
		goto out;
	json_object_foreach(wm, key, v) {
		if (!json_is_string(v) || !rcheckpoint_shard_name_ok(json_string_value(v))) {
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
		const struct radiance_file *f = ck_find_file(files, nfiles, shard);
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
	qsort(L->refs, L->n_refs, sizeof *L->refs, ck_cmp_ref);
	for (size_t i = 1; i < L->n_refs; i++)
		if (strcmp(L->refs[i - 1].name, L->refs[i].name) == 0) {
			ck_err(L, "tensor \"%s\" appears in both %s and %s, expected it once",
			       L->refs[i].name, L->refs[i - 1].f->name, L->refs[i].f->name);
			return -EINVAL;
		}
	return 0;
}

int radiance__ck_open_weights(struct ck_loader *L, const struct radiance_file *files, size_t n)
{
	const struct radiance_file *f;
	int rc;

	/* With both, the index reads them, and model.safetensors must be one of
	 * its shards (open_sharded; rcheckpoint_single_beside_index says why). */
	if ((f = ck_find_file(files, n, CK_INDEX))) {
		rc = open_sharded(L, files, n, f);
	} else if ((f = ck_find_file(files, n, CK_SINGLE))) {
		rc = add_shard(L, f);
	} else {
		ck_err(L, "no weights: expected %s or %s among the checkpoint files", CK_SINGLE, CK_INDEX);
		rc = -ENOENT;
	}
	return rc ? rc : build_refs(L);
}
