"""Transports written in Python against Ray's interface, across processes."""

import dataclasses
import inspect
import pickle
import time

import numpy as np
import pytest

import rdt
import transports_for_tests as tt
import workers

pytestmark = pytest.mark.timeout(120)


def ensure(name, cls):
    if name not in rdt.default_runtime().transport_names():
        rdt.register_tensor_transport(name, ["cpu"], cls)


def serve_small(child, name, kind):
    """A child that serves workers' "small" object over transports_for_tests'
    `kind`, registered here and there as `name`; and the refs it sent."""
    ensure(name, getattr(tt, kind))
    c = child(workers.serve, [name], "small", [(name, "transports_for_tests", kind)])
    return c, pickle.loads(c.recv()[name])


@pytest.mark.parametrize("name,kind", [("pyshm", "PyShm"), ("pysocket", "PySocket"), ("asyncshm", "AsyncShm")])
def test_python_transports_across_processes(child, name, kind):
    ensure(name, getattr(tt, kind))
    info = {t["name"]: t for t in rdt.default_runtime().transports()}[name]
    assert not info["builtin"] and info["one_sided"] == (kind != "PySocket")
    c = child(workers.serve, [name], "dtypes", [(name, "transports_for_tests", kind)])
    refs = pickle.loads(c.recv()[name])
    assert refs[0].transport == name
    want = workers.dtype_arrays()
    got = rdt.get(refs, timeout=60)
    for g in got:
        np.testing.assert_array_equal(g["tensor"], want[g["name"]])
    used = {t["name"]: t["transfers_completed"] for t in rdt.default_runtime().transports()}
    assert used[name] >= sum(1 for r in refs if r.nbytes > 0)  # empty objects move nothing
    if kind == "AsyncShm":
        # rdt drove fetch/wait (wait with -1: forever) and dropped each
        # request, whose __del__ cleaned up.
        log = tt.AsyncShm.log
        assert ("wait", -1) in log
        fetched = {x[1] for x in log if x[0] == "fetch"}
        assert fetched and fetched <= {x[1] for x in log if x[0] == "cleaned"}
    for r in refs:
        r.close()
    c.stop()


def test_a_raising_receive_surfaces_its_message(child):
    c, (ref,) = serve_small(child, "failing", "FailingRecv")
    with pytest.raises(rdt.RdtError, match="RuntimeError: the disk is on fire") as e:
        rdt.get(ref, timeout=30)
    assert "recv_multiple_tensors" in str(e.value)  # where it was raised
    assert str(e.value).count("transport failing:") == 1, str(e.value)  # named once, by the engine
    assert rdt.default_runtime().stats()["fetches_active"] == 0
    c.stop()


def test_a_raising_send_on_the_source_surfaces_at_the_destination(child):
    c, (ref,) = serve_small(child, "failsend", "FailingSend")
    with pytest.raises(rdt.RdtError, match="the cable was cut") as e:
        rdt.get(ref, timeout=30)
    assert str(e.value).count("transport failsend: the source failed to send") == 1, str(e.value)
    c.stop()


def test_a_transport_sees_the_put_tensors_and_the_get_buffers():
    tt.Recording.calls.clear()
    with rdt.Runtime("src", builtin_transports=False) as a, rdt.Runtime("dst", builtin_transports=False) as b:
        a.register_tensor_transport("rec", "cpu", tt.Recording)
        b.register_tensor_transport("rec", ["cpu"], tt.Recording)
        x, y = np.arange(4.0), np.ones((2, 2), np.int32)
        ref = a.put({"x": x, "y": y}, transport="rec")
        kind, oid, tensors = tt.Recording.calls[0]
        assert kind == "extract" and oid == ref.id and tensors[0] is x and tensors[1] is y
        got = b.get(b.borrow(ref))
        recv = [c for c in tt.Recording.calls if c[0] == "recv"][0]
        assert recv[2][0] is got["x"] and recv[2][1] is got["y"]  # the very arrays get returns
        comm = [c for c in tt.Recording.calls if c[0] == "communicator"][0]
        assert isinstance(comm[1], rdt.Peer) and comm[3] == "rec"
        np.testing.assert_array_equal(got["y"], y)
        out = [np.empty(4), np.empty((2, 2), np.int32)]
        b.get(b.borrow(ref), out=out)
        recv = [c for c in tt.Recording.calls if c[0] == "recv"][-1]
        assert recv[2][0] is out[0]
        ref.close()
    gcs = [c for c in tt.Recording.calls if c[0] == "gc"]
    assert len(gcs) == 1 and gcs[0][1] == oid and gcs[0][2][0]() is x


