"""The interface of custom transports: Ray's ``TensorTransportManager``,
method for method, so that a class written for Ray runs under rdt unchanged.

rdt drives it from its C transport vtable (see ``_adapter.py``):

====================================  ======================================
Ray method                            rdt vtable callback (who, when)
====================================  ======================================
extract_tensor_transport_metadata     extract_metadata (source, at put)
get_communicator_metadata             communicator_metadata (destination,
                                      once per transfer)
recv_multiple_tensors                 recv (destination, on an rdt thread)
fetch_multiple_tensors +              fetch + wait + release_request, when
wait_fetch_complete                   the class overrides either of them
send_multiple_tensors                 send (source, two-sided only)
garbage_collect                       garbage_collect (source, object freed)
abort_transport                       abort (either side)
is_one_sided / can_abort_transport    the vtable's flags
can_write_transport                   RDT_TRANSPORT_WRITES (rdt's addition)
write_multiple_tensors                write (writer, on an rdt thread; rdt's
                                      addition)
====================================  ======================================

Ray's interface has no writes. rdt adds two methods, both optional: a
one-sided transport whose ``can_write_transport()`` returns True writes into
objects other processes exposed with it (``rdt.expose``) through
``write_multiple_tensors``. A class written for Ray, which has neither,
registers as a transport that does not write.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ._errors import UnsupportedError


@dataclass
class CommunicatorMetadata:
    """Metadata of the communicator for one transfer (subclass it to carry
    what your transport needs, such as ranks or a channel)."""


@dataclass
class TensorTransportMetadata:
    """What receivers learn about an object's tensors: a (shape, dtype) pair
    per tensor, and the device they live on. Subclass it to add what your
    transport needs (memory keys, segment names...). It travels pickled
    inside every serialized reference."""

    tensor_meta: List[Tuple[Any, Any]]
    tensor_device: Optional[str] = None


@dataclass
class FetchRequest:
    """A pending or completed fetch. The default fetch stores the received
    tensors here after a synchronous receive. Subclasses that hold resources
    release them in ``__del__``, so that they go even if nobody waits: rdt
    drops its reference once the fetch is over."""

    obj_id: str
    tensors: List[Any]


@dataclass(frozen=True)
class Peer:
    """The other side of a transfer, where Ray passes an actor handle: the
    runtime's id and control-plane address."""

    runtime_id: str
    address: str


class TensorTransportManager(ABC):
    """Interface with which to implement custom tensor transports, as in Ray.

    Register a subclass with :func:`rdt.register_tensor_transport` in every
    process that puts or gets with it. rdt calls the methods on its own
    threads, possibly several at once.
    """

    @abstractmethod
    def tensor_transport_backend(self) -> str:
        """The name of the transport backend."""

    @staticmethod
    @abstractmethod
    def is_one_sided() -> bool:
        """True if the receiver alone moves the bytes (``send_multiple_tensors``
        is then never called); False if the source must send."""

    @staticmethod
    @abstractmethod
    def can_abort_transport() -> bool:
        """True if ``abort_transport`` reliably interrupts a transfer in
        progress, on either side, without leaving the other blocked."""

    @abstractmethod
    def actor_has_tensor_transport(self, actor: Any) -> bool:
        """Whether the peer has this transport available."""

    @abstractmethod
    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> TensorTransportMetadata:
        """Source, at put: describe the tensors for receivers (and, say,
        register their memory)."""

    @abstractmethod
    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        """The communicator metadata for one transfer from src to dst."""

    @abstractmethod
    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        """Destination: receive the object's tensors, into ``target_buffers``
        if possible, and return them."""

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorTransportMetadata,
                               communicator_metadata: CommunicatorMetadata,
                               target_buffers: Optional[List[Any]] = None) -> FetchRequest:
        """Start a fetch without waiting for it. By default this receives
        synchronously with ``recv_multiple_tensors`` and returns a request
        holding the result. Override it together with
        ``wait_fetch_complete`` for a truly asynchronous transport."""
        tensors = self.recv_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata,
                                             target_buffers)
        return FetchRequest(obj_id=obj_id, tensors=tensors)

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> List[Any]:
        """Wait for a fetch started by ``fetch_multiple_tensors`` and return
        its tensors. ``timeout`` is in seconds: -1 waits forever, 0 returns
        at once if not ready. Raise ``TimeoutError`` when it passes. By
        default the request already holds the tensors."""
        return fetch_request.tensors

    @staticmethod
    def can_write_transport() -> bool:
        """rdt's addition (Ray's interface has no writes): True if
        ``write_multiple_tensors`` writes into objects that other processes
        exposed with this transport. Requires ``is_one_sided()``: the owner
        runs nothing of the transport during a write. Default: False."""
        return False

    def write_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorTransportMetadata,
                               communicator_metadata: CommunicatorMetadata, tensors: List[Any]) -> None:
        """rdt's addition, called when ``can_write_transport()``: on the
        writer, write ``tensors`` (host views, only to be read) into the
        object ``obj_id`` that its owner exposed, tensor i into exposed
        tensor i (shapes and dtypes already checked).
        ``tensor_transport_metadata`` is what
        ``extract_tensor_transport_metadata`` made for the exposed tensors
        on the owner; ``communicator_metadata`` what
        ``get_communicator_metadata`` made here. Return when every byte is in
        place. Raise once no byte of the write can land any more: the writer
        gets the error, and the owner's notice says the write failed. After
        ``abort_transport`` (when ``can_abort_transport()``), return soon.
        The default, for transports that do not write, refuses: rdt never
        calls it for them."""
        raise UnsupportedError(f"{type(self).__name__} does not write: its can_write_transport() is False")

    @abstractmethod
    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata) -> None:
        """Source of a two-sided transport: send the tensors to the
        destination. One-sided transports may raise NotImplementedError."""

    @abstractmethod
    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata,
                        tensors: List[Any]) -> None:
        """Source: the object is out of scope everywhere; release what the
        transport holds for it."""

    @abstractmethod
    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        """Either side: interrupt a transfer in progress (called only if
        ``can_abort_transport()``)."""
