/*
 * Hostile and broken clients against the real radianced: every bad input we
 * could think of on the control socket (framing, protobuf, fds, handshake)
 * and in the shared rings (descriptors, offsets, shapes, ids, corrupted
 * counters and slots), and a client SIGKILLed mid-stream. After each, the
 * daemon must still be alive, hold no leaked descriptor, and serve a good
 * client correct results (checked against the CPU reference); teardown also
 * checks it exits 0 on SIGTERM.
 *
 * The control-plane tests speak raw frames through common/transport and the
 * generated protobuf-c structs. The data-plane tests set a session up with
 * libradiance and then write into its rings directly (client-private.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client-private.h"
#include "daemon_harness.h"
#include "proto_util.h"
#include "raw_client.h"
#include "wire.h"

static struct h_ref ref;
static struct h_daemon daemon_;
static char ckpt[512];
static int fds_at_start;

static int group_setup(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	return h_ref_load_some(&ref, h_good_layers);
}

static int group_teardown(void **state)
{
	h_ref_free(&ref);
	return 0;
}

static int start(void **state)
{
	if (h_daemon_start(&daemon_) < 0)
		return -1;
	fds_at_start = h_count_fds(daemon_.pid);
	return 0;
}

/* Waits up to 2 s for the daemon's descriptor count to come back to what it
 * was; returns the last count. */
static int settle_fds(int want)
{
	int n = -1;
	for (int i = 0; i < 200; i++) {
		n = h_count_fds(daemon_.pid);
		if (n <= want)
			break;
		h_sleep_ms(10);
	}
	return n;
}

/* After every test: the daemon lives, serves a good client correctly, has
 * closed every descriptor the test made it take, and exits 0 on SIGTERM. */
static int check_and_stop(void **state)
{
	int ok = 1;
	if (!h_daemon_alive(&daemon_)) {
		fprintf(stderr, "the daemon died\n");
		ok = 0;
	} else {
		if (h_good_client(daemon_.socket, &ref) != 0) {
			fprintf(stderr, "the good client failed after the fault\n");
			ok = 0;
		}
		int n = settle_fds(fds_at_start);
		if (n > fds_at_start) {
			fprintf(stderr, "daemon fds: %d at start, %d now (leak)\n", fds_at_start, n);
			ok = 0;
		}
	}
	int st = h_daemon_stop(&daemon_);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "daemon exit status 0x%x\n", st);
		ok = 0;
	}
	return ok ? 0 : -1;
}

/* --- raw control-plane client (tests/raw_client.h) ------------------------- */

static void raw_open(struct raw *w)
{
	assert_int_equal(raw_open_at(w, daemon_.socket), 0);
}

static int open_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++) {
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		assert_true(fds[i] >= 0);
	}
	return n;
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* Lines of the daemon's log that contain needle and, after it, needle2
 * (NULL: anything), waiting up to 2 s for at least one (the daemon may log
 * after it has answered). */
static int log_lines(const char *needle, const char *needle2)
{
	int n = 0;
	for (int tries = 0; tries < 200 && n == 0; tries++) {
		if (tries)
			h_sleep_ms(10);
		FILE *f = fopen(daemon_.log, "r");
		if (!f)
			continue;
		char line[2048];
		while (fgets(line, sizeof line, f)) {
			const char *at = strstr(line, needle);
			if (at && (!needle2 || strstr(at + strlen(needle), needle2)))
				n++;
		}
		fclose(f);
	}
	if (n == 0) {
		fprintf(stderr, "no line of the daemon's log has: %s%s%s\n", needle,
			needle2 ? " ... " : "", needle2 ? needle2 : "");
		h_daemon_dump_log(&daemon_);
	}
	return n;
}

static int log_count(const char *needle)
{
	return log_lines(needle, NULL);
}

/* Whether byte c occurs anywhere in the daemon's log. */
static int log_has_byte(int c)
{
	FILE *f = fopen(daemon_.log, "r");
	assert_non_null(f);
	int ch, found = 0;
	while ((ch = fgetc(f)) != EOF)
		if (ch == c)
			found = 1;
	fclose(f);
	return found;
}

/* The next reply that is not a LoadProgress (within 20 s each). */
static Rdw__ServerMessage *raw_recv_after_progress(struct raw *w)
{
	Rdw__ServerMessage *reply;
	for (;;) {
		assert_int_equal(raw_recv(w, &reply, 20000), 1);
		if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS)
			return reply;
		rdw__server_message__free_unpacked(reply, NULL);
	}
}

/* The reply to the last request, after any LoadProgress, is an Error with
 * this code whose text has every needle (NULL-terminated). */
static void raw_expect_error(struct raw *w, int code, ...)
{
	Rdw__ServerMessage *reply = raw_recv_after_progress(w);
	int got_case = reply->msg_case, got = 0;
	char text[512] = "";
	if (got_case == RDW__SERVER_MESSAGE__MSG_ERROR) {
		got = reply->error->code;
		snprintf(text, sizeof text, "%s", reply->error->message ? reply->error->message : "");
	}
	rdw__server_message__free_unpacked(reply, NULL);
	if (got_case != RDW__SERVER_MESSAGE__MSG_ERROR)
		fail_msg("expected Error %d, got message case %d", code, got_case);
	if (got != code)
		fail_msg("expected Error %d, got %d '%s'", code, got, text);
	va_list ap;
	va_start(ap, code);
	for (const char *needle; (needle = va_arg(ap, const char *));)
		if (!strstr(text, needle))
			fail_msg("Error '%s' lacks '%s'", text, needle);
	va_end(ap);
}

/* The reply to a LoadModel, after any LoadProgress, is its ModelInfo. */
static void raw_expect_loaded(struct raw *w)
{
	Rdw__ServerMessage *reply = raw_recv_after_progress(w);
	int got = reply->msg_case;
	char text[512] = "";
	if (got == RDW__SERVER_MESSAGE__MSG_ERROR)
		snprintf(text, sizeof text, "%s", reply->error->message ? reply->error->message : "");
	rdw__server_message__free_unpacked(reply, NULL);
	if (got != RDW__SERVER_MESSAGE__MSG_MODEL_INFO)
		fail_msg("expected ModelInfo, got message case %d %s", got, text);
}

static void raw_send_attach(struct raw *w, char *name)
{
	Rdw__AttachModel a = RDW__ATTACH_MODEL__INIT;
	a.name = name;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_ATTACH_MODEL;
	m.attach_model = &a;
	raw_send(w, &m, NULL, 0);
}

/* Hello, and the session id the Welcome gives. */
static uint64_t raw_hello_id(struct raw *w)
{
	struct raw_welcome wl;
	raw_hello_welcome(w, &wl);
	return wl.session_id;
}

/* The names of the model ListModels shows, one per line, into out. */
static size_t raw_list_names(struct raw *w, char *out, size_t outlen)
{
	raw_send_list_models(w, NULL, 0);
	Rdw__ServerMessage *reply;
	assert_int_equal(raw_recv(w, &reply, 10000), 1);
	assert_int_equal(reply->msg_case, RDW__SERVER_MESSAGE__MSG_MODEL_LIST);
	size_t n = reply->model_list->n_models, o = 0;
	out[0] = 0;
	for (size_t i = 0; i < n && o < outlen; i++)
		o += (size_t)snprintf(out + o, outlen - o, "%s\n", reply->model_list->models[i]->name);
	rdw__server_message__free_unpacked(reply, NULL);
	return n;
}

static char *ckpt_files[] = { "config.json", "quantization_config.json", "model.safetensors" };

/* The checkpoint's three files, opened from dir (or from the checkpoint
 * where dir has no such file). */
static void open_ckpt(const char *dir, int fds[3])
{
	for (int i = 0; i < 3; i++) {
		char path[1024];
		snprintf(path, sizeof path, "%s/%s", dir, ckpt_files[i]);
		fds[i] = open(path, O_RDONLY | O_CLOEXEC);
		if (fds[i] < 0) {
			snprintf(path, sizeof path, "%s/%s", ckpt, ckpt_files[i]);
			fds[i] = open(path, O_RDONLY | O_CLOEXEC);
		}
		assert_true(fds[i] >= 0);
	}
}

