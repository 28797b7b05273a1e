/*
 * The W4A8 launch planner: which kernel, token tile, K split and ring shape
 * a GEMM of m x n x k gets on a device (kernels/w4a8_plan.c). Plain C with
 * no vendor header, so the CPU build compiles and tests it
 * (tests/test_plan.c); the GPU dispatcher (kernels/w4a8_launch.hip) runs
 * what it returns. Also the types every W4A8 caller shares: the device
 * description, the launch arguments, the settings (docs/daemon.md options
 * prefill and wgmma_tile) and the sizes of the device arrays.
 *
 * Thread safety: every function here is pure (reads its arguments only),
 * except what the device's gemv_blocks callback does (the GPU's is
 * thread-safe and caches its answers).
 */
#ifndef RADIANCE_W4A8_PLAN_H
#define RADIANCE_W4A8_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "numerics.h"   /* enum radiance_dtype */

#ifdef __cplusplus
extern "C" {
#endif

/* The streaming decode kernel's instances (tokens per tile, n-tiles per
 * warp, groups per ring slot), in the order of their index; the planner
 * and kernels/w4a8_gemv.hip both expand this list. */
#define RADIANCE_W4A8_GEMV_INSTANCES(X)                                                            \
	X(8, 1, 1) X(8, 1, 2) X(8, 1, 4) X(8, 2, 1) X(8, 2, 2) X(8, 4, 1) X(16, 1, 1) X(16, 1, 2)   \
	X(16, 1, 4) X(16, 2, 1) X(16, 2, 2) X(32, 1, 2) X(32, 2, 2) X(64, 1, 2)
#define RADIANCE_W4A8_GEMV_NINST 14u
#define RADIANCE_W4A8_GEMV_MAX_STAGES 8u   /* ring slots per warp, at most */
#define RADIANCE_W4A8_GEMV_WARPS 4u        /* warps per block of the streaming kernel */
/* A streaming-kernel ring slot holds ntw x cg tile-groups of 1 KiB weights
 * and 32 B scales. Warps splitting K (wk > 1) add their fp32 partials,
 * [ntw][tok / 8][4] a lane, through their rings: a plan of wk > 1 needs
 * stages slots that hold them (the planner adds slots, the launch refuses
 * a plan without). */
#define RADIANCE_W4A8_GEMV_SLOT_BYTES(ntw, cg) ((uint32_t)(ntw) * (cg) * 1056u)
#define RADIANCE_W4A8_GEMV_PARTIAL_BYTES(ntw, tok) ((uint32_t)(ntw) * ((tok) / 8u) * 4u * 32u * 4u)
#define RADIANCE_W4A8_GEMV_RING_HOLDS_PARTIALS(ntw, cg, tok, stages) \
	((uint32_t)(stages) * RADIANCE_W4A8_GEMV_SLOT_BYTES(ntw, cg) >= RADIANCE_W4A8_GEMV_PARTIAL_BYTES(ntw, tok))
#define RADIANCE_W4A8_GEMM_WARPS 8u        /* warps per block of the matrix-core kernel */

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
	/* Resident blocks per SM of streaming-kernel instance `inst` (an index
	 * of RADIANCE_W4A8_GEMV_INSTANCES) with a ring of `stages` slots, 0 when
	 * none fit; NULL where that kernel is not built (AMD). Set by
	 * radiance__gpu_init (the vendor's occupancy calculator). */
	int (*gemv_blocks)(unsigned inst, uint32_t stages);
};

/* Where each code goes inside its row. NATURAL: codes[m][k] in k order, as
 * the CPU writes them. WGMMA (k % 128 == 0): within every 128-group, 4-byte
 * word t*8 + 2j + r (k = 32t + 8j + 4r .. +3) is stored at word 8j + 4r + t,
 * the order in which the sm_90a prefill's wgmma reads K from shared memory
 * so that it meets the weights' nibble order (numerics_gpu.h). */
enum radiance__codes_order {
	RADIANCE_CODES_NATURAL = 0,
	RADIANCE_CODES_WGMMA = 1,
};

