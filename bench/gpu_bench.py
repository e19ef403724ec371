"""GPU fetches against a device-to-device copy in one process.

A source process puts CUDA tensors (torch) once per GPU transport
(cuda_ipc, and nixl where NIXL loads); this process fetches them into
tensors it allocated before on the same GPU. The baseline, measured in the
same run, is torch's copy_ between two tensors of this process (one
device-to-device copy on a stream, then a synchronize). Bandwidth is bytes
over the best of several runs, for the fetch and the copy alike; the 4 KiB
line is the median of many fetches (latency). For nixl, one fetch from a
fresh process with UCX_PROTO_INFO=y shows which of UCX's transports UCX
selected (the nixl column names them) and whether cuda_ipc is among them.
With two GPUs, cuda_ipc from a process that sees only GPU 1 into GPU 0
is measured against torch's copy_ from cuda:1 to cuda:0 in one process.
Run by `make gpu-bench` and by the GPU pack (docs/gpu.md); the output is
Markdown for bench/RESULTS.md.
"""

import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [("1 MiB", 1 << 20, 30), ("64 MiB", 64 << 20, 15), ("1 GiB", 1 << 30, 8)]
SMALL, SMALL_RUNS = 4096, 2000
TRANSPORTS = ["cuda_ipc", "nixl"]
# Targets of the GPU transports: (transport, bandwidth ratio to the copy at 1 GiB).
BANDWIDTH_TARGETS = {"cuda_ipc": 0.9, "nixl": 0.8}
SMALL_TARGET_US = 30.0
# Where the benchmark leaves logs beside its table (the GPU pack's output).
LOGS_ENV = "RDT_GPU_BENCH_LOGS"
# UCX's transports (UCT) that its protocol tables name as "transport/device".
UCT_NAMES = ("cuda_ipc", "cuda_copy", "gdr_copy", "tcp", "cma", "knem", "xpmem", "posix", "sysv", "self",
             "rc_mlx5", "rc_verbs", "dc_mlx5", "ud_mlx5", "ud_verbs")
LANE = re.compile(r"\b(" + "|".join(UCT_NAMES) + r")/")
# Sizes of the fetch across GPUs, with their runs.
CROSS_SIZES = [("64 MiB", 64 << 20, 15), ("1 GiB", 1 << 30, 8)]


def fill_value(n):
    return (n >> 10) % 251 + 1


def source(conn, transports):
    import torch
    import rdt
    refs = {}
    for name in transports:
        for _, n, _ in SIZES + [("4 KiB", SMALL, 0)]:
            x = torch.full((n,), fill_value(n), dtype=torch.uint8, device="cuda:0")
            refs[name, n] = rdt.put(x, transport=name)
    # A host tensor of the same size: the runtime's and Python's share of a
    # fetch, over the host transport the automatic choice takes.
    refs["host", SMALL] = rdt.put(torch.full((SMALL,), fill_value(SMALL), dtype=torch.uint8))
    torch.cuda.synchronize()
    conn.send({k: r.serialize() for k, r in refs.items()})
    conn.recv()  # until told to stop


def best_of(runs, fn):
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    import torch
    import rdt
    if not torch.cuda.is_available():
        sys.exit("gpu-bench: no CUDA device (torch sees none)")
    rt = rdt.default_runtime()
    available = rt.transport_names()
    transports = [t for t in TRANSPORTS if t in available]
    missing = [t for t in TRANSPORTS if t not in available]
    if "cuda_ipc" not in transports:
        sys.exit("gpu-bench: the runtime lists no cuda_ipc transport (is the CUDA driver loadable?)")
    ctx = mp.get_context("spawn")
    conn, child_end = ctx.Pipe()
    p = ctx.Process(target=source, args=(child_end, transports))
    p.start()
    try:
        blobs = conn.recv()
        refs = {k: rt.deserialize(b) for k, b in blobs.items()}
        lanes = None
        if "nixl" in transports:
            lanes = ucx_protocols(refs["nixl", 64 << 20].serialize(), os.environ.get(LOGS_ENV))
        run(torch, rdt, transports, missing, refs, lanes)
        breakdown(torch, rdt, refs)
        for r in refs.values():
            r.close()
    finally:
        conn.send("stop")
        p.join(60)
    across_gpus(torch, rdt)


