"""Transports written against Ray's TensorTransportManager interface, and
odd tensor producers, used by the tests (also from spawned processes, so
everything here is importable by name)."""

import ctypes
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any, List, Optional

import numpy as np

import rdt


class DLPackOnly:
    """A producer seen only through __dlpack__ (the generic DLPack path)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None, max_version=None, **kw):
        if max_version is None:
            return self._a.__dlpack__()
        return self._a.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class ArrayInterfaceOnly:
    """A producer seen only through __array_interface__."""

    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


def _bytes(t):
    """A flat uint8 numpy view of a host tensor (numpy or torch)."""
    if not isinstance(t, np.ndarray):
        t = t.view(-1).view(__import__("torch").uint8).numpy()
    return t.reshape(-1).view(np.uint8)


# ---- a one-sided transport: shared memory ------------------------------------

@dataclass
class ShmMeta(rdt.TensorTransportMetadata):
    segment: Optional[str] = None
    offsets: Optional[List[int]] = None


class OneSided(rdt.TensorTransportManager):
    """What the one-sided test transports share: the receiver (or the
    writer) moves the bytes alone, so the source never sends, and nothing
    needs aborting or per-transfer metadata."""

    @staticmethod
    def is_one_sided():
        return True

    @staticmethod
    def can_abort_transport():
        return False

    def actor_has_tensor_transport(self, actor):
        return True

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        return rdt.CommunicatorMetadata()

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise rdt.UnsupportedError(f"{self.tensor_transport_backend()} is one-sided: its sources never send")

    def abort_transport(self, obj_id, communicator_metadata):
        pass


class PyShm(OneSided):
    """One-sided: the source copies an object into a named shared-memory
    segment at put; receivers attach and copy out; GC unlinks it."""

    def __init__(self):
        self.segments = {}
        self.lock = threading.Lock()

    def tensor_transport_backend(self):
        return "pyshm"

    def extract_tensor_transport_metadata(self, obj_id, gpu_object):
        total = sum(_bytes(t).nbytes for t in gpu_object)
        seg = shared_memory.SharedMemory(create=True, size=max(total, 1))
        offsets, off = [], 0
        for t in gpu_object:
            b = _bytes(t)
            seg.buf[off:off + b.nbytes] = b
            offsets.append(off)
            off += b.nbytes
        with self.lock:
            self.segments[obj_id] = seg
        return ShmMeta(tensor_meta=[(tuple(t.shape), t.dtype) for t in gpu_object], tensor_device="cpu",
                       segment=seg.name, offsets=offsets)

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        seg = shared_memory.SharedMemory(name=tensor_transport_metadata.segment)
        try:
            for t, off in zip(target_buffers, tensor_transport_metadata.offsets):
                b = _bytes(t)
                b[:] = np.frombuffer(seg.buf, dtype=np.uint8, count=b.nbytes, offset=off)
        finally:
            seg.close()
        return target_buffers

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        with self.lock:
            seg = self.segments.pop(obj_id, None)
        if seg is not None:
            seg.close()
            seg.unlink()


# ---- a one-sided transport that writes: process_vm_readv/writev ------------

class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
for _fn in ("process_vm_readv", "process_vm_writev"):
    getattr(_libc, _fn).argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                    ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    getattr(_libc, _fn).restype = ctypes.c_ssize_t


def _address(t):
    return _bytes(t).__array_interface__["data"][0]


@dataclass
class VmMeta(rdt.TensorTransportMetadata):
    pid: int = 0
    regions: Optional[List[Any]] = None  # (address, nbytes) per tensor


class PyVm(OneSided):
    """One-sided, and it writes (rdt's addition to the interface): the
    source (or the owner of an exposed object) publishes its pid and the
    tensors' addresses; a receiver reads them with process_vm_readv, a
    writer writes them with process_vm_writev, and the other process runs
    nothing."""

    def tensor_transport_backend(self):
        return "pyvm"

    @staticmethod
    def can_write_transport():
        return True

    def extract_tensor_transport_metadata(self, obj_id, gpu_object):
        return VmMeta(tensor_meta=[(tuple(t.shape), t.dtype) for t in gpu_object], tensor_device="cpu",
                      pid=os.getpid(), regions=[(_address(t), _bytes(t).nbytes) for t in gpu_object])

    @staticmethod
    def _move(fn, pid, local, regions):
        if len(local) != len(regions):
            raise ValueError(f"{len(local)} tensors for {len(regions)} regions")
        for t, (addr, size) in zip(local, regions):
            b = _bytes(t)
            if b.nbytes != size:
                raise ValueError(f"a tensor of {b.nbytes} bytes for a region of {size}")
            if size == 0:
                continue
            liov, riov = _IoVec(_address(t), size), _IoVec(addr, size)
            n = fn(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
            if n != size:
                err = ctypes.get_errno()
                raise OSError(err, f"process {pid}: {os.strerror(err) if n < 0 else 'short copy'}")

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        m = tensor_transport_metadata
        self._move(_libc.process_vm_readv, m.pid, target_buffers, m.regions)
        return target_buffers

    def write_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, tensors):
        m = tensor_transport_metadata
        self._move(_libc.process_vm_writev, m.pid, tensors, m.regions)

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        pass


class FailingWrite(PyVm):
    def write_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, tensors):
        raise RuntimeError("the link went down")


class SlowWrite(PyVm):
    """Lands its bytes, then takes 2 s to return, and cannot abort: a
    write that outlives a shorter deadline."""

    def write_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, tensors):
        super().write_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata, tensors)
        time.sleep(2)


class SlowAbortableWrite(PyVm):
    """Lands its bytes, then returns once aborted (or after 2 s)."""

    def __init__(self):
        super().__init__()
        self.aborted = threading.Event()

    @staticmethod
    def can_abort_transport():
        return True

    def write_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, tensors):
        super().write_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata, tensors)
        self.aborted.wait(2)

    def abort_transport(self, obj_id, communicator_metadata):
        self.aborted.set()


class TwoSidedWrite(PyVm):
    @staticmethod
    def is_one_sided():
        return False


class SaysWritesWithoutWrite(PyShm):
    @staticmethod
    def can_write_transport():
        return True


# ---- a two-sided transport: a socket per transfer ----------------------------

@dataclass
class PortMeta(rdt.CommunicatorMetadata):
    port: int = 0


class PySocket(rdt.TensorTransportManager):
    """Two-sided: the destination listens on a fresh loopback port (the
    communicator metadata), the source connects and sends."""

    def __init__(self):
        self.listeners = {}
        self.lock = threading.Lock()

    def tensor_transport_backend(self):
        return "pysocket"

    @staticmethod
    def is_one_sided():
        return False

    @staticmethod
    def can_abort_transport():
        return True

    def actor_has_tensor_transport(self, actor):
        return True

    def extract_tensor_transport_metadata(self, obj_id, gpu_object):
        return rdt.TensorTransportMetadata(tensor_meta=[(tuple(t.shape), t.dtype) for t in gpu_object],
                                           tensor_device="cpu")

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with self.lock:
            self.listeners[port] = s
        return PortMeta(port=port)

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        with self.lock:
            s = self.listeners.pop(communicator_metadata.port)
        try:
            s.settimeout(20)
            c, _ = s.accept()
        finally:
            s.close()
        with c:
            for t in target_buffers:
                view = memoryview(_bytes(t))
                got = 0
                while got < len(view):
                    n = c.recv_into(view[got:])
                    if n == 0:
                        raise ConnectionError("the sender hung up")
                    got += n
        return target_buffers

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        with socket.create_connection(("127.0.0.1", communicator_metadata.port), timeout=20) as c:
            for t in tensors:
                c.sendall(_bytes(t))

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        pass

    def abort_transport(self, obj_id, communicator_metadata):
        with self.lock:
            s = self.listeners.pop(getattr(communicator_metadata, "port", 0), None)
        if s is not None:
            s.close()


class FailingRecv(PyShm):
    """Raises in recv: the message must reach the caller of get."""

    def recv_multiple_tensors(self, *a, **k):
        raise RuntimeError("the disk is on fire")


class FailingSend(PySocket):
    """Two-sided; the source's send raises."""

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise OSError("the cable was cut")


# ---- fetch/wait, aborts, timeouts ------------------------------------------------

@dataclass
class StuckRequest(rdt.FetchRequest):
    event: Any = None


class Stuck(PyShm):
    """Never finishes a fetch unless aborted (an asynchronous fetch/wait
    pair that can abort)."""

    def __init__(self):
        super().__init__()
        self.events = {}

    @staticmethod
    def can_abort_transport():
        return True

    def fetch_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                               target_buffers=None):
        ev = threading.Event()
        self.events[obj_id] = ev
        return StuckRequest(obj_id=obj_id, tensors=target_buffers, event=ev)

    def wait_fetch_complete(self, fetch_request, timeout=-1):
        if not fetch_request.event.wait(None if timeout < 0 else timeout):
            raise TimeoutError("still stuck")
        raise RuntimeError("aborted")

    def abort_transport(self, obj_id, communicator_metadata):
        ev = self.events.pop(obj_id, None)
        if ev is not None:
            ev.set()


