"""Tensors in and out.

numpy arrays, torch tensors (CPU or CUDA), and anything with ``__dlpack__``,
``__array_interface__`` or ``__cuda_array_interface__`` (CuPy, numba) are seen as rdt_tensor descriptions of their memory
(never copied); tensors of the producer's framework are allocated to receive
into; and rdt_tensor arrays handed to callbacks are seen as numpy arrays (or
torch tensors) over the same memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import operator
import struct
import sys
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _cuda, _lib
from ._errors import InvalidArgumentError, UnsupportedError
from ._receive import HUGE_PAGE_MIN, ReceiveCache

# DLPack dtype codes (rdt.h's RDT_DTYPE_*).
INT, UINT, FLOAT, BFLOAT, COMPLEX, BOOL = 0, 1, 2, 4, 5, 6
FLOAT8_E4M3FN, FLOAT8_E5M2 = 10, 12

# numpy dtype <-> DLPack (code, bits); lanes are always 1.
_NP_TO_DL: Dict[np.dtype, Tuple[int, int]] = {
    np.dtype(np.bool_): (BOOL, 8),
    np.dtype(np.int8): (INT, 8), np.dtype(np.int16): (INT, 16),
    np.dtype(np.int32): (INT, 32), np.dtype(np.int64): (INT, 64),
    np.dtype(np.uint8): (UINT, 8), np.dtype(np.uint16): (UINT, 16),
    np.dtype(np.uint32): (UINT, 32), np.dtype(np.uint64): (UINT, 64),
    np.dtype(np.float16): (FLOAT, 16), np.dtype(np.float32): (FLOAT, 32),
    np.dtype(np.float64): (FLOAT, 64),
    np.dtype(np.complex64): (COMPLEX, 64), np.dtype(np.complex128): (COMPLEX, 128),
}
_DL_TO_NP: Dict[Tuple[int, int], np.dtype] = {v: k for k, v in _NP_TO_DL.items()}

# torch dtype names <-> DLPack (code, bits).
_TORCH_DL: Dict[str, Tuple[int, int]] = {
    "bool": (BOOL, 8), "int8": (INT, 8), "int16": (INT, 16), "int32": (INT, 32), "int64": (INT, 64),
    "uint8": (UINT, 8), "uint16": (UINT, 16), "uint32": (UINT, 32), "uint64": (UINT, 64),
    "float16": (FLOAT, 16), "float32": (FLOAT, 32), "float64": (FLOAT, 64), "bfloat16": (BFLOAT, 16),
    "complex64": (COMPLEX, 64), "complex128": (COMPLEX, 128),
    "float8_e4m3fn": (FLOAT8_E4M3FN, 8), "float8_e5m2": (FLOAT8_E5M2, 8),
}
_DL_TO_TORCH = {v: k for k, v in _TORCH_DL.items()}

DEVICE_NAMES = {"cpu": _lib.DEVICE_CPU, "cuda": _lib.DEVICE_CUDA, "cuda_host": _lib.DEVICE_CUDA_HOST,
                "rocm": _lib.DEVICE_ROCM, "cuda_managed": _lib.DEVICE_CUDA_MANAGED}
_HOST_DEVICES = (_lib.DEVICE_CPU, _lib.DEVICE_CUDA_HOST, _lib.DEVICE_CUDA_MANAGED)
# For the fast paths of other modules: the dtype table and the host devices.
NP_TO_DL = _NP_TO_DL
HOST_DEVICES = _HOST_DEVICES
# Device types a receive may cross between (rdt lands one in another).
_LANDS = _HOST_DEVICES + (_lib.DEVICE_CUDA,)


def device_code(name: str) -> int:
    """The DLPack device type of a device name such as "cpu" or "cuda:1"."""
    try:
        return DEVICE_NAMES[str(name).lower().split(":")[0]]
    except KeyError:
        raise InvalidArgumentError(f"unknown device type {name!r} (known: {', '.join(DEVICE_NAMES)})") from None


class Desc(NamedTuple):
    """Shape, dtype and device of a tensor as rdt sees it."""

    shape: Tuple[int, ...]
    code: int
    bits: int
    lanes: int
    device_type: int
    device_id: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ((self.bits * self.lanes + 7) // 8)

    @property
    def numpy_dtype(self) -> Optional[np.dtype]:
        if self.lanes != 1:
            return None
        dt = _DL_TO_NP.get((self.code, self.bits))
        if dt is None:
            dt = _extra_numpy_dtype(self.code, self.bits)
        return dt

    def dtype_name(self) -> str:
        dt = self.numpy_dtype
        if dt is not None:
            return str(dt)
        t = _DL_TO_TORCH.get((self.code, self.bits))
        base = t or f"dlpack(code={self.code}, bits={self.bits})"
        return base if self.lanes == 1 else f"{base}x{self.lanes}"


def _extra_numpy_dtype(code: int, bits: int) -> Optional[np.dtype]:
    """bfloat16 and float8 as numpy dtypes, when ml_dtypes is installed."""
    if (code, bits) not in ((BFLOAT, 16), (FLOAT8_E4M3FN, 8), (FLOAT8_E5M2, 8)):
        return None
    try:
        import ml_dtypes  # type: ignore[import-not-found]
    except ImportError:
        return None
    name = {BFLOAT: "bfloat16", FLOAT8_E4M3FN: "float8_e4m3fn", FLOAT8_E5M2: "float8_e5m2"}[code]
    return np.dtype(getattr(ml_dtypes, name))


class Item(NamedTuple):
    """One tensor found in a value: its data address, description, what keeps
    its memory alive, and the framework it came from."""

    data: int
    desc: Desc
    keep: Any
    framework: str


def _torch() -> Any:
    return sys.modules.get("torch")


_SCALARS = (str, bytes, bytearray, memoryview, int, float, complex, bool, type(None), np.generic)


def is_tensor(obj: Any) -> bool:
    """Whether put() treats obj as a tensor rather than as structure."""
    if type(obj) is np.ndarray:
        return True
    if isinstance(obj, _SCALARS):
        return False  # numpy scalars have __array_interface__ but are plain values
    if isinstance(obj, np.ndarray):
        return True
    t = _torch()
    if t is not None and isinstance(obj, t.Tensor):
        return True
    if isinstance(obj, type):
        return False
    return (hasattr(obj, "__dlpack__") or hasattr(obj, "__array_interface__")
            or hasattr(obj, "__cuda_array_interface__"))


_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof
_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level constructor


def _name(what: Any) -> str:
    """The name of a tensor in messages: "tensor", "tensor 2", "out[0]"."""
    if isinstance(what, int):
        return f"tensor {what}"
    if isinstance(what, tuple):
        return f"out[{what[0]}]"
    return str(what)


def _numpy_item(a: np.ndarray, keep: Any, framework: str, writable: bool, what: Any) -> Item:
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{_name(what)}: array of shape {a.shape} with strides {a.strides} is not C-contiguous; rdt moves "
            "contiguous tensors only (pass np.ascontiguousarray(x))")
    dl = _NP_TO_DL.get(a.dtype)
    if dl is None:
        if a.dtype.isnative is False:
            raise UnsupportedError(f"{_name(what)}: dtype {a.dtype.str} is not in native byte order; convert it with "
                                   "x.astype(x.dtype.newbyteorder('='))")
        extra = {"bfloat16": (BFLOAT, 16), "float8_e4m3fn": (FLOAT8_E4M3FN, 8),
                 "float8_e5m2": (FLOAT8_E5M2, 8)}.get(a.dtype.name)
        if extra is None:
            raise UnsupportedError(f"{_name(what)}: dtype {a.dtype} has no DLPack equivalent that rdt can move "
                                   "(bool, int8..int64, uint8..uint64, float16/32/64, complex64/128 are)")
        dl = extra
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{_name(what)}: array is read-only")
    try:
        data = _addressof(_from_buffer(a))  # type: ignore[arg-type]  # fast; writable, non-empty only
    except (TypeError, ValueError, BufferError):
        data = a.__array_interface__["data"][0] if a.size else 0
    # tuple.__new__: a NamedTuple's own constructor is a Python call.
    return _new_tuple(Item, (data, _new_tuple(Desc, (a.shape, dl[0], dl[1], 1, _lib.DEVICE_CPU, 0)), keep,
                             framework))


def _torch_item(x: Any, writable: bool, what: Any) -> Item:
    if not x.is_contiguous():
        raise InvalidArgumentError(f"{_name(what)}: torch tensor of shape {tuple(x.shape)} is not contiguous; rdt "
                                   "moves contiguous tensors only (pass x.contiguous())")
    name = str(x.dtype).replace("torch.", "")
    dl = _TORCH_DL.get(name)
    if dl is None:
        raise UnsupportedError(f"{_name(what)}: torch dtype {x.dtype} has no DLPack equivalent that rdt can move")
    dev = x.device
    if dev.type not in DEVICE_NAMES:
        raise UnsupportedError(f"{_name(what)}: torch device {dev} is not one rdt moves (cpu, cuda)")
    desc = Desc(tuple(x.shape), dl[0], dl[1], 1, DEVICE_NAMES[dev.type], dev.index or 0)
    if dev.type == "cuda":
        # rdt copies on its own streams: work queued on the tensor's stream
        # (the kernel that wrote it, or one still reading an out= buffer)
        # must be done first.
        _torch().cuda.current_stream(dev).synchronize()
    return Item(x.data_ptr() if x.numel() else 0, desc, x, "torch")


def _module(obj: Any) -> str:
    return (type(obj).__module__ or "").split(".")[0]


def _cupy_sync(obj: Any) -> None:
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with cupy.cuda.Device(obj.device.id):
            cupy.cuda.get_current_stream().synchronize()


def _cuda_device_of(obj: Any, what: Any) -> int:
    """The ordinal of the GPU holding a __cuda_array_interface__ object
    (the interface itself does not say)."""
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None:
        return int(dlpack_device()[1])
    dev = getattr(obj, "device", None)
    if dev is not None and hasattr(dev, "id"):
        return int(dev.id)
    if _module(obj) == "numba":
        from numba import cuda  # type: ignore[import-not-found]
        return int(cuda.get_current_device().id)
    raise UnsupportedError(f"{_name(what)}: cannot tell which GPU holds this {type(obj).__name__} (it has "
                           "__cuda_array_interface__ but neither __dlpack_device__ nor .device.id)")


def _cuda_array_item(obj: Any, writable: bool, what: Any) -> Item:
    """Reads __cuda_array_interface__ (CuPy, numba): a device pointer."""
    cai = obj.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    dt = np.dtype(cai["typestr"])
    dl = _NP_TO_DL.get(dt)
    if dl is None:
        raise UnsupportedError(f"{_name(what)}: dtype {dt} has no DLPack equivalent that rdt can move")
    strides = cai.get("strides")
    if strides is not None and 0 not in shape:
        expect = dt.itemsize
        for i in reversed(range(len(shape))):
            if shape[i] != 1 and strides[i] != expect:
                raise InvalidArgumentError(f"{_name(what)}: {type(obj).__name__} of shape {shape} is not "
                                           "contiguous; rdt moves contiguous tensors only")
            expect *= shape[i]
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise InvalidArgumentError(f"{_name(what)}: {type(obj).__name__} is read-only")
    desc = Desc(shape, dl[0], dl[1], 1, _lib.DEVICE_CUDA, _cuda_device_of(obj, what))
    framework = "cupy" if _module(obj) == "cupy" else "cuda"
    if framework == "cupy":
        _cupy_sync(obj)
    return Item(int(ptr or 0) if desc.nbytes else 0, desc, obj, framework)


class _DLTensor(ctypes.Structure):
    _fields_ = _lib.Tensor._fields_


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DLPACK_READ_ONLY = 1 << 0
_DLPACK_IS_COPIED = 1 << 1


# DLPack device types whose producers order their work by CUDA streams.
_DLPACK_STREAM_DEVICES = (_lib.DEVICE_CUDA, _lib.DEVICE_CUDA_MANAGED)
# The stream rdt names to a CUDA producer's __dlpack__: 1 is CUDA's legacy
# default stream in the DLPack protocol (None means the same, but some
# producers, torch among them, take None as "no synchronization").
DLPACK_CONSUMER_STREAM = 1


def _dlpack_capsule(obj: Any) -> Any:
    """obj.__dlpack__(), asking for a versioned capsule and, from a producer
    on a CUDA device, for its work to be ordered before CUDA's legacy
    default stream (see wait_legacy_stream)."""
    kw: Dict[str, Any] = {}
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None and int(dlpack_device()[0]) in _DLPACK_STREAM_DEVICES:
        kw["stream"] = DLPACK_CONSUMER_STREAM
    try:
        return obj.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:  # a producer that predates versioned capsules
        if not kw:
            return obj.__dlpack__()
    try:
        return obj.__dlpack__(**kw)
    except TypeError:  # nor streams: by the protocol it orders its work before the legacy default stream
        return obj.__dlpack__()


def _dlpack_item(obj: Any, writable: bool, what: Any) -> Item:
    """Reads a DLPack capsule without consuming it: the capsule, kept alive
    with the object, still owns the DLPack tensor and frees it when dropped.
    For CUDA memory, waits until the work the producer ordered before the
    legacy default stream is done: rdt copies on streams of its own."""
    cap = _dlpack_capsule(obj)
    flags = 0
    if _capsule_valid(cap, b"dltensor_versioned"):
        # DLManagedTensorVersioned: version (2 x u32), manager_ctx, deleter, flags (u64), then the DLTensor.
        base = _capsule_pointer(cap, b"dltensor_versioned")
        flags = ctypes.c_uint64.from_address(base + 24).value
        dl = _DLTensor.from_address(base + 32)
    elif _capsule_valid(cap, b"dltensor"):
        dl = _DLTensor.from_address(_capsule_pointer(cap, b"dltensor"))  # DLManagedTensor starts with it
    else:
        raise UnsupportedError(f"{_name(what)}: {type(obj).__name__}.__dlpack__() returned no unused DLPack capsule")
    if writable and flags & (_DLPACK_READ_ONLY | _DLPACK_IS_COPIED):
        raise InvalidArgumentError(f"{_name(what)}: {type(obj).__name__} exports a read-only or copied DLPack tensor; "
                                   "rdt cannot receive into it")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    if dl.strides and 0 not in shape:
        expect = 1
        for i in reversed(range(dl.ndim)):
            if shape[i] != 1 and dl.strides[i] != expect:
                raise InvalidArgumentError(f"{_name(what)}: {type(obj).__name__} of shape {shape} is not contiguous; "
                                           "rdt moves contiguous tensors only")
            expect *= shape[i]
    if dl.device.device_type <= 0:
        raise UnsupportedError(f"{_name(what)}: DLPack device type {dl.device.device_type} is not valid")
    desc = Desc(shape, dl.dtype.code, dl.dtype.bits, dl.dtype.lanes, dl.device.device_type, dl.device.device_id)
    data = (dl.data or 0) + dl.byte_offset if desc.nbytes else 0
    if desc.device_type in _DLPACK_STREAM_DEVICES and desc.nbytes:
        wait_legacy_stream(desc.device_id)
    return Item(data, desc, (obj, cap), "dlpack")


def wait_legacy_stream(device_id: int) -> None:
    """Waits for CUDA's legacy default stream of GPU ``device_id`` (see
    _cuda.Driver.wait_legacy_stream)."""
    _cuda.DRIVER.wait_legacy_stream(device_id)


# Describing this many tensors at once pauses the cycle collector: the
# hundreds of thousands of small tuples made would trigger full collections
# over every object alive, doubling the cost, and none of them is cyclic.
_PAUSE_GC_FROM = 1024


@contextlib.contextmanager
def _collector_paused(n: int) -> Iterator[None]:
    if n < _PAUSE_GC_FROM or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def items_of(objs: Sequence[Any], writable: bool = False, first: int = 0,
             what: Callable[[int], Any] = lambda i: i) -> List[Item]:
    """item_of over many tensors: numpy arrays in a lean loop (the per-tensor
    cost decides how fast an object of 100,000 tensors is put and fetched),
    anything else through item_of. ``what(i)`` names tensor i in messages;
    ``first`` is the index of objs[0]."""
    with _collector_paused(len(objs)):
        return _numpy_items(objs, writable, first, what)


def _numpy_items(objs: Sequence[Any], writable: bool, first: int, what: Callable[[int], Any]) -> List[Item]:
    out: List[Item] = []
    append = out.append
    ndarray, cpu = np.ndarray, _lib.DEVICE_CPU
    last_dt: Any = None
    code = bits = 0
    for i, a in enumerate(objs, first):
        if type(a) is ndarray and a.flags.c_contiguous:
            dt = a.dtype
            if dt is not last_dt:
                dl = _NP_TO_DL.get(dt)
                if dl is None:
                    append(item_of(a, writable, what(i)))
                    continue
                last_dt, (code, bits) = dt, dl
            try:
                data = _addressof(_from_buffer(a))  # type: ignore[arg-type]  # writable, non-empty only
            except (TypeError, ValueError, BufferError):
                append(item_of(a, writable, what(i)))  # read-only or empty: the full checks
                continue
            append(_new_tuple(Item, (data, _new_tuple(Desc, (a.shape, code, bits, 1, cpu, 0)), a, "numpy")))
        else:
            append(item_of(a, writable, what(i)))
    return out


def is_torch_list(objs: Sequence[Any]) -> bool:
    """Whether objs are all torch tensors (torch already imported)."""
    t = _torch()
    if t is None:
        return False
    tensor_type = t.Tensor
    return all(type(x) is tensor_type for x in objs)


def torch_items_of(objs: Sequence[Any], first: int = 0) -> List[Item]:
    """items_of for a list of torch tensors in host memory: data_ptr() is
    cheap where numpy's address is not. Anything else goes through item_of."""
    with _collector_paused(len(objs)):
        return _torch_items(objs, first)


