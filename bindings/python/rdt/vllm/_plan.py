"""What a librdt worker learns from an update and replays: a watch over
vLLM's loaders (which elements of each receive buffer they read, and where
their plain copies land), the plan made from it, the checkpoint-layout
tensors kept for layers vLLM processes after loading, and that
processing."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

import rdt

Key = Tuple[int, str]  # (id of a module, parameter name)


def _extent(t: torch.Tensor) -> Optional[Tuple[int, int]]:
    """The elements [lo, hi) of t's storage that t covers, or None if empty."""
    if t.numel() == 0:
        return None
    lo = t.storage_offset()
    return lo, lo + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


MAX_SPANS = 1 << 16
"""Spans one read of a strided tensor is recorded as at most; a read of
more (or of a tensor whose last dimension is strided) counts as its whole
extent."""


def _spans(t: torch.Tensor) -> List[Tuple[int, int]]:
    """The runs of storage elements t covers: one for a contiguous tensor;
    for a slice of columns (a row-parallel layer's shard, say) one per row,
    so that a rank fetches its columns only."""
    extent = _extent(t)
    if extent is None:
        return []
    shape, stride = list(t.shape), list(t.stride())
    # The innermost dimensions that lie back to back make one run.
    run, d = 1, len(shape)
    while d > 0 and (shape[d - 1] == 1 or stride[d - 1] == run):
        run *= shape[d - 1]
        d -= 1
    if d == 0 or run == 1:
        return [extent]
    outer = [(n, st) for n, st in zip(shape[:d], stride[:d]) if n > 1]
    count = 1
    for n, _ in outer:
        count *= n
    if count > MAX_SPANS:
        return [extent]
    firsts = [t.storage_offset()]
    for n, st in outer:
        firsts = [f + i * st for f in firsts for i in range(n)]
    return _merge([(f, f + run) for f in firsts])


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _merge(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def flat(t: torch.Tensor, offset: int, count: int) -> torch.Tensor:
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


class Params:
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
                    self.by_storage[storage_of(p)] = (module, name, p)

    def find(self, t: torch.Tensor) -> Optional[Tuple[torch.nn.Module, str, torch.nn.Parameter]]:
        s = storage_of(t)
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


class Watch(TorchFunctionMode):
    """Records what the model's loaders do with the receive buffers: which
    elements of each they read, and their plain copies into parameters
    (with each destination parameter's shape, dtype and attributes)."""

    def __init__(self, buffers: Sequence[torch.Tensor], params: Params) -> None:
        super().__init__()
        # storage -> (first elements, [(first, end, buffer index)]): packed
        # tensors share one receive buffer.
        spans: Dict[int, List[Tuple[int, int, int]]] = {}
        for i, b in enumerate(buffers):
            if b.numel():
                spans.setdefault(storage_of(b), []).append((b.storage_offset(), b.storage_offset() + b.numel(), i))
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
            found = self.index.get(storage_of(t))
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
                self.read[i].extend((lo - first, hi - first) for lo, hi in _spans(a))
            plain = (fname == "copy_" and len(args) >= 2 and not kwargs and isinstance(args[1], torch.Tensor)
                     and self._copy(args[0], args[1]))
            if not plain:
                self.unplain.update(i for _, (i, _) in sources)
        if (not plain and self.written and (_in_place(fname) or "out" in kwargs)
                and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta"):
            key = self.written.get(storage_of(args[0]))
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
        mine = {storage_of(a) for a, _ in sources}
        return all(o.device.type != "meta" and storage_of(o) in mine for o in outs)

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
        self.written[storage_of(param)] = key
        span = _extent(dst)
        if span is not None:
            self.spans.setdefault(key, []).append(span)
        return True


class Plan:
    """What one layout's updates do, learned from its first one.

    ``landing`` (a plan whose every read is a plain copy) maps each tensor
    to the pieces it lands as: (source offset, count, target, offset), the
    target a live parameter or a staged checkpoint-layout tensor. Otherwise
    ``loaded`` lists the tensors that go through load_weights."""

    def __init__(self, names: List[str], buffers: List[torch.Tensor], sources: List[Tuple[int, int, int]],
                 receive: List[torch.Tensor], watch: Watch) -> None:
        self.names = names
        self.buffers = buffers                      # one per tensor, the full shape, reused
        self.sources = sources                      # per tensor: (ref, tensor of the ref, first element there)
        self.receive = receive                      # what a whole fetch of the refs lands in, in put order
        self.chunks: List[Tuple[rdt.Prepared, List[int], List[int]]] = []  # prepared get, its refs, layers after
        self.watch: Optional[Watch] = watch        # until learned
        self.ranges: List[List[Tuple[int, int]]] = []
        self.landing: Optional[List[List[Tuple[int, int, torch.Tensor, int]]]] = None
        self.loaded: List[int] = []
        self.live: Dict[Key, Tuple[torch.nn.Module, str, torch.nn.Parameter]] = {}
        self.staged: Dict[int, Tuple[torch.nn.Module, Dict[str, torch.nn.Parameter]]] = {}
        self.last_tensor: Dict[int, int] = {}      # staged module -> the last tensor that lands in it
        self.mapped: Optional[bool] = None         # whether its updates' refs can be viewed (None: not tried)

    @property
    def learned(self) -> bool:
        return self.watch is None

    def learn(self, processed: Any, staging: "Staging", mixed: bool) -> None:
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
                        flat(target.data, c.offset, c.count).copy_(
                            self.buffers[i].view(-1)[c.source_offset:c.source_offset + c.count])
                else:
                    target = c.module._parameters[c.name]
                    live[key] = (c.module, c.name, target)
                landing[i].append((c.source_offset, c.count, target, c.offset))
        if loaded and not mixed:
            self.loaded = [i for i in range(len(self.buffers)) if self.ranges[i]]
            return
        self.landing, self.loaded, self.live = landing, loaded, live
        # Landed tensors never go through a receive buffer again: let their
        # memory go (a model's size), keeping each one's dtype.
        kept = set(loaded)
        self.buffers = [b if i in kept else b.new_empty(0) for i, b in enumerate(self.buffers)]
        self.receive = []

    def current(self) -> bool:
        """Whether the live parameters it lands in are still the model's."""
        return all(m._parameters.get(n) is p for m, n, p in self.live.values())

    def close(self) -> None:
        for prepared, _, _ in self.chunks:
            prepared.close()
        self.chunks = []


class Staging:
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
    got = flat(param.data, c.offset, c.count)
    want = buffer.view(-1)[c.source_offset:c.source_offset + c.count]
    return bool(torch.equal(got.view(torch.uint8), want.view(torch.uint8)))


def _deferred(module: torch.nn.Module) -> bool:
    """Attention layers' weights (kv-cache scales) are processed by vLLM
    at the end of a reload only: leave them to it."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer

    return bool(is_deferred_attention_layer(module))


def transforms(module: torch.nn.Module, repacked: bool) -> bool:
    """Whether vLLM transforms this module's weights after loading them: a
    quantization method other than the unquantized linear and embedding
    ones, or any on CPU and XPU (the CPU build repacks each linear layer's
    weights, and the output embedding's, for its GEMM kernels)."""
    qm = getattr(module, "quant_method", None)
    return qm is not None and (repacked or type(qm).__name__ not in ("UnquantizedLinearMethod",
                                                                      "UnquantizedEmbeddingMethod"))


def repacks() -> bool:
    """Whether vLLM on this platform repacks every linear layer's weights
    after loading them (its CPU and XPU builds)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu() or current_platform.is_xpu())


def needs_reload(model: torch.nn.Module) -> bool:
    """Whether loading this model's weights needs vLLM's layerwise reload:
    whether some layer's weights are transformed after loading."""
    repacked = repacks()
    return any(transforms(m, repacked) for m in model.modules())


def process_layer(module: torch.nn.Module, staged: Dict[str, torch.nn.Parameter]) -> None:
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
