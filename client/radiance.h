/*
 * libradiance: the client library of radianced.
 *
 * radianced owns one compute device, keeps AutoRound int4 checkpoints
 * resident once, and runs W4A8 linear layers for many client processes. A
 * client connects over a Unix socket (the control plane: handshake, models,
 * stats) and gets a per-session shared-memory segment (the data plane: a
 * submission queue, a completion queue and an arena that holds activations
 * and outputs).
 *
 * Tensors. A request runs one linear layer of a resident model:
 *
 *     y[rows, N] = x[rows, K] * W^T + bias
 *
 *   x  [rows][K]  row-major, bf16 or fp16 (RADIANCE_BF16 / RADIANCE_FP16),
 *                 raw 16-bit patterns in host (little-endian) order;
 *   y  [rows][N]  row-major, always bf16;
 *   N, K          the layer's, from struct radiance_layer_info.
 *
 * Buffer layout. The functions take bare pointers and cannot see strides or
 * dtypes, so each buffer must be exactly this, or the results are silently
 * wrong:
 *   x  rows * K elements of 2 bytes, contiguous and row-major: element (r, k)
 *      at byte offset (r * K + k) * 2, no padding between rows; bytes =
 *      rows * K * 2. The dtype argument says what the 16 bits are.
 *   y  rows * N bf16 elements, contiguous and row-major: (r, n) at byte
 *      offset (r * N + n) * 2; bytes = rows * N * 2.
 * Alignment: caller memory (radiance_linear) needs only the 2-byte
 * alignment of a uint16_t array (it is copied); arena buffers
 * (radiance_submit) must start on a 16-byte boundary, which
 * radiance_arena_alloc() memory does (64). From PyTorch that is
 * x.contiguous() of dtype torch.bfloat16 or torch.float16 on the CPU, shape
 * [rows, K]: a transposed view, a slice with a stride or a float32 tensor
 * passed as is reads the wrong numbers.
 * W4A8 layers quantize each row of x to fp8 e4m3 with a per-token scale the
 * way vLLM's dynamic per-token fp8 quant does (scaled_fp8_quant with
 * use_per_token_if_dynamic), multiply with the int4 weights (symmetric, zero
 * point 8, group size 128 along K), accumulate in fp32 and round once to bf16
 * (round to nearest even). bf16 layers skip the fp8 step. The exact rules are
 * in docs/numerics.md. On a W4A8 layer a row of x holding Inf or NaN yields
 * a NaN output row (its per-token scale is not finite). A bf16 layer follows
 * IEEE arithmetic element by element instead: a NaN in a row gives a NaN row,
 * an Inf gives +-Inf or NaN per output as the products and sums do.
 *
 * Errors. Functions return 0 (or a count) on success and a negative errno
 * value on failure; radiance_strerror() names it. Constructors return NULL
 * and set errno. Errors that end the connection (the daemon went away, or one
 * side broke the protocol) are sticky: every later call on that handle
 * returns the same code, see radiance_get_error(). Errors the daemon reports
 * for one request (an unknown model name, a bad checkpoint) are not sticky.
 * radiance_error_message() gives the text behind the most recent failure.
 * Every call that the thread-safety check below covers may also return
 * -EBUSY: another thread is inside a call on the same handle.
 *
 * Logging. The library writes nothing to stdout or stderr. Set
 * radiance_options.log to receive its messages.
 *
 * Thread safety. A handle is NOT thread-safe: one thread at a time may be
 * inside a call on it (use one handle per thread, or serialize the calls
 * with your own lock; passing a handle to another thread between calls is
 * fine). The library checks the rule at the entry of every call that uses
 * the handle (radiance_load_model, _attach_model, _release_model,
 * _unload_preloaded, _get_model, _list_models, _list_tensors,
 * _map_tensors, _open_rings, _arena_alloc,
 * _arena_free, _submit, _poll, _wait, _linear, _get_stats, _disconnect): one
 * made while another thread is inside a call on the same handle fails at
 * once with -EBUSY (radiance_arena_alloc: NULL, errno EBUSY), never waits,
 * and touches nothing else of the handle; radiance_error_message() on that
 * thread then returns "<function>: radiance handle used by two threads at
 * once: a handle is not thread-safe; use one per thread or lock". This
 * -EBUSY is not sticky. radiance_arena_free() refused so frees nothing and
 * says so to the log callback; radiance_disconnect() refused so does not
 * free the handle (freeing it under the other thread's call would be a use
 * after free there): it logs that and leaks it. Nothing can catch a call
 * that starts after radiance_disconnect() freed the handle. The getters
 * radiance_get_error, radiance_error_message (but for the text above),
 * radiance_get_ring_info, radiance_held_model and radiance_in_flight are
 * not checked: call them from the thread that uses the handle, or under
 * your lock. radiance_get_server_info() does not change after connect and
 * may be called from any thread. Callbacks (log, load progress) run inside
 * the call, on its thread, and must not call into the same handle: such a
 * call fails at once with -EDEADLK (radiance_arena_alloc: NULL, errno
 * EDEADLK), touches nothing, is not sticky, and radiance_error_message()
 * in the callback says "<function>: called from inside the <log|load
 * progress> callback of a call on this handle: ..."; radiance_disconnect()
 * there is refused and logged, and the handle stays the caller's.
 * Different handles are independent and may be used concurrently from
 * different threads. Functions that take no handle (radiance_strerror,
 * radiance_default_socket_path, radiance_find_layer, the *_free functions on
 * their own objects, radiance_version, radiance_protocol_version) are safe
 * from any thread. A handle must not be used across fork(): the child
 * connects its own. Every call that would talk to the daemon or touch the
 * rings from a forked child fails with -EBADFD (sticky in the child's copy)
 * instead of corrupting the parent's session. (A child may call
 * radiance_disconnect() on an inherited handle to free its copy: that closes
 * only the child's descriptors and mappings; the parent's session goes on.)
 *
 * ABI. Structs the caller fills (options) start with a `size` field that the
 * caller sets to sizeof(the struct), so new fields can be appended; use the
 * *_INIT macros. Structs the library returns are allocated by the library and
 * may grow at the end.
 *
 * Link with `pkg-config --cflags --libs radiance`.
 */
