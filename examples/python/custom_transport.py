"""A transport written against Ray's TensorTransportManager interface:
the tensors are copied into a named shared-memory segment at put and read
from it by receivers. Register it under the same name in every process.

    python examples/python/custom_transport.py
"""

import multiprocessing as mp
import pickle
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import List, Optional

import numpy as np

import rdt


@dataclass
class SegmentMeta(rdt.TensorTransportMetadata):
    segment: Optional[str] = None
    offsets: Optional[List[int]] = None


class SharedMemoryTransport(rdt.TensorTransportManager):
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

    def extract_tensor_transport_metadata(self, obj_id, rdt_object):
        seg = shared_memory.SharedMemory(create=True, size=max(1, sum(t.nbytes for t in rdt_object)))
        offsets, off = [], 0
        for t in rdt_object:
            seg.buf[off:off + t.nbytes] = t.reshape(-1).view(np.uint8)
            offsets.append(off)
            off += t.nbytes
        self.segments[obj_id] = seg
        return SegmentMeta([(t.shape, t.dtype) for t in rdt_object], "cpu", seg.name, offsets)

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        return rdt.CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        seg = shared_memory.SharedMemory(name=tensor_transport_metadata.segment)
        for t, off in zip(target_buffers, tensor_transport_metadata.offsets):
            t.reshape(-1).view(np.uint8)[:] = seg.buf[off:off + t.nbytes]
        seg.close()
        return target_buffers

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("one-sided: the receiver reads alone")

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        seg = self.segments.pop(obj_id)
        seg.close()
        seg.unlink()

    def abort_transport(self, obj_id, communicator_metadata):
        pass


def producer(conn):
    rdt.register_tensor_transport("pyshm", ["cpu"], SharedMemoryTransport)
    ref = rdt.put(np.arange(10, dtype=np.int64), transport="pyshm")
    conn.send(pickle.dumps(ref))
    conn.recv()


def main():
    rdt.register_tensor_transport("pyshm", ["cpu"], SharedMemoryTransport)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=producer, args=(child,))
    p.start()
    ref = pickle.loads(parent.recv())
    print("over", ref.transport, ":", rdt.get(ref))
    parent.send("done")
    p.join()


if __name__ == "__main__":
    main()
