/* Completion words and batched row copies for the GPU backend's data path
 * (w4a8_gpu.h, daemon/backend_gpu.c): the daemon learns that a launch is
 * done from a word the device writes into host memory, never from a
 * blocking synchronize, and a merged launch's rows move between the
 * session arenas and the staging buffers in one kernel, not one copy call
 * per request; and the backend's two lanes, streams of two priorities. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);   /* gpu_runtime.hip */

__device__ __forceinline__ void rad_fence_system(void)
{
#ifdef RAD_NVIDIA
	__threadfence_system();
#else
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

__global__ void rad_signal(volatile uint32_t *word, uint32_t value)
{
	/* every write of the kernels before this one is done (stream order);
	 * the fence makes them visible system-wide before the word */
	rad_fence_system();
	*word = value;
	rad_fence_system();
}

/* Block (x, y) copies a stretch of request y's bytes; 16-byte moves where
 * both sides and the length allow, else bytes. */
__global__ void __launch_bounds__(256) rad_rows_copy(struct radiance__gpu_rows_list L, uint32_t nblocks,
						      int fence)
{
	const uint32_t r = RAD_BID_Y();
	const uint8_t *s = (const uint8_t *)L.src[r];
	uint8_t *d = (uint8_t *)L.dst[r];
	const uint64_t bytes = L.bytes[r], stride = (uint64_t)256 * nblocks;
	uint64_t i = (uint64_t)RAD_BID_X() * 256 + RAD_TID();
	if ((((uintptr_t)s | (uintptr_t)d | bytes) & 15) == 0) {
		const rad_u4 *s16 = (const rad_u4 *)s;
		rad_u4 *d16 = (rad_u4 *)d;
		for (; i < bytes / 16; i += stride)
			d16[i] = s16[i];
	} else {
		for (; i < bytes; i += stride)
			d[i] = s[i];
	}
	if (fence)
		rad_fence_system();
}

extern "C" int radiance__gpu_rows_preload(unsigned *count)
{
	RAD_PRELOAD(rad_signal, count);
	RAD_PRELOAD(rad_rows_copy, count);
	return 0;
}

extern "C" int radiance__gpu_rows_copy(const struct radiance__gpu_rows_list *l, int fence, void *stream)
{
	if (l->n == 0)
		return 0;
	if (l->n > RADIANCE__GPU_ROWS_MAX)
		return radiance__gpu_fail_text(-EINVAL, "%u row copies in one launch (at most %u)", l->n,
					       RADIANCE__GPU_ROWS_MAX);
	uint64_t most = 0;
	for (uint32_t i = 0; i < l->n; i++)
		most = l->bytes[i] > most ? l->bytes[i] : most;
	/* enough blocks to keep every byte of the biggest one in flight at
	 * once up to 64 KiB a block, at most 132 (one per H200 SM) */
	uint64_t nb = (most + 16 * 256 - 1) / (16 * 256);
	nb = nb < 1 ? 1 : nb > 132 ? 132 : nb;
	hipLaunchKernelGGL(rad_rows_copy, dim3((uint32_t)nb, l->n), dim3(256), 0, (hipStream_t)stream, *l,
			   (uint32_t)nb, fence);
	hipError_t e = hipGetLastError();
	return e == hipSuccess ? 0 : radiance__gpu_fail_text(-EIO, "row copies: %s", hipGetErrorString(e));
}

extern "C" int radiance__gpu_signal(void *dev_word, uint32_t value, void *stream)
{
#ifdef RAD_NVIDIA
	/* the driver's stream memory operation: no kernel launch; its default
	 * flags put a memory barrier before the write */
	static int memops = 1;
	if (memops) {
		CUresult r = cuStreamWriteValue32((CUstream)stream, (CUdeviceptr)(uintptr_t)dev_word, value, 0);
		if (r == CUDA_SUCCESS)
			return 0;
		memops = 0;   /* refused here (no stream memory operations): the kernel from now on */
		const char *why = NULL;
		cuGetErrorString(r, &why);
		fprintf(stderr, "radiance: cuStreamWriteValue32 refused (%s): completion words by kernel\n",
			why ? why : "?");
	}
#endif
	hipLaunchKernelGGL(rad_signal, dim3(1), dim3(1), 0, (hipStream_t)stream, (volatile uint32_t *)dev_word,
			   value);
	hipError_t e = hipGetLastError();
	return e == hipSuccess ? 0 : radiance__gpu_fail_text(-EIO, "completion word: %s", hipGetErrorString(e));
}

extern "C" int radiance__gpu_stream_query(void *stream)
{
	hipError_t e = hipStreamQuery((hipStream_t)stream);
	if (e == hipSuccess)
		return 0;
	if (e == hipErrorNotReady)
		return 1;
	return radiance__gpu_fail_text(-EIO, "stream: %s", hipGetErrorString(e));
}

extern "C" int radiance__gpu_stream_create_priority(void **stream, int high)
{
	int least = 0, greatest = 0;
	hipError_t e = hipDeviceGetStreamPriorityRange(&least, &greatest);
	hipStream_t st;
	if (e == hipSuccess)
		e = hipStreamCreateWithPriority(&st, hipStreamNonBlocking, high ? greatest : least);
	if (e != hipSuccess)
		return radiance__gpu_fail_text(-EIO, "stream create (priority): %s", hipGetErrorString(e));
	*stream = (void *)st;
	return 0;
}
