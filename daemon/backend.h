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
 * thread-safe, except register_host and unregister_host, which any thread
 * may call at any time, beside the executor's calls (the daemon pins
 * arenas on the executor's pin thread: executor.h, executor_pin), though never two
 * at once for the same range, and share_create, which one other thread (the
 * pin thread, one model at a time) may call beside the executor's calls:
 * it reads nothing they change.
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

/* The W4A8 kernel for launches above the decode band (GPU backend; the
 * config option `prefill`, in this order). */
enum radiance_backend_prefill {
	RADIANCE_BACKEND_PREFILL_AUTO = 0,   /* FAST where the sm_90a wgmma kernel runs, else EXACT */
	RADIANCE_BACKEND_PREFILL_EXACT = 1,  /* f16 tensor cores, fp32 accumulation: one bf16 step */
	RADIANCE_BACKEND_PREFILL_FAST = 2,   /* fp8 wgmma, Hopper's ~14-bit accumulation: the fp8
	                                        bound of docs/numerics.md "Contract"; EXACT (and a
	                                        warning) where no wgmma kernel runs */
};

struct radiance_backend_options {
	const char *kind;        /* "auto", "cpu", "gpu"; NULL means "auto" */
	int device;              /* GPU ordinal; below 0: not chosen, the GPU backend
	                            takes 0. The CPU backend ignores it, with a
	                            warning when one was chosen. */
	int require_gpu;         /* auto: no fallback to the CPU; create fails with
	                            -ENODEV and the GPU's reason instead */
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
	                            error; the CPU backend warns that it has no
	                            effect */
	const char *share;       /* GPU: "auto" (NULL), "vmm", "ipc" or "none": how
	                            models are allocated for MapModel */
	int fake_share;          /* CPU: export the host arrays in a sealed memfd
	                            (the test handle; tests only) */
	uint32_t test_pin_delay_us; /* CPU: sleep this long in register_host and
	                            unregister_host, as page-locking an arena on
	                            a GPU can take (tests only) */
	int cpu_simd;            /* CPU: SIMD kernels, 0 the best the CPU has, 1 scalar
	                            (the reference kernels), 2 avx2, 3 avx2-int16
	                            (not bit-exact), 4 avx512, 5 neon; create fails
	                            (-ENOTSUP, the text says why) when the CPU lacks
	                            the level asked for */
	int prefill;             /* GPU: enum radiance_backend_prefill; the CPU
	                            backend warns for any but AUTO */
	uint32_t wgmma_tile;     /* GPU, prefill fast: 0 the policy, 128 or 96 tokens */
	uint32_t zero_copy_rows; /* GPU: launches of at most this many rows read x
	                            from and write y into the registered arenas
	                            through their device mapping, no copies; larger
	                            ones copy (0: always copy). docs/gpu.md has
	                            the crossover. */
	uint32_t zero_copy_x_kib;   /* GPU, zero-copy launches: the quant reads x in
	                            place when no request's x exceeds this many
	                            KiB, else the row-copy kernel gathers it first
	                            (0: always gather) */
	uint32_t zero_copy_y_kib;   /* GPU, zero-copy launches: the GEMM writes y in
	                            place when no request's y exceeds this many
	                            KiB (several requests: in the decode band,
	                            max_decode_rows), else the row-copy kernel
	                            scatters it (0: always scatter) */
	uint32_t pin_piece_kib;  /* GPU: arenas are page-locked in pieces of this
	                            many KiB (0: each as one range), so that no
	                            registration holds the driver's lock, which
	                            every launch takes, for long */
	/* GPU: runs between two pieces of a registration or unregistration, on
	 * the thread doing it (register_host's caller), with pin_pace_arg; the
	 * executor waits there until it has had a round of its own, so that
	 * each of its rounds waits for at most one piece. NULL: a 50 us sleep. */
	void (*pin_pace)(void *arg);
	void *pin_pace_arg;
	int test_no_preload;     /* GPU: do not load the kernels at create, leave
	                            them to the driver's lazy loading (tests only:
	                            shows that tests/test_gpu.c's check of the
	                            device memory sees a load) */
};

