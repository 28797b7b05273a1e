"""close() at the end of a with block, and at garbage collection: the one
copy of that protocol for the package's handles (Client, Model,
MappedModel), each of which defines close() (idempotent, safe to call
again after it)."""
from __future__ import annotations

from typing import TypeVar

_T = TypeVar("_T", bound="Closing")


class Closing:
    """``with handle: ...`` calls ``handle.close()`` on the way out, whether
    or not the block raised (the exception is not swallowed)."""

    def close(self) -> None:   # every subclass defines it
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ClosedWhenCollected(Closing):
    """Also closed when the object is collected. Best effort: an error then
    has nobody to reach (the interpreter may be shutting down), so it is
    dropped; call close() to see it."""

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