/* --- framing and decoding -------------------------------------------------- */

static void garbage_bytes(void **state)
{
	struct raw w;
	raw_open(&w);
	/* a valid length around bytes that are no protobuf (wire type 7) */
	static const uint8_t junk[] = { 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F };
	raw_send_frame(&w, junk, sizeof junk, NULL, 0);
	raw_expect_closed(&w);
	raw_close(&w);

	/* unframed noise */
	raw_open(&w);
	uint8_t noise[256];
	unsigned seed = 7;
	for (size_t i = 0; i < sizeof noise; i++)
		noise[i] = (uint8_t)((seed = seed * 1103515245u + 12345u) >> 16);
	raw_send_bytes(&w, noise, sizeof noise, NULL, 0);
	raw_expect_closed(&w);
	raw_close(&w);
}

static void bad_protobuf_after_hello(void **state)
{
	struct raw w;
	raw_open(&w);
	raw_hello(&w);
	/* field 2 (hello), length 16, but only one byte follows */
	static const uint8_t truncated[] = { 0x08, 0x02, 0x12, 0x10, 0x08 };
	raw_send_frame(&w, truncated, sizeof truncated, NULL, 0);
	raw_expect_closed(&w);
	raw_close(&w);
}

/* The one home of the daemon's frame-length check (common/transport.c's own
 * is test_transport's): every length outside 1..RADIANCE_MAX_FRAME ends
 * that session, is logged once with its value, and costs no memory. */
static void oversized_frame_length(void **state)
{
	static const uint32_t lens[] = { 0xFFFFFFFFu, 0x7FFFFFF0u, RADIANCE_MAX_FRAME + 1, 0 };
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		struct raw w;
		raw_open(&w);
		uint8_t buf[16] = { 0 };
		memcpy(buf, &lens[i], 4);
		raw_send_bytes(&w, buf, sizeof buf, NULL, 0);
		raw_expect_closed(&w);
		raw_close(&w);
	}
	/* the daemon did not try to allocate 4 GiB and is fine */
	assert_true(h_rss_kib(daemon_.pid) < 1024 * 1024);
	/* and said what was wrong with each, with the value */
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		char want[128];
		snprintf(want, sizeof want, "protocol violation: frame length %u is outside 1..%u bytes",
			 lens[i], RADIANCE_MAX_FRAME);
		assert_int_equal(log_count(want), 1);
	}
}

static void half_frame_then_hang_up(void **state)
{
	struct raw w;
	raw_open(&w);
	uint32_t len = 1000;
	uint8_t buf[4 + 10] = { 0 };
	memcpy(buf, &len, 4);
	raw_send_bytes(&w, buf, sizeof buf, NULL, 0);
	/* while that one dawdles, another client is served */
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	raw_close(&w);
}

static void unknown_message(void **state)
{
	/* an empty oneof, before and after the handshake */
	for (int hello = 0; hello < 2; hello++) {
		struct raw w;
		raw_open(&w);
		if (hello)
			raw_hello(&w);
		Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
		raw_send(&w, &m, NULL, 0);
		raw_expect_closed(&w);
		raw_close(&w);
	}
	/* a field number from the future: unknown fields, no oneof set */
	struct raw w;
	raw_open(&w);
	raw_hello(&w);
	static const uint8_t future[] = { 0x08, 0x05, 0xA2, 0x06, 0x00 };   /* tag 5, field 100 */
	raw_send_frame(&w, future, sizeof future, NULL, 0);
	raw_expect_closed(&w);
	raw_close(&w);
}

/* --- handshake ------------------------------------------------------------ */

static void protocol_version_mismatch(void **state)
{
	struct raw w;
	raw_open(&w);
	raw_send_hello(&w, RADIANCE_PROTOCOL_VERSION + 1, "from-the-future", NULL, 0);
	int code = raw_expect_closed(&w);
	assert_int_not_equal(code, 0);   /* an Error explains the refusal */
	raw_close(&w);
}

static void request_before_hello_and_hello_twice(void **state)
{
	struct raw w;
	raw_open(&w);
	raw_send_list_models(&w, NULL, 0);
	raw_expect_closed(&w);
	raw_close(&w);

	raw_open(&w);
	raw_hello(&w);
	raw_send_hello(&w, RADIANCE_PROTOCOL_VERSION, NULL, NULL, 0);
	raw_expect_closed(&w);
	raw_close(&w);
}

/* --- descriptors ---------------------------------------------------------- */

static void fds_on_a_message_declaring_none(void **state)
{
	int fds[3];
	open_fds(fds, 3);
	struct raw w;
	raw_open(&w);
	raw_send_hello(&w, RADIANCE_PROTOCOL_VERSION, NULL, fds, 3);
	raw_expect_closed(&w);
	raw_close(&w);

	raw_open(&w);
	raw_hello(&w);
	raw_send_list_models(&w, fds, 1);
	raw_expect_closed(&w);
	raw_close(&w);
	close_fds(fds, 3);
	/* teardown checks the daemon closed every one of them */
}

static void too_many_fds(void **state)
{
	static const int counts[] = { RADIANCE_MAX_FDS + 1, 253 };
	int fds[253];
	open_fds(fds, 253);
	for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
		int n = counts[c];
		struct raw w;
		raw_open(&w);
		raw_hello(&w);
		/* a LoadModel that even declares them all */
		char **names = calloc((size_t)n, sizeof *names);
		for (int i = 0; i < n; i++)
			names[i] = "model.safetensors";
		raw_send_load_model(&w, names, (size_t)n, fds, (size_t)n);
		raw_expect_closed(&w);
		raw_close(&w);
		free(names);
	}
	close_fds(fds, 253);
}

static void load_model_fd_count_mismatch(void **state)
{
	int fds[1];
	open_fds(fds, 1);
	struct raw w;
	raw_open(&w);
	raw_hello(&w);
	char *names[] = { "config.json", "quantization_config.json", "model.safetensors" };
	raw_send_load_model(&w, names, 3, fds, 1);
	raw_expect_closed(&w);
	raw_close(&w);
	close_fds(fds, 1);
}

static void load_model_bogus_files(void **state)
{
	/* Descriptors that are all wrong: /dev/null, a pipe, a directory, a
	 * truncated copy. The load fails with an Error; the session goes on. */
	struct raw w;
	raw_open(&w);
	raw_hello(&w);
	int p[2];
	assert_int_equal(pipe(p), 0);
	int dir = open("/tmp", O_RDONLY | O_DIRECTORY);
	int null = open("/dev/null", O_RDONLY);
	const int sets[][3] = { { null, null, null }, { null, null, p[0] }, { null, null, dir } };
	char *names[] = { "config.json", "quantization_config.json", "model.safetensors" };
	for (size_t s = 0; s < 3; s++) {
		raw_send_load_model(&w, names, 3, sets[s], 3);
		Rdw__ServerMessage *reply;
		do {
			assert_int_equal(raw_recv(&w, &reply, 20000), 1);
			if (reply->msg_case == RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS)
				rdw__server_message__free_unpacked(reply, NULL);
			else
				break;
		} while (1);
		assert_int_equal(reply->msg_case, RDW__SERVER_MESSAGE__MSG_ERROR);
		assert_true(reply->error->code > 0);
		rdw__server_message__free_unpacked(reply, NULL);
	}
	raw_expect_alive(&w);
	raw_close(&w);
	close(p[0]);
	close(p[1]);
	close(dir);
	close(null);
}

/* --- names that end up in the log and in listings -------------------------- */

/* A model name is shown to every client (`radiancectl models`) and logged:
 * one with a newline and an escape sequence would forge a row and log
 * lines. The daemon refuses such names (EINVAL, naming the field and the
 * byte) in LoadModel.name, LoadModel.file_names and AttachModel.name, and
 * model names that read as a path or as blank ("a/b", "..", " "); the
 * session goes on, and nothing forged is listed or logged. */
