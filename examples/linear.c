/*
 * The smallest useful libradiance program: load a checkpoint (or attach to a
 * resident model), run one linear layer on a few rows, print a corner of the
 * output.
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

#include "radiance.h"

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

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CHECKPOINT_DIR [LAYER_NAME] [ROWS]\n", argv[0]);
		return 2;
	}
	struct radiance *r = radiance_connect(NULL, NULL);
	if (!r) {
		fprintf(stderr, "connect: %s\n", radiance_strerror(errno));
		return 1;
	}
	uint32_t model;
	int rc = radiance_load_model(r, argv[1], NULL, &model);
	if (rc < 0) {
		fprintf(stderr, "load %s: %s\n", argv[1], radiance_error_message(r));
		radiance_disconnect(r);
		return 1;
	}
	const struct radiance_model_info *m = radiance_held_model(r, model);
	int layer = argc > 2 ? radiance_find_layer(m, argv[2]) : 0;
	if (layer < 0) {
		fprintf(stderr, "no layer %s in %s\n", argv[2], m->name);
		radiance_disconnect(r);
		return 1;
	}
	const struct radiance_layer_info *l = &m->layers[layer];
	uint32_t rows = argc > 3 ? (uint32_t)atoi(argv[3]) : 4;
	if (rows == 0)
		rows = 1;

	/* x [rows, K] bf16: a smooth test pattern. y [rows, N] bf16. */
	uint16_t *x = malloc((size_t)rows * l->k * 2);
	uint16_t *y = malloc((size_t)rows * l->n * 2);
	for (uint32_t i = 0; i < rows; i++)
		for (uint32_t k = 0; k < l->k; k++)
			x[(size_t)i * l->k + k] = to_bf16((float)((i + 1) * (k % 17)) / 16.0f - 0.5f);

	rc = radiance_linear(r, model, (uint32_t)layer, rows, RADIANCE_BF16, x, y);
	if (rc < 0) {
		fprintf(stderr, "linear: %s\n", radiance_error_message(r));
	} else {
		printf("%s: %s [%u x %u] on %u rows\n", m->name, l->name, l->n, l->k, rows);
		for (uint32_t i = 0; i < rows && i < 4; i++) {
			printf("  y[%u][0..3] =", i);
			for (uint32_t n = 0; n < 4 && n < l->n; n++)
				printf(" %9.4f", from_bf16(y[(size_t)i * l->n + n]));
			printf("\n");
		}
	}
	free(x);
	free(y);
	radiance_disconnect(r);
	return rc < 0 ? 1 : 0;
}
