"""rdt's log lines, in Python's ``logging`` under the logger ``rdt``.

Once the library is loaded, the core holds its log lines in a bounded queue
instead of writing them to stderr (rdt_log_capture), and a daemon thread
here takes them (rdt_log_take) and hands each to the logger. The core never
calls into Python to log: a line logged on one of its threads while a
Python thread holds the GIL and waits inside rdt cannot deadlock.

``RDT_LOG_STDERR=1`` keeps the lines on stderr, as in C programs.
Until the application configures logging, nothing is printed (the logger
has a NullHandler).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Optional, Union

from . import _lib

LOGGER = logging.getLogger("rdt")
# As libraries do: a program that configured no logging sees no line of
# rdt's (a failed fetch is in the exception it raises already), rather
# than logging's last-resort printing of warnings to stderr. Handlers the
# application adds, on this logger or above it, get every line.
LOGGER.addHandler(logging.NullHandler())

# RDT_LOG_* to logging's levels.
_TO_LOGGING = {2: logging.ERROR, 3: logging.WARNING, 4: logging.INFO, 5: logging.DEBUG}
_NAMES = {"error": logging.ERROR, "warn": logging.WARNING, "warning": logging.WARNING,
          "info": logging.INFO, "debug": logging.DEBUG}
_OFF = logging.CRITICAL + 10  # above every level: nothing passes
_TAKE_BATCH = 64
_TAKE_WAIT_MS = 200  # how soon the thread sees that it should stop
_STOP_JOIN_S = 2.0


def _core_level(level: int) -> int:
    """The RDT_LOG_* level that lets through what logging's ``level`` does."""
    if level >= _OFF:
        return _lib.LOG_LEVELS["off"]
    if level > logging.WARNING:
        return _lib.LOG_LEVELS["error"]
    if level > logging.INFO:
        return _lib.LOG_LEVELS["warn"]
    if level > logging.DEBUG:
        return _lib.LOG_LEVELS["info"]
    return _lib.LOG_LEVELS["debug"]


class Forwarder:
    """The thread that moves the core's held log lines into ``logging``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lib: Optional[ctypes.CDLL] = None

    def start(self, lib: ctypes.CDLL) -> None:
        """Called once, when the library is loaded."""
        if os.environ.get("RDT_LOG_STDERR", "") not in ("", "0"):
            return
        with self._lock:
            if self._thread is not None:
                return
            self._lib = lib
            # A level set on the logger before rdt loaded is the core's too.
            if LOGGER.level != logging.NOTSET and not os.environ.get("RDT_LOG"):
                lib.rdt_log_set_level(_core_level(LOGGER.level))
            _lib.check(lib.rdt_log_capture(1))
            self._thread = threading.Thread(target=self._run, name="rdt-logs", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Takes the last lines, then gives stderr back (at interpreter exit)."""
        with self._lock:
            thread, lib = self._thread, self._lib
            self._thread = None
        if thread is None or lib is None or not _lib.loaded():
            return
        self._stop.set()
        thread.join(_STOP_JOIN_S)
        lib.rdt_log_capture(0)

    def _run(self) -> None:
        lib = self._lib
        assert lib is not None
        records = (_lib.LogRecord * _TAKE_BATCH)()
        for r in records:
            _lib.init(r)
        count = ctypes.c_size_t()
        while True:
            status = lib.rdt_log_take(ctypes.addressof(records), _TAKE_BATCH, ctypes.byref(count), _TAKE_WAIT_MS)
            if status != _lib.OK:
                return  # capture was turned off
            for r in records[:count.value]:
                self._emit(r)
            if count.value == 0 and self._stop.is_set():
                return

    @staticmethod
    def _emit(r: "_lib.LogRecord") -> None:
        level = _TO_LOGGING.get(r.level, logging.WARNING)
        if not LOGGER.isEnabledFor(level):
            return
        runtime = _lib.decode(r.runtime)
        record = LOGGER.makeRecord(LOGGER.name, level, "(rdt)", 0, "%s: %s",
                                   (runtime, _lib.decode(r.message)), None,
                                   extra={"rdt_runtime": runtime})
        record.created = r.unix_ns / 1e9
        record.msecs = (r.unix_ns // 1_000_000) % 1000
        try:
            LOGGER.handle(record)
        except Exception:  # a broken handler must not stop the thread
            pass


FORWARDER = Forwarder()


def set_log_level(level: Union[str, int, None]) -> None:
    """Sets how much rdt logs, in the core and on the ``rdt`` logger:
    "debug", "info", "warn", "error", "off", one of logging's levels, or
    None to give every runtime its own level back (its ``log_level``, else
    ``$RDT_LOG``) and the logger NOTSET."""
    if level is None:
        py, core = logging.NOTSET, _lib.LOG_LEVELS[None]
    elif isinstance(level, str):
        key = level.strip().lower()
        if key == "off":
            py = _OFF
        elif key in _NAMES:
            py = _NAMES[key]
        else:
            raise ValueError(f"rdt: log level must be debug, info, warn, error, off or a logging level, not {level!r}")
        core = _core_level(py)
    elif isinstance(level, int) and not isinstance(level, bool):
        py, core = level, _core_level(level)
    else:
        raise TypeError(f"rdt: log level must be a name or a logging level, not {type(level).__name__}")
    _lib.check(_lib.lib().rdt_log_set_level(core))
    LOGGER.setLevel(py)
