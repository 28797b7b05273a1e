/*
 * The smallest useful libradiance program: load a checkpoint (or attach to a
 * resident model), run one linear layer on a few rows, print a corner of the
 * output. Every call is checked, and every failure says what to do.
 *
 *   build/examples/linear CHECKPOINT_DIR [LAYER_NAME] [ROWS]
 *   cc linear.c $(pkg-config --cflags --libs radiance)
 *
 * The socket is the default one (RADIANCE_SOCKET overrides).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "radiance.h"

/* Rows are allocated here twice over (x and y): a bound keeps a typo from
 * asking for gigabytes. The library itself takes any count and splits it. */
#define MAX_ROWS 65536u

/* fp32 -> bf16 bits, round to nearest even (finite inputs) */
static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7FFFu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void usage(FILE *f, const char *prog)
{
	fprintf(f,
		"usage: %s CHECKPOINT_DIR [LAYER_NAME] [ROWS]\n"
		"  Loads the AutoRound int4 checkpoint in CHECKPOINT_DIR into radianced (or\n"
		"  attaches to it if it is already resident), runs LAYER_NAME (default: the\n"
		"  first linear layer) on ROWS rows of a test pattern (1 to %u, default 4)\n"
		"  and prints the first outputs. The daemon's socket is $RADIANCE_SOCKET, else\n"
		"  the default one (see radiance_default_socket_path in radiance.h).\n",
		prog, MAX_ROWS);
}

/* The most specific text for a failure: the daemon's or the library's
 * message when there is one, else the code's name. */
static const char *why(const struct radiance *r, int rc)
{
	const char *msg = radiance_error_message(r);
	return *msg ? msg : radiance_strerror(rc);
}

/* libradiance is silent; this keeps its last warning. When
 * radiance_connect() fails there is no handle to ask for the reason, so it
 * comes this way (e.g. the daemon's "too many sessions (the limit is 64)"). */
static void keep_warning(void *user, int priority, const char *message)
{
	if (priority <= LOG_WARNING)
		snprintf(user, 512, "%s", message);
}

int main(int argc, char **argv)
{
	const char *prog = argv[0] ? argv[0] : "linear";
	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		usage(stdout, prog);
		return 0;
	}
	if (argc < 2 || argc > 4 || !*argv[1]) {
		usage(stderr, prog);
		return 2;
	}
	if (argv[1][0] == '-') {
		fprintf(stderr, "%s: unknown option '%s' (--help for usage)\n", prog, argv[1]);
		return 2;
	}
	uint32_t rows = 4;
	if (argc > 3) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(argv[3], &end, 10);
		/* strtoul accepts "-3" (as a huge number): digits only */
		if (argv[3][0] < '0' || argv[3][0] > '9' || *end || errno || v < 1 || v > MAX_ROWS) {
			fprintf(stderr, "%s: ROWS must be a whole number from 1 to %u, not '%s'\n", prog,
				MAX_ROWS, argv[3]);
			return 2;
		}
		rows = (uint32_t)v;
	}

	char path[108];
	int prc = radiance_default_socket_path(path, sizeof path);
	if (prc == -EINVAL) {
		fprintf(stderr, "%s: $RADIANCE_DEVICE is '%s', not a GPU ordinal (0 to 1024)\n", prog,
			getenv("RADIANCE_DEVICE"));
		return 1;
	} else if (prc < 0) {
		fprintf(stderr, "%s: $RADIANCE_SOCKET is too long for a socket path\n", prog);
		return 1;
	}
	char warning[512] = "";
	struct radiance_options opt = RADIANCE_OPTIONS_INIT;
	opt.client_name = "examples/linear";
	opt.log = keep_warning;
	opt.log_user = warning;
	struct radiance *r = radiance_connect(path, &opt);
	if (!r) {
		int e = errno;
		if (*warning)   /* "cannot connect to PATH: REASON" */
			fprintf(stderr, "%s: %s\n", prog, warning);
		else
			fprintf(stderr, "%s: cannot connect to %s: %s\n", prog, path,
				radiance_strerror(e));
		if (e == ENOENT || e == ECONNREFUSED)
			fprintf(stderr, "%s: is radianced running? RADIANCE_SOCKET names another "
					"socket\n", prog);
		return 1;
	}
	int ret = 1;
	uint16_t *x = NULL, *y = NULL;
	uint32_t model;
	int rc = radiance_load_model(r, argv[1], NULL, &model);
	if (rc < 0) {
		fprintf(stderr, "%s: load %s: %s\n", prog, argv[1], why(r, rc));
		goto out;
	}
	const struct radiance_model_info *m = radiance_held_model(r, model);
	if (!m || m->n_layers == 0) {
		fprintf(stderr, "%s: model %u has no linear layers\n", prog, model);
		goto out;
	}
	int layer = argc > 2 ? radiance_find_layer(m, argv[2]) : 0;
	if (layer < 0) {
		fprintf(stderr, "%s: model \"%s\" has no layer \"%s\" (radiancectl layers %s lists "
				"them)\n", prog, m->name, argv[2], m->name);
		goto out;
	}
	const struct radiance_layer_info *l = &m->layers[layer];

	/* x [rows, K] bf16: a smooth test pattern. y [rows, N] bf16. */
	x = malloc((size_t)rows * l->k * sizeof *x);
	y = malloc((size_t)rows * l->n * sizeof *y);
	if (!x || !y) {
		fprintf(stderr, "%s: out of memory for %u rows of [%u x %u]\n", prog, rows, l->n, l->k);
		goto out;
	}
	for (uint32_t i = 0; i < rows; i++)
		for (uint32_t k = 0; k < l->k; k++)
			x[(size_t)i * l->k + k] =
				to_bf16((float)((i % 64 + 1) * (k % 17)) / 16.0f - 0.5f);

	rc = radiance_linear(r, model, (uint32_t)layer, rows, RADIANCE_BF16, x, y);
	if (rc < 0) {
		fprintf(stderr, "%s: linear %s: %s\n", prog, l->name, why(r, rc));
		goto out;
	}
	printf("%s: %s [%u x %u] on %u rows\n", m->name, l->name, l->n, l->k, rows);
	for (uint32_t i = 0; i < rows && i < 4; i++) {
		printf("  y[%u][0..3] =", i);
		for (uint32_t n = 0; n < 4 && n < l->n; n++)
			printf(" %9.4f", from_bf16(y[(size_t)i * l->n + n]));
		printf("\n");
	}
	ret = 0;
out:
	free(x);
	free(y);
	radiance_disconnect(r);
	return ret;
}
