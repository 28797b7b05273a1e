/*
 * The CPU backend's kernels: the numerics of kernels/numerics.h, written
 * plainly. They are the reference the GPU kernels are checked against, and
 * they serve requests where there is no GPU.
 *
 * Layouts are the canonical host layouts of daemon/model.h. All functions are
 * reentrant and thread-safe (no global state) and allocate nothing on the
 * heap; radiance_cpu_w4a8() takes a caller-provided scratch.
 */
#ifndef RADIANCE_W4A8_CPU_H
#define RADIANCE_W4A8_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "numerics.h"

/* Per-token quantization of one row, as vLLM's dynamic per-token fp8 quant.
 * x: k elements of `dtype` (bf16 or fp16 bits). codes: k e4m3 bytes out.
 * Returns s_m (fp32); NaN for a row holding Inf or NaN (codes all 0x7F). */
float radiance_quant_row_e4m3(const uint16_t *x, enum radiance_dtype dtype, uint32_t k,
			      uint8_t *codes);

/* W4A8 GEMM on already-quantized rows.
 *   codes   e4m3 [m][k], s fp32 [m] (from radiance_quant_row_e4m3)
 *   qweight uint32 [n][k/8], scales fp16 [n][k/128], bias fp32 [n] or NULL
 *   y       bf16 [m][n] out
 * k must be a multiple of 128. */
void radiance_cpu_w4a8_gemm(const uint8_t *codes, const float *s, uint32_t m,
			    const uint32_t *qweight, const uint16_t *scales, const float *bias,
			    uint32_t n, uint32_t k, uint16_t *y);

/* Bytes of scratch radiance_cpu_w4a8() needs for m rows of k inputs. */
size_t radiance_cpu_w4a8_scratch_bytes(uint32_t m, uint32_t k);

/* The whole W4A8 linear: quantize x [m][k] (bf16/fp16) per token, GEMM, bf16
 * y [m][n]. scratch: radiance_cpu_w4a8_scratch_bytes(m, k) bytes, 16-byte
 * aligned, owned by the caller. */
void radiance_cpu_w4a8(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
		       const uint32_t *qweight, const uint16_t *scales, const float *bias,
		       uint32_t n, uint32_t k, uint16_t *y, void *scratch);

/* bf16 linear: x [m][k] bf16/fp16, weight bf16 [n][k], bias fp32 [n] or NULL,
 * fp32 accumulate, y bf16 [m][n] (RNE). */
void radiance_cpu_bf16(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
		       const uint16_t *weight, const float *bias, uint32_t n, uint32_t k,
		       uint16_t *y);

#endif