static void names_with_control_characters(void **state)
{
	struct raw w;
	raw_open(&w);
	raw_hello(&w);
	int fds[3];
	open_ckpt(ckpt, fds);
	char forged[] = "fake\n   9  evil\x1b[2K";
	raw_send_load_model_named(&w, forged, ckpt_files, 3, fds, 3);
	raw_expect_error(&w, EINVAL, "LoadModel.name", "control character (0x0a) at byte 4", NULL);
	/* nor escape sequences alone, DEL, C1 controls as UTF-8, broken UTF-8 */
	static const struct {
		const char *name, *why;
	} bad[] = {
		{ "evil\x1b[2K", "(0x1b) at byte 4" },
		{ "del\x7f", "(0x7f) at byte 3" },
		{ "c1\xc2\x9b" "2K", "(U+009B) at byte 2" },
		{ "bad\xff", "not valid UTF-8 at byte 3 (0xff)" },
		{ "cut\xe2\x82", "not valid UTF-8 at byte 3" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		raw_send_load_model_named(&w, (char *)bad[i].name, ckpt_files, 3, fds, 3);
		raw_expect_error(&w, EINVAL, "LoadModel.name", bad[i].why, NULL);
	}
	/* nor one that reads as a path or as blank in `radiancectl models` and
	 * as its MODEL argument (these loaded before) */
	static const struct {
		const char *name, *why;
	} pathlike[] = {
		{ " ", "\" \" begins with a space" },
		{ " minilm", "\" minilm\" begins with a space" },
		{ "minilm ", "\"minilm \" ends with a space" },
		{ ".", "\".\" is a directory's name" },
		{ "..", "\"..\" is a directory's name" },
		{ "a/b", "\"a/b\" has a '/' at byte 1" },
		{ "/", "\"/\" has a '/' at byte 0" },
	};
	for (size_t i = 0; i < sizeof pathlike / sizeof pathlike[0]; i++) {
		raw_send_load_model_named(&w, (char *)pathlike[i].name, ckpt_files, 3, fds, 3);
		raw_expect_error(&w, EINVAL, "LoadModel.name", pathlike[i].why,
				 "a model name is printable text of 1..255 bytes, without '/', not "
				 "\".\" or \"..\", with no space at either end", NULL);
	}
	raw_send_attach(&w, "a/b");
	raw_expect_error(&w, EINVAL, "AttachModel.name \"a/b\" has a '/' at byte 1", NULL);
	char long_name[300];
	memset(long_name, 'x', 256);
	long_name[256] = 0;
	raw_send_load_model_named(&w, long_name, ckpt_files, 3, fds, 3);
	raw_expect_error(&w, EINVAL, "LoadModel.name is 256 bytes long", NULL);

	/* file names are logged and named in errors too */
	char *files[] = { "config.json\n[warn] x", "quantization_config.json", "model.safetensors" };
	raw_send_load_model_named(&w, "", files, 3, fds, 3);
	raw_expect_error(&w, EINVAL, "LoadModel.file_names[0]", "(0x0a) at byte 11", NULL);

	raw_send_attach(&w, forged);
	raw_expect_error(&w, EINVAL, "AttachModel.name", "(0x0a) at byte 4", NULL);
	raw_send_attach(&w, "");
	raw_expect_error(&w, EINVAL, "AttachModel.name is empty", NULL);

	/* the session goes on; nothing was loaded, so nothing is listed */
	char names[1024];
	assert_int_equal(raw_list_names(&w, names, sizeof names), 0);

	/* printable UTF-8 is a name like any other */
	raw_send_load_model_named(&w, "minilm \xc3\xbc" "ber-\xe2\x9c\x93", ckpt_files, 3, fds, 3);
	raw_expect_loaded(&w);
	assert_int_equal(raw_list_names(&w, names, sizeof names), 1);
	assert_string_equal(names, "minilm \xc3\xbc" "ber-\xe2\x9c\x93\n");
	close_fds(fds, 3);
	raw_close(&w);

	/* the log has no raw escape byte and no line the forged name began */
	assert_false(log_has_byte(0x1b));
	assert_false(log_has_byte(0x7f));
	FILE *f = fopen(daemon_.log, "r");
	assert_non_null(f);
	char line[2048];
	while (fgets(line, sizeof line, f))
		assert_false(strncmp(line, "   9", 4) == 0 || strncmp(line, "[warn] x", 8) == 0);
	fclose(f);
}

/* A LoadModel without a name takes config.json's _name_or_path, text the
 * client wrote: checked the same way. A load that fails is logged naming
 * the model id, its name and the session that asked. */
static void checkpoint_names_and_load_failure_log(void **state)
{
	char cfg_path[256];
	snprintf(cfg_path, sizeof cfg_path, "%s/config.json", daemon_.dir);
	char src[1024];
	snprintf(src, sizeof src, "%s/config.json", ckpt);
	json_t *cfg = json_load_file(src, 0, NULL);
	assert_non_null(cfg);
	json_object_set_new(cfg, "_name_or_path", json_string("org/evil\x1b[2Kname"));
	assert_int_equal(json_dump_file(cfg, cfg_path, 0), 0);
	json_decref(cfg);

	struct raw w;
	raw_open(&w);
	uint64_t sid = raw_hello_id(&w);
	int fds[3];
	open_ckpt(daemon_.dir, fds);
	raw_send_load_model_named(&w, "", ckpt_files, 3, fds, 3);
	raw_expect_error(&w, EINVAL, "the model name from config.json's _name_or_path",
			 "\"evil\\x1b[2Kname\"", "(0x1b) at byte 4", "give the load a name", NULL);
	char who[64];
	snprintf(who, sizeof who, "session %llu: loading model ", (unsigned long long)sid);
	assert_int_equal(log_lines(who, " (no name yet) failed: the model name from config.json's "
				   "_name_or_path \"evil\\x1b[2Kname\""), 1);
	assert_false(log_has_byte(0x1b));

	/* the same files under a name of the client's own: fine */
	raw_send_load_model_named(&w, "named-by-client", ckpt_files, 3, fds, 3);
	raw_expect_loaded(&w);
	close_fds(fds, 3);

	/* another config.json that is no JSON: the load fails, and the log
	 * says which model, under which name, for which session */
	FILE *f = fopen(cfg_path, "w");
	assert_non_null(f);
	fputs("{ not json", f);
	fclose(f);
	open_ckpt(daemon_.dir, fds);
	raw_send_load_model_named(&w, "broken-config", ckpt_files, 3, fds, 3);
	raw_expect_error(&w, EINVAL, "config.json", NULL);
	close_fds(fds, 3);
	assert_int_equal(log_lines(who, " 'broken-config' failed: config.json"), 1);
	raw_expect_alive(&w);
	raw_close(&w);
}

/* --- control requests with bad arguments (not fatal) ---------------------- */

static void bad_control_arguments(void **state)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.sq_entries = 3;   /* not a power of two */
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	assert_int_equal(radiance_open_rings(r), -EINVAL);
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);

	o.sq_entries = 16;
	o.cq_entries = 8;   /* fewer CQ than SQ entries */
	r = radiance_connect(daemon_.socket, &o);
	assert_int_equal(radiance_open_rings(r), -EINVAL);
	radiance_disconnect(r);

	o.sq_entries = 0;
	o.cq_entries = 0;
	o.arena_bytes = 1ull << 50;   /* beyond max_arena_bytes */
	r = radiance_connect(daemon_.socket, &o);
	int rc = radiance_open_rings(r);
	assert_true(rc == -EINVAL || rc == -E2BIG);
	/* still usable: the unknown ids below are plain errors */
	struct radiance_model_info *m;
	assert_int_equal(radiance_get_model(r, 12345, &m), -ENOENT);
	assert_int_equal(radiance_release_model(r, 12345), -ENOENT);
	uint32_t id;
	assert_int_equal(radiance_attach_model(r, "nope", &id), -ENOENT);
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);
}

