/*
 * radiancectl: inspect and drive radianced from the command line, through
 * libradiance like any other client. Human tables by default, --json (one
 * JSON document on stdout, via jansson) for scripts. Failures go to stderr
 * as text either way; with --json they are also an {"error": ...} object on
 * stdout, so a script never has to parse stderr to learn why.
 *
 * Exit codes (also in --help and docs/client.md):
 *   0  success
 *   1  the daemon refused or the operation failed (unknown model, bad
 *      checkpoint, ...)
 *   2  usage error
 *   3  cannot reach the daemon, or the connection broke
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include <jansson.h>

#include "radiance.h"
#include "text.h"   /* the model name rule, shared with the daemon */

enum {
	EXIT_OK = 0,
	EXIT_FAILED = 1,
	EXIT_USAGE = 2,
	EXIT_CONNECT = 3,
};

struct ctl {
	const char *socket;
	bool json;
	const char *name;     /* load --name */
	bool hold;            /* load --hold */
	bool prometheus;      /* stats --prometheus */
	const char *output;   /* stats --prometheus --output FILE */
	bool verbose;
	double timeout_s;     /* --timeout; < 0: not given */
	char connect_error[512];   /* libradiance's reason when connect fails */
	struct radiance *r;
	/* progress */
	bool tty;
	int last_decile;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: radiancectl [OPTIONS] COMMAND [ARGS]\n"
		"\n"
		"Commands:\n"
		"  status              daemon version, backend, device, sessions, uptime\n"
		"  models              resident models\n"
		"  layers MODEL        linear layers of a resident model (a name or an id;\n"
		"                      one model's name that is another's id: refused)\n"
		"  tensors MODEL       the shared tensors of a resident model: every tensor of\n"
		"                      no linear layer (embeddings, norms, ...) that the\n"
		"                      daemon holds once in a sealed memfd for all clients\n"
		"                      (name, dtype, shape, bytes, offset in the memfd)\n"
		"  load DIR [--name NAME] [--hold]\n"
		"                      load the checkpoint in DIR (progress on stderr: a bar\n"
		"                      on a TTY, else a line every 10%%).\n"
		"                      The model stays resident only while some session\n"
		"                      holds it: without --hold it is unloaded when\n"
		"                      radiancectl exits unless another client uses it or it\n"
		"                      was already resident; --hold keeps this session (and\n"
		"                      the model) until SIGINT/SIGTERM. For permanent\n"
		"                      residency, preload it in radianced.conf.\n"
		"  unload MODEL        drop the daemon's own reference to a preloaded MODEL\n"
		"                      (root or the daemon's user only); it is freed once no\n"
		"                      client session holds it. Models loaded by clients\n"
		"                      belong to their sessions: they are freed when the last\n"
		"                      one releases or disconnects.\n"
		"  stats               request counters and latency, global and per session\n"
		"                      (p50/p99 are histogram bucket upper bounds)\n"
		"  stats --prometheus [--output FILE]\n"
		"                      the same (global) and resident bytes per model in the\n"
		"                      Prometheus text format; --output replaces FILE\n"
		"                      atomically (a temporary file renamed over it), for\n"
		"                      node_exporter's textfile collector, and writes\n"
		"                      radiance_up 0 there when the daemon cannot be reached\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH   daemon socket (default: $RADIANCE_SOCKET, else\n"
		"                      /run/radiance/radiance-N.sock for $RADIANCE_DEVICE=N, else\n"
		"                      /run/radiance/radiance.sock for root, else\n"
		"                      $XDG_RUNTIME_DIR/radiance.sock if it exists)\n"
		"  -d, --device N      the daemon of GPU N, radianced@N:\n"
		"                      /run/radiance/radiance-N.sock (as $RADIANCE_DEVICE=N)\n"
		"  -j, --json          print one JSON document on stdout; a failure is\n"
		"                      {\"error\": {\"code\", \"errno\", \"message\"}} there too\n"
		"  -n, --name NAME     (load) model name: printable, no '/', not . or ..,\n"
		"                      no space at either end\n"
		"      --hold          (load) keep the model loaded until interrupted\n"
		"  -t, --timeout SEC   longest wait for the daemon's answer (its Welcome,\n"
		"                      each reply, each load progress step), in seconds;\n"
		"                      0: no limit. Default 10, load: no limit (a load may\n"
		"                      wait for others'). A stopped or wedged daemon then\n"
		"                      fails with exit status 3 (and radiance_up 0)\n"
		"  -v, --verbose       log what libradiance does to stderr\n"
		"  -h, --help          this text\n"
		"  -V, --version       print versions (radiancectl, libradiance, protocol)\n"
		"\n"
		"Exit status: 0 success, 1 the operation failed, 2 usage error,\n"
		"3 cannot reach the daemon (or the connection broke).\n");
}

/* A usage error: one line saying what is wrong, one pointing at --help. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("radiancectl: ", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'radiancectl --help' for more information.\n", stderr);
	return EXIT_USAGE;
}

/* libradiance is silent unless given a log callback. Its warnings are kept
 * (radiance_connect() has no handle to ask for the reason of a failure:
 * the daemon's refusal text comes this way); with --verbose everything is
 * printed too. */
static void log_cb(void *user, int priority, const char *message)
{
	struct ctl *c = user;
	if (priority <= LOG_WARNING)
		snprintf(c->connect_error, sizeof c->connect_error, "%s", message);
	if (c->verbose)
		fprintf(stderr, "radiancectl: libradiance: %s\n", message);
}

/* A JSON string of s. Paths and the daemon's text are bytes, not always
 * UTF-8, which jansson refuses: then each non-ASCII byte becomes '?', so
 * the error object still gets out. */
