/* Defaults, config file (libinih) and command line (getopt_long). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "checkpoint.h"
#include "io.h"
#include "limit.h"
#include "log.h"
#include "notify.h"
#include "scheduler.h"
#include "shm_layout.h"
#include "text.h"
#include "wire.h"

/* Room for a value, key, option or path as a message shows it: through
 * rtext_escape, which writes a control character (a newline, ESC) as \xNN
 * so that a value cannot forge a log line or drive a terminal, and cuts a
 * longer one with "...". */
#define CONFIG_SHOWN_MAX 512

enum value_type {
	V_STRING, V_BACKEND, V_BOOL, V_INT, V_U32, V_POW2, V_BYTES, V_LOGLEVEL, V_PRELOAD,
	V_MAPALLOW, V_SHARE,
	V_UIDWEIGHTS,              /* cfg->uid_weights: "WHO:WEIGHT ..." */
	V_CHOICE,                  /* uint32_t: the index of the value in choices[] */
	V_LIMIT_BYTES, V_LIMIT,    /* uint64_t: bytes or a count, or "auto" (LIMIT_AUTO) */
};

struct setting {
	const char *key;          /* config file key; the long option is the same with '-' */
	int opt;                  /* getopt value: a short option letter or >= 256 */
	const char *arg;          /* argument name for --help */
	enum value_type type;
	size_t offset;
	uint64_t min, max;
	const char *help;
};

#define OFF(f) offsetof(struct radiance_config, f)
static const struct setting settings[] = {
	{ "socket", 's', "PATH", V_STRING, OFF(socket_path), 0, 0,
	  "listening socket (default " RADIANCE_DEFAULT_ROOT_SOCKET " as root, else "
	  "$XDG_RUNTIME_DIR/radiance.sock)" },
	{ "group", 'g', "GROUP", V_STRING, OFF(socket_group), 0, 0,
	  "group owning the socket, which is then mode 0660 (default: none, 0600)" },
	{ "backend", 'b', "KIND", V_BACKEND, OFF(backend), 0, 0, "auto, cpu or gpu (default auto)" },
	{ "require_gpu", 268, "[=yes|no]", V_BOOL, OFF(require_gpu), 0, 1,
	  "with backend auto: fail to start instead of falling back to the CPU when "
	  "this build has no GPU backend or no device answers (no; the option alone "
	  "means yes)" },
	{ "device", 'd', "N", V_INT, OFF(device), 0, 1024,
	  "GPU ordinal (default 0); no effect on the cpu backend" },
	{ "preload", 'p', "DIR", V_PRELOAD, OFF(preload), 0, 0,
	  "load this checkpoint at start and keep it resident (repeatable; the config "
	  "key takes a space-separated list, \"quoted\" where a directory has spaces)" },
	{ "max_sessions", 256, "N", V_U32, OFF(max_sessions), 1, 65536,
	  "connections at once, counting those still in the handshake (64)" },
	{ "max_arena_bytes", 257, "BYTES", V_BYTES, OFF(max_arena_bytes), 4096, RADIANCE_SHM_MAX_ARENA_BYTES,
	  "largest arena a session may ask for (1G)" },
	{ "arena_bytes", 258, "BYTES", V_BYTES, OFF(arena_bytes), 4096, RADIANCE_SHM_MAX_ARENA_BYTES,
	  "arena when a session asks for the default (64M)" },
	{ "max_rows", 259, "N", V_U32, OFF(max_rows), 1, 65536,
	  "most rows (M) per request and per merged launch (512)" },
	{ "max_inflight", 260, "N", V_U32, OFF(max_inflight), 1, 1u << 20,
	  "requests per session submitted but not completed (1024)" },
	{ "max_sq_entries", 261, "N", V_POW2, OFF(max_sq_entries), 1, RADIANCE_SHM_MAX_ENTRIES,
	  "largest SQ/CQ a session may ask for, a power of two (1024)" },
	{ "sq_entries", 262, "N", V_POW2, OFF(sq_entries), 1, RADIANCE_SHM_MAX_ENTRIES,
	  "SQ/CQ entries when a session asks for the default (256)" },
	{ "max_k", 263, "N", V_U32, OFF(max_k), 128, 1u << 20,
	  "largest layer K the backend's scratch is sized for (32768)" },
	{ "max_n", 264, "N", V_U32, OFF(max_n), 1, 1u << 22,
	  "largest layer N the backend's scratch is sized for (65536)" },
	{ "hello_timeout_ms", 265, "MS", V_U32, OFF(hello_timeout_ms), 1, 3600000,
	  "close a connection that sends no Hello within this many ms (5000)" },
	{ "decode_rows", 266, "N", V_U32, OFF(decode_rows), 1, 64,
	  "largest M served by the GPU's split-K decode kernel; sizes its partials "
	  "scratch, allocated once at start (64, the kernel's largest token tile; "
	  "at most max_rows)" },
	{ "numerics_gate", 267, "0|1", V_U32, OFF(numerics_gate), 0, 1,
	  "GPU: compare the first launch of each (layer, M) with the CPU reference "
	  "and log the relative error (0; also RADIANCE_NUMERICS_GATE=0|1)" },
	{ "share", 270, "HOW", V_SHARE, OFF(share), 0, 0,
	  "GPU: how models are allocated so MapModel can share them: vmm, ipc, none, "
	  "or auto: vmm where the device has it, else ipc (auto; also RADIANCE_SHARE)" },
	{ "zero_copy_rows", 272, "N", V_U32, OFF(zero_copy_rows), 0, 65536,
	  "GPU: launches of at most this many rows read x from and write y into "
	  "the session arenas through their device mapping instead of copying "
	  "(docs/gpu.md has the crossover); 0: always copy (64)" },
	{ "zero_copy_x_kib", 274, "KIB", V_U32, OFF(zero_copy_x_kib), 0, 1u << 20,
	  "GPU: a zero-copy launch's quant reads x in place through the arenas' "
	  "device mapping when no request's x is larger than this many KiB (the "
	  "requests' rows are read at once); else the row-copy kernel gathers x "
	  "into device memory first; 0: always gather (1024)" },
	{ "zero_copy_y_kib", 275, "KIB", V_U32, OFF(zero_copy_y_kib), 0, 1u << 20,
	  "GPU: a zero-copy launch's GEMM writes y in place through the arenas' "
	  "device mapping when no request's y is larger than this many KiB (a "
	  "launch of several requests: when it is in the decode band, "
	  "decode_rows); else y is scattered from device memory by the row-copy "
	  "kernel; 0: always scatter (1024)" },
	{ "pin_piece_kib", 273, "KIB", V_U32, OFF(pin_piece_kib), 0, 1u << 22,
	  "GPU: page-lock each session arena in pieces of this many KiB, a multiple "
	  "of 4, so that no registration holds the driver's lock (which every launch "
	  "waits for) for long; 0: each arena as one range (1024)" },
	{ "fake_share", 271, "0|1", V_U32, OFF(fake_share), 0, 1,
	  "tests only: the cpu backend exports a sealed memfd of the host arrays for "
	  "MapModel (0; also RADIANCE_FAKE_SHARE=0|1)" },
	{ "test_pin_delay_us", 600, "US", V_U32, OFF(test_pin_delay_us), 0, 10000000,
	  "tests only: the cpu backend sleeps this long in each arena registration and "
	  "unregistration, as a GPU's page-locking does, and with fake_share in each "
	  "model's allocation (0; also RADIANCE_TEST_PIN_DELAY_US)" },
	{ "map_allow", 269, "WHO", V_MAPALLOW, OFF(map_allow), 0, 0,
	  "who may map models' device memory into their own process (MapModel, "
	  "docs/mapped.md): owner (root and the daemon's user), all, or none (owner); "
	  "a mapping process can write the weights every session computes with" },
	{ "cpu_threads", 290, "N", V_U32, OFF(cpu_threads), 0, 4096,
	  "CPU backend: compute threads, the executor's included; 0: as many as this "
	  "process may run on (sched_getaffinity, capped by cgroup cpu.max) (0)" },
	/* kernel settings (docs/cpu.md, docs/gpu.md, docs/numerics.md "Contract") */
	{ "cpu_simd", 500, "LEVEL", V_CHOICE, OFF(cpu_simd), 0, 0,
	  "CPU backend: SIMD kernels: auto (the best this CPU has: avx512, else "
	  "avx2 on x86-64; neon on aarch64), scalar (the reference kernels), avx2 (the "
	  "same bits as scalar), avx512 (W4A8 on AVX-512 BF16 dot products, the same "
	  "bits as scalar), neon (aarch64, the same bits as scalar) or "
	  "avx2-int16 (W4A8 group sums in 16-bit integers: within a stated bound of "
	  "the reference, not bit-exact; never chosen by auto); a level the CPU lacks "
	  "fails start-up (auto)" },
	{ "prefill", 501, "HOW", V_CHOICE, OFF(prefill), 0, 0,
	  "GPU: W4A8 launches above decode_rows: exact (f16 tensor cores, fp32 "
	  "accumulation, within one bf16 step of the definition), fast (sm_90a fp8 "
	  "wgmma, Hopper's ~14-bit accumulation: within the bound of docs/numerics.md; "
	  "exact where there is no wgmma, and for launches of up to 64 rows) or auto "
	  "(fast where the wgmma kernel runs, else exact) (auto)" },
	{ "wgmma_tile", 502, "TOKENS", V_CHOICE, OFF(wgmma_tile), 0, 0,
	  "GPU, prefill = fast: tokens per wgmma block: auto (96 where 128 leaves SMs "
	  "idle, else 128), 128 or 96 (auto)" },
	/* scheduling: fairness between sessions (daemon/scheduler.h) */
	{ "sched_chunk_rows", 291, "N", V_U32, OFF(sched_chunk_rows), 0, 65536,
	  "a request of more rows runs in pieces of this many, with other sessions' "
	  "work and jobs in between; one piece of the biggest layer per busy session "
	  "is what a small request may wait; 0: 256 on a GPU backend, 32 on the CPU "
	  "(0)" },
	{ "sched_session_rows", 292, "N", V_U32, OFF(sched_session_rows), 1, 1u << 24,
	  "rows one session may have in flight (taken from its SQ, not answered); a "
	  "request that would go above waits in the SQ until results free rows; "
	  "one of more rows runs alone (1024)" },
	{ "sched_gather_us", 293, "US", V_U32, OFF(sched_gather_us), 0, 1000,
	  "while two or more sessions are busy, wait up to this long before a "
	  "launch for the busy sessions that have not submitted yet, so that "
	  "lockstep clients share one launch; a lone session never waits (20)" },
	{ "sched_uid_weights", 294, "LIST", V_UIDWEIGHTS, OFF(uid_weights), 0, 0,
	  "device-time shares: space-separated USER:WEIGHT (a user name or uid, "
	  "a weight 1..1000); busy uids share the device in proportion to their "
	  "weights, and a uid's busy sessions its share in equal parts; uids not "
	  "listed weigh 1 (none: every uid alike)" },
	{ "log_level", 'l', "LEVEL", V_LOGLEVEL, OFF(log_level), 0, 0,
	  "silent, error, warn, info or debug (info)" },
	/* memory and per-uid limits: 0 is none, auto is derived (docs/daemon.md "Limits") */
	{ "max_model_bytes", 400, "BYTES", V_LIMIT_BYTES, OFF(max_model_bytes), 0, 1ull << 50,
	  "resident bytes of all models together; auto: three quarters of the memory the daemon "
	  "may use (RAM, or its cgroup's memory.max) (auto)" },
	{ "max_model_bytes_per_uid", 401, "BYTES", V_LIMIT_BYTES, OFF(max_model_bytes_per_uid), 0,
	  1ull << 50, "resident bytes of the models one uid loaded (a shared model counts for "
	  "the uid that loaded it); auto: max_model_bytes (auto)" },
	{ "max_total_arena_bytes", 402, "BYTES", V_LIMIT_BYTES, OFF(max_total_arena_bytes), 0,
	  1ull << 50, "arena bytes of all sessions together; auto: a quarter of the memory, at "
	  "least arena_bytes (auto)" },
	{ "max_arena_bytes_per_uid", 403, "BYTES", V_LIMIT_BYTES, OFF(max_arena_bytes_per_uid), 0,
	  1ull << 50, "arena bytes of one uid's sessions; auto: max_total_arena_bytes (auto)" },
	{ "max_sessions_per_uid", 404, "N", V_LIMIT, OFF(max_sessions_per_uid), 0, 65536,
	  "sessions of one uid at once; auto: max_sessions (auto)" },
};
#define NSETTINGS (sizeof settings / sizeof settings[0])

