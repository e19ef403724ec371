"""cuda_ipc with PyTorch's expandable segments.

With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (what RL frameworks
set) PyTorch maps its memory in chunks with CUDA's virtual memory
management, which legacy CUDA IPC cannot share; cuda_ipc shares the chunks
as file descriptors. A child process allocates that way and puts tensors
(one spanning several 20 MiB chunks of the large pool, small ones in the
2 MiB chunks of the small pool); this process fetches them over cuda_ipc.
Needs a CUDA device and torch; skips without them (gpu_env).
"""

import os
import pickle

import pytest

import gpu_env
import rdt

BIG = 12 << 20  # float32 elements: 48 MiB, over several large-pool chunks


def expected(torch, device):
    return {"big": torch.arange(BIG, dtype=torch.float32, device=device),
            "small": torch.arange(1000, dtype=torch.int64, device=device) * 3,
            "view": (torch.arange(4096, dtype=torch.int16, device=device) - 7)[100:3000]}


def serve_expandable(conn):
    """Allocates with expandable segments, puts expected()'s tensors over
    cuda_ipc, sends the pickled ref and whether torch says its segments are
    expandable, then waits until told to stop."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    # Something before, so that the big tensor starts inside a chunk.
    pad = torch.empty(3 << 20, dtype=torch.uint8, device="cuda:0")
    values = expected(torch, "cuda:0")
    torch.cuda.synchronize()
    segs = torch.cuda.memory_snapshot()
    expandable = [s.get("is_expandable") for s in segs]
    ref = rdt.put(values, transport="cuda_ipc")
    conn.send((pickle.dumps(ref), expandable))
    try:
        conn.recv()
    except EOFError:
        pass
    del pad


def _torch_cuda():
    torch = gpu_env.cuda_torch("no CUDA device")
    with rdt.Runtime("probe") as rt:
        if "cuda_ipc" not in rt.transport_names():
            gpu_env.missing("no CUDA device: the runtime lists no cuda_ipc transport")
    return torch


@pytest.mark.gpu
def test_expandable_segments_across_processes(child):
    torch = _torch_cuda()
    c = child(serve_expandable)
    blob, expandable = c.recv(timeout=120)
    if any(e is not None for e in expandable):
        assert all(expandable), f"the child's segments are not all expandable: {expandable}"
    ref = pickle.loads(blob)
    want = expected(torch, "cuda:0")
    for _ in range(2):  # the second get reuses the receiver's mapping
        got = rdt.get(ref)
        for k, v in want.items():
            assert got[k].device == torch.device("cuda:0"), k
            assert torch.equal(got[k], v), k
    out = {k: torch.empty_like(v) for k, v in want.items()}
    rdt.get(ref, out=[out["big"], out["small"], out["view"]])
    for k, v in want.items():
        assert torch.equal(out[k], v), k
    ref.close()
    c.stop()


def serve_stream_ordered(conn):
    """Allocates with PyTorch's cudaMallocAsync backend (the device's
    default memory pool, which CUDA cannot share between processes): sends
    what a put over cuda_ipc said, and the pickled ref of a put that lets
    rdt choose the transport, then waits until told to stop."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    import torch
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    torch.cuda.synchronize()
    try:
        ipc, refused = pickle.dumps(rdt.put([x], transport="cuda_ipc")), ""
    except rdt.RdtError as e:  # where the put asks for the metadata itself
        ipc, refused = None, f"{type(e).__name__}: {e}"
    ref = rdt.put([x])
    conn.send((refused, ipc, pickle.dumps(ref), torch.cuda.get_allocator_backend()))
    try:
        conn.recv()
    except EOFError:
        pass


@pytest.mark.gpu
def test_stream_ordered_memory_is_refused_by_cuda_ipc_and_moved_by_another(child):
    # cudaMallocAsync memory of the default pool cannot be shared by CUDA
    # IPC in any form: cuda_ipc says so, naming the allocator and what to
    # do instead, and the automatic choice moves it over another transport
    # (nixl) when one that moves device memory is here.
    torch = _torch_cuda()
    c = child(serve_stream_ordered)
    refused, ipc, blob, backend = c.recv(timeout=120)
    assert backend == "cudaMallocAsync", backend
    if ipc is not None:  # the receiver asks for the metadata, and is refused
        with pytest.raises(rdt.UnsupportedError) as e:
            rdt.get(pickle.loads(ipc), timeout=60)
        refused = f"UnsupportedError: {e.value}"
    assert refused.startswith("UnsupportedError"), refused
    assert "cudaMallocAsync" in refused and "another transport" in refused, refused
    ref = pickle.loads(blob)
    want = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    with rdt.Runtime("probe") as rt:
        others = [t for t in rt.transport_names() if t in ("nixl", "nccl")]
    if "nixl" in others:
        got = rdt.get(ref)
        assert torch.equal(got[0], want)
    else:
        with pytest.raises(rdt.RdtError):
            rdt.get(ref, timeout=30)
    ref.close()
    c.stop()
