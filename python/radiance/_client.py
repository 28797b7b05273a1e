"""Client, Model, Layer and Request: libradiance for Python programs."""
from __future__ import annotations

import errno
import logging
import math
import os
import sys
import threading
import time
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence,
                    Tuple, Union)

import ml_dtypes
import numpy as np

from . import _lib
from ._closing import ClosedWhenCollected, Closing
from ._errors import RadianceError
from ._gpu import DEFAULT_MAX_ROWS

if TYPE_CHECKING:   # pragma: no cover
    from ._gpu import MappedModel

log = logging.getLogger("radiance")
# A library's logger (the logging HOWTO, "Configuring Logging for a
# Library"): records go where the program sends them, and nowhere when it
# configures nothing, rather than to logging's last-resort stderr handler.
log.addHandler(logging.NullHandler())

#: numpy dtype of bf16 tensors (``ml_dtypes.bfloat16``): inputs may be bf16
#: or float16, outputs are always bf16.
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)

# the C enums (radiance_elem, radiance_layer_kind)
_BF16, _FP16 = _lib.BF16, _lib.FP16
_KIND = {1: "w4a8", 2: "bf16"}
# connection errors after which a synchronous call is worth one more try on a
# fresh session: the daemon went away (restart; ESHUTDOWN: it said it stops);
# linear is a pure function, nothing was delivered
_LOST = (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ESHUTDOWN)
_INT32_MAX = 2**31 - 1
# one wait holds the client's lock at most this long, so threads sharing the
# client get their turn while a request is slow
_WAIT_SLICE_MS = 50

_LOG_LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR,
               4: logging.WARNING, 5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}
_LOG_WARNING, _LOG_DEBUG = 4, 7

Array = Any   # numpy.ndarray or torch.Tensor (torch is optional)


class Layer(NamedTuple):
    """One linear layer of a resident model: ``y[rows, N] = x[rows, K] . W^T (+ bias)``.

    index: what requests name it by; name: module path
    ("encoder.layer.0.attention.self.query"); kind: "w4a8" (int4 weights,
    fp8 e4m3 activations) or "bf16"; N: output features; K: input features;
    bias: whether it adds a bias; bytes: resident bytes of its weights."""
    index: int
    name: str
    kind: str
    N: int
    K: int
    bias: bool
    bytes: int


class OtherTensor(NamedTuple):
    """A checkpoint tensor outside the linear layers (norms, embeddings), as
    the model's description lists it; Model.tensors has its bytes and
    Model.tensor() its data."""
    name: str
    dtype: str
    shape: Tuple[int, ...]


class Tensor(NamedTuple):
    """One of a model's shared tensors (Model.tensors): a checkpoint tensor of
    no linear layer that the daemon holds once, for every process, in a
    sealed read-only memfd. dtype: the safetensors name ("BF16", "F32",
    "I64", ...); shape: C order; bytes: its size; offset: where it starts in
    the memfd (a multiple of 64)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    bytes: int
    offset: int


# safetensors dtype -> numpy dtype of Model.tensor() (little-endian, as stored)
_NP_DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "BF16": bfloat16, "I32": np.dtype("<i4"), "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}


class _TensorMap:
    """A model's shared tensors mapped into this process (radiance_map_tensors):
    one read-only buffer over the whole memfd. Every array Model.tensor()
    returns is a view of it and keeps it alive; the mapping is unmapped and
    its fd closed when the last view and the Model are gone."""

    def __init__(self, ffi, lib, t):
        self.tensors = tuple(Tensor(_cstr(ffi, x.name), _cstr(ffi, x.dtype),
                                    tuple(int(x.shape[d]) for d in range(x.ndim)),
                                    int(x.bytes), int(x.offset))
                             for x in (t.tensors[i] for i in range(t.count)))
        self.by_name = {x.name: x for x in self.tensors}
        self.bytes = int(t.bytes)
        if t.base != ffi.NULL:
            # the buffer holds the gc'd pointer, whose destructor frees t
            base = ffi.gc(ffi.cast("char *", t.base), lambda _p, t=t: lib.radiance_tensors_free(t))
            self.view: Optional[memoryview] = memoryview(ffi.buffer(base, self.bytes)).toreadonly()
        else:
            lib.radiance_tensors_free(t)
            self.view = None


class ResidentModel(NamedTuple):
    """A model the daemon holds, as Client.resident_models() lists it."""
    model_id: int
    name: str
    resident_bytes: int
    preloaded: bool
    users: int


def _is_torch(x: Any) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _c_text(what: str, value: Any, path: bool = False) -> bytes:
    """value as the C string libradiance takes: a str (a path also bytes or
    os.PathLike), encoded as UTF-8 (a path as the file system encodes it).
    A NUL in it would end the C string early, naming another socket, model
    or directory than the caller's: EINVAL, as a wrong type is."""
    if path and isinstance(value, (str, bytes, os.PathLike)):
        b = os.fsencode(value)
    elif isinstance(value, str):
        b = value.encode()
    else:
        raise RadianceError(errno.EINVAL, f"{what} must be a str, not {value!r}")
    i = b.find(b"\0")
    if i >= 0:
        raise RadianceError(errno.EINVAL, f"{what} {os.fsdecode(b)!r} has a NUL at byte {i}; "
                                          f"a C string would end there")
    return b


def _cstr(ffi, p) -> str:
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


class _ClientLock:
    """A Client's lock: reentrant (the package's calls nest on one thread),
    but a call from inside a callback the client is running (load()'s
    progress, a logging handler fed by libradiance's log) is refused with
    EDEADLK: it would run inside libradiance's call on the same handle
    (which refuses that too), and a close() there would take the session
    away from under the call that runs the callback."""
    __slots__ = ("_lock", "callback")

    def __init__(self):
        self._lock = threading.RLock()
        # (thread ident, what) while that thread runs a callback, else None
        self.callback: Optional[Tuple[int, str]] = None

    def __enter__(self) -> "_ClientLock":
        cb = self.callback
        if cb is not None and cb[0] == threading.get_ident():
            raise RadianceError(errno.EDEADLK, f"the client was called from inside its own "
                                f"{cb[1]}, which runs within one of its calls: call it once "
                                f"that call has returned")
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def running(self, what: str, fn: Callable[..., Any], *args) -> Any:
        """fn(*args) as the callback `what`: calls into the client from it
        are refused."""
        outer = self.callback
        self.callback = (threading.get_ident(), what)
        try:
            return fn(*args)
        finally:
            self.callback = outer


# --------------------------------------------------------------------------
# one libradiance handle = one daemon session
# --------------------------------------------------------------------------
class _Slot:
    """One C request in flight: its arena blocks and, once reaped, its
    completion. x/y are arena pointers owned by the session."""
    __slots__ = ("session", "rid", "x", "y", "ybytes", "done", "status", "error", "ycopy",
                 "abandoned", "queue_ns", "exec_ns")

    def __init__(self, session: "_Session", x, y, ybytes: int):
        self.session = session
        self.rid = 0
        self.x, self.y, self.ybytes = x, y, ybytes
        self.done = False
        self.status = 0
        self.error: Optional[RadianceError] = None   # set when it cannot complete
        self.ycopy: Optional[bytes] = None            # y saved before the arena died
        self.abandoned = False
        self.queue_ns = 0                             # the completion's daemon-side times
        self.exec_ns = 0


