/* Thin C wrappers over the vendor runtime (w4a8_gpu.h), and the bench's
 * streaming-read probe. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../common/clock.h"
#include "numerics_gpu.h"
#include "w4a8_gpu.h"

static thread_local char last_error[256];

/* For gpu_share.hip, which reports driver-API failures through the same text. */
extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof last_error, fmt, ap);
	va_end(ap);
	return rc;
}
static int probe_blocks = 1024;   /* resident blocks of the probe: 8 per SM */

extern "C" int radiance__wgmma_probe(int *usable);   /* w4a8_wgmma.hip */
#ifdef RAD_HAVE_BULK
extern "C" int radiance__w4a8_gemv_blocks(unsigned inst, uint32_t stages);   /* w4a8_gemv.hip */
#endif

static int fail(const char *what, hipError_t e)
{
	snprintf(last_error, sizeof last_error, "%s: %s", what, hipGetErrorString(e));
	return -EIO;
}

#define CHECK(what, call)                          \
	do {                                       \
		hipError_t e_ = (call);            \
		if (e_ != hipSuccess)              \
			return fail((what), e_);   \
	} while (0)

extern "C" const char *radiance__gpu_last_error(void)
{
	return last_error;
}

extern "C" int radiance__gpu_check_launch(const char *what)
{
	hipError_t e = hipGetLastError();
	return e == hipSuccess ? 0 : fail(what, e);
}

extern "C" int radiance__gpu_init(int ordinal, struct radiance__gpu_device *dev)
{
	int count = 0;
	memset(dev, 0, sizeof *dev);
	hipError_t e = hipGetDeviceCount(&count);
	if (e != hipSuccess || count <= 0) {
		snprintf(last_error, sizeof last_error, "no GPU: %s",
			 e != hipSuccess ? hipGetErrorString(e) : "no device");
		return -ENODEV;
	}
	if (ordinal < 0 || ordinal >= count) {
		snprintf(last_error, sizeof last_error, "GPU %d requested, %d present", ordinal, count);
		return -ENODEV;
	}
	CHECK("set device", hipSetDevice(ordinal));
	hipDeviceProp_t p;
	CHECK("device properties", hipGetDeviceProperties(&p, ordinal));
	snprintf(dev->name, sizeof dev->name, "%s", p.name);
	dev->ordinal = ordinal;
	dev->sm_count = p.multiProcessorCount;
	dev->l2_bytes = (uint64_t)p.l2CacheSize;
	dev->mem_bytes = (uint64_t)p.totalGlobalMem;
	probe_blocks = p.multiProcessorCount * 8;
#ifdef RAD_NVIDIA
	snprintf(dev->vendor, sizeof dev->vendor, "cuda");
	dev->cc_major = p.major;
	dev->cc_minor = p.minor;
	/* e4m3 mma.sync exists from sm_89 */
	dev->fp8_mma = p.major * 10 + p.minor >= 89;
#ifdef RAD_HAVE_BULK
	dev->gemv_blocks = radiance__w4a8_gemv_blocks;
#endif
	int usable = 0;
	if (p.major == 9 && radiance__wgmma_probe(&usable) == 0)
		dev->wgmma = usable;
	(void)hipGetLastError();   /* a probe on a device without the image leaves an error */
#else
	snprintf(dev->vendor, sizeof dev->vendor, "hip");
	unsigned gfx = 0;
	sscanf(p.gcnArchName, "gfx%x", &gfx);
	dev->cc_major = (int)(gfx >> 8);
	dev->cc_minor = (int)(gfx & 0xFF);
	/* fp8 WMMA (v_wmma_f32_16x16x16_fp8_fp8) is gfx12 */
	dev->fp8_mma = dev->cc_major == 0x12;
	dev->wgmma = 0;
	if (p.name[0] == 0)
		snprintf(dev->name, sizeof dev->name, "%s", p.gcnArchName);
#endif
	return 0;
}

extern "C" int radiance__gpu_get_device(int *ordinal)
{
	CHECK("get device", hipGetDevice(ordinal));
	return 0;
}

extern "C" int radiance__gpu_set_device(int ordinal)
{
	CHECK("set device", hipSetDevice(ordinal));
	return 0;
}

extern "C" int radiance__gpu_mem_info(size_t *free_bytes, size_t *total_bytes)
{
	CHECK("memory info", hipMemGetInfo(free_bytes, total_bytes));
	return 0;
}

extern "C" int radiance__gpu_pci_bus_id(int ordinal, char *buf, size_t len)
{
	CHECK("PCI bus id", hipDeviceGetPCIBusId(buf, (int)len, ordinal));
	return 0;
}

extern "C" int radiance__gpu_device_by_pci_bus_id(const char *bus_id, int *ordinal)
{
	hipError_t e = hipDeviceGetByPCIBusId(ordinal, bus_id);
	if (e != hipSuccess) {
		snprintf(last_error, sizeof last_error, "no visible device has PCI bus id %s: %s", bus_id,
			 hipGetErrorString(e));
		(void)hipGetLastError();
		return -ENODEV;
	}
	return 0;
}

