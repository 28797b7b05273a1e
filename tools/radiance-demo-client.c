/*
 * radiance-demo-client: one client process of `make demo` (tools/demo.sh).
 *
 * Runs every captured linear layer of the real checkpoint through radianced
 * on the captured activations (fp32 x rounded to bf16), and prints per layer
 * the error against the CPU reference (kernels/w4a8_cpu.h on the checkpoint
 * loaded here) and against the original fp32 model's outputs; then the
 * latency of a small request (M=1 on a 384x384 layer). Exit status 0 when
 * every layer matches the reference (bit-exact when the daemon runs the CPU
 * backend, the reference's own kernel; within the bf16 floor on a GPU), 1
 * otherwise, 2 for usage or setup errors.
 *
 *   radiance-demo-client [--socket PATH] [--data DIR] [--attach]
 *                        [--attach-wait S] [--label A] [--iters N] [--brief]
 *                        [--latency-only] [--spin-us US]
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "../tests/reference.h"
#include "radiance.h"

/* The most specific text for a failure: the library's or daemon's message
 * when there is one, else the code's name (never both: they are often the
 * same words). */
static const char *why(struct radiance *r, int rc)
{
	const char *msg = r ? radiance_error_message(r) : "";
	return *msg ? msg : radiance_strerror(rc);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
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
		fprintf(stderr, "[%s] no layer %s\n", label, name);
		return -1;
	}
	uint64_t *sync_ns = calloc((size_t)iters, sizeof *sync_ns);
	uint64_t *async_ns = calloc((size_t)iters, sizeof *async_ns);
	uint64_t *queue_ns = calloc((size_t)iters, sizeof *queue_ns);
	uint64_t *exec_ns = calloc((size_t)iters, sizeof *exec_ns);
	uint16_t y[384];
	uint16_t *ax = radiance_arena_alloc(r, 384 * 2), *ay = radiance_arena_alloc(r, 384 * 2);
	int rc = 0;
	if (!sync_ns || !async_ns || !queue_ns || !exec_ns || !ax || !ay) {
		fprintf(stderr, "[%s] out of memory (arena or host)\n", label);
		rc = -ENOMEM;
		goto out;
	}
	memcpy(ax, hl->x_bf16, 384 * 2);
	char failed[512] = "";
	for (int i = -iters / 10; i < iters && rc == 0; i++) {   /* first 10%: warm-up */
		uint64_t t0 = rclock_ns();
		rc = radiance_linear(r, model_id, (uint32_t)layer, 1, RADIANCE_BF16, hl->x_bf16, y);
		uint64_t t1 = rclock_ns();
		if (rc == 0)
			rc = radiance_submit(r, model_id, (uint32_t)layer, 1, RADIANCE_BF16, ax, ay, NULL);
		struct radiance_completion c = { 0 };
		if (rc == 0 && (rc = radiance_wait(r, &c, 10000)) == 1) {
			rc = c.status;
			if (rc < 0)   /* the request's own reason, valid until the next call */
				snprintf(failed, sizeof failed, "%s", c.error ? c.error : "");
		}
		uint64_t t2 = rclock_ns();
		if (i >= 0) {
			sync_ns[i] = t1 - t0;
			async_ns[i] = t2 - t1;
			queue_ns[i] = c.queue_ns;
			exec_ns[i] = c.exec_ns;
		}
	}
	if (rc < 0) {
		fprintf(stderr, "[%s] latency run: %s\n", label, *failed ? failed : why(r, rc));
		goto out;
	}
	if (memcmp(ay, hl->ref_bf16, 384 * 2) && h_compare_bf16(ay, hl->ref_bf16, 384, NULL, NULL)) {
		fprintf(stderr, "[%s] M=1 output differs from the reference\n", label);
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

/* Every captured layer, one radiance_linear each. The full table unless
 * brief (then only failing layers get a row); always a summary line.
 * exact: the daemon runs the very kernel of the reference (the CPU
 * backend), so anything but bit-exact is a failure; otherwise (a GPU) the
 * bf16 floor is the bound. Returns the number of failed layers. */
static int accuracy(struct radiance *r, uint32_t model_id, const struct h_ref *ref,
		    const char *label, int brief, int exact_only)
{
	int fails = 0;
	size_t n_exact = 0;
	double worst_daemon = 0, worst_ulps = 0;
	if (!brief) {
		printf("[%s] %-42s %5s %5s %3s  %-14s %9s  %-19s\n", label, "layer", "N", "K", "M",
		       "vs CPU ref", "max ulp", "rel err vs fp32 model");
		printf("[%s] %-42s %5s %5s %3s  %-14s %9s  %9s %9s\n", label, "", "", "", "",
		       "bit-exact", "", "daemon", "CPU ref");
	}
	for (size_t i = 0; i < ref->n_layers; i++) {
		const struct h_layer *hl = &ref->layers[i];
		int layer = radiance_find_layer(radiance_held_model(r, model_id), hl->name);
		size_t mn = (size_t)hl->m * hl->n;
		uint16_t *y = malloc(mn * 2);
		int rc = !y ? -ENOMEM
		       : layer < 0 ? -ENOENT
				   : radiance_linear(r, model_id, (uint32_t)layer, hl->m, RADIANCE_BF16,
						     hl->x_bf16, y);
		if (rc < 0) {
			printf("[%s] %-42s request failed: %s\n", label, hl->name,
			       rc == -ENOENT && layer < 0 ? "no such layer in the model" : why(r, rc));
			fails++;
			free(y);
			continue;
		}
		size_t exact;
		double ulps;
		size_t bad = h_compare_bf16(y, hl->ref_bf16, mn, &exact, &ulps);
		if (exact_only)
			bad = mn - exact;
		double e_daemon = h_relerr(y, hl->y_fp32, mn);
		double e_ref = h_relerr(hl->ref_bf16, hl->y_fp32, mn);
		if (e_daemon > worst_daemon)
			worst_daemon = e_daemon;
		if (ulps > worst_ulps)
			worst_ulps = ulps;
		n_exact += exact == mn;
		if (!brief || bad) {
			char exact_s[32];
			snprintf(exact_s, sizeof exact_s, "%zu/%zu", exact, mn);
			printf("[%s] %-42s %5u %5u %3u  %-14s %9.1f  %9.4f %9.4f%s\n", label, hl->name,
			       hl->n, hl->k, hl->m, exact_s, ulps, e_daemon, e_ref, bad ? "  FAIL" : "");
		}
		if (bad)
			fails++;
		free(y);
	}
	char verdict[160];
	if (fails)
		snprintf(verdict, sizeof verdict, "%d FAILED against the CPU reference (%s)", fails,
			 exact_only ? "bit-exact required" : "bf16 floor");
	else if (n_exact == ref->n_layers)
		snprintf(verdict, sizeof verdict, "all bit-exact with the CPU reference");
	else
		snprintf(verdict, sizeof verdict,
			 "all within the bf16 floor of the CPU reference (%zu bit-exact, max %.1f ulp)",
			 n_exact, worst_ulps);
	printf("[%s] %zu layers: %s; worst relative error against the fp32 model %.4f "
	       "(the cost of int4 weights + fp8 activations, see docs/accuracy.md)\n",
	       label, ref->n_layers, verdict, worst_daemon);
	return fails;
}

/* A whole decimal int in [lo, hi], or a usage error. */
static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (!*s || *end || errno || v < lo || v > hi) {
		fprintf(stderr, "radiance-demo-client: %s must be a whole number from %ld to %ld, not "
				"'%s'\n", opt, lo, hi, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

/* Keeps libradiance's last warning: radiance_connect() has no handle to ask
 * for the reason of a failure (the daemon's refusal text comes this way). */
static void keep_warning(void *user, int priority, const char *message)
{
	if (priority <= LOG_WARNING)
		snprintf(user, 512, "%s", message);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: radiance-demo-client [--socket PATH] [--data DIR] [--attach] [--attach-wait S]\n"
		"                            [--label L] [--iters N] [--brief] [--latency-only]\n"
		"                            [--spin-us US]\n"
		"  --socket PATH     radianced's socket (default: $RADIANCE_SOCKET, else the system one)\n"
		"  --data DIR        test data with minilm-w4g128/ and the captured activations\n"
		"                    (default tests/data)\n"
		"  --attach          attach to the resident model by name instead of loading it\n"
		"  --attach-wait S   with --attach: how long to wait for another client to load it\n"
		"                    (default 60; 0 fails at once)\n"
		"  --label L         prefix of every output line (default client)\n"
		"  --iters N         latency iterations (default 2000)\n"
		"  --brief           no per-layer table, only the summary (and failing layers)\n"
		"  --latency-only    skip the per-layer check\n"
		"  --spin-us US      CQ spin before sleeping on the doorbell (-1 never, 0 default)\n");
}

int main(int argc, char **argv)
{
	const char *socket = NULL, *label = "client", *data = NULL;
	int attach = 0, attach_wait = 60, iters = 2000, latency_only = 0, spin_us = 0, brief = 0;
	enum { OPT_ATTACH_WAIT = 256, OPT_BRIEF };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "data", required_argument, NULL, 'd' },
		{ "attach", no_argument, NULL, 'a' },
		{ "attach-wait", required_argument, NULL, OPT_ATTACH_WAIT },
		{ "label", required_argument, NULL, 'l' },
		{ "iters", required_argument, NULL, 'i' },
		{ "brief", no_argument, NULL, OPT_BRIEF },
		{ "latency-only", no_argument, NULL, 'L' },
		{ "spin-us", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int o;
	opterr = 0;
	while ((o = getopt_long(argc, argv, "s:d:al:i:LS:h", opts, NULL)) != -1) {
		switch (o) {
		case 's': socket = optarg; break;
		case 'd': data = optarg; break;
		case 'a': attach = 1; break;
		case 'l': label = optarg; break;
		case 'L': latency_only = 1; break;
		case OPT_BRIEF: brief = 1; break;
		case 'i':
			if (parse_int("--iters", optarg, 1, 10000000, &iters) < 0)
				return 2;
			break;
		case 'S':
			if (parse_int("--spin-us", optarg, -1, 1000000, &spin_us) < 0)
				return 2;
			break;
		case OPT_ATTACH_WAIT:
			if (parse_int("--attach-wait", optarg, 0, 86400, &attach_wait) < 0)
				return 2;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			fprintf(stderr, "radiance-demo-client: bad option '%s' (--help for usage)\n",
				argv[optind - 1]);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "radiance-demo-client: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (data)
		setenv("RADIANCE_TEST_DATA", data, 1);

	/* Connect first: a wrong socket fails at once, before the reference
	 * is computed. */
	char path[108] = "", warning[512] = "";
	if (socket)
		snprintf(path, sizeof path, "%s", socket);
	else
		radiance_default_socket_path(path, sizeof path);
	struct radiance_options ro = RADIANCE_OPTIONS_INIT;
	char name[64];
	snprintf(name, sizeof name, "demo-%s", label);
	ro.client_name = name;
	ro.timeout_ms = 60000;
	ro.spin_us = spin_us;   /* 0: the library's default */
	ro.log = keep_warning;
	ro.log_user = warning;
	struct radiance *r = radiance_connect(path, &ro);
	if (!r) {
		int e = errno;
		if (*warning)
			fprintf(stderr, "[%s] %s\n", label, warning);
		else
			fprintf(stderr, "[%s] cannot connect to %s: %s\n", label, path, radiance_strerror(e));
		if (e == ENOENT || e == ECONNREFUSED)
			fprintf(stderr, "[%s] is radianced running there? --socket PATH names another "
					"socket\n", label);
		return 2;
	}

	struct h_ref ref;
	static const char *const one[] = { "encoder.layer.0.attention.self.query", NULL };
	if (h_ref_load_some(&ref, latency_only ? one : NULL) < 0) {
		radiance_disconnect(r);
		return 2;
	}

	const struct radiance_server_info *si = radiance_get_server_info(r);
	uint32_t id;
	int rc;
	uint64_t t0 = rclock_ns();
	if (attach) {
		/* In the demo the other client is loading it right now: retry,
		 * and say what we wait for if it takes more than a second. */
		int told = 0;
		while ((rc = radiance_attach_model(r, ref.model_name, &id)) == -ENOENT &&
		       rclock_ns() - t0 < (uint64_t)attach_wait * 1000000000ull) {
			if (!told && rclock_ns() - t0 > 1000000000ull) {
				fprintf(stderr, "[%s] no model \"%s\" is resident yet; waiting up to %d s "
						"for another client to load it\n",
					label, ref.model_name, attach_wait);
				told = 1;
			}
			usleep(20000);
		}
		if (rc == -ENOENT) {
			fprintf(stderr, "[%s] attach: no model \"%s\" is resident in the daemon at %s "
					"(waited %d s); load it first (e.g. radiancectl load --hold DIR), "
					"or run without --attach\n",
				label, ref.model_name, path, attach_wait);
			radiance_disconnect(r);
			h_ref_free(&ref);
			return 2;
		}
	} else {
		char ckpt[512];
		h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
		rc = radiance_load_model(r, ckpt, NULL, &id);
	}
	if (rc < 0) {
		fprintf(stderr, "[%s] %s: %s\n", label, attach ? "attach" : "load", why(r, rc));
		radiance_disconnect(r);
		h_ref_free(&ref);
		return 2;
	}
	const struct radiance_model_info *mi = radiance_held_model(r, id);
	printf("[%s] session %" PRIu64 " on radianced %s, backend %s (%s); %s model %u \"%s\" "
	       "(%zu layers, %.1f MiB resident) in %.0f ms\n",
	       label, si->session_id, si->server_version, si->backend, si->device,
	       attach ? "attached to" : "loaded", id, mi->name, mi->n_layers,
	       mi->resident_bytes / 1048576.0, (rclock_ns() - t0) / 1e6);

	int fails = 0;
	if (!latency_only)
		fails = accuracy(r, id, &ref, label, brief, !strcmp(si->backend, "cpu"));
	if (latency(r, id, &ref, label, iters) < 0)
		fails++;
	radiance_disconnect(r);
	h_ref_free(&ref);
	return fails ? 1 : 0;
}
