/*
 * Mapped weights, the protocol half (MapModel / UnmapModel, docs/mapped.md),
 * against the real radianced on the CPU backend:
 *   - the cpu backend refuses MapModel with ENOTSUP and says why; the session
 *     goes on; a model the session does not hold is ENOENT; a layout version
 *     the daemon does not serve is EPROTONOSUPPORT (raw frames);
 *   - with the test memfd (RADIANCE_FAKE_SHARE=1) the reply's fd arrives,
 *     is sealed against writes, and holds every layer's canonical arrays at
 *     the offsets the reply names, byte for byte against the checkpoint
 *     loaded here;
 *   - lifetime: release of a mapped model is EBUSY until UnmapModel; each
 *     map needs its own unmap; a session that ends while mapping drops
 *     its reference (another session's keeps the model; the last one's
 *     release unloads it) and the fd it took stays readable;
 *   - who may map (map_allow): owner (the default) refuses another uid with
 *     EPERM, all lets it map, none refuses everybody, another value is a
 *     usage error;
 *   - an older daemon (a fake one whose Welcome has no map_layout_version)
 *     gets no MapModel at all: the library answers ENOTSUP itself.
 * The GPU half (import, kernels on mapped memory) is tests/test_gpu_map.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "map.h"
#include "raw_client.h"
#include "wire.h"

static struct h_daemon daemon_;
static char ckpt[512];

static int start_cpu(void **state)
{
	unsetenv("RADIANCE_FAKE_SHARE");
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	return h_daemon_start(&daemon_);
}

static int start_fake_share(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	setenv("RADIANCE_FAKE_SHARE", "1", 1);
	int rc = h_daemon_start(&daemon_);
	unsetenv("RADIANCE_FAKE_SHARE");
	return rc;
}

static int start_fake_share_with(const char *allow)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	const char *const args[] = { "--map-allow", allow, NULL };
	setenv("RADIANCE_FAKE_SHARE", "1", 1);
	int rc = h_daemon_start_argv(&daemon_, args);
	unsetenv("RADIANCE_FAKE_SHARE");
	return rc;
}

static int start_allow_all(void **state)
{
	return start_fake_share_with("all");
}

static int start_allow_none(void **state)
{
	return start_fake_share_with("none");
}

static int stop(void **state)
{
	return h_daemon_stop_clean(&daemon_);
}

static struct radiance *connect_load(uint32_t *id)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.timeout_ms = 20000;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	assert_non_null(r);
	int rc = radiance_load_model(r, ckpt, NULL, id);
	if (rc)
		fail_msg("load: %s", radiance_error_message(r));
	return r;
}

/* ---- the cpu backend refuses --------------------------------------------- */

static void cpu_refuses(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);
	assert_int_equal(radiance_get_server_info(r)->map_layout_version, RADIANCE_MAP_LAYOUT_VERSION);
	struct radiance_mapping *m = (void *)1;
	assert_int_equal(radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION, &m), -ENOTSUP);
	assert_null(m);
	const char *why = radiance_error_message(r);
	if (!strstr(why, "cpu backend") || !strstr(why, "cannot be mapped"))
		fail_msg("refusal does not say why: '%s'", why);
	/* a model this session does not hold: checked here, and by the daemon */
	assert_int_equal(radiance_map_model(r, id + 100, RADIANCE_MAP_LAYOUT_VERSION, &m), -ENOENT);
	/* another layout version than the daemon's: refused before sending */
	assert_int_equal(radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION + 1, &m), -ENOTSUP);
	assert_int_equal(radiance_unmap_model(r, id), -ENOENT);
	/* nothing of that is sticky: the session still computes */
	assert_int_equal(radiance_get_error(r), 0);
	assert_int_equal(radiance_release_model(r, id), 0);
	radiance_disconnect(r);
}

/* The same refusals as the daemon sends them, with no library in between. */
/* Sends MapModel(model_id, version) raw; the reply must be Error(code) with
 * `says` in its text, and no fd. */
