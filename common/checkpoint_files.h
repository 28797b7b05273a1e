/*
 * The checkpoint directory rules, one copy for the daemon's loader and the
 * client library (docs/loader.md, "Checkpoint directories"): which files of
 * a directory a load sends, what a shard name may be, and the model name a
 * directory gives when none is asked for.
 *
 * Thread safety: stateless; any thread.
 */
#ifndef RADIANCE_CHECKPOINT_FILES_H
#define RADIANCE_CHECKPOINT_FILES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* The files a checkpoint directory holds for the loader. */
#define RADIANCE_CHECKPOINT_CONFIG "config.json"
#define RADIANCE_CHECKPOINT_QCONFIG "quantization_config.json"
#define RADIANCE_CHECKPOINT_SINGLE "model.safetensors"
#define RADIANCE_CHECKPOINT_INDEX "model.safetensors.index.json"
/* The largest of the JSON files (config, index, quantization config) read. */
#define RADIANCE_CHECKPOINT_MAX_JSON (64u << 20)

/* Whether s, a shard name from the index's weight_map, is a plain basename:
 * not empty, no '/', not "." or "..". Anything else could reach outside the
 * checkpoint directory and is refused on both sides. */
bool rcheckpoint_shard_name_ok(const char *s);

/* A model.safetensors beside model.safetensors.index.json: transformers
 * loads the single file and vLLM the shards the index names, so the two may
 * be different weights, and such a checkpoint is refused rather than one of
 * them picked without a word, unless the index names model.safetensors as
 * one of its shards (then both loaders read it). weight_map is the index's
 * (an object); where says whose files they are (the directory, or "the
 * checkpoint files" of a LoadModel), for the message. 0, or -EINVAL with
 * err naming both files. */
int rcheckpoint_single_beside_index(const json_t *weight_map, const char *where, char *err,
				    size_t errlen);

/* The name a checkpoint directory gives its model when none is asked for:
 * the last component of dir as written (no symlink resolved), trailing
 * slashes dropped; empty for "/" or "". Points into dir, *len bytes (not
 * NUL-terminated). The daemon names preloads this way, the client its
 * loads, and radiance_checkpoint_load_dir after realpath(). */
const char *rcheckpoint_dir_name(const char *dir, size_t *len);

/* Whether the len bytes at s (a component rcheckpoint_dir_name gave) are
 * "." or "..": a relative path, which names no model (the directory it
 * stands for, or nothing, does). */
int rcheckpoint_dot_name(const char *s, size_t len);

/* Whether buf, the first len bytes of the checkpoint file name, is a Git
 * LFS pointer: the small text ("version https://git-lfs.github.com/spec/v1",
 * "oid sha256:...", "size N") a clone without LFS leaves in place of the
 * real content. When it is, err says so: "<name> is a Git LFS pointer (oid
 * sha256:..., size N), not <what>: run `git lfs pull` in the checkpoint's
 * repository" (what: "the tensor data", "the JSON"). Every checkpoint file
 * the loader reads is checked with it before it is parsed: a pointer would
 * otherwise read as a safetensors header length of 2.4e18, or as JSON that
 * fails at "version". */
bool rcheckpoint_lfs_pointer(const void *buf, size_t len, const char *name, const char *what,
			     char *err, size_t errlen);

/* Reads the small JSON file on fd (fname for messages) whole with pread
 * into private memory, so a file that changes under us is read once, and
 * parses it: a JSON object, no duplicate keys, at most
 * RADIANCE_CHECKPOINT_MAX_JSON bytes. 0 with *out set (json_decref it), or
 * -EINVAL (not a regular file, too big, a Git LFS pointer
 * (rcheckpoint_lfs_pointer), not JSON, not an object), -EIO (a
 * read failed, the file shrank), -ENOMEM, with *out NULL and err set. */
int rcheckpoint_read_json(int fd, const char *fname, json_t **out, char *err,
				  size_t errlen);

/* The files of dir a load sends (LoadModel, or the daemon's own load of a
 * path): config.json (required), quantization_config.json if present, then
 * either model.safetensors.index.json and every shard its weight_map names
 * (strcmp order, each once) or, when there is no index, model.safetensors;
 * both, with an index that does not name model.safetensors, is refused
 * (rcheckpoint_single_beside_index).
 * Each must be a regular file after symlinks. Returns the count and sets
 * *names to a NULL-terminated malloc'ed array of malloc'ed basenames (free
 * with rcheckpoint_files_free), or -errno with *names NULL and err
 * naming the file: -ENOENT (dir, a required file or a shard missing),
 * -EINVAL (a file that is not a regular file; a bad index: not JSON, no
 * weight_map object, an empty one, a shard name that is not a plain
 * basename; model.safetensors beside an index that does not name it),
 * -EIO, -ENOMEM. */
int rcheckpoint_list_files(const char *dir, char ***names, char *err, size_t errlen);

/* Frees what rcheckpoint_list_files returned; NULL is a no-op. */
void rcheckpoint_files_free(char **names);

#endif
