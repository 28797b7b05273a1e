/*
 * A synthetic AutoRound checkpoint of given shapes that the real loader
 * accepts (daemon/checkpoint.h): auto_round:auto_gptq packing, 4 bits,
 * group 128, symmetric (every qzero 7). For bench_mapped and bench_serve,
 * which time the service path on realistic shapes without a real model.
 *
 * Layout: config.json (a quantization_config) and one model.safetensors
 * with, per block b and shape s, model.layers.<b>.<module>.{qweight I32
 * [k/8][n], scales F16 [k/128][n], qzeros I32 [k/128][n/8]}: random codes,
 * scales from a table of plausible fp16 values (~0.004..0.03, both signs).
 * The header goes first: every offset follows from the shapes, so the
 * tensors stream out in 8 MiB pieces and memory stays small whatever the
 * size. Layer index of (b, s) in the loaded model: b * nshapes + s (the
 * loader keeps file order).
 *
 * Header-only (static functions): every .c file in bench/ is its own binary.
 */
#ifndef RADIANCE_BENCH_SYNTH_CHECKPOINT_H
#define RADIANCE_BENCH_SYNTH_CHECKPOINT_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "log.h"

struct synth_shape {
	uint32_t n, k;           /* k % 128 == 0, n % 8 == 0 */
	const char *module;      /* e.g. "mlp.down_proj" */
};

static uint64_t synth_rng = 0x2545F4914F6CDD1Dull;
static inline uint64_t synth_rnd64(void)
{
	synth_rng ^= synth_rng << 13;
	synth_rng ^= synth_rng >> 7;
	synth_rng ^= synth_rng << 17;
	return synth_rng;
}

/* len bytes at *at, which moves past them (common/io.c's write loop). */
static inline int synth_put_all(int fd, const void *p, size_t len, uint64_t *at)
{
	int rc = rio_pwrite_all(fd, p, len, *at);
	if (rc == 0)
		*at += len;
	return rc;
}

/* mkdir -p dir: dir and each missing parent, mode 0755 (less the umask); a
 * directory already there is fine. 0, or -errno with err naming the path
 * that could not be made (-ENOTDIR: a component is a file). */
static inline int synth_mkdir_p(const char *dir, char *err, size_t errlen)
{
	char path[4096];
	struct stat st;
	if (!*dir) {
		rlog_errf(err, errlen, "no directory given (an empty path)");
		return -EINVAL;
	}
	if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
		rlog_errf(err, errlen, "%.64s...: path longer than %zu bytes", dir, sizeof path - 1);
		return -ENAMETOOLONG;
	}
	/* each prefix ending before a '/', then the whole path */
	for (char *p = path + 1;; p++) {
		if (*p && *p != '/')
			continue;
		char c = *p;
		*p = 0;
		if (mkdir(path, 0755) < 0 && errno != EEXIST) {
			int e = errno;
			rlog_errf(err, errlen, "cannot create the directory %s: %s", path, strerror(e));
			return -e;
		}
		/* EEXIST is also what a file there gives */
		if (stat(path, &st) < 0) {
			int e = errno;
			rlog_errf(err, errlen, "cannot create the directory %s: %s", path, strerror(e));
			return -e;
		}
		if (!S_ISDIR(st.st_mode)) {
			rlog_errf(err, errlen, "cannot create the directory %s: %s exists and is not a "
				  "directory", dir, path);
			return -ENOTDIR;
		}
		if (!(*p = c))
			return 0;
	}
}

/* Writes the checkpoint into dir, made first (with its parents) when it
 * does not exist; *bytes_out (may be NULL) gets the tensor bytes. 0,
 * -EINVAL (a shape the format cannot hold), -ENOMEM, or -errno of the
 * directory and file calls, with err set. */
