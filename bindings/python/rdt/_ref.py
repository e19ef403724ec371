"""Object references, byte ranges of their tensors, and the structure put
around the tensors."""

from __future__ import annotations

import asyncio
import ctypes
import math
import operator
import pickle
import time
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _lib
from . import _tensors as _t
from ._errors import GetTimeoutError, InvalidArgumentError, RdtError, error_for
from ._handle import Handle
from ._store import Entry, RuntimeLike

_string_at = ctypes.string_at


# ---- the structure around the tensors -----------------------------------------

def _oid_of(data: bytes) -> str:
    """The object id of a serialized ref of version 1, read from its bytes
    (the body starts with it: docs/design.md), or "" for any other form."""
    if data[:6] == b"RDTR\x01\x00" and len(data) >= 28:
        return data[12:28].hex()
    return ""


class _Slot:
    """Stands for the n-th tensor of an object inside its pickled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> Any:
        return (_Slot, (self.index,))

    def __repr__(self) -> str:
        return f"<tensor {self.index}>"


def flatten(value: Any, found: List[Any]) -> Any:
    """The skeleton of value: its lists, tuples (named ones too) and dicts,
    with every tensor moved to found and replaced by a _Slot."""
    if _t.is_tensor(value):
        found.append(value)
        return _Slot(len(found) - 1)
    tp = type(value)
    if tp is list:
        return [flatten(v, found) for v in value]
    if tp is dict:
        return {k: flatten(v, found) for k, v in value.items()}
    if tp is tuple:
        return tuple(flatten(v, found) for v in value)
    if isinstance(value, tuple):
        items = [flatten(v, found) for v in value]
        return tp(*items) if hasattr(value, "_fields") else tp(items)
    if isinstance(value, list):
        new = tp.__new__(tp)  # type: ignore[call-overload]
        new.__dict__.update(getattr(value, "__dict__", {}))
        new.extend(flatten(v, found) for v in value)
        return new
    if isinstance(value, dict):
        try:
            new = value.copy()
        except Exception:
            new = dict(value)
        for k, v in value.items():
            new[k] = flatten(v, found)
        return new
    return value


def unflatten(skeleton: Any, tensors: Sequence[Any]) -> Any:
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    tp = type(skeleton)
    if tp is list or isinstance(skeleton, list):
        for i, v in enumerate(skeleton):
            skeleton[i] = unflatten(v, tensors)
        return skeleton
    if tp is dict or isinstance(skeleton, dict):
        for k, v in list(skeleton.items()):
            skeleton[k] = unflatten(v, tensors)
        return skeleton
    if isinstance(skeleton, tuple):
        items = [unflatten(v, tensors) for v in skeleton]
        return tp(*items) if hasattr(skeleton, "_fields") else tp(items)
    return skeleton


# A skeleton travels pickled with the ref. These two mean "no pickle needed".
SINGLE = None        # the value was one tensor
# A tuple of ints n means "a plain list of n tensors".


def encode_skeleton(skeleton: Any, n: int) -> Any:
    if isinstance(skeleton, _Slot):
        return SINGLE
    if type(skeleton) is list and len(skeleton) == n and all(
            isinstance(s, _Slot) and s.index == i for i, s in enumerate(skeleton)):
        return n
    try:
        return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise InvalidArgumentError(f"the structure around the tensors cannot be pickled: {e}") from e


def decode_skeleton(blob: Any, tensors: Sequence[Any]) -> Any:
    if blob is SINGLE:
        return tensors[0] if len(tensors) == 1 else list(tensors)
    if isinstance(blob, int):
        return list(tensors)
    return unflatten(pickle.loads(blob), tensors)


# ---- notices of writes into exposed objects ------------------------------------

class WriteNotice(NamedTuple):
    """How one write into an exposed object ended, as its owner learns it
    (:meth:`ObjectRef.wait_notice`). ``error`` is None when every byte of
    the write landed; otherwise the bytes it covers may hold any mix of old
    and new values (a torn write) and ``error`` says why."""

    tag: int       # the writer's tag (write(..., tag=), run(tag)) of the
    #                write or run the notice is for
    nbytes: int    # the bytes the write covered
    writer: str    # the writing runtime's id
    error: Optional[RdtError]

    @property
    def ok(self) -> bool:
        """Whether every byte of the write landed."""
        return self.error is None


def _wait_in_slices(call: Any, timeout: Optional[float], late: str) -> None:
    """Calls call(ms), a C wait that returns OK or TIMEOUT, in slices of at
    most 100 ms (so that Ctrl-C is seen between them) until OK, or raises
    GetTimeoutError(late) once timeout seconds (None: no limit) passed."""
    t = _lib.timeout_seconds(timeout)
    deadline = None if t is None else time.monotonic() + t
    while True:
        left = 100.0 if deadline is None else min(100.0, (deadline - time.monotonic()) * 1000 + 0.999)
        st = call(max(0, int(left)))
        if st == _lib.OK:
            return
        if st != _lib.ERR_TIMEOUT:
            raise _lib.make_error(st)
        if deadline is not None and time.monotonic() >= deadline:
            raise GetTimeoutError(late, _lib.ERR_TIMEOUT)


def _notice_of(n: Any) -> WriteNotice:
    err = None
    if n.status != _lib.OK:
        err = error_for(n.status, n.message.decode(errors="replace"))
    return WriteNotice(int(n.tag), int(n.nbytes), n.writer.decode(), err)


# ---- byte ranges of one tensor -------------------------------------------------

class Range:
    """A byte range of one tensor of a ref (rdt_range in C, rdt::Range in
    C++), the tensor whole or part of it: ``ref[i]`` (the i-th tensor in put
    order) or ``ref["key"]`` (a tensor of a dict that was put), then
    optionally ``[a:b]`` (rows a to b of the first dimension, numpy's rules
    for negative and omitted bounds, step 1) or ``[k]`` (row k), or
    ``.bytes(offset, length)``. ``get``, ``get_start``, ``get_async`` and
    ``prepare_get`` take it wherever they take a ref, and receive only those
    bytes: into a new tensor of ``shape`` in the producer's framework, or
    into an ``out=`` buffer of the same dtype and ``nbytes`` (any shape).
    ``write``, ``write_start``, ``write_async`` and ``prepare_write`` take a
    range of a writable ref, and write only those bytes.

    Bounds are checked when the get or write starts, against the owner's
    description: rows past the end are refused then (InvalidArgumentError).
    A range is cut once: index ``ref[i]`` again for other rows.
    """

    __slots__ = ("ref", "index", "offset", "nbytes", "shape", "_desc", "_sliced")

    def __init__(self, ref: "ObjectRef", index: int, desc: _t.Desc, offset: int, nbytes: int,
                 shape: Tuple[int, ...], sliced: bool) -> None:
        self.ref = ref        # the ObjectRef the tensor belongs to
        self.index = index    # the tensor's place in put order
        self.offset = offset  # the first byte of the tensor received
        self.nbytes = nbytes  # how many bytes are received
        self.shape = shape    # of the tensor get allocates for it
        self._desc = desc     # the whole source tensor
        self._sliced = sliced

    @property
    def dtype(self) -> str:
        """The source tensor's dtype, by name (as ``ObjectRef.dtypes``)."""
        return self._desc.dtype_name()

    def __getitem__(self, key: Union[int, slice]) -> "Range":
        if self._sliced:
            raise InvalidArgumentError(f"{self!r} is already cut from its tensor: index the ref again "
                                       f"(ref[{self.index}][a:b]) for other rows")
        d = self._desc
        if not d.shape:
            raise InvalidArgumentError(f"tensor {self.index} is a scalar (shape ()): it has no rows")
        rows, rest = d.shape[0], tuple(d.shape[1:])
        row_bytes = math.prod(rest) * ((d.bits * d.lanes + 7) // 8)
        if isinstance(key, slice):
            label = ":".join("" if v is None else str(v) for v in (key.start, key.stop, key.step)).rstrip(":")
            if key.step is not None and operator.index(key.step) != 1:
                raise InvalidArgumentError(f"rows [{label}] of tensor {self.index}: the step must be 1 (rdt moves "
                                           "a contiguous range of rows); get the range and slice it locally")
            a = self._row(key.start, 0, rows, label)
            b = max(a, self._row(key.stop, rows, rows, label))  # numpy: b <= a is empty
            return Range(self.ref, self.index, d, a * row_bytes, (b - a) * row_bytes, (b - a,) + rest, True)
        if isinstance(key, bool) or not hasattr(key, "__index__"):
            raise InvalidArgumentError(f"index the rows of tensor {self.index} with an int or a slice a:b, "
                                       f"not {type(key).__name__}")
        k = self._row(key, 0, rows, str(key))
        return Range(self.ref, self.index, d, k * row_bytes, row_bytes, rest, True)

    def _row(self, bound: Any, default: int, rows: int, label: str) -> int:
        """A row bound with numpy's meaning of negatives. Rows past the end
        are left for rdt to refuse when the get or write starts (it checks
        against the owner's description); rows before the first cannot be
        expressed at all."""
        if bound is None:
            return default
        i = operator.index(bound)
        if i < 0:
            i += rows
            if i < 0:
                raise InvalidArgumentError(f"rows [{label}] of tensor {self.index}: row {bound} is before the "
                                           f"first of its {rows} rows")
        return i

    def bytes(self, offset: int, length: Optional[int] = None) -> "Range":
        """``length`` bytes (None: to the end) from byte ``offset`` of the
        tensor, as a flat tensor of its dtype: both must fall on its
        elements (rdt refuses them when the get or write starts otherwise)."""
        if self._sliced:
            raise InvalidArgumentError(f"{self!r} is already cut from its tensor: take bytes of ref[{self.index}]")
        d = self._desc
        offset = operator.index(offset)
        if offset < 0 or (length is not None and operator.index(length) < 0):
            raise InvalidArgumentError(f"bytes({offset}, {length}): offset and length must not be negative")
        n = max(0, d.nbytes - offset) if length is None else operator.index(length)
        elem = (d.bits * d.lanes + 7) // 8
        return Range(self.ref, self.index, d, offset, n, (n // elem,), True)

    def _value_of(self, tensors: Sequence[Any]) -> Any:
        """What get returns for it: its one tensor."""
        return tensors[0]

    def __repr__(self) -> str:
        return (f"rdt.Range(tensor {self.index} of {self.ref!r}, bytes [{self.offset}, "
                f"{self.offset + self.nbytes}), shape={self.shape}, dtype={self.dtype})")


# ---- references ------------------------------------------------------------

class ObjectRef(Handle):
    """A counted reference to an object put in some runtime.

    Pickle it to hand it to another process: unpickling makes a *borrow* in
    that process's default runtime, which the owner counts. ``close()`` (or
    leaving a ``with`` block, or garbage collection) releases this handle.
    """

    # Defaults read through the class: a put or an unpickle, which make a
    # ref every time, set only what they know.
    _descs: Optional[List[_t.Desc]] = None
    _entry: Optional[Entry] = None  # set when this process put the object (it owns it)
    _oid = ""
    _info_cache: Optional[Tuple[str, str, bool, int]] = None
    _tree: Any = None  # the put structure, read by ref[key]

    def __init__(self, runtime: RuntimeLike, ptr: int, skeleton: Any, frameworks: Tuple[str, ...],
                 descs: Optional[List[_t.Desc]] = None, entry: Optional[Entry] = None,
                 oid: str = "") -> None:
        self._ptr = ptr
        self._runtime = runtime
        self._skeleton = skeleton
        self._frameworks = frameworks
        if descs is not None:
            self._descs = descs
        if entry is not None:
            self._entry = entry
        if oid:
            self._oid = oid

    def _free(self, ptr: int) -> None:
        # Also after the runtime was destroyed: the handle answers CLOSED
        # then, but releasing it frees the handle itself.
        self._entry = None  # the put tensors are rdt's to keep or drop now
        _lib.lib().rdt_ref_release(ptr)

    def close(self) -> None:
        """Releases this handle (idempotent; safe from several threads)."""
        p = self._take()
        if p is not None:
            self._entry = None
            _lib.lib().rdt_ref_release(p)

    # ---- what it points to -------------------------------------------------

    def _info(self) -> Tuple[str, str, bool, int]:
        c = self._info_cache
        if c is None:
            c = self._info_cache = _lib.ref_info(self._handle())[:4]
        return c

    @property
    def runtime(self) -> RuntimeLike:
        """The runtime this handle belongs to."""
        return self._runtime

    @property
    def id(self) -> str:
        """The object id: 32 hexadecimal characters, unique across runtimes."""
        return self._oid or self._info()[0]

    @property
    def transport(self) -> Optional[str]:
        """The transport named at put, or None when each fetch chooses."""
        return self._info()[1] or None

    @property
    def is_owner(self) -> bool:
        """Whether this handle's runtime owns (put) the object."""
        return self._info()[2]

    @property
    def nbytes(self) -> int:
        """Bytes over all the object's tensors."""
        return self._info()[3]

    @property
    def writable(self) -> bool:
        """Whether this is a writable ref (made by ``Runtime.expose``): its
        holders write into the object instead of fetching it."""
        return _lib.ref_info(self._handle()).is_writable

    # ---- the owner's side of an exposed object ---------------------------------

    def wait_notice(self, timeout: Optional[float] = None) -> WriteNotice:
        """Takes the oldest notice of a write into this exposed object (the
        owner's ref), waiting up to ``timeout`` seconds (None: no limit;
        0: only look) for one: GetTimeoutError (a TimeoutError) when none
        came. Every write the owner admitted ends in exactly one notice, in
        the order writes ended. Ctrl-C interrupts the wait."""
        n = _lib.init(_lib.WriteNotice())
        L = _lib.lib()
        _wait_in_slices(lambda ms: L.rdt_write_notice_wait(self._handle(), ms, ctypes.byref(n)), timeout,
                        f"wait_notice: no write notice within {timeout} s")
        return _notice_of(n)

    def notice_fd(self) -> int:
        """A descriptor that is readable while notices of this exposed
        object wait to be taken (poll it, then ``wait_notice(0)``). It
        belongs to the object and closes when the object is freed."""
        fd = ctypes.c_int32(-1)
        _lib.check(_lib.lib().rdt_write_notice_event_fd(self._handle(), ctypes.byref(fd)))
        return fd.value

    async def wait_notice_async(self, timeout: Optional[float] = None) -> WriteNotice:
        """:meth:`wait_notice` for asyncio: the event loop watches
        :meth:`notice_fd`, no thread waits."""
        t = _lib.timeout_seconds(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if t is None else loop.time() + t
        n = _lib.init(_lib.WriteNotice())
        L = _lib.lib()
        while True:
            st = L.rdt_write_notice_wait(self._handle(), 0, ctypes.byref(n))
            if st == _lib.OK:
                return _notice_of(n)
            if st != _lib.ERR_TIMEOUT:
                raise _lib.make_error(st)
            fd = self.notice_fd()
            fut = loop.create_future()
            loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
            try:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                await asyncio.wait_for(fut, left)
            except asyncio.TimeoutError:
                raise GetTimeoutError(f"wait_notice_async: no write notice within {timeout} s",
                                      _lib.ERR_TIMEOUT) from None
            finally:
                loop.remove_reader(fd)

    def revoke_writes(self, timeout: Optional[float] = None) -> None:
        """Revokes every writable ref of this exposed object (the owner's
        ref): no write is admitted any more (PermissionDeniedError for the
        writer), serialized copies not yet deserialized stop holding it, and
        this waits up to ``timeout`` seconds until no admitted write is open
        (GetTimeoutError when they still are; the revocation stays). Once it
        returns nothing writes into the memory any more."""
        L = _lib.lib()
        _wait_in_slices(lambda ms: L.rdt_ref_revoke_writes(self._handle(), ms), timeout,
                        f"revoke_writes: writes are still open after {timeout} s; the revocation stays")

    def tensor_descs(self) -> List[_t.Desc]:
        """Shape, dtype and device of each tensor, in put order."""
        d = self._descs
        if d is None:
            L = _lib.lib()
            h = self._handle()
            info = _lib.ref_info(h)
            if self._info_cache is None:
                self._info_cache = info[:4]
            d = []
            ti = _lib.init(_lib.TensorInfo())
            for i in range(info.num_tensors):
                _lib.check(L.rdt_ref_tensor_info(h, i, ctypes.byref(ti)))
                d.append(_t.desc_of_info(ti))
            self._descs = d
        return d

    def _receive_frameworks(self) -> Tuple[str, ...]:
        """The framework to receive each tensor into: the producer's, where
        the ref carries them (a pickled ref does), else numpy."""
        return self._frameworks or ("numpy",) * len(self.tensor_descs())

    def _value_of(self, tensors: Sequence[Any]) -> Any:
        """The put structure around these tensors (in put order)."""
        return decode_skeleton(self._skeleton, tensors)

    # ---- one tensor of it ------------------------------------------------------

    def __getitem__(self, key: Any) -> Range:
        """The tensor ``key`` names, as a :class:`Range` to get alone or cut
        to rows or bytes. An int is a place in put order (negative from the end);
        a tuple is a path through nested dicts (keys) and lists or tuples
        (ints); anything else is a key of the dict that was put."""
        if isinstance(key, tuple):
            return self._tensor(self._path(key))
        if isinstance(key, bool) or not hasattr(key, "__index__"):
            return self._tensor(self._path((key,)))
        descs = self.tensor_descs()
        i = operator.index(key)
        if not -len(descs) <= i < len(descs):
            raise InvalidArgumentError(f"ref[{key}]: the object has {len(descs)} tensor"
                                       f"{'s' if len(descs) != 1 else ''}")
        return self._tensor(i % len(descs))

    # Indexable but not a sequence: iterating a ref stays a TypeError.
    __iter__ = None

    def _tensor(self, i: int) -> Range:
        d = self.tensor_descs()[i]
        return Range(self, i, d, 0, d.nbytes, tuple(d.shape), False)

    def _path(self, path: Tuple[Any, ...]) -> int:
        """The put-order index of the tensor at path in the put structure."""
        node = self._structure()
        for depth, k in enumerate(path):
            where = "ref" + "".join(f"[{p!r}]" for p in path[:depth])
            if isinstance(node, dict):
                if k not in node:
                    keys = [repr(x) for x, _ in zip(node, range(8))]
                    more = ", ..." if len(node) > len(keys) else ""
                    raise InvalidArgumentError(f"{where} has no key {k!r} (keys: {', '.join(keys)}{more})")
                node = node[k]
            elif isinstance(node, (list, tuple)) and not isinstance(k, bool) and hasattr(k, "__index__"):
                if not -len(node) <= operator.index(k) < len(node):
                    raise InvalidArgumentError(f"{where}[{k!r}]: it holds {len(node)} items")
                node = node[k]
            else:
                what = "a tensor" if isinstance(node, _Slot) else f"a {type(node).__name__}"
                raise InvalidArgumentError(f"{where}[{k!r}]: {where} is {what}, which takes no key {k!r}")
        if not isinstance(node, _Slot):
            raise InvalidArgumentError(f"ref{''.join(f'[{p!r}]' for p in path)} is a {type(node).__name__}, "
                                       f"not one tensor")
        return node.index

    def _structure(self) -> Any:
        """The put structure with a _Slot for each tensor (read, never changed)."""
        s = self._tree
        if s is None:
            blob = self._skeleton
            if blob is SINGLE or isinstance(blob, int):  # as decode_skeleton reads them
                n = len(self.tensor_descs())
                s = _Slot(0) if blob is SINGLE and n == 1 else [_Slot(i) for i in range(n)]
            else:
                s = pickle.loads(blob)
            self._tree = s
        return s

    @property
    def shapes(self) -> List[Tuple[int, ...]]:
        return [tuple(d.shape) for d in self.tensor_descs()]

    @property
    def dtypes(self) -> List[str]:
        return [d.dtype_name() for d in self.tensor_descs()]

    # ---- handles and bytes ---------------------------------------------------

    def serialize(self) -> bytes:
        """The ref as the C ABI's bytes (readable by any language's binding).
        The bytes keep the object alive for the owner's lease or until they
        are deserialized. The structure around the tensors is not in them:
        pickle the ObjectRef to carry it too."""
        L = _lib.lib()
        h = self._handle()
        s = _lib.scratch()
        try:
            st = L.rdt_ref_serialize(h, s.base, s.base + 8)
            if st != _lib.OK:
                raise _lib.make_error(st)
            words = s.words
            data = words[0]
            try:
                out = _string_at(data, words[1])
            finally:
                L.rdt_bytes_free(data)
        finally:
            _lib.give_back(s)
        e = self._own_entry()
        if e is not None:
            # The ref may come back: index the object by id so that its
            # own tensors are found then (see _own_entry).
            e.sent += 1
            if not e.oid:
                self._oid = _oid_of(out) or self._info()[0]
                self._runtime._store.index(e, self._oid)
        return out

    def _own_entry(self) -> Optional[Entry]:
        """The put entry if this ref's runtime owns the object (it put it)."""
        e = self._entry
        if e is None:
            store = self._runtime._store
            if store.by_id:  # only serialized objects can come back
                e = store.own(self._oid or self._info()[0])
                if e is not None:
                    self._entry = e
        return e

    def clone(self) -> "ObjectRef":
        """Another handle to the same object (release both)."""
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_ref_clone(self._handle(), ctypes.byref(out)))
        r = ObjectRef(self._runtime, out.value or 0, self._skeleton, self._frameworks, self._descs, self._entry,
                      self._oid)
        r._info_cache = self._info_cache
        return r

    def release(self, *, revoke_leases: bool = False) -> None:
        """Releases this handle, as :meth:`close` does (idempotent).

        ``revoke_leases=True``, in the runtime that owns the object, also
        ends every lease of the object now, as if it had expired: pickled or
        serialized copies that nobody has unpickled yet stop holding it, so
        the object is freed as soon as no handle and no borrow is left,
        rather than after the owner's lease (two minutes by default). When
        this call frees it, no transport serves it any more once the call
        returns. Once it is freed, such bytes make a ref whose first get
        raises :class:`NotFoundError`. Borrows already made are kept. For a host
        that knows those bytes will never be unpickled. On a borrowed ref it
        raises :class:`InvalidArgumentError` and the handle stays open.
        """
        if not revoke_leases:
            self.close()
            return
        p = self._take()
        if p is None:
            return
        status = _lib.lib().rdt_ref_release_ex(p, _lib.RELEASE_REVOKE_LEASES)
        if status != _lib.OK:
            self._ptr = p  # refused: the handle was not released
            _lib.check(status)
        self._entry = None  # the put tensors are rdt's to keep or drop now

    def __copy__(self) -> "ObjectRef":
        return self.clone()

    def __deepcopy__(self, memo: Any) -> "ObjectRef":
        return self.clone()

    def _pickle_args(self) -> Tuple[bytes, Any, Tuple[str, ...], Any, str]:
        """What a pickled ref carries (rdt._default pickles refs with it):
        the C bytes, plus what they lack: the structure around the tensors,
        their frameworks, and (to spare the receiver two calls) the
        descriptions and id. rdt checks targets against its own bytes."""
        data = self.serialize()
        descs = tuple(map(tuple, self._descs)) if self._descs is not None else None
        oid = self._oid or (self._info_cache[0] if self._info_cache else "")
        return (data, self._skeleton, self._frameworks, descs, oid)

    def __repr__(self) -> str:
        if self.closed:
            return "ObjectRef(<released>)"
        try:
            oid, tr, _, _ = self._info()
            shapes = self.shapes
            # An object may hold a million tensors: name a few.
            shown = repr(shapes) if len(shapes) <= 8 else f"[{', '.join(map(str, shapes[:4]))}, ... {len(shapes)} tensors]"
            return f"ObjectRef(id={oid}, transport={tr or 'auto'}, shapes={shown})"
        except Exception as e:  # the runtime may be gone
            return f"ObjectRef(<{type(e).__name__}: {e}>)"