static json_t *json_text(const char *s)
{
	json_t *j = json_string(s);
	if (j)
		return j;
	char *copy = strdup(s);
	if (!copy)
		return NULL;
	for (char *p = copy; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	j = json_string(copy);
	free(copy);
	return j;
}

/* What to try when the daemon accepted the connection but did not answer
 * within --timeout. */
#define NOT_ANSWERING_HINT                                                                  \
	"the daemon accepts connections but does not answer: stopped (SIGSTOP), wedged, or "  \
	"still starting (socket activation with big preloads); --timeout SEC waits longer, " \
	"0 without limit"

/* Every failure after the options are read goes through here: "radiancectl:
 * MESSAGE" on stderr, then HINT (what to try) on a line of its own if there
 * is one. With --json also, on stdout:
 *   {"error": {"code": "ENOENT", "errno": 2, "message": MESSAGE, "hint": HINT}}
 * code is the errno's name (its number, as text, if it has none), hint is
 * left out when there is none. err is an errno of either sign; returns ret,
 * the exit status. */
static int report(struct ctl *c, int ret, int err, const char *hint, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int report(struct ctl *c, int ret, int err, const char *hint, const char *fmt, ...)
{
	char msg[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "radiancectl: %s\n", msg);
	if (hint)
		fprintf(stderr, "radiancectl: %s\n", hint);
	if (!c->json)
		return ret;

	if (err < 0)
		err = -err;
	char number[16];
	const char *name = strerrorname_np(err);
	if (!name) {
		snprintf(number, sizeof number, "%d", err);
		name = number;
	}
	json_t *e = json_pack("{s:s, s:i, s:o}", "code", name, "errno", err, "message",
			      json_text(msg));
	if (e && hint)
		json_object_set_new(e, "hint", json_text(hint));
	json_t *j = e ? json_pack("{s:o}", "error", e) : NULL;
	char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	json_decref(j);
	if (text)
		puts(text);
	else
		fprintf(stderr, "radiancectl: out of memory writing the JSON error object\n");
	free(text);
	return ret;
}

static int fail_hint(struct ctl *c, int rc, const char *what, const char *hint)
{
	const char *msg = c->r ? radiance_error_message(c->r) : "";
	int sticky = c->r ? radiance_get_error(c->r) : 0;
	if (sticky == -ECONNRESET)
		return report(c, EXIT_CONNECT, ECONNRESET, NULL,
			      "%s: the daemon went away (it closed the connection)", what);
	if (sticky == -ESHUTDOWN)
		return report(c, EXIT_CONNECT, ESHUTDOWN, NULL, "%s: the daemon stopped (%s)", what,
			      msg);
	if (rc == -ETIMEDOUT)
		return report(c, EXIT_CONNECT, ETIMEDOUT, NOT_ANSWERING_HINT, "%s: %s", what,
			      *msg ? msg : radiance_strerror(rc));
	return report(c, sticky ? EXIT_CONNECT : EXIT_FAILED, rc, hint, "%s: %s", what,
		      *msg ? msg : radiance_strerror(rc));
}

static int fail(struct ctl *c, int rc, const char *what)
{
	return fail_hint(c, rc, what, NULL);
}

/* Prints j (taking it) as the command's JSON document. j is NULL when
 * json_pack failed: out of memory, or a name that is not UTF-8. */
static int print_json(struct ctl *c, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	json_decref(j);
	if (!s)
		return report(c, EXIT_FAILED, EILSEQ, NULL,
			      "cannot write the JSON output (out of memory, or text from the "
			      "daemon that is not UTF-8)");
	puts(s);
	free(s);
	return EXIT_OK;
}

static void human_bytes(char *buf, size_t n, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, n, "%.2f GiB", (double)b / (1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, n, "%.2f MiB", (double)b / (1ull << 20));
	else if (b >= (1ull << 10))
		snprintf(buf, n, "%.1f KiB", (double)b / (1ull << 10));
	else
		snprintf(buf, n, "%" PRIu64 " B", b);
}

static void human_duration(char *buf, size_t n, uint64_t ns)
{
	uint64_t s = ns / 1000000000u;
	uint64_t d = s / 86400;
	s %= 86400;
	if (d)
		snprintf(buf, n, "%" PRIu64 "d %02u:%02u:%02u", d, (unsigned)(s / 3600),
			 (unsigned)(s / 60 % 60), (unsigned)(s % 60));
	else
		snprintf(buf, n, "%02u:%02u:%02u", (unsigned)(s / 3600), (unsigned)(s / 60 % 60),
			 (unsigned)(s % 60));
}

/* MODEL on the command line: a resident model's name, else its numeric id.
 * A name may be digits ("1" is a valid name), so when arg is the name of one
 * model and the id of another it is refused (EINVAL) instead of silently
 * picking the name: `unload 1` or `layers 1` meant for model 1 must not act
 * on another model that happens to be named "1". */
static int resolve_model(struct ctl *c, const char *arg, uint32_t *id)
{
	struct radiance_model_list *list;
	int rc = radiance_list_models(c->r, &list);
	if (rc < 0)
		return fail(c, rc, "list models");
	const struct radiance_model_info *by_name = NULL, *by_id = NULL;
	char *end;
	errno = 0;
	unsigned long v = strtoul(arg, &end, 10);
	bool numeric = !errno && *arg && !*end;
	for (size_t i = 0; i < list->count; i++) {
		if (!by_name && strcmp(list->models[i].name, arg) == 0)
			by_name = &list->models[i];
		if (!by_id && numeric && list->models[i].model_id == v)
			by_id = &list->models[i];
	}
	int ret = EXIT_OK;
	if (by_name && by_id && by_name != by_id) {
		char hint[400];
		snprintf(hint, sizeof hint, "give %" PRIu32 " for the model named \"%s\", or \"%s\" "
			 "for model %" PRIu32, by_name->model_id, arg, by_id->name, by_id->model_id);
		ret = report(c, EXIT_FAILED, EINVAL, hint,
			     "\"%s\" is ambiguous: the name of model %" PRIu32 " and the id of model %"
			     PRIu32 " \"%s\"", arg, by_name->model_id, by_id->model_id, by_id->name);
	}
	else if (by_name || by_id)
		*id = (by_name ? by_name : by_id)->model_id;
	else
		ret = report(c, EXIT_FAILED, ENOENT, NULL, "no resident model \"%s\"", arg);
	radiance_model_list_free(list);
	return ret;
}

/* MODEL on the command line, resolved to *id and fetched in full into *m
 * (for radiance_model_info_free); EXIT_OK or the exit code of what failed. */
static int get_model(struct ctl *c, const char *arg, uint32_t *id, struct radiance_model_info **m)
{
	int ret = resolve_model(c, arg, id);
	if (ret != EXIT_OK)
		return ret;
	int rc = radiance_get_model(c->r, *id, m);
	if (rc < 0)
		return fail(c, rc, "get model");
	return EXIT_OK;
}

/* --- commands ------------------------------------------------------------- */

static json_t *stats_json(const struct radiance_stats *s, bool global)
{
	json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "requests",
			      (json_int_t)s->requests, "rows", (json_int_t)s->rows, "bytes_in",
			      (json_int_t)s->bytes_in, "bytes_out", (json_int_t)s->bytes_out, "errors",
			      (json_int_t)s->errors, "latency_p50_ns", (json_int_t)s->latency_p50_ns,
			      "latency_p99_ns", (json_int_t)s->latency_p99_ns, "latency_max_ns",
			      (json_int_t)s->latency_max_ns);
	if (j && global) {
		json_object_set_new(j, "sessions", json_integer(s->sessions));
		json_object_set_new(j, "uptime_ns", json_integer((json_int_t)s->uptime_ns));
	}
	return j;
}

/* The counters and the resident models, both or neither (EXIT_OK, or the
 * failure reported). */
static int get_stats_models(struct ctl *c, struct radiance_stats_reply **st,
			    struct radiance_model_list **ml)
{
	int rc = radiance_get_stats(c->r, st);
	if (rc < 0)
		return fail(c, rc, "stats");
	if ((rc = radiance_list_models(c->r, ml)) < 0) {
		radiance_stats_free(*st);
		return fail(c, rc, "list models");
	}
	return EXIT_OK;
}

static int cmd_status(struct ctl *c)
{
	const struct radiance_server_info *si = radiance_get_server_info(c->r);
	struct radiance_stats_reply *st;
	struct radiance_model_list *ml;
	int ret = get_stats_models(c, &st, &ml);
	if (ret != EXIT_OK)
		return ret;
	if (c->json) {
		/* every figure of the text below, and the library's version */
		ret = print_json(c, json_pack("{s:s, s:i, s:s, s:s, s:i, s:i, s:I, s:i, s:I, s:I, s:s}",
					      "server_version", si->server_version,
					      "protocol_version", (int)si->protocol_version,
					      "backend", si->backend, "device", si->device,
					      "max_rows", (int)si->max_rows,
					      "sessions", (int)st->global.sessions,
					      "uptime_ns", (json_int_t)st->global.uptime_ns,
					      "models", (int)ml->count,
					      "requests", (json_int_t)st->global.requests,
					      "errors", (json_int_t)st->global.errors,
					      "client_version", radiance_version()));
	} else {
		char up[64];
		human_duration(up, sizeof up, st->global.uptime_ns);
		printf("radianced %s (protocol %u)\n", si->server_version, si->protocol_version);
		printf("  backend:   %s\n", si->backend);
		printf("  device:    %s\n", si->device);
		printf("  max rows:  %u per request\n", si->max_rows);
		printf("  sessions:  %u (this one included)\n", st->global.sessions);
		printf("  models:    %zu resident\n", ml->count);
		printf("  uptime:    %s\n", up);
		printf("  requests:  %" PRIu64 " (%" PRIu64 " errors)\n", st->global.requests,
		       st->global.errors);
		ret = EXIT_OK;
	}
	radiance_model_list_free(ml);
	radiance_stats_free(st);
	return ret;
}

static int cmd_models(struct ctl *c)
{
	struct radiance_model_list *ml;
	int rc = radiance_list_models(c->r, &ml);
	if (rc < 0)
		return fail(c, rc, "list models");
	if (c->json) {
		json_t *a = json_array();
		for (size_t i = 0; a && i < ml->count; i++) {
			const struct radiance_model_info *m = &ml->models[i];
			json_array_append_new(a, json_pack("{s:i, s:s, s:I, s:b, s:i}", "model_id",
							   (int)m->model_id, "name", m->name,
							   "resident_bytes", (json_int_t)m->resident_bytes,
							   "preloaded", m->preloaded, "users",
							   (int)m->users));
		}
		radiance_model_list_free(ml);
		return print_json(c, json_pack("{s:o}", "models", a));
	}
	if (ml->count == 0)
		printf("no resident models\n");
	else
		printf("%4s  %-32s %12s %6s  %s\n", "ID", "NAME", "RESIDENT", "USERS", "PRELOADED");
	for (size_t i = 0; i < ml->count; i++) {
		const struct radiance_model_info *m = &ml->models[i];
		char b[32];
		human_bytes(b, sizeof b, m->resident_bytes);
		printf("%4u  %-32s %12s %6u  %s\n", m->model_id, m->name, b, m->users,
		       m->preloaded ? "yes" : "no");
	}
	radiance_model_list_free(ml);
	return EXIT_OK;
}

static const char *kind_name(enum radiance_layer_kind k)
{
	return k == RADIANCE_LAYER_W4A8 ? "w4a8" : k == RADIANCE_LAYER_BF16 ? "bf16" : "?";
}

/* [d0, d1, ...] of a tensor's shape; NULL when out of memory (json_pack
 * then fails, and the command reports it). */
static json_t *json_shape(uint32_t ndim, const uint64_t *shape)
{
	json_t *a = json_array();
	for (uint32_t d = 0; a && d < ndim; d++)
		json_array_append_new(a, json_integer((json_int_t)shape[d]));
	return a;
}

static int cmd_layers(struct ctl *c, const char *model)
{
	uint32_t id;
	struct radiance_model_info *m;
	int ret = get_model(c, model, &id, &m);
	if (ret != EXIT_OK)
		return ret;
	if (c->json) {
		json_t *a = json_array();
		for (size_t i = 0; a && i < m->n_layers; i++) {
			const struct radiance_layer_info *l = &m->layers[i];
			json_array_append_new(a, json_pack("{s:i, s:s, s:s, s:i, s:i, s:b, s:I}", "index",
							   (int)l->index, "name", l->name, "kind",
							   kind_name(l->kind), "n", (int)l->n, "k",
							   (int)l->k, "has_bias", l->has_bias, "bytes",
							   (json_int_t)l->bytes));
		}
		json_t *o = json_array();
		for (size_t i = 0; o && i < m->n_other; i++) {
			json_array_append_new(o, json_pack("{s:s, s:s, s:o}", "name", m->other[i].name,
							   "dtype", m->other[i].dtype, "shape",
							   json_shape(m->other[i].ndim, m->other[i].shape)));
		}
		ret = print_json(c, json_pack("{s:i, s:s, s:I, s:o, s:o}", "model_id", (int)m->model_id,
					   "name", m->name, "resident_bytes",
					   (json_int_t)m->resident_bytes, "layers", a, "other_tensors", o));
	} else {
		char b[32];
		human_bytes(b, sizeof b, m->resident_bytes);
		printf("model %u \"%s\": %zu linear layers, %s resident\n", m->model_id, m->name,
		       m->n_layers, b);
		printf("%5s  %-48s %-5s %6s %6s %4s %10s\n", "INDEX", "NAME", "KIND", "N", "K", "BIAS",
		       "BYTES");
		for (size_t i = 0; i < m->n_layers; i++) {
			const struct radiance_layer_info *l = &m->layers[i];
			human_bytes(b, sizeof b, l->bytes);
			printf("%5u  %-48s %-5s %6u %6u %4s %10s\n", l->index, l->name, kind_name(l->kind),
			       l->n, l->k, l->has_bias ? "yes" : "no", b);
		}
		if (m->n_other)
			printf("%zu other tensors (no linear layer): norms, embeddings, ... (radiancectl "
			       "tensors %u lists them)\n", m->n_other, m->model_id);
		ret = EXIT_OK;
	}
	radiance_model_info_free(m);
	return ret;
}

static int cmd_tensors(struct ctl *c, const char *model)
{
	uint32_t id;
	struct radiance_model_info *m;
	int ret = get_model(c, model, &id, &m);
	if (ret != EXIT_OK)
		return ret;
	struct radiance_tensors *t;
	int rc = radiance_list_tensors(c->r, id, &t);
	if (rc < 0) {
		ret = fail(c, rc, "list tensors");
		radiance_model_info_free(m);
		return ret;
	}
	if (c->json) {
		json_t *a = json_array();
		for (size_t i = 0; a && i < t->count; i++) {
			const struct radiance_tensor *x = &t->tensors[i];
			json_array_append_new(a, json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", x->name,
							   "dtype", x->dtype, "shape",
							   json_shape(x->ndim, x->shape), "bytes",
							   (json_int_t)x->bytes, "offset",
							   (json_int_t)x->offset));
		}
		ret = print_json(c, json_pack("{s:i, s:s, s:I, s:o}", "model_id", (int)m->model_id,
					   "name", m->name, "bytes", (json_int_t)t->bytes, "tensors", a));
	} else {
		char b[32], shape[96];
		human_bytes(b, sizeof b, t->bytes);
		printf("model %u \"%s\": %zu shared tensors, %s in one sealed memfd (mapped read-only "
		       "by every client that asks)\n", m->model_id, m->name, t->count, b);
		printf("%-56s %-5s %-16s %10s %10s\n", "NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET");
		for (size_t i = 0; i < t->count; i++) {
			const struct radiance_tensor *x = &t->tensors[i];
			size_t o = (size_t)snprintf(shape, sizeof shape, "[");
			for (uint32_t d = 0; d < x->ndim && o < sizeof shape; d++)
				o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%llu", d ? ", " : "",
						      (unsigned long long)x->shape[d]);
			if (o < sizeof shape)
				snprintf(shape + o, sizeof shape - o, "]");
			human_bytes(b, sizeof b, x->bytes);
			printf("%-56s %-5s %-16s %10s %10llu\n", x->name, x->dtype, shape, b,
			       (unsigned long long)x->offset);
		}
		ret = EXIT_OK;
	}
	radiance_tensors_free(t);
	radiance_model_info_free(m);
	return ret;
}

