"""The managed-handle base: one C handle, closed exactly once, usable as a
context manager, and closed as a last resort by garbage collection.
Runtime, ObjectRef and Fetch are built on it."""

from __future__ import annotations

from typing import Any, Optional, TypeVar

from ._errors import ClosedError


_H = TypeVar("_H", bound="Handle")


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

    def _take(self) -> Optional[int]:
        """Swaps the handle out: exactly one caller gets it, later ones None.
        Popping it off the instance's dict is one atomic step (the class
        attribute, None, shows through afterwards), so a handle is freed
        exactly once even if threads race to close it, without a lock."""
        return self.__dict__.pop("_ptr", None)

    def close(self) -> None:
        """Frees the handle (idempotent; safe from several threads)."""
        p = self._take()
        if p is not None:
            self._free(p)

    def _free(self, ptr: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _collected(self) -> None:
        """What garbage collection does with a handle still held: close()
        unless a subclass must not block there."""
        self.close()

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._ptr is not None:
                self._collected()
        except Exception:
            pass  # during interpreter shutdown the library may be gone