class Slow(PyShm):
    """Takes SLOW seconds per receive and cannot abort."""

    SLOW = 1.5
    finished = []  # (time, first byte) per finished recv, in this process

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        time.sleep(self.SLOW)
        out = super().recv_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata,
                                            target_buffers)
        Slow.finished.append(time.monotonic())
        return out


class Barrier(PyShm):
    """Each recv waits until PARTIES receives run at once: only a get that
    starts every transfer before waiting on any can finish."""

    PARTIES = 4
    barrier = threading.Barrier(PARTIES, timeout=10)

    def recv_multiple_tensors(self, *a, **k):
        try:
            Barrier.barrier.wait()
        except threading.BrokenBarrierError:
            raise RuntimeError("the receives did not run concurrently") from None
        return super().recv_multiple_tensors(*a, **k)


@dataclass
class TrackedRequest(rdt.FetchRequest):
    """A request that cleans up in __del__, as Ray asks of subclasses."""

    log: Any = None

    def __del__(self):
        if self.log is not None:
            self.log.append(("cleaned", self.obj_id))


class AsyncShm(PyShm):
    """Overrides fetch and wait (receiving in a thread) and records how rdt
    drives it."""

    log = []

    def fetch_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                               target_buffers=None):
        req = TrackedRequest(obj_id=obj_id, tensors=target_buffers, log=AsyncShm.log)
        done = threading.Event()
        req.done = done

        def work():
            try:
                PyShm.recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                                            target_buffers)
            finally:
                done.set()
        threading.Thread(target=work, daemon=True).start()
        AsyncShm.log.append(("fetch", obj_id))
        return req

    def wait_fetch_complete(self, fetch_request, timeout=-1):
        AsyncShm.log.append(("wait", timeout))
        if not fetch_request.done.wait(None if timeout < 0 else timeout):
            raise TimeoutError("not yet")
        return fetch_request.tensors


class Recording(PyShm):
    """Records what each method received (in this process)."""

    calls = []

    def extract_tensor_transport_metadata(self, obj_id, gpu_object):
        Recording.calls.append(("extract", obj_id, list(gpu_object)))
        return super().extract_tensor_transport_metadata(obj_id, gpu_object)

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        Recording.calls.append(("communicator", src_actor, dst_actor, backend))
        return super().get_communicator_metadata(src_actor, dst_actor, backend)

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        Recording.calls.append(("recv", obj_id, list(target_buffers)))
        return super().recv_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata,
                                             target_buffers)

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        Recording.calls.append(("gc", obj_id, [weakref.ref(t) if isinstance(t, np.ndarray) else t
                                                for t in tensors]))
        super().garbage_collect(obj_id, tensor_transport_meta, tensors)


class ReturnsCopies(PyShm):
    """Returns new arrays instead of filling the targets (Ray allows it)."""

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        fresh = [np.empty_like(t) for t in target_buffers]
        return super().recv_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata, fresh)
