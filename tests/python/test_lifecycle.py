"""Lifetimes: timeouts, freeing, dead peers, fork, interpreter exit."""

import gc
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest

import rdt
import transports_for_tests as tt
import workers
from conftest import stop_process, wait_until

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))



def test_timeout_raises_and_leaks_nothing(child):
    rdt.register_tensor_transport("stuck", ["cpu"], tt.Stuck)
    c = child(workers.serve, ["stuck"], "small", [("stuck", "transports_for_tests", "Stuck")])
    (ref,) = pickle.loads(c.recv()["stuck"])
    rt = rdt.default_runtime()
    for _ in range(2):  # the ref stays usable after a timeout
        t0 = time.monotonic()
        with pytest.raises(rdt.GetTimeoutError) as e:
            rdt.get(ref, timeout=0.3)
        assert isinstance(e.value, TimeoutError) and isinstance(e.value, rdt.RdtError)
        assert 0.25 < time.monotonic() - t0 < 3
        # The abort reaches the transport on rdt's own thread; Stuck knows
        # fetches only by object id, so let it land before the next one.
        assert wait_until(lambda: rt.stats()["fetches_active"] == 0)
    assert wait_until(lambda: not rt._store.receiving)  # no buffer left registered (the drain thread forgets it)
    ref.close()
    c.send("stats")
    assert wait_until(lambda: rt.stats()["borrowed_objects"] == 0)
    c.stop()


def test_small_get_into_out_times_out_and_recovers(child):
    # One small ref into one array takes a single-call path that gives up
    # after a slice and starts again; a stopped source exercises both the
    # restart (timeout > slice) and the deadline, then the same ref works.
    c = child(workers.serve, ["tcp"], "small")
    (ref,) = pickle.loads(c.recv()["tcp"])
    out = np.zeros(10)
    rdt.get(ref, out=out)
    assert out.tolist() == list(np.arange(10.0))
    out[:] = -1
    stop_process(c.proc.pid)
    try:
        t0 = time.monotonic()
        with pytest.raises(rdt.GetTimeoutError):
            rdt.get(ref, timeout=0.5, out=out)
        assert 0.45 < time.monotonic() - t0 < 3
        assert (out == -1).all()  # nothing was written after the timeout
    finally:
        os.kill(c.proc.pid, signal.SIGCONT)
    assert rdt.get(ref, timeout=30, out=out) is out
    assert out.tolist() == list(np.arange(10.0))
    ref.close()
    c.stop()


def test_timeout_with_a_transport_that_cannot_abort(child, request):
    # Without out=, get returns at the deadline and the transfer finishes
    # in the background into buffers nobody sees; with out=, get returns
    # only once nothing writes into the caller's buffers.
    rdt.register_tensor_transport("slow", ["cpu"], tt.Slow)
    # Runtimes that later tests make must not inherit it (they register
    # their own "slow").
    request.addfinalizer(lambda: rdt._process.PROCESS.remove_transport("slow"))
    c = child(workers.serve, ["slow"], "small", [("slow", "transports_for_tests", "Slow")])
    (ref,) = pickle.loads(c.recv()["slow"])
    rt = rdt.default_runtime()
    t0 = time.monotonic()
    with pytest.raises(rdt.GetTimeoutError):
        rdt.get(ref, timeout=0.3)
    assert time.monotonic() - t0 < 1.2 < tt.Slow.SLOW
    assert wait_until(lambda: rt.stats()["fetches_active"] == 0, timeout=10)
    assert wait_until(lambda: not rt._store.receiving)

    out = np.zeros(10)
    t0 = time.monotonic()
    with pytest.raises(rdt.GetTimeoutError):
        rdt.get(ref, timeout=0.3, out=out)
    done_at = time.monotonic()
    assert done_at - t0 >= tt.Slow.SLOW - 0.2
    assert tt.Slow.finished and tt.Slow.finished[-1] <= done_at  # the receive was over before get returned
    ref.close()
    c.stop()


