/*
 * Loading models through the real radianced binary ($RADIANCED) on the CPU
 * backend, as a client sees it: a checkpoint loaded twice is resident once,
 * two checkpoints of one name, attach by name and errors that do not stick,
 * a preloaded model, a preload whose name has a control character. The
 * registry's refcounts, dedup and charges on their own are test_registry;
 * the loader's rules test_checkpoint; the limits' refusals test_limits.
 *
 * One daemon per test, the reference once per binary (daemon_fixture.h).
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon_fixture.h"

static int start_preload(void **state)
{
	static const char *args[3] = { "--preload", ckpt, NULL };
	return h_daemon_start_argv(&daemon_, args);
}

/* --- models --------------------------------------------------------------- */

/* The daemon notices a disconnect asynchronously: poll up to 2 s for the
 * model list (count models; users of the first) to settle at what we want. */
/* The daemon notices a disconnect asynchronously: poll up to 2 s for the
 * model list (count models; users of the first) to settle at what we want. */
static void wait_models(struct radiance *r, size_t count, uint32_t users)
{
	struct radiance_model_list *l = NULL;
	for (int i = 0; i < 200; i++) {
		radiance_model_list_free(l);
		assert_int_equal(radiance_list_models(r, &l), 0);
		if (l->count == count && (count == 0 || l->models[0].users == users))
			break;
		h_sleep_ms(10);
	}
	assert_int_equal(l->count, count);
	if (count)
		assert_int_equal(l->models[0].users, users);
	radiance_model_list_free(l);
}

static void load_twice_is_resident_once(void **state)
{
	struct radiance *a = connect_named("a"), *b = connect_named("b");
	assert_non_null(a);
	assert_non_null(b);
	uint32_t ida, idb;
	assert_int_equal(radiance_load_model(a, ckpt, NULL, &ida), 0);
	assert_int_equal(radiance_load_model(b, ckpt, NULL, &idb), 0);
	assert_int_equal(ida, idb);

	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(a, &l), 0);
	assert_int_equal(l->count, 1);
	assert_int_equal(l->models[0].model_id, ida);
	assert_int_equal(l->models[0].users, 2);
	assert_false(l->models[0].preloaded);
	assert_true(l->models[0].resident_bytes > 0);
	radiance_model_list_free(l);

	/* the full description, layers included, for anyone who asks */
	struct radiance_model_info *m;
	assert_int_equal(radiance_get_model(b, ida, &m), 0);
	assert_int_equal(m->n_layers, ref.n_layers);
	for (size_t i = 0; i < m->n_layers; i++) {
		const struct h_layer *hl = h_ref_find(&ref, m->layers[i].name);
		assert_non_null(hl);
		assert_int_equal(m->layers[i].n, hl->n);
		assert_int_equal(m->layers[i].k, hl->k);
		assert_int_equal(m->layers[i].index, i);
	}
	radiance_model_info_free(m);

	/* b leaves: one user; a releases: nobody holds it, it is unloaded */
	radiance_disconnect(b);
	wait_models(a, 1, 1);
	assert_int_equal(radiance_release_model(a, ida), 0);
	assert_null(radiance_held_model(a, ida));
	assert_int_equal(radiance_list_models(a, &l), 0);
	assert_int_equal(l->count, 0);
	radiance_model_list_free(l);
	/* releasing what we no longer hold is the daemon's ENOENT, not sticky */
	assert_int_equal(radiance_release_model(a, ida), -ENOENT);
	assert_int_equal(radiance_get_error(a), 0);
	radiance_disconnect(a);
}

/* Copies the checkpoint to dir/minilm-w4g128 with one bias value changed:
 * another checkpoint with the same directory name. */
