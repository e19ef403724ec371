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

import bisect
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode
from vllm.distributed.weight_transfer.base import WeightTransferEngine

import rdt

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
Key = Tuple[int, str]  # (id of a module, parameter name)


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


def _merge(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _flat(t: torch.Tensor, offset: int, count: int) -> torch.Tensor:
    """Elements [offset, offset + count) of contiguous t, as a flat view."""
    return torch.as_strided(t, (count,), (1,), t.storage_offset() + offset)


@dataclass
class _Copy:
    """A loader's plain copy of buffer elements into a parameter, as seen once."""

    source: int           # the buffer's index in the layout
    source_offset: int    # in elements
    count: int            # elements
    module: torch.nn.Module
    name: str             # the parameter's name in the module
    offset: int           # in elements from the parameter's first


class _Params:
    """Which module parameter a storage address belongs to. vLLM's layerwise
    reload makes a layer's parameters anew while loading it, so a miss
    looks again (once per address)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.by_storage: Dict[int, Tuple[torch.nn.Module, str, torch.nn.Parameter]] = {}
        self.missed: Set[int] = set()
        self._scan()

    def _scan(self) -> None:
        for module in self.model.modules():
            for name, p in module._parameters.items():
                if p is not None and p.device.type != "meta" and p.numel():
                    self.by_storage[_storage(p)] = (module, name, p)

    def find(self, t: torch.Tensor) -> Optional[Tuple[torch.nn.Module, str, torch.nn.Parameter]]:
        s = _storage(t)
        hit = self.by_storage.get(s)
        if hit is not None and hit[0]._parameters.get(hit[1]) is hit[2]:
            return hit
        if s in self.missed:
            return None
        self._scan()
        hit = self.by_storage.get(s)
        if hit is None:
            self.missed.add(s)
        return hit


class _Watch(TorchFunctionMode):
    """Records what the model's loaders do with the receive buffers: which
    elements of each they read, and their plain copies into parameters
    (with each destination parameter's shape, dtype and attributes)."""

    def __init__(self, buffers: Sequence[torch.Tensor], params: _Params) -> None:
        super().__init__()
        # storage -> (first elements, [(first, end, buffer index)]): packed
        # tensors share one receive buffer.
        spans: Dict[int, List[Tuple[int, int, int]]] = {}
        for i, b in enumerate(buffers):
            if b.numel():
                spans.setdefault(_storage(b), []).append((b.storage_offset(), b.storage_offset() + b.numel(), i))
        self.index = {s: ([lo for lo, _, _ in sorted(v)], sorted(v)) for s, v in spans.items()}
        self.params = params
        self.read: List[List[Tuple[int, int]]] = [[] for _ in buffers]
        self.copies: List[_Copy] = []
        self.unplain: Set[int] = set()  # buffers some read of which is not a plain copy
        self.seen: Dict[Key, Tuple[torch.Size, torch.dtype, Dict[str, Any]]] = {}
        self.written: Dict[int, Key] = {}  # storage of a parameter copied into -> its key
        self.spans: Dict[Key, List[Tuple[int, int]]] = {}  # the storage elements copies wrote there
        self.changed: Set[Key] = set()     # parameters changed in place over bytes copied into them

    def _source(self, t: Any) -> Optional[Tuple[int, int]]:
        """(buffer index, its first element in the storage) of a tensor
        over a receive buffer."""
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            found = self.index.get(_storage(t))
            if found is not None:
                firsts, spans = found
                j = bisect.bisect_right(firsts, t.storage_offset()) - 1
                if j >= 0 and t.storage_offset() < spans[j][1]:
                    return spans[j][2], spans[j][0]
        return None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        fname = getattr(func, "__name__", "")
        if fname == "copy_" and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            return out  # vLLM's layerwise reload counting what a loader would load: nothing moves
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        sources = [(a, found) for a in tensors if (found := self._source(a)) is not None]
        plain = False
        if sources and fname not in _METADATA and not self._aliases(out, sources):  # else metadata or a view
            for a, (i, first) in sources:
                span = _extent(a)
                if span is not None:
                    self.read[i].append((span[0] - first, span[1] - first))
            plain = (fname == "copy_" and len(args) >= 2 and not kwargs and isinstance(args[1], torch.Tensor)
                     and self._copy(args[0], args[1]))
            if not plain:
                self.unplain.update(i for _, (i, _) in sources)
        if (not plain and self.written and (_in_place(fname) or "out" in kwargs)
                and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta"):
            key = self.written.get(_storage(args[0]))
            if key is not None and not self._zeroes_elsewhere(fname, args, key):
                self.changed.add(key)  # the bytes copied there are not what stays: a copy alone cannot make it
        return out

    def _zeroes_elsewhere(self, fname: str, args: Any, key: Key) -> bool:
        """Whether an in-place op only zeroes elements no copy wrote (a
        vocabulary's padding rows, say), which staged tensors, zeroed when
        made, hold already."""
        zero = fname == "zero_" or (fname == "fill_" and len(args) == 2 and not isinstance(args[1], torch.Tensor)
                                    and args[1] == 0)
        span = _extent(args[0])
        return zero and (span is None or all(span[1] <= lo or hi <= span[0] for lo, hi in self.spans.get(key, ())))

    @staticmethod
    def _aliases(out: Any, sources: List[Tuple[torch.Tensor, Any]]) -> bool:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
            return False
        mine = {_storage(a) for a, _ in sources}
        return all(o.device.type != "meta" and _storage(o) in mine for o in outs)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> bool:
        found = self._source(src)
        if (found is None or dst.device.type == "meta" or dst.dtype != src.dtype or dst.shape != src.shape
                or not dst.is_contiguous() or not src.is_contiguous() or dst.device != src.device):
            return False
        i, first = found
        target = self.params.find(dst)
        if target is None:
            return False
        module, name, param = target
        if not param.is_contiguous():
            return False
        self.copies.append(_Copy(i, src.storage_offset() - first, src.numel(), module, name,
                                 dst.storage_offset() - param.storage_offset()))
        key = (id(module), name)
        self.seen[key] = (param.shape, param.dtype, dict(param.__dict__))
        self.written[_storage(param)] = key
        span = _extent(dst)
        if span is not None:
            self.spans.setdefault(key, []).append(span)
        return True


class _Plan:
    """What one layout's updates do, learned from its first one.

    ``landing`` (a plan whose every read is a plain copy) maps each tensor
    to the pieces it lands as: (source offset, count, target, offset), the
    target a live parameter or a staged checkpoint-layout tensor. Otherwise
    ``loaded`` lists the tensors that go through load_weights."""

    def __init__(self, names: List[str], buffers: List[torch.Tensor], sources: List[Tuple[int, int, int]],
                 receive: List[torch.Tensor], watch: _Watch) -> None:
        self.names = names
        self.buffers = buffers                      # one per tensor, the full shape, reused
        self.sources = sources                      # per tensor: (ref, tensor of the ref, first element there)
        self.receive = receive                      # what a whole fetch of the refs lands in, in put order
        self.chunks: List[Tuple[rdt.Prepared, List[int], List[int]]] = []  # prepared get, its refs, layers after
        self.watch: Optional[_Watch] = watch        # until learned
        self.ranges: List[List[Tuple[int, int]]] = []
        self.landing: Optional[List[List[Tuple[int, int, torch.Tensor, int]]]] = None
        self.loaded: List[int] = []
        self.live: Dict[Key, Tuple[torch.nn.Module, str, torch.nn.Parameter]] = {}
        self.staged: Dict[int, Tuple[torch.nn.Module, Dict[str, torch.nn.Parameter]]] = {}
        self.last_tensor: Dict[int, int] = {}      # staged module -> the last tensor that lands in it

    @property
    def learned(self) -> bool:
        return self.watch is None

    def learn(self, processed: Any, staging: "_Staging", mixed: bool) -> None:
        """Makes the plan from what its watch saw. ``processed(module)``
        says whether vLLM transforms the module's weights after loading;
        ``mixed``, whether some tensors may land while others are loaded
        (not under vLLM's layerwise reload, which is all or nothing)."""
        watch, self.watch = self.watch, None
        assert watch is not None
        self.ranges = [_merge(spans) for spans in watch.read]
        by_tensor: Dict[int, List[_Copy]] = {}
        for c in watch.copies:
            by_tensor.setdefault(c.source, []).append(c)
        landing: List[List[Tuple[int, int, torch.Tensor, int]]] = [[] for _ in self.buffers]
        loaded: List[int] = []
        live: Dict[Key, Tuple[torch.nn.Module, str, torch.nn.Parameter]] = {}
        for i in range(len(self.buffers)):
            if not self.ranges[i]:
                continue  # read by no loader: this rank does not hold it
            copies = by_tensor.get(i, [])
            ok = (i not in watch.unplain and _covers(copies, self.ranges[i])
                  and not any(_deferred(c.module) or (id(c.module), c.name) in watch.changed for c in copies))
            for c in copies if ok else ():
                if processed(c.module):
                    continue
                param = c.module._parameters.get(c.name)
                shape, dtype, _ = watch.seen[(id(c.module), c.name)]
                if (param is None or param.shape != shape or param.dtype != dtype or not param.is_contiguous()
                        or not _landed(param, c, self.buffers[i])):
                    ok = False
            if not ok:
                loaded.append(i)
                continue
            for c in copies:
                key = (id(c.module), c.name)
                if processed(c.module):
                    target = staging.tensor(c.module, c.name, *watch.seen[key])
                    self.staged[id(c.module)] = (c.module, staging.params[id(c.module)])
                    self.last_tensor[id(c.module)] = i
                    with torch.no_grad():  # what this update brought, as a replay would have landed it
                        _flat(target.data, c.offset, c.count).copy_(
                            self.buffers[i].view(-1)[c.source_offset:c.source_offset + c.count])
                else:
                    target = c.module._parameters[c.name]
                    live[key] = (c.module, c.name, target)
                landing[i].append((c.source_offset, c.count, target, c.offset))
        if loaded and not mixed:
            self.loaded = [i for i in range(len(self.buffers)) if self.ranges[i]]
            return
        self.landing, self.loaded, self.live = landing, loaded, live

    def current(self) -> bool:
        """Whether the live parameters it lands in are still the model's."""
        return all(m._parameters.get(n) is p for m, n, p in self.live.values())

    def close(self) -> None:
        for prepared, _, _ in self.chunks:
            prepared.close()
        self.chunks = []


class _Staging:
    """Checkpoint-layout tensors for the layers vLLM processes after
    loading, one set per layer for the engine's life (made on first use,
    zeroed: elements no copy writes, padding say, stay zero)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.params: Dict[int, Dict[str, torch.nn.Parameter]] = {}

    def tensor(self, module: torch.nn.Module, name: str, shape: torch.Size, dtype: torch.dtype,
               attrs: Dict[str, Any]) -> torch.nn.Parameter:
        mine = self.params.setdefault(id(module), {})
        p = mine.get(name)
        if p is None or p.shape != shape or p.dtype != dtype:
            p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=self.device), requires_grad=False)
            p.__dict__.update({k: v for k, v in attrs.items() if k != "weight_loader"})
            mine[name] = p
        return p


# Tensor functions that read a tensor's description, not its elements.
_METADATA = frozenset(("__get__", "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset",
                       "is_contiguous", "element_size", "data_ptr", "untyped_storage", "get_device", "__len__",
                       "is_floating_point", "is_complex", "is_signed", "is_pinned", "is_shared", "__hash__",
                       "_is_view", "dim_order"))


def _in_place(fname: str) -> bool:
    """Whether a torch function of this name changes its first argument:
    ``add_``, ``__iadd__``, ``__setitem__`` (not ``__get__``)."""
    if fname.startswith("__"):
        return fname == "__setitem__" or (fname.startswith("__i") and fname.endswith("__") and fname != "__init__")
    return fname.endswith("_")


def _covers(copies: List[_Copy], ranges: List[Tuple[int, int]]) -> bool:
    """Whether the plain copies read every element the loaders read."""
    return bool(copies) and _merge([(c.source_offset, c.source_offset + c.count) for c in copies]) == ranges


def _landed(param: torch.Tensor, c: _Copy, buffer: torch.Tensor) -> bool:
    """Whether a parameter vLLM uses as loaded holds, bit for bit, what the
    copy put there once every loader ran: then the copy alone makes it."""
    got = _flat(param.data, c.offset, c.count)
    want = buffer.view(-1)[c.source_offset:c.source_offset + c.count]
    return bool(torch.equal(got.view(torch.uint8), want.view(torch.uint8)))


def _deferred(module: torch.nn.Module) -> bool:
    """Attention layers' weights (kv-cache scales) are processed by vLLM
    at the end of a reload only: leave them to it."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer

    return bool(is_deferred_attention_layer(module))


def _transforms(module: torch.nn.Module, repacks: bool) -> bool:
    """Whether vLLM transforms this module's weights after loading them: a
    quantization method other than the unquantized linear and embedding
    ones, or any on CPU and XPU (the CPU build repacks each linear layer's
    weights, and the output embedding's, for its GEMM kernels)."""
    qm = getattr(module, "quant_method", None)
    return qm is not None and (repacks or type(qm).__name__ not in ("UnquantizedLinearMethod",
                                                                      "UnquantizedEmbeddingMethod"))


def _repacks() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu() or current_platform.is_xpu())


def needs_reload(model: torch.nn.Module) -> bool:
    """Whether loading this model's weights needs vLLM's layerwise reload:
    whether some layer's weights are transformed after loading."""
    repacks = _repacks()
    return any(_transforms(m, repacks) for m in model.modules())


def _process(module: torch.nn.Module, staged: Dict[str, torch.nn.Parameter]) -> None:
    """Runs vLLM's processing of one layer on its staged checkpoint-layout
    weights, then copies the results into the layer's own tensors and puts
    those back, as vLLM's layerwise reload does (so their addresses, which
    CUDA graphs hold, do not change)."""
    kernel_params = dict(module._parameters)
    kernel_buffers = dict(module._buffers)
    for name, p in staged.items():
        delattr(module, name)
        module.register_parameter(name, p)
    if hasattr(module, "_already_called_process_weights_after_loading"):
        delattr(module, "_already_called_process_weights_after_loading")
    try:
        module.quant_method.process_weights_after_loading(module)
        if hasattr(module, "update_param_tp_status"):
            module.update_param_tp_status()
        with torch.no_grad():
            for name, kp in kernel_params.items():
                new = getattr(module, name, None)
                if kp is not None and isinstance(new, torch.Tensor) and new is not kp:
                    kp.data.copy_(new)
            for name, kb in kernel_buffers.items():
                new = module._buffers.get(name)
                if kb is not None and new is not None and new is not kb and new.shape == kb.shape:
                    kb.data.copy_(new)
    finally:
        for name in list(module._parameters):
            if name not in kernel_params:
                delattr(module, name)
        for name, kp in kernel_params.items():
            if name in module._parameters or hasattr(module, name):
                delattr(module, name)
            module.register_parameter(name, kp)
        for name, kb in kernel_buffers.items():
            if module._buffers.get(name) is not kb:
                if hasattr(module, name):
                    delattr(module, name)
                module.register_buffer(name, kb, persistent=name not in module._non_persistent_buffers_set)


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
        self._repacks = _repacks()
        self._reload = needs_reload(model)
        self._staging = _Staging(device)
        self._reloading = False          # vLLM's layerwise reload is open
        self._learning: List[_Plan] = []  # plans of this session that finish learning at its end
        self._version = -1               # of the last update received whole
        self._syncs = 0                  # sessions finished
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
        load_weights), ``seconds`` (time spent fetching: waiting for bytes;
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
            "seconds": dict(self._seconds),
        }
        if self._runtime is not None:
            out.update(self._runtime.stats())
            out["transports"] = {t["name"]: t["bytes_received"] for t in self._runtime.transports()
                                 if t["bytes_received"]}
        return out

    def digests(self) -> Dict[str, str]:
        """The SHA-256 of the elements of each tensor the last update
        brought (those this rank reads), by name, over every plan."""
        import hashlib

        out: Dict[str, str] = {}
        for plan in self._plans.values():
            if not plan.learned:
                continue
            for i, name in enumerate(plan.names):
                h = hashlib.sha256()
                if plan.landing is not None and i not in plan.loaded:
                    pieces = sorted(plan.landing[i], key=lambda piece: piece[0])
                    regions = [_flat(target, offset, count) for _, count, target, offset in pieces]
                else:
                    regions = [plan.buffers[i].view(-1)[lo:hi] for lo, hi in plan.ranges[i]]
                for r in regions:
                    h.update(r.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
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
               deadline: float) -> _Plan:
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
        plan = _Plan(names, buffers, sources, receive, _Watch(buffers, _Params(self.model)))
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
        return _transforms(module, self._repacks)

    def _replay(self, runtime: rdt.Runtime, info: LibrdtInitInfo, plan: _Plan, refs: List[rdt.ObjectRef],
                deadline: float) -> None:
        """Fetches the plan's pieces straight into their targets, and the
        ranges of the tensors it loads into their buffers, one prepared get
        per chunk of about CHUNK_BYTES (made at the first replay, rebound to
        each update's refs after), processing each staged layer once its
        last piece landed while the next chunk moves; then loads what it
        loads."""
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
                    _process(module, staged)
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
        if plan.loaded:
            self._open_reload()
            t0 = time.monotonic()
            self._load(plan.names, plan.buffers, plan.loaded)
            self._seconds["load"] += time.monotonic() - t0

    def _chunks(self, runtime: rdt.Runtime, info: LibrdtInitInfo, plan: _Plan,
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
        slices: List[rdt.TensorSlice] = []
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
                outs.append(_flat(target.data, offset, count))
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
