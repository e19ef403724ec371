"""The one-call paths of get, put, pickling and close: one ref into one
out= array (transport named or not, any thread), many out= arrays packed at
once, refs made and released through scratch blocks. Each gives what the
general path gives, refuses what it refuses, and falls back to it for
anything unusual."""

import pickle
import threading

import numpy as np
import pytest

import rdt
from rdt import _lib
from rdt import _tensors as _t


@pytest.fixture
def pair():
    with rdt.Runtime("calls-a") as a, rdt.Runtime("calls-b") as b:
        yield a, b


def test_one_ref_into_out_with_a_transport_named(pair):
    a, b = pair
    src = np.arange(1024, dtype=np.int32).reshape(32, 32)
    with a.put(src) as ref, b.borrow(ref) as borrowed:
        for tr in [None] + [t for t in ("cma", "shm", "tcp") if t in b.transport_names()]:
            out = np.zeros_like(src)
            assert b.get(borrowed, out=out, transport=tr) is out
            np.testing.assert_array_equal(out, src)
        with pytest.raises(rdt.RdtError):
            b.get(borrowed, out=np.zeros_like(src), transport="no-such-transport")


def test_one_ref_into_out_from_other_threads(pair):
    a, b = pair
    src = np.arange(3 << 18, dtype=np.float64)  # past the main thread's one-call limit
    errors = []
    with a.put(src) as ref, b.borrow(ref) as borrowed:
        def work():
            try:
                for _ in range(20):
                    out = np.empty_like(src)
                    b.get(borrowed, out=out, timeout=30)
                    np.testing.assert_array_equal(out, src)
            except Exception as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = np.empty_like(src)
        b.get(borrowed, out=out)  # the main thread: the general path for a large array
        np.testing.assert_array_equal(out, src)
    assert not errors, errors


def test_one_ref_into_a_mismatched_out_says_what_is_wrong(pair):
    a, b = pair
    with a.put(np.arange(16, dtype=np.float32)) as ref, b.borrow(ref) as borrowed:
        with pytest.raises(rdt.InvalidArgumentError, match="shape"):
            b.get(borrowed, out=np.zeros(15, np.float32))
        with pytest.raises(rdt.InvalidArgumentError, match="dtype"):
            b.get(borrowed, out=np.zeros(16, np.int32))
        ro = np.zeros(16, np.float32)
        ro.flags.writeable = False
        with pytest.raises(rdt.InvalidArgumentError, match="read-only"):
            b.get(borrowed, out=ro)
        with pytest.raises(rdt.InvalidArgumentError, match="not C-contiguous"):
            b.get(borrowed, out=np.zeros(32, np.float32)[::2])


