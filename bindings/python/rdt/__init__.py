"""rdt: direct tensor transport between processes and hosts.

    ref = rdt.put({"w": weights})          # in the producer; nothing is copied
    pickle.dumps(ref)                      # hand the ref to another process
    value = rdt.get(ref)                   # in the consumer: the bytes move now
"""

from ._errors import (ABIMismatchError, AbortedError, AlreadyExistsError, ClosedError, CorruptError,
                      ForkedError, GetTimeoutError, InternalError, InvalidArgumentError, NoMemoryError,
                      NotFoundError, PeerUnavailableError, PermissionDeniedError, RdtError, TransportError,
                      UnsupportedError, UserError)
from .runtime import (ObjectRef, Runtime, default_runtime, get, put, register_tensor_transport,
                      wait_tensor_freed)
from .transport import (CommunicatorMetadata, FetchRequest, Peer, TensorTransportManager,
                        TensorTransportMetadata)

__version__ = "0.1.0"

__all__ = [
    "Runtime", "ObjectRef", "default_runtime", "put", "get", "wait_tensor_freed", "register_tensor_transport",
    "TensorTransportManager", "TensorTransportMetadata", "CommunicatorMetadata", "FetchRequest", "Peer",
    "RdtError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "GetTimeoutError",
    "AbortedError", "PeerUnavailableError", "CorruptError", "UnsupportedError", "PermissionDeniedError",
    "TransportError", "NoMemoryError", "ABIMismatchError", "ForkedError", "ClosedError", "InternalError",
    "UserError",
]
