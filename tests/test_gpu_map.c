/*
 * Mapped weights on the GPU (docs/mapped.md): radianced on the GPU backend in
 * one process, this test in another maps its models with libradiance-gpu
 * and runs the layers on its own stream, checked against the CPU reference
 * computed here from the same checkpoints:
 *   - every layer of the shipped MiniLM checkpoint (W4A8 and bf16) and of a
 *     synthetic one (N = 200 and 72, not multiples of a tile; K = 4096,
 *     split-K; a bf16 layer with bias) at M = 1..300 through the policy's
 *     path (streaming GEMV, decode, tiled, BLAS), and the forced portable
 *     (bit-exact) and wgmma paths; rows past M untouched;
 *   - bit for bit what the daemon computes for the same requests through
 *     the rings (the same kernels, the same plan, the same weights);
 *   - radiance_gpu_linear_fp8 on the codes and scales the CPU quant makes
 *     from x gives radiance_gpu_linear's y bit for bit, and on random codes
 *     the CPU GEMM's on the same codes; its argument errors;
 *   - radiance_gpu_linear_multi (one quant for several layers in the decode
 *     band) gives each layer's radiance_gpu_linear y bit for bit;
 *   - the calls captured in a CUDA graph and replayed give the same bits;
 *   - the mapping is read-only: a second process that writes to it fails
 *     and the weights every session computes with are unchanged;
 *   - lifetime and argument errors (EBUSY release, ENOENT layer, E2BIG, EINVAL);
 *   - the legacy IPC path (a daemon with RADIANCE_SHARE=ipc).
 * Skips without a GPU build or device.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef RADIANCE_GPU
#include "checkpoint.h"
#include "daemon_harness.h"
#include "gpu/gpu-private.h"
#include "gpu_check.h"
#include "st_writer.h"
#include "w4a8_cpu.h"
#include "w4a8_gpu.h"

#define SYN_NAME "map-synthetic"
#define MAX_ROWS 512u

static int have_gpu;
static struct radiance__gpu_device dev;
static void *stream;
static char minilm_dir[512], syn_root[64], syn_dir[256];
static struct radiance_model *minilm, *syn;
static struct h_daemon daemon_;
static void *dx, *dy;            /* [MAX_ROWS][max k] and [MAX_ROWS + 1][max n] */
static const char *self_exe;

/* ---- the synthetic checkpoint ---- */

static void add_w4(struct stw *w, const char *module, uint32_t n, uint32_t k, int bias)
{
	char name[256];
	const uint32_t words = k / 8, groups = k / 128, zw = (n + 7) / 8;
	uint32_t *qw = malloc((size_t)words * n * 4), *qz = malloc((size_t)groups * zw * 4);
	uint16_t *sc = malloc((size_t)groups * n * 2), *b = malloc((size_t)n * 2);
	for (size_t i = 0; i < (size_t)words * n; i++)
		qw[i] = rnd() ^ (rnd() << 16);
	for (size_t i = 0; i < (size_t)groups * n; i++)
		sc[i] = f32_to_f16((0.002f + 0.03f * frand()) * ((rnd() & 1) ? -1.0f : 1.0f));
	for (size_t i = 0; i < (size_t)groups * zw; i++)
		qz[i] = 0x77777777u;   /* symmetric: every zero point 8, stored as 7 */
	for (uint32_t i = 0; i < n; i++)
		b[i] = f32_to_f16(nrand() * 0.5f);
	stw_add_gptq(w, module, n, k, qw, sc, qz);
	if (bias) {
		snprintf(name, sizeof name, "%s.bias", module);
		stw_add(w, name, "F16", 1, (uint64_t[]){ n }, b, (size_t)n * 2);
	}
	free(qw);
	free(qz);
	free(sc);
	free(b);
}

static int write_synthetic(void)
{
	struct stw w;
	char path[512];
	stw_init(&w);
	add_w4(&w, "model.layers.0.mlp.narrow", 200, 640, 1);
	add_w4(&w, "model.layers.0.mlp.deep", 72, 4096, 0);
	const uint32_t n = 136, k = 384;
	uint16_t *wb = malloc((size_t)n * k * 2), *b = malloc(n * 2);
	for (size_t i = 0; i < (size_t)n * k; i++)
		wb[i] = radiance_bf16_from_f32(nrand() * 0.05f);
	for (uint32_t i = 0; i < n; i++)
		b[i] = radiance_bf16_from_f32(nrand());
	stw_add(&w, "lm_head.weight", "BF16", 2, (uint64_t[]){ n, k }, wb, (size_t)n * k * 2);
	stw_add(&w, "lm_head.bias", "BF16", 1, (uint64_t[]){ n }, b, (size_t)n * 2);
	free(wb);
	free(b);
	snprintf(syn_root, sizeof syn_root, "/tmp/radiance-map-XXXXXX");
	if (!mkdtemp(syn_root))
		return -1;
	snprintf(syn_dir, sizeof syn_dir, "%s/%s", syn_root, SYN_NAME);
	if (mkdir(syn_dir, 0755) < 0)
		return -1;
	int rc = stw_write(&w, path_join(path, sizeof path, syn_dir, "model.safetensors"));
	stw_finish(&w);
	if (rc < 0)
		return -1;
	return write_text(path_join(path, sizeof path, syn_dir, "config.json"),
			  "{\"architectures\": [\"LlamaForCausalLM\"], \"_name_or_path\": \"synthetic/map\","
			  " \"quantization_config\": {\"quant_method\": \"auto-round\","
			  " \"packing_format\": \"auto_round:auto_gptq\", \"bits\": 4, \"group_size\": 128,"
			  " \"sym\": true, \"data_type\": \"int\", \"block_name_to_quantize\": \"model.layers\"}}");
}

