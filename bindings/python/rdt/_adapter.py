"""Turns a TensorTransportManager into an rdt_transport_vtable.

Every callback runs on one of rdt's threads. ctypes takes the GIL for it
(rdt's calls that wait on callbacks were entered with the GIL released, so
this never deadlocks); an exception becomes RDT_ERR_USER with its message
set through rdt_set_error, and rdt reports it to the caller of get.
Metadata objects cross processes pickled: tensor metadata inside the
serialized ref, communicator metadata over rdt's control plane.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import pickle
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from . import _tensors as _t
from ._errors import InvalidArgumentError, RdtError
from ._store import RuntimeLike, Store
from ._transport import Peer

_REQUIRED = ("is_one_sided", "can_abort_transport", "extract_tensor_transport_metadata",
             "get_communicator_metadata", "garbage_collect", "abort_transport")


def _overrides(manager: Any, method: str) -> bool:
    """Whether the class defines method itself rather than inheriting the
    interface's default (ours, or Ray's own TensorTransportManager)."""
    for klass in type(manager).__mro__:
        if method in vars(klass):
            return klass.__name__ != "TensorTransportManager"
    return False


def _device_list(devices: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(devices, str):
        devices = [devices]
    out = list(devices)
    if not out:
        raise InvalidArgumentError("a transport needs at least one device type, such as 'cpu'")
    return out


def validate(name: str, devices: Union[str, Sequence[str]], cls: Any) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"a transport name must be a non-empty string, not {name!r}")
    for d in _device_list(devices):
        _t.device_code(d)
    missing = [m for m in _REQUIRED if not hasattr(cls, m)]
    if not (hasattr(cls, "recv_multiple_tensors") or hasattr(cls, "fetch_multiple_tensors")):
        missing.append("recv_multiple_tensors")
    if missing:
        raise TypeError(f"{cls!r} does not implement the TensorTransportManager interface: it lacks "
                        f"{', '.join(missing)}")


_live: Dict[int, "Adapter"] = {}
_live_ids = itertools.count(1)


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"


class Adapter:
    """One registered transport of one runtime."""

    def __init__(self, store: Store, name: str, manager: Any, data_type: Any) -> None:
        self.store = store  # the runtime's: what it put, and what its fetches receive into
        self.name = name
        self.manager = manager
        self.data_type = data_type
        self.view_framework = "torch" if getattr(data_type, "__module__", "").startswith("torch") else "numpy"
        self.lock = threading.Lock()
        self.requests: Dict[int, Tuple[Any, List[Any], str, Any]] = {}
        self.cmeta: Dict[int, Any] = {}
        self.req_ids = itertools.count(1)
        self.key = next(_live_ids)

        one_sided = bool(manager.is_one_sided())
        can_abort = bool(manager.can_abort_transport())
        use_fetch = _overrides(manager, "fetch_multiple_tensors") or _overrides(manager, "wait_fetch_complete")
        if not use_fetch and not hasattr(manager, "recv_multiple_tensors"):
            use_fetch = True
        if not one_sided and not hasattr(manager, "send_multiple_tensors"):
            raise TypeError(f"{type(manager).__name__} is two-sided but has no send_multiple_tensors")
        # rdt's addition to the interface: Ray's transports do not write.
        can_write = getattr(manager, "can_write_transport", None)
        writes = bool(can_write()) if callable(can_write) else False
        if writes and not _overrides(manager, "write_multiple_tensors"):
            raise TypeError(f"{type(manager).__name__}.can_write_transport() is True but it does not define "
                            "write_multiple_tensors")

        vt = _lib.init(_lib.TransportVTable())
        vt.flags = ((_lib.TRANSPORT_ONE_SIDED if one_sided else 0) |
                    (_lib.TRANSPORT_CAN_ABORT if can_abort else 0) |
                    (_lib.TRANSPORT_WRITES if writes else 0))
        vt.user_data = self.key
        cbs: List[Any] = []

        def setcb(field: str, ctype: Any, fn: Callable[..., Any]) -> None:
            c = ctype(fn)
            cbs.append(c)
            setattr(vt, field, c)

        setcb("free_user_data", _lib.FreeUserDataFn, self._free)
        setcb("extract_metadata", _lib.ExtractMetadataFn, self._extract)
        setcb("communicator_metadata", _lib.CommunicatorMetadataFn, self._communicator)
        setcb("garbage_collect", _lib.GarbageCollectFn, self._gc)
        if not one_sided:
            setcb("send", _lib.SendFn, self._send)
        if use_fetch:
            setcb("fetch", _lib.FetchFn, self._fetch)
            setcb("wait", _lib.WaitFn, self._wait)
            setcb("release_request", _lib.ReleaseRequestFn, self._release_request)
        else:
            setcb("recv", _lib.RecvFn, self._recv)
        if writes:
            setcb("write", _lib.WriteFn, self._write)
        if can_abort:
            setcb("abort", _lib.AbortFn, self._abort)
        self.callbacks = cbs  # ctypes callbacks must outlive every call into them
        self.vtable = vt
        _live[self.key] = self  # until rdt calls free_user_data
        store.transport_added()

    # ---- conversions -----------------------------------------------------------

    def _adapt(self, x: Any) -> Any:
        """x as the type the transport was registered for (zero copy)."""
        dt = self.data_type
        if dt is None or isinstance(dt, tuple) or isinstance(x, dt):
            return x
        if self.view_framework == "torch":
            import torch
            if isinstance(x, torch.Tensor):
                return x
            return torch.from_numpy(_t.as_numpy(x))
        if dt is np.ndarray:
            return _t.as_numpy(x)
        return x

    def _views(self, ptr: Any, n: int) -> List[Any]:
        return [_t.view_of_c(ptr[i], self.view_framework) for i in range(n)]

    def _source_tensors(self, obj_id: str, ptr: Any, n: int) -> List[Any]:
        e = self.store.own(obj_id)
        if e is not None and len(e.tensors) == n:
            return [self._adapt(x) for x in e.tensors]
        return self._views(ptr, n)

    def _put_tensors(self, obj_id: str, ptr: Any, n: int) -> List[Any]:
        key = tuple((ptr[i].data or 0) + ptr[i].byte_offset for i in range(n))
        e = self.store.putting.get(key)
        if e is not None and len(e.tensors) == n:
            if not e.oid:  # garbage_collect and send find the tensors by id
                self.store.index(e, obj_id)
            return [self._adapt(x) for x in e.tensors]
        return self._views(ptr, n)

    def _targets(self, ptr: Any, n: int) -> List[Any]:
        out = []
        for i in range(n):
            t = ptr[i]
            obj = self.store.target((t.data or 0) + t.byte_offset) if t.data else None
            out.append(self._adapt(obj) if obj is not None else _t.view_of_c(t, self.view_framework))
        return out

    @staticmethod
    def _load(ptr: Optional[int], size: int) -> Any:
        if not ptr or size == 0:
            return None
        return pickle.loads(ctypes.string_at(ptr, size))

    @staticmethod
    def _store(obj: Any, out: int) -> None:
        if obj is None:
            return
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        _lib.check(_lib.lib().rdt_buffer_set(out, blob, len(blob)))

    @staticmethod
    def _copy_into(result: Optional[Sequence[Any]], targets: List[Any]) -> None:
        """A transport may return other tensors than the targets it was
        given (as Ray allows); their bytes go into the targets."""
        if result is None:
            return
        result = list(result)
        if len(result) != len(targets):
            raise ValueError(f"the transport returned {len(result)} tensors for {len(targets)} targets")
        for i, (got, target) in enumerate(zip(result, targets)):
            if got is target:
                continue
            src = _t.as_numpy(got)
            dst = _t.as_numpy(target)
            if src.__array_interface__["data"][0] == dst.__array_interface__["data"][0] and src.nbytes == dst.nbytes:
                continue
            if src.dtype != dst.dtype or src.size != dst.size:
                raise ValueError(f"the transport returned tensor {i} as {src.dtype}{list(src.shape)}; the target "
                                 f"is {dst.dtype}{list(dst.shape)}")
            np.copyto(dst, src.reshape(dst.shape), casting="no")

    def _guard(self, fn: Callable[[], Optional[int]]) -> int:
        if sys.is_finalizing():
            return _lib.ERR_CLOSED
        try:
            st = fn()
            return _lib.OK if st is None else st
        except BaseException as e:  # noqa: BLE001 - nothing may unwind into rdt
            status = _lib.ERR_USER
            if isinstance(e, RdtError) and e.status < 0:
                status = e.status
            try:
                msg = f"{type(e).__name__}: {e}{_where(e)}"
                _lib.lib().rdt_set_error(msg.encode("utf-8", "replace"))
            except BaseException:  # noqa: BLE001
                pass
            return status

    # ---- callbacks ---------------------------------------------------------------

    def _free(self, _ud: Optional[int]) -> None:
        if _live.pop(self.key, None) is not None:
            self.store.transport_removed()

    def _extract(self, _ud: Any, obj_id: bytes, tensors: Any, n: int, out: int) -> int:
        def run() -> None:
            oid = obj_id.decode()
            meta = self.manager.extract_tensor_transport_metadata(oid, self._put_tensors(oid, tensors, n))
            self._store(meta, out)
        return self._guard(run)

    def _communicator(self, _ud: Any, x: Any, out: int) -> int:
        def run() -> None:
            t = x.contents
            src = Peer(_lib.decode(t.source_runtime), _lib.decode(t.source_address))
            dst = Peer(_lib.decode(t.destination_runtime), _lib.decode(t.destination_address))
            self._store(self.manager.get_communicator_metadata(src, dst, self.name), out)
        return self._guard(run)

    @contextlib.contextmanager
    def _in_flight(self, transfer_id: int, cm: Any) -> Iterator[None]:
        """Keeps a send's, recv's or write's communicator metadata where
        abort finds it."""
        with self.lock:
            self.cmeta[transfer_id] = cm
        try:
            yield
        finally:
            with self.lock:
                self.cmeta.pop(transfer_id, None)

    def _send(self, _ud: Any, x: Any, tensors: Any, n: int, tmeta: int, tsize: int, cmeta: int,
              csize: int) -> int:
        def run() -> None:
            t = x.contents
            cm = self._load(cmeta, csize)
            with self._in_flight(t.transfer_id, cm):
                self.manager.send_multiple_tensors(self._source_tensors(_lib.decode(t.object_id), tensors, n),
                                                   self._load(tmeta, tsize), cm)
        return self._guard(run)

    def _recv(self, _ud: Any, x: Any, targets: Any, n: int, tmeta: int, tsize: int, cmeta: int,
              csize: int) -> int:
        def run() -> None:
            t = x.contents
            cm = self._load(cmeta, csize)
            with self._in_flight(t.transfer_id, cm):
                bufs = self._targets(targets, n)
                got = self.manager.recv_multiple_tensors(_lib.decode(t.object_id), self._load(tmeta, tsize), cm,
                                                         bufs)
                self._copy_into(got, bufs)
        return self._guard(run)

    def _write(self, _ud: Any, x: Any, sources: Any, n: int, tmeta: int, tsize: int, cmeta: int,
               csize: int) -> int:
        def run() -> None:
            t = x.contents
            cm = self._load(cmeta, csize)
            with self._in_flight(t.transfer_id, cm):
                self.manager.write_multiple_tensors(_lib.decode(t.object_id), self._load(tmeta, tsize), cm,
                                                    self._views(sources, n))
        return self._guard(run)

    def _fetch(self, _ud: Any, x: Any, targets: Any, n: int, tmeta: int, tsize: int, cmeta: int, csize: int,
               request: Any) -> int:
        def run() -> None:
            t = x.contents
            obj_id = _lib.decode(t.object_id)
            cm = self._load(cmeta, csize)
            bufs = self._targets(targets, n)
            req = self.manager.fetch_multiple_tensors(obj_id, self._load(tmeta, tsize), cm, bufs)
            rid = next(self.req_ids)
            with self.lock:
                self.requests[rid] = (req, bufs, obj_id, cm)
            request[0] = rid
        return self._guard(run)

    def _wait(self, _ud: Any, request: Optional[int], timeout_ms: int) -> int:
        def run() -> int:
            with self.lock:
                req, bufs, _, _ = self.requests[request or 0]
            timeout = -1 if timeout_ms < 0 else timeout_ms / 1000.0
            try:
                got = self.manager.wait_fetch_complete(req, timeout=timeout)
            except TimeoutError as e:
                _lib.lib().rdt_set_error(f"{type(e).__name__}: {e}".encode("utf-8", "replace"))
                return _lib.ERR_TIMEOUT
            self._copy_into(got, bufs)
            return _lib.OK
        return self._guard(run)

    def _release_request(self, _ud: Any, request: Optional[int]) -> None:
        if sys.is_finalizing():
            return
        try:
            with self.lock:
                entry = self.requests.pop(request or 0, None)
            del entry  # the last reference: a FetchRequest subclass cleans up in __del__
        except BaseException:  # noqa: BLE001
            pass

    def _gc(self, _ud: Any, obj_id: bytes, tensors: Any, n: int, tmeta: int, tsize: int) -> None:
        def run() -> None:
            oid = obj_id.decode()
            self.manager.garbage_collect(oid, self._load(tmeta, tsize), self._source_tensors(oid, tensors, n))
        self._guard(run)

    def _abort(self, _ud: Any, x: Any, request: Optional[int]) -> int:
        def run() -> None:
            t = x.contents
            obj_id = _lib.decode(t.object_id)
            with self.lock:
                if request:
                    _, _, obj_id, cm = self.requests.get(request, (None, None, obj_id, None))
                else:
                    cm = self.cmeta.get(t.transfer_id)
            self.manager.abort_transport(obj_id, cm)
        return self._guard(run)


def register(rt: RuntimeLike, name: str, devices: Union[str, Sequence[str]], cls: Any, data_type: Any = None) -> None:
    """Registers an instance of cls (or cls itself if it is an instance)
    with one runtime."""
    validate(name, devices, cls)
    manager = cls() if isinstance(cls, type) else cls
    devs = _device_list(devices)
    codes = (ctypes.c_int32 * len(devs))(*[_t.device_code(d) for d in devs])
    adapter = Adapter(rt._store, name, manager, data_type)
    st = _lib.lib().rdt_register_transport(rt._handle(), name.encode(), codes, len(devs),
                                           ctypes.byref(adapter.vtable))
    if st != _lib.OK:
        err = _lib.make_error(st)
        adapter._free(None)  # free_user_data already ran; be sure
        raise err
