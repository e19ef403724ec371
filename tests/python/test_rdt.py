"""The Python package between real processes (multiprocessing, spawn)."""

import multiprocessing as mp
import os
import pickle
import time

import numpy as np
import pytest

import rdt
import transports_for_tests as tt
import workers

pytestmark = pytest.mark.timeout(120)

BUILTINS = ["cma", "shm", "tcp"]


def start(ctx, target, *args):
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(child,) + args)
    p.start()
    return p, parent


def finish(p, conn):
    try:
        conn.send("stop")
    except (BrokenPipeError, OSError):
        pass
    p.join(30)
    assert p.exitcode == 0


@pytest.mark.parametrize("transport", [None] + BUILTINS)
def test_every_dtype_across_processes(ctx, transport):
    p, conn = start(ctx, workers.serve, transport, "dtypes")
    refs = pickle.loads(conn.recv())
    want = workers.dtype_arrays()
    got = rdt.get(refs)
    assert [g["name"] for g in got] == list(want)
    for g in got:
        w = want[g["name"]]
        assert isinstance(g["tensor"], np.ndarray)
        assert g["tensor"].dtype == w.dtype and g["tensor"].shape == w.shape
        np.testing.assert_array_equal(g["tensor"], w)
    for r in refs:
        r.close()
    finish(p, conn)


def test_nested_structures_round_trip(ctx):
    p, conn = start(ctx, workers.serve, None, "nested")
    (ref,) = pickle.loads(conn.recv())
    v = rdt.get(ref)
    assert v["d"] is None
    np.testing.assert_array_equal(v["a"][0], np.ones(3))
    assert isinstance(v["a"][1], tuple) and v["a"][1][1:] == ("text", 7)
    np.testing.assert_array_equal(v["a"][1][0], np.arange(4))
    np.testing.assert_array_equal(v["b"]["c"], np.full((2, 2), 9.0))
    assert "shapes=[(3,), (4,), (2, 2)]" in repr(ref)
    ref.close()
    finish(p, conn)


def test_dlpack_producer_comes_back_as_numpy(ctx):
    p, conn = start(ctx, workers.serve, None, "dlpack")
    (ref,) = pickle.loads(conn.recv())
    got = rdt.get(ref)
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.int32).reshape(3, 4))
    ref.close()
    finish(p, conn)


def test_torch_round_trip():
    torch = pytest.importorskip("torch", reason="torch is not installed (CI uses the DLPack path instead)")
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
        ref = a.put([x])
        r2 = b.deserialize(ref.serialize(), ref._skeleton, ref._frameworks)
        (y,) = b.get(r2)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
        assert torch.equal(x, y)


