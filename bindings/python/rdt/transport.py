"""Custom transports written against Ray's TensorTransportManager
interface, and the adapter that registers them as C vtables."""

from __future__ import annotations

import ctypes
import itertools
import pickle
import sys
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _lib
from .tensors import numpy_over_c


@dataclass
class CommunicatorMetadata:
    """Metadata for the communicator of one transfer (subclass it)."""


@dataclass
class TensorTransportMetadata:
    """What receivers need to know about an object's tensors: (shape, dtype)
    pairs, and the device they live on."""

    tensor_meta: List[Tuple[Any, Any]]
    tensor_device: Optional[str] = None


@dataclass
class FetchRequest:
    """A pending or completed fetch. Subclasses carrying resources release
    them in ``__del__``, so that they go even if nobody waits."""

    obj_id: str
    tensors: List[Any]


@dataclass(frozen=True)
class Peer:
    """The other side of a transfer, where Ray passes an actor handle."""

    runtime_id: str
    address: str


class TensorTransportManager(ABC):
    """The interface of a custom tensor transport, method for method as Ray
    defines it, so a class written for Ray runs under rdt unchanged."""

    @abstractmethod
    def tensor_transport_backend(self) -> str:
        """The transport's name."""

    @staticmethod
    @abstractmethod
    def is_one_sided() -> bool:
        """True if the receiver alone moves the bytes (send is never called)."""

    @staticmethod
    @abstractmethod
    def can_abort_transport() -> bool:
        """True if abort_transport reliably interrupts a transfer."""

    @abstractmethod
    def actor_has_tensor_transport(self, actor: Any) -> bool:
        """Whether the peer has this transport."""

    @abstractmethod
    def extract_tensor_transport_metadata(self, obj_id: str, gpu_object: List[Any]) -> TensorTransportMetadata:
        """Source, at put: describe the tensors for receivers."""

    @abstractmethod
    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        """Destination, once per transfer: the communicator metadata."""

    @abstractmethod
    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        """Destination: receive the tensors (into target_buffers if possible)."""

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorTransportMetadata,
                               communicator_metadata: CommunicatorMetadata,
                               target_buffers: Optional[List[Any]] = None) -> FetchRequest:
        """Start a fetch; by default a synchronous recv whose result the
        request holds."""
        tensors = self.recv_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata,
                                             target_buffers)
        return FetchRequest(obj_id=obj_id, tensors=tensors)

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> List[Any]:
        """Wait for a fetch (timeout in seconds, -1 forever, 0 poll) and
        return its tensors; raise TimeoutError if it passes."""
        return fetch_request.tensors

    @abstractmethod
    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata) -> None:
        """Source of a two-sided transport: send the tensors."""

    @abstractmethod
    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata,
                        tensors: List[Any]) -> None:
        """Source: the object is freed; release what the transport holds."""

    @abstractmethod
    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        """Either side: interrupt a transfer in progress."""


def _describe(tensors: List[Any]) -> TensorTransportMetadata:
    return TensorTransportMetadata(tensor_meta=[(tuple(t.shape), t.dtype) for t in tensors],
                                   tensor_device="cpu")


_finalizing = sys.is_finalizing