/* The values of each V_CHOICE setting, in the order of their indices. */
static const char *const cpu_simd_choices[] = { "auto", "scalar", "avx2", "avx2-int16", "avx512",
					       "neon", NULL };
static const char *const prefill_choices[] = { "auto", "exact", "fast", NULL };
static const char *const wgmma_tile_choices[] = { "auto", "128", "96", NULL };
static const struct {
	size_t offset;
	const char *const *values;
} choices[] = {
	{ OFF(cpu_simd), cpu_simd_choices },
	{ OFF(prefill), prefill_choices },
	{ OFF(wgmma_tile), wgmma_tile_choices },
};

static const char *const *choices_of(const struct setting *st)
{
	for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++)
		if (choices[i].offset == st->offset)
			return choices[i].values;
	return NULL;
}
enum { OPT_CONFIG = 'c', OPT_NO_CONFIG = 300, OPT_HELP = 'h', OPT_VERSION = 'V' };

/* Where each setting's value came from ("default", "--max-rows",
 * "/etc/radiance/radianced.conf:12"), for errors about combinations; and
 * where each cfg->preload[i] came from, as preload is a list. */
struct origins {
	char where[NSETTINGS][320];
	char **preload_from;
	size_t n_preload_from;
};

static size_t setting_index(const char *key)
{
	for (size_t i = 0; i < NSETTINGS; i++)
		if (strcmp(settings[i].key, key) == 0)
			return i;
	return NSETTINGS;
}

static const char *origin(const struct origins *o, const char *key)
{
	size_t i = setting_index(key);
	return i < NSETTINGS && o->where[i][0] ? o->where[i] : "default";
}

