"""The spread of the figures that move most from run to run and from machine
to machine: C's 4 KiB, 64 MiB, many-tensor, prepared and write rows and
Python's per-call costs, each measured in three runs on the machine as it
is and three beside one busy process per core (as tools/under-load.sh
makes), printed as one Markdown section of min–max cells.

    python bench/spread.py RDTBENCH [RUNS]     (bench/run.sh runs it)
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_bench  # noqa: E402  (a sibling script: its measurements, not a copy of them)

TRANSPORTS = ("cma", "shm", "tcp")


def c_rows(rdtbench: str) -> Dict[str, float]:
    """One round of C's rows, keyed "transport what"."""
    r: Dict[str, float] = {}
    for t in TRANSPORTS:
        r[f"{t} 4 KiB get p50 µs"] = float(python_bench._row(rdtbench, t, "4KiB", 3000)["p50_us"])
        r[f"{t} 64 MiB get GB/s"] = float(python_bench._row(rdtbench, t, "64MiB", 20)["gbps"])
        r[f"{t} 1,024 x 4 KiB get ms"] = float(python_bench._row(rdtbench, t, "1024x4KiB", 200)["many_ms"])
        prep = python_bench._row(rdtbench, t, "prepared:4KiB", 3000)
        r[f"{t} prepared 4 KiB get p50 µs"] = float(prep["prepared_fetch_p50_us"])
        if "prepared_write_p50_us" in prep:
            r[f"{t} prepared 4 KiB write p50 µs"] = float(prep["prepared_write_p50_us"])
        r[f"{t} 4 KiB write p50 µs"] = float(python_bench._row(rdtbench, t, "write:4KiB", 2000)["write_p50_us"])
    return r


def python_calls() -> Dict[str, float]:
    """One round of Python's per-call costs, with the bare C calls timed
    beside them."""
    gets = python_bench.calls_python_gets()
    refs = python_bench.calls_python_refs()
    r = {f"{t} 4 KiB get from Python p50 µs": gets[t] for t in TRANSPORTS}
    for call in ("put", "serialize", "deserialize", "release"):
        r[f"{call} from Python p50 µs"] = refs[call]
        r[f"{call} bare C call p50 µs"] = refs["c_" + call]
    return r


def busy(n: int) -> List[subprocess.Popen]:
    """n processes that keep one core each busy and use no memory."""
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]


def rounds(measure: Callable[[], Dict[str, float]], runs: int, loaded: bool) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {}
    for _ in range(runs):
        hogs = busy(os.cpu_count() or 1) if loaded else []
        try:
            for k, v in measure().items():
                out.setdefault(k, []).append(v)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    return out


def cell(values: List[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f}–{hi:.2f}"


def main() -> None:
    rdtbench = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    measure = lambda: {**c_rows(rdtbench), **python_calls()}  # noqa: E731
    quiet = rounds(measure, runs, loaded=False)
    loaded = rounds(measure, runs, loaded=True)
    print(f"\n## Spread: {runs} runs as the machine is, {runs} beside one busy process per core\n")
    print("The rows that move most between runs and between machines of one kind, each measured in "
          f"{runs} runs of its own on the machine as it is and {runs} beside one busy shell loop per core "
          "(what `make test-under-load` adds); each cell is the least and the most of its runs. The tables "
          "above are each one run.\n")
    print("| measurement | as it is | beside busy cores |\n|---|---|---|")
    for k in quiet:
        print(f"| {k} | {cell(quiet[k])} | {cell(loaded[k]) if k in loaded else '–'} |", flush=True)


if __name__ == "__main__":
    main()
