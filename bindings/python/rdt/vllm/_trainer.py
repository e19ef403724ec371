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
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from vllm.distributed.weight_transfer.base import (TrainerWeightTransferEngine, VLLMWeightSyncClient,
                                                   WeightSource, WeightTransferUpdatePayload, layerwise_groups)

import rdt

from ._wire import LibrdtTrainerInitInfo, WeightSyncError, encode_ref


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
        self._buckets: Optional[List[int]] = None  # group index -> bucket index, from metadata

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
        started = False
        try:
            if self.is_sender:
                self.client.start_weight_update()
                started = True
            for bucket in self._bucket_stream(self.source):
                self._send(version, bucket, deadline)
            if self.is_sender:
                started = False
                self.client.finish_weight_update(weight_version=str(version))
        except BaseException as e:
            if started:
                self._abandon(version)
            if isinstance(e, WeightSyncError) or not isinstance(e, Exception):
                raise
            raise WeightSyncError(f"weight sync of version {version} failed: {type(e).__name__}: {e}",
                                  getattr(e, "status", None)) from e
        self.version = version
        return version

    def shutdown(self) -> None:
        self.runtime.close()

    # ---- one step --------------------------------------------------------------------

    def _bucket_stream(self, source: WeightSource) -> Iterator[List[Tuple[str, torch.Tensor]]]:
        """The source's held groups, batched into buckets of whole groups
        whose bounds come from the metadata, so that every rank cuts them
        alike (a rank holding none of a bucket sends an empty one)."""
        if self._buckets is None:
            self._buckets = _bucket_bounds(source, self.info.bucket_bytes)
        groups = layerwise_groups([m.name for m in source.metadata()])
        first = {g[0]: i for i, g in enumerate(groups) if g}
        pending: List[Tuple[str, torch.Tensor]] = []
        current = 0
        for names, tensors in source.iter_groups():
            b = self._buckets[first[names[0]]]
            while current < b:
                yield pending
                pending, current = [], current + 1
            pending.extend((n, t) for n, t in zip(names, tensors) if t is not None)
        while current <= max(self._buckets, default=-1):
            yield pending
            pending, current = [], current + 1

    def _send(self, version: int, bucket: List[Tuple[str, torch.Tensor]], deadline: float) -> None:
        tensors = [t.detach().contiguous() for _, t in bucket]
        ref = self.runtime.put(tensors) if tensors else None
        try:
            mine = ([encode_ref(ref.serialize())], [[n for n, _ in bucket]]) if ref is not None else ([], [])
            refs, names = _gather(mine)
            if self.is_sender and refs:
                self.client.update_weights({"version": version, "refs": refs, "names": names})
        finally:
            if ref is not None:
                ref.release(revoke_leases=True)
                self._wait_returned(tensors[0], deadline)

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


def _bucket_bounds(source: WeightSource, bound: int) -> List[int]:
    """Each metadata group's bucket: whole groups, in order, a new bucket
    once the bytes reach ``bound``."""
    sizes = {m.name: _nbytes(m.dtype, m.shape) for m in source.metadata()}
    out: List[int] = []
    bucket, filled = 0, 0
    for group in layerwise_groups(list(sizes)):
        n = sum(sizes[name] for name in group)
        if filled and filled + n > bound:
            bucket, filled = bucket + 1, 0
        out.append(bucket)
        filled += n
    return out


def _nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= d
    return n


def _gather(mine: Tuple[List[str], List[List[str]]]) -> Tuple[List[str], List[List[str]]]:
    """Every trainer rank's refs and names, on every rank (one rank: its own)."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    refs = [r for rank_refs, _ in everyone for r in rank_refs]
    names = [n for _, rank_names in everyone for n in rank_names]
    return refs, names
