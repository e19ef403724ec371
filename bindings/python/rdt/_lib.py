"""Loads librdt.so (lazily, exactly once) and declares the C ABI for ctypes.

The structures mirror include/rdt.h field for field, and every exported
function gets its argument and result types here. Calls go through
``ctypes.CDLL``, which releases the GIL for the duration of each foreign
call: rdt's own threads call back into Python (transport callbacks, release
callbacks) while a Python thread waits inside rdt, and that must not
deadlock. (``ctypes.PyDLL`` would keep the GIL: never use it here.)
"""

from __future__ import annotations

import ctypes
import math
import numbers
import os
import struct
import sys
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int32, c_int64, c_size_t, c_uint8,
                    c_uint16, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ._errors import ForkedError, InvalidArgumentError, InvalidArgumentTypeError, RdtError, error_for

ABI_VERSION = 1
OBJECT_ID_LEN = 32
NAME_MAX = 63
REASON_MAX = 511
MAX_NDIM = 64
MAX_DEVICES = 8
# The most tensors one object holds: the library refuses a ref claiming more.
MAX_TENSORS = 1 << 20
# The C ABI's timeouts are int64 milliseconds; the library caps them further.
MAX_TIMEOUT_MS = (1 << 63) - 1

OK = 0
ERR_INVALID_ARGUMENT = -1
ERR_TIMEOUT = -4
ERR_UNSUPPORTED = -8
ERR_FORKED = -13
ERR_CLOSED = -14
ERR_USER = -100

DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3
DEVICE_ROCM = 10
DEVICE_CUDA_MANAGED = 13

RUNTIME_IN_PROCESS = 1 << 0
RUNTIME_NO_BUILTIN_TRANSPORTS = 1 << 1
RUNTIME_QUEUE_RELEASES = 1 << 2

RELEASE_REVOKE_LEASES = 1 << 0

TRANSPORT_ONE_SIDED = 1 << 0
TRANSPORT_CAN_ABORT = 1 << 1
TRANSPORT_BUILTIN = 1 << 2
TRANSPORT_SAME_HOST_ONLY = 1 << 3
TRANSPORT_RANGES = 1 << 4
TRANSPORT_WRITES = 1 << 5

ROLE_SOURCE = 1
ROLE_DESTINATION = 2

LOG_LEVELS = {None: 0, "off": 1, "error": 2, "warn": 3, "info": 4, "debug": 5}


class Device(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class Tensor(Structure):
    """rdt_tensor, layout-compatible with DLPack's DLTensor (48 bytes)."""

    _fields_ = [
        ("data", c_void_p),
        ("device", Device),
        ("ndim", c_int32),
        ("dtype", DType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class RuntimeOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("name", c_char_p),
        ("log_level", c_int32),
        ("flags", c_uint32),
        ("lease_ms", c_int64),
        ("peer_timeout_ms", c_int64),
        ("listen_tcp", c_char_p),
        ("auth_token", c_char_p),
        ("advertise_host", c_char_p),
        ("socket_dir", c_char_p),
        ("host_id", c_char_p),
    ]


class Range(Structure):
    """rdt_range: a byte range of one tensor of an object (what a target of a
    partial get receives, or where a source of a partial write lands)."""

    _fields_ = [("ref", c_uint32), ("tensor", c_uint32), ("offset", c_uint64), ("length", c_uint64)]


class GetOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("transport", c_char_p),
                ("sources", POINTER(Range)), ("num_sources", c_size_t)]


class ViewOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("transport", c_char_p)]


# rdt_view_options.flags: map copy-on-write.
VIEW_PRIVATE = 1


class DeserializeOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("timeout_ms", c_int64)]


# RDT_DESERIALIZE_TIMEOUT_DEFAULT_MS: how long deserializing waits for the owner.
DESERIALIZE_TIMEOUT_DEFAULT_MS = 30000


class GroupOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("backend", c_char_p)]


class ObjectInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_tensors", c_uint32),
        ("object_id", c_char * (OBJECT_ID_LEN + 1)),
        ("transport", c_char * (NAME_MAX + 1)),
        ("is_owner", c_int32),
        ("nbytes", c_uint64),
        ("is_writable", c_int32),
    ]


class WriteOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("transport", c_char_p),
                ("destinations", POINTER(Range)), ("num_destinations", c_size_t), ("tag", c_uint64)]


NOTICE_MESSAGE_MAX = 255


class WriteNotice(Structure):
    _fields_ = [("struct_size", c_uint32), ("status", c_int32), ("tag", c_uint64), ("nbytes", c_uint64),
                ("writer", c_char * (OBJECT_ID_LEN + 1)), ("message", c_char * (NOTICE_MESSAGE_MAX + 1))]


class TensorInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("ndim", c_int32),
        ("device", Device),
        ("dtype", DType),
        ("nbytes", c_uint64),
        ("shape", c_int64 * MAX_NDIM),
    ]


class Transfer(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("role", c_uint32),
        ("object_id", c_char_p),
        ("transfer_id", c_uint64),
        ("transport", c_char_p),
        ("source_runtime", c_char_p),
        ("source_address", c_char_p),
        ("destination_runtime", c_char_p),
        ("destination_address", c_char_p),
        ("ranges", POINTER(Range)),
        ("num_ranges", c_size_t),
    ]


class TransportInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("name", c_char * (NAME_MAX + 1)),
        ("num_devices", c_uint32),
        ("devices", c_int32 * MAX_DEVICES),
        ("transfers_completed", c_uint64),
        ("transfers_failed", c_uint64),
        ("bytes_received", c_uint64),
        ("sends_completed", c_uint64),
        ("bytes_sent", c_uint64),
        ("auto_rank_host", c_uint32),
        ("auto_rank_cuda", c_uint32),
        ("writes_completed", c_uint64),
        ("writes_failed", c_uint64),
        ("bytes_written", c_uint64),
    ]


# Fetch histograms (rdt.h "Observability"): size class c < FETCH_SIZE_CLASSES - 1
# holds objects of at most 4096 << 4c bytes; bucket b < FETCH_LATENCY_BUCKETS - 1
# fetches of at most 2^b microseconds.
FETCH_SIZE_CLASSES = 6
FETCH_LATENCY_BUCKETS = 25


def fetch_size_class_max_bytes(c: int) -> Optional[int]:
    """RDT_FETCH_SIZE_CLASS_MAX_BYTES(c); None for the last, unbounded class."""
    return 4096 << (4 * c) if c < FETCH_SIZE_CLASSES - 1 else None


def fetch_latency_bucket_max_us(b: int) -> Optional[int]:
    """RDT_FETCH_LATENCY_BUCKET_MAX_US(b); None for the last, unbounded bucket."""
    return 1 << b if b < FETCH_LATENCY_BUCKETS - 1 else None


class FetchHistogram(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("size_class", c_uint32),
        ("transport", c_char * (NAME_MAX + 1)),
        ("count", c_uint64),
        ("sum_ns", c_uint64),
        ("bytes", c_uint64),
        ("failures", c_uint64),
        ("buckets", c_uint64 * FETCH_LATENCY_BUCKETS),
        ("direction", c_uint32),
    ]


# rdt_fetch_histogram.direction (RDT_DIRECTION_*), as fetch_histograms names it.
DIRECTION_NAMES = ("get", "write")


class UnavailableTransport(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("status", c_int32),
        ("name", c_char * (NAME_MAX + 1)),
        ("reason", c_char * (REASON_MAX + 1)),
    ]


STATS_FIELDS = (
    "objects", "objects_freed", "refs", "borrows", "borrowed_objects", "refs_in_transit",
    "leases_expired", "fetches_active", "transfers_completed", "transfers_failed", "bytes_received",
    "sends_completed", "bytes_sent", "local_copies", "peers", "peers_lost",
    "writes_completed", "writes_failed", "bytes_written", "writes_open", "views_open", "bytes_viewed",
)