/* ---- fixtures ---- */

static int start_daemon(const char *share)
{
	if (share)
		setenv("RADIANCE_SHARE", share, 1);
	setenv("RADIANCE_TEST_BACKEND", "gpu", 1);
	int rc = h_daemon_start(&daemon_);
	unsetenv("RADIANCE_SHARE");
	return rc;
}

static int group_setup(void **state)
{
	char err[512];
	if (radiance__gpu_init(0, &dev) != 0 || radiance__gpu_stream_create(&stream) != 0) {
		printf("# no usable GPU (%s): every test is skipped\n", radiance__gpu_last_error());
		return 0;
	}
	h_path(minilm_dir, sizeof minilm_dir, H_CHECKPOINT);
	if (write_synthetic() < 0 ||
	    radiance_checkpoint_load_dir(minilm_dir, NULL, NULL, NULL, &minilm, err, sizeof err) < 0 ||
	    radiance_checkpoint_load_dir(syn_dir, NULL, NULL, NULL, &syn, err, sizeof err) < 0) {
		fprintf(stderr, "checkpoints: %s\n", err);
		return -1;
	}
	if (radiance__gpu_malloc(&dx, (size_t)MAX_ROWS * 4096 * 2) || radiance__gpu_malloc(&dy, (size_t)(MAX_ROWS + 1) * 1536 * 2))
		return -1;
	have_gpu = 1;
	printf("# GPU: %s, wgmma %d\n", dev.name, dev.wgmma);
	return 0;
}

static int group_teardown(void **state)
{
	radiance__gpu_free(dx);
	radiance__gpu_free(dy);
	radiance__gpu_stream_destroy(stream);
	radiance_model_destroy(minilm);
	radiance_model_destroy(syn);
	if (syn_root[0]) {
		tmpdir_remove(strdup(syn_dir));
		rmdir(syn_root);
	}
	return 0;
}

static int start(void **state)
{
	return have_gpu ? start_daemon(NULL) : 0;
}

static int start_ipc(void **state)
{
	return have_gpu ? start_daemon("ipc") : 0;
}

static int stop(void **state)
{
	if (!have_gpu)
		return 0;
	return h_daemon_stop_clean(&daemon_);
}

#define NEED_GPU()             \
	do {                   \
		if (!have_gpu) \
			skip(); \
	} while (0)

static struct radiance *connect_load(const char *dir, uint32_t *id)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 60000;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	if (radiance_load_model(r, dir, NULL, id) < 0)
		fail_msg("load %s: %s", dir, radiance_error_message(r));
	return r;
}

static struct radiance_gpu_model *map(struct radiance *r, uint32_t id)
{
	struct radiance_gpu_options o = RADIANCE_GPU_OPTIONS_INIT;
	o.max_rows = MAX_ROWS;
	struct radiance_gpu_model *g = NULL;
	if (radiance_gpu_map(r, id, &o, &g) < 0)
		fail_msg("map model %u: %s", id, radiance_gpu_error_message());
	return g;
}

/* x [m][k] random of dtype dt; the CPU reference of layer l into ref. */
static void reference(const struct radiance_layer *l, const uint16_t *x, enum radiance_dtype dt, uint32_t m,
		      uint16_t *ref)
{
	if (l->kind == RADIANCE_LAYER_BF16) {
		radiance_cpu_bf16(x, dt, m, l->weight, l->bias, l->n, l->k, ref);
		return;
	}
	void *scr = aligned_alloc(64, (radiance_cpu_w4a8_scratch_bytes(m, l->k) + 63) & ~(size_t)63);
	assert_non_null(scr);
	radiance_cpu_w4a8(x, dt, m, l->qweight, l->scales, l->bias, l->n, l->k, ref, scr);
	free(scr);
}

static void fill(uint16_t *x, size_t n, enum radiance_dtype dt)
{
	float mag = ldexpf(1.0f, (int)(rnd() % 12) - 6);
	for (size_t i = 0; i < n; i++)
		x[i] = to_dtype(nrand() * mag, dt);
}

/* y rows are poisoned with this quiet-NaN bf16 before a call; the guard row
 * after the last one must still hold it afterwards. */
#define POISON 0x7FC1

static void poison(uint16_t *y, size_t count)
{
	for (size_t i = 0; i < count; i++)
		y[i] = POISON;
}