static void raw_map_refused(struct raw *w, uint32_t model_id, uint32_t version, int code, const char *says)
{
	Rdw__MapModel mm = RDW__MAP_MODEL__INIT;
	mm.model_id = model_id;
	mm.layout_version = version;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_MAP_MODEL;
	m.map_model = &mm;
	raw_send_refused(w, &m, code, says);
	assert_int_equal(rconn_queued_fds(&w->conn), 0);
}

static void raw_refusals(void **state)
{
	struct raw w;
	assert_int_equal(raw_open_at(&w, daemon_.socket), 0);
	struct raw_welcome wl;
	raw_hello_welcome(&w, &wl);
	/* an old client reads protocol 1 and ignores field 7 */
	assert_int_equal(wl.protocol_version, 1);
	assert_int_equal(wl.map_layout_version, RADIANCE_MAP_LAYOUT_VERSION);

	/* whether held is asked before the version */
	raw_map_refused(&w, 7, RADIANCE_MAP_LAYOUT_VERSION, ENOENT, "not loaded by this session");
	raw_map_refused(&w, 7, 0, ENOENT, "not loaded by this session");
	Rdw__UnmapModel um = RDW__UNMAP_MODEL__INIT;
	um.model_id = 3;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_UNMAP_MODEL;
	m.unmap_model = &um;
	raw_send(&w, &m, NULL, 0);
	Rdw__ServerMessage *reply;
	assert_int_equal(raw_recv(&w, &reply, 10000), 1);
	assert_int_equal(reply->msg_case, RDW__SERVER_MESSAGE__MSG_ERROR);
	assert_int_equal(reply->error->code, ENOENT);
	rdw__server_message__free_unpacked(reply, NULL);
	raw_expect_alive(&w);
	raw_close(&w);
}

/* A held model with a layout version the daemon does not serve: the
 * daemon's own check (libradiance refuses before sending). */
static void raw_layout_version(void **state)
{
	struct raw w;
	assert_int_equal(raw_open_at(&w, daemon_.socket), 0);
	raw_hello(&w);
	uint32_t id = raw_load_dir(&w, ckpt);
	raw_map_refused(&w, id, RADIANCE_MAP_LAYOUT_VERSION + 1, EPROTONOSUPPORT, "layout version 2 is not served");
	/* the right version on the cpu backend: ENOTSUP, no fd */
	raw_map_refused(&w, id, RADIANCE_MAP_LAYOUT_VERSION, ENOTSUP, "cpu backend");
	raw_expect_alive(&w);
	raw_close(&w);
}

/* ---- the test memfd -------------------------------------------------------- */

static void check_bytes(const uint8_t *base, uint64_t off, uint64_t len, const void *want, uint64_t want_len,
			const char *what, const char *layer)
{
	if (len != want_len)
		fail_msg("%s of %s: %llu bytes in the mapping, %llu in the model", what, layer,
			 (unsigned long long)len, (unsigned long long)want_len);
	if (memcmp(base + off, want, len) != 0)
		fail_msg("%s of %s differs from the checkpoint's", what, layer);
}

