"""What this process put, kept alive until rdt frees it.

``put`` hands rdt addresses of memory that Python objects own. Each put
object gets an entry here holding those objects; rdt's release callback,
which runs once the object is freed everywhere (after every transport's
garbage_collect), drops the entry. The entries also let a Python transport
see the very tensors that were put (not views of them), and let ``get`` of
an object this process owns return those tensors, as Ray does.
"""

from __future__ import annotations

import itertools
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _lib

if TYPE_CHECKING:
    from .runtime import Runtime


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


def _released(user_data: Optional[int]) -> None:
    # On an rdt thread, holding the GIL (ctypes took it). Dict operations
    # only: nothing here can block or call back into rdt.
    if sys.is_finalizing():
        return
    try:
        drop(user_data or 0)
    except BaseException:  # noqa: BLE001 - nothing may unwind into rdt
        pass


# One callback object for the life of the process (rdt may call it until
# the last runtime is destroyed).
release_fn = _lib.ReleaseFn(_released)


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
