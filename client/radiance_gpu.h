/*
 * libradiance-gpu: run a resident model's layers in the caller's own GPU
 * process, on the daemon's one copy of the weights (docs/mapped.md).
 *
 * An inference engine whose activations live in device memory pays, per
 * layer call through the rings, a copy out, a copy in, the daemon's launch,
 * a copy back and a cross-process round trip. Mapped, it imports the
 * daemon's device allocation of the model once (radiance_gpu_map) and
 * launches the same W4A8 kernels the daemon uses on its own stream
 * (radiance_gpu_linear): no copy, no round trip, no daemon in the loop.
 *
 * Built with make GPU=cuda (NVIDIA) or GPU=hip (AMD); link with
 * `pkg-config --cflags --libs radiance-gpu` (which brings libradiance).
 * The device buffers, pointers and streams below are the vendor runtime's
 * (CUDA or HIP) of the device that holds the model.
 *
 * Tensors, as radiance.h: x [rows][K] bf16 or fp16 bits, y [rows][N] bf16,
 * row-major, here in device memory of the model's device. Numerics are the
 * daemon's (docs/numerics.md): the same kernels, the same launch policy.
 *
 * Errors: 0 or a negative errno; radiance_gpu_error_message() has the text
 * of the last failure on the calling thread.
 *
 * Thread safety: a struct radiance_gpu_model is not thread-safe, and its
 * scratch serves one stream at a time: calls on it must be ordered on one
 * stream (or ordered across streams by the caller's events). Map once per
 * stream that runs layers concurrently; the weights are not duplicated by
 * that, only the scratch.
 */
#ifndef RADIANCE_GPU_H
#define RADIANCE_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "radiance.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is the library's interface; the library is built
 * with -fvisibility=hidden, so this is what it exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

struct radiance_gpu_model;   /* a mapped model; opaque */

struct radiance_gpu_options {
	uint32_t size;           /* sizeof(struct radiance_gpu_options) */
	uint32_t max_rows;       /* largest rows of one radiance_gpu_linear call;
	                            sizes the scratch; 0 = 64 */
	uint32_t prefill;        /* the W4A8 kernel above the decode band (more than
	                            64 rows), as the daemon's `prefill` option
	                            (docs/daemon.md): RADIANCE_GPU_PREFILL_AUTO (0,
	                            the daemon's default: fp8 wgmma where it runs,
	                            sm_90a; f16 tensor cores elsewhere), _EXACT, _FAST.
	                            Results equal the daemon's bit for bit when both
	                            use the same kernel. Fields past `size` read 0. */
};

#define RADIANCE_GPU_PREFILL_AUTO 0u
#define RADIANCE_GPU_PREFILL_EXACT 1u
#define RADIANCE_GPU_PREFILL_FAST 2u

#define RADIANCE_GPU_OPTIONS_INIT { .size = sizeof(struct radiance_gpu_options) }

/* Maps model_id, which session r holds (radiance_load_model /
 * radiance_attach_model), into this process: asks the daemon for the
 * model's allocation (radiance_map_model), finds the device by its PCI bus
 * id (whatever CUDA_VISIBLE_DEVICES this process has), imports it there
 * read-only (VMM; a legacy IPC handle, the fallback where the GPU has no
 * VMM, is mapped read-write: the API has no read-only mode), and allocates
 * the scratch the kernels need, once, for layers up to the model's largest
 * N x K and opt->max_rows rows (radiance_gpu_get_info says how much).
 * Nothing is allocated later. opt may be NULL.
 *
 * Runs in the caller's context: the thread's current device is changed for
 * the duration of the call and restored. The model's device must be visible
 * to this process.
 *
 * The session counts as mapping the model until radiance_gpu_unmap(): the
 * daemon keeps it resident and refuses radiance_release_model() of it. If
 * the session ends first (disconnect, the daemon gone), the memory this
 * process mapped stays valid (VMM memory lives while any process maps it;
 * for IPC handles the vendors do not say), but it is outside the daemon's
 * accounting: unmap before disconnecting.
 * Returns 0 and *out, or:
 *   -EINVAL   opt->size too small, opt->prefill not one of RADIANCE_GPU_PREFILL_*;
 *   -ENOTSUP  the daemon cannot map the model (cpu backend, no VMM/IPC, an
 *             older daemon, another layout version), or the mapping is for
 *             another vendor's kernels, or a test handle;
 *   -ENODEV   the model's device is not visible here;
 *   -ENOENT   the session holds no model_id;
 *   -EINVAL   opt->size too small;
 *   -EIO      importing or mapping failed (the driver's message);
 *   -ENOMEM, or what radiance_map_model returns. */
int radiance_gpu_map(struct radiance *r, uint32_t model_id, const struct radiance_gpu_options *opt,
		     struct radiance_gpu_model **out);

/* y = layer(x): per-token e4m3 quantization and the W4A8 GEMM (int4 weights,
 * fp32 accumulation, one bf16 rounding, + bias), or for bf16 layers the
 * vendor BLAS GEMM, enqueued on `stream` (a cudaStream_t / hipStream_t of
 * the model's device, NULL: the legacy default stream). Asynchronous:
 * returns once enqueued; y is written when the stream gets there.
 *   layer   the layer's index (radiance_layer_info.index);
 *   x       device pointer to [rows][K] of dtype, 16-byte aligned;
 *   y       device pointer to [rows][N] bf16, 16-byte aligned, not
 *           overlapping x;
 *   rows    1..max_rows of the map options.
 * The calling thread's current device must be the model's
 * (radiance_gpu_get_info().device). Allocates nothing and never
 * synchronizes, so it may be captured in a CUDA graph. Returns 0, or
 * -ENOENT (layer out of range, as radiance_submit), -EINVAL (rows 0, dtype, misaligned x/y),
 * -E2BIG (rows above max_rows), -EIO (a launch failed; the vendor's text). */
