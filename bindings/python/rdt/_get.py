"""get, get_start and get_async in one runtime: what it moves for them into
what, and the waits. Runtime's methods of those names forward here.

What this module uses of other objects is kept to a few members made for
it (tests/python/test_package.py holds it to them): of the runtime (as
RuntimeLike) its C handle, its store and ``_group_device()``; of a ref its
public face (``runtime``, ``transport``, ``tensor_descs()``), its C
handle, ``_receive_frameworks()``, ``_value_of()`` and ``_own_entry()``; of
a range its public face (``ref``, ``index``, ``offset``, ``nbytes``,
``shape``); of a fetch ``_result_by()``."""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from . import _tensors as _t
from ._errors import CorruptError, GetTimeoutError, InvalidArgumentError, NoMemoryError
from ._fetch import Fetch
from ._pending import Plan, await_pending, deadline_of, ms_until, slice_ms, zero_timeout
from ._process import PROCESS
from ._ref import ObjectRef, Range, flatten
from ._store import RuntimeLike

_ARRAYS = {np.ndarray}
_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof

# What get, get_start and get_async take: a ref (all its tensors) or a range.
Refs = Union[ObjectRef, Range]

# get of one ref into one array of at most this many bytes uses rdt_get (a
# single call), restarting with the general path if a wait's slice is not
# enough.
_SMALL = 1 << 20

# Why the one-call path gave way to the general one.
_SLOW: Any = object()

# rdt_get_options naming one transport, by name: made once per name, never
# changed afterwards (rdt only reads them), so every thread may pass them.
_OPTIONS: Dict[str, Tuple[Any, int, bytes]] = {}
_OPTIONS_KEPT = 64

# The rdt_tensor and shape of one target, after the ref's handle, by number
# of dimensions (see _one).
_ONE: Dict[int, struct.Struct] = {}
_ONE_MAX_NDIM = 32


def _options(transport: str) -> int:
    """The address of an rdt_get_options naming transport."""
    o = _OPTIONS.get(transport)
    if o is None:
        name = transport.encode()
        opts = _lib.init(_lib.GetOptions())
        opts.transport = name
        o = (opts, ctypes.addressof(opts), name)
        if len(_OPTIONS) < _OPTIONS_KEPT:
            o = _OPTIONS.setdefault(transport, o)
    return o[1]


def get_in(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]], timeout: Optional[float] = None,
           transport: Optional[str] = None, out: Any = None, device: Optional[str] = None) -> Any:
    """Runtime.get."""
    deadline = deadline_of(timeout)
    if timeout == 0:
        deadline = zero_timeout(check_refs(rt, refs)[1], "rdt.get")
    if type(out) is np.ndarray and type(refs) is ObjectRef and device is None:
        got = _one(rt, refs, out, transport, deadline)
        if got is not _SLOW:
            return got
    return Fetch(rt, plan(rt, refs, out, device, transport), transport)._result_by(deadline, "rdt.get")


def one_target(rt: RuntimeLike, r: ObjectRef, a: np.ndarray) -> Any:
    """The descriptor of r's one tensor and a's address, when a matches it
    and may take the one-call path (get's and write's): one host tensor of
    a's shape and dtype, a contiguous and writable (ctypes takes no other
    buffer), no Python transport; else None."""
    if r.runtime is not rt:
        return None
    descs = r.tensor_descs()
    if len(descs) != 1 or rt._store.python_transports:
        return None
    d = descs[0]
    nd = len(d.shape)
    if a.shape != d.shape or d.lanes != 1 or d.device_type not in _t.HOST_DEVICES or nd > _ONE_MAX_NDIM or \
            _t.NP_TO_DL.get(a.dtype) != (d.code, d.bits):
        return None
    try:
        data = _addressof(_from_buffer(a))  # type: ignore[arg-type]  # contiguous, writable, not empty
    except (TypeError, ValueError, BufferError):
        return None
    return d, data


def pack_one(s: Any, handle: int, data: int, d: Any) -> int:
    """Packs into scratch block s the ref's handle (word 0) and one
    rdt_tensor (from byte 8) with its shape; returns the first byte free
    after them."""
    nd = len(d.shape)
    st = _ONE.get(nd)
    if st is None:
        st = _ONE.setdefault(nd, struct.Struct(f"=Q QiiiBBHQQQ{nd}q"))
    st.pack_into(s.buf, 0, handle, data, d.device_type, d.device_id, nd, d.code, d.bits, 1,
                 s.base + 56 if nd else 0, 0, 0, *d.shape)
    return st.size


