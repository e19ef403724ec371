"""``rdt bench``: a quick table of each transport on this host, between this
process and a peer process (:mod:`rdt._cli._peer`), against this host's own
limits measured in the same run: single-thread memcpy for the same-host
copies, raw loopback TCP between the two processes for tcp."""

from __future__ import annotations

import base64
import pickle
import socket
import statistics
import struct
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from ._peer import PeerProcess, automatic_order, pattern, quiet_runtime

DEFAULT_SIZES = (4 << 10, 1 << 20, 64 << 20)
MAX_SIZE = 1 << 32  # 4 GiB: --sizes beyond are a usage error
# Time spent measuring one (transport, size) row, and its iteration bounds.
ROW_SECONDS = 0.6
MIN_ITERATIONS, MAX_ITERATIONS = 3, 2000


def parse_size(text: str) -> int:
    """"4K", "1M", "64M", "1G" (binary units) or a byte count."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if scale != 1 else t
    if not digits.isdigit():
        raise ValueError(f"size {text!r}: want a number with an optional K, M or G (binary units)")
    n = int(digits) * scale
    if not 0 < n <= MAX_SIZE:
        raise ValueError(f"size {text!r}: want 1 byte to 4 GiB")
    return n


def human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


class Progress:
    """A plain-text bar on a terminal (redrawn with \\r), else one line per step."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.tty = stream.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        if self.tty:
            width = 30
            filled = width * self.done // self.total
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {what:<28}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"bench: {self.done}/{self.total} {what}\n")
        self.stream.flush()


