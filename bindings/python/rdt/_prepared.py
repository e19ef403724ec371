"""Prepared transfers: rdt.Prepared, a get or a write resolved once and run
many times (Runtime.prepare_get and prepare_write forward here)."""

from __future__ import annotations

import asyncio
import ctypes
import threading
from typing import Any, List, Optional, Sequence, Union

from . import _get
from . import _lib
from . import _write
from ._fetch import check_transport, get_options
from ._handle import Handle
from ._pending import Plan, deadline_of, handles_of, ms_until
from ._errors import InvalidArgumentError
from ._ref import ObjectRef
from ._store import RuntimeLike


class Prepared(Handle):
    """A get or a write resolved once and run again and again with the same
    refs and tensors, made by :meth:`Runtime.prepare_get` and
    :meth:`Runtime.prepare_write`. The first :meth:`run` is an ordinary get
    or write, which connects to the owners, chooses the transports and gets
    the metadata; later runs only start the transports and wait.

    ``run(timeout=None)`` of a prepared get returns what :meth:`Runtime.get`
    returns, with the same tensors every run (those of ``out=``, or the ones
    allocated at prepare): copy a result you keep past the next run.
    ``run(tag, timeout=None)`` of a prepared write returns None once every
    byte landed; each run makes one notice with its ``tag``. A run that
    fails raises as get and write do, and the next run starts again. The
    Prepared holds its own handles on the refs (the objects stay borrowed
    until it is closed) and keeps its tensors alive; keep them unmodified
    while a run goes on. ``close()`` (or leaving a ``with`` block) frees it
    after a run in progress; runs are serialized.

    A run on the main thread without a timeout is not interrupted by Ctrl-C
    until it ends: give long runs a timeout.
    """

    def __init__(self, runtime: RuntimeLike, plan: Plan, transport: Optional[str], write: bool) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self._runtime = runtime
        self._store = runtime._store
        self._plan = plan
        self._write = write
        self._lock = threading.Lock()
        refs = plan.moved
        self._value: Any = None
        self._layout = [r.tensor_descs() for r in refs]  # what rebind takes
        if not refs:  # only objects this runtime owns (a get returns them): nothing to run
            if transport:
                check_transport(runtime, transport, plan)
            self._ptr = None
            self._empty = True
            return
        self._empty = False
        self._transport = transport
        handles = handles_of(refs)
        self._buf, addr, n = plan.pack()  # kept: the C side holds the tensors' addresses
        self._targets = (addr, n)  # what rebind prepares again
        L = _lib.lib()
        p = ctypes.c_void_p()
        if write:
            st = L.rdt_prepare_write(runtime._handle(), handles, len(refs), addr, n,
                                     ctypes.byref(_write.write_options(transport, plan)), ctypes.byref(p))
            self._mine: Any = []
        else:
            gopts = get_options(transport, plan)
            # Python transports receiving a run get these very objects.
            self._mine = self._store.receive_into(plan.targets())
            st = L.rdt_prepare_get(runtime._handle(), handles, len(refs), addr, n,
                                   ctypes.byref(gopts) if gopts is not None else None, ctypes.byref(p))
        if st != _lib.OK:
            self._store.forget(self._mine)
            raise _lib.make_error(st)
        self._ptr = p.value

    def __repr__(self) -> str:
        what = "write into" if self._write else "get of"
        n = len(self._plan.moved)
        state = "closed" if self._ptr is None and not self._empty else "ready"
        return f"<rdt.Prepared {what} {n} ref{'s' if n != 1 else ''}, {state}>"

    def run(self, tag: int = 0, timeout: Optional[float] = None) -> Any:
        """Runs it once; see the class. ``tag`` is a write's notice tag (a
        get ignores it); ``timeout`` in seconds (None: no limit)."""
        deadline = deadline_of(timeout)
        if self._ptr == 0:
            raise InvalidArgumentError("run: this prepared get was unbound; rebind it to refs first",
                                       _lib.ERR_INVALID_ARGUMENT)
        if not self._empty:
            with self._lock:
                st = _lib.lib().rdt_prepared_run(self._handle(), int(tag) & 0xFFFFFFFFFFFFFFFF, ms_until(deadline))
            if st != _lib.OK:
                raise _lib.make_error(st)
        if self._write:
            return None
        if self._value is None:
            p = self._plan
            results = [r._value_of(ts) for r, ts in zip(p.refs, p.tensors)]
            self._value = results[0] if p.single else results
        return self._value

    def rebind(self, refs: Sequence[Any]) -> None:
        """Points a prepared get at other refs of the same layout, keeping
        its targets and ranges: each ref in place of the one prepared there
        (the order :attr:`refs` gives), holding the same tensors (shapes,
        dtypes, devices) in the same order, as a producer's next version of
        the same weights does. The next run is an ordinary get of the new
        refs (it asks their owners for the metadata); the refs held before
        are no longer held. Preparing anew costs Python time per tensor and
        range; this costs it per ref. InvalidArgumentError: a write, another
        count of refs, or a ref of another layout (nothing changes then)."""
        if self._write:
            raise InvalidArgumentError("rebind: a prepared write keeps its refs", _lib.ERR_INVALID_ARGUMENT)
        refs = list(refs)
        if len(refs) != len(self._layout):
            raise InvalidArgumentError(f"rebind: {len(refs)} refs for a get prepared with {len(self._layout)}",
                                       _lib.ERR_INVALID_ARGUMENT)
        for i, (new, was) in enumerate(zip(refs, self._layout)):
            if not isinstance(new, ObjectRef):
                raise InvalidArgumentError(f"rebind: refs[{i}] is a {type(new).__name__}, not an ObjectRef",
                                           _lib.ERR_INVALID_ARGUMENT)
            if new.tensor_descs() != was:
                raise InvalidArgumentError(f"rebind: refs[{i}] holds other tensors than the ref prepared there "
                                           f"({new.shapes} {new.dtypes}, not "
                                           f"{[tuple(d.shape) for d in was]} {[d.dtype_name() for d in was]})",
                                           _lib.ERR_INVALID_ARGUMENT)
        if self._empty:
            return
        handles = handles_of(refs)
        addr, n = self._targets
        gopts = get_options(self._transport, self._plan)
        L = _lib.lib()
        p = ctypes.c_void_p()
        with self._lock:  # after a run in progress
            was_ptr = self._handle()
            st = L.rdt_prepare_get(self._runtime._handle(), handles, len(refs), addr, n,
                                   ctypes.byref(gopts) if gopts is not None else None, ctypes.byref(p))
            if st != _lib.OK:
                raise _lib.make_error(st)
            self._ptr = p.value
            L.rdt_prepared_free(was_ptr or None)
        self._plan.moved = refs

    def unbind(self) -> None:
        """Stops holding the refs of a prepared get (their objects may go)
        while keeping its targets and ranges for :meth:`rebind`; runs raise
        InvalidArgumentError until then. Idempotent."""
        if self._write:
            raise InvalidArgumentError("unbind: a prepared write keeps its refs", _lib.ERR_INVALID_ARGUMENT)
        if self._empty:
            return
        with self._lock:  # after a run in progress
            was_ptr = self._handle()
            self._ptr = 0
            _lib.lib().rdt_prepared_free(was_ptr or None)
        self._plan.moved = []

    @property
    def refs(self) -> List[Any]:
        """The refs it gets, one for each object (in the order
        :meth:`rebind` takes them); none once unbound."""
        return list(self._plan.moved)

    async def run_async(self, tag: int = 0, timeout: Optional[float] = None) -> Any:
        """:meth:`run` on a worker thread, for asyncio (the event loop goes
        on; cancelling the task does not stop the run, which ends within
        its timeout)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.run, tag, timeout)

    def _free(self, ptr: int) -> None:
        with self._lock:  # after a run in progress
            _lib.lib().rdt_prepared_free(ptr)
        self._store.forget(self._mine)


def prepare_get_in(rt: RuntimeLike, refs: Union[_get.Refs, Sequence[_get.Refs]], out: Any = None,
                   transport: Optional[str] = None, device: Optional[str] = None) -> Prepared:
    """Runtime.prepare_get."""
    return Prepared(rt, _get.plan(rt, refs, out, device, transport), transport, write=False)


def prepare_write_in(rt: RuntimeLike, dests: Union[_write.Dests, Sequence[_write.Dests]], value: Any,
                     transport: Optional[str] = None) -> Prepared:
    """Runtime.prepare_write."""
    return Prepared(rt, _write.plan(rt, dests, value), transport, write=True)
