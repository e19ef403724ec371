"""The nixl transport moving CUDA memory (VRAM) between spawned processes.
Needs a CUDA device and torch's CUDA build; skips otherwise."""

import json
import os
import pickle
import subprocess
import sys

import pytest

import gpu_env
import rdt

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]


def _cuda_torch():
    torch = gpu_env.cuda_torch("no CUDA device")
    if "nixl" not in rdt.default_runtime().transport_names():
        gpu_env.missing("NIXL is not available: set RDT_NIXL_LIBRARY to libnixl_capi.so or pip install nixl-cu12")
    return torch


def _hold(conn, tensors):
    """Puts tensors over nixl, sends the pickled ref and keeps the object
    until told to stop."""
    ref = rdt.put(tensors, transport="nixl")
    conn.send(pickle.dumps(ref))
    conn.recv()
    ref.close()


def _served(child, serve):
    """torch (or a skip), the child running serve, and the ref it sent."""
    torch = _cuda_torch()
    c = child(serve)
    return torch, c, pickle.loads(c.recv(timeout=120))


def serve_cuda(conn):
    """Puts CUDA tensors over nixl and keeps them until told to stop."""
    import torch
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    y = (torch.arange(4096, dtype=torch.int64, device="cuda:0") * 3).reshape(64, 64)
    _hold(conn, {"x": x, "y": y})


def test_cuda_tensors_over_nixl_between_processes(child):
    torch, c, ref = _served(child, serve_cuda)
    got = rdt.get(ref, transport="nixl", timeout=60)
    assert got["x"].is_cuda and got["y"].is_cuda
    assert torch.equal(got["x"].cpu(), torch.arange(1 << 20, dtype=torch.float32))
    assert torch.equal(got["y"].cpu(), (torch.arange(4096, dtype=torch.int64) * 3).reshape(64, 64))
    used = {t["name"]: t["transfers_completed"] for t in rdt.default_runtime().transports()}
    assert used["nixl"] >= 1
    # Into a host buffer: VRAM at the source, DRAM at the destination.
    out = {"x": torch.empty(1 << 20, dtype=torch.float32), "y": torch.empty(64, 64, dtype=torch.int64)}
    rdt.get(ref, transport="nixl", out=out, timeout=60)
    assert torch.equal(out["x"], torch.arange(1 << 20, dtype=torch.float32))
    # Rows of the CUDA matrix, into host memory and onto the device.
    rows = rdt.get(ref["y"][10:20], transport="nixl", out=torch.empty(10, 64, dtype=torch.int64), timeout=60)
    assert torch.equal(rows, (torch.arange(4096, dtype=torch.int64) * 3).reshape(64, 64)[10:20])
    rows = rdt.get(ref["y"][-3:], transport="nixl", timeout=60)
    assert rows.is_cuda and torch.equal(rows.cpu(), (torch.arange(4096, dtype=torch.int64) * 3).reshape(64, 64)[-3:])
    ref.close()
    c.stop()


def serve_host(conn):
    """Puts host tensors over nixl and keeps them until told to stop."""
    import torch
    _hold(conn, {"w": torch.arange(1 << 16, dtype=torch.float32).reshape(256, 256)})


def test_host_tensors_land_on_the_device_over_nixl(child):
    torch, c, ref = _served(child, serve_host)
    want = torch.arange(1 << 16, dtype=torch.float32).reshape(256, 256)
    out = {"w": torch.empty(256, 256, dtype=torch.float32, device="cuda:0")}
    rdt.get(ref, transport="nixl", out=out, timeout=60)  # DRAM at the source, VRAM here
    assert torch.equal(out["w"].cpu(), want)
    half = torch.empty(128, 256, dtype=torch.float32, device="cuda:0")
    rdt.get(ref["w"][128:], transport="nixl", out=half, timeout=60)
    assert torch.equal(half.cpu(), want[128:])
    ref.close()
    c.stop()


# What a process that uses nixl where a GPU is has in its C environment (UCX
# reads it there): rdt turns UCX's cuda_ipc reads on before NIXL loads,
# unless the user chose. Printed as JSON by a fresh interpreter, since
# os.environ shows neither what rdt set nor what it keeps.
_ENV_PROBE = """
import ctypes, json, rdt
rt = rdt.Runtime("env-probe")
nixl = [t for t in rt.transports() if t["name"] == "nixl"]
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
value = getenv(b"UCX_CUDA_IPC_ENABLE_GET_ZCOPY")
print(json.dumps({"nixl_devices": nixl[0]["devices"] if nixl else None, "value": value and value.decode()}))
"""
ZCOPY = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


def _env_probe(value):
    """What _ENV_PROBE prints, run with UCX_CUDA_IPC_ENABLE_GET_ZCOPY unset
    (value None) or set to value."""
    env = {k: v for k, v in os.environ.items() if k != ZCOPY}
    if value is not None:
        env[ZCOPY] = value
    here = os.path.dirname(os.path.dirname(os.path.abspath(rdt.__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", _ENV_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def test_nixl_turns_on_ucx_cuda_ipc_reads_where_a_gpu_is():
    _cuda_torch()
    got = _env_probe(None)
    assert got["nixl_devices"] and "cuda" in got["nixl_devices"], got
    assert got["value"] == "y", got
    # A value the user set is kept.
    got = _env_probe("n")
    assert "cuda" in got["nixl_devices"] and got["value"] == "n", got