def _timed(run: Callable[[], None]) -> List[float]:
    """Runs `run` repeatedly for about ROW_SECONDS; the seconds of each."""
    times: List[float] = []
    end = time.perf_counter() + ROW_SECONDS
    while len(times) < MIN_ITERATIONS or (time.perf_counter() < end and len(times) < MAX_ITERATIONS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def memcpy_baseline(size: int) -> List[float]:
    import numpy as np
    src = pattern(size, 3)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the pages first
    return _timed(lambda: np.copyto(dst, src))


def cuda_memcpy_baseline(size: int) -> List[float]:
    import torch
    src = torch.ones(size, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        torch.cuda.synchronize()
    copy()
    return _timed(copy)


def tcp_baseline(peer: PeerProcess, size: int, timeout: float) -> List[float]:
    """Raw loopback TCP between the two processes: ask for `size` bytes,
    receive them all."""
    port = peer.request("tcp_serve", timeout, nbytes=size)["port"]
    buf = bytearray(size)
    view = memoryview(buf)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ask = struct.pack("<Q", size)

        def fetch() -> None:
            s.sendall(ask)
            got = 0
            while got < size:
                n = s.recv_into(view[got:])
                if n == 0:
                    raise ConnectionError("the peer closed the baseline connection")
                got += n
        fetch()
        return _timed(fetch)


def device_of(info: Dict[str, Any]) -> str:
    """Where bench puts the object a transport (its rt.transports() entry)
    moves: host memory, unless the transport moves CUDA memory only."""
    return "cpu" if "cpu" in info["devices"] else "cuda"


def transport_times(rt: Any, peer: PeerProcess, name: str, size: int, timeout: float, device: str) -> List[float]:
    import numpy as np
    reply = peer.request("put", timeout, nbytes=size, seed=7, transport=name, device=device)
    ref = pickle.loads(base64.b64decode(reply["ref"]))
    try:
        if device == "cuda":
            import torch
            out = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        else:
            out = np.empty(size, dtype=np.uint8)
        rt.get(ref, timeout=timeout, out={"x": out})
        got = out.cpu().numpy() if device == "cuda" else out
        if not np.array_equal(got, pattern(size, 7)):
            raise RuntimeError(f"{name}: the fetched bytes differ from the ones put")
        return _timed(lambda: rt.get(ref, timeout=timeout, out={"x": out}))
    finally:
        ref.release()
        peer.request("release", timeout, key=reply["key"])


def _row(name: str, size: int, times: Sequence[float], baseline: str, base_times: Sequence[float]) -> Dict[str, Any]:
    p50, base_p50 = statistics.median(times), statistics.median(base_times)
    return {"transport": name, "size": size, "iterations": len(times), "p50_us": round(p50 * 1e6, 1),
            "gbps": round(size / p50 / 1e9, 3), "baseline": baseline,
            "baseline_p50_us": round(base_p50 * 1e6, 1), "baseline_gbps": round(size / base_p50 / 1e9, 3),
            "ratio": round(base_p50 / p50, 3)}


def default_transports(rt: Any) -> List[str]:
    """The one-sided transports of the automatic choice between two
    processes of this host: for host memory, and for CUDA memory where a
    GPU and torch are present (the library's order, not a list here)."""
    ones = [t["name"] for t in rt.transports() if t["one_sided"]]
    out = [n for n in automatic_order(rt, "host") if n in ones]
    try:
        import torch
        if not torch.cuda.is_available():
            return out
    except ImportError:
        return out
    return out + [n for n in automatic_order(rt, "cuda") if n in ones and n not in out]


def run(transports: Optional[Sequence[str]], sizes: Sequence[int], timeout: float = 30.0,
        progress_stream: TextIO = sys.stderr) -> Dict[str, Any]:
    rt = quiet_runtime("rdt-bench")
    here = {t["name"]: t for t in rt.transports()}
    if transports is None:
        transports = default_transports(rt)
    report: Dict[str, Any] = {"sizes": list(sizes), "rows": [], "errors": {}}
    baselines: Dict[Any, List[float]] = {}
    progress = Progress(len(transports) * len(sizes), progress_stream)
    with PeerProcess(start_timeout=timeout) as peer:
        for name in transports:
            for size in sizes:
                progress.step(f"{name} {human(size)}")
                if name not in here:
                    report["errors"][name] = rdt_unavailable(rt, name)
                    continue
                if name in report["errors"]:
                    continue
                info = here[name]
                if not info["one_sided"]:
                    report["errors"][name] = ("two-sided: it moves data only within a group of processes "
                                              "(rdt.create_collective_group), which bench does not form")
                    continue
                device = device_of(info)
                kind = "cuda memcpy" if device == "cuda" else "memcpy" if info["same_host_only"] else "loopback tcp"
                try:
                    if (kind, size) not in baselines:
                        baselines[kind, size] = (tcp_baseline(peer, size, timeout) if kind == "loopback tcp"
                                                 else cuda_memcpy_baseline(size) if kind == "cuda memcpy"
                                                 else memcpy_baseline(size))
                    times = transport_times(rt, peer, name, size, timeout, device)
                except Exception as e:
                    report["errors"][name] = f"{type(e).__name__}: {e}"
                    continue
                report["rows"].append(_row(name, size, times, kind, baselines[kind, size]))
    return report


def rdt_unavailable(rt: Any, name: str) -> str:
    why = rt.unavailable_transports().get(name)
    return f"not available here: {why}" if why else "not registered in this runtime"


def render(report: Dict[str, Any]) -> str:
    header = f"{'transport':<9} {'size':>8} {'p50':>10} {'GB/s':>8}   {'baseline':<13} {'GB/s':>8} {'ratio':>6}"
    lines = [header, "-" * len(header)]
    for r in report["rows"]:
        p50 = f"{r['p50_us']:.1f} us" if r["p50_us"] < 10000 else f"{r['p50_us'] / 1000:.2f} ms"
        lines.append(f"{r['transport']:<9} {human(r['size']):>8} {p50:>10} {r['gbps']:>8.2f}   "
                     f"{r['baseline']:<13} {r['baseline_gbps']:>8.2f} {r['ratio']:>6.2f}")
    for name, why in report["errors"].items():
        lines.append(f"{name:<9} FAILED {why}")
    lines.append("ratio: the transport's p50 against the baseline's (1.00 = as fast as this host's own limit)")
    return "\n".join(lines)
