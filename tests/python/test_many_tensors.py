"""Objects of many tensors from Python: the lean paths that describe and
pack them (lists of numpy arrays or torch tensors) give what the general
ones give, fall back to them for anything unusual, and carry the bytes."""

import numpy as np
import pytest

import rdt
from rdt import _tensors as _t


def _general(objs, writable=False):
    return [_t.item_of(x, writable, i) for i, x in enumerate(objs)]


def test_items_of_matches_item_of_for_mixed_arrays():
    base = np.arange(4096, dtype=np.float32)
    ro = np.arange(10, dtype=np.int16)
    ro.flags.writeable = False
    objs = [base[:100], base[100:164].reshape(8, 8), np.zeros(0, np.float64), ro,
            np.arange(6, dtype=np.uint8).reshape(2, 3), base[200:300], np.float64(1.0) * np.ones(3)]
    assert _t.items_of(objs) == _general(objs)


def test_items_of_refuses_what_item_of_refuses():
    strided = np.arange(100, dtype=np.float32)[::2]
    with pytest.raises(rdt.InvalidArgumentError, match="not C-contiguous"):
        _t.items_of([np.ones(4), strided])
    ro = np.ones(4)
    ro.flags.writeable = False
    with pytest.raises(rdt.InvalidArgumentError, match="read-only"):
        _t.items_of([np.ones(4), ro], writable=True, what=lambda i: (i,))
    with pytest.raises(rdt.UnsupportedError):
        _t.items_of([np.ones(2), np.array(["a"])])


@pytest.mark.parametrize("shapes", [
    [(16,)] * 100,                                   # views of one shape: one fill
    [(i % 7 + 1, 3) for i in range(100)],            # one ndim, shapes that differ
    [(4,)] * 50 + [(2, 2)] * 50,                     # mixed ndim: struct by struct
])
def test_columns_pack_as_struct_packing_does(shapes):
    objs = [np.full(s, i, dtype=np.float32) for i, s in enumerate(shapes)]
    items = _t.items_of(objs)
    buf, addr = _t.pack(items)
    n = len(items)
    tensors = (_t._lib.Tensor * n).from_address(addr)
    for it, c in zip(items, tensors):
        assert c.data == it.data
        assert (c.device.device_type, c.ndim, c.dtype.code, c.dtype.bits, c.dtype.lanes) == \
            (_t._lib.DEVICE_CPU, len(it.desc.shape), it.desc.code, it.desc.bits, 1)
        assert tuple(c.shape[d] for d in range(c.ndim)) == it.desc.shape
        assert not c.strides and c.byte_offset == 0
    del buf


def test_ten_thousand_views_round_trip_between_runtimes():
    n, part = 10000, 24
    src = np.arange(n * part, dtype=np.float64)
    views = list(src.reshape(n, part))
    out = np.zeros_like(src)
    with rdt.Runtime("many-a") as a, rdt.Runtime("many-b") as b:
        with a.put(views) as ref, b.borrow(ref) as borrowed:
            assert len(borrowed.shapes) == n and "10000 tensors" in repr(borrowed)
            got = b.get(borrowed, out=list(out.reshape(n, part)))
            assert len(got) == n
            np.testing.assert_array_equal(out, src)
            # A slice of the last view alone.
            last = b.get(borrowed[n - 1][2:5])
            np.testing.assert_array_equal(last, src[-part + 2:-part + 5])


def test_torch_lists_take_the_lean_path_and_round_trip():
    torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
    base = torch.arange(3000, dtype=torch.float32)
    objs = list(base.reshape(300, 10)) + [torch.zeros(0), torch.arange(4, dtype=torch.int64)]
    lean = _t.torch_items_of(objs)
    assert [(it.data, it.desc) for it in lean] == [(it.data, it.desc) for it in _general(objs)]
    with rdt.Runtime("torch-a") as a, rdt.Runtime("torch-b") as b:
        with a.put(objs) as ref, b.borrow(ref) as borrowed:
            got = b.get(borrowed)
            assert all(torch.equal(g, o) for g, o in zip(got, objs))


def test_device_argument_makes_new_tensors_there():
    src = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    with rdt.Runtime("dev-a") as a, rdt.Runtime("dev-b") as b:
        with a.put(src) as ref, b.borrow(ref) as borrowed:
            got = b.get(borrowed, device="cpu")
            np.testing.assert_array_equal(got["w"], src["w"])
            own = a.get(ref, device="cpu")  # our own object: a copy, not the put array
            assert own["w"] is not src["w"]
            np.testing.assert_array_equal(own["w"], src["w"])
            with pytest.raises(rdt.InvalidArgumentError, match="out= or device="):
                b.get(borrowed, out=[np.empty((3, 4), np.float32)], device="cpu")
            with pytest.raises(rdt.InvalidArgumentError, match="'cpu', 'cuda' or 'cuda:N'"):
                b.get(borrowed, device="rocm")
            with pytest.raises(rdt.InvalidArgumentError, match="'cpu', 'cuda' or 'cuda:N'"):
                b.get(borrowed, device="cuda:x")
