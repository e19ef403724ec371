"""rdt: direct tensor transport between processes and hosts.

    ref = rdt.put({"w": weights})          # in the producer; nothing is copied
    blob = pickle.dumps(ref)               # hand the ref to another process
    value = rdt.get(pickle.loads(blob))    # in the consumer: the bytes move now
    value = await rdt.get_async(ref)       # the same, in asyncio, without a thread
    rows = rdt.get(ref["w"][0:512])        # only rows 0..511 of "w" move: an rdt.Range

The words are those of the C ABI (docs/abi.md, "Vocabulary"): a get moves an
object's bytes to you, a write moves yours into an object its owner exposed;
each comes blocking (get, write), started (get_start, write_start: an
rdt.Fetch or rdt.Write to wait on) or prepared to run many times
(prepare_get, prepare_write: an rdt.Prepared).

The native library (librdt.so) is loaded on first use, not at import.
"""

import warnings as _warnings

from ._errors import (ABIMismatchError, AbortedError, AlreadyExistsError, ClosedError, CorruptError,
                      ForkedError, GetTimeoutError, InternalError, InvalidArgumentError, NoMemoryError,
                      NotFoundError, PeerUnavailableError, PermissionDeniedError, RdtError, TransportError,
                      UnsupportedError, UserError)
from ._default import (create_collective_group, default_runtime, destroy_collective_group, expose, fetch, get,
                       get_async, get_start, init, prepare_get, prepare_write, put, register_tensor_transport,
                       wait_tensor_freed, write, write_async, write_start)
from ._fetch import Fetch
from ._logs import set_log_level
from ._lib import decode as _decode
from ._lib import lib as _native
from ._ref import ObjectRef, Range, WriteNotice
from ._runtime import Runtime
from ._prepared import Prepared
from ._write import Write
from ._transport import (CommunicatorMetadata, FetchRequest, Peer, TensorTransportManager,
                        TensorTransportMetadata)

__version__ = "0.1.0"


def library_version() -> str:
    """The version of the loaded librdt.so."""
    return _decode(_native().rdt_version())


def build_info() -> "dict[str, str]":
    """How the loaded librdt.so was built: go, os, arch, compiler, cc,
    buildmode, tags, cgo, and the vcs revision where the build recorded it."""
    text = _decode(_native().rdt_build_info())
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def __getattr__(name: str) -> "type":
    """The earlier name of rdt.Range, with a DeprecationWarning. (It is not
    in __all__, where a star import would warn; rdt.fetch, which warns when
    called, still is.)"""
    if name == "TensorSlice":
        _warnings.warn("rdt.TensorSlice is deprecated: use rdt.Range", DeprecationWarning, stacklevel=2)
        return Range
    raise AttributeError(f"module 'rdt' has no attribute {name!r}")


__all__ = [
    "Runtime", "ObjectRef", "Range", "Fetch", "Write", "WriteNotice", "init", "default_runtime", "put", "get",
    "get_start", "get_async", "wait_tensor_freed", "expose", "write", "write_start", "write_async", "Prepared",
    "prepare_get", "prepare_write", "fetch",
    "register_tensor_transport", "library_version", "build_info", "set_log_level",
    "create_collective_group", "destroy_collective_group",
    "TensorTransportManager", "TensorTransportMetadata", "CommunicatorMetadata", "FetchRequest", "Peer",
    "RdtError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "GetTimeoutError",
    "AbortedError", "PeerUnavailableError", "CorruptError", "UnsupportedError", "PermissionDeniedError",
    "TransportError", "NoMemoryError", "ABIMismatchError", "ForkedError", "ClosedError", "InternalError",
    "UserError",
]