def run(torch, rdt, transports, missing, refs, lanes):
    print(f"## GPU transports against a device-to-device copy ({torch.cuda.get_device_name(0)})")
    print()
    print(f"rdt {rdt.library_version()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    if missing:
        print(f"Not measured: {', '.join(missing)} (not available in this runtime).")
    print()
    heads = [f"nixl (UCX: {', '.join(lanes['lanes']) or 'no lane found'})" if t == "nixl" and lanes else t
             for t in transports]
    print("| size | same-process copy | " + " | ".join(heads) + " |")
    print("|---" * (2 + len(transports)) + "|")
    ratios = {}
    for label, n, runs in SIZES:
        out = torch.empty(n, dtype=torch.uint8, device="cuda:0")
        src = torch.empty(n, dtype=torch.uint8, device="cuda:0")

        def copy():
            out.copy_(src)
            torch.cuda.synchronize()

        copy()
        t_copy = best_of(runs, copy)
        cells = []
        for name in transports:
            ref = refs[name, n]
            out.zero_()
            rdt.get(ref, out=[out], transport=name)  # the first fetch also opens handles and agents
            want = fill_value(n)
            if not bool((out == want).all()):
                sys.exit(f"gpu-bench: {name} {label}: the bytes arrived corrupted")
            t = best_of(runs, lambda: rdt.get(ref, out=[out], transport=name))
            ratios[name, n] = t_copy / t
            cells.append(f"{n / t / 1e9:.1f} GB/s ({t_copy / t:.2f}x)")
        print(f"| {label} | {n / t_copy / 1e9:.1f} GB/s | " + " | ".join(cells) + " |")
        del out, src
    small = {}
    out = torch.empty(SMALL, dtype=torch.uint8, device="cuda:0")
    src = torch.empty(SMALL, dtype=torch.uint8, device="cuda:0")
    copies = []
    for _ in range(SMALL_RUNS):
        t0 = time.perf_counter()
        out.copy_(src)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t0)
    for name in transports:
        ref = refs[name, SMALL]
        rdt.get(ref, out=[out], transport=name)
        times = []
        for _ in range(SMALL_RUNS):
            t0 = time.perf_counter()
            rdt.get(ref, out=[out], transport=name)
            times.append(time.perf_counter() - t0)
        small[name] = statistics.median(times) * 1e6
    print(f"| 4 KiB p50 | {statistics.median(copies) * 1e6:.1f} µs | "
          + " | ".join(f"{small[t]:.1f} µs" for t in transports) + " |")
    print()
    print("Bandwidth: bytes over the best of several runs; ratio: fetch bandwidth over the copy's. A fetch is "
          "one `rdt.get` into a preallocated tensor on the same GPU, from another process (handles and "
          f"agents cached after the first); the copy is torch `copy_` plus a synchronize. 4 KiB: median of "
          f"{SMALL_RUNS}.")
    print()
    print("| target | measured | met |")
    print("|---|---|---|")
    for name, want in BANDWIDTH_TARGETS.items():
        if name in transports:
            got = ratios[name, 1 << 30]
            print(f"| {name} at 1 GiB >= {want}x the copy | {got:.2f}x | {'yes' if got >= want else 'no'} |")
        else:
            print(f"| {name} at 1 GiB >= {want}x the copy | not measured | no |")
    got = small["cuda_ipc"]
    print(f"| 4 KiB GPU fetch p50 <= {SMALL_TARGET_US:.0f} µs (cuda_ipc) | {got:.1f} µs | "
          f"{'yes' if got <= SMALL_TARGET_US else 'no'} |")
    if lanes:
        print()
        print(lanes["text"])