static void origins_clear_preload(struct origins *o)
{
	for (size_t i = 0; i < o->n_preload_from; i++)
		free(o->preload_from[i]);
	free(o->preload_from);
	o->preload_from = NULL;
	o->n_preload_from = 0;
}

/* Records `where` as the origin of the preloads apply() just added. */
static int origins_add_preload(struct origins *o, const struct radiance_config *cfg,
			       const char *where)
{
	if (cfg->n_preload <= o->n_preload_from)
		return 0;
	char **p = realloc(o->preload_from, cfg->n_preload * sizeof *p);
	if (!p)
		return -ENOMEM;
	o->preload_from = p;
	while (o->n_preload_from < cfg->n_preload) {
		p[o->n_preload_from] = strdup(where);
		if (!p[o->n_preload_from])
			return -ENOMEM;
		o->n_preload_from++;
	}
	return 0;
}

int config_init(struct radiance_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->backend = strdup("auto");
	if (!cfg->backend)
		return -ENOMEM;
	cfg->max_sessions = 64;
	cfg->max_arena_bytes = 1ull << 30;
	cfg->arena_bytes = 64ull << 20;
	cfg->max_rows = 512;
	cfg->max_inflight = 1024;
	cfg->max_sq_entries = 1024;
	cfg->sq_entries = 256;
	cfg->max_k = 32768;
	cfg->max_n = 65536;
	cfg->hello_timeout_ms = 5000;
	cfg->decode_rows = 64;
	cfg->sched_chunk_rows = 0;   /* auto: by backend, executor_main */
	cfg->sched_session_rows = 1024;
	cfg->sched_gather_us = 20;
	cfg->zero_copy_rows = 64;
	cfg->zero_copy_x_kib = 1024;   /* the H200 crossover, docs/gpu.md "Moving rows" */
	cfg->zero_copy_y_kib = 1024;
	cfg->pin_piece_kib = 1024;
	cfg->device = -1;   /* not given: the GPU backend takes 0, the CPU one does not warn */
	cfg->log_level = RADIANCE_LOG_INFO;
	cfg->socket_gid = (gid_t)-1;
	cfg->max_model_bytes = cfg->max_model_bytes_per_uid = LIMIT_AUTO;
	cfg->max_total_arena_bytes = cfg->max_arena_bytes_per_uid = LIMIT_AUTO;
	cfg->max_sessions_per_uid = LIMIT_AUTO;
	return 0;
}

static void preload_clear(struct radiance_config *cfg)
{
	for (size_t i = 0; i < cfg->n_preload; i++)
		free(cfg->preload[i]);
	free(cfg->preload);
	cfg->preload = NULL;
	cfg->n_preload = 0;
}

void config_finish(struct radiance_config *cfg)
{
	free(cfg->config_path);
	free(cfg->socket_path);
	free(cfg->socket_group);
	free(cfg->backend);
	free(cfg->share);
	free(cfg->uid_weights);
	preload_clear(cfg);
	memset(cfg, 0, sizeof *cfg);
}

static int preload_add(struct radiance_config *cfg, const char *dir, size_t len)
{
	char **p = realloc(cfg->preload, (cfg->n_preload + 1) * sizeof *p);
	if (!p)
		return -ENOMEM;
	cfg->preload = p;
	p[cfg->n_preload] = strndup(dir, len);
	if (!p[cfg->n_preload])
		return -ENOMEM;
	cfg->n_preload++;
	return 0;
}

/* Whole-string unsigned decimal, with K/M/G/T (powers of 1024, optional
 * "iB"/"B") when bytes. */
static int parse_u64(const char *s, int bytes, uint64_t *out)
{
	char *end;
	if (!*s || *s == '-' || *s == '+' || *s == ' ')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	if (bytes && *end) {
		int shift;
		switch (*end) {
		case 'K': case 'k': shift = 10; break;
		case 'M': case 'm': shift = 20; break;
		case 'G': case 'g': shift = 30; break;
		case 'T': case 't': shift = 40; break;
		default: return -EINVAL;
		}
		end++;
		if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0)
			end += strlen(end);
		if (v > (UINT64_MAX >> shift))
			return -EINVAL;
		v <<= shift;
	}
	if (*end)
		return -EINVAL;
	*out = v;
	return 0;
}

/* "WHO:WEIGHT ..." (space- or comma-separated; WHO a user name or a uid)
 * into cfg->uid_weights, replacing what was there. */
static int parse_uid_weights(struct radiance_config *cfg, const char *value, const char *where,
			     char *err, size_t errlen)
{
	struct radiance_uid_weight *v = NULL;
	size_t n = 0;
	int rc = -EINVAL;
	for (const char *p = value;;) {
		p += strspn(p, " \t,");
		if (!*p)
			break;
		size_t len = strcspn(p, " \t,");
		char item[160], *colon;
		snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), p);
		p += len;
		char shown[CONFIG_SHOWN_MAX];
		rtext_escape(item, shown, sizeof shown);
		uint64_t w, id;
		colon = strrchr(item, ':');
		if (!colon || colon == item || parse_u64(colon + 1, 0, &w) < 0 || w < 1 ||
		    w > SCHED_MAX_WEIGHT) {
			snprintf(err, errlen, "%s: '%s' is not USER:WEIGHT (a user name or uid, a "
				 "weight 1..%u)", where, shown, SCHED_MAX_WEIGHT);
			goto fail;
		}
		*colon = 0;
		rtext_escape(item, shown, sizeof shown);   /* the user alone now */
		errno = 0;
		struct passwd *pw = getpwnam(item);
		if (pw) {
			id = pw->pw_uid;
		} else if (parse_u64(item, 0, &id) < 0 || id >= (uid_t)-1) {
			snprintf(err, errlen, "%s: '%s' is neither a user nor a uid", where, shown);
			goto fail;
		}
		for (size_t i = 0; i < n; i++)
			if (v[i].uid == (uid_t)id) {
				snprintf(err, errlen, "%s: uid %llu ('%s') is given twice", where,
					 (unsigned long long)id, shown);
				goto fail;
			}
		struct radiance_uid_weight *nv = realloc(v, (n + 1) * sizeof *v);
		if (!nv) {
			rc = -ENOMEM;
			goto fail;
		}
		v = nv;
		v[n++] = (struct radiance_uid_weight){ (uid_t)id, (uint32_t)w };
	}
	if (!n) {
		snprintf(err, errlen, "%s: empty value (expected USER:WEIGHT ...)", where);
		goto fail;
	}
	free(cfg->uid_weights);
	cfg->uid_weights = v;
	cfg->n_uid_weights = n;
	return 0;
fail:
	free(v);
	return rc;
}

uint32_t config_uid_weight(const struct radiance_config *cfg, uid_t uid)
{
	for (size_t i = 0; i < cfg->n_uid_weights; i++)
		if (cfg->uid_weights[i].uid == uid)
			return cfg->uid_weights[i].weight;
	return 1;
}

/* Applies value to the setting; `where` names it for errors ("--max-rows" or
 * "file:12: max_rows"). A `where` that begins with '-' is the command line,
 * where a preload value is one directory (the file's is a list). */