def _torch_items(objs: Sequence[Any], first: int) -> List[Item]:
    t = _torch()
    out: List[Item] = []
    append = out.append
    tensor_type, cpu = t.Tensor, _lib.DEVICE_CPU
    last_dt: Any = None
    code = bits = 0
    for i, x in enumerate(objs, first):
        if type(x) is tensor_type and x.device.type == "cpu" and x.is_contiguous():
            dt = x.dtype
            if dt is not last_dt:
                dl = _TORCH_DL.get(str(dt)[6:])  # "torch.float32"
                if dl is None:
                    append(item_of(x, False, i))
                    continue
                last_dt, (code, bits) = dt, dl
            append(_new_tuple(Item, (x.data_ptr() if x.numel() else 0,
                                     _new_tuple(Desc, (tuple(x.shape), code, bits, 1, cpu, 0)), x, "torch")))
        else:
            append(item_of(x, False, i))
    return out


def item_of(obj: Any, writable: bool = False, what: Any = "tensor") -> Item:
    """Describes a tensor-like object's memory. Raises for what rdt cannot
    move without a copy (non-contiguous) or at all (unknown types, dtypes)."""
    if type(obj) is np.ndarray:
        return _numpy_item(obj, obj, "numpy", writable, what)
    t = _torch()
    if t is not None and isinstance(obj, t.Tensor):
        return _torch_item(obj, writable, what)
    if isinstance(obj, np.ndarray):
        return _numpy_item(obj, obj, "numpy", writable, what)
    if isinstance(obj, _SCALARS) or isinstance(obj, type):
        raise UnsupportedError(f"{_name(what)}: a {type(obj).__name__} is not a tensor (want a numpy array, a torch "
                               "tensor, or an object with __dlpack__ or __array_interface__)")
    if hasattr(obj, "__cuda_array_interface__"):
        return _cuda_array_item(obj, writable, what)
    if hasattr(obj, "__dlpack__"):
        it = _dlpack_item(obj, writable, what)
        if it.desc.device_type == _lib.DEVICE_CUDA and _module(obj) == "cupy":
            _cupy_sync(obj)
            it = Item(it.data, it.desc, it.keep, "cupy")
        return it
    if hasattr(obj, "__array_interface__"):
        try:
            a = np.asarray(obj)
        except Exception as e:
            raise UnsupportedError(f"{_name(what)}: {type(obj).__name__}.__array_interface__ is unusable: {e}") from e
        return _numpy_item(a, (obj, a), "numpy", writable, what)
    raise UnsupportedError(f"{_name(what)}: cannot use a {type(obj).__name__} as a tensor (want a numpy array, a "
                           "torch tensor, or an object with __dlpack__ or __array_interface__)")