static void progress(void *user, uint64_t done, uint64_t total)
{
	struct ctl *c = user;
	int pct = total ? (int)(done * 100 / total) : 100;
	if (c->tty) {
		char bar[41];
		int fill = pct * 40 / 100;
		memset(bar, '#', (size_t)fill);
		memset(bar + fill, '.', (size_t)(40 - fill));
		bar[40] = '\0';
		fprintf(stderr, "\rloading [%s] %3d%%  %.1f / %.1f MiB", bar, pct,
			(double)done / (1 << 20), (double)total / (1 << 20));
		if (done >= total)
			fputc('\n', stderr);
		fflush(stderr);
	} else if (pct / 10 > c->last_decile || (done >= total && c->last_decile < 10)) {
		c->last_decile = pct / 10;
		fprintf(stderr, "loading: %d%% (%" PRIu64 " of %" PRIu64 " bytes)\n", pct, done, total);
	}
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = 1;
}

static int cmd_load(struct ctl *c, const char *dir)
{
	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.name = c->name;
	lo.progress = progress;
	lo.progress_user = c;
	c->tty = isatty(STDERR_FILENO);
	c->last_decile = -1;
	uint32_t id;
	int rc = radiance_load_model(c->r, dir, &lo, &id);
	if (rc < 0) {
		char what[4200], hint[4300];
		snprintf(what, sizeof what, "cannot load %s", dir);
		snprintf(hint, sizeof hint, "to load it next to the resident one, give it another "
			 "name: radiancectl load --name NAME %s", dir);
		return fail_hint(c, rc, what, rc == -EEXIST ? hint : NULL);
	}
	const struct radiance_model_info *m = radiance_held_model(c->r, id);
	if (c->json) {
		int ret = print_json(c, json_pack("{s:i, s:s, s:I, s:i, s:i, s:b, s:b}", "model_id",
						  (int)m->model_id, "name", m->name, "resident_bytes",
						  (json_int_t)m->resident_bytes, "layers",
						  (int)m->n_layers, "users", (int)m->users,
						  "preloaded", m->preloaded, "held", c->hold));
		if (ret != EXIT_OK)
			return ret;
	} else {
		char b[32];
		human_bytes(b, sizeof b, m->resident_bytes);
		printf("model %u \"%s\": %zu layers, %s resident, %u session%s using it\n", m->model_id,
		       m->name, m->n_layers, b, m->users, m->users == 1 ? "" : "s");
		/* the daemon dedupes by file identity: the same files under
		 * another name attach to the model under its first name */
		if (c->name && strcmp(c->name, m->name))
			printf("note: these files are already resident as \"%s\"; attached to it (the "
			       "name \"%s\" is not used)\n", m->name, c->name);
		if (!c->hold && m->users <= 1 && !m->preloaded)
			printf("note: no other session holds it, so it is unloaded when radiancectl exits "
			       "(use --hold, or preload it in radianced.conf)\n");
	}
	fflush(stdout);
	if (!c->hold)
		return EXIT_OK;

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (!c->json)
		printf("holding model %u until interrupted (Ctrl-C)\n", id);
	fflush(stdout);
	/* Wake up now and then to notice a daemon that went away. */
	while (!stop) {
		struct radiance_model_list *ml;
		sleep(1);
		if (stop)
			break;
		if ((rc = radiance_list_models(c->r, &ml)) < 0) {
			if (radiance_get_error(c->r) == -ECONNRESET)
				return report(c, EXIT_CONNECT, ECONNRESET, NULL,
					      "the daemon went away while holding model %u (it "
					      "closed the connection)", id);
			if (radiance_get_error(c->r) == -ESHUTDOWN)
				return report(c, EXIT_CONNECT, ESHUTDOWN, NULL,
					      "the daemon stopped while holding model %u (%s)", id,
					      radiance_error_message(c->r));
			return fail(c, rc, "holding the model");
		}
		radiance_model_list_free(ml);
	}
	if ((rc = radiance_release_model(c->r, id)) < 0)
		return fail(c, rc, "release");
	if (!c->json)
		printf("released model %u\n", id);
	return EXIT_OK;
}

