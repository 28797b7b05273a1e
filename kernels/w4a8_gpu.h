/*
 * C API of the GPU kernels (the .hip files in kernels/), for the GPU backend
 * (daemon/backend_gpu.c), tests/test_gpu.c and bench/bench_w4a8.c, which are
 * C11 and include no vendor header. The same API is built for NVIDIA (nvcc)
 * and AMD (hipcc); "device pointer" means memory from radiance__gpu_malloc.
 *
 * Errors: 0 or a negative errno (-EIO for a device/runtime failure, -EINVAL
 * for arguments, -ENOMEM, -ENODEV, -ENOTSUP); radiance__gpu_last_error()
 * then names the failing call and the vendor's message. All launchers are
 * asynchronous on `stream` (NULL = the legacy default stream) and allocate
 * nothing. Thread safety: the runtime wrappers are as thread-safe as the
 * vendor runtime; the last-error text is per thread.
 */
#ifndef RADIANCE_W4A8_GPU_H
#define RADIANCE_W4A8_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "numerics.h"   /* enum radiance_dtype */
#include "w4a8_plan.h" /* device, paths, plan, args, settings, array sizes */

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- runtime */

/* Selects device `ordinal` for the calling thread and describes it.
 * -ENODEV when there is no such device (or no driver). */
int radiance__gpu_init(int ordinal, struct radiance__gpu_device *dev);
const char *radiance__gpu_last_error(void);
/* Loads every kernel the backend can launch on `dev` into its context, so
 * that under lazy module loading no request pays a kernel's load and the
 * device memory in use stops growing once the backend is up (the wgmma
 * kernels only where dev->wgmma). cuBLAS's own kernels are not covered.
 * *count gets how many were loaded. 0, or -EIO (the last-error text names
 * the kernel). Call after radiance__gpu_init, on its thread. */
int radiance__gpu_preload(const struct radiance__gpu_device *dev, unsigned *count);
/* Sets the calling thread's last-error text (printf format); returns rc. */
int radiance__gpu_fail_text(int rc, const char *fmt, ...);

int radiance__gpu_malloc(void **p, size_t bytes);
void radiance__gpu_free(void *p);
int radiance__gpu_stream_create(void **stream);
void radiance__gpu_stream_destroy(void *stream);
int radiance__gpu_stream_sync(void *stream);
int radiance__gpu_device_sync(void);
int radiance__gpu_memset_async(void *dst, int value, size_t bytes, void *stream);
int radiance__gpu_h2d_async(void *dst, const void *src, size_t bytes, void *stream);
int radiance__gpu_d2h_async(void *dst, const void *src, size_t bytes, void *stream);
int radiance__gpu_d2d_async(void *dst, const void *src, size_t bytes, void *stream);
/* Page-locks and maps [base, base+len) for async copies; *dev_ptr gets the
 * device's address of base (it can differ from base on HIP). */
int radiance__gpu_host_register(void *base, size_t len, void **dev_ptr);
int radiance__gpu_host_unregister(void *base);
/* The same in pieces of `piece` bytes (a multiple of the page size), with
 * a short sleep between two, so that no single driver call holds the
 * driver's lock for long (a 64 MiB registration took 25-43 ms on the
 * H200, and every launch of the process waited meanwhile). The pieces must
 * map to one contiguous device range (*dev_ptr, as for a whole-range
 * registration): where they do not, nothing stays registered and the
 * return is -EXDEV (register the whole range instead). Unregister with
 * radiance__gpu_host_unregister_pieces and the same len and piece.
 * *slowest_ns (when not NULL) gets the longest one piece's driver calls
 * took, in nanoseconds: what a launch of another thread may have waited.
 * pace (when not NULL) runs between two pieces instead of the sleep, on the
 * calling thread, with pace_arg: the daemon's executor waits there until it
 * has had a round of its own (daemon/exec_jobs.c, pin_pace). */
int radiance__gpu_host_register_pieces(void *base, size_t len, size_t piece, void **dev_ptr,
				       uint64_t *slowest_ns, void (*pace)(void *), void *pace_arg);
