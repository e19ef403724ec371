"""Transports written as Ray TensorTransportManager subclasses, used from
spawned processes."""

import socket
import threading
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any, List, Optional

import numpy as np

import rdt


class DLPackOnly:
    """A producer seen only through __dlpack__ (the generic path)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@dataclass
class ShmMeta(rdt.TensorTransportMetadata):
    segment: Optional[str] = None
    offsets: Optional[List[int]] = None


class PyShm(rdt.TensorTransportManager):
    """One-sided: the source copies an object into a named shared-memory
    segment at put; receivers attach and copy out; GC unlinks it."""

    def __init__(self):
        self.segments = {}

    def tensor_transport_backend(self):
        return "pyshm"

    @staticmethod
    def is_one_sided():
        return True

    @staticmethod
    def can_abort_transport():
        return False

    def actor_has_tensor_transport(self, actor):
        return True

    def extract_tensor_transport_metadata(self, obj_id, gpu_object):
        total = sum(t.nbytes for t in gpu_object)
        seg = shared_memory.SharedMemory(create=True, size=max(total, 1))
        offsets, off = [], 0
        for t in gpu_object:
            seg.buf[off:off + t.nbytes] = t.reshape(-1).view(np.uint8)
            offsets.append(off)
            off += t.nbytes
        self.segments[obj_id] = seg
        return ShmMeta(tensor_meta=[(t.shape, t.dtype) for t in gpu_object], tensor_device="cpu",
                       segment=seg.name, offsets=offsets)

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        return rdt.CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        seg = shared_memory.SharedMemory(name=tensor_transport_metadata.segment)
        try:
            for t, off in zip(target_buffers, tensor_transport_metadata.offsets):
                t.reshape(-1).view(np.uint8)[:] = seg.buf[off:off + t.nbytes]
        finally:
            seg.close()
        return target_buffers

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("one-sided")

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        seg = self.segments.pop(obj_id, None)
        if seg is not None:
            seg.close()
            seg.unlink()

    def abort_transport(self, obj_id, communicator_metadata):
        pass


@dataclass
class PortMeta(rdt.CommunicatorMetadata):
    port: int = 0


class PySocket(rdt.TensorTransportManager):
    """Two-sided: the destination listens, the source connects and sends."""

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
        return rdt.TensorTransportMetadata(tensor_meta=[(t.shape, t.dtype) for t in gpu_object],
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
        s.settimeout(20)
        c, _ = s.accept()
        with c:
            for t in target_buffers:
                view = memoryview(t.reshape(-1).view(np.uint8))
                got = 0
                while got < len(view):
                    n = c.recv_into(view[got:])
                    if n == 0:
                        raise ConnectionError("the sender hung up")
                    got += n
        s.close()
        return target_buffers

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        with socket.create_connection(("127.0.0.1", communicator_metadata.port), timeout=20) as c:
            for t in tensors:
                c.sendall(t.reshape(-1).view(np.uint8))

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        pass

    def abort_transport(self, obj_id, communicator_metadata):
        with self.lock:
            s = self.listeners.pop(getattr(communicator_metadata, "port", 0), None)
        if s is not None:
            s.close()


class Failing(PyShm):
    """Raises in recv: the message must reach the caller of get."""

    def recv_multiple_tensors(self, *a, **k):
        raise RuntimeError("the disk is on fire")


class Stuck(PyShm):
    """Never finishes a fetch unless aborted (async fetch/wait pair)."""

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


@dataclass
class StuckRequest(rdt.FetchRequest):
    event: Any = None
