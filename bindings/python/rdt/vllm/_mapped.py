"""Replaying a plan from views of a same-host trainer's objects: rdt maps
the owner's one staged copy into every worker on the host (the shm
transport's sealed segment, see docs/python.md, "One copy for many
readers"), so no worker copies the bytes its layers' processing only
reads, and the owner's staging (its copy into the segment) runs on the
trainer's CPUs, not the worker's.

A layer vLLM processes after loading (every linear layer on the CPU build)
is handed checkpoint-layout weights. Where one of them lies in the mapping
whole and in order (a fused qkv's q, k and v back to back, as a trainer
puts a layer's tensors), the layer is processed straight from the mapping;
other weights, and parameters vLLM uses as loaded, are copied from it. A
layer is read from the mapping only where the update lands every one of
its staged weights and no other layout lands only some of them (that one
would process the layer from staged weights a view left as they were);
other layers are copied into their staged weights, as a fetch would.

The refs of an update are viewed in order, the next one opening (the
trainer staging it) while the layers whose last bytes came in the current
one are processed.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

import rdt

from .. import _view
from ._plan import Plan, flat, process_layer

# Where a piece lies in a view: (ref, tensor where the ref's tensors are
# not in one mapping, else -1), and its first byte there.
Place = Tuple[Tuple[int, int], int]


class Mapped:
    """An update's refs, viewed one after another: each one's bytes as flat
    uint8 tensors over its mapping (one per ref, or one per tensor where
    they are not in one mapping). Holds the views until closed."""

    def __init__(self, runtime: rdt.Runtime, refs: List[rdt.ObjectRef], deadline: float,
                 pool: ThreadPoolExecutor) -> None:
        self._runtime, self._refs, self._deadline, self._pool = runtime, refs, deadline, pool
        self._opened: List[Any] = [None] * len(refs)
        self._whole: List[Optional[torch.Tensor]] = [None] * len(refs)
        self._flats: List[Dict[int, torch.Tensor]] = [{} for _ in refs]
        self._next: Optional[Tuple[int, "Future[Any]"]] = None
        self.nbytes = 0  # of the views opened

    def _open(self, r: int) -> Any:
        return _view._open(self._runtime, self._refs[r], True, None, self._deadline)  # private: copy-on-write

    def open(self, r: int) -> None:
        """Waits for ref r's view (opening it now unless it is on its way),
        then starts opening ref r + 1. UnsupportedError: r cannot be viewed
        from here (another host, device memory)."""
        ahead, self._next = self._next, None
        o = ahead[1].result() if ahead is not None and ahead[0] == r else self._open(r)
        self._opened[r] = o
        self.nbytes += sum(o.sizes)
        self._whole[r] = None if o.whole is None else torch.from_numpy(o.whole)
        if r + 1 < len(self._refs):
            self._next = (r + 1, self._pool.submit(self._open, r + 1))

    def place(self, r: int, j: int, byte: int) -> Place:
        if self._whole[r] is not None:
            return (r, -1), self._opened[r].offsets[j] + byte
        return (r, j), byte

    def bytes(self, at: Place, n: int) -> torch.Tensor:
        (r, j), first = at
        whole = self._whole[r]
        if whole is None:
            whole = self._flats[r].get(j)
            if whole is None:
                whole = self._flats[r][j] = torch.from_numpy(self._opened[r].flat(j))
        return whole[first:first + n]

    def close(self) -> None:
        """Lets the views go (each is released with the last tensor over
        it), after the one on its way, if any, arrived or failed."""
        ahead, self._next = self._next, None
        if ahead is not None:
            ahead[1].exception()
        self._opened, self._whole, self._flats = [], [], []


def _whole(plan: Plan) -> Set[int]:
    """The staged layers every staged weight of which this plan lands in."""
    landed = {id(target) for pieces in plan.landing or () for _, _, target, _ in pieces}
    return {m for m, (_, staged) in plan.staged.items() if all(id(p) in landed for p in staged.values())}


def alone(plan: Plan, others: List[Plan]) -> Set[int]:
    """The layers plan may process from views: those it lands every staged
    weight of, which no other plan lands only some weights of."""
    partial: Set[int] = set()
    for other in others:
        partial |= set(other.staged) - _whole(other)
    return _whole(plan) - partial


def replay(plan: Plan, mapped: Mapped, alone: Callable[[int], bool], seconds: Dict[str, float],
           clock: Callable[[], float], digests: Optional[Dict[str, str]] = None) -> int:
    """Lands a learned plan's pieces from mapped, ref after ref: live
    targets, the ranges of the tensors it loads (into their receive
    buffers, for the caller to load) and the staged tensors of layers not
    ``alone`` (landed in by this plan only), by copies; each staged layer
    is processed once the ref holding its last piece was opened, the
    weights of a layer alone that lie whole and in order in the mapping
    read from it. Returns how many weights were read from the mapping.
    ``digests``, if given, gets the SHA-256 of the bytes each tensor
    brought (a pass over them), as the engine's digests() reports them."""
    owner: Dict[int, Tuple[int, str]] = {}  # id of a staged tensor -> (its layer, its name)
    for m, (_, staged) in plan.staged.items():
        for name, p in staged.items():
            owner[id(p)] = (m, name)
    by_ref: Dict[int, List[Tuple[int, int, int, torch.Tensor, int]]] = {}  # ref -> its pieces, as in landing
    last_ref: Dict[int, int] = {}  # staged layer -> the last ref it has a piece in
    loaded = set(plan.loaded)
    for k, whole in enumerate(plan.buffers):
        if k in loaded:
            landing = [(lo, hi - lo, whole, lo) for lo, hi in plan.ranges[k]]
        else:
            landing = plan.landing[k] if plan.landing is not None else []
        if landing:
            r = plan.sources[k][0]
            for source_offset, count, target, offset in landing:
                by_ref.setdefault(r, []).append((k, source_offset, count, target, offset))
                o = owner.get(id(target))
                if o is not None:
                    last_ref[o[0]] = max(last_ref.get(o[0], -1), r)
    after: Dict[int, List[int]] = {}
    for m, r in last_ref.items():
        after.setdefault(r, []).append(m)
    pieces: Dict[int, Dict[str, List[Tuple[int, int, Place]]]] = {}  # layer alone -> name -> (offset, count, place)
    read = 0
    for r in sorted(by_ref):
        t0 = clock()
        mapped.open(r)
        t1 = clock()
        seconds["fetch"] += t1 - t0
        with torch.no_grad():
            for k, source_offset, count, target, offset in by_ref[r]:
                _, j, first = plan.sources[k]
                size = plan.buffers[k].element_size()
                at = mapped.place(r, j, (first + source_offset) * size)
                o = owner.get(id(target))
                if o is not None and alone(o[0]):
                    pieces.setdefault(o[0], {}).setdefault(o[1], []).append((offset, count, at))
                else:
                    flat(target.data, offset, count).view(torch.uint8).copy_(mapped.bytes(at, count * size))
        if digests is not None:
            _digest(plan, r, by_ref[r], mapped, digests)
        t2 = clock()
        seconds["land"] += t2 - t1
        for m in after.get(r, ()):
            module, staged = plan.staged[m]
            read += _process(module, staged, pieces.pop(m, {}), mapped)
        seconds["process"] += clock() - t2
    return read


