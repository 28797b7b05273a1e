/* Model lookup and teardown; loading lives in checkpoint.c. */
#include "model.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long radiance_model_find_layer(const struct radiance_model *m, const char *name)
{
	for (size_t i = 0; i < m->n_layers; i++)
		if (strcmp(m->layers[i].name, name) == 0)
			return (long)i;
	return -1;
}

void radiance_model_destroy(struct radiance_model *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n_layers; i++) {
		struct radiance_layer *l = &m->layers[i];
		free(l->name);
		free(l->qweight);
		free(l->scales);
		free(l->weight);
		free(l->bias);
	}
	for (size_t i = 0; i < m->n_other; i++)
		free(m->other[i].name);
	free(m->layers);
	free(m->other);
	if (m->tensors_fd >= 0)
		close(m->tensors_fd);
	free(m->name);
	free(m);
}