/* A model stays resident while any session holds a reference; a preloaded
 * one also holds the daemon's own. unload can only drop the latter: client
 * sessions' references are theirs (they end with release or disconnect). */
static int cmd_unload(struct ctl *c, const char *model)
{
	uint32_t id;
	struct radiance_model_info *m;
	int ret = get_model(c, model, &id, &m);
	if (ret != EXIT_OK)
		return ret;
	bool preloaded = m->preloaded;
	uint32_t users = m->users;
	char name[256];
	snprintf(name, sizeof name, "%s", m->name);
	radiance_model_info_free(m);
	/* ENOENT as the daemon answers it: no preload reference to drop */
	if (!preloaded)
		return report(c, EXIT_FAILED, ENOENT, NULL,
			      "model %u \"%s\" is not preloaded: it is held by %u client session%s "
			      "and is unloaded when the last of them releases it or disconnects",
			      id, name, users, users == 1 ? "" : "s");
	int rc = radiance_unload_preloaded(c->r, id);
	if (rc == -EPERM)
		return report(c, EXIT_FAILED, EPERM, NULL,
			      "not allowed to unload model %u \"%s\": it is preloaded by the "
			      "daemon's configuration, and only root or the user radianced runs as "
			      "may drop that (this is uid %u)",
			      id, name, (unsigned)getuid());
	if (rc < 0)
		return fail(c, rc, "unload (dropping the daemon's preload reference)");
	if (c->json)
		return print_json(c, json_pack("{s:i, s:b, s:i}", "model_id", (int)id, "released", 1,
					    "users", (int)users));
	if (users)
		printf("model %u \"%s\": preload reference dropped; unloaded when %s release%s it\n",
		       id, name, users == 1 ? "the session using it" : "the sessions using it",
		       users == 1 ? "s" : "");
	else
		printf("model %u \"%s\" unloaded\n", id, name);
	return EXIT_OK;
}