/* --- data plane ----------------------------------------------------------- */

struct dp {
	struct radiance *r;
	uint32_t model_id;
	uint32_t layer;            /* 384 x 384 */
	uint64_t x_off, y_off;     /* a valid pair in the arena */
	uint16_t *x, *y;
};

/* sq, cq: the rings' entries (0: the defaults). */
static void dp_open_entries(struct dp *d, uint32_t sq, uint32_t cq)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 20000;
	o.sq_entries = sq;
	o.cq_entries = cq;
	o.client_name = "data-plane-faults";
	d->r = radiance_connect(daemon_.socket, &o);
	assert_non_null(d->r);
	assert_int_equal(radiance_load_model(d->r, ckpt, NULL, &d->model_id), 0);
	int l = radiance_find_layer(radiance_held_model(d->r, d->model_id), h_good_layers[0]);
	assert_true(l >= 0);
	d->layer = (uint32_t)l;
	d->x = radiance_arena_alloc(d->r, 36 * 384 * 2);
	d->y = radiance_arena_alloc(d->r, 36 * 384 * 2);
	assert_non_null(d->x);
	assert_non_null(d->y);
	memcpy(d->x, h_ref_find(&ref, h_good_layers[0])->x_bf16, 36 * 384 * 2);
	d->x_off = (uint64_t)((uint8_t *)d->x - d->r->arena.base);
	d->y_off = (uint64_t)((uint8_t *)d->y - d->r->arena.base);
}

static void dp_open(struct dp *d)
{
	dp_open_entries(d, 0, 0);
}

/* Pushes a request as given, bypassing every check of radiance_submit. */
static void dp_push(struct dp *d, const Rdw__LinearRequest *req)
{
	uint8_t slot[RADIANCE_SLOT_BYTES - 4];
	int len = rproto_pack_slot(&req->base, slot, sizeof slot);
	assert_true(len > 0);
	assert_int_equal(rring_push(&d->r->sq, slot, (size_t)len), 0);
	rdoorbell_ring(d->r->sq_doorbell);
	d->r->in_flight++;
}

static Rdw__LinearRequest dp_good(struct dp *d)
{
	Rdw__LinearRequest req = RDW__LINEAR_REQUEST__INIT;
	req.request_id = 1000;
	req.model_id = d->model_id;
	req.layer = d->layer;
	req.rows = 36;
	req.dtype = RDW__DTYPE__DTYPE_BF16;
	req.input_offset = d->x_off;
	req.output_offset = d->y_off;
	return req;
}

/* The request fails with `status` (positive errno) and the session lives. */
static void dp_expect_status(struct dp *d, const Rdw__LinearRequest *req, int status)
{
	dp_push(d, req);
	struct radiance_completion c;
	assert_int_equal(radiance_wait(d->r, &c, 10000), 1);
	assert_int_equal(c.request_id, req->request_id);
	if (c.status != -status)
		fprintf(stderr, "request %llu: status %d (%s), expected %d\n",
			(unsigned long long)req->request_id, c.status, c.error ? c.error : "", -status);
	assert_int_equal(c.status, -status);
	assert_non_null(c.error);
	assert_int_equal(radiance_get_error(d->r), 0);
}

/* The session still computes right after the faults. */
static void dp_expect_good(struct dp *d)
{
	const struct h_layer *hl = h_ref_find(&ref, h_good_layers[0]);
	Rdw__LinearRequest req = dp_good(d);
	memset(d->y, 0xFF, 36 * 384 * 2);
	dp_push(d, &req);
	struct radiance_completion c;
	assert_int_equal(radiance_wait(d->r, &c, 10000), 1);
	assert_int_equal(c.status, 0);
	assert_int_equal(h_compare_bf16(d->y, hl->ref_bf16, 36 * 384, NULL, NULL), 0);
}

/* The daemon ends the session: the next wait fails with a sticky error. */
static void dp_expect_killed(struct dp *d)
{
	struct radiance_completion c;
	int rc;
	double t = h_now();
	/* results pushed before the violation may still arrive */
	while ((rc = radiance_wait(d->r, &c, 10000)) == 1)
		;
	assert_true(h_now() - t < 10.0);
	assert_true(rc == -EPROTO || rc == -ECONNRESET);
	assert_int_equal(radiance_get_error(d->r), rc);
}

static void descriptor_outside_arena(void **state)
{
	struct dp d;
	dp_open(&d);
	uint64_t arena = d.r->arena.bytes;
	Rdw__LinearRequest req = dp_good(&d);
	req.input_offset = arena;                       /* just past the end */
	dp_expect_status(&d, &req, EFAULT);
	req = dp_good(&d);
	req.output_offset = arena - 16;                 /* starts inside, ends outside */
	dp_expect_status(&d, &req, EFAULT);
	req = dp_good(&d);
	req.input_offset = arena * 4096;                /* far away */
	dp_expect_status(&d, &req, EFAULT);
	dp_expect_good(&d);
	radiance_disconnect(d.r);
}

static void overflowing_and_overlapping_offsets(void **state)
{
	struct dp d;
	dp_open(&d);
	Rdw__LinearRequest req = dp_good(&d);
	req.input_offset = UINT64_MAX & ~(uint64_t)15;  /* offset + bytes wraps around */
	dp_expect_status(&d, &req, EFAULT);
	req = dp_good(&d);
	req.output_offset = UINT64_MAX - 15;
	dp_expect_status(&d, &req, EFAULT);
	req = dp_good(&d);
	req.output_offset = req.input_offset + 16 * 384 * 2;   /* y over x's later rows */
	dp_expect_status(&d, &req, EINVAL);
	req = dp_good(&d);
	req.output_offset = req.input_offset;
	dp_expect_status(&d, &req, EINVAL);
	req = dp_good(&d);
	req.input_offset += 8;                          /* misaligned */
	dp_expect_status(&d, &req, EINVAL);
	dp_expect_good(&d);
	radiance_disconnect(d.r);
}

static void wrong_shape_and_dtype(void **state)
{
	struct dp d;
	dp_open(&d);
	Rdw__LinearRequest req = dp_good(&d);
	req.rows = 0;
	dp_expect_status(&d, &req, EINVAL);
	req.rows = d.r->server.max_rows + 1;
	dp_expect_status(&d, &req, EINVAL);
	req.rows = UINT32_MAX;
	dp_expect_status(&d, &req, EINVAL);
	req = dp_good(&d);
	req.dtype = (Rdw__DType)0;
	dp_expect_status(&d, &req, EINVAL);
	req.dtype = (Rdw__DType)77;
	dp_expect_status(&d, &req, EINVAL);
	dp_expect_good(&d);
	radiance_disconnect(d.r);
}

static void unknown_layer_and_model(void **state)
{
	struct dp d;
	dp_open(&d);
	Rdw__LinearRequest req = dp_good(&d);
	req.layer = (uint32_t)radiance_held_model(d.r, d.model_id)->n_layers;   /* one past */
	dp_expect_status(&d, &req, ENOENT);
	req.layer = UINT32_MAX;
	dp_expect_status(&d, &req, ENOENT);
	req = dp_good(&d);
	req.model_id = d.model_id + 1000;
	dp_expect_status(&d, &req, ENOENT);
	dp_expect_good(&d);

	/* a model this session released: no longer referenced by it, even
	 * though another session keeps it resident */
	struct radiance *other = radiance_connect(daemon_.socket, NULL);
	uint32_t oid;
	assert_int_equal(radiance_load_model(other, ckpt, NULL, &oid), 0);
	assert_int_equal(oid, d.model_id);
	assert_int_equal(radiance_release_model(d.r, d.model_id), 0);
	req = dp_good(&d);
	dp_expect_status(&d, &req, ENOENT);
	/* and one nobody holds any more */
	assert_int_equal(radiance_release_model(other, oid), 0);
	dp_expect_status(&d, &req, ENOENT);
	radiance_disconnect(other);
	radiance_disconnect(d.r);
}

