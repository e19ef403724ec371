"""What the driver tells every worker (runtime_env's env_vars) and how it
is written and read: the transport's registration, the cluster token, the
bound of the receive cache. Plain data; nothing here talks to Ray."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import rdt

from .._receive import DEFAULT_LIMIT

# What the driver tells every worker, through runtime_env's env_vars: the
# transport's registration ("NAME;dev,dev;framework;rdt transport") and the
# cluster token.
_CONFIG_ENV = "RDT_RAY_TRANSPORT"
_TOKEN_ENV = "RDT_RAY_AUTH_TOKEN"
# How many bytes of dropped receive buffers a process keeps for reuse.
_CACHE_ENV = "RDT_RAY_RECEIVE_CACHE_BYTES"
_DEFAULT_CACHE_BYTES = DEFAULT_LIMIT
_SETUP_HOOK = "rdt.ray.setup"


def _framework_of(data_type: Any) -> str:
    """'torch' or 'numpy' for a data_type argument (None: torch)."""
    if data_type is None or data_type in ("torch", "torch.Tensor"):
        return "torch"
    if data_type in ("numpy", "numpy.ndarray"):
        return "numpy"
    mod = getattr(data_type, "__module__", "") or ""
    name = getattr(data_type, "__name__", "")
    if mod.startswith("torch") and name == "Tensor":
        return "torch"
    if mod.startswith("numpy") and name == "ndarray":
        return "numpy"
    raise rdt.InvalidArgumentError(f"data_type must be torch.Tensor (the default) or numpy.ndarray, not {data_type!r}")


def _data_type(framework: str) -> Any:
    if framework == "torch":
        try:
            import torch
        except ImportError as e:
            raise ImportError("rdt.ray moves torch tensors by default and torch is not installed here; install "
                              "torch, or register with data_type=numpy.ndarray (see docs/ray.md)") from e
        return torch.Tensor
    import numpy
    return numpy.ndarray


_NUMPY_WARNING = (
    "rdt.ray: registering for numpy.ndarray installs Ray's serializer hook for every numpy array in the "
    "processes that use the transport: from the first transfer on, ordinary numpy values passed through Ray's "
    "object store in those processes are serialized far more slowly (measured: 13.5 -> 0.3 GB/s at 1 GiB). "
    "Register for torch.Tensor (the default) unless numpy is what your tasks exchange.")


def _devices_of(devices: Any) -> Tuple[str, ...]:
    if isinstance(devices, str):
        devices = (devices,)
    out = tuple(str(d) for d in devices)
    for d in out:
        if d not in ("cpu", "cuda"):
            raise rdt.InvalidArgumentError(f"devices are device types, 'cpu' or 'cuda', not {d!r}")
    if not out:
        raise rdt.InvalidArgumentError("devices is empty: give 'cpu', 'cuda' or both")
    return out


def _encode_config(name: str, devices: Tuple[str, ...], framework: str, transport: Optional[str]) -> str:
    for what, value in (("transport name", name), ("rdt transport", transport or "")):
        if ";" in value:
            raise rdt.InvalidArgumentError(f"{what} {value!r} contains ';'")
    if not name:
        raise rdt.InvalidArgumentError("the transport name is empty")
    return f"{name.upper()};{','.join(devices)};{framework};{transport or ''}"


_DEFAULT_CONFIG = "RDT;cpu,cuda;torch;"


def _decode_config(text: str) -> Tuple[str, Tuple[str, ...], str, Optional[str]]:
    """(name, devices, framework, rdt transport or None) from the text
    runtime_env() put in the environment."""
    parts = text.split(";")
    if len(parts) != 4:
        raise rdt.InvalidArgumentError(f"${_CONFIG_ENV}={text!r}: want NAME;devices;framework;transport "
                                       "(set it with rdt.ray.runtime_env)")
    return parts[0], _devices_of(parts[1].split(",")), _framework_of(parts[2]), parts[3] or None


def _cache_limit(text: str, what: str) -> int:
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if limit < 0:
        raise rdt.InvalidArgumentError(f"rdt.ray: {what} must be a whole number of bytes, 0 or more; got {text!r}")
    return limit
