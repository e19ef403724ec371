"""The names the binding renamed (docs/abi.md, "Vocabulary") still work,
each with a DeprecationWarning naming its replacement: rdt.fetch and
Runtime.fetch (now get_start), rdt.TensorSlice (now rdt.Range). And the
two pending kinds are siblings: a Write is not a Fetch."""

import numpy as np
import pytest

import rdt
from rdt import _pending

pytestmark = pytest.mark.timeout(120)


def test_fetch_is_get_start_with_a_warning():
    with rdt.Runtime("owner") as a, rdt.Runtime("reader") as b:
        x = np.arange(64, dtype=np.float32)
        ref = a.put(x)
        theirs = b.deserialize(ref.serialize())
        with pytest.warns(DeprecationWarning, match="Runtime.fetch is deprecated: use Runtime.get_start"):
            f = b.fetch(theirs)
        assert isinstance(f, rdt.Fetch)
        assert np.array_equal(f.result(timeout=30), x)
        with pytest.warns(DeprecationWarning, match="rdt.fetch is deprecated: use rdt.get_start"):
            g = rdt.fetch(theirs[0][8:16])
        assert np.array_equal(g.result(timeout=30), x[8:16])


def test_tensor_slice_is_range_with_a_warning():
    with pytest.warns(DeprecationWarning, match="rdt.TensorSlice is deprecated: use rdt.Range"):
        old = rdt.TensorSlice
    assert old is rdt.Range
    assert "TensorSlice" not in rdt.__all__ and "Range" in rdt.__all__
    with pytest.raises(AttributeError):
        rdt.NoSuchName  # noqa: B018
    with rdt.Runtime("ranges") as rt:
        ref = rt.put(np.zeros((4, 4), np.float32))
        assert isinstance(ref[0][1:3], old)
        assert repr(ref[0][1:3]).startswith("rdt.Range(tensor 0 of ")


def test_fetch_and_write_are_siblings_over_one_pending_base():
    assert issubclass(rdt.Fetch, _pending.Pending) and issubclass(rdt.Write, _pending.Pending)
    assert not issubclass(rdt.Write, rdt.Fetch) and not issubclass(rdt.Fetch, rdt.Write)
    with rdt.Runtime("owner") as a, rdt.Runtime("writer") as b:
        buf = np.zeros(16, np.int32)
        slot = a.expose(buf)
        w = b.deserialize(slot.serialize())
        with b.write_start(w, np.arange(16, dtype=np.int32), tag=3) as pending:
            assert isinstance(pending, rdt.Write) and repr(pending).startswith("<rdt.Write into 1 ref")
            assert pending.result(timeout=30) is None
        assert slot.wait_notice(timeout=30).tag == 3
        assert np.array_equal(buf, np.arange(16))