def _one(rt: RuntimeLike, r: ObjectRef, out: np.ndarray, transport: Optional[str], deadline: Optional[float]) -> Any:
    """The common case, one ref of one tensor into one array that matches
    it, in one call, with the ref's handle, the target and the options
    packed into a scratch block; _SLOW where the general path must run
    (any other shape, a Python transport, a large array on the main
    thread whose slice ran out)."""
    found = one_target(rt, r, out)
    if found is None:
        return _SLOW
    d, data = found
    # On the main thread it gives up (aborting) after a slice, so that
    # Ctrl-C is seen, and the general path starts again. Other threads
    # never see a signal: they wait for the whole deadline, so that a slow
    # get is not aborted and moved twice. A large get on the main thread
    # takes the general path at once rather than risk moving twice.
    main = threading.get_ident() == threading.main_thread().ident
    if main and out.nbytes > _SMALL:
        return _SLOW
    opts = _options(transport) if transport else None
    h = rt._handle()
    s = _lib.scratch()
    try:
        base = s.base
        pack_one(s, r._handle(), data, d)
        status = _rdt_get()(h, base, 1, base + 8, 1, opts, slice_ms(deadline) if main else ms_until(deadline))
    finally:
        _lib.give_back(s)
    if status == _lib.OK:
        return r._value_of([out])
    if status != _lib.ERR_TIMEOUT:
        raise _lib.make_error(status)
    if deadline is not None and time.monotonic() >= deadline:
        raise GetTimeoutError("rdt.get: the deadline passed before 1 object arrived; the get "
                              "was aborted", _lib.ERR_TIMEOUT)
    return _SLOW


def _rdt_get() -> Any:
    return _lib.lib().rdt_get


def device_of(device: Optional[str], out: Any) -> Optional[Tuple[int, int]]:
    """get's device= as a DLPack (type, id): where new tensors are made."""
    if device is None:
        return None
    if out is not None:
        raise InvalidArgumentError("give out= or device=, not both: out= says where every tensor lands")
    kind, _, index = str(device).lower().partition(":")
    code = _t.DEVICE_NAMES.get(kind)
    if code not in (_lib.DEVICE_CPU, _lib.DEVICE_CUDA) or (index and not index.isdigit()) or \
            (code == _lib.DEVICE_CPU and index not in ("", "0")):
        raise InvalidArgumentError(f"device={device!r}: name 'cpu', 'cuda' or 'cuda:N'")
    return code, int(index or 0)


def _on(d: _t.Desc, dev: Optional[Tuple[int, int]]) -> _t.Desc:
    """d on dev (None: where it is)."""
    return d if dev is None else _t.Desc(d.shape, d.code, d.bits, d.lanes, dev[0], dev[1])


def landing(d: _t.Desc, framework: str, current: Callable[[str], int], group: Optional[int] = None,
            dev: Optional[Tuple[int, int]] = None) -> _t.Desc:
    """Where a new tensor receiving the source tensor d (of ``framework``)
    is made: on ``dev`` (get's device=) when given; else a host tensor as d
    is, and a CUDA tensor on this process's own GPU, never on d's ordinal
    (which numbers the GPUs the source process sees, not ours): on
    ``group``, the device of the collective group the fetch may go over
    (nccl receives only into it), else on ``current(framework)``, the
    current device of the framework that makes the tensor."""
    if dev is not None:
        return _on(d, dev)
    if d.device_type != _lib.DEVICE_CUDA:
        return d
    return _on(d, (_lib.DEVICE_CUDA, group if group is not None else current(framework)))


def _placer(rt: RuntimeLike, dev: Optional[Tuple[int, int]],
            transport: Optional[str]) -> Callable[[_t.Desc, str, ObjectRef], _t.Desc]:
    """landing() for one get: each of its new tensors, given the source's
    descriptor, framework and ref, on its device. The current device is
    asked once per framework, and the group's device once per ref, for the
    transport its fetch names (get's transport=, else the ref's)."""
    if dev is not None:
        return lambda d, fw, r: _on(d, dev)
    asked: Dict[str, int] = {}
    groups: Dict[int, Optional[int]] = {}

    def current(fw: str) -> int:
        c = asked.get(fw)
        if c is None:
            c = asked[fw] = _t.current_cuda_device(fw)
        return c

    def place(d: _t.Desc, fw: str, r: ObjectRef) -> _t.Desc:
        if d.device_type != _lib.DEVICE_CUDA:
            return d
        k = id(r)
        if k not in groups:
            groups[k] = rt._group_device(transport or r.transport)
        return landing(d, fw, current, groups[k])
    return place