static void fake_share_bytes(void **state)
{
	char err[512];
	struct radiance_model *model = NULL;
	assert_int_equal(radiance_checkpoint_load_dir(ckpt, NULL, NULL, NULL, &model, err, sizeof err), 0);
	uint32_t id;
	struct radiance *r = connect_load(&id);
	struct radiance_mapping *m = NULL;
	int rc = radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION, &m);
	if (rc)
		fail_msg("map: %s", radiance_error_message(r));
	assert_int_equal(m->handle, RADIANCE_MAP_TEST_MEMFD);
	assert_true(m->fd >= 0);
	assert_string_equal(m->vendor, "cpu");
	assert_int_equal(m->n_layers, model->n_layers);
	assert_int_equal(m->bytes % m->granularity, 0);

	/* sealed: nobody can write it, this process not even through a new mapping */
	int seals = fcntl(m->fd, F_GET_SEALS);
	assert_true(seals & F_SEAL_WRITE);
	assert_true(seals & F_SEAL_SHRINK);
	void *w = mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	assert_true(w == MAP_FAILED && errno == EPERM);
	const uint8_t *base = mmap(NULL, m->bytes, PROT_READ, MAP_SHARED, m->fd, 0);
	assert_true(base != MAP_FAILED);

	size_t w4 = 0, b16 = 0;
	for (size_t i = 0; i < model->n_layers; i++) {
		const struct radiance_layer *l = &model->layers[i];
		const struct radiance_mapped_layer *ml = &m->layers[i];
		assert_int_equal(ml->index, i);
		assert_int_equal(ml->n, l->n);
		assert_int_equal(ml->k, l->k);
		assert_int_equal(ml->weight_offset % RADIANCE_MAP_ALIGN, 0);
		if (l->kind == RADIANCE_LAYER_W4A8) {
			w4++;
			check_bytes(base, ml->weight_offset, ml->weight_bytes, l->qweight,
				    (uint64_t)l->n * l->k / 2, "qweight", l->name);
			check_bytes(base, ml->scales_offset, ml->scales_bytes, l->scales,
				    (uint64_t)l->n * (l->k / 128) * 2, "scales", l->name);
		} else {
			b16++;
			check_bytes(base, ml->weight_offset, ml->weight_bytes, l->weight,
				    (uint64_t)l->n * l->k * 2, "weight", l->name);
			assert_int_equal(ml->scales_bytes, 0);
		}
		if (l->bias)
			check_bytes(base, ml->bias_offset, ml->bias_bytes, l->bias, (uint64_t)l->n * 4, "bias",
				    l->name);
		else
			assert_int_equal(ml->bias_bytes, 0);
		/* arrays of one layer do not overlap the next layer's */
		if (i + 1 < model->n_layers)
			assert_true(m->layers[i + 1].weight_offset >= ml->weight_offset + ml->weight_bytes);
	}
	printf("# test memfd: %zu W4A8 and %zu bf16 layers, %llu bytes, every array equal\n", w4, b16,
	       (unsigned long long)m->bytes);
	assert_true(w4 > 0 && b16 > 0);
	munmap((void *)base, m->bytes);
	radiance_mapping_free(m);
	assert_int_equal(radiance_unmap_model(r, id), 0);
	radiance_disconnect(r);
	radiance_model_destroy(model);
}

static uint32_t users_of(struct radiance *r, uint32_t id, int *present)
{
	struct radiance_model_list *list;
	assert_int_equal(radiance_list_models(r, &list), 0);
	uint32_t users = 0;
	*present = 0;
	for (size_t i = 0; i < list->count; i++)
		if (list->models[i].model_id == id) {
			*present = 1;
			users = list->models[i].users;
		}
	radiance_model_list_free(list);
	return users;
}

static void fake_share_lifetime(void **state)
{
	uint32_t id, id_b;
	struct radiance *a = connect_load(&id);
	struct radiance *b = connect_load(&id_b);
	assert_int_equal(id, id_b);   /* the same files: one resident model */
	struct radiance_mapping *m1 = NULL, *m2 = NULL;
	assert_int_equal(radiance_map_model(a, id, RADIANCE_MAP_LAYOUT_VERSION, &m1), 0);
	/* mapped: the reference may not go */
	assert_int_equal(radiance_release_model(a, id), -EBUSY);
	assert_non_null(strstr(radiance_error_message(a), "unmap it first"));
	/* a second map is the same allocation, and needs its own unmap */
	assert_int_equal(radiance_map_model(a, id, RADIANCE_MAP_LAYOUT_VERSION, &m2), 0);
	assert_int_equal(m1->bytes, m2->bytes);
	assert_int_equal(m1->layers[3].weight_offset, m2->layers[3].weight_offset);
	radiance_mapping_free(m2);
	assert_int_equal(radiance_unmap_model(a, id), 0);
	assert_int_equal(radiance_release_model(a, id), -EBUSY);   /* m1's mapping is still there */
	assert_int_equal(radiance_unmap_model(a, id), 0);
	assert_int_equal(radiance_unmap_model(a, id), -ENOENT);
	assert_int_equal(radiance_release_model(a, id), 0);
	int present;
	assert_int_equal(users_of(b, id, &present), 1);

	/* a session that ends while it maps: its reference goes, b's keeps the
	 * model; what a took stays readable (the memfd's pages are reference-
	 * counted, as VMM memory is) */
	assert_int_equal(radiance_attach_model(a, "minilm-w4g128", &id_b), 0);
	struct radiance_mapping *m3 = NULL;
	assert_int_equal(radiance_map_model(a, id, RADIANCE_MAP_LAYOUT_VERSION, &m3), 0);
	assert_int_equal(users_of(b, id, &present), 2);
	radiance_disconnect(a);
	for (int i = 0; i < 200 && users_of(b, id, &present) != 1; i++)
		h_sleep_ms(10);
	assert_int_equal(users_of(b, id, &present), 1);
	assert_int_equal(radiance_release_model(b, id), 0);
	for (int i = 0; i < 200; i++) {
		users_of(b, id, &present);
		if (!present)
			break;
		h_sleep_ms(10);
	}
	assert_false(present);   /* unloaded: nobody holds it */
	uint8_t first[64], again[64];
	assert_int_equal(pread(m1->fd, first, sizeof first, (off_t)m1->layers[0].weight_offset), sizeof first);
	assert_int_equal(pread(m3->fd, again, sizeof again, (off_t)m3->layers[0].weight_offset), sizeof again);
	assert_memory_equal(first, again, sizeof first);
	radiance_mapping_free(m1);
	radiance_mapping_free(m3);
	radiance_disconnect(b);
}