class _Session:
    def __init__(self, ffi, lib, h, pid: int, log_cb):
        self.ffi, self.lib, self.h = ffi, lib, h
        self.pid = pid
        self.log_cb = log_cb                   # the cffi callback lives as long as h
        self.model_ids: Dict[str, int] = {}    # model name -> id in this session
        self.slots: Dict[int, _Slot] = {}      # request id -> request in flight
        self.dead: Optional[RadianceError] = None
        si = lib.radiance_get_server_info(h)
        self.info = {
            "protocol_version": int(si.protocol_version),
            "server_version": _cstr(ffi, si.server_version),
            "backend": _cstr(ffi, si.backend),
            "device": _cstr(ffi, si.device),
            "session_id": int(si.session_id),
            "max_rows": int(si.max_rows),
            "max_request_layers": int(si.max_request_layers),
        }

    def message(self) -> str:
        return _cstr(self.ffi, self.lib.radiance_error_message(self.h))


# --------------------------------------------------------------------------
class Client(ClosedWhenCollected):
    """A connection to radianced (one session), shared by the Models it opens.

    Args:
        socket: the daemon's Unix socket (str, bytes or os.PathLike; a NUL
            in it is EINVAL, as in the names); None: libradiance's default
            ($RADIANCE_SOCKET, else /run/radiance/radiance.sock for root, else
            $XDG_RUNTIME_DIR/radiance.sock if it exists, else the system one).
        timeout: longest wait for one control reply (connect, load progress
            step, attach), in seconds; None: no limit (libradiance's default).
        name: shown in the daemon's logs and ``radiancectl stats``.
        arena_bytes, sq_entries, cq_entries, spin_us: data-plane sizes and
            the completion spin, as ``struct radiance_options`` (0: the
            daemon's or library's default).

    Connects at once (raises RadianceError: ENOENT/ECONNREFUSED no daemon
    there, EINVAL a bad argument, ENOTSOCK not a socket, EACCES the socket
    keeps this uid out (the message names the daemon's --group /
    SocketGroup= that lets a user in),
    EBUSY the daemon's session limit, EPROTO another protocol, ETIMEDOUT).

    Logging: libradiance's messages go to the ``radiance`` logger (which
    has a NullHandler: silent unless the program configures logging); the
    reason a connect failed is the exception's message, logged at DEBUG
    only.

    Threads: a Client may be shared by any number of threads. One lock
    serializes the calls on the session (libradiance handles are not
    thread-safe); the lock is released during waits for asynchronous
    results in slices of 50 ms, and the GIL is released inside every C call.
    For parallel requests from many threads, one Client per thread avoids the
    lock. load()'s progress callback and logging handlers fed by
    libradiance run inside the client's call: a call into the same client
    from them raises RadianceError(EDEADLK).

    Fork: a child process that uses an inherited Client gets a fresh session
    on its first call (the parent's session is never touched; the child's copy
    of it is freed). Requests the parent had in flight fail in the child.

    Daemon restart: when the connection is lost (the daemon exited or was
    restarted), the next call connects again and re-attaches every open model
    by name (a model this client loaded from a directory is loaded again from
    that directory when the new daemon does not hold it). A synchronous
    linear() that finds the connection lost is retried once on the new
    session; requests submitted asynchronously before a call noticed the
    loss fail with a RadianceError (ECONNRESET) saying so.
    """

    def __init__(self, socket: Optional[Union[str, os.PathLike]] = None,
                 timeout: Optional[float] = None, *, name: Optional[str] = None,
                 arena_bytes: int = 0, sq_entries: int = 0, cq_entries: int = 0,
                 spin_us: int = 0):
        self._ffi, self._lib = _lib.load()
        # the C types of the per-call buffers, looked up once (not parsed
        # from their text on every call)
        self._u16_array = self._ffi.typeof("uint16_t[]")
        self._u32_array = self._ffi.typeof("uint32_t[]")
        self._ptr_array = self._ffi.typeof("void *[]")
        self._void_ptr = self._ffi.typeof("void *")
        if timeout is not None:
            # radiance_options.timeout_ms is an int32_t
            if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and
                    0 < timeout <= _INT32_MAX / 1000):
                raise RadianceError(errno.EINVAL, f"timeout must be a number of seconds in "
                                                  f"(0, {_INT32_MAX // 1000}] or None, not "
                                                  f"{timeout!r}")
            self._timeout_ms = max(1, int(round(timeout * 1000)))
        else:
            self._timeout_ms = 0
        # the C fields' ranges: a larger value would be cffi's OverflowError
        for k, v, hi in (("arena_bytes", arena_bytes, 2**64 - 1),
                         ("sq_entries", sq_entries, 2**32 - 1),
                         ("cq_entries", cq_entries, 2**32 - 1)):
            if not isinstance(v, int) or not 0 <= v <= hi:
                raise RadianceError(errno.EINVAL, f"{k} must be an int in 0..{hi}, not {v!r}")
        if not isinstance(spin_us, int) or not -1 <= spin_us <= _INT32_MAX:
            raise RadianceError(errno.EINVAL, f"spin_us must be an int in -1..{_INT32_MAX}, "
                                              f"not {spin_us!r}")
        if socket is None:
            self._socket = default_socket_path()
        else:
            self._socket = os.fsdecode(_c_text("socket", socket, path=True))
            if not self._socket:
                raise RadianceError(errno.EINVAL, "socket is an empty path")
        self._name = name if name is not None else \
            f"python:{os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'}"
        _c_text("name", self._name)
        self._sizes = (arena_bytes, sq_entries, cq_entries, spin_us)
        self._lock = _ClientLock()
        self._session: Optional[_Session] = None
        self._models: Dict[str, "Model"] = {}
        self._closed = False
        self._garbage: List[List[_Slot]] = []   # slots of Requests dropped unread
        self._connect()
        _CLIENTS.add(self)

    # -- session management (caller holds the lock) -------------------------
    def _connect(self) -> _Session:
        ffi, lib = self._ffi, self._lib
        # radiance_connect() returns no handle to ask why it failed: its
        # warnings are the reason, raised below. Held until it returns, so
        # that a failure is raised, not also logged; after a success they
        # are logged as they came.
        held: Dict[str, Any] = {"records": []}

        def on_log(user, priority, message):
            text = _cstr(ffi, message)
            level = _LOG_LEVELS.get(priority, logging.DEBUG)
            if held["records"] is not None and priority <= _LOG_WARNING:
                held["records"].append((level, text))
            else:
                self._lock.running("logging handler", log.log, level, "%s", text)

        cb = ffi.callback("radiance_log_fn", on_log)
        opt = ffi.new("struct radiance_options *")
        opt.size = ffi.sizeof("struct radiance_options")
        cname = ffi.new("char[]", _c_text("name", self._name))
        opt.client_name = cname
        opt.log = cb
        opt.log_priority = _LOG_DEBUG if log.isEnabledFor(logging.DEBUG) else _LOG_WARNING
        opt.arena_bytes, opt.sq_entries, opt.cq_entries, opt.spin_us = self._sizes
        opt.timeout_ms = self._timeout_ms
        # one attempt: the caller's next call is the retry (see reconnecting
        # above), and "no daemon" is said at once rather than after 30 s
        opt.connect_timeout_ms = -1
        h = lib.radiance_connect(os.fsencode(self._socket), opt)
        e = ffi.errno
        records, held["records"] = held["records"], None
        for level, text in records:
            log.log(level if h != ffi.NULL else logging.DEBUG, "%s", text)
        if h == ffi.NULL:
            msg = records[-1][1] if records else f"cannot connect to {self._socket}: {_strerror(e)}"
            if e in (errno.ENOENT, errno.ECONNREFUSED):
                msg += " (is radianced running? Client(socket=...) or $RADIANCE_SOCKET names another)"
            raise RadianceError(e or errno.EIO, msg)
        s = _Session(ffi, lib, h, os.getpid(), cb)
        self._session = s
        return s

    def _drop(self, s: _Session, why: RadianceError, forked: bool = False) -> None:
        """Ends session s: every request in flight on it fails with `why`
        (results already reaped are copied out of the arena first), then the
        handle is freed (in a forked child: only the child's copy)."""
        s.dead = why
        for slot in list(s.slots.values()):
            slot.done = True
            slot.error = why
        s.slots.clear()
        if not forked:
            for m in self._models.values():
                for slot in m._reaped_slots(s):
                    if slot.status == 0 and slot.ycopy is None and slot.error is None:
                        slot.ycopy = bytes(self._ffi.buffer(slot.y, slot.ybytes))
        self._lib.radiance_disconnect(s.h)
        s.h = self._ffi.NULL
        if self._session is s:
            self._session = None

    def _sess(self) -> _Session:
        self._collect()
        if self._closed:
            raise RadianceError(errno.EBADF, f"{self!r} is closed")
        s = self._session
        if s is not None and s.pid != os.getpid():
            self._drop(s, RadianceError(errno.ECHILD, f"submitted by process {s.pid} before it "
                                        f"forked; it cannot complete in process {os.getpid()}"),
                       forked=True)
            s = None
        if s is None:
            s = self._connect()
        return s

    def _sess_again(self, lost: RadianceError) -> _Session:
        """_sess() after `lost` ended the session (the one retry): when no
        new session can be had either, the error says both what ended the
        old one (e.g. the daemon stopping) and why reconnecting failed."""
        try:
            return self._sess()
        except RadianceError as e:
            raise RadianceError(e.errno, f"{lost.message}; reconnecting: {e.message}") from None

    def _fail(self, s: _Session, rc: int, what: str) -> RadianceError:
        """The RadianceError for return code rc of a call on s; a sticky
        (connection) error ends the session so the next call reconnects."""
        text = s.message() or _strerror(rc)
        err = RadianceError(-rc, f"{what}: {text}")
        sticky = self._lib.radiance_get_error(s.h)
        if sticky:
            self._drop(s, RadianceError(-sticky, f"the connection to the daemon was lost "
                                        f"({text}): resubmit the request"))
        return err

    def _collect(self) -> None:
        """Frees the arena blocks of Requests dropped without result()."""
        while self._garbage:
            for slot in self._garbage.pop():
                if slot.done:
                    self._free_slot(slot)
                else:
                    slot.abandoned = True

    def _free_slot(self, slot: _Slot) -> None:
        s = slot.session
        if s.dead is None and slot.x is not None:
            self._lib.radiance_arena_free(s.h, slot.x)
            self._lib.radiance_arena_free(s.h, slot.y)
        slot.x = slot.y = None

    def _alloc(self, s: _Session, nbytes: int):
        """An arena block, or NULL (ffi.errno set). When the arena is full
        and Requests dropped unread are still in flight, their completions
        give blocks back: wait for them first."""
        lib, ffi = self._lib, self._ffi
        while True:
            p = lib.radiance_arena_alloc(s.h, nbytes)
            if p != ffi.NULL or ffi.errno != errno.ENOMEM:
                return p
            if not any(sl.abandoned for sl in s.slots.values()):
                ffi.errno = errno.ENOMEM
                return p
            self._wait_one(s, -1)

    def _reap(self, s: _Session, c) -> None:
        slot = s.slots.pop(int(c.request_id), None)
        if slot is None:
            log.warning("completion for unknown request %d ignored", int(c.request_id))
            return
        slot.done = True
        slot.status = int(c.status)
        slot.queue_ns, slot.exec_ns = int(c.queue_ns), int(c.exec_ns)
        if slot.status != 0:
            slot.error = RadianceError(-slot.status, _cstr(self._ffi, c.error) or
                                       _strerror(slot.status))
        if slot.abandoned:
            self._free_slot(slot)

    def _wait_one(self, s: _Session, timeout_ms: int) -> bool:
        """Reaps one completion of s (waiting up to timeout_ms); False on
        timeout. Raises on a connection error (after ending the session)."""
        c = self._ffi.new("struct radiance_completion *")
        rc = self._lib.radiance_wait(s.h, c, timeout_ms)
        if rc == 1:
            self._reap(s, c)
            return True
        if rc == -errno.ETIMEDOUT:
            return False
        if rc == -errno.ENOENT:       # nothing in flight: nothing to wait for
            return True
        raise self._fail(s, rc, "waiting for a completion")

    def _model_id(self, s: _Session, model: "Model") -> int:
        """model's id in session s, attaching it (after a reconnect or a
        fork) by name, or loading it again from its directory."""
        if model._closed:
            raise RadianceError(errno.EBADF, f"{model!r} was released")
        mid = s.model_ids.get(model.name)
        if mid is not None:
            return mid
        ffi, lib = self._ffi, self._lib
        out = ffi.new("uint32_t *")
        rc = lib.radiance_attach_model(s.h, model.name.encode(), out)
        if rc == -errno.ENOENT and model.directory is not None:
            rc = self._load_call(s, model.directory, model.name, None, out)
        if rc < 0:
            raise self._fail(s, rc, f"re-attaching model '{model.name}' on session "
                                    f"{s.info['session_id']}")
        info = lib.radiance_held_model(s.h, out[0])
        layers = _layers(ffi, info)
        if layers != model.layers:
            lib.radiance_release_model(s.h, out[0])
            raise RadianceError(errno.ESTALE, f"model '{model.name}' on session "
                                f"{s.info['session_id']} has other layers than when it was "
                                f"opened: another checkpoint under the same name")
        s.model_ids[model.name] = int(out[0])
        return int(out[0])

    def _load_call(self, s, directory: str, name: Optional[str], progress, out) -> int:
        ffi = self._ffi
        opt = ffi.new("struct radiance_load_options *")
        opt.size = ffi.sizeof("struct radiance_load_options")
        keep = []
        if name:
            cname = ffi.new("char[]", _c_text("name", name))
            keep.append(cname)
            opt.name = cname
        if progress is not None:
            opt.progress = progress
        return self._lib.radiance_load_model(s.h, _c_text("directory", directory, path=True),
                                             opt, out)

    # -- public ---------------------------------------------------------------
    @property
    def socket(self) -> str:
        """The socket path this client connects to."""
        return self._socket

    @property
    def server_info(self) -> Dict[str, Any]:
        """The daemon's handshake: protocol_version, server_version, backend
        ("cpu", "cuda", "hip"), device, session_id, max_rows (rows one
        request may carry; linear() and submit() split larger inputs),
        max_request_layers (layers one Model.linear_multi request may name;
        0: a daemon that predates them)."""
        with self._lock:
            return dict(self._sess().info)

    @property
    def session_id(self) -> int:
        """The daemon's id of the current session (changes on reconnect)."""
        return self.server_info["session_id"]

    def load(self, directory: Union[str, os.PathLike], name: Optional[str] = None,
             progress: Optional[Callable[[int, int], None]] = None) -> "Model":
        """Loads the AutoRound int4 checkpoint in `directory` (or attaches
        to the resident copy of the very same files, under the name it
        already has) and returns its Model.

        name: model name (default: the directory's basename): printable
            text of 1..255 bytes (UTF-8) without '/', not "." or "..", with
            no space at either end (the daemon refuses others, EINVAL).
        progress: called as progress(done_bytes, total_bytes) while the
            daemon reads; an exception it raises is re-raised once the load
            has finished (the load itself cannot be interrupted), and the
            model is released. It runs inside this call: a call into this
            client from it raises RadianceError(EDEADLK).

        Raises RadianceError: ENOENT (directory or a file missing), EACCES,
        EINVAL (malformed checkpoint, with the daemon's reason), EEXIST
        (another checkpoint holds that name), ENOMEM, ETIMEDOUT."""
        _c_text("directory", directory, path=True)
        if name is not None:
            _c_text("name", name)
        directory = os.path.abspath(os.fspath(directory))
        ffi = self._ffi
        raised: List[BaseException] = []
        cb = None
        if progress is not None:
            if not callable(progress):
                raise RadianceError(errno.EINVAL, f"progress must be callable, not {progress!r}")

            def on_progress(user, done, total):
                if not raised:
                    try:
                        self._lock.running("load progress callback", progress, int(done),
                                           int(total))
                    except BaseException as e:   # noqa: B902 - re-raised below
                        raised.append(e)
            cb = ffi.callback("radiance_load_progress_fn", on_progress)
        with self._lock:
            s = self._sess()
            out = ffi.new("uint32_t *")
            rc = self._load_call(s, directory, name, cb, out)
            if rc < 0:
                raise self._fail(s, rc, f"loading {directory}")
            m = self._open(s, int(out[0]), directory)
            if raised:
                m.close()
                raise raised[0]
            return m

    def attach(self, name: str) -> "Model":
        """The Model of a checkpoint the daemon already holds (preloaded, or
        loaded by another process), by name. Raises RadianceError ENOENT
        (no such model: ``radiancectl models`` lists them), EINVAL (empty
        name)."""
        if not isinstance(name, str) or not name:
            raise RadianceError(errno.EINVAL, f"model name must be a non-empty str, not {name!r}")
        _c_text("model name", name)
        with self._lock:
            m = self._models.get(name)
            if m is not None:
                return m
            s = self._sess()
            out = self._ffi.new("uint32_t *")
            rc = self._lib.radiance_attach_model(s.h, _c_text("model name", name), out)
            if rc < 0:
                raise self._fail(s, rc, f"attaching model '{name}'")
            return self._open(s, int(out[0]), None)

    def _open(self, s: _Session, mid: int, directory: Optional[str]) -> "Model":
        info = self._lib.radiance_held_model(s.h, mid)
        name = _cstr(self._ffi, info.name)
        s.model_ids[name] = mid
        m = self._models.get(name)
        if m is None:   # one Model per name: the session holds one reference
            other = tuple(OtherTensor(_cstr(self._ffi, o.name), _cstr(self._ffi, o.dtype),
                                      tuple(int(o.shape[i]) for i in range(o.ndim)))
                          for o in (info.other[i] for i in range(info.n_other)))
            m = Model(self, name, _layers(self._ffi, info), other, directory)
            self._models[name] = m
        return m

    def resident_models(self) -> List[ResidentModel]:
        """Every model the daemon holds (any session's), without taking a
        reference."""
        with self._lock:
            s = self._sess()
            pp = self._ffi.new("struct radiance_model_list **")
            rc = self._lib.radiance_list_models(s.h, pp)
            if rc < 0:
                raise self._fail(s, rc, "listing models")
            try:
                lst = pp[0]
                return [ResidentModel(int(m.model_id), _cstr(self._ffi, m.name),
                                      int(m.resident_bytes), bool(m.preloaded), int(m.users))
                        for m in (lst.models[i] for i in range(lst.count))]
            finally:
                self._lib.radiance_model_list_free(pp[0])

    def close(self) -> None:
        """Ends the session: the daemon drops this client's model references;
        requests in flight fail (RadianceError EBADF); every Model of this
        client is closed. A second close is a no-op."""
        with self._lock:
            if self._closed:
                return
            for m in self._models.values():
                for mm in list(m._mappings):
                    mm.close()
            self._closed = True
            s = self._session
            if s is not None:
                self._drop(s, RadianceError(errno.EBADF, "the client was closed"),
                           forked=s.pid != os.getpid())
            for m in self._models.values():
                m._closed = True
            self._models.clear()

    def __repr__(self) -> str:
        s = self._session
        if self._closed:
            state = "closed"
        elif s is None or s.pid != os.getpid():
            state = "not connected"
        else:
            state = f"session {s.info['session_id']}, backend {s.info['backend']}"
        return f"<radiance.Client socket={self._socket!r} {state}>"