def test_data_type_converts_what_the_transport_sees():
    torch = pytest.importorskip("torch", reason="torch is not installed (set RDT_TEST_TORCH=1 for make)")
    tt.Recording.calls.clear()
    with rdt.Runtime("src", builtin_transports=False) as a, rdt.Runtime("dst", builtin_transports=False) as b:
        for rt in (a, b):
            rt.register_tensor_transport("rect", ["cpu"], tt.Recording, data_type=torch.Tensor)
        x = np.arange(6, dtype=np.float32)
        ref = a.put(x, transport="rect")
        got = b.get(b.borrow(ref))
        assert type(got) is np.ndarray  # the caller still gets the producer's framework
        np.testing.assert_array_equal(got, x)
        kinds = {c[0]: c for c in tt.Recording.calls}
        assert isinstance(kinds["extract"][2][0], torch.Tensor)
        assert isinstance(kinds["recv"][2][0], torch.Tensor)
        assert kinds["extract"][2][0].data_ptr() == x.__array_interface__["data"][0]  # no copy


def test_a_transport_may_return_new_tensors():
    with rdt.Runtime("src", builtin_transports=False) as a, rdt.Runtime("dst", builtin_transports=False) as b:
        for rt in (a, b):
            rt.register_tensor_transport("copies", ["cpu"], tt.ReturnsCopies)
        ref = a.put([np.arange(3), np.arange(4.0)], transport="copies")
        got = b.get(b.borrow(ref))
        assert got[0].tolist() == [0, 1, 2] and got[1].tolist() == [0, 1, 2, 3]


def test_abort_on_timeout_reaches_the_transport():
    with rdt.Runtime("src", builtin_transports=False) as a, rdt.Runtime("dst", builtin_transports=False) as b:
        for rt in (a, b):
            rt.register_tensor_transport("stuck2", ["cpu"], tt.Stuck)
        ref = a.put(np.arange(100.0), transport="stuck2")
        r2 = b.borrow(ref)
        t0 = time.monotonic()
        with pytest.raises(rdt.GetTimeoutError):
            b.get(r2, timeout=0.2)
        assert time.monotonic() - t0 < 3
        end = time.monotonic() + 10
        while b.stats()["fetches_active"] and time.monotonic() < end:
            time.sleep(0.02)  # our own buffers are let go in the background
        assert b.stats()["fetches_active"] == 0


def test_registration_errors():
    with rdt.Runtime("reg", builtin_transports=False) as rt:
        rt.register_tensor_transport("once", ["cpu"], tt.PyShm)
        with pytest.raises(rdt.AlreadyExistsError):
            rt.register_tensor_transport("ONCE", ["cpu"], tt.PyShm)  # names are case-insensitive
        with pytest.raises(TypeError, match="lacks"):
            rt.register_tensor_transport("bad", ["cpu"], object)
        with pytest.raises(rdt.InvalidArgumentError, match="device"):
            rt.register_tensor_transport("nodev", ["abacus"], tt.PyShm)
        with pytest.raises(rdt.InvalidArgumentError):
            rt.register_tensor_transport("has space", ["cpu"], tt.PyShm)
        with pytest.raises(rdt.NotFoundError):
            rt.put(np.ones(1), transport="never-registered")
    rdt.register_tensor_transport("process-wide", ["cpu"], tt.PyShm)
    with pytest.raises(ValueError):  # as Ray: registering a name twice is a ValueError
        rdt.register_tensor_transport("process-wide", ["cpu"], tt.PyShm)
    with rdt.Runtime("later") as rt:
        assert "process-wide" in rt.transport_names(builtin=False)  # later runtimes get it too


# ---- a class written for Ray -----------------------------------------------------

def test_rdt_interface_matches_rays():
    ray_ttm = pytest.importorskip("ray.experimental.rdt.tensor_transport_manager",
                                  reason="ray is not installed (tests/python/requirements.txt pins it)")
    ours, theirs = rdt.TensorTransportManager, ray_ttm.TensorTransportManager
    methods = [m for m in vars(theirs) if not m.startswith("_")]
    assert set(methods) <= set(vars(ours)), set(methods) - set(vars(ours))
    for m in methods:
        a, b = inspect.signature(getattr(ours, m)), inspect.signature(getattr(theirs, m))
        assert [(p.name, p.kind, p.default) for p in a.parameters.values()] == \
               [(p.name, p.kind, p.default) for p in b.parameters.values()], m
        assert (m in ours.__abstractmethods__) == (m in theirs.__abstractmethods__), m
        assert isinstance(inspect.getattr_static(ours, m), staticmethod) == \
               isinstance(inspect.getattr_static(theirs, m), staticmethod), m
    for name in ("TensorTransportMetadata", "CommunicatorMetadata", "FetchRequest"):
        f1 = [(f.name, f.default) for f in dataclasses.fields(getattr(rdt, name))]
        f2 = [(f.name, f.default) for f in dataclasses.fields(getattr(ray_ttm, name))]
        assert f1 == f2, name


def test_a_transport_written_for_ray_runs_unchanged(child):
    pytest.importorskip("ray", reason="ray is not installed (tests/python/requirements.txt pins it)")
    import ray_written_transport as rw
    ensure("file", rw.FileTransport)
    c = child(workers.serve, ["file"], "dtypes", [("file", "ray_written_transport", "FileTransport")])
    refs = pickle.loads(c.recv()["file"])
    want = workers.dtype_arrays()
    for g in rdt.get(refs, timeout=60):
        np.testing.assert_array_equal(g["tensor"], want[g["name"]])
    for r in refs:
        r.close()
    c.stop()