/* One request's rows inside a (possibly merged) launch. x and y point into a
 * session arena that register_host made known to the backend. */
struct radiance_rows {
	const void *x;           /* [m][layer k] elements of `dtype` */
	uint16_t *y;             /* [m][layer n] bf16, written by the backend */
	uint32_t m;
	enum radiance_dtype dtype;
	int bulk;                /* a piece of a request run in pieces (prefill):
	                            every piece of one request must carry it, so
	                            that they run in order; a GPU backend queues
	                            such launches behind decode ones, at a lower
	                            priority */
};

struct radiance_backend_info {
	char name[16];           /* "cpu", "cuda", "hip" */
	char device[128];        /* e.g. "NVIDIA H200" or the CPU model string */
	uint64_t scratch_bytes;  /* bytes allocated at create for staging/split-K */
	char share[16];          /* how models are made mappable: "vmm", "ipc",
	                            "test-memfd", or "none" */
	char share_why[192];     /* for "none" (or "ipc"): why not more */
	int queues;              /* 1: linear_start queues the launch on a device
	                            and returns at once (GPU); 0: it runs the
	                            launch before it returns (CPU), so a slow
	                            start is the work itself, not a wait */
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
 * copy/repack it to the device (GPU); `l` must outlive the returned handle.
 * -E2BIG for a layer above the options' max_n or max_k (when set). */
int radiance_backend_layer_upload(struct radiance_backend *b, const struct radiance_layer *l,
				  struct radiance_backend_layer **out, char *err, size_t errlen);
void radiance_backend_layer_free(struct radiance_backend *b, struct radiance_backend_layer *h);

/* Pin (GPU: page-lock and map, which takes time in proportion to len: tens
 * of ms for a big arena) a host range that rows will point into, e.g. a
 * session's shared-memory arena; unregister before unmapping it, and only
 * once no launch that reads or writes it is still in flight (done, or a
 * synchronous call returned): the GPU backend does not synchronize its
 * queues for it. On the CPU nothing is pinned: both only sleep for
 * test_pin_delay_us. Any thread (above). register: 0, -ENOMEM, -EIO with
 * err set. */
int radiance_backend_register_host(struct radiance_backend *b, void *base, size_t len,
				   char *err, size_t errlen);
void radiance_backend_unregister_host(struct radiance_backend *b, void *base);

/* ---- shared weights (docs/mapped.md) ----
 *
 * A backend that can let other processes map a model's weights keeps all of
 * its layers in one exportable allocation (proto/map.h describes the
 * layout). The executor asks for it before the first layer's upload and
 * uploads every layer into it; session_map.c hands it to the sessions that
 * ask (MapModel). */
enum radiance_share_handle {
	RADIANCE_SHARE_HANDLE_NONE = 0,
	RADIANCE_SHARE_HANDLE_POSIX_FD = 1,     /* a VMM allocation's exported fd */
	RADIANCE_SHARE_HANDLE_IPC = 2,          /* a legacy IPC handle, ipc_handle */
	RADIANCE_SHARE_HANDLE_TEST_MEMFD = 3,   /* test only: canonical arrays in a sealed memfd */
};

/* Values as in radiance.proto's MappedLayer: bytes from the start. */
struct radiance_share_layer {
	uint64_t weight_offset, weight_bytes;
	uint64_t scales_offset, scales_bytes;   /* W4A8 only */
	uint64_t bias_offset, bias_bytes;       /* 0 bytes: no bias */
};

/* Made by radiance_backend_share_create (the executor's pin thread), filled by the
 * uploads, immutable once the model is READY, so the loop thread may read
 * it from then on; freed by radiance_backend_share_destroy after every
 * layer handle is freed. */
struct radiance_backend_share {
	enum radiance_share_handle handle;
	int fd;                  /* POSIX_FD, TEST_MEMFD: the backend's (sessions send dups); else -1 */
	uint8_t ipc_handle[64];  /* IPC */
	uint64_t bytes;          /* the whole allocation */
	uint64_t granularity;
	char vendor[8];          /* "cuda", "hip", "cpu" */
	char pci_bus_id[32];     /* "" for the cpu */
	char layout[96];         /* a description for logs and clients */
	size_t n_layers;
	struct radiance_share_layer *layers;   /* [n_layers], by index */
	void *priv;              /* the backend's */
};

/* Lays out model m's layers in one exportable allocation and makes it.
 * 0 with *out NULL when this backend does not share (the cpu backend, a GPU
 * without VMM or IPC, RADIANCE_SHARE=none): then layers go into private
 * memory and MapModel is refused. -ENOMEM / -EIO with err set otherwise. */
int radiance_backend_share_create(struct radiance_backend *b, const struct radiance_model *m,
				  struct radiance_backend_share **out, char *err, size_t errlen);
/* NULL is a no-op. Every layer uploaded into it must be freed first. */
void radiance_backend_share_destroy(struct radiance_backend *b, struct radiance_backend_share *s);

/* radiance_backend_layer_upload into layer `index` of share s (which must
 * be m's, where l = &m->layers[index]); s NULL: a plain upload. */
int radiance_backend_layer_upload_into(struct radiance_backend *b, struct radiance_backend_share *s,
				       size_t index, const struct radiance_layer *l,
				       struct radiance_backend_layer **out, char *err, size_t errlen);

/* Run the layer on `nrows` requests' rows, stacked into one launch when the
 * backend can (sum of m <= max_rows). Synchronous: outputs are written when it
 * returns. -EINVAL for a dtype or size the backend cannot take, -E2BIG when
 * the stacked rows exceed max_rows, -EIO for a device fault. */
int radiance_backend_linear(struct radiance_backend *b, const struct radiance_layer *l,
			    struct radiance_backend_layer *h, const struct radiance_rows *rows,
			    size_t nrows, char *err, size_t errlen);

/* Runs nlayers layers of one K on the same requests' x: one launch, x
 * quantized once for every W4A8 layer where the backend can (the cpu
 * backend's SIMD level; the scalar level and the GPU backend run the layers
 * one after another, each quantizing x: the same bits either way, since
 * the per-token quantization is deterministic). rows holds nlayers x nrows
 * entries, rows[j * nrows + i] request i's for layer j: x, m and dtype equal
 * across j, y layer j's [m][n_j]. Synchronous. Errors as
 * radiance_backend_linear, and -EINVAL for layers of different K. */
int radiance_backend_linear_multi(struct radiance_backend *b, const struct radiance_layer *const *l,
				  struct radiance_backend_layer *const *h, size_t nlayers,
				  const struct radiance_rows *rows, size_t nrows, char *err,
				  size_t errlen);

/* The same launch, asynchronous (a GPU backend): queued on the device and
 * returned from at once; *ticket names it for radiance_backend_linear_done.
 * Until its launch is done, the rows' x may not change and y is being
 * written; the arena must stay registered. Several launches may be in
 * flight. Launches of bulk rows (struct radiance_rows; all rows of one
 * launch alike) complete in the order they were started, and so do the
 * others among themselves; a non-bulk launch may overtake bulk ones.
 * Errors as for radiance_backend_linear, found at start; -EOPNOTSUPP when
 * the backend has no asynchronous launches: use radiance_backend_linear.
 * The cpu backend runs the launch before it returns, and its launches are
 * done at the first look. */
int radiance_backend_linear_start(struct radiance_backend *b, const struct radiance_layer *l,
				  struct radiance_backend_layer *h, const struct radiance_rows *rows,
				  size_t nrows, uint64_t *ticket, char *err, size_t errlen);

/* Has the launch `ticket` finished?
 * Never blocks: it reads a completion word the device writes into host
 * memory at the end of the launch. 1 done (outputs written), 0 not yet,
 * -EIO when the device faulted (then this and every later launch fails;
 * err says why). */
int radiance_backend_linear_done(struct radiance_backend *b, uint64_t ticket, char *err, size_t errlen);

#endif
