"""The nccl transport with GPUs (marked `gpu`; `make gpu-test` runs them).
They skip with a reason naming what is missing: torch, a CUDA device, or
NCCL (libnccl.so.2, or RDT_NCCL_LIBRARY; the torch wheels ship one in
nvidia/nccl/lib). The two-rank test needs two GPUs."""

import pickle

import pytest

import gpu_env
import rdt


def _no(why):
    gpu_env.missing(f"no NCCL/CUDA: {why}")


def _torch_nccl():
    torch = gpu_env.cuda_torch("no NCCL/CUDA", "torch sees no CUDA device")
    with rdt.Runtime("probe") as rt:
        if "nccl" not in rt.transport_names():
            try:
                rt.create_collective_group(1, 0, name="probe")
            except rdt.UnsupportedError as e:
                _no(str(e))
    return torch


@pytest.mark.gpu
def test_one_rank_group_forms_and_is_destroyed():
    _torch_nccl()
    with rdt.Runtime("solo") as rt:
        rt.create_collective_group(1, 0, name="solo", device=0, timeout=120)
        with pytest.raises(rdt.AlreadyExistsError):
            rt.create_collective_group(1, 0, name="solo", device=0)
        rt.destroy_collective_group("solo")
        with pytest.raises(rdt.NotFoundError):
            rt.destroy_collective_group("solo")
        rt.create_collective_group(1, 0, name="solo", device="cuda:0", timeout=120)


@pytest.mark.gpu
def test_two_rank_transfer(child):
    torch = _torch_nccl()
    if torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL needs two GPUs for one group (this machine has {torch.cuda.device_count()})")
    import workers
    with rdt.Runtime("rank0") as rt:
        c = child(workers.nccl_rank1, rt.address)
        rt.create_collective_group(2, 0, name="pair", device=0, timeout=120)
        assert c.recv(120) == "joined"
        x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
        ref = rt.put([x], transport="nccl")
        c.send(pickle.dumps(ref))
        status, total = c.recv(120)
        assert status == "ok", total
        assert total == float(x.double().sum().item())
        # A runtime outside the group cannot fetch over nccl, and is told why.
        with rdt.Runtime("outsider") as other:
            with pytest.raises(rdt.RdtError, match="not ranks of one nccl group"):
                other.get(other.borrow(ref), out=[torch.empty_like(x)])
        c.stop()
