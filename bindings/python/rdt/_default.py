"""The process's default runtime, the module functions that use it, and
how a ref pickles: unpickling makes a borrow in the default runtime. Only
this module makes the default runtime, so the modules below never need
to reach back up for it."""

from __future__ import annotations

import copyreg
import threading
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple, Type, Union

from . import _tensors as _t
from ._adapter import validate
from ._errors import InvalidArgumentError
from ._fetch import Fetch
from ._get import Refs, get_async_in, get_in, get_start_in
from ._pending import deadline_of
from ._prepared import Prepared
from ._process import PROCESS
from ._ref import ObjectRef, Range
from ._runtime import Runtime
from ._write import Write


class DefaultRuntime:
    """The runtime the module functions use, made on first use (or by
    ``rdt.init``) and made again once it was closed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while the runtime is made
        self.runtime: Optional[Runtime] = None

    def init(self, options: Dict[str, Any]) -> Runtime:
        with self.lock:
            if self.runtime is not None and not self.runtime.closed:
                raise InvalidArgumentError("rdt.init: the default runtime already exists")
            self.runtime = Runtime(**options)
            return self.runtime

    def get(self) -> Runtime:
        rt = self.runtime
        if rt is not None and rt._ptr is not None:
            return rt
        with self.lock:
            if self.runtime is None or self.runtime.closed:
                self.runtime = Runtime()
            return self.runtime


DEFAULT = DefaultRuntime()


# ---- pickling a ref --------------------------------------------------------------

def _reduce_ref(ref: ObjectRef) -> Any:
    return (_unpickle_ref, ref._pickle_args())


def _unpickle_ref(data: bytes, skeleton: Any, frameworks: Tuple[str, ...], descs: Any = None,
                  oid: str = "") -> ObjectRef:
    return DEFAULT.get().deserialize(data, _skeleton=skeleton, _frameworks=frameworks, _descs=descs, _oid=oid)


# Registered here rather than as ObjectRef.__reduce__: the function that
# unpickles needs the default runtime, which lives in this module.
copyreg.pickle(ObjectRef, _reduce_ref)


# ---- the module functions ----------------------------------------------------------

def init(**options: Any) -> Runtime:
    """Creates the process's default runtime with options (see Runtime).
    Call it before anything else uses the default runtime."""
    return DEFAULT.init(options)


def default_runtime() -> Runtime:
    """The process's default runtime, created on first use."""
    return DEFAULT.get()


def put(value: Any, transport: Optional[str] = None) -> ObjectRef:
    """Puts value into the default runtime; see Runtime.put."""
    return DEFAULT.get().put(value, transport)


def expose(value: Any, transport: Optional[str] = None) -> ObjectRef:
    """Exposes value's tensors in the default runtime for other processes to
    write into; see Runtime.expose."""
    return DEFAULT.get().expose(value, transport)


def write(refs: Any, value: Any, *, tag: int = 0, timeout: Optional[float] = None,
          transport: Optional[str] = None) -> None:
    """Writes value into writable refs (or ranges of them), in the runtime
    they belong to; see Runtime.write."""
    runtime_of(refs).write(refs, value, tag=tag, timeout=timeout, transport=transport)


def write_start(refs: Any, value: Any, *, tag: int = 0, transport: Optional[str] = None) -> Write:
    """Starts writing value into writable refs (or ranges of them), in the
    runtime they belong to, and returns the rdt.Write; see
    Runtime.write_start."""
    return runtime_of(refs).write_start(refs, value, tag=tag, transport=transport)


async def write_async(refs: Any, value: Any, *, tag: int = 0, timeout: Optional[float] = None,
                      transport: Optional[str] = None) -> None:
    """``await rdt.write_async(ref, value)``: rdt.write for asyncio."""
    await runtime_of(refs).write_async(refs, value, tag=tag, timeout=timeout, transport=transport)


def prepare_get(refs: Any, out: Any = None, transport: Optional[str] = None,
                device: Optional[str] = None) -> "Prepared":
    """A get prepared to run many times, in the runtime the refs belong to;
    see Runtime.prepare_get."""
    return runtime_of(refs).prepare_get(refs, out=out, transport=transport, device=device)


def prepare_write(refs: Any, value: Any, *, transport: Optional[str] = None) -> "Prepared":
    """A write prepared to run many times, in the runtime the refs belong to;
    see Runtime.prepare_write."""
    return runtime_of(refs).prepare_write(refs, value, transport=transport)


