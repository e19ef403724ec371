"""Usage: machine.py OUT.json
What the GPU pack's run.sh reports about the machine it runs on: the GPU,
driver and CUDA version, how the GPUs are linked (NVLink, topology),
torch, CuPy and NCCL, and what rdt itself finds (its transports, NIXL's
libraries and the UCX they carry). Prints one line per fact and writes
them to OUT.json; a fact that cannot be had reads "not available: <why>".
Runs with the machine's own python3 and needs nothing installed: each
import is tried."""

import glob

import ctypes
import json
import os
import platform
import subprocess
import sys


def run(*cmd):
    """The command's stdout; raises with its stderr when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip().splitlines()[-1] if (p.stderr or p.stdout).strip()
                           else f"{cmd[0]} exited with status {p.returncode}")
    return p.stdout.strip()


def host():
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"kernel": platform.release(), "machine": platform.machine(),
            "glibc": os.confstr("CS_GNU_LIBC_VERSION"), "cpus": os.cpu_count(),
            "memory_gib": round(mem_kb / (1 << 20), 1), "python": sys.version.split()[0]}


def gpu():
    rows = run("nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id",
               "--format=csv,noheader").splitlines()
    header = run("nvidia-smi")
    cuda = header.split("CUDA Version:")[1].split()[0] if "CUDA Version:" in header else "not shown"
    return {"gpus": [r.strip() for r in rows], "driver_cuda_version": cuda}


def nvlink():
    """nvidia-smi nvlink -s: each GPU's NVLink links and their speed (UCX
    turns cuda_ipc reads on by itself only over an active link)."""
    out = run("nvidia-smi", "nvlink", "-s")
    if not out:
        raise RuntimeError("nvidia-smi nvlink -s printed nothing (no NVLink)")
    return out.splitlines()


def topology():
    """nvidia-smi topo -m: how each pair of GPUs (and NICs) is connected."""
    return run("nvidia-smi", "topo", "-m").splitlines()


def cuda_driver():
    """The driver rdt loads (RDT_CUDA_LIBRARY, else libcuda.so.1) and the
    CUDA version it reports."""
    path = os.environ.get("RDT_CUDA_LIBRARY") or "libcuda.so.1"
    lib = ctypes.CDLL(path)
    v = ctypes.c_int()
    if not hasattr(lib, "cuDriverGetVersion"):
        version = "not available: the library has no cuDriverGetVersion"
    elif lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
        version = "not available: cuDriverGetVersion failed"
    else:
        version = f"{v.value // 1000}.{v.value % 1000 // 10}"
    return {"library": path, "cuda_version": version,
            "test_double": bool(os.environ.get("RDT_CUDA_LIBRARY"))}


def torch_facts():
    import torch
    facts = {"version": torch.__version__, "cuda_build": torch.version.cuda,
             "cuda_available": torch.cuda.is_available()}
    if facts["cuda_available"]:
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return facts


def cupy_facts():
    import cupy
    facts = {"version": cupy.__version__}
    try:
        facts["runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        facts["devices"] = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no device: CuPy imports but cannot reach one
        facts["devices"] = f"not available: {e}"
    return facts


def nccl():
    """The libnccl.so.2 run.sh hands rdt (RDT_NCCL_LIBRARY), its version,
    and the wheel it came from."""
    from importlib import metadata
    path = os.environ.get("RDT_NCCL_LIBRARY")
    if not path:
        raise RuntimeError("no libnccl.so.2 found (no nvidia-nccl wheel in this python3, RDT_NCCL_LIBRARY unset)")
    v = ctypes.c_int()
    rc = ctypes.CDLL(path).ncclGetVersion(ctypes.byref(v))
    facts = {"library": path, "version": f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"
             if rc == 0 else f"ncclGetVersion returned {rc}"}
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            facts["wheel"] = f"{dist}=={metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            pass
    return facts


def rdt_facts():
    import rdt
    with rdt.Runtime("machine") as rt:
        return {"version": rdt.library_version(), "transports": rt.transport_names(),
                "unavailable": rt.unavailable_transports()}


def nixl():
    """The NIXL libraries run.sh unpacked, and any library they need that
    this machine lacks."""
    path = os.environ.get("RDT_NIXL_LIBRARY")
    if not path:
        raise RuntimeError("RDT_NIXL_LIBRARY is unset")
    plugin = os.path.join(os.path.dirname(path), "plugins", "libplugin_UCX.so")
    missing = sorted({line.split()[0] for lib in (path, plugin) for line in run("ldd", lib).splitlines()
                      if "not found" in line})
    return {"library": path, "missing_libraries": missing}


def ucx():
    """The UCX that NIXL's UCX backend loads from the pack: the version its
    libucp reports (ucp_get_version_string; the wheel has no ucx_info),
    asked in a child process (UCX starts with the library), and the
    library's file."""
    path = os.environ.get("RDT_NIXL_LIBRARY")
    if not path:
        raise RuntimeError("RDT_NIXL_LIBRARY is unset")
    root = os.path.dirname(os.path.dirname(path))
    found = sorted(glob.glob(os.path.join(root, "*.libs", "libucp*.so*")))
    if not found:
        raise RuntimeError(f"no libucp in {root}")
    try:
        version = run(sys.executable, "-c", "import ctypes, sys\n"
                      "f = ctypes.CDLL(sys.argv[1]).ucp_get_version_string\n"
                      "f.restype = ctypes.c_char_p\n"
                      "print(f().decode())", found[0]).splitlines()[-1]
    except Exception as e:  # noqa: BLE001 - reported, not raised
        version = f"not available: {e}"
    return {"version": version, "library": os.path.relpath(found[0], root)}


def main():
    facts = {}
    for name, get in [("host", host), ("gpu", gpu), ("nvlink", nvlink), ("topology", topology),
                      ("cuda_driver", cuda_driver), ("torch", torch_facts), ("cupy", cupy_facts), ("nccl", nccl),
                      ("rdt", rdt_facts), ("nixl", nixl), ("ucx", ucx)]:
        try:
            facts[name] = get()
        except Exception as e:  # noqa: BLE001 - every failure is a fact to report
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            facts[name] = f"not available: {why}"
        print(f"{name}: {json.dumps(facts[name])}", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main()
