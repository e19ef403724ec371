"""Where get puts the new tensors it makes for CUDA sources: on the
receiver's own GPU (its collective group's device, else its current
device), never on the source's ordinal, which numbers the GPUs of the
source process. These tests need no GPU: the choice is a pure function
(rdt._get.landing), and the gets below stop at the allocation, where the
device chosen is recorded. test_gpu.py checks the same on real GPUs.
"""

import asyncio

import numpy as np
import pytest

import rdt
from rdt import _get, _lib
from rdt import _tensors as _t

CUDA = _lib.DEVICE_CUDA
CPU = _lib.DEVICE_CPU


class FakeCudaArray:
    """__cuda_array_interface__ over an address nothing reads, on GPU
    ``device_id`` as the process that puts it numbers its GPUs."""

    def __init__(self, shape, device_id=0, ptr=0x7f0000001000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False),
                                         "strides": None, "version": 3}
        self.device = type("Device", (), {"id": device_id})()


def desc(device_type=CUDA, device_id=3, shape=(4, 8)):
    return _t.Desc(shape, 2, 32, 1, device_type, device_id)  # float32


def never(framework):
    raise AssertionError(f"the current device was asked ({framework})")


# ---- the rule -------------------------------------------------------------------

def test_a_cuda_source_lands_on_the_receivers_current_device():
    asked = []

    def current(framework):
        asked.append(framework)
        return 1

    got = _get.landing(desc(device_id=3), "torch", current)
    assert (got.device_type, got.device_id) == (CUDA, 1)
    assert asked == ["torch"]
    assert (got.shape, got.code, got.bits, got.lanes) == ((4, 8), 2, 32, 1)  # only the device changes
    # The framework that makes the tensor is the one asked.
    assert _get.landing(desc(device_id=0), "cupy", lambda fw: 5 if fw == "cupy" else 9).device_id == 5


def test_the_groups_device_wins_over_the_current_device():
    got = _get.landing(desc(device_id=3), "torch", never, group=2)
    assert (got.device_type, got.device_id) == (CUDA, 2)
    # Group device 0 is a device, not "no group".
    assert _get.landing(desc(device_id=3), "torch", never, group=0).device_id == 0


def test_host_sources_stay_where_they_are():
    for kind in (CPU, _lib.DEVICE_CUDA_HOST):
        d = desc(device_type=kind, device_id=0)
        assert _get.landing(d, "numpy", never) == d
        assert _get.landing(d, "torch", never, group=2) == d


def test_device_argument_wins():
    got = _get.landing(desc(device_id=3), "torch", never, group=2, dev=(CUDA, 6))
    assert (got.device_type, got.device_id) == (CUDA, 6)
    got = _get.landing(desc(device_id=3), "torch", never, group=2, dev=(CPU, 0))
    assert (got.device_type, got.device_id) == (CPU, 0)
    got = _get.landing(desc(device_type=CPU, device_id=0), "numpy", never, dev=(CUDA, 1))
    assert (got.device_type, got.device_id) == (CUDA, 1)


def test_current_device_without_a_cuda_framework_is_device_0(monkeypatch):
    # Neither torch with CUDA nor CuPy with a device here: device 0.
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("torch sees a CUDA device here: its current device is asked instead")
    except ImportError:
        pass
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here: its current device is asked instead")
    except ImportError:
        pass
    for fw in ("torch", "cupy", "cuda", "numpy"):
        assert _t.current_cuda_device(fw) == 0


# ---- the groups a runtime records -------------------------------------------------

def test_a_runtime_records_its_groups_devices(monkeypatch):
    with rdt.Runtime("g") as rt:
        assert rt._group_device(None) is None and rt._group_device("nccl") is None
        # Forming a group needs NCCL and a GPU: the C call is stood in for.
        monkeypatch.setattr(_lib.lib(), "rdt_group_create", lambda *args: _lib.OK)
        rt.create_collective_group(2, 1, "unix:nowhere", name="trainers", device="cuda:2")
        assert rt._group_device("nccl") == 2 and rt._group_device("NCCL") == 2
        assert rt._group_device(None) == 2  # the automatic choice may take nccl
        assert rt._group_device("cuda_ipc") is None  # another transport receives anywhere
        rt.create_collective_group(2, 1, "unix:nowhere", name="second", device=2)
        assert rt._group_device("nccl") == 2
        rt.create_collective_group(2, 1, "unix:nowhere", name="elsewhere", device=4)
        assert rt._group_device("nccl") is None  # two devices: the current device decides
        monkeypatch.undo()
        # The library has no such groups: destroying one says so, and the
        # runtime forgets it all the same.
        with pytest.raises(rdt.NotFoundError):
            rt.destroy_collective_group("elsewhere")
        assert rt._group_device("nccl") == 2
        monkeypatch.setattr(_lib.lib(), "rdt_group_destroy", lambda *args: _lib.OK)
        rt.destroy_collective_group("trainers")
        rt.destroy_collective_group("second")
        assert rt._group_device("nccl") is None and rt._groups == {}


