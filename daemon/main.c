/* radianced: serve W4A8 linear layers of resident int4 checkpoints. */
#include <stdio.h>

#include "config.h"
#include "log.h"
#include "server.h"

int main(int argc, char **argv)
{
	struct radiance_config cfg;
	char err[512] = "";
	int rc = config_load(&cfg, argc, argv, err, sizeof err);
	if (rc != 0) {
		if (rc < 0)
			fprintf(stderr, "radianced: %s\n", err);
		config_finish(&cfg);
		return rc < 0 ? 2 : 0;
	}
	rlog_init(cfg.log_level);
	rc = server_run(&cfg);
	config_finish(&cfg);
	return rc;
}
