"""A write under way: rdt.Write, the Pending that write_start returns, and
write, write_start and write_async in one runtime (Runtime's methods of
those names forward here). The owner's side (notices, revoking) is on
ObjectRef."""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from . import _tensors as _t
from ._errors import GetTimeoutError, InvalidArgumentError
from ._get import one_target, pack_one
from ._pending import (Pending, Plan, await_pending, deadline_of, fill_options, handles_of, ms_until, slice_ms,
                       zero_timeout)
from ._ref import ObjectRef, Range, flatten
from ._store import RuntimeLike

# What write takes: a writable ref (all its tensors) or a range of one.
Dests = Union[ObjectRef, Range]


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
    each range one tensor of its dtype and nbytes."""
    rt._handle()  # ClosedError once the runtime is closed
    if isinstance(dests, (ObjectRef, Range)):
        lst: List[Dests] = [dests]
        values = [value]
    elif isinstance(dests, (list, tuple)):
        lst = list(dests)
        if not isinstance(value, (list, tuple)) or len(value) != len(lst):
            raise InvalidArgumentError(f"write into {len(lst)} refs and ranges takes a list of as many values")
        values = list(value)
    else:
        raise InvalidArgumentError(f"write takes a writable ObjectRef, a Range of one or a list of them, "
                                   f"not {type(dests).__name__}")
    refs: List[ObjectRef] = []
    place = {}
    rows: List[Tuple[int, int, int, int]] = []
    items: List[_t.Item] = []
    objs: List[Any] = []
    partial = False
    for k, (d, v) in enumerate(zip(lst, values)):
        r = d.ref if isinstance(d, Range) else d
        if not isinstance(r, ObjectRef):
            raise InvalidArgumentError(f"write takes ObjectRefs and Ranges, not {type(r).__name__}")
        if r.runtime is not rt:
            raise InvalidArgumentError(f"{r!r} belongs to another runtime ({r.runtime!r}); write from there")
        if id(r) not in place:
            place[id(r)] = len(refs)
            refs.append(r)
        p = place[id(r)]
        if isinstance(d, Range):
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
    return Plan(True, [], [], refs, items, objs, False, _t.ranges(rows) if partial else None)


def write_options(transport: Optional[str], plan: Plan, tag: int = 0) -> Any:
    """A write's rdt_write_options. The destinations array stays plan's
    (rdt copies it during the call)."""
    opts = _lib.init(_lib.WriteOptions())
    opts.tag = int(tag) & 0xFFFFFFFFFFFFFFFF
    return fill_options(opts, transport, plan, "destinations")


class Write(Pending):
    """A write under way, made by :meth:`Runtime.write_start`: local
    sources moving into exposed objects. Waited on, polled, aborted, closed
    and awaited as its sibling :class:`rdt.Fetch` is; its ``result()`` is
    None. Keep the source tensors unmodified until it is complete or
    closed. Once it failed or was closed, nothing of it lands any more, and
    each owner's notice for it says it failed."""

    _name = "rdt.Write"

    def __init__(self, runtime: RuntimeLike, plan: Plan, transport: Optional[str], tag: int) -> None:
        super().__init__(runtime, plan)
        refs = plan.moved
        self._buf, addr, n = plan.pack()
        opts = write_options(transport, plan, tag)
        p = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_write_start(runtime._handle(), handles_of(refs), len(refs), addr, n,
                                              ctypes.byref(opts), ctypes.byref(p)))
        self._started(p.value)

    def __repr__(self) -> str:
        n = len(self._plan.moved)
        return f"<rdt.Write into {n} ref{'s' if n != 1 else ''}, {self._state()}>"

    def result(self, timeout: Optional[float] = None) -> None:
        """None once every byte landed in the owners' objects. Waits up to
        ``timeout`` seconds (None: no limit) and raises GetTimeoutError (a
        TimeoutError) when it passes, leaving the write running. Raises the
        write's error if it failed (AbortedError after ``abort()``)."""
        return super().result(timeout)

    def _value(self) -> None:
        return None

    def _objects(self) -> str:
        n = len(self._plan.moved)
        return f"{n} object{'s' if n != 1 else ''}"

    def _not_yet(self, timeout: Optional[float]) -> str:
        return (f"rdt.Write.result: the write into {self._objects()} did not end within {timeout} s; "
                "the write is still running")

    def _late(self, call: str) -> str:
        return f"{call}: the deadline passed before the write into {self._objects()} ended; it was aborted"