static int apply(struct radiance_config *cfg, const struct setting *st, const char *value,
		 const char *where, char *err, size_t errlen)
{
	void *field = (char *)cfg + st->offset;
	uint64_t v;
	int lvl;
	/* the value as messages show it: a newline or an escape sequence in it
	 * would forge a line of the log or drive the terminal */
	char shown[CONFIG_SHOWN_MAX];
	rtext_escape(value ? value : "", shown, sizeof shown);

	switch (st->type) {
	case V_BACKEND:
		if (strcmp(value, "auto") && strcmp(value, "cpu") && strcmp(value, "gpu")) {
			snprintf(err, errlen, "%s: '%s' is not a backend (expected auto, cpu or gpu)",
				 where, shown);
			return -EINVAL;
		}
		goto string;
	case V_SHARE:
		if (strcmp(value, "auto") && strcmp(value, "vmm") && strcmp(value, "ipc") &&
		    strcmp(value, "none")) {
			snprintf(err, errlen, "%s: '%s' is not a share mode (expected auto, vmm, ipc or "
				 "none)", where, shown);
			return -EINVAL;
		}
		goto string;
	case V_STRING:
	string: {
		if (!*value) {
			snprintf(err, errlen, "%s: empty value", where);
			return -EINVAL;
		}
		char *dup = strdup(value);
		if (!dup)
			return -ENOMEM;
		free(*(char **)field);
		*(char **)field = dup;
		return 0;
	}
	case V_UIDWEIGHTS:
		return parse_uid_weights(cfg, value, where, err, errlen);
	case V_MAPALLOW:
		if (strcmp(value, "owner") == 0)
			cfg->map_allow = RADIANCE_MAP_ALLOW_OWNER;
		else if (strcmp(value, "all") == 0)
			cfg->map_allow = RADIANCE_MAP_ALLOW_ALL;
		else if (strcmp(value, "none") == 0)
			cfg->map_allow = RADIANCE_MAP_ALLOW_NONE;
		else {
			snprintf(err, errlen, "%s: '%s' is not a map_allow value (expected owner, all "
				 "or none)", where, shown);
			return -EINVAL;
		}
		return 0;
	case V_CHOICE: {
		const char *const *values = choices_of(st);
		char list[96] = "";
		for (uint32_t i = 0; values && values[i]; i++) {
			if (strcmp(value, values[i]) == 0) {
				*(uint32_t *)field = i;
				return 0;
			}
			snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
				 i == 0 ? "" : values[i + 1] ? ", " : " or ", values[i]);
		}
		snprintf(err, errlen, "%s: '%s' is not a %s value (expected %s)", where, shown, st->key,
			 list);
		return -EINVAL;
	}
	case V_BOOL:
		/* the command-line flag alone (no =VALUE) means yes */
		if (!value || !strcmp(value, "yes") || !strcmp(value, "true") || !strcmp(value, "1")) {
			*(uint32_t *)field = 1;
		} else if (!strcmp(value, "no") || !strcmp(value, "false") || !strcmp(value, "0")) {
			*(uint32_t *)field = 0;
		} else {
			snprintf(err, errlen, "%s: '%s' is not yes or no (also true/false, 1/0)",
				 where, shown);
			return -EINVAL;
		}
		return 0;
	case V_LOGLEVEL:
		lvl = rlog_level_parse(value);
		if (lvl < 0) {
			snprintf(err, errlen, "%s: '%s' is not a log level (expected silent, error, "
				 "warn, info or debug)", where, shown);
			return -EINVAL;
		}
		cfg->log_level = lvl;
		return 0;
	case V_PRELOAD:
		/* like any other option, an empty value is a mistake (an unset
		 * variable in a unit file), not a request for no preload */
		if (!value[strspn(value, " \t")]) {
			snprintf(err, errlen, "%s: empty value (expected a checkpoint directory)",
				 where);
			return -EINVAL;
		}
		if (where[0] == '-') {
			/* the command line: one argument is one directory, spaces
			 * and all */
			return preload_add(cfg, value, strlen(value)) < 0 ? -ENOMEM : 0;
		}
		/* the config key: a list separated by spaces; a directory with
		 * a space in it is written in double quotes */
		for (const char *p = value; *p;) {
			p += strspn(p, " \t");
			if (!*p)
				break;
			size_t n;
			if (*p == '"') {
				const char *q = strchr(p + 1, '"');
				if (!q) {
					snprintf(err, errlen, "%s: '%s' has a '\"' with no closing one (a "
						 "directory with spaces is written \"/srv/my models/m\")",
						 where, shown);
					return -EINVAL;
				}
				n = (size_t)(q - p - 1);
				if (n && preload_add(cfg, p + 1, n) < 0)
					return -ENOMEM;
				p = q + 1;
				continue;
			}
			n = strcspn(p, " \t");
			if (preload_add(cfg, p, n) < 0)
				return -ENOMEM;
			p += n;
		}
		return 0;
	case V_LIMIT_BYTES:
	case V_LIMIT:
		if (strcmp(value, "auto") == 0) {
			*(uint64_t *)field = LIMIT_AUTO;
			return 0;
		}
		if (parse_u64(value, st->type == V_LIMIT_BYTES, &v) < 0 || v > st->max) {
			snprintf(err, errlen, "%s: '%s' is not auto or %s in 0..%llu (0: no limit)",
				 where, shown, st->type == V_LIMIT_BYTES ?
				 "a byte count (K, M, G, T: powers of 1024)" : "a number",
				 (unsigned long long)st->max);
			return -EINVAL;
		}
		*(uint64_t *)field = v;
		return 0;
	case V_INT:
	case V_U32:
	case V_POW2:
	case V_BYTES:
		if (parse_u64(value, st->type == V_BYTES, &v) < 0 || v < st->min || v > st->max ||
		    (st->type == V_POW2 && (v & (v - 1)))) {
			snprintf(err, errlen, "%s: '%s' is not %s in %llu..%llu", where, shown,
				 st->type == V_POW2 ? "a power of two" :
				 st->type == V_BYTES ? "a byte count (K, M, G, T: powers of 1024)" :
						       "a number",
				 (unsigned long long)st->min, (unsigned long long)st->max);
			return -EINVAL;
		}
		if (st->type == V_BYTES)
			*(uint64_t *)field = v;
		else if (st->type == V_INT)
			*(int *)field = (int)v;
		else
			*(uint32_t *)field = (uint32_t)v;
		return 0;
	}
	return -EINVAL;
}

struct file_ctx {
	struct radiance_config *cfg;
	struct origins *origins;     /* NULL: not tracked */
	const char *path;
	FILE *f;
	int rc;
	char *err;
	size_t errlen;
	int line;                    /* of the line inih is parsing */
	int at_line_start;
	int first_line[NSETTINGS];   /* where each key was first set, or 0 */
};

/* libinih's reader: fgets that counts lines (so the handler can name them)
 * and refuses a line longer than libinih's buffer instead of letting it
 * split the line in two. */