static void make_modified_copy(const char *dir, char *out, size_t n)
{
	char cmd[4096];
	snprintf(out, n, "%s/" H_CHECKPOINT, dir);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/config.json '%s'/quantization_config.json "
		 "'%s'/model.safetensors '%s'/", out, ckpt, ckpt, ckpt, out);
	assert_int_equal(system(cmd), 0);
	char path[1024];
	snprintf(path, sizeof path, "%s/model.safetensors", out);
	FILE *f = fopen(path, "r+b");
	assert_non_null(f);
	uint64_t hlen;
	assert_int_equal(fread(&hlen, 8, 1, f), 1);
	char *hdr = calloc(1, hlen + 1);
	assert_int_equal(fread(hdr, 1, hlen, f), hlen);
	json_t *j = json_loads(hdr, 0, NULL);
	assert_non_null(j);
	json_t *t = json_object_get(j, "encoder.layer.0.attention.self.query.bias");
	json_int_t begin = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
	uint16_t one = 0x3C00;   /* fp16 1.0 */
	assert_int_equal(fseek(f, (long)(8 + hlen + (uint64_t)begin), SEEK_SET), 0);
	assert_int_equal(fwrite(&one, 2, 1, f), 1);
	fclose(f);
	json_decref(j);
	free(hdr);
}

/* Two different checkpoints that happen to share a name (here: the same
 * directory name, the library's default) must not be served as one: the
 * daemon dedupes by file identity only, and refuses the name clash with
 * -EEXIST (not sticky). Under another name the copy loads as its own model,
 * with its own bias; the original's files under another name attach to the
 * original, which keeps its name. */
