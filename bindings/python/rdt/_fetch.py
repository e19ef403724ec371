"""A get under way: rdt.Fetch, the Pending that get_start returns (get and
get_async in _get wait on one too), and what starts it."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from . import _lib
from ._pending import Pending, Plan, fill_options, handles_of
from ._store import RuntimeLike


def get_options(transport: Optional[str], plan: Plan) -> Any:
    """A get's rdt_get_options, or None when it needs none. The sources
    array stays plan's (rdt copies it during the call)."""
    if not transport and plan.ranges is None:
        return None
    return fill_options(_lib.init(_lib.GetOptions()), transport, plan, "sources")


def check_transport(runtime: RuntimeLike, transport: str, plan: Plan) -> None:
    """Refuses a transport name the runtime lacks where nothing moves (a
    get of objects it owns gives back the put tensors), with the error a
    get gives: rdt checks the name in a get of no refs."""
    L = _lib.lib()
    p = ctypes.c_void_p()
    _lib.check(L.rdt_get_start(runtime._handle(), None, 0, None, 0, get_options(transport, plan), ctypes.byref(p)))
    L.rdt_pending_free(p.value)


class Fetch(Pending):
    """A get under way, made by :meth:`Runtime.get_start`: the refs' bytes
    moving into the targets. Every transfer is running when you get it;
    nothing blocks until you wait.

    ``wait(timeout)`` blocks up to ``timeout`` seconds and says whether the
    get is complete; ``done()`` asks without blocking; ``result()`` gives
    what ``get`` would return (or raises its error); ``abort()`` stops every
    transfer. ``await fetch`` (or ``await fetch.wait_async()``) waits without
    blocking the event loop and without a thread: the loop watches the
    completion descriptor. Cancelling the awaiting task aborts the get.

    ``close()`` (also leaving a ``with`` block) aborts what still runs and
    frees it; with ``out=`` it returns once nothing writes into those
    buffers any more. A get that completes frees its native resources by
    itself; one dropped while running is aborted, without blocking.
    :class:`rdt.Write` is its sibling for the other direction.
    """

    _name = "rdt.Fetch"

    def __init__(self, runtime: RuntimeLike, plan: Plan, transport: Optional[str]) -> None:
        super().__init__(runtime, plan)
        self._result: Any = None
        self._has_result = False
        refs = plan.moved
        if not refs:
            if transport:
                check_transport(runtime, transport, plan)
            self._nothing_to_move()  # only own objects or none
            return
        handles = handles_of(refs)
        self._buf, addr, n = plan.pack()
        opts = get_options(transport, plan)
        # Python transports receiving this get get these very objects.
        self._mine = self._store.receive_into(plan.targets())
        p = ctypes.c_void_p()
        st = _lib.lib().rdt_get_start(runtime._handle(), handles, len(refs), addr, n, opts, ctypes.byref(p))
        if st != _lib.OK:
            self._store.forget(self._mine)
            raise _lib.make_error(st)
        self._started(p.value)

    def __repr__(self) -> str:
        n = len(self._plan.refs)
        return f"<rdt.Fetch of {n} ref{'s' if n != 1 else ''}, {self._state()}>"

    def result(self, timeout: Optional[float] = None) -> Any:
        """What ``get`` returns for these refs: the put structure(s), with new
        tensors or those given in ``out=``. Waits up to ``timeout`` seconds
        (None: no limit) and raises GetTimeoutError (a TimeoutError) when it
        passes, leaving the get running. Raises the get's error if it failed
        (AbortedError after ``abort()``)."""
        return super().result(timeout)

    def _value(self) -> Any:
        if not self._has_result:
            p = self._plan
            results = [r._value_of(ts) for r, ts in zip(p.refs, p.tensors)]
            self._result = results[0] if p.single else results
            self._has_result = True
        return self._result

    def _objects(self) -> str:
        n = len(self._plan.moved)
        return f"{n} object{'s' if n != 1 else ''}"

    def _not_yet(self, timeout: Optional[float]) -> str:
        return f"rdt.Fetch.result: {self._objects()} did not arrive within {timeout} s; the get is still running"

    def _late(self, call: str) -> str:
        return f"{call}: the deadline passed before {self._objects()} arrived; the get was aborted"