int radiance_gpu_linear(struct radiance_gpu_model *g, uint32_t layer, const void *x, void *y, uint32_t rows,
			enum radiance_elem dtype, void *stream);

/* y = layer(codes, scales) for a W4A8 layer whose activations the caller
 * has already quantized (an engine that fuses the per-token fp8 quant into
 * the kernel that makes x, e.g. its RMSNorm): the GEMM of radiance_gpu_linear
 * with no quant launch before it. The same kernels and policy; given the
 * codes and scales radiance_gpu_linear would make from x, y is the same,
 * bit for bit.
 *   codes   device pointer to [rows][K] e4m3 (OCP FP8 E4M3, as numerics.h),
 *           row-major in natural K order, 16-byte aligned;
 *   scales  device pointer to [rows] fp32 per-token scales: row t stands for
 *           codes[t] x scales[t] (docs/numerics.md "Activations": ours are
 *           s = amax / 448, x * (1/s) rounded once to e4m3, the form of
 *           vLLM's per-token dynamic fp8 quant); 4-byte aligned;
 *   y       device pointer to [rows][N] bf16, 16-byte aligned, overlapping
 *           neither;
 *   rows    1..max_rows of the map options.
 * codes and scales are only read, and only by the launches enqueued here:
 * keep them unchanged until the stream has run them. Launches the sm_90a
 * wgmma kernels take (rows above 32 there) first get the codes rewritten
 * into the mapping's scratch (one small launch); the others read them in
 * place. Current device, allocation and capture as
 * radiance_gpu_linear. Returns 0, or -ENOENT (layer out of range), -EINVAL
 * (a bf16 layer: use radiance_gpu_linear; rows 0; misaligned codes, scales
 * or y), -E2BIG (rows above max_rows), -EIO (a launch failed; the vendor's
 * text). Since RADIANCE_GPU_1 of the version script. */
int radiance_gpu_linear_fp8(struct radiance_gpu_model *g, uint32_t layer, const void *codes, const float *scales,
			    void *y, uint32_t rows, void *stream);

/* y[j] = layers[j](x) for j < nlayers, enqueued on `stream` in that order:
 * the several-layer form of radiance_gpu_linear (q, k and v; gate and up)
 * on one x, with the outputs of nlayers radiance_gpu_linear calls, bit for
 * bit. Where every layer is W4A8 and its kernel reads the codes in natural
 * order (on sm_90a up to 32 rows; every row count where no wgmma kernel
 * runs), x is quantized once for all the layers: one quant launch and
 * nlayers GEMMs instead of nlayers of each. Otherwise (more rows on sm_90a,
 * a bf16 layer among them) the layers run one after another as
 * radiance_gpu_linear calls.
 *   layers   [nlayers] layer indexes, distinct, all of one K;
 *            nlayers 1..RADIANCE_MAX_LAYERS_PER_REQUEST;
 *   x        device pointer to [rows][K] of dtype, 16-byte aligned;
 *   y        [nlayers] device pointers, y[j] to [rows][N_j] bf16 of layer
 *            layers[j], 16-byte aligned, overlapping neither x nor each
 *            other (not checked: device memory);
 * the host arrays layers and y are read during the call only. The rest as
 * radiance_gpu_linear (stream, current device, no allocation, capturable).
 * Everything is checked before anything is enqueued. Returns 0, or
 * -EINVAL (nlayers 0 or above the limit, NULL arrays, a layer named twice,
 * layers of different K: the message names them with their K; and as
 * radiance_gpu_linear), -ENOENT (layers[j] out of range: the message says
 * which j), -E2BIG, -EIO as radiance_gpu_linear; after -EIO the layers
 * before the failing one may have been enqueued. */
int radiance_gpu_linear_multi(struct radiance_gpu_model *g, const uint32_t *layers, uint32_t nlayers,
			      const void *x, void *const *y, uint32_t rows, enum radiance_elem dtype,
			      void *stream);

struct radiance_gpu_info {
	uint32_t model_id;
	int device;              /* the device's ordinal in this process */
	const char *handle;      /* "vmm" or "ipc" */
	bool read_only;          /* the mapping is read-only in this process */
	uint64_t mapped_bytes;   /* the model's allocation, mapped, not copied */
	uint64_t scratch_bytes;  /* device memory this mapping allocated itself */
	uint32_t max_rows;
	size_t n_layers;
};

/* Fills *info; strings owned by g. */
void radiance_gpu_get_info(const struct radiance_gpu_model *g, struct radiance_gpu_info *info);

/* Unmaps g (its scratch too) and, when r is not NULL, tells the daemon
 * (radiance_unmap_model). No work using g may be pending: synchronize the
 * streams that ran it first. Returns 0 or radiance_unmap_model's error
 * (g is freed in every case). NULL g is a no-op. */
int radiance_gpu_unmap(struct radiance *r, struct radiance_gpu_model *g);

/* Text of the last failure of a radiance_gpu_* call on this thread ("" if
 * none). Thread-local storage, valid until the next call on this thread. */
const char *radiance_gpu_error_message(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