int radiance__gpu_host_unregister_pieces(void *base, size_t len, size_t piece, uint64_t *slowest_ns,
					 void (*pace)(void *), void *pace_arg);
int radiance__gpu_event_create(void **ev);
void radiance__gpu_event_destroy(void *ev);
int radiance__gpu_event_record(void *ev, void *stream);
/* An event for ordering streams only (no timing: cheaper to record and
 * wait for; radiance__gpu_event_elapsed refuses it). Destroy it with
 * radiance__gpu_event_destroy. */
int radiance__gpu_event_create_sync(void **ev);
/* Work queued on `stream` after this call waits until the device has
 * passed `ev` as last recorded before this call (a later record of ev
 * does not change what it waits for; an event never recorded is passed
 * already). Nothing waits on the host. 0 or -EIO. */
int radiance__gpu_stream_wait_event(void *stream, void *ev);
/* Milliseconds between two recorded events (waits for `end`). */
int radiance__gpu_event_elapsed(void *start, void *end, float *ms);
/* Stream capture into a graph (tests and bench: a layer call must be
 * capturable): begin (relaxed mode), end and instantiate, launch, free. */
int radiance__gpu_graph_begin(void *stream);
int radiance__gpu_graph_end(void *stream, void **exec);
int radiance__gpu_graph_launch(void *exec, void *stream);
void radiance__gpu_graph_destroy(void *exec);
/* Last error of an asynchronous launch (0 or -EIO). */
int radiance__gpu_check_launch(const char *what);
/* The calling thread's current device, and making one current (the CUDA
 * and HIP runtimes launch on the current device). */
int radiance__gpu_get_device(int *ordinal);
int radiance__gpu_set_device(int ordinal);
/* Free and total bytes of the current device (the whole device, every
 * process: cudaMemGetInfo / hipMemGetInfo). */
int radiance__gpu_mem_info(size_t *free_bytes, size_t *total_bytes);
/* The PCI bus id of a device ("0000:19:00.0"), and the ordinal of the
 * device with a given bus id in this process (ordinals differ between
 * processes with other CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES; the
 * bus id does not). -ENODEV when no visible device has it. */
int radiance__gpu_pci_bus_id(int ordinal, char *buf, size_t len);
int radiance__gpu_device_by_pci_bus_id(const char *bus_id, int *ordinal);

/* ------------------------------------------- completion and row copies */

/* A non-blocking stream of the device's greatest (high) or least priority:
 * the block scheduler starts waiting blocks of a higher-priority stream's
 * kernels first. */
int radiance__gpu_stream_create_priority(void **stream, int high);

/* 0 when everything queued on `stream` has finished, 1 while work is still
 * queued or running, -EIO when the device faulted (the text says how). */
int radiance__gpu_stream_query(void *stream);

/* Queues on `stream`, after everything queued before it, a 32-bit store of
 * `value` to dev_word, the device address of registered host memory
 * (radiance__gpu_host_register), ordered after every earlier write of the
 * stream, to host memory included: the host sees the value only once what
 * came before it is visible. CUDA: cuStreamWriteValue32 (its default
 * memory barrier); where stream memory operations are refused, and on HIP,
 * a one-thread kernel with a system-scope fence before the store. */
int radiance__gpu_signal(void *dev_word, uint32_t value, void *stream);

/* Up to RADIANCE__GPU_ROWS_MAX copies in one launch (the copy engine would
 * take one call each): dst[i] <- src[i], bytes[i] bytes, either side device
 * memory or the device address of registered host memory. With fence,
 * every thread ends with a system-scope fence (for writes into host memory
 * that the host must see before a later signal). */
#define RADIANCE__GPU_ROWS_MAX 32
struct radiance__gpu_rows_list {
	uint32_t n;
	const void *src[RADIANCE__GPU_ROWS_MAX];
	void *dst[RADIANCE__GPU_ROWS_MAX];
	uint64_t bytes[RADIANCE__GPU_ROWS_MAX];
};
int radiance__gpu_rows_copy(const struct radiance__gpu_rows_list *l, int fence, void *stream);

