"""The trainer side of "librdt": vLLM's TrainerWeightTransferEngine, and a
client for an offline ``vllm.LLM`` of the same process.

Each step (``send_weights``) the sender drives start -> update(s) ->
finish through a ``VLLMWeightSyncClient``. Every bucket of whole layers,
bounded in bytes, is put into rdt without a copy (the parameters
themselves where they are contiguous) and announced to the workers as
serialized refs; when the update call returns the trainer releases its ref
and waits until every worker released its borrow (``wait_tensor_freed``),
so no transfer is in flight when the next bucket starts or the step
returns, and the optimizer may change the weights then.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch._utils import _flatten_dense_tensors as flatten_dense_tensors
from vllm.distributed.weight_transfer.base import (TrainerWeightTransferEngine, VLLMWeightSyncClient,
                                                   WeightSource, WeightTransferUpdatePayload, layerwise_groups)

import rdt

from ._wire import LibrdtTrainerInitInfo, WeightSyncError, collector_paused, encode_ref

OBJECT_BYTES = 32 << 20
"""A bucket is put as objects of whole layers of about this many bytes:
a worker on this host maps (views) them one after another, processing the
layers of one while the trainer stages the next."""

PACK_BYTES = 64 << 10
"""Tensors of at most this many bytes travel packed, one tensor per dtype
and bucket: a model's norms and biases, and models of tens of thousands of
small tensors, cost a copy of their bytes rather than rdt's and vLLM's
work per tensor."""


class LLMClient:
    """The four weight-sync calls of an offline ``vllm.LLM`` in this
    process, as a ``VLLMWeightSyncClient`` (the LLM's own methods take
    request dicts)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: WeightTransferUpdatePayload) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self.llm.finish_weight_update(weight_version)


