"""A transport written for Ray, against Ray's own interface: it imports
nothing from rdt. The tests register it with rdt unchanged (they skip when
Ray is not installed)."""

import os
import tempfile
from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
from ray.experimental import CommunicatorMetadata, TensorTransportManager, TensorTransportMetadata


@dataclass
class FileMeta(TensorTransportMetadata):
    path: Optional[str] = None
    sizes: Optional[List[int]] = None


class FileTransport(TensorTransportManager):
    """One-sided: the source writes an object to a file at put; receivers
    read it; garbage_collect deletes it. Relies on Ray's defaults for
    fetch_multiple_tensors and wait_fetch_complete."""

    def tensor_transport_backend(self) -> str:
        return "FILE"

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return False

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> TensorTransportMetadata:
        fd, path = tempfile.mkstemp(prefix=f"ray-file-{obj_id[:8]}-")
        sizes = []
        with os.fdopen(fd, "wb") as f:
            for t in rdt_object:
                b = np.ascontiguousarray(t).tobytes()
                f.write(b)
                sizes.append(len(b))
        return FileMeta(tensor_meta=[(t.shape, t.dtype) for t in rdt_object], tensor_device="cpu", path=path,
                        sizes=sizes)

    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        out = []
        with open(tensor_transport_metadata.path, "rb") as f:
            for (shape, dtype), size in zip(tensor_transport_metadata.tensor_meta, tensor_transport_metadata.sizes):
                out.append(np.frombuffer(f.read(size), dtype=dtype).reshape(shape))
        return out  # not the target buffers: the caller copies them in

    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata):
        raise NotImplementedError

    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata, tensors: List[Any]):
        os.unlink(tensor_transport_meta.path)

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata):
        pass
