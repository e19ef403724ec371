"""get without out= receives large host tensors into the process's cache of
huge-page buffers (rdt._receive), and hands a buffer out again only once
nothing refers to it."""

import gc

import numpy as np
import pytest

import rdt

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


@pytest.fixture
def cache():
    """The process's cache, empty and bounded for the test (Ray's tests may
    have bounded it otherwise in this process), emptied afterwards."""
    c = rdt._process.PROCESS.receive_cache()
    old = c.limit
    gc.collect()  # buffers earlier tests dropped come back now, and go
    c.set_limit(0)
    c.set_limit(256 * MIB)
    yield c
    c.set_limit(0)
    c.set_limit(old)


def test_get_reuses_a_dropped_buffer_and_never_one_in_use(cache):
    with rdt.Runtime("src") as a, rdt.Runtime("dst") as b:
        x = np.arange(MIB, dtype=np.float64)  # 8 MiB
        ref = a.put(x)
        borrowed = b.borrow(ref)
        got = b.get(borrowed)
        at = got.ctypes.data
        assert np.array_equal(got, x) and got.flags.writeable
        assert cache.cached_bytes() == 0
        del got
        gc.collect()
        assert cache.cached_bytes() == 8 * MIB, "the dropped buffer did not come back to the cache"
        again = b.get(borrowed)
        assert again.ctypes.data == at and cache.cached_bytes() == 0, "the dropped buffer was not reused"
        assert np.array_equal(again, x)
        view = again[1:]  # holds the memory
        again[:] = -1  # the caller's to write
        del again
        third = b.get(borrowed)
        assert third.ctypes.data != at, "a buffer a view still refers to was handed out"
        assert np.array_equal(third, x) and view[0] == -1
        small_ref = a.put(np.arange(10.0))
        with b.borrow(small_ref) as small_borrowed:
            assert b.get(small_borrowed).base is None  # below 4 MiB: a plain array
        small_ref.release()
        borrowed.close()
        ref.release()


def test_get_of_torch_tensors_uses_the_cache(cache):
    torch = pytest.importorskip("torch")
    with rdt.Runtime("src") as a, rdt.Runtime("dst") as b:
        t = torch.arange(2 * MIB, dtype=torch.float32)  # 8 MiB
        ref = a.put(t)
        borrowed = b.borrow(ref)
        got = b.get(borrowed)
        at = got.data_ptr()
        assert isinstance(got, torch.Tensor) and torch.equal(got, t)
        del got
        gc.collect()
        again = b.get(borrowed)
        assert again.data_ptr() == at and torch.equal(again, t)
        borrowed.close()
        ref.release()


def test_out_and_own_objects_bypass_the_cache(cache):
    with rdt.Runtime("src") as a, rdt.Runtime("dst") as b:
        x = np.arange(MIB, dtype=np.float64)
        ref = a.put(x)
        assert a.get(ref) is x  # the owner gets its put tensor
        borrowed = b.borrow(ref)
        before = cache.cached_bytes()
        out = np.empty_like(x)
        assert b.get(borrowed, out=out) is out
        assert cache.cached_bytes() == before
        borrowed.close()
        ref.release()


def _limit_in_child(value):
    import os
    import subprocess
    import sys
    env = dict(os.environ, RDT_RECEIVE_CACHE_MIB=value)
    code = ("import rdt\n"
            "try:\n"
            "    print(rdt._process.PROCESS.receive_cache().limit)\n"
            "except rdt.InvalidArgumentError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_environment_bounds_the_cache():
    assert _limit_in_child("") == str(1 << 30), "unset: 1 GiB"
    assert _limit_in_child("0") == "0", "0 keeps nothing"
    assert _limit_in_child("64") == str(64 * MIB)
    for bad in ("-1", "lots", str((1 << 20) + 1)):
        out = _limit_in_child(bad)
        assert out.startswith("refused:") and f"RDT_RECEIVE_CACHE_MIB={bad!r}" in out, out