/* p50/p99 are upper edges of the daemon's histogram buckets (4 per power
 * of two, so up to 25% above the true value): printed as "<= N" whole
 * microseconds, rounded up, rather than with digits they do not have. */
static void bound_us(char *buf, size_t n, uint64_t ns, uint64_t requests)
{
	if (!requests)
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "<=%" PRIu64, (ns + 999) / 1000);
}

/* uid and weight: "-" for the global row, and a weight of 0 (a daemon
 * that does not send it) as "-" too */
static void print_stats_row(const char *who, const char *uid, uint32_t weight,
			    const struct radiance_stats *s)
{
	char in[32], out[32], p50[32], p99[32], max[32];
	human_bytes(in, sizeof in, s->bytes_in);
	human_bytes(out, sizeof out, s->bytes_out);
	bound_us(p50, sizeof p50, s->latency_p50_ns, s->requests);
	bound_us(p99, sizeof p99, s->latency_p99_ns, s->requests);
	if (s->requests)
		snprintf(max, sizeof max, "%.1f", s->latency_max_ns / 1e3);
	else
		snprintf(max, sizeof max, "-");
	char w[16] = "-";
	if (weight)
		snprintf(w, sizeof w, "%" PRIu32, weight);
	printf("%-28s %10s %6s %10" PRIu64 " %10" PRIu64 " %7" PRIu64 " %11s %11s %8s %8s %9s\n",
	       who, uid, w, s->requests, s->rows, s->errors, in, out, p50, p99, max);
}

/* --- Prometheus text exposition format (version 0.0.4) -------------------- */

/* A label value: backslash, double quote and newline escaped, as the
 * format requires; other bytes pass as they are. */
static void prom_label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void prom_family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void prom_u64(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
	prom_family(f, name, type, help);
	fprintf(f, "%s %" PRIu64 "\n", name, v);
}

/* A gauge in seconds from ns; NaN when there is no value yet. */
static void prom_seconds(FILE *f, const char *name, const char *help, uint64_t ns, bool known)
{
	prom_family(f, name, "gauge", help);
	if (known)
		fprintf(f, "%s %.9g\n", name, ns / 1e9);
	else
		fprintf(f, "%s NaN\n", name);
}

/* What radiancectl stats shows for all sessions, and each resident model's
 * bytes. Per-session series are left out on purpose: a label per session id
 * would create a new series with every connection. Latency is a histogram
 * at the daemon's coarse power-of-two bounds (exact counts), and the
 * daemon's finer p50/p99 estimates as gauges. */
