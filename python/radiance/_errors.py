"""The one exception type of the package."""
from __future__ import annotations

import errno as _errno
import os


# where errno.errorcode keeps an alias of the name C code uses (35 is
# EDEADLOCK there, EDEADLK in glibc's and libradiance's words)
_CODES = {_errno.EDEADLK: "EDEADLK"}


class RadianceError(Exception):
    """Every failure of the package: a refused argument (checked in Python
    before anything reaches the daemon), a libradiance return code, or a
    request the daemon refused.

    Attributes:
        errno: the positive errno value (``errno.EINVAL``, ``errno.ENOENT``,
            ``errno.ECONNRESET``, ...);
        code: its symbolic name, e.g. ``"EINVAL"``;
        message: the text: what was wrong and where, with the values; for
            failures of libradiance or the daemon, their own words
            (``radiance_error_message()``, else ``radiance_strerror()``).
    """

    def __init__(self, errno: int, message: str):
        errno = abs(int(errno))
        super().__init__(errno, message)
        self.errno = errno
        self.code = _CODES.get(errno) or _errno.errorcode.get(errno, str(errno))
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"

    def __repr__(self) -> str:
        return f"RadianceError({self.code}, {self.message!r})"

    def __reduce__(self):   # picklable across processes (multiprocessing)
        return (RadianceError, (self.errno, self.message))


def strerror(err: int) -> str:
    """radiance_strerror() when the library is there, else os.strerror()."""
    try:
        from ._lib import load

        ffi, lib = load()
        return ffi.string(lib.radiance_strerror(int(err))).decode("utf-8", "replace")
    except RadianceError:
        return os.strerror(abs(int(err)))
