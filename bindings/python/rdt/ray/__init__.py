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

# The package's modules, in import order: _ray_api (Ray's interface, or the
# error saying Ray is missing), _config (what runtime_env tells workers),
# _runtime (the process's runtime for Ray), _buffers (what receives land
# in), _transport (the TensorTransportManager), _register (register, setup,
# runtime_env). Their names are imported here, where they always were.

from .._receive import ReceiveCache as _ReceiveCache
from ._ray_api import CommunicatorMetadata, FetchRequest, TensorTransportManager, TensorTransportMetadata, ray
from ._ray_api import ray_rdt as _ray_rdt
from ._config import (_CACHE_ENV, _CONFIG_ENV, _DEFAULT_CACHE_BYTES, _DEFAULT_CONFIG, _NUMPY_WARNING, _SETUP_HOOK,
                      _TOKEN_ENV, _cache_limit, _data_type, _decode_config, _devices_of, _encode_config,
                      _framework_of)
from ._runtime import _PROCESS, _Process, _config, _hint_unreachable, _node_id, _ray_session, runtime
from ._buffers import _HUGE_PAGE, _HUGE_PAGE_MIN, _empty, _host_buffer, _receive_device
from ._transport import (_ABORT_CHECK, _START_WAIT, RdtFetchRequest, RdtTensorTransport, RdtTransportMetadata,
                         _describe, _Held)
from ._register import _register_with_ray, register, runtime_env, setup

__all__ = ["register", "setup", "runtime_env", "runtime", "RdtTensorTransport", "RdtTransportMetadata"]