/* -------------------------------------------------------- shared memory */

/* Device memory that other processes can map (kernels/gpu_share.hip,
 * docs/mapped.md): a VMM allocation exported as a POSIX fd
 * (cuMemCreate + cuMemExportToShareableHandle; hipMemCreate +
 * hipMemExportToShareableHandle), or a plain allocation with a legacy IPC
 * handle (cudaIpcGetMemHandle / hipIpcGetMemHandle) where VMM is missing. */
enum radiance__gpu_share_kind {
	RADIANCE_SHARE_NONE = 0,
	RADIANCE_SHARE_VMM = 1,
	RADIANCE_SHARE_IPC = 2,
};

#define RADIANCE__GPU_IPC_BYTES 64

/* What device `ordinal` offers; `why` says what is missing and why. */
struct radiance__gpu_share_caps {
	int vmm;                  /* VMM allocations exportable as POSIX fds */
	int ipc;                  /* legacy IPC handles (assumed on every discrete GPU) */
	size_t granularity;       /* VMM allocation granularity (0 without VMM) */
	char why[192];
};
int radiance__gpu_share_caps(int ordinal, struct radiance__gpu_share_caps *caps);

/* One exportable allocation, owned by the process that made it. */
struct radiance__gpu_share {
	enum radiance__gpu_share_kind kind;
	void *base;               /* device address here; bytes of it are read-write */
	size_t bytes;             /* as asked, rounded up to `granularity` */
	size_t granularity;       /* VMM: the device's; IPC: 1 */
	int fd;                   /* VMM: the exported fd (owned, closed by free); else -1 */
	uint8_t ipc[RADIANCE__GPU_IPC_BYTES];   /* IPC: the handle */
	uint64_t handle;          /* VMM: the allocation handle */
};

/* Allocates bytes on device `ordinal` (the current device) as `kind` and
 * exports it. 0, -ENOMEM, -ENOTSUP (the kind is not available), -EIO. */
int radiance__gpu_share_alloc(int ordinal, enum radiance__gpu_share_kind kind, size_t bytes,
			      struct radiance__gpu_share *s);
/* Unmaps and releases it (importers keep what they mapped, see
 * docs/mapped.md), closes the fd. Safe on a zeroed struct with fd -1. */
void radiance__gpu_share_free(struct radiance__gpu_share *s);

/* Another process's allocation, mapped into this one. */
struct radiance__gpu_import {
	enum radiance__gpu_share_kind kind;
	void *base;
	size_t bytes;
};

/* Imports a VMM fd (not closed: the caller's) of `bytes` and maps it on
 * device `ordinal`, read-only when read_only (else read-write).
 * 0, -EINVAL (bytes not a multiple of granularity), -EIO (the text names
 * the failing driver call). */
int radiance__gpu_share_import_fd(int ordinal, int fd, size_t bytes, size_t granularity, int read_only,
				  struct radiance__gpu_import *imp);
/* Opens a legacy IPC handle on the current device (always read-write: the
 * API has no read-only mode). */
int radiance__gpu_share_import_ipc(const uint8_t ipc[RADIANCE__GPU_IPC_BYTES], size_t bytes,
				   struct radiance__gpu_import *imp);
void radiance__gpu_share_unimport(struct radiance__gpu_import *imp);

/* ----------------------------------------------------------- activations */

/* Per-token quantization of x [m][k] (dtype bf16/fp16 bits, device) to
 * e4m3 codes [m][k] and fp32 scales s [m], exactly as
 * radiance_quant_row_e4m3() (the same codes, bit for bit, in `order`).
 * k % 8 == 0 (k % 128 == 0 for the WGMMA order). */
int radiance__gpu_quant(const void *x, enum radiance_dtype dtype, uint32_t m, uint32_t k,
			enum radiance__codes_order order, uint8_t *codes, float *s, void *stream);

