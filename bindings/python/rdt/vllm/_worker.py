"""The worker side of "librdt": vLLM's WeightTransferEngine, run in each of
vLLM's worker processes.

Each update call names refs to the trainer's tensors. The first time a
layout of names, shapes and dtypes comes, the engine fetches the whole
tensors into receive buffers and loads them with ``model.load_weights``,
watching (a TorchFunctionMode) which bytes of each buffer the model's
loaders read and where plain copies land. That is the plan, kept for the
engine's life and replayed on every later update of the same layout:

* only the bytes the loaders read are fetched (a tensor-parallel rank's
  rows; nothing of a tensor this rank does not hold);
* where vLLM uses the checkpoint's layout as it is (no quantization, no
  repacking of the layer's weights), bytes land straight in the model's
  parameters, in place, and the loaders are not run for them;
* the rest lands in the same receive buffers every time and goes through
  ``model.load_weights`` inside vLLM's layerwise reload (the CPU build
  repacks every linear layer's weights for oneDNN, so all of it does
  there).
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode
from vllm.distributed.weight_transfer.base import WeightTransferEngine

import rdt

from ._wire import LibrdtInitInfo, LibrdtUpdateInfo, WeightSyncError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig

MAX_PLANS = 4096
"""Layouts remembered; a trainer whose buckets never repeat starts over
rather than growing without bound."""

Layout = Tuple[Tuple[Tuple[str, Tuple[int, ...], str], ...], ...]


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise rdt.UnsupportedError(f"the trainer sent a tensor of dtype {name!r}, which torch does not have",
                                   rdt.UnsupportedError.status)
    return dt


def _extent(t: torch.Tensor) -> Optional[Tuple[int, int]]:
    """The elements [lo, hi) of t's storage that t covers, or None if empty."""
    if t.numel() == 0:
        return None
    lo = t.storage_offset()
    return lo, lo + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@dataclass
class _Copy:
    """A loader's plain copy of buffer bytes into a parameter, as seen once."""

    source: int                 # the buffer's index in the layout
    source_offset: int          # in elements
    count: int                  # elements
    param: torch.nn.Parameter
    param_storage: int          # the parameter's storage address when it was seen
    offset: int                 # the destination's storage offset, in elements


class _Watch(TorchFunctionMode):
    """Records what the model's loaders do with the receive buffers: which
    elements of each they read, and their plain copies into parameters."""

    def __init__(self, buffers: Sequence[torch.Tensor], params: Dict[int, torch.nn.Parameter]) -> None:
        super().__init__()
        self.index = {_storage(b): i for i, b in enumerate(buffers)}
        self.params = params
        self.read: List[List[Tuple[int, int]]] = [[] for _ in buffers]
        self.copies: List[_Copy] = []
        self.unplain: set = set()  # buffers some copy of which cannot be replayed as bytes

    def _source(self, t: Any) -> Optional[int]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            return self.index.get(_storage(t))
        return None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        sources = [(a, i) for a in tensors if (i := self._source(a)) is not None]
        if not sources:
            return out
        if getattr(func, "__name__", "") == "__get__" or self._aliases(out, sources):
            return out  # a property or a view: no bytes read
        for a, i in sources:
            span = _extent(a)
            if span is not None:
                self.read[i].append(span)
        if getattr(func, "__name__", "") == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            self._copy(args[0], args[1])
        return out

    @staticmethod
    def _aliases(out: Any, sources: List[Tuple[torch.Tensor, int]]) -> bool:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
            return False
        mine = {_storage(a) for a, _ in sources}
        return all(o.device.type != "meta" and _storage(o) in mine for o in outs)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        i = self._source(src)
        if i is None:
            return
        param = self.params.get(_storage(dst)) if dst.device.type != "meta" else None
        if (param is None or dst.dtype != src.dtype or dst.shape != src.shape or not dst.is_contiguous()
                or not src.is_contiguous() or dst.device != src.device):
            self.unplain.add(i)
            return
        self.copies.append(_Copy(i, src.storage_offset(), src.numel(), param, _storage(param),
                                 dst.storage_offset()))


