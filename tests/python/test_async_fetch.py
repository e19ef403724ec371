"""rdt.Fetch and asyncio: many fetches in one event loop without a thread
each, timeouts, abort, cancellation of the awaiting task, and a loop that
keeps running while an owner (a real second process, SIGSTOPped) is silent.
The refs are put with tcp, so the bytes need the owner to answer; the
many-fetches test puts with shm and fetches with cma, so that each fetch
waits for the owner's answer to a metadata request."""

import asyncio
import gc
import threading
import time

import numpy as np
import pytest

import rdt
import transports_for_tests as tt
import workers
from conftest import wait_until
from rdt import _lib
from test_deadlines import MARGIN, Stopped

pytestmark = pytest.mark.timeout(120)
EXPECTED = np.arange(1000, dtype=np.float64)
T = 1.0


@pytest.fixture
def owned(child):
    """An owner process, a receiver runtime, and the refs it borrowed (put
    with tcp, put with shm)."""
    c = child(workers.serve_raw, ["tcp", "shm"])
    raws = c.recv()
    rt = rdt.Runtime("receiver", peer_timeout=30)
    # Connected and borrowed while the owner runs.
    ref, shm_ref = rt.deserialize(raws["tcp"][0]), rt.deserialize(raws["shm"][0])
    yield c, rt, ref, shm_ref
    shm_ref.close()
    ref.close()
    rt.close()
    c.stop()


@pytest.fixture
def slow():
    """Two runtimes of this process, and a ref the second borrowed from the
    first, put with a transport that takes Slow.SLOW s per receive and
    cannot abort: a fetch of it runs on for that long whatever happens."""
    owner, rt = rdt.Runtime("slow-owner"), rdt.Runtime("slow-receiver")
    for r in (owner, rt):
        r.register_tensor_transport("slow", ["cpu"], tt.Slow)
    ref = rt.borrow(owner.put(np.arange(10.0), transport="slow"))
    yield rt, ref
    ref.close()
    assert wait_until(lambda: rt.stats()["fetches_active"] == 0, timeout=10)
    rt.close()
    owner.close()


def _nothing_writes(ptr):
    """Whether the C fetch ptr is complete or freed: either way no transfer
    writes into its targets any more."""
    return _lib.lib().rdt_pending_wait(ptr, 0) != _lib.ERR_TIMEOUT


async def _until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.01)


def test_many_get_async_share_the_loop_without_a_thread_each(owned):
    c, rt, _, ref = owned
    n = 100

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        threads_before = threading.active_count()
        with Stopped(c.proc.pid):
            tasks = [asyncio.create_task(rt.get_async(ref, transport="cma")) for _ in range(n)]
            await _until(lambda: rt.stats()["fetches_active"] == n)
            ticks_then = ticks
            await asyncio.sleep(0.5)
            # The loop ran while every fetch waited on the silent owner...
            assert ticks > ticks_then + 5
            assert not any(t.done() for t in tasks)
            # ...and no thread waits per fetch.
            assert threading.active_count() <= threads_before + 2
        values = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        stop.set()
        await tick_task
        return values

    values = asyncio.run(main())
    assert len(values) == n
    for v in values:
        assert np.array_equal(v, EXPECTED)
    assert rt.stats()["fetches_active"] == 0


def test_timeouts_abort_the_fetch(owned):
    c, rt, ref, _ = owned

    async def main():
        with Stopped(c.proc.pid):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(rt.get_async(ref), T)
            assert time.monotonic() - t0 < T + MARGIN
            t0 = time.monotonic()
            with pytest.raises(rdt.GetTimeoutError):
                await rdt.get_async(ref, timeout=T)
            took = time.monotonic() - t0
            assert T - 0.05 < took < T + MARGIN
            # Both fetches were aborted and freed, the owner still silent.
            await _until(lambda: rt.stats()["fetches_active"] == 0)
        return await rdt.get_async(ref, timeout=30)

    assert np.array_equal(asyncio.run(main()), EXPECTED)


def test_cancelling_the_awaiting_task_aborts_the_fetch(owned):
    c, rt, ref, _ = owned

    async def main():
        with Stopped(c.proc.pid):
            f = rt.get_start(ref)
            task = asyncio.create_task(f.wait_async())
            await asyncio.sleep(0.2)
            assert rt.stats()["fetches_active"] == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _until(lambda: rt.stats()["fetches_active"] == 0)
            assert f.done()
            with pytest.raises(rdt.AbortedError):
                f.result()

    asyncio.run(main())


def test_fetch_wait_done_result_and_out(owned):
    c, rt, ref, _ = owned
    out = np.zeros(1000)
    with Stopped(c.proc.pid):
        f = rt.get_start(ref, out=out)
        assert not f.done()
        t0 = time.monotonic()
        assert f.wait(T) is False
        assert T - 0.05 < time.monotonic() - t0 < T + MARGIN
        with pytest.raises(rdt.GetTimeoutError):
            f.result(timeout=0.1)
        assert not f.done()  # a timed-out wait leaves it running
        assert rt.stats()["fetches_active"] == 1
    assert f.wait(30) is True
    assert f.result() is out
    assert np.array_equal(out, EXPECTED)
    assert rt.stats()["fetches_active"] == 0  # freed once complete
    f.close()

    # Awaiting a Fetch, and a list of refs with a structure.
    async def main():
        return await rt.get_start([ref, ref])

    got = asyncio.run(main())
    assert isinstance(got, list) and len(got) == 2
    assert all(np.array_equal(v, EXPECTED) for v in got)


