"""Partial fetches: slices of a ref's tensors (ref[i], ref["key"],
ref[i][a:b], .bytes) fetched from another process, into new tensors and
into out= buffers, over every host transport that serves ranges."""

import asyncio

import numpy as np
import pytest

import partial_workers as pw
import rdt
import transports_for_tests as tt

pytestmark = pytest.mark.timeout(120)

try:
    import torch
except ImportError:
    torch = None


def _ranges_transports():
    """The built-in host transports whose transports() entry says they
    serve ranges: the partial fetch tests run over each."""
    with rdt.Runtime("probe") as rt:
        return [t["name"] for t in rt.transports() if t["builtin"] and "cpu" in t["devices"] and t["ranges"]]


RANGES = _ranges_transports()
over_ranges = pytest.mark.parametrize("transport", RANGES or [pytest.param(None, marks=pytest.mark.skip(
    reason="no built-in host transport serves ranges here"))])


def received(transport=None):
    """Bytes received by this process's default runtime: in all, and over
    `transport`."""
    rt = rdt.default_runtime()
    per = {t["name"]: t["bytes_received"] for t in rt.transports()}
    return rt.stats()["bytes_received"], per.get(transport, 0)


def completed():
    return rdt.default_runtime().stats()["transfers_completed"]


def test_transports_say_whether_they_serve_ranges():
    with rdt.Runtime("flags") as rt:
        rt.register_tensor_transport("pyshm", ["cpu"], tt.PyShm)
        listed = {t["name"]: t for t in rt.transports()}
    assert all(isinstance(t["ranges"], bool) for t in listed.values())
    assert listed["pyshm"]["ranges"] is False  # Python transports move whole objects
    assert set(RANGES) == {n for n, t in listed.items() if t["ranges"] and t["builtin"] and "cpu" in t["devices"]}
    if "cma" in listed:
        assert listed["cma"]["ranges"]


def test_a_slice_describes_what_it_takes(served_values):
    ref = served_values["state"]
    want = pw.state()
    w = ref["w"]
    assert isinstance(w, rdt.Range) and w.ref is ref and w.index == 1
    assert (w.shape, w.dtype, w.offset, w.nbytes) == ((33, 7), "float64", 0, want["w"].nbytes)
    rows = w[4:9]
    assert (rows.shape, rows.offset, rows.nbytes) == ((5, 7), 4 * 56, 5 * 56)
    assert ref[1].offset == w.offset and ref[-1].index == 5  # put order: emb, w, b, scalar, empty, cube
    assert (ref["cube"][2].shape, ref["cube"][2].offset, ref["cube"][2].nbytes) == ((4, 3), 48, 24)
    assert (w[-3:].offset, w[-3:].shape) == (30 * 56, (3, 7))
    assert (w[:].nbytes, w[5:2].nbytes, w[5:2].offset, w[5:2].shape) == (want["w"].nbytes, 0, 5 * 56, (0, 7))
    assert (ref["emb"].bytes(64, 32).shape, ref["emb"].bytes(4000).shape) == ((8,), (24,))
    assert "tensor 1 of ObjectRef" in repr(rows) and "bytes [224, 504)" in repr(rows)


@over_ranges
def test_rows_arrive_and_only_their_bytes_move(served_values, transport):
    ref = served_values["state"]
    want = pw.state()
    cases = [("emb", slice(0, 1)), ("emb", slice(31, 33)), ("emb", slice(-1, None)), ("w", slice(None, 5)),
             ("w", slice(10, 33)), ("w", slice(-20, -10)), ("cube", slice(2, 5)), ("b", slice(3, 9))]
    for key, rows in cases:
        total0, over0 = received(transport)
        got = rdt.get(ref[key][rows], transport=transport)
        expect = want[key][rows]
        assert type(got) is np.ndarray and got.dtype == expect.dtype and got.shape == expect.shape, (key, rows)
        np.testing.assert_array_equal(got, expect)
        total1, over1 = received(transport)
        # Exactly the slice's bytes, not the tensor's, over this transport.
        assert (total1 - total0, over1 - over0) == (expect.nbytes, expect.nbytes), (key, rows)