def _strerror(rc: int) -> str:
    ffi, lib = _lib.load()
    return _cstr(ffi, lib.radiance_strerror(int(rc)))


def _layers(ffi, info) -> Tuple[Layer, ...]:
    return tuple(Layer(int(l.index), _cstr(ffi, l.name), _KIND.get(int(l.kind), str(int(l.kind))),
                       int(l.n), int(l.k), bool(l.has_bias), int(l.bytes))
                 for l in (info.layers[i] for i in range(info.n_layers)))


# --------------------------------------------------------------------------
class _Prepared(NamedTuple):
    x: np.ndarray          # [rows, K] uint16 view, C-contiguous
    elem: int              # _BF16 / _FP16
    lead: Tuple[int, ...]  # leading shape of x
    y: np.ndarray          # [rows, N] uint16 view of the output
    result: Array          # what the call returns (ndarray or torch.Tensor)
    torch: bool            # x is a torch tensor (y is made one)


class Model(Closing):
    """A model this client holds (Client.load / Client.attach).

    ``layers`` is the tuple of its Layer rows, by index. Calls take a layer
    by name or index. Usable as a context manager (releases on exit).
    Thread-safe as its Client is."""

    def __init__(self, client: Client, name: str, layers: Tuple[Layer, ...],
                 other: Tuple[OtherTensor, ...], directory: Optional[str]):
        self._client = client
        self.name = name
        self.layers = layers
        self.other_tensors = other
        self.directory = directory
        self._by_name = {l.name: l for l in layers}
        self._closed = False
        self._requests: "weakref.WeakSet[Request]" = weakref.WeakSet()
        self._mappings: list = []   # MappedModels of this process (Model.map)
        self._tensor_map: Optional[_TensorMap] = None

    @property
    def client(self) -> Client:
        return self._client

    def _multi_layers(self, layers: Sequence[Union[int, str, Layer]], where: str, unit: str,
                      most: Optional[int] = None) -> List[Layer]:
        """The Layers of a several-layer call (linear_multi here and in
        MappedModel), checked: a list (not one layer alone), not empty (nor
        above `most` where given), no layer twice, all of one K. Raises
        RadianceError EINVAL naming the layers and their K, or ENOENT (a
        layer) as layer()."""
        # one layer given alone: a str would be iterated letter by letter,
        # a Layer (a tuple) field by field
        if isinstance(layers, (str, bytes, int, Layer)) or not hasattr(layers, "__iter__"):
            raise RadianceError(errno.EINVAL, f"{where}: layers must be a list of layers (names, "
                                f"indexes or Layers), not {type(layers).__name__} {layers!r} "
                                f"(linear() takes one layer)")
        ls = [self.layer(l) for l in layers]
        if most is not None and not 1 <= len(ls) <= most:
            raise RadianceError(errno.EINVAL, f"{where}: {len(ls)} layers; linear_multi takes 1.."
                                f"{most}")
        if not ls:
            raise RadianceError(errno.EINVAL, f"{where}: linear_multi needs at least one layer")
        for j, l in enumerate(ls):
            for i in range(j):
                if ls[i] == l:
                    raise RadianceError(errno.EINVAL, f"{where}: layers[{j}] ('{l.name}') repeats "
                                        f"layers[{i}]")
            if l.K != ls[0].K:
                raise RadianceError(errno.EINVAL, f"{where}: layers[{j}] ('{l.name}') has K={l.K} "
                                    f"but layers[0] ('{ls[0].name}') K={ls[0].K}: the layers of one "
                                    f"{unit} share x")
        return ls

    def layer(self, layer: Union[int, str, Layer]) -> Layer:
        """The Layer called `layer` (a name), at index `layer` (an int), or
        `layer` itself if it is one of this model's. RadianceError ENOENT
        (no such name, or an index out of range: the C library's and the
        daemon's code for both)."""
        if isinstance(layer, Layer):
            if layer.index < len(self.layers) and self.layers[layer.index] == layer:
                return layer
            raise RadianceError(errno.ENOENT, f"{layer!r} is not a layer of model '{self.name}'")
        if isinstance(layer, str):
            l = self._by_name.get(layer)
            if l is None:
                raise RadianceError(errno.ENOENT, f"model '{self.name}' has no layer '{layer}' "
                                    f"({len(self.layers)} layers: Model.layers lists them)")
            return l
        if isinstance(layer, (int, np.integer)) and not isinstance(layer, bool):
            i = int(layer)
            if not 0 <= i < len(self.layers):
                raise RadianceError(errno.ENOENT, f"layer index {i} out of range: model "
                                    f"'{self.name}' has layers 0..{len(self.layers) - 1}")
            return self.layers[i]
        raise RadianceError(errno.EINVAL, f"layer must be a name (str) or an index (int), "
                                          f"not {type(layer).__name__}")

    # -- argument checks: everything before it reaches the daemon ------------
    def _where(self, l: Layer) -> str:
        """What the error messages of a call on layer l name. Formatted only
        when a message is: most calls raise nothing."""
        return f"layer '{l.name}' of model '{self.name}'"

    def _prepare(self, l: Layer, x: Array, out: Optional[Array],
                 px: Optional[_Prepared] = None) -> _Prepared:
        """x and out of a call on layer l, checked, as the C call takes them.
        px: the _Prepared of the same x for another layer of the same K (a
        linear_multi request), whose x part is taken as it is.

        Every call of linear(), linear_multi() and submit() comes through
        here, a few hundred a pass in an engine: the messages are formatted
        only when raised, and the common case (a C-contiguous native array
        of the right shape) takes no copy, reshape or numpy reduction."""
        if px is None:
            xn, elem, lead, torch_x = self._prepare_x(l, x)
        else:
            xn, elem, lead, torch_x = px.x, px.elem, px.lead, px.torch
        return self._prepare_y(l, xn, elem, lead, torch_x, out)

    def _prepare_x(self, l: Layer, x: Array) -> Tuple[np.ndarray, int, Tuple[int, ...], bool]:
        """(x as [rows, K] uint16, its elem, its leading shape, whether it is
        a torch tensor), or the RadianceError for an x layer l does not take."""
        torch_x = _is_torch(x)
        if torch_x:
            t = sys.modules["torch"]
            if x.device.type != "cpu":
                raise RadianceError(errno.EOPNOTSUPP, f"{self._where(l)}: x is on {x.device}: "
                                    f"linear() serves CPU tensors through the rings; for CUDA "
                                    f"tensors map the model (Model.map().linear, or radiance.torch."
                                    f"RadianceLinear)")
            elem = _lib.torch_elem(t, x, self._where(l))
            shape = tuple(x.shape)
            xn = x.detach().contiguous().view(t.int16).numpy().view(np.uint16)
        elif isinstance(x, np.ndarray):
            dt = x.dtype
            if dt == bfloat16:
                elem = _BF16
            elif dt.kind == "f" and dt.itemsize == 2:   # float16, either byte order
                elem = _FP16
                if not dt.isnative:
                    x = x.astype(float16)
            else:
                raise RadianceError(errno.EINVAL, f"{self._where(l)}: x has dtype {x.dtype}; the "
                                    f"layer takes bfloat16 (ml_dtypes.bfloat16) or float16 "
                                    f"(convert explicitly, e.g. x.astype(ml_dtypes.bfloat16))")
            shape = x.shape
            # non-contiguous inputs (slices, transposes, broadcasts) are copied
            xn = (x if x.flags.c_contiguous and type(x) is np.ndarray else
                  np.ascontiguousarray(x)).view(np.uint16)
        else:
            raise RadianceError(errno.EINVAL, f"{self._where(l)}: x must be a numpy.ndarray or a "
                                              f"torch.Tensor, not {type(x).__name__}")
        if len(shape) == 0:
            raise RadianceError(errno.EINVAL, f"{self._where(l)}: x is a scalar; it needs a last "
                                              f"dimension of K={l.K}")
        if shape[-1] != l.K:
            raise RadianceError(errno.EINVAL, f"{self._where(l)}: x has shape {shape}: its last "
                                f"dimension is {shape[-1]}, the layer takes K={l.K} (N={l.N})")
        lead = shape[:-1]   # a tuple of ints (numpy's shape, or torch's made one)
        rows = math.prod(lead)
        if rows >= 1 << 32:
            raise RadianceError(errno.EINVAL, f"{self._where(l)}: {rows} rows, more than 2^32-1")
        if len(shape) != 2:
            xn = xn.reshape(rows, l.K)
        return xn, elem, lead, torch_x

    def _prepare_y(self, l: Layer, xn: np.ndarray, elem: int, lead: Tuple[int, ...],
                   torch_x: bool, out: Optional[Array]) -> _Prepared:
        """The _Prepared of a call on layer l: x's part as _prepare_x gave it,
        y (a new array, or out checked)."""
        rows = xn.shape[0]
        yshape = lead + (l.N,)
        if out is None:
            if torch_x:
                t = sys.modules["torch"]
                result = t.empty(yshape, dtype=t.bfloat16)
                y = result.view(t.int16).numpy().view(np.uint16)
            else:
                result = np.empty(yshape, dtype=bfloat16)
                y = result.view(np.uint16)
        elif _is_torch(out):
            t = sys.modules["torch"]
            if out.device.type != "cpu":
                raise RadianceError(errno.EOPNOTSUPP, f"{self._where(l)}: out is on {out.device}: "
                                    f"linear() serves CPU tensors through the rings; for CUDA "
                                    f"tensors map the model (Model.map().linear)")
            if out.dtype != t.bfloat16 or tuple(out.shape) != yshape or not out.is_contiguous():
                raise RadianceError(errno.EINVAL, f"{self._where(l)}: out must be a contiguous "
                                    f"torch.bfloat16 tensor of shape {yshape}, not "
                                    f"{out.dtype} {tuple(out.shape)}"
                                    f"{'' if out.is_contiguous() else ' (non-contiguous)'}")
            result = out
            y = out.detach().view(t.int16).numpy().view(np.uint16)
        elif isinstance(out, np.ndarray):
            problems = []
            if out.dtype != bfloat16:
                problems.append(f"dtype {out.dtype}")
            if out.shape != yshape:
                problems.append(f"shape {out.shape}")
            if not out.flags.c_contiguous:
                problems.append("not C-contiguous")
            if not out.flags.writeable:
                problems.append("read-only")
            if problems:
                raise RadianceError(errno.EINVAL, f"{self._where(l)}: out must be a C-contiguous, "
                                    f"writable bfloat16 array of shape {yshape}; it is "
                                    f"{', '.join(problems)} (out= is never copied)")
            result = out
            y = out.view(np.uint16)
        else:
            raise RadianceError(errno.EINVAL, f"{self._where(l)}: out must be a numpy.ndarray or "
                                              f"a torch.Tensor, not {type(out).__name__}")
        if len(yshape) != 2:
            y = y.reshape(rows, l.N)
        if out is not None and np.may_share_memory(y, xn):
            raise RadianceError(errno.EINVAL, f"{self._where(l)}: out overlaps x")
        return _Prepared(xn, elem, lead, y, result, torch_x)

    # -- calls ----------------------------------------------------------------
    def linear_multi(self, layers: Sequence[Union[int, str, Layer]], x: Array,
                     out: Optional[Sequence[Optional[Array]]] = None) -> List[Array]:
        """Several layers of one K on the same x in one request: ``y[j] =
        x . W_j^T + bias_j`` for each of `layers` (q, k and v of an attention
        block; gate and up of an MLP), with one round trip and, on a W4A8
        layer, one quantization of x for all of them. The outputs are bit for
        bit those of linear() on each layer.

        layers: 1..max_request_layers (server_info; 8) distinct layers
            (names, indexes or Layer objects) with the same K.
        x: [..., K] as for linear(): bf16 / float16 numpy array or CPU
            torch tensor, any leading shape, copied if non-contiguous.
        out: optional sequence of len(layers), each None or an [..., N_j]
            bf16 C-contiguous writable array (tensor) for layer j, as
            linear()'s out; outputs may not overlap x or each other.
        Returns [y_0, ..., y_{n-1}], y_j [..., N_j] bf16 (numpy
        ml_dtypes.bfloat16, or torch.bfloat16 tensors when x is one).

        Raises RadianceError: EINVAL (layers not a list (one str, Layer or
        index alone), out not a list, no layers, more than the daemon takes,
        a layer named twice, layers of different K: the message names them
        and their K; x and out as linear()), ENOENT (a layer: no such name,
        index out of range), ENOTSUP (the daemon predates several-layer
        requests: "not supported by this daemon"), EBADF, the daemon's
        status for a refused request, a connection error."""
        where = f"model '{self.name}'"
        if out is not None and (isinstance(out, np.ndarray) or _is_torch(out)):
            raise RadianceError(errno.EINVAL, f"{where}: out must be a list of one output (or "
                                f"None) per layer, not {type(out).__name__}")
        ls = self._multi_layers(layers, where, "request")
        outs = list(out) if out is not None else [None] * len(ls)
        if len(outs) != len(ls):
            raise RadianceError(errno.EINVAL, f"{where}: out has {len(outs)} entries for "
                                f"{len(ls)} layers")
        ps = [self._prepare(ls[0], x, outs[0])]   # x checked (and copied) once for all
        ps += [self._prepare(l, x, o, ps[0]) for l, o in zip(ls[1:], outs[1:])]
        for j in range(len(ps)):
            for i in range(j):
                if outs[i] is not None and outs[j] is not None and \
                        np.may_share_memory(ps[i].y, ps[j].y):
                    raise RadianceError(errno.EINVAL, f"{where}: out[{i}] and out[{j}] overlap")
        rows = ps[0].x.shape[0]
        if rows == 0:
            return [p.result for p in ps]
        c = self._client
        ffi, lib = c._ffi, c._lib
        xp = ffi.from_buffer(c._u16_array, ps[0].x)
        ybufs = [ffi.from_buffer(c._u16_array, p.y, require_writable=True) for p in ps]
        yp = ffi.new(c._ptr_array, [ffi.cast(c._void_ptr, b) for b in ybufs])
        idx = ffi.new(c._u32_array, [l.index for l in ls])
        self._call(lambda: "layers " + ", ".join(f"'{l.name}'" for l in ls) +
                   f" of model '{self.name}'",
                   lambda h, mid: lib.radiance_linear_multi(h, mid, idx, len(ls), rows,
                                                            ps[0].elem, xp, yp))
        return [p.result for p in ps]

    def linear(self, layer: Union[int, str, Layer], x: Array, out: Optional[Array] = None) -> Array:
        """``y = x . W^T + bias`` on the daemon, synchronously.

        x: [..., K] bf16 (``ml_dtypes.bfloat16``) or float16 numpy array, or
            a CPU torch tensor of torch.bfloat16 / torch.float16; any leading
            shape (flattened to rows, reshaped back); non-contiguous inputs
            are copied (np.ascontiguousarray / Tensor.contiguous).
        out: optional [..., N] bf16 C-contiguous writable array (or tensor)
            to write into; anything else is refused, never copied. On
            failure its contents are unspecified.
        Returns y [..., N] bf16: a numpy array (ml_dtypes.bfloat16), or a
        torch.bfloat16 tensor when x is a tensor; `out` when given.

        Raises RadianceError: EINVAL (dtype, last dimension != K, out),
        ENOENT (layer: no such name, index out of range), EOPNOTSUPP (a
        CUDA tensor), EBADF (model released or client closed), the daemon's status for a refused
        request (with its text), a connection error."""
        l = self.layer(layer)
        p = self._prepare(l, x, out)
        rows = p.x.shape[0]
        if rows == 0:
            return p.result
        c = self._client
        ffi, lib = c._ffi, c._lib
        xp = ffi.from_buffer(c._u16_array, p.x)
        yp = ffi.from_buffer(c._u16_array, p.y, require_writable=True)
        self._call(lambda: self._where(l),
                   lambda h, mid: lib.radiance_linear(h, mid, l.index, rows, p.elem, xp, yp))
        return p.result

    def _call(self, what: Callable[[], str], call: Callable[[Any, int], int]) -> None:
        """call(session handle, model id) under the client's lock: 0 is
        done; a lost connection is retried once on a fresh session (the
        reconnect re-attaches the model); any other failure raises its
        RadianceError, what() saying what was asked (formatted only then)."""
        c = self._client
        with c._lock:
            err: Optional[RadianceError] = None
            for attempt in (0, 1):
                s = c._sess() if err is None else c._sess_again(err)
                rc = call(s.h, c._model_id(s, self))
                if rc == 0:
                    return
                err = c._fail(s, rc, what())
                if attempt == 0 and s.dead is not None and s.dead.errno in _LOST:
                    log.info("connection lost (%s): reconnecting once", err.message)
                    continue
                raise err

    def submit(self, layer: Union[int, str, Layer], x: Array,
               out: Optional[Array] = None) -> "Request":
        """Like linear(), without waiting: x is copied into the session's
        shared arena and the request queued at once; Request.result() waits
        and returns y (or writes `out`). The arena blocks are freed when the
        result is read (or, for a Request dropped unread, once it completes).

        Raises at submission what linear() would for the arguments, and
        ENOMEM when the arena has no room for x and y of this request: of
        all its pieces at once for x of more than max_rows rows (read earlier
        results, submit fewer rows, or Client(arena_bytes=...))."""
        l = self.layer(layer)
        p = self._prepare(l, x, out)
        req = Request(self, l, p)
        rows = p.x.shape[0]
        if rows == 0:
            return req
        c = self._client
        ffi, lib = c._ffi, c._lib
        with c._lock:
            s = c._sess()
            mid = c._model_id(s, self)
            step = s.info["max_rows"]
            blocks = []
            try:
                for r0 in range(0, rows, step):
                    m = min(step, rows - r0)
                    xb = c._alloc(s, m * l.K * 2)
                    yb = c._alloc(s, m * l.N * 2) if xb != ffi.NULL else ffi.NULL
                    if yb == ffi.NULL:
                        e = ffi.errno
                        if xb != ffi.NULL:
                            lib.radiance_arena_free(s.h, xb)
                        # the pieces of this request placed so far hold
                        # arena too: say so, or "0 requests in flight" reads
                        # as an arena that is simply too small for m rows
                        whole = ""
                        if rows > step:
                            whole = (f" (rows {r0}..{r0 + m - 1} of this request's {rows}: it "
                                     f"needs {rows * (l.K + l.N) * 2} bytes of x and y at once, "
                                     f"in {-(-rows // step)} pieces of up to {step} rows, "
                                     f"{len(blocks)} placed; linear() splits to fit)")
                        raise RadianceError(e or errno.ENOMEM, f"layer '{l.name}': the arena has "
                                            f"no room for {m} rows ({m * (l.K + l.N) * 2} bytes of x "
                                            f"and y; {len(s.slots)} requests in flight){whole}: read "
                                            f"earlier results, submit fewer rows, or "
                                            f"Client(arena_bytes=...)")
                    blocks.append((r0, m, _Slot(s, xb, yb, m * l.N * 2)))
            except BaseException:
                for _, _, slot in blocks:
                    c._free_slot(slot)
                raise
            rid = ffi.new("uint64_t *")
            for i, (r0, m, slot) in enumerate(blocks):
                ffi.memmove(slot.x, ffi.from_buffer(p.x[r0:r0 + m]), m * l.K * 2)
                while True:
                    rc = lib.radiance_submit(s.h, mid, l.index, m, p.elem, slot.x, slot.y, rid)
                    if rc != -errno.EAGAIN:
                        break
                    c._wait_one(s, -1)   # the CQ is full: reap one, then retry
                if rc < 0:
                    err = c._fail(s, rc, f"submitting layer '{l.name}' of model '{self.name}'")
                    req._slots = [sl for _, _, sl in blocks[:i]]
                    for _, _, sl in blocks[i:]:
                        c._free_slot(sl)
                    del req   # the submitted part is collected once it completes
                    raise err
                slot.rid = int(rid[0])
                s.slots[slot.rid] = slot
            req._slots = [sl for _, _, sl in blocks]
            req._rows = [(r0, m) for r0, m, _ in blocks]
            self._requests.add(req)
        return req

    # -- shared tensors --------------------------------------------------------
    def _tensors(self) -> _TensorMap:
        """The shared tensors, mapped on first use (one MapTensors per Model
        and process: a forked child inherits the read-only mapping)."""
        if self._closed:
            raise RadianceError(errno.EBADF, f"{self!r} was released: its shared tensors are not "
                                f"mapped again (views taken before stay valid)")
        tm = self._tensor_map
        if tm is not None:
            return tm
        c = self._client
        ffi, lib = c._ffi, c._lib
        with c._lock:
            if self._tensor_map is not None:
                return self._tensor_map
            err: Optional[RadianceError] = None
            for attempt in (0, 1):
                s = c._sess() if err is None else c._sess_again(err)
                mid = c._model_id(s, self)
                pp = ffi.new("struct radiance_tensors **")
                rc = lib.radiance_map_tensors(s.h, mid, pp)
                if rc == 0:
                    self._tensor_map = _TensorMap(ffi, lib, pp[0])
                    return self._tensor_map
                err = c._fail(s, rc, f"mapping the shared tensors of model '{self.name}'")
                if attempt == 0 and s.dead is not None and s.dead.errno in _LOST:
                    continue
                raise err
        raise AssertionError("unreachable")

    @property
    def tensors(self) -> Tuple[Tensor, ...]:
        """The model's shared tensors (every checkpoint tensor of no linear
        layer: embeddings, norms, ...), sorted by name. The first use maps
        them (see tensor()). Raises RadianceError: ENOTSUP (a radianced that
        predates shared tensors), EBADF (model released), a connection
        error."""
        return self._tensors().tensors

    @property
    def shared_bytes(self) -> int:
        """Size of the memfd holding the shared tensors (a multiple of 4096):
        what the daemon charges the model for them, once, in its
        resident_bytes. Maps them on first use, as ``tensors``."""
        return self._tensors().bytes

    def tensor(self, name: str) -> np.ndarray:
        """The shared tensor called `name` as a read-only numpy array of its
        shape, in its checkpoint dtype (BF16 as ``ml_dtypes.bfloat16``, F16
        float16, F32 float32, I64 int64, ...), without a copy: a view of the
        daemon's one copy, which every process mapping it shares (this
        process pays page tables only). Writing is refused (ValueError; the
        pages are mapped read-only and sealed: a raw write would fault).
        Copy it (np.array(t)) for a private, writable one.

        Lifetime: the array keeps the mapping alive on its own; it stays
        valid after Model.close(), Client.close(), a daemon restart or the
        model's unload (it then keeps the old pages, no longer counted by the
        daemon, until the last view is gone).

        Raises RadianceError: ENOENT (no shared tensor of that name:
        Model.tensors lists them), ENOTSUP (a dtype numpy cannot view, e.g.
        F4; or a radianced that predates shared tensors), EBADF (the model
        was released), a connection error."""
        tm = self._tensors()
        t = tm.by_name.get(name)
        if t is None:
            raise RadianceError(errno.ENOENT, f"model '{self.name}' has no shared tensor "
                                f"'{name}' ({len(tm.tensors)} tensors: Model.tensors lists them)")
        dt = _NP_DTYPES.get(t.dtype)
        if dt is None:
            raise RadianceError(errno.ENOTSUP, f"shared tensor '{name}' of model '{self.name}' has "
                                f"dtype {t.dtype}, which numpy cannot view")
        count = 1
        for d in t.shape:
            count *= d
        if count == 0 or tm.view is None:
            a = np.zeros(t.shape, dt)   # nothing mapped to view
            a.flags.writeable = False
            return a
        a = np.frombuffer(tm.view, dtype=dt, count=count, offset=t.offset).reshape(t.shape)
        return a

    def _reaped_slots(self, s: _Session):
        for r in list(self._requests):
            for slot in r._slots:
                if slot.session is s and slot.done:
                    yield slot

    def map(self, max_rows: int = DEFAULT_MAX_ROWS, prefill: str = "auto") -> "MappedModel":
        """Maps the model into this process's GPU (libradiance-gpu,
        docs/mapped.md): a MappedModel whose linear() runs the daemon's W4A8
        kernels on torch CUDA tensors, on the caller's stream, on the
        daemon's one copy of the weights. max_rows sizes its scratch, once
        (longer inputs are split into launches of max_rows rows).
        prefill ("auto", "exact" or "fast", as the daemon's option of that
        name) picks the kernel for launches of more than 64 rows; "auto" is
        the daemon's default (fast on sm_90a), and a mapping gives the
        daemon's bits when both use the same one.
        Each call makes a new mapping (close() it, or Model.close() closes
        them all); radiance.torch keeps one per model for its modules.

        Raises RadianceError: EINVAL (max_rows or prefill), ENOENT
        (libradiance-gpu not found: built by make GPU=cuda), EOPNOTSUPP (the daemon cannot map: the cpu
        backend, an older daemon, share = none; with its reason), EPERM
        (the daemon's map_allow), ENODEV (the model's GPU is not visible
        here), EIO (the driver refused the import), EBADF (released)."""
        from ._gpu import MappedModel

        return MappedModel(self, max_rows, prefill)

    def close(self) -> None:
        """Releases this client's reference to the model (the daemon unloads
        it when nobody holds it and it was not preloaded), after closing its
        mappings (Model.map). Waits for this session's requests in flight
        first (libradiance refuses a release while any is). Later calls
        raise RadianceError EBADF. A second close is a no-op."""
        c = self._client
        with c._lock:
            if self._closed:
                return
            for mm in list(self._mappings):
                mm.close()
            self._closed = True
            c._models.pop(self.name, None)
            s = c._session
            if s is None or s.dead is not None or s.pid != os.getpid() or c._closed:
                return
            mid = s.model_ids.pop(self.name, None)
            if mid is None:
                return
            while s.slots and s.dead is None:
                c._wait_one(s, -1)
            if s.dead is None:
                rc = c._lib.radiance_release_model(s.h, mid)
                if rc < 0:
                    raise c._fail(s, rc, f"releasing model '{self.name}'")

    release = close

    def __repr__(self) -> str:
        state = " released" if self._closed else ""
        return f"<radiance.Model '{self.name}' {len(self.layers)} layers{state}>"


