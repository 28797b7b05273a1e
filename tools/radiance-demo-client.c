/*
 * radiance-demo-client: one client process of `make demo` (tools/demo.sh).
 *
 * Runs every captured linear layer of the real checkpoint through radianced
 * on the captured activations (fp32 x rounded to bf16), and prints per layer
 * the error against the CPU reference (kernels/w4a8_cpu.h on the checkpoint
 * loaded here) and against the original fp32 model's outputs; then the
 * latency of a small request (M=1 on a 384x384 layer). Exit status 0 when
 * every layer is within the bf16 floor of the reference, 1 otherwise, 2 for
 * usage or setup errors.
 *
 *   radiance-demo-client --socket PATH [--data DIR] [--attach] [--label A]
 *                        [--iters N] [--latency-only] [--spin-us US]
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tests/reference.h"
#include "radiance.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t pct(const uint64_t *sorted, size_t n, double p)
{
	size_t i = (size_t)(p * (double)(n - 1) + 0.5);
	return sorted[i < n ? i : n - 1];
}

struct lat {
	uint64_t p50, p99, max;
};

static void summarize(uint64_t *v, size_t n, struct lat *out)
{
	qsort(v, n, sizeof *v, cmp_u64);
	out->p50 = pct(v, n, 0.50);
	out->p99 = pct(v, n, 0.99);
	out->max = v[n - 1];
}

/* M=1 on the first 384x384 layer: the synchronous path (copies in and out)
 * and the zero-copy async path (submit + wait on arena buffers). */
static int latency(struct radiance *r, uint32_t model_id, const struct h_ref *ref,
		   const char *label, int iters)
{
	const char *name = "encoder.layer.0.attention.self.query";
	const struct h_layer *hl = h_ref_find(ref, name);
	int layer = radiance_find_layer(radiance_held_model(r, model_id), name);
	if (!hl || layer < 0) {
		fprintf(stderr, "%s: no layer %s\n", label, name);
		return -1;
	}
	uint64_t *sync_ns = calloc((size_t)iters, sizeof *sync_ns);
	uint64_t *async_ns = calloc((size_t)iters, sizeof *async_ns);
	uint64_t *queue_ns = calloc((size_t)iters, sizeof *queue_ns);
	uint64_t *exec_ns = calloc((size_t)iters, sizeof *exec_ns);
	uint16_t y[384];
	uint16_t *ax = radiance_arena_alloc(r, 384 * 2), *ay = radiance_arena_alloc(r, 384 * 2);
	int rc = 0;
	if (!ax || !ay) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(ax, hl->x_bf16, 384 * 2);
	for (int i = -iters / 10; i < iters && rc == 0; i++) {   /* first 10%: warm-up */
		uint64_t t0 = now_ns();
		rc = radiance_linear(r, model_id, (uint32_t)layer, 1, RADIANCE_BF16, hl->x_bf16, y);
		uint64_t t1 = now_ns();
		if (rc == 0)
			rc = radiance_submit(r, model_id, (uint32_t)layer, 1, RADIANCE_BF16, ax, ay, NULL);
		struct radiance_completion c = { 0 };
		if (rc == 0 && (rc = radiance_wait(r, &c, 10000)) == 1)
			rc = c.status;
		uint64_t t2 = now_ns();
		if (i >= 0) {
			sync_ns[i] = t1 - t0;
			async_ns[i] = t2 - t1;
			queue_ns[i] = c.queue_ns;
			exec_ns[i] = c.exec_ns;
		}
	}
	if (rc < 0) {
		fprintf(stderr, "%s: latency run: %s (%s)\n", label, radiance_strerror(rc),
			radiance_error_message(r));
		goto out;
	}
	if (memcmp(ay, hl->ref_bf16, 384 * 2) && h_compare_bf16(ay, hl->ref_bf16, 384, NULL, NULL)) {
		fprintf(stderr, "%s: M=1 output differs from the reference\n", label);
		rc = -EIO;
		goto out;
	}
	struct lat s, a, q, e;
	summarize(sync_ns, (size_t)iters, &s);
	summarize(async_ns, (size_t)iters, &a);
	summarize(queue_ns, (size_t)iters, &q);
	summarize(exec_ns, (size_t)iters, &e);
	printf("[%s] latency, M=1 on %s (384x384), %d iterations each:\n", label, name, iters);
	printf("[%s]   %-40s p50 %7.1f us   p99 %7.1f us   max %8.1f us\n", label,
	       "radiance_linear (copy in/out, sync)", s.p50 / 1e3, s.p99 / 1e3, s.max / 1e3);
	printf("[%s]   %-40s p50 %7.1f us   p99 %7.1f us   max %8.1f us\n", label,
	       "submit + wait (arena, zero-copy)", a.p50 / 1e3, a.p99 / 1e3, a.max / 1e3);
	printf("[%s]   %-40s p50 %7.1f us   p99 %7.1f us   max %8.1f us\n", label,
	       "  daemon: queue (pickup to launch)", q.p50 / 1e3, q.p99 / 1e3, q.max / 1e3);
	printf("[%s]   %-40s p50 %7.1f us   p99 %7.1f us   max %8.1f us\n", label,
	       "  daemon: exec (kernel + copies)", e.p50 / 1e3, e.p99 / 1e3, e.max / 1e3);
out:
	radiance_arena_free(r, ax);
	radiance_arena_free(r, ay);
	free(sync_ns);
	free(async_ns);
	free(queue_ns);
	free(exec_ns);
	return rc < 0 ? -1 : 0;
}