static void corrupted_sq_tail(void **state)
{
	struct dp d;
	dp_open(&d);
	dp_expect_good(&d);
	/* the tail runs far ahead of the head */
	struct radiance_shm_header *h = (struct radiance_shm_header *)d.r->segment;
	uint32_t head = __atomic_load_n(&h->sq.head, __ATOMIC_ACQUIRE);
	__atomic_store_n(&h->sq.tail, head + d.r->sq_entries + 5, __ATOMIC_RELEASE);
	rdoorbell_ring(d.r->sq_doorbell);
	d.r->in_flight++;   /* so the library waits */
	dp_expect_killed(&d);
	/* the log says which condition, with the values */
	char want[160];
	snprintf(want, sizeof want, "SQ tail %u is %u entries ahead of head %u (at most %u)",
		 head + d.r->sq_entries + 5, d.r->sq_entries + 5, head, d.r->sq_entries);
	assert_int_equal(log_count(want), 1);
	radiance_disconnect(d.r);
}

static void corrupted_sq_slot(void **state)
{
	/* slot lengths 0 and > slot size, and a payload that is no protobuf */
	for (int kind = 0; kind < 3; kind++) {
		struct dp d;
		dp_open(&d);
		dp_expect_good(&d);
		struct rring *sq = &d.r->sq;
		uint8_t *slot = sq->slots + (size_t)(sq->local & sq->mask) * RADIANCE_SLOT_BYTES;
		uint32_t bad_len = kind == 0 ? 0 : kind == 1 ? 4096 : 8;
		uint32_t entry = sq->local;
		memcpy(slot, &bad_len, 4);
		memset(slot + 4, 0xFF, 8);
		sq->local++;
		__atomic_store_n(&sq->ctl->tail, sq->local, __ATOMIC_RELEASE);
		rdoorbell_ring(d.r->sq_doorbell);
		d.r->in_flight++;
		dp_expect_killed(&d);
		char want[160];
		if (kind < 2)
			snprintf(want, sizeof want, "SQ slot %u (entry %u): length %u is outside 1..%u",
				 entry & sq->mask, entry, bad_len, RADIANCE_SLOT_BYTES - 4);
		else
			snprintf(want, sizeof want, "SQ entry %u is not a LinearRequest (8 bytes)", entry);
		assert_true(log_count(want) >= 1);
		radiance_disconnect(d.r);
	}
}

static void corrupted_cq_head(void **state)
{
	struct dp d;
	dp_open(&d);
	dp_expect_good(&d);
	struct radiance_shm_header *h = (struct radiance_shm_header *)d.r->segment;
	__atomic_store_n(&h->cq.head, 0x80000000u, __ATOMIC_RELEASE);
	Rdw__LinearRequest req = dp_good(&d);
	dp_push(&d, &req);
	/* the daemon cannot post the result: it ends the session */
	struct radiance_completion c;
	int rc = radiance_wait(d.r, &c, 10000);
	assert_true(rc == -EPROTO || rc == -ECONNRESET);
	/* the head is 2^31 entries past the daemon's tail */
	assert_int_equal(log_count("CQ head 2147483648 is "), 1);
	assert_int_equal(log_count("entries ahead of tail"), 1);
	radiance_disconnect(d.r);
}

static void header_scribbled(void **state)
{
	/* The client rewrites the whole header: geometry is the daemon's
	 * private copy, so nothing changes for it except the ring words. */
	struct dp d;
	dp_open(&d);
	struct radiance_shm_header *h = (struct radiance_shm_header *)d.r->segment;
	h->magic = 0;
	h->sq_offset = h->cq_offset = UINT64_MAX;
	h->arena_bytes = UINT64_MAX;
	h->arena_offset = 0;
	h->sq.entries = h->cq.entries = 3;
	dp_expect_good(&d);
	Rdw__LinearRequest req = dp_good(&d);
	req.input_offset = d.r->arena.bytes;   /* the real arena size still rules */
	dp_expect_status(&d, &req, EFAULT);
	radiance_disconnect(d.r);
}

/* The CQ doorbell cannot stall the executor. It was an eventfd shared with
 * the client, which could make it blocking and saturate its count; it is now
 * the read end of a pipe whose write end only the daemon holds. Here the
 * client does everything it can to its end: makes it blocking, shrinks the
 * pipe to one page, and asks to be woken on every completion without ever
 * reading the doorbell, until the pipe is full. The daemon must go on
 * completing this session's requests and serving another client. */
static void cq_doorbell_cannot_block_the_daemon(void **state)
{
	struct dp d;
	dp_open(&d);
	dp_expect_good(&d);
	int fd = d.r->cq_doorbell;
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	assert_true(S_ISFIFO(st.st_mode));
	uint64_t one = 1;
	assert_int_equal(write(fd, &one, sizeof one), -1);   /* a read end */
	assert_int_equal(errno, EBADF);
	assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK), 0);
	int pipe_bytes = fcntl(fd, F_SETPIPE_SZ, 4096);
	assert_true(pipe_bytes >= 4096);

	struct radiance_shm_header *h = (struct radiance_shm_header *)d.r->segment;
	Rdw__LinearRequest req = dp_good(&d);
	req.rows = 1;
	int queued = 0, requests = 0;
	/* every completion rings (8 bytes): a page fills after 512 */
	for (; requests < 4 * pipe_bytes / 8 && queued < pipe_bytes; requests++) {
		__atomic_store_n(&h->cq.sleeping, 1, __ATOMIC_SEQ_CST);
		req.request_id = 5000u + (uint64_t)requests;
		dp_push(&d, &req);
		struct radiance_completion c;
		int rc;
		double t = h_now();
		while ((rc = radiance_poll(d.r, &c)) == 0 && h_now() - t < 10.0)
			;
		assert_int_equal(rc, 1);
		assert_int_equal(c.request_id, req.request_id);
		assert_int_equal(c.status, 0);
		assert_int_equal(ioctl(fd, FIONREAD, &queued), 0);
	}
	assert_int_equal(queued, pipe_bytes);   /* full, and never read */
	/* past a full pipe the session still completes its requests (this
	 * wait may sleep and read the doorbell: poll says it is readable, so
	 * the read does not block even on a blocking fd)... */
	__atomic_store_n(&h->cq.sleeping, 1, __ATOMIC_SEQ_CST);
	dp_expect_status(&d, &(Rdw__LinearRequest){ .base = req.base, .request_id = 9,
							 .model_id = req.model_id, .layer = 9999,
							 .rows = 1, .dtype = req.dtype },
			 ENOENT);
	/* ... and with the library's fd as it left it, waits work as before;
	 * other clients are served */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	dp_expect_good(&d);
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	radiance_disconnect(d.r);
}

/* Whether the daemon's executor thread is asleep: 18 of 20 looks at its
 * state over a second find it blocked ('S': in epoll_wait), not running or
 * runnable ('R'), which a thread that polls in a loop always is. */
static int executor_sleeps(long long *ticks_used)
{
	int asleep = 0;
	long long t0 = 0, t = 0;
	for (int i = 0; i < 20; i++) {
		char st = '?';
		assert_int_equal(h_thread_stat(daemon_.pid, "radiance-exec", &st, &t), 0);
		if (i == 0)
			t0 = t;
		asleep += st == 'S';
		h_sleep_ms(50);
	}
	*ticks_used = t - t0;
	return asleep >= 18;
}

/* A client that breaks the ring contract (at most cq_entries requests in
 * flight): it submits past its CQ space and never reaps. The daemon leaves
 * what has no room for its result in the SQ (test_sched's
 * test_exec_cq_room), and it must not poll that ring in a loop: the
 * executor used to take the waiting SQ entries for work on every idle check
 * and never slept, a whole core spent for as long as the client stalled
 * (on a 2-core machine, the CPU every other client's requests ran on). Now
 * it sleeps and looks at such a CQ again every few ms; other clients are
 * served meanwhile, and once this one reaps, the rest complete. */
