/*
 * The checkpoint loader's internals, shared by its files (one per concern,
 * as libuv's src/unix): checkpoint.c runs a load; checkpoint_config.c reads
 * the JSON files and opens the weights (configs and shards);
 * checkpoint_plan.c routes tensors to layers from the headers alone;
 * checkpoint_repack.c reads, checks and repacks each layer;
 * checkpoint_dir.c loads checkpoint directories (common/checkpoint_files.c
 * lists them);
 * checkpoint_identity.c hashes a file set. Not installed, not for other
 * parts of the daemon: daemon/checkpoint.h is the interface.
 *
 * Every function here writes its message through ck_err and returns 0 or
 * -errno, as checkpoint.h describes.
 */
#ifndef RADIANCE_CHECKPOINT_PRIVATE_H
#define RADIANCE_CHECKPOINT_PRIVATE_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "checkpoint.h"
#include "checkpoint_files.h"
#include "quant_config.h"
#include "safetensors.h"

#define CK_MAX_JSON RADIANCE_CHECKPOINT_MAX_JSON
#define CK_CONFIG RADIANCE_CHECKPOINT_CONFIG
#define CK_QCONFIG RADIANCE_CHECKPOINT_QCONFIG
#define CK_SINGLE RADIANCE_CHECKPOINT_SINGLE
#define CK_INDEX RADIANCE_CHECKPOINT_INDEX

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
	void *scratch;                          /* one tensor's bytes, read_tensor's */
	size_t scratch_len;
};

static inline void ck_err(struct ck_loader *L, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static inline void ck_err(struct ck_loader *L, const char *fmt, ...)
{
	va_list ap;
	if (!L->err || !L->errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(L->err, L->errlen, fmt, ap);
	va_end(ap);
}

static inline int ck_nomem(struct ck_loader *L, const char *what)
{
	ck_err(L, "out of memory (%s)", what);
	return -ENOMEM;
}

static inline const struct radiance_file *ck_find_file(const struct radiance_file *files,
							size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (files[i].name && strcmp(files[i].name, name) == 0)
			return &files[i];
	return NULL;
}

/* L->refs order, and bsearch over it */
static inline int ck_cmp_ref(const void *a, const void *b)
{
	return strcmp(((const struct ck_ref *)a)->name, ((const struct ck_ref *)b)->name);
}


/* checkpoint_config.c */

/* rcheckpoint_read_json (common/checkpoint_files.h) with L's error
 * buffer. */
static inline int radiance__ck_read_json(struct ck_loader *L, int fd, const char *fname,
					 json_t **out)
{
	return rcheckpoint_read_json(fd, fname, out, L->err, L->errlen);
}

/* L->qc from config.json's quantization_config (L->config) and/or
 * quantization_config.json among files, which must agree. */
int radiance__ck_load_quant_config(struct ck_loader *L, const struct radiance_file *files,
				   size_t n);

/* Opens the weights among files (the index and its shards, else
 * model.safetensors) into L->st, headers only, and builds L->refs. */
int radiance__ck_open_weights(struct ck_loader *L, const struct radiance_file *files, size_t n);

/* checkpoint_plan.c */

/* Decides from the headers which tensors make which linear layer
 * (L->plans, sorted by module name in natural order) and checks their
 * dtypes and shapes against the config and the kernels; no tensor data is
 * read. */
int radiance__ck_plan_layers(struct ck_loader *L);

/* Resident bytes of the layer p plans: its repacked arrays and fp32 bias. */
uint64_t radiance__ck_plan_bytes(const struct ck_plan *p);

/* Hands the plan, as layers without arrays, to the caller's check before
 * anything is allocated for a layer. 0 or the check's -errno. */
int radiance__ck_check_plan(struct ck_loader *L, const char *name, radiance_plan_check_fn check,
			    void *user);

/* checkpoint_repack.c */

/* Reads plan p's tensors, checks their data and repacks them into l. */
int radiance__ck_build_layer(struct ck_loader *L, struct ck_plan *p, struct radiance_layer *l);

/* m->other: every tensor no linear claimed, sorted by name. */
int radiance__ck_build_other(struct ck_loader *L, struct radiance_model *m);

#endif
