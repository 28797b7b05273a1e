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

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- runtime */

struct radiance__gpu_device {
	char name[128];          /* e.g. "NVIDIA H200", "AMD Radeon RX 9070 XT" */
	char vendor[8];          /* "cuda" or "hip" */
	int ordinal;
	int sm_count;            /* multiprocessors / compute units */
	int cc_major, cc_minor;  /* NVIDIA compute capability; AMD: gfx major/minor */
	uint64_t l2_bytes;
	uint64_t mem_bytes;
	int fp8_mma;             /* the matrix-core W4A8 kernels can run here */
	int wgmma;               /* the sm_90a wgmma prefill kernel is built and usable */
};

/* Selects device `ordinal` for the calling thread and describes it.
 * -ENODEV when there is no such device (or no driver). */
int radiance__gpu_init(int ordinal, struct radiance__gpu_device *dev);
const char *radiance__gpu_last_error(void);

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
int radiance__gpu_event_create(void **ev);
void radiance__gpu_event_destroy(void *ev);
int radiance__gpu_event_record(void *ev, void *stream);
/* Milliseconds between two recorded events (waits for `end`). */
int radiance__gpu_event_elapsed(void *start, void *end, float *ms);
/* Last error of an asynchronous launch (0 or -EIO). */
int radiance__gpu_check_launch(const char *what);

/* ----------------------------------------------------------- activations */

/* Where each code goes inside its row. NATURAL: codes[m][k] in k order, as
 * the CPU writes them. WGMMA (k % 128 == 0): within every 128-group, 4-byte
 * word t*8 + 2j + r (k = 32t + 8j + 4r .. +3) is stored at word 8j + 4r + t,
 * the order in which the sm_90a prefill's wgmma reads K from shared memory
 * so that it meets the weights' nibble order (numerics_gpu.h). */
enum radiance__codes_order {
	RADIANCE_CODES_NATURAL = 0,
	RADIANCE_CODES_WGMMA = 1,
};

/* Per-token quantization of x [m][k] (dtype bf16/fp16 bits, device) to
 * e4m3 codes [m][k] and fp32 scales s [m], exactly as
 * radiance_quant_row_e4m3() (the same codes, bit for bit, in `order`).
 * k % 8 == 0 (k % 128 == 0 for the WGMMA order). */
int radiance__gpu_quant(const void *x, enum radiance_dtype dtype, uint32_t m, uint32_t k,
			enum radiance__codes_order order, uint8_t *codes, float *s, void *stream);

/* ---------------------------------------------------------- W4A8 weights */

/* Bytes of the device weight and scale arrays of an n x k layer. */
size_t radiance__w4a8_weight_bytes(uint32_t n, uint32_t k);
size_t radiance__w4a8_scale_bytes(uint32_t n, uint32_t k);

/* Repack the canonical host layout (daemon/model.h), already copied to the
 * device (qweight uint32 [n][k/8], scales fp16 [n][k/128]), into the device
 * layout of kernels/numerics_gpu.h. k % 128 == 0. */
int radiance__w4a8_repack(const uint32_t *qweight, const uint16_t *scales, uint32_t n, uint32_t k,
			  void *w_dev, void *s_dev, void *stream);

enum radiance__w4a8_path {
	RADIANCE_W4A8_AUTO = 0,
	RADIANCE_W4A8_DECODE,      /* matrix-core, split-K, m <= 64 */
	RADIANCE_W4A8_TILED,       /* matrix-core, the decode kernel tiled over tokens, any m */
	RADIANCE_W4A8_WGMMA,       /* sm_90a wgmma prefill, any m */
	RADIANCE_W4A8_PORTABLE,    /* plain fp32 dot products, any GPU, any m */
};