static char *config_read_line(char *str, int num, void *stream)
{
	struct file_ctx *ctx = stream;
	memset(str, 0, (size_t)num);   /* so that a NUL byte read can be told from the end */
	if (!fgets(str, num, ctx->f))
		return NULL;
	size_t len = strlen(str);
	if (ctx->at_line_start)
		ctx->line++;
	const char *nl = memchr(str, '\n', (size_t)num - 1);
	if (nl && (size_t)(nl - str) > len) {
		/* fgets read past a NUL byte: the line is not text */
		if (!ctx->rc) {
			snprintf(ctx->err, ctx->errlen, "%s:%d: a NUL byte at column %zu (the file is "
				 "not text)", ctx->path, ctx->line, len + 1);
			ctx->rc = -EINVAL;
		}
		ctx->at_line_start = 1;
		str[0] = 0;
		return str;
	}
	ctx->at_line_start = len > 0 && str[len - 1] == '\n';
	if (!ctx->at_line_start && !feof(ctx->f)) {
		if (!ctx->rc) {
			snprintf(ctx->err, ctx->errlen, "%s:%d: line longer than %d bytes (libinih's limit; "
				 "give a longer preload path with -p/--preload, or through a shorter "
				 "symlink)", ctx->path, ctx->line, num - 3);
			ctx->rc = -EINVAL;
		}
		int c;
		while ((c = getc(ctx->f)) != EOF && c != '\n')
			;
		ctx->at_line_start = 1;
		str[0] = 0;   /* an empty line for libinih */
	}
	return str;
}

/* docs/daemon.md promises '#' and ';' comments after a value; libinih only
 * strips ';' ones. A comment starts at a '#' or ';' that begins the value or
 * follows whitespace ("a#b" stays a value). */
static void strip_inline_comment(char *v)
{
	for (char *p = v; *p; p++) {
		if ((*p == '#' || *p == ';') && (p == v || p[-1] == ' ' || p[-1] == '\t')) {
			*p = 0;
			break;
		}
	}
	size_t n = strlen(v);
	while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
		v[--n] = 0;
}

static int config_ini_line(void *user, const char *section, const char *name, const char *value
#if INI_HANDLER_LINENO
		       , int lineno
#endif
)
{
	struct file_ctx *ctx = user;
	char where[512], shown[CONFIG_SHOWN_MAX];
	if (ctx->rc)
		return 0;
	snprintf(where, sizeof where, "%s:%d: %s", ctx->path, ctx->line, name);
	if (*section && strcmp(section, "radianced") != 0) {
		rtext_escape(section, shown, sizeof shown);
		snprintf(ctx->err, ctx->errlen, "%s:%d: unknown section [%s] (expected none or "
			 "[radianced])", ctx->path, ctx->line, shown);
		ctx->rc = -EINVAL;
		return 0;
	}
	/* accept the option spelling (max-rows) as well as the key (max_rows) */
	char key[64];
	snprintf(key, sizeof key, "%s", name);
	for (char *p = key; *p; p++)
		if (*p == '-')
			*p = '_';
	size_t i = setting_index(key);
	if (i == NSETTINGS) {
		rtext_escape(name, shown, sizeof shown);
		snprintf(ctx->err, ctx->errlen, "%s:%d: unknown key '%s'", ctx->path, ctx->line, shown);
		ctx->rc = -EINVAL;
		return 0;
	}
	/* With two lines for one key the later would win without a word, while
	 * a reader of a long file stops at the first. preload is a list: its
	 * lines add up. */
	if (ctx->first_line[i] && settings[i].type != V_PRELOAD) {
		snprintf(ctx->err, ctx->errlen, "%s:%d: %s is set again (line %d set it first); "
			 "give each key once (only preload may repeat, its lines add up)",
			 ctx->path, ctx->line, settings[i].key, ctx->first_line[i]);
		ctx->rc = -EINVAL;
		return 0;
	}
	if (!ctx->first_line[i])
		ctx->first_line[i] = ctx->line;
	char *v = strdup(value);
	if (!v) {
		ctx->rc = -ENOMEM;
		return 0;
	}
	strip_inline_comment(v);
	int rc = apply(ctx->cfg, &settings[i], v, where, ctx->err, ctx->errlen);
	free(v);
	if (rc == 0 && ctx->origins) {
		snprintf(ctx->origins->where[i], sizeof ctx->origins->where[i], "%s:%d", ctx->path,
			 ctx->line);
		if (settings[i].type == V_PRELOAD)
			rc = origins_add_preload(ctx->origins, ctx->cfg, ctx->origins->where[i]);
	}
	if (rc < 0) {
		ctx->rc = rc;
		return 0;
	}
	return 1;
}

static int parse_file(struct radiance_config *cfg, struct origins *origins, const char *file,
		      char *err, size_t errlen)
{
	/* every message and origin names the file as shown, escaped */
	char path[CONFIG_SHOWN_MAX];
	rtext_escape(file, path, sizeof path);
	/* O_NONBLOCK: opening a FIFO for reading waits for a writer, forever
	 * before anything is printed; this way the open returns and the type
	 * check below refuses it. open() also takes a directory, which libinih
	 * would read as an empty file. Checking the descriptor, not the path,
	 * leaves no window for the path to change in between. */
	int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "config file %s: %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	int flags;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		snprintf(err, errlen, "config file %s: %s", path, strerror(e));
		close(fd);
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		int e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
		snprintf(err, errlen, "config file %s: %s", path,
			 e == EISDIR ? "is a directory" : "is not a regular file");
		close(fd);
		return -e;
	}
	/* a regular file never blocks, but stdio should see a plain descriptor */
	flags = fcntl(fd, F_GETFL);
	FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "r");
	if (!f) {
		int e = errno;
		snprintf(err, errlen, "config file %s: %s", path, strerror(e));
		close(fd);
		return -e;
	}
	struct file_ctx ctx = {
		.cfg = cfg, .origins = origins, .path = path, .f = f,
		.err = err, .errlen = errlen, .at_line_start = 1,
	};
	int line = ini_parse_stream(config_read_line, &ctx, config_ini_line, &ctx);
	int read_error = ferror(f);
	fclose(f);
	if (ctx.rc)
		return ctx.rc;
	if (read_error) {
		snprintf(err, errlen, "config file %s: read error", path);
		return -EIO;
	}
	if (line != 0) {
		snprintf(err, errlen, "%s:%d: syntax error (expected key = value)", path, line);
		return -EINVAL;
	}
	return 0;
}

int config_parse_file(struct radiance_config *cfg, const char *path, char *err, size_t errlen)
{
	return parse_file(cfg, NULL, path, err, errlen);
}

/* Width of the option column of --help: the longest "-x, --name ARG". */
#define USAGE_COLUMN 36

#define USAGE_WIDTH 79