#ifndef RADIANCE_CLIENT_H
#define RADIANCE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is the library's interface; the library is built
 * with -fvisibility=hidden, so this is what it exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

struct radiance;   /* a connection (session) to radianced; opaque */

/* Element type of x. Values match the wire protocol's DType. */
enum radiance_elem {
	RADIANCE_BF16 = 1,
	RADIANCE_FP16 = 2,
};

/* What a layer holds. The wire protocol's LayerKind, with its values; the
 * daemon uses this enum too. */
enum radiance_layer_kind {
	RADIANCE_LAYER_W4A8 = 1,   /* int4 weights, fp8 e4m3 activations */
	RADIANCE_LAYER_BF16 = 2,   /* weights kept at 16 bits in the checkpoint */
};

/* Receives one message of the library (no trailing newline) with its syslog
 * priority (<syslog.h>: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG). Called
 * from inside the library function that produced it, on the caller's thread;
 * must not call back into the same handle. */
typedef void (*radiance_log_fn)(void *user, int priority, const char *message);

/* Connection options. Zero fields take the defaults given. */
struct radiance_options {
	uint32_t size;              /* sizeof(struct radiance_options) */
	const char *client_name;    /* shown in the daemon's logs and stats;
	                               default "libradiance"; copied */
	radiance_log_fn log;        /* default NULL: silent */
	void *log_user;
	int log_priority;           /* most verbose syslog priority passed to
	                               log; 0 (LOG_EMERG, unused) = LOG_WARNING */
	/* Data plane, asked for when the rings are opened. 0 = the daemon's
	 * default; the daemon refuses values above its limits (-EINVAL). */
	uint32_t sq_entries;        /* power of two */
	uint32_t cq_entries;        /* power of two, >= sq_entries */
	uint64_t arena_bytes;       /* bytes of shared arena for x and y buffers */
	/* How long a wait spins on the completion queue before it sleeps on
	 * the doorbell, in microseconds. 0 = the default for the daemon's
	 * backend (its Welcome): 30 on "cpu" (its compute threads need the
	 * cores), 200 on a GPU (decode round trips of 25-110 us would
	 * otherwise each pay a doorbell wake-up); -1 = never spin; below -1:
	 * EINVAL. */
	int32_t spin_us;
	/* Longest wait for one control reply (or one load progress step), in
	 * milliseconds. 0 = wait forever (the default); negative: EINVAL. */
	int32_t timeout_ms;
	/* Longest time radiance_connect() and radiance_reconnect() take to
	 * get a session, in milliseconds: while the socket is missing (ENOENT,
	 * in a directory that exists) or nobody listens (ECONNREFUSED) they
	 * retry (10 ms, doubling to 500 ms), and the daemon's Welcome is
	 * awaited within what is left. 0 = RADIANCE_CONNECT_TIMEOUT_MS (30 s:
	 * under socket activation connect() succeeds at once and the Welcome
	 * comes once the daemon has started its backend and preloads, which
	 * takes seconds on a GPU; a restart without activation leaves the path
	 * missing for as long). -1 = one attempt, the Welcome awaited as any
	 * reply (timeout_ms). Below -1: EINVAL. Added after timeout_ms:
	 * callers built against an older header (smaller .size) get 0. */
	int32_t connect_timeout_ms;
};

#define RADIANCE_CONNECT_TIMEOUT_MS 30000

#define RADIANCE_OPTIONS_INIT { .size = sizeof(struct radiance_options) }

/* --- version, errors ------------------------------------------------------ */

/* The library's version string, e.g. "0.1.0". Static storage. */
const char *radiance_version(void);

/* The wire protocol version this library speaks (sends in its handshake and
 * requires of the daemon), e.g. 1. Compare with
 * radiance_server_info.protocol_version. Any thread. */
uint32_t radiance_protocol_version(void);

/* Text for a return code of this library: err may be negative (as returned)
 * or positive. Never NULL; static storage; any thread. */
const char *radiance_strerror(int err);

/* --- connection ----------------------------------------------------------- */

/* Writes the socket path radiance_connect(NULL, ...) uses into buf (size
 * bytes, NUL-terminated): $RADIANCE_SOCKET if set and non-empty; otherwise,
 * with $RADIANCE_DEVICE=N set and non-empty (a GPU ordinal, 0 to 1024, in
 * decimal without leading zeros), /run/radiance/radiance-N.sock: the socket
 * of radianced@N, one daemon per GPU; otherwise
 * /run/radiance/radiance.sock for root; otherwise
 * $XDG_RUNTIME_DIR/radiance.sock when $XDG_RUNTIME_DIR is set and that socket
 * exists, else /run/radiance/radiance.sock (a per-user daemon first, then
 * the system one). Returns 0, -ENAMETOOLONG, or -EINVAL when
 * $RADIANCE_DEVICE is not such a number. Any thread. */
int radiance_default_socket_path(char *buf, size_t size);