enum radiance__w4a8_path {
	RADIANCE_W4A8_AUTO = 0,
	RADIANCE_W4A8_DECODE,      /* matrix-core, split-K, m <= 64 */
	RADIANCE_W4A8_TILED,       /* matrix-core, the decode kernel tiled over tokens, any m */
	RADIANCE_W4A8_WGMMA,       /* sm_90a wgmma prefill, any m */
	RADIANCE_W4A8_PORTABLE,    /* plain fp32 dot products, any GPU, any m */
	RADIANCE_W4A8_WGMMA_EXACT, /* sm_90a f16 wgmma, fp32 accumulation, split-K, any m: the
	                              band m = 33..64 and exact prefill where wgmma is built */
};

/* Prefill (m above the decode band) on a device with both kernels. */
enum radiance__w4a8_prefill {
	RADIANCE_PREFILL_EXACT = 0,  /* f16 tensor cores, fp32 accumulation: f16 wgmma on
	                                sm_90a, the tiled path elsewhere */
	RADIANCE_PREFILL_FAST = 1,   /* fp8 wgmma (sm_90a), Hopper's truncating accumulation:
	                                the bound of docs/numerics.md "Contract" */
};

/* Kernel settings: the daemon's options (daemon/config.c: prefill,
 * wgmma_tile), tests and bench. A zeroed struct is the default. */
struct radiance__w4a8_settings {
	enum radiance__w4a8_prefill prefill;
	uint32_t wgmma_tile;       /* wgmma token tile: 0 the policy (128, or 96 when 128
	                              leaves SMs idle), 128 or 96 */
	/* decode overrides, for measurement and tests: decode_kernel 0 the
	 * policy, 1 the cp.async-ring kernel, 2 the streaming kernel (sm_90,
	 * m <= 16; forced, m <= 64 on path DECODE) with decode_ntw n-tiles per warp, decode_cg groups per slot
	 * and decode_stages slots (each 0: the policy's) */
	int decode_kernel;
	uint32_t decode_ntw, decode_cg, decode_stages;
	/* the streaming kernel's warps of a block splitting K: 1, 2 or 4 (0:
	 * the policy's); fewer where the K range is too short, and 1 where the
	 * kernel quantizes x itself (decode_fuse_rows) */
	uint32_t decode_wk;
	/* the streaming kernel quantizes args.x itself for m <= this many rows
	 * (0: the policy's RADIANCE_W4A8_FUSE_ROWS, which is off; -1: never; at
	 * most RADIANCE_W4A8_FUSE_MAX_ROWS) */
	int decode_fuse_rows;
};

/* Fused quant (docs/gpu.md "Fused quant"): the streaming decode kernel
 * quantizes its own activations, every block the whole row for the amax and
 * its K range for the codes, in shared memory; never for more than MAX rows
 * and only while the codes of a block's K range fit RADIANCE_W4A8_FUSE_SMEM
 * bytes. Off by default (ROWS 0: it made the H200's decode step slower);
 * settings.decode_fuse_rows turns it on. */
#define RADIANCE_W4A8_FUSE_ROWS 0
#define RADIANCE_W4A8_FUSE_MAX_ROWS 4
#define RADIANCE_W4A8_FUSE_SMEM 8192u

/* The launch shape the policy picks (exposed for tests, bench and docs). */
struct radiance__w4a8_plan {
	enum radiance__w4a8_path path;
	enum radiance__codes_order order;   /* the codes this path reads */
	uint32_t tok;              /* tokens per warp tile (8..64); wgmma: per block (128 or 96;
	                              wgmma-exact 64 or 128) */
	uint32_t wk;               /* warps of a block splitting K (1,2,4,8; streaming
	                              kernel 1,2,4: partials added in shared memory) */
	uint32_t split;            /* blocks splitting K (global split-K) */
	uint32_t ntw;              /* decode: 0 the cp.async-ring kernel; else the
	                              bulk-copy streaming kernel with ntw n-tiles per warp */
	uint32_t stages;           /* streaming kernel: ring slots per warp */
	uint32_t cg;               /* streaming kernel: groups per ring slot */
	uint32_t fused;            /* streaming kernel: it quantizes args.x itself (the
	                              caller runs no quant; codes and s untouched) */
};