static void same_name_other_checkpoint(void **state)
{
	char other[256];
	make_modified_copy(daemon_.dir, other, sizeof other);
	struct radiance *a = connect_named("orig"), *b = connect_named("copy");
	assert_non_null(a);
	assert_non_null(b);
	uint32_t ida, idb;
	assert_int_equal(radiance_load_model(a, ckpt, NULL, &ida), 0);
	assert_int_equal(radiance_load_model(b, other, NULL, &idb), -EEXIST);
	assert_int_equal(radiance_get_error(b), 0);
	assert_non_null(strstr(radiance_error_message(b), "load this one under another name"));
	assert_null(radiance_held_model(b, ida));

	struct radiance_load_options lo = RADIANCE_LOAD_OPTIONS_INIT;
	lo.name = "minilm-modified";
	assert_int_equal(radiance_load_model(b, other, &lo, &idb), 0);
	assert_int_not_equal(idb, ida);
	assert_string_equal(radiance_held_model(b, idb)->name, "minilm-modified");
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.0.attention.self.query");
	fprintf(stderr, "the copy has its own bias, so it must differ from the reference:\n");
	assert_true(h_check_layer(b, idb, hl, RADIANCE_BF16, NULL) > 0);

	uint32_t idc;
	lo.name = "another-name";
	assert_int_equal(radiance_load_model(b, ckpt, &lo, &idc), 0);
	assert_int_equal(idc, ida);
	assert_string_equal(radiance_held_model(b, idc)->name, ref.model_name);
	assert_int_equal(h_check_layer(b, idc, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(a);
	radiance_disconnect(b);
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%.256s'", other);
	assert_int_equal(system(cmd), 0);
}

static void attach_and_errors_are_not_sticky(void **state)
{
	struct radiance *r = connect_named("attach");
	assert_non_null(r);
	uint32_t id;
	assert_int_equal(radiance_attach_model(r, "no-such-model", &id), -ENOENT);
	assert_int_equal(radiance_get_error(r), 0);
	assert_true(strlen(radiance_error_message(r)) > 0);
	assert_int_equal(radiance_load_model(r, "/nonexistent", NULL, &id), -ENOENT);
	struct radiance_model_info *m;
	assert_int_equal(radiance_get_model(r, 4242, &m), -ENOENT);
	assert_null(m);
	/* ... and the handle still works */
	assert_int_equal(h_good_client(daemon_.socket, &ref), 0);
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.3.attention.self.key");
	assert_non_null(hl);
	assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
	radiance_disconnect(r);
}

static void preloaded_model(void **state)
{
	struct radiance *r = connect_named("preload");
	assert_non_null(r);
	struct radiance_model_list *l;
	assert_int_equal(radiance_list_models(r, &l), 0);
	assert_int_equal(l->count, 1);
	assert_true(l->models[0].preloaded);
	assert_int_equal(l->models[0].users, 0);
	radiance_model_list_free(l);
	uint32_t id;
	assert_int_equal(radiance_attach_model(r, ref.model_name, &id), 0);
	const struct h_layer *hl = h_ref_find(&ref, "encoder.layer.1.output.dense");
	assert_int_equal(h_check_layer(r, id, hl, RADIANCE_BF16, NULL), 0);
	/* a load of the same files attaches to the preloaded copy */
	uint32_t id2;
	assert_int_equal(radiance_load_model(r, ckpt, NULL, &id2), 0);
	assert_int_equal(id2, id);
	radiance_disconnect(r);
	/* nobody holds it now, and it stays: preloaded */
	r = connect_named("preload-2");
	wait_models(r, 1, 0);
	/* a double release is an error and never touches the daemon's hold */
	assert_int_equal(radiance_attach_model(r, ref.model_name, &id), 0);
	assert_int_equal(radiance_release_model(r, id), 0);
	assert_int_equal(radiance_release_model(r, id), -ENOENT);
	/* errors say what was asked in the API's terms, not the wire's
	 * message name (they said "release_model: ...") */
	char want[160];
	snprintf(want, sizeof want, "release model %u: model_id %u is not loaded by this session",
		 id, id);
	assert_string_equal(radiance_error_message(r), want);
	wait_models(r, 1, 0);
	/* the explicit unload drops it (the tests run as root) ... */
	assert_int_equal(radiance_unload_preloaded(r, id), 0);
	wait_models(r, 0, 0);
	/* ... and there is nothing left to unload */
	assert_int_equal(radiance_unload_preloaded(r, id), -ENOENT);
	snprintf(want, sizeof want, "unload model %u: model_id %u is not a preloaded model", id, id);
	assert_string_equal(radiance_error_message(r), want);
	/* a load or an attach is named by the model name it asks for */
	assert_int_equal(radiance_attach_model(r, "no-such-model", &id2), -ENOENT);
	static const char attach_want[] = "attach \"no-such-model\": ";
	if (strncmp(radiance_error_message(r), attach_want, strlen(attach_want)))
		fail_msg("attach error \"%s\", expected it to start with \"%s\"",
			 radiance_error_message(r), attach_want);
	radiance_disconnect(r);
}

/* --- start-up: a preload's name --------------------------------------------- */

/* A preload is named after its directory, a name every client sees: one
 * with a control character is refused at start, in one log line that
 * shows it escaped. */
static void preload_name_with_control_character(void **state)
{
	char base[64] = "/tmp/radiance-preload-XXXXXX";
	assert_non_null(mkdtemp(base));
	char log[128], sock[128], link[160];
	snprintf(log, sizeof log, "%s/radianced.log", base);
	snprintf(sock, sizeof sock, "%s/r.sock", base);
	snprintf(link, sizeof link, "%s/evil\x1b[2Kname", base);
	assert_int_equal(symlink(ckpt, link), 0);
	pid_t pid = h_spawn_logged(log, (const char *const[]){ "--socket", sock, "--preload", link,
							     NULL });
	int status = h_wait_exit(pid, 20.0);
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 1)
		h_show_file(log);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 1);
	char want[300];
	snprintf(want, sizeof want, "preload %s/evil\\x1b[2Kname: its directory name (the model's "
		 "name) \"evil\\x1b[2Kname\" has a control character (0x1b) at byte 4", base);
	if (h_count_lines(log, want) != 1)
		h_show_file(log);
	assert_int_equal(h_count_lines(log, want), 1);
	assert_int_equal(h_count_lines(log, "[error]"), 1);
	assert_int_equal(h_count_lines(log, "\x1b"), 0);
	assert_int_equal(access(sock, F_OK), -1);

	snprintf(want, sizeof want, "rm -rf '%s'", base);
	assert_int_equal(system(want), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(load_twice_is_resident_once, start, stop),
		cmocka_unit_test_setup_teardown(same_name_other_checkpoint, start, stop),
		cmocka_unit_test_setup_teardown(attach_and_errors_are_not_sticky, start, stop),
		cmocka_unit_test_setup_teardown(preloaded_model, start_preload, stop),
		cmocka_unit_test(preload_name_with_control_character),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
