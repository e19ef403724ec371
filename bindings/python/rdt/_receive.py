"""Host memory that large receives land in: mappings advised for huge
pages, and kept for the next receive of the same size once nothing refers
to them any more. ``get`` (through _tensors.allocate) and rdt.ray receive
into them; the process keeps one cache (_process.PROCESS.receive_cache).

A fresh mapping costs a page fault and the zeroing of every page on the
first write, which is as much again as moving the bytes; a receiver that
takes the same shapes every step (weights, activations) pays it once.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import warnings
import weakref
from typing import Any, List, Sequence, Tuple

import numpy as np

from ._errors import InvalidArgumentError

# Host receive buffers at least this large are mapped and advised for huge
# pages: faulting in 4 KiB pages costs more than moving the bytes. Their
# mappings are kept for reuse once dropped, in whole huge pages.
HUGE_PAGE_MIN = 4 << 20
HUGE_PAGE = 2 << 20
# How many bytes of dropped receive buffers a process keeps unless told
# (RDT_RECEIVE_CACHE_MIB, or rdt.ray's runtime_env(receive_cache=...)).
DEFAULT_LIMIT = 1 << 30
LIMIT_VARIABLE = "RDT_RECEIVE_CACHE_MIB"
MAX_LIMIT_MIB = 1 << 20


def limit_from_environment() -> int:
    """The cache's bound in bytes: RDT_RECEIVE_CACHE_MIB (0 keeps nothing),
    else DEFAULT_LIMIT. A value that is not an integer from 0 to
    MAX_LIMIT_MIB is an InvalidArgumentError naming the variable."""
    value = os.environ.get(LIMIT_VARIABLE, "")
    if value == "":
        return DEFAULT_LIMIT
    try:
        mib = int(value)
    except ValueError:
        mib = -1
    if not 0 <= mib <= MAX_LIMIT_MIB:
        raise InvalidArgumentError(f"environment variable {LIMIT_VARIABLE}={value!r}: "
                                   f"want an integer from 0 to {MAX_LIMIT_MIB}")
    return mib << 20


class ReceiveCache:
    """Receive buffers of 4 MiB and more, mapped for huge pages, and kept for
    the next receive of the same size once the tensor over them is dropped,
    up to ``limit`` bytes (oldest dropped first).

    A buffer comes back only when the last tensor or view over its memory
    is gone (a finalizer on the ctypes array every view keeps alive), and
    rdt keeps the targets of an aborted fetch alive until nothing writes
    into them, so a buffer is never handed out while in use."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Re-entrant: a view's finalizer runs under garbage collection,
        # which any allocation may start, also inside this lock.
        self._lock = threading.RLock()
        self._free: List[Tuple[int, mmap.mmap]] = []  # (mapped bytes, mapping), oldest first
        self._bytes = 0

    def buffer(self, nbytes: int) -> Any:
        """A writable buffer of nbytes (uninitialized, like torch.empty)."""
        mapped = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        m = None
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if self._free[i][0] == mapped:
                    m = self._free.pop(i)[1]
                    self._bytes -= mapped
                    break
        if m is None:
            m = mmap.mmap(-1, mapped, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            advice = getattr(mmap, "MADV_HUGEPAGE", None)
            if advice is not None:
                try:
                    m.madvise(advice)
                except OSError:
                    pass  # kernels without transparent huge pages: 4 KiB pages then
        view = (ctypes.c_char * nbytes).from_buffer(m)
        if self.limit >= mapped:
            done = weakref.finalize(view, self._give_back, mapped, m)
            done.atexit = False
        return view

    def _give_back(self, mapped: int, m: mmap.mmap) -> None:
        entry = (mapped, m)  # made before the lock: making it may start a collection
        with self._lock:
            self._free.append(entry)
            self._bytes += mapped
            self._trim()

    def _trim(self) -> None:
        """Under the lock: drops the oldest mappings beyond the bound."""
        while self._bytes > self.limit:
            self._bytes -= self._free.pop(0)[0]  # unmapped once its last view is gone

    def set_limit(self, limit: int) -> None:
        """Bounds the cache to ``limit`` bytes from now on (0: keeps none)."""
        with self._lock:
            self.limit = limit
            self._trim()

    def cached_bytes(self) -> int:
        with self._lock:
            return self._bytes

    # ---- tensors over the buffers -----------------------------------------------------

    def numpy_array(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """An uninitialized array over a buffer of the cache, like ``numpy.empty``."""
        shape = tuple(int(d) for d in shape)
        dt = np.dtype(dtype)
        return np.frombuffer(self.buffer(_count(shape) * dt.itemsize), dtype=dt).reshape(shape)

    def torch_tensor(self, torch: Any, shape: Sequence[int], dtype: Any) -> Any:
        """An uninitialized CPU tensor over a buffer of the cache, like
        ``torch.empty``."""
        shape = tuple(int(d) for d in shape)
        nbytes = _count(shape) * torch.empty((), dtype=dtype).element_size()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about buffers it may not own; this one it keeps alive
            return torch.frombuffer(self.buffer(nbytes), dtype=torch.uint8).view(dtype).reshape(shape)


def _count(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