def p50_us(fn, runs=SMALL_RUNS):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def breakdown(torch, rdt, refs):
    """The parts of a 4 KiB cuda_ipc fetch that can be timed from Python,
    beside the whole; the transport's own time is the go-cuda_ipc step's
    BenchmarkGPUFetch."""
    dev = torch.empty(SMALL, dtype=torch.uint8, device="cuda:0")
    host = torch.empty(SMALL, dtype=torch.uint8)
    rows = [
        ("rdt.get over cuda_ipc into device memory", lambda: rdt.get(refs["cuda_ipc", SMALL], out=[dev])),
        ("rdt.get over cuda_ipc into host memory", lambda: rdt.get(refs["cuda_ipc", SMALL], out=[host])),
        ("rdt.get of a host tensor into host memory (automatic choice)", lambda: rdt.get(refs["host", SMALL],
                                                                                        out=[host])),
        ("torch.cuda.current_stream().synchronize(), idle", lambda: torch.cuda.current_stream().synchronize()),
    ]
    print()
    print("| 4 KiB, where the time goes | p50 |")
    print("|---|---|")
    for label, fn in rows:
        fn()
        print(f"| {label} | {p50_us(fn):.1f} µs |")


def ucx_protocols(blob, logs):
    """Fetches a 64 MiB nixl object once from a fresh process with
    UCX_PROTO_INFO=y, keeping UCX's protocol tables (which UCX transport
    moves device memory) in LOGS/nixl-ucx-protocols.log (a temporary file
    without LOGS). Returns the lanes those tables name ("lanes", sorted)
    and a Markdown paragraph that says whether cuda_ipc is among them
    ("text")."""
    with tempfile.NamedTemporaryFile(suffix=".ref", delete=False) as f:
        f.write(blob)
    if logs:
        path = os.path.join(logs, "nixl-ucx-protocols.log")
    else:
        fd, path = tempfile.mkstemp(suffix=".log")
        os.close(fd)
    try:
        with open(path, "w") as log:
            r = subprocess.run([sys.executable, __file__, "--fetch-once", f.name], stdout=log, stderr=log,
                               env={**os.environ, "UCX_PROTO_INFO": "y"}, timeout=60)
        ended = f"exit {r.returncode}"
    except subprocess.TimeoutExpired:
        ended = "timed out"
    finally:
        os.unlink(f.name)
    with open(path, errors="replace") as log:
        lines = log.read().splitlines()
    if not logs:
        os.unlink(path)
    found = lanes_in(lines)
    fetched = next((ln for ln in lines if ln.startswith("fetched ")), "no fetch finished")
    zcopy = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("UCX_CUDA_IPC_ENABLE_GET_ZCOPY=")), "?")
    where = f" (`{os.path.basename(path)}`)" if logs else ""
    verdict = (f"yes, on {found['cuda_ipc']} line{'s' if found['cuda_ipc'] != 1 else ''}" if "cuda_ipc" in found
               else "no")
    text = (f"**nixl's lanes.** A 64 MiB nixl fetch from a fresh process with `UCX_PROTO_INFO=y` "
            f"(`UCX_CUDA_IPC_ENABLE_GET_ZCOPY={zcopy}` there): {ended}; {fetched}. UCX's protocol "
            f"selection{where} names `cuda_ipc`: **{verdict}**; lanes named: "
            f"{', '.join(f'`{k}` ({v})' for k, v in sorted(found.items())) or 'none'}.")
    return {"lanes": sorted(found), "text": text}


def lanes_in(lines):
    """The UCX transports named in the rows of UCX's protocol tables
    (UCX_PROTO_INFO=y), each with how many rows name it."""
    found = {}
    for line in lines:
        if "|" not in line:
            continue
        for name in set(LANE.findall(line)):
            found[name] = found.get(name, 0) + 1
    return found