/* One option: its help wrapped at word boundaries to USAGE_WIDTH. */
static void usage_line(FILE *out, const char *opt, const char *help)
{
	const int room = USAGE_WIDTH - 3 - USAGE_COLUMN;
	fprintf(out, "  %-*s ", USAGE_COLUMN, opt);
	while (*help) {
		int n = (int)strlen(help);
		if (n > room) {
			n = room;
			while (n > 0 && help[n] != ' ')
				n--;
			if (n == 0)
				n = (int)strcspn(help, " ");
		}
		fprintf(out, "%.*s\n", n, help);
		help += n;
		help += strspn(help, " ");
		if (*help)
			fprintf(out, "  %-*s ", USAGE_COLUMN, "");
	}
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: radianced [OPTION]...\n"
		"Serve W4A8 linear layers of resident int4 checkpoints to local clients.\n\n");
	usage_line(out, "-c, --config PATH",
		   "config file (default " RADIANCE_DEFAULT_CONFIG " if it exists)");
	usage_line(out, "    --no-config", "read no config file");
	for (size_t i = 0; i < NSETTINGS; i++) {
		const struct setting *st = &settings[i];
		char opt[64], name[48];
		snprintf(name, sizeof name, "%s", st->key);
		for (char *p = name; *p; p++)
			if (*p == '_')
				*p = '-';
		if (st->opt < 256)
			snprintf(opt, sizeof opt, "-%c, --%s %s", st->opt, name, st->arg);
		else
			snprintf(opt, sizeof opt, "    --%s%s%s", name, st->type == V_BOOL ? "" : " ",
				 st->arg);
		usage_line(out, opt, st->help);
	}
	usage_line(out, "-h, --help", "show this help");
	usage_line(out, "-V, --version", "show the version");
	fprintf(out,
		"\n"
		"The config file takes the long option names as keys (key = value, '_' or '-');\n"
		"'#' and ';' start comments, also after a value. The command line overrides\n"
		"the file; --preload on the command line replaces the file's preload list,\n"
		"--sched-uid-weights its list of weights.\n"
		"A key may appear once in the file, except preload, whose lines add up;\n"
		"likewise an option once on the command line, except --preload.\n"
		"BYTES values take a K, M, G or T suffix, in powers of 1024 (64M is 64 MiB;\n"
		"64MiB and 64MB read the same). The max_*_bytes*, max_sessions_per_uid\n"
		"limits take 0 for no limit and auto for the default derived as shown.\n"
		"\n"
		"Signals:\n"
		"  TERM, INT     stop accepting, finish what clients submitted, exit 0\n"
		"  HUP           logged and ignored: the configuration is read only at start\n"
		"                (restart to apply changes); USR1 and USR2 are ignored too\n"
		"  QUIT          the default action: exit with a core dump\n"
		"\n"
		"Exit status: 0 after TERM/INT (or --help, --version), 1 when start-up or\n"
		"the daemon fails (the log says why), 2 for a bad command line or config file.\n"
		"\n"
		"Logs go to stderr, one line per event; under systemd that is the journal\n"
		"(journalctl -u radianced). See docs/daemon.md.\n");
}

/* getopt_long table: settings + config/help/version. Names live in names[]. */
struct opt_table {
	struct option opts[NSETTINGS + 5];
	char names[NSETTINGS][48];
};

static void build_opts(struct opt_table *t)
{
	size_t n = 0;
	for (size_t i = 0; i < NSETTINGS; i++) {
		snprintf(t->names[i], sizeof t->names[i], "%s", settings[i].key);
		for (char *p = t->names[i]; *p; p++)
			if (*p == '_')
				*p = '-';
		t->opts[n++] = (struct option){ t->names[i],
						settings[i].type == V_BOOL ? optional_argument
									   : required_argument,
						NULL, settings[i].opt };
	}
	t->opts[n++] = (struct option){ "config", required_argument, NULL, OPT_CONFIG };
	t->opts[n++] = (struct option){ "no-config", no_argument, NULL, OPT_NO_CONFIG };
	t->opts[n++] = (struct option){ "help", no_argument, NULL, OPT_HELP };
	t->opts[n++] = (struct option){ "version", no_argument, NULL, OPT_VERSION };
	t->opts[n] = (struct option){ 0 };
}

static const char shortopts[] = ":c:s:g:b:d:p:l:hV";

static const struct setting *setting_by_opt(int opt)
{
	for (size_t i = 0; i < NSETTINGS; i++)
		if (settings[i].opt == opt)
			return &settings[i];
	return NULL;
}

static int default_socket(struct radiance_config *cfg, char *err, size_t errlen)
{
	if (cfg->socket_path)
		return 0;
	if (geteuid() == 0) {
		cfg->socket_path = strdup(RADIANCE_DEFAULT_ROOT_SOCKET);
	} else {
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		if (!xdg || !*xdg) {
			snprintf(err, errlen, "XDG_RUNTIME_DIR is not set and not running as root: "
				 "pass --socket PATH");
			return -EINVAL;
		}
		char path[PATH_MAX];
		if (rio_path_join(path, sizeof path, xdg, "radiance.sock") < 0) {
			snprintf(err, errlen, "XDG_RUNTIME_DIR is longer than %zu bytes: pass --socket "
				 "PATH", sizeof path - 16);
			return -ENAMETOOLONG;
		}
		cfg->socket_path = strdup(path);
	}
	return cfg->socket_path ? 0 : -ENOMEM;
}

/* The socket path must fit a Unix socket address (sun_path: 107 bytes and
 * the NUL). Checked here with the other values, so that a path that cannot
 * be bound is a usage error (exit 2) naming where it came from, not a
 * failure once the backend has started (listen.c checks again). Under
 * socket activation the path is not used, so it is not checked. */
static int socket_length_check(const struct radiance_config *cfg, const struct origins *o,
			       char *err, size_t errlen)
{
	struct sockaddr_un addr;
	size_t len = strlen(cfg->socket_path);
	if (len < sizeof addr.sun_path || notify_socket_activated())
		return 0;
	char shown[CONFIG_SHOWN_MAX];
	rtext_escape(cfg->socket_path, shown, sizeof shown);
	const char *where = origin(o, "socket");
	bool deflt = strcmp(where, "default") == 0;
	snprintf(err, errlen, "socket '%s' (%s) is %zu bytes, longer than the %zu a Unix socket "
		 "address holds; %s", shown, deflt && geteuid() != 0 ?
		 "default: $XDG_RUNTIME_DIR/radiance.sock" : where, len, sizeof addr.sun_path - 1,
		 deflt ? "pass --socket PATH" : "choose a shorter path");
	return -EINVAL;
}

static int preload_same_name(const char *a, const char *b)
{
	size_t alen, blen;
	const char *an = rcheckpoint_dir_name(a, &alen);
	const char *bn = rcheckpoint_dir_name(b, &blen);
	return alen == blen && memcmp(an, bn, alen) == 0;
}

/* Drops cfg->preload[i], with its origin and its realpath in real[]. */
static void preload_remove(struct radiance_config *cfg, struct origins *o, char **real, size_t i)
{
	size_t after = cfg->n_preload - i - 1;
	free(cfg->preload[i]);
	free(o->preload_from[i]);
	free(real[i]);
	memmove(&cfg->preload[i], &cfg->preload[i + 1], after * sizeof *cfg->preload);
	memmove(&o->preload_from[i], &o->preload_from[i + 1], after * sizeof *o->preload_from);
	memmove(&real[i], &real[i + 1], after * sizeof *real);
	cfg->n_preload--;
	o->n_preload_from--;
}

/* Preloads are named after their directory, so two different directories
 * with one basename would race for the name: whichever finished loading
 * second would fail, with advice to load it under another name that a
 * preload cannot take. Refuse that here, before anything starts. The same
 * directory twice (same realpath) is one preload: the later mention is
 * dropped. A path that does not resolve is left to the load, which says why
 * it fails. */
