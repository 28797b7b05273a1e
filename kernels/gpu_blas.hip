/*
 * The vendor BLAS for bf16 linears and the bench's bf16 peer: cuBLAS on
 * NVIDIA, hipBLAS on AMD (when its headers are there; the CI compile check
 * builds without them and this file then reports -ENOTSUP).
 *
 * Row-major y[m][n] = x[m][k] * w[n][k]^T is, in BLAS's column-major terms,
 * Y^T (n x m, ld n) = W^T... i.e. op(A) = W^T with A = w (k x n col-major,
 * ld k), B = x (k x m col-major, ld k). Compute type fp32 (never TF32 or
 * reduced precision), so products of bf16 are exact and sums are fp32, as
 * numerics.h defines bf16 layers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

#if defined(RAD_NVIDIA)
#include <cublas_v2.h>
#define HAVE_BLAS 1
typedef cublasHandle_t blas_t;
#define BLAS_OK CUBLAS_STATUS_SUCCESS
#define R_16BF CUDA_R_16BF
#define R_32F CUDA_R_32F
#define OP_T CUBLAS_OP_T
#define OP_N CUBLAS_OP_N
#define COMPUTE_32F CUBLAS_COMPUTE_32F
#define GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
#define blas_create cublasCreate
#define blas_destroy cublasDestroy
#define blas_set_stream cublasSetStream
#define blas_gemm_ex cublasGemmEx
#elif __has_include(<hipblas/hipblas.h>)
#define HIPBLAS_V2
#include <hipblas/hipblas.h>
#define HAVE_BLAS 1
typedef hipblasHandle_t blas_t;
#define BLAS_OK HIPBLAS_STATUS_SUCCESS
#define R_16BF HIP_R_16BF
#define R_32F HIP_R_32F
#define OP_T HIPBLAS_OP_T
#define OP_N HIPBLAS_OP_N
#define COMPUTE_32F HIPBLAS_COMPUTE_32F
#define GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#define blas_create hipblasCreate
#define blas_destroy hipblasDestroy
#define blas_set_stream hipblasSetStream
#define blas_gemm_ex hipblasGemmEx
#endif

#ifdef HAVE_BLAS
extern "C" int radiance__blas_create(void **blas, void *stream, void *workspace, size_t workspace_bytes)
{
	blas_t h;
	*blas = NULL;
	if (blas_create(&h) != BLAS_OK)
		return -ENODEV;
	if (blas_set_stream(h, (hipStream_t)stream) != BLAS_OK) {
		blas_destroy(h);
		return -EIO;
	}
#ifdef RAD_NVIDIA
	/* a caller-owned workspace: cuBLAS then never allocates while serving */
	if (workspace && cublasSetWorkspace(h, workspace, workspace_bytes) != BLAS_OK) {
		blas_destroy(h);
		return -EIO;
	}
#else
	(void)workspace;
	(void)workspace_bytes;
#endif
	*blas = (void *)h;
	return 0;
}

extern "C" void radiance__blas_destroy(void *blas)
{
	if (blas)
		blas_destroy((blas_t)blas);
}

extern "C" int radiance__blas_set_stream(void *blas, void *stream)
{
	return blas_set_stream((blas_t)blas, (hipStream_t)stream) == BLAS_OK ? 0 : -EIO;
}

static int gemm(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w, uint32_t n, uint32_t k, void *c,
		int c_bf16)
{
	const float alpha = 1.0f, beta = 0.0f;
	if (!m)
		return 0;
	if (blas_gemm_ex((blas_t)blas, OP_T, OP_N, (int)n, (int)m, (int)k, &alpha, w, R_16BF, (int)k, x, R_16BF,
			 (int)k, &beta, c, c_bf16 ? R_16BF : R_32F, (int)n, COMPUTE_32F, GEMM_DEFAULT) != BLAS_OK)
		return -EIO;
	return 0;
}

extern "C" int radiance__blas_bf16_f32(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w, uint32_t n,
				       uint32_t k, float *c)
{
	return gemm(blas, x, m, w, n, k, c, 0);
}

extern "C" int radiance__blas_bf16_bf16(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w,
					uint32_t n, uint32_t k, uint16_t *y)
{
	return gemm(blas, x, m, w, n, k, y, 1);
}

#else

extern "C" int radiance__blas_create(void **blas, void *stream, void *workspace, size_t workspace_bytes)
{
	*blas = NULL;
	return -ENOTSUP;
}
extern "C" void radiance__blas_destroy(void *blas) {}
extern "C" int radiance__blas_set_stream(void *blas, void *stream)
{
	return -ENOTSUP;
}
extern "C" int radiance__blas_bf16_f32(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w, uint32_t n,
				       uint32_t k, float *c)
{
	return -ENOTSUP;
}
extern "C" int radiance__blas_bf16_bf16(void *blas, const uint16_t *x, uint32_t m, const uint16_t *w,
					uint32_t n, uint32_t k, uint16_t *y)
{
	return -ENOTSUP;
}
#endif