# ---- rdt_tensor arrays ------------------------------------------------------

TENSOR_SIZE = ctypes.sizeof(_lib.Tensor)
_TENSOR = struct.Struct("=QiiiBBHQQQ")  # data, device, ndim, dtype, shape, strides, byte_offset
assert _TENSOR.size == TENSOR_SIZE == 48
_pack_into = _TENSOR.pack_into


_ONE: Dict[int, struct.Struct] = {}


def pack_one(data: int, d: Desc) -> Tuple[Any, int]:
    """One rdt_tensor (with its shape after it) in a buffer, and its address."""
    nd = len(d.shape)
    st = _ONE.get(nd)
    if st is None:
        st = _ONE.setdefault(nd, struct.Struct(f"=QiiiBBHQQQ{nd}q"))
    buf = ctypes.create_string_buffer(st.size)
    base = _addressof(buf)
    st.pack_into(buf, 0, data, d.device_type, d.device_id, nd, d.code, d.bits, d.lanes,
                 base + TENSOR_SIZE if nd else 0, 0, 0, *d.shape)
    return buf, base


def pack_one_at(s: Any, offset: int, data: int, d: Desc) -> bool:
    """pack_one into a scratch block (_lib.Scratch) at offset; False when
    the tensor has too many dimensions to fit there."""
    shape, code, bits, lanes, device_type, device_id = d  # one unpacking: this runs on every put
    nd = len(shape)
    st = _ONE.get(nd)
    if st is None:
        st = _ONE.setdefault(nd, struct.Struct(f"=QiiiBBHQQQ{nd}q"))
    if offset + st.size > s.SIZE:
        return False
    st.pack_into(s.buf, offset, data, device_type, device_id, nd, code, bits, lanes,
                 s.base + offset + TENSOR_SIZE if nd else 0, 0, 0, *shape)
    return True