/* Connects to radianced at socket_path (NULL: radiance_default_socket_path)
 * and performs the handshake (the protocol version of
 * radiance_protocol_version()). opt may be NULL. Blocks until the daemon
 * answers, at most opt->connect_timeout_ms (default 30 s, see there).
 * Returns a new handle, owned by the caller (radiance_disconnect), or NULL
 * with errno set:
 *   EACCES                        no permission on the socket;
 *   ENOTSOCK                      the path exists but is not a socket (a
 *                                 regular file, a directory, ...);
 *   ENAMETOOLONG                  the path does not fit a sockaddr_un;
 *   EBUSY                         the daemon refused: it already serves as
 *                                 many sessions as it allows (max_sessions),
 *                                 or as many of this uid's as it allows
 *                                 (max_sessions_per_uid);
 *   EPROTO                        the daemon speaks another protocol version,
 *                                 or sent something that is not protocol;
 *   ECONNRESET                    the daemon closed the connection;
 *   ENOENT, ECONNREFUSED          no socket, or nobody listens on it,
 *                                 still after opt->connect_timeout_ms
 *                                 (default 30 s) of retrying (at once when
 *                                 the socket's directory does not exist);
 *   ETIMEDOUT                     no Welcome within what is left of
 *                                 opt->connect_timeout_ms, or no answer
 *                                 within opt->timeout_ms;
 *   EINVAL                        opt->size too small for the fields
 *                                 before `log`, spin_us below -1,
 *                                 timeout_ms below 0 or connect_timeout_ms
 *                                 below -1; or socket_path NULL
 *                                 and $RADIANCE_DEVICE not a GPU ordinal;
 *   ENOMEM, or an errno of socket()/connect().
 * There is no handle to ask radiance_error_message() then: the reason (the
 * daemon's text for a refusal, e.g. "too many sessions (the limit is 64)")
 * goes to opt->log at LOG_WARNING, as one message "cannot connect to PATH:
 * REASON" (with no default path: "cannot connect: $RADIANCE_DEVICE is 'X',
 * not a GPU ordinal ..." or "... ($RADIANCE_SOCKET) is too long ..."). */
struct radiance *radiance_connect(const char *socket_path, const struct radiance_options *opt);

/* Closes the connection: the daemon drops every model reference and the
 * rings of this session; in-flight requests are abandoned. Unmaps the arena:
 * pointers from radiance_arena_alloc() die. Sends nothing: it closes the
 * socket, so it is also how a forked child frees an inherited handle.
 * NULL is a no-op; r is freed, so a second call on it is a double free (as
 * with free()). */
void radiance_disconnect(struct radiance *r);

/* Replaces r's session with a new one on the same socket, as after a
 * daemon restart (the old session may be dead or still up; it is closed).
 * - Every request that was not delivered yet (radiance_submit()'s, in
 *   flight or completed and kept aside) is failed: radiance_poll() /
 *   radiance_wait() return one completion for each, status -ECANCELED and
 *   error "in flight when radiance_reconnect() replaced the session
 *   (<the old session's error>): its output is lost; resubmit it".
 *   radiance_in_flight() counts them until they are reaped.
 * - The rings and the arena go: pointers from radiance_arena_alloc() die;
 *   the rings open again on first use.
 * - Every model r held is attached again by name (AttachModel), so it must
 *   be resident in the new daemon (preloaded, or loaded by another client);
 *   the daemon assigns ids: a model's id may differ from before
 *   (radiance_attach_model(r, name, &id) again gives the current one and
 *   takes no second reference).
 * - The sticky error is cleared on success; options and socket path are
 *   those of radiance_connect().
 * Returns 0; -ENOENT when the session is up but some held models could not
 * be attached again (not sticky; radiance_error_message() names each and
 * why; they are no longer held); or, when no session could be made, the
 * connect error (-ECONNREFUSED, -ENOENT, -ETIMEDOUT, -EBUSY, ..., sticky
 * until the next radiance_reconnect(), which may be tried again: r keeps
 * the models to attach). -EBADFD in a forked child. Same thread rule as
 * every call on r (-EBUSY when another thread is inside one). */
int radiance_reconnect(struct radiance *r);

/* 0, or the sticky error that ended this connection (negative errno:
 * -ECONNRESET the daemon closed it; -ESHUTDOWN the daemon said it stops
 * (radiance_error_message(): "daemon stopping: SIGTERM"; the requests it
 * had taken were run first, and radiance_poll()/radiance_wait() still
 * deliver their completions before returning -ESHUTDOWN); the daemon's own
 * code when it ended the
 * session and said why (its text in radiance_error_message()); -EPROTO a
 * protocol violation by either side; -ETIMEDOUT no reply within the
 * timeout; -ENOMEM while receiving, ...). Once nonzero it never changes and
 * every call on the handle (other than these getters and disconnect)
 * returns it. -EBADFD: the handle was used in a forked child. r NULL:
 * -EINVAL. */
int radiance_get_error(const struct radiance *r);

/* Text of the most recent failure on this handle: the daemon's message for
 * an Error reply or a failed request, or the library's own description.
 * "" if none, and for r NULL. Owned by the handle, valid until the next call
 * on it. */
const char *radiance_error_message(const struct radiance *r);

/* The daemon's description of itself, from the handshake. */
struct radiance_server_info {
	uint32_t protocol_version;
	const char *server_version; /* radianced's version string */
	const char *backend;        /* "cpu", "cuda", "hip" */
	const char *device;         /* e.g. "NVIDIA H200", or the CPU model */
	uint64_t session_id;        /* this connection's session */
	uint32_t max_rows;          /* largest rows (M) one request may carry */
	uint32_t map_layout_version;/* mapped-weights layout the daemon serves
	                               (radiance_map_model); 0: an older radianced
	                               that does not offer mapping */
	uint32_t tensors_version;   /* shared tensors the daemon serves
	                               (radiance_list_tensors, _map_tensors);
	                               0: an older radianced without them */
	uint32_t max_request_layers;/* most layers one radiance_submit_multi /
	                               radiance_linear_multi request may name; 0:
	                               an older radianced without them */
};

/* Owned by the handle; valid until radiance_disconnect. Never NULL. */
const struct radiance_server_info *radiance_get_server_info(const struct radiance *r);

/* --- models --------------------------------------------------------------- */

struct radiance_layer_info {
	uint32_t index;                  /* what requests name as `layer` */
	const char *name;                /* module path, e.g.
	                                    "encoder.layer.0.attention.self.query" */
	enum radiance_layer_kind kind;
	uint32_t n;                      /* output features (N) */
	uint32_t k;                      /* input features (K) */
	bool has_bias;
	uint64_t bytes;                  /* resident bytes of its weights */
};

