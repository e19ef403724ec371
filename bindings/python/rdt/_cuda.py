"""The CUDA driver, as the Python side needs it: only to wait for CUDA's
legacy default stream before rdt copies a tensor a DLPack producer ordered
there (rdt's own copies run on streams of rdt's, in the Go core). Loaded on
first use, from RDT_CUDA_LIBRARY or libcuda.so.1, as the core loads it."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Dict, Optional

from ._errors import TransportError, UnsupportedError

_CU_STREAM_LEGACY = 1  # CU_STREAM_LEGACY, a stream handle

_SIGNATURES = (("cuInit", [ctypes.c_uint]),
               ("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
               ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]),
               ("cuCtxGetCurrent", [ctypes.POINTER(ctypes.c_void_p)]),
               ("cuCtxSetCurrent", [ctypes.c_void_p]),
               ("cuStreamSynchronize", [ctypes.c_void_p]))


def _check(lib: ctypes.CDLL, call: str, rc: int) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        if hasattr(lib, "cuGetErrorName"):
            lib.cuGetErrorName(rc, ctypes.byref(name))
        raise TransportError(f"{call} failed: {(name.value or b'').decode() or 'CUresult'} ({rc})")


class Driver:
    """The process's handle on the CUDA driver and the primary contexts it
    retained (kept for the process's life, as rdt's transports keep theirs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: Optional[ctypes.CDLL] = None
        self._contexts: Dict[int, int] = {}

    def _driver(self) -> ctypes.CDLL:
        lib = self._lib
        if lib is not None:
            return lib
        with self._lock:
            if self._lib is None:
                path = os.environ.get("RDT_CUDA_LIBRARY") or "libcuda.so.1"
                try:
                    loaded = ctypes.CDLL(path)
                    for name, args in _SIGNATURES:
                        fn = getattr(loaded, name)
                        fn.argtypes, fn.restype = args, ctypes.c_int
                except (OSError, AttributeError) as e:
                    raise UnsupportedError(f"a DLPack tensor in CUDA memory: cannot load the CUDA driver {path} to "
                                           f"wait for the producer's work before rdt copies it: {e}") from None
                _check(loaded, "cuInit", loaded.cuInit(0))
                self._lib = loaded
            return self._lib

    def _context(self, lib: ctypes.CDLL, device_id: int) -> int:
        ctx = self._contexts.get(device_id)
        if ctx is None:
            with self._lock:
                dev, c = ctypes.c_int(), ctypes.c_void_p()
                _check(lib, "cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), device_id))
                _check(lib, "cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev.value))
                ctx = self._contexts.setdefault(device_id, c.value or 0)
        return ctx

    def wait_legacy_stream(self, device_id: int) -> None:
        """Waits until the work queued on CUDA's legacy default stream of
        GPU ``device_id`` (in its primary context, the one torch, CuPy and
        JAX use) is done. A DLPack producer asked with stream=1 orders the
        work that writes a tensor before that stream; rdt then copies on
        streams of its own, which do not wait for it."""
        lib = self._driver()
        ctx = self._context(lib, device_id)
        saved = ctypes.c_void_p()
        _check(lib, "cuCtxGetCurrent", lib.cuCtxGetCurrent(ctypes.byref(saved)))
        switch = (saved.value or 0) != ctx
        if switch:
            _check(lib, "cuCtxSetCurrent", lib.cuCtxSetCurrent(ctx))
        try:
            _check(lib, "cuStreamSynchronize", lib.cuStreamSynchronize(_CU_STREAM_LEGACY))
        finally:
            if switch:
                lib.cuCtxSetCurrent(saved)


DRIVER = Driver()
