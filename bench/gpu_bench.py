"""cuda_ipc against a device-to-device copy in one process, on one GPU.

A source process puts CUDA tensors (torch) with transport="cuda_ipc"; this
process fetches them into preallocated tensors on the same GPU. The
baseline is torch's copy_ between two tensors of this process (a
cuMemcpyDtoD on one stream), measured in the same run. Each size reports
its best time over several runs; the 4 KiB line reports the median of many
fetches (latency, not bandwidth). Run by `make gpu-bench`.
"""

import multiprocessing as mp
import statistics
import sys
import time

SIZES = [("1 MiB", 1 << 20, 20), ("64 MiB", 64 << 20, 10), ("1 GiB", 1 << 30, 5)]
SMALL, SMALL_RUNS = 4096, 2000


def source(conn):
    import torch
    import rdt
    refs = {}
    for _, n, _ in SIZES + [("4 KiB", SMALL, 0)]:
        x = torch.full((n,), 7, dtype=torch.uint8, device="cuda:0")
        refs[n] = rdt.put(x, transport="cuda_ipc")
    torch.cuda.synchronize()
    conn.send({n: r.serialize() for n, r in refs.items()})
    conn.recv()  # until told to stop


def main():
    import torch
    import rdt
    if not torch.cuda.is_available():
        sys.exit("gpu-bench: no CUDA device (torch sees none)")
    ctx = mp.get_context("spawn")
    conn, child_end = ctx.Pipe()
    p = ctx.Process(target=source, args=(child_end,))
    p.start()
    blobs = conn.recv()
    rt = rdt.default_runtime()
    refs = {n: rt.deserialize(b) for n, b in blobs.items()}
    print(f"rdt {rdt.library_version()}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print()
    print(f"| size | cuda_ipc fetch | same-process copy | cuda_ipc / copy |")
    print(f"|---|---|---|---|")
    for label, n, runs in SIZES:
        out = torch.empty(n, dtype=torch.uint8, device="cuda:0")
        src = torch.empty(n, dtype=torch.uint8, device="cuda:0")
        rdt.get(refs[n], out=[out])  # opens and caches the handle
        assert int(out[0]) == 7 and int(out[-1]) == 7
        best_f = best_c = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            rdt.get(refs[n], out=[out])
            best_f = min(best_f, time.perf_counter() - t0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out.copy_(src)
            torch.cuda.synchronize()
            best_c = min(best_c, time.perf_counter() - t0)
        gbs = lambda s: n / s / 1e9
        print(f"| {label} | {best_f * 1e3:.3f} ms ({gbs(best_f):.1f} GB/s) | {best_c * 1e3:.3f} ms "
              f"({gbs(best_c):.1f} GB/s) | {best_f / best_c:.2f}x |")
    out = torch.empty(SMALL, dtype=torch.uint8, device="cuda:0")
    src = torch.empty(SMALL, dtype=torch.uint8, device="cuda:0")
    fetches, copies = [], []
    for _ in range(SMALL_RUNS):
        t0 = time.perf_counter()
        rdt.get(refs[SMALL], out=[out])
        fetches.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out.copy_(src)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t0)
    f50, c50 = statistics.median(fetches), statistics.median(copies)
    print(f"| 4 KiB p50 | {f50 * 1e6:.1f} µs | {c50 * 1e6:.1f} µs | {f50 / c50:.2f}x |")
    print()
    print("cuda_ipc fetch: rdt.get into a preallocated tensor, from another process (handle cached after the "
          "first fetch); copy: torch copy_ + synchronize in this process. Best of several runs; 4 KiB: median "
          f"of {SMALL_RUNS}.")
    for r in refs.values():
        r.close()
    conn.send("stop")
    p.join(30)


if __name__ == "__main__":
    main()