def test_put_keeps_objects_alive_until_released():
    with rdt.Runtime("keep") as rt:
        x = np.arange(1000.0)
        for _ in range(300):  # one buffer put and released again and again: nothing piles up
            rt.put(x).close()
        rt.wait_tensor_freed(x, timeout=10)
        assert wait_until(lambda: not rt._store.entries)

        y = np.arange(5.0)
        alive = weakref.ref(y)
        ref = rt.put(y)
        del y
        gc.collect()
        assert alive() is not None  # rdt still holds it: so does Python
        other = rdt.Runtime("other")
        assert other.get(other.borrow(ref)).tolist() == [0, 1, 2, 3, 4]
        other.close()
        ref.close()
        assert wait_until(lambda: alive() is None)  # released: gone


def test_wait_tensor_freed_until_a_borrower_releases(child):
    x = np.arange(1000.0)
    ref = rdt.put(x)
    c = child(workers.hold, pickle.dumps(ref))
    assert c.recv() == "holding"
    ref.close()
    with pytest.raises(rdt.GetTimeoutError) as e:
        rdt.wait_tensor_freed(x, timeout=0.3)
    assert isinstance(e.value, TimeoutError)
    c.send("release")
    assert c.recv() == "released"
    rdt.wait_tensor_freed(x, timeout=10)
    c.proc.join(30)


def test_wait_tensor_freed_when_the_borrower_is_killed(child):
    x = np.arange(1000.0)
    ref = rdt.put(x)
    stats = rdt.default_runtime().stats
    before = stats()["borrows"]
    c = child(workers.hold, pickle.dumps(ref))
    assert c.recv() == "holding"
    # Unpickling sends the borrow without waiting for the owner's answer:
    # a borrower killed before its borrow lands leaves only the lease,
    # which holds the object for two minutes. Kill it once it is counted.
    assert wait_until(lambda: stats()["borrows"] == before + 1)
    ref.close()
    c.kill()
    t0 = time.monotonic()
    rdt.wait_tensor_freed(x, timeout=30)
    assert time.monotonic() - t0 < 15
    rdt.wait_tensor_freed(np.arange(3.0))  # never put: returns at once


@pytest.mark.parametrize("how", ["exits", "is killed"])
def test_get_when_the_owner_is_gone(child, how):
    c = child(workers.serve, [None], "small")
    blob = c.recv()[None]
    (ref,) = pickle.loads(blob)  # a borrow, made while the owner lives
    lost = rdt.default_runtime().stats()["peers_lost"]
    if how == "exits":
        c.send("exit_now")
        c.proc.join(30)
    else:
        c.kill()
    t0 = time.monotonic()
    with pytest.raises(rdt.PeerUnavailableError) as e:
        rdt.get(ref, timeout=30)
    assert isinstance(e.value, ConnectionError)
    assert time.monotonic() - t0 < 15
    # Unpickling makes a borrow, which needs the owner. A borrow goes out on
    # the connection already open without waiting for the answer (rdt.h,
    # rdt_ref_deserialize), and the get above may have failed on the
    # transport before this runtime read the connection's end (a loaded
    # machine): once it has, unpickling fails at once.
    assert wait_until(lambda: rdt.default_runtime().stats()["peers_lost"] > lost)
    with pytest.raises(rdt.PeerUnavailableError):
        pickle.loads(blob)
    ref.close()


def test_unpickling_refs_of_a_closed_runtime():
    rt = rdt.Runtime("short-lived")
    blob = pickle.dumps(rt.put(np.ones(3)))
    ref = rt.put(np.ones(2))
    rt.close()
    with pytest.raises(rdt.PeerUnavailableError):
        pickle.loads(blob)
    with pytest.raises(rdt.ClosedError):
        rdt.get(ref)
    with pytest.raises(rdt.ClosedError):
        rt.put(np.ones(1))
    ref.close()  # still fine
    assert "closed" in repr(rt)


def _use_after_fork(q):
    try:
        rdt.put(np.ones(2))
        q.put("no error")
    except rdt.ForkedError as e:
        q.put("forked: " + str(e))


