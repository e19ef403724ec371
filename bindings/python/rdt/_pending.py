"""A get or a write under way: the one C rdt_pending that rdt.Fetch (a get,
in _fetch) and rdt.Write (a write, in _write) each own, its blocking and
asyncio waits, aborting and freeing. What the two share is here; what a
get or a write is (how it starts, what it returns, the words of its
errors) is each subclass's own."""

from __future__ import annotations

import abc
import asyncio
import ctypes
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

from . import _lib
from . import _tensors as _t
from ._errors import AbortedError, GetTimeoutError, InvalidArgumentError
from ._handle import Handle
from ._ref import ObjectRef, Range
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


def zero_timeout(refs: Any, call: str) -> None:
    """What a call that moves refs (ObjectRefs or ranges of them) does with
    timeout 0, which is no time at all, the same on every transport
    (docs/abi.md, "Timeouts"): a ref of another runtime is refused with
    GetTimeoutError before anything starts; the runtime's own objects need
    no other process and are done without a deadline (None). ``call`` names
    the caller in the message ("rdt.get", "rdt.write")."""
    for i, x in enumerate(refs):
        r = x.ref if isinstance(x, Range) else x
        if not r.is_owner:
            raise GetTimeoutError(f"{call}: timeout 0 leaves no time to reach the owner of ref {i} "
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


def handles_of(refs: Sequence[ObjectRef]) -> Any:
    """The refs' C handles as the rdt_ref *const * of a start call."""
    if len(refs) == 1:
        return ctypes.byref(ctypes.c_void_p(refs[0]._handle()))
    return (ctypes.c_void_p * len(refs))(*[r._handle() for r in refs])


class Plan:
    """What a get or a write moves: the refs and ranges asked for, each
    one's local tensors (a get's targets, new, given in out=, or the put
    tensors of an object this runtime owns; a write's sources), and, of
    those, the refs whose objects move (``moved``, each once, the refs rdt
    is called with). ``ranges`` (the rdt_range array of a partial get's
    sources or a partial write's destinations, else None) says where each
    local tensor's bytes come from or land."""

    __slots__ = ("single", "refs", "tensors", "moved", "items", "objs", "owned", "ranges", "packed")

    def __init__(self, single: bool, refs: List[Any], tensors: List[List[Any]], moved: List[ObjectRef],
                 items: List[_t.Item], objs: List[Any], owned: bool, ranges: Optional[Any] = None,
                 packed: Optional[Tuple[Any, int, List[int]]] = None) -> None:
        self.single, self.refs, self.tensors = single, refs, tensors
        self.moved, self.items, self.objs, self.owned = moved, items, objs, owned
        self.ranges = ranges
        # Local tensors packed already (_t.pack_out): the array, its address
        # and each tensor's address; items is empty then.
        self.packed = packed

    def pack(self) -> Tuple[Any, int, int]:
        """The local tensors' rdt_tensor array (keep it alive while in use),
        its address and length."""
        if self.packed is not None:
            return self.packed[0], self.packed[1], len(self.packed[2])
        buf, addr = _t.pack(self.items)
        return buf, addr, len(self.items)

    def targets(self) -> Any:
        """(data address, tensor object) of every local tensor."""
        datas = self.packed[2] if self.packed is not None else [it.data for it in self.items]
        return zip(datas, self.objs)


def fill_options(opts: Any, transport: Optional[str], plan: Plan, ranges_field: str) -> Any:
    """Names transport (when given) in a get's or a write's options struct
    and points its ranges_field (sources or destinations) at the plan's
    rdt_range array when it has one (rdt copies the array during the call)."""
    if transport:
        opts.transport = transport.encode()
    if plan.ranges is not None:
        setattr(opts, ranges_field, ctypes.cast(plan.ranges.ctypes.data, ctypes.POINTER(_lib.Range)))
        setattr(opts, "num_" + ranges_field, len(plan.ranges))
    return opts


class Pending(Handle, abc.ABC):
    """A get or a write under way, one C rdt_pending: every transfer is
    running when it is made; nothing blocks until it is waited on.

    ``wait(timeout)`` blocks up to ``timeout`` seconds and says whether it
    is complete; ``done()`` asks without blocking; ``result()`` gives its
    result (or raises its error); ``abort()`` stops every transfer. ``await``
    on it (or ``wait_async()``) waits without blocking the event loop and
    without a thread: the loop watches the rdt_pending's completion
    descriptor. Cancelling the awaiting task aborts it.

    ``close()`` (also leaving a ``with`` block) aborts what still runs and
    frees it; with local tensors the caller gave (a get's ``out=``, a
    write's sources) it returns once nothing touches them any more. One
    that completes frees its native resources by itself; one dropped while
    running is aborted, without blocking.

    On :class:`Handle`'s pattern: the rdt_pending is its handle, swapped out
    under its own lock (which also guards the result and the event loop
    watching it), and freed by :meth:`_free`.

    A subclass starts it (:meth:`_started` with the rdt_pending, or
    :meth:`_nothing_to_move`) and says what it is: ``_name`` (its class as
    users see it, for messages), :meth:`_value` (its result),
    :meth:`_not_yet` and :meth:`_late` (its messages for a timeout).
    """

    _name = "rdt.Pending"

    def __init__(self, runtime: RuntimeLike, plan: Plan) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self._runtime = runtime
        self._store: Store = runtime._store
        self._plan = plan
        self._lock = threading.Lock()
        self._ptr: Optional[int] = None  # the rdt_pending, until freed
        self._final: Optional[Tuple[Optional[BaseException]]] = None  # (error or None,) once complete
        self._fd: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # watching the fd
        self._waiters: List["asyncio.Future[None]"] = []
        self._buf: Any = None  # the rdt_tensor array rdt was given
        self._mine: List[Tuple[int, Any]] = []  # buffers registered for Python transports

    def _started(self, ptr: int) -> None:
        """The start call succeeded with this rdt_pending."""
        self._ptr = ptr

    def _nothing_to_move(self) -> None:
        """Complete at once: nothing to move, so no rdt_pending."""
        self._final = (None,)

    # ---- what each kind says --------------------------------------------------------

    @abc.abstractmethod
    def _value(self) -> Any:
        """The result once it completed without error."""

    @abc.abstractmethod
    def _not_yet(self, timeout: Optional[float]) -> str:
        """The message of result(timeout) when the time ran out."""

    @abc.abstractmethod
    def _late(self, call: str) -> str:
        """The message of a deadline that passed in ``call`` (it aborted)."""

    # ---- completion ----------------------------------------------------------------

    def _state(self) -> str:
        return "running" if self._final is None else ("failed" if self._final[0] is not None else "done")

    def _poll(self, ms: int) -> bool:
        """Waits up to ms for the rdt_pending; True once the result is known."""
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
        """Records the final result (the first one wins) and frees the
        rdt_pending, unless an event loop watches its descriptor: then the
        loop frees it once it stopped watching."""
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
        rdt_pending once complete. A closed loop never will: it is
        forgotten, and the rdt_pending is freed as one nobody watches.
        Under the lock."""
        loop = self._loop
        if loop is not None and loop.is_closed():
            self._loop, self._waiters = None, []
            return False
        return loop is not None

    def _free(self, ptr: int) -> None:
        # Complete, or the caller accepts waiting: returns once nothing
        # touches the local tensors.
        try:
            _lib.lib().rdt_pending_free(ptr)
        finally:
            self._store.forget(self._mine)
            self._mine, self._buf, self._fd = [], None, None

    def done(self) -> bool:
        """Whether it is complete (succeeded, failed or aborted)."""
        return self._poll(0)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until it is complete, up to ``timeout`` seconds (None: no
        limit). True when complete (``result()`` then returns or raises at
        once), False when the time ran out; it keeps running then. Ctrl-C
        interrupts the wait (it keeps running)."""
        return self._wait_until(deadline_of(timeout))

    def _wait_until(self, deadline: Optional[float]) -> bool:
        """Waits in slices until complete (True) or past deadline (False)."""
        while not self._poll(slice_ms(deadline)):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def result(self, timeout: Optional[float] = None) -> Any:
        """Its result, waiting up to ``timeout`` seconds (None: no limit);
        GetTimeoutError (a TimeoutError) when the time runs out, leaving it
        running. Raises its error if it failed (AbortedError after
        ``abort()``)."""
        if not self.wait(timeout):
            raise GetTimeoutError(self._not_yet(timeout), _lib.ERR_TIMEOUT)
        return self._result_now()

    def _result_by(self, deadline: Optional[float], call: str) -> Any:
        """The blocking call's wait (``call`` is its name, for the message):
        the result once complete. When the deadline passes
        (GetTimeoutError), or Ctrl-C or an exit interrupts the wait, every
        transfer is stopped first: local tensors the caller gave are quiet
        before the error is raised; a get's own targets may finish filling
        in the background (a transport that cannot abort) and are dropped
        then."""
        try:
            if not self._wait_until(deadline):
                raise GetTimeoutError(self._late(call), _lib.ERR_TIMEOUT)
        except (GetTimeoutError, KeyboardInterrupt, SystemExit):
            self.close()
            raise
        return self._result_now()

    def _result_now(self) -> Any:
        assert self._final is not None
        err = self._final[0]
        if err is not None:
            raise err
        return self._value()

    def abort(self) -> None:
        """Asks every unfinished transfer to stop and returns at once. It
        then completes with AbortedError (or its result, if everything had
        already moved)."""
        ptr = self._ptr
        if ptr is not None and self._final is None:
            _lib.lib().rdt_pending_abort(ptr)

    # ---- freeing -------------------------------------------------------------------

    def close(self) -> None:
        """Aborts what still runs and frees it (idempotent). With local
        tensors the caller gave it returns once nothing touches them (for a
        transport that cannot abort: when it finished); a get's own targets
        are dropped in the background instead."""
        self._release(block=not self._plan.owned)

    def _release(self, block: bool) -> None:
        closed = AbortedError(f"{self._name}: closed before it completed", AbortedError.status)
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
            # The loop frees it once complete; make that soon. Tensors the
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
        # Only our own tensors can still be touched (a transport that has
        # not stopped yet): let a thread free the rdt_pending, and them,
        # afterwards.
        mine, buf, objs = self._mine, self._buf, self._plan.objs
        self._mine, self._buf, self._fd = [], None, None
        self._store.start_thread(_drain, (ptr, buf, objs, self._store, mine), "rdt-drain")

    def _collected(self) -> None:
        # Never block here: a transfer still running is drained by a
        # thread that keeps every local tensor alive until then.
        self._release(block=False)

    # ---- asyncio -------------------------------------------------------------------

    def __await__(self) -> Any:
        return self.wait_async().__await__()

    async def wait_async(self) -> Any:
        """Awaits it and returns ``result()``. The event loop watches the
        completion descriptor: no thread, and the loop runs meanwhile.
        Cancelling the awaiting task aborts it; with local tensors the
        caller gave, the cancellation reaches it once nothing touches them
        any more."""
        if not self._poll(0):
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._watch(loop, fut)
            try:
                await fut
            except asyncio.CancelledError:
                self.abort()
                if not self._plan.owned:
                    # The tensors are the caller's: nothing may touch them
                    # once the cancellation reaches the caller.
                    await self._aborted(loop)
                self._unwatch(loop)
                raise
            self._poll(0)
        return self._result_now()

    async def _aborted(self, loop: asyncio.AbstractEventLoop) -> None:
        """Returns once the (aborted) operation is complete; the loop runs
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
        task awaits it, stop watching, so that nothing depends on the loop
        running (or staying open) again, and free it (in the background
        while a transfer still stops)."""
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
                raise InvalidArgumentError(f"this {self._name} is already awaited in another event loop")
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
        """Runs on the loop once the descriptor is readable: it is complete.
        Stop watching, take the result, free, wake the waiters."""
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


def _drain(pending: int, buf: Any, objs: List[Any], store: Store, mine: List[Tuple[int, Any]]) -> None:
    """Frees an aborted rdt_pending once nothing touches its local tensors;
    they were kept alive until then, and go with it."""
    try:
        _lib.lib().rdt_pending_free(pending)
    finally:
        store.forget(mine)
        del buf, objs


async def await_pending(p: Pending, deadline: Optional[float], call: str) -> Any:
    """Awaits a get or a write until deadline (a time.monotonic() value;
    None: no limit), then aborts it and raises GetTimeoutError with its
    message for ``call`` ("rdt.get_async", "rdt.write_async")."""
    if deadline is None:
        return await p
    try:
        return await asyncio.wait_for(p.wait_async(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise GetTimeoutError(p._late(call), _lib.ERR_TIMEOUT) from None