extern "C" int radiance__gpu_malloc(void **p, size_t bytes)
{
	*p = NULL;
	hipError_t e = hipMalloc(p, bytes ? bytes : 16);
	if (e != hipSuccess) {
		fail("device allocation", e);
		*p = NULL;
		return -ENOMEM;
	}
	return 0;
}

extern "C" void radiance__gpu_free(void *p)
{
	if (p)
		(void)hipFree(p);
}

extern "C" int radiance__gpu_stream_create(void **stream)
{
	hipStream_t s;
	CHECK("stream create", hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
	*stream = (void *)s;
	return 0;
}

extern "C" void radiance__gpu_stream_destroy(void *stream)
{
	if (stream)
		(void)hipStreamDestroy((hipStream_t)stream);
}

extern "C" int radiance__gpu_stream_sync(void *stream)
{
	CHECK("stream synchronize", hipStreamSynchronize((hipStream_t)stream));
	return 0;
}

extern "C" int radiance__gpu_device_sync(void)
{
	CHECK("device synchronize", hipDeviceSynchronize());
	return 0;
}

extern "C" int radiance__gpu_memset_async(void *dst, int value, size_t bytes, void *stream)
{
	CHECK("memset", hipMemsetAsync(dst, value, bytes, (hipStream_t)stream));
	return 0;
}

extern "C" int radiance__gpu_h2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
	CHECK("copy to device", hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, (hipStream_t)stream));
	return 0;
}

extern "C" int radiance__gpu_d2h_async(void *dst, const void *src, size_t bytes, void *stream)
{
	CHECK("copy to host", hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, (hipStream_t)stream));
	return 0;
}

extern "C" int radiance__gpu_d2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
	CHECK("device copy", hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, (hipStream_t)stream));
	return 0;
}

extern "C" int radiance__gpu_host_register(void *base, size_t len, void **dev_ptr)
{
	CHECK("host register", hipHostRegister(base, len, hipHostRegisterMapped | hipHostRegisterPortable));
	void *d = NULL;
	hipError_t e = hipHostGetDevicePointer(&d, base, 0);
	if (e != hipSuccess) {
		(void)hipHostUnregister(base);
		return fail("host device pointer", e);
	}
	*dev_ptr = d;
	return 0;
}

extern "C" int radiance__gpu_host_unregister(void *base)
{
	CHECK("host unregister", hipHostUnregister(base));
	return 0;
}

/* Between two pieces: the driver holds one lock for a registration, and
 * the executor's launches and copies wait on it; sleeping here hands it
 * over to them before the next piece takes it again. */
static void piece_gap(void (*pace)(void *), void *pace_arg)
{
	if (pace) {
		pace(pace_arg);
		return;
	}
	struct timespec ts = { 0, 50000 };   /* 50 us */
	nanosleep(&ts, NULL);
}

/* *slowest = max(*slowest, now - t0), when slowest is not NULL */
static void piece_took(uint64_t *slowest, uint64_t t0)
{
	const uint64_t d = rclock_ns() - t0;
	if (slowest && d > *slowest)
		*slowest = d;
}

extern "C" int radiance__gpu_host_unregister_pieces(void *base, size_t len, size_t piece, uint64_t *slowest_ns,
						    void (*pace)(void *), void *pace_arg)
{
	int rc = 0;
	if (slowest_ns)
		*slowest_ns = 0;
	for (size_t off = 0; off < len; off += piece) {
		if (off)
			piece_gap(pace, pace_arg);
		const uint64_t t0 = rclock_ns();
		hipError_t e = hipHostUnregister((char *)base + off);
		piece_took(slowest_ns, t0);
		if (e != hipSuccess && rc == 0)
			rc = fail("host unregister (piece)", e);
	}
	return rc;
}

extern "C" int radiance__gpu_host_register_pieces(void *base, size_t len, size_t piece, void **dev_ptr,
						  uint64_t *slowest_ns, void (*pace)(void *), void *pace_arg)
{
	char *b = (char *)base;
	void *d0 = NULL;
	size_t off;
	if (slowest_ns)
		*slowest_ns = 0;
	for (off = 0; off < len; off += piece) {
		size_t n = len - off < piece ? len - off : piece;
		if (off)
			piece_gap(pace, pace_arg);
		const uint64_t t0 = rclock_ns();
		hipError_t e = hipHostRegister(b + off, n, hipHostRegisterMapped | hipHostRegisterPortable);
		if (e != hipSuccess) {
			radiance__gpu_host_unregister_pieces(base, off, piece, NULL, NULL, NULL);
			return fail("host register (piece)", e);
		}
		void *d = NULL;
		e = hipHostGetDevicePointer(&d, b + off, 0);
		piece_took(slowest_ns, t0);
		if (e == hipSuccess && off == 0)
			d0 = d;
		/* the pieces must read as one range on the device too */
		if (e != hipSuccess || (char *)d != (char *)d0 + off) {
			radiance__gpu_host_unregister_pieces(base, off + piece, piece, NULL, NULL, NULL);
			if (e != hipSuccess)
				return fail("host device pointer (piece)", e);
			return radiance__gpu_fail_text(-EXDEV, "host register: piece %zu of a range maps to "
						       "%p, not %p", off / piece, d, (void *)((char *)d0 + off));
		}
	}
	*dev_ptr = d0;
	return 0;
}

