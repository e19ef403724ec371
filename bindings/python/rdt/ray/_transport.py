"""The transport itself: rdt behind Ray's TensorTransportManager, the
metadata it hands Ray, and the fetches Ray waits on."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import rdt

from ._buffers import _empty, _receive_device
from ._ray_api import CommunicatorMetadata, FetchRequest, TensorTransportManager, TensorTransportMetadata
from ._runtime import _config, _hint_unreachable, runtime

# fetch_multiple_tensors starts a fetch without blocking Ray's thread: the
# first contact with a source's runtime (a handshake) is given this long,
# then finished inside wait_fetch_complete under Ray's timeout.
_START_WAIT = 0.05
# How often a wait for the source's runtime checks for abort_transport.
_ABORT_CHECK = 0.1


@dataclass
class RdtTransportMetadata(TensorTransportMetadata):
    """What receivers need: the tensors' shapes and dtypes (for Ray), the
    serialized rdt ref (plain bytes: Ray's borrowers keep the metadata for
    as long as they like, a live handle would pin the object), and the
    framework to receive into."""

    # Named, repr'd and pickled by reference as rdt.ray's, where it is
    # imported from (Ray pickles the metadata; the class pickles by name).
    __module__ = "rdt.ray"

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


# How many objects' last failed fetch a receiver remembers (abort_transport).
_FAILED_KEPT = 4096


def _ray_fetch_deadline() -> float:
    """Ray's fetch deadline in this process (seconds): how long its monitor
    lets a transfer run before it aborts it."""
    try:
        from ray._private import ray_constants
        return float(ray_constants.RDT_FETCH_FAIL_TIMEOUT_SECONDS)
    except Exception:  # an older Ray without it: only the failure rule holds
        return 0.0


class RdtFetchRequest(FetchRequest):
    """A fetch Ray started and will wait on. Dropping it (Ray does after a
    timeout, and never waits then) aborts what still runs and releases the
    borrow, without blocking."""

    __module__ = "rdt.ray"

    def __init__(self, obj_id: str, tensors: List[Any]) -> None:
        super().__init__(obj_id=obj_id, tensors=tensors)
        self.ref: Optional[rdt.ObjectRef] = None      # the borrow the fetch reads through
        self.fetch: Optional[rdt.Fetch] = None        # None until the source's runtime answered
        self.pending: Optional[Tuple[bytes, List[Any]]] = None  # (ref bytes, buffers) until then
        self.aborted = False
        self.failed = False  # it raised to Ray (an error, a timeout): Ray may abort the object after
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

    __module__ = "rdt.ray"

    def __init__(self) -> None:
        # Re-entrant: a dropped request's __del__ (see RdtFetchRequest.close)
        # takes it, and garbage collection may run that inside it.
        self._lock = threading.RLock()
        self._held: Dict[str, _Held] = {}  # Ray object id -> what this process put
        self._fetching: Dict[str, List[RdtFetchRequest]] = {}  # Ray object id -> fetches in flight here
        # Ray object id -> when a fetch of it here last failed (monotonic):
        # an abort Ray sends afterwards is for that fetch (abort_transport).
        self._failed_at: Dict[str, float] = {}
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
            req.failed = True
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
        req.fetch = rt.get_start(ref, out=outs)
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
            req.failed = True
            raise  # Ray drops the request, which aborts the fetch
        except BaseException:
            req.failed = True
            req.close()
            raise
        req.tensors = list(value) if isinstance(value, list) else [value]
        req.close()
        return req.tensors

    def abort_transport(self, obj_id: str, communicator_metadata: Any) -> None:
        # Ray calls this on the receiver (on another thread than the one in
        # recv) when a transfer failed or timed out: stop the fetches of the
        # object here; their waits then raise AbortedError. Ray's monitor
        # sends it a second or more after it saw the failure, so a fetch of
        # the same object that started after one here failed (a retry), and
        # is younger than Ray's fetch deadline, is not the one it means.
        with self._lock:
            reqs = list(self._fetching.get(obj_id, ()))
            failed = self._failed_at.get(obj_id)
        now, deadline = time.monotonic(), _ray_fetch_deadline()
        for req in reqs:
            if failed is not None and req.started > failed and now - req.started < deadline:
                continue
            req.aborted = True
            f = req.fetch
            if f is not None:
                f.abort()

    def _forget(self, req: RdtFetchRequest) -> None:
        now = time.monotonic()
        took = now - req.started
        with self._lock:
            if req.failed:
                if len(self._failed_at) >= _FAILED_KEPT and req.obj_id not in self._failed_at:
                    self._failed_at.pop(next(iter(self._failed_at)))  # the oldest
                self._failed_at[req.obj_id] = now
            reqs = self._fetching.get(req.obj_id)
            if reqs is not None:
                # By identity: Ray's FetchRequest is a dataclass, so two
                # fetches of one object (no tensors yet) compare equal.
                at = next((i for i, r in enumerate(reqs) if r is req), None)
                if at is None:
                    return  # forgotten already
                del reqs[at]
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
