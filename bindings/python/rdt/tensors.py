"""Tensors in and out: numpy arrays, torch tensors, and anything with
``__dlpack__`` or ``__array_interface__``, seen as rdt_tensor views over
their memory (never copied), and new tensors of the producer's framework
allocated for receiving."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from ._errors import InvalidArgumentError, UnsupportedError

# numpy dtype <-> DLPack (code, bits); lanes are always 1.
_NP_TO_DL = {
    np.dtype(np.bool_): (6, 8),
    np.dtype(np.int8): (0, 8), np.dtype(np.int16): (0, 16),
    np.dtype(np.int32): (0, 32), np.dtype(np.int64): (0, 64),
    np.dtype(np.uint8): (1, 8), np.dtype(np.uint16): (1, 16),
    np.dtype(np.uint32): (1, 32), np.dtype(np.uint64): (1, 64),
    np.dtype(np.float16): (2, 16), np.dtype(np.float32): (2, 32),
    np.dtype(np.float64): (2, 64),
    np.dtype(np.complex64): (5, 64), np.dtype(np.complex128): (5, 128),
}
_DL_TO_NP = {v: k for k, v in _NP_TO_DL.items()}

DEVICE_NAMES = {"cpu": _lib.DEVICE_CPU, "cuda": _lib.DEVICE_CUDA, "cuda_host": _lib.DEVICE_CUDA_HOST,
                "rocm": _lib.DEVICE_ROCM, "cuda_managed": _lib.DEVICE_CUDA_MANAGED}


def device_code(name: str) -> int:
    try:
        return DEVICE_NAMES[name.lower().split(":")[0]]
    except KeyError:
        raise InvalidArgumentError(f"unknown device type {name!r} (known: {', '.join(DEVICE_NAMES)})") from None


@dataclass
class TensorDesc:
    """Shape, dtype and device of a tensor as rdt sees it."""

    shape: Tuple[int, ...]
    code: int
    bits: int
    lanes: int
    device_type: int
    device_id: int

    @property
    def numpy_dtype(self) -> Optional[np.dtype]:
        return _DL_TO_NP.get((self.code, self.bits)) if self.lanes == 1 else None


_SHAPE_TYPES = [ctypes.c_int64 * max(i, 1) for i in range(9)]


class View:
    """An rdt_tensor over a Python object's memory, with what keeps the
    memory alive and which framework made it."""

    __slots__ = ("tensor", "shape_array", "keepalive", "framework", "desc", "data")

    def __init__(self, data: int, desc: TensorDesc, keepalive: Any, framework: str) -> None:
        self.desc = desc
        self.data = data
        self.keepalive = keepalive
        self.framework = framework
        n = len(desc.shape)
        self.shape_array = (_SHAPE_TYPES[n] if n < len(_SHAPE_TYPES) else ctypes.c_int64 * n)(*desc.shape)
        # Built in one constructor call: attribute by attribute costs more
        # than the rest of a small put.
        self.tensor = _lib.Tensor(data or None, _lib.Device(desc.device_type, desc.device_id), n,
                                  _lib.DType(desc.code, desc.bits, desc.lanes), self.shape_array, None, 0)


def _torch():
    return sys.modules.get("torch")


def is_tensor(obj: Any) -> bool:
    """Whether put() treats obj as a tensor rather than structure."""
    if isinstance(obj, np.ndarray):
        return True
    t = _torch()
    if t is not None and isinstance(obj, t.Tensor):
        return True
    if isinstance(obj, (str, bytes, bytearray, memoryview, int, float, complex, bool)) or obj is None:
        return False
    return hasattr(obj, "__dlpack__") or hasattr(obj, "__array_interface__")


def _from_numpy(a: np.ndarray, keepalive: Any, framework: str) -> View:
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(
            f"array of shape {a.shape} with strides {a.strides} is not C-contiguous; pass np.ascontiguousarray(x)")
    dl = _NP_TO_DL.get(a.dtype)
    if dl is None:
        raise UnsupportedError(f"dtype {a.dtype} has no DLPack equivalent rdt can move")
    desc = TensorDesc(tuple(int(d) for d in a.shape), dl[0], dl[1], 1, _lib.DEVICE_CPU, 0)
    return View(a.__array_interface__["data"][0], desc, keepalive, framework)


_TORCH_DL = {
    "bool": (6, 8), "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16),
    "complex64": (5, 64), "complex128": (5, 128),
}


def _from_torch(x: Any) -> View:
    if not x.is_contiguous():
        raise InvalidArgumentError(f"torch tensor of shape {tuple(x.shape)} is not contiguous; pass x.contiguous()")
    name = str(x.dtype).replace("torch.", "")
    dl = _TORCH_DL.get(name)
    if dl is None:
        raise UnsupportedError(f"torch dtype {x.dtype} has no DLPack equivalent rdt can move")
    dev = x.device
    dtype_code = device_code(dev.type)
    desc = TensorDesc(tuple(int(d) for d in x.shape), dl[0], dl[1], 1, dtype_code, dev.index or 0)
    return View(x.data_ptr(), desc, x, "torch")


class _DLTensor(ctypes.Structure):
    _fields_ = _lib.Tensor._fields_


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj: Any) -> View:
    """Reads a DLPack capsule without consuming it: the capsule (kept alive
    with the object) still owns the tensor and frees it when dropped."""
    cap = obj.__dlpack__()
    if _capsule_valid(cap, b"dltensor"):
        # DLManagedTensor starts with its DLTensor.
        dl = _DLTensor.from_address(_capsule_pointer(cap, b"dltensor"))
    elif _capsule_valid(cap, b"dltensor_versioned"):
        # DLManagedTensorVersioned: version (2 x u32), manager_ctx, deleter, flags (u64), then DLTensor.
        base = _capsule_pointer(cap, b"dltensor_versioned")
        dl = _DLTensor.from_address(base + 8 + 8 + 8 + 8)
    else:
        raise UnsupportedError(f"{type(obj).__name__}.__dlpack__() returned no DLPack capsule")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    if dl.strides:
        expect = 1
        for i in reversed(range(dl.ndim)):
            if shape[i] != 1 and dl.strides[i] != expect:
                raise InvalidArgumentError(f"{type(obj).__name__} of shape {shape} is not contiguous")
            expect *= shape[i]
    desc = TensorDesc(shape, dl.dtype.code, dl.dtype.bits, dl.dtype.lanes, dl.device.device_type,
                      dl.device.device_id)
    data = (dl.data or 0) + dl.byte_offset
    return View(data, desc, (obj, cap), "dlpack")


def view_of(obj: Any) -> View:
    """A view over a tensor-like object's memory. Raises for what rdt cannot
    move without a copy (non-contiguous) or at all (unknown dtypes/types)."""
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj, obj, "numpy")
    t = _torch()
    if t is not None and isinstance(obj, t.Tensor):
        return _from_torch(obj)
    if hasattr(obj, "__array_interface__") and not hasattr(obj, "__dlpack__"):
        return _from_numpy(np.asarray(obj), obj, "numpy")
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj)
    raise UnsupportedError(f"cannot use a {type(obj).__name__} as a tensor (want numpy, torch, "
                           "__dlpack__ or __array_interface__)")


def allocate(desc: TensorDesc, framework: str) -> Any:
    """A new tensor to receive into, of the producer's framework when it is
    importable here, else numpy."""
    t = _torch() if framework == "torch" else None
    if framework == "torch" and t is None:
        try:
            import torch as t  # noqa: F811
        except ImportError:
            t = None
    if t is not None:
        dt = {v: k for k, v in _TORCH_DL.items()}.get((desc.code, desc.bits))
        if dt is not None:
            device = "cpu"
            if desc.device_type == _lib.DEVICE_CUDA:
                device = f"cuda:{desc.device_id}"
            return t.empty(desc.shape, dtype=getattr(t, dt), device=device)
    if desc.device_type not in (_lib.DEVICE_CPU, _lib.DEVICE_CUDA_HOST, _lib.DEVICE_CUDA_MANAGED):
        raise UnsupportedError(f"receiving device memory (device type {desc.device_type}) needs torch or "
                               "an out= buffer on that device")
    dt = desc.numpy_dtype
    if dt is None:
        raise UnsupportedError(f"no numpy dtype for DLPack code {desc.code}, {desc.bits} bits, {desc.lanes} "
                               "lanes: install torch or pass out=")
    return np.empty(desc.shape, dtype=dt)


def as_numpy(v: View) -> np.ndarray:
    """A numpy array over a host view (no copy), for handing to transports."""
    dt = v.desc.numpy_dtype
    if dt is None:
        dt = np.dtype(np.uint8)
        shape: Sequence[int] = (int(np.prod(v.desc.shape, dtype=np.int64)) * v.desc.bits * v.desc.lanes // 8,)
    else:
        shape = v.desc.shape
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n == 0:
        return np.empty(shape, dtype=dt)
    buf = (ctypes.c_char * n).from_address(v.data)
    return np.frombuffer(buf, dtype=dt, count=n // dt.itemsize).reshape(shape)


def desc_of_c(t: _lib.Tensor) -> TensorDesc:
    shape = tuple(t.shape[i] for i in range(t.ndim)) if t.ndim else ()
    return TensorDesc(shape, t.dtype.code, t.dtype.bits, t.dtype.lanes, t.device.device_type, t.device.device_id)


def numpy_over_c(t: _lib.Tensor) -> np.ndarray:
    """A numpy array over an rdt_tensor handed to a callback (no copy)."""
    d = desc_of_c(t)
    return as_numpy(View(t.data or 0, d, None, "numpy"))


def check_out(out: List[Any], descs: List[TensorDesc]) -> List[View]:
    if len(out) != len(descs):
        raise InvalidArgumentError(f"out= holds {len(out)} tensors, the refs hold {len(descs)}")
    views = []
    for i, (o, d) in enumerate(zip(out, descs)):
        v = view_of(o)
        if v.desc.shape != d.shape:
            raise InvalidArgumentError(f"out[{i}] has shape {v.desc.shape}, the source tensor has {d.shape}")
        if (v.desc.code, v.desc.bits, v.desc.lanes) != (d.code, d.bits, d.lanes):
            raise InvalidArgumentError(f"out[{i}] has another dtype than the source tensor")
        views.append(v)
    return views
