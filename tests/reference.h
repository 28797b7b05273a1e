/*
 * The reference side of the tests and the demo: the real checkpoint loaded
 * locally (daemon/checkpoint.h), the captured activations
 * (tests/data/minilm-acts.safetensors + .json), CPU reference outputs from
 * kernels/w4a8_cpu.h, and comparisons "to the bf16 floor".
 *
 * Header-only (static functions): every test and tool source is its
 * own binary. Used by tests/daemon_harness.h and tools/radiance-demo-client.c.
 */
#ifndef RADIANCE_TEST_REFERENCE_H
#define RADIANCE_TEST_REFERENCE_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "checkpoint.h"
#include "clock.h"
#include "model.h"
#include "numerics.h"
#include "safetensors.h"
#include "w4a8_cpu.h"

#define H_CHECKPOINT "minilm-w4g128"
#define H_ACTS "minilm-acts"

static inline const char *h_env(const char *name, const char *def)
{
	const char *v = getenv(name);
	return v && *v ? v : def;
}

static inline const char *h_data_dir(void)
{
	return h_env("RADIANCE_TEST_DATA", "tests/data");
}

static inline void h_path(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", h_data_dir(), name);
}

static inline double h_now(void)
{
	return rclock_s();
}

static inline void h_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* --- reference data ------------------------------------------------------- */

/* One captured layer: its activations, the fp32 model's output, and the CPU
 * reference of the loaded checkpoint. */
struct h_layer {
	char name[128];
	uint32_t n, k, m;
	int local;                  /* index in h_ref.model->layers */
	uint16_t *x_bf16;           /* [m][k], fp32 x rounded to bf16 (RNE) */
	uint16_t *x_fp16;           /* [m][k], the bf16 values as fp16 (RNE) */
	float *y_fp32;              /* [m][n], the unquantized model's output */
	uint16_t *ref_bf16;         /* [m][n], CPU reference for x_bf16 */
	uint16_t *ref_fp16;         /* [m][n], CPU reference for x_fp16 */
};

struct h_ref {
	struct radiance_model *model;
	struct h_layer *layers;
	size_t n_layers;
	char model_name[128];
};

/* fp32 -> fp16, round to nearest even (values here are well inside range). */
static inline uint16_t h_fp16_from_f32(float f)
{
	uint32_t u = radiance_f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7FFFFFFFu;
	if (a >= 0x47800000u)                       /* >= 65536: Inf (or NaN) */
		return sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u);
	if (a < 0x38800000u) {                      /* below 2^-14: subnormal */
		float q = radiance_f32_from_bits(a) * 16777216.0f;   /* / 2^-24 */
		return sign | (uint16_t)nearbyintf(q);
	}
	uint32_t exp = (a >> 23) - 127 + 15;
	uint32_t man = a & 0x7FFFFFu;
	uint32_t keep = man >> 13, rest = man & 0x1FFFu;
	if (rest > 0x1000u || (rest == 0x1000u && (keep & 1u)))
		keep++;
	uint32_t v = (exp << 10) + keep;            /* a mantissa carry bumps exp */
	return sign | (uint16_t)(v >= 0x7C00u ? 0x7C00u : v);
}

static inline void h_reference(const struct radiance_layer *l, const uint16_t *x,
			       enum radiance_dtype dt, uint32_t m, uint16_t *y)
{
	if (l->kind == RADIANCE_LAYER_W4A8) {
		void *scratch = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(m, l->k) + 63) / 64 * 64);
		radiance_cpu_w4a8(x, dt, m, l->qweight, l->scales, l->bias, l->n, l->k, y, scratch);
		free(scratch);
	} else {
		radiance_cpu_bf16(x, dt, m, l->weight, l->bias, l->n, l->k, y);
	}
}

static inline void h_ref_free(struct h_ref *r)
{
	for (size_t i = 0; i < r->n_layers; i++) {
		free(r->layers[i].x_bf16);
		free(r->layers[i].x_fp16);
		free(r->layers[i].y_fp32);
		free(r->layers[i].ref_bf16);
		free(r->layers[i].ref_fp16);
	}
	free(r->layers);
	radiance_model_destroy(r->model);
	memset(r, 0, sizeof *r);
}

/* Loads the checkpoint locally and the captured activations, and computes
 * the CPU reference of the captured layers named in only[] (NULL-terminated;
 * NULL: all of them). 0 or -1 (message printed). */