class Stats(Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32)] + [(n, c_uint64) for n in STATS_FIELDS]


LOG_MESSAGE_MAX = 1023


class LogRecord(Structure):
    _fields_ = [("struct_size", c_uint32), ("level", c_int32), ("unix_ns", c_int64),
                ("runtime", c_char * (NAME_MAX + 1)), ("message", c_char * (LOG_MESSAGE_MAX + 1))]


class Scratch:
    """A small block of native memory for one call's arguments and results:
    an rdt_tensor with its shape, handles, out-parameters. ``base`` is its
    address; ``word(i)`` reads the i-th 8-byte word. Taken with
    :func:`scratch` and given back with :func:`give_back` once the call
    returned (rdt copies what it reads during the call)."""

    __slots__ = ("buf", "base", "words")

    SIZE = 512  # 64 words: a tensor of up to 48 dimensions with its handle

    def __init__(self) -> None:
        self.buf = ctypes.create_string_buffer(self.SIZE)
        self.base = ctypes.addressof(self.buf)
        self.words = (c_uint64 * (self.SIZE // 8)).from_buffer(self.buf)


# Free blocks. Each block is used by one call at a time: it is popped off
# this list for the call and appended back afterwards (both atomic), so
# that threads, and a signal handler that calls rdt on the thread it
# interrupted, never share one.
_scratch: List[Scratch] = []
_SCRATCH_KEPT = 32


def scratch() -> Scratch:
    try:
        return _scratch.pop()
    except IndexError:
        return Scratch()


def give_back(s: Scratch) -> None:
    if len(_scratch) < _SCRATCH_KEPT:
        _scratch.append(s)


# rdt_object_info read with struct from a Scratch block: struct_size,
# num_tensors, object_id, transport, is_owner, nbytes, is_writable.
_INFO = struct.Struct("=II33s64s3xiQi4x")
assert _INFO.size == ctypes.sizeof(ObjectInfo) and ObjectInfo.is_owner.offset == 108 and \
    ObjectInfo.nbytes.offset == 112 and ObjectInfo.is_writable.offset == 120


class RefInfo(NamedTuple):
    """rdt_ref_info's answer."""

    object_id: str
    transport: str
    is_owner: bool
    nbytes: int
    num_tensors: int
    is_writable: bool


def ref_info(handle: int) -> RefInfo:
    """rdt_ref_info of a ref handle (raises for a failed call)."""
    s = scratch()
    try:
        _INFO.pack_into(s.buf, 0, _INFO.size, 0, b"", b"", 0, 0, 0)
        st = lib().rdt_ref_info(handle, s.base)
        if st != OK:
            raise make_error(st)
        _, n, oid, tr, owner, nbytes, writable = _INFO.unpack_from(s.buf, 0)
    finally:
        give_back(s)
    return RefInfo(oid.split(b"\0", 1)[0].decode(), tr.split(b"\0", 1)[0].decode(), bool(owner), nbytes, n,
                   bool(writable))


def init(struct: Any) -> Any:
    """Sets struct_size, as the header's static inline *_init functions do."""
    struct.struct_size = ctypes.sizeof(struct)
    return struct


# Callback types: rdt_release_fn and the members of rdt_transport_vtable.
ReleaseFn = CFUNCTYPE(None, c_void_p)
FreeUserDataFn = CFUNCTYPE(None, c_void_p)
ExtractMetadataFn = CFUNCTYPE(c_int32, c_void_p, c_char_p, POINTER(Tensor), c_size_t, c_void_p)
CommunicatorMetadataFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), c_void_p)
SendFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), POINTER(Tensor), c_size_t,
                   c_void_p, c_size_t, c_void_p, c_size_t)
RecvFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), POINTER(Tensor), c_size_t,
                   c_void_p, c_size_t, c_void_p, c_size_t)
FetchFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), POINTER(Tensor), c_size_t,
                    c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_void_p))
