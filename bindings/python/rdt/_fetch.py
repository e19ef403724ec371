"""A fetch in flight: rdt.Fetch and its blocking and asyncio waits.
get, fetch and get_async (in _get) are built on it."""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from typing import Any, List, Optional, Tuple, Union

from . import _lib
from . import _tensors as _t
from ._errors import AbortedError, GetTimeoutError, InvalidArgumentError
from ._handle import Handle
from ._ref import ObjectRef, TensorSlice
from ._store import RuntimeLike, Store

# A blocking wait runs in slices of this many milliseconds, so that Python
# can run signal handlers (Ctrl-C) between them.
SLICE_MS = 100


def deadline_of(timeout: Any) -> Optional[float]:
    """The time.monotonic() at which timeout seconds run out (None: no
    limit); a bad timeout is refused here, before anything starts."""
    if timeout is None:  # the common case, without a call
        return None
    t = _lib.timeout_seconds(timeout)
    return None if t is None else time.monotonic() + t


def zero_timeout(refs: Any, what: str = "get") -> None:
    """What a call that moves refs (ObjectRefs or slices of them) does with
    timeout 0, which is no time at all, the same on every transport
    (docs/abi.md, "Timeouts"): a ref of another runtime is refused with
    GetTimeoutError before anything starts; the runtime's own objects need
    no other process and are done without a deadline (None)."""
    for i, x in enumerate(refs):
        r = x.ref if isinstance(x, TensorSlice) else x
        if not r.is_owner:
            raise GetTimeoutError(f"rdt.{what}: timeout 0 leaves no time to reach the owner of ref {i} "
                                  f"(object {r.id}): nothing was started", _lib.ERR_TIMEOUT)
    return None


def ms_until(deadline: Optional[float]) -> int:
    """Milliseconds left before deadline, for a C wait (-1: no deadline)."""
    if deadline is None:
        return -1
    left = (deadline - time.monotonic()) * 1000 + 0.999
    return max(0, int(left)) if left < _lib.MAX_TIMEOUT_MS else _lib.MAX_TIMEOUT_MS


def slice_ms(deadline: Optional[float]) -> int:
    """The next slice of a wait: SLICE_MS, or less when the deadline is nearer."""
    left = ms_until(deadline)
    return SLICE_MS if left < 0 else min(SLICE_MS, left)


class Plan:
    """What a fetch moves and what its result is made of: the refs and
    slices asked for, each one's tensors (new, given in out=, or the put
    tensors of an object this runtime owns), and, of those, the ones to
    fetch. ``sources`` (a partial fetch's rdt_range array, else None)
    says what each of those receives."""

    __slots__ = ("single", "refs", "tensors", "fetch_refs", "items", "objs", "owned", "sources", "packed")

    def __init__(self, single: bool, refs: List[Union[ObjectRef, TensorSlice]], tensors: List[List[Any]],
                 fetch_refs: List[ObjectRef], items: List[_t.Item], objs: List[Any], owned: bool,
                 sources: Optional[Any] = None, packed: Optional[Tuple[Any, int, List[int]]] = None) -> None:
        self.single, self.refs, self.tensors = single, refs, tensors
        self.fetch_refs, self.items, self.objs, self.owned = fetch_refs, items, objs, owned
        self.sources = sources
        # Targets packed already (_t.pack_out): the array, its address and
        # each target's address; items is empty then.
        self.packed = packed

    def pack(self) -> Tuple[Any, int, int]:
        """The targets' rdt_tensor array (keep it alive while in use), its
        address and length."""
        if self.packed is not None:
            return self.packed[0], self.packed[1], len(self.packed[2])
        buf, addr = _t.pack(self.items)
        return buf, addr, len(self.items)

    def targets(self) -> Any:
        """(data address, target object) of every target."""
        datas = self.packed[2] if self.packed is not None else [it.data for it in self.items]
        return zip(datas, self.objs)


def fetch_options(transport: Optional[str], plan: Plan) -> Any:
    """A fetch's rdt_get_options, or None when it needs none. The sources
    array stays plan's (rdt copies it during the call)."""
    if not transport and plan.sources is None:
        return None
    opts = _lib.init(_lib.GetOptions())
    if transport:
        opts.transport = transport.encode()
    if plan.sources is not None:
        opts.sources = ctypes.cast(plan.sources.ctypes.data, ctypes.POINTER(_lib.Range))
        opts.num_sources = len(plan.sources)
    return opts


