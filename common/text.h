/*
 * Text that came from a client or a checkpoint: checked before the daemon
 * logs or lists it, and escaped for messages. Shared code (common/), used
 * by the daemon's registry and sessions.
 *
 * Thread safety: stateless; any thread.
 */
#ifndef RADIANCE_TEXT_H
#define RADIANCE_TEXT_H

#include <stddef.h>

/* Longest name (a model's, a checkpoint file's) a client may give. */
#define RTEXT_NAME_MAX 255

/* Checks a name that came from a client or a checkpoint and that the daemon
 * logs and lists to every client (LoadModel.name and file_names,
 * AttachModel.name, config.json's _name_or_path, a preload's directory
 * name, tensor names): UTF-8 text of 1..max_len bytes (max_len 0: any
 * length, empty too) with no control character (C0, DEL or C1). A newline or an
 * escape sequence in one would forge lines of the log and rows of
 * `radiancectl models`; invalid UTF-8 would make a ModelList undecodable
 * for protobuf runtimes that check strings. Returns 0, or -EINVAL with err
 * naming `field`, the name (escaped), the offending byte and its offset. */
int rtext_check(const char *field, const char *name, size_t max_len, char *err,
			size_t errlen);

/* The rule for a model name (LoadModel.name, AttachModel.name, the name a
 * checkpoint or a preload's directory gives): rtext_check's printable UTF-8
 * of 1..max_len bytes (max_len > 0) and, since the name is an argument of `radiancectl
 * layers/unload MODEL` and a column of `radiancectl models`, nothing that
 * reads as a path or as blank: no '/', not "." or "..", no space at
 * either end (" " alone included). Returns 0, or -EINVAL with err naming
 * `field`, the name (escaped), what is wrong and the rule. */
int rtext_check_model_name(const char *field, const char *name, size_t max_len, char *err,
			   size_t errlen);

/* s for a message: printable ASCII as is, every other byte as \xNN, cut
 * (with "...") where out is full. Never longer than outlen - 1. */
void rtext_escape(const char *s, char *out, size_t outlen);

#endif