static int preload_check(struct radiance_config *cfg, struct origins *o, char *err,
			 size_t errlen)
{
	int rc = 0;
	char **real = calloc(cfg->n_preload ? cfg->n_preload : 1, sizeof *real);
	if (!real)
		return -ENOMEM;
	for (size_t i = 0; i < cfg->n_preload; i++)
		real[i] = realpath(cfg->preload[i], NULL);
	for (size_t i = 0; i < cfg->n_preload;) {
		size_t j = 0;
		while (j < i && !(real[i] && real[j] && strcmp(real[i], real[j]) == 0))
			j++;
		if (j < i)
			preload_remove(cfg, o, real, i);
		else
			i++;
	}
	for (size_t i = 0; i < cfg->n_preload && !rc; i++) {
		for (size_t j = 0; j < i && real[i] && !rc; j++) {
			if (!real[j] || !preload_same_name(cfg->preload[i], cfg->preload[j]))
				continue;
			char a[CONFIG_SHOWN_MAX], b[CONFIG_SHOWN_MAX], name[CONFIG_SHOWN_MAX];
			size_t len;
			const char *base = rcheckpoint_dir_name(cfg->preload[i], &len);
			char *dup = strndup(base, len);
			rtext_escape(dup ? dup : "", name, sizeof name);
			free(dup);
			rtext_escape(cfg->preload[j], a, sizeof a);
			rtext_escape(cfg->preload[i], b, sizeof b);
			snprintf(err, errlen, "preload %s (%s) and preload %s (%s) are different "
				 "directories with the same name '%s': a preload's model name is "
				 "its directory's basename; rename one of the directories",
				 a, o->preload_from[j], b, o->preload_from[i], name);
			rc = -EINVAL;
		}
	}
	for (size_t i = 0; i < cfg->n_preload; i++)
		free(real[i]);
	free(real);
	return rc;
}

/* "auto" limits from the memory this daemon may use and max_sessions. The
 * per-uid ones default to their totals: the main use is several workers of
 * one engine under one uid, which a per-uid share would refuse; a shared
 * host sets them (docs/daemon.md "Limits"). An
 * arena limit below arena_bytes would refuse every OpenRing that asks for
 * the default, which is an error when it was given and raised to
 * arena_bytes when it was derived. */
static int resolve_limits(struct radiance_config *cfg, const struct origins *o, char *err,
			  size_t errlen)
{
	const char *from = NULL;
	uint64_t mem = 0;
	if (cfg->max_model_bytes == LIMIT_AUTO || cfg->max_total_arena_bytes == LIMIT_AUTO) {
		mem = limit_memory_bytes(&from);
		cfg->memory_bytes = mem;
		cfg->memory_from = from;
	}
	if (cfg->max_model_bytes == LIMIT_AUTO)
		cfg->max_model_bytes = mem / 4 * 3;
	if (cfg->max_model_bytes_per_uid == LIMIT_AUTO)
		cfg->max_model_bytes_per_uid = cfg->max_model_bytes;
	int total_auto = cfg->max_total_arena_bytes == LIMIT_AUTO;
	int uid_auto = cfg->max_arena_bytes_per_uid == LIMIT_AUTO;
	if (total_auto)
		cfg->max_total_arena_bytes = mem / 4;
	if (uid_auto)
		cfg->max_arena_bytes_per_uid = cfg->max_total_arena_bytes;
	if (total_auto && cfg->max_total_arena_bytes && cfg->max_total_arena_bytes < cfg->arena_bytes)
		cfg->max_total_arena_bytes = cfg->arena_bytes;
	if (uid_auto && cfg->max_arena_bytes_per_uid && cfg->max_arena_bytes_per_uid < cfg->arena_bytes)
		cfg->max_arena_bytes_per_uid = cfg->arena_bytes;
	if (cfg->max_sessions_per_uid == LIMIT_AUTO)
		cfg->max_sessions_per_uid = cfg->max_sessions;
	static const char *const keys[] = { "max_total_arena_bytes", "max_arena_bytes_per_uid" };
	const uint64_t v[] = { cfg->max_total_arena_bytes, cfg->max_arena_bytes_per_uid };
	for (size_t i = 0; i < 2; i++) {
		if (v[i] && v[i] < cfg->arena_bytes) {
			snprintf(err, errlen, "%s %llu (%s) is below arena_bytes %llu (%s): no session "
				 "could open its rings with the default arena", keys[i],
				 (unsigned long long)v[i], origin(o, keys[i]),
				 (unsigned long long)cfg->arena_bytes, origin(o, "arena_bytes"));
			return -EINVAL;
		}
	}
	return 0;
}

/* Resolves the socket group now, so a typo is a command-line error (exit 2)
 * and not a failure after the backend started. A number is taken as a gid. */
static int resolve_group(struct radiance_config *cfg, const struct origins *o, char *err,
			 size_t errlen)
{
	if (!cfg->socket_group)
		return 0;
	errno = 0;
	struct group *g = getgrnam(cfg->socket_group);
	if (g) {
		cfg->socket_gid = g->gr_gid;
		return 0;
	}
	int e = errno;
	uint64_t v;
	if (parse_u64(cfg->socket_group, 0, &v) == 0 && v < (gid_t)-1) {
		cfg->socket_gid = (gid_t)v;
		return 0;
	}
	const char *where = origin(o, "group");
	char shown[CONFIG_SHOWN_MAX];
	rtext_escape(cfg->socket_group, shown, sizeof shown);
	if (e && e != ENOENT && e != ESRCH && e != EBADF && e != EPERM)
		snprintf(err, errlen, "%s: looking up group '%s': %s", where, shown, strerror(e));
	else
		snprintf(err, errlen, "%s: group '%s' does not exist", where, shown);
	return -EINVAL;
}

/* The environment variables the tests and bench scripts set, read here and
 * nowhere else in the daemon: each is the fallback of its setting, used
 * when neither the config file nor the command line gave one. */
static int apply_env(struct radiance_config *cfg, struct origins *o, char *err, size_t errlen)
{
	static const struct {
		const char *env, *key;
	} envs[] = {
		{ "RADIANCE_NUMERICS_GATE", "numerics_gate" },
		{ "RADIANCE_SHARE", "share" },
		{ "RADIANCE_FAKE_SHARE", "fake_share" },
		{ "RADIANCE_TEST_PIN_DELAY_US", "test_pin_delay_us" },
	};
	for (size_t e = 0; e < sizeof envs / sizeof *envs; e++) {
		const char *v = getenv(envs[e].env);
		size_t i = setting_index(envs[e].key);
		if (!v || !*v || o->where[i][0])
			continue;
		char where[64];
		snprintf(where, sizeof where, "environment %s", envs[e].env);
		int rc = apply(cfg, &settings[i], v, where, err, errlen);
		if (rc < 0)
			return rc;
		snprintf(o->where[i], sizeof o->where[0], "%s", where);
	}
	return 0;
}

