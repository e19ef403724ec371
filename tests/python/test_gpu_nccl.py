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
        # Both ranks let go of the group at about the same time (the child
        # as its runtime closes): NCCL frees a communicator once its peers
        # on the host free theirs.
        c.conn.send("stop")
        rt.destroy_collective_group("pair")
        c.stop()


# ---- teardown between two processes -------------------------------------------
# NCCL frees a communicator only once the group's other ranks on the host
# free theirs or exit; rdt waits for that at most RDT_NCCL_TEARDOWN_MS, for
# a group's destroy and for a runtime's close alike (docs/transports.md,
# "Teardown is collective on a host, and bounded"). Both ranks run in
# children, which read the bound when their runtime is created.
TEARDOWN_MS = 5000
MARGIN = 10.0  # seconds past the bound for a process to answer


def _pair(child, monkeypatch):
    """Two children, ranks 0 and 1 of the group "pair" on GPUs 0 and 1,
    with one nccl transfer from rank 0 to rank 1 done."""
    torch = _torch_nccl()
    if torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL needs two GPUs for one group (this machine has {torch.cuda.device_count()})")
    import workers
    monkeypatch.setenv("RDT_NCCL_TEARDOWN_MS", str(TEARDOWN_MS))
    r0 = child(workers.nccl_pair_rank, 0)
    r1 = child(workers.nccl_pair_rank, 1, r0.recv(120))
    assert r0.recv(120) == "joined" and r1.recv(120) == "joined"
    r0.send("put")
    r1.send(("get", r0.recv(60)))
    status, total = r1.recv(120)
    assert status == "ok", total
    n = 1 << 20
    assert total == float(n * (n - 1) // 2)
    return r0, r1


@pytest.mark.gpu
def test_two_ranks_destroy_at_once(child, monkeypatch):
    r0, r1 = _pair(child, monkeypatch)
    r0.send("destroy")
    r1.send("destroy")
    (how0, took0), (how1, took1) = r0.recv(TEARDOWN_MS / 1000 + MARGIN), r1.recv(TEARDOWN_MS / 1000 + MARGIN)
    assert (how0, how1) == ("ok", "ok"), (how0, how1)
    assert max(took0, took1) <= TEARDOWN_MS / 1000 + 1, (took0, took1)
    r0.stop()
    r1.stop()


@pytest.mark.gpu
def test_destroy_after_the_other_rank_exited(child, monkeypatch):
    r0, r1 = _pair(child, monkeypatch)
    r1.send("exit")  # gone with its group still formed
    r1.proc.join(30)
    assert r1.proc.exitcode == 0
    r0.send("destroy")
    how, took = r0.recv(TEARDOWN_MS / 1000 + MARGIN)
    assert how == "ok" or how.startswith("timeout"), how
    assert took <= TEARDOWN_MS / 1000 + MARGIN, took
    r0.stop()


@pytest.mark.gpu
def test_runtime_close_with_a_live_group_is_bounded(child, monkeypatch):
    r0, r1 = _pair(child, monkeypatch)
    r0.send("close")  # rank 1 keeps its group, and runs on
    how, took = r0.recv(TEARDOWN_MS / 1000 + MARGIN)
    assert how == "ok", how
    assert took <= TEARDOWN_MS / 1000 + MARGIN, took
    assert r1.proc.is_alive()
    r1.send("destroy")
    how1, _ = r1.recv(TEARDOWN_MS / 1000 + MARGIN)
    assert how1 == "ok" or how1.startswith("timeout"), how1
    r0.stop()
    r1.stop()
