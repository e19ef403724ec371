"""What the process shares across its runtimes: the set of live runtimes,
the transports registered for every runtime, the cache of receive buffers,
and whether the interpreter is shutting down. Every Runtime joins it when made; the default runtime
is kept above, in _default."""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

from ._errors import AlreadyExistsError
from ._logs import FORWARDER
from ._receive import ReceiveCache, limit_from_environment
from ._store import RuntimeLike


class Process:
    """The process's runtimes and the transports each of them gets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runtimes: "weakref.WeakSet[RuntimeLike]" = weakref.WeakSet()
        # Transports registered with rdt.register_tensor_transport: every
        # runtime of the process gets them, also those created later.
        self.transports: Dict[str, Tuple[str, Any, Any, Any]] = {}
        self.shutting_down = False
        self._receive_cache: Optional[ReceiveCache] = None

    def receive_cache(self) -> ReceiveCache:
        """The buffers large receives land in, shared by every runtime of
        the process (and by rdt.ray, which may bound it otherwise); made on
        first use, bounded by RDT_RECEIVE_CACHE_MIB (1 GiB of dropped
        buffers when unset)."""
        cache = self._receive_cache
        if cache is None:
            with self.lock:
                if self._receive_cache is None:
                    self._receive_cache = ReceiveCache(limit_from_environment())
                cache = self._receive_cache
        return cache

    # ---- runtimes ------------------------------------------------------------------

    def add(self, rt: RuntimeLike) -> List[Tuple[str, Any, Any, Any]]:
        """Counts a new runtime in; returns the process's transports it gets."""
        with self.lock:
            self.runtimes.add(rt)
            return list(self.transports.values())

    def live(self) -> List[RuntimeLike]:
        with self.lock:
            return [rt for rt in self.runtimes if not rt.closed]

    def holder_of(self, data: int) -> Optional[RuntimeLike]:
        """A live runtime holding an object with a tensor at this address."""
        for rt in self.live():
            if rt._store.holds(data):
                return rt
        return None

    # ---- transports for every runtime ----------------------------------------------

    def add_transport(self, name: str, entry: Tuple[str, Any, Any, Any]) -> None:
        key = name.lower()
        with self.lock:
            if key in self.transports:
                raise AlreadyExistsError(f"a transport named {name!r} is already registered in this process", AlreadyExistsError.status)
            self.transports[key] = entry

    def remove_transport(self, name: str) -> None:
        with self.lock:
            self.transports.pop(name.lower(), None)

    # ---- shutdown ------------------------------------------------------------------

    def shutdown(self) -> None:
        # Destroy every runtime while Python still runs: release callbacks and
        # Python transports run during destroy and need the interpreter. After
        # this no rdt thread calls into Python any more.
        with self.lock:
            self.shutting_down = True
            runtimes = list(self.runtimes)
        for rt in runtimes:
            try:
                rt.close()
            except Exception:
                pass
        # The lines logged while closing reach logging too; then stderr again.
        FORWARDER.stop()


PROCESS = Process()
atexit.register(PROCESS.shutdown)
