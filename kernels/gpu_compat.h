/*
 * Vendor mapping for the GPU kernels. The kernels are written in HIP; this
 * header is the only place that knows whether they are being compiled by
 * nvcc (as CUDA, for NVIDIA) or by clang/hipcc (for AMD).
 *
 * Why not HIP's own headers on NVIDIA: HIP 5.2.3's nvidia_detail headers do
 * not compile under CUDA 13, so on NVIDIA the few hip* runtime names we use
 * are mapped to cuda* here.
 *
 * Why builtins instead of threadIdx on AMD: Debian's clang-19 has no gfx1201
 * device libraries, so the compile check builds with -nogpulib, and HIP's
 * threadIdx/blockIdx pull in __ockl_* functions that then fail to link. The
 * amdgcn builtins compile to the same registers with or without device libs.
 *
 * Device-side vendor differences (fragment layouts, the int4 -> e4m3 unpack,
 * streaming loads, barriers, atomics) are small inline functions here so the
 * kernels themselves read the same on both vendors.
 */
#ifndef RADIANCE_GPU_COMPAT_H
#define RADIANCE_GPU_COMPAT_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) && !defined(__HIP__)
/* ------------------------------------------------------------------ NVIDIA */
#define RAD_NVIDIA 1
#include <cuda_runtime.h>

typedef cudaStream_t hipStream_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaError_t hipError_t;
typedef cudaDeviceProp hipDeviceProp_t;
#define hipSuccess cudaSuccess
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipStreamQuery cudaStreamQuery
#define hipStreamCreateWithPriority cudaStreamCreateWithPriority
#define hipDeviceGetStreamPriorityRange cudaDeviceGetStreamPriorityRange
#define hipErrorNotReady cudaErrorNotReady
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipHostRegister cudaHostRegister
#define hipHostRegisterMapped cudaHostRegisterMapped
#define hipHostRegisterPortable cudaHostRegisterPortable
#define hipHostUnregister cudaHostUnregister
#define hipHostGetDevicePointer cudaHostGetDevicePointer
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDisableTiming cudaEventDisableTiming
#define hipStreamWaitEvent cudaStreamWaitEvent
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributes cudaFuncAttributes
#define hipFuncGetAttributes cudaFuncGetAttributes
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipLaunchKernelGGL(k, g, b, sh, st, ...) k<<<(g), (b), (sh), (st)>>>(__VA_ARGS__)
#define hipGetDevice cudaGetDevice
#define hipMemGetInfo cudaMemGetInfo
#define hipDeviceGetPCIBusId cudaDeviceGetPCIBusId
#define hipDeviceGetByPCIBusId cudaDeviceGetByPCIBusId
#define hipIpcMemHandle_t cudaIpcMemHandle_t
#define hipIpcGetMemHandle cudaIpcGetMemHandle
#define hipIpcOpenMemHandle cudaIpcOpenMemHandle
#define hipIpcCloseMemHandle cudaIpcCloseMemHandle
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipGraph_t cudaGraph_t
#define hipGraphExec_t cudaGraphExec_t
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamCaptureModeRelaxed cudaStreamCaptureModeRelaxed
#define hipStreamEndCapture cudaStreamEndCapture
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphDestroy cudaGraphDestroy
#define hipGraphExecDestroy cudaGraphExecDestroy


/* Virtual memory management (the driver API, -lcuda): one exportable
 * allocation per model, shared with clients as a POSIX fd (kernels/gpu_share.hip).
 * The wrappers give both vendors one signature; they return the vendor's
 * status, RAD_VMM_OK on success. */