def matching_out(a: np.ndarray, d: Desc) -> int:
    """The data address of an out= numpy array that exactly matches d (same
    shape and dtype, host memory, C-contiguous, writable, not empty), or 0
    when it needs check_out's full checks and messages."""
    if a.shape == d.shape and d.lanes == 1 and d.device_type in _HOST_DEVICES and \
            _NP_TO_DL.get(a.dtype) == (d.code, d.bits):
        try:
            return _addressof(_from_buffer(a))  # type: ignore[arg-type]  # contiguous, writable, non-empty
        except (TypeError, ValueError, BufferError):
            return 0
    return 0


# rdt_tensor as a numpy record, for packing many tensors a column at a time.
_TENSOR_RECORD = np.dtype([("data", np.uint64), ("device_type", np.int32), ("device_id", np.int32),
                           ("ndim", np.int32), ("code", np.uint8), ("bits", np.uint8), ("lanes", np.uint16),
                           ("shape", np.uint64), ("strides", np.uint64), ("byte_offset", np.uint64)])
assert _TENSOR_RECORD.itemsize == TENSOR_SIZE

# Past this many tensors, pack fills columns rather than one struct at a time.
_COLUMNS_FROM = 64


def _pack_columns(items: Sequence[Item]) -> Optional[Tuple[Any, int]]:
    """pack for many tensors of one dtype, device and number of dimensions
    (the shape of a model's layers, or of views of one buffer); None for
    any other mix."""
    d0 = items[0].desc
    nd = len(d0.shape)
    key = (d0.code, d0.bits, d0.lanes, d0.device_type, d0.device_id)
    descs = [it.desc for it in items]
    for d in descs:
        if len(d.shape) != nd or (d.code, d.bits, d.lanes, d.device_type, d.device_id) != key:
            return None
    n = len(items)
    block = np.zeros(TENSOR_SIZE * n + 8 * nd * n or 1, dtype=np.uint8)
    base = block.ctypes.data
    rec = block[:TENSOR_SIZE * n].view(_TENSOR_RECORD)
    rec["data"] = [it.data for it in items]
    rec["device_type"], rec["device_id"], rec["ndim"] = d0.device_type, d0.device_id, nd
    rec["code"], rec["bits"], rec["lanes"] = d0.code, d0.bits, d0.lanes
    if nd:
        shapes = block[TENSOR_SIZE * n:].view(np.int64).reshape(n, nd)
        first = d0.shape
        if all(d.shape == first for d in descs):  # views of one shape
            shapes[:] = first
        else:
            shapes[:] = [d.shape for d in descs]
        rec["shape"] = base + TENSOR_SIZE * n + np.arange(n, dtype=np.uint64) * (8 * nd)
    return block, base