/* -1 when the call wrote into the guard row m of y [m + 1][n], else 0. */
static int guard_touched(const uint16_t *y, uint32_t m, uint32_t n)
{
	for (size_t i = (size_t)m * n; i < (size_t)(m + 1) * n; i++)
		if (y[i] != POISON)
			return -1;
	return 0;
}

/* Runs layer li of g on m rows through the mapping (path forced or AUTO);
 * y gets m rows; the guard row after them must stay poisoned. */
static int run_mapped(struct radiance_gpu_model *g, uint32_t li, const struct radiance_layer *l, const uint16_t *x,
		      enum radiance_dtype dt, uint32_t m, uint16_t *y, enum radiance__w4a8_path force,
		      const char **path)
{
	const size_t ybytes = (size_t)(m + 1) * l->n * 2;
	poison(y, (size_t)(m + 1) * l->n);
	assert_int_equal(radiance__gpu_h2d_async(dx, x, (size_t)m * l->k * 2, stream), 0);
	assert_int_equal(radiance__gpu_h2d_async(dy, y, ybytes, stream), 0);
	int rc = radiance__gpu_model_run(g, li, dx, dy, m, (enum radiance_elem)dt, stream, force, path);
	if (rc)
		fail_msg("layer %s m=%u: %s", l->name, m, radiance_gpu_error_message());
	assert_int_equal(radiance__gpu_d2h_async(y, dy, ybytes, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
	return guard_touched(y, m, l->n);
}

/* A session with both models loaded and mapped (MiniLM and the synthetic
 * one), as most tests here use them. */
struct both {
	struct radiance *r;
	uint32_t id_m, id_s;
	struct radiance_gpu_model *gm, *gs;
};

static void both_open(struct both *b)
{
	b->r = connect_load(minilm_dir, &b->id_m);
	assert_int_equal(radiance_load_model(b->r, syn_dir, NULL, &b->id_s), 0);
	b->gm = map(b->r, b->id_m);
	b->gs = map(b->r, b->id_s);
}

static void both_close(struct both *b)
{
	assert_int_equal(radiance_gpu_unmap(b->r, b->gm), 0);
	assert_int_equal(radiance_gpu_unmap(b->r, b->gs), 0);
	radiance_disconnect(b->r);
}

/* ---- every path ---- */

static size_t check_model(struct radiance_gpu_model *g, const struct radiance_model *model, size_t *checked)
{
	static const uint32_t ms[] = { 1, 3, 8, 16, 17, 33, 64, 65, 128, 300 };
	size_t failed = 0;
	uint16_t *x = malloc((size_t)MAX_ROWS * 4096 * 2), *y = malloc((size_t)(MAX_ROWS + 1) * 1536 * 2);
	uint16_t *ref = malloc((size_t)MAX_ROWS * 1536 * 2);
	for (uint32_t li = 0; li < model->n_layers; li++) {
		const struct radiance_layer *l = &model->layers[li];
		for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
			const uint32_t m = ms[mi];
			const enum radiance_dtype dt = ((li + mi) & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
			fill(x, (size_t)m * l->k, dt);
			reference(l, x, dt, m, ref);
			enum radiance__w4a8_path paths[4] = { RADIANCE_W4A8_AUTO, RADIANCE_W4A8_AUTO, RADIANCE_W4A8_AUTO,
							      RADIANCE_W4A8_AUTO };
			size_t np = 1;
			if (l->kind == RADIANCE_LAYER_W4A8 && (m == 1 || m == 65))
				paths[np++] = RADIANCE_W4A8_PORTABLE;
			if (l->kind == RADIANCE_LAYER_W4A8 && dev.wgmma && (m == 128 || m == 300)) {
				paths[np++] = RADIANCE_W4A8_WGMMA;
				paths[np++] = RADIANCE_W4A8_WGMMA_EXACT;
			}
			for (size_t pi = 0; pi < np; pi++) {
				const char *path = "";
				char what[400];
				int guard = run_mapped(g, li, l, x, dt, m, y, paths[pi], &path);
				snprintf(what, sizeof what, "mapped %s (%ux%u) m=%u %s %s", l->name, l->n, l->k, m,
					 dt == RADIANCE_DTYPE_FP16 ? "fp16" : "bf16", path);
				if (guard)
					printf("# %s: rows past m were written  <-- FAIL\n", what);
				failed += guard != 0 || compare(what, y, ref, m, l->n, paths[pi] == RADIANCE_W4A8_PORTABLE);
				(*checked)++;
			}
		}
	}
	free(x);
	free(y);
	free(ref);
	return failed;
}

static void every_path(void **state)
{
	NEED_GPU();
	struct both b;
	both_open(&b);
	struct radiance_gpu_info info;
	radiance_gpu_get_info(b.gm, &info);
	printf("# mapped MiniLM: %s, read-only %d, %llu bytes mapped, %llu bytes of scratch, %zu layers\n",
	       info.handle, info.read_only, (unsigned long long)info.mapped_bytes,
	       (unsigned long long)info.scratch_bytes, info.n_layers);
	assert_string_equal(info.handle, "vmm");
	assert_true(info.read_only);
	size_t checked = 0, failed = check_model(b.gm, minilm, &checked) + check_model(b.gs, syn, &checked);
	printf("# %zu mapped launches checked against the CPU reference, %zu out of tolerance\n", checked, failed);
	assert_int_equal(failed, 0);
	both_close(&b);
}

/* ---- the same bits as the daemon ---- */

static size_t same_as_rings(struct radiance *r, uint32_t id, struct radiance_gpu_model *g,
			    const struct radiance_model *model, size_t *checked)
{
	static const uint32_t ms[] = { 1, 16, 17, 100 };
	size_t differ = 0;
	uint16_t *x = malloc((size_t)100 * 4096 * 2), *y = malloc((size_t)101 * 1536 * 2);
	uint16_t *yr = malloc((size_t)100 * 1536 * 2);
	for (uint32_t li = 0; li < model->n_layers; li++) {
		const struct radiance_layer *l = &model->layers[li];
		for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
			const uint32_t m = ms[mi];
			const enum radiance_dtype dt = (mi & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
			fill(x, (size_t)m * l->k, dt);
			assert_int_equal(run_mapped(g, li, l, x, dt, m, y, RADIANCE_W4A8_AUTO, NULL), 0);
			if (radiance_linear(r, id, li, m, (enum radiance_elem)dt, x, yr) < 0)
				fail_msg("rings %s: %s", l->name, radiance_error_message(r));
			if (memcmp(y, yr, (size_t)m * l->n * 2) != 0) {
				printf("# %s m=%u: mapped and rings results differ  <-- FAIL\n", l->name, m);
				differ++;
			}
			(*checked)++;
		}
	}
	free(x);
	free(y);
	free(yr);
	return differ;
}

static void same_bits_as_daemon(void **state)
{
	NEED_GPU();
	struct both b;
	both_open(&b);
	size_t checked = 0;
	size_t differ = same_as_rings(b.r, b.id_m, b.gm, minilm, &checked) + same_as_rings(b.r, b.id_s, b.gs, syn, &checked);
	printf("# %zu requests: mapped == rings bit for bit in %zu\n", checked, checked - differ);
	assert_int_equal(differ, 0);
	both_close(&b);
}

/* ---- activations quantized by the caller (radiance_gpu_linear_fp8) ---- */

/* Layer li of g on the caller's codes and scales: y gets m rows, the guard
 * row after them must stay poisoned. */
static int run_fp8(struct radiance_gpu_model *g, uint32_t li, const struct radiance_layer *l, const uint8_t *codes,
		   const float *s, uint32_t m, uint8_t *dcodes, float *dscales, uint16_t *y)
{
	const size_t ybytes = (size_t)(m + 1) * l->n * 2;
	poison(y, (size_t)(m + 1) * l->n);
	assert_int_equal(radiance__gpu_h2d_async(dcodes, codes, (size_t)m * l->k, stream), 0);
	assert_int_equal(radiance__gpu_h2d_async(dscales, s, (size_t)m * 4, stream), 0);
	assert_int_equal(radiance__gpu_h2d_async(dy, y, ybytes, stream), 0);
	if (radiance_gpu_linear_fp8(g, li, dcodes, dscales, dy, m, stream) != 0)
		fail_msg("fp8 layer %s m=%u: %s", l->name, m, radiance_gpu_error_message());
	assert_int_equal(radiance__gpu_d2h_async(y, dy, ybytes, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
	return guard_touched(y, m, l->n);
}

/* Every W4A8 layer of model at M across the decode band and prefill:
 * (1) the codes and scales of x made here by the CPU quant give y bit for
 * bit as radiance_gpu_linear(x); (2) codes made from no x at all (random
 * e4m3 but NaN, random scales) against the CPU GEMM on the same codes. */
static size_t fp8_model(struct radiance_gpu_model *g, const struct radiance_model *model, uint8_t *dcodes,
			float *dscales, size_t *checked)
{
	/* 32/33: the last natural-order wgmma-free count and the first reordered one on sm_90a */
	static const uint32_t ms[] = { 1, 16, 17, 32, 33, 64, 100, 300 };
	size_t failed = 0;
	uint16_t *x = malloc((size_t)MAX_ROWS * 4096 * 2), *y = malloc((size_t)(MAX_ROWS + 1) * 1536 * 2);
	uint16_t *yx = malloc((size_t)(MAX_ROWS + 1) * 1536 * 2), *ref = malloc((size_t)MAX_ROWS * 1536 * 2);
	uint8_t *codes = malloc((size_t)MAX_ROWS * 4096);
	float *s = malloc(MAX_ROWS * sizeof(float));
	for (uint32_t li = 0; li < model->n_layers; li++) {
		const struct radiance_layer *l = &model->layers[li];
		if (l->kind != RADIANCE_LAYER_W4A8)
			continue;
		for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
			const uint32_t m = ms[mi];
			const enum radiance_dtype dt = ((li + mi) & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
			const char *path = "";
			char what[400];
			fill(x, (size_t)m * l->k, dt);
			for (uint32_t t = 0; t < m; t++)
				s[t] = radiance_quant_row_e4m3(x + (size_t)t * l->k, dt, l->k, codes + (size_t)t * l->k);
			int guard = run_mapped(g, li, l, x, dt, m, yx, RADIANCE_W4A8_AUTO, &path);
			guard |= run_fp8(g, li, l, codes, s, m, dcodes, dscales, y);
			const int same = memcmp(y, yx, (size_t)m * l->n * 2) == 0;
			if (guard || !same)
				printf("# fp8 %s (%ux%u) m=%u %s: %s  <-- FAIL\n", l->name, l->n, l->k, m, path,
				       guard ? "rows past m were written" : "y differs from radiance_gpu_linear's");
			failed += guard || !same;
			for (size_t i = 0; i < (size_t)m * l->k; i++) {
				const uint8_t c = (uint8_t)rnd();
				codes[i] = (c & 0x7F) == 0x7F ? 0 : c;   /* e4m3 NaN: 0x7F, 0xFF */
			}
			for (uint32_t t = 0; t < m; t++)
				s[t] = ldexpf(1.0f + frand(), -2 - (int)(rnd() % 8));
			radiance_cpu_w4a8_gemm(codes, s, m, l->qweight, l->scales, l->bias, l->n, l->k, ref);
			guard = run_fp8(g, li, l, codes, s, m, dcodes, dscales, y);
			snprintf(what, sizeof what, "fp8 random codes %s (%ux%u) m=%u %s", l->name, l->n, l->k, m, path);
			if (guard)
				printf("# %s: rows past m were written  <-- FAIL\n", what);
			failed += guard != 0 || compare(what, y, ref, m, l->n, 0) != 0;
			*checked += 2;
		}
	}
	free(x);
	free(y);
	free(yx);
	free(ref);
	free(codes);
	free(s);
	return failed;
}

static void fp8_codes(void **state)
{
	NEED_GPU();
	struct both b;
	both_open(&b);
	uint8_t *dcodes = NULL;
	float *dscales = NULL;
	assert_int_equal(radiance__gpu_malloc((void **)&dcodes, (size_t)MAX_ROWS * 4096), 0);
	assert_int_equal(radiance__gpu_malloc((void **)&dscales, MAX_ROWS * sizeof(float)), 0);
	size_t checked = 0;
	size_t failed = fp8_model(b.gm, minilm, dcodes, dscales, &checked) + fp8_model(b.gs, syn, dcodes, dscales, &checked);
	printf("# radiance_gpu_linear_fp8: %zu launches checked, %zu failed\n", checked, failed);
	assert_int_equal(failed, 0);
	/* its argument errors, before anything is enqueued */
	uint32_t bf16_layer = UINT32_MAX;
	for (uint32_t li = 0; li < minilm->n_layers && bf16_layer == UINT32_MAX; li++)
		if (minilm->layers[li].kind == RADIANCE_LAYER_BF16)
			bf16_layer = li;
	assert_int_not_equal(bf16_layer, UINT32_MAX);
	assert_int_equal(radiance_gpu_linear_fp8(b.gm, bf16_layer, dcodes, dscales, dy, 1, stream), -EINVAL);
	assert_non_null(strstr(radiance_gpu_error_message(), "bf16 layer"));
	assert_int_equal(radiance_gpu_linear_fp8(b.gm, 0, dcodes + 8, dscales, dy, 1, stream), -EINVAL);
	assert_int_equal(radiance_gpu_linear_fp8(b.gm, 0, dcodes, (const float *)((uint8_t *)dscales + 2), dy, 1, stream),
			 -EINVAL);
	assert_int_equal(radiance_gpu_linear_fp8(b.gm, 0, dcodes, dscales, dy, 0, stream), -EINVAL);
	assert_int_equal(radiance_gpu_linear_fp8(b.gm, 0, dcodes, dscales, dy, MAX_ROWS + 1, stream), -E2BIG);
	assert_int_equal(radiance_gpu_linear_fp8(b.gm, (uint32_t)minilm->n_layers, dcodes, dscales, dy, 1, stream),
			 -ENOENT);
	radiance__gpu_free(dcodes);
	radiance__gpu_free(dscales);
	both_close(&b);
}

/* ---- several layers on one x (radiance_gpu_linear_multi) ---- */

/* Up to 3 layers of model sharing the K of its first W4A8 layer (and a
 * bf16 layer of that K where the model has one, in a second group): the
 * multi call's y[j] against radiance_gpu_linear of layer j, bit for bit. */
static size_t multi_model(struct radiance_gpu_model *g, const struct radiance_model *model, void *const *dys,
			  size_t *checked)
{
	/* 32/33: the last count where the quant is shared on sm_90a and the first where it is not */
	static const uint32_t ms[] = { 1, 16, 17, 32, 33, 64, 100, 300 };
	uint32_t w4[3] = { 0, 0, 0 }, nw4 = 0, bf = UINT32_MAX, k = 0;
	/* the first K that two W4A8 layers share */
	for (uint32_t a = 0; a < model->n_layers && nw4 < 2; a++) {
		if (model->layers[a].kind != RADIANCE_LAYER_W4A8)
			continue;
		k = model->layers[a].k;
		nw4 = 0;
		for (uint32_t li = a; li < model->n_layers && nw4 < 3; li++)
			if (model->layers[li].kind == RADIANCE_LAYER_W4A8 && model->layers[li].k == k)
				w4[nw4++] = li;
	}
	if (nw4 < 2) {
		printf("# multi: no two W4A8 layers of one K in %u layers: nothing to check\n", (unsigned)model->n_layers);
		return 0;
	}
	for (uint32_t li = 0; li < model->n_layers && bf == UINT32_MAX; li++)
		if (model->layers[li].kind == RADIANCE_LAYER_BF16 && model->layers[li].k == k)
			bf = li;
	const uint32_t groups[2][3] = { { w4[0], w4[1], nw4 > 2 ? w4[2] : w4[0] }, { w4[1], bf, w4[0] } };
	const uint32_t counts[2] = { nw4 > 2 ? 3u : 2u, bf == UINT32_MAX ? 0u : 3u };
	size_t failed = 0;
	uint16_t *x = malloc((size_t)MAX_ROWS * k * 2), *y = malloc((size_t)(MAX_ROWS + 1) * 1536 * 2);
	uint16_t *ym = malloc((size_t)(MAX_ROWS + 1) * 1536 * 2);
	for (int gi = 0; gi < 2; gi++)
		for (size_t mi = 0; mi < sizeof ms / sizeof ms[0] && counts[gi]; mi++) {
			const uint32_t m = ms[mi], nl = counts[gi];
			const enum radiance_dtype dt = (mi & 1) ? RADIANCE_DTYPE_FP16 : RADIANCE_DTYPE_BF16;
			fill(x, (size_t)m * k, dt);
			assert_int_equal(radiance__gpu_h2d_async(dx, x, (size_t)m * k * 2, stream), 0);
			/* every y poisoned, its guard row (row m) included */
			poison(ym, (size_t)(m + 1) * 1536);
			for (uint32_t j = 0; j < nl; j++)
				assert_int_equal(radiance__gpu_h2d_async(dys[j], ym, (size_t)(m + 1) * 1536 * 2, stream), 0);
			if (radiance_gpu_linear_multi(g, groups[gi], nl, dx, dys, m, (enum radiance_elem)dt, stream) != 0)
				fail_msg("multi m=%u: %s", m, radiance_gpu_error_message());
			for (uint32_t j = 0; j < nl; j++) {
				const struct radiance_layer *l = &model->layers[groups[gi][j]];
				assert_int_equal(radiance__gpu_d2h_async(ym, dys[j], (size_t)(m + 1) * l->n * 2, stream), 0);
				assert_int_equal(radiance__gpu_stream_sync(stream), 0);
				const int touched = guard_touched(ym, m, l->n);
				const char *path = "";
				const int guard = run_mapped(g, groups[gi][j], l, x, dt, m, y, RADIANCE_W4A8_AUTO, &path);
				const int same = memcmp(y, ym, (size_t)m * l->n * 2) == 0;
				if (guard || touched || !same)
					printf("# multi %s (%ux%u) m=%u %s, layer %u of %u: %s  <-- FAIL\n", l->name, l->n,
					       l->k, m, path, j, nl,
					       guard || touched ? "rows past m were written"
								: "y differs from radiance_gpu_linear's");
				failed += guard || touched || !same;
				(*checked)++;
			}
		}
	free(x);
	free(y);
	free(ym);
	return failed;
}

static void multi_layers(void **state)
{
	NEED_GPU();
	struct both b;
	both_open(&b);
	void *dys[3];
	for (int j = 0; j < 3; j++)
		assert_int_equal(radiance__gpu_malloc(&dys[j], (size_t)(MAX_ROWS + 1) * 1536 * 2), 0);
	size_t checked = 0;
	size_t failed = multi_model(b.gm, minilm, dys, &checked) + multi_model(b.gs, syn, dys, &checked);
	printf("# radiance_gpu_linear_multi: %zu outputs checked, %zu failed\n", checked, failed);
	assert_int_equal(failed, 0);
	for (int j = 0; j < 3; j++)
		radiance__gpu_free(dys[j]);
	both_close(&b);
}

/* ---- CUDA graphs ---- */

static void graph_capture(void **state)
{
	NEED_GPU();
	uint32_t id;
	struct radiance *r = connect_load(minilm_dir, &id);
	struct radiance_gpu_model *g = map(r, id);
	/* three layers of one block in a row, the way an engine's step runs:
	 * x -> query, x -> intermediate (1536), that -> output (384) */
	const int q = radiance_find_layer(radiance_held_model(r, id), "encoder.layer.0.attention.self.query");
	const int up = radiance_find_layer(radiance_held_model(r, id), "encoder.layer.0.intermediate.dense");
	const int down = radiance_find_layer(radiance_held_model(r, id), "encoder.layer.0.output.dense");
	assert_true(q >= 0 && up >= 0 && down >= 0);
	const uint32_t m = 4;
	void *dq, *dmid, *dout;
	assert_int_equal(radiance__gpu_malloc(&dq, (size_t)m * 384 * 2), 0);
	assert_int_equal(radiance__gpu_malloc(&dmid, (size_t)m * 1536 * 2), 0);
	assert_int_equal(radiance__gpu_malloc(&dout, (size_t)m * 384 * 2), 0);
	uint16_t x[4 * 384], want[3][4 * 1536], got[3][4 * 1536];
	void *outs[3] = { dq, dmid, dout };
	const size_t outn[3] = { 384, 1536, 384 };
#define STEP()                                                                                          \
	do {                                                                                            \
		assert_int_equal(radiance_gpu_linear(g, (uint32_t)q, dx, dq, m, RADIANCE_BF16, stream), 0);    \
		assert_int_equal(radiance_gpu_linear(g, (uint32_t)up, dx, dmid, m, RADIANCE_BF16, stream), 0); \
		assert_int_equal(radiance_gpu_linear(g, (uint32_t)down, dmid, dout, m, RADIANCE_BF16, stream), 0); \
	} while (0)
	void *exec = NULL;
	assert_int_equal(radiance__gpu_graph_begin(stream), 0);
	STEP();
	if (radiance__gpu_graph_end(stream, &exec) != 0)
		fail_msg("capture: %s", radiance__gpu_last_error());
	for (int round = 0; round < 2; round++) {
		fill(x, sizeof x / 2, RADIANCE_DTYPE_BF16);
		assert_int_equal(radiance__gpu_h2d_async(dx, x, sizeof x, stream), 0);
		STEP();
		for (int i = 0; i < 3; i++)
			assert_int_equal(radiance__gpu_d2h_async(want[i], outs[i], m * outn[i] * 2, stream), 0);
		assert_int_equal(radiance__gpu_memset_async(dout, 0xFF, m * 384 * 2, stream), 0);
		assert_int_equal(radiance__gpu_graph_launch(exec, stream), 0);
		for (int i = 0; i < 3; i++)
			assert_int_equal(radiance__gpu_d2h_async(got[i], outs[i], m * outn[i] * 2, stream), 0);
		assert_int_equal(radiance__gpu_stream_sync(stream), 0);
		for (int i = 0; i < 3; i++)
			assert_memory_equal(got[i], want[i], m * outn[i] * 2);
	}
#undef STEP
	printf("# three mapped layer calls captured in a graph: replayed twice, the same bits as direct calls\n");
	radiance__gpu_graph_destroy(exec);
	radiance__gpu_free(dq);
	radiance__gpu_free(dmid);
	radiance__gpu_free(dout);
	radiance_gpu_unmap(r, g);
	radiance_disconnect(r);
}

/* ---- read-only ---- */

/* In a process of its own (the CUDA context of a faulting process is lost):
 * maps MiniLM and tries to write layer 0's weights, first with a memset,
 * then from a kernel (the quant kernel, told to put its codes there).
 * Exit 0: both writes failed; 1: one went through; 2: could not try. */
static int write_probe(const char *socket, const char *dir)
{
	struct radiance *r = radiance_connect(socket, NULL);
	uint32_t id;
	if (!r || radiance_load_model(r, dir, NULL, &id) < 0)
		return 2;
	struct radiance_gpu_model *g = NULL;
	if (radiance_gpu_map(r, id, NULL, &g) < 0) {
		fprintf(stderr, "write probe: map: %s\n", radiance_gpu_error_message());
		return 2;
	}
	uint8_t *w = (uint8_t *)radiance__gpu_model_layer(g, 0)->w;
	int rc = radiance__gpu_memset_async(w, 0x55, 4096, NULL);
	if (rc == 0)
		rc = radiance__gpu_stream_sync(NULL);
	fprintf(stderr, "write probe: memset on the mapped weights: %s\n", rc ? radiance__gpu_last_error() : "succeeded");
	if (rc == 0)
		_exit(1);
	radiance__gpu_check_launch("the memset's error");   /* taken: the kernel's own comes next */
	void *x;
	uint16_t ones[384];
	for (int i = 0; i < 384; i++)
		ones[i] = 0x3F80;
	if (radiance__gpu_malloc(&x, sizeof ones) || radiance__gpu_h2d_async(x, ones, sizeof ones, NULL) ||
	    radiance__gpu_stream_sync(NULL))
		_exit(2);
	rc = radiance__gpu_quant(x, RADIANCE_DTYPE_BF16, 1, 384, RADIANCE_CODES_NATURAL, w, (float *)(void *)(w + 1024),
				 NULL);
	if (rc == 0)
		rc = radiance__gpu_stream_sync(NULL);
	fprintf(stderr, "write probe: a kernel writing the mapped weights: %s\n",
		rc ? radiance__gpu_last_error() : "succeeded");
	_exit(rc ? 0 : 1);   /* no unmap: the context may be gone */
}

static void read_only(void **state)
{
	NEED_GPU();
	uint32_t id;
	struct radiance *r = connect_load(minilm_dir, &id);
	const struct radiance_layer *l = &minilm->layers[0];
	const uint32_t m = 5;
	uint16_t x[5 * 384], before[5 * 384], after[5 * 384], ref[5 * 384];
	fill(x, (size_t)m * l->k, RADIANCE_DTYPE_BF16);
	assert_int_equal(radiance_linear(r, id, 0, m, RADIANCE_BF16, x, before), 0);

	char log[128];
	snprintf(log, sizeof log, "%s/write-probe.log", daemon_.dir);
	const char *args[] = { self_exe, "--write-probe", daemon_.socket, minilm_dir, NULL };
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		if (!freopen(log, "w", stderr))
			_exit(3);
		execv(self_exe, (char *const *)args);
		_exit(3);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	h_show_file(log);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* the daemon serves on, with the weights it had */
	assert_int_equal(radiance_linear(r, id, 0, m, RADIANCE_BF16, x, after), 0);
	assert_memory_equal(before, after, sizeof before[0] * m * l->n);
	reference(l, x, RADIANCE_DTYPE_BF16, m, ref);
	assert_int_equal(compare("rings after the write probe", after, ref, m, l->n, 0), 0);
	radiance_disconnect(r);
}

/* ---- lifetime and arguments ---- */

static void lifetime_and_errors(void **state)
{
	NEED_GPU();
	uint32_t id;
	struct radiance *r = connect_load(minilm_dir, &id);
	struct radiance_gpu_model *g = map(r, id);
	assert_int_equal(radiance_release_model(r, id), -EBUSY);
	assert_int_equal(radiance_gpu_linear(g, 37, dx, dy, 1, RADIANCE_BF16, stream), -ENOENT);
	assert_int_equal(radiance_gpu_linear(g, 0, dx, dy, 0, RADIANCE_BF16, stream), -EINVAL);
	assert_int_equal(radiance_gpu_linear(g, 0, dx, dy, MAX_ROWS + 1, RADIANCE_BF16, stream), -E2BIG);
	assert_non_null(strstr(radiance_gpu_error_message(), "max_rows"));
	assert_int_equal(radiance_gpu_linear(g, 0, (uint8_t *)dx + 2, dy, 1, RADIANCE_BF16, stream), -EINVAL);
	assert_int_equal(radiance_gpu_linear(g, 0, dx, dy, 1, (enum radiance_elem)7, stream), -EINVAL);
	/* nothing of that reached the device: a real call still works */
	assert_int_equal(radiance_gpu_linear(g, 0, dx, dy, 1, RADIANCE_BF16, stream), 0);
	assert_int_equal(radiance__gpu_stream_sync(stream), 0);
	assert_int_equal(radiance_gpu_unmap(r, g), 0);
	assert_int_equal(radiance_release_model(r, id), 0);
	/* a model not held: the daemon says so */
	struct radiance_gpu_model *none = NULL;
	assert_int_equal(radiance_gpu_map(r, id, NULL, &none), -ENOENT);
	assert_null(none);
	radiance_disconnect(r);
}

/* ---- legacy IPC ---- */

static void ipc_path(void **state)
{
	NEED_GPU();
	uint32_t id;
	struct radiance *r = connect_load(syn_dir, &id);
	struct radiance_gpu_model *g = map(r, id);
	struct radiance_gpu_info info;
	radiance_gpu_get_info(g, &info);
	assert_string_equal(info.handle, "ipc");
	assert_false(info.read_only);   /* IPC has no read-only mode */
	size_t checked = 0;
	assert_int_equal(check_model(g, syn, &checked), 0);
	printf("# IPC handle: %zu mapped launches within tolerance\n", checked);
	radiance_gpu_unmap(r, g);
	radiance_disconnect(r);
}

int main(int argc, char **argv)
{
	self_exe = argv[0];
	if (argc == 4 && strcmp(argv[1], "--write-probe") == 0)
		return write_probe(argv[2], argv[3]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(every_path, start, stop),
		cmocka_unit_test_setup_teardown(same_bits_as_daemon, start, stop),
		cmocka_unit_test_setup_teardown(fp8_codes, start, stop),
		cmocka_unit_test_setup_teardown(multi_layers, start, stop),
		cmocka_unit_test_setup_teardown(graph_capture, start, stop),
		cmocka_unit_test_setup_teardown(read_only, start, stop),
		cmocka_unit_test_setup_teardown(lifetime_and_errors, start, stop),
		cmocka_unit_test_setup_teardown(ipc_path, start_ipc, stop),
	};
	/* RADIANCE_TEST_FILTER: only the tests whose names match (as test_gpu) */
	if (getenv("RADIANCE_TEST_FILTER"))
		cmocka_set_test_filter(getenv("RADIANCE_TEST_FILTER"));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

#else /* CPU-only build */

static void needs_gpu_build(void **state)
{
	printf("# this build has no GPU backend (build with make GPU=cuda or GPU=hip): skipped\n");
	skip();
}

int main(void)
{
	const struct CMUnitTest tests[] = { cmocka_unit_test(needs_gpu_build) };
	return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
