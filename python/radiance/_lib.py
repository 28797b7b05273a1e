"""Loading libradiance through cffi in ABI mode.

The declarations are not written here: they are client/radiance.h itself
(shipped in the package as radiance.h), with the comments and preprocessor
lines cffi cannot read taken out. A signature the Python side gets wrong is
how the hand-written ctypes wrapper segfaulted; reading the header leaves
nothing to get wrong, and no compiler is needed at install time.

The library is found, in this order:

1. ``$RADIANCE_LIBRARY``: a path to libradiance.so.0 (an error if it cannot
   be loaded: a variable that is set and wrong is never silently skipped);
2. ``libradiance.so.0`` next to this file (a wheel that bundles it);
3. the system loader: ``libradiance.so.0`` on the default search path
   (``make install``, ``$LD_LIBRARY_PATH``).
"""
from __future__ import annotations

import errno as _errno
import os
import re
import threading
from importlib import resources
from typing import Any, Tuple

import cffi

SONAME = "libradiance.so.0"

# enum radiance_elem (client/radiance.h): the dtype of x and y
BF16, FP16 = 1, 2


def torch_elem(torch: Any, x: Any, where: str) -> int:
    """BF16 or FP16 for a torch tensor x of dtype torch.bfloat16 or
    torch.float16 (torch is the torch module); any other dtype is
    RadianceError EINVAL naming `where` and the dtype."""
    if x.dtype == torch.bfloat16:
        return BF16
    if x.dtype == torch.float16:
        return FP16
    from ._errors import RadianceError

    raise RadianceError(_errno.EINVAL, f"{where}: x has dtype {x.dtype}; the layer takes "
                        f"torch.bfloat16 or torch.float16 (convert explicitly, e.g. "
                        f"x.to(torch.bfloat16))")

_lock = threading.Lock()
_loaded: Tuple[Any, Any] | None = None
_path: str | None = None


def cdef_source(header: str) -> str:
    """The declarations of radiance.h in the form cffi's cdef() takes.

    Drops comments, the C++ guard (``#ifdef __cplusplus`` .. ``#endif``) and
    every other preprocessor line: include guards, #include, and the
    ``*_INIT`` initializer macros (designated initializers are not cdef
    syntax; Python sets ``size`` itself)."""
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out = []
    in_cplusplus = False
    continued = False
    for line in text.splitlines():
        s = line.strip()
        if continued:
            continued = s.endswith("\\")
            continue
        if in_cplusplus:
            if s.startswith("#endif"):
                in_cplusplus = False
            continue
        if s.startswith("#"):
            if re.match(r"#\s*ifdef\s+__cplusplus\b", s):
                in_cplusplus = True
            continued = s.endswith("\\")
            continue
        out.append(line)
    return "\n".join(out)


def _header_text(name: str = "radiance.h") -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _error(message: str) -> Exception:
    from ._errors import RadianceError

    return RadianceError(_errno.ENOENT, message)


def _dlopen(ffi, env: str, soname: str, dirs, hint: str) -> Tuple[Any, str]:
    """(lib, where it came from) for `soname`: ``$env`` (a path that must
    load), then `soname` in each of `dirs`, then the system loader; raises
    RadianceError (ENOENT) naming every place tried, then `hint`."""
    path = os.environ.get(env)
    if path:
        try:
            return ffi.dlopen(path), path
        except OSError as e:
            raise _error(f"cannot load ${env}={path}: {e}") from None
    tried = [f"${env} (not set)"]
    for d in dirs:
        p = os.path.join(d, soname)
        if not os.path.exists(p):
            tried.append(f"{p} (no such file)")
            continue
        try:
            return ffi.dlopen(p), p
        except OSError as e:
            tried.append(f"{p}: {e}")
    try:
        return ffi.dlopen(soname), soname
    except OSError as e:
        tried.append(f"the system loader: {e}")
    raise _error(f"cannot find {soname.split('.so')[0]}: tried " + "; ".join(tried) + ". " + hint)


def load() -> Tuple[Any, Any]:
    """(ffi, lib), loading libradiance on first use; raises RadianceError
    (ENOENT) naming every place that was tried."""
    global _loaded, _path
    with _lock:
        if _loaded is not None:
            return _loaded
        ffi = cffi.FFI()
        ffi.cdef(cdef_source(_header_text()))
        here = os.path.dirname(os.path.abspath(__file__))
        lib, _path = _dlopen(ffi, "RADIANCE_LIBRARY", SONAME, [here],
                             "Build it (make) and set RADIANCE_LIBRARY=build/libradiance.so.0, "
                             "or install it (make install)")
        _loaded = (ffi, lib)
        return _loaded


def library_path() -> str:
    """Where libradiance was loaded from (loading it if needed)."""
    load()
    assert _path is not None
    return _path