_desc_shape = operator.itemgetter(0)
_desc_kind = operator.itemgetter(1, 2, 3, 4, 5)
_shape_attr = operator.attrgetter("shape")
_dtype_attr = operator.attrgetter("dtype")


def pack_out(outs: List[Any], descs: List[Desc]) -> Optional[Tuple[Any, int, List[int]]]:
    """check_out and pack at once for the common case of many targets: numpy
    arrays, C-contiguous, writable, not empty, each of its source tensor's
    shape, all of one dtype, from host tensors of one dtype. Each step runs
    over all of them at C speed (map), with no description made per
    tensor. The packed array, its address, and the targets' addresses; None
    for anything else (check_out then says what is wrong)."""
    n = len(outs)
    if n < 2 or n != len(descs):
        return None
    # Descriptions all alike (views of one buffer, a model's equal layers):
    # one comparison each at C speed, often only an identity check.
    first = descs[0]
    same = descs.count(first) == n
    if same:
        code, bits, lanes, device_type, _ = _desc_kind(first)
    else:
        kinds = set(map(_desc_kind, descs))
        if len(kinds) != 1:
            return None
        code, bits, lanes, device_type, _ = kinds.pop()
    if lanes != 1 or device_type not in _HOST_DEVICES:
        return None
    if set(map(type, outs)) != {np.ndarray}:
        return None
    dtypes = set(map(_dtype_attr, outs))
    if len(dtypes) != 1 or _NP_TO_DL.get(dtypes.pop()) != (code, bits):
        return None
    shapes = list(map(_shape_attr, outs))
    if same:
        if shapes.count(first.shape) != n:
            return None
    elif shapes != list(map(_desc_shape, descs)):
        return None
    try:
        datas = list(map(_addressof, map(_from_buffer, outs)))  # contiguous, writable, not empty
    except (TypeError, ValueError, BufferError):
        return None
    nd = len(shapes[0])
    if not same and any(len(sh) != nd for sh in set(shapes)):
        return None
    block = np.zeros(TENSOR_SIZE * n + 8 * nd * n, dtype=np.uint8)
    base = block.ctypes.data
    rec = block[:TENSOR_SIZE * n].view(_TENSOR_RECORD)
    rec["data"] = datas
    rec["device_type"], rec["device_id"], rec["ndim"] = _lib.DEVICE_CPU, 0, nd
    rec["code"], rec["bits"], rec["lanes"] = code, bits, 1
    if nd:
        block[TENSOR_SIZE * n:].view(np.int64).reshape(n, nd)[:] = first.shape if same else shapes
        rec["shape"] = base + TENSOR_SIZE * n + np.arange(n, dtype=np.uint64) * (8 * nd)
    return block, base, datas