static void prom_write(FILE *f, const struct radiance_server_info *si,
		       const struct radiance_stats_reply *st, const struct radiance_model_list *ml)
{
	const struct radiance_stats *g = &st->global;
	prom_u64(f, "radiance_up", "gauge", "1 when radiancectl reached the daemon", 1);
	prom_family(f, "radiance_info", "gauge", "daemon version, protocol, backend and device");
	fprintf(f, "radiance_info{version=\"");
	prom_label(f, si->server_version);
	fprintf(f, "\",protocol=\"%u\",backend=\"", si->protocol_version);
	prom_label(f, si->backend);
	fprintf(f, "\",device=\"");
	prom_label(f, si->device);
	fprintf(f, "\"} 1\n");
	prom_seconds(f, "radiance_uptime_seconds", "seconds since the daemon started", g->uptime_ns,
		     true);
	prom_u64(f, "radiance_sessions", "gauge", "live client sessions (this one included)",
		 g->sessions);
	prom_u64(f, "radiance_requests_total", "counter", "requests decoded, good or not",
		 g->requests);
	prom_u64(f, "radiance_errors_total", "counter", "requests answered with an error",
		 g->errors);
	prom_u64(f, "radiance_rows_total", "counter", "rows (M) of successful requests", g->rows);
	prom_u64(f, "radiance_input_bytes_total", "counter",
		 "activation bytes read by successful requests", g->bytes_in);
	prom_u64(f, "radiance_output_bytes_total", "counter",
		 "output bytes written by successful requests", g->bytes_out);
	if (st->n_latency_buckets) {
		/* counters and buckets are read one after the other, not as one
		 * snapshot: the total must not fall below the last bucket */
		uint64_t total = g->requests;
		if (st->latency_cumulative[st->n_latency_buckets - 1] > total)
			total = st->latency_cumulative[st->n_latency_buckets - 1];
		prom_family(f, "radiance_request_latency_seconds", "histogram",
			    "queue + execution time of a request in the daemon");
		/* le exactly, in decimal: a rounded %g bound could fall below
		 * the daemon's and misplace a request */
		for (size_t i = 0; i < st->n_latency_buckets; i++)
			fprintf(f, "radiance_request_latency_seconds_bucket{le=\"%" PRIu64 ".%09" PRIu64
				"\"} %" PRIu64 "\n", st->latency_le_ns[i] / 1000000000u,
				st->latency_le_ns[i] % 1000000000u, st->latency_cumulative[i]);
		fprintf(f, "radiance_request_latency_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", total);
		fprintf(f, "radiance_request_latency_seconds_sum %.9g\n", st->latency_sum_ns / 1e9);
		fprintf(f, "radiance_request_latency_seconds_count %" PRIu64 "\n", total);
	}
	/* finer than the histogram's power-of-two buckets: the daemon's own
	 * estimates, upper edges of buckets a quarter of a power of two wide */
	prom_seconds(f, "radiance_request_latency_p50_seconds",
		     "median request latency, an upper bound within 25% (NaN before any request)",
		     g->latency_p50_ns, g->requests != 0);
	prom_seconds(f, "radiance_request_latency_p99_seconds",
		     "99th percentile request latency, an upper bound within 25% (NaN before any "
		     "request)", g->latency_p99_ns, g->requests != 0);
	prom_seconds(f, "radiance_request_latency_max_seconds",
		     "longest request since the daemon started", g->latency_max_ns, true);
	prom_u64(f, "radiance_models", "gauge", "resident models", ml->count);
	prom_family(f, "radiance_model_resident_bytes", "gauge",
		    "bytes of a resident model's layers on the device");
	for (size_t i = 0; i < ml->count; i++) {
		fprintf(f, "radiance_model_resident_bytes{model=\"");
		prom_label(f, ml->models[i].name);
		fprintf(f, "\"} %" PRIu64 "\n", ml->models[i].resident_bytes);
	}
	prom_family(f, "radiance_model_users", "gauge", "sessions holding a resident model");
	for (size_t i = 0; i < ml->count; i++) {
		fprintf(f, "radiance_model_users{model=\"");
		prom_label(f, ml->models[i].name);
		fprintf(f, "\"} %" PRIu32 "\n", ml->models[i].users);
	}
}

/* Writes the metrics (or, st NULL, radiance_up 0) to stdout, or replaces
 * c->output atomically: node_exporter reads the textfile directory at any
 * moment and must never see half a file. The temporary name does not end
 * in .prom, so the collector ignores it. */
static int prom_emit(struct ctl *c, const struct radiance_server_info *si,
		     const struct radiance_stats_reply *st, const struct radiance_model_list *ml)
{
	if (!c->output) {
		if (st)
			prom_write(stdout, si, st, ml);
		else
			prom_u64(stdout, "radiance_up", "gauge", "1 when radiancectl reached the daemon", 0);
		return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAILED;
	}
	char tmp[4096];
	if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", c->output, (long)getpid()) >= (int)sizeof tmp)
		return report(c, EXIT_FAILED, ENAMETOOLONG, NULL, "--output %s: path too long",
			      c->output);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return report(c, EXIT_FAILED, errno, NULL, "--output: cannot create %s: %s", tmp,
			      strerror(errno));
	FILE *f = fdopen(fd, "w");
	if (!f) {
		int e = errno;
		close(fd);
		unlink(tmp);
		return report(c, EXIT_FAILED, e, NULL, "--output %s: %s", tmp, strerror(e));
	}
	if (st)
		prom_write(f, si, st, ml);
	else
		prom_u64(f, "radiance_up", "gauge", "1 when radiancectl reached the daemon", 0);
	int e = 0;
	if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
		e = errno ? errno : EIO;
	if (fclose(f) != 0 && !e)
		e = errno;
	if (!e && rename(tmp, c->output) != 0)
		e = errno;
	if (e) {
		unlink(tmp);
		return report(c, EXIT_FAILED, e, NULL, "--output: writing %s: %s", c->output,
			      strerror(e));
	}
	return EXIT_OK;
}

