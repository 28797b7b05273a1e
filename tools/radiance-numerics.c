/*
 * radiance-numerics: exposes the numerics of kernels/numerics.h to scripts,
 * so independent implementations (ml_dtypes, numpy) can check them. Reads
 * little-endian binary on stdin, writes binary on stdout.
 *
 *   radiance-numerics e4m3-encode      fp32[n]            -> uint8[n]
 *   radiance-numerics e4m3-decode      uint8[n]           -> fp32[n]
 *   radiance-numerics bf16-encode      fp32[n]            -> uint16[n]
 *   radiance-numerics f16-decode       uint16[n]          -> fp32[n]
 *   radiance-numerics quant-rows M K   bf16[M][K]         -> fp32 s[M], uint8 codes[M][K]
 *   radiance-numerics w4a8 M N K       bf16 x[M][K], uint32 qweight[N][K/8],
 *                                      uint16 scales[N][K/128], fp32 bias[N]
 *                                                         -> bf16 y[M][N]
 *   radiance-numerics w4a8-bound M N K fp32|fp8-sm90
 *                                      the w4a8 input, then bf16 y[M][N] (a
 *                                      path's output)     -> float64 exact[M][N],
 *                                                            float64 allowed[M][N]
 *                                      (docs/numerics.md "Contract"); stderr:
 *                                      elements outside, worst fraction
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics.h"
#include "numerics_bound.h"
#include "w4a8_cpu.h"

static void *read_all(size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + n, 1, cap - n, stdin)) > 0) {
		n += r;
		if (n == cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb) {
				free(buf);
				return NULL;
			}
			buf = nb;
		}
	}
	*len = n;
	return buf;
}

static int usage(void)
{
	fprintf(stderr, "usage: radiance-numerics e4m3-encode|e4m3-decode|bf16-encode|f16-decode\n"
			"       radiance-numerics quant-rows M K | w4a8 M N K  (binary stdin -> stdout)\n"
			"       radiance-numerics w4a8-bound M N K fp32|fp8-sm90\n");
	return 2;
}

/* w4a8-bound: the contract's bound for every element of y, and what falls
 * outside it (the numerics gate's report, for scripts). */
static int w4a8_bound(const unsigned char *in, size_t len, unsigned long m, unsigned long n, unsigned long k,
		      enum radiance_acc acc)
{
	const size_t xb = m * k * 2, qb = n * (k / 8) * 4, sb = n * (k / 128) * 2, bb = n * 4, yb = m * n * 2;
	if (k % 128 || len != xb + qb + sb + bb + yb) {
		fprintf(stderr, "radiance-numerics: w4a8-bound wants K %% 128 == 0 and %zu bytes, got %zu\n",
			xb + qb + sb + bb + yb, len);
		return 1;
	}
	uint16_t *x = malloc(xb + 1), *sc = malloc(sb + 1), *y = malloc(yb + 1);
	uint32_t *qw = malloc(qb + 1);
	float *bias = malloc(bb + 1), *s = malloc(m * sizeof *s + 1);
	uint8_t *codes = malloc(m * k + 1);
	double *out = malloc(2 * m * n * sizeof *out + 1);
	int rc = 1;
	if (!x || !sc || !y || !qw || !bias || !s || !codes || !out) {
		fprintf(stderr, "radiance-numerics: out of memory\n");
		goto out;
	}
	/* each section to its own aligned buffer before reading it as its type */
	memcpy(x, in, xb);
	memcpy(qw, in + xb, qb);
	memcpy(sc, in + xb + qb, sb);
	memcpy(bias, in + xb + qb + sb, bb);
	memcpy(y, in + xb + qb + sb + bb, yb);
	for (unsigned long r = 0; r < m; r++)
		s[r] = radiance_quant_row_e4m3(x + r * k, RADIANCE_DTYPE_BF16, (uint32_t)k, codes + r * k);
	for (unsigned long r = 0; r < m; r++)
		for (unsigned long j = 0; j < n; j++)
			radiance_w4a8_bound(codes + r * k, s[r], qw + j * (k / 8), sc + j * (k / 128), bias[j],
					    (uint32_t)k, acc, &out[r * n + j], &out[m * n + r * n + j]);
	struct radiance_bound_report rep;
	radiance_w4a8_bound_check(codes, s, qw, sc, bias, (uint32_t)m, (uint32_t)n, (uint32_t)k, acc, y, &rep);
	fwrite(out, sizeof *out, 2 * m * n, stdout);
	fprintf(stderr, "w4a8-bound: %zu of %zu outside, worst %.3f of allowed, %zu NaN mismatches\n", rep.outside,
		rep.checked, rep.worst, rep.nan_mismatch);
	rc = 0;
out:
	free(x);
	free(sc);
	free(y);
	free(qw);
	free(bias);
	free(s);
	free(codes);
	free(out);
	return rc;
}

