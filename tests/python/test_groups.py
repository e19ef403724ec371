"""Collective groups without GPUs: argument errors, and UnsupportedError
naming NCCL where it is not installed. Forming real NCCL groups needs GPUs:
see test_gpu_nccl.py."""

import pytest

import rdt


def _has_nccl(rt):
    return "nccl" in rt.transport_names()


def test_argument_errors():
    with rdt.Runtime("g") as rt:
        for kwargs, text in [
            (dict(world_size=0, rank=0), "world size 0"),
            (dict(world_size=2, rank=2, rank0_address=rt.address), "rank 2 is outside 0..1"),
            (dict(world_size=2, rank=-1, rank0_address=rt.address), "rank -1"),
            (dict(world_size=2, rank=1), "address of rank 0"),
            (dict(world_size=1, rank=0, name="bad name"), "group name"),
            (dict(world_size=1, rank=0, device=-1), "device -1"),
        ]:
            with pytest.raises(rdt.InvalidArgumentError, match=text):
                rt.create_collective_group(**kwargs)
        with pytest.raises(rdt.InvalidArgumentError, match="cuda:N"):
            rt.create_collective_group(1, 0, device="gpu0")
        with pytest.raises(rdt.InvalidArgumentError, match="positive"):
            rt.create_collective_group(1, 0, timeout=0)
        with pytest.raises(rdt.UnsupportedError, match="does not form groups"):
            rt.create_collective_group(1, 0, backend="tcp")
        with pytest.raises(rdt.NotFoundError, match='no group "default"'):
            rt.destroy_collective_group()
        with pytest.raises(rdt.NotFoundError):
            rt.destroy_collective_group("other")


def test_unsupported_without_nccl():
    with rdt.Runtime("g") as rt:
        if _has_nccl(rt):
            pytest.skip("NCCL and a CUDA device are available here")
        with pytest.raises(rdt.UnsupportedError, match="libnccl.so.2") as e:
            rt.create_collective_group(1, 0)
        assert "RDT_NCCL_LIBRARY" in str(e.value)
        with pytest.raises(rdt.UnsupportedError, match="nccl"):
            rt.create_collective_group(2, 1, rt.address, name="pair", device="cuda:0")


def test_module_level_functions():
    assert rdt.create_collective_group is not None and rdt.destroy_collective_group is not None
    with pytest.raises(rdt.NotFoundError):
        rdt.destroy_collective_group("never-created")


def test_group_of_one_with_nccl():
    """Where NCCL and a CUDA device are (or the test doubles of both, under
    `make fake-nccl-test`): a group of one forms and is destroyed, and a rank
    that never joins makes rank 0 time out."""
    with rdt.Runtime("g") as rt:
        if not _has_nccl(rt):
            pytest.skip("no NCCL or no CUDA device here")
        rt.create_collective_group(1, 0, name="solo", device="cuda:0", timeout=60)
        with pytest.raises(rdt.AlreadyExistsError):
            rt.create_collective_group(1, 0, name="solo")
        rt.destroy_collective_group("solo")
        with pytest.raises(rdt.NotFoundError):
            rt.destroy_collective_group("solo")
        with pytest.raises(rdt.GetTimeoutError, match=r"ranks \[1\] of 2"):
            rt.create_collective_group(2, 0, name="pair", timeout=0.3)
        with pytest.raises(rdt.NotFoundError):
            rt.destroy_collective_group("pair")
