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
import workers
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
            f = rt.fetch(ref)
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
        f = rt.fetch(ref, out=out)
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
        return await rt.fetch([ref, ref])

    got = asyncio.run(main())
    assert isinstance(got, list) and len(got) == 2
    assert all(np.array_equal(v, EXPECTED) for v in got)


def test_abort_close_and_drop(owned):
    c, rt, ref, _ = owned
    with Stopped(c.proc.pid):
        f = rt.fetch(ref)
        f.abort()
        assert f.wait(10) is True
        with pytest.raises(rdt.AbortedError):
            f.result()
        assert rt.stats()["fetches_active"] == 0

        out = np.zeros(1000)
        with rt.fetch(ref, out=out) as f2:
            assert not f2.done()
        # Closed: nothing writes into out any more, and it is freed.
        assert rt.stats()["fetches_active"] == 0
        with pytest.raises(rdt.AbortedError):
            f2.result()

        f3 = rt.fetch(ref)
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