def check_refs(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]]) -> Tuple[bool, List[Refs], bool]:
    """get's refs checked: whether one was given (not a list), them as a
    list, and whether a range is among them."""
    rt._handle()  # ClosedError once the runtime is closed
    single = isinstance(refs, (ObjectRef, Range))
    if single:
        lst: List[Refs] = [refs]  # type: ignore[list-item]
    elif isinstance(refs, (list, tuple)):
        lst = list(refs)
    else:
        raise InvalidArgumentError(f"get takes an ObjectRef, a Range (ref[i]) or a list of them, "
                                   f"not {type(refs).__name__}")
    partial = False
    for r in lst:
        if isinstance(r, Range):
            partial = True
            r = r.ref
        elif not isinstance(r, ObjectRef):
            raise InvalidArgumentError(f"get takes ObjectRefs and Ranges, not {type(r).__name__}")
        if r.runtime is not rt:
            raise InvalidArgumentError(f"{r!r} belongs to another runtime ({r.runtime!r}); get it there")
        r._handle()  # ClosedError for a released ref
    return single, lst, partial


def plan(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]], out: Any, device: Optional[str] = None,
         transport: Optional[str] = None) -> Plan:
    """Checks get's arguments and decides what to fetch into what (over
    ``transport``, None: each ref's)."""
    dev = device_of(device, out)
    single, lst, partial = check_refs(rt, refs)
    if not lst:
        return Plan(single, [], [], [], [], [], out is None)
    if partial:
        return partial_plan(rt, single, lst, out, dev, transport)  # type: ignore[arg-type]
    whole: List[ObjectRef] = lst  # type: ignore[assignment]
    descs = [r.tensor_descs() for r in whole]
    tensors: List[List[Any]] = []
    moved: List[ObjectRef] = []
    items: List[_t.Item] = []
    objs: List[Any] = []
    if out is None:
        cache = PROCESS.receive_cache()
        own = [r._own_entry() if dev is None else None for r in whole]  # device=: a copy there, even of our own
        check_room([ds for ds, e in zip(descs, own) if e is None], [], dev)
        place = _placer(rt, dev, transport)
        for r, ds, e in zip(whole, descs, own):
            if e is not None:
                if e.shared:
                    rt._store.warn_shared(4)
                tensors.append(list(e.tensors))
                continue
            fws = r._receive_frameworks()
            got = [_t.allocate(place(d, fw, r), fw, cache) for d, fw in zip(ds, fws)]
            tensors.append(got)
            moved.append(r)
            objs.extend(got)
            items.extend(_t.item_of(x, writable=True) for x in got)
    else:
        outs = outs_of(out)
        flat = descs[0] if len(descs) == 1 else [d for ds in descs for d in ds]
        packed = _t.pack_out(outs, flat) if not rt._store.python_transports else None
        items = _t.check_out(outs, flat) if packed is None else []
        objs = outs
        i = 0
        for ds in descs:
            tensors.append(outs[i:i + len(ds)])
            i += len(ds)
        moved = whole
        return Plan(single, whole, tensors, moved, items, objs, False, None, packed)  # type: ignore[arg-type]
    return Plan(single, whole, tensors, moved, items, objs, owned=out is None)  # type: ignore[arg-type]


def check_room(whole: List[List[_t.Desc]], ranges: List[Tuple[int, Range]],
               dev: Optional[Tuple[int, int]]) -> None:
    """Refuses, before anything is allocated, new tensors that cannot be:
    a range past its tensor's end, an object of more tensors than an object
    holds (a ref that claims them is corrupt), and more host memory in all
    than this machine has. ``whole``: the tensors of each ref received
    whole; ``ranges``: each range received, with its place in the get."""
    host = _t.HOST_DEVICES
    on_host = dev is None or dev[0] in host
    total = count = 0
    for ds in whole:
        if len(ds) > _lib.MAX_TENSORS:
            raise CorruptError(f"rdt.get: a ref claims {len(ds)} tensors; an object holds at most "
                               f"{_lib.MAX_TENSORS}", CorruptError.status)
        count += len(ds)
        total += sum(d.nbytes for d in ds if (d.device_type in host if dev is None else on_host))
    for k, x in ranges:
        d = x.ref.tensor_descs()[x.index]
        if x.offset + x.nbytes > d.nbytes:
            raise InvalidArgumentError(f"rdt.get: item {k}, a range of tensor {x.index}: bytes [{x.offset}, "
                                       f"{x.offset}+{x.nbytes}) are outside the tensor's {d.nbytes} bytes")
        count += 1
        if (d.device_type in host) if dev is None else on_host:
            total += x.nbytes
    memory = _MEMORY
    if total > memory:
        raise NoMemoryError(f"rdt.get: {count} tensor{'s' if count != 1 else ''} of {total} bytes in all would be "
                            f"received into new host memory, more than this machine's {memory} bytes; nothing was "
                            "allocated (fetch part of them, ref[i][a:b], or into buffers of your own, out=)",
                            NoMemoryError.status)