def check_transport(runtime: RuntimeLike, transport: str, plan: Plan) -> None:
    """Refuses a transport name the runtime lacks where nothing is fetched
    (a get of objects it owns gives back the put tensors), with the error
    a fetch gives: rdt checks the name in a fetch of no refs."""
    L = _lib.lib()
    f = ctypes.c_void_p()
    _lib.check(L.rdt_get_start(runtime._handle(), None, 0, None, 0, fetch_options(transport, plan),
                                 ctypes.byref(f)))
    L.rdt_pending_free(f.value)


class Fetch(Handle):
    """Refs being fetched, made by :meth:`Runtime.fetch`. Every transfer is
    running when you get it; nothing blocks until you wait.

    ``wait(timeout)`` blocks up to ``timeout`` seconds and says whether the
    fetch is complete; ``done()`` asks without blocking; ``result()`` gives
    what ``get`` would return (or raises its error); ``abort()`` stops every
    transfer. ``await fetch`` (or ``await fetch.wait_async()``) waits without
    blocking the event loop and without a thread: the loop watches the
    fetch's completion descriptor. Cancelling the awaiting task aborts the
    fetch.

    ``close()`` (also leaving a ``with`` block) aborts what still runs and
    frees the fetch; with ``out=`` it returns once nothing writes into those
    buffers any more. A fetch that completes frees its native resources by
    itself; one dropped while running is aborted, without blocking.

    On :class:`Handle`'s pattern: the C fetch is its handle, swapped out
    under the fetch's own lock (which also guards the result and the event
    loop watching it), and freed by :meth:`_free`.
    """

    def __init__(self, runtime: RuntimeLike, plan: Plan, transport: Optional[str]) -> None:
        self._runtime = runtime
        self._store: Store = runtime._store
        self._plan = plan
        self._lock = threading.Lock()
        self._ptr: Optional[int] = None  # the C fetch, until freed
        self._final: Optional[Tuple[Optional[BaseException]]] = None  # (error or None,) once complete
        self._value: Any = None
        self._has_value = False
        self._fd: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # watching the fd
        self._waiters: List["asyncio.Future[None]"] = []
        self._buf: Any = None
        self._mine: List[Tuple[int, Any]] = []
        refs = plan.fetch_refs
        if not refs:
            if transport:
                check_transport(runtime, transport, plan)
            self._final = (None,)  # nothing to move: only own objects or none
            return
        L = _lib.lib()
        if len(refs) == 1:
            handles: Any = ctypes.byref(ctypes.c_void_p(refs[0]._handle()))
        else:
            handles = (ctypes.c_void_p * len(refs))(*[r._handle() for r in refs])
        self._buf, addr, n = plan.pack()
        opts = fetch_options(transport, plan)
        # Python transports receiving this fetch get these very objects.
        self._mine = self._store.receive_into(plan.targets())
        f = ctypes.c_void_p()
        st = L.rdt_get_start(runtime._handle(), handles, len(refs), addr, n, opts, ctypes.byref(f))
        if st != _lib.OK:
            self._store.forget(self._mine)
            raise _lib.make_error(st)
        self._ptr = f.value

    def __repr__(self) -> str:
        state = "running" if self._final is None else ("failed" if self._final[0] is not None else "done")
        return f"<rdt.Fetch of {len(self._plan.refs)} ref{'s' if len(self._plan.refs) != 1 else ''}, {state}>"

    # ---- completion ----------------------------------------------------------------

    def _poll(self, ms: int) -> bool:
        """Waits up to ms for the C fetch; True once the result is known."""
        if self._final is not None:
            return True
        ptr = self._ptr
        if ptr is None:  # another thread settled and freed it since
            return self._final is not None
        st = _lib.lib().rdt_pending_wait(ptr, ms)
        if st == _lib.ERR_TIMEOUT:
            return False
        # Made here: the message is this thread's last error.
        self._settle(None if st == _lib.OK else _lib.make_error(st))
        return True

    def _settle(self, err: Optional[BaseException]) -> None:
        """Records the final result (the first one wins) and frees the C
        fetch, unless an event loop watches its descriptor: then the loop
        frees it once it stopped watching."""
        with self._lock:
            if self._final is None:
                self._final = (err,)
            if self._watched():
                return
            ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._free(ptr)

    def _watched(self) -> bool:
        """Whether an event loop watches the descriptor, and so frees the
        fetch once complete. A closed loop never will: it is forgotten, and
        the fetch is freed as one nobody watches. Under the lock."""
        loop = self._loop
        if loop is not None and loop.is_closed():
            self._loop, self._waiters = None, []
            return False
        return loop is not None

    def _free(self, ptr: int) -> None:
        # Complete, or the caller accepts waiting: returns once nothing
        # writes into the targets.
        try:
            _lib.lib().rdt_pending_free(ptr)
        finally:
            self._store.forget(self._mine)
            self._mine, self._buf, self._fd = [], None, None

    def done(self) -> bool:
        """Whether the fetch is complete (succeeded, failed or aborted)."""
        return self._poll(0)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the fetch is complete, up to ``timeout`` seconds (None:
        no limit). True when complete (``result()`` then returns or raises at
        once), False when the time ran out; the fetch keeps running then.
        Ctrl-C interrupts the wait (the fetch keeps running)."""
        return self._wait_until(deadline_of(timeout))

    def _wait_until(self, deadline: Optional[float]) -> bool:
        """Waits in slices until complete (True) or past deadline (False)."""
        while not self._poll(slice_ms(deadline)):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def result(self, timeout: Optional[float] = None) -> Any:
        """What ``get`` returns for these refs: the put structure(s), with new
        tensors or those given in ``out=``. Waits up to ``timeout`` seconds
        (None: no limit) and raises GetTimeoutError (a TimeoutError) when it
        passes, leaving the fetch running. Raises the fetch's error if it
        failed (AbortedError after ``abort()``)."""
        if not self.wait(timeout):
            n = len(self._plan.fetch_refs)
            raise GetTimeoutError(f"rdt.Fetch.result: {n} object{'s' if n != 1 else ''} did not arrive "
                                  f"within {timeout} s; the fetch is still running", _lib.ERR_TIMEOUT)
        return self._result_now()

    def _result_by(self, deadline: Optional[float]) -> Any:
        """get's wait: the result once complete. When the deadline passes
        (GetTimeoutError), or Ctrl-C or an exit interrupts the wait, every
        transfer is stopped first: buffers the caller gave are quiet before
        the error is raised; the fetch's own may finish filling in the
        background (a transport that cannot abort) and are dropped then."""
        try:
            if not self._wait_until(deadline):
                raise GetTimeoutError(self._late("rdt.get"), _lib.ERR_TIMEOUT)
        except (GetTimeoutError, KeyboardInterrupt, SystemExit):
            self.close()
            raise
        return self._result_now()

    def _late(self, call: str) -> str:
        """The message of a deadline that passed in ``call``."""
        n = len(self._plan.fetch_refs)
        return f"{call}: the deadline passed before {n} object{'s' if n != 1 else ''} arrived; the fetch was aborted"

    def _result_now(self) -> Any:
        assert self._final is not None
        err = self._final[0]
        if err is not None:
            raise err
        if not self._has_value:
            p = self._plan
            results = [r._value_of(ts) for r, ts in zip(p.refs, p.tensors)]
            self._value = results[0] if p.single else results
            self._has_value = True
        return self._value

    def abort(self) -> None:
        """Asks every unfinished transfer to stop and returns at once. The
        fetch then completes with AbortedError (or its result, if everything
        had already arrived)."""
        ptr = self._ptr
        if ptr is not None and self._final is None:
            _lib.lib().rdt_pending_abort(ptr)

    # ---- freeing -------------------------------------------------------------------

    def close(self) -> None:
        """Aborts what still runs and frees the fetch (idempotent). With
        ``out=`` it returns once nothing writes into those buffers (for a
        transport that cannot abort: when it finished); the fetch's own
        buffers are dropped in the background instead."""
        self._release(block=not self._plan.owned)

    def _release(self, block: bool) -> None:
        closed = AbortedError("rdt.Fetch: closed before it completed", AbortedError.status)
        L = _lib.lib()
        with self._lock:
            if self._watched() or self._ptr is None:
                watched = self._loop is not None
                ptr = None
            else:
                watched = False
                ptr, self._ptr = self._ptr, None
                if self._final is None:
                    self._final = (closed,)
        if watched:
            # The loop frees it once complete; make that soon. Buffers the
            # caller gave must be quiet before we return. (If the loop freed
            # it meanwhile, the handle is invalid: no wait either.)
            p = self._ptr
            if p is not None:
                L.rdt_pending_abort(p)
                if block:
                    while L.rdt_pending_wait(p, SLICE_MS) == _lib.ERR_TIMEOUT:
                        pass
                    with self._lock:
                        if self._final is None:
                            self._final = (closed,)
            return
        if ptr is None:
            return
        L.rdt_pending_abort(ptr)
        if block or L.rdt_pending_wait(ptr, 0) != _lib.ERR_TIMEOUT:
            self._free(ptr)
            return
        # Only our own buffers can still be written (a transport that has not
        # stopped yet): let a thread free the fetch, and them, afterwards.
        mine, buf, objs = self._mine, self._buf, self._plan.objs
        self._mine, self._buf, self._fd = [], None, None
        self._store.start_thread(_drain, (ptr, buf, objs, self._store, mine), "rdt-drain")

    def _collected(self) -> None:
        # Never block here: a transfer still running is drained by a
        # thread that keeps every target alive until then.
        self._release(block=False)

    # ---- asyncio -------------------------------------------------------------------

    def __await__(self) -> Any:
        return self.wait_async().__await__()

    async def wait_async(self) -> Any:
        """Awaits the fetch and returns ``result()``. The event loop watches
        the fetch's completion descriptor: no thread, and the loop runs
        meanwhile. Cancelling the awaiting task aborts the fetch; with
        ``out=`` the cancellation reaches it once nothing writes into those
        buffers any more."""
        if not self._poll(0):
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._watch(loop, fut)
            try:
                await fut
            except asyncio.CancelledError:
                self.abort()
                if not self._plan.owned:
                    # The buffers are the caller's: nothing may write into
                    # them once the cancellation reaches the caller.
                    await self._aborted(loop)
                self._unwatch(loop)
                raise
            self._poll(0)
        return self._result_now()

    async def _aborted(self, loop: asyncio.AbstractEventLoop) -> None:
        """Returns once the (aborted) fetch is complete; the loop runs
        meanwhile, and a further cancellation does not cut the wait short."""
        fut = loop.create_future()
        self._watch(loop, fut)
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                pass

    def _unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop, once its awaiting task was cancelled: if no other
        task awaits the fetch, stop watching it, so that nothing depends on
        the loop running (or staying open) again, and free it (in the
        background while a transfer still stops)."""
        with self._lock:
            if self._loop is not loop or any(not w.done() for w in self._waiters):
                return
            fd, self._loop, self._waiters = self._fd, None, []
        if fd is not None:
            loop.remove_reader(fd)
        if not self._poll(0):
            self._release(block=not self._plan.owned)

    def _watch(self, loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[None]") -> None:
        with self._lock:
            if self._watched() and self._loop is not loop:
                raise InvalidArgumentError("this fetch is already awaited in another event loop")
            ptr = self._ptr
            if ptr is None:  # completed meanwhile
                fut.set_result(None)
                return
            if self._loop is None:
                if self._fd is None:
                    fd = ctypes.c_int32(-1)
                    _lib.check(_lib.lib().rdt_pending_event_fd(ptr, ctypes.byref(fd)))
                    self._fd = fd.value
                loop.add_reader(self._fd, self._on_complete)
                self._loop = loop
            self._waiters.append(fut)

    def _on_complete(self) -> None:
        """Runs on the loop once the descriptor is readable: the fetch is
        complete. Stop watching, take the result, free, wake the waiters."""
        with self._lock:
            loop, fd = self._loop, self._fd
            self._loop = None
            waiters, self._waiters = self._waiters, []
        if loop is not None and fd is not None:
            loop.remove_reader(fd)
        self._poll(0)  # the result; frees unless already settled
        with self._lock:
            ptr, self._ptr = self._ptr, None
        if ptr is not None:  # settled elsewhere while the loop watched
            self._free(ptr)
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def _drain(fetch: int, buf: Any, objs: List[Any], store: Store, mine: List[Tuple[int, Any]]) -> None:
    """Frees an aborted fetch once nothing writes into its targets; they
    were kept alive until then, and go with it."""
    try:
        _lib.lib().rdt_pending_free(fetch)
    finally:
        store.forget(mine)
        del buf, objs


async def await_fetch(f: Fetch, deadline: Optional[float]) -> Any:
    """Awaits a fetch until deadline (a time.monotonic() value; None: no
    limit), then aborts it and raises GetTimeoutError."""
    if deadline is None:
        return await f
    try:
        return await asyncio.wait_for(f.wait_async(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise GetTimeoutError(f._late("rdt.get_async"), _lib.ERR_TIMEOUT) from None
