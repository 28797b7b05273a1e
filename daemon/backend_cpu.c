/*
 * The CPU backend: the reference numerics (kernels/w4a8_cpu.c) serving real
 * requests. Weights stay in the loader's canonical host layout, so a layer
 * "upload" is a handle onto the model's arrays. The only memory it owns is
 * the activation-code scratch, sized once at create for max_rows x max_k.
 *
 * It has no device memory to share: MapModel is refused. For tests of the
 * protocol and the fd passing on machines without a GPU, RADIANCE_FAKE_SHARE=1
 * makes it copy each model's canonical arrays into one sealed memfd laid out
 * as proto/map.h says (MAP_HANDLE_TEST_MEMFD); it still computes from the
 * model's own arrays.
 */
#include "backend_impl.h"
#include "w4a8_cpu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define TEST_SHARE_GRANULARITY 4096u

struct cpu_state {
	void *scratch;
	size_t scratch_bytes;
	uint32_t max_rows;
	uint32_t max_k;
	char cpu_model[128];
	int fake_share;           /* RADIANCE_FAKE_SHARE=1 */
};

struct radiance_backend_layer {
	const struct radiance_layer *layer;
};

static void read_cpu_model(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	snprintf(out, len, "cpu");
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "model name", 10) == 0) {
			char *p = strchr(line, ':');
			if (p) {
				p += 1 + strspn(p + 1, " \t");
				p[strcspn(p, "\n")] = 0;
				snprintf(out, len, "%s", p);
			}
			break;
		}
	}
	fclose(f);
}

static int cpu_create(const struct radiance_backend_options *opt, void **state, char *err,
		      size_t errlen)
{
	struct cpu_state *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "cpu backend: out of memory");
		return -ENOMEM;
	}
	s->max_rows = opt->max_rows;
	s->max_k = opt->max_k ? opt->max_k : RADIANCE_GROUP_SIZE;
	s->scratch_bytes = radiance_cpu_w4a8_scratch_bytes(s->max_rows, s->max_k);
	s->scratch = aligned_alloc(64, (s->scratch_bytes + 63) & ~(size_t)63);
	if (!s->scratch) {
		/* the size is the operator's choice: say which options make it */
		snprintf(err, errlen, "cpu backend: out of memory for %zu bytes (%.1f GiB) of "
			 "activation scratch, sized by max_rows %u x max_k %u (about 5 bytes "
			 "each); lower --max-rows or --max-k", s->scratch_bytes,
			 (double)s->scratch_bytes / (1u << 30), s->max_rows, s->max_k);
		free(s);
		return -ENOMEM;
	}
	read_cpu_model(s->cpu_model, sizeof s->cpu_model);
	const char *fake = getenv("RADIANCE_FAKE_SHARE");
	s->fake_share = fake && strcmp(fake, "1") == 0;
	*state = s;
	return 0;
}

static void cpu_destroy(void *state)
{
	struct cpu_state *s = state;
	if (!s)
		return;
	free(s->scratch);
	free(s);
}

static void cpu_info(void *state, struct radiance_backend_info *info)
{
	struct cpu_state *s = state;
	snprintf(info->name, sizeof info->name, "cpu");
	snprintf(info->device, sizeof info->device, "%s", s->cpu_model);
	info->scratch_bytes = s->scratch_bytes;
	snprintf(info->share, sizeof info->share, "%s", s->fake_share ? "test-memfd" : "none");
	snprintf(info->share_why, sizeof info->share_why, "%s",
		 s->fake_share ? "RADIANCE_FAKE_SHARE=1: a memfd of host arrays, for tests"
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

static int cpu_share_create(void *state, const struct radiance_model *m,
			    struct radiance_backend_share **out, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	uint64_t total;
	if (!s->fake_share)
		return 0;
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

static int put(int fd, const void *p, uint64_t len, uint64_t off)
{
	const uint8_t *b = p;
	while (len) {
		ssize_t n = pwrite(fd, b, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		b += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static int cpu_layer_upload_into(void *state, struct radiance_backend_share *sh, size_t index,
				 const struct radiance_layer *l, struct radiance_backend_layer **out,
				 char *err, size_t errlen)
{
	const struct radiance_share_layer *sl = &sh->layers[index];
	int rc = l->kind == RADIANCE_LAYER_W4A8
			 ? put(sh->fd, l->qweight, sl->weight_bytes, sl->weight_offset)
			 : put(sh->fd, l->weight, sl->weight_bytes, sl->weight_offset);
	if (!rc && sl->scales_bytes)
		rc = put(sh->fd, l->scales, sl->scales_bytes, sl->scales_offset);
	if (!rc && sl->bias_bytes)
		rc = put(sh->fd, l->bias, sl->bias_bytes, sl->bias_offset);
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

static int cpu_register_host(void *state, void *base, size_t len, char *err, size_t errlen)
{
	return 0;
}

static void cpu_unregister_host(void *state, void *base)
{
}

static int cpu_linear(void *state, const struct radiance_layer *l, struct radiance_backend_layer *h,
		      const struct radiance_rows *rows, size_t nrows, char *err, size_t errlen)
{
	struct cpu_state *s = state;
	for (size_t i = 0; i < nrows; i++) {
		const struct radiance_rows *r = &rows[i];
		if (l->kind == RADIANCE_LAYER_W4A8)
			radiance_cpu_w4a8(r->x, r->dtype, r->m, l->qweight, l->scales, l->bias, l->n,
					  l->k, r->y, s->scratch);
		else
			radiance_cpu_bf16(r->x, r->dtype, r->m, l->weight, l->bias, l->n, l->k, r->y);
	}
	return 0;
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
};