def pack(items: Sequence[Item]) -> Tuple[Any, int]:
    """An rdt_tensor array (with the shapes after it) in one buffer, and its
    address. Keep the buffer alive while the address is in use."""
    n = len(items)
    if n == 1:  # the common case, in one pack_into
        it = items[0]
        return pack_one(it.data, it.desc)
    if n >= _COLUMNS_FROM:
        packed = _pack_columns(items)
        if packed is not None:
            return packed
    ndims = 0
    for it in items:
        ndims += len(it.desc.shape)
    buf = ctypes.create_string_buffer(TENSOR_SIZE * n + 8 * ndims or 1)
    base = _addressof(buf)
    shape_off = TENSOR_SIZE * n
    for i, it in enumerate(items):
        d = it.desc
        nd = len(d.shape)
        _pack_into(buf, TENSOR_SIZE * i, it.data, d.device_type, d.device_id, nd, d.code, d.bits, d.lanes,
                   base + shape_off if nd else 0, 0, 0)
        if nd:
            struct.pack_into(f"={nd}q", buf, shape_off, *d.shape)
            shape_off += 8 * nd
    return buf, base


def desc_of_c(t: _lib.Tensor) -> Desc:
    shape = tuple(t.shape[i] for i in range(t.ndim)) if t.ndim else ()
    return Desc(shape, t.dtype.code, t.dtype.bits, t.dtype.lanes, t.device.device_type, t.device.device_id)