static int cmd_stats_prometheus(struct ctl *c)
{
	struct radiance_stats_reply *st;
	struct radiance_model_list *ml;
	int ret = get_stats_models(c, &st, &ml);
	if (ret == EXIT_CONNECT && c->output) {
		/* reached, then lost (or it stopped answering): the collector's
		 * file must not keep the last figures either */
		prom_emit(c, NULL, NULL, NULL);
		return ret;
	}
	if (ret != EXIT_OK)
		return ret;
	ret = prom_emit(c, radiance_get_server_info(c->r), st, ml);
	radiance_model_list_free(ml);
	radiance_stats_free(st);
	return ret;
}

static int cmd_stats(struct ctl *c)
{
	struct radiance_stats_reply *st;
	int rc = radiance_get_stats(c->r, &st);
	if (rc < 0)
		return fail(c, rc, "stats");
	if (c->json) {
		json_t *a = json_array();
		for (size_t i = 0; a && i < st->n_sessions; i++) {
			const struct radiance_session_stats *s = &st->sessions[i];
			json_array_append_new(a, json_pack("{s:I, s:s, s:i, s:I, s:I, s:o}",
							   "session_id", (json_int_t)s->session_id,
							   "client_name", s->client_name, "pid",
							   (int)s->pid, "uid", (json_int_t)s->uid,
							   "weight",
							   (json_int_t)st->session_weights[i],
							   "stats", stats_json(&s->stats, false)));
		}
		json_t *j = json_pack("{s:o, s:o, s:o}", "global", stats_json(&st->global, true),
				      "session", stats_json(&st->session, false), "sessions", a);
		radiance_stats_free(st);
		return print_json(c, j);
	}
	char up[64];
	human_duration(up, sizeof up, st->global.uptime_ns);
	printf("uptime %s, %u live session%s\n", up, st->global.sessions,
	       st->global.sessions == 1 ? "" : "s");
	printf("latency in the daemon (queue + exec), us: P50 and P99 are the upper bounds of "
	       "histogram buckets (within 25%%), MAX is exact\n");
	printf("%-28s %10s %6s %10s %10s %7s %11s %11s %8s %8s %9s\n", "SESSION NAME PID", "UID", "WEIGHT",
	       "REQUESTS", "ROWS", "ERRORS", "IN", "OUT", "P50", "P99", "MAX");
	print_stats_row("all sessions", "-", 0, &st->global);
	/* in session id order (the daemon lists them in its table's order) */
	size_t *order = malloc((st->n_sessions ? st->n_sessions : 1) * sizeof *order);
	if (!order) {
		radiance_stats_free(st);
		return report(c, EXIT_FAILED, ENOMEM, NULL, "out of memory");
	}
	for (size_t i = 0; i < st->n_sessions; i++) {
		size_t j = i;
		for (; j > 0 && st->sessions[order[j - 1]].session_id > st->sessions[i].session_id; j--)
			order[j] = order[j - 1];
		order[j] = i;
	}
	for (size_t oi = 0; oi < st->n_sessions; oi++) {
		const size_t i = order[oi];
		const struct radiance_session_stats *s = &st->sessions[i];
		char who[64];
		char uid[16];
		snprintf(who, sizeof who, "%" PRIu64 " %.14s pid %d", s->session_id, s->client_name,
			 s->pid);
		snprintf(uid, sizeof uid, "%" PRIu32, s->uid);
		print_stats_row(who, uid, st->session_weights[i], &s->stats);
	}
	free(order);
	radiance_stats_free(st);
	return EXIT_OK;
}

/* getopt_long's ':' (missing argument) or '?' (anything else wrong), told
 * in one line. arg is argv[optind - 1]: the option itself when it is a long
 * one; a short one may sit inside a cluster ("-jx"), so optopt names it. */
static int bad_option(int o, const char *arg, const struct option *opts)
{
	if (strncmp(arg, "--", 2) == 0) {
		size_t len = strcspn(arg + 2, "=");
		for (const struct option *p = opts; p->name; p++)
			if (strlen(p->name) == len && !strncmp(p->name, arg + 2, len))
				return usage_error(o == ':' ? "option '--%s' needs an argument"
							    : "option '--%s' takes no argument",
						   p->name);
		return usage_error("unknown option '%.*s'", (int)len + 2, arg);
	}
	if (o == ':')
		return usage_error("option '-%c' needs an argument", optopt);
	return usage_error("unknown option '-%c'", optopt);
}