class _Plan:
    """What one layout's updates do, learned from its first one: which
    element ranges of each tensor the loaders read, which tensors land in
    parameters (``direct``) and which go through load_weights
    (``loaded``)."""

    def __init__(self, names: List[str], buffers: List[torch.Tensor], watch: _Watch) -> None:
        self.names = names
        self.buffers = buffers                        # one per tensor, the full shape, reused
        self.watch: Optional[_Watch] = watch          # until learned
        self.ranges: List[List[Tuple[int, int]]] = []
        self.direct: Dict[int, List[_Copy]] = {}
        self.loaded: List[int] = []

    def learned(self, direct_allowed: bool) -> None:
        """Makes the plan from what its watch saw."""
        watch, self.watch = self.watch, None
        assert watch is not None
        self.ranges = [_merge(spans) for spans in watch.read]
        by_tensor: Dict[int, List[_Copy]] = {}
        for c in watch.copies:
            by_tensor.setdefault(c.source, []).append(c)
        for i, buffer in enumerate(self.buffers):
            copies = by_tensor.get(i, [])
            if (direct_allowed and copies and i not in watch.unplain and _covers(copies, self.ranges[i])
                    and all(_landed(c, buffer) for c in copies)):
                self.direct[i] = copies
            elif self.ranges[i]:
                self.loaded.append(i)

    def current(self) -> bool:
        """Whether the parameters it lands in are still the ones it saw."""
        return all(c.param_storage == _storage(c.param) for cs in self.direct.values() for c in cs)


def _merge(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def needs_reload(model: torch.nn.Module) -> bool:
    """Whether vLLM transforms some of this model's weights after loading
    them, so that bytes cannot land in its parameters as they are: a layer
    with a quantization method other than the unquantized linear and
    embedding ones, or with any quantization method on CPU and XPU (the CPU
    build repacks each linear layer's weights, and the output embedding's,
    for its GEMM kernels). Layers without one (norms, a plain torch
    module's) are used as loaded."""
    from vllm.platforms import current_platform

    repacks = current_platform.is_cpu() or current_platform.is_xpu()
    plain = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if qm is not None and (repacks or type(qm).__name__ not in plain):
            return True
    return False


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
        self._plans: Dict[Layout, _Plan] = {}
        self._reload = needs_reload(model)
        self._reloading = False
        self._learning: List[_Plan] = []  # plans of this session that finish learning at its end
        self._version = -1   # of the last update received whole
        self._syncs = 0      # sessions finished

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
        self._ready()
        if self._reload and not self._reloading:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            self._reloading = True

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":  # a CPU worker of torch's CUDA build has no accelerator to wait for
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: LibrdtUpdateInfo) -> None:
        runtime, info = self._ready()
        deadline = time.monotonic() + info.timeout_s
        try:
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
        self._plans.clear()
        self._close_runtime()

    # ---- what tests and tools read ---------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The engine's counters and its runtime's, for tests and tools:
        ``version`` (of the last update received), ``syncs`` (sessions
        finished), ``plans``, ``reload`` (whether updates go through vLLM's
        layerwise reload), ``direct_tensors`` and ``loaded_tensors`` (over
        all plans), and the runtime's ``stats()`` and per-transport bytes
        received (``transports``)."""
        out: Dict[str, Any] = {
            "version": self._version, "syncs": self._syncs, "plans": len(self._plans), "reload": self._reload,
            "direct_tensors": sum(len(p.direct) for p in self._plans.values()),
            "loaded_tensors": sum(len(p.loaded) for p in self._plans.values()),
        }
        if self._runtime is not None:
            out.update(self._runtime.stats())
            out["transports"] = {t["name"]: t["bytes_received"] for t in self._runtime.transports()
                                 if t["bytes_received"]}
        return out

    def digests(self) -> Dict[str, str]:
        """The SHA-256 of the bytes each tensor's last update brought, by
        name, over every plan (the ranges this rank read, for a shard)."""
        import hashlib

        out: Dict[str, str] = {}
        for plan in self._plans.values():
            for i, name in enumerate(plan.names):
                h = hashlib.sha256()
                if i in plan.direct:
                    for c in plan.direct[i]:
                        region = torch.as_strided(c.param.data, (c.count,), (1,), c.offset)
                        h.update(region.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
                else:
                    flat = plan.buffers[i].view(-1)
                    for lo, hi in plan.ranges[i]:
                        h.update(flat[lo:hi].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
                out[name] = h.hexdigest()
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
                                  "finished sync stay, less any layer of this one vLLM already processed")
        refs: List[rdt.ObjectRef] = []
        try:
            for i in range(len(update.refs)):
                refs.append(runtime.deserialize(update.ref_bytes(i), timeout=_left(deadline)))
            layout = _layout_of(update, refs)
            plan = self._plans.get(layout)
            if plan is not None and (plan.watch is not None or not plan.current()):
                # Still learning (the same layout twice in one session), or
                # vLLM replaced a parameter it lands in: learn again.
                del self._plans[layout]
                plan = None
            if plan is None:
                plan = self._learn(runtime, info, layout, refs, deadline)
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()
                self._plans[layout] = plan
            else:
                self._replay(runtime, info, plan, refs, deadline)
        finally:
            for r in refs:
                r.close()

    def _learn(self, runtime: rdt.Runtime, info: LibrdtInitInfo, layout: Layout, refs: List[rdt.ObjectRef],
               deadline: float) -> _Plan:
        names = [name for tensors in layout for name, _, _ in tensors]
        buffers = [torch.empty(shape, dtype=_torch_dtype(dtype), device=self.device)
                   for tensors in layout for _, shape, dtype in tensors]
        runtime.get(refs, out=buffers, timeout=_left(deadline), transport=info.transport)
        params = {_storage(p): p for p in self.model.parameters() if p.device.type != "meta" and p.numel()}
        plan = _Plan(names, buffers, _Watch(buffers, params))
        with plan.watch:
            self._load(names, buffers, range(len(names)))
        if self._reloading:
            self._learning.append(plan)  # layers vLLM processes only at the end read there too
        else:
            plan.learned(direct_allowed=not self._reload)
        return plan

    def _replay(self, runtime: rdt.Runtime, info: LibrdtInitInfo, plan: _Plan, refs: List[rdt.ObjectRef],
                deadline: float) -> None:
        slices: List[rdt.TensorSlice] = []
        outs: List[torch.Tensor] = []
        k = 0
        for ref in refs:
            for j in range(len(ref.shapes)):
                whole = plan.buffers[k]
                size = whole.element_size()
                for c in plan.direct.get(k, ()):
                    slices.append(ref[j].bytes(c.source_offset * size, c.count * size))
                    outs.append(torch.as_strided(c.param.data, (c.count,), (1,), c.offset))
                if k not in plan.direct:
                    flat = whole.view(-1)
                    for lo, hi in plan.ranges[k]:
                        if lo == 0 and hi == whole.numel():
                            slices.append(ref[j])
                            outs.append(whole)
                        else:
                            slices.append(ref[j].bytes(lo * size, (hi - lo) * size))
                            outs.append(flat[lo:hi])
                k += 1
        if slices:
            runtime.get(slices, out=outs, timeout=_left(deadline), transport=info.transport)
        if plan.loaded:
            self._load(plan.names, plan.buffers, plan.loaded)

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
        if not self._reloading:
            return
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        self._reloading = False
        with ExitStack() as watching:
            for plan in learning:
                if learned and plan.watch is not None:
                    watching.enter_context(plan.watch)
            finalize_layerwise_reload(self.model, self.model_config)
        for plan in learning:
            if learned:
                plan.learned(direct_allowed=False)
            else:
                self._plans = {k: p for k, p in self._plans.items() if p is not plan}

    def _close_runtime(self) -> None:
        if self._runtime is not None:
            runtime, self._runtime = self._runtime, None
            self._plans.clear()
            runtime.close()


def _left(deadline: float) -> float:
    """Seconds to the deadline; GetTimeoutError once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise rdt.GetTimeoutError("the update's deadline passed", rdt.GetTimeoutError.status)
    return left