@over_ranges
def test_one_row_one_element_and_whole_tensors(served_values, transport):
    ref = served_values["state"]
    want = pw.state()
    got = rdt.get([ref["b"][7], ref["emb"][63], ref["w"], ref["scalar"], ref[-1]], transport=transport)
    assert got[0].shape == () and got[0] == want["b"][7]
    np.testing.assert_array_equal(got[1], want["emb"][63])
    np.testing.assert_array_equal(got[2], want["w"])
    assert got[3].shape == () and got[3] == np.float32(2.5)
    np.testing.assert_array_equal(got[4], want["cube"])


@over_ranges
def test_empty_ranges_move_nothing(served_values, transport):
    ref = served_values["state"]
    before = received(transport)
    got = rdt.get([ref["emb"][5:5], ref["w"][20:3], ref["emb"][64:], ref["empty"], ref["empty"][0:0]],
                  transport=transport)
    assert [g.shape for g in got] == [(0, 16), (0, 7), (0, 16), (0, 5), (0, 5)]
    assert received(transport) == before


@over_ranges
def test_a_subset_in_another_order_into_buffers_of_any_shape(served_values, transport):
    ref = served_values["state"]
    want = pw.state()
    a = np.full(70, -1.0)                      # rows 10..19 of w, flat
    b = np.full((2, 5), -1, np.int32)          # all of b, reshaped
    c = np.full((1, 16), -1, np.float32)       # row 0 of emb
    t0 = completed()
    out = [a, b, c]
    got = rdt.get([ref["w"][10:20], ref["b"], ref["emb"][0:1]], out=out, transport=transport)
    assert got[0] is a and got[1] is b and got[2] is c
    np.testing.assert_array_equal(a, want["w"][10:20].ravel())
    np.testing.assert_array_equal(b.ravel(), want["b"])
    np.testing.assert_array_equal(c, want["emb"][0:1])
    assert completed() - t0 == 1  # three slices of one ref: one transfer


@over_ranges
def test_rows_into_views_of_one_buffer(served_values, transport):
    # The resharding pattern: many ranges of several refs straight into
    # adjacent parts of one preallocated array.
    ref = served_values["state"]
    want = pw.state()
    buf = np.zeros((64 + 33, 16), np.float32)
    slices = [ref["emb"][r:r + 1] for r in range(63, -1, -1)]          # rows reversed
    out = [buf[i] for i in range(64)]
    rdt.get(slices, out=out, transport=transport)
    np.testing.assert_array_equal(buf[:64], want["emb"][::-1])
    w = np.zeros((33, 7))
    rdt.get([ref["w"][i:i + 3] for i in range(0, 33, 3)], out=[w[i:i + 3] for i in range(0, 33, 3)],
            transport=transport)
    np.testing.assert_array_equal(w, want["w"])


@over_ranges
def test_refs_and_slices_mixed(served_values, transport):
    ref, small = served_values["state"], served_values["small"]
    want = pw.state()
    got = rdt.get([small, ref["emb"][3:5], ref], transport=transport)
    assert isinstance(got[0], list) and got[0][0].tolist() == [0, 1, 2]
    np.testing.assert_array_equal(got[1], want["emb"][3:5])
    assert got[2]["step"] == 7 and set(got[2]) == set(want)
    for k in ("emb", "w", "b", "cube"):
        np.testing.assert_array_equal(got[2][k], want[k])
    # With out=: a ref takes one buffer per tensor, in put order.
    s = np.zeros(3, np.int8)
    rows = np.zeros((2, 16), np.float32)
    got = rdt.get([small, ref["emb"][3:5]], out=[s, rows], transport=transport)
    assert got[0][0] is s and got[1] is rows
    np.testing.assert_array_equal(rows, want["emb"][3:5])
    assert s.tolist() == [0, 1, 2]