int main(int argc, char **argv)
{
	size_t len;
	if (argc < 2)
		return usage();
	unsigned char *in = read_all(&len);
	if (!in) {
		fprintf(stderr, "radiance-numerics: out of memory\n");
		return 1;
	}
	const char *op = argv[1];
	int rc = 0;
	if (strcmp(op, "e4m3-encode") == 0) {
		for (size_t i = 0; i + 4 <= len; i += 4) {
			float f;
			memcpy(&f, in + i, 4);
			putchar(radiance_e4m3_from_f32(f));
		}
	} else if (strcmp(op, "e4m3-decode") == 0) {
		for (size_t i = 0; i < len; i++) {
			float f = radiance_e4m3_to_f32(in[i]);
			fwrite(&f, 4, 1, stdout);
		}
	} else if (strcmp(op, "bf16-encode") == 0) {
		for (size_t i = 0; i + 4 <= len; i += 4) {
			float f;
			memcpy(&f, in + i, 4);
			uint16_t h = radiance_bf16_from_f32(f);
			fwrite(&h, 2, 1, stdout);
		}
	} else if (strcmp(op, "f16-decode") == 0) {
		for (size_t i = 0; i + 2 <= len; i += 2) {
			uint16_t h;
			memcpy(&h, in + i, 2);
			float f = radiance_f16_to_f32(h);
			fwrite(&f, 4, 1, stdout);
		}
	} else if (strcmp(op, "quant-rows") == 0 && argc == 4) {
		unsigned long m = strtoul(argv[2], NULL, 10), k = strtoul(argv[3], NULL, 10);
		if (len != m * k * 2) {
			fprintf(stderr, "radiance-numerics: quant-rows wants %lu bytes, got %zu\n", m * k * 2, len);
			rc = 1;
		} else {
			uint8_t *codes = malloc(m * k + 1);
			float *s = malloc(m * sizeof *s + 1);
			for (unsigned long r = 0; r < m; r++)
				s[r] = radiance_quant_row_e4m3((const uint16_t *)in + r * k, RADIANCE_DTYPE_BF16,
							       (uint32_t)k, codes + r * k);
			fwrite(s, sizeof *s, m, stdout);
			fwrite(codes, 1, m * k, stdout);
			free(codes);
			free(s);
		}
	} else if (strcmp(op, "w4a8") == 0 && argc == 5) {
		unsigned long m = strtoul(argv[2], NULL, 10), n = strtoul(argv[3], NULL, 10),
			      k = strtoul(argv[4], NULL, 10);
		size_t want = m * k * 2 + n * (k / 8) * 4 + n * (k / 128) * 2 + n * 4;
		if (k % 128 || len != want) {
			fprintf(stderr, "radiance-numerics: w4a8 wants K %% 128 == 0 and %zu bytes, got %zu\n",
				want, len);
			rc = 1;
		} else {
			/* the sections of stdin are packed back to back: copy each to
			 * its own (aligned) buffer before reading it as its type */
			size_t xb = m * k * 2, qb = n * (k / 8) * 4, sb = n * (k / 128) * 2;
			uint16_t *x = malloc(xb + 1);
			uint32_t *qw = malloc(qb + 1);
			uint16_t *sc = malloc(sb + 1);
			float *bias = malloc(n * 4 + 1);
			if (!x || !qw || !sc || !bias) {
				fprintf(stderr, "radiance-numerics: out of memory\n");
				return 1;
			}
			memcpy(x, in, xb);
			memcpy(qw, in + xb, qb);
			memcpy(sc, in + xb + qb, sb);
			memcpy(bias, in + xb + qb + sb, n * 4);
			uint16_t *y = malloc(m * n * 2 + 2);
			void *scratch = aligned_alloc(16, (radiance_cpu_w4a8_scratch_bytes(m, k) + 15) & ~15ul);
			radiance_cpu_w4a8(x, RADIANCE_DTYPE_BF16, m, qw, sc, bias, n, k, y, scratch);
			fwrite(y, 2, m * n, stdout);
			free(y);
			free(scratch);
			free(x);
			free(qw);
			free(sc);
			free(bias);
		}
	} else if (strcmp(op, "w4a8-bound") == 0 && argc == 6 &&
		   (strcmp(argv[5], "fp32") == 0 || strcmp(argv[5], "fp8-sm90") == 0)) {
		rc = w4a8_bound(in, len, strtoul(argv[2], NULL, 10), strtoul(argv[3], NULL, 10),
				strtoul(argv[4], NULL, 10),
				strcmp(argv[5], "fp32") == 0 ? RADIANCE_ACC_FP32 : RADIANCE_ACC_FP8_SM90);
	} else {
		rc = usage();
	}
	free(in);
	return rc;
}
