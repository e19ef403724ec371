"""Runtimes and put."""

from __future__ import annotations

import ctypes
import struct
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import _get, _lib, _prepared, _view, _write
from . import _tensors as _t
from ._adapter import register
from ._errors import ClosedError, GetTimeoutError, InvalidArgumentError, NotFoundError
from ._fetch import Fetch
from ._handle import Handle
from ._logs import FORWARDER
from ._pending import deadline_of as _deadline
from ._pending import ms_until as _ms
from ._pending import slice_ms as _slice_ms
from ._process import PROCESS
from ._ref import SINGLE, ObjectRef, encode_skeleton, flatten
from ._store import NO_RELEASE, Entry, Store

# How long closing a runtime waits for its threads still running Python
# code (the release thread, drains of aborted fetches).
_THREAD_JOIN_S = 10.0


def _redact_address(address: str) -> str:
    """The address with the keys of its TCP parts hidden, for display."""
    parts = []
    for part in address.split(","):
        if part.startswith("tcp://") and "@" in part:
            part = "tcp://****@" + part.rsplit("@", 1)[1]
        parts.append(part)
    return ",".join(parts)

# How long deserializing (unpickling) a ref waits for its owner by default,
# in seconds: the C library's RDT_DESERIALIZE_TIMEOUT_DEFAULT_MS.
DESERIALIZE_TIMEOUT = _lib.DESERIALIZE_TIMEOUT_DEFAULT_MS / 1000

# Marks "the runtime's deserialize_timeout" (None means no deadline).
_RUNTIME_DEFAULT: Any = object()

def _seconds_ms(value: Optional[float], what: str) -> int:
    """A runtime option in seconds as the C ABI's milliseconds (0: the
    library's default, for None); float("inf") is as long as it counts."""
    if value is None:
        return 0
    t = _lib.timeout_seconds(value, what)
    if t == 0:
        raise InvalidArgumentError(f"{what} must be a positive number of seconds, not {value!r}")
    return _lib.MAX_TIMEOUT_MS if t is None or t * 1000 >= _lib.MAX_TIMEOUT_MS else max(1, int(t * 1000))


def _no_tensor(value: Any, call: str) -> str:
    """Why a value without a tensor is refused, and how to make it one."""
    what = type(value).__name__
    if isinstance(value, (list, tuple, dict)):
        what += f", {len(value)} item{'s' if len(value) != 1 else ''}"
    return (f"rdt.{call}: the value ({what}) holds no tensor: rdt would pickle all of it into the ref and "
            f"move nothing. Make it a tensor: rdt.{call}(numpy.asarray(value)) (or torch.tensor(value)); rdt "
            "moves numpy arrays, torch tensors and objects with __dlpack__ or __array_interface__")


_NUMPY1 = ("numpy",)

# rdt_deserialize_options, packed into a scratch block.
_DESERIALIZE = struct.Struct("=IIq")
assert _DESERIALIZE.size == ctypes.sizeof(_lib.DeserializeOptions)
_Desc = _t.Desc