def test_a_group_that_cannot_form_is_not_recorded():
    with rdt.Runtime("g") as rt:
        if "nccl" in rt.transport_names():
            pytest.skip("NCCL and a GPU are here: a group of one rank would form")
        with pytest.raises(rdt.RdtError):
            rt.create_collective_group(1, 0, device=0, timeout=10)
        assert rt._groups == {}


# ---- the gets that use it -----------------------------------------------------------

class Allocated(Exception):
    """Stops a get at its first allocation."""


@pytest.fixture
def spy(monkeypatch):
    """Records the descriptor and framework of every tensor get allocates
    (then stops the get), with the current device ``spy.current``."""

    class Spy:
        current = 1
        made = []
        stop = True

        @staticmethod
        def allocate(d, framework, cache=None):
            Spy.made.append((d.device_type, d.device_id, d.shape, framework))
            if Spy.stop:
                raise Allocated()
            return np.empty(d.shape, dtype=np.float32)

    monkeypatch.setattr(_t, "allocate", Spy.allocate)
    monkeypatch.setattr(_t, "current_cuda_device", lambda framework: Spy.current)
    return Spy


@pytest.fixture
def pair():
    with rdt.Runtime("src") as a, rdt.Runtime("dst") as b:
        yield a, b


def _get_every_way(b, ref, **kw):
    """Gets ref, its tensor 0 and rows 1:3 of that with get, get_start,
    get_async, prepare_get and rdt.get, each stopped at its allocation."""
    ways = [lambda r: b.get(r, **kw), lambda r: b.get_start(r, **kw),
            lambda r: asyncio.run(b.get_async(r, **kw)), lambda r: b.prepare_get(r, **kw),
            lambda r: rdt.get(r, **kw)]
    for way in ways:
        for what in (ref, ref[0], ref[0][1:3]):
            with pytest.raises(Allocated):
                way(what)


def test_every_get_lands_on_the_current_device(spy, pair):
    a, b = pair
    ref = b.borrow(a.put(FakeCudaArray((4, 8), device_id=3)))
    spy.current = 1
    _get_every_way(b, ref)
    assert len(spy.made) == 15
    assert {(t, i) for t, i, _, _ in spy.made} == {(CUDA, 1)}
    assert {s for _, _, s, _ in spy.made} == {(4, 8), (2, 8)}
    assert {fw for _, _, _, fw in spy.made} == {"cuda"}


def test_every_get_lands_on_the_groups_device(spy, pair, monkeypatch):
    a, b = pair
    ref = b.borrow(a.put(FakeCudaArray((4, 8), device_id=3)))
    with monkeypatch.context() as m:
        m.setattr(_lib.lib(), "rdt_group_create", lambda *args: _lib.OK)
        b.create_collective_group(2, 1, "unix:nowhere", device=2)
    _get_every_way(b, ref)
    assert {(t, i) for t, i, _, _ in spy.made} == {(CUDA, 2)}
    # A get over a transport that is not the group's: the current device.
    spy.made.clear()
    _get_every_way(b, ref, transport="cuda_ipc")
    assert {(t, i) for t, i, _, _ in spy.made} == {(CUDA, 1)}
    # A ref put for nccl, or for another transport, with none named at the
    # get (putting for nccl needs NCCL: the ref's transport is stood in for).
    for put_with, want in (("nccl", 2), ("cuda_ipc", 1)):
        with monkeypatch.context() as m:
            m.setattr(rdt.ObjectRef, "transport", property(lambda self: put_with))
            spy.made.clear()
            _get_every_way(b, ref)
            assert {(t, i) for t, i, _, _ in spy.made} == {(CUDA, want)}, put_with
            # transport= at the get overrides the ref's.
            spy.made.clear()
            _get_every_way(b, ref, transport="nccl")
            assert {(t, i) for t, i, _, _ in spy.made} == {(CUDA, 2)}, put_with
    b._groups.clear()  # the library holds no such group to destroy


def test_device_argument_and_host_tensors_are_unchanged(spy, pair):
    a, b = pair
    ref = b.borrow(a.put(FakeCudaArray((4, 8), device_id=3)))
    _get_every_way(b, ref, device="cuda:5")
    assert {(t, i) for t, i, _, _ in spy.made} == {(CUDA, 5)}
    spy.made.clear()
    _get_every_way(b, ref, device="cpu")
    assert {(t, i) for t, i, _, _ in spy.made} == {(CPU, 0)}
    # Host tensors beside a CUDA one: each where its kind lands.
    spy.made.clear()
    spy.stop = False
    mixed = b.borrow(a.put([np.zeros((4, 8), dtype=np.float32), FakeCudaArray((4, 8), device_id=3)]))
    _get.plan(b, mixed, None)
    assert [(t, i) for t, i, _, _ in spy.made] == [(CPU, 0), (CUDA, 1)]


def test_out_wins(spy, pair, monkeypatch):
    a, b = pair
    ref = b.borrow(a.put(FakeCudaArray((4, 8), device_id=3)))
    monkeypatch.setattr(_t, "current_cuda_device", never)
    out = [FakeCudaArray((4, 8), device_id=7, ptr=0x7f0000100000)]
    for what in (ref, ref[0], ref[0][1:3]):
        p = _get.plan(b, what, out if what is ref else out[0])
        assert p.objs == out and not spy.made