class Request:
    """An asynchronous linear (Model.submit). result() waits for it.

    After a successful result(), `queue_ns` and `exec_ns` hold the daemon's
    own account of it (struct radiance_completion): nanoseconds from the
    executor picking the request up to its execution start, and of execution
    (copies included). A request above the daemon's max_rows is split into
    parts that may run together; the figures are then those of the part
    whose queue plus execution was longest. The time between submit() and
    pickup (the doorbell, an executor busy with a round) and the client's own
    wake-up are in neither. Both are None before the result is read."""

    def __init__(self, model: Model, layer: Layer, p: _Prepared):
        self.model = model
        self.layer = layer
        self._p = p
        self._slots: List[_Slot] = []
        self._rows: List[Tuple[int, int]] = []
        self._read = False
        self.queue_ns: Optional[int] = None
        self.exec_ns: Optional[int] = None

    @property
    def rows(self) -> int:
        return self._p.x.shape[0]

    def done(self) -> bool:
        """True once the daemon finished every part (successfully or not);
        does not block."""
        c = self.model._client
        with c._lock:
            s = c._session
            if s is not None and s.dead is None and s.pid == os.getpid():
                c2 = c._ffi.new("struct radiance_completion *")
                while any(not sl.done for sl in self._slots):
                    rc = c._lib.radiance_poll(s.h, c2)
                    if rc == 1:
                        c._reap(s, c2)
                    elif rc == 0:
                        break
                    else:
                        raise c._fail(s, rc, "polling")
            return all(sl.done or sl.session is not s for sl in self._slots)

    def result(self, timeout: Optional[float] = None) -> Array:
        """Waits (up to `timeout` seconds; 0 or less: only looks; None: no
        limit) and returns y [..., N] bf16 (an ndarray, a tensor for tensor
        inputs, or the `out` given to submit). May be called again: returns
        the same object.

        Raises RadianceError: EINVAL (timeout neither None nor a number, or
        NaN), ETIMEDOUT (not complete in time; the request
        stays valid, call again), the daemon's status with its text for a
        refused request, ECONNRESET (or the connection's error) when the
        connection was lost while it was in flight, ECHILD in a forked child
        for a request of the parent, EBADF when the client was closed."""
        c = self.model._client
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or
                                    math.isnan(timeout)):
            raise RadianceError(errno.EINVAL, f"timeout must be a number of seconds or None, "
                                f"not {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if self._read:
            return self._p.result
        while True:
            with c._lock:
                c._collect()
                pending = [sl for sl in self._slots if not sl.done]
                if not pending:
                    return self._finish()
                s = pending[0].session
                if s.pid != os.getpid() and c._session is s:
                    c._sess()   # a forked child: fails the parent's requests
                    continue
                ms = _WAIT_SLICE_MS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RadianceError(errno.ETIMEDOUT, f"layer '{self.layer.name}': not "
                                            f"complete after {timeout} s")
                    ms = max(1, min(ms, int(left * 1000)))
                if s.dead is None:
                    try:
                        c._wait_one(s, ms)
                    except RadianceError:
                        if s.dead is None:
                            raise
                        # the session ended: its requests carry the reason
            # the lock is free here for other threads

    def _finish(self) -> Array:
        c = self.model._client
        err = next((sl.error for sl in self._slots if sl.error is not None), None)
        if err is not None:
            for sl in self._slots:
                c._free_slot(sl)
            self._read = True
            self._error = err
            raise RadianceError(err.errno, f"layer '{self.layer.name}' of model "
                                f"'{self.model.name}': {err.message}")
        y = self._p.y
        ffi = c._ffi
        if self._slots:
            last = max(self._slots, key=lambda sl: sl.queue_ns + sl.exec_ns)
            self.queue_ns, self.exec_ns = last.queue_ns, last.exec_ns
        for (r0, m), sl in zip(self._rows, self._slots):
            dst = y[r0:r0 + m]
            if sl.ycopy is not None:
                dst[...] = np.frombuffer(sl.ycopy, np.uint16).reshape(dst.shape)
            else:
                dst[...] = np.frombuffer(ffi.buffer(sl.y, sl.ybytes), np.uint16).reshape(dst.shape)
            c._free_slot(sl)
        self._read = True
        self.model._requests.discard(self)
        return self._p.result

    def __del__(self):
        try:
            if not self._read and self._slots:
                self.model._client._garbage.append(self._slots)
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "read" if self._read else ("in flight" if self._slots else "empty")
        return f"<radiance.Request '{self.layer.name}' rows={self.rows} {state}>"


# clients of this process, for the fork hook
_CLIENTS: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_child() -> None:
    # The lock may have been held by a thread that does not exist in the
    # child: a fresh one. The session itself is replaced on first use (the
    # pid check in _sess()).
    for c in list(_CLIENTS):
        c._lock = _ClientLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)


def default_socket_path() -> str:
    """The socket Client(socket=None) connects to (radiance_default_socket_path).

    Raises RadianceError: EINVAL ($RADIANCE_DEVICE is set but not a GPU
    ordinal), ENAMETOOLONG ($RADIANCE_SOCKET is too long)."""
    ffi, lib = _lib.load()
    buf = ffi.new("char[]", 4096)
    rc = lib.radiance_default_socket_path(buf, 4096)
    if rc == -errno.EINVAL:
        raise RadianceError(-rc, f"$RADIANCE_DEVICE is {os.environ.get('RADIANCE_DEVICE')!r}, "
                                 f"not a GPU ordinal (0 to 1024, in decimal without leading "
                                 f"zeros), so there is no default socket")
    if rc < 0:
        raise RadianceError(-rc, "the default socket path ($RADIANCE_SOCKET) is too long")
    return os.fsdecode(ffi.string(buf))


def library_version() -> str:
    """libradiance's version string."""
    ffi, lib = _lib.load()
    return ffi.string(lib.radiance_version()).decode()
