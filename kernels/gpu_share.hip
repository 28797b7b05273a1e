/*
 * Device memory shared between processes (w4a8_gpu.h, docs/mapped.md): the
 * daemon makes one exportable allocation per model, clients map it.
 *
 * VMM first: cuMemCreate / hipMemCreate with the POSIX-fd handle type, mapped
 * read-write for the daemon, exported once as an fd that travels with
 * SCM_RIGHTS. The physical memory is reference-counted by the driver: it
 * lives while any process holds a handle or a mapping of it, so a client
 * that keeps its mapping keeps the memory after the daemon released its own.
 *
 * IPC where VMM is missing (reported for RDNA GPUs, gfx1201 among them): one
 * plain allocation and its legacy IPC handle, 64 bytes that any process of
 * the machine can open while the allocation exists. There the importer's
 * mapping is always read-write, and what happens to it once the exporter
 * frees the memory is not defined by either vendor; the daemon never frees a
 * model a live session maps (daemon/session_map.c).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "numerics_gpu.h"
#include "w4a8_gpu.h"

extern "C" int radiance__gpu_fail_text(int rc, const char *fmt, ...);   /* gpu_runtime.hip */

static int vmm_fail(const char *what, rad_vmm_err e)
{
	return radiance__gpu_fail_text(-EIO, "%s: %s", what, rad_vmm_strerror(e));
}

