"""Mapped mode: a resident model's layers run in this process's GPU, on the
daemon's one copy of the weights (libradiance-gpu, docs/mapped.md).

libradiance-gpu.so.0 (``make GPU=cuda``) is loaded through the same cffi
FFI as libradiance, its declarations read from radiance_gpu.h (shipped in
the package, a symlink to client/radiance_gpu.h in the tree), so a
``struct radiance *`` of a Client's session is the same C type for both.
It is found, in this order:

1. ``$RADIANCE_GPU_LIBRARY``: a path (an error if it cannot be loaded);
2. ``libradiance-gpu.so.0`` in the directory libradiance was loaded from
   (a build tree holds both: RADIANCE_LIBRARY=build-cuda/libradiance.so.0
   is enough);
3. ``libradiance-gpu.so.0`` next to this file (a wheel that bundles it);
4. the system loader.

Device memory and streams here are the vendor runtime's (CUDA or HIP) of
the process: ``MappedModel.linear`` takes torch CUDA tensors and runs on
``torch.cuda.current_stream()``; ``linear_ptr`` takes raw device pointers
and a stream handle for other frameworks.
"""
from __future__ import annotations

import errno
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._closing import ClosedWhenCollected
from ._errors import RadianceError

if TYPE_CHECKING:   # pragma: no cover
    from ._client import Layer, Model

GPU_SONAME = "libradiance-gpu.so.0"
#: rows one radiance_gpu_linear call of a mapping takes unless told
#: otherwise (Model.map(max_rows=)): the daemon's default max_rows; longer
#: inputs are split into calls of this many rows
DEFAULT_MAX_ROWS = 512
_BF16, _FP16 = _lib.BF16, _lib.FP16
#: layers one linear_multi call takes (RADIANCE_MAX_LAYERS_PER_REQUEST, radiance.h)
MAX_LAYERS = 8

_lock = threading.Lock()
_loaded: Optional[Tuple[Any, Any]] = None
_path: Optional[str] = None
_declared = False


def load() -> Tuple[Any, Any]:
    """(ffi, gpu lib), loading libradiance-gpu on first use (and libradiance
    before it: the GPU library links it, and the loader reuses the copy
    already loaded, by its soname). Raises RadianceError ENOENT naming every
    place tried."""
    global _loaded, _path, _declared
    ffi, lib = _lib.load()
    with _lock:
        if _loaded is not None:
            return _loaded
        if not _declared:   # once: a failed search below may be retried
            ffi.cdef(_lib.cdef_source(_lib._header_text("radiance_gpu.h")))
            _declared = True
        dirs = []
        where = _lib.library_path()
        if os.sep in where:
            dirs.append(os.path.dirname(os.path.abspath(where)))
        dirs.append(os.path.dirname(os.path.abspath(__file__)))
        glib, _path = _lib._dlopen(
            ffi, "RADIANCE_GPU_LIBRARY", GPU_SONAME, dirs,
            "It is built by make GPU=cuda (or GPU=hip) beside libradiance.so.0 "
            "(build-cuda/); set RADIANCE_GPU_LIBRARY to its path, or install it")
        _loaded = (ffi, glib)
        return _loaded


def library_path() -> str:
    """Where libradiance-gpu was loaded from (loading it if needed)."""
    load()
    assert _path is not None
    return _path


def _message(ffi, glib) -> str:
    p = glib.radiance_gpu_error_message()
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


def _torch():
    t = sys.modules.get("torch")
    if t is None:
        import torch as t   # noqa: F811 - only MappedModel.linear needs it
    return t


# radiance_gpu_options.prefill (RADIANCE_GPU_PREFILL_*), as the daemon's
# `prefill` option names them
_PREFILL = {"auto": 0, "exact": 1, "fast": 2}