class Adapter:
    """Turns a TensorTransportManager into an rdt_transport_vtable. Each
    callback runs on an rdt thread: ctypes takes the GIL for it, and any
    exception becomes RDT_ERR_USER with its message."""

    _live: Dict[int, "Adapter"] = {}
    _ids = itertools.count(1)
    _live_lock = threading.Lock()

    def __init__(self, name: str, manager: TensorTransportManager, data_type: Any = None) -> None:
        self.name = name
        self.manager = manager
        self.data_type = data_type
        self.requests: Dict[int, Tuple[Any, List[np.ndarray]]] = {}
        self.cmeta: Dict[int, Any] = {}
        self.lock = threading.Lock()
        self.req_ids = itertools.count(1)
        with Adapter._live_lock:
            self.key = next(Adapter._ids)
            Adapter._live[self.key] = self
        overrides_fetch = type(manager).fetch_multiple_tensors is not TensorTransportManager.fetch_multiple_tensors
        vt = _lib.init(_lib.TransportVTable())
        flags = 0
        if type(manager).is_one_sided():
            flags |= _lib.TRANSPORT_ONE_SIDED
        if type(manager).can_abort_transport():
            flags |= _lib.TRANSPORT_CAN_ABORT
        vt.flags = flags
        vt.user_data = self.key
        self._callbacks = [
            _lib.FreeUserDataFn(self._free),
            _lib.ExtractMetadataFn(self._extract),
            _lib.CommunicatorMetadataFn(self._communicator),
            _lib.SendFn(self._send),
            _lib.RecvFn(self._recv),
            _lib.GarbageCollectFn(self._gc),
            _lib.AbortFn(self._abort),
        ]
        (vt.free_user_data, vt.extract_metadata, vt.communicator_metadata, vt.send, vt.recv,
         vt.garbage_collect, vt.abort) = self._callbacks
        if overrides_fetch:
            fetch_cbs = [_lib.FetchFn(self._fetch), _lib.WaitFn(self._wait),
                         _lib.ReleaseRequestFn(self._release_request)]
            self._callbacks += fetch_cbs
            vt.fetch, vt.wait, vt.release_request = fetch_cbs
        self.vtable = vt

    # ---- conversions -------------------------------------------------------

    def _tensors(self, ptr: Any, n: int) -> List[Any]:
        arrays = [numpy_over_c(ptr[i]) for i in range(n)]
        if self.data_type is not None and getattr(self.data_type, "__module__", "").startswith("torch"):
            import torch
            return [torch.from_numpy(a) for a in arrays]
        return arrays

    @staticmethod
    def _load(ptr: Optional[int], size: int) -> Any:
        if not ptr or size == 0:
            return None
        return pickle.loads(ctypes.string_at(ptr, size))

    @staticmethod
    def _store(obj: Any, out: int) -> None:
        blob = pickle.dumps(obj)
        _lib.check(_lib.lib().rdt_buffer_set(out, blob, len(blob)))

    @staticmethod
    def _peer(runtime: bytes, address: bytes) -> Peer:
        return Peer((runtime or b"").decode(), (address or b"").decode())

    @staticmethod
    def _copy_into(result: Optional[List[Any]], targets: List[Any]) -> None:
        if result is None:
            return
        result = list(result)
        if len(result) != len(targets):
            raise ValueError(f"the transport returned {len(result)} tensors for {len(targets)} targets")
        for got, target in zip(result, targets):
            if got is target:
                continue
            src = got.numpy() if hasattr(got, "numpy") and not isinstance(got, np.ndarray) else np.asarray(got)
            dst = target.numpy() if hasattr(target, "numpy") and not isinstance(target, np.ndarray) else target
            if src.ctypes.data == dst.ctypes.data:
                continue
            np.copyto(dst, src.reshape(dst.shape), casting="no")

    def _guard(self, fn: Callable[[], Optional[int]]) -> int:
        if _finalizing():
            return -14
        try:
            st = fn()
            return _lib.OK if st is None else st
        except BaseException as e:  # noqa: BLE001 - nothing may unwind into rdt
            try:
                msg = f"{type(e).__name__}: {e}"
                _lib.lib().rdt_set_error(msg.encode("utf-8", "replace"))
            except BaseException:
                pass
            return _lib.ERR_USER

    # ---- callbacks ---------------------------------------------------------

    def _free(self, _ud: int) -> None:
        with Adapter._live_lock:
            Adapter._live.pop(self.key, None)

    def _extract(self, _ud: int, obj_id: bytes, tensors: Any, n: int, out: int) -> int:
        return self._guard(lambda: self._store(
            self.manager.extract_tensor_transport_metadata(obj_id.decode(), self._tensors(tensors, n)), out))

    def _communicator(self, _ud: int, x: Any, out: int) -> int:
        t = x.contents

        def run() -> None:
            src = self._peer(t.source_runtime, t.source_address)
            dst = self._peer(t.destination_runtime, t.destination_address)
            self._store(self.manager.get_communicator_metadata(src, dst, self.name), out)
        return self._guard(run)

    def _send(self, _ud: int, x: Any, tensors: Any, n: int, tmeta: int, tsize: int, cmeta: int, csize: int) -> int:
        def run() -> None:
            cm = self._load(cmeta, csize)
            tid = x.contents.transfer_id
            with self.lock:
                self.cmeta[tid] = cm
            try:
                self.manager.send_multiple_tensors(self._tensors(tensors, n), self._load(tmeta, tsize), cm)
            finally:
                with self.lock:
                    self.cmeta.pop(tid, None)
        return self._guard(run)

    def _recv(self, _ud: int, x: Any, targets: Any, n: int, tmeta: int, tsize: int, cmeta: int, csize: int) -> int:
        def run() -> None:
            cm = self._load(cmeta, csize)
            tid = x.contents.transfer_id
            with self.lock:
                self.cmeta[tid] = cm
            try:
                bufs = self._tensors(targets, n)
                got = self.manager.recv_multiple_tensors(x.contents.object_id.decode(), self._load(tmeta, tsize),
                                                         cm, target_buffers=bufs)
                self._copy_into(got, bufs)
            finally:
                with self.lock:
                    self.cmeta.pop(tid, None)
        return self._guard(run)

    def _fetch(self, _ud: int, x: Any, targets: Any, n: int, tmeta: int, tsize: int, cmeta: int, csize: int,
               request: Any) -> int:
        def run() -> None:
            bufs = self._tensors(targets, n)
            cm = self._load(cmeta, csize)
            req = self.manager.fetch_multiple_tensors(x.contents.object_id.decode(), self._load(tmeta, tsize),
                                                      cm, target_buffers=bufs)
            rid = next(self.req_ids)
            with self.lock:
                self.requests[rid] = (req, bufs)
                self.cmeta[-rid] = (x.contents.object_id.decode(), cm)
            request[0] = rid
        return self._guard(run)

    def _wait(self, _ud: int, request: int, timeout_ms: int) -> int:
        def run() -> int:
            with self.lock:
                req, bufs = self.requests[request]
            timeout = -1 if timeout_ms < 0 else timeout_ms / 1000.0
            try:
                got = self.manager.wait_fetch_complete(req, timeout=timeout)
            except TimeoutError:
                return _lib.ERR_TIMEOUT
            self._copy_into(got, bufs)
            return _lib.OK
        return self._guard(run)

    def _release_request(self, _ud: int, request: int) -> None:
        with self.lock:
            self.requests.pop(request, None)  # the request's __del__ cleans up
            self.cmeta.pop(-request, None)

    def _gc(self, _ud: int, obj_id: bytes, tensors: Any, n: int, tmeta: int, tsize: int) -> None:
        self._guard(lambda: self.manager.garbage_collect(obj_id.decode(), self._load(tmeta, tsize),
                                                         self._tensors(tensors, n)))

    def _abort(self, _ud: int, x: Any, request: Optional[int]) -> int:
        def run() -> None:
            obj = x.contents.object_id.decode()
            with self.lock:
                if request:
                    _, cm = self.cmeta.get(-request, (obj, None))
                else:
                    cm = self.cmeta.get(x.contents.transfer_id)
            self.manager.abort_transport(obj, cm)
        return self._guard(run)


def register(rt_handle: int, name: str, devices: Union[str, List[str]], cls: Any, data_type: Any = None) -> None:
    """Registers an instance of cls (or cls itself, if already an instance)
    with a runtime."""
    from .tensors import device_code
    manager = cls() if isinstance(cls, type) else cls
    if not isinstance(manager, TensorTransportManager):
        missing = [m for m in ("recv_multiple_tensors", "is_one_sided", "can_abort_transport")
                   if not hasattr(manager, m)]
        if missing:
            raise TypeError(f"{cls!r} does not implement the TensorTransportManager interface (no {missing[0]})")
    if isinstance(devices, str):
        devices = [devices]
    codes = (ctypes.c_int32 * len(devices))(*[device_code(d) for d in devices])
    adapter = Adapter(name, manager, data_type)
    _lib.check(_lib.lib().rdt_register_transport(rt_handle, name.encode(), codes, len(devices),
                                                 ctypes.byref(adapter.vtable)))
