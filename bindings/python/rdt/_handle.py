"""The managed-handle base: one C handle, closed exactly once, usable as a
context manager."""

from __future__ import annotations

import threading
from typing import Any, Optional

from ._errors import ClosedError


# Closing swaps the handle out under one lock for all handles: a handle is
# freed exactly once even if threads race to close it.
_close_lock = threading.RLock()  # re-entrant: __del__ may run inside it


class Handle:
    """Owns a C handle. ``close()`` frees it (idempotent); so does leaving a
    ``with`` block, and, as a last resort, garbage collection."""

    _ptr: Optional[int] = None

    def __init__(self, ptr: int) -> None:
        self._ptr = ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _handle(self) -> int:
        p = self._ptr
        if p is None:
            raise ClosedError(f"{type(self).__name__} is closed", ClosedError.status)
        return p

    def close(self) -> None:
        """Frees the handle (idempotent; safe from several threads)."""
        with _close_lock:
            p, self._ptr = self._ptr, None
        if p is not None:
            self._free(p)

    def _free(self, ptr: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._ptr is not None:
                self.close()
        except Exception:
            pass  # during interpreter shutdown the library may be gone
