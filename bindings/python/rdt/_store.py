"""What one runtime put, kept alive until rdt frees it.

``put`` hands rdt addresses of memory that Python objects own. Each put
object gets an entry in its runtime's store holding those objects; once rdt
frees the object everywhere (after every transport's garbage_collect) it
queues the entry's key, and the runtime's release thread drops the entry.
The entries also let a Python transport see the very tensors that were put
(not views of them), and let ``get`` of an object the runtime owns return
those tensors, as Ray does.

The caller's thread, the release thread and rdt's threads (running Python
transports) all touch a store: its tables change under its lock.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Set, Tuple

from . import _lib


class RuntimeLike(Protocol):
    """A runtime as the modules below rdt.Runtime see it: they may not
    import _runtime, which imports them. What they use of it: its C handle,
    its store, the device of its collective groups, whether it is closed,
    and closing it."""

    _store: "Store"

    @property
    def closed(self) -> bool: ...

    def _handle(self) -> int: ...

    def _group_device(self, transport: Optional[str]) -> Optional[int]: ...

    def close(self) -> None: ...


class Entry:
    """One put object: the put tensors in put order, what keeps their memory
    alive, and its skeleton."""

    __slots__ = ("tensors", "keep", "skeleton", "oid", "sent", "back", "key", "__weakref__")

    def __init__(self, tensors: List[Any], keep: List[Any], skeleton: Any) -> None:
        self.tensors = tensors
        self.keep = keep
        self.skeleton = skeleton
        self.oid = ""
        # Refs to it serialized (pickled), and those deserialized again by
        # its own runtime: more sent than came back, and others may read it.
        self.sent = 0
        self.back = 0
        self.key = 0

    @property
    def shared(self) -> bool:
        """Whether a ref to it went to another runtime (or is on its way)."""
        return self.sent > self.back


# Puts pass no release callback: a callback would enter Python on an rdt
# thread and contend for the GIL with the thread that puts and gets (tens of
# microseconds a round trip). Each runtime is created with
# RDT_RUNTIME_QUEUE_RELEASES instead, and one Python thread per runtime
# takes the keys of freed objects and drops their entries.
NO_RELEASE = ctypes.cast(None, _lib.ReleaseFn)
_BATCH = 256
# After a batch, the thread sleeps this long before it waits again: it then
# takes the GIL at most a few hundred times a second however fast objects
# are freed, and an idle process never wakes it.
_PAUSE = 0.002


class Store:
    """One runtime's put objects, puts in progress and receive buffers."""

    def __init__(self) -> None:
        # Re-entrant: finalizers take it (a dropped fetch forgets its
        # receive buffers or starts its drain), and garbage collection may
        # run them inside any section that allocates.
        self.lock = threading.RLock()
        self._keys = itertools.count(1)
        self.entries: Dict[int, Entry] = {}   # release-callback key -> entry
        self.by_id: Dict[str, Entry] = {}     # object id -> entry (objects whose id is known)
        # Tensors of puts in progress, by their data addresses: a transport's
        # extract_tensor_transport_metadata runs inside rdt_put and gets these.
        self.putting: Dict[Tuple[int, ...], Entry] = {}
        # Buffers that fetches in progress receive into, by data address: a
        # transport's recv_multiple_tensors gets these objects as target_buffers.
        # Kept only while Python transports are registered (python_transports > 0).
        self.receiving: Dict[int, Any] = {}
        self.python_transports = 0
        self._warned_shared = False
        # rdt's own threads that run Python code for this store (the release
        # thread, drains of aborted fetches): joined when the runtime goes,
        # so that none runs Python while the interpreter finalizes.
        self._threads: Set[threading.Thread] = set()

    # ---- put objects ---------------------------------------------------------------

    def add(self, entry: Entry) -> int:
        # Without the lock: taking the next key and storing into the dict
        # are each atomic, and nothing reads the entry under its new key
        # before rdt_put returns the object's release to it.
        key = entry.key = next(self._keys)
        self.entries[key] = entry
        return key

    def drop(self, key: int) -> None:
        with self.lock:
            e = self.entries.pop(key, None)
            if e is not None and e.oid:
                self._unindex(e)

    def index(self, entry: Entry, oid: str) -> None:
        """Finds entry by oid from now on, unless it was dropped already.
        Without the lock (it runs on every first pickling of a ref): index
        first, then look whether drop took the entry meanwhile. drop takes
        the entry before it unindexes, so one of the two always unindexes
        an entry that went."""
        entry.oid = oid
        self.by_id[oid] = entry
        if self.entries.get(entry.key) is not entry:
            self._unindex(entry)

    def _unindex(self, e: Entry) -> None:
        if self.by_id.get(e.oid) is e:
            self.by_id.pop(e.oid, None)  # pop: index and drop may both get here

    def own(self, oid: str) -> Optional[Entry]:
        """The entry of an object of this runtime with that id, if it is known."""
        return self.by_id.get(oid) if self.by_id else None

    def warn_shared(self, stacklevel: int) -> None:
        """Warns, once for this runtime, that a get of an own object whose
        ref also went elsewhere gives back the put tensors (as Ray does)."""
        with self.lock:
            if self._warned_shared:
                return
            self._warned_shared = True
        warnings.warn(
            "rdt.get of an object put by this runtime returns the put tensors themselves, not copies; a ref to "
            "the object was also sent elsewhere, and its readers there read the same memory: changes made here "
            "before they fetch may be seen by them (use out= to get a copy).", UserWarning, stacklevel=stacklevel + 1)

    def holds(self, data: int) -> bool:
        """Whether an object here holds a tensor at this address."""
        with self.lock:
            entries = list(self.entries.values())
        return any(t[0] == data for e in entries for t in e.keep)

    def clear(self) -> None:
        """Forgets every entry (the runtime is destroyed). The entries go
        after the lock is let go: their tensors' finalizers may call back."""
        with self.lock:
            gone = (self.entries, self.by_id, self.putting)
            self.entries, self.by_id, self.putting = {}, {}, {}
        del gone

    # ---- Python transports and their receive buffers -------------------------------

    def transport_added(self) -> None:
        with self.lock:
            self.python_transports += 1

    def transport_removed(self) -> None:
        with self.lock:
            self.python_transports -= 1

    def receive_into(self, pairs: Iterable[Tuple[int, Any]]) -> List[Tuple[int, Any]]:
        """Registers (data address, buffer) pairs for a fetch when Python
        transports may receive it; returns what was registered."""
        if not self.python_transports:
            return []
        mine = [(data, obj) for data, obj in pairs if data]
        with self.lock:
            for data, obj in mine:
                self.receiving[data] = obj
        return mine

    def target(self, data: int) -> Any:
        return self.receiving.get(data)

    def forget(self, mine: List[Tuple[int, Any]]) -> None:
        if not mine:
            return
        with self.lock:
            for data, obj in mine:
                if self.receiving.get(data) is obj:
                    del self.receiving[data]

    # ---- the release thread --------------------------------------------------------

    def start_thread(self, target: Callable[..., None], args: Tuple[Any, ...], name: str) -> threading.Thread:
        """Runs target(*args) on a daemon thread that join_threads waits for."""
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self.lock:  # started under the lock, so that no prune sees it not yet alive
            # Pruned in place: a finalizer that starts a thread while the
            # list below is made keeps it in the set.
            for gone in [x for x in self._threads if not x.is_alive()]:
                self._threads.discard(gone)
            self._threads.add(t)
            t.start()
        return t

    def join_threads(self, timeout: float) -> None:
        """Waits up to timeout seconds for this store's threads (but the
        calling one) to end; a thread ends only after it let go of what its
        target and arguments held."""
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        with self.lock:
            threads = [t for t in self._threads if t is not me]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def start_releaser(self, handle: int, name: str) -> threading.Thread:
        return self.start_thread(self._take_released, (handle,), f"rdt-release-{name}")

    def _take_released(self, handle: int) -> None:
        take = _lib.lib().rdt_runtime_take_released
        keys = (ctypes.c_void_p * _BATCH)()
        n = ctypes.c_size_t()
        while True:
            # Waits without the GIL; returns CLOSED (or INVALID_ARGUMENT for a
            # handle already gone) once the runtime is destroyed.
            if take(handle, keys, _BATCH, ctypes.byref(n), -1) != _lib.OK:
                return
            for i in range(n.value):
                self.drop(keys[i] or 0)
            if n.value < _BATCH:
                time.sleep(_PAUSE)
