"""What this process put, kept alive until rdt frees it.

``put`` hands rdt addresses of memory that Python objects own. Each put
object gets an entry here holding those objects; once rdt frees the object
everywhere (after every transport's garbage_collect) it queues the entry's
key, and the runtime's release thread drops the entry. The entries also let a Python transport
see the very tensors that were put (not views of them), and let ``get`` of
an object this process owns return those tensors, as Ray does.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _lib

if TYPE_CHECKING:
    from ._runtime import Runtime


class Entry:
    """One put object: the runtime it lives in, the put tensors in put order,
    what keeps their memory alive, and its skeleton."""

    __slots__ = ("runtime", "tensors", "keep", "skeleton", "oid", "sent", "key", "__weakref__")

    def __init__(self, runtime: "Runtime", tensors: List[Any], keep: List[Any], skeleton: Any) -> None:
        self.runtime = runtime
        self.tensors = tensors
        self.keep = keep
        self.skeleton = skeleton
        self.oid = ""
        self.sent = False  # a ref to it was serialized: other processes may read it
        self.key = 0


_keys = itertools.count(1)
entries: Dict[int, Entry] = {}   # release-callback key -> entry
by_id: Dict[str, Entry] = {}     # object id -> entry

# Tensors of puts in progress, by their data addresses: a transport's
# extract_tensor_transport_metadata runs inside rdt_put and gets these.
putting: Dict[Tuple[int, ...], "Entry"] = {}

# Buffers that fetches in progress receive into, by data address: a
# transport's recv_multiple_tensors gets these objects as target_buffers.
# Kept only while Python transports are registered (python_transports > 0).
receiving: Dict[int, Any] = {}
python_transports = 0


def add(entry: Entry) -> int:
    key = next(_keys)
    entry.key = key
    entries[key] = entry
    return key


def drop(key: int) -> None:
    e = entries.pop(key, None)
    if e is not None and e.oid:
        if by_id.get(e.oid) is e:
            del by_id[e.oid]


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


def start_releaser(runtime: "Runtime", handle: int) -> threading.Thread:
    t = threading.Thread(target=_take_released, args=(handle,), name=f"rdt-release-{runtime.name or ''}",
                         daemon=True)
    t.start()
    return t


def _take_released(handle: int) -> None:
    take = _lib.lib().rdt_runtime_take_released
    keys = (ctypes.c_void_p * _BATCH)()
    n = ctypes.c_size_t()
    while True:
        # Waits without the GIL; returns CLOSED (or INVALID_ARGUMENT for a
        # handle already gone) once the runtime is destroyed.
        if take(handle, keys, _BATCH, ctypes.byref(n), -1) != _lib.OK:
            return
        for i in range(n.value):
            drop(keys[i] or 0)
        if n.value < _BATCH:
            time.sleep(_PAUSE)


def drop_runtime(runtime: "Runtime") -> None:
    """Forgets every entry of a destroyed runtime (normally already gone:
    destroy runs the release callbacks)."""
    for key, e in list(entries.items()):
        if e.runtime is runtime:
            drop(key)


def holder_of(data: int) -> Optional["Runtime"]:
    """A runtime holding an object with a tensor at this address."""
    for e in list(entries.values()):
        for t in e.keep:
            if t[0] == data:
                return e.runtime
    return None