def _layout_of(update: LibrdtUpdateInfo, refs: List[rdt.ObjectRef]) -> Layout:
    """The update's names with each ref's shapes and dtypes, as the owners
    describe them; an update whose names do not match its refs is refused."""
    out = []
    for i, (ref, names) in enumerate(zip(refs, update.names)):
        shapes, dtypes = ref.shapes, ref.dtypes
        if len(shapes) != len(names):
            raise ValueError(f"refs[{i}] holds {len(shapes)} tensors but names[{i}] names {len(names)}")
        out.append(tuple((n, tuple(s), d) for n, s, d in zip(names, shapes, dtypes)))
    return tuple(out)


def _covers(copies: List[_Copy], ranges: List[Tuple[int, int]]) -> bool:
    """Whether the plain copies read every element the loaders read."""
    return _merge([(c.source_offset, c.source_offset + c.count) for c in copies]) == ranges


def _landed(c: _Copy, buffer: torch.Tensor) -> bool:
    """Whether the parameter still holds, bit for bit, what the copy put
    there once every loader ran: then the copy alone makes it."""
    got = torch.as_strided(c.param.data, (c.count,), (1,), c.offset)
    want = buffer.view(-1)[c.source_offset:c.source_offset + c.count]
    return bool(torch.equal(got.view(torch.uint8), want.view(torch.uint8)))