def _digest(plan: Plan, r: int, pieces: List[Tuple[int, int, int, torch.Tensor, int]], mapped: Mapped,
            out: Dict[str, str]) -> None:
    """The SHA-256 of each tensor's pieces in ref r, in their order in the
    tensor (a tensor's pieces all come from its one ref)."""
    import hashlib

    by_tensor: Dict[int, List[Tuple[int, int]]] = {}
    for k, source_offset, count, _, _ in pieces:
        by_tensor.setdefault(k, []).append((source_offset, count))
    for k, spans in by_tensor.items():
        _, j, first = plan.sources[k]
        size = plan.buffers[k].element_size()
        h = hashlib.sha256()
        for source_offset, count in sorted(spans):
            h.update(mapped.bytes(mapped.place(r, j, (first + source_offset) * size), count * size).numpy().tobytes())
        out[plan.names[k]] = h.hexdigest()


def _process(module: torch.nn.Module, staged: Dict[str, torch.nn.Parameter],
             parts: Dict[str, List[Tuple[int, int, Place]]], mapped: Mapped) -> int:
    """Processes a layer from its staged tensors, those of its weights
    that lie whole and in order in the mapping read from there; returns
    how many were."""
    saved: Dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name, its in parts.items():
                p = staged[name]
                whole = _in_order(its, p, mapped)
                if whole is not None:
                    saved[name], p.data = p.data, whole
                    continue
                size = p.element_size()
                for offset, count, at in its:
                    flat(p.data, offset, count).view(torch.uint8).copy_(mapped.bytes(at, count * size))
        process_layer(module, staged)
    finally:
        for name, data in saved.items():
            staged[name].data = data  # the staged tensor back: nothing keeps the mapping
    return len(saved)


def _in_order(parts: List[Tuple[int, int, Place]], p: torch.Tensor, mapped: Mapped) -> Optional[torch.Tensor]:
    """p's elements as one tensor over the mapping, when its pieces cover
    it whole, back to back in the mapping in p's order; else None."""
    size = p.element_size()
    parts = sorted(parts, key=lambda part: part[0])
    key, first = parts[0][2]
    if parts[0][0] != 0 or first % size:
        return None
    end_elem, end_byte = 0, first
    for offset, count, (k, b) in parts:
        if offset != end_elem or k != key or b != end_byte:
            return None
        end_elem, end_byte = offset + count, b + count * size
    if end_elem != p.numel():
        return None
    return mapped.bytes(parts[0][2], end_byte - first).view(p.dtype).view(p.shape)