class MappedModel(ClosedWhenCollected):
    """A model of the daemon mapped into this process's GPU
    (``radiance_gpu_map``): Model.map() makes one.

    The weights are the daemon's allocation, imported read-only (VMM; a
    legacy IPC handle is read-write: that API has no read-only mode), not a
    copy. The mapping allocated, once, the scratch its kernels need for
    calls of up to ``max_rows`` rows (``scratch_bytes`` of device memory);
    nothing is allocated per call, and calls never synchronize, so they can
    be captured in a CUDA graph.

    Attributes: model (the Model), device (the CUDA ordinal in this
    process), handle ("vmm" or "ipc"), read_only, mapped_bytes,
    scratch_bytes, max_rows.

    Streams and threads: the scratch serves one stream at a time.
    linear(), linear_fp8() and linear_multi() keep that true by themselves: when a call comes on another stream than the
    last one, the new stream first waits (an event) for the work enqueued
    on the old one. While a stream is being captured into a CUDA graph no
    such wait is inserted (nothing runs during capture): replay the graph
    where it is ordered with other uses of this mapping, e.g. on the stream
    that uses it, as torch's graph replay on the current stream does.
    linear_ptr() leaves the ordering to its caller. Calls from several
    threads are serialized by a lock.

    Lifetime: the session counts as mapping the model until close(); the
    daemon keeps the model resident and Model.close() unmaps first. After a
    daemon restart the mapping keeps working (the process holds the
    memory), outside the new daemon's accounting: close() it and map again.
    Not inherited across fork (CUDA is not); a child maps its own.
    """

    def __init__(self, model: "Model", max_rows: int = DEFAULT_MAX_ROWS, prefill: str = "auto"):
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or not \
                1 <= max_rows < 1 << 32:
            raise RadianceError(errno.EINVAL, f"max_rows must be an int in 1..2^32-1, not "
                                              f"{max_rows!r}")
        if not isinstance(prefill, str) or prefill not in _PREFILL:
            raise RadianceError(errno.EINVAL, f"prefill must be one of "
                                              f"{', '.join(_PREFILL)}, not {prefill!r}")
        ffi, glib = load()
        self._ffi, self._glib = ffi, glib
        self.model = model
        self._lock = threading.Lock()
        self._g = ffi.NULL
        self._last_stream = None
        c = model._client
        with c._lock:
            s = c._sess()
            mid = c._model_id(s, model)
            opt = ffi.new("struct radiance_gpu_options *")
            opt.size = ffi.sizeof("struct radiance_gpu_options")
            opt.max_rows = max_rows
            opt.prefill = _PREFILL[prefill]
            pp = ffi.new("struct radiance_gpu_model **")
            rc = glib.radiance_gpu_map(s.h, mid, opt, pp)
            if rc < 0:
                text = _message(ffi, glib)
                if -rc == errno.EOPNOTSUPP and s.info["backend"] == "cpu":
                    text += (f" (radianced {s.info['server_version']} runs the cpu backend: "
                             f"CUDA tensors need a daemon on the gpu backend; pass CPU tensors "
                             f"to use the rings)")
                raise RadianceError(-rc, f"mapping model '{model.name}': {text}")
            self._g = pp[0]
            self._session = s
            self._pid = os.getpid()
            model._mappings.append(self)
        info = ffi.new("struct radiance_gpu_info *")
        glib.radiance_gpu_get_info(self._g, info)
        self.device = int(info.device)
        self.handle = ffi.string(info.handle).decode() if info.handle != ffi.NULL else ""
        self.read_only = bool(info.read_only)
        self.mapped_bytes = int(info.mapped_bytes)
        self.scratch_bytes = int(info.scratch_bytes)
        self.max_rows = int(info.max_rows)

    @property
    def closed(self) -> bool:
        return self._g == self._ffi.NULL

    def _check_open(self) -> None:
        if self._g == self._ffi.NULL:
            raise RadianceError(errno.EBADF, f"{self!r} is closed")
        if self._pid != os.getpid():
            raise RadianceError(errno.ECHILD, f"model '{self.model.name}' was mapped by process "
                                f"{self._pid}; a forked child maps it again (Model.map())")

    def linear_ptr(self, layer: Union[int, str, "Layer"], x: int, y: int, rows: int,
                   dtype: str = "bf16", stream: int = 0) -> None:
        """Enqueues y = layer(x) on `stream` (a cudaStream_t as an int, 0:
        the legacy default stream): x a device pointer to [rows][K] bf16 or
        fp16 (dtype "bf16" / "fp16"), y to [rows][N] bf16, both 16-byte
        aligned, on this mapping's device, which must be the thread's
        current device; rows 1..max_rows. Nothing is checked about the
        memory behind the pointers: the caller owns it. Raises
        RadianceError: ENOENT (layer), EINVAL (rows 0, dtype, alignment),
        E2BIG (rows above max_rows), EIO (a launch failed), EBADF
        (closed)."""
        l = self.model.layer(layer)
        elem = {"bf16": _BF16, "fp16": _FP16}.get(dtype)
        if elem is None:
            raise RadianceError(errno.EINVAL, f"dtype must be 'bf16' or 'fp16', not {dtype!r}")
        with self._lock:
            self._check_open()
            self._run(l, x, y, rows, elem, stream)

    def _run(self, l: "Layer", x: int, y: int, rows: int, elem: int, stream: int) -> None:
        ffi = self._ffi
        rc = self._glib.radiance_gpu_linear(self._g, l.index, ffi.cast("void *", x),
                                            ffi.cast("void *", y), rows, elem,
                                            ffi.cast("void *", stream))
        if rc < 0:
            raise RadianceError(-rc, f"layer '{l.name}' of model '{self.model.name}' (mapped): "
                                     f"{_message(ffi, self._glib)}")

    def _order(self, t, stream) -> None:
        """Makes `stream` wait for the work enqueued on the last stream that
        used the scratch (lock held)."""
        last = self._last_stream
        self._last_stream = stream
        if last is None or last.cuda_stream == stream.cuda_stream:
            return
        if t.cuda.is_current_stream_capturing():
            return   # nothing runs during capture; an outside event cannot be waited on
        ev = t.cuda.Event()
        ev.record(last)
        stream.wait_event(ev)

    def _on_device(self, t, v, what: str, where: str):
        """v, detached, after checking that it is a torch CUDA tensor on this
        mapping's device."""
        if not isinstance(v, t.Tensor):
            raise RadianceError(errno.EINVAL, f"{where}: {what} must be a torch.Tensor, not "
                                              f"{type(v).__name__}")
        if v.device.type != "cuda":
            raise RadianceError(errno.EINVAL, f"{where}: {what} is on {v.device}; a mapped model "
                                f"takes CUDA tensors (Model.linear serves CPU ones)")
        if v.device.index != self.device:
            raise RadianceError(errno.EINVAL, f"{where}: {what} is on {v.device}, the model is "
                                f"mapped on cuda:{self.device} (where the daemon holds it)")
        return v.detach()

    @staticmethod
    def _packed(v):
        """v contiguous and 16-byte aligned: a copy (on the device, on the
        current stream) where it is not."""
        if not v.is_contiguous():
            v = v.contiguous()
        if v.data_ptr() % 16:
            v = v.clone()
        return v

    @staticmethod
    def _output(t, out, yshape, device, inputs, where: str):
        """A new bf16 tensor of yshape, or `out` after checking it (never
        copied): a contiguous, 16-byte aligned torch.bfloat16 tensor of
        yshape on `device`, overlapping none of `inputs` ((name, tensor)
        pairs)."""
        if out is None:
            return t.empty(yshape, dtype=t.bfloat16, device=device)
        if not isinstance(out, t.Tensor):
            raise RadianceError(errno.EINVAL, f"{where}: out must be a torch.Tensor, not "
                                              f"{type(out).__name__}")
        problems = []
        if out.device != device:
            problems.append(f"on {out.device}")
        if out.dtype != t.bfloat16:
            problems.append(f"dtype {out.dtype}")
        if tuple(out.shape) != tuple(yshape):
            problems.append(f"shape {tuple(out.shape)}")
        if not out.is_contiguous():
            problems.append("not contiguous")
        elif out.data_ptr() % 16:
            problems.append(f"not 16-byte aligned ({out.data_ptr():#x})")
        if not problems and out.numel():
            yb, ye = out.data_ptr(), out.data_ptr() + out.numel() * 2
            for name, v in inputs:
                if v.numel() and v.data_ptr() < ye and yb < v.data_ptr() + v.numel() * v.element_size():
                    problems.append(f"overlaps {name}")
                    break
        if problems:
            raise RadianceError(errno.EINVAL, f"{where}: out must be a contiguous, 16-byte "
                                f"aligned torch.bfloat16 tensor of shape {tuple(yshape)} on "
                                f"{device}; it is {', '.join(problems)} (out= is never copied)")
        return out.detach()

    def _launch(self, t, device, launch) -> None:
        """Calls launch(h) under the lock, h the handle of torch's current
        stream of `device`, once that stream is ordered after the last one
        this mapping's scratch served (_order); launch enqueues the calls."""
        stream = t.cuda.current_stream(device)
        with self._lock:
            self._check_open()
            with t.cuda.device(device):
                self._order(t, stream)
                launch(stream.cuda_stream)

    def linear(self, layer: Union[int, str, "Layer"], x, out=None):
        """``y = x . W^T + bias`` for a torch CUDA tensor x [..., K] of
        torch.bfloat16 or torch.float16 on this mapping's device, enqueued
        on ``torch.cuda.current_stream()`` (asynchronous, as any torch CUDA
        op). Any leading shape; rows above max_rows are split into several
        launches. Non-contiguous x, or x not 16-byte aligned (a view at an
        odd offset), is copied first (on the device, on that stream).

        out: optional contiguous torch.bfloat16 CUDA tensor [..., N] on the
            same device, 16-byte aligned, not overlapping x (never copied).
        Returns y [..., N] torch.bfloat16 (a new tensor, or `out`).

        Raises RadianceError: EINVAL (not a tensor, not on CUDA, another
        device, dtype, last dimension != K, out), ENOENT (layer), EBADF
        (closed), ECHILD (mapped by the parent process), EIO (a launch
        failed)."""
        t = _torch()
        l = self.model.layer(layer)
        where = f"layer '{l.name}' of model '{self.model.name}' (mapped)"
        x = self._on_device(t, x, "x", where)
        elem = _lib.torch_elem(t, x, where)
        if x.dim() == 0 or x.shape[-1] != l.K:
            raise RadianceError(errno.EINVAL, f"{where}: x has shape {tuple(x.shape)}: the layer "
                                f"takes a last dimension of K={l.K} (N={l.N})")
        x = self._packed(x)
        y = self._output(t, out, (*x.shape[:-1], l.N), x.device, [("x", x)], where)
        rows = x.numel() // l.K if l.K else 0
        if rows == 0:
            return out if out is not None else y
        xs, ys = x.element_size() * l.K, 2 * l.N
        xp, yp = x.data_ptr(), y.data_ptr()

        def launch(h):
            for r0 in range(0, rows, self.max_rows):
                self._run(l, xp + r0 * xs, yp + r0 * ys, min(self.max_rows, rows - r0), elem, h)
        self._launch(t, x.device, launch)
        return out if out is not None else y

    def linear_fp8(self, layer: Union[int, str, "Layer"], codes, scales, out=None):
        """``y = (codes x scales) . W^T + bias`` for activations this process
        quantized itself (``radiance_gpu_linear_fp8``: no quant launch; an
        engine that fuses vLLM's per-token dynamic fp8 quant into its
        RMSNorm). Enqueued on ``torch.cuda.current_stream()``.

        codes: torch CUDA tensor [..., K] of torch.float8_e4m3fn (OCP E4M3;
            torch.uint8 holding the same bits is taken too), on this
            mapping's device; copied first when not contiguous or not
            16-byte aligned.
        scales: torch.float32 CUDA tensor of shape codes.shape[:-1], or that
            with a trailing 1 (vLLM's [tokens, 1]): row t stands for
            codes[t] * scales[t]. radiance's own quant makes s = amax / 448
            (docs/numerics.md "Activations"); given those codes and scales,
            y is linear(x)'s bit for bit.
        out: optional, as linear().
        Returns y [..., N] torch.bfloat16. Only W4A8 layers (a bf16 layer
        takes x: linear()).

        Raises RadianceError: EINVAL (a bf16 layer, not tensors, not on
        CUDA, another device, dtypes, shapes, out), ENOENT (layer), EBADF
        (closed), ECHILD (mapped by the parent process), EIO (a launch
        failed)."""
        t = _torch()
        l = self.model.layer(layer)
        where = f"layer '{l.name}' of model '{self.model.name}' (mapped, fp8 codes)"
        if l.kind != "w4a8":
            raise RadianceError(errno.EINVAL, f"{where}: a {l.kind} layer takes no fp8 codes; "
                                f"pass x to linear()")
        codes = self._on_device(t, codes, "codes", where)
        if codes.dtype not in (getattr(t, "float8_e4m3fn", t.uint8), t.uint8):
            raise RadianceError(errno.EINVAL, f"{where}: codes have dtype {codes.dtype}; they take "
                                f"torch.float8_e4m3fn (or torch.uint8 holding its bits)")
        if codes.dim() == 0 or codes.shape[-1] != l.K:
            raise RadianceError(errno.EINVAL, f"{where}: codes have shape {tuple(codes.shape)}: "
                                f"the layer takes a last dimension of K={l.K} (N={l.N})")
        lead = tuple(codes.shape[:-1])
        scales = self._on_device(t, scales, "scales", where)
        if scales.dtype != t.float32:
            raise RadianceError(errno.EINVAL, f"{where}: scales have dtype {scales.dtype}; "
                                f"per-token scales are torch.float32")
        if tuple(scales.shape) not in (lead, lead + (1,)):
            raise RadianceError(errno.EINVAL, f"{where}: scales have shape {tuple(scales.shape)}; "
                                f"codes of shape {tuple(codes.shape)} take one scale per row: "
                                f"{lead} or {lead + (1,)}")
        codes, scales = self._packed(codes), scales.contiguous()   # float32: 4-byte aligned
        y = self._output(t, out, (*lead, l.N), codes.device, [("codes", codes), ("scales", scales)],
                         where)
        rows = codes.numel() // l.K
        if rows == 0:
            return out if out is not None else y
        ffi, glib, g = self._ffi, self._glib, self._g
        cp, sp, yp = codes.data_ptr(), scales.data_ptr(), y.data_ptr()

        def launch(h):
            for r0 in range(0, rows, self.max_rows):
                m = min(self.max_rows, rows - r0)
                rc = glib.radiance_gpu_linear_fp8(
                    g, l.index, ffi.cast("void *", cp + r0 * l.K),
                    ffi.cast("float *", sp + r0 * 4), ffi.cast("void *", yp + r0 * 2 * l.N), m,
                    ffi.cast("void *", h))
                if rc < 0:
                    raise RadianceError(-rc, f"{where}: {_message(ffi, glib)}")
        self._launch(t, codes.device, launch)
        return out if out is not None else y

    def linear_multi(self, layers: Sequence[Union[int, str, "Layer"]], x, out=None) -> List[Any]:
        """``[layer(x) for layer in layers]`` in one call
        (``radiance_gpu_linear_multi``: q, k and v, or gate and up, on one
        x): the same bits as that many linear() calls; where every layer is
        W4A8 and its kernel reads natural-order codes (up to 32 rows on
        sm_90a), x is quantized once for all of them. Enqueued on
        ``torch.cuda.current_stream()``.

        layers: a list of 1..8 (RADIANCE_MAX_LAYERS_PER_REQUEST) distinct
            layers (names, indexes or Layer objects) of one K.
        x: as linear().
        out: optional list of len(layers), each None (a new tensor) or a
            tensor as linear()'s out= for its layer, overlapping neither x
            nor each other.
        Returns [y_0, ..., y_{n-1}], y_j [..., N_j] torch.bfloat16 (out[j]
        where given).

        Raises RadianceError: EINVAL (layers not a list (one str, Layer or
        index alone), no layers, more than 8, a layer named twice, layers of
        different K: the message names them and their K; x and out as
        linear()), ENOENT (a layer), EBADF, ECHILD, EIO as linear(). All
        checked before anything is enqueued, for empty x too."""
        t = _torch()
        where = f"model '{self.model.name}' (mapped, linear_multi)"
        ls = self.model._multi_layers(layers, where, "call", MAX_LAYERS)
        if out is not None and (isinstance(out, t.Tensor) or not hasattr(out, "__len__")
                                or len(out) != len(ls)):
            raise RadianceError(errno.EINVAL, f"{where}: out must be a list of {len(ls)} entries, "
                                f"None or a tensor for each layer")
        K = ls[0].K
        x = self._on_device(t, x, "x", where)
        elem = _lib.torch_elem(t, x, where)
        if x.dim() == 0 or x.shape[-1] != K:
            raise RadianceError(errno.EINVAL, f"{where}: x has shape {tuple(x.shape)}: the layers "
                                f"take a last dimension of K={K}")
        x = self._packed(x)
        lead = tuple(x.shape[:-1])
        ys: List[Any] = []
        for j, l in enumerate(ls):
            ys.append(self._output(t, None if out is None else out[j], (*lead, l.N), x.device,
                                   [("x", x)] + [(f"out[{i}]", v) for i, v in enumerate(ys)],
                                   f"{where}, out[{j}] ({l.name})"))
        # out's own tensors where given (the same storage as ys[j])
        result = [y if out is None or out[j] is None else out[j] for j, y in enumerate(ys)]
        rows = x.numel() // K
        if rows == 0:
            return result
        ffi, glib, g = self._ffi, self._glib, self._g
        idx = ffi.new("uint32_t[]", [l.index for l in ls])
        yv = ffi.new("void *[]", len(ls))
        xp, xs = x.data_ptr(), x.element_size() * K

        def launch(h):
            for r0 in range(0, rows, self.max_rows):
                m = min(self.max_rows, rows - r0)
                for j, l in enumerate(ls):
                    yv[j] = ffi.cast("void *", ys[j].data_ptr() + r0 * 2 * l.N)
                rc = glib.radiance_gpu_linear_multi(g, idx, len(ls), ffi.cast("void *", xp + r0 * xs),
                                                    yv, m, elem, ffi.cast("void *", h))
                if rc < 0:
                    raise RadianceError(-rc, f"{where}: {_message(ffi, glib)}")
        self._launch(t, x.device, launch)
        return result

    def close(self) -> None:
        """Unmaps: waits for this mapping's device (torch.cuda.synchronize,
        when torch's CUDA is initialized: no work using the mapping may be
        pending), frees the scratch, and tells the daemon (when the session
        that mapped is still the client's). A second close is a no-op; in a
        forked child it only forgets the mapping."""
        with self._lock:
            if self._g == self._ffi.NULL:
                return
            g, self._g = self._g, self._ffi.NULL
            try:
                self.model._mappings.remove(self)
            except ValueError:
                pass
            if self._pid != os.getpid():
                return
            t = sys.modules.get("torch")
            if t is not None and t.cuda.is_initialized():
                t.cuda.synchronize(self.device)
            c = self.model._client
            with c._lock:
                s = c._session
                live = s is self._session and s is not None and s.dead is None
                rc = self._glib.radiance_gpu_unmap(s.h if live else self._ffi.NULL, g)
                if rc < 0 and live:
                    raise c._fail(s, rc, f"unmapping model '{self.model.name}'")

    def __repr__(self) -> str:
        if self._g == self._ffi.NULL:
            return f"<radiance.MappedModel '{self.model.name}' closed>"
        return (f"<radiance.MappedModel '{self.model.name}' cuda:{self.device} {self.handle}"
                f"{' read-only' if self.read_only else ' read-write'} "
                f"{self.mapped_bytes / 2**20:.1f} MiB mapped, {self.scratch_bytes / 2**20:.1f} MiB "
                f"scratch, max_rows {self.max_rows}>")
