/* The default limits' memory figure and the wording of a refusal. */
#include "limit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The smallest memory.max on the way from our cgroup up to the root (a
 * parent's limit binds its children too), or 0 when there is none (cgroup
 * v1, no controller, "max" everywhere). */
static uint64_t cgroup_memory_max(void)
{
	FILE *f = fopen("/proc/self/cgroup", "r");
	char line[4096], path[4200];
	uint64_t best = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "0::", 3) != 0)
			continue;
		line[strcspn(line, "\n")] = 0;
		char *dir = line + 3;
		for (;;) {
			snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max",
				 strcmp(dir, "/") == 0 ? "" : dir);
			FILE *m = fopen(path, "r");
			char v[64];
			if (m && fgets(v, sizeof v, m)) {
				char *end;
				unsigned long long b = strtoull(v, &end, 10);
				if (end != v && (*end == '\n' || !*end) && (!best || b < best))
					best = b;
			}
			if (m)
				fclose(m);
			char *slash = strrchr(dir, '/');
			if (!slash || slash == dir)
				break;
			*slash = 0;
		}
	}
	fclose(f);
	return best;
}

uint64_t limit_memory_bytes(const char **from)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
	uint64_t cg = cgroup_memory_max();
	if (cg && (!phys || cg < phys)) {
		*from = "cgroup memory.max";
		return cg;
	}
	*from = "physical memory";
	return phys;
}

void limit_format_bytes(uint64_t v, char *out, size_t len)
{
	static const char units[] = "KMGTPE";
	if (v < 1024) {
		snprintf(out, len, "%" PRIu64, v);
		return;
	}
	int u = 0;
	while (u < 5 && v >= (1024ull << (10 * (u + 1))))
		u++;
	uint64_t unit = 1024ull << (10 * u);
	if (v % unit == 0)
		snprintf(out, len, "%" PRIu64 "%c", v / unit, units[u]);
	else
		snprintf(out, len, "%.1f%c", (double)v / (double)unit, units[u]);
}

void limit_option(const char *key, char *out, size_t len)
{
	char opt[64];
	snprintf(opt, sizeof opt, "%s", key);
	for (char *p = opt; *p; p++)
		if (*p == '_')
			*p = '-';
	snprintf(out, len, "%s in radianced.conf, or --%s", key, opt);
}

void limit_refusal(char *err, size_t errlen, const char *doing, const char *whose,
		    const char *what, uint64_t would, const char *key, uint64_t limit, int bytes)
{
	char w[32], l[32], where[96];
	if (bytes) {
		limit_format_bytes(would, w, sizeof w);
		limit_format_bytes(limit, l, sizeof l);
	} else {
		snprintf(w, sizeof w, "%" PRIu64, would);
		snprintf(l, sizeof l, "%" PRIu64, limit);
	}
	limit_option(key, where, sizeof where);
	snprintf(err, errlen, "%s would make %s %s %s, above %s = %s (%s)", doing, whose, what, w,
		 key, l, where);
}
