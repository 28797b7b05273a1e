/* Defaults, config file (libinih) and command line (getopt_long). */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "shm.h"

enum value_type { V_STRING, V_BACKEND, V_INT, V_U32, V_POW2, V_BYTES, V_LOGLEVEL, V_PRELOAD };

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
	{ "device", 'd', "N", V_INT, OFF(device), 0, 1024, "GPU ordinal (default 0)" },
	{ "preload", 'p', "DIR", V_PRELOAD, OFF(preload), 0, 0,
	  "load this checkpoint at start and keep it resident (repeatable; the config "
	  "key takes a space-separated list)" },
	{ "max_sessions", 256, "N", V_U32, OFF(max_sessions), 1, 65536, "clients at once (64)" },
	{ "max_arena_bytes", 257, "BYTES", V_BYTES, OFF(max_arena_bytes), 4096, 1ull << 40,
	  "largest arena a session may ask for (1G)" },
	{ "arena_bytes", 258, "BYTES", V_BYTES, OFF(arena_bytes), 4096, 1ull << 40,
	  "arena when a session asks for the default (64M)" },
	{ "max_rows", 259, "N", V_U32, OFF(max_rows), 1, 65536,
	  "most rows (M) per request and per merged launch (512)" },
	{ "max_inflight", 260, "N", V_U32, OFF(max_inflight), 1, 1u << 20,
	  "requests per session submitted but not completed (1024)" },
	{ "max_sq_entries", 261, "N", V_POW2, OFF(max_sq_entries), 1, 1u << 16,
	  "largest SQ/CQ a session may ask for, a power of two (1024)" },
	{ "sq_entries", 262, "N", V_POW2, OFF(sq_entries), 1, 1u << 16,
	  "SQ/CQ entries when a session asks for the default (256)" },
	{ "max_k", 263, "N", V_U32, OFF(max_k), 128, 1u << 20,
	  "largest layer K the backend's scratch is sized for (32768)" },
	{ "max_n", 264, "N", V_U32, OFF(max_n), 1, 1u << 22,
	  "largest layer N the backend's scratch is sized for (65536)" },
	{ "log_level", 'l', "LEVEL", V_LOGLEVEL, OFF(log_level), 0, 0,
	  "silent, error, warn, info or debug (info)" },
};
#define NSETTINGS (sizeof settings / sizeof settings[0])
enum { OPT_CONFIG = 'c', OPT_NO_CONFIG = 300, OPT_HELP = 'h', OPT_VERSION = 'V' };

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
	cfg->log_level = RADIANCE_LOG_INFO;
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

/* Applies value to the setting; `where` names it for errors ("--max-rows" or
 * "file:12: max_rows"). */
static int apply(struct radiance_config *cfg, const struct setting *st, const char *value,
		 const char *where, char *err, size_t errlen)
{
	void *field = (char *)cfg + st->offset;
	uint64_t v;
	int lvl;

	switch (st->type) {
	case V_BACKEND:
		if (strcmp(value, "auto") && strcmp(value, "cpu") && strcmp(value, "gpu")) {
			snprintf(err, errlen, "%s: '%s' is not a backend (expected auto, cpu or gpu)",
				 where, value);
			return -EINVAL;
		}
		/* fall through */
	case V_STRING: {
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
	case V_LOGLEVEL:
		lvl = radiance_log_level_parse(value);
		if (lvl < 0) {
			snprintf(err, errlen, "%s: '%s' is not a log level (expected silent, error, "
				 "warn, info or debug)", where, value);
			return -EINVAL;
		}
		cfg->log_level = lvl;
		return 0;
	case V_PRELOAD:
		for (const char *p = value; *p;) {
			p += strspn(p, " \t");
			size_t n = strcspn(p, " \t");
			if (n && preload_add(cfg, p, n) < 0)
				return -ENOMEM;
			p += n;
		}
		return 0;
	case V_INT:
	case V_U32:
	case V_POW2:
	case V_BYTES:
		if (parse_u64(value, st->type == V_BYTES, &v) < 0 || v < st->min || v > st->max ||
		    (st->type == V_POW2 && (v & (v - 1)))) {
			snprintf(err, errlen, "%s: '%s' is not %s in %llu..%llu", where, value,
				 st->type == V_POW2 ? "a power of two" :
				 st->type == V_BYTES ? "a byte count (K, M, G suffixes allowed)" :
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
	const char *path;
	int rc;
	char *err;
	size_t errlen;
	int line;
};

static int config_ini_line(void *user, const char *section, const char *name, const char *value
#if INI_HANDLER_LINENO
		       , int lineno
#endif
)
{
	struct file_ctx *ctx = user;
	char where[512];
	if (ctx->rc)
		return 0;
	snprintf(where, sizeof where, "%s: %s", ctx->path, name);
	if (*section && strcmp(section, "radianced") != 0) {
		snprintf(ctx->err, ctx->errlen, "%s: unknown section [%s] (expected none or "
			 "[radianced])", ctx->path, section);
		ctx->rc = -EINVAL;
		return 0;
	}
	/* accept the option spelling (max-rows) as well as the key (max_rows) */
	char key[64];
	snprintf(key, sizeof key, "%s", name);
	for (char *p = key; *p; p++)
		if (*p == '-')
			*p = '_';
	for (size_t i = 0; i < NSETTINGS; i++) {
		if (strcmp(settings[i].key, key) == 0) {
			int rc = apply(ctx->cfg, &settings[i], value, where, ctx->err, ctx->errlen);
			if (rc < 0)
				ctx->rc = rc;
			return rc == 0;
		}
	}
	snprintf(ctx->err, ctx->errlen, "%s: unknown key '%s'", ctx->path, name);
	ctx->rc = -EINVAL;
	return 0;
}

int config_parse_file(struct radiance_config *cfg, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		int e = errno;
		snprintf(err, errlen, "config file %s: %s", path, strerror(e));
		return -e;
	}
	struct file_ctx ctx = { cfg, path, 0, err, errlen, 0 };
	int line = ini_parse_file(f, config_ini_line, &ctx);
	fclose(f);
	if (ctx.rc) {
		/* name the line too: libinih returns the first line its handler refused */
		if (line > 0) {
			char msg[512];
			snprintf(msg, sizeof msg, "%s", err);
			const char *rest = strncmp(msg, path, strlen(path)) == 0 ? msg + strlen(path) : msg;
			snprintf(err, errlen, "%s:%d%s", path, line, rest);
		}
		return ctx.rc;
	}
	if (line != 0) {
		snprintf(err, errlen, "%s:%d: syntax error (expected key = value)", path, line);
		return -EINVAL;
	}
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: radianced [OPTION]...\n"
		"Serve W4A8 linear layers of resident int4 checkpoints to local clients.\n\n"
		"  -c, --config PATH          config file (default " RADIANCE_DEFAULT_CONFIG
		" if it exists)\n"
		"      --no-config            read no config file\n");
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
			snprintf(opt, sizeof opt, "    --%s %s", name, st->arg);
		fprintf(out, "  %-26s %s\n", opt, st->help);
	}
	fprintf(out,
		"  -h, --help                 show this help\n"
		"  -V, --version              show the version\n\n"
		"The config file takes the long option names as keys (key = value, '_' or '-').\n"
		"The command line overrides the file; --preload on the command line replaces\n"
		"the file's preload list.\n");
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
		t->opts[n++] = (struct option){ t->names[i], required_argument, NULL, settings[i].opt };
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
		if (asprintf(&cfg->socket_path, "%s/radiance.sock", xdg) < 0)
			cfg->socket_path = NULL;
	}
	return cfg->socket_path ? 0 : -ENOMEM;
}

