/*
 * One real radianced per test on the shipped checkpoint, the CPU reference
 * computed once per binary: the fixture of test_client_api, test_models and
 * test_lifetime (they were one file, test_daemon.c, until it was split by
 * area). Each test gets its own daemon on a socket in a fresh mkdtemp
 * directory (per-test setup/teardown); `stop` also checks that it still
 * runs and exits cleanly.
 *
 * Header-only, as daemon_harness.h, whose helpers it uses: the Makefile
 * builds each tests/test_*.c into its own binary.
 */
#ifndef RADIANCE_DAEMON_FIXTURE_H
#define RADIANCE_DAEMON_FIXTURE_H

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon_harness.h"

__attribute__((unused)) static struct h_ref ref;
__attribute__((unused)) static struct h_daemon daemon_;
__attribute__((unused)) static char ckpt[512];

static inline int group_setup(void **state)
{
	h_path(ckpt, sizeof ckpt, H_CHECKPOINT);
	double t = h_now();
	if (h_ref_load(&ref) < 0)
		return -1;
	fprintf(stderr, "reference: %zu layers in %.2f s\n", ref.n_layers, h_now() - t);
	return 0;
}

static inline int group_teardown(void **state)
{
	h_ref_free(&ref);
	return 0;
}

static inline int start(void **state)
{
	return h_daemon_start(&daemon_);
}

static inline int stop(void **state)
{
	/* every test leaves a daemon that still runs and exits cleanly */
	return h_daemon_stop_clean(&daemon_);
}

static inline struct radiance *connect_named(const char *name)
{
	struct radiance_options o = RADIANCE_OPTIONS_INIT;
	o.client_name = name;
	o.timeout_ms = 30000;
	struct radiance *r = radiance_connect(daemon_.socket, &o);
	if (!r)
		fprintf(stderr, "connect: %s\n", radiance_strerror(errno));
	return r;
}

/* For the tests that end with the daemon gone (SIGTERM, SIGKILL). */
static inline int stop_after_sigterm(void **state)
{
	h_daemon_stop(&daemon_);   /* already exited: only removes the directory */
	return 0;
}

/* GetStats' session count, once the daemon has noticed every disconnect
 * (asynchronously: poll up to 2 s). */
static inline void wait_sessions(struct radiance *r, uint32_t want)
{
	struct radiance_stats_reply *st = NULL;
	for (int i = 0; i < 200; i++) {
		radiance_stats_free(st);
		assert_int_equal(radiance_get_stats(r, &st), 0);
		if (st->global.sessions == want)
			break;
		h_sleep_ms(10);
	}
	assert_int_equal(st->global.sessions, want);
	radiance_stats_free(st);
}

/* 'T' once the kernel has stopped pid (SIGSTOP delivered). */
static inline int process_state(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : -1;
}

/* SIGSTOP, and wait until the daemon really is stopped: from here nothing
 * it was sent runs before SIGCONT. */
static inline void daemon_freeze(void)
{
	assert_int_equal(kill(daemon_.pid, SIGSTOP), 0);
	for (int t = 0; t < 500 && process_state(daemon_.pid) != 'T'; t++)
		h_sleep_ms(2);
	assert_int_equal(process_state(daemon_.pid), 'T');
}

/* Requests of the FFN's first layer (the largest) on its captured rows:
 * one input x in the arena, n outputs y[i] (0xff-filled), for a drain that
 * takes a while. */
struct ffn_batch {
	const struct h_layer *hl;
	uint32_t layer;
	size_t yb;
	uint16_t *x;
};

static inline void ffn_batch_init(struct ffn_batch *b, struct radiance *r, uint32_t id, uint16_t **y,
					  int n)
{
	b->hl = h_ref_find(&ref, "encoder.layer.0.intermediate.dense");
	assert_non_null(b->hl);
	int layer = radiance_find_layer(radiance_held_model(r, id), b->hl->name);
	assert_true(layer >= 0);
	b->layer = (uint32_t)layer;
	size_t xb = (size_t)b->hl->m * b->hl->k * 2;
	b->yb = (size_t)b->hl->m * b->hl->n * 2;
	b->x = radiance_arena_alloc(r, xb);
	assert_non_null(b->x);
	memcpy(b->x, b->hl->x_bf16, xb);
	for (int i = 0; i < n; i++) {
		y[i] = radiance_arena_alloc(r, b->yb);
		assert_non_null(y[i]);
		memset(y[i], 0xff, b->yb);
	}
}

static inline void ffn_batch_submit(const struct ffn_batch *b, struct radiance *r, uint32_t id,
					    uint16_t **y, uint64_t *ids, int n)
{
	for (int i = 0; i < n; i++) {
		memset(y[i], 0xff, b->yb);
		assert_int_equal(radiance_submit(r, id, b->layer, b->hl->m, RADIANCE_BF16, b->x, y[i],
						 &ids[i]), 0);
	}
}

#endif
