"""get(copy=False): views of objects instead of copies. A view maps a
same-host owner's staged copy into this process (rdt_view_open), so that
every reader on a host shares one copy. numpy arrays over it are
read-only; torch has no read-only tensors, so an object received as torch
is mapped copy-on-write: writing a tensor copies the pages written into
this process alone, and the shared copy never changes.

Each array keeps its view alive (through the buffer it was made from); the
view, and the borrow it holds on the object, is released when the last of
them is garbage collected (at once, with CPython, when the last reference
goes)."""

from __future__ import annotations

import asyncio
import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from . import _tensors as _t
from ._errors import CorruptError, InvalidArgumentError, UnsupportedError
from ._get import Refs, check_refs
from ._get import get_async_in as copy_async
from ._get import get_in as copy_in
from ._handle import Handle
from ._pending import deadline_of, ms_until
from ._ref import ObjectRef, Range
from ._store import RuntimeLike


class _View(Handle):
    """An rdt_view: the mapping and its borrow, released with the last
    array over it (each holds it through its buffer)."""

    def _free(self, ptr: int) -> None:
        _lib.lib().rdt_view_release(ptr)


class _Opened:
    """A view's bytes: one flat uint8 array over the mapping (whole) and
    where each tensor starts in it, or (a runtime's own tensors, which
    need not be in one mapping) a flat array per tensor."""

    def __init__(self, whole: Optional[np.ndarray], offsets: List[int], sizes: List[int],
                 flats: Optional[List[np.ndarray]] = None) -> None:
        self.whole, self.offsets, self.sizes, self._flats = whole, offsets, sizes, flats

    def flat(self, i: int) -> np.ndarray:
        if self._flats is not None:
            return self._flats[i]
        o = self.offsets[i]
        return self.whole[o:o + self.sizes[i]]  # type: ignore[index]


def _open(rt: RuntimeLike, r: ObjectRef, private: bool, transport: Optional[str],
          deadline: Optional[float]) -> _Opened:
    """Opens a view of r's object: its bytes, in arrays that hold the view
    (read-only unless private)."""
    L = _lib.lib()
    opts = _lib.init(_lib.ViewOptions())
    opts.flags = _lib.VIEW_PRIVATE if private else 0
    opts.transport = transport.encode() if transport else None
    out = ctypes.c_void_p()
    _lib.check(L.rdt_view_open(rt._handle(), r._handle(), ctypes.byref(opts), ms_until(deadline),
                               ctypes.byref(out)))
    v = _View(out.value or 0)
    descs = r.tensor_descs()
    addrs = np.zeros(len(descs), np.uint64)
    held = np.zeros(len(descs), np.uint64)
    mapped = ctypes.c_int32()
    _lib.check(L.rdt_view_data(v._handle(), addrs.ctypes.data, len(descs), ctypes.byref(mapped)))
    # What each tensor's address holds is the view's (the owner's, checked
    # against the mapping), never what the ref says: arrays are sized by it.
    _lib.check(L.rdt_view_sizes(v._handle(), held.ctypes.data, len(descs)))
    sizes = held.tolist()
    if sizes != [d.nbytes for d in descs]:
        i = next(i for i, (d, n) in enumerate(zip(descs, sizes)) if d.nbytes != n)
        raise CorruptError(f"tensor {i} of the view holds {sizes[i]} bytes; the ref describes "
                           f"{descs[i].nbytes} ({descs[i].dtype_name()} {tuple(descs[i].shape)}): refusing the ref")
    if not mapped.value or not any(sizes):
        return _Opened(None, [], sizes, [_bytes_of(v, int(a), n, private) for a, n in zip(addrs, sizes)])
    # One mapping holds them all: one buffer over it, each tensor at its
    # offset (tens of thousands of tensors make a buffer each slow).
    lo = min(int(a) for a, n in zip(addrs, sizes) if n)
    hi = max(int(a) + n for a, n in zip(addrs, sizes) if n)
    return _Opened(_bytes_of(v, lo, hi - lo, private), [a - lo if n else 0 for a, n in zip(addrs.tolist(), sizes)],
                   sizes)


def _bytes_of(v: _View, addr: int, n: int, writable: bool) -> np.ndarray:
    """The n bytes at addr as a flat uint8 array that holds v (read-only
    unless writable: numpy then refuses to make it writable again)."""
    if n == 0:
        b = np.empty(0, dtype=np.uint8)
    else:
        raw = (ctypes.c_char * n).from_address(addr)
        raw._rdt_view = v  # type: ignore[attr-defined]  # the array's buffer keeps the view
        b = np.frombuffer(raw if writable else memoryview(raw).toreadonly(), dtype=np.uint8)  # type: ignore[call-overload]
    if not writable:
        b.flags.writeable = False
    return b


