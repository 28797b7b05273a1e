/*
 * The compute backend seam. The daemon's executor talks only to this; the CPU
 * backend (daemon/backend_cpu.c) and the GPU backend (daemon/backend_gpu.c,
 * built with GPU=cuda or GPU=hip) implement it with the numerics of
 * kernels/numerics.h.
 *
 * Threading: radiance_backend_create() must run once, in the thread that will
 * call everything else, after the process has forked/daemonized (HIP must not
 * be initialized before a fork whose child goes on without exec). All other
 * calls on one backend come from that one executor thread; a backend is not
 * thread-safe.
 *
 * Errors: functions return 0 or a negative errno; `err` (may be NULL) gets a
 * one-line human message naming what failed.
 */
#ifndef RADIANCE_BACKEND_H
#define RADIANCE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct radiance_backend;
struct radiance_backend_layer;   /* a layer resident on the backend's device */

struct radiance_backend_options {
	const char *kind;        /* "auto", "cpu", "gpu"; NULL means "auto" */
	int device;              /* GPU ordinal; below 0: not chosen, the GPU backend
	                            takes 0. The CPU backend ignores it, with a
	                            warning when one was chosen. */
	uint32_t max_rows;       /* largest M of one launch (rows of all stacked
	                            requests); sizes activation and output staging */
	uint32_t max_decode_rows;/* decode band's largest M; sizes split-K partials */
	uint32_t max_n;          /* largest N of any layer served; sizes split-K partials */
	uint32_t max_k;          /* largest K of any layer served */
	unsigned cpu_threads;    /* CPU backend: compute threads in all, the calling
	                            (executor) thread included; 0: as many as the
	                            process may run on (sched_getaffinity, cgroup
	                            cpu.max). The GPU backend ignores it. */
	int numerics_gate;       /* GPU: check the first launch of each (layer, M)
	                            against the CPU reference and log the relative
	                            error (also env RADIANCE_NUMERICS_GATE=1); the
	                            CPU backend warns that it has no effect */
};

/* One request's rows inside a (possibly merged) launch. x and y point into a
 * session arena that register_host made known to the backend. */
struct radiance_rows {
	const void *x;           /* [m][layer k] elements of `dtype` */
	uint16_t *y;             /* [m][layer n] bf16, written by the backend */
	uint32_t m;
	enum radiance_dtype dtype;
};

struct radiance_backend_info {
	char name[16];           /* "cpu", "cuda", "hip" */
	char device[128];        /* e.g. "NVIDIA H200" or the CPU model string */
	uint64_t scratch_bytes;  /* bytes allocated at create for staging/split-K */
};

/* Creates the backend opt->kind names. "auto" tries the GPU and falls back to
 * the CPU when this build has no GPU backend or no device answers; it logs
 * (info) which one it took and why. Logs a warning for GPU-only options
 * (device, numerics_gate) when the backend that runs is the CPU. */
int radiance_backend_create(const struct radiance_backend_options *opt,
			    struct radiance_backend **out, char *err, size_t errlen);
void radiance_backend_destroy(struct radiance_backend *b);
void radiance_backend_info(const struct radiance_backend *b, struct radiance_backend_info *info);

/* Make a layer resident. The backend may keep pointers into `l` (CPU) or
 * copy/repack it to the device (GPU); `l` must outlive the returned handle. */
int radiance_backend_layer_upload(struct radiance_backend *b, const struct radiance_layer *l,
				  struct radiance_backend_layer **out, char *err, size_t errlen);
void radiance_backend_layer_free(struct radiance_backend *b, struct radiance_backend_layer *h);

/* Pin (GPU: page-lock and map) a host range that rows will point into, e.g. a
 * session's shared-memory arena; unregister before unmapping it. No-op on CPU. */
int radiance_backend_register_host(struct radiance_backend *b, void *base, size_t len,
				   char *err, size_t errlen);
void radiance_backend_unregister_host(struct radiance_backend *b, void *base);

/* Run the layer on `nrows` requests' rows, stacked into one launch when the
 * backend can (sum of m <= max_rows). Synchronous: outputs are written when it
 * returns. -EINVAL for a dtype or size the backend cannot take, -E2BIG when
 * the stacked rows exceed max_rows, -EIO for a device fault. */
int radiance_backend_linear(struct radiance_backend *b, const struct radiance_layer *l,
			    struct radiance_backend_layer *h, const struct radiance_rows *rows,
			    size_t nrows, char *err, size_t errlen);

#endif
