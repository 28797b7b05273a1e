/*
 * Mapped weights (MapModel / ModelMapping in radiance.proto, docs/mapped.md):
 * what a client that maps a model's device allocation may rely on.
 *
 * One allocation per model. Every layer's arrays are packed into it in
 * layer order, each starting at a multiple of RADIANCE_MAP_ALIGN, and the
 * allocation is rounded up to the device's allocation granularity
 * (ModelMapping.granularity, 2 MiB on an H200). Per layer:
 *   W4A8   weight  the device layout of kernels/numerics_gpu.h: tiles of 16
 *                  output rows x one 128-group, ordered [n_tile][group],
 *                  radiance__w4a8_weight_bytes(n, k) bytes;
 *          scales  32-byte blocks per (tile, group), radiance__w4a8_scale_bytes(n, k);
 *   BF16   weight  bf16 [n][k], row-major;
 *   both   bias    fp32 [n], or absent (bias_bytes 0).
 * The W4A8 arrays differ between vendors (NVIDIA keeps the scales of rows
 * g and g+8 as one half2): ModelMapping.vendor names the one they are for,
 * and a client built for another vendor must refuse the mapping.
 *
 * RADIANCE_MAP_LAYOUT_VERSION changes whenever anything above (or the
 * kernels' reading of it) changes: Welcome.map_layout_version says which
 * one a daemon serves, MapModel.layout_version which one the client reads.
 *
 * The test memfd handle (MAP_HANDLE_TEST_MEMFD, RADIANCE_FAKE_SHARE=1 on the
 * cpu backend) packs the canonical host arrays of daemon/model.h instead
 * (W4A8 weight = qweight uint32 [n][k/8], scales = fp16 [n][k/128]), with
 * the same alignment, so the protocol and the fd passing can be tested on a
 * machine without a GPU.
 */
#ifndef RADIANCE_MAP_H
#define RADIANCE_MAP_H

#define RADIANCE_MAP_LAYOUT_VERSION 1u
#define RADIANCE_MAP_ALIGN 256u             /* every array's offset is a multiple */
#define RADIANCE_MAP_IPC_HANDLE_BYTES 64u   /* cudaIpcMemHandle_t, hipIpcMemHandle_t */

#endif