/* The launch shape the policy picks (exposed for tests, bench and docs). */
struct radiance__w4a8_plan {
	enum radiance__w4a8_path path;
	enum radiance__codes_order order;   /* the codes this path reads */
	uint32_t tok;              /* tokens per warp tile (8..64) */
	uint32_t wk;               /* warps of a block splitting K (1,2,4,8) */
	uint32_t split;            /* blocks splitting K (global split-K) */
	uint32_t ntw;              /* decode: 0 the cp.async-ring kernel; else the
	                              bulk-copy streaming kernel with ntw n-tiles per warp */
	uint32_t stages;           /* streaming kernel: ring slots per warp */
	uint32_t cg;               /* streaming kernel: groups per ring slot */
};

struct radiance__w4a8_args {
	const uint8_t *codes;      /* [m][k] in the plan's order (radiance__gpu_quant) */
	const float *s;            /* [m] per-token scales */
	uint32_t m, n, k;
	const void *w, *sc;        /* device layout from radiance__w4a8_repack */
	const float *bias;         /* [n] fp32 or NULL */
	uint16_t *y;               /* [m][n] bf16 out; rows >= m never touched */
	float *partials;           /* split-K scratch (NULL: no global split) */
	size_t partials_bytes;
	uint32_t *counters;        /* zeroed once at allocation; left zeroed */
	size_t counters_n;
	enum radiance__w4a8_path path;   /* AUTO: decode for m <= max_decode_rows */
	uint32_t max_decode_rows;  /* 0 means 64 */
	uint32_t split;            /* 0: the policy; else force (bench/tests) */
	int pdl;                   /* launched right after radiance__gpu_quant on the
	                              same stream: let the GEMM start early and
	                              prefetch weights (programmatic dependent
	                              launch, sm_90; ignored elsewhere) */
};

/* The plan radiance__w4a8_gemm would use for these args on `dev`. */
void radiance__w4a8_plan(const struct radiance__gpu_device *dev,
			 const struct radiance__w4a8_args *a, struct radiance__w4a8_plan *plan);

/* Counters the split-K fixup needs for n outputs (one per 16-row block column). */
size_t radiance__w4a8_counters_needed(uint32_t n);
/* Partials bytes the policy may use for m rows of n outputs: the policy caps
 * split * m at RADIANCE_W4A8_SPLIT_ROWS. */
#define RADIANCE_W4A8_SPLIT_ROWS 256u
size_t radiance__w4a8_partials_bytes(uint32_t max_decode_rows, uint32_t max_n);

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
/* c fp32 [m][n] = x bf16 [m][k] * w bf16 [n][k]^T, fp32 compute. */
int radiance__blas_bf16_f32(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w,
			    uint32_t n, uint32_t k, float *c);
/* y bf16 [m][n] = x w^T straight to bf16 (the bench's vendor peer). */
int radiance__blas_bf16_bf16(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w,
			     uint32_t n, uint32_t k, uint16_t *y);

/* ----------------------------------------------------------------- bench */

/* Reads `bytes` (multiple of 16) of buf once, the way a perfect bandwidth-bound
 * kernel would; writes one word to sink so nothing is optimised away. */
int radiance__gpu_read_probe(const void *buf, size_t bytes, uint32_t *sink, void *stream);
/* Kernel variants for measurement: 0 the default (wgmma prefill tiles of 128
 * or 96 tokens, whichever fills the GPU); 1 always 128; 2 always 96 (also
 * RADIANCE_WGMMA=n96). Process-wide. */
void radiance__w4a8_set_variant(int variant);
/* Decode kernel override for measurement and tests (process-wide): kernel 0
 * the policy, 1 the cp.async-ring kernel, 2 the streaming kernel (sm_90, m <=
 * 16) with ntw n-tiles per warp, cg groups per ring slot and `stages` slots
 * (0: the policy's). */
void radiance__w4a8_set_decode(int kernel, uint32_t ntw, uint32_t cg, uint32_t stages);

/* Dequantize a device-layout W4A8 layer to bf16 [n][k] (for the BLAS peer). */
int radiance__w4a8_dequant_bf16(const void *w, const void *sc, uint32_t n, uint32_t k,
				uint16_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