/* ---- who may map ------------------------------------------------------------- */

/* In a child running as uid 65534: attach to the resident model by name and
 * map it. Exit 0 when radiance_map_model returned `want` (and, for 0, an fd
 * came), else 1. */
static int map_as_nobody(int want, const char *says)
{
	if (geteuid() != 0)
		return -1;
	/* let uid 65534 reach the socket (the daemon, as root, allows it) */
	assert_int_equal(chmod(daemon_.dir, 0711), 0);
	assert_int_equal(chmod(daemon_.socket, 0666), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
		    setresuid(65534, 65534, 65534) < 0)
			_exit(2);
		struct radiance *r = radiance_connect(daemon_.socket, NULL);
		uint32_t id;
		if (!r || radiance_attach_model(r, H_CHECKPOINT, &id) < 0)
			_exit(3);
		struct radiance_mapping *m = NULL;
		int rc = radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION, &m);
		fprintf(stderr, "uid 65534: map: %d %s\n", rc, rc ? radiance_error_message(r) : "");
		int ok = rc == want && (rc || (m && m->fd >= 0)) &&
			 (!says || strstr(radiance_error_message(r), says));
		radiance_mapping_free(m);
		radiance_disconnect(r);
		_exit(ok ? 0 : 1);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* A client that pipelines MapModel and reads nothing: as with MapTensors
 * (test_tensors.c), at most SESSION_FD_REPLIES_MAX_QUEUED (8) replies with
 * their share fd dup wait unsent in the daemon and the rest are EBUSY, so
 * the daemon's descriptors stay bounded; each answered map counts (one
 * unmap each), the refused ones do not. */
static void pipelined_maps_bounded(void **state)
{
	struct raw w;
	assert_int_equal(raw_open_at(&w, daemon_.socket), 0);
	raw_hello(&w);
	uint32_t id = raw_load_dir(&w, ckpt);
	enum { N = 1000 };
	Rdw__MapModel mm = RDW__MAP_MODEL__INIT;
	mm.model_id = id;
	mm.layout_version = RADIANCE_MAP_LAYOUT_VERSION;
	Rdw__ClientMessage m = RDW__CLIENT_MESSAGE__INIT;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_MAP_MODEL;
	m.map_model = &mm;
	int maps = raw_expect_fd_replies_capped(&w, daemon_.pid, &m, N, RDW__SERVER_MESSAGE__MSG_MODEL_MAPPING,
						"MapModel");
	/* every answered map needs its unmap; one more is ENOENT */
	Rdw__UnmapModel um = RDW__UNMAP_MODEL__INIT;
	um.model_id = id;
	m.msg_case = RDW__CLIENT_MESSAGE__MSG_UNMAP_MODEL;
	m.unmap_model = &um;
	for (int i = 0; i <= maps; i++) {
		raw_send(&w, &m, NULL, 0);
		Rdw__ServerMessage *reply;
		assert_int_equal(raw_recv(&w, &reply, 20000), 1);
		if (i < maps)
			assert_int_equal(reply->msg_case, RDW__SERVER_MESSAGE__MSG_OK);
		else
			assert_true(reply->msg_case == RDW__SERVER_MESSAGE__MSG_ERROR &&
				    reply->error->code == ENOENT);
		rdw__server_message__free_unpacked(reply, NULL);
	}
	raw_expect_alive(&w);
	raw_close(&w);
}

