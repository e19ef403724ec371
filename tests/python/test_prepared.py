"""Prepared gets and writes between real processes: each run moves what
the source holds at that run, a prepared write makes one notice per run,
a killed owner or writer fails clearly, and a closed Prepared refuses."""

import gc
import pickle
import time

import numpy as np
import pytest

import rdt
import workers
from conftest import check_notices_after_writer_killed, wait_until

HOST = ["cma", "shm", "tcp"]


@pytest.mark.parametrize("transport", HOST)
def test_prepared_get_runs_again_and_moves_the_bytes_each_time(child, transport):
    c = child(workers.mutable_source, transport)
    ref = pickle.loads(c.recv())
    out = np.full(1024, -1, np.float32)
    # cma and tcp read the owner's memory at each run; shm staged the object
    # at put, so each run moves the put bytes again.
    live = transport != "shm"
    with rdt.prepare_get(ref, out=out) as p:
        ref.close()  # the Prepared holds its own handle: the object stays borrowed
        for v in range(1, 6):
            c.send(("set", float(v)))
            assert c.recv() == "ok"
            out[:] = -1
            got = p.run(timeout=30)
            assert got is out and (out == (v if live else 0)).all(), f"run {v}"
        assert "ready" in repr(p)
    with pytest.raises(rdt.ClosedError):
        p.run()
    c.stop()


@pytest.mark.parametrize("transport", HOST)
def test_a_rebound_prepared_get_fetches_each_new_version_into_the_same_targets(child, transport):
    c = child(workers.version_source, transport)
    c.send(("put", 1.0))
    ref = pickle.loads(c.recv())
    head = np.zeros(100, np.float32)
    tail = np.zeros(256, np.float32)
    with rdt.prepare_get([ref[0][10:110], ref[1]], out=[head, tail]) as p:
        assert p.refs[0].id == ref.id
        p.run(timeout=30)
        assert (head == 1).all() and (tail == 1).all()
        for v in (2.0, 3.0):
            c.send(("put", v))
            new = pickle.loads(c.recv())
            p.rebind([new])
            ref.close()  # the Prepared holds the new one; the old may go
            ref = new
            assert p.refs[0].id == new.id
            p.run(timeout=30)
            assert (head == v).all() and (tail == v).all(), f"version {v}"
        c.send(("put3", 4.0))
        other = pickle.loads(c.recv())
        with pytest.raises(rdt.InvalidArgumentError, match="other tensors"):
            p.rebind([other])
        with pytest.raises(rdt.InvalidArgumentError, match="2 refs for a get prepared with 1"):
            p.rebind([ref, ref])
        p.run(timeout=30)  # still bound to the last good version
        assert (head == 3).all()
        p.unbind()
        p.unbind()  # idempotent
        assert p.refs == []
        with pytest.raises(rdt.InvalidArgumentError, match="unbound"):
            p.run(timeout=30)
        c.send(("put", 5.0))
        last = pickle.loads(c.recv())
        ref.close()  # unbound: nothing holds version 3 any more
        p.rebind([last])
        p.run(timeout=30)
        assert (head == 5).all() and (tail == 5).all()
        ref = last
        other.close()
    ref.close()
    c.stop()


def test_a_prepared_write_cannot_be_rebound(child):
    c = child(workers.exposer, ["cma"], None)
    ref = rdt.default_runtime().deserialize(c.recv()["cma"])
    with rdt.prepare_write(ref, np.ones(4096, np.uint8)) as p:
        with pytest.raises(rdt.InvalidArgumentError, match="keeps its refs"):
            p.rebind([ref])
    ref.close()
    c.stop()


def test_prepared_get_without_out_reuses_its_tensors(child):
    c = child(workers.mutable_source, "cma")
    ref = pickle.loads(c.recv())
    p = rdt.prepare_get(ref)
    first = p.run(timeout=30)
    c.send(("set", 7.0))
    assert c.recv() == "ok"
    again = p.run(timeout=30)
    assert again is first and (again == 7).all(), "the same array, filled again"
    p.close()
    p.close()  # idempotent
    ref.close()
    c.stop()


def test_prepared_get_owner_killed(child):
    c = child(workers.mutable_source, "cma")
    ref = pickle.loads(c.recv())
    out = np.zeros(1024, np.float32)
    p = rdt.prepare_get(ref, out=out)
    p.run(timeout=30)
    c.kill()
    with pytest.raises(rdt.PeerUnavailableError):
        end = time.monotonic() + 60
        while time.monotonic() < end:
            p.run(timeout=30)  # until the runtime notices the owner is gone
            time.sleep(0.01)
    p.close()
    ref.close()


@pytest.mark.parametrize("transport", ["cma", "shm", "tcp"])
def test_prepared_write_notice_per_run(child, transport):
    with rdt.Runtime("owner") as rt:
        bufs = {"w": np.zeros((64, 16), np.float32), "b": np.zeros(100, np.uint8)}
        ref = rt.expose(bufs, transport=transport)
        c = child(workers.prepared_writer, pickle.dumps(ref), transport)
        assert c.recv() == "ready"
        for tag in (1, 2, 3, 4):
            c.send(("run", tag))
            assert c.recv() == "ok"
            n = ref.wait_notice(timeout=30)
            assert n.ok and n.tag == tag
            want = workers.version_of(tag)
            assert all(np.array_equal(bufs[k], want[k]) for k in bufs), f"version {tag} landed whole"
        ref.revoke_writes(timeout=30)
        c.send(("run", 5))
        assert c.recv().startswith("PermissionDeniedError")
        with pytest.raises(rdt.GetTimeoutError):
            ref.wait_notice(timeout=0)  # a refused write makes no notice
        c.stop()


def test_prepared_writer_killed_mid_loop_never_leaves_a_false_success(child):
    with rdt.Runtime("owner") as rt:
        bufs = {"w": np.zeros((64, 16), np.float32), "b": np.zeros(100, np.uint8)}
        ref = rt.expose(bufs, transport="cma")
        c = child(workers.prepared_writer, pickle.dumps(ref), "cma")
        assert c.recv() == "ready"
        c.send(("loop", 1))
        assert c.recv() == "looping"
        first = ref.wait_notice(timeout=60)
        assert first.ok and first.tag == 1
        c.kill()
        assert wait_until(lambda: rt.stats()["writes_open"] == 0, 60)
        check_notices_after_writer_killed(
            ref, first, lambda tag: all(np.array_equal(bufs[k], workers.version_of(tag)[k]) for k in bufs))


def test_prepare_refuses_bad_arguments_and_dropped_ones_free_themselves():
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        r = a.put(np.arange(10.0), transport="cma")
        theirs = b.deserialize(r.serialize())
        with pytest.raises(rdt.InvalidArgumentError):
            b.prepare_get(theirs, out=np.zeros(3))
        with pytest.raises(rdt.InvalidArgumentError):
            b.prepare_write(theirs, np.zeros(10))  # a put object is not written
        out = np.zeros(10)
        p = b.prepare_get(theirs, out=out)
        p.run(timeout=10)
        assert (out == np.arange(10.0)).all()
        theirs.close()
        del p
        gc.collect()
        r.close()
        assert wait_until(lambda: a.stats()["objects_freed"] == 1, 30), "dropping the Prepared let go of the borrow"


def test_run_async():
    import asyncio
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        x = np.arange(100.0)
        r = a.put(x, transport="shm")
        theirs = b.deserialize(r.serialize())
        p = b.prepare_get(theirs, out=np.zeros(100))
        got = asyncio.run(p.run_async(timeout=10))
        assert (got == x).all()
        p.close()