static inline int synth_checkpoint_write(const char *dir, const struct synth_shape *shapes, size_t nshapes,
					 uint32_t blocks, uint64_t *bytes_out, char *err, size_t errlen)
{
	char path[4096];
	const size_t plen = errlen > 64 ? errlen - 64 : 1;   /* room for the reason */
	int rc = 0, fd = -1;
	char *h = NULL;
	uint64_t *buf = NULL;
	for (size_t s = 0; s < nshapes; s++)
		if (shapes[s].k % 128 || shapes[s].n % 8 || !shapes[s].n) {
			snprintf(err, errlen, "shape %zu (%s): %ux%u: k must be a multiple of 128, n of 8", s,
				 shapes[s].module, shapes[s].n, shapes[s].k);
			return -EINVAL;
		}
	if ((rc = synth_mkdir_p(dir, err, errlen)) < 0)
		return rc;
	rio_path_join(path, sizeof path, dir, "config.json");
	FILE *f = fopen(path, "w");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "%.*s: %s", (int)plen, path, strerror(errno));
		return rc;
	}
	fprintf(f, "{\"architectures\": [\"Qwen3ForCausalLM\"], \"_name_or_path\": \"synthetic/shapes\","
		   " \"quantization_config\": {\"quant_method\": \"auto-round\", \"packing_format\":"
		   " \"auto_round:auto_gptq\", \"bits\": 4, \"group_size\": 128, \"sym\": true,"
		   " \"data_type\": \"int\", \"block_name_to_quantize\": \"model.layers\"}}\n");
	if (fclose(f) != 0) {
		rc = -errno;
		snprintf(err, errlen, "%.*s: %s", (int)plen, path, strerror(errno));
		return rc;
	}
	size_t hcap = 512 * (size_t)blocks * nshapes + 64, hlen = 0;
	const size_t chunk = 8u << 20;
	h = malloc(hcap);
	buf = malloc(chunk);
	if (!h || !buf) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	uint64_t off = 0;
	hlen += (size_t)snprintf(h + hlen, hcap - hlen, "{");
	for (uint32_t b = 0; b < blocks; b++)
		for (size_t s = 0; s < nshapes; s++) {
			const uint64_t n = shapes[s].n, k = shapes[s].k;
			const uint64_t sizes[3] = {k / 8 * n * 4, k / 128 * n * 2, k / 128 * (n / 8) * 4};
			static const char *suffix[3] = {"qweight", "scales", "qzeros"};
			static const char *dt[3] = {"I32", "F16", "I32"};
			const uint64_t dims[3][2] = {{k / 8, n}, {k / 128, n}, {k / 128, n / 8}};
			for (int t = 0; t < 3; t++) {
				hlen += (size_t)snprintf(h + hlen, hcap - hlen,
							 "%s\"model.layers.%u.%s.%s\": {\"dtype\": \"%s\", \"shape\": "
							 "[%llu, %llu], \"data_offsets\": [%llu, %llu]}",
							 hlen > 1 ? ", " : "", b, shapes[s].module, suffix[t], dt[t],
							 (unsigned long long)dims[t][0], (unsigned long long)dims[t][1],
							 (unsigned long long)off, (unsigned long long)(off + sizes[t]));
				off += sizes[t];
			}
		}
	hlen += (size_t)snprintf(h + hlen, hcap - hlen, "}");
	while (hlen % 8)
		h[hlen++] = ' ';
	rio_path_join(path, sizeof path, dir, "model.safetensors");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%.*s: %s", (int)plen, path, strerror(errno));
		goto out;
	}
	uint64_t hl = hlen, at = 0;
	if ((rc = synth_put_all(fd, &hl, 8, &at)) || (rc = synth_put_all(fd, h, hlen, &at)))
		goto io;
	uint16_t table[64];
	for (int i = 0; i < 64; i++)
		table[i] = (uint16_t)(0x1C00 + i * 37 + ((i & 1) ? 0x8000 : 0));
	for (uint32_t b = 0; b < blocks; b++)
		for (size_t s = 0; s < nshapes; s++) {
			const uint64_t n = shapes[s].n, k = shapes[s].k;
			for (uint64_t left = k / 8 * n * 4; left;) {
				size_t c = left < chunk ? left : chunk;
				for (size_t i = 0; i < c / 8; i++)
					buf[i] = synth_rnd64();
				if ((rc = synth_put_all(fd, buf, c, &at)))
					goto io;
				left -= c;
			}
			for (uint64_t left = k / 128 * n * 2; left;) {
				size_t c = left < chunk ? left : chunk;
				uint16_t *p = (uint16_t *)buf;
				for (size_t i = 0; i < c / 2; i++)
					p[i] = table[synth_rnd64() & 63];
				if ((rc = synth_put_all(fd, buf, c, &at)))
					goto io;
				left -= c;
			}
			for (uint64_t left = k / 128 * (n / 8) * 4; left;) {
				size_t c = left < chunk ? left : chunk;
				memset(buf, 0x77, c);
				if ((rc = synth_put_all(fd, buf, c, &at)))
					goto io;
				left -= c;
			}
		}
	if (close(fd) != 0) {
		fd = -1;
		rc = -errno;
		goto io;
	}
	fd = -1;
	if (bytes_out)
		*bytes_out = off;
	goto out;
io:
	snprintf(err, errlen, "%.*s: %s", (int)plen, path, strerror(-rc));
out:
	if (fd >= 0)
		close(fd);
	free(h);
	free(buf);
	return rc;
}

#endif