static void cq_never_reaped_executor_sleeps(void **state)
{
	struct dp d;
	dp_open_entries(&d, 4, 4);
	struct radiance_shm_header *h = (struct radiance_shm_header *)d.r->segment;
	Rdw__LinearRequest req = dp_good(&d);
	req.rows = 1;
	for (int i = 0; i < 4; i++) {
		req.request_id = 100u + (uint64_t)i;
		dp_push(&d, &req);
	}
	/* the CQ fills with their results, never reaped... */
	double deadline = h_now() + 20.0;
	while (__atomic_load_n(&h->cq.tail, __ATOMIC_ACQUIRE) -
	       __atomic_load_n(&h->cq.head, __ATOMIC_ACQUIRE) < 4) {
		assert_true(h_now() < deadline);
		h_sleep_ms(1);
	}
	/* ... and four more wait in the SQ with no room for their results */
	for (int i = 4; i < 8; i++) {
		req.request_id = 100u + (uint64_t)i;
		dp_push(&d, &req);
	}
	int slept = 0;
	long long ticks = 0;
	for (int tries = 0; tries < 10 && !slept; tries++)
		slept = executor_sleeps(&ticks);
	if (!slept)
		fail_msg("the executor never slept in 10 s with the SQ of a session whose CQ is full "
			 "waiting: it polls that ring in a loop (%lld clock ticks of CPU in its last "
			 "second, %ld a second)", ticks, sysconf(_SC_CLK_TCK));
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	assert_int_equal(__atomic_load_n(&h->sq.head, __ATOMIC_ACQUIRE), 4);   /* not taken */
	int seen = 0;
	for (int i = 0; i < 8; i++) {
		struct radiance_completion c;
		assert_int_equal(radiance_wait(d.r, &c, 10000), 1);
		assert_int_equal(c.status, 0);
		assert_true(c.request_id >= 100 && c.request_id < 108);
		seen |= 1 << (c.request_id - 100);
	}
	assert_int_equal(seen, 0xFF);
	dp_expect_good(&d);
	radiance_disconnect(d.r);
}

/* Misuse of a handle that the library can see: a forked child using its
 * parent's handle (once corrupted the parent's session, which then blamed
 * the daemon), NULL result pointers, a layer index that wrapped the message,
 * an empty arena allocation. Each is refused with its own code and text. */
static void handle_misuse(void **state)
{
	struct dp d;
	dp_open(&d);
	dp_expect_good(&d);

	fflush(NULL);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		/* no cmocka here: the exit code says which check failed */
		struct radiance_completion c;
		struct radiance_stats_reply *st = NULL;
		if (radiance_linear(d.r, d.model_id, d.layer, 1, RADIANCE_BF16, d.x, d.y) != -EBADFD)
			_exit(10);
		if (!strstr(radiance_error_message(d.r), "forked child"))
			_exit(11);
		if (radiance_get_stats(d.r, &st) != -EBADFD || radiance_poll(d.r, &c) != -EBADFD)
			_exit(12);
		if (radiance_get_error(d.r) != -EBADFD)
			_exit(13);
		radiance_disconnect(d.r);   /* frees the child's copy only */
		_exit(0);
	}
	int st;
	assert_int_equal(waitpid(child, &st, 0), child);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* the parent's session never noticed */
	assert_int_equal(radiance_get_error(d.r), 0);
	dp_expect_good(&d);

	assert_int_equal(radiance_get_model(d.r, d.model_id, NULL), -EINVAL);
	assert_int_equal(radiance_list_models(d.r, NULL), -EINVAL);
	assert_int_equal(radiance_get_stats(d.r, NULL), -EINVAL);
	assert_non_null(strstr(radiance_error_message(d.r), "NULL"));

	uint16_t x[384], y[384];
	memset(x, 0, sizeof x);
	assert_int_equal(radiance_linear(d.r, d.model_id, 0xFFFFFFFFu, 1, RADIANCE_BF16, x, y),
			 -ENOENT);
	assert_non_null(strstr(radiance_error_message(d.r), "layer 4294967295 is out of range"));

	errno = 0;
	assert_null(radiance_arena_alloc(d.r, 0));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(radiance_error_message(d.r), "0 bytes"));
	assert_int_equal(radiance_get_error(d.r), 0);   /* none of it sticky */
	dp_expect_good(&d);
	radiance_disconnect(d.r);
}

/* --- a client killed mid-stream ------------------------------------------- */

/* A client that closes its socket with replies it never read: the kernel
 * resets the daemon's end (ECONNRESET, which uv_poll reports as a "bad file
 * descriptor"), or the daemon's next send finds it gone (EPIPE). The log
 * says what happened, once, not "poll: bad file descriptor". */
static void client_gone_with_unread_replies(void **state)
{
	struct raw w;
	assert_int_equal(raw_open_at(&w, daemon_.socket), 0);
	raw_send_hello(&w, RADIANCE_PROTOCOL_VERSION, "leaves-unread", NULL, 0);
	for (int i = 0; i < 8; i++)
		raw_send_list_models(&w, NULL, 0);
	/* wait until replies are there to be left unread */
	struct pollfd p = { .fd = w.conn.fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 10000), 1);
	h_sleep_ms(50);
	raw_close(&w);
	int n = 0;
	for (int i = 0; i < 500 && (n = h_count_lines(daemon_.log, "client went away with")) == 0; i++)
		h_sleep_ms(10);
	if (n != 1)
		h_daemon_dump_log(&daemon_);
	assert_int_equal(n, 1);
	assert_int_equal(h_count_lines(daemon_.log, "'leaves-unread'): closing: client went away "
				       "with"), 1);
	assert_int_equal(h_count_lines(daemon_.log, "bad file descriptor"), 0);
	assert_int_equal(h_count_lines(daemon_.log, "send failed"), 0);
}

/* A client that pipelines requests and never reads the replies: the daemon
 * queues at most SESSION_OUT_HIGH_WATER (8 MiB) of them, then reads none of
 * its requests, so the client's sends stop being taken; it says so once,
 * its memory stays bounded, and it serves everybody else meanwhile. When
 * the client reads, every request it sent is answered, none lost. */