def write_start_in(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any, tag: int = 0,
                   transport: Optional[str] = None) -> Write:
    """Runtime.write_start."""
    return Write(rt, plan(rt, dests, value), transport, tag)


def write_in(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any, tag: int = 0,
             timeout: Optional[float] = None, transport: Optional[str] = None) -> None:
    """Runtime.write."""
    deadline = deadline_of(timeout)
    if timeout != 0 and type(value) is np.ndarray and type(dests) is ObjectRef and \
            _one(rt, dests, value, tag, transport, deadline):
        return
    p = plan(rt, dests, value)
    if timeout == 0:
        deadline = zero_timeout(p.moved, "rdt.write")
    Write(rt, p, transport, tag)._result_by(deadline, "rdt.write")


# A one-call write's scratch block, after the ref's handle and the source
# (_get.pack_one): its rdt_write_options (struct_size, reserved, transport,
# destinations, num_destinations, tag), then the rdt_pending made.
_OPTS = struct.Struct("=IIQQQQ")
assert _OPTS.size == ctypes.sizeof(_lib.WriteOptions)

# Transport names as C strings for one-call writes, by name: made once,
# never changed, kept alive here.
_NAMES: Dict[str, Any] = {}
_NAMES_KEPT = 64


def _one(rt: RuntimeLike, r: ObjectRef, value: np.ndarray, tag: int, transport: Optional[str],
         deadline: Optional[float]) -> bool:
    """The common case, one writable ref of one tensor from one array that
    matches it, started with the ref's handle, the source and the options
    packed into a scratch block, and waited for as Write is (in slices on
    the main thread, aborted at the deadline or on Ctrl-C); False where the
    general path must run."""
    found = one_target(rt, r, value)
    if found is None:
        return False
    d, data = found
    name = None
    if transport:
        name = _NAMES.get(transport)
        if name is None:
            name = ctypes.create_string_buffer(transport.encode())
            if len(_NAMES) < _NAMES_KEPT:
                name = _NAMES.setdefault(transport, name)
    L = _lib.lib()
    h = rt._handle()
    s = _lib.scratch()
    try:
        base = s.base
        at = pack_one(s, r._handle(), data, d)
        _OPTS.pack_into(s.buf, at, _OPTS.size, 0, ctypes.addressof(name) if name is not None else 0, 0, 0,
                        int(tag) & 0xFFFFFFFFFFFFFFFF)
        out = at + _OPTS.size
        status = L.rdt_write_start(h, base, 1, base + 8, 1, base + at, base + out)
        ptr = s.words[out // 8]
    finally:
        _lib.give_back(s)
    _lib.check(status)
    _wait_one(L, ptr, deadline)
    return True


def _wait_one(L: Any, ptr: int, deadline: Optional[float]) -> None:
    """Waits for a one-call write's rdt_pending and frees it, raising its
    error: in slices on the main thread, so that Ctrl-C is seen; aborted
    (and waited on until nothing reads the source) when the deadline
    passes or the wait is interrupted."""
    main = threading.get_ident() == threading.main_thread().ident
    try:
        while True:
            st = L.rdt_pending_wait(ptr, slice_ms(deadline) if main else ms_until(deadline))
            if st != _lib.ERR_TIMEOUT:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise GetTimeoutError("rdt.write: the deadline passed before the write into 1 object ended; "
                                      "it was aborted", _lib.ERR_TIMEOUT)
        err = None if st == _lib.OK else _lib.make_error(st)  # this thread's last error, before free
    except BaseException:
        L.rdt_pending_abort(ptr)
        L.rdt_pending_free(ptr)
        raise
    L.rdt_pending_free(ptr)
    if err is not None:
        raise err


async def write_async_in(rt: RuntimeLike, dests: Union[Dests, Sequence[Dests]], value: Any, tag: int = 0,
                         timeout: Optional[float] = None, transport: Optional[str] = None) -> None:
    """Runtime.write_async."""
    deadline = deadline_of(timeout)
    p = plan(rt, dests, value)
    if timeout == 0:
        deadline = zero_timeout(p.moved, "rdt.write_async")
    await await_pending(Write(rt, p, transport, tag), deadline, "rdt.write_async")
