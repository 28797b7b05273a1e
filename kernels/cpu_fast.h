/*
 * The CPU backend's fast path: the numerics of kernels/numerics.h on SIMD
 * kernels (chosen once, at create, from what the CPU has) and a compute pool.
 * The scalar kernels of w4a8_cpu.h stay the reference it is tested against.
 *
 * Contract (tests/test_cpu_fast.c checks it, docs/numerics.md states it):
 * bit-exact with the scalar reference, radiance_cpu_w4a8() and
 * radiance_cpu_bf16(), for the levels scalar, avx2, avx512 and neon and every thread
 * count: the same fp32 operations in the same order (the kernels say how).
 * avx2-int16 keeps bf16 layers bit-exact and W4A8 within the bound that
 * docs/numerics.md states; its result of a row is the same bits for every M,
 * thread count and batch the row is in.
 *
 * Threading: a radiance_cpu_fast is used from one thread at a time (the
 * backend's executor thread); its pool threads are its own and are joined by
 * radiance_cpu_fast_destroy(). Nothing is allocated per call.
 */
#ifndef RADIANCE_CPU_FAST_H
#define RADIANCE_CPU_FAST_H

#include <stddef.h>
#include <stdint.h>

#include "numerics.h"

enum radiance_cpu_simd {
	RADIANCE_CPU_SIMD_AUTO = -1,   /* the best this CPU has: avx512, avx2, scalar on
	                                  x86-64; neon on aarch64 */
	RADIANCE_CPU_SIMD_SCALAR = 0,  /* the reference kernels, split by rows over threads */
	RADIANCE_CPU_SIMD_AVX2 = 1,    /* x86-64 AVX2 + FMA + F16C */
	/* The same CPUs; W4A8 group sums exact in 16-bit integer multiply-adds,
	 * rounded once: NOT bit-exact with the reference, within one bf16
	 * rounding plus the fp32 error of the group-scale sum (docs/numerics.md,
	 * "CPU fast path"). Only when asked for; AUTO never picks it. */
	RADIANCE_CPU_SIMD_AVX2_INT16 = 2,
	/* x86-64 with AVX-512 F, BW, VBMI and BF16 (e.g. Intel Sapphire Rapids,
	 * AMD Zen 4): W4A8 on bf16 dot products, bit-exact with the reference
	 * like avx2 (checked on the CPU at hand before it is used, see
	 * radiance_cpu_fast_create); bf16 layers as avx2. */
	RADIANCE_CPU_SIMD_AVX512 = 3,
	/* aarch64 Advanced SIMD (every AArch64 Linux machine has it): W4A8 and
	 * bf16 layers bit-exact with the reference, as avx2. Tested under
	 * qemu-aarch64 only (tests/test_cpu_neon.sh): never run on ARM hardware. */
	RADIANCE_CPU_SIMD_NEON = 4,
};

struct radiance_cpu_fast_options {
	unsigned threads;              /* threads in all, caller included; 0: all this process
	                                  may use (radiance_cpu_usable_threads()) */
	enum radiance_cpu_simd simd;   /* AUTO, or a level to insist on (-ENOTSUP if absent) */
	uint32_t max_rows;             /* largest m of one call (>= 1) */
	uint32_t max_k;                /* largest k of one call (>= 1) */
};

struct radiance_cpu_fast;

/* Picks the SIMD level (opt->simd: AUTO, or the level the daemon's cpu_simd
 * option asks for), starts the pool and allocates the activation scratch
 * for max_rows x max_k. 0, -EINVAL (zero max_rows/max_k, a level this build
 * does not know), -ENOTSUP (the level is not on this CPU, or avx512's
 * known-answer check gave other bits than the reference here: AUTO then
 * takes avx2 and radiance_cpu_fast_simd_note() says why), -ENOMEM, or a
 * pthread_create error; err names the cause. */
int radiance_cpu_fast_create(const struct radiance_cpu_fast_options *opt,
			     struct radiance_cpu_fast **out, char *err, size_t errlen);
/* Bytes of activation scratch radiance_cpu_fast_create() allocates for opt
 * (resolving AUTO and threads 0 as it does); 0 when it would refuse opt. */
size_t radiance_cpu_fast_scratch_bytes_for(const struct radiance_cpu_fast_options *opt);

/* Joins the pool threads and frees everything. NULL is a no-op. */
void radiance_cpu_fast_destroy(struct radiance_cpu_fast *f);

enum radiance_cpu_simd radiance_cpu_fast_simd(const struct radiance_cpu_fast *f);
/* "scalar", "avx2+fma", "avx2-int16", "avx512+bf16", "neon" */
const char *radiance_cpu_simd_name(enum radiance_cpu_simd simd);
/* Why AUTO did not take a better level than the one it picked ("" when
 * nothing was passed over; e.g. the avx512 known-answer check failed).
 * Static string. */
const char *radiance_cpu_fast_simd_note(const struct radiance_cpu_fast *f);
unsigned radiance_cpu_fast_threads(const struct radiance_cpu_fast *f);
/* What set the thread count: "cpu_threads" (asked for), or the auto source
 * ("sched_getaffinity", "cgroup cpu.max"). Static string. */
const char *radiance_cpu_fast_threads_source(const struct radiance_cpu_fast *f);
size_t radiance_cpu_fast_scratch_bytes(const struct radiance_cpu_fast *f);

/* W4A8 linear, as radiance_cpu_w4a8(): x [m][k] bf16/fp16 bits, qweight
 * uint32 [n][k/8], scales fp16 [n][k/128], bias fp32 [n] or NULL, y bf16
 * [m][n]. k a multiple of 128. 0, or -E2BIG when m > max_rows or k > max_k,
 * -EINVAL for k not a multiple of 128 (nothing written then). */
int radiance_cpu_fast_w4a8(struct radiance_cpu_fast *f, const uint16_t *x, enum radiance_dtype dtype,
			   uint32_t m, const uint32_t *qweight, const uint16_t *scales,
			   const float *bias, uint32_t n, uint32_t k, uint16_t *y);

/* One W4A8 layer of radiance_cpu_fast_w4a8_multi(). */
struct radiance_cpu_fast_w4a8_layer {
	const uint32_t *qweight;       /* uint32 [n][k/8] */
	const uint16_t *scales;        /* fp16 [n][k/128] */
	const float *bias;             /* fp32 [n] or NULL */
	uint32_t n;
	uint16_t *y;                   /* bf16 [m][n] */
};

/* Several W4A8 layers of one K on the same x: each y as
 * radiance_cpu_fast_w4a8() gives it, bit for bit, with x quantized once
 * for all of them on the SIMD level (the scalar level runs the reference
 * per layer). Errors as radiance_cpu_fast_w4a8 (nothing written then). */
int radiance_cpu_fast_w4a8_multi(struct radiance_cpu_fast *f, const uint16_t *x,
				 enum radiance_dtype dtype, uint32_t m, uint32_t k,
				 const struct radiance_cpu_fast_w4a8_layer *layers, size_t nlayers);

/* bf16 linear, as radiance_cpu_bf16(): weight bf16 [n][k], any k. 0 or -E2BIG. */
int radiance_cpu_fast_bf16(struct radiance_cpu_fast *f, const uint16_t *x, enum radiance_dtype dtype,
			   uint32_t m, const uint16_t *weight, const float *bias, uint32_t n,
			   uint32_t k, uint16_t *y);

#endif