static void replies_never_read_are_bounded(void **state)
{
	struct raw w;
	raw_open(&w);
	raw_hello(&w);
	long rss0 = h_rss_kib(daemon_.pid);
	/* one ListModels frame (its reply is ~34 bytes), many times over;
	 * the stream is sent from wherever the socket stopped taking it */
	Rdw__ListModels lm = RDW__LIST_MODELS__INIT;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_LIST_MODELS;
	m.list_models = &lm;
	m.tag = 7;
	uint32_t flen = (uint32_t)protobuf_c_message_get_packed_size(&m.base);
	enum { FRAMES = 4096 };
	uint8_t *buf = malloc((size_t)FRAMES * (4 + flen));
	assert_non_null(buf);
	for (size_t i = 0; i < FRAMES; i++) {
		memcpy(buf + i * (4 + flen), &flen, 4);
		protobuf_c_message_pack(&m.base, buf + i * (4 + flen) + 4);
	}
	/* a send that waits 2 s untaken: the daemon stopped reading */
	struct timeval tv = { .tv_sec = 2 };
	assert_int_equal(setsockopt(w.conn.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv), 0);
	const size_t stream = (size_t)FRAMES * (4 + flen);
	/* with no bound, 2 M requests queue ~64 MiB of replies; stop there */
	const uint64_t cap = 2000000ull * (4 + flen);
	uint64_t sent = 0;
	for (;;) {
		size_t at = (size_t)(sent % stream);
		ssize_t n = send(w.conn.fd, buf + at, stream - at, MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		assert_true(n > 0);
		sent += (uint64_t)n;
		if (sent >= cap)
			break;
	}
	free(buf);
	long rss = h_rss_kib(daemon_.pid);
	uint64_t requests = sent / (4 + flen);
	printf("# %llu requests sent unread before the daemon stopped taking them; its RSS "
	       "%ld -> %ld KiB\n", (unsigned long long)requests, rss0, rss);
	if (sent >= cap)
		fail_msg("the daemon took %llu requests from a client that reads no reply, and reads on "
			 "(RSS %ld -> %ld KiB)", (unsigned long long)requests, rss0, rss);
	assert_int_equal(log_lines("unsent: it does not read its socket; reading none of its "
				   "requests until it does", "(at most 8 MiB"), 1);
	/* the 8 MiB of replies and the buffer they grew in, and nothing per
	 * request (a sanitizer's quarantine keeps every freed reply) */
	if (!h_sanitized())
		assert_true(rss - rss0 < 12 * 1024);
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	/* now it reads: every whole request sent is answered; then the rest
	 * of the last one, cut where the socket stopped taking the stream */
	for (uint64_t i = 0; i <= requests; i++) {
		if (i == requests) {
			uint64_t part = sent % (4 + flen);
			if (!part)
				break;
			uint8_t frame[64];
			assert_true(4 + flen <= sizeof frame);
			memcpy(frame, &flen, 4);
			protobuf_c_message_pack(&m.base, frame + 4);
			raw_send_bytes(&w, frame + part, (size_t)(4 + flen - part), NULL, 0);
		}
		Rdw__ServerMessage *reply;
		int rc = raw_recv(&w, &reply, 10000);
		if (rc != 1)
			fail_msg("reply %llu of %llu: %d", (unsigned long long)i,
				 (unsigned long long)requests, rc);
		int got = reply->msg_case;
		uint64_t tag = reply->tag;
		rdw__server_message__free_unpacked(reply, NULL);
		assert_int_equal(got, RDW__SERVER_MESSAGE__MSG_MODEL_LIST);
		assert_int_equal(tag, 7);
	}
	assert_int_equal(log_count("reads its replies again"), 1);
	raw_expect_alive(&w);
	raw_close(&w);
}

static void sigkill_client_mid_stream(void **state)
{
	/* victim: keeps the SQ full of requests until it is killed */
	fflush(NULL);
	pid_t victim = fork();
	assert_true(victim >= 0);
	if (victim == 0) {
		struct dp d;
		dp_open(&d);
		for (;;) {
			uint64_t id;
			int rc = radiance_submit(d.r, d.model_id, d.layer, 36, RADIANCE_BF16, d.x, d.y, &id);
			if (rc == -EAGAIN) {
				struct radiance_completion c;
				radiance_wait(d.r, &c, 1000);
			} else if (rc < 0) {
				_exit(3);
			}
		}
	}
	/* meanwhile good clients keep getting right answers: one in this
	 * process, and one in a loop in another across the kill */
	h_sleep_ms(300);
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	pid_t good = fork();
	assert_true(good >= 0);
	if (good == 0) {
		double end = h_now() + 1.0;
		int n = 0;
		while (h_now() < end || n < 3) {
			if (h_good_client(daemon_.socket, &ref) != 0)
				_exit(1);
			n++;
		}
		_exit(0);
	}
	h_sleep_ms(300);
	assert_int_equal(kill(victim, SIGKILL), 0);
	int st;
	assert_int_equal(waitpid(victim, &st, 0), victim);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(waitpid(good, &st, 0), good);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	/* the victim's session goes away */
	struct radiance *r = radiance_connect(daemon_.socket, NULL);
	struct radiance_stats_reply *s = NULL;
	for (int i = 0; i < 200; i++) {
		radiance_stats_free(s);
		assert_int_equal(radiance_get_stats(r, &s), 0);
		if (s->global.sessions == 1)
			break;
		h_sleep_ms(10);
	}
	assert_int_equal(s->global.sessions, 1);
	radiance_stats_free(s);
	radiance_disconnect(r);
}

static void sigkill_client_while_loading(void **state)
{
	fflush(NULL);
	pid_t victim = fork();
	assert_true(victim >= 0);
	if (victim == 0) {
		struct radiance *r = radiance_connect(daemon_.socket, NULL);
		uint32_t id;
		radiance_load_model(r, ckpt, NULL, &id);
		_exit(0);
	}
	h_sleep_ms(20);
	kill(victim, SIGKILL);
	waitpid(victim, NULL, 0);
}

/* --- a checkpoint file that shrinks under the loader ----------------------- */

/* The client's model.safetensors, a memfd, cut to a random length while the
 * daemon loads it, 60 times (fixed seed): either at once, racing the daemon's
 * open and header read, or on the 1st to 3rd LoadProgress that is not the
 * last, while the loader is between layers on its threadpool thread. Each
 * load must end in its ModelInfo with right answers (the cut came after the
 * last read), or an Error: EIO naming the file and saying it shrank to the
 * length cut while loading, from its size at open; or, for a cut before the
 * daemon opened it, EINVAL from the header of the now short file.
 * Meanwhile another client process keeps checking answers, and the daemon
 * must outlive it all (check_and_stop). Through a mapping, a cut that landed
 * mid-load killed the daemon with SIGBUS. */
static void checkpoint_shrinks_while_loading(void **state)
{
	char src[1024];
	snprintf(src, sizeof src, "%s/model.safetensors", ckpt);
	int sfd = open(src, O_RDONLY | O_CLOEXEC);
	assert_true(sfd >= 0);
	struct stat sb;
	assert_int_equal(fstat(sfd, &sb), 0);
	size_t size = (size_t)sb.st_size, got = 0;
	uint8_t *bytes = malloc(size);
	assert_non_null(bytes);
	while (got < size) {
		ssize_t r = pread(sfd, bytes + got, size - got, (off_t)got);
		assert_true(r > 0);
		got += (size_t)r;
	}
	close(sfd);

	/* the other client: checks answers until the pipe closes */
	int stop[2];
	assert_int_equal(pipe2(stop, O_CLOEXEC), 0);
	fflush(NULL);
	pid_t good = fork();
	assert_true(good >= 0);
	if (good == 0) {
		close(stop[1]);
		for (int n = 1;; n++) {
			if (h_good_client(daemon_.socket, &ref) != 0)
				_exit(1);
			struct pollfd p = { .fd = stop[0], .events = POLLIN };
			if (n >= 3 && poll(&p, 1, 0) == 1)
				_exit(0);
		}
	}
	close(stop[0]);

	const struct h_layer *hl = h_ref_find(&ref, h_good_layers[0]);
	assert_non_null(hl);
	uint32_t seed = 0x5eed5678u;
	int loaded = 0, shrank = 0, refused = 0;
	for (int it = 0; it < 60; it++) {
		seed ^= seed << 13;
		seed ^= seed >> 17;
		seed ^= seed << 5;
		off_t len = (off_t)(seed % size);
		int at = (int)(seed >> 28) % 4;   /* 0: at once, else on that LoadProgress */
		int fds[3];
		open_ckpt(ckpt, fds);
		close(fds[2]);
		fds[2] = memfd_create("model.safetensors", MFD_CLOEXEC);
		assert_true(fds[2] >= 0);
		assert_int_equal(pwrite(fds[2], bytes, size, 0), (ssize_t)size);
		char name[32];
		snprintf(name, sizeof name, "shrink-%d", it);

		struct raw w;
		raw_open(&w);
		raw_hello(&w);
		raw_send_load_model_named(&w, name, ckpt_files, 3, fds, 3);
		int progress = 0, cut = 0, cut_first = at == 0;
		if (at == 0) {
			assert_int_equal(ftruncate(fds[2], len), 0);
			cut = 1;
		}
		Rdw__ServerMessage *reply;
		for (;;) {
			assert_int_equal(raw_recv(&w, &reply, 20000), 1);
			if (reply->msg_case != RDW__SERVER_MESSAGE__MSG_LOAD_PROGRESS)
				break;
			if (!cut && reply->load_progress->done_bytes < reply->load_progress->total_bytes &&
			    ++progress == at) {
				assert_int_equal(ftruncate(fds[2], len), 0);
				cut = 1;
			}
			rdw__server_message__free_unpacked(reply, NULL);
		}
		int mc = reply->msg_case, code = 0;
		char text[512] = "";
		if (mc == RDW__SERVER_MESSAGE__MSG_ERROR) {
			code = reply->error->code;
			snprintf(text, sizeof text, "%s", reply->error->message ? reply->error->message : "");
		}
		rdw__server_message__free_unpacked(reply, NULL);

		char want[160], want2[64];
		snprintf(want, sizeof want, "file shrank to %lld bytes while loading", (long long)len);
		snprintf(want2, sizeof want2, "(expected %zu)", size);
		if (mc == RDW__SERVER_MESSAGE__MSG_MODEL_INFO) {
			/* whole: another session attaches and gets right answers */
			struct radiance *r = radiance_connect(daemon_.socket, NULL);
			assert_non_null(r);
			uint32_t id;
			assert_int_equal(radiance_attach_model(r, name, &id), 0);
			assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
			radiance_disconnect(r);
			loaded++;
		} else if (mc == RDW__SERVER_MESSAGE__MSG_ERROR && code == EIO &&
			   strncmp(text, "model.safetensors: ", 19) == 0 && strstr(text, want) &&
			   strstr(text, want2)) {
			shrank++;
		} else if (mc == RDW__SERVER_MESSAGE__MSG_ERROR && code == EINVAL && cut_first &&
			   strncmp(text, "model.safetensors: ", 19) == 0) {
			refused++;
		} else {
			fail_msg("load %d, cut to %lld (%s): message case %d, Error %d '%s'", it,
				 (long long)len, at ? "on LoadProgress" : "at once", mc, code, text);
		}
		raw_close(&w);
		close_fds(fds, 3);
	}
	close(stop[1]);
	int st;
	assert_int_equal(waitpid(good, &st, 0), good);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	print_message("  60 cuts: %d loads whole, %d refused as shrunk while loading, %d refused "
		      "as short before the load\n", loaded, shrank, refused);
	/* a cut on LoadProgress lands ahead of a loader that still has layers to read */
	assert_true(shrank > 0);
	free(bytes);
}

/* --- ring set-ups cut short while the arena is pinned ---------------------- */

#define PIN_DELAY_US "300000"

/* A daemon whose every arena registration and unregistration sleeps 300 ms
 * (test_pin_delay_us): the pin thread is busy with the first one while
 * later set-ups queue behind it. */
static int start_slow_pins(void **state)
{
	const char *const args[] = { "--test-pin-delay-us", PIN_DELAY_US, NULL };
	if (h_daemon_start_argv(&daemon_, args) < 0)
		return -1;
	fds_at_start = h_count_fds(daemon_.pid);
	return 0;
}

static void raw_send_open_ring(struct raw *w)
{
	Rdw__OpenRing o = RDW__OPEN_RING__INIT;   /* the daemon's default sizes */
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_OPEN_RING;
	m.open_ring = &o;
	raw_send(w, &m, NULL, 0);
}

/* 8 clients ask for a ring and hang up 100 ms later, while the first pin
 * sleeps on the pin thread: the queued pins are taken back
 * (executor_pin_cancel), the running one finishes and is undone, and every segment and descriptor goes
 * (check_and_stop: fds back, a good client served, exit 0; under ASan, no
 * leak). */
static void hang_up_while_pinning(void **state)
{
	enum { N = 8 };
	struct raw w[N];
	for (int i = 0; i < N; i++) {
		raw_open(&w[i]);
		raw_hello(&w[i]);
	}
	for (int i = 0; i < N; i++)
		raw_send_open_ring(&w[i]);
	h_sleep_ms(100);   /* the daemon has read them: pins asleep, or queued */
	for (int i = 0; i < N; i++)
		raw_close(&w[i]);
	/* every registration that ran is undone, and nothing else is left */
	int pinned = -1, unpinned = -2, n = -1;
	for (int t = 0; t < 1000; t++) {
		pinned = h_count_lines(daemon_.log, "registering its arena");
		unpinned = h_count_lines(daemon_.log, "unregistering its arena");
		pinned -= unpinned;   /* "unregistering" contains "registering" */
		n = h_count_fds(daemon_.pid);
		if (pinned == unpinned && n <= fds_at_start && h_count_lines(daemon_.log, "closing") >= N)
			break;
		h_sleep_ms(10);
	}
	print_message("  %d clients gone while pinning: %d arenas pinned (and unpinned), %d pins "
		      "taken back before they began\n", N, pinned, N - pinned);
	assert_int_equal(pinned, unpinned);
	assert_true(n <= fds_at_start);
	/* the workers were asleep in the first pins when the others hung up */
	assert_true(pinned > 0);
	assert_true(pinned < N);
}

/* SIGTERM while 6 set-ups are pinning (4 asleep on the workers, 2 queued):
 * each finishes, is undone, and its client gets the Goodbye; the daemon
 * exits 0 with no handle left open (server_run logs any). */
static void stop_while_pinning(void **state)
{
	enum { N = 6 };
	struct raw w[N];
	for (int i = 0; i < N; i++) {
		raw_open(&w[i]);
		raw_hello(&w[i]);
		raw_send_open_ring(&w[i]);
	}
	h_sleep_ms(50);
	kill(daemon_.pid, SIGTERM);
	for (int i = 0; i < N; i++) {
		int goodbye = 0, rc;
		Rdw__ServerMessage *m;
		while ((rc = raw_recv(&w[i], &m, 10000)) == 1) {
			goodbye |= m->msg_case == RDW__SERVER_MESSAGE__MSG_GOODBYE;
			rdw__server_message__free_unpacked(m, NULL);
		}
		raw_close(&w[i]);
		if (!goodbye)
			fail_msg("client %d: no Goodbye before the daemon hung up (%d)", i, rc);
	}
	assert_true(h_daemon_wait(&daemon_, 10.0));
	int st = daemon_.exit_status;
	int pinned = h_count_lines(daemon_.log, "registering its arena");
	int unpinned = h_count_lines(daemon_.log, "unregistering its arena");
	int open = h_count_lines(daemon_.log, "handle still open");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || open != 0)
		h_daemon_dump_log(&daemon_);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(open, 0);
	assert_int_equal(pinned - unpinned, unpinned);
	assert_int_equal(unpinned, N);
}