extern "C" int radiance__gpu_event_create(void **ev)
{
	hipEvent_t e;
	CHECK("event create", hipEventCreate(&e));
	*ev = (void *)e;
	return 0;
}

/* Ordering only: no timestamps, which a record would otherwise take. */
extern "C" int radiance__gpu_event_create_sync(void **ev)
{
	hipEvent_t e;
	CHECK("event create", hipEventCreateWithFlags(&e, hipEventDisableTiming));
	*ev = (void *)e;
	return 0;
}

extern "C" int radiance__gpu_stream_wait_event(void *stream, void *ev)
{
	CHECK("stream wait event", hipStreamWaitEvent((hipStream_t)stream, (hipEvent_t)ev, 0));
	return 0;
}

extern "C" void radiance__gpu_event_destroy(void *ev)
{
	if (ev)
		(void)hipEventDestroy((hipEvent_t)ev);
}

extern "C" int radiance__gpu_event_record(void *ev, void *stream)
{
	CHECK("event record", hipEventRecord((hipEvent_t)ev, (hipStream_t)stream));
	return 0;
}

extern "C" int radiance__gpu_event_elapsed(void *start, void *end, float *ms)
{
	CHECK("event synchronize", hipEventSynchronize((hipEvent_t)end));
	CHECK("event elapsed", hipEventElapsedTime(ms, (hipEvent_t)start, (hipEvent_t)end));
	return 0;
}

extern "C" int radiance__gpu_graph_begin(void *stream)
{
	/* relaxed: the first launch of a kernel sets its attributes, which a
	 * global-mode capture would refuse */
	CHECK("begin capture", hipStreamBeginCapture((hipStream_t)stream, hipStreamCaptureModeRelaxed));
	return 0;
}

extern "C" int radiance__gpu_graph_end(void *stream, void **exec)
{
	hipGraph_t graph;
	hipGraphExec_t e;
	CHECK("end capture", hipStreamEndCapture((hipStream_t)stream, &graph));
	hipError_t err = hipGraphInstantiateWithFlags(&e, graph, 0);
	(void)hipGraphDestroy(graph);
	if (err != hipSuccess)
		return fail("graph instantiate", err);
	*exec = (void *)e;
	return 0;
}

extern "C" int radiance__gpu_graph_launch(void *exec, void *stream)
{
	CHECK("graph launch", hipGraphLaunch((hipGraphExec_t)exec, (hipStream_t)stream));
	return 0;
}

extern "C" void radiance__gpu_graph_destroy(void *exec)
{
	if (exec)
		(void)hipGraphExecDestroy((hipGraphExec_t)exec);
}

/* The ceiling for a bandwidth-bound kernel: every thread keeps four 16-byte
 * streaming loads in flight over a grid-stride loop; the xor keeps them live. */
__global__ void __launch_bounds__(256) rad_read_probe(const rad_u4 *buf, size_t n16, uint32_t nblocks,
						       uint32_t *sink)
{
	size_t stride = (size_t)256 * nblocks;
	size_t i = (size_t)RAD_BID_X() * 256 + RAD_TID();
	uint32_t acc = 0;
	for (; i + 3 * stride < n16; i += 4 * stride) {
		rad_u4 a = rad_ld_stream16(buf + i);
		rad_u4 b = rad_ld_stream16(buf + i + stride);
		rad_u4 c = rad_ld_stream16(buf + i + 2 * stride);
		rad_u4 d = rad_ld_stream16(buf + i + 3 * stride);
		acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
		acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
	}
	for (; i < n16; i += stride) {
		rad_u4 a = rad_ld_stream16(buf + i);
		acc ^= a.x ^ a.y ^ a.z ^ a.w;
	}
	if (acc == 0x9E3779B9u)
		*sink = acc;
}

extern "C" int radiance__gpu_read_probe(const void *buf, size_t bytes, uint32_t *sink, void *stream)
{
	hipLaunchKernelGGL(rad_read_probe, dim3(probe_blocks), dim3(256), 0, (hipStream_t)stream,
			   (const rad_u4 *)buf, bytes / 16, (uint32_t)probe_blocks, sink);
	return radiance__gpu_check_launch("read probe");
}