def _tensor(flat: np.ndarray, d: _t.Desc, shape: Sequence[int], fw: str) -> Any:
    """A tensor of d's dtype and shape over flat bytes, of framework fw."""
    if fw == "torch":
        import torch
        name = _t._DL_TO_TORCH.get((d.code, d.bits))
        if name is None or d.lanes != 1:
            raise UnsupportedError(f"no torch dtype for {d.dtype_name()}")
        if flat.size == 0:
            return torch.empty(tuple(shape), dtype=getattr(torch, name))
        return torch.from_numpy(flat).view(getattr(torch, name)).reshape(tuple(shape))
    dt = d.numpy_dtype
    a = flat if dt is None else flat.view(dt).reshape(tuple(shape))  # a dtype numpy lacks: its bytes
    a.flags.writeable = False  # even over a copy-on-write mapping made for torch tensors beside it
    return a


def _arrays(o: _Opened, ds: List[_t.Desc]) -> List[np.ndarray]:
    """Read-only numpy arrays over a view's one buffer, each made in one
    call; a dtype numpy lacks comes as its bytes."""
    out = []
    whole, offsets, empty = o.whole, o.offsets, np.ndarray
    for d, off in zip(ds, offsets):
        dt = d.numpy_dtype
        if dt is None:
            out.append(whole[off:off + d.nbytes])  # type: ignore[index]
        elif d.nbytes:
            out.append(empty(d.shape, dt, whole, off))
        else:
            a = np.empty(d.shape, dt)
            a.flags.writeable = False
            out.append(a)
    return out


def view_in(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]], timeout: Optional[float],
            transport: Optional[str]) -> Any:
    """Runtime.get(copy=False): get's structure, each tensor a view."""
    deadline = deadline_of(timeout)
    single, lst, _ = check_refs(rt, refs)
    opened: Dict[int, Tuple[ObjectRef, _Opened]] = {}  # id of a ref -> its view's bytes

    def open_once(r: ObjectRef) -> _Opened:
        got = opened.get(id(r))
        if got is None:
            got = (r, _open(rt, r, "torch" in r._receive_frameworks(), transport, deadline))
            opened[id(r)] = got
        return got[1]

    values: List[Any] = []
    for x in lst:
        r = x.ref if isinstance(x, Range) else x
        e = r._own_entry()
        if e is not None and not isinstance(x, Range):
            if transport:
                open_once(r)  # a view of our own maps nothing, but the name is checked as for another's
            values.append(r._value_of(list(e.tensors)))  # our own: the put tensors, as get gives them
            continue
        o, ds, fws = open_once(r), r.tensor_descs(), r._receive_frameworks()
        if isinstance(x, Range):
            d = ds[x.index]
            part = o.flat(x.index)[x.offset:x.offset + x.nbytes]
            values.append(x._value_of([_tensor(part, d, x.shape, fws[x.index])]))
        elif o.whole is not None and not o.whole.flags.writeable:
            values.append(r._value_of(_arrays(o, ds)))  # numpy alone: read-only, the quick way
        else:
            values.append(r._value_of([_tensor(o.flat(i), d, d.shape, fw) for i, (d, fw) in enumerate(zip(ds, fws))]))
    return values[0] if single else values


def get_in(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]], timeout: Optional[float], transport: Optional[str],
           out: Any, device: Optional[str], copy: Optional[bool]) -> Any:
    """Runtime.get with copy other than True: False views (or raises),
    None views where it can and copies elsewhere."""
    if copy is not None and copy is not False:
        raise InvalidArgumentError(f"copy must be True, False or None, not {copy!r}")
    if out is not None or device is not None:
        if copy is None:
            return copy_in(rt, refs, timeout=timeout, transport=transport, out=out, device=device)
        raise InvalidArgumentError("copy=False returns views of the owner's memory; out= and device= ask for a "
                                   "copy: leave them out, or use copy=True")
    if copy is False:
        return view_in(rt, refs, timeout, transport)
    try:
        return view_in(rt, refs, timeout, None)
    except UnsupportedError:  # another host, device memory: a copy it is
        return copy_in(rt, refs, timeout=timeout, transport=transport, out=None, device=None)


async def get_async_in(rt: RuntimeLike, refs: Union[Refs, Sequence[Refs]], timeout: Optional[float],
                       transport: Optional[str], out: Any, device: Optional[str], copy: Optional[bool]) -> Any:
    """Runtime.get_async with copy other than True: get_in on a thread (a
    view waits only for the owner's answers); a copy into out= or onto a
    device as get_async makes it."""
    if copy is None and (out is not None or device is not None):
        return await copy_async(rt, refs, timeout=timeout, transport=transport, out=out, device=device)
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: get_in(rt, refs, timeout, transport, out, device, copy))
