/*
 * The CPU backend: the numerics of kernels/numerics.h serving real requests
 * on the fast path of kernels/cpu_fast.h (SIMD level picked once at create,
 * a pool of compute threads), which is bit-exact with the scalar reference
 * kernels/w4a8_cpu.c for W4A8 layers. Weights stay in the loader's canonical
 * host layout, so a layer "upload" is a handle onto the model's arrays. The
 * only memory it owns is the activation scratch, sized once at create for
 * max_rows x max_k, and the pool.
 *
 * It has no device memory to share: MapModel is refused. For tests of the
 * protocol and the fd passing on machines without a GPU, RADIANCE_FAKE_SHARE=1
 * makes it copy each model's canonical arrays into one sealed memfd laid out
 * as proto/map.h says (MAP_HANDLE_TEST_MEMFD); it still computes from the
 * model's own arrays.
 */
#include "backend_impl.h"
#include "cpu_fast.h"
#include "cpu_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define TEST_SHARE_GRANULARITY 4096u

#include "io.h"
#include "log.h"
#include "shm.h"

struct cpu_state {
	struct radiance_cpu_fast *fast;
	uint32_t max_k;
	char cpu_model[128];
	int fake_share;           /* options' fake_share (RADIANCE_FAKE_SHARE=1) */
	uint32_t pin_delay_us;    /* options' test_pin_delay_us */
};

struct radiance_backend_layer {
	const struct radiance_layer *layer;
};

static int cpu_create(const struct radiance_backend_options *opt, void **state, char *err,
		      size_t errlen)
{
	struct cpu_state *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "cpu backend: out of memory");
		return -ENOMEM;
	}
	s->max_k = opt->max_k ? opt->max_k : RADIANCE_GROUP_SIZE;
	struct radiance_cpu_fast_options fo = {
		.threads = opt->cpu_threads,
		.simd = opt->cpu_simd == 1   ? RADIANCE_CPU_SIMD_SCALAR
			: opt->cpu_simd == 2 ? RADIANCE_CPU_SIMD_AVX2
			: opt->cpu_simd == 3 ? RADIANCE_CPU_SIMD_AVX2_INT16
			: opt->cpu_simd == 4 ? RADIANCE_CPU_SIMD_AVX512
			: opt->cpu_simd == 5 ? RADIANCE_CPU_SIMD_NEON
					      : RADIANCE_CPU_SIMD_AUTO,
		.max_rows = opt->max_rows,
		.max_k = s->max_k,
	};
	int rc = radiance_cpu_fast_create(&fo, &s->fast, err, errlen);
	if (rc < 0) {
		free(s);
		return rc;
	}
	radiance_cpu_model_name(s->cpu_model, sizeof s->cpu_model);
	const char *why;
	unsigned usable = radiance_cpu_usable_threads(&why);
	if (opt->cpu_threads > usable)
		log_warn("cpu_threads %u is more than the %u CPUs this process may run on (%s): "
			 "the threads will share them", opt->cpu_threads, usable, why);
	log_info("cpu backend: %s kernels, %u compute threads (%s; --cpu-threads sets it)",
		 radiance_cpu_simd_name(radiance_cpu_fast_simd(s->fast)),
		 radiance_cpu_fast_threads(s->fast), radiance_cpu_fast_threads_source(s->fast));
	if (*radiance_cpu_fast_simd_note(s->fast))
		log_warn("cpu backend: %s", radiance_cpu_fast_simd_note(s->fast));
	s->fake_share = opt->fake_share != 0;
	s->pin_delay_us = opt->test_pin_delay_us;
	*state = s;
	return 0;
}

static void cpu_destroy(void *state)
{
	struct cpu_state *s = state;
	if (!s)
		return;
	radiance_cpu_fast_destroy(s->fast);
	free(s);
}

static void cpu_info(void *state, struct radiance_backend_info *info)
{
	struct cpu_state *s = state;
	snprintf(info->name, sizeof info->name, "cpu");
	/* the SIMD level and threads travel with the device string to
	 * `radiancectl status` */
	snprintf(info->device, sizeof info->device, "%.90s (%s, %u threads)", s->cpu_model,
		 radiance_cpu_simd_name(radiance_cpu_fast_simd(s->fast)),
		 radiance_cpu_fast_threads(s->fast));
	info->scratch_bytes = radiance_cpu_fast_scratch_bytes(s->fast);
	snprintf(info->share, sizeof info->share, "%s", s->fake_share ? "test-memfd" : "none");
	snprintf(info->share_why, sizeof info->share_why, "%s",
		 s->fake_share ? "fake_share = 1: a memfd of host arrays, for tests"
			       : "the cpu backend computes from host memory: there is no device "
				 "memory to map (run radianced --backend gpu, built with GPU=cuda "
				 "or GPU=hip)");
}

