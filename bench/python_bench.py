"""The Python binding's speed.

    python bench/python_bench.py                  # Python numbers only
    python bench/python_bench.py build/rdtbench   # also the C side, same run
    python bench/python_bench.py --new 64M,1G     # get into new tensors only

Measures (1) a 4 KiB round trip between two runtimes: put, hand the ref to
the other runtime (serialize + deserialize), get into a buffer, release both
handles; and (2) a 64 MiB get from another process (spawned), into a
preallocated buffer. Prints µs and GB/s; with the C benchmark given, also
the C ABI's numbers for the same two measurements (``rdtbench compare``)
and the difference, as a Markdown section.

``--new SIZES`` measures only plain ``rdt.get`` of one object of each size
from another process (spawned), into the new arrays get makes, each one
dropped before the next get: what a consumer that keeps no buffers of its
own pays, receive memory included.
"""

import multiprocessing as mp
import pickle
import statistics
import subprocess
import sys
import time

import numpy as np

import rdt

MIB = 1 << 20
RUNS = 5


def roundtrip_us(n: int = 5000) -> float:
    with rdt.Runtime("py-a") as a, rdt.Runtime("py-b") as b:
        src = np.zeros(4096, dtype=np.uint8)
        dst = np.empty(4096, dtype=np.uint8)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            ref = a.put(src)
            borrowed = b.borrow(ref)
            b.get(borrowed, out=dst)
            borrowed.close()
            ref.close()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6


def _source(conn) -> None:
    x = np.arange(8 * MIB, dtype=np.float64)  # 64 MiB
    ref = rdt.put(x)
    conn.send(pickle.dumps(ref))
    conn.recv()


def get_64m_gbps(rounds: int = 20) -> float:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_source, args=(child,))
    p.start()
    ref = pickle.loads(parent.recv())
    # np.empty, as the C side maps its buffers: numpy advises arrays it
    # allocates uninitialized for huge pages (np.zeros takes calloc's pages).
    out = np.empty(8 * MIB, dtype=np.float64)
    out.fill(0)
    rdt.get(ref, out=out)  # warm up: connection, page faults
    assert out[-1] == 8 * MIB - 1
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        rdt.get(ref, out=out)
        times.append(time.perf_counter() - t0)
    ref.close()
    parent.send("done")
    p.join()
    return 64 * MIB / statistics.median(times) / 1e9


def _source_of(conn, nbytes: int) -> None:
    x = np.arange(nbytes // 8, dtype=np.float64)
    ref = rdt.put(x)
    conn.send(pickle.dumps(ref))
    conn.recv()


def get_new_gbps(nbytes: int, rounds: int) -> float:
    """GB/s of rdt.get into new arrays (the median of rounds gets)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_source_of, args=(child, nbytes))
    p.start()
    ref = pickle.loads(parent.recv())
    got = rdt.get(ref)  # warm up: connection
    assert got[-1] == nbytes // 8 - 1
    del got
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        got = rdt.get(ref)
        times.append(time.perf_counter() - t0)
        del got
    ref.close()
    parent.send("done")
    p.join()
    return nbytes / statistics.median(times) / 1e9


def new_main(sizes: str) -> None:
    for text in sizes.split(","):
        n = int(text[:-1]) << {"M": 20, "G": 30}[text[-1]]
        gbps = get_new_gbps(n, rounds=max(5, min(20, (1 << 30) * 5 // n)))
        print(f"get_new {text} {gbps:.3f}", flush=True)


def c_side(rdtbench: str) -> dict:
    out = subprocess.run([rdtbench, "compare"], capture_output=True, text=True, check=True).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines())}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--new":
        new_main(sys.argv[2])
        return
    rdtbench = sys.argv[1] if len(sys.argv) > 1 else None
    # On two cores the Go runtime's threads and the benchmark share the CPUs,
    # and this kind of machine drifts by tens of percent from one second to
    # the next: interleave five runs of each side and compare the medians of
    # the runs (one outlier run on either side does not decide).
    c_runs, py_rts, py_gbs = [], [], []
    for _ in range(RUNS):
        if rdtbench:
            c_runs.append(c_side(rdtbench))
        py_rts.append(roundtrip_us())
        py_gbs.append(get_64m_gbps())
    py_rt, py_gb = statistics.median(py_rts), statistics.median(py_gbs)
    if not rdtbench:
        print(f"4 KiB put+get round trip (p50, median of {RUNS} runs): {py_rt:.1f} µs")
        print(f"64 MiB get from another process (p50, median of {RUNS} runs): {py_gb:.2f} GB/s")
        return
    c_rt = statistics.median(r["roundtrip_4k_us"] for r in c_runs)
    c_gb = statistics.median(r["get_64m_gbps"] for r in c_runs)
    over = py_rt - c_rt
    ratio = py_gb / c_gb
    print(f"\n## Python binding against C, same run (median of {RUNS} interleaved runs each)\n")
    print("| measurement | C | Python | difference | target | met |\n|---|---|---|---|---|---|")
    print(f"| 4 KiB put+get round trip (p50) | {c_rt:.1f} µs | {py_rt:.1f} µs | +{over:.1f} µs | "
          f"≤ +15 µs | {'yes' if over <= 15 else '**no**'} |")
    print(f"| 64 MiB get from another process | {c_gb:.2f} GB/s | {py_gb:.2f} GB/s | {ratio:.2f}x | "
          f"≥ 0.95x | {'yes' if ratio >= 0.95 else '**no**'} |")


if __name__ == "__main__":
    main()
