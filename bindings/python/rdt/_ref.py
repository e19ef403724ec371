"""Object references, and the structure put around the tensors."""

from __future__ import annotations

import ctypes
import pickle
from typing import Any, List, Optional, Sequence, Tuple

from . import _lib
from . import _tensors as _t
from ._errors import InvalidArgumentError
from ._handle import Handle
from ._store import Entry, RuntimeLike


# ---- the structure around the tensors -----------------------------------------

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


# ---- references ------------------------------------------------------------

class ObjectRef(Handle):
    """A counted reference to an object put in some runtime.

    Pickle it to hand it to another process: unpickling makes a *borrow* in
    that process's default runtime, which the owner counts. ``close()`` (or
    leaving a ``with`` block, or garbage collection) releases this handle.
    """

    def __init__(self, runtime: RuntimeLike, ptr: int, skeleton: Any, frameworks: Tuple[str, ...],
                 descs: Optional[List[_t.Desc]] = None, entry: Optional[Entry] = None,
                 oid: str = "") -> None:
        self._ptr = ptr
        self._runtime = runtime
        self._skeleton = skeleton
        self._frameworks = frameworks
        self._descs = descs
        self._entry = entry  # set when this process put the object (it owns it)
        self._oid = oid
        self._info_cache: Optional[Tuple[str, str, bool, int]] = None

    def _free(self, ptr: int) -> None:
        # Also after the runtime was destroyed: the handle answers CLOSED
        # then, but releasing it frees the handle itself.
        self._entry = None  # the put tensors are rdt's to keep or drop now
        _lib.lib().rdt_ref_release(ptr)

    # ---- what it points to -------------------------------------------------

    def _info(self) -> Tuple[str, str, bool, int]:
        c = self._info_cache
        if c is None:
            info = _lib.init(_lib.ObjectInfo())
            _lib.check(_lib.lib().rdt_ref_info(self._handle(), ctypes.byref(info)))
            c = (info.object_id.decode(), info.transport.decode(), bool(info.is_owner), int(info.nbytes))
            self._info_cache = c
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

    def tensor_descs(self) -> List[_t.Desc]:
        """Shape, dtype and device of each tensor, in put order."""
        d = self._descs
        if d is None:
            L = _lib.lib()
            h = self._handle()
            info = _lib.init(_lib.ObjectInfo())
            _lib.check(L.rdt_ref_info(h, ctypes.byref(info)))
            if self._info_cache is None:
                self._info_cache = (info.object_id.decode(), info.transport.decode(), bool(info.is_owner),
                                    int(info.nbytes))
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
        data = ctypes.c_void_p()
        size = ctypes.c_size_t()
        L = _lib.lib()
        _lib.check(L.rdt_ref_serialize(self._handle(), ctypes.byref(data), ctypes.byref(size)))
        try:
            out = ctypes.string_at(data, size.value)
        finally:
            L.rdt_bytes_free(data)
        e = self._entry
        if e is not None:
            # The ref may come back: index the object by id so that its
            # own tensors are found then (see _own_entry).
            e.sent = True
            if not e.oid:
                self._oid = self._info()[0]
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
        descs = tuple(tuple(d) for d in self._descs) if self._descs is not None else None
        oid = self._oid or (self._info_cache[0] if self._info_cache else "")
        return (data, self._skeleton, self._frameworks, descs, oid)

    def __repr__(self) -> str:
        if self.closed:
            return "ObjectRef(<released>)"
        try:
            oid, tr, _, _ = self._info()
            return f"ObjectRef(id={oid}, transport={tr or 'auto'}, shapes={self.shapes})"
        except Exception as e:  # the runtime may be gone
            return f"ObjectRef(<{type(e).__name__}: {e}>)"