WaitFn = CFUNCTYPE(c_int32, c_void_p, c_void_p, c_int64)
ReleaseRequestFn = CFUNCTYPE(None, c_void_p, c_void_p)
GarbageCollectFn = CFUNCTYPE(None, c_void_p, c_char_p, POINTER(Tensor), c_size_t, c_void_p, c_size_t)
AbortFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), c_void_p)
WriteFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), POINTER(Tensor), c_size_t,
                    c_void_p, c_size_t, c_void_p, c_size_t)
WriteStartFn = CFUNCTYPE(c_int32, c_void_p, POINTER(Transfer), POINTER(Tensor), c_size_t,
                         c_void_p, c_size_t, c_void_p, c_size_t, POINTER(c_void_p))


class TransportVTable(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("user_data", c_void_p),
        ("free_user_data", FreeUserDataFn),
        ("extract_metadata", ExtractMetadataFn),
        ("communicator_metadata", CommunicatorMetadataFn),
        ("send", SendFn),
        ("recv", RecvFn),
        ("fetch", FetchFn),
        ("wait", WaitFn),
        ("release_request", ReleaseRequestFn),
        ("garbage_collect", GarbageCollectFn),
        ("abort", AbortFn),
        ("write", WriteFn),
        ("write_start", WriteStartFn),
    ]