/* A checkpoint tensor that belongs to no linear layer (norms, embeddings). */
struct radiance_other_tensor {
	const char *name;
	const char *dtype;               /* safetensors dtype, e.g. "F32" */
	uint32_t ndim;
	const uint64_t *shape;           /* [ndim] */
};

struct radiance_model_info {
	uint32_t model_id;               /* what requests name as `model_id` */
	const char *name;
	uint64_t resident_bytes;         /* all layers, on the device */
	bool preloaded;                  /* from the daemon's config (or --preload):
	                                    the daemon holds a reference of its own
	                                    until radiance_unload_preloaded() */
	uint32_t users;                  /* sessions holding a reference */
	size_t n_layers;                 /* 0 in radiance_list_models() results */
	const struct radiance_layer_info *layers;   /* [n_layers], by index */
	size_t n_other;
	const struct radiance_other_tensor *other;   /* [n_other] */
};

/* Called while a load runs; bytes of checkpoint data read by the daemon. */
typedef void (*radiance_load_progress_fn)(void *user, uint64_t done_bytes, uint64_t total_bytes);

struct radiance_load_options {
	uint32_t size;                   /* sizeof(struct radiance_load_options) */
	const char *name;                /* model name; NULL or "": the basename
	                                    of the directory (as the daemon names
	                                    preloaded checkpoints; "." and ".."
	                                    resolved to the directory they name).
	                                    Printable UTF-8 of 1..255 bytes, no
	                                    '/', not "." or "..", no space at
	                                    either end, else the load fails with
	                                    -EINVAL saying which */
	radiance_load_progress_fn progress;   /* may be NULL */
	void *progress_user;
};

#define RADIANCE_LOAD_OPTIONS_INIT { .size = sizeof(struct radiance_load_options) }

/* Loads the checkpoint in directory dir (AutoRound auto_round:auto_gptq int4,
 * group size 128: config.json, quantization_config.json when present,
 * model.safetensors or model.safetensors.index.json and its shards; a
 * directory with both is refused with -EINVAL, naming them, unless the
 * index names model.safetensors as a shard). The library opens those files itself, read-only, and passes their descriptors
 * to the daemon, so the daemon reads exactly what this process can read.
 *
 * Deduplication is by file identity, not by name: if the daemon already
 * holds (or is loading) a model from the very same files (same inodes,
 * unchanged since), the session attaches to it instead, under the name it
 * already has, whatever opt->name says; a model is resident once however
 * many sessions load it. Other files under a name that a resident model
 * already has are refused with -EEXIST (the daemon never serves one
 * checkpoint's weights for another's name): load them under another name.
 *
 * The session holds one reference (loading or attaching a model it already
 * holds changes nothing) until radiance_release_model() or disconnect; a
 * model nobody references (and not preloaded) is unloaded. Blocks for the
 * whole load; opt->progress is called as the daemon reports progress. opt
 * may be NULL.
 * On success *model_id is set and radiance_held_model() describes it.
 * Returns 0, or:
 *   -ENOENT     dir or a required file is missing;
 *   -EACCES     a file cannot be read by this process;
 *   -EINVAL     the checkpoint is malformed or unsupported, or one of its
 *               files is not a regular file (the message in
 *               radiance_error_message());
 *   -EEXIST     a different checkpoint with this name is already resident;
 *   -ENOMEM     the daemon (or this process) is out of memory;
 *   -EDQUOT     the model would take the daemon above one of its memory
 *               limits (max_model_bytes, or max_model_bytes_per_uid for
 *               this process's uid, which is charged for a model it loads
 *               until the model is unloaded); the message names the limit,
 *               its value and the option that sets it. Nothing was read;
 *   -E2BIG      more files than one message may carry (64), or a layer
 *               larger than the daemon serves (N above max_n, K above
 *               max_k: the message says which);
 *   -ETIMEDOUT  no progress within the timeout;
 *   another daemon-reported errno, or a sticky connection error. */
int radiance_load_model(struct radiance *r, const char *dir,
			const struct radiance_load_options *opt, uint32_t *model_id);

/* Attaches to a model the daemon already holds (preloaded, or loaded by
 * another session) by name, taking a reference as radiance_load_model does.
 * Returns 0 and sets *model_id, or -ENOENT (no such model), -EINVAL (name
 * NULL or empty), or a sticky error. */
int radiance_attach_model(struct radiance *r, const char *name, uint32_t *model_id);

/* Drops this session's reference to model_id (taken by load or attach).
 * Requests for it must have completed. The radiance_held_model() pointer
 * dies. Returns 0, -ENOENT (this session holds no such reference), -EBUSY
 * (requests still in flight on this handle), or a sticky error. */
int radiance_release_model(struct radiance *r, uint32_t model_id);

/* Drops the daemon's own hold on a preloaded model (radianced --preload):
 * it is unloaded at once if no session holds it, else when the last one
 * releases it. This session's own reference, if any, is not touched.
 * Allowed to root (uid 0) and to the user the daemon runs as. Returns 0,
 * -ENOENT (no preloaded model has that id), -EPERM (this process's uid may
 * not), or a sticky error. */
int radiance_unload_preloaded(struct radiance *r, uint32_t model_id);

/* The description of a model this session holds (layers included), or NULL
 * when it holds no reference to model_id. Owned by the handle, valid until
 * that reference is released or the handle disconnected. No I/O. */
const struct radiance_model_info *radiance_held_model(const struct radiance *r,
						       uint32_t model_id);

/* Index of the layer called `name` in m (0..n_layers-1), or -ENOENT. Any
 * thread. */
int radiance_find_layer(const struct radiance_model_info *m, const char *name);

/* Asks the daemon for any resident model's description, layers included
 * (no reference is taken). *out is allocated; free it with
 * radiance_model_info_free(). Returns 0, -ENOENT, -EINVAL (out NULL), or a
 * sticky error. */