static inline int h_ref_load_some(struct h_ref *r, const char *const *only)
{
	char ckpt[512], st_path[512], json_path[512], err[512];
	memset(r, 0, sizeof *r);
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	h_path(st_path, sizeof st_path, H_ACTS ".safetensors");
	h_path(json_path, sizeof json_path, H_ACTS ".json");
	int rc = radiance_checkpoint_load_dir(ckpt, NULL, NULL, NULL, &r->model, err, sizeof err);
	if (rc < 0) {
		fprintf(stderr, "loading %s locally: %s\n", ckpt, err);
		return -1;
	}
	snprintf(r->model_name, sizeof r->model_name, "%s", r->model->name);
	json_error_t jerr;
	json_t *meta = json_load_file(json_path, 0, &jerr);
	if (!meta) {
		fprintf(stderr, "%s: %s\n", json_path, jerr.text);
		return -1;
	}
	struct radiance_st_file *st;
	if (radiance_st_load_path(st_path, &st, err, sizeof err) < 0) {
		fprintf(stderr, "%s\n", err);
		json_decref(meta);
		return -1;
	}
	json_t *layers = json_object_get(meta, "layers");
	size_t n = json_array_size(layers);
	r->layers = calloc(n ? n : 1, sizeof *r->layers);
	int ret = 0;
	for (size_t i = 0; i < n && ret == 0; i++) {
		json_t *jl = json_array_get(layers, i);
		const char *lname = json_string_value(json_object_get(jl, "name"));
		int wanted = !only;
		for (size_t j = 0; only && only[j] && !wanted; j++)
			wanted = lname && strcmp(only[j], lname) == 0;
		if (!wanted)
			continue;
		struct h_layer *l = &r->layers[r->n_layers++];
		snprintf(l->name, sizeof l->name, "%s", lname ? lname : "");
		l->n = (uint32_t)json_integer_value(json_object_get(jl, "N"));
		l->k = (uint32_t)json_integer_value(json_object_get(jl, "K"));
		l->m = (uint32_t)json_integer_value(json_object_get(jl, "M"));
		long li = radiance_model_find_layer(r->model, l->name);
		char xn[160], yn[160];
		snprintf(xn, sizeof xn, "%s.x", l->name);
		snprintf(yn, sizeof yn, "%s.y_fp32", l->name);
		const struct radiance_st_tensor *tx = radiance_st_find(st, xn);
		const struct radiance_st_tensor *ty = radiance_st_find(st, yn);
		if (li < 0 || !tx || !ty || tx->dtype != RADIANCE_ST_F32 || ty->dtype != RADIANCE_ST_F32 ||
		    tx->nelem != (uint64_t)l->m * l->k || ty->nelem != (uint64_t)l->m * l->n ||
		    r->model->layers[li].n != l->n || r->model->layers[li].k != l->k) {
			fprintf(stderr, "layer %s: checkpoint and activations disagree\n", l->name);
			ret = -1;
			break;
		}
		l->local = (int)li;
		size_t mk = (size_t)l->m * l->k, mn = (size_t)l->m * l->n;
		l->x_bf16 = malloc(mk * 2);
		l->x_fp16 = malloc(mk * 2);
		l->y_fp32 = malloc(mn * 4);
		l->ref_bf16 = malloc(mn * 2);
		l->ref_fp16 = malloc(mn * 2);
		for (size_t j = 0; j < mk; j++) {
			l->x_bf16[j] = radiance_bf16_from_f32(radiance_st_get_f32(tx, j));
			l->x_fp16[j] = h_fp16_from_f32(radiance_bf16_to_f32(l->x_bf16[j]));
		}
		for (size_t j = 0; j < mn; j++)
			l->y_fp32[j] = radiance_st_get_f32(ty, j);
		h_reference(&r->model->layers[li], l->x_bf16, RADIANCE_DTYPE_BF16, l->m, l->ref_bf16);
		h_reference(&r->model->layers[li], l->x_fp16, RADIANCE_DTYPE_FP16, l->m, l->ref_fp16);
	}
	radiance_st_close(st);
	json_decref(meta);
	if (ret < 0)
		h_ref_free(r);
	return ret;
}

static inline int h_ref_load(struct h_ref *r)
{
	return h_ref_load_some(r, NULL);
}

/* The three layers h_good_client() checks: one of each shape. */
static const char *const h_good_layers[] = {
	"encoder.layer.0.attention.self.query",       /* 384 x 384 */
	"encoder.layer.2.intermediate.dense",         /* 1536 x 384 */
	"encoder.layer.5.output.dense",               /* 384 x 1536 */
	NULL,
};

static inline const struct h_layer *h_ref_find(const struct h_ref *r, const char *name)
{
	for (size_t i = 0; i < r->n_layers; i++)
		if (strcmp(r->layers[i].name, name) == 0)
			return &r->layers[i];
	return NULL;
}

/* Compares bf16 outputs. Backends may differ in the order of fp32 sums, so
 * outputs agree "to the bf16 rounding floor": each element within one bf16
 * ulp of the larger magnitude (docs/numerics.md). Returns the number of
 * elements beyond that; *exact counts bit-identical ones. */
static inline size_t h_compare_bf16(const uint16_t *got, const uint16_t *want, size_t n,
				    size_t *exact, double *max_ulps)
{
	size_t bad = 0, same = 0;
	double worst = 0;
	for (size_t i = 0; i < n; i++) {
		if (got[i] == want[i]) {
			same++;
			continue;
		}
		float a = radiance_bf16_to_f32(got[i]), b = radiance_bf16_to_f32(want[i]);
		if (isnan(a) || isnan(b)) {
			bad++;
			continue;
		}
		float mag = fabsf(a) > fabsf(b) ? fabsf(a) : fabsf(b);
		int e;
		frexpf(mag, &e);
		double ulp = ldexp(1.0, e - 8);   /* bf16: 8 significant bits */
		double d = fabs((double)a - (double)b) / ulp;
		if (d > worst)
			worst = d;
		if (d > 1.0)
			bad++;
	}
	if (exact)
		*exact = same;
	if (max_ulps)
		*max_ulps = worst;
	return bad;
}

/* Relative Frobenius error of bf16 y against fp32 want. */
static inline double h_relerr(const uint16_t *y, const float *want, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)radiance_bf16_to_f32(y[i]) - want[i];
		num += d * d;
		den += (double)want[i] * want[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