def fetch_once(path):
    import ctypes
    import torch
    import rdt
    with open(path, "rb") as f:
        ref = rdt.default_runtime().deserialize(f.read())
    getenv = ctypes.CDLL(None).getenv  # what rdt set for UCX, which os.environ does not show
    getenv.restype = ctypes.c_char_p
    zcopy = getenv(b"UCX_CUDA_IPC_ENABLE_GET_ZCOPY")
    print(f"UCX_CUDA_IPC_ENABLE_GET_ZCOPY={zcopy.decode() if zcopy else '(unset)'}", flush=True)
    out = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    t0 = time.perf_counter()
    rdt.get(ref, out=[out], transport="nixl")
    t = time.perf_counter() - t0
    print(f"fetched 64 MiB over nixl in {t * 1e3:.2f} ms ({(64 << 20) / t / 1e9:.2f} GB/s), "
          f"bytes right: {bool((out == fill_value(64 << 20)).all())}", flush=True)
    ref.close()


def cross_source(conn, visible):
    """Sees only the GPU ``visible`` (CUDA_VISIBLE_DEVICES, set before CUDA
    starts here) and puts a tensor of each of CROSS_SIZES there over
    cuda_ipc; sends their serialized refs, then waits until told to stop."""
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    import torch
    import rdt
    refs = {n: rdt.put(torch.full((n,), fill_value(n), dtype=torch.uint8, device="cuda:0"), transport="cuda_ipc")
            for _, n, _ in CROSS_SIZES}
    torch.cuda.synchronize()
    conn.send({n: r.serialize() for n, r in refs.items()})
    conn.recv()


def across_gpus(torch, rdt):
    """cuda_ipc from a process that sees only GPU 1 into this process's
    GPU 0 against torch's copy_ from cuda:1 to cuda:0 in one process."""
    print()
    print("### Across GPUs")
    print()
    n = torch.cuda.device_count()
    if n < 2:
        print(f"Not measured: this machine has {n} GPU{'s' if n != 1 else ''} (needs two).")
        return
    if not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        print("Not measured: GPUs 0 and 1 have no peer access.")
        return
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in env.split(",")][:n] if env else [str(i) for i in range(n)]
    ctx = mp.get_context("spawn")
    conn, child_end = ctx.Pipe()
    p = ctx.Process(target=cross_source, args=(child_end, ids[1]))
    p.start()
    try:
        refs = {k: rdt.default_runtime().deserialize(b) for k, b in conn.recv().items()}
        print(f"{torch.cuda.get_device_name(1)} to {torch.cuda.get_device_name(0)}; the source process sees "
              "only GPU 1, as its cuda:0.")
        print()
        print("| size | same-process copy cuda:1 → cuda:0 | cuda_ipc |")
        print("|---|---|---|")
        for label, size, runs in CROSS_SIZES:
            out = torch.empty(size, dtype=torch.uint8, device="cuda:0")
            src = torch.empty(size, dtype=torch.uint8, device="cuda:1")

            def copy():
                out.copy_(src)
                torch.cuda.synchronize(0)
                torch.cuda.synchronize(1)

            copy()
            t_copy = best_of(runs, copy)
            ref = refs[size]
            try:
                out.zero_()
                rdt.get(ref, out=[out], transport="cuda_ipc")
                if not bool((out == fill_value(size)).all()):
                    cell = "the bytes arrived corrupted"
                else:
                    t = best_of(runs, lambda: rdt.get(ref, out=[out], transport="cuda_ipc"))
                    cell = f"{size / t / 1e9:.1f} GB/s ({t_copy / t:.2f}x)"
            except rdt.RdtError as e:
                cell = f"failed: {type(e).__name__}: {e}"
            print(f"| {label} | {size / t_copy / 1e9:.1f} GB/s | {cell} |")
        for r in refs.values():
            r.close()
    finally:
        conn.send("stop")
        p.join(60)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--fetch-once":
        fetch_once(sys.argv[2])
    else:
        main()