int config_load(struct radiance_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	struct opt_table t;
	const char *config_path = NULL;
	char shown[CONFIG_SHOWN_MAX];
	int no_config = 0, rc, c;

	rc = config_init(cfg);
	if (rc < 0)
		return rc;
	/* two settings with one getopt value would make the second unreachable
	 * from the command line: a programming error every config test catches */
	for (size_t i = 0; i < NSETTINGS; i++)
		for (size_t j = 0; j < i; j++)
			if (settings[i].opt == settings[j].opt) {
				snprintf(err, errlen, "internal: options %s and %s share getopt value %d",
					 settings[j].key, settings[i].key, settings[i].opt);
				return -EINVAL;
			}
	build_opts(&t);
	struct origins *o = calloc(1, sizeof *o);
	if (!o)
		return -ENOMEM;

	/* Pass 1: find the config file, answer --help/--version, reject unknown
	 * and repeated options before anything else happens. */
	const char *given[NSETTINGS];   /* each setting's value on the command line */
	bool seen[NSETTINGS] = { 0 };
	opterr = 0;
	optind = 0;
	while ((c = getopt_long(argc, argv, shortopts, t.opts, NULL)) != -1) {
		const struct setting *st = setting_by_opt(c);
		/* The last of two would win without a word, as a second line for
		 * a key would in the file, which is refused too. preload is a
		 * list: its options add up. */
		if (st && st->type != V_PRELOAD) {
			size_t i = (size_t)(st - settings);
			if (seen[i]) {
				char shortopt[8] = "";
				if (st->opt < 256)
					snprintf(shortopt, sizeof shortopt, "-%c/", st->opt);
				char first[CONFIG_SHOWN_MAX], then[CONFIG_SHOWN_MAX];
				rtext_escape(given[i] ? given[i] : "(no value)", first, sizeof first);
				rtext_escape(optarg ? optarg : "(no value)", then, sizeof then);
				snprintf(err, errlen, "%s--%s is given twice ('%s', then '%s'); give each "
					 "option once (only -p/--preload may repeat, its values add up)",
					 shortopt, t.names[i], first, then);
				rc = -EINVAL;
				goto out;
			}
			seen[i] = true;
			given[i] = optarg;
		}
		switch (c) {
		case OPT_CONFIG:
			if (config_path) {
				char first[CONFIG_SHOWN_MAX], then[CONFIG_SHOWN_MAX];
				rtext_escape(config_path, first, sizeof first);
				rtext_escape(optarg, then, sizeof then);
				snprintf(err, errlen, "--config is given twice ('%s', then '%s'); give "
					 "one config file", first, then);
				rc = -EINVAL;
				goto out;
			}
			config_path = optarg;
			break;
		case OPT_NO_CONFIG:
			no_config = 1;
			break;
		case OPT_HELP:
			usage(stdout);
			rc = 1;
			goto out;
		case OPT_VERSION:
			printf("radianced %s (protocol %u)\n", RADIANCE_VERSION, RADIANCE_PROTOCOL_VERSION);
			rc = 1;
			goto out;
		case ':':
			rtext_escape(argv[optind - 1], shown, sizeof shown);
			snprintf(err, errlen, "option '%s' needs a value (see --help)", shown);
			rc = -EINVAL;
			goto out;
		case '?':
			rtext_escape(argv[optind - 1], shown, sizeof shown);
			snprintf(err, errlen, "unknown option '%s' (see --help)", shown);
			rc = -EINVAL;
			goto out;
		}
	}
	if (optind < argc) {
		rtext_escape(argv[optind], shown, sizeof shown);
		snprintf(err, errlen, "unexpected argument '%s' (see --help)", shown);
		rc = -EINVAL;
		goto out;
	}
	if (no_config && config_path) {
		rtext_escape(config_path, shown, sizeof shown);
		snprintf(err, errlen, "--config %s and --no-config contradict each other (see --help)",
			 shown);
		rc = -EINVAL;
		goto out;
	}

	if (!no_config) {
		if (!config_path && access(RADIANCE_DEFAULT_CONFIG, F_OK) == 0)
			config_path = RADIANCE_DEFAULT_CONFIG;
		if (config_path) {
			rc = parse_file(cfg, o, config_path, err, errlen);
			if (rc < 0)
				goto out;
			cfg->config_path = strdup(config_path);
			if (!cfg->config_path) {
				rc = -ENOMEM;
				goto out;
			}
		}
	}

	/* Pass 2: the command line overrides the file. */
	int cli_preload = 0;
	optind = 0;
	while ((c = getopt_long(argc, argv, shortopts, t.opts, NULL)) != -1) {
		const struct setting *st = setting_by_opt(c);
		if (!st)
			continue;
		if (st->type == V_PRELOAD && !cli_preload) {
			preload_clear(cfg);
			origins_clear_preload(o);
			cli_preload = 1;
		}
		char where[64];
		if (st->opt < 256)
			snprintf(where, sizeof where, "-%c/--%s", st->opt, t.names[st - settings]);
		else
			snprintf(where, sizeof where, "--%s", t.names[st - settings]);
		rc = apply(cfg, st, optarg, where, err, errlen);
		if (rc == 0 && st->type == V_PRELOAD)
			rc = origins_add_preload(o, cfg, where);
		if (rc < 0)
			goto out;
		snprintf(o->where[st - settings], sizeof o->where[0], "%s", where);
	}

	rc = apply_env(cfg, o, err, errlen);
	if (rc < 0)
		goto out;

	rc = -EINVAL;
	if (cfg->arena_bytes > cfg->max_arena_bytes) {
		snprintf(err, errlen, "arena_bytes %llu (%s) exceeds max_arena_bytes %llu (%s)",
			 (unsigned long long)cfg->arena_bytes, origin(o, "arena_bytes"),
			 (unsigned long long)cfg->max_arena_bytes, origin(o, "max_arena_bytes"));
		goto out;
	}
	if (cfg->sq_entries > cfg->max_sq_entries) {
		snprintf(err, errlen, "sq_entries %u (%s) exceeds max_sq_entries %u (%s)",
			 cfg->sq_entries, origin(o, "sq_entries"), cfg->max_sq_entries,
			 origin(o, "max_sq_entries"));
		goto out;
	}
	/* The one fall-back require_gpu forbids is the one backend = cpu asks
	 * for: a radianced@N instance (--require-gpu) with a configuration copied
	 * from a CPU host would otherwise serve GPU N's clients from the CPU. */
	if (cfg->require_gpu && cfg->backend && strcmp(cfg->backend, "cpu") == 0) {
		snprintf(err, errlen, "require_gpu yes (%s) contradicts backend cpu (%s): a GPU is "
			 "required but the CPU backend is asked for; set backend auto or gpu, or "
			 "require_gpu no", origin(o, "require_gpu"), origin(o, "backend"));
		goto out;
	}
	if (cfg->max_k % 128) {
		snprintf(err, errlen, "%s: max_k %u is not a multiple of 128", origin(o, "max_k"),
			 cfg->max_k);
		goto out;
	}
	if (cfg->pin_piece_kib % 4) {
		snprintf(err, errlen, "%s: pin_piece_kib %u is not a multiple of 4 (pages of 4 KiB)",
			 origin(o, "pin_piece_kib"), cfg->pin_piece_kib);
		goto out;
	}
	rc = resolve_limits(cfg, o, err, errlen);
	if (rc < 0)
		goto out;
	rc = preload_check(cfg, o, err, errlen);
	if (rc < 0)
		goto out;
	rc = resolve_group(cfg, o, err, errlen);
	if (rc < 0)
		goto out;
	rc = default_socket(cfg, err, errlen);
	if (rc == 0)
		rc = socket_length_check(cfg, o, err, errlen);
out:
	origins_clear_preload(o);
	free(o);
	return rc;
}
