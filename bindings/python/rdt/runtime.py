"""Runtimes, object references, put and get."""

from __future__ import annotations

import atexit
import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _lib, tensors as _t
from ._errors import InvalidArgumentError
from ._handle import Handle
from .transport import register as _register_transport

# ---- objects kept alive until rdt frees them -------------------------------
#
# put() must keep the Python objects behind its tensors alive until rdt
# frees the object. A Python release callback would run on an rdt thread
# that then waits for the GIL, stalling rdt (measured: +70 us per put/get
# round trip). Instead the release callback is libc's sem_post on a
# semaphore per object: it needs no GIL, and Python polls the semaphores
# (sem_trywait), amortized over puts, to drop what was freed.

_libc = ctypes.CDLL(None, use_errno=True)
_sem_init = _libc.sem_init
_sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
_sem_trywait = _libc.sem_trywait
_sem_trywait.argtypes = [ctypes.c_void_p]
_sem_destroy = _libc.sem_destroy
_sem_destroy.argtypes = [ctypes.c_void_p]
# int sem_post(sem_t *) is called as void (*)(void *): the same registers
# on every Linux ABI, and the result is ignored.
_release_fn = _lib.ReleaseFn(ctypes.cast(_libc.sem_post, ctypes.c_void_p).value)
_SEM_SIZE = 64  # sizeof(sem_t) is 32 on 64-bit glibc and musl; keep room

_keep: Dict[int, Tuple[Any, Any]] = {}  # semaphore address -> (semaphore, kept objects)
_keep_lock = threading.Lock()
_next_sweep = 64


def _new_semaphore() -> Any:
    sem = (ctypes.c_char * _SEM_SIZE)()
    if _sem_init(sem, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sem_init failed")
    return sem


def _sweep(force: bool = False) -> None:
    """Drops what rdt has freed (its semaphore was posted)."""
    global _next_sweep
    with _keep_lock:
        if not force and len(_keep) < _next_sweep:
            return
        for addr, (sem, _) in list(_keep.items()):
            if _sem_trywait(sem) == 0:
                _sem_destroy(sem)
                del _keep[addr]
        _next_sweep = max(64, 2 * len(_keep))


# ---- structure <-> tensors -------------------------------------------------

@dataclass(frozen=True)
class _Slot:
    """Where the n-th tensor of an object goes back into its structure."""

    index: int


def _flatten(value: Any, out: List[Any]) -> Any:
    if _t.is_tensor(value):
        out.append(value)
        return _Slot(len(out) - 1)
    if isinstance(value, list):
        return [_flatten(v, out) for v in value]
    if isinstance(value, tuple):
        items = [_flatten(v, out) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return type(value)((k, _flatten(v, out)) for k, v in value.items())
    return value


def _unflatten(skeleton: Any, tensors: Sequence[Any]) -> Any:
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, list):
        return [_unflatten(v, tensors) for v in skeleton]
    if isinstance(skeleton, tuple):
        items = [_unflatten(v, tensors) for v in skeleton]
        return type(skeleton)(*items) if hasattr(skeleton, "_fields") else type(skeleton)(items)
    if isinstance(skeleton, dict):
        return type(skeleton)((k, _unflatten(v, tensors)) for k, v in skeleton.items())
    return skeleton


def _ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise InvalidArgumentError(f"timeout must be None or >= 0 seconds, not {timeout}")
    return int(timeout * 1000)


# ---- references --------------------------------------------------------------

class ObjectRef(Handle):
    """A reference to an object put in some runtime. Pickle it to hand it to
    another process: unpickling there makes a borrow in that process's
    default runtime, counted by the owner. ``close()`` (or garbage
    collection) releases this handle."""

    def __init__(self, runtime: "Runtime", ptr: int, skeleton: Any, frameworks: Tuple[str, ...],
                 descs: Optional[List[_t.TensorDesc]] = None) -> None:
        super().__init__(ptr)
        self._runtime = runtime
        self._skeleton = skeleton
        self._frameworks = frameworks
        self._descs = descs

    def _free(self, ptr: int) -> None:
        if not self._runtime.closed:
            _lib.lib().rdt_ref_release(ptr)

    def _info(self) -> _lib.ObjectInfo:
        info = _lib.init(_lib.ObjectInfo())
        _lib.check(_lib.lib().rdt_ref_info(self._handle(), ctypes.byref(info)))
        return info

    @property
    def id(self) -> str:
        """The object id (hexadecimal)."""
        return self._info().object_id.decode()

    @property
    def transport(self) -> Optional[str]:
        """The transport named at put, or None for the automatic choice."""
        return self._info().transport.decode() or None

    @property
    def nbytes(self) -> int:
        return self._info().nbytes

    def tensor_descs(self) -> List[_t.TensorDesc]:
        """Shape, dtype and device of each tensor (fixed for the object's life)."""
        if self._descs is not None:
            return self._descs
        n = self._info().num_tensors
        out = []
        for i in range(n):
            ti = _lib.init(_lib.TensorInfo())
            _lib.check(_lib.lib().rdt_ref_tensor_info(self._handle(), i, ctypes.byref(ti)))
            out.append(_t.TensorDesc(tuple(ti.shape[j] for j in range(ti.ndim)), ti.dtype.code, ti.dtype.bits,
                                     ti.dtype.lanes, ti.device.device_type, ti.device.device_id))
        self._descs = out
        return out

    @property
    def shapes(self) -> List[Tuple[int, ...]]:
        return [d.shape for d in self.tensor_descs()]

    def serialize(self) -> bytes:
        """The ref as bytes (the C ABI's format), leased by the owner."""
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        _lib.check(_lib.lib().rdt_ref_serialize(self._handle(), ctypes.byref(data), ctypes.byref(size)))
        try:
            return ctypes.string_at(data, size.value)
        finally:
            _lib.lib().rdt_bytes_free(data)

    def clone(self) -> "ObjectRef":
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_ref_clone(self._handle(), ctypes.byref(out)))
        return ObjectRef(self._runtime, out.value, self._skeleton, self._frameworks, self._descs)

    def __reduce__(self) -> Any:
        return (_unpickle_ref, (self.serialize(), self._skeleton, self._frameworks))

    def __repr__(self) -> str:
        if self.closed:
            return "ObjectRef(<released>)"
        try:
            return f"ObjectRef(id={self.id}, transport={self.transport or 'auto'}, shapes={self.shapes})"
        except Exception as e:  # the runtime may be gone
            return f"ObjectRef(<{type(e).__name__}>)"


