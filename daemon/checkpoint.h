/*
 * Checkpoint loader: AutoRound int4 (auto_round:auto_gptq packing) safetensors
 * checkpoints into a struct radiance_model (daemon/model.h), validated and
 * repacked once to the canonical host layout. docs/loader.md lists every
 * check, the routing rule and the error catalog.
 *
 * In short:
 *   - safetensors files (model.safetensors, or model.safetensors.index.json
 *     plus its shards): their headers are read with pread and validated as
 *     the format's reference implementation does (daemon/safetensors.h);
 *     the tensors of linear layers are read with pread into private
 *     memory one tensor at a time just before that layer is checked and
 *     repacked (never through a mapping: a client that shrinks its file
 *     mid-load gets -EIO for that load, the daemon no SIGBUS), so the load
 *     holds about one tensor beyond the resident model; every other tensor
 *     is read the same way (pread) into the model's shared memfd, which is
 *     then sealed (model->tensors_fd, daemon/model.h);
 *   - the quantization config (config.json's "quantization_config" and/or
 *     quantization_config.json, which must agree when both are present) must
 *     be AutoRound, auto_round:auto_gptq packing, bits 4, group_size 128,
 *     sym true (daemon/quant_config.h);
 *   - routing as engines do it: a module with a qweight inside
 *     block_name_to_quantize (or named by a 4-bit extra_config entry) is a
 *     W4A8 layer; a module held at >= 16 bits by extra_config, or a 2-D
 *     BF16/F16/F32 `<m>.weight` outside the blocks, is a bf16 linear; a
 *     tensor whose name contains "embed" (case-insensitive) or has a path
 *     component "wte"/"wpe" is an embedding, never a linear; every tensor of
 *     no linear is listed in model->other;
 *   - per W4A8 layer: qweight I32 [K/8, N], scales F16 [K/128, N] and finite,
 *     qzeros I32 [K/128, ceil(N/8)] with every word 0x77777777, g_idx absent
 *     or I32/I64 [K] equal to k/128, K % 128 == 0, bias [N] BF16/F16/F32;
 *     dtypes always from the safetensors header, never config.json's dtype.
 *
 * Errors: every function returns 0 (or a count) on success and -errno on
 * failure, and then writes one NUL-terminated message to err (errlen bytes;
 * err may be NULL when errlen is 0) naming the file, the tensor or layer,
 * what was found and what was expected:
 *   -EINVAL  the checkpoint is malformed, contradicts its config, or uses
 *            something the kernels do not support; also bad arguments
 *   -ENOENT  a required file is missing (config, weights, a shard)
 *   -ENOMEM  out of memory
 *   other -errno of memfd_create/ftruncate/mmap for the shared tensors
 *            (-EMFILE, -ENOSPC, ...)
 *   -EIO     a read failed, or a file shrank while being read ("<file>:
 *            tensor "<name>": file shrank to N bytes while loading
 *            (expected M)")
 *   other -errno from open/fstat (e.g. -EACCES) for the *_dir calls, and
 *   from dup (-EMFILE).
 *
 * Thread safety: the loader has no global state. Any number of loads may run
 * concurrently on different threads, even on the same fds (files are read
 * with pread only, never through the fd's file position). The progress
 * callback runs on the calling thread.
 */
#ifndef RADIANCE_CHECKPOINT_H
#define RADIANCE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint_files.h"   /* rcheckpoint_list_files, _dir_name */
#include "model.h"

/* One checkpoint file handed to the loader. name is its basename as in the
 * checkpoint directory: "config.json", "quantization_config.json",
 * "model.safetensors", "model.safetensors.index.json",
 * "model-00001-of-00002.safetensors". fd is open for reading; the loader
 * neither closes it nor moves its file position. Files with other names
 * (tokenizer.json, ...) are ignored. */
struct radiance_file {
	const char *name;
	int fd;
};

/* Load progress: done_bytes of total_bytes of checkpoint tensor data (what
 * goes into linear layers: qweight, scales, qzeros, g_idx, weight, bias;
 * and the shared tensors of no linear) has been read. Called with done 0
 * before the first layer, after every layer (but the last when no shared
 * tensor remains), and last with done == total once the shared tensors
 * are sealed too; done never decreases. */
typedef void (*radiance_progress_fn)(void *user, uint64_t done_bytes, uint64_t total_bytes);

/* Loads the checkpoint made of files[0..nfiles) into *out (free it with
 * radiance_model_destroy()). Required: model.safetensors.index.json with
 * every shard it names, or model.safetensors (both: refused with -EINVAL
 * unless the index names model.safetensors as a shard, see
 * rcheckpoint_single_beside_index); and a quantization
 * config (config.json with "quantization_config", or
 * quantization_config.json). name: the model's name; NULL means config.json's
 * "_name_or_path" basename, else "model". progress may be NULL.
 * Returns 0, -EINVAL, -ENOENT, -ENOMEM or -EIO (see above); *out is NULL on
 * failure. */
int radiance_checkpoint_load(const struct radiance_file *files, size_t nfiles, const char *name,
			     radiance_progress_fn progress, void *user,
			     struct radiance_model **out, char *err, size_t errlen);

/* A caller's check of what a load is about to build, called once every
 * layer is decided from the safetensors headers and before any tensor data
 * is read or anything is allocated for a layer (the daemon's limits:
 * max_n, max_k, resident bytes). layers[0..n_layers) have name (as the
 * checkpoint spells it: not yet checked to be printable), kind, n, k and
 * bytes (what the layer will hold resident) set and no arrays;
 * resident_bytes is their sum plus the shared tensors' memfd
 * (model->tensors_bytes), model_name the model's name. Returns 0, or
 * a negative errno (with err written) that ends the load. Runs on the
 * loading thread. */
typedef int (*radiance_plan_check_fn)(void *user, const char *model_name,
				      const struct radiance_layer *layers, size_t n_layers,
				      uint64_t resident_bytes, char *err, size_t errlen);

/* radiance_checkpoint_load with a plan check (NULL: none); check and
 * progress get the same user. Also returns whatever check returns. */
int radiance_checkpoint_load_checked(const struct radiance_file *files, size_t nfiles,
				     const char *name, radiance_plan_check_fn check,
				     radiance_progress_fn progress, void *user,
				     struct radiance_model **out, char *err, size_t errlen);

/* rcheckpoint_list_files(dir) + open each + radiance_checkpoint_load
 * + close. name NULL means the directory's basename (of its realpath, else
 * as written; "model" when that is empty). Also returns -errno of
 * open/fstat. */
int radiance_checkpoint_load_dir(const char *dir, const char *name, radiance_progress_fn progress,
				 void *user, struct radiance_model **out, char *err, size_t errlen);

/* Identity of a set of checkpoint files, to detect "the same checkpoint
 * loaded twice" without reading it: a hash of the (name, st_dev, st_ino,
 * st_size, st_mtim) tuples of files[0..n), sorted by name, so the order of
 * files does not matter. Files are the same checkpoint exactly when they
 * are the same inodes, unchanged since; a copy elsewhere or a rewrite gets
 * another identity. out: 64 lowercase hex digits and a NUL (four FNV-1a 64
 * lanes, each finished with a 64-bit mixer; not cryptographic).
 * Returns 0, -EINVAL (n == 0, a NULL name) or -errno of fstat. */
int radiance_checkpoint_identity(const struct radiance_file *files, size_t n, char out[65]);

#endif
