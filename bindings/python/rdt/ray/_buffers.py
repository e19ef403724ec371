"""What a receive lands in: new tensors on the receiving device, CPU ones
of 4 MiB and more over the process's cache of huge-page buffers
(rdt._receive, which rdt.get uses too)."""

from __future__ import annotations

from typing import Any, Optional

import rdt

from .._receive import HUGE_PAGE as _HUGE_PAGE  # noqa: F401  (rdt.ray's name for it)
from .._receive import HUGE_PAGE_MIN as _HUGE_PAGE_MIN
from .._tensors import current_cuda_device
from ._runtime import _PROCESS


def _host_buffer(nbytes: int) -> Any:
    """Writable memory for a received tensor: large ones from this process's
    cache of huge-page mappings, so that the receive is not paced by page
    faults."""
    if nbytes < _HUGE_PAGE_MIN:
        return bytearray(nbytes)
    return _PROCESS.receive_cache().buffer(nbytes)


def _empty(framework: str, shape: Any, dtype: Any, device: str) -> Any:
    """An uninitialized tensor to receive into, like ``torch.empty``."""
    shape = tuple(int(d) for d in shape)
    count = 1
    for d in shape:
        count *= d
    if framework == "torch":
        import torch
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if device != "cpu" or nbytes < _HUGE_PAGE_MIN:
            return torch.empty(shape, dtype=dtype, device=device)
        return _PROCESS.receive_cache().torch_tensor(torch, shape, dtype)
    import numpy as np
    dt = np.dtype(dtype)
    return np.frombuffer(_host_buffer(count * dt.itemsize), dtype=dt).reshape(shape)


def _receive_device(device: Optional[str]) -> str:
    """Where a receive of tensors on ``device`` ("cuda" or "cpu") lands: a
    CUDA object on this actor's current device, by the rule rdt.get
    follows (Ray shows an actor only its own GPUs)."""
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise rdt.UnsupportedError("the object holds CUDA tensors and this actor has no CUDA device (give it "
                                       "num_gpus, or set a target device with ray.experimental.set_target_device_for_ref)")
        return f"cuda:{current_cuda_device('torch')}"
    return "cpu"