def test_keys_and_paths(served_values):
    ref = served_values["nested"]
    got = rdt.get([ref["layers", 2, "w"][1:3], ref["head"][-1], ref[0]])
    np.testing.assert_array_equal(got[0], np.full((2, 3), 2.0, np.float32))
    assert got[1].tolist() == [10, 11]
    np.testing.assert_array_equal(got[2], np.zeros((4, 3), np.float32))
    assert ref["layers", -1, "w"].index == 2 and ref["head"].index == 3
    for key, message in [("nope", "has no key 'nope'"), ("layers", "is a list, not one tensor"),
                         (("layers", 3), "it holds 3 items"), (("head", 0), "is a tensor"),
                         (5, "the object has 4 tensors"), (-5, "the object has 4 tensors")]:
        with pytest.raises(rdt.InvalidArgumentError, match=message):
            ref[key]
    with pytest.raises(rdt.InvalidArgumentError, match="ref is a list, which takes no key 'x'"):
        served_values["small"]["x"]
    with pytest.raises(TypeError):
        iter(ref)  # indexable, not a sequence


def _sentinel_outs():
    return np.full((3, 16), 7.0, np.float32), np.full(8, 7.0, np.float32)


def test_refusals_raise_and_leave_out_untouched(served_values):
    ref = served_values["state"]
    emb = ref["emb"]
    a, b = _sentinel_outs()
    refused = [
        ([emb[62:65]], [a], "outside the tensor's 4096 bytes"),          # past the last row
        ([emb[64]], [a[0]], "outside the tensor's 4096 bytes"),           # the row after the last
        ([emb[70:]], [a[0:0]], "past the tensor's 4096 bytes"),           # empty, but past the end
        ([emb[0:3]], [a.astype(np.float64)], "dtype float64 is not the source's float32"),
        ([emb[0:3]], [b], "holds 32 bytes for a range of 192"),           # wrong size
        ([emb[0:1], emb[1:2]], [a[0], a.ravel()[8:24]], "targets overlap"),
        ([emb.bytes(2, 8)], [b[:2]], "do not fall on the 4-byte elements"),
        ([ref["b"][0:2], emb[0:1]], [a[0][:2].view(np.int32), a[0]], "targets overlap"),
    ]
    for slices, out, message in refused:
        keep = [o.copy() for o in out]
        with pytest.raises(rdt.InvalidArgumentError, match=message):
            rdt.get(slices, out=out)
        for o, k in zip(out, keep):
            np.testing.assert_array_equal(o, k)
    np.testing.assert_array_equal(a, np.full((3, 16), 7.0, np.float32))
    for make, message in [(lambda: emb[0:8:2], "the step must be 1"), (lambda: emb[::-1], "the step must be 1"),
                          (lambda: emb[-65:], "before the first of its 64 rows"),
                          (lambda: emb[1:3][0:1], "already cut from its tensor"), (lambda: ref["scalar"][0], "no rows"),
                          (lambda: emb["x"], "with an int or a slice"), (lambda: emb.bytes(-4), "negative")]:
        with pytest.raises(rdt.InvalidArgumentError, match=message):
            make()
    with pytest.raises(rdt.InvalidArgumentError, match="out= holds 1 tensors, the refs and ranges take 2"):
        rdt.get([emb[0:1], emb[1:2]], out=[a[0]])
    with pytest.raises(rdt.InvalidArgumentError, match=r"out\[1\].*read-only"):
        ro = np.zeros(16, np.float32)
        ro.flags.writeable = False
        rdt.get([emb[0:1], emb[1:2]], out=[a[0], ro])