def desc_of_info(ti: _lib.TensorInfo) -> Desc:
    return Desc(tuple(ti.shape[:ti.ndim]), ti.dtype.code, ti.dtype.bits, ti.dtype.lanes, ti.device.device_type,
                ti.device.device_id)


# ---- receiving -------------------------------------------------------------

def _import_torch() -> Any:
    t = _torch()
    if t is None:
        try:
            import torch
        except ImportError:
            return None
        t = torch
    return t


def allocate(desc: Desc, framework: str, cache: Optional[ReceiveCache] = None) -> Any:
    """A new tensor to receive into: of the producer's framework when it can
    be imported here (torch stays torch), else numpy. Host tensors of 4 MiB
    and more come from ``cache`` when given (see _receive)."""
    large = cache is not None and desc.nbytes >= HUGE_PAGE_MIN
    if framework == "torch" and desc.lanes == 1:
        t = _import_torch()
        name = _DL_TO_TORCH.get((desc.code, desc.bits))
        if t is not None and name is not None and hasattr(t, name):
            device = "cpu" if desc.device_type in _HOST_DEVICES else None
            if desc.device_type == _lib.DEVICE_CUDA and _torch_has_cuda(t, desc.device_id):
                device = f"cuda:{desc.device_id}"
            if device == "cpu" and large:
                assert cache is not None
                return cache.torch_tensor(t, desc.shape, getattr(t, name))
            if device is not None:
                return t.empty(desc.shape, dtype=getattr(t, name), device=device)
    if desc.device_type == _lib.DEVICE_CUDA:
        got = _allocate_cuda(desc, framework)
        if got is not None:
            return got
    if desc.device_type not in _HOST_DEVICES:
        raise UnsupportedError(f"receiving a tensor of device type {desc.device_type} needs torch or CuPy (with "
                               "that device) or an out= buffer on that device")
    dt = desc.numpy_dtype
    if dt is None:
        raise UnsupportedError(f"no numpy dtype for {desc.dtype_name()} here: install torch (or ml_dtypes), "
                               "or pass out=")
    if large:
        assert cache is not None
        return cache.numpy_array(desc.shape, dt)
    return np.empty(desc.shape, dtype=dt)


def _torch_has_cuda(t: Any, device_id: int) -> bool:
    """Whether torch can allocate on cuda:<device_id> here: a CPU-only
    torch, or the CUDA build on a machine whose driver it cannot use (rdt
    may use another, see RDT_CUDA_LIBRARY), cannot."""
    try:
        return bool(t.cuda.is_available()) and device_id < t.cuda.device_count()
    except Exception:
        return False


def _cuda_order(framework: str) -> List[str]:
    """The frameworks that may make a CUDA tensor received from a producer
    of this framework, in the order tried."""
    return ["cupy", "torch"] if framework == "cupy" else ["torch", "cupy"]


def current_cuda_device(framework: str) -> int:
    """The ordinal of this process's current CUDA device as seen by the
    framework that makes a new CUDA tensor for a producer of ``framework``
    (the order of _allocate_cuda): ``torch.cuda.current_device()``, CuPy's
    current device; 0 when neither can tell."""
    for fw in _cuda_order(framework):
        if fw == "torch":
            t = _import_torch()
            if t is not None and _torch_has_cuda(t, 0):
                return int(t.cuda.current_device())
        else:
            try:
                import cupy  # type: ignore[import-not-found]
                return int(cupy.cuda.runtime.getDevice())
            except Exception:  # not installed, or no device it can use
                continue
    return 0


def _allocate_cuda(desc: Desc, framework: str) -> Any:
    """A CUDA tensor to receive into: CuPy for CuPy producers when CuPy is
    importable, else torch, else CuPy; None when neither is."""
    order = _cuda_order(framework)
    for fw in order:
        if fw == "torch":
            t = _import_torch()
            name = _DL_TO_TORCH.get((desc.code, desc.bits))
            if t is not None and name is not None and hasattr(t, name) and desc.lanes == 1 and \
                    _torch_has_cuda(t, desc.device_id):
                return t.empty(desc.shape, dtype=getattr(t, name), device=f"cuda:{desc.device_id}")
        else:
            try:
                import cupy  # type: ignore[import-not-found]
            except ImportError:
                continue
            dt = desc.numpy_dtype
            if dt is not None:
                with cupy.cuda.Device(desc.device_id):
                    return cupy.empty(desc.shape, dtype=dt)
    return None