def runtime_of(refs: Any) -> Runtime:
    """The runtime refs (or ranges of them) belong to (the default one for
    anything else, whose get then says what is wrong)."""
    first = refs[0] if isinstance(refs, (list, tuple)) and refs else refs
    if isinstance(first, Range):
        first = first.ref
    if isinstance(first, ObjectRef):
        return first._runtime
    return DEFAULT.get()


def get(refs: Union[Refs, Sequence[Refs]], timeout: Optional[float] = None,
        transport: Optional[str] = None, out: Any = None, device: Optional[str] = None,
        copy: Optional[bool] = True) -> Any:
    """Gets refs (or ranges of them, ``ref[i][a:b]``) in the runtime they
    belong to, or with ``copy=False`` views them; see Runtime.get."""
    if copy is not True:
        return runtime_of(refs).get(refs, timeout, transport, out, device, copy)
    return get_in(runtime_of(refs), refs, timeout=timeout, transport=transport, out=out, device=device)


def get_start(refs: Union[Refs, Sequence[Refs]], out: Any = None, transport: Optional[str] = None,
              device: Optional[str] = None) -> Fetch:
    """Starts a get of refs in the runtime they belong to and returns the
    rdt.Fetch; see Runtime.get_start."""
    return get_start_in(runtime_of(refs), refs, out=out, transport=transport, device=device)


def fetch(refs: Union[Refs, Sequence[Refs]], out: Any = None, transport: Optional[str] = None,
          device: Optional[str] = None) -> Fetch:
    """The earlier name of :func:`get_start`; deprecated."""
    warnings.warn("rdt.fetch is deprecated: use rdt.get_start", DeprecationWarning, stacklevel=2)
    return get_start_in(runtime_of(refs), refs, out=out, transport=transport, device=device)


async def get_async(refs: Union[Refs, Sequence[Refs]], timeout: Optional[float] = None,
                    transport: Optional[str] = None, out: Any = None, device: Optional[str] = None,
                    copy: Optional[bool] = True) -> Any:
    """``await rdt.get_async(refs)``: ``rdt.get`` for asyncio, in the runtime
    the refs belong to. The event loop keeps running while the bytes move,
    and no thread waits. ``timeout`` (seconds) raises GetTimeoutError (a
    TimeoutError) and aborts the get; so does cancelling the awaiting task
    (``asyncio.wait_for`` included). With ``out=``, either returns once
    nothing writes into those buffers any more."""
    if copy is not True:
        return await runtime_of(refs).get_async(refs, timeout, transport, out, device, copy)
    return await get_async_in(runtime_of(refs), refs, timeout, transport, out, device)


def wait_tensor_freed(tensor: Any, timeout: Optional[float] = None) -> None:
    """Blocks until no object of this process holds ``tensor``; see
    Runtime.wait_tensor_freed."""
    deadline_of(timeout)  # a bad timeout is refused even when nothing holds the tensor
    it = _t.item_of(tensor)
    rt = PROCESS.holder_of(it.data) if it.data else None
    if rt is None or rt.closed:
        return  # nothing holds it (its release callback already ran)
    rt.wait_tensor_freed(tensor, timeout)


def create_collective_group(world_size: int, rank: int, rank0_address: Optional[str] = None, *,
                            backend: str = "nccl", name: str = "default", device: Union[int, str] = 0,
                            timeout: Optional[float] = 300.0) -> None:
    """Makes the default runtime a rank of a collective group; see
    Runtime.create_collective_group. Rank 0 shares ``rdt.default_runtime().address``."""
    default_runtime().create_collective_group(world_size, rank, rank0_address, backend=backend, name=name,
                                              device=device, timeout=timeout)


def destroy_collective_group(name: str = "default") -> None:
    """Destroys the default runtime's rank of a group; see
    Runtime.destroy_collective_group."""
    default_runtime().destroy_collective_group(name)


def register_tensor_transport(name: str, devices: Union[str, Sequence[str]], cls: Any,
                              data_type: Optional[Type[Any]] = None) -> None:
    """Registers a ``TensorTransportManager`` class under ``name`` for the
    whole process: with every runtime that exists and every one created
    later (each gets its own instance). Call it in every process that puts
    or gets with the transport. Raises AlreadyExistsError (a ValueError) if
    the name is taken."""
    validate(name, devices, cls)
    PROCESS.add_transport(name, (name, devices, cls, data_type))
    try:
        default_runtime()
        for rt in PROCESS.live():
            rt._register(name, devices, cls, data_type, skip_existing=True)
    except BaseException:
        PROCESS.remove_transport(name)
        raise
