"""Writes into objects another runtime exposed: rdt.Write, a fetch the
other way. Runtime.write, write_start and write_async forward here; the
owner's side (notices, revoking) is on ObjectRef."""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _lib
from . import _tensors as _t
from ._errors import InvalidArgumentError
from ._fetch import Fetch, Plan, await_fetch, deadline_of, zero_timeout
from ._ref import ObjectRef, TensorSlice, flatten
from ._store import RuntimeLike

# What write takes: a writable ref (all its tensors) or a slice of one.
Dests = Union[ObjectRef, TensorSlice]


def _tensors_of(value: Any) -> List[Any]:
    """The tensors of a value, in put order."""
    if isinstance(value, list) and all(_t.is_tensor(x) for x in value):
        return list(value)
    found: List[Any] = []
    flatten(value, found)
    return found


def plan(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any) -> Plan:
    """Checks write's arguments: each ref takes one source per tensor (the
    value's tensors in put order, each of the tensor's shape and dtype),
    each slice one tensor of its dtype and nbytes."""
    rt._handle()  # ClosedError once the runtime is closed
    if isinstance(dests, (ObjectRef, TensorSlice)):
        lst: List[Dests] = [dests]
        values = [value]
    elif isinstance(dests, (list, tuple)):
        lst = list(dests)
        if not isinstance(value, (list, tuple)) or len(value) != len(lst):
            raise InvalidArgumentError(f"write into {len(lst)} refs and slices takes a list of as many values")
        values = list(value)
    else:
        raise InvalidArgumentError(f"write takes a writable ObjectRef, a TensorSlice of one or a list of them, "
                                   f"not {type(dests).__name__}")
    refs: List[ObjectRef] = []
    place = {}
    rows: List[Tuple[int, int, int, int]] = []
    items: List[_t.Item] = []
    objs: List[Any] = []
    partial = False
    for k, (d, v) in enumerate(zip(lst, values)):
        r = d.ref if isinstance(d, TensorSlice) else d
        if not isinstance(r, ObjectRef):
            raise InvalidArgumentError(f"write takes ObjectRefs and TensorSlices, not {type(r).__name__}")
        if r.runtime is not rt:
            raise InvalidArgumentError(f"{r!r} belongs to another runtime ({r.runtime!r}); write from there")
        if id(r) not in place:
            place[id(r)] = len(refs)
            refs.append(r)
        p = place[id(r)]
        if isinstance(d, TensorSlice):
            partial = True
            items.append(_t.item_of(v, False, f"value {k}"))
            objs.append(v)
            rows.append((p, d.index, d.offset, d.nbytes))
            continue
        descs = r.tensor_descs()
        ts = _tensors_of(v)
        if len(ts) != len(descs):
            raise InvalidArgumentError(f"value {k} holds {len(ts)} tensors; the exposed object has {len(descs)}")
        for j, (x, want) in enumerate(zip(ts, descs)):
            it = _t.item_of(x, False, f"value {k} tensor {j}")
            if tuple(it.desc.shape) != tuple(want.shape) or (it.desc.code, it.desc.bits, it.desc.lanes) != \
                    (want.code, want.bits, want.lanes):
                raise InvalidArgumentError(f"value {k} tensor {j} is {it.desc.dtype_name()}{tuple(it.desc.shape)}, "
                                           f"the exposed tensor {want.dtype_name()}{tuple(want.shape)}")
            items.append(it)
            objs.append(x)
            rows.append((p, j, 0, want.nbytes))
    return Plan(True, [], [], refs, items, objs, False, _t.sources(rows) if partial else None)


def write_options(transport: Optional[str], plan: Plan, tag: int = 0) -> Any:
    """A write's rdt_write_options. The destinations array stays plan's
    (rdt copies it during the call)."""
    opts = _lib.init(_lib.WriteOptions())
    opts.tag = int(tag) & 0xFFFFFFFFFFFFFFFF
    if transport:
        opts.transport = transport.encode()
    if plan.sources is not None:
        opts.destinations = ctypes.cast(plan.sources.ctypes.data, ctypes.POINTER(_lib.Range))
        opts.num_destinations = len(plan.sources)
    return opts


class Write(Fetch):
    """A write in flight, made by :meth:`Runtime.write_start`: waited on,
    polled, aborted, closed and awaited as an :class:`rdt.Fetch` is; its
    ``result()`` is None. Keep the source tensors unmodified until it is
    complete or closed. Once it failed or was closed, nothing of it lands
    any more, and each owner's notice for it says it failed."""

    def __init__(self, runtime: RuntimeLike, plan: Plan, transport: Optional[str], tag: int) -> None:
        # Fetch's state, started with rdt_write_start instead.
        super().__init__(runtime, Plan(True, [], [], [], [], [], False), None)
        self._plan = plan
        self._final = None
        refs = plan.fetch_refs
        if len(refs) == 1:
            handles: Any = ctypes.byref(ctypes.c_void_p(refs[0]._handle()))
        else:
            handles = (ctypes.c_void_p * len(refs))(*[r._handle() for r in refs])
        self._buf, addr = _t.pack(plan.items)
        opts = write_options(transport, plan, tag)
        f = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_write_start(runtime._handle(), handles, len(refs), addr, len(plan.items),
                                              ctypes.byref(opts), ctypes.byref(f)))
        self._ptr = f.value

    def __repr__(self) -> str:
        state = "running" if self._final is None else ("failed" if self._final[0] is not None else "done")
        n = len(self._plan.fetch_refs)
        return f"<rdt.Write into {n} ref{'s' if n != 1 else ''}, {state}>"

    def _late(self, call: str) -> str:
        n = len(self._plan.fetch_refs)
        call = call.replace("get", "write")
        return f"{call}: the deadline passed before the write into {n} object{'s' if n != 1 else ''} ended; it was aborted"

    def _result_now(self) -> Any:
        assert self._final is not None
        err = self._final[0]
        if err is not None:
            raise err
        return None


def write_start_in(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any, tag: int = 0,
                   transport: Optional[str] = None) -> Write:
    """Runtime.write_start."""
    return Write(rt, plan(rt, dests, value), transport, tag)


def write_in(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any, tag: int = 0,
             timeout: Optional[float] = None, transport: Optional[str] = None) -> None:
    """Runtime.write."""
    deadline = deadline_of(timeout)
    p = plan(rt, dests, value)
    if timeout == 0:
        deadline = zero_timeout(p.fetch_refs, "write")
    Write(rt, p, transport, tag)._result_by(deadline)


async def write_async_in(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any, tag: int = 0,
                         timeout: Optional[float] = None, transport: Optional[str] = None) -> None:
    """Runtime.write_async."""
    deadline = deadline_of(timeout)
    p = plan(rt, dests, value)
    if timeout == 0:
        deadline = zero_timeout(p.fetch_refs, "write")
    await await_fetch(Write(rt, p, transport, tag), deadline)