int radiance_get_model(struct radiance *r, uint32_t model_id, struct radiance_model_info **out);
void radiance_model_info_free(struct radiance_model_info *m);

struct radiance_model_list {
	size_t count;
	struct radiance_model_info *models;   /* [count]; layers not filled */
};

/* Every resident model. *out is allocated; free it with
 * radiance_model_list_free(). Returns 0, -EINVAL (out NULL) or a sticky
 * error. */
int radiance_list_models(struct radiance *r, struct radiance_model_list **out);
void radiance_model_list_free(struct radiance_model_list *list);

/* --- data plane ----------------------------------------------------------- */

/* Asks the daemon for this session's shared-memory segment (SQ, CQ, arena;
 * sizes from the connect options) and maps it. Called implicitly by the
 * first radiance_arena_alloc(), radiance_submit() or radiance_linear();
 * call it explicitly to fail early. A second call is a no-op.
 * Returns 0, -EINVAL (sizes refused), -EDQUOT (the arena would take the
 * daemon above max_total_arena_bytes, or this uid above
 * max_arena_bytes_per_uid; not sticky: retry when other sessions closed, or
 * ask for a smaller arena_bytes), -ENOMEM, -EPROTO (the segment does not
 * have the layout of proto/shm.h; sticky), or a sticky error. */
int radiance_open_rings(struct radiance *r);

/* Geometry of the open rings (after radiance_open_rings). */
struct radiance_ring_info {
	uint32_t sq_entries;
	uint32_t cq_entries;             /* most requests in flight at once */
	uint64_t arena_bytes;
	void *arena;                     /* start of the arena in this process */
};

/* Fills *info. Returns 0, or -ENOTCONN when the rings are not open. */
int radiance_get_ring_info(const struct radiance *r, struct radiance_ring_info *info);

/* Allocates bytes (> 0) of the shared arena, 64-byte aligned, for x and y of
 * asynchronous requests: data written there reaches the daemon without a
 * copy. Opens the rings first if needed. Returns a pointer into the arena,
 * or NULL with errno ENOMEM (no free extent large enough), EINVAL (bytes 0),
 * or the errno of radiance_open_rings(). The memory is shared with the
 * daemon: it reads x and writes y while a request using them is in flight. */
void *radiance_arena_alloc(struct radiance *r, size_t bytes);

/* Returns a block from radiance_arena_alloc() to the arena. NULL is a no-op.
 * Do not free a buffer a request in flight uses. Pointers not from
 * radiance_arena_alloc() are ignored (and logged). */
void radiance_arena_free(struct radiance *r, void *p);

/* Submits y = layer(x) without waiting.
 *   model_id  a model this session holds (load/attach);
 *   layer     a layer index of that model (struct radiance_layer_info.index);
 *   rows      M, 1 <= rows <= server max_rows;
 *   dtype     element type of x;
 *   x         arena pointer to [rows][K] elements of dtype, rows * K * 2 bytes;
 *   y         arena pointer to [rows][N] bf16, rows * N * 2 bytes, written by
 *             the daemon;
 * both contiguous and row-major (see "Buffer layout" above), from
 * radiance_arena_alloc() memory, 16-byte aligned, the whole tensor
 * inside the arena, x and y not overlapping (the daemon refuses that with
 * status -EINVAL). Requests in flight together must be independent: the
 * daemon batches equal layers across sessions, so they may complete in any
 * order. Neither x nor y may be touched until the request completes
 * (radiance_poll / radiance_wait). *request_id (may be NULL) receives the
 * id the completion will carry; ids increase by one per request, from 1.
 * At most cq_entries requests are in flight on a handle.
 * Returns 0, or:
 *   -EAGAIN   cq_entries requests in flight, not completed by the daemon
 *             yet (or the SQ is full): reap a completion first;
 *   -ENOENT   this session holds no model model_id, or layer is out of
 *             range for the model (0 .. n_layers - 1; the message says
 *             which): the daemon answers a request for a layer it does
 *             not have with the same code;
 *   -EINVAL   rows out of range, bad dtype, or x/y misaligned;
 *   -EFAULT   x or y (with its whole extent) not inside the arena;
 *   or a sticky error. */
int radiance_submit(struct radiance *r, uint32_t model_id, uint32_t layer, uint32_t rows,
		    enum radiance_elem dtype, const void *x, void *y, uint64_t *request_id);

/* One finished request. */
struct radiance_completion {
	uint64_t request_id;
	int status;              /* 0, or negative errno (e.g. -EINVAL bad request,
	                            -EIO device fault) */
	uint64_t queue_ns;       /* in the daemon, from pickup to execution start */
	uint64_t exec_ns;        /* execution, including copies */
	const char *error;       /* the daemon's reason when status != 0, else
	                            NULL; valid until the next poll/wait/linear
	                            call on the handle */
	uint64_t reserved[4];
};

/* Reaps one completion without blocking. Completions come in the order the
 * daemon finishes requests, which need not be submission order.
 * Returns 1 (and fills *c), 0 when none is ready, or a sticky error. */
int radiance_poll(struct radiance *r, struct radiance_completion *c);

/* Reaps one completion, blocking up to timeout_ms milliseconds (-1: no
 * limit, 0: just poll). Spins for spin_us first, then sleeps on the CQ
 * doorbell; also watches the control socket, so a daemon that goes away
 * ends the wait with -ECONNRESET instead of hanging. A daemon that stops
 * (SIGTERM) runs what it took first: after its Goodbye the completions
 * still come, then -ESHUTDOWN.
 * Returns 1 (and fills *c), -ETIMEDOUT, -ENOENT when nothing is in flight,
 * or a sticky error. -EINTR is never returned (waits restart). */
int radiance_wait(struct radiance *r, struct radiance_completion *c, int timeout_ms);