class LibrdtTrainerWeightTransferEngine(TrainerWeightTransferEngine[LibrdtTrainerInitInfo]):
    """vLLM's trainer-side engine for "librdt". Made by
    ``WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=r), client=..., source=...)``
    on every trainer rank; rank 0 talks to vLLM. Ranks that each hold part
    of the model (``WeightSource.held_names``) put what they hold and rank 0
    announces every rank's refs (over the default torch.distributed group).
    """

    init_info_cls = LibrdtTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, is_sender: bool,
                 info: LibrdtTrainerInitInfo, runtime: rdt.Runtime) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.info = info
        self.runtime = runtime
        self.version = 0
        # From the metadata: name -> bucket, name -> object in its bucket,
        # and the buckets of more than one object.
        self._buckets: Optional[Dict[str, int]] = None
        self._objects: Dict[str, int] = {}
        self._split: Set[int] = set()

    @classmethod
    def trainer_init(cls, init_info: LibrdtTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: Optional[WeightSource] = None) -> "LibrdtTrainerWeightTransferEngine":
        if source is None:
            raise ValueError("the librdt trainer sends a WeightSource's weights every step: pass source=")
        runtime = rdt.Runtime(name=f"vllm-trainer-{init_info.rank}", listen_tcp=init_info.listen_tcp,
                              advertise_host=init_info.advertise_host, auth_token=init_info.auth_token)
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, info=init_info, runtime=runtime)
        if engine.is_sender:
            try:
                client.init_weight_transfer_engine(init_info.worker_init_info())
            except Exception as e:
                runtime.close()
                raise WeightSyncError(f"vLLM refused the librdt init info: {e}") from e
        return engine

    def send_weights(self) -> int:
        """One step: every weight of the source to every worker, as version
        ``self.version + 1``, which it returns. Raises WeightSyncError (the
        cause chained) when the step fails; vLLM's session is then closed
        without the version, and the next step starts afresh."""
        assert self.source is not None
        version = self.version + 1
        deadline = time.monotonic() + self.info.timeout_s
        with collector_paused():
            try:
                self._step(version, deadline)
            except WeightSyncError:
                raise
            except Exception as e:
                raise WeightSyncError(f"weight sync of version {version} failed: {type(e).__name__}: {e}",
                                      getattr(e, "status", None)) from e
        self.version = version
        return version

    def _step(self, version: int, deadline: float) -> None:
        """start -> update(s) -> finish. A failure once vLLM's session is
        open abandons it, so that the next step can start one."""
        assert self.source is not None
        if self.is_sender:
            self.client.start_weight_update()
        try:
            for bucket in self._bucket_stream(self.source):
                self._send(version, bucket, deadline)
        except BaseException:
            if self.is_sender:
                self._abandon(version)
            raise
        if self.is_sender:
            self.client.finish_weight_update(weight_version=str(version))

    def shutdown(self) -> None:
        self.runtime.close()

    # ---- one step --------------------------------------------------------------------

    def _bucket_stream(self, source: WeightSource) -> Iterator[List[Tuple[str, torch.Tensor]]]:
        """The source's tensors, batched into buckets of whole groups whose
        bounds come from the metadata, so that every rank cuts them alike
        (a rank holding none of a bucket sends an empty one). Iterating the
        source itself, not its per-group batches, keeps the cost per tensor
        to a dictionary lookup."""
        if self._buckets is None:
            placed = _bucket_of(source, self.info.bucket_bytes, OBJECT_BYTES)
            self._buckets = {name: b for name, (b, _) in placed.items()}
            self._objects = {name: o for name, (_, o) in placed.items()}
            self._split = {b for b, o in placed.values() if o > 0}
        bucket_of = self._buckets
        last = max(bucket_of.values(), default=-1)
        pending: List[Tuple[str, torch.Tensor]] = []
        current = 0
        for name, tensor in source:
            b = bucket_of.get(name)
            if b is None:
                raise ValueError(f"the WeightSource yielded {name!r}, which its metadata() does not name")
            while current < b:
                yield pending
                pending, current = [], current + 1
            if tensor is not None:  # a name another rank holds
                pending.append((name, tensor))
        while current <= last:
            yield pending
            pending, current = [], current + 1

    def _send(self, version: int, bucket: List[Tuple[str, torch.Tensor]], deadline: float) -> None:
        """Puts the bucket as objects of whole layers, announces them in
        one update, then waits until every worker let each go."""
        assert self._buckets is not None
        parts: Dict[int, List[Tuple[str, torch.Tensor]]] = {}
        if bucket and self._buckets[bucket[0][0]] in self._split:
            for name, t in bucket:
                parts.setdefault(self._objects[name], []).append((name, t))
        elif bucket:
            parts[0] = bucket
        mine: Tuple[List[str], List[List[str]], List[Any]] = ([], [], [])
        put: List[Tuple[rdt.ObjectRef, torch.Tensor]] = []
        try:
            for _, members in sorted(parts.items()):
                ref, first, names, packs = self._put(members)
                put.append((ref, first))
                mine[0].append(encode_ref(ref.serialize())), mine[1].append(names), mine[2].append(packs)
            refs, names, all_packs = _gather(mine)
            if self.is_sender and refs:
                self.client.update_weights({"version": version, "refs": refs, "names": names,
                                            "packs": all_packs})
        finally:
            for ref, _ in put:
                ref.release(revoke_leases=True)
            for _, first in put:
                self._wait_returned(first, deadline)

    def _put(self, members: List[Tuple[str, torch.Tensor]]) -> Tuple[rdt.ObjectRef, torch.Tensor, List[str], Any]:
        """One object: the members of at most PACK_BYTES packed into one
        tensor per dtype at its end, the others as they are. Returns the
        ref, a tensor of it (to wait on), the names of its own tensors and
        the packs."""
        own_names: List[str] = []
        tensors: List[torch.Tensor] = []
        small: Dict[Tuple[torch.dtype, torch.device], List[Tuple[str, torch.Tensor]]] = {}
        for name, t in members:
            if t.nbytes <= PACK_BYTES:
                small.setdefault((t.dtype, t.device), []).append((name, t))
            else:
                own_names.append(name)
                tensors.append(t.detach() if t.is_contiguous() else t.detach().contiguous())
        packs = []
        for (dtype, _), group in small.items():
            with torch.no_grad():  # the members back to back, one tensor (a C++ loop, no Python per tensor)
                tensors.append(flatten_dense_tensors([t for _, t in group]))
            packs.append({"dtype": str(dtype)[6:], "names": [n for n, _ in group],
                          "shapes": [list(t.shape) for _, t in group]})
        return self.runtime.put(tensors), tensors[0], own_names, packs

    def _wait_returned(self, tensor: torch.Tensor, deadline: float) -> None:
        """Blocks until no worker holds the bucket any more: each releases
        its borrow once its pull ended, and a worker that died or fell
        silent loses it when its connection does."""
        try:
            self.runtime.wait_tensor_freed(tensor, timeout=max(deadline - time.monotonic(), 0.001))
        except rdt.GetTimeoutError as e:
            raise WeightSyncError(f"a worker still holds a bucket at the step's deadline "
                                  f"({self.info.timeout_s} s): do not change these weights yet", e.status) from e

    def _abandon(self, version: int) -> None:
        """Closes vLLM's open session without the version: an update the
        workers refuse on purpose ends it (vLLM has no abort call)."""
        try:
            self.client.update_weights({"version": version, "refs": [], "names": [], "abandon": True})
        except Exception:
            pass  # refused, as it must be


def _bucket_of(source: WeightSource, bound: int, object_bound: int) -> Dict[str, Tuple[int, int]]:
    """Each name's bucket and object in it: whole metadata groups, in
    order, a new bucket once the bytes reach ``bound``, a new object once
    they reach ``object_bound``."""
    sizes = {m.name: _nbytes(m.dtype, m.shape) for m in source.metadata()}
    out: Dict[str, Tuple[int, int]] = {}
    bucket, filled, part, part_filled = 0, 0, 0, 0
    for group in layerwise_groups(list(sizes)):
        n = sum(sizes[name] for name in group)
        if filled and filled + n > bound:
            bucket, filled, part, part_filled = bucket + 1, 0, 0, 0
        elif part_filled and part_filled + n > object_bound:
            part, part_filled = part + 1, 0
        for name in group:
            out[name] = (bucket, part)
        filled += n
        part_filled += n
    return out


def _nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= d
    return n


def _gather(mine: Tuple[List[str], List[List[str]], List[Any]]) -> Tuple[List[str], List[List[str]], List[Any]]:
    """Every trainer rank's refs, names and packs, on every rank (one rank:
    its own)."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return ([r for rank in everyone for r in rank[0]], [n for rank in everyone for n in rank[1]],
            [p for rank in everyone for p in rank[2]])