def test_torch_across_processes_keeps_framework_and_dtypes(ctx):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    p, conn = start(ctx, workers.serve, None, "torch")
    (ref,) = pickle.loads(conn.recv())
    v = rdt.get(ref)
    assert isinstance(v["f32"], torch.Tensor) and isinstance(v["np"], np.ndarray)
    assert v["bf16"].dtype == torch.bfloat16 and v["i64"].shape == ()
    assert torch.equal(v["f32"], torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert torch.equal(v["bf16"], torch.arange(6, dtype=torch.bfloat16))
    assert int(v["i64"]) == 7
    out = [torch.empty(3, 4), torch.empty(6, dtype=torch.bfloat16), torch.empty((), dtype=torch.int64),
           np.empty(3, dtype=np.int64)]
    rdt.get(ref, out=out)
    assert torch.equal(out[0], v["f32"])
    ref.close()
    finish(p, conn)


def test_receive_into_buffers_and_wrong_out_shapes(ctx):
    p, conn = start(ctx, workers.serve, None, "big")
    (ref,) = pickle.loads(conn.recv())
    out = np.empty(4 << 20, dtype=np.float64)
    got = rdt.get(ref, out=out)
    assert got is out
    np.testing.assert_array_equal(out[:5], np.arange(5.0))
    assert out[-1] == (4 << 20) - 1
    with pytest.raises(rdt.InvalidArgumentError, match="shape"):
        rdt.get(ref, out=np.empty(10))
    with pytest.raises(rdt.InvalidArgumentError, match="dtype"):
        rdt.get(ref, out=np.empty(4 << 20, dtype=np.float32))
    ref.close()
    finish(p, conn)


def test_concurrent_get_of_a_list(ctx):
    procs = [start(ctx, workers.serve, t, "dtypes") for t in BUILTINS]
    refs = [r for _, conn in procs for r in pickle.loads(conn.recv())]
    got = rdt.get(refs)
    assert len(got) == len(refs)
    want = workers.dtype_arrays()
    for g in got:
        np.testing.assert_array_equal(g["tensor"], want[g["name"]])
    for r in refs:
        r.close()
    for p, conn in procs:
        finish(p, conn)


def test_timeout_raises_and_leaks_nothing():
    with rdt.Runtime("src", builtin_transports=False) as a, rdt.Runtime("dst", builtin_transports=False) as b:
        for rt in (a, b):
            rt.register_tensor_transport("stuck", ["cpu"], tt.Stuck)
        ref = a.put(np.arange(100.0), transport="stuck")
        r2 = b.deserialize(ref.serialize())
        t0 = time.monotonic()
        with pytest.raises(rdt.GetTimeoutError) as e:
            b.get(r2, timeout=0.3)
        assert isinstance(e.value, TimeoutError)
        assert time.monotonic() - t0 < 5
        assert b.stats()["fetches_active"] == 0
        r2.close()
        ref.close()


def test_wait_tensor_freed_until_a_borrower_releases(ctx):
    x = np.arange(1000.0)
    ref = rdt.put(x)
    p, conn = start(ctx, workers.hold, pickle.dumps(ref))
    assert conn.recv() == "holding"
    ref.close()
    with pytest.raises(rdt.GetTimeoutError):
        rdt.wait_tensor_freed(x, timeout=0.3)
    conn.send("release")
    assert conn.recv() == "released"
    rdt.wait_tensor_freed(x, timeout=10)
    p.join(30)


def test_wait_tensor_freed_when_the_borrower_is_killed(ctx):
    x = np.arange(1000.0)
    ref = rdt.put(x)
    p, conn = start(ctx, workers.hold, pickle.dumps(ref))
    assert conn.recv() == "holding"
    ref.close()
    p.kill()
    p.join()
    t0 = time.monotonic()
    rdt.wait_tensor_freed(x, timeout=30)
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("kind,name", [("PyShm", "pyshm"), ("PySocket", "pysocket")])
def test_python_transports_across_processes(ctx, kind, name):
    rdt.register_tensor_transport(name, ["cpu"], getattr(tt, kind)) if name not in \
        [t["name"] for t in rdt.default_runtime().transports()] else None
    p, conn = start(ctx, workers.serve, name, "dtypes", [(name, kind)])
    refs = pickle.loads(conn.recv())
    assert refs[0].transport == name
    want = workers.dtype_arrays()
    for g in rdt.get(refs):
        np.testing.assert_array_equal(g["tensor"], want[g["name"]])
    used = {t["name"]: t["transfers_completed"] for t in rdt.default_runtime().transports()}
    assert used[name] >= sum(1 for r in refs if r.nbytes > 0)  # empty objects move nothing
    for r in refs:
        r.close()
    finish(p, conn)


def test_a_raising_transport_surfaces_its_message():
    with rdt.Runtime("src", builtin_transports=False) as a, rdt.Runtime("dst", builtin_transports=False) as b:
        for rt in (a, b):
            rt.register_tensor_transport("failing", ["cpu"], tt.Failing)
        ref = a.put(np.arange(10.0), transport="failing")
        r2 = b.deserialize(ref.serialize())
        with pytest.raises(rdt.RdtError, match="the disk is on fire"):
            b.get(r2)


def test_bad_input_gets_clear_errors():
    with pytest.raises(rdt.InvalidArgumentError, match="contiguous"):
        rdt.put(np.arange(20.0).reshape(4, 5)[:, ::2])
    with pytest.raises(rdt.UnsupportedError, match="dtype"):
        rdt.put(np.array(["a", "b"]))
    with pytest.raises(rdt.UnsupportedError):
        rdt.put(np.array([object()]))
    with pytest.raises(rdt.NotFoundError):
        rdt.put(np.ones(3), transport="no-such-transport")
    with pytest.raises(rdt.InvalidArgumentError):
        rdt.get(["not a ref"])
    with pytest.raises(rdt.CorruptError):
        rdt.default_runtime().deserialize(b"RDTR garbage")
    ref = rdt.put(np.ones(3))
    ref.close()
    with pytest.raises(rdt.ClosedError):
        ref.serialize()


def test_refs_of_a_dead_owner(ctx):
    p, conn = start(ctx, workers.owner_then_exit)
    data = conn.recv()
    ref = pickle.loads(data)
    conn.send("exit")
    p.join(30)
    with pytest.raises(rdt.PeerUnavailableError):
        rdt.get(ref, timeout=30)
    with pytest.raises(rdt.PeerUnavailableError):
        pickle.loads(data)  # unpickling makes a borrow, which needs the owner


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
    assert msg.startswith("forked:") and "spawn" in msg


def test_put_keeps_objects_alive_only_until_freed():
    from rdt import runtime as R
    x = np.arange(1000.0)
    with rdt.Runtime("keep") as rt:
        for _ in range(300):  # the same buffer, put and released again and again
            rt.put(x).close()
        rt.wait_tensor_freed(x, timeout=10)
        R._sweep(force=True)
        assert len(R._keep) < 10
        ref = rt.put(np.arange(5.0))  # no other reference to this array: rdt keeps it
        import gc
        gc.collect()
        assert rt.get(rt.deserialize(ref.serialize(), ref._skeleton, ref._frameworks)).tolist() == [0, 1, 2, 3, 4]