/* --- event-loop integration ------------------------------------------------
 *
 * For a caller with its own loop (epoll, libuv, GLib): instead of blocking
 * in radiance_wait(), put radiance_get_fd() in the loop and call
 * radiance_dispatch() whenever it is readable, then radiance_poll() the
 * completions it reports:
 *
 *     int fd = radiance_get_fd(r);              // once; add to the loop
 *     ... submit requests ...
 *     // fd readable (POLLIN):
 *     int n = radiance_dispatch(r);
 *     if (n < 0) { stop watching fd; radiance_reconnect(r) or disconnect }
 *     while (radiance_poll(r, &c) == 1) { ... }
 *
 * Modelled on libseat_get_fd()/libseat_dispatch() and wl_display_get_fd().
 */

/* One descriptor that becomes readable when a completion arrives or the
 * daemon says something outside a reply (a Goodbye when it stops, an Error
 * ending the session, a hang-up). It is an epoll set owned by r (do not
 * read or close it; watch it for POLLIN/EPOLLIN only): it stays the same
 * fd for r's lifetime, across radiance_reconnect() and the lazy opening of
 * the rings, and radiance_disconnect() closes it. Asking for it makes the
 * daemon ring the CQ doorbell on every completion (otherwise only while a
 * wait sleeps): a write per batch of results. Returns the fd (>= 0), or
 * -errno (-EMFILE, ...) or the sticky error. Same thread rule as every
 * call on r. */
int radiance_get_fd(struct radiance *r);

/* Never blocks. Takes every completion off the CQ and keeps it for
 * radiance_poll()/radiance_wait() (in completion order), reads what the
 * daemon sent outside a reply, and re-arms the fd. Call it each time the
 * fd is readable, and again after radiance_wait() or radiance_linear(),
 * which disarm it, before the loop sleeps on the fd again.
 * Returns the number of completions ready for radiance_poll() (0: nothing,
 * e.g. a spurious wake-up; radiance_poll() may then return more, those
 * that completed after dispatch looked), or the sticky error once nothing is left to
 * deliver: -ESHUTDOWN after the daemon's Goodbye (whose drained results
 * were counted and delivered first), -ECONNRESET when it went away,
 * -EPROTO, ... The fd then stays readable (a closed socket): stop watching
 * it, or radiance_reconnect(). -EBADFD in a forked child. Same thread rule
 * as every call on r. */
int radiance_dispatch(struct radiance *r);

/* Number of requests submitted whose completion radiance_poll/radiance_wait
 * has not returned yet (in the daemon, or completed and kept aside by
 * radiance_linear). */
unsigned radiance_in_flight(const struct radiance *r);

/* Synchronous linear on caller memory: copies x into the arena, submits,
 * waits, copies y out. Any rows >= 1: more than max_rows (or than fits the
 * arena) are split into several requests, run one after another.
 *   x  [rows][K] of dtype, rows * K * 2 bytes, contiguous and row-major
 *      (see "Buffer layout" above), caller memory (not the arena), 2-byte
 *      aligned; read only;
 *   y  [rows][N] bf16, rows * N * 2 bytes, contiguous and row-major, caller
 *      memory, 2-byte aligned, not overlapping x; written only on success
 *      (on failure its contents are unspecified).
 * Completions of asynchronous requests that arrive meanwhile are kept for
 * radiance_poll/radiance_wait. Returns 0, the request's status (negative
 * errno, text in radiance_error_message()), -ENOENT / -EINVAL as
 * radiance_submit, -ENOMEM when the arena cannot hold even one row, or a
 * sticky error. */
int radiance_linear(struct radiance *r, uint32_t model_id, uint32_t layer, uint32_t rows,
		    enum radiance_elem dtype, const void *x, void *y);

/* --- several layers in one request ---------------------------------------- */

/* Most layers one request may name (RADIANCE_MAX_REQUEST_LAYERS of the
 * wire); the daemon's own limit is radiance_server_info.max_request_layers. */
#define RADIANCE_MAX_LAYERS_PER_REQUEST 8

/* Submits y[j] = layers[j](x) for j < nlayers without waiting: one request,
 * one x, one quantization of x for all the W4A8 layers (q, k and v of an
 * attention block; gate and up of an MLP), one completion for all of them.
 *   layers   [nlayers] layer indexes of model model_id, distinct, every one
 *            with the same K; nlayers 1..max_request_layers;
 *   x        arena pointer to [rows][K] elements of dtype, as radiance_submit;
 *   y        [nlayers] arena pointers, y[j] to [rows][N_j] bf16 of layer
 *            layers[j], 16-byte aligned, inside the arena, overlapping
 *            neither x nor each other;
 * the rest as radiance_submit. The outputs are bit for bit those of
 * nlayers radiance_submit calls. The arrays layers and y are read during
 * the call only; the buffers they point to belong to the request until it
 * completes. Returns 0, or:
 *   -ENOTSUP  the daemon predates several-layer requests
 *             (radiance_server_info.max_request_layers 0): "not supported
 *             by this daemon"; nothing was sent;
 *   -EINVAL   nlayers 0 or above the daemon's limit, layers or y NULL, a
 *             layer named twice, layers of different K (the message names
 *             both, with their K), and as radiance_submit;
 *   -ENOENT   no model model_id held, or layers[j] out of range (the
 *             message says which j);
 *   -EFAULT / -EAGAIN  as radiance_submit, for x or any y[j];
 *   or a sticky error. */
int radiance_submit_multi(struct radiance *r, uint32_t model_id, const uint32_t *layers,
			  uint32_t nlayers, uint32_t rows, enum radiance_elem dtype, const void *x,
			  void *const *y, uint64_t *request_id);

/* Synchronous radiance_submit_multi on caller memory, as radiance_linear:
 * copies x into the arena once, runs every layer, copies each y[j]
 * ([rows][N_j] bf16, caller memory, 2-byte aligned, not overlapping x or
 * each other) out. Any rows >= 1 (split as radiance_linear splits). Returns
 * 0, the request's status, the errors of radiance_submit_multi, -ENOMEM
 * when the arena cannot hold one row of x and every output, or a sticky
 * error. */
