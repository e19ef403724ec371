"""put and get between real processes (multiprocessing, spawn)."""

import pickle
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import rdt
import workers
from conftest import BUILTINS, Child, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dtype_server():
    """One child that put every dtype once per built-in transport, and once
    with the automatic choice (key None)."""
    c = Child(workers.serve, [None] + BUILTINS, "dtypes")
    yield c, c.recv()
    c.stop()


def check_dtypes(got):
    want = workers.dtype_arrays()
    assert [g["name"] for g in got] == list(want)
    for g in got:
        w = want[g["name"]]
        assert type(g["tensor"]) is np.ndarray
        assert g["tensor"].dtype == w.dtype and g["tensor"].shape == w.shape, g["name"]
        np.testing.assert_array_equal(g["tensor"], w)


def test_every_dtype_over_each_builtin_transport(dtype_server, builtin):
    _, blobs = dtype_server
    refs = pickle.loads(blobs[builtin])
    assert all(r.transport == builtin for r in refs)
    assert [r.dtypes[0] for r in refs][:len(workers.DTYPES)] == workers.DTYPES
    before = {t["name"]: t["transfers_completed"] for t in rdt.default_runtime().transports()}
    check_dtypes(rdt.get(refs))
    after = {t["name"]: t["transfers_completed"] for t in rdt.default_runtime().transports()}
    assert after[builtin] > before[builtin]  # it really went over this transport
    for r in refs:
        r.close()


def test_every_dtype_with_the_automatic_choice(dtype_server):
    _, blobs = dtype_server
    refs = pickle.loads(blobs[None])
    assert refs[0].transport is None and "transport=auto" in repr(refs[0])
    check_dtypes([rdt.get(r) for r in refs])  # one at a time this time


def test_transport_override_at_get(dtype_server, builtin):
    _, blobs = dtype_server
    refs = pickle.loads(blobs[None])
    check_dtypes(rdt.get(refs, transport=builtin.upper()))  # names are case-insensitive


def test_nested_structures_round_trip(child):
    c = child(workers.serve, [None], "nested")
    (ref,) = pickle.loads(c.recv()[None])
    v = rdt.get(ref)
    want = workers.nested_value()
    assert v.keys() == want.keys() and v["d"] is None
    np.testing.assert_array_equal(v["a"][0], np.ones(3))
    assert isinstance(v["a"][1], tuple) and v["a"][1][1:] == ("text", 7)
    np.testing.assert_array_equal(v["a"][1][0], np.arange(4))
    np.testing.assert_array_equal(v["b"]["c"], np.full((2, 2), 9.0))
    assert type(v["p"]) is workers.Point and v["p"].x == np.int8(1)  # numpy scalars are values, not tensors
    np.testing.assert_array_equal(v["p"].y, np.arange(2, dtype=np.uint16))
    assert type(v["o"]).__name__ == "OrderedDict" and list(v["o"]) == ["z", "y"] and v["o"]["y"] == b"bytes"
    assert type(v["scalar"]) is np.float64
    assert repr(ref).endswith("shapes=[(3,), (4,), (2, 2), (2,), (1,)])")
    v2 = rdt.get(ref)
    assert v2 is not v and v2["b"]["c"] is not v["b"]["c"]  # every get fetches anew: nothing is cached
    ref.close()
    c.stop()


def test_dlpack_and_array_interface_producers_come_back_as_numpy(child):
    c = child(workers.serve, [None], "dlpack")
    a, b = pickle.loads(c.recv()[None])
    got = rdt.get(a)
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.int32).reshape(3, 4))
    np.testing.assert_array_equal(rdt.get(b), np.arange(6, dtype=np.float32))
    c.stop()