# Every function rdt.h declares (the static inline *_init helpers are done
# by init() above). Tensor arrays are passed as raw addresses (c_void_p):
# the binding packs them itself, which is much cheaper than ctypes structs.
# So are the out-parameters and options of the calls made once per put,
# get, pickle and unpickle: those calls pass addresses in a Scratch block
# (below) rather than new ctypes objects.
SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "rdt_version": (c_char_p, []),
    "rdt_abi_version": (c_uint32, []),
    "rdt_status_string": (c_char_p, [c_int32]),
    "rdt_last_error": (c_char_p, []),
    "rdt_runtime_create": (c_int32, [POINTER(RuntimeOptions), POINTER(c_void_p)]),
    "rdt_runtime_destroy": (c_int32, [c_void_p]),
    "rdt_runtime_address": (c_int32, [c_void_p, POINTER(c_char_p)]),
    "rdt_put": (c_int32, [c_void_p, c_void_p, c_size_t, c_char_p, ReleaseFn, c_void_p, c_void_p]),
    "rdt_ref_clone": (c_int32, [c_void_p, POINTER(c_void_p)]),
    "rdt_ref_release": (c_int32, [c_void_p]),
    "rdt_ref_release_ex": (c_int32, [c_void_p, c_uint32]),
    "rdt_ref_serialize": (c_int32, [c_void_p, c_void_p, c_void_p]),
    "rdt_bytes_free": (None, [c_void_p]),
    "rdt_ref_deserialize": (c_int32, [c_void_p, c_char_p, c_size_t, POINTER(c_void_p)]),
    "rdt_ref_deserialize_ex": (c_int32, [c_void_p, c_char_p, c_size_t, c_void_p, c_void_p]),
    "rdt_ref_info": (c_int32, [c_void_p, c_void_p]),
    "rdt_ref_tensor_info": (c_int32, [c_void_p, c_uint32, POINTER(TensorInfo)]),
    "rdt_get_start": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(GetOptions),
                                POINTER(c_void_p)]),
    "rdt_pending_wait": (c_int32, [c_void_p, c_int64]),
    "rdt_pending_abort": (c_int32, [c_void_p]),
    "rdt_pending_free": (c_int32, [c_void_p]),
    "rdt_pending_event_fd": (c_int32, [c_void_p, POINTER(c_int32)]),
    "rdt_get": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_int64]),
    "rdt_wait_tensor_freed": (c_int32, [c_void_p, c_void_p, c_int64]),
    "rdt_expose": (c_int32, [c_void_p, c_void_p, c_size_t, c_char_p, ReleaseFn, c_void_p, c_void_p]),
    # c_void_p, not POINTER(WriteOptions): the one-call path passes a
    # scratch block's addresses (byref() still does for the general path).
    "rdt_write_start": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_void_p]),
    "rdt_write": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(WriteOptions), c_int64]),
    "rdt_write_notice_wait": (c_int32, [c_void_p, c_int64, POINTER(WriteNotice)]),
    "rdt_write_notice_event_fd": (c_int32, [c_void_p, POINTER(c_int32)]),
    "rdt_ref_revoke_writes": (c_int32, [c_void_p, c_int64]),
    "rdt_prepare_get": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(GetOptions),
                                  POINTER(c_void_p)]),
    "rdt_prepare_write": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(WriteOptions),
                                    POINTER(c_void_p)]),
    "rdt_prepared_run": (c_int32, [c_void_p, c_uint64, c_int64]),
    "rdt_prepared_free": (c_int32, [c_void_p]),
    "rdt_view_open": (c_int32, [c_void_p, c_void_p, POINTER(ViewOptions), c_int64, POINTER(c_void_p)]),
    "rdt_view_data": (c_int32, [c_void_p, c_void_p, c_size_t, POINTER(c_int32)]),
    "rdt_view_sizes": (c_int32, [c_void_p, c_void_p, c_size_t]),
    "rdt_view_release": (c_int32, [c_void_p]),
    "rdt_buffer_set": (c_int32, [c_void_p, c_char_p, c_size_t]),
    "rdt_set_error": (None, [c_char_p]),
    "rdt_register_transport": (c_int32, [c_void_p, c_char_p, POINTER(c_int32), c_size_t,
                                         POINTER(TransportVTable)]),
    "rdt_transport_list": (c_int32, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "rdt_transport_list_unavailable": (c_int32, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "rdt_build_info": (c_char_p, []),
    "rdt_runtime_stats": (c_int32, [c_void_p, POINTER(Stats)]),
    "rdt_runtime_fetch_histograms": (c_int32, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "rdt_runtime_take_released": (c_int32, [c_void_p, POINTER(c_void_p), c_size_t, POINTER(c_size_t), c_int64]),
    "rdt_group_create": (c_int32, [c_void_p, c_char_p, c_int32, c_int32, c_char_p, c_int32,
                                   POINTER(GroupOptions), c_int64]),
    "rdt_group_destroy": (c_int32, [c_void_p, c_char_p]),
    "rdt_log_capture": (c_int32, [ctypes.c_int]),
    "rdt_log_take": (c_int32, [c_void_p, c_size_t, POINTER(c_size_t), c_int64]),
    "rdt_log_set_level": (c_int32, [c_int32]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_pid: Optional[int] = None
_forked = False  # set in a child forked after the library was loaded


def _after_fork_in_child() -> None:
    global _forked
    if _lib is not None:
        _forked = True


# A flag set at fork costs nothing per call, unlike comparing getpid().
os.register_at_fork(after_in_child=_after_fork_in_child)


def library_path() -> str:
    """``$RDT_LIBRARY`` if set, else the librdt.so bundled in this package."""
    env = os.environ.get("RDT_LIBRARY")
    if env:
        return env
    return str(Path(__file__).with_name("librdt.so"))


FORK_HINT = ("rdt's library runs a Go runtime, which does not survive fork(): this process was forked "
             "from process {parent} after rdt was loaded there. Start worker processes with "
             "multiprocessing's 'spawn' or 'forkserver' start method (for example "
             "multiprocessing.get_context('spawn')), or with fork+exec (subprocess).")


def lib() -> ctypes.CDLL:
    """The loaded library. The first call loads it. In a child forked after
    that, every call raises ForkedError (the Go runtime cannot run there)."""
    L = _lib
    if L is not None and not _forked:
        return L
    if _forked:  # (a fork made outside os.fork is caught by the library: RDT_ERR_FORKED)
        raise ForkedError(FORK_HINT.format(parent=_pid), ERR_FORKED)
    with _lock:
        if _lib is None:
            _load()
    return lib()


def _find_in_sys_path(env: str, patterns: "tuple[str, ...]") -> None:
    """Sets env to the first file of an installed wheel matching one of
    patterns (globs under a sys.path entry), unless env is set already. The
    library reads these variables once, when it first creates a runtime."""
    if os.environ.get(env):
        return
    for entry in sys.path:
        for pattern in patterns:
            try:
                found = sorted(Path(entry).glob(pattern))
            except OSError:
                continue
            if found:
                os.environ[env] = str(found[-1])
                return


def _find_libraries() -> None:
    # NIXL's C API library from a nixl wheel (nixl-cu12 or nixl-cu13).
    _find_in_sys_path("RDT_NIXL_LIBRARY", (".nixl_cu*.mesonpy.libs/libnixl_capi.so",))
    # NCCL from the wheel torch depends on (nvidia-nccl-cu12 or -cu13), so
    # the nccl transport loads the same NCCL as torch.
    _find_in_sys_path("RDT_NCCL_LIBRARY", ("nvidia/nccl/lib/libnccl.so.2", "nvidia/cu*/lib/libnccl.so.2"))


def _load() -> None:
    global _lib, _pid
    _find_libraries()
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(
            f"rdt: librdt.so not found at {path}. Install the package with pip (which builds the library "
            "with Go), or set RDT_LIBRARY to a built librdt.so (make in the repository builds build/librdt.so).")
    try:
        handle = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"rdt: cannot load {path}: {e}") from e
    for name, (res, args) in SIGNATURES.items():
        try:
            fn = getattr(handle, name)
        except AttributeError:
            raise ImportError(f"rdt: {path} does not export {name}; it is not a matching librdt.so") from None
        fn.restype = res
        fn.argtypes = args
    abi = handle.rdt_abi_version()
    if abi != ABI_VERSION:
        raise ImportError(f"rdt: {path} implements rdt ABI {abi}; this package speaks ABI {ABI_VERSION}")
    _pid = os.getpid()
    _lib = handle


def loaded() -> bool:
    """Whether the library was loaded in this process (not in a parent)."""
    return _lib is not None and not _forked


def last_error() -> str:
    return (lib().rdt_last_error() or b"").decode("utf-8", "replace")


def make_error(status: int) -> RdtError:
    """The exception for a failed call, with this thread's last message."""
    if status == ERR_FORKED:
        return ForkedError(FORK_HINT.format(parent=_pid), status)
    msg = last_error() or (lib().rdt_status_string(status) or b"").decode()
    return error_for(status, msg)


def check(status: int) -> None:
    """Raises the exception for a failed call."""
    if status != OK:
        raise make_error(status)


def decode(b: Optional[bytes]) -> str:
    return (b or b"").decode("utf-8", "replace")


def timeout_seconds(timeout: Any, what: str = "timeout") -> Optional[float]:
    """A timeout argument in seconds, as every call that takes one reads
    it: None or float("inf") is no limit (None is returned), a number >= 0
    is that many seconds (0 is no time at all: see _fetch.zero_timeout). A
    negative number or nan is an InvalidArgumentError naming it; a bool, a
    str or anything else that is not a real number is one too, and also a
    TypeError."""
    if timeout is None:
        return None
    kind = type(timeout)
    # float and int first: the ABC check costs more than a small get's wait.
    if kind is not float and kind is not int and (kind is bool or not isinstance(timeout, numbers.Real)):
        raise InvalidArgumentTypeError(f"{what} must be None or a number of seconds, not {timeout!r} "
                                       f"(a {type(timeout).__name__})")
    if timeout != timeout or timeout < 0:  # nan, or negative
        raise InvalidArgumentError(f"{what} must be None or a number of seconds >= 0, not {timeout!r}")
    try:
        t = float(timeout)
    except OverflowError:  # an int beyond any float: beyond any clock too
        return None
    return None if t == math.inf else t