static void allow_owner(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);   /* keeps the model resident */
	int rc = map_as_nobody(-EPERM, "map_allow owner");
	if (rc < 0) {
		radiance_disconnect(r);
		printf("# allow_owner: needs root to run a client as uid 65534: skipped\n");
		skip();
	}
	assert_int_equal(rc, 0);
	/* this session's uid is the daemon's: it may */
	struct radiance_mapping *m = NULL;
	assert_int_equal(radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION, &m), 0);
	radiance_mapping_free(m);
	radiance_disconnect(r);
}

static void allow_all(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);
	int rc = map_as_nobody(0, NULL);
	radiance_disconnect(r);
	if (rc < 0) {
		printf("# allow_all: needs root to run a client as uid 65534: skipped\n");
		skip();
	}
	assert_int_equal(rc, 0);
}

static void allow_none(void **state)
{
	uint32_t id;
	struct radiance *r = connect_load(&id);
	struct radiance_mapping *m = NULL;
	assert_int_equal(radiance_map_model(r, id, RADIANCE_MAP_LAYOUT_VERSION, &m), -EPERM);
	assert_non_null(strstr(radiance_error_message(r), "map_allow none"));
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);
}

/* A map_allow the daemon does not know: a usage error naming the value. */
static void allow_bad_value(void **state)
{
	char log[] = "/tmp/radiance-map-allow-XXXXXX";
	int fd = mkstemp(log);
	assert_true(fd >= 0);
	close(fd);
	const char *const args[] = { "--map-allow", "everyone", "--socket", "/nonexistent/r.sock", NULL };
	int st = h_wait_exit(h_spawn_logged(log, args), 10.0);
	char text[1024] = "";
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	size_t n = fread(text, 1, sizeof text - 1, f);
	text[n] = 0;
	fclose(f);
	unlink(log);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 2);
	if (!strstr(text, "'everyone' is not a map_allow value (expected owner, all or none)"))
		fail_msg("radianced said: %s", text);
}

/* ---- an older daemon ------------------------------------------------------- */

static void old_daemon_never_asked(void **state)
{
	struct raw_old old;
	raw_old_start(&old);
	struct radiance *r = radiance_connect(old.path, NULL);
	assert_non_null(r);
	assert_int_equal(radiance_get_server_info(r)->map_layout_version, 0);
	struct radiance_mapping *m = NULL;
	assert_int_equal(radiance_map_model(r, 1, RADIANCE_MAP_LAYOUT_VERSION, &m), -ENOTSUP);
	assert_non_null(strstr(radiance_error_message(r), "predates MapModel"));
	assert_int_equal(radiance_get_error(r), 0);
	radiance_disconnect(r);
	raw_old_reap(&old);   /* no MapModel reached it */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(cpu_refuses, start_cpu, stop),
		cmocka_unit_test_setup_teardown(raw_refusals, start_cpu, stop),
		cmocka_unit_test_setup_teardown(raw_layout_version, start_cpu, stop),
		cmocka_unit_test_setup_teardown(fake_share_bytes, start_fake_share, stop),
		cmocka_unit_test_setup_teardown(fake_share_lifetime, start_fake_share, stop),
		cmocka_unit_test_setup_teardown(pipelined_maps_bounded, start_fake_share, stop),
		cmocka_unit_test_setup_teardown(allow_owner, start_fake_share, stop),
		cmocka_unit_test_setup_teardown(allow_all, start_allow_all, stop),
		cmocka_unit_test_setup_teardown(allow_none, start_allow_none, stop),
		cmocka_unit_test(allow_bad_value),
		cmocka_unit_test(old_daemon_never_asked),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