static int cpu_layer_upload(void *state, const struct radiance_layer *l,
			    struct radiance_backend_layer **out, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	/* the scratch is sized for max_k (backend.c checks the option; this
	 * is the CPU's own default when the option is 0) */
	if (l->k > s->max_k) {
		snprintf(err, errlen, "layer %s: K=%u exceeds the backend's max_k=%u", l->name, l->k,
			 s->max_k);
		return -E2BIG;
	}
	struct radiance_backend_layer *h = calloc(1, sizeof *h);
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	h->layer = l;
	*out = h;
	return 0;
}

static void cpu_layer_free(void *state, struct radiance_backend_layer *h)
{
	free(h);
}

/* ---- the test memfd (RADIANCE_FAKE_SHARE=1) ---- */

static void canonical_sizes(const struct radiance_layer *l, uint64_t *weight, uint64_t *scales)
{
	*weight = (uint64_t)l->n * (l->k / 8) * 4;
	*scales = (uint64_t)l->n * (l->k / RADIANCE_GROUP_SIZE) * 2;
}

static void cpu_share_destroy(void *state, struct radiance_backend_share *sh)
{
	if (sh->fd >= 0)
		close(sh->fd);
	free(sh->layers);
	free(sh);
}

static void pin_delay(const struct cpu_state *s);