/* Every captured layer, one radiance_linear each; a table of errors. */
static int accuracy(struct radiance *r, uint32_t model_id, const struct h_ref *ref,
		    const char *label)
{
	int fails = 0;
	printf("[%s] %-42s %5s %5s %3s  %-14s %9s  %-19s\n", label, "layer", "N", "K", "M",
	       "vs CPU ref", "max ulp", "rel err vs fp32 model");
	printf("[%s] %-42s %5s %5s %3s  %-14s %9s  %9s %9s\n", label, "", "", "", "", "bit-exact",
	       "", "daemon", "CPU ref");
	double worst_daemon = 0;
	for (size_t i = 0; i < ref->n_layers; i++) {
		const struct h_layer *hl = &ref->layers[i];
		int layer = radiance_find_layer(radiance_held_model(r, model_id), hl->name);
		size_t mn = (size_t)hl->m * hl->n;
		uint16_t *y = malloc(mn * 2);
		int rc = layer < 0 ? -ENOENT
				   : radiance_linear(r, model_id, (uint32_t)layer, hl->m, RADIANCE_BF16,
						     hl->x_bf16, y);
		if (rc < 0) {
			printf("[%s] %-42s request failed: %s (%s)\n", label, hl->name, radiance_strerror(rc),
			       radiance_error_message(r));
			fails++;
			free(y);
			continue;
		}
		size_t exact;
		double ulps;
		size_t bad = h_compare_bf16(y, hl->ref_bf16, mn, &exact, &ulps);
		double e_daemon = h_relerr(y, hl->y_fp32, mn);
		double e_ref = h_relerr(hl->ref_bf16, hl->y_fp32, mn);
		if (e_daemon > worst_daemon)
			worst_daemon = e_daemon;
		char exact_s[32];
		snprintf(exact_s, sizeof exact_s, "%zu/%zu", exact, mn);
		printf("[%s] %-42s %5u %5u %3u  %-14s %9.1f  %9.4f %9.4f%s\n", label, hl->name, hl->n,
		       hl->k, hl->m, exact_s, ulps, e_daemon, e_ref, bad ? "  FAIL" : "");
		if (bad)
			fails++;
		free(y);
	}
	printf("[%s] %zu layers: %s; worst relative error against the fp32 model %.4f (int4 weights "
	       "+ fp8 activations)\n",
	       label, ref->n_layers, fails ? "FAILED" : "all within the bf16 floor of the CPU reference",
	       worst_daemon);
	return fails;
}

int main(int argc, char **argv)
{
	const char *socket = NULL, *label = "client", *data = NULL;
	int attach = 0, iters = 2000, latency_only = 0, spin_us = 0;
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "data", required_argument, NULL, 'd' },
		{ "attach", no_argument, NULL, 'a' },
		{ "label", required_argument, NULL, 'l' },
		{ "iters", required_argument, NULL, 'i' },
		{ "latency-only", no_argument, NULL, 'L' },
		{ "spin-us", required_argument, NULL, 'S' },
		{ 0 },
	};
	int o;
	while ((o = getopt_long(argc, argv, "s:d:al:i:LS:", opts, NULL)) != -1) {
		switch (o) {
		case 's': socket = optarg; break;
		case 'd': data = optarg; break;
		case 'a': attach = 1; break;
		case 'l': label = optarg; break;
		case 'i': iters = atoi(optarg); break;
		case 'L': latency_only = 1; break;
		case 'S': spin_us = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s --socket PATH [--data DIR] [--attach] [--label L] "
					"[--iters N] [--latency-only] [--spin-us US]\n", argv[0]);
			return 2;
		}
	}
	if (iters < 10)
		iters = 10;
	if (data)
		setenv("RADIANCE_TEST_DATA", data, 1);

	struct h_ref ref;
	static const char *const one[] = { "encoder.layer.0.attention.self.query", NULL };
	if (h_ref_load_some(&ref, latency_only ? one : NULL) < 0)
		return 2;

	struct radiance_options ro = RADIANCE_OPTIONS_INIT;
	char name[64];
	snprintf(name, sizeof name, "demo-%s", label);
	ro.client_name = name;
	ro.timeout_ms = 60000;
	ro.spin_us = spin_us;   /* 0: the library's default */
	struct radiance *r = radiance_connect(socket, &ro);
	if (!r) {
		fprintf(stderr, "[%s] connect: %s\n", label, radiance_strerror(errno));
		h_ref_free(&ref);
		return 2;
	}
	const struct radiance_server_info *si = radiance_get_server_info(r);
	uint32_t id;
	int rc;
	uint64_t t0 = now_ns();
	if (attach) {
		/* The other demo client is loading it right now: retry for 60 s. */
		while ((rc = radiance_attach_model(r, ref.model_name, &id)) == -ENOENT &&
		       now_ns() - t0 < 60000000000ull)
			usleep(20000);
	} else {
		char ckpt[512];
		h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
		rc = radiance_load_model(r, ckpt, NULL, &id);
	}
	if (rc < 0) {
		fprintf(stderr, "[%s] %s: %s\n", label, attach ? "attach" : "load", radiance_error_message(r));
		radiance_disconnect(r);
		h_ref_free(&ref);
		return 2;
	}
	const struct radiance_model_info *mi = radiance_held_model(r, id);
	printf("[%s] session %" PRIu64 " on radianced %s, backend %s (%s); %s model %u \"%s\" "
	       "(%zu layers, %.1f MiB resident) in %.0f ms\n",
	       label, si->session_id, si->server_version, si->backend, si->device,
	       attach ? "attached to" : "loaded", id, mi->name, mi->n_layers,
	       mi->resident_bytes / 1048576.0, (now_ns() - t0) / 1e6);

	int fails = 0;
	if (!latency_only)
		fails = accuracy(r, id, &ref, label);
	if (latency(r, id, &ref, label, iters) < 0)
		fails++;
	radiance_disconnect(r);
	h_ref_free(&ref);
	return fails ? 1 : 0;
}
