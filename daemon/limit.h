/*
 * What an administrator bounds about memory and clients (docs/daemon.md,
 * "Limits"): resident model bytes and arena bytes, of everyone together and
 * of one peer uid, and the sessions of one uid. The counting lives with
 * what is counted (registry.c charges models, session.c sums arenas,
 * server.c counts sessions); this file holds what they share: the default
 * derived from memory, and the one wording of a refusal, which names the
 * limit, its value and the option that sets it.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef RADIANCE_LIMIT_H
#define RADIANCE_LIMIT_H

#include <stddef.h>
#include <stdint.h>

/* "auto" in the config: resolved by config_load (config.c). */
#define LIMIT_AUTO UINT64_MAX

/* The memory this daemon may use: the host's physical memory, or less when
 * its cgroup (v2 memory.max, e.g. systemd's MemoryMax=) says so. *from gets
 * a static description ("physical memory", "cgroup memory.max"). 0 when
 * neither can be read. */
uint64_t limit_memory_bytes(const char **from);

/* v as a config value would write it: "16M" when exact, else one decimal
 * ("22.6M"), "512" below 1K. */
void limit_format_bytes(uint64_t v, char *out, size_t len);

/* Where key is set, for a message: "<key> in radianced.conf, or
 * --<key with '-'>". */
void limit_option(const char *key, char *out, size_t len);

/* The refusal: "<doing> would make <whose> <what> <would>, above <key> =
 * <limit> (<key> in radianced.conf, or --<key with '-'>)". bytes: the two
 * values are bytes (formatted by limit_format_bytes), else counts. */
void limit_refusal(char *err, size_t errlen, const char *doing, const char *whose,
		    const char *what, uint64_t would, const char *key, uint64_t limit, int bytes);

#endif