int config_load(struct radiance_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	struct opt_table t;
	const char *config_path = NULL;
	int no_config = 0, rc, c;

	rc = config_init(cfg);
	if (rc < 0)
		return rc;
	build_opts(&t);

	/* Pass 1: find the config file, answer --help/--version, reject unknown
	 * options before anything else happens. */
	opterr = 0;
	optind = 0;
	while ((c = getopt_long(argc, argv, shortopts, t.opts, NULL)) != -1) {
		switch (c) {
		case OPT_CONFIG:
			config_path = optarg;
			break;
		case OPT_NO_CONFIG:
			no_config = 1;
			break;
		case OPT_HELP:
			usage(stdout);
			return 1;
		case OPT_VERSION:
			printf("radianced %s (protocol %u)\n", RADIANCE_VERSION, RADIANCE_PROTOCOL_VERSION);
			return 1;
		case ':':
			snprintf(err, errlen, "option '%s' needs a value (see --help)", argv[optind - 1]);
			return -EINVAL;
		case '?':
			snprintf(err, errlen, "unknown option '%s' (see --help)", argv[optind - 1]);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		snprintf(err, errlen, "unexpected argument '%s' (see --help)", argv[optind]);
		return -EINVAL;
	}

	if (!no_config) {
		if (!config_path && access(RADIANCE_DEFAULT_CONFIG, F_OK) == 0)
			config_path = RADIANCE_DEFAULT_CONFIG;
		if (config_path) {
			rc = config_parse_file(cfg, config_path, err, errlen);
			if (rc < 0)
				return rc;
			cfg->config_path = strdup(config_path);
			if (!cfg->config_path)
				return -ENOMEM;
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
			cli_preload = 1;
		}
		char where[64];
		if (st->opt < 256)
			snprintf(where, sizeof where, "-%c/--%s", st->opt, t.names[st - settings]);
		else
			snprintf(where, sizeof where, "--%s", t.names[st - settings]);
		rc = apply(cfg, st, optarg, where, err, errlen);
		if (rc < 0)
			return rc;
	}

	if (cfg->arena_bytes > cfg->max_arena_bytes) {
		snprintf(err, errlen, "arena_bytes %llu exceeds max_arena_bytes %llu",
			 (unsigned long long)cfg->arena_bytes, (unsigned long long)cfg->max_arena_bytes);
		return -EINVAL;
	}
	if (cfg->sq_entries > cfg->max_sq_entries) {
		snprintf(err, errlen, "sq_entries %u exceeds max_sq_entries %u", cfg->sq_entries,
			 cfg->max_sq_entries);
		return -EINVAL;
	}
	if (cfg->max_k % 128) {
		snprintf(err, errlen, "max_k %u is not a multiple of 128", cfg->max_k);
		return -EINVAL;
	}
	return default_socket(cfg, err, errlen);
}