def _unpickle_ref(data: bytes, skeleton: Any, frameworks: Tuple[str, ...]) -> ObjectRef:
    return default_runtime().deserialize(data, skeleton, frameworks)


# ---- runtimes --------------------------------------------------------------

_VP1 = ctypes.c_void_p * 1

_LOG_LEVELS = {None: 0, "off": 1, "error": 2, "warn": 3, "info": 4, "debug": 5}
_runtimes: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


class Runtime(Handle):
    """An rdt runtime: an object store, a transport registry and a control
    plane endpoint. Use it as a context manager, or call ``close()``.

    By default runtimes talk over Unix sockets with other processes on this
    host. ``listen_tcp="host:port"`` also accepts peers on other hosts (a
    non-loopback host needs ``auth_token`` or ``RDT_AUTH_TOKEN``)."""

    def __init__(self, name: Optional[str] = None, *, lease: Optional[float] = None,
                 peer_timeout: Optional[float] = None, listen_tcp: Optional[str] = None,
                 auth_token: Optional[str] = None, advertise_host: Optional[str] = None,
                 socket_dir: Optional[str] = None, host_id: Optional[str] = None,
                 in_process: bool = False, builtin_transports: bool = True,
                 log_level: Optional[str] = None) -> None:
        if log_level not in _LOG_LEVELS:
            raise InvalidArgumentError(f"log_level must be one of off, error, warn, info, debug, not {log_level!r}")
        o = _lib.init(_lib.RuntimeOptions())
        o.abi_version = _lib.ABI_VERSION
        enc = lambda s: s.encode() if s is not None else None  # noqa: E731
        self._strings = [enc(name), enc(listen_tcp), enc(auth_token), enc(advertise_host), enc(socket_dir),
                         enc(host_id)]
        (o.name, o.listen_tcp, o.auth_token, o.advertise_host, o.socket_dir, o.host_id) = self._strings
        o.log_level = _LOG_LEVELS[log_level]
        o.flags = (_lib.RUNTIME_IN_PROCESS if in_process else 0) | \
                  (0 if builtin_transports else _lib.RUNTIME_NO_BUILTIN_TRANSPORTS)
        o.lease_ms = _ms(lease) if lease is not None else 0
        o.peer_timeout_ms = _ms(peer_timeout) if peer_timeout is not None else 0
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_runtime_create(ctypes.byref(o), ctypes.byref(out)))
        super().__init__(out.value)
        _runtimes.add(self)

    def _free(self, ptr: int) -> None:
        _lib.lib().rdt_runtime_destroy(ptr)
        _sweep(force=True)  # every object of this runtime is freed now

    @property
    def address(self) -> str:
        s = ctypes.c_char_p()
        _lib.check(_lib.lib().rdt_runtime_address(self._handle(), ctypes.byref(s)))
        return (s.value or b"").decode()

    # ---- objects ---------------------------------------------------------

    def put(self, value: Any, transport: Optional[str] = None) -> ObjectRef:
        """Puts the tensors found in value (a tensor, or lists, tuples and
        dicts holding them) as one object, without copying them. Keep them
        unmodified until they are freed (see wait_tensor_freed)."""
        found: List[Any] = []
        skeleton = _flatten(value, found)
        views = [_t.view_of(x) for x in found]
        arr = (_lib.Tensor * max(len(views), 1))(*[v.tensor for v in views])
        out = ctypes.c_void_p()
        sem = _new_semaphore()
        st = _lib.lib().rdt_put(self._handle(), arr, len(views), transport.encode() if transport else None,
                                _release_fn, ctypes.addressof(sem), ctypes.byref(out))
        if st != _lib.OK:
            _sem_destroy(sem)
            _lib.check(st)
        with _keep_lock:
            _keep[ctypes.addressof(sem)] = (sem, (found, views))
        _sweep()
        return ObjectRef(self, out.value, skeleton, tuple(v.framework for v in views),
                         [v.desc for v in views])

    def deserialize(self, data: bytes, skeleton: Any = None, frameworks: Tuple[str, ...] = ()) -> ObjectRef:
        """A ref from rdt_ref_serialize bytes (from any language)."""
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_ref_deserialize(self._handle(), data, len(data), ctypes.byref(out)))
        ref = ObjectRef(self, out.value, skeleton, frameworks)
        if skeleton is None:
            n = len(ref.tensor_descs())
            ref._skeleton = _Slot(0) if n == 1 else [_Slot(i) for i in range(n)]
        return ref

    def get(self, refs: Union[ObjectRef, Sequence[ObjectRef]], timeout: Optional[float] = None,
            transport: Optional[str] = None, out: Any = None) -> Any:
        """Fetches one ref, or a list of refs concurrently, and returns the
        put structure(s) with fresh tensors of the producer's framework, or
        with the tensors given in ``out`` (in put order across all refs).
        Raises GetTimeoutError when ``timeout`` seconds pass; nothing is left
        writing into the buffers then."""
        single = isinstance(refs, ObjectRef)
        lst: List[ObjectRef] = [refs] if single else list(refs)  # type: ignore[list-item]
        for r in lst:
            if not isinstance(r, ObjectRef):
                raise InvalidArgumentError(f"get takes ObjectRefs, not {type(r).__name__}")
            if r._runtime is not self:
                raise InvalidArgumentError("the ref belongs to another runtime")
        descs = [r.tensor_descs() for r in lst]
        flat = [d for ds in descs for d in ds]
        if out is None:
            fws = [fw for r in lst for fw in (r._frameworks or ("numpy",) * len(r.tensor_descs()))]
            results = [_t.allocate(d, fw) for d, fw in zip(flat, fws)]
            views = [_t.view_of(x) for x in results]
        else:
            outs: List[Any] = []
            _flatten(out, outs)
            views = _t.check_out(outs, flat)
            results = outs
        handles = (_VP1 if len(lst) == 1 else ctypes.c_void_p * len(lst))(*[r._handle() for r in lst])
        targets = (_lib.Tensor * max(len(views), 1))(*[v.tensor for v in views])
        fo = None
        if transport:
            fo = _lib.init(_lib.FetchOptions())
            fo.transport = transport.encode()
        _lib.check(_lib.lib().rdt_get(self._handle(), handles, len(lst), targets, len(views),
                                      ctypes.byref(fo) if fo is not None else None, _ms(timeout)))
        structures, i = [], 0
        for r, ds in zip(lst, descs):
            structures.append(_unflatten(r._skeleton, results[i:i + len(ds)]))
            i += len(ds)
        return structures[0] if single else structures

    def wait_tensor_freed(self, tensor: Any, timeout: Optional[float] = None) -> None:
        """Blocks until no object of this runtime holds tensor (put it again
        or modify it after that). Raises GetTimeoutError (a TimeoutError)."""
        v = _t.view_of(tensor)
        _lib.check(_lib.lib().rdt_wait_tensor_freed(self._handle(), v.data or None, _ms(timeout)))

    # ---- transports and counters -------------------------------------------

    def register_tensor_transport(self, name: str, devices: Union[str, List[str]], cls: Any,
                                  data_type: Any = None) -> None:
        """Registers a TensorTransportManager class (or instance) under name.
        Register it under the same name in every process that uses it."""
        _register_transport(self._handle(), name, devices, cls, data_type)

    def transports(self) -> List[Dict[str, Any]]:
        n = ctypes.c_size_t()
        _lib.check(_lib.lib().rdt_transport_list(self._handle(), None, 0, ctypes.byref(n)))
        arr = (_lib.TransportInfo * max(n.value, 1))()
        for x in arr:
            _lib.init(x)
        _lib.check(_lib.lib().rdt_transport_list(self._handle(), arr, n.value, ctypes.byref(n)))
        return [{"name": x.name.decode(), "one_sided": bool(x.flags & _lib.TRANSPORT_ONE_SIDED),
                 "can_abort": bool(x.flags & _lib.TRANSPORT_CAN_ABORT),
                 "builtin": bool(x.flags & _lib.TRANSPORT_BUILTIN),
                 "transfers_completed": x.transfers_completed, "transfers_failed": x.transfers_failed,
                 "bytes_received": x.bytes_received} for x in arr[:n.value]]

    def stats(self) -> Dict[str, int]:
        s = _lib.init(_lib.Stats())
        _lib.check(_lib.lib().rdt_runtime_stats(self._handle(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _lib.Stats._fields_[2:]}


# ---- the default runtime ---------------------------------------------------

_default: Optional[Runtime] = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The process's default runtime, created on first use."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Runtime()
        return _default


def put(value: Any, transport: Optional[str] = None) -> ObjectRef:
    return default_runtime().put(value, transport)


def get(refs: Union[ObjectRef, Sequence[ObjectRef]], timeout: Optional[float] = None,
        transport: Optional[str] = None, out: Any = None) -> Any:
    if isinstance(refs, ObjectRef):
        rt = refs._runtime
    else:
        refs = list(refs)
        rt = refs[0]._runtime if refs and isinstance(refs[0], ObjectRef) else default_runtime()
    return rt.get(refs, timeout=timeout, transport=transport, out=out)


def wait_tensor_freed(tensor: Any, timeout: Optional[float] = None) -> None:
    default_runtime().wait_tensor_freed(tensor, timeout)


def register_tensor_transport(name: str, devices: Union[str, List[str]], cls: Any, data_type: Any = None) -> None:
    default_runtime().register_tensor_transport(name, devices, cls, data_type)


@atexit.register
def _close_all() -> None:
    # Destroy runtimes while Python still runs: their release callbacks and
    # transports' free functions call into it.
    for rt in list(_runtimes):
        try:
            rt.close()
        except Exception:
            pass
