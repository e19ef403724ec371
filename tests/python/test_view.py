"""get(copy=False): views of another process's objects instead of copies.
Every reader on a host maps the owner's one staged copy: numpy arrays are
read-only, torch tensors copy-on-write; a view holds a borrow until its
arrays are collected, outlives its owner and costs a reader no copy."""

import asyncio
import gc
import pickle
import struct

import numpy as np
import pytest

import partial_workers as pw
import rdt
import view_workers as vw
from conftest import Child

pytestmark = pytest.mark.timeout(120)

try:
    import torch
except ImportError:
    torch = None


def test_views_are_the_values_and_read_only(served_values):
    rt = rdt.default_runtime()
    before = rt.stats()
    got = rdt.get(served_values["state"], copy=False)
    want = pw.state()
    assert got["step"] == 7
    for k, w in want.items():
        if isinstance(w, np.ndarray):
            assert got[k].dtype == w.dtype and got[k].shape == w.shape
            np.testing.assert_array_equal(got[k], w)
            assert not got[k].flags.writeable
    with pytest.raises(ValueError):
        got["emb"][0, 0] = 1
    with pytest.raises(ValueError):
        got["emb"].flags.writeable = True  # the buffer itself is read-only
    after = rt.stats()
    assert after["views_open"] == before["views_open"] + 1
    assert after["transfers_completed"] == before["transfers_completed"], "a view fetches nothing"
    del got
    gc.collect()
    assert rt.stats()["views_open"] == before["views_open"], "collected, the view is released"


def test_slices_and_lists_of_views(served_values):
    emb, head, small = rdt.get([served_values["state"]["emb"][8:16], served_values["nested"]["head"], served_values["small"]], copy=False)
    np.testing.assert_array_equal(emb, pw.state()["emb"][8:16])
    np.testing.assert_array_equal(head, pw.nested()["head"])
    np.testing.assert_array_equal(small[0], np.arange(3, dtype=np.int8))
    assert not emb.flags.writeable


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_views_are_copy_on_write(served_values):
    a = rdt.get(served_values["torch"], copy=False)
    b = rdt.get(served_values["torch"], copy=False)
    want = pw.torch_state()
    assert torch.equal(a["w"], want["w"]) and torch.equal(a["h"], want["h"])
    a["w"][0, 0] = -1  # lands in a page of this view alone
    assert a["w"][0, 0].item() == -1
    assert torch.equal(b["w"], want["w"]), "the other view still reads the put's bytes"
    c = rdt.get(served_values["torch"], copy=False)
    assert torch.equal(c["w"], want["w"]), "as does a later one"


def test_async_and_copy_none(served_values):
    got = asyncio.run(rdt.get_async(served_values["nested"], copy=False))
    np.testing.assert_array_equal(got["head"], pw.nested()["head"])
    assert not got["head"].flags.writeable
    viewed = rdt.get(served_values["nested"], copy=None)  # on this host: a view
    assert not viewed["head"].flags.writeable
    out = np.zeros((6, 2), np.int64)
    rdt.get(served_values["nested"]["head"], out=out, copy=None)  # out= is a copy
    np.testing.assert_array_equal(out, pw.nested()["head"])


def test_bad_arguments(served_values):
    with pytest.raises(rdt.InvalidArgumentError, match="out="):
        rdt.get(served_values["small"], out=[np.zeros(3, np.int8)], copy=False)
    with pytest.raises(rdt.InvalidArgumentError, match="copy must be"):
        rdt.get(served_values["small"], copy="no")
    with pytest.raises(rdt.UnsupportedError, match="cannot map"):
        rdt.get(served_values["small"], copy=False, transport="tcp")
    mine = np.arange(5.0)
    with rdt.put(mine) as ref:
        assert rdt.get(ref, copy=False) is mine, "our own object: the put array, as get gives it"


def test_a_view_holds_a_borrow_and_outlives_its_owner(child):
    a = np.arange(1 << 20, dtype=np.float32)
    ref = rdt.put(a)
    reader = child(vw.view_and_hold, pickle.dumps(ref))
    assert reader.recv() == ("viewing", float(a.sum()))
    ref.close()
    with pytest.raises(TimeoutError):
        rdt.wait_tensor_freed(a, timeout=0.3)  # the reader's view holds it
    reader.send("drop")
    assert reader.recv() == 0
    rdt.wait_tensor_freed(a, timeout=30)
    reader.send("stop")
    reader.stop()

    # The owner killed: the view reads the put's bytes; a new view fails.
    owner = Child(pw.serve, False)
    try:
        ref = pickle.loads(owner.recv()["state"])
        got = rdt.get(ref, copy=False)
    finally:
        owner.kill()
    np.testing.assert_array_equal(got["emb"], pw.state()["emb"])
    with pytest.raises(rdt.PeerUnavailableError):
        rdt.get(ref, copy=False, timeout=30)
    np.testing.assert_array_equal(got["w"], pw.state()["w"])
    ref.close()


@pytest.mark.parametrize("copy", [True, False])
def test_a_view_costs_a_reader_no_copy(child, copy):
    """Each of three readers reads all 64 MiB: copying, each grows by the
    object; viewing, by nothing near it."""
    a = np.arange(16 << 20, dtype=np.uint32)
    with rdt.put(a) as ref:
        readers = [child(vw.read_and_measure, pickle.dumps(ref), copy) for _ in range(3)]
        for r in readers:
            total, grew_kib = r.recv()
            assert total == int(a.sum(dtype=np.uint64))
            if copy:
                assert grew_kib >= 60 << 10, "a copy adds the object to the reader (the measure works)"
            else:
                assert grew_kib < 8 << 10, f"a view added {grew_kib} KiB to the reader"
        for r in readers:
            r.send("stop")
            r.stop()


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum a serialized ref ends with."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _rewrite_dim(blob: bytes, old: int, new: int) -> bytes:
    """The ref's bytes with one dimension (found by its value) changed and
    the checksum recomputed: what anyone holding a ref can do."""
    body = blob[:-4]
    at = body.index(struct.pack("<q", old))
    body = body[:at] + struct.pack("<q", new) + body[at + 8:]
    return body + struct.pack("<I", _crc32c(body))


@pytest.mark.parametrize("new", [4097, 64 << 20])
def test_a_rewritten_ref_is_refused_not_read_past_its_mapping(child, new):
    """A ref whose shape was enlarged (by a byte, or to 64 MiB) is refused
    by a view as by a copy: the reader gets CorruptError, never another
    mapping's bytes or a crash."""
    a = np.arange(4099, dtype=np.uint8)
    with rdt.put(a, transport="shm") as ref:
        blob = ref.serialize()
        assert rdt.default_runtime().deserialize(blob).tensor_descs()[0].shape == (4099,)
        reader = child(vw.view_rewritten, _rewrite_dim(blob, 4099, new))
        (view_kind, view_msg), (copy_kind, _) = reader.recv()
        assert view_kind == "CorruptError" and "refusing the ref" in view_msg, view_msg
        assert copy_kind in ("InvalidArgumentError", "CorruptError")
        reader.send("stop")
        reader.stop()
        # The ref as it was made is viewed by the same reader code.
        reader = child(vw.view_rewritten, blob)
        assert reader.recv() == [None, None]
        reader.send("stop")
        reader.stop()