def check_out(outs: List[Any], descs: List[Desc], first: int = 0) -> List[Item]:
    """Describes the out= buffers, checking each against its source tensor.
    ``first``: the index in out= of outs[0], for the messages."""
    if len(outs) != len(descs):
        raise InvalidArgumentError(f"out= holds {len(outs)} tensors, the refs hold {len(descs)}")
    items = items_of(outs, True, first, lambda i: (i,))
    for i, (it, d) in enumerate(zip(items, descs), first):
        od = it.desc
        if od.shape != d.shape and tuple(od.shape) != tuple(d.shape):
            raise InvalidArgumentError(f"out[{i}] has shape {tuple(od.shape)}, the source tensor has shape "
                                       f"{tuple(d.shape)}")
        if od.code != d.code or od.bits != d.bits or od.lanes != d.lanes:
            raise InvalidArgumentError(f"out[{i}] has dtype {od.dtype_name()}, the source tensor has dtype "
                                       f"{d.dtype_name()}")
        if od.device_type != d.device_type and not (od.device_type in _LANDS and d.device_type in _LANDS):
            raise InvalidArgumentError(f"out[{i}] is on device type {od.device_type}, the source tensor on "
                                       f"{d.device_type} (a receive across device types goes between host and "
                                       "CUDA memory only)")
    return items


# ---- ranges of partial gets and writes --------------------------------------

# rdt_range as a numpy record: a partial get's sources (or a partial write's
# destinations) are built as one array (a column per field) and passed by
# address, not struct by struct.
RANGE = np.dtype([("ref", np.uint32), ("tensor", np.uint32), ("offset", np.uint64), ("length", np.uint64)])
assert RANGE.itemsize == ctypes.sizeof(_lib.Range) and all(
    RANGE.fields[name][1] == getattr(_lib.Range, name).offset for name in RANGE.names)


def ranges(rows: Sequence[Tuple[int, int, int, int]]) -> np.ndarray:
    """An rdt_range array of (ref, tensor, offset, length) rows."""
    return np.array(rows, dtype=RANGE)


# ---- views over rdt_tensors handed to callbacks ------------------------------

def numpy_view(data: int, desc: Desc) -> np.ndarray:
    """A numpy array over host memory (no copy). Dtypes numpy lacks are shown
    as flat uint8 bytes."""
    dt = desc.numpy_dtype
    shape: Sequence[int] = desc.shape
    if dt is None:
        dt = np.dtype(np.uint8)
        shape = (desc.nbytes,)
    n = desc.nbytes
    if n == 0 or not data:
        return np.empty(shape, dtype=dt)
    buf = (ctypes.c_char * n).from_address(data)
    return np.frombuffer(buf, dtype=dt).reshape(shape)  # type: ignore[call-overload]


def torch_view(data: int, desc: Desc) -> Any:
    """A torch tensor over host memory (no copy)."""
    import torch
    name = _DL_TO_TORCH.get((desc.code, desc.bits))
    if name is None or desc.lanes != 1:
        raise UnsupportedError(f"no torch dtype for {desc.dtype_name()}")
    dt = getattr(torch, name)
    n = desc.nbytes
    if n == 0 or not data:
        return torch.empty(desc.shape, dtype=dt)
    raw = np.frombuffer((ctypes.c_char * n).from_address(data), dtype=np.uint8)  # type: ignore[call-overload]
    return torch.from_numpy(raw).view(dt).reshape(desc.shape)


def view_of_c(t: _lib.Tensor, framework: str = "numpy") -> Any:
    """A tensor over an rdt_tensor handed to a callback (host memory only)."""
    d = desc_of_c(t)
    data = (t.data or 0) + t.byte_offset
    if d.device_type not in _HOST_DEVICES:
        raise UnsupportedError(f"device type {d.device_type} memory cannot be shown to a Python transport "
                               "without torch")
    if framework == "torch":
        return torch_view(data, d)
    return numpy_view(data, d)


def as_numpy(x: Any) -> np.ndarray:
    """A numpy view of a host tensor of any supported framework."""
    if isinstance(x, np.ndarray):
        return x
    t = _torch()
    if t is not None and isinstance(x, t.Tensor):
        if x.dtype in (t.bfloat16,) or str(x.dtype).startswith("torch.float8"):
            return x.view(t.uint16 if x.element_size() == 2 else t.uint8).numpy()
        return x.detach().numpy()
    it = item_of(x)
    return numpy_view(it.data, it.desc)