int radiance_linear_multi(struct radiance *r, uint32_t model_id, const uint32_t *layers,
			  uint32_t nlayers, uint32_t rows, enum radiance_elem dtype, const void *x,
			  void *const *y);

/* --- mapped weights (docs/mapped.md) -------------------------------------- */

/* How a mapping's memory is reached. Values match the wire's MapHandle. */
enum radiance_map_handle {
	RADIANCE_MAP_POSIX_FD = 1,       /* a VMM allocation's fd: import and map it
	                                    (cuMemImportFromShareableHandle, ...) */
	RADIANCE_MAP_IPC = 2,            /* a legacy IPC handle (cudaIpcOpenMemHandle, ...) */
	RADIANCE_MAP_TEST_MEMFD = 3,     /* test daemons only (RADIANCE_FAKE_SHARE=1 on the
	                                    cpu backend): a sealed memfd to mmap read-only */
};

/* Where one layer's arrays sit, in bytes from the start of the mapping.
 * Offsets are multiples of 256; a bias_bytes of 0: no bias. What the arrays
 * hold is proto/map.h's layout (vendor-specific for W4A8). */
struct radiance_mapped_layer {
	uint32_t index;
	enum radiance_layer_kind kind;
	uint32_t n, k;
	uint64_t weight_offset, weight_bytes;
	uint64_t scales_offset, scales_bytes;   /* W4A8 */
	uint64_t bias_offset, bias_bytes;       /* fp32 [n] */
};

/* A model's one device allocation, as the daemon describes it. */
struct radiance_mapping {
	uint32_t model_id;
	uint32_t layout_version;         /* as asked */
	const char *layout;              /* description, for logs */
	enum radiance_map_handle handle;
	int fd;                          /* POSIX_FD, TEST_MEMFD: owned by this struct
	                                    (radiance_mapping_free closes it); set it to
	                                    -1 to keep it. IPC: -1 */
	uint8_t ipc_handle[64];          /* IPC */
	uint64_t bytes;                  /* size of the allocation: map all of it */
	uint64_t granularity;            /* the allocation granularity it was made with */
	const char *vendor;              /* "cuda", "hip" ("cpu": test memfd) */
	const char *pci_bus_id;          /* the device that holds it, e.g.
	                                    "0000:19:00.0" ("" for the test memfd) */
	size_t n_layers;
	const struct radiance_mapped_layer *layers;   /* [n_layers], by index */
};

/* Asks the daemon for device access to model_id, which this session must
 * hold (radiance_load_model / radiance_attach_model), laid out in
 * layout_version (proto/map.h's RADIANCE_MAP_LAYOUT_VERSION for the layout
 * the caller's kernels read). Most callers want libradiance-gpu's
 * radiance_gpu_map() (radiance_gpu.h), which does this and maps it.
 *
 * From then on the session counts as mapping the model: the daemon keeps it
 * resident, and radiance_release_model() of it fails with -EBUSY until
 * radiance_unmap_model() (one per radiance_map_model of the model). Whoever has the fd (or the IPC handle) can read
 * the model's weights; docs/mapped.md has the security model. The reply is
 * checked: every layer of the held model, within the allocation, aligned.
 * *out is allocated; free it with radiance_mapping_free().
 * Returns 0, or:
 *   -ENOTSUP          the daemon cannot map this model (the cpu backend, a
 *                     GPU without VMM or IPC; the reason is in
 *                     radiance_error_message()), or predates mapping
 *                     (radiance_server_info.map_layout_version 0), or
 *                     serves another layout version;
 *   -EPROTONOSUPPORT  the daemon refused layout_version;
 *   -ENOENT           this session holds no model model_id;
 *   -EPROTO           the reply is inconsistent (sticky);
 *   -ENOMEM, or a sticky error. */
int radiance_map_model(struct radiance *r, uint32_t model_id, uint32_t layout_version,
		       struct radiance_mapping **out);

/* Tells the daemon this session no longer uses one of its mappings of
 * model_id (call it after unmapping it in this process). Returns 0, -ENOENT (not
 * mapped by this session), or a sticky error. */
int radiance_unmap_model(struct radiance *r, uint32_t model_id);

/* Frees m and closes its fd unless it is -1. NULL is a no-op. Any thread. */
void radiance_mapping_free(struct radiance_mapping *m);

/* --- shared tensors (docs/engines.md, "Shared tensors") ------------------- */

/* A checkpoint tensor of no linear layer (embeddings, norms, the biases of
 * what the daemon does not serve as a linear), as the daemon keeps it: the
 * bytes exactly as the safetensors file stores them, little-endian,
 * row-major (C order) of `shape`, in the checkpoint's dtype. */
struct radiance_tensor {
	const char *name;                /* as the checkpoint names it */
	const char *dtype;               /* safetensors dtype: "BF16", "F16", "F32",
	                                    "I64", ... */
	uint32_t ndim;
	const uint64_t *shape;           /* [ndim]; NULL for a scalar (ndim 0) */
	uint64_t bytes;                  /* product(shape) x the dtype's size */
	uint64_t offset;                 /* in the model's memfd, a multiple of 64 */
	const void *data;                /* radiance_map_tensors: the tensor in the
	                                    read-only mapping (base + offset), 64-byte
	                                    aligned; radiance_list_tensors: NULL */
};

/* A model's shared tensors. Owned by the caller: radiance_tensors_free().
 * Immutable: any thread may read it. It does not depend on the handle that
 * made it: it stays valid after radiance_disconnect(), a daemon restart
 * and the model's unload (a mapping keeps its pages; that memory is then
 * this process's, see below). */