def test_get_of_a_list_starts_every_fetch_before_waiting(child):
    # Each receive waits for the other three: a get that fetched one ref
    # after another would break the barrier and fail.
    import transports_for_tests as tt
    rdt.register_tensor_transport("barrier", ["cpu"], tt.Barrier)
    c = child(workers.serve, ["barrier"], "four", [("barrier", "transports_for_tests", "Barrier")])
    refs = pickle.loads(c.recv()["barrier"])
    assert len(refs) == tt.Barrier.PARTIES
    got = rdt.get(refs, timeout=30)
    assert [float(g[0]) for g in got] == [0.0, 1.0, 2.0, 3.0]
    c.stop()


def test_concurrent_get_of_a_list_over_several_transports(dtype_server):
    _, blobs = dtype_server
    refs = [r for t in [None] + BUILTINS for r in pickle.loads(blobs[t])]
    got = rdt.get(refs)
    assert len(got) == len(refs)
    n = len(workers.dtype_arrays())
    for i in range(0, len(got), n):
        check_dtypes(got[i:i + n])


def test_gets_from_several_threads(dtype_server):
    _, blobs = dtype_server
    refs = pickle.loads(blobs[None])
    errors = []

    def run():
        try:
            for _ in range(5):
                check_dtypes(rdt.get(refs))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_receive_into_buffers(child):
    c = child(workers.serve, [None], "big")
    (ref,) = pickle.loads(c.recv()[None])
    out = np.empty(4 << 20, dtype=np.float64)
    assert rdt.get(ref, out=out) is out
    assert out[0] == 0 and out[12345] == 12345 and out[-1] == (4 << 20) - 1
    out2 = [np.empty(4 << 20, dtype=np.float64)]
    assert rdt.get([ref], out=out2)[0] is out2[0]
    np.testing.assert_array_equal(out2[0], out)
    ref.close()
    c.stop()


def test_receive_into_nested_buffers(child):
    c = child(workers.serve, [None], "nested")
    (ref,) = pickle.loads(c.recv()[None])
    out = [np.empty(3), np.empty(4, dtype=np.int64), np.empty((2, 2)), np.empty(2, np.uint16), np.empty(1)]
    v = rdt.get(ref, out={"anything": out})  # any structure: its tensors are taken in order
    assert v["a"][0] is out[0] and v["b"]["c"] is out[2]
    np.testing.assert_array_equal(out[2], np.full((2, 2), 9.0))
    c.stop()


def test_wrong_out_buffers_are_clear_errors(child):
    c = child(workers.serve, [None], "big")
    (ref,) = pickle.loads(c.recv()[None])
    with pytest.raises(rdt.InvalidArgumentError, match=r"out\[0\] has shape \(10,\), the source tensor has "
                                                       r"shape \(4194304,\)"):
        rdt.get(ref, out=np.empty(10))
    with pytest.raises(rdt.InvalidArgumentError, match="dtype float32, the source tensor has dtype float64"):
        rdt.get(ref, out=np.empty(4 << 20, dtype=np.float32))
    with pytest.raises(rdt.InvalidArgumentError, match="holds 2 tensors, the refs hold 1"):
        rdt.get(ref, out=[np.empty(4 << 20), np.empty(1)])
    ro = np.empty(4 << 20)
    ro.flags.writeable = False
    with pytest.raises(rdt.InvalidArgumentError, match="read-only"):
        rdt.get(ref, out=ro)
    with pytest.raises(rdt.InvalidArgumentError, match="contiguous"):
        rdt.get(ref, out=np.empty(8 << 20)[::2])
    c.stop()


def test_own_objects_come_back_as_the_same_tensors():
    # As in Ray: getting a ref in the process that put it gives the tensor
    # itself, not a copy; out= still copies.
    x = np.arange(5.0)
    ref = rdt.put({"x": x, "n": 1})
    v = rdt.get(ref)
    assert v["x"] is x and v["n"] == 1
    out = np.empty(5)
    assert rdt.get(ref, out=out)["x"] is out
    np.testing.assert_array_equal(out, x)
    again = pickle.loads(pickle.dumps(ref))  # out and back
    assert again.is_owner and rdt.get(again)["x"] is x