def test_a_transport_that_does_not_serve_ranges_refuses_ranges_only():
    with rdt.Runtime("src") as a, rdt.Runtime("dst") as b:
        for rt in (a, b):
            rt.register_tensor_transport("pyshm", ["cpu"], tt.PyShm)
        value = pw.state()
        ref = b.borrow(a.put(value, transport="pyshm"))
        out = np.full((2, 16), -1.0, np.float32)
        with pytest.raises(rdt.UnsupportedError, match="pyshm cannot serve a partial fetch"):
            b.get(ref["emb"][0:2], out=out)
        assert (out == -1).all()
        # Every tensor whole and in put order is an ordinary fetch of the ref.
        got = b.get([ref[i] for i in range(6)])
        for g, k in zip(got, ("emb", "w", "b", "scalar", "empty", "cube")):
            np.testing.assert_array_equal(g, value[k])
        pyshm = {t["name"]: t for t in b.transports()}["pyshm"]
        assert pyshm["transfers_completed"] == 1 and not pyshm["ranges"]
        ref.close()


def test_slices_of_an_object_this_runtime_owns_are_copies():
    with rdt.Runtime("owner") as rt:
        value = pw.state()
        ref = rt.put(value)
        local0 = rt.stats()["local_copies"]
        got = rt.get([ref["w"][3:6], ref["emb"][10]])
        np.testing.assert_array_equal(got[0], value["w"][3:6])
        np.testing.assert_array_equal(got[1], value["emb"][10])
        assert not np.shares_memory(got[0], value["w"])  # a slice is copied, unlike a whole own ref
        out = np.zeros((3, 7))
        assert rt.get(ref["w"][3:6], out=out) is out
        np.testing.assert_array_equal(out, value["w"][3:6])
        assert rt.stats()["local_copies"] - local0 == 2
        whole, part = rt.get([ref, ref["b"][2:4]])
        assert whole["w"] is value["w"]  # the ref itself still gives back the put tensors
        assert part.tolist() == value["b"][2:4].tolist()
        with pytest.raises(rdt.InvalidArgumentError, match="outside the tensor"):
            rt.get(ref["b"][9:11])
        ref.close()


def test_fetch_and_get_async_take_slices(served_values):
    ref = served_values["state"]
    want = pw.state()
    f = rdt.get_start([ref["emb"][7:9], ref["b"][1]])
    rows, one = f.result(timeout=30)
    np.testing.assert_array_equal(rows, want["emb"][7:9])
    assert one == want["b"][1]
    out = np.zeros(7)
    got = asyncio.run(rdt.get_async(ref["w"][32], out=out, timeout=30))
    assert got is out
    np.testing.assert_array_equal(out, want["w"][32])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_sources_give_torch_tensors_and_fill_either_kind_of_out(served_values):
    ref = served_values["torch"]
    want = pw.torch_state()
    got = rdt.get([ref["w"][5:9], ref["h"][3:7]])
    assert all(isinstance(g, torch.Tensor) for g in got)
    assert got[0].shape == (4, 8) and torch.equal(got[0], want["w"][5:9])
    assert got[1].dtype == torch.bfloat16 and torch.equal(got[1], want["h"][3:7])
    t = torch.zeros(16, dtype=torch.float32)
    n = np.zeros((2, 8), np.float32)
    got = rdt.get([ref["w"][0:2], ref["w"][-2:]], out=[t, n])
    assert got[0] is t and torch.equal(t, want["w"][0:2].reshape(-1))
    np.testing.assert_array_equal(n, want["w"][-2:].numpy())
    with pytest.raises(rdt.InvalidArgumentError, match="dtype float64 is not the source's float32"):
        rdt.get(ref["w"][0:2], out=torch.zeros(16, dtype=torch.float64))
    # numpy state into torch buffers too.
    e = torch.full((2, 16), -1.0)
    rdt.get(served_values["state"]["emb"][1:3], out=e)
    assert torch.equal(e, torch.from_numpy(pw.state()["emb"][1:3]))