def test_abort_close_and_drop(owned):
    c, rt, ref, _ = owned
    with Stopped(c.proc.pid):
        f = rt.get_start(ref)
        f.abort()
        assert f.wait(10) is True
        with pytest.raises(rdt.AbortedError):
            f.result()
        assert rt.stats()["fetches_active"] == 0

        out = np.zeros(1000)
        with rt.get_start(ref, out=out) as f2:
            assert not f2.done()
        # Closed: nothing writes into out any more, and it is freed.
        assert rt.stats()["fetches_active"] == 0
        with pytest.raises(rdt.AbortedError):
            f2.result()

        f3 = rt.get_start(ref)
        assert rt.stats()["fetches_active"] == 1
        t0 = time.monotonic()
        del f3
        gc.collect()
        assert time.monotonic() - t0 < MARGIN  # dropping never waits for the owner
        end = time.monotonic() + 10
        while rt.stats()["fetches_active"] != 0:
            assert time.monotonic() < end, "a dropped fetch was not freed"
            time.sleep(0.01)
    assert np.array_equal(rdt.get(ref, timeout=30), EXPECTED)


def test_close_of_an_awaited_fetch_into_out_returns_once_nothing_writes(slow):
    rt, ref = slow
    out = np.zeros(10)

    async def main():
        f = rt.get_start(ref, out=out)
        task = asyncio.create_task(f.wait_async())
        await asyncio.sleep(0.1)
        assert f._loop is not None and not f.done()  # the loop watches it
        ptr, n = f._ptr, len(tt.Slow.finished)
        f.close()
        closed_at = time.monotonic()
        assert _nothing_writes(ptr)
        assert len(tt.Slow.finished) == n + 1 and tt.Slow.finished[-1] <= closed_at
        with pytest.raises(rdt.AbortedError):
            await task
        with pytest.raises(rdt.AbortedError):
            f.result()
        await _until(lambda: rt.stats()["fetches_active"] == 0)

    asyncio.run(main())


def test_get_async_into_out_returns_on_timeout_once_nothing_writes(slow):
    rt, ref = slow
    out = np.zeros(10)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        for wait in (lambda: rt.get_async(ref, out=out, timeout=0.3),
                     lambda: rdt.get_async(ref, out=out, timeout=0.3),
                     lambda: asyncio.wait_for(rt.get_async(ref, out=out), 0.3)):
            n, ticks_then = len(tt.Slow.finished), ticks
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await wait()
            done_at = time.monotonic()
            assert done_at - t0 >= tt.Slow.SLOW - 0.2
            # The receive into out was over before the timeout reached us,
            # and the loop ran meanwhile.
            assert len(tt.Slow.finished) == n + 1 and tt.Slow.finished[-1] <= done_at
            assert ticks > ticks_then + 10
        # Without out=, the timeout comes at once: the fetch's own buffers
        # are left to fill in the background.
        t0 = time.monotonic()
        with pytest.raises(rdt.GetTimeoutError):
            await rt.get_async(ref, timeout=0.3)
        assert time.monotonic() - t0 < tt.Slow.SLOW - 0.2
        tick_task.cancel()

    asyncio.run(main())


def test_a_fetch_is_freed_after_its_event_loop_closed(slow):
    rt, ref = slow

    async def cancel_then_await(f):
        task = asyncio.create_task(f.wait_async())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    # Cancelled, the loop closed before the fetch completed, then closed.
    f1 = rt.get_start(ref)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(cancel_then_await(f1))
    loop.close()
    f1.close()
    # Still awaited when the loop closed, then waited on or dropped.
    f2, f3 = rt.get_start(ref), rt.get_start(ref)
    loop = asyncio.new_event_loop()
    tasks = [loop.create_task(f.wait_async()) for f in (f2, f3)]
    loop.run_until_complete(asyncio.sleep(0.1))
    assert f2._loop is loop and f3._loop is loop
    loop.close()
    del tasks, loop
    assert f2.wait(10) is True
    del f3
    gc.collect()
    assert wait_until(lambda: rt.stats()["fetches_active"] == 0, timeout=10)
    assert np.array_equal(f2.result(), np.arange(10.0))


def test_runtime_get_async_fetches_in_that_runtime_only(slow):
    rt, ref = slow
    with rdt.Runtime("another") as other:
        with pytest.raises(rdt.InvalidArgumentError):
            other.get(ref)
        with pytest.raises(rdt.InvalidArgumentError):
            asyncio.run(other.get_async(ref))
        assert asyncio.run(other.get_async([])) == []
    with pytest.raises(rdt.ClosedError):
        other.get([])
    with pytest.raises(rdt.ClosedError):  # not the default runtime's
        asyncio.run(other.get_async([]))
    assert rt.stats()["fetches_active"] == 0


def test_get_async_checks_the_timeout_before_it_starts(slow):
    rt, ref = slow
    for bad in (-1, "soon", object()):
        for call in (lambda: rt.get_async(ref, timeout=bad), lambda: rdt.get_async(ref, timeout=bad)):
            with pytest.raises(rdt.InvalidArgumentError):
                asyncio.run(call())
            assert rt.stats()["fetches_active"] == 0