# A script that pickles its own ref and gets it back: nobody else reads it.
ONE_PROCESS = """
import pickle, warnings, numpy as np, rdt
warnings.simplefilter("error")
x = np.arange(4.0)
ref = rdt.put({"x": x})
assert rdt.get(pickle.loads(pickle.dumps(ref)))["x"] is x
assert rdt.get(rdt.default_runtime().deserialize(ref.serialize())) is x  # bytes carry no dict
print("no warning")
"""

# Another process gets the object, from the serialized bytes on stdin.
READER = """
import sys, rdt
print(rdt.Runtime("reader").deserialize(sys.stdin.buffer.read()).nbytes)
"""


def test_the_mutability_warning_needs_a_ref_that_went_to_another_process():
    # As Ray: an own object whose ref came back warns that the tensors
    # given back are the put ones only if the ref also went elsewhere.
    out = subprocess.run([sys.executable, "-c", ONE_PROCESS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "no warning" in out.stdout, out.stderr
    with rdt.Runtime("own") as rt:
        x = np.arange(5.0)
        ref = rt.put([x])
        reader = subprocess.run([sys.executable, "-c", READER], input=ref.serialize(), capture_output=True,
                                timeout=60)
        assert reader.returncode == 0 and reader.stdout.strip() == b"40", reader.stderr
        back = rt.deserialize(ref.serialize())
        with pytest.warns(UserWarning, match="not copies.*also sent elsewhere"):
            assert rt.get(back) is x  # from bytes: the one tensor, no list
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per runtime
            assert rt.get(ref)[0] is x
        back.close()
        ref.release(revoke_leases=True)


def test_two_runtimes_in_one_process():
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        x = np.arange(6, dtype=np.int16).reshape(2, 3)
        ref = a.put([x, "label"])
        borrowed = b.borrow(ref)
        assert not borrowed.is_owner and ref.is_owner and borrowed.id == ref.id
        y, label = b.get(borrowed)
        assert y is not x and label == "label"
        np.testing.assert_array_equal(x, y)
        with pytest.raises(rdt.InvalidArgumentError, match="another runtime"):
            a.get(borrowed)
        assert b.stats()["borrowed_objects"] == 1
        assert wait_until(lambda: a.stats()["borrows"] == 1)  # the owner counts it when the borrow arrives


def test_torch_in_one_process():
    torch = pytest.importorskip("torch", reason="torch is not installed (set RDT_TEST_TORCH=1 for make)")
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
        ref = a.put([x])
        (y,) = b.get(b.borrow(ref))
        assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
        assert torch.equal(x, y)
        with pytest.raises(rdt.InvalidArgumentError, match="contiguous"):
            a.put(torch.arange(12.0).reshape(3, 4).t())


def test_torch_across_processes_keeps_framework_and_dtypes(child):
    torch = pytest.importorskip("torch", reason="torch is not installed (set RDT_TEST_TORCH=1 for make)")
    c = child(workers.serve, [None], "torch")
    (ref,) = pickle.loads(c.recv()[None])
    v = rdt.get(ref)
    assert isinstance(v["f32"], torch.Tensor) and type(v["np"]) is np.ndarray
    assert v["bf16"].dtype == torch.bfloat16 and v["i64"].shape == ()
    assert torch.equal(v["f32"], torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert torch.equal(v["bf16"], torch.arange(6, dtype=torch.bfloat16))
    assert int(v["i64"]) == 7
    out = [torch.empty(3, 4), torch.empty(6, dtype=torch.bfloat16), torch.empty((), dtype=torch.int64),
           np.empty(3, dtype=np.int64)]
    rdt.get(ref, out=out)
    assert torch.equal(out[0], v["f32"]) and torch.equal(out[1], v["bf16"])
    ref.close()
    c.stop()
