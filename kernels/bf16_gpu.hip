/*
 * bf16 linears (layers the checkpoint keeps at 16 bits): numerics.h defines
 * them as fp32 accumulation of x * w, + bias, rounded once to bf16. The
 * vendor BLAS (gpu_blas.hip) does the GEMM with bf16 operands and an fp32
 * result; the small kernels here make that exact for fp16 activations and
 * add the bias before the single rounding.
 *
 * fp16 activations: a BLAS GEMM wants both operands in one type, and fp16
 * does not fit bf16. But an fp16 value has 11 significant bits, so it is
 * exactly hi + lo with hi its bf16 truncation and lo the (at most 3-bit)
 * remainder, both bf16. Stacking [hi; lo] as 2m rows gives two exact fp32
 * product sets from one GEMM; the epilogue adds row r and row r + m.
 */
#include <errno.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

__global__ void rad_split_f16(const uint16_t *x, size_t count, uint16_t *hilo)
{
	RAD_NO_CONTRACT
	const size_t i = (size_t)RAD_BID_X() * 256 + RAD_TID();
	if (i >= count)
		return;
	const float f = rad_f16_to_f32(x[i]);
	uint32_t hb = rad_f32_bits(f) & 0xFFFF0000u;
	uint32_t lo = 0;
	if ((rad_f32_bits(f) & 0x7F800000u) != 0x7F800000u)   /* Inf/NaN: all in hi */
		lo = rad_f32_bits(RAD_FADD(f, -rad_bits_f32(hb))) >> 16;
	else if (rad_f32_bits(f) & 0x007FFFFFu)
		/* NaN: an fp16 NaN whose payload is only in its low 3 bits
		 * (0x7C01..0x7C07) has all of it in the truncated half, and hi
		 * alone would be Inf; keep it a NaN, quiet, as numerics.h
		 * radiance_bf16_from_f32 does */
		hb |= 0x00400000u;
	hilo[i] = (uint16_t)(hb >> 16);
	hilo[count + i] = (uint16_t)lo;
}

__global__ void rad_bias_bf16(const float *c, uint32_t m, uint32_t n, int hilo, const float *bias, uint16_t *y)
{
	RAD_NO_CONTRACT
	const size_t i = (size_t)RAD_BID_X() * 256 + RAD_TID();
	if (i >= (size_t)m * n)
		return;
	float v = c[i];
	if (hilo)
		v = RAD_FADD(v, c[(size_t)m * n + i]);
	const float b = bias ? bias[i % n] : 0.0f;
	y[i] = (uint16_t)rad_bf16_from_f32(RAD_FADD(v, b));
}

/* The no-BLAS path, and a bit-exact mirror of radiance_cpu_bf16. */
__global__ void __launch_bounds__(256) rad_bf16_portable(const uint16_t *x, int fp16, uint32_t m, const uint16_t *w,
							  const float *bias, uint32_t n, uint32_t k, uint16_t *y)
{
	RAD_NO_CONTRACT
	const uint32_t j = RAD_BID_X() * 256 + RAD_TID(), r = RAD_BID_Y();
	if (j >= n)
		return;
	const uint16_t *xr = x + (size_t)r * k, *wr = w + (size_t)j * k;
	float acc = 0.f;
	for (uint32_t t = 0; t < k; t++) {
		const float xv = fp16 ? rad_f16_to_f32(xr[t]) : rad_bf16_to_f32(xr[t]);
		acc = RAD_FADD(acc, RAD_FMUL(xv, rad_bf16_to_f32(wr[t])));
	}
	y[(size_t)r * n + j] = (uint16_t)rad_bf16_from_f32(RAD_FADD(acc, bias ? bias[j] : 0.0f));
}

static unsigned blocks_for(size_t count) { return (unsigned)((count + 255) / 256); }

extern "C" int radiance__gpu_bf16_preload(unsigned *count)
{
	RAD_PRELOAD(rad_split_f16, count);
	RAD_PRELOAD(rad_bias_bf16, count);
	RAD_PRELOAD(rad_bf16_portable, count);
	return 0;
}

extern "C" int radiance__gpu_split_f16(const uint16_t *x, uint32_t m, uint32_t k, uint16_t *hilo, void *stream)
{
	const size_t count = (size_t)m * k;
	if (!count)
		return 0;
	hipLaunchKernelGGL(rad_split_f16, dim3(blocks_for(count)), dim3(256), 0, (hipStream_t)stream, x, count,
			   hilo);
	return radiance__gpu_check_launch("fp16 split");
}

extern "C" int radiance__gpu_bias_bf16(const float *c, uint32_t m, uint32_t n, int hilo, const float *bias,
				       uint16_t *y, void *stream)
{
	const size_t count = (size_t)m * n;
	if (!count)
		return 0;
	hipLaunchKernelGGL(rad_bias_bf16, dim3(blocks_for(count)), dim3(256), 0, (hipStream_t)stream, c, m, n,
			   hilo, bias, y);
	return radiance__gpu_check_launch("bf16 bias epilogue");
}

extern "C" int radiance__gpu_bf16_portable(const uint16_t *x, enum radiance_dtype dtype, uint32_t m,
					   const uint16_t *w, const float *bias, uint32_t n, uint32_t k, uint16_t *y,
					   void *stream)
{
	if (!m)
		return 0;
	hipLaunchKernelGGL(rad_bf16_portable, dim3(blocks_for(n), m), dim3(256), 0, (hipStream_t)stream, x,
			   dtype == RADIANCE_DTYPE_FP16, m, w, bias, n, k, y);
	return radiance__gpu_check_launch("bf16 portable kernel");
}
