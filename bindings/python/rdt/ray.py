"""rdt as a Ray tensor transport.

    import ray, rdt.ray
    ray.init(runtime_env=rdt.ray.runtime_env())   # every worker registers rdt
    rdt.ray.register()                             # the driver too, before the actors

    @ray.remote
    class Trainer:
        @ray.method(tensor_transport="RDT")
        def weights(self): return self.model.state_dict()

Ray places the actors, runs the tasks and counts the references; rdt moves
the tensors (cma or shm between processes of one Ray node, tcp between
nodes, cuda_ipc, nixl or nccl for GPU memory) and frees them when Ray says
the object is out of scope. See docs/ray.md.

``import rdt`` never imports Ray; ``import rdt.ray`` does (its transport
subclasses Ray's ``TensorTransportManager``). Each process gets one runtime for Ray's use (:func:`runtime`), apart
from the one ``rdt.init`` makes.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import rdt

try:
    import ray
    import ray.experimental  # noqa: F401  (register_tensor_transport, set_target_for_ref)
    from ray.experimental.rdt import util as _ray_rdt
    from ray.experimental.rdt.tensor_transport_manager import (CommunicatorMetadata, FetchRequest,
                                                               TensorTransportManager, TensorTransportMetadata)
except ImportError as e:
    raise ImportError("rdt.ray needs Ray 2.60 or later (pip install 'ray>=2.60'); rdt itself does not") from e

__all__ = ["register", "setup", "runtime_env", "runtime", "RdtTensorTransport", "RdtTransportMetadata"]

# What the driver tells every worker, through runtime_env's env_vars: the
# transport's registration ("NAME;dev,dev;framework;rdt transport") and the
# cluster token.
_CONFIG_ENV = "RDT_RAY_TRANSPORT"
_TOKEN_ENV = "RDT_RAY_AUTH_TOKEN"
# How many bytes of dropped receive buffers a process keeps for reuse.
_CACHE_ENV = "RDT_RAY_RECEIVE_CACHE_BYTES"
_DEFAULT_CACHE_BYTES = 1 << 30
_SETUP_HOOK = "rdt.ray.setup"

# Host receive buffers at least this large are mapped and advised for huge
# pages: faulting in 4 KiB pages costs more than moving the bytes. Their
# mappings are kept for reuse once dropped (_ReceiveCache), in whole huge
# pages.
_HUGE_PAGE_MIN = 4 << 20
_HUGE_PAGE = 2 << 20

# fetch_multiple_tensors starts a fetch without blocking Ray's thread: the
# first contact with a source's runtime (a handshake) is given this long,
# then finished inside wait_fetch_complete under Ray's timeout.
_START_WAIT = 0.05
# How often a wait for the source's runtime checks for abort_transport.
_ABORT_CHECK = 0.1


# ---- how the transport is registered -----------------------------------------------

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


def _config() -> Tuple[str, Tuple[str, ...], str, Optional[str]]:
    return _PROCESS.config()


def _register_with_ray(name: str, devices: Tuple[str, ...], framework: str) -> None:
    name = name.upper()
    known = _ray_rdt.transport_manager_info.get(name)
    if known is not None:
        if (known.transport_manager_class is RdtTensorTransport and tuple(known.devices) == devices
                and _framework_of(known.data_type) == framework):
            return  # already registered, the same way (the setup hook, then the driver's own task)
        raise rdt.AlreadyExistsError(f"Ray already has a tensor transport named {name!r}, registered differently "
                                     f"({known.transport_manager_class.__name__}, devices {list(known.devices)})",
                                     rdt.AlreadyExistsError.status)
    ray.experimental.register_tensor_transport(name, list(devices), RdtTensorTransport, _data_type(framework))


def register(name: str = "RDT", devices: Sequence[str] = ("cpu", "cuda"), data_type: Any = None) -> None:
    """Registers rdt with Ray as the tensor transport ``name`` in this
    process. Call it in the driver, after ``ray.init`` and before the actors
    that use it are created; give it the arguments given to
    :func:`runtime_env`, which registers it in every worker.

    ``devices`` are device types ("cpu", "cuda"). ``data_type`` is the type
    of the values Ray hands rdt: torch tensors (``None``, the default) or
    ``numpy.ndarray``, which warns: Ray then serializes every numpy array of
    those processes through its transport hook (see docs/ray.md).
    Registering again the same way does nothing."""
    framework = _framework_of(data_type)
    devs = _devices_of(devices)
    if framework == "numpy":
        warnings.warn(_NUMPY_WARNING, UserWarning, stacklevel=2)
    _register_with_ray(name, devs, framework)


def setup() -> None:
    """Ray's ``worker_process_setup_hook`` for rdt (``"rdt.ray.setup"``, set
    by :func:`runtime_env`): registers the transport in this worker as the
    driver described it, and starts the worker's runtime now, so that
    neither an early ``ray.put(..., _tensor_transport=...)`` nor a restarted
    actor finds it missing, and the first transfer pays no start-up."""
    name, devices, framework, _ = _config()
    _register_with_ray(name, devices, framework)
    runtime()


def runtime_env(env: Optional[Dict[str, Any]] = None, *, name: str = "RDT",
                devices: Sequence[str] = ("cpu", "cuda"), data_type: Any = None,
                token: Optional[str] = None, transport: Optional[str] = None,
                receive_cache: Optional[int] = None) -> Dict[str, Any]:
    """A Ray ``runtime_env`` (``env`` plus rdt's part) that registers rdt in
    every worker (:func:`setup` as ``worker_process_setup_hook``) and gives
    every worker the cluster's token. Pass it to ``ray.init`` (or a job's,
    or an actor's, runtime_env).

    ``token`` authenticates the runtimes of the cluster to one another over
    TCP; None takes ``$RDT_RAY_AUTH_TOKEN``, else makes a random one for
    this driver and its workers. It travels as an environment variable of
    the job: whoever may read the job's runtime_env may also run code in its
    workers, so it protects nothing they could not reach anyway; rdt never
    logs it. Runtimes with different tokens do not connect.

    ``transport`` pins the rdt transport that moves the objects these
    processes make ("cma", "shm", "tcp", ...); None lets each transfer
    take the best one. A runtime_env given to one actor may pin another.

    ``receive_cache`` bounds the bytes of dropped CPU receive buffers (of
    4 MiB and more) each process keeps to receive into again; None keeps
    1 GiB (or ``$RDT_RAY_RECEIVE_CACHE_BYTES``), 0 keeps none."""
    framework = _framework_of(data_type)
    cache = None
    if receive_cache is not None:
        cache = str(_cache_limit(str(receive_cache), "receive_cache"))
    config = _encode_config(name, _devices_of(devices), framework, transport)
    out = dict(env or {})
    hook = out.get("worker_process_setup_hook")
    if hook not in (None, _SETUP_HOOK):
        raise rdt.InvalidArgumentError(f"runtime_env already has a worker_process_setup_hook ({hook!r}); call "
                                       "rdt.ray.setup() from yours instead and keep the env_vars rdt adds")
    out["worker_process_setup_hook"] = _SETUP_HOOK
    tok = token or os.environ.get(_TOKEN_ENV) or _PROCESS.token()
    if not tok:
        tok = secrets.token_urlsafe(32)
    _PROCESS.set_token(tok)
    env_vars = dict(out.get("env_vars") or {})
    env_vars[_CONFIG_ENV] = config
    env_vars[_TOKEN_ENV] = tok
    if cache is not None:
        env_vars[_CACHE_ENV] = cache
    out["env_vars"] = env_vars
    return out


# ---- the process's runtime for Ray -----------------------------------------------

class _Process:
    """This process's runtime for Ray's transfers, made on first use, and the
    token the driver chose (workers read theirs from the environment)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtime: Optional[rdt.Runtime] = None
        self._node: Optional[str] = None  # the Ray node the runtime was made on
        self._session: Any = None  # the Ray connection _node was read from
        self._config: Optional[Tuple[str, Any]] = None
        self._token: Optional[str] = None
        self._cache: Optional[_ReceiveCache] = None

    def receive_cache(self) -> "_ReceiveCache":
        """The cache of dropped receive buffers, sized on first use."""
        cache = self._cache
        if cache is None:
            with self._lock:
                if self._cache is None:
                    raw = os.environ.get(_CACHE_ENV)
                    limit = _DEFAULT_CACHE_BYTES if raw is None else _cache_limit(raw, "$" + _CACHE_ENV)
                    self._cache = _ReceiveCache(limit)
                cache = self._cache
        return cache

    def config(self) -> Tuple[str, Tuple[str, ...], str, Optional[str]]:
        """The registration runtime_env() described, parsed once per value."""
        raw = os.environ.get(_CONFIG_ENV) or _DEFAULT_CONFIG
        cached = self._config
        if cached is not None and cached[0] == raw:
            return cached[1]
        parsed = _decode_config(raw)
        self._config = (raw, parsed)
        return parsed

    def token(self) -> Optional[str]:
        return self._token or os.environ.get(_TOKEN_ENV) or None

    def set_token(self, token: str) -> None:
        with self._lock:
            self._token = token

    def runtime(self) -> rdt.Runtime:
        rt = self._runtime
        if rt is not None and not rt.closed and self._session is _ray_session():
            return rt
        node = _node_id()
        with self._lock:
            old = None
            if self._runtime is None or self._runtime.closed or self._node != node:
                # A driver that joins another Ray session is on another
                # node: its host identity changes with it.
                old, self._runtime, self._node = self._runtime, self._create(node), node
            self._session = _ray_session()
        if old is not None:
            old.close()
        return self._runtime

    def _create(self, node: Optional[str]) -> rdt.Runtime:
        options: Dict[str, Any] = {"name": f"ray-{os.getpid()}"}
        if node is not None:
            # Each Ray node counts as a host: runtimes of one node share cma
            # and shm, runtimes of different nodes use tcp (also two nodes of
            # one machine, as Ray's own tests make them).
            options["host_id"] = "ray-node-" + node
            token = self._token or os.environ.get(_TOKEN_ENV)
            if token:
                ip = ray.util.get_node_ip_address()
                host = f"[{ip}]" if ":" in ip else ip
                options.update(listen_tcp=f"{host}:0", advertise_host=ip, auth_token=token)
        return rdt.Runtime(**options)


def _ray_session() -> Any:
    """This process's connection to Ray (None when not connected): the node
    is read again only when it changes (a driver's ray.shutdown and
    ray.init), since reading it costs microseconds on every transfer."""
    worker = ray._private.worker.global_worker
    return getattr(worker, "core_worker", None) if worker.connected else None


def _node_id() -> Optional[str]:
    """This process's Ray node, or None outside a Ray session."""
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


_PROCESS = _Process()


def runtime() -> rdt.Runtime:
    """This process's rdt runtime for Ray's transfers (made on first use; in
    workers by :func:`setup`). Its ``stats()`` and ``transports()`` count what
    Ray moved over rdt here."""
    return _PROCESS.runtime()


# ---- receive buffers -------------------------------------------------------------------

def _cache_limit(text: str, what: str) -> int:
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if limit < 0:
        raise rdt.InvalidArgumentError(f"rdt.ray: {what} must be a whole number of bytes, 0 or more; got {text!r}")
    return limit


class _ReceiveCache:
    """Receive buffers of 4 MiB and more, mapped for huge pages, and kept for
    the next receive of the same size once the tensor over them is dropped,
    up to ``limit`` bytes (oldest dropped first). A fresh mapping costs a
    page fault and the zeroing of every page on the first write, which is
    as much again as moving the bytes; a receiver that takes the same
    shapes every step (weights, activations) pays it once.

    A buffer comes back only when the last tensor or view over its memory
    is gone (a finalizer on the ctypes array every view keeps alive), and
    rdt keeps the targets of an aborted fetch alive until nothing writes
    into them, so a buffer is never handed out while in use."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Re-entrant: a view's finalizer runs under garbage collection,
        # which any allocation may start, also inside this lock.
        self._lock = threading.RLock()
        self._free: List[Tuple[int, mmap.mmap]] = []  # (mapped bytes, mapping), oldest first
        self._bytes = 0

    def buffer(self, nbytes: int) -> Any:
        """A writable buffer of nbytes (uninitialized, like torch.empty)."""
        mapped = -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE
        m = None
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if self._free[i][0] == mapped:
                    m = self._free.pop(i)[1]
                    self._bytes -= mapped
                    break
        if m is None:
            m = mmap.mmap(-1, mapped, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            advice = getattr(mmap, "MADV_HUGEPAGE", None)
            if advice is not None:
                try:
                    m.madvise(advice)
                except OSError:
                    pass  # kernels without transparent huge pages: 4 KiB pages then
        view = (ctypes.c_char * nbytes).from_buffer(m)
        if self.limit >= mapped:
            done = weakref.finalize(view, self._give_back, mapped, m)
            done.atexit = False
        return view

    def _give_back(self, mapped: int, m: mmap.mmap) -> None:
        entry = (mapped, m)  # made before the lock: making it may start a collection
        with self._lock:
            self._free.append(entry)
            self._bytes += mapped
            while self._bytes > self.limit:
                self._bytes -= self._free.pop(0)[0]  # unmapped once its last view is gone

    def cached_bytes(self) -> int:
        with self._lock:
            return self._bytes


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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about buffers it may not own; this one it keeps alive
            return torch.frombuffer(_host_buffer(nbytes), dtype=torch.uint8).view(dtype).reshape(shape)
    import numpy as np
    dt = np.dtype(dtype)
    return np.frombuffer(_host_buffer(count * dt.itemsize), dtype=dt).reshape(shape)


# ---- the transport -------------------------------------------------------------------

@dataclass
class RdtTransportMetadata(TensorTransportMetadata):
    """What receivers need: the tensors' shapes and dtypes (for Ray), the
    serialized rdt ref (plain bytes: Ray's borrowers keep the metadata for
    as long as they like, a live handle would pin the object), and the
    framework to receive into."""

    ref: bytes = b""
    framework: str = "torch"


class _Held:
    """An object this process put for Ray: the owner's handle, the tensors
    (their identity decides whether a retried extract is the same object)
    and the metadata handed out."""

    __slots__ = ("ref", "tensors", "meta")

    def __init__(self, ref: Optional[rdt.ObjectRef], tensors: List[Any], meta: RdtTransportMetadata) -> None:
        self.ref, self.tensors, self.meta = ref, tensors, meta

    def same(self, tensors: List[Any]) -> bool:
        return len(tensors) == len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors))


class RdtFetchRequest(FetchRequest):
    """A fetch Ray started and will wait on. Dropping it (Ray does after a
    timeout, and never waits then) aborts what still runs and releases the
    borrow, without blocking."""

    def __init__(self, obj_id: str, tensors: List[Any]) -> None:
        super().__init__(obj_id=obj_id, tensors=tensors)
        self.ref: Optional[rdt.ObjectRef] = None      # the borrow the fetch reads through
        self.fetch: Optional[rdt.Fetch] = None        # None until the source's runtime answered
        self.pending: Optional[Tuple[bytes, List[Any]]] = None  # (ref bytes, buffers) until then
        self.aborted = False
        self.owner: Optional["RdtTensorTransport"] = None
        self.started = time.monotonic()

    def close(self) -> None:
        f, self.fetch = self.fetch, None
        r, self.ref = self.ref, None
        self.pending = None
        if self.owner is not None:
            self.owner._forget(self)
        if f is not None:
            f.abort()  # a complete fetch ignores it; its buffers live until quiet
            del f
        if r is not None:
            r.release()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass  # interpreter shutdown


class RdtTensorTransport(TensorTransportManager):
    """rdt behind Ray's ``TensorTransportManager`` interface: one-sided (the
    receiver reads; the source's task thread is never needed), abortable,
    and asynchronous. Register it with :func:`register`."""

    def __init__(self) -> None:
        # Re-entrant: a dropped request's __del__ (see RdtFetchRequest.close)
        # takes it, and garbage collection may run that inside it.
        self._lock = threading.RLock()
        self._held: Dict[str, _Held] = {}  # Ray object id -> what this process put
        self._fetching: Dict[str, List[RdtFetchRequest]] = {}  # Ray object id -> fetches in flight here
        # For receives(): fetches from other processes started and ended,
        # and the longest one, start to end.
        self._receives_started = 0
        self._receives_ended = 0
        self._slowest_receive_s = 0.0

    def tensor_transport_backend(self) -> str:
        return "RDT"

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        # Runs in the driver before each task; asking the actor would block.
        # Workers get rdt from the setup hook (runtime_env).
        return True

    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any, backend: Optional[str] = None) -> Any:
        return CommunicatorMetadata()

    # ---- the source ------------------------------------------------------------

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> RdtTransportMetadata:
        tensors = list(rdt_object)
        with self._lock:
            held = self._held.get(obj_id)
            if held is not None and held.same(tensors):
                return held.meta
        framework, device = _describe(tensors)
        meta_list = [(t.shape, t.dtype) for t in tensors]
        ref = None
        data = b""
        if tensors:
            ref = runtime().put(tensors, _config()[3])
            data = ref.serialize()
        meta = RdtTransportMetadata(tensor_meta=meta_list, tensor_device=device, ref=data, framework=framework)
        with self._lock:
            old = self._held.get(obj_id)
            self._held[obj_id] = _Held(ref, tensors, meta)
        if old is not None and old.ref is not None:
            # A retried task made the object again: the first one is never
            # read (Ray keeps only the new metadata).
            old.ref.release(revoke_leases=True)
        return meta

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any, tensors: List[Any]) -> None:
        with self._lock:
            held = self._held.pop(obj_id, None)
        if held is not None and held.ref is not None:
            # Never blocks: the object goes once borrows in use end; the
            # leases of copies of the metadata nobody read end now.
            held.ref.release(revoke_leases=True)

    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: Any,
                              communicator_metadata: Any) -> None:
        # Required by Ray's interface; Ray calls it only for two-sided
        # transports (is_one_sided() is True), so reaching it is a bug.
        raise NotImplementedError("rdt is one-sided: the receiver reads, Ray never calls send")

    # ---- the receiver --------------------------------------------------------------

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any, communicator_metadata: Any,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        req = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata,
                                          target_buffers)
        return self.wait_fetch_complete(req, -1)

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any, communicator_metadata: Any,
                               target_buffers: Optional[List[Any]] = None) -> RdtFetchRequest:
        meta = tensor_transport_metadata
        if not isinstance(meta, RdtTransportMetadata):
            raise rdt.InvalidArgumentError(f"rdt got metadata of another transport ({type(meta).__name__})")
        req = RdtFetchRequest(obj_id, [])
        with self._lock:
            held = self._held.get(obj_id)
        if held is not None:
            # This process made the object: hand out the tensors themselves,
            # as Ray does, or copy them into the buffers asked for.
            if target_buffers:
                for dst, src in zip(target_buffers, held.tensors):
                    if hasattr(dst, "copy_"):
                        dst.copy_(src)
                    else:
                        dst[...] = src
                req.tensors = list(target_buffers)
            else:
                req.tensors = list(held.tensors)
            return req
        if not meta.ref:
            return req  # an empty list of tensors
        if target_buffers:
            if len(target_buffers) != len(meta.tensor_meta):
                raise ValueError(f"{len(target_buffers)} target buffers for {len(meta.tensor_meta)} tensors")
            outs = list(target_buffers)
        else:
            device = _receive_device(meta.tensor_device)
            outs = [_empty(meta.framework, shape, dtype, device) for shape, dtype in meta.tensor_meta]
        req.owner = self
        with self._lock:
            self._fetching.setdefault(obj_id, []).append(req)
            self._receives_started += 1
        req.pending = (meta.ref, outs)
        try:
            self._start(req, _START_WAIT)
        except BaseException:
            req.close()
            raise
        return req

    def _start(self, req: RdtFetchRequest, timeout: Optional[float]) -> bool:
        """Makes the borrow and starts the fetch once the source's runtime
        answers; False if it has not within ``timeout`` seconds (None: no
        limit). Waits in short slices, so that abort_transport stops it."""
        assert req.pending is not None
        data, outs = req.pending
        rt = runtime()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if req.aborted:
                raise rdt.AbortedError(f"rdt: the transfer of Ray object {req.obj_id} was aborted",
                                       rdt.AbortedError.status)
            left = _ABORT_CHECK if deadline is None else min(_ABORT_CHECK, deadline - time.monotonic())
            if left <= 0:
                return False
            try:
                ref = rt.deserialize(data, timeout=max(left, 0.001))
                break
            except rdt.GetTimeoutError:
                continue
            except rdt.PeerUnavailableError as e:
                raise rdt.PeerUnavailableError(f"{e}{_hint_unreachable()}", e.status) from None
        req.ref = ref
        req.pending = None
        req.fetch = rt.fetch(ref, out=outs)
        if req.aborted:
            req.fetch.abort()
        return True

    def wait_fetch_complete(self, fetch_request: Any, timeout: float = -1) -> List[Any]:
        req = fetch_request
        if not isinstance(req, RdtFetchRequest) or (req.fetch is None and req.pending is None):
            return list(req.tensors)  # made here, or nothing to move
        limit = None if timeout is None or timeout < 0 else float(timeout)
        try:
            if req.fetch is None:
                if not self._start(req, limit):
                    raise TimeoutError(f"rdt: the runtime holding Ray object {req.obj_id} did not answer within "
                                       f"{limit} s")
            f = req.fetch
            assert f is not None
            if not f.wait(limit):
                raise TimeoutError(f"rdt: Ray object {req.obj_id} did not arrive within {limit} s")
            value = f.result()
        except TimeoutError:
            raise  # Ray drops the request, which aborts the fetch
        except BaseException:
            req.close()
            raise
        req.tensors = list(value) if isinstance(value, list) else [value]
        req.close()
        return req.tensors

    def abort_transport(self, obj_id: str, communicator_metadata: Any) -> None:
        # Ray calls this on the receiver (on another thread than the one in
        # recv) when a transfer failed or timed out: stop every fetch of
        # the object here; their waits then raise AbortedError.
        with self._lock:
            reqs = list(self._fetching.get(obj_id, ()))
        for req in reqs:
            req.aborted = True
            f = req.fetch
            if f is not None:
                f.abort()

    def _forget(self, req: RdtFetchRequest) -> None:
        took = time.monotonic() - req.started
        with self._lock:
            reqs = self._fetching.get(req.obj_id)
            if reqs is not None:
                try:
                    reqs.remove(req)
                except ValueError:
                    return  # forgotten already
                self._receives_ended += 1
                self._slowest_receive_s = max(self._slowest_receive_s, took)
                if not reqs:
                    del self._fetching[req.obj_id]

    def receives(self) -> Dict[str, Any]:
        """What this process's receives from other processes did, to tell a
        slow or stuck receive from one Ray never asked for: how many Ray
        started and how many ended, how many run now and how many of those
        still wait for the source's runtime to answer, the oldest running
        one's age and the longest one's duration (seconds)."""
        now = time.monotonic()
        with self._lock:
            running = [r for reqs in self._fetching.values() for r in reqs]
            return {
                "started": self._receives_started,
                "ended": self._receives_ended,
                "running": len(running),
                "awaiting_source": sum(1 for r in running if r.pending is not None),
                "oldest_running_s": max((now - r.started for r in running), default=0.0),
                "slowest_s": self._slowest_receive_s,
            }


def _describe(tensors: List[Any]) -> Tuple[str, Optional[str]]:
    """The framework and device type of an object's tensors (one of each)."""
    if not tensors:
        return "torch", None
    frameworks = set()
    devices = set()
    for t in tensors:
        mod = type(t).__module__ or ""
        if mod.startswith("torch"):
            frameworks.add("torch")
            devices.add(t.device.type)
        elif mod.startswith("numpy"):
            frameworks.add("numpy")
            devices.add("cpu")
        else:
            raise rdt.InvalidArgumentError(f"rdt.ray moves torch tensors and numpy arrays, not {type(t).__name__}")
    if len(frameworks) > 1 or len(devices) > 1:
        raise rdt.InvalidArgumentError("the tensors of one Ray object must share one framework and one device type "
                                       f"(got {sorted(frameworks)} on {sorted(devices)})")
    device = devices.pop()
    if device not in ("cpu", "cuda"):
        raise rdt.UnsupportedError(f"rdt.ray moves CPU and CUDA tensors, not {device}")
    return frameworks.pop(), device


def _receive_device(device: Optional[str]) -> str:
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise rdt.UnsupportedError("the object holds CUDA tensors and this actor has no CUDA device (give it "
                                       "num_gpus, or set a target device with ray.experimental.set_target_device_for_ref)")
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _hint_unreachable() -> str:
    if _PROCESS.token():
        return ""
    return (" — to reach runtimes on other Ray nodes, every process needs the cluster's token: "
            "ray.init(runtime_env=rdt.ray.runtime_env()) (see docs/ray.md)")