/* The same for rows stacked from several sources in one launch: source i
 * holds m[i] rows of k (device memory or the device address of registered
 * host memory, 16-byte aligned; read in place), and codes/s get the
 * sources' rows one after the other (row sum(m[0..i)) + r is source i's
 * row r). Up to RADIANCE__GPU_QUANT_SRC_MAX sources; -EINVAL for more, for
 * an unaligned source, or for k, dtype or order as above. Rows of up to
 * 48 KiB (k <= 24576) are read once (kernels/w4a8_quant.hip). */
#define RADIANCE__GPU_QUANT_SRC_MAX RADIANCE__GPU_ROWS_MAX
struct radiance__gpu_quant_src {
	uint32_t n;
	const void *x[RADIANCE__GPU_QUANT_SRC_MAX];
	uint32_t m[RADIANCE__GPU_QUANT_SRC_MAX];
};
int radiance__gpu_quant_rows(const struct radiance__gpu_quant_src *src, enum radiance_dtype dtype, uint32_t k,
			     enum radiance__codes_order order, uint8_t *codes, float *s, void *stream);

/* Natural-order e4m3 codes [m][k] (device, made by the caller) rewritten
 * into `order` for the kernels that read another one (the sm_90a wgmma
 * prefill reads RADIANCE_CODES_WGMMA: 4-byte words permuted within each
 * 128-code group, as radiance__gpu_quant writes them). in and out are
 * separate device buffers, 16-byte aligned; k % 128 == 0. 0 or -EINVAL
 * (another order, k, alignment), -EIO (the launch). */
int radiance__gpu_codes_reorder(const uint8_t *in, uint32_t m, uint32_t k, enum radiance__codes_order order,
				uint8_t *out, void *stream);

/* ---------------------------------------------------------- W4A8 weights */

/* Repack the canonical host layout (daemon/model.h), already copied to the
 * device (qweight uint32 [n][k/8], scales fp16 [n][k/128]), into the device
 * layout of kernels/numerics_gpu.h. k % 128 == 0. */
int radiance__w4a8_repack(const uint32_t *qweight, const uint16_t *scales, uint32_t n, uint32_t k,
			  void *w_dev, void *s_dev, void *stream);

/* y = bf16(codes * W^T per group * scale, * s, + bias). codes must be in the
 * order radiance__w4a8_plan gives for the same args. */
int radiance__w4a8_gemm(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
			void *stream);

/* ---------------------------------------------------------- bf16 layers */

/* fp16 x [m][k] -> bf16 hi [m][k] then lo [m][k] (x == hi + lo exactly). */
int radiance__gpu_split_f16(const uint16_t *x, uint32_t m, uint32_t k, uint16_t *hilo, void *stream);
/* y[r][j] = bf16(c[r][j] (+ c[r+m][j] when hilo) + bias[j]); c fp32 [m or 2m][n]. */
int radiance__gpu_bias_bf16(const float *c, uint32_t m, uint32_t n, int hilo, const float *bias,
			    uint16_t *y, void *stream);
/* Plain fp32 bf16 linear (the no-BLAS path): y = bf16(x W^T + bias). */
int radiance__gpu_bf16_portable(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
				const uint16_t *w, const float *bias, uint32_t n, uint32_t k,
				uint16_t *y, void *stream);

/* Vendor BLAS (cuBLAS / hipBLAS). -ENOTSUP when built without one. */
int radiance__blas_create(void **blas, void *stream, void *workspace, size_t workspace_bytes);
void radiance__blas_destroy(void *blas);
/* The stream later calls on the handle run on (cheap; no allocation). */
int radiance__blas_set_stream(void *blas, void *stream);
/* c fp32 [m][n] = x bf16 [m][k] * w bf16 [n][k]^T, fp32 compute. */
int radiance__blas_bf16_f32(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w,
			    uint32_t n, uint32_t k, float *c);
/* y bf16 [m][n] = x w^T straight to bf16 (the bench's vendor peer). */
int radiance__blas_bf16_bf16(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w,
			     uint32_t n, uint32_t k, uint16_t *y);