# The machine's physical memory in bytes, read once: asking on every get
# costs a system call.
_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def outs_of(out: Any) -> List[Any]:
    """The tensors of out=, in order."""
    if type(out) is np.ndarray:
        return [out]
    if type(out) is list and set(map(type, out)) <= _ARRAYS:
        return out  # a plain list of arrays: nothing to walk
    outs: List[Any] = []
    flatten(out, outs)
    return outs


def partial_plan(rt: RuntimeLike, single: bool, lst: List[Refs], out: Any,
                 dev: Optional[Tuple[int, int]] = None, transport: Optional[str] = None) -> Plan:
    """A partial get: each range's target receives its bytes, each ref's
    targets its tensors whole (rdt moves those as usual). Every ref is
    fetched once, for all of its targets, however often the list names it.
    The sources are one array, one row per target; rdt checks each against
    the owner's description of the tensor (with out=, "source i" of its
    messages is out[i])."""
    known: Dict[int, Tuple[int, List[_t.Desc], Tuple[str, ...]]] = {}  # id of a ref -> place, descs, frameworks
    moved: List[ObjectRef] = []
    rows: List[Tuple[int, int, int, int]] = []
    tensors: List[List[Any]] = []
    items: List[_t.Item] = []
    objs: List[Any] = []

    def learn(r: ObjectRef) -> Tuple[int, List[_t.Desc], Tuple[str, ...]]:
        k = known[id(r)] = (len(moved), r.tensor_descs(), r._receive_frameworks())
        moved.append(r)
        return k

    if out is None:
        cache = PROCESS.receive_cache()
        allocate, item_of = _t.allocate, _t.item_of
        own = {id(r): r._own_entry() if dev is None else None for r in lst if type(r) is ObjectRef}
        check_room([r.tensor_descs() for r in lst if type(r) is ObjectRef and own[id(r)] is None],
                   [(i, r) for i, r in enumerate(lst) if type(r) is Range], dev)
        place = _placer(rt, dev, transport)
        for r in lst:
            if type(r) is Range:
                base = r.ref
                p, ds, fws = known.get(id(base)) or learn(base)
                d = ds[r.index]
                x = allocate(place(_t.Desc(r.shape, d.code, d.bits, d.lanes, d.device_type, d.device_id),
                                   fws[r.index], base), fws[r.index], cache)
                rows.append((p, r.index, r.offset, r.nbytes))
                tensors.append([x])
                objs.append(x)
                items.append(item_of(x, True))
                continue
            e = own[id(r)]
            if e is not None:
                if e.shared:
                    rt._store.warn_shared(5)
                tensors.append(list(e.tensors))
                continue
            p, ds, fws = known.get(id(r)) or learn(r)
            got = [allocate(place(d, fw, r), fw, cache) for d, fw in zip(ds, fws)]
            rows.extend((p, j, 0, d.nbytes) for j, d in enumerate(ds))
            tensors.append(got)
            objs.extend(got)
            items.extend(item_of(x, True) for x in got)
    else:
        outs = objs = outs_of(out)
        want = sum(1 if isinstance(r, Range) else len(r.tensor_descs()) for r in lst)
        if len(outs) != want:
            raise InvalidArgumentError(f"out= holds {len(outs)} tensors, the refs and ranges take {want}")
        i = 0
        for r in lst:
            if type(r) is Range:
                # Any shape: rdt checks the dtype, device and size itself.
                items.append(_t.item_of(outs[i], True, (i,)))
                rows.append(((known.get(id(r.ref)) or learn(r.ref))[0], r.index, r.offset, r.nbytes))
                tensors.append(outs[i:i + 1])
                i += 1
                continue
            p, ds, _ = known.get(id(r)) or learn(r)
            items.extend(_t.check_out(outs[i:i + len(ds)], ds, first=i))
            rows.extend((p, j, 0, d.nbytes) for j, d in enumerate(ds))
            tensors.append(outs[i:i + len(ds)])
            i += len(ds)
    return Plan(single, lst, tensors, moved, items, objs, out is None, _t.ranges(rows))


def get_start_in(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]], out: Any = None,
                 transport: Optional[str] = None, device: Optional[str] = None) -> Fetch:
    """Runtime.get_start."""
    return Fetch(rt, plan(rt, refs, out, device, transport), transport)


async def get_async_in(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]],
                       timeout: Optional[float] = None, transport: Optional[str] = None, out: Any = None,
                       device: Optional[str] = None) -> Any:
    """Runtime.get_async."""
    deadline = deadline_of(timeout)  # a bad timeout starts nothing
    if timeout == 0:
        deadline = zero_timeout(check_refs(rt, refs)[1], "rdt.get_async")
    return await await_pending(get_start_in(rt, refs, out=out, transport=transport, device=device), deadline,
                               "rdt.get_async")

