/*
 * radianced's settings: built-in defaults, then the config file (INI, parsed
 * with libinih; keys at top level or in a [radianced] section), then the
 * command line, each overriding the one before. docs/daemon.md lists every
 * option; `radianced --help` prints them.
 *
 * Thread safety: filled once at start by the main thread, read-only after.
 */
#ifndef RADIANCE_CONFIG_H
#define RADIANCE_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RADIANCE_DEFAULT_CONFIG "/etc/radiance/radianced.conf"
#define RADIANCE_DEFAULT_ROOT_SOCKET "/run/radiance/radiance.sock"

/* Who may MapModel (docs/mapped.md). */
enum radiance_map_allow {
	RADIANCE_MAP_ALLOW_OWNER = 0,   /* root and the daemon's own uid (the default) */
	RADIANCE_MAP_ALLOW_ALL,         /* every session */
	RADIANCE_MAP_ALLOW_NONE,        /* nobody */
};

/* One entry of sched_uid_weights. */
struct radiance_uid_weight {
	uid_t uid;
	uint32_t weight;            /* 1..SCHED_MAX_WEIGHT (scheduler.h) */
};

struct radiance_config {
	char *config_path;          /* the file that was read, or NULL */
	char *socket_path;          /* listening socket (ignored when socket-activated) */
	char *socket_group;         /* chgrp the socket to this and make it 0660; NULL: 0600 */
	gid_t socket_gid;           /* socket_group resolved by config_load, or (gid_t)-1 */
	char *backend;              /* "auto", "cpu", "gpu" */
	int device;                 /* GPU ordinal; -1 when not given (the GPU backend takes 0) */
	uint32_t require_gpu;       /* 1: backend auto may not fall back to the CPU */
	char **preload;             /* checkpoint directories to load at start; config_load
	                               refuses two with one basename (the model name) and
	                               drops repeats of one directory */
	size_t n_preload;
	uint32_t max_sessions;      /* connected clients at once */
	uint64_t max_arena_bytes;   /* largest arena one session may ask for, bytes */
	uint64_t arena_bytes;       /* arena of an OpenRing that asks for 0 (<= max) */
	uint32_t max_rows;          /* largest M of a request, and of one merged launch */
	uint32_t max_inflight;      /* requests per session submitted but not completed */
	uint32_t max_sq_entries;    /* largest SQ (and CQ) a session may ask for; power of two */
	uint32_t sq_entries;        /* SQ/CQ entries of an OpenRing that asks for 0 */
	uint32_t max_k, max_n;      /* largest layer K and N the backend is sized for */
	uint32_t hello_timeout_ms;  /* a connection that sends no Hello this long is closed */
	uint32_t decode_rows;       /* largest M of the split-K decode path (clamped to max_rows) */
	uint32_t numerics_gate;     /* 1: GPU backend checks first launches against the CPU */
	/* scheduling (daemon/scheduler.h) */
	uint32_t sched_chunk_rows;  /* a request of more rows runs in pieces of this many */
	uint32_t sched_session_rows;/* rows one session may have taken and not answered */
	uint32_t sched_gather_us;   /* wait for busy sessions before a launch (0: never) */
	struct radiance_uid_weight *uid_weights;   /* sched_uid_weights, uids distinct;
	                                              owned; NULL: none */
	size_t n_uid_weights;
	uint32_t zero_copy_rows;    /* GPU: launches up to this many rows map the arenas */
	uint32_t zero_copy_x_kib;   /* GPU, zero-copy: x read in place up to this per request */
	uint32_t zero_copy_y_kib;   /* GPU, zero-copy: y written in place up to this (one request) */
	uint32_t pin_piece_kib;     /* GPU: arenas page-locked in pieces of this size (0: whole) */
	char *share;                /* GPU backend: auto, vmm, ipc or none; NULL: auto */
	uint32_t fake_share;        /* 1: CPU backend exports the test memfd (tests only) */
	uint32_t test_pin_delay_us; /* CPU backend: sleep per arena (un)registration (tests only) */
	uint32_t cpu_threads;       /* CPU backend compute threads; 0: all usable (auto) */
	/* kernel settings: indices of the option's values (config.c) */
	uint32_t cpu_simd;          /* 0 auto, 1 scalar, 2 avx2 */
	uint32_t prefill;           /* enum radiance_backend_prefill: 0 auto, 1 exact, 2 fast */
	uint32_t wgmma_tile;        /* 0 auto, 1 128 tokens, 2 96 tokens */
	enum radiance_map_allow map_allow;   /* who may map models' device memory */
	/* Limits (docs/daemon.md "Limits"); 0: none. config_load resolves
	 * "auto" (LIMIT_AUTO) from memory_bytes and max_sessions. */
	uint64_t max_model_bytes;          /* resident model bytes, all models */
	uint64_t max_model_bytes_per_uid;  /* ... of the models one uid loaded */
	uint64_t max_total_arena_bytes;    /* arena bytes of all open rings */
	uint64_t max_arena_bytes_per_uid;  /* ... of one uid's sessions */
	uint64_t max_sessions_per_uid;     /* sessions of one uid at once */
	uint64_t memory_bytes;             /* what "auto" derived from, 0: nothing was */
	const char *memory_from;           /* "physical memory", "cgroup memory.max" */
	int log_level;              /* enum rlog_level */
};

/* Fills cfg from defaults, the config file and argv, and resolves
 * socket_group to socket_gid. Returns 0 to run, 1 when --help or --version
 * was answered on stdout (exit 0), or a negative errno (-EINVAL, -ENOENT,
 * -EISDIR, -ENOMEM, ...) with a one-line message in err naming the option or
 * file:line key and the bad value; for a bad combination of values, where
 * each one came from. cfg must be finished in every case. */
int config_load(struct radiance_config *cfg, int argc, char **argv, char *err, size_t errlen);

/* Defaults only (no file, no argv): what config_load starts from. */
int config_init(struct radiance_config *cfg);

/* Applies one INI file over cfg. 0, -ENOENT/-errno when it cannot be
 * opened, -EISDIR/-EINVAL when it is not a regular file (a FIFO is refused,
 * not waited on), -EINVAL for a bad or too long line, unknown key, a key set
 * twice (but preload, whose lines add up) or bad value (err says which
 * file:line).
 * A '#' or ';' that starts a value or follows whitespace starts a comment. */
int config_parse_file(struct radiance_config *cfg, const char *path, char *err, size_t errlen);

/* The device-time weight of a uid's sessions: its sched_uid_weights
 * entry, else 1. Any thread (cfg is read-only after config_load). */
uint32_t config_uid_weight(const struct radiance_config *cfg, uid_t uid);

/* Frees everything cfg owns; safe on a zeroed or half-filled cfg. */
void config_finish(struct radiance_config *cfg);

#endif