/* ------------------------------------------------------- one layer call */

/* A resident layer's device arrays (kernels/gpu_layer.hip). */
struct radiance__gpu_layer {
	int bf16;                  /* 0: W4A8 (w, sc from radiance__w4a8_repack); 1: bf16 w [n][k] */
	uint32_t n, k;
	const void *w, *sc;
	const float *bias;         /* fp32 [n] or NULL */
};

/* What radiance__gpu_layer_run needs besides the weights, allocated once
 * (radiance__gpu_scratch_create) for layers up to max_n x max_k and calls
 * of up to max_rows rows: e4m3 codes [max_rows][max_k] (rows rounded up to
 * 64), per-token scales, one fp32 buffer for split-K partials and bf16-layer
 * GEMM results, the split-K counters (zeroed at creation, left zeroed by
 * every launch), and for bf16 layers the fp16 hi/lo split and a BLAS handle
 * with its own 32 MiB workspace (the BLAS then never allocates). One
 * scratch serves one stream at a time: launches that use it must be
 * ordered (same stream, or events). */
struct radiance__gpu_scratch {
	uint32_t max_rows, max_decode_rows, max_n, max_k;
	uint8_t *codes;
	float *s;
	float *f32;
	size_t f32_bytes;
	uint32_t *counters;
	size_t counters_n;
	uint16_t *hilo;            /* bf16 layers: [2 * bf16_chunk][max_k] */
	void *blas, *blas_ws;      /* bf16 layers; blas NULL: the portable kernel */
	uint32_t bf16_chunk;       /* rows per bf16 GEMM (fp16 input: half of it) */
	uint64_t bytes;            /* device bytes allocated */
	struct radiance__w4a8_settings settings;   /* W4A8 kernel settings of every
	                              layer run on it (zeroed by create: the defaults) */
};

/* bf16_layers: also what bf16 layers need (hilo, BLAS). max_decode_rows 0
 * means 64 (and more is cut to 64). 0, -ENOMEM or -EIO (text in
 * radiance__gpu_last_error); on failure nothing stays allocated. */
int radiance__gpu_scratch_create(struct radiance__gpu_scratch *s, uint32_t max_rows, uint32_t max_decode_rows,
				 uint32_t max_n, uint32_t max_k, int bf16_layers, void *stream);
void radiance__gpu_scratch_destroy(struct radiance__gpu_scratch *s);

/* y [m][n] bf16 = l(x [m][k] of dtype): per-token quant + W4A8 GEMM (the
 * policy's path, PDL; for a few rows on sm_90 one launch, the GEMV
 * quantizing x itself: plan.fused), or BLAS bf16 GEMM + bias, on `stream`;
 * x and y are device pointers (x 16-byte aligned for the fused path, else it
 * takes the quant launch). m <= s->max_rows, l->n <= s->max_n, l->k <= s->max_k
 * (-E2BIG otherwise), dtype bf16 or fp16 (-EINVAL). Allocates nothing and
 * never synchronizes, so a CUDA graph can capture it. *path (may be NULL)
 * names what ran: "decode", "tiled", "wgmma", "wgmma-exact", "portable", "bf16-blas",
 * "bf16-portable". `force` is RADIANCE_W4A8_AUTO except in tests. */
int radiance__gpu_layer_run(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
			    const struct radiance__gpu_layer *l, const void *x, enum radiance_dtype dtype,
			    uint32_t m, uint16_t *y, void *stream, enum radiance__w4a8_path force, const char **path);

/* y [m][n] bf16 = l(codes, scales): the W4A8 GEMM of radiance__gpu_layer_run
 * on activations the caller already quantized, with no quant launch.
 * codes: e4m3 [m][k] in natural order (device, 16-byte aligned), scales:
 * fp32 [m] per-token (device, 4-byte aligned): row t of x is codes[t] x
 * scales[t], as radiance__gpu_quant makes them (docs/numerics.md); any
 * producer of that form will do (vLLM's per-token dynamic fp8 quant makes
 * it too). Both are only read. The policy's path as
 * radiance__gpu_layer_run; a path that reads the WGMMA order (the sm_90a
 * wgmma kernels: m > 32 there) first rewrites the codes into s->codes (one
 * small launch). -EINVAL for a bf16 layer or misaligned codes/scales, -E2BIG as
 * radiance__gpu_layer_run. Allocates nothing, never synchronizes. */