/* For a test that stops the daemon itself. */
static int cleanup_only(void **state)
{
	h_daemon_stop(&daemon_);
	return 0;
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, start, check_and_stop)
	const struct CMUnitTest tests[] = {
		T(garbage_bytes),
		T(bad_protobuf_after_hello),
		T(oversized_frame_length),
		T(half_frame_then_hang_up),
		T(unknown_message),
		T(protocol_version_mismatch),
		T(request_before_hello_and_hello_twice),
		T(fds_on_a_message_declaring_none),
		T(too_many_fds),
		T(load_model_fd_count_mismatch),
		T(load_model_bogus_files),
		T(names_with_control_characters),
		T(checkpoint_names_and_load_failure_log),
		T(bad_control_arguments),
		T(descriptor_outside_arena),
		T(overflowing_and_overlapping_offsets),
		T(wrong_shape_and_dtype),
		T(unknown_layer_and_model),
		T(corrupted_sq_tail),
		T(corrupted_sq_slot),
		T(corrupted_cq_head),
		T(header_scribbled),
		T(cq_doorbell_cannot_block_the_daemon),
		T(cq_never_reaped_executor_sleeps),
		T(handle_misuse),
		T(client_gone_with_unread_replies),
		T(replies_never_read_are_bounded),
		T(sigkill_client_mid_stream),
		T(sigkill_client_while_loading),
		T(checkpoint_shrinks_while_loading),
		cmocka_unit_test_setup_teardown(hang_up_while_pinning, start_slow_pins, check_and_stop),
		cmocka_unit_test_setup_teardown(stop_while_pinning, start_slow_pins, cleanup_only),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