struct radiance__w4a8_args {
	const uint8_t *codes;      /* [m][k] in the plan's order (radiance__gpu_quant) */
	const float *s;            /* [m] per-token scales */
	const void *x;             /* NULL, or the activations the codes come from:
	                              [m][k] x_dtype (bf16/fp16) in device memory,
	                              16-byte aligned; where the plan says fused the
	                              GEMM reads these instead of codes and s */
	enum radiance_dtype x_dtype;
	uint32_t m, n, k;
	const void *w, *sc;        /* device layout from radiance__w4a8_repack */
	const float *bias;         /* [n] fp32 or NULL */
	uint16_t *y;               /* [m][n] bf16 out; rows >= m never touched */
	uint16_t *const *y_rows;   /* NULL: row t of y at y + t*n. Else m (at most
	                              RADIANCE_W4A8_Y_ROWS_MAX) device addresses, host
	                              array read at the call: row t (n bf16) at y_rows[t],
	                              y unused; not for the WGMMA path (-EINVAL; WGMMA_EXACT
	                              takes them) */
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
	const struct radiance__w4a8_settings *settings;   /* NULL: the defaults */
};

/* Rows a launch with per-row y destinations (radiance__w4a8_args.y_rows)
 * may have: the decode band's largest M. */
#define RADIANCE_W4A8_Y_ROWS_MAX 64u

/* The plan radiance__w4a8_gemm uses for these args on `dev`. A path that
 * cannot run them (wgmma or wgmma-exact where it is not built: tiled; decode for m > 64, matrix
 * cores without fp8 support) falls back to one that can. 0, or -EINVAL (plan
 * untouched) for a launch no kernel takes: m, n or k zero, or k not a
 * multiple of the 128-group (radiance__w4a8_gemm returns 0 for m = 0 before
 * asking). */
int radiance__w4a8_plan(const struct radiance__gpu_device *dev,
			 const struct radiance__w4a8_args *a, struct radiance__w4a8_plan *plan);

/* The prefill kernel a request for `asked` gets on dev: 0 auto, 1 exact,
 * 2 fast, in the order of the daemon's `prefill` option (enum
 * radiance_backend_prefill) and radiance_gpu_options.prefill. FAST where
 * auto or fast is asked and the sm_90a wgmma kernel runs on dev, else EXACT
 * (the planner runs exact there anyway). One policy for the daemon, the
 * mapping library and the bench, so that they give the same bits. */
enum radiance__w4a8_prefill radiance__w4a8_prefill_choose(const struct radiance__gpu_device *dev,
							    unsigned asked);

/* The name of a path as the logs, the bench and the tests print it:
 * "auto", "decode", "tiled", "wgmma", "portable", "wgmma-exact"; "?" for a
 * value outside the enum. Static storage. */
const char *radiance__w4a8_path_name(enum radiance__w4a8_path path);

/* A plan as the bench's results files print it (their `plan` column):
 * "gemv t8 n2 c2 q2 s1 w4" for the streaming kernel (token tile, n-tiles a
 * warp, groups a slot, slots, split, and warps splitting K where more than
 * one), "decode t32 wk1 s2" / "tiled t64 wk1 s1" for the matrix-core kernel
 * (token tile, warps splitting K, split), "wgmma t128", "wgmma-exact t64 s3",
 * else the path name. At most len bytes, NUL-terminated; returns buf. */
char *radiance__w4a8_plan_format(char *buf, size_t len, const struct radiance__w4a8_plan *plan);

/* Bytes of the device weight and scale arrays of an n x k layer (k % 128 == 0). */
size_t radiance__w4a8_weight_bytes(uint32_t n, uint32_t k);
size_t radiance__w4a8_scale_bytes(uint32_t n, uint32_t k);
/* Counters the split-K fixup needs for n outputs (one per 16-row block column). */
size_t radiance__w4a8_counters_needed(uint32_t n);
/* Partials bytes the policy may use for m rows of n outputs: the policy caps
 * split * m at RADIANCE_W4A8_SPLIT_ROWS. */
#define RADIANCE_W4A8_SPLIT_ROWS 256u
size_t radiance__w4a8_partials_bytes(uint32_t max_decode_rows, uint32_t max_n);

#ifdef __cplusplus
}
#endif

#endif
