"""Exceptions: one class per rdt status, all under RdtError."""

from __future__ import annotations

from typing import Dict, Type


class RdtError(Exception):
    """An rdt call failed. ``status`` is the C status code, ``message`` the
    library's detailed message."""

    status: int = -50

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgumentError(RdtError, ValueError):
    status = -1


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (a timeout that is a str, say): an
    InvalidArgumentError that is also a builtin ``TypeError``."""


class NotFoundError(RdtError, LookupError):
    status = -2


class AlreadyExistsError(RdtError, ValueError):
    """A transport of that name is already registered."""

    status = -3


class GetTimeoutError(RdtError, TimeoutError):
    """The deadline passed. Also a builtin ``TimeoutError``."""

    status = -4


class AbortedError(RdtError):
    status = -5


class PeerUnavailableError(RdtError, ConnectionError):
    """The other runtime is gone or cannot be reached."""

    status = -6


class CorruptError(RdtError, ValueError):
    status = -7


class UnsupportedError(RdtError, TypeError):
    status = -8


class PermissionDeniedError(RdtError, PermissionError):
    status = -9


class TransportError(RdtError):
    status = -10


class NoMemoryError(RdtError, MemoryError):
    status = -11


class ABIMismatchError(RdtError):
    status = -12


class ForkedError(RdtError):
    """rdt was used in a child forked after the library was loaded."""

    status = -13


class ClosedError(RdtError):
    status = -14


class InternalError(RdtError):
    status = -50


class UserError(RdtError):
    """A transport callback failed (for a Python transport: it raised)."""

    status = -100


_BY_STATUS: Dict[int, Type[RdtError]] = {
    cls.status: cls
    for cls in (
        InvalidArgumentError, NotFoundError, AlreadyExistsError, GetTimeoutError,
        AbortedError, PeerUnavailableError, CorruptError, UnsupportedError,
        PermissionDeniedError, TransportError, NoMemoryError, ABIMismatchError,
        ForkedError, ClosedError, InternalError, UserError,
    )
}


def error_for(status: int, message: str) -> RdtError:
    """The exception for a status code (codes at or below -100 are a
    callback's own and map to UserError)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = UserError if status <= -100 else RdtError
    return cls(message, status)