def test_fork_after_loading_is_a_clear_error():
    rdt.default_runtime()
    fctx = mp.get_context("fork")
    q = fctx.Queue()
    p = fctx.Process(target=_use_after_fork, args=(q,))
    p.start()
    msg = q.get(timeout=30)
    p.join(30)
    assert msg.startswith("forked:") and "spawn" in msg and "fork" in msg


def test_fork_before_loading_is_fine():
    code = textwrap.dedent("""
        import os, numpy as np, rdt
        pid = os.fork()                      # rdt imported, library not loaded yet
        if pid == 0:
            with rdt.Runtime("child") as rt:
                os._exit(0 if rt.get(rt.put(np.arange(3.0))).tolist() == [0, 1, 2] else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "child 0"


def test_interpreter_exit_with_live_runtimes_transports_and_fetches():
    code = textwrap.dedent("""
        import sys, threading, numpy as np, rdt
        sys.path.insert(0, %r)
        import transports_for_tests as tt
        rt = rdt.Runtime("left-open")
        rt.register_tensor_transport("pyshm", ["cpu"], tt.PyShm)
        rt.register_tensor_transport("slow", ["cpu"], tt.Slow)
        keep = [rt.put(np.ones(1000), transport="pyshm"), rt.put(np.ones(10))]
        other = rdt.Runtime("other")
        other.register_tensor_transport("slow", ["cpu"], tt.Slow)
        borrowed = other.borrow(rt.put(np.ones(10), transport="slow"))
        try:
            other.get(borrowed, timeout=0.1)   # leaves a transfer draining in the background
        except rdt.GetTimeoutError:
            pass
        def fetch_forever():
            try:
                other.get(borrowed)
            except rdt.RdtError:
                pass  # the owner goes away at exit: an error, not a hang or a crash
        threading.Thread(target=fetch_forever, daemon=True).start()
        rdt.put(np.zeros(3))  # the default runtime too
        print("exiting")
    """ % HERE)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert "Traceback" not in out.stderr and "panic" not in out.stderr
    assert time.monotonic() - t0 < 30


def test_exit_waits_for_the_release_thread_to_finish_dropping_tensors(tmp_path):
    # A released object's tensors are dropped on rdt's release thread. If
    # the interpreter finalized while that thread was still inside a drop,
    # the thread would be killed where it stood (inside a torch tensor's C++
    # destructor that aborts the process). The finalizer below runs on the
    # release thread and is slow: its marker shows that it ran to the end.
    marker = tmp_path / "dropped"
    code = textwrap.dedent("""
        import sys, threading, time, weakref, numpy as np, rdt
        started = threading.Event()
        def slow_drop():
            started.set()
            time.sleep(0.5)  # the GIL goes; exit proceeds on the main thread
            open(%r, "w").write(threading.current_thread().name)
        rt = rdt.Runtime("owner")
        data = np.ones(1000)
        weakref.finalize(data, slow_drop)
        ref = rt.put(data)
        del data
        ref.release()  # the object is freed; the release thread drops its tensors
        if not started.wait(30):
            sys.exit("the release thread never dropped the tensors")
        print("exiting")
    """ % str(marker))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert marker.exists(), "the interpreter finalized while the release thread was still dropping tensors"
    assert marker.read_text().startswith("rdt-release")


def test_the_store_indexes_an_entry_only_while_it_lives():
    """index runs without the store's lock, on every first pickling of a
    ref: whichever order it and drop run in, a dropped entry is never left
    findable by its id."""
    from rdt._store import Entry, Store

    s = Store()
    live, dropped, late = Entry([], [], None), Entry([], [], None), Entry([], [], None)
    for e in (live, dropped, late):
        s.add(e)
    s.index(live, "aa")
    s.index(dropped, "bb")
    s.drop(dropped.key)  # indexed, then dropped
    s.drop(late.key)
    s.index(late, "cc")  # dropped, then indexed
    assert s.own("aa") is live and s.own("bb") is None and s.own("cc") is None
    assert set(s.by_id) == {"aa"}
    s.drop(live.key)
    assert s.own("aa") is None and not s.by_id and not s.entries