int radiance__gpu_layer_run_fp8(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
				const struct radiance__gpu_layer *l, const uint8_t *codes, const float *scales,
				uint32_t m, uint16_t *y, void *stream, enum radiance__w4a8_path force,
				const char **path);

/* y[j] [m][n_j] bf16 = l[j](x) for j < nl, layers of one K on one x [m][k]
 * (q, k and v; gate and up), on `stream` in order: the outputs of nl
 * radiance__gpu_layer_run calls with the policy's path, bit for bit. Where
 * every layer is W4A8, its plan reads the natural code order (on sm_90a
 * m <= 32; the wgmma kernels read the WGMMA order) and no GEMV would
 * quantize x itself, x is quantized once for all of them (one quant
 * launch, then nl GEMMs); otherwise each layer runs as
 * radiance__gpu_layer_run. x 16-byte aligned,
 * the y[j] distinct. 0, -EINVAL (nl 0 or above RADIANCE__GPU_SHARED_MAX,
 * layers of different K, dtype), -E2BIG as radiance__gpu_layer_run, -EIO;
 * everything is checked before the first launch. */
#define RADIANCE__GPU_SHARED_MAX 8
int radiance__gpu_layer_run_shared(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
				   const struct radiance__gpu_layer *const *l, uint32_t nl, const void *x,
				   enum radiance_dtype dtype, uint32_t m, uint16_t *const *y, void *stream);

/* Where a launch's stacked y rows go instead of one [m][n] buffer:
 * destination i gets the next m[i] rows, [m[i]][n] bf16 at y[i] (device
 * memory or the device address of registered host memory), in the order
 * of the rows of x. A destination 16 bytes aligned, with n % 8 == 0, gets
 * whole 16-byte stores. */
struct radiance__gpu_y_dst {
	uint32_t n;
	uint16_t *y[RADIANCE__GPU_ROWS_MAX];
	uint32_t m[RADIANCE__GPU_ROWS_MAX];
};

/* A W4A8 layer on rows stacked from several sources, each read in place
 * (radiance__gpu_quant_rows: device memory or the device address of
 * registered host memory, 16-byte aligned): y [sum m][n] bf16 as
 * radiance__gpu_layer_run, in one quant launch and the GEMM. With ydst
 * (NULL: y), the GEMM writes each destination's rows in place and y is
 * unused: sum of ydst->m equal to the rows of x, at most
 * RADIANCE_W4A8_Y_ROWS_MAX of them, and a path other than wgmma (the
 * decode band of radiance__w4a8_plan, or forced). -EINVAL for a bf16
 * layer, too many sources or destinations, destinations that do not add
 * up, or a wgmma launch with ydst; -E2BIG as radiance__gpu_layer_run. */
int radiance__gpu_layer_run_rows(const struct radiance__gpu_device *dev, struct radiance__gpu_scratch *s,
				 const struct radiance__gpu_layer *l, const struct radiance__gpu_quant_src *src,
				 enum radiance_dtype dtype, uint16_t *y, const struct radiance__gpu_y_dst *ydst,
				 void *stream, enum radiance__w4a8_path force, const char **path);

/* ----------------------------------------------------------------- bench */

/* Reads `bytes` (multiple of 16) of buf once, the way a perfect bandwidth-bound
 * kernel would; writes one word to sink so nothing is optimised away. */
int radiance__gpu_read_probe(const void *buf, size_t bytes, uint32_t *sink, void *stream);
/* Dequantize a device-layout W4A8 layer to bf16 [n][k] (for the BLAS peer). */
int radiance__w4a8_dequant_bf16(const void *w, const void *sc, uint32_t n, uint32_t k,
				uint16_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
