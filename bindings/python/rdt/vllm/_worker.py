"""The worker side of "librdt": vLLM's WeightTransferEngine, run in each of
vLLM's worker processes.

Each update call names refs to the trainer's tensors. The first time a
layout of names, shapes and dtypes comes, the engine fetches the whole
tensors into receive buffers and loads them with ``model.load_weights``
(inside vLLM's layerwise reload where vLLM transforms weights after
loading), watching with a TorchFunctionMode which elements of each buffer
the model's loaders read and where their plain copies (same dtype,
contiguous on both sides) land. That is the plan, kept for the engine's
life and replayed on every later update of the same layout:

* only the elements the loaders read are fetched (a tensor-parallel rank's
  rows; nothing of a tensor this rank does not hold);
* where every read was a plain copy, the bytes land straight where the
  copies put them: in the live parameters of a layer vLLM uses as loaded
  (in place), or, for a layer vLLM processes after loading (quantizes,
  repacks: every linear layer on the CPU build), in checkpoint-layout
  tensors the engine keeps for it, which it hands to the layer's
  ``process_weights_after_loading`` once they all landed, while the next
  chunk is still being fetched;
* a layout with a read that is not a plain copy goes through
  ``model.load_weights`` every time, from the same receive buffers.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

import rdt

from . import _mapped
from ._plan import Params, Plan, Staging, Watch, flat, needs_reload, process_layer, repacks, transforms
from ._wire import LibrdtInitInfo, LibrdtUpdateInfo, WeightSyncError, collector_paused

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig

MAX_PLANS = 4096
"""Layouts remembered; a trainer whose buckets never repeat starts over
rather than growing without bound."""

CHUNK_BYTES = 32 << 20
"""Bytes of one fetch of a replay: layers whose bytes all came are
processed while the next chunk moves."""

Layout = Tuple[Tuple[Tuple[Tuple[str, Tuple[int, ...], str], ...], Tuple[Tuple[str, Tuple[Tuple[str, Tuple[int, ...]], ...]], ...]], ...]


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise rdt.UnsupportedError(f"the trainer sent a tensor of dtype {name!r}, which torch does not have",
                                   rdt.UnsupportedError.status)
    return dt


class LibrdtWeightTransferEngine(WeightTransferEngine[LibrdtInitInfo, LibrdtUpdateInfo]):
    """vLLM's worker-side engine for "librdt" (see the module's doc)."""

    init_info_cls = LibrdtInitInfo
    update_info_cls = LibrdtUpdateInfo
    # Plans hold the target model's parameters; a draft model would need its own.
    supports_draft_weight_update = False

    def __init__(self, config: "WeightTransferConfig", vllm_config: "VllmConfig", device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._runtime: Optional[rdt.Runtime] = None
        self._info: Optional[LibrdtInitInfo] = None
        self._plans: Dict[Layout, Plan] = {}
        self._repacks = repacks()
        self._reload = needs_reload(model)
        self._staging = Staging(device)
        self._reloading = False          # vLLM's layerwise reload is open
        self._learning: List[Plan] = []  # plans of this session that finish learning at its end
        self._version = -1               # of the last update received whole
        self._syncs = 0                  # sessions finished
        self._mapped_weights = 0         # staged weights processed straight from a view
        self._bytes_mapped = 0           # of the trainer's objects, viewed
        self._digests: Optional[Dict[str, str]] = None  # of the bytes views brought, while recording
        self._seconds = {"fetch": 0.0, "land": 0.0, "process": 0.0, "load": 0.0, "transfer": 0.0}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="librdt-fetch")  # runs a chunk while layers process

    # ---- vLLM's calls ------------------------------------------------------------

    def init_transfer_engine(self, init_info: LibrdtInitInfo) -> None:
        if self._reloading:
            raise RuntimeError("init_weight_transfer_engine during a weight update")
        if self._runtime is not None and (self._info is None or self._info.auth_token != init_info.auth_token):
            self._close_runtime()
        if self._runtime is None:
            self._runtime = rdt.Runtime(name=f"vllm-worker-{os.getpid()}", auth_token=init_info.auth_token)
        self._info = init_info

    def start_weight_update(self) -> None:
        self._ready()  # vLLM's layerwise reload opens with the first update that needs it

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":  # a CPU worker of torch's CUDA build has no accelerator to wait for
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: LibrdtUpdateInfo) -> None:
        runtime, info = self._ready()
        deadline = time.monotonic() + info.timeout_s
        try:
            with collector_paused():
                self._receive(runtime, info, update_info, deadline)
        except BaseException:
            # vLLM ends the session without finish_weight_update: put the
            # model back in a state it serves from (see _end_reload).
            self._end_reload(learned=False)
            raise
        self._version = update_info.version

    def finish_weight_update(self) -> None:
        self._end_reload()
        self._syncs += 1

    def shutdown(self) -> None:
        self._end_reload(learned=False)
        self._close_runtime()

    # ---- what tests and tools read ---------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The engine's counters and its runtime's, for tests and tools:
        ``version`` (of the last update received), ``syncs`` (sessions
        finished), ``plans``, ``reload`` (whether the model needs vLLM's
        layerwise reload to load), ``landing_tensors`` (tensors of plans
        that land as bytes), ``staged_layers`` (layers processed from staged
        weights), ``loaded_tensors`` (tensors of plans that go through
        load_weights), ``bytes_mapped`` (of the trainer's objects viewed, see
        ``LibrdtInitInfo.views``), ``mapped_weights`` (staged weights
        processed straight from such a view),
        ``seconds`` (time spent fetching: waiting for bytes;
        landing: the plan's own work; processing layers; loading; and
        transfer: the replays' prepared gets running, beside the rest), and the
        runtime's ``stats()`` and per-transport bytes received
        (``transports``)."""
        learned = [p for p in self._plans.values() if p.learned]
        out: Dict[str, Any] = {
            "version": self._version, "syncs": self._syncs, "plans": len(self._plans), "reload": self._reload,
            "landing_tensors": sum(sum(1 for pieces in p.landing if pieces) for p in learned if p.landing is not None),
            "staged_layers": sum(len(p.staged) for p in learned),
            "loaded_tensors": sum(len(p.loaded) for p in learned),
            "bytes_mapped": self._bytes_mapped, "mapped_weights": self._mapped_weights,
            "seconds": dict(self._seconds),
        }
        if self._runtime is not None:
            out.update(self._runtime.stats())
            out["transports"] = {t["name"]: t["bytes_received"] for t in self._runtime.transports()
                                 if t["bytes_received"]}
        return out

    def record_digests(self, on: bool = True) -> None:
        """While on, each update from views hashes the bytes it maps (a
        pass over them), so that digests() covers the weights vLLM
        processed straight from a view, whose bytes no tensor of the
        worker keeps. For tests and tools."""
        self._digests = {} if on else None

    def digests(self) -> Dict[str, str]:
        """The SHA-256 of the elements of each tensor the last update
        brought (those this rank reads), by name, over every plan (for a
        replay from views, those recorded while record_digests was on)."""
        import hashlib

        out: Dict[str, str] = {}
        for plan in self._plans.values():
            if not plan.learned:
                continue
            for i, name in enumerate(plan.names):
                h = hashlib.sha256()
                if plan.landing is not None and i not in plan.loaded:
                    pieces = sorted(plan.landing[i], key=lambda piece: piece[0])
                    regions = [flat(target, offset, count) for _, count, target, offset in pieces]
                else:
                    regions = [plan.buffers[i].view(-1)[lo:hi] for lo, hi in plan.ranges[i]]
                for r in regions:
                    h.update(r.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
                out[name] = h.hexdigest()
        out.update(self._digests or {})
        return out

    # ---- the work ------------------------------------------------------------------

    def _ready(self) -> Tuple[rdt.Runtime, LibrdtInitInfo]:
        if self._runtime is None or self._info is None:
            raise RuntimeError("the librdt engine has no trainer yet: call init_weight_transfer_engine first")
        return self._runtime, self._info

    def _receive(self, runtime: rdt.Runtime, info: LibrdtInitInfo, update: LibrdtUpdateInfo,
                 deadline: float) -> None:
        if update.abandon:
            raise WeightSyncError(f"the trainer abandoned version {update.version}; the weights of the last "
                                  "finished sync stay, less any layer of this one already processed")
        refs: List[rdt.ObjectRef] = []
        try:
            for i in range(len(update.refs)):
                refs.append(runtime.deserialize(update.ref_bytes(i), timeout=_left(deadline)))
            layout = _layout_of(update, refs)
            plan = self._plans.get(layout)
            if plan is not None and (not plan.learned or not plan.current()):
                # Still learning (the same layout twice in one session), or
                # vLLM replaced a parameter it lands in: learn again.
                self._plans.pop(layout).close()
                plan = None
            if plan is None:
                plan = self._learn(runtime, info, layout, refs, deadline)
                if len(self._plans) >= MAX_PLANS:
                    self._forget_plans()
                self._plans[layout] = plan
            else:
                self._replay(runtime, info, plan, refs, deadline)
        finally:
            for r in refs:
                r.close()

    def _forget_plans(self) -> None:
        for plan in self._plans.values():
            plan.close()
        self._plans.clear()

    def _open_reload(self) -> None:
        if self._reload and not self._reloading:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            self._reloading = True

    def _learn(self, runtime: rdt.Runtime, info: LibrdtInitInfo, layout: Layout, refs: List[rdt.ObjectRef],
               deadline: float) -> Plan:
        names: List[str] = []
        buffers: List[torch.Tensor] = []
        sources: List[Tuple[int, int, int]] = []
        receive: List[torch.Tensor] = []
        for r, (own, packs) in enumerate(layout):
            for j, (name, shape, dtype) in enumerate(own):
                b = torch.empty(shape, dtype=_torch_dtype(dtype), device=self.device)
                names.append(name), buffers.append(b), sources.append((r, j, 0)), receive.append(b)
            for g, (dtype, members) in enumerate(packs):
                whole = torch.empty(sum(_numel(shape) for _, shape in members), dtype=_torch_dtype(dtype),
                                    device=self.device)
                first = 0
                for name, shape in members:
                    n = _numel(shape)
                    names.append(name), buffers.append(whole[first:first + n].view(shape))
                    sources.append((r, len(own) + g, first))
                    first += n
                receive.append(whole)
        t0 = time.monotonic()
        runtime.get(refs, out=receive, timeout=_left(deadline), transport=info.transport)
        self._seconds["fetch"] += time.monotonic() - t0
        self._open_reload()
        plan = Plan(names, buffers, sources, receive, Watch(buffers, Params(self.model)))
        t0 = time.monotonic()
        with plan.watch:
            self._load(names, buffers, range(len(names)))
        self._seconds["load"] += time.monotonic() - t0
        if self._reloading:
            self._learning.append(plan)  # layers vLLM processes only at the end read there too
        else:
            plan.learn(self._processed, self._staging, mixed=not self._reload)
        return plan

    def _processed(self, module: torch.nn.Module) -> bool:
        return transforms(module, self._repacks)

    def _replay(self, runtime: rdt.Runtime, info: LibrdtInitInfo, plan: Plan, refs: List[rdt.ObjectRef],
                deadline: float) -> None:
        """Replays a learned plan: from views of the trainer's objects where
        they can be mapped here (see _mapped), else by prepared gets."""
        viewed = False
        if info.views and info.transport in (None, "shm") and plan.mapped is not False and refs:
            mapped = _mapped.Mapped(runtime, refs, deadline, self._pool)
            alone = _mapped.alone(plan, [p for p in self._plans.values() if p is not plan and p.learned])
            try:
                self._mapped_weights += _mapped.replay(plan, mapped, alone.__contains__, self._seconds,
                                                       time.monotonic, self._digests)
                plan.mapped = viewed = True
            except rdt.UnsupportedError:
                # A ref of another host, or in device memory: fetch this
                # layout from now on (whatever was processed already is
                # landed and processed again, whole).
                plan.mapped = False
            finally:
                self._bytes_mapped += mapped.nbytes
                mapped.close()
        if not viewed:
            self._fetch(runtime, info, plan, refs, deadline)
        if plan.loaded:
            self._open_reload()
            t0 = time.monotonic()
            self._load(plan.names, plan.buffers, plan.loaded)
            self._seconds["load"] += time.monotonic() - t0

    def _fetch(self, runtime: rdt.Runtime, info: LibrdtInitInfo, plan: Plan, refs: List[rdt.ObjectRef],
               deadline: float) -> None:
        """Fetches the plan's pieces straight into their targets, and the
        ranges of the tensors it loads into their buffers, one prepared get
        per chunk of about CHUNK_BYTES (made at the first replay, rebound to
        each update's refs after), processing each staged layer once its
        last piece landed while the next chunk moves."""
        t_start = time.monotonic()
        waited = processing = 0.0
        if not plan.chunks:
            plan.chunks = self._chunks(runtime, info, plan, refs)
        else:
            for prepared, order, _ in plan.chunks:
                prepared.rebind([refs[r] for r in order])
        running = None
        moving = [0.0]  # seconds the chunks' runs took, on the engine's thread

        def run(prepared: rdt.Prepared, timeout: float) -> None:
            t0 = time.monotonic()
            try:
                prepared.run(0, timeout)
            finally:
                moving[0] += time.monotonic() - t0

        try:
            if plan.chunks:
                running = self._pool.submit(run, plan.chunks[0][0], _left(deadline))
            for c, (_, _, layers) in enumerate(plan.chunks):
                t0 = time.monotonic()
                current, running = running, None
                current.result()
                waited += time.monotonic() - t0
                if c + 1 < len(plan.chunks):
                    running = self._pool.submit(run, plan.chunks[c + 1][0], _left(deadline))
                t0 = time.monotonic()
                for m in layers:
                    module, staged = plan.staged[m]
                    process_layer(module, staged)
                processing += time.monotonic() - t0
        finally:
            if running is not None:
                running.exception()  # a run ends by its timeout: wait for it before its targets are let go
            for prepared, _, _ in plan.chunks:
                prepared.unbind()  # the trainer's objects may go now
        self._seconds["fetch"] += waited
        self._seconds["process"] += processing
        self._seconds["land"] += time.monotonic() - t_start - waited - processing
        self._seconds["transfer"] += moving[0]

    def _chunks(self, runtime: rdt.Runtime, info: LibrdtInitInfo, plan: Plan,
                refs: List[rdt.ObjectRef]) -> List[Tuple[rdt.Prepared, List[int], List[int]]]:
        """The plan's pieces as prepared gets of about CHUNK_BYTES each,
        with the refs each takes (indexes into an update's) and the staged
        layers complete once it landed."""
        loaded = set(plan.loaded)
        last: Dict[int, List[int]] = {}
        for m, i in plan.last_tensor.items():
            last.setdefault(i, []).append(m)
        tensors = [[ref[j] for j in range(len(ref.tensor_descs()))] for ref in refs]
        out: List[Tuple[rdt.Prepared, List[int], List[int]]] = []
        slices: List[rdt.Range] = []
        outs: List[torch.Tensor] = []
        done: List[int] = []
        filled = 0

        def close_chunk() -> None:
            if slices:
                prepared = runtime.prepare_get(slices, out=outs, transport=info.transport)
                index = {id(r): k for k, r in enumerate(refs)}
                out.append((prepared, [index[id(r)] for r in prepared.refs], list(done)))
            elif done and out:
                out[-1][2].extend(done)

        for k, whole in enumerate(plan.buffers):
            r, j, first = plan.sources[k]
            size = whole.element_size()
            if k in loaded:
                pieces = [(lo, hi - lo, whole, lo) for lo, hi in plan.ranges[k]]
            else:
                pieces = plan.landing[k] if plan.landing is not None else []
            for source_offset, count, target, offset in pieces:
                slices.append(tensors[r][j].bytes((first + source_offset) * size, count * size))
                outs.append(flat(target.data, offset, count))
                filled += count * size
            done.extend(last.get(k, ()))
            if filled >= CHUNK_BYTES:
                close_chunk()
                slices, outs, done, filled = [], [], [], 0
        close_chunk()
        return out

    def _load(self, names: List[str], buffers: List[torch.Tensor], which: Sequence[int]) -> None:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        with disable_mtp_completeness_check():
            self.model.load_weights((names[i], buffers[i]) for i in which)

    def _end_reload(self, learned: bool = True) -> None:
        """Ends vLLM's layerwise reload if one is open: layers whose weights
        all came are processed, the others get their previous weights back.
        Plans learning in this session finish learning then (``learned``),
        or are forgotten (a session that failed)."""
        learning, self._learning = self._learning, []
        if self._reloading:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            self._reloading = False
            with ExitStack() as watching:
                for plan in learning:
                    if learned and plan.watch is not None:
                        watching.enter_context(plan.watch)
                finalize_layerwise_reload(self.model, self.model_config)
        for plan in learning:
            if learned:
                plan.learn(self._processed, self._staging, mixed=not self._reload)
            else:
                self._plans = {k: p for k, p in self._plans.items() if p is not plan}
                plan.close()

    def _close_runtime(self) -> None:
        self._forget_plans()
        if self._runtime is not None:
            runtime, self._runtime = self._runtime, None
            runtime.close()


def _left(deadline: float) -> float:
    """Seconds to the deadline; GetTimeoutError once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise rdt.GetTimeoutError("the update's deadline passed", rdt.GetTimeoutError.status)
    return left


def _numel(shape: Sequence[int]) -> int:
    """The elements of a shape from outside; ValueError unless its sizes
    are non-negative ints."""
    n = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise ValueError(f"shape {list(shape)!r}: sizes must be non-negative ints")
        n *= d
    return n


def _layout_of(update: LibrdtUpdateInfo, refs: List[rdt.ObjectRef]) -> Layout:
    """Per ref, its own tensors (name, shape, dtype, as the owner describes
    them) and its packed groups (dtype, then name and shape of each
    member); an update whose names and packs do not match its refs is
    refused."""
    out = []
    for i, (ref, names) in enumerate(zip(refs, update.names)):
        descs = ref.tensor_descs()
        packs = update.packs[i] if update.packs else []
        if len(descs) != len(names) + len(packs):
            raise ValueError(f"refs[{i}] holds {len(descs)} tensors but names[{i}] and packs[{i}] describe "
                             f"{len(names) + len(packs)}")
        own = tuple((n, tuple(d.shape), d.dtype_name()) for n, d in zip(names, descs))
        groups = []
        for g, (group, d) in enumerate(zip(packs, descs[len(names):])):
            members = tuple(zip(group["names"], map(tuple, group["shapes"])))
            total = sum(_numel(shape) for _, shape in members)
            if d.dtype_name() != group["dtype"] or tuple(d.shape) != (total,):
                raise ValueError(f"packs[{i}][{g}] describes {total} elements of {group['dtype']}, but its tensor "
                                 f"is {tuple(d.shape)} of {d.dtype_name()}")
            groups.append((group["dtype"], members))
        out.append((own, tuple(groups)))
    return tuple(out)
