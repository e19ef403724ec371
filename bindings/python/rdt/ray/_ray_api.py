"""Ray's side of the interface, imported once: the package needs Ray 2.60
or later, and says so when it is missing."""

try:
    import ray
    import ray.experimental  # noqa: F401  (register_tensor_transport, set_target_for_ref)
    from ray.experimental.rdt import util as ray_rdt
    from ray.experimental.rdt.tensor_transport_manager import (CommunicatorMetadata, FetchRequest,
                                                               TensorTransportManager, TensorTransportMetadata)
except ImportError as e:
    raise ImportError("rdt.ray needs Ray 2.60 or later (pip install 'ray>=2.60'); rdt itself does not") from e

__all__ = ["ray", "ray_rdt", "CommunicatorMetadata", "FetchRequest", "TensorTransportManager",
           "TensorTransportMetadata"]