extern "C" int radiance__gpu_share_caps(int ordinal, struct radiance__gpu_share_caps *caps)
{
	memset(caps, 0, sizeof *caps);
	caps->ipc = 1;
	int yes = 0;
	rad_vmm_err e = rad_vmm_supported(ordinal, &yes);
	if (e != RAD_VMM_OK) {
		snprintf(caps->why, sizeof caps->why, "asking for VMM support failed: %s", rad_vmm_strerror(e));
		return 0;
	}
	if (!yes) {
#ifdef RAD_NVIDIA
		snprintf(caps->why, sizeof caps->why, "device %d has no VMM with POSIX fd handles", ordinal);
#elif defined(HIP_VERSION_MAJOR) && HIP_VERSION_MAJOR >= 6
		snprintf(caps->why, sizeof caps->why,
			 "device %d reports hipDeviceAttributeVirtualMemoryManagementSupported 0", ordinal);
#else
		snprintf(caps->why, sizeof caps->why, "built with HIP %d.%d headers, which cannot ask for VMM support",
			 HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
#endif
		return 0;
	}
	e = rad_vmm_granularity(ordinal, &caps->granularity);
	if (e != RAD_VMM_OK || caps->granularity == 0) {
		snprintf(caps->why, sizeof caps->why, "VMM granularity query failed: %s",
			 e != RAD_VMM_OK ? rad_vmm_strerror(e) : "granularity 0");
		caps->granularity = 0;
		return 0;
	}
	caps->vmm = 1;
	return 0;
}

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

extern "C" int radiance__gpu_share_alloc(int ordinal, enum radiance__gpu_share_kind kind, size_t bytes,
					 struct radiance__gpu_share *s)
{
	memset(s, 0, sizeof *s);
	s->fd = -1;
	if (bytes == 0)
		bytes = 1;
	if (kind == RADIANCE_SHARE_IPC) {
		hipIpcMemHandle_t h;
		hipError_t e = hipMalloc(&s->base, bytes);
		if (e != hipSuccess) {
			s->base = NULL;
			return radiance__gpu_fail_text(-ENOMEM, "device allocation of %zu bytes: %s", bytes,
						       hipGetErrorString(e));
		}
		if ((e = hipIpcGetMemHandle(&h, s->base)) != hipSuccess) {
			(void)hipFree(s->base);
			s->base = NULL;
			return radiance__gpu_fail_text(-EIO, "IPC handle: %s", hipGetErrorString(e));
		}
		static_assert(sizeof h == RADIANCE__GPU_IPC_BYTES, "IPC handle size");
		memcpy(s->ipc, &h, sizeof h);
		s->kind = kind;
		s->bytes = bytes;
		s->granularity = 1;
		return 0;
	}
	if (kind != RADIANCE_SHARE_VMM)
		return radiance__gpu_fail_text(-EINVAL, "share kind %d", (int)kind);
	struct radiance__gpu_share_caps caps;
	radiance__gpu_share_caps(ordinal, &caps);
	if (!caps.vmm)
		return radiance__gpu_fail_text(-ENOTSUP, "%s", caps.why);
	const size_t total = round_up(bytes, caps.granularity);
	rad_vmm_handle h;
	rad_vmm_err e = rad_vmm_create(ordinal, total, &h);
	if (e != RAD_VMM_OK)
		return radiance__gpu_fail_text(-ENOMEM, "VMM allocation of %zu bytes: %s",
					       total, rad_vmm_strerror(e));
	void *va = NULL;
	if ((e = rad_vmm_map(h, total, caps.granularity, ordinal, 0, &va)) != RAD_VMM_OK) {
		rad_vmm_release(h);
		return vmm_fail("mapping the VMM allocation", e);
	}
	int fd = -1;
	if ((e = rad_vmm_export_fd(h, &fd)) != RAD_VMM_OK) {
		rad_vmm_unmap(va, total);
		rad_vmm_release(h);
		return vmm_fail("exporting the VMM allocation as an fd", e);
	}
	s->kind = kind;
	s->base = va;
	s->bytes = total;
	s->granularity = caps.granularity;
	s->fd = fd;
	s->handle = (uint64_t)h;
	return 0;
}

extern "C" void radiance__gpu_share_free(struct radiance__gpu_share *s)
{
	if (s->kind == RADIANCE_SHARE_VMM && s->base) {
		rad_vmm_unmap(s->base, s->bytes);
		rad_vmm_release((rad_vmm_handle)s->handle);
	} else if (s->kind == RADIANCE_SHARE_IPC && s->base) {
		(void)hipFree(s->base);
	}
	if (s->fd >= 0)
		close(s->fd);
	memset(s, 0, sizeof *s);
	s->fd = -1;
}

extern "C" int radiance__gpu_share_import_fd(int ordinal, int fd, size_t bytes, size_t granularity, int read_only,
					     struct radiance__gpu_import *imp)
{
	memset(imp, 0, sizeof *imp);
	if (!granularity || bytes == 0 || bytes % granularity)
		return radiance__gpu_fail_text(-EINVAL, "mapping of %zu bytes is not a multiple of its granularity %zu",
					       bytes, granularity);
	rad_vmm_handle h;
	rad_vmm_err e = rad_vmm_import_fd(fd, &h);
	if (e != RAD_VMM_OK)
		return vmm_fail("importing the daemon's VMM fd", e);
	void *va = NULL;
	if ((e = rad_vmm_map(h, bytes, granularity, ordinal, read_only, &va)) != RAD_VMM_OK) {
		rad_vmm_release(h);
		return vmm_fail(read_only ? "mapping the imported allocation read-only"
					  : "mapping the imported allocation",
				e);
	}
	/* the mapping holds the memory now; the handle is not needed to unmap */
	rad_vmm_release(h);
	imp->kind = RADIANCE_SHARE_VMM;
	imp->base = va;
	imp->bytes = bytes;
	return 0;
}

extern "C" int radiance__gpu_share_import_ipc(const uint8_t ipc[RADIANCE__GPU_IPC_BYTES], size_t bytes,
					      struct radiance__gpu_import *imp)
{
	memset(imp, 0, sizeof *imp);
	hipIpcMemHandle_t h;
	memcpy(&h, ipc, sizeof h);
	void *p = NULL;
	hipError_t e = hipIpcOpenMemHandle(&p, h, hipIpcMemLazyEnablePeerAccess);
	if (e != hipSuccess)
		return radiance__gpu_fail_text(-EIO, "opening the daemon's IPC handle: %s", hipGetErrorString(e));
	imp->kind = RADIANCE_SHARE_IPC;
	imp->base = p;
	imp->bytes = bytes;
	return 0;
}

extern "C" void radiance__gpu_share_unimport(struct radiance__gpu_import *imp)
{
	if (imp->kind == RADIANCE_SHARE_VMM && imp->base)
		rad_vmm_unmap(imp->base, imp->bytes);
	else if (imp->kind == RADIANCE_SHARE_IPC && imp->base)
		(void)hipIpcCloseMemHandle(imp->base);
	memset(imp, 0, sizeof *imp);
}
