/*
 * W4A8 GEMM on the device weight layout of kernels/numerics_gpu.h:
 *   y[m][n] = bf16( sum_g (sum_{k in g} e4m3(q[m][k]) * v[n][k]) * scale[g][n] * s[m] + bias[n] )
 *
 * The dispatcher: radiance__w4a8_plan (plain C, w4a8_plan.c) picks the path
 * and launch shape, this file fills the kernel parameters and calls the
 * kernel's launcher. The kernels, one file each (vLLM's Marlin split):
 *
 *   w4a8_mma.hip      DECODE / TILED: the matrix-core kernel (mma.sync
 *                     m16n8k16 f16 on NVIDIA, v_wmma_f32_16x16x16_fp8_fp8 on
 *                     gfx12), split-K, tiled over tokens for prefill;
 *   w4a8_gemv.hip     DECODE on sm_90, m <= 16 (64 forced): the bulk-copy streaming kernel;
 *   w4a8_wgmma.hip    WGMMA: the sm_90a fp8 prefill (prefill = fast);
 *                     WGMMA_EXACT: its f16 twin (prefill = exact);
 *   w4a8_portable.hip PORTABLE: bit-identical to the CPU reference, any GPU;
 *   w4a8_repack.hip   the weight repack and the bf16 dequantization.
 *
 * Fragments of the matrix-core kernels: w4a8_mma.h; register dequantization
 * (int4 -> f16 / e4m3, e4m3 -> f16): w4a8_dequant.h; what they share:
 * w4a8_kernels.h. docs/gpu.md has the measurements.
 */
#include <errno.h>

#include "w4a8_kernels.h"

extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);   /* gpu_runtime.hip */
/* the other files' parts of radiance__gpu_preload */
extern "C" int radiance__gpu_quant_preload(unsigned *count);    /* w4a8_quant.hip */
extern "C" int radiance__w4a8_wgmma_preload(unsigned *count);   /* w4a8_wgmma.hip */
extern "C" int radiance__w4a8_repack_preload(unsigned *count);  /* w4a8_repack.hip */
extern "C" int radiance__gpu_bf16_preload(unsigned *count);     /* bf16_gpu.hip */
extern "C" int radiance__gpu_rows_preload(unsigned *count);     /* gpu_rows.hip */

extern "C" int radiance__gpu_preload(const struct radiance__gpu_device *dev, unsigned *count)
{
	*count = 0;
	int rc = radiance__gpu_quant_preload(count);
	if (!rc)
		rc = radiance__w4a8_mma_preload(count);
#ifdef RAD_HAVE_BULK
	if (!rc)
		rc = radiance__w4a8_gemv_preload(count);
#endif
	if (!rc)
		rc = radiance__w4a8_portable_preload(count);
	if (!rc && dev->wgmma)
		rc = radiance__w4a8_wgmma_preload(count);
	if (!rc)
		rc = radiance__w4a8_repack_preload(count);
	if (!rc)
		rc = radiance__gpu_bf16_preload(count);
	if (!rc)
		rc = radiance__gpu_rows_preload(count);
	return rc;
}

extern "C" int radiance__w4a8_gemm(const struct radiance__gpu_device *dev, const struct radiance__w4a8_args *a,
				   void *stream)
{
	if (a->m == 0 && a->n && a->k && a->k % RAD_GROUP == 0)
		return 0;
	struct radiance__w4a8_plan plan;
	int rc = radiance__w4a8_plan(dev, a, &plan);
	if (rc)
		return rc;
	gemm_params p;
	p.codes = a->codes;
	p.s = a->s;
	p.w = (const rad_u4 *)a->w;
	p.sc = (const uint8_t *)a->sc;
	p.bias = a->bias;
	p.y = a->y;
	p.partials = a->partials;
	p.counters = a->counters;
	p.m = a->m;
	p.n = a->n;
	p.k = a->k;
	p.groups = a->k / RAD_GROUP;
	p.ntiles = ceil_div(a->n, RAD_TILE_N);
	p.wk = plan.wk;
	p.wn = GEMM_WARPS / plan.wk;
	p.x = plan.fused ? a->x : NULL;
	p.x_fp16 = a->x_dtype == RADIANCE_DTYPE_FP16;
	/* whole 16-byte pieces of y where every row starts aligned */
	p.y_rows = a->y_rows != NULL;
	p.y16 = a->n % 8 == 0;
	if (a->y_rows) {
		if (a->m > RADIANCE_W4A8_Y_ROWS_MAX)
			return radiance__gpu_fail_text(-EINVAL, "per-row y destinations for %u rows (at most %u)",
						       a->m, RADIANCE_W4A8_Y_ROWS_MAX);
		if (plan.path == RADIANCE_W4A8_WGMMA)
			return radiance__gpu_fail_text(-EINVAL, "per-row y destinations on the wgmma path "
						       "(%u rows of a %ux%u layer)", a->m, a->n, a->k);
		for (uint32_t t = 0; t < a->m; t++) {
			p.yrow[t] = a->y_rows[t];
			p.y16 &= ((uintptr_t)a->y_rows[t] & 15) == 0;
		}
	} else {
		p.y16 &= ((uintptr_t)a->y & 15) == 0;
	}

	switch (plan.path) {
	case RADIANCE_W4A8_PORTABLE:
		return radiance__w4a8_portable_launch(p, stream);
	case RADIANCE_W4A8_WGMMA:
		return radiance__w4a8_wgmma_launch(a->codes, a->s, a->w, a->sc, a->bias, a->y, a->m, a->n, a->k,
						   plan.tok, stream);
	case RADIANCE_W4A8_WGMMA_EXACT:
		return radiance__w4a8_wgmma_exact_launch(p, plan, stream);
	default:
		break;
	}
#ifdef RAD_HAVE_BULK
	if (plan.ntw)
		return radiance__w4a8_gemv_launch(p, plan, stream, a->pdl);
#endif
	return radiance__w4a8_mma_launch(p, plan, stream, a->pdl);
}
