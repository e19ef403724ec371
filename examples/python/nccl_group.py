"""Two processes, one GPU each, form an NCCL group and move a tensor.

    python examples/python/nccl_group.py

Needs torch with CUDA, two GPUs and NCCL (libnccl.so.2; torch's wheels ship
one under nvidia/nccl/lib, which this example points RDT_NCCL_LIBRARY at).
Without them it says what is missing and exits with status 0.
"""

import glob
import multiprocessing as mp
import os
import pickle
import sys


def find_nccl():
    """Use the NCCL that came with torch unless RDT_NCCL_LIBRARY is set
    (it must be set before rdt loads its library)."""
    if os.environ.get("RDT_NCCL_LIBRARY"):
        return
    try:
        import nvidia.nccl
    except ImportError:
        return
    for d in nvidia.nccl.__path__:
        for lib in glob.glob(os.path.join(d, "lib", "libnccl.so*")):
            os.environ["RDT_NCCL_LIBRARY"] = lib
            return


def rank1(conn, address):
    find_nccl()
    import torch

    import rdt
    rdt.create_collective_group(2, 1, address, name="pair", device=1)
    ref = pickle.loads(conn.recv())
    out = torch.empty(4, device="cuda:1")
    rdt.get(ref, out=[out])                  # ncclRecv on rank 1, ncclSend on rank 0
    conn.send(out.tolist())
    conn.recv()
    rdt.destroy_collective_group("pair")     # with rank 0, at about the same time


def main():
    find_nccl()
    try:
        import torch
    except ImportError:
        print("this example needs torch with CUDA (pip install torch)")
        return 0
    if torch.cuda.device_count() < 2:
        print(f"this example needs two GPUs (found {torch.cuda.device_count()})")
        return 0
    import rdt
    rt = rdt.default_runtime()
    if "nccl" not in rt.transport_names():
        try:
            rt.create_collective_group(1, 0, name="probe")
        except rdt.UnsupportedError as e:
            print(f"NCCL is not usable here: {e}")
            return 0
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=rank1, args=(child, rt.address))
    p.start()
    rdt.create_collective_group(2, 0, name="pair", device=0)
    x = torch.arange(4, dtype=torch.float32, device="cuda:0")
    ref = rdt.put([x], transport="nccl")
    parent.send(pickle.dumps(ref))
    print("rank 1 received", parent.recv())
    parent.send("done")
    # Both ranks destroy the group at about the same time: NCCL frees a
    # communicator once the group's other ranks on the host free theirs
    # (rdt waits for that at most RDT_NCCL_TEARDOWN_MS).
    rdt.destroy_collective_group("pair")
    p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
