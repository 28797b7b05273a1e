/*
 * The portable W4A8 kernel (path PORTABLE): one thread per output, fp32
 * FMA-free dot products in the CPU reference's order, so bit-identical to
 * radiance_cpu_w4a8_gemm on any GPU.
 */
#include "w4a8_kernels.h"

/* One thread per (token, output): the CPU reference's loop order and
 * roundings (separate multiply and add), so the result is bit-identical. */
__global__ void __launch_bounds__(256) rad_w4a8_portable(gemm_params P)
{
	RAD_NO_CONTRACT
	const uint32_t n = RAD_BID_X() * 256 + RAD_TID();
	const uint32_t t = RAD_BID_Y();
	if (n >= P.n)
		return;
	const uint32_t G = P.groups, tile = n / RAD_TILE_N, row = n % RAD_TILE_N;
	const uint8_t *xr = P.codes + (size_t)t * P.k;
	const uint32_t *wt = (const uint32_t *)P.w + (size_t)tile * G * 256 + row * 16;
	float acc = 0.f;
	for (uint32_t g = 0; g < G; g++) {
		const uint32_t *wg = wt + (size_t)g * 256;
		const uint8_t *xg = xr + (size_t)g * RAD_GROUP;
		/* eight partial sums, element i of the group into sum i % 8, then
		 * combined pairwise: the order of the CPU's dot_group() */
		float pa[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
		for (uint32_t wi = 0; wi < 16; wi++) {
			uint32_t w = wg[wi];
			for (uint32_t q = 0; q < 8; q++) {
				float xv = rad_e4m3_to_f32(xg[wi * 8 + q]);
				float wv = (float)rad_word_int(w, q);
				pa[q] = RAD_FADD(pa[q], RAD_FMUL(xv, wv));
			}
		}
		float p = RAD_FADD(RAD_FADD(RAD_FADD(pa[0], pa[4]), RAD_FADD(pa[1], pa[5])),
				   RAD_FADD(RAD_FADD(pa[2], pa[6]), RAD_FADD(pa[3], pa[7])));
		float sc = rad_scale_of_row(P.sc + ((size_t)tile * G + g) * RAD_SCALE_BYTES, row);
		acc = RAD_FADD(acc, RAD_FMUL(p, sc));
	}
	y_row(P, t)[n] = out_bf16(acc, P.s[t], P.bias, n);
}

int radiance__w4a8_portable_preload(unsigned *count)
{
	RAD_PRELOAD(rad_w4a8_portable, count);
	return 0;
}

int radiance__w4a8_portable_launch(const gemm_params &p, void *stream)
{
	hipLaunchKernelGGL(rad_w4a8_portable, dim3(ceil_div(p.n, 256), p.m), dim3(256), 0, (hipStream_t)stream, p);
	return radiance__gpu_check_launch("w4a8 portable kernel");
}