class Runtime(Handle):
    """An rdt runtime: an object store, a transport registry and a control
    plane endpoint. Use it as a context manager, or call ``close()``.

    By default a runtime talks to the other processes of this host over a
    Unix socket. ``listen_tcp="host:port"`` also accepts peers on other hosts
    (a non-loopback host needs ``auth_token`` or ``$RDT_AUTH_TOKEN``).
    ``lease`` and ``peer_timeout`` are seconds; ``log_level`` is one of
    "off", "error", "warn", "info", "debug" (default: ``$RDT_LOG``, else warn).
    ``builtin_transports=False`` starts without cma, shm, tcp, ...; ``in_process``
    keeps the runtime's peers inside this process. ``deserialize_timeout``
    (seconds, None for no deadline; the attribute of that name may be changed
    later) bounds how long :meth:`deserialize`, and so unpickling a ref, waits
    for the ref's owner by default.
    """

    def __init__(self, name: Optional[str] = None, *, lease: Optional[float] = None,
                 peer_timeout: Optional[float] = None, listen_tcp: Optional[str] = None,
                 auth_token: Optional[str] = None, advertise_host: Optional[str] = None,
                 socket_dir: Optional[str] = None, host_id: Optional[str] = None,
                 in_process: bool = False, builtin_transports: bool = True,
                 log_level: Optional[str] = None,
                 deserialize_timeout: Optional[float] = DESERIALIZE_TIMEOUT) -> None:
        if PROCESS.shutting_down:
            raise ClosedError("rdt: the interpreter is shutting down; no new runtime can start", _lib.ERR_CLOSED)
        if log_level not in _lib.LOG_LEVELS:
            raise InvalidArgumentError(f"log_level must be one of off, error, warn, info, debug, not {log_level!r}")
        o = _lib.init(_lib.RuntimeOptions())
        o.abi_version = _lib.ABI_VERSION

        def enc(s: Optional[str]) -> Optional[bytes]:
            return s.encode() if s is not None else None
        (o.name, o.listen_tcp, o.auth_token, o.advertise_host, o.socket_dir, o.host_id) = (
            enc(name), enc(listen_tcp), enc(auth_token), enc(advertise_host), enc(socket_dir), enc(host_id))
        o.log_level = _lib.LOG_LEVELS[log_level]
        o.flags = ((_lib.RUNTIME_IN_PROCESS if in_process else 0) |
                   (0 if builtin_transports else _lib.RUNTIME_NO_BUILTIN_TRANSPORTS) |
                   _lib.RUNTIME_QUEUE_RELEASES)  # see Store.start_releaser
        o.lease_ms = _seconds_ms(lease, "lease")
        o.peer_timeout_ms = _seconds_ms(peer_timeout, "peer_timeout")
        _deadline(deserialize_timeout)  # InvalidArgumentError for a bad value, before anything is made
        FORWARDER.start(_lib.lib())  # only runtimes log: their lines go to logging from the first one
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().rdt_runtime_create(ctypes.byref(o), ctypes.byref(out)))
        super().__init__(out.value or 0)
        self.name = name
        self.deserialize_timeout = deserialize_timeout
        self._lock = threading.Lock()
        self._releaser: Optional[threading.Thread] = None
        self._store = Store()  # what this runtime put, and what its fetches receive into
        # The collective groups this runtime is a rank of: name -> (backend,
        # CUDA device), as create_collective_group was given them.
        self._groups: Dict[str, Tuple[str, int]] = {}
        for tname, devices, cls, data_type in PROCESS.add(self):
            self._register(tname, devices, cls, data_type, skip_existing=True)

    def _free(self, ptr: int) -> None:
        # garbage_collect and free_user_data run inside destroy, on rdt's
        # threads; ctypes released the GIL for them. Destroy frees every put
        # object and stops the release thread; their entries go here. Then
        # wait for the release thread and drains still dropping tensors: a
        # thread the interpreter kills at exit inside a tensor's C++
        # destructor aborts the process.
        try:
            _lib.lib().rdt_runtime_destroy(ptr)
        finally:
            self._store.clear()
            self._store.join_threads(_THREAD_JOIN_S)

    def __repr__(self) -> str:
        if self.closed:
            return f"Runtime({self.name!r}, closed)"
        return f"Runtime({self.name!r}, address={_redact_address(self.address)!r})"

    @property
    def address(self) -> str:
        """Where peers reach this runtime (Unix socket, and TCP if listening).

        A capability: listening on TCP without an auth token, the TCP part
        carries the runtime's secret (``tcp://<secret>@host:port``), and
        whoever holds the address may connect. ``repr`` hides it."""
        s = ctypes.c_char_p()
        _lib.check(_lib.lib().rdt_runtime_address(self._handle(), ctypes.byref(s)))
        return _lib.decode(s.value)

    # ---- put -------------------------------------------------------------------

    def put(self, value: Any, transport: Optional[str] = None) -> ObjectRef:
        """Puts the tensors in ``value`` (a tensor, or lists, tuples and dicts
        holding tensors) as one object, without copying them, and returns a
        reference. The rest of the structure is pickled now and travels with
        the reference. Keep the tensors unmodified until the object is freed
        (see :meth:`wait_tensor_freed`). ``transport`` names the transport
        receivers use; None lets each get choose."""
        return self._put(value, transport, False)

    def expose(self, value: Any, transport: Optional[str] = None) -> ObjectRef:
        """Exposes the tensors in ``value`` (a structure as :meth:`put`
        takes) for other processes to write into, and returns a writable
        ref: a capability, which only its holders may use, and hand on by
        pickling. They write with :meth:`write`; every write ends in one
        notice here (``ref.wait_notice()``), which says whether all of its
        bytes landed. The memory may change whenever a write is open; read
        it once its notice says so. A writable object is never the source of a get.
        ``ref.revoke_writes()`` stops every writer. ``transport``: one that
        writes (cma, shm, tcp, nixl, cuda_ipc), or None to choose per write."""
        return self._put(value, transport, True)

    def _put(self, value: Any, transport: Optional[str], expose: bool) -> ObjectRef:
        if type(value) is np.ndarray:  # the common case, quickly
            found: List[Any] = [value]
            items = [_t.item_of(value)]
            blob = SINGLE
            frameworks: Tuple[str, ...] = _NUMPY1
        elif type(value) is list and value and all(type(x) is np.ndarray for x in value):
            # A plain list of arrays (a state dict's values, views of one
            # buffer): its skeleton is its length, no walk needed.
            found = value[:]
            items = _t.items_of(found)
            blob = len(found)
            frameworks = _NUMPY1 * len(found) if all(it.framework == "numpy" for it in items) \
                else tuple([it.framework for it in items])
        elif type(value) is list and value and _t.is_torch_list(value):
            found = value[:]
            items = _t.torch_items_of(found)
            blob = len(found)
            frameworks = tuple([it.framework for it in items])
        else:
            found = []
            skeleton = flatten(value, found)
            if not found:
                raise InvalidArgumentError(_no_tensor(value, "expose" if expose else "put"))
            items = _t.items_of(found, what=lambda i: i if len(found) > 1 else "tensor")
            blob = encode_skeleton(skeleton, len(found))
            frameworks = tuple([it.framework for it in items])
        n = len(items)
        if self._releaser is None:
            with self._lock:
                if self._releaser is None:
                    self._releaser = self._store.start_releaser(self._handle(), self.name or "")
        entry = Entry(found, items, blob)
        key = self._store.add(entry)
        tname = transport.encode() if transport else None
        ptrs: Optional[Tuple[int, ...]] = None
        if tname is not None:
            # A transport extracts its metadata inside rdt_put: let a Python
            # one see these very tensors.
            ptrs = tuple(it.data for it in items)
            self._store.putting[ptrs] = entry
        L = _lib.lib()
        make = L.rdt_expose if expose else L.rdt_put
        s = _lib.scratch()
        try:
            # One tensor goes in the scratch block beside the result; more
            # in a block of their own.
            if n == 1 and _t.pack_one_at(s, 8, items[0].data, items[0].desc):
                addr = s.base + 8
            else:
                buf, addr = _t.pack(items)
            st = make(self._handle(), addr, n, tname, NO_RELEASE, key, s.base)
            ptr = s.words[0]
        finally:
            _lib.give_back(s)
            if ptrs is not None:
                self._store.putting.pop(ptrs, None)
        if st != _lib.OK:
            self._store.drop(key)  # on error rdt keeps nothing and never calls release
            raise _lib.make_error(st)
        descs = [items[0].desc] if n == 1 else [it.desc for it in items]
        return ObjectRef(self, ptr, blob, frameworks, descs, entry)

    # ---- references --------------------------------------------------------------

    def deserialize(self, data: bytes, timeout: Optional[float] = _RUNTIME_DEFAULT, *, _skeleton: Any = None,
                    _frameworks: Tuple[str, ...] = (), _descs: Any = None, _oid: str = "") -> ObjectRef:
        """A ref from bytes made by ``ObjectRef.serialize()`` (or by
        rdt_ref_serialize in any language). Such a ref gets its tensors back
        as a single tensor (one) or a list (several).

        It waits for the ref's owner only when this runtime has no connection
        to it yet, at most ``timeout`` seconds (default: the runtime's
        ``deserialize_timeout``, 30 s unless set; None: no deadline, though a
        connection attempt still gives up after the control plane's handshake
        timeout with PeerUnavailableError). GetTimeoutError (a TimeoutError)
        when it passes; nothing is kept then, and the same bytes may be
        deserialized again. Ctrl-C interrupts the wait."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"deserialize takes bytes, not {type(data).__name__}")
        if timeout is _RUNTIME_DEFAULT:
            timeout = self.deserialize_timeout
        h = self._deserialize(data if type(data) is bytes else bytes(data), timeout)
        descs = [_Desc._make(d) for d in _descs] if _descs is not None else None
        return self._came_back(ObjectRef(self, h, _skeleton, _frameworks, descs, None, _oid))

    def _came_back(self, r: ObjectRef) -> ObjectRef:
        """r, counted as a ref that came back if this runtime owns its
        object: one fewer serialized copy that others may read."""
        if self._store.by_id:  # only objects whose refs were serialized come back
            e = r._own_entry()
            if e is not None:
                e.back += 1
        return r

    def _deserialize(self, data: bytes, timeout: Optional[float]) -> int:
        """The handle rdt_ref_deserialize_ex makes of data, waiting for the
        owner in slices so that signal handlers run between them (a slice
        that ends joins the connection attempt the previous one began)."""
        deadline = _deadline(timeout)
        f = _lib.lib().rdt_ref_deserialize_ex
        h = self._handle()
        s = _lib.scratch()
        try:
            base = s.base
            # rdt_deserialize_options (struct_size, reserved, timeout_ms), then the handle made.
            while True:
                _DESERIALIZE.pack_into(s.buf, 0, _DESERIALIZE.size, 0, max(1, _slice_ms(deadline)))
                st = f(h, data, len(data), base, base + _DESERIALIZE.size)
                if st == _lib.OK:
                    return s.words[_DESERIALIZE.size // 8] or 0
                if st != _lib.ERR_TIMEOUT:
                    raise _lib.make_error(st)
                if deadline is not None and time.monotonic() >= deadline:
                    raise GetTimeoutError(f"rdt.deserialize: the owner did not answer within {timeout} s "
                                          f"({_lib.last_error()})", _lib.ERR_TIMEOUT)
        finally:
            _lib.give_back(s)

    def borrow(self, ref: ObjectRef) -> ObjectRef:
        """A handle in this runtime to the object ``ref`` (of another runtime)
        points to, as unpickling would make: a borrow the owner counts. It
        waits for the owner as :meth:`deserialize` does."""
        if not isinstance(ref, ObjectRef):
            raise InvalidArgumentError(f"borrow takes an ObjectRef, not {type(ref).__name__}")
        data = ref.serialize()
        h = self._deserialize(data, self.deserialize_timeout)
        r = ObjectRef(self, h, ref._skeleton, ref._frameworks, ref._descs, None, ref._oid)
        if r._oid == "" and ref._info_cache is not None:
            r._oid = ref._info_cache[0]
        return self._came_back(r)

    # ---- get ---------------------------------------------------------------------

    def get(self, refs: Union[_get.Refs, Sequence[_get.Refs]], timeout: Optional[float] = None,
            transport: Optional[str] = None, out: Any = None, device: Optional[str] = None,
            copy: Optional[bool] = True) -> Any:
        """Gets one ref, or a list of refs concurrently (one get), and
        returns the put structure(s) with new tensors of the producer's
        framework, or with the tensors given in ``out=`` (a tensor, or a
        structure of them, in put order across all refs).

        ``timeout`` is in seconds (None waits forever): when it passes,
        GetTimeoutError (a TimeoutError) is raised and every transfer is
        aborted. With ``out=`` nothing writes into your buffers once get
        returns; without, a transfer that cannot abort finishes in the
        background into buffers nobody sees. ``transport`` overrides the
        transport of every ref for this get.

        A ref this runtime owns gives back the put tensors themselves (no
        copy), as Ray does, unless ``out=`` is given.

        Wherever a ref goes, a :class:`rdt.Range` may go instead:
        ``ref[i]`` or ``ref["key"]`` (one tensor), ``ref[i][a:b]`` (rows a
        to b of it), ``ref[i].bytes(offset, length)``. Only those bytes
        move, into a new tensor of the range's shape, or into its place in
        ``out=`` (the source's dtype and the range's ``nbytes``, any shape).
        A range of an object this runtime owns is copied.

        New tensors of host sources are made in host memory; those of CUDA
        sources on this process's own GPU, never on the source's ordinal:
        the device of this runtime's collective group when the get may go
        over one (the ref's or ``transport``'s backend, or no transport
        named), else the current CUDA device of the framework that makes
        them (``torch.cuda.current_device()``, CuPy's).
        ``device`` ("cpu", "cuda" or "cuda:N"), without ``out=``, makes the
        new tensors there instead: a GPU object lands in host memory, host
        tensors on a GPU (between host and CUDA memory; see docs/python.md,
        "Device tensors"). Objects this runtime owns are copied then too.

        ``copy=False`` copies nothing: each tensor is a view of the owner's
        staged copy, mapped into this process and shared by every reader on
        the host (read-only numpy arrays; torch tensors copy-on-write, their
        writes private to this process). The owner must be on this host and
        the tensors in host memory, else UnsupportedError; ``copy=None``
        then copies instead. A view holds a borrow until its last array is
        garbage collected, and its bytes never change, even after the owner
        is gone. See docs/python.md, "One copy for many readers".
        """
        if copy is not True:
            return _view.get_in(self, refs, timeout, transport, out, device, copy)
        return _get.get_in(self, refs, timeout=timeout, transport=transport, out=out, device=device)

    def get_start(self, refs: Union[_get.Refs, Sequence[_get.Refs]], out: Any = None,
                  transport: Optional[str] = None, device: Optional[str] = None) -> Fetch:
        """Starts a get of one ref or a list of refs (every transfer
        concurrent) and returns at once with an :class:`rdt.Fetch` to wait
        on, poll, abort or ``await``. Its ``result()`` is what :meth:`get`
        returns for the same arguments; ``out=`` and ``transport`` and
        ``device`` mean the same. Keep buffers given in ``out=`` untouched
        until the get completed or was closed."""
        return _get.get_start_in(self, refs, out=out, transport=transport, device=device)

    def fetch(self, refs: Union[_get.Refs, Sequence[_get.Refs]], out: Any = None,
              transport: Optional[str] = None, device: Optional[str] = None) -> Fetch:
        """The earlier name of :meth:`get_start`; deprecated."""
        warnings.warn("Runtime.fetch is deprecated: use Runtime.get_start", DeprecationWarning, stacklevel=2)
        return _get.get_start_in(self, refs, out=out, transport=transport, device=device)

    async def get_async(self, refs: Union[_get.Refs, Sequence[_get.Refs]], timeout: Optional[float] = None,
                        transport: Optional[str] = None, out: Any = None, device: Optional[str] = None,
                        copy: Optional[bool] = True) -> Any:
        """:meth:`get` for asyncio; see :func:`rdt.get_async`."""
        if copy is not True:
            return await _view.get_async_in(self, refs, timeout, transport, out, device, copy)
        return await _get.get_async_in(self, refs, timeout=timeout, transport=transport, out=out, device=device)

    # ---- writes into exposed objects -------------------------------------------

    def write(self, refs: Union[_write.Dests, Sequence[_write.Dests]], value: Any, *, tag: int = 0,
              timeout: Optional[float] = None, transport: Optional[str] = None) -> None:
        """Writes ``value`` into the object of a writable ref (made by
        another process's :meth:`expose`) and returns once every byte
        landed. A ref takes a value of its structure (its tensors in put
        order, each of the exposed tensor's shape and dtype); a range,
        ``ref[i]``, ``ref[i][a:b]`` or ``ref[i].bytes(offset, n)``, takes
        one tensor of its dtype and nbytes, and only those bytes change.
        A list of refs and ranges takes a list of values.

        The owner gets one notice for each ref written, carrying ``tag``
        (a version, say). ``timeout`` (seconds, None: no limit) aborts the
        write when it passes (GetTimeoutError); after any error nothing of
        it lands any more and the owner's notice says it failed.
        PermissionDeniedError: the owner revoked the ref, or the ref is not
        a real one."""
        _write.write_in(self, refs, value, tag=tag, timeout=timeout, transport=transport)

    def write_start(self, refs: Union[_write.Dests, Sequence[_write.Dests]], value: Any, *, tag: int = 0,
                    transport: Optional[str] = None) -> "_write.Write":
        """Starts :meth:`write` and returns at once with an :class:`rdt.Write`
        to wait on, abort or ``await``. Keep the value's tensors unmodified
        until it completed or was closed."""
        return _write.write_start_in(self, refs, value, tag=tag, transport=transport)

    async def write_async(self, refs: Union[_write.Dests, Sequence[_write.Dests]], value: Any, *, tag: int = 0,
                          timeout: Optional[float] = None, transport: Optional[str] = None) -> None:
        """:meth:`write` for asyncio: the event loop watches the write's
        completion descriptor, no thread waits. Cancelling aborts it."""
        await _write.write_async_in(self, refs, value, tag=tag, timeout=timeout, transport=transport)

    def prepare_get(self, refs: Union[_get.Refs, Sequence[_get.Refs]], out: Any = None,
                    transport: Optional[str] = None, device: Optional[str] = None) -> "_prepared.Prepared":
        """A :meth:`get` of the same refs into the same tensors, prepared to
        run many times: an :class:`rdt.Prepared` whose ``run()`` returns what
        ``get`` returns. Arguments as :meth:`get`'s; without ``out=`` the
        tensors are allocated here, once, and every run fills them again."""
        return _prepared.prepare_get_in(self, refs, out=out, transport=transport, device=device)

    def prepare_write(self, refs: Union[_write.Dests, Sequence[_write.Dests]], value: Any, *,
                      transport: Optional[str] = None) -> "_prepared.Prepared":
        """A :meth:`write` of ``value``'s tensors into the same writable refs
        or ranges, prepared to run many times: each ``run(tag)`` writes what
        the tensors hold then and makes one notice with ``tag``."""
        return _prepared.prepare_write_in(self, refs, value, transport=transport)

    # ---- the source side -------------------------------------------------------

    def wait_tensor_freed(self, tensor: Any, timeout: Optional[float] = None) -> None:
        """Blocks until no object of this runtime holds ``tensor`` (matched by
        its data address), so it may be modified or reused. Raises
        GetTimeoutError (a TimeoutError) when ``timeout`` seconds pass."""
        deadline = _deadline(timeout)
        it = _t.item_of(tensor)
        if not it.data:
            return
        L = _lib.lib()
        while True:
            st = L.rdt_wait_tensor_freed(self._handle(), it.data, _slice_ms(deadline))
            if st == _lib.OK:
                return
            if st != _lib.ERR_TIMEOUT:
                raise _lib.make_error(st)
            if deadline is not None and time.monotonic() >= deadline:
                raise GetTimeoutError(f"wait_tensor_freed: the tensor is still held after {timeout} s",
                                      _lib.ERR_TIMEOUT)

    # ---- collective groups -------------------------------------------------------

    def create_collective_group(self, world_size: int, rank: int, rank0_address: Optional[str] = None, *,
                                backend: str = "nccl", name: str = "default", device: Union[int, str] = 0,
                                timeout: Optional[float] = 300.0) -> None:
        """Makes this runtime rank ``rank`` of the collective group ``name``
        of ``world_size`` ranks, on CUDA device ``device`` (an ordinal or
        "cuda:N"), and returns once every rank has joined and the
        communicator is formed. Every rank calls it; ranks other than 0 pass
        ``rank0_address``, the ``address`` of rank 0's runtime. Refs put with
        ``transport="nccl"`` are then fetched by other ranks of the group,
        and gets here that may go over the group make their new CUDA
        tensors on ``device`` (see :meth:`get`).

        A transfer that fails or is aborted destroys the group on that rank;
        destroy it on every rank and create it again. Raises UnsupportedError
        where NCCL or a CUDA device is missing, GetTimeoutError when a rank
        does not join within ``timeout`` seconds (None waits forever)."""
        if isinstance(device, str):
            if not device.startswith("cuda:") or not device[5:].isdigit():
                raise InvalidArgumentError(f"device {device!r}: want an ordinal or 'cuda:N'",
                                           _lib.ERR_INVALID_ARGUMENT)
            device = int(device[5:])
        deadline = _deadline(timeout)
        if timeout == 0:
            raise InvalidArgumentError("timeout must be positive (None waits forever)", _lib.ERR_INVALID_ARGUMENT)
        opts = _lib.GroupOptions(ctypes.sizeof(_lib.GroupOptions), 0, backend.encode())
        ms = _ms(deadline)
        _lib.check(_lib.lib().rdt_group_create(self._handle(), name.encode(), int(world_size), int(rank),
                                               rank0_address.encode() if rank0_address else None, int(device),
                                               ctypes.byref(opts), ms))
        self._groups[name] = (backend.lower(), int(device))

    def destroy_collective_group(self, name: str = "default") -> None:
        """Destroys this runtime's rank of the group ``name`` (NotFoundError
        if there is none). Other ranks destroy theirs themselves, at about
        the same time: NCCL frees a communicator only once the group's
        other ranks on the host free theirs, and this waits for that at
        most ``RDT_NCCL_TEARDOWN_MS`` (10 s), then raises GetTimeoutError
        with the group gone all the same (NCCL finishes in the
        background)."""
        try:
            _lib.check(_lib.lib().rdt_group_destroy(self._handle(), name.encode()))
        except (NotFoundError, GetTimeoutError):
            self._groups.pop(name, None)  # gone from the runtime either way
            raise
        self._groups.pop(name, None)

    def _group_device(self, transport: Optional[str]) -> Optional[int]:
        """The CUDA device a get receives into when it may go over one of
        this runtime's collective groups: ``transport`` names the fetch's
        transport (None: chosen per fetch, any group's backend may be), and
        the groups of that backend are all on one device. None otherwise."""
        if not self._groups:
            return None
        want = transport.lower() if transport else None
        devices = {dev for backend, dev in list(self._groups.values()) if want is None or backend == want}
        return devices.pop() if len(devices) == 1 else None

    # ---- transports and counters -------------------------------------------------

    def register_tensor_transport(self, name: str, devices: Union[str, Sequence[str]], cls: Any,
                                  data_type: Optional[Type[Any]] = None) -> None:
        """Registers a transport class written against Ray's
        ``TensorTransportManager`` interface (an instance is made with
        ``cls()``; an instance is accepted too) with this runtime under
        ``name``. Every process that uses it registers it under that name.
        ``data_type`` (say ``torch.Tensor``) is the tensor type the class
        wants to see; None shows each tensor as its producer made it."""
        self._register(name, devices, cls, data_type, skip_existing=False)

    def _register(self, name: str, devices: Any, cls: Any, data_type: Any, skip_existing: bool) -> None:
        if skip_existing and name.lower() in self.transport_names():
            return
        register(self, name, devices, cls, data_type)

    def _list(self, call: Any, entry: Any) -> List[Any]:
        """The entries of one of the runtime's lists that call
        (rdt_transport_list and its kind) copies out: asked how many, then
        into an array of that many entries, again if one appeared meanwhile."""
        n = ctypes.c_size_t()
        while True:
            _lib.check(call(self._handle(), None, 0, ctypes.byref(n)))
            arr = (entry * max(n.value, 1))()
            for x in arr:
                _lib.init(x)
            now = ctypes.c_size_t()
            _lib.check(call(self._handle(), ctypes.addressof(arr), len(arr), ctypes.byref(now)))
            if now.value <= len(arr):  # else an entry appeared meanwhile: ask again
                return arr[:now.value]

    def transports(self) -> List[Dict[str, Any]]:
        """Every registered transport with its flags, devices and counters.
        ``ranges``: it serves partial gets (byte ranges of a ref's tensors)."""
        listed = self._list(_lib.lib().rdt_transport_list, _lib.TransportInfo)
        names = {v: k for k, v in _t.DEVICE_NAMES.items()}
        return [{"name": x.name.decode(), "builtin": bool(x.flags & _lib.TRANSPORT_BUILTIN),
                 "one_sided": bool(x.flags & _lib.TRANSPORT_ONE_SIDED),
                 "can_abort": bool(x.flags & _lib.TRANSPORT_CAN_ABORT),
                 "devices": [names.get(x.devices[i], str(x.devices[i])) for i in range(x.num_devices)],
                 "transfers_completed": x.transfers_completed, "transfers_failed": x.transfers_failed,
                 "bytes_received": x.bytes_received, "sends_completed": x.sends_completed,
                 "bytes_sent": x.bytes_sent, "writes_completed": x.writes_completed,
                 "writes_failed": x.writes_failed, "bytes_written": x.bytes_written,
                 "same_host_only": bool(x.flags & _lib.TRANSPORT_SAME_HOST_ONLY),
                 "ranges": bool(x.flags & _lib.TRANSPORT_RANGES),
                 "writes": bool(x.flags & _lib.TRANSPORT_WRITES),
                 "auto_rank_host": x.auto_rank_host, "auto_rank_cuda": x.auto_rank_cuda}
                for x in listed]

    def unavailable_transports(self) -> Dict[str, str]:
        """The built-in transports missing here, by name, with the reason
        each gave (a library, device or kernel feature it lacks)."""
        listed = self._list(_lib.lib().rdt_transport_list_unavailable, _lib.UnavailableTransport)
        return {x.name.decode(): _lib.decode(x.reason) for x in listed}

    def transport_names(self, builtin: Optional[bool] = None) -> List[str]:
        """Names of the registered transports (only built-in ones with
        ``builtin=True``, only the application's with False)."""
        return [t["name"] for t in self.transports() if builtin is None or t["builtin"] == builtin]

    def fetch_histograms(self) -> List[Dict[str, Any]]:
        """Latency histograms, one dict per transport, direction and object
        size class that saw a transfer or a failure, sorted by transport,
        direction and size class: ``transport``, ``direction`` (``"get"``:
        gets this runtime received; ``"write"``: writes it made into exposed
        objects, counted alike), ``size_class`` (0-5), ``size_class_max_bytes``
        (None for the last class), ``buckets`` (fetches per latency bucket,
        not cumulative: bucket b holds fetches of at most 2**b microseconds,
        the last one the slower ones), ``count``, ``sum_ns`` and ``bytes`` of
        the completed fetches, and ``failures``. ``rdt.metrics`` turns them
        into Prometheus histograms; docs/metrics.md describes them."""
        return [{"transport": x.transport.decode(), "direction": _lib.DIRECTION_NAMES[x.direction],
                 "size_class": x.size_class,
                 "size_class_max_bytes": _lib.fetch_size_class_max_bytes(x.size_class),
                 "buckets": list(x.buckets), "count": x.count, "sum_ns": x.sum_ns, "bytes": x.bytes,
                 "failures": x.failures}
                for x in self._list(_lib.lib().rdt_runtime_fetch_histograms, _lib.FetchHistogram)]

    def stats(self) -> Dict[str, int]:
        """The runtime's counters (objects, refs, borrows, transfers, bytes...)."""
        s = _lib.init(_lib.Stats())
        _lib.check(_lib.lib().rdt_runtime_stats(self._handle(), ctypes.byref(s)))
        return {name: int(getattr(s, name)) for name in _lib.STATS_FIELDS}