struct radiance_tensors {
	uint32_t model_id;
	size_t count;
	const struct radiance_tensor *tensors;   /* [count], sorted by name */
	uint64_t bytes;                  /* size of the model's memfd (a multiple of 4096) */
	const void *base;                /* radiance_map_tensors: the memfd mapped
	                                    PROT_READ, MAP_SHARED, `bytes` long (NULL
	                                    when bytes is 0); a listing: NULL */
	int fd;                          /* radiance_map_tensors: the sealed memfd,
	                                    owned (closed by radiance_tensors_free;
	                                    set it to -1 to keep it); a listing: -1 */
};

/* Describes the shared tensors of any resident model (no reference is
 * taken, as radiance_get_model). *out is allocated (data, base NULL, fd
 * -1); free it with radiance_tensors_free(). The reply is checked: every
 * tensor inside the memfd, aligned, of the size its dtype and shape say.
 * Returns 0, or:
 *   -ENOTSUP  the daemon predates shared tensors
 *             (radiance_server_info.tensors_version 0): nothing was sent;
 *   -ENOENT   no resident model has model_id;
 *   -EINVAL   out NULL;
 *   -EPROTO   the reply is inconsistent (sticky);
 *   -ENOMEM, or a sticky error. */
int radiance_list_tensors(struct radiance *r, uint32_t model_id, struct radiance_tensors **out);

/* As radiance_list_tensors, for a model this session holds
 * (radiance_load_model / radiance_attach_model), and maps its tensors: the
 * daemon passes the model's memfd, sealed against writes, shrinking and
 * growing (checked here: a memfd without those seals is -EPROTO), and it
 * is mapped PROT_READ, MAP_SHARED. Every process that maps it shares the
 * same physical pages, charged once to the model in the daemon (its
 * resident_bytes, the daemon's model limits); mapping costs this process
 * page tables only. A write through `data` faults (SIGSEGV); mprotect to
 * PROT_WRITE and a writable MAP_SHARED mmap of fd fail (EACCES, EPERM); a
 * MAP_PRIVATE writable mapping copies on write and changes nothing shared.
 * Lifetime: the pages live as long as the daemon's model or any fd or
 * mapping of them, whichever is last: after the model is unloaded this
 * struct still reads the old bytes and keeps them in memory (no longer
 * counted by the daemon) until radiance_tensors_free().
 * Returns 0, or:
 *   -ENOTSUP  the daemon predates shared tensors: nothing was sent;
 *   -ENOENT   this session holds no model model_id;
 *   -EINVAL   out NULL;
 *   -EPROTO   the reply is inconsistent, lacks its fd, or the fd is not a
 *             sealed memfd of the size announced (sticky);
 *   -ENOMEM, an errno of mmap (-EMFILE, -ENOMEM), or a sticky error. */
int radiance_map_tensors(struct radiance *r, uint32_t model_id, struct radiance_tensors **out);

/* The tensor called name in t, or NULL. Any thread. */
const struct radiance_tensor *radiance_find_tensor(const struct radiance_tensors *t,
						   const char *name);

/* Unmaps t's mapping, closes its fd unless -1, and frees t: every data
 * pointer dies. NULL is a no-op. Any thread. */
void radiance_tensors_free(struct radiance_tensors *t);

/* --- stats ---------------------------------------------------------------- */

struct radiance_stats {
	uint64_t requests;
	uint64_t rows;
	uint64_t bytes_in;               /* activation bytes read */
	uint64_t bytes_out;              /* output bytes written */
	uint64_t errors;                 /* requests that failed */
	/* Latency in the daemon (queue + exec). p50 and p99 come from a
	 * histogram with 4 log-spaced buckets per power of two: each is the
	 * upper edge of its bucket (at most 25% above the true percentile),
	 * capped at the max, which is exact. */
	uint64_t latency_p50_ns;
	uint64_t latency_p99_ns;
	uint64_t latency_max_ns;
	uint32_t sessions;               /* global only: live sessions */
	uint64_t uptime_ns;              /* global only: daemon uptime */
};

struct radiance_session_stats {
	uint64_t session_id;
	const char *client_name;
	int32_t pid;
	uint32_t uid;
	struct radiance_stats stats;
};

struct radiance_stats_reply {
	struct radiance_stats global;
	struct radiance_stats session;   /* this session's own */
	size_t n_sessions;
	struct radiance_session_stats *sessions;   /* [n_sessions]; may be empty
	                                              when the daemon shows only
	                                              the caller's */
	/* The global latency histogram at coarse bounds, for exporters (kept
	 * at the end: the struct is only ever allocated by the library).
	 * latency_le_ns[i] (ns, increasing, inclusive) and latency_cumulative[i]
	 * (requests that took at most that long), [n_latency_buckets]; the
	 * +Inf bucket is global.requests (counters and buckets are not one
	 * atomic snapshot: the last bucket may exceed it by the requests
	 * completed meanwhile). latency_sum_ns is every request's
	 * latency summed. 0 buckets from a daemon that does not send them. */
	size_t n_latency_buckets;
	const uint64_t *latency_le_ns;
	const uint64_t *latency_cumulative;
	uint64_t latency_sum_ns;
	/* Launches the daemon's executor ran since it started (global): one
	 * backend call over the stacked rows of the requests of one layer
	 * that were queued together, or one piece of a request of more than
	 * sched_chunk_rows rows. launches / global.requests is the launches
	 * per request; 0 from a daemon that does not count them. */
	uint64_t launches;
	/* sessions[i]'s uid's device-time weight (the daemon's
	 * sched_uid_weights, 1 for a uid not listed: its ring shares the
	 * executor by it), [n_sessions]; 0 from a daemon that does not send
	 * it. A separate array because struct radiance_session_stats is an
	 * array element and cannot grow. NULL when n_sessions is 0. */
	const uint32_t *session_weights;
};

/* Asks the daemon for its counters. *out is allocated; free it with
 * radiance_stats_free(). Returns 0, -EINVAL (out NULL) or a sticky error. */
int radiance_get_stats(struct radiance *r, struct radiance_stats_reply **out);
void radiance_stats_free(struct radiance_stats_reply *s);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