def test_many_out_arrays_pack_as_check_out_does():
    base = np.zeros(64 * 8, dtype=np.float32)
    outs = list(base.reshape(64, 8))
    descs = [_t.Desc((8,), _t.FLOAT, 32, 1, _lib.DEVICE_CPU, 0)] * 64
    block, addr, datas = _t.pack_out(outs, descs)
    want, _ = _t.pack(_t.check_out(outs, descs))
    assert bytes(block[:_t.TENSOR_SIZE * 64]) != b"" and datas == [it.data for it in _t.check_out(outs, descs)]
    rec = block[:_t.TENSOR_SIZE * 64].view(_t._TENSOR_RECORD)
    wrec = np.frombuffer(want, dtype=np.uint8)[:_t.TENSOR_SIZE * 64].view(_t._TENSOR_RECORD)
    for field in ("data", "device_type", "device_id", "ndim", "code", "bits", "lanes"):
        np.testing.assert_array_equal(rec[field], wrec[field])
    shapes = block[_t.TENSOR_SIZE * 64:].view(np.int64)
    assert list(shapes) == [8] * 64
    # Anything unusual is left to check_out.
    assert _t.pack_out(outs[:-1] + [np.zeros(8, np.float64)], descs) is None
    assert _t.pack_out(outs[:-1] + [np.zeros(9, np.float32)], descs) is None
    assert _t.pack_out(outs[:-1] + [np.zeros(16, np.float32)[::2]], descs) is None
    assert _t.pack_out(outs[:-1] + [[0.0] * 8], descs) is None
    assert _t.pack_out(outs[:1], descs[:1]) is None
    # Equal descriptions that are distinct objects pack alike.
    fresh = [_t.Desc((8,), _t.FLOAT, 32, 1, _lib.DEVICE_CPU, 0) for _ in range(64)]
    again = _t.pack_out(outs, fresh)[0]
    for field in ("data", "device_type", "device_id", "ndim", "code", "bits", "lanes"):
        np.testing.assert_array_equal(again[:_t.TENSOR_SIZE * 64].view(_t._TENSOR_RECORD)[field], rec[field])
    assert bytes(again[_t.TENSOR_SIZE * 64:]) == bytes(block[_t.TENSOR_SIZE * 64:])
    # Descriptions that differ in shape: compared one by one.
    mixed = [_t.Desc((8 if i % 2 else 4,), _t.FLOAT, 32, 1, _lib.DEVICE_CPU, 0) for i in range(64)]
    targets = [np.zeros(d.shape, np.float32) for d in mixed]
    packed, _, _ = _t.pack_out(targets, mixed)
    assert list(packed[_t.TENSOR_SIZE * 64:].view(np.int64)) == [8 if i % 2 else 4 for i in range(64)]
    assert _t.pack_out(targets[::-1], mixed) is None  # every target the other shape
    assert _t.pack_out(targets[:-1] + [np.zeros((2, 4), np.float32)], mixed) is None  # another rank


def test_many_out_arrays_round_trip_and_refuse_as_before(pair):
    a, b = pair
    src = np.arange(256 * 16, dtype=np.int64)
    with a.put(list(src.reshape(256, 16))) as ref, b.borrow(ref) as borrowed:
        out = np.zeros_like(src)
        views = list(out.reshape(256, 16))
        got = b.get(borrowed, out=views)
        assert len(got) == 256 and got[3] is views[3]
        np.testing.assert_array_equal(out, src)
        bad = views[:-1] + [np.zeros(16, np.int32)]
        with pytest.raises(rdt.InvalidArgumentError, match=r"out\[255\] has dtype int32"):
            b.get(borrowed, out=bad)
        with pytest.raises(rdt.InvalidArgumentError, match="holds 255 tensors"):
            b.get(borrowed, out=views[:-1])
        # A prepared get and a fetch take the same packed targets.
        out[:] = 0
        with b.prepare_get(borrowed, out=views) as pg:
            pg.run()
            np.testing.assert_array_equal(out, src)
        out[:] = 0
        b.get_start(borrowed, out=views).result(timeout=30)
        np.testing.assert_array_equal(out, src)


def test_pickled_refs_and_close_from_many_threads():
    src = np.arange(100, dtype=np.uint8)
    ref = rdt.put(src)
    blob = pickle.dumps(ref)
    again = pickle.loads(blob)
    assert again.id == ref.id and again.shapes == [(100,)]
    out = np.zeros_like(src)
    rdt.get(again, out=out)
    np.testing.assert_array_equal(out, src)
    refs = [ref.clone() for _ in range(8)] + [again]
    barrier = threading.Barrier(4)

    def close_all():
        barrier.wait()
        for r in refs:
            r.close()
    threads = [threading.Thread(target=close_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.closed for r in refs)
    with pytest.raises(rdt.ClosedError):
        refs[0].serialize()
    ref.close()


def test_scratch_blocks_are_never_shared():
    taken = [_lib.scratch() for _ in range(3)]
    assert len({id(s) for s in taken}) == 3
    for s in taken:
        _lib.give_back(s)
    again = _lib.scratch()
    assert any(again is s for s in taken)
    _lib.give_back(again)