int main(int argc, char **argv)
{
	struct ctl c = { .timeout_s = -1 };
	const char *device = NULL;
	enum { OPT_HOLD = 256, OPT_PROMETHEUS, OPT_OUTPUT };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "device", required_argument, NULL, 'd' },
		{ "prometheus", no_argument, NULL, OPT_PROMETHEUS },
		{ "output", required_argument, NULL, OPT_OUTPUT },
		{ "json", no_argument, NULL, 'j' },
		{ "name", required_argument, NULL, 'n' },
		{ "hold", no_argument, NULL, OPT_HOLD },
		{ "timeout", required_argument, NULL, 't' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	int o;
	opterr = 0;   /* our own one-line messages, without argv[0]'s path */
	while ((o = getopt_long(argc, argv, ":s:d:jn:t:vhV", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			if (!*optarg)
				return usage_error("--socket needs a path, not an empty string");
			c.socket = optarg;
			break;
		case 'd':
			device = optarg;
			break;
		case OPT_PROMETHEUS:
			c.prometheus = true;
			break;
		case OPT_OUTPUT:
			if (!*optarg)
				return usage_error("--output needs a file name, not an empty string");
			c.output = optarg;
			break;
		case 'j':
			c.json = true;
			break;
		case 'n':
			if (!*optarg)
				return usage_error("--name needs a model name, not an empty string");
			/* the daemon's rule, said before anything is loaded */
			char why[512];
			if (rtext_check_model_name("--name", optarg, RTEXT_NAME_MAX, why,
						   sizeof why) < 0)
				return usage_error("%s", why);
			c.name = optarg;
			break;
		case OPT_HOLD:
			c.hold = true;
			break;
		case 't': {
			char *end;
			errno = 0;
			double t = strtod(optarg, &end);
			/* at most a day: the library takes int milliseconds */
			if (errno || end == optarg || *end || !(t >= 0 && t <= 86400))
				return usage_error("--timeout '%s' is not a number of seconds in 0..86400 "
						   "(0: no limit)", optarg);
			c.timeout_s = t;
			break;
		}
		case 'v':
			c.verbose = true;
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case 'V':
			printf("radiancectl %s (libradiance %s, protocol %u)\n", RADIANCE_VERSION,
			       radiance_version(), radiance_protocol_version());
			return EXIT_OK;
		default:
			return bad_option(o, argv[optind - 1], opts);
		}
	}
	if (optind >= argc)
		return usage_error("no command given (status, models, layers, tensors, load, unload, stats)");
	const char *cmd = argv[optind];
	int nargs = argc - optind - 1;
	char **args = argv + optind + 1;
	int want = -1;
	if (!strcmp(cmd, "status") || !strcmp(cmd, "models") || !strcmp(cmd, "stats"))
		want = 0;
	else if (!strcmp(cmd, "layers") || !strcmp(cmd, "tensors") || !strcmp(cmd, "load") ||
		 !strcmp(cmd, "unload"))
		want = 1;
	if (want < 0)
		return usage_error("unknown command \"%s\"", cmd);
	if (nargs != want) {
		if (want == 0)
			return usage_error("%s takes no arguments (got \"%s\")", cmd, args[0]);
		return usage_error("%s takes one argument: %s", cmd,
				   strcmp(cmd, "load") ? "MODEL (a name or an id)" : "DIR");
	}
	if ((c.name || c.hold) && strcmp(cmd, "load"))
		return usage_error("--name and --hold belong to load");
	if ((c.prometheus || c.output) && strcmp(cmd, "stats"))
		return usage_error("--prometheus and --output belong to stats");
	if (c.output && !c.prometheus)
		return usage_error("--output needs --prometheus");
	if (c.prometheus && c.json)
		return usage_error("--prometheus and --json are two output formats: pick one");
	if (device) {
		if (c.socket)
			return usage_error("--socket and --device both name the socket: pick one");
		/* libradiance's own resolution ($RADIANCE_DEVICE), so that the two
		 * agree on the path; the option wins over $RADIANCE_SOCKET */
		if (setenv("RADIANCE_DEVICE", device, 1) < 0 || unsetenv("RADIANCE_SOCKET") < 0)
			return report(&c, EXIT_FAILED, errno, NULL, "setenv: %s", strerror(errno));
		char path[108];
		int prc = radiance_default_socket_path(path, sizeof path);
		if (prc < 0)
			return usage_error("--device '%s': %s", device,
					   prc == -EINVAL ? "not a GPU ordinal (0 to 1024)"
							  : radiance_strerror(prc));
	}
	if (!strcmp(cmd, "layers") || !strcmp(cmd, "tensors") || !strcmp(cmd, "unload")) {
		if (!*args[0])
			return usage_error("%s needs a model name or id, not an empty string", cmd);
	} else if (!strcmp(cmd, "load") && !*args[0]) {
		return usage_error("load needs a checkpoint directory, not an empty string");
	}

	struct radiance_options ro = RADIANCE_OPTIONS_INIT;
	ro.client_name = "radiancectl";
	ro.log = log_cb;
	ro.log_user = &c;
	ro.log_priority = c.verbose ? LOG_DEBUG : LOG_WARNING;
	/* an administrator's question about the daemon now: a missing socket or
	 * a stale one is the answer, not something to wait out (the library
	 * default would retry for 30 s) */
	ro.connect_timeout_ms = -1;
	/* ... and a daemon that accepts but does not answer (SIGSTOPped,
	 * wedged) is one too: without a limit radiancectl waited for ever, and
	 * radiance-metrics.service (a oneshot, no start timeout) with it, the
	 * collector's file keeping its last radiance_up 1. A load may wait its
	 * turn behind others' loads, without progress: no limit unless asked. */
	double timeout_s = c.timeout_s >= 0 ? c.timeout_s : strcmp(cmd, "load") ? 10 : 0;
	ro.timeout_ms = timeout_s > 0 && timeout_s * 1000 < 1 ? 1 : (int32_t)(timeout_s * 1000);
	c.r = radiance_connect(c.socket, &ro);
	if (!c.r && c.output) {
		/* the collector's file must say the daemon is down, not keep the
		 * last figures; the reason still goes to stderr and the exit code */
		int e = errno;
		prom_emit(&c, NULL, NULL, NULL);
		errno = e;
	}
	if (!c.r) {
		int e = errno;
		char path[108] = "";
		if (c.socket)
			snprintf(path, sizeof path, "%s", c.socket);
		else
			radiance_default_socket_path(path, sizeof path);
		/* Nothing there, or a socket nobody listens on: the daemon is
		 * the likely problem. Not for ENOTSOCK: the path is wrong, and
		 * the message says so. */
		const char *hint = e == ENOENT || e == ECONNREFUSED
					   ? "is radianced running? --socket PATH or $RADIANCE_SOCKET "
					     "names another socket"
				   : e == ETIMEDOUT ? NOT_ANSWERING_HINT
						    : NULL;
		/* the library's reason names the path and, for a refusal, gives
		 * the daemon's text (e.g. "too many sessions (the limit is 64)");
		 * for EACCES it says who may connect */
		if (c.connect_error[0])
			return report(&c, EXIT_CONNECT, e, hint, "%s", c.connect_error);
		return report(&c, EXIT_CONNECT, e, hint, "cannot connect to %s: %s", path,
			      radiance_strerror(e));
	}

	int ret;
	if (!strcmp(cmd, "status"))
		ret = cmd_status(&c);
	else if (!strcmp(cmd, "models"))
		ret = cmd_models(&c);
	else if (!strcmp(cmd, "stats"))
		ret = c.prometheus ? cmd_stats_prometheus(&c) : cmd_stats(&c);
	else if (!strcmp(cmd, "layers"))
		ret = cmd_layers(&c, args[0]);
	else if (!strcmp(cmd, "tensors"))
		ret = cmd_tensors(&c, args[0]);
	else if (!strcmp(cmd, "load"))
		ret = cmd_load(&c, args[0]);
	else
		ret = cmd_unload(&c, args[0]);
	radiance_disconnect(c.r);
	return ret;
}