#include <cuda.h>
typedef CUmemGenericAllocationHandle rad_vmm_handle;
typedef CUresult rad_vmm_err;
#define RAD_VMM_OK CUDA_SUCCESS
static inline const char *rad_vmm_strerror(rad_vmm_err e)
{
	const char *s = NULL;
	cuGetErrorString(e, &s);
	return s ? s : "unknown CUDA driver error";
}
/* *yes: the device can make VMM allocations exportable as POSIX fds */
static inline rad_vmm_err rad_vmm_supported(int ordinal, int *yes)
{
	CUdevice d;
	int vmm = 0, fd = 0;
	rad_vmm_err e = cuInit(0);
	if (e == CUDA_SUCCESS)
		e = cuDeviceGet(&d, ordinal);
	if (e == CUDA_SUCCESS)
		e = cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d);
	if (e == CUDA_SUCCESS)
		e = cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d);
	*yes = e == CUDA_SUCCESS && vmm && fd;
	return e;
}
static inline void rad_vmm_prop(CUmemAllocationProp *p, int ordinal)
{
	memset(p, 0, sizeof *p);
	p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->location.id = ordinal;
	p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}
static inline rad_vmm_err rad_vmm_granularity(int ordinal, size_t *g)
{
	CUmemAllocationProp p;
	rad_vmm_prop(&p, ordinal);
	return cuMemGetAllocationGranularity(g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
}
static inline rad_vmm_err rad_vmm_create(int ordinal, size_t bytes, rad_vmm_handle *h)
{
	CUmemAllocationProp p;
	rad_vmm_prop(&p, ordinal);
	return cuMemCreate(h, bytes, &p, 0);
}
static inline rad_vmm_err rad_vmm_export_fd(rad_vmm_handle h, int *fd)
{
	return cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}
static inline rad_vmm_err rad_vmm_import_fd(int fd, rad_vmm_handle *h)
{
	return cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}
/* Reserves an address range of `bytes`, maps h there and grants this
 * device read (read_only) or read-write access. Undone by rad_vmm_unmap. */
static inline rad_vmm_err rad_vmm_map(rad_vmm_handle h, size_t bytes, size_t align, int ordinal, int read_only,
				      void **va)
{
	CUdeviceptr p = 0;
	rad_vmm_err e = cuMemAddressReserve(&p, bytes, align, 0, 0);
	if (e != CUDA_SUCCESS)
		return e;
	if ((e = cuMemMap(p, bytes, 0, h, 0)) != CUDA_SUCCESS) {
		cuMemAddressFree(p, bytes);
		return e;
	}
	CUmemAccessDesc d;
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = ordinal;
	d.flags = read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if ((e = cuMemSetAccess(p, bytes, &d, 1)) != CUDA_SUCCESS) {
		cuMemUnmap(p, bytes);
		cuMemAddressFree(p, bytes);
		return e;
	}
	*va = (void *)(uintptr_t)p;
	return CUDA_SUCCESS;
}
static inline void rad_vmm_unmap(void *va, size_t bytes)
{
	cuMemUnmap((CUdeviceptr)(uintptr_t)va, bytes);
	cuMemAddressFree((CUdeviceptr)(uintptr_t)va, bytes);
}
static inline void rad_vmm_release(rad_vmm_handle h)
{
	cuMemRelease(h);
}

#define RAD_TID() ((uint32_t)threadIdx.x)
#define RAD_BID_X() ((uint32_t)blockIdx.x)
#define RAD_BID_Y() ((uint32_t)blockIdx.y)
#define RAD_BID_Z() ((uint32_t)blockIdx.z)
#define RAD_NBLK_Y() ((uint32_t)gridDim.y)
#define RAD_SYNC() __syncthreads()
#define RAD_FENCE_DEVICE() __threadfence()
#define RAD_WAVE 32

/* Correctly rounded fp32 ops that are never contracted into an FMA: the
 * numerics mirror the CPU reference's separate multiply and add. */
#define RAD_FMUL(a, b) __fmul_rn((a), (b))
#define RAD_FADD(a, b) __fadd_rn((a), (b))
#define RAD_FDIV(a, b) __fdiv_rn((a), (b))

__device__ __forceinline__ float rad_bits_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t rad_f32_bits(float f) { return __float_as_uint(f); }
/* fp16 bits -> fp32 in one hardware conversion (exact for every fp16,
 * subnormals included): for weight scales inside the GEMM loops. */
__device__ __forceinline__ float rad_h2f(uint32_t h)
{
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
	return f;
}


/* 16-byte load of data read exactly once (weights): skip L1 so it keeps
 * the activations that every warp of the block re-reads. */
typedef uint4 rad_u4;
#define RAD_NO_CONTRACT

__device__ __forceinline__ rad_u4 rad_ld_stream16(const void *p)
{
	rad_u4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}
__device__ __forceinline__ rad_u4 rad_ld16(const void *p) { return __ldg((const uint4 *)p); }
__device__ __forceinline__ uint32_t rad_ld4(const void *p) { return __ldg((const unsigned int *)p); }
/* Load that bypasses L1 (data written by other blocks of this launch). */
__device__ __forceinline__ float rad_ld_cg(const float *p) { return __ldcg(p); }

/* Programmatic dependent launch (sm_90): a kernel launched with it may start
 * while the previous kernel of the stream runs; rad_grid_wait() blocks until
 * that kernel has finished and its writes are visible. rad_grid_launch()
 * lets the next kernel start early. No-ops elsewhere. */
__device__ __forceinline__ void rad_grid_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void rad_grid_launch(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ uint32_t rad_atomic_inc(uint32_t *p) { return atomicAdd((unsigned int *)p, 1u); }
/* The max / bitwise or of v over the 32 lanes of a (full) warp, in every lane. */
__device__ __forceinline__ uint32_t rad_warp_max_u32(uint32_t v) { return __reduce_max_sync(0xFFFFFFFFu, v); }
__device__ __forceinline__ uint32_t rad_warp_or_u32(uint32_t v) { return __reduce_or_sync(0xFFFFFFFFu, v); }
/* Barrier `id` (1..15; 0 is __syncthreads) over the first `threads` threads
 * of the block (a multiple of 32): the warps that take part in a phase. */
__device__ __forceinline__ void rad_bar_sync(uint32_t id, uint32_t threads)
{
	asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* Bulk copies (sm_90 TMA, 1-D: no tensor map) into shared memory, completing
 * on an mbarrier's transaction count. Addresses are shared-window u32s. A
 * bulk copy may complete before the arrive.expect_tx of its phase: the
 * tx-count may go negative, and the phase completes only once the one
 * expected arrival has happened and the count is back at zero. */
#define RAD_HAVE_BULK 1
__device__ __forceinline__ uint32_t rad_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void rad_mbar_init(uint32_t bar, uint32_t count)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
/* the inits visible to the async proxy (the copy engine) */
__device__ __forceinline__ void rad_mbar_init_fence(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void rad_mbar_arrive_tx(uint32_t bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void rad_bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
		     ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#else
	__trap();
#endif
}
/* Wait for the phase of parity `parity` to complete. Bounded: a phase that
 * never completes (a bug) traps instead of hanging the GPU. */
__device__ __forceinline__ void rad_mbar_wait(uint32_t bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	for (uint32_t spin = 0;; spin++) {
		uint32_t done;
		asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
			     " selp.u32 %0, 1, 0, p;\n}"
			     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
		if (done)
			break;
		if (spin > (1u << 22))
			__trap();
	}
#endif
}

#else
/* --------------------------------------------------------------------- AMD */
#define RAD_AMD 1
#include <hip/hip_runtime.h>


/* Virtual memory management, the same wrappers as on NVIDIA. HIP 5.2's
 * headers (Debian's, the compile check's) declare the calls but have no
 * device attribute saying whether they work; ROCm 6 has one. RDNA GPUs are
 * reported to lack VMM (llama.cpp prints "VMM: no" on gfx1100-gfx1201), so
 * there the legacy IPC handle is what users get (gpu_share.hip falls back).
 * Unverified on AMD hardware: hipMemImportFromShareableHandle is given the
 * fd's value cast to a pointer, as CUDA's is (ROCm's own test was fixed to
 * do so, ROCm/rocm-systems#1564). */
typedef hipMemGenericAllocationHandle_t rad_vmm_handle;
typedef hipError_t rad_vmm_err;
#define RAD_VMM_OK hipSuccess
static inline const char *rad_vmm_strerror(rad_vmm_err e)
{
	return hipGetErrorString(e);
}
static inline rad_vmm_err rad_vmm_supported(int ordinal, int *yes)
{
#if defined(HIP_VERSION_MAJOR) && HIP_VERSION_MAJOR >= 6
	int v = 0;
	rad_vmm_err e = hipDeviceGetAttribute(&v, hipDeviceAttributeVirtualMemoryManagementSupported, ordinal);
	*yes = e == hipSuccess && v;
	return e;
#else
	(void)ordinal;
	*yes = 0;   /* no way to ask: take the IPC path */
	return hipSuccess;
#endif
}
static inline void rad_vmm_prop(hipMemAllocationProp *p, int ordinal)
{
	memset(p, 0, sizeof *p);
	p->type = hipMemAllocationTypePinned;
	p->location.type = hipMemLocationTypeDevice;
	p->location.id = ordinal;
	p->requestedHandleType = hipMemHandleTypePosixFileDescriptor;   /* ROCm 6's name; 7 adds ...Types */
}
static inline rad_vmm_err rad_vmm_granularity(int ordinal, size_t *g)
{
	hipMemAllocationProp p;
	rad_vmm_prop(&p, ordinal);
	return hipMemGetAllocationGranularity(g, &p, hipMemAllocationGranularityRecommended);
}
static inline rad_vmm_err rad_vmm_create(int ordinal, size_t bytes, rad_vmm_handle *h)
{
	hipMemAllocationProp p;
	rad_vmm_prop(&p, ordinal);
	return hipMemCreate(h, bytes, &p, 0);
}
static inline rad_vmm_err rad_vmm_export_fd(rad_vmm_handle h, int *fd)
{
	return hipMemExportToShareableHandle(fd, h, hipMemHandleTypePosixFileDescriptor, 0);
}
static inline rad_vmm_err rad_vmm_import_fd(int fd, rad_vmm_handle *h)
{
	return hipMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, hipMemHandleTypePosixFileDescriptor);
}
static inline rad_vmm_err rad_vmm_map(rad_vmm_handle h, size_t bytes, size_t align, int ordinal, int read_only,
				      void **va)
{
	void *p = NULL;
	rad_vmm_err e = hipMemAddressReserve(&p, bytes, align, NULL, 0);
	if (e != hipSuccess)
		return e;
	if ((e = hipMemMap(p, bytes, 0, h, 0)) != hipSuccess) {
		(void)hipMemAddressFree(p, bytes);
		return e;
	}
	hipMemAccessDesc d;
	memset(&d, 0, sizeof d);
	d.location.type = hipMemLocationTypeDevice;
	d.location.id = ordinal;
	d.flags = read_only ? hipMemAccessFlagsProtRead : hipMemAccessFlagsProtReadWrite;
	if ((e = hipMemSetAccess(p, bytes, &d, 1)) != hipSuccess) {
		(void)hipMemUnmap(p, bytes);
		(void)hipMemAddressFree(p, bytes);
		return e;
	}
	*va = p;
	return hipSuccess;
}
static inline void rad_vmm_unmap(void *va, size_t bytes)
{
	(void)hipMemUnmap(va, bytes);
	(void)hipMemAddressFree(va, bytes);
}
static inline void rad_vmm_release(rad_vmm_handle h)
{
	(void)hipMemRelease(h);
}

#define RAD_TID() ((uint32_t)__builtin_amdgcn_workitem_id_x())
#define RAD_BID_X() ((uint32_t)__builtin_amdgcn_workgroup_id_x())
#define RAD_BID_Y() ((uint32_t)__builtin_amdgcn_workgroup_id_y())
#define RAD_BID_Z() ((uint32_t)__builtin_amdgcn_workgroup_id_z())
/* gridDim.y without __ockl: the grid size in work-items over the group size,
 * read from the dispatch packet (hsa_kernel_dispatch_packet_t: grid_size_y at
 * byte 16, workgroup_size_y at byte 6). */
__device__ __forceinline__ uint32_t rad_nblk_y(void)
{
	const uint8_t *pkt = (const uint8_t *)__builtin_amdgcn_dispatch_ptr();
	uint32_t grid = *(const uint32_t *)(pkt + 16);
	uint32_t wg = *(const uint16_t *)(pkt + 6);
	return grid / wg;
}
#define RAD_NBLK_Y() rad_nblk_y()
#define RAD_SYNC()                                                   \
	do {                                                         \
		__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); \
		__builtin_amdgcn_s_barrier();                        \
		__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); \
	} while (0)
#define RAD_FENCE_DEVICE() __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent")
#define RAD_WAVE 32   /* gfx12 WMMA kernels are built for wave32 */

/* RAD_NO_CONTRACT (clang's `fp contract(off)`) opens every function that
 * needs separate roundings; these keep the call sites identical to NVIDIA's. */
#define RAD_FMUL(a, b) ((a) * (b))
#define RAD_FADD(a, b) ((a) + (b))
#define RAD_FDIV(a, b) ((a) / (b))   /* HIP divides correctly rounded by default */

__device__ __forceinline__ float rad_bits_f32(uint32_t u) { return __builtin_bit_cast(float, u); }
__device__ __forceinline__ uint32_t rad_f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
__device__ __forceinline__ float rad_h2f(uint32_t h)
{
	return (float)__builtin_bit_cast(_Float16, (uint16_t)h);   /* v_cvt_f32_f16, exact */
}


struct __attribute__((aligned(16))) rad_u4 { uint32_t x, y, z, w; };
typedef uint32_t rad_u4v __attribute__((ext_vector_type(4)));
#define RAD_NO_CONTRACT _Pragma("clang fp contract(off)")

__device__ __forceinline__ rad_u4 rad_ld_stream16(const void *p)
{
	rad_u4v v = __builtin_nontemporal_load((const rad_u4v *)p);
	rad_u4 r = {v.x, v.y, v.z, v.w};
	return r;
}
__device__ __forceinline__ rad_u4 rad_ld16(const void *p) { return *(const rad_u4 *)p; }
__device__ __forceinline__ uint32_t rad_ld4(const void *p) { return *(const uint32_t *)p; }
__device__ __forceinline__ float rad_ld_cg(const float *p)
{
	return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ uint32_t rad_atomic_inc(uint32_t *p)
{
	return __hip_atomic_fetch_add(p, 1u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void rad_grid_wait(void) {}
__device__ __forceinline__ void rad_grid_launch(void) {}
/* The max / bitwise or of v over the 32 lanes of a (full) wave32, in every lane. */
__device__ __forceinline__ uint32_t rad_warp_max_u32(uint32_t v)
{
	for (int o = 16; o > 0; o >>= 1) {
		const uint32_t u = (uint32_t)__shfl_xor((int)v, o, 32);
		v = u > v ? u : v;
	}
	return v;
}
__device__ __forceinline__ uint32_t rad_warp_or_u32(uint32_t v)
{
	for (int o = 16; o > 0; o >>= 1)
		v |= (uint32_t)__shfl_xor((int)v, o, 32);
	return v;
}
#endif

/* Loads kernel `f` into the current device's context now, and counts it in
 * *count. A driver that loads code lazily (CUDA_MODULE_LOADING=LAZY, CUDA's
 * default since 11.7; HIP's deferred code-object loading) otherwise loads a
 * kernel, and takes device memory for it, at its first launch: that request
 * pays the load, and the device memory in use grows in the middle of
 * serving. Asking for the kernel's attributes makes the runtime load it
 * (the backend logs the device memory this took: docs/gpu.md "Kernels
 * loaded at start"). Host code only. 0, or -EIO with the last-error text
 * naming the kernel. */
extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);
static inline int rad_preload(const void *f, const char *name, unsigned *count)
{
	hipFuncAttributes a;
	hipError_t e = hipFuncGetAttributes(&a, f);
	if (e != hipSuccess)
		return radiance__gpu_fail_text(-EIO, "loading kernel %s: %s", name, hipGetErrorString(e));
	++*count;
	return 0;
}
#define RAD_PRELOAD(f, count)                                                       \
	do {                                                                        \
		int rad_pl_rc_ = rad_preload((const void *)(f), #f, (count));       \
		if (rad_pl_rc_)                                                     \
			return rad_pl_rc_;                                          \
	} while (0)

#endif