static int cpu_share_create(void *state, const struct radiance_model *m,
			    struct radiance_backend_share **out, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	uint64_t total;
	if (!s->fake_share)
		return 0;
	pin_delay(s);   /* as a GPU's allocation of a model, beside registrations, can take */
	struct radiance_backend_share *sh = calloc(1, sizeof *sh);
	if (!sh || radiance__backend_share_layout(sh, m, canonical_sizes, &total) < 0) {
		free(sh);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	sh->fd = -1;
	sh->handle = RADIANCE_SHARE_HANDLE_TEST_MEMFD;
	sh->granularity = TEST_SHARE_GRANULARITY;
	sh->bytes = (total + TEST_SHARE_GRANULARITY - 1) / TEST_SHARE_GRANULARITY * TEST_SHARE_GRANULARITY;
	if (sh->bytes == 0)
		sh->bytes = TEST_SHARE_GRANULARITY;
	snprintf(sh->vendor, sizeof sh->vendor, "cpu");
	snprintf(sh->layout, sizeof sh->layout, "canonical host arrays (daemon/model.h), test memfd");
	sh->fd = memfd_create("radiance-test-share", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (sh->fd < 0 || ftruncate(sh->fd, (off_t)sh->bytes) < 0) {
		int e = errno;
		snprintf(err, errlen, "test share memfd of %llu bytes: %s", (unsigned long long)sh->bytes,
			 strerror(e));
		cpu_share_destroy(state, sh);
		return -e;
	}
	*out = sh;
	return 0;
}

static int cpu_layer_upload_into(void *state, struct radiance_backend_share *sh, size_t index,
				 const struct radiance_layer *l, struct radiance_backend_layer **out,
				 char *err, size_t errlen)
{
	const struct radiance_share_layer *sl = &sh->layers[index];
	int rc = l->kind == RADIANCE_LAYER_W4A8
			 ? rio_pwrite_all(sh->fd, l->qweight, (size_t)sl->weight_bytes, sl->weight_offset)
			 : rio_pwrite_all(sh->fd, l->weight, (size_t)sl->weight_bytes, sl->weight_offset);
	if (!rc && sl->scales_bytes)
		rc = rio_pwrite_all(sh->fd, l->scales, (size_t)sl->scales_bytes, sl->scales_offset);
	if (!rc && sl->bias_bytes)
		rc = rio_pwrite_all(sh->fd, l->bias, (size_t)sl->bias_bytes, sl->bias_offset);
	/* the last layer is in: from now on nobody may change the bytes, the
	 * daemon included (a client's PROT_WRITE mapping is refused) */
	if (!rc && index + 1 == sh->n_layers &&
	    fcntl(sh->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
		rc = -errno;
	if (rc) {
		snprintf(err, errlen, "layer %s: writing the test share: %s", l->name, strerror(-rc));
		return rc;
	}
	return cpu_layer_upload(state, l, out, err, errlen);
}

/* Nothing to pin on the CPU; test_pin_delay_us stands in for the time a
 * GPU's page-locking takes (and, with fake_share, a model's allocation),
 * so tests can see what a slow one does to the executor. */
static void pin_delay(const struct cpu_state *s)
{
	struct timespec ts = { s->pin_delay_us / 1000000u, (long)(s->pin_delay_us % 1000000u) * 1000 };
	while (s->pin_delay_us && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int cpu_register_host(void *state, void *base, size_t len, char *err, size_t errlen)
{
	pin_delay(state);
	return 0;
}

static void cpu_unregister_host(void *state, void *base)
{
	pin_delay(state);
}

static int cpu_linear(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	for (size_t i = 0; i < nrows; i++) {
		const struct radiance_rows *r = &rows[i];
		int rc;
		if (l->kind == RADIANCE_LAYER_W4A8)
			rc = radiance_cpu_fast_w4a8(s->fast, r->x, r->dtype, r->m, l->qweight, l->scales,
						    l->bias, l->n, l->k, r->y);
		else
			rc = radiance_cpu_fast_bf16(s->fast, r->x, r->dtype, r->m, l->weight, l->bias,
						    l->n, l->k, r->y);
		if (rc < 0) {
			/* backend.c checked rows against max_rows and upload K against max_k */
			snprintf(err, errlen, "layer %s: %u rows of K=%u refused by the cpu kernels: %s",
				 l->name, r->m, l->k, strerror(-rc));
			return rc;
		}
	}
	return 0;
}

/* x quantized once per request for all its W4A8 layers; bf16 layers (which
 * widen x into the same scratch) one after another. */
static int cpu_linear_multi(void *state, const struct radiance_layer *const *l,
			    struct radiance_backend_layer *const *h, size_t nlayers,
			    const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	for (size_t i = 0; i < nrows; i++) {
		const struct radiance_rows *r = &rows[i];
		struct radiance_cpu_fast_w4a8_layer w[RADIANCE_MAX_REQUEST_LAYERS];
		size_t nw = 0;
		for (size_t j = 0; j < nlayers; j++) {
			if (l[j]->kind != RADIANCE_LAYER_W4A8) {
				int rc = cpu_linear(state, l[j], h[j], &rows[j * nrows + i], 1, err, errlen);
				if (rc < 0)
					return rc;
				continue;
			}
			if (nw == RADIANCE_MAX_REQUEST_LAYERS) {
				snprintf(err, errlen, "%zu layers in one launch: at most %u", nlayers,
					 RADIANCE_MAX_REQUEST_LAYERS);
				return -E2BIG;
			}
			w[nw++] = (struct radiance_cpu_fast_w4a8_layer){
				.qweight = l[j]->qweight, .scales = l[j]->scales, .bias = l[j]->bias,
				.n = l[j]->n, .y = rows[j * nrows + i].y,
			};
		}
		int rc = nw ? radiance_cpu_fast_w4a8_multi(s->fast, r->x, r->dtype, r->m, l[0]->k, w, nw)
			    : 0;
		if (rc < 0) {
			snprintf(err, errlen, "layer %s and %zu more: %u rows of K=%u refused by the cpu "
				 "kernels: %s", l[0]->name, nlayers - 1, r->m, l[0]->k, strerror(-rc));
			return rc;
		}
	}
	return 0;
}

/* Asynchronous only in form: the launch runs before this returns (there
 * is no device to queue on) and is done at the first look, so the
 * executor keeps one bookkeeping for both backends and CI tests the
 * asynchronous one. */
static int cpu_linear_start(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
			    const struct radiance_rows *rows, size_t nrows, uint64_t *ticket, char *err,
			    size_t errlen)
{
	*ticket = 0;
	return cpu_linear(state, l, h, rows, nrows, err, errlen);
}

static int cpu_linear_done(void *state, uint64_t ticket, char *err, size_t errlen)
{
	return 1;
}

const struct radiance_backend_ops radiance__backend_cpu_ops = {
	.name = "cpu",
	.create = cpu_create,
	.destroy = cpu_destroy,
	.info = cpu_info,
	.layer_upload = cpu_layer_upload,
	.layer_free = cpu_layer_free,
	.register_host = cpu_register_host,
	.unregister_host = cpu_unregister_host,
	.share_create = cpu_share_create,
	.share_destroy = cpu_share_destroy,
	.layer_upload_into = cpu_layer_upload_into,
	.linear = cpu_linear,
	.linear_multi = cpu_linear_multi,
	.linear_start = cpu_linear_start,
	.linear_done = cpu_linear_done,
};
