"""rdt as a Ray tensor transport against Ray's own ways of moving tensors.

    python bench/ray_bench.py [--out bench/RAY_RESULTS.md] [--nixl-dir build/nixl] [--quick]

Every mode runs in a fresh Ray session in its own process (Ray's serializer
hooks for a transport's data type are process-global, so modes must not share
a process). rdt must be importable (PYTHONPATH, RDT_LIBRARY) for the rdt
modes; Ray's NIXL mode needs the nixl wheel unpacked in --nixl-dir. A mode
that cannot start is reported as unavailable, with the reason. Progress goes
to stderr; the Markdown report goes to --out (stdout without it).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

KB, MB = 1000, 1000 * 1000
MIB, GIB = 1 << 20, 1 << 30
SIZES = [4, 150 * KB, 1 * MB, 64 * MIB, 1 * GIB]
SIZE_NAMES = {4: "4 B", 150 * KB: "150 KB", 1 * MB: "1 MB", 64 * MIB: "64 MiB", 1 * GIB: "1 GiB"}
PATHS = ["actor", "driver"]  # actor to actor, actor to driver (driver ray.get)
SOURCES = ["prealloc", "fresh"]
RECEIVERS = ["one", "all"]  # touch one element, read every byte

# mode -> (tensor_transport or None for the object store, data type)
MODES = {
    "store-numpy": (None, "numpy"),
    "store-torch": (None, "torch"),
    "gloo": ("gloo", "torch"),
    "nixl": ("nixl", "torch"),
    "rdt-torch": ("RDT", "torch"),
    "rdt-numpy": ("RDT", "numpy"),
    # The least any Ray tensor transport can cost: a transport that carries
    # the bytes inside its metadata, so its receive contacts no one. Small
    # sizes only (FLOOR_MAX).
    "floor": ("FLOOR", "torch"),
}
FLOOR_MAX = 1000 * 1000
MODE_TITLES = {
    "store-numpy": "Ray object store, numpy",
    "store-torch": "Ray object store, torch",
    "gloo": "Ray gloo (torch_gloo group)",
    "nixl": "Ray NIXL, CPU",
    "rdt-torch": "rdt, torch",
    "rdt-numpy": "rdt, numpy",
    "floor": "floor: Ray's tensor-transport path, bytes in the metadata",
}
# Each rdt mode against the Ray modes that move the same data type.
RATIOS = [
    ("rdt-torch", "store-torch"),
    ("rdt-torch", "gloo"),
    ("rdt-torch", "nixl"),
    ("rdt-numpy", "store-numpy"),
    ("floor", "store-torch"),
    ("rdt-torch", "floor"),
]
OBJECT_STORE_BYTES = 4 * GIB
CALL_TIMEOUT_S = 180
MODE_TIMEOUT_S = 600


def log(msg: str) -> None:
    print(f"[ray_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def reps_for(size: int, quick: bool) -> tuple:
    """(warm-up runs, measured runs) for one cell."""
    if size >= GIB:
        return (0, 1) if quick else (0, 3)  # the median of 3 drops the cold first run
    if size >= 64 * MIB:
        return (1, 2) if quick else (1, 7)
    return (2, 5) if quick else (3, 30)


# ---------------------------------------------------------------- the floor

def _floor_transport():
    """A Ray tensor transport that moves nothing of its own: the tensors'
    bytes ride in the metadata, so its receive contacts no other process.
    Whatever it costs is what Ray's tensor-transport path costs any
    transport."""
    import torch
    from dataclasses import dataclass
    from ray.experimental.rdt.tensor_transport_manager import (CommunicatorMetadata, TensorTransportManager,
                                                               TensorTransportMetadata)

    @dataclass
    class FloorMetadata(TensorTransportMetadata):
        payload: tuple = ()

    class FloorTransport(TensorTransportManager):
        def tensor_transport_backend(self):
            return "FLOOR"

        @staticmethod
        def is_one_sided():
            return True

        @staticmethod
        def can_abort_transport():
            return True

        def actor_has_tensor_transport(self, actor):
            return True

        def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
            return CommunicatorMetadata()

        def extract_tensor_transport_metadata(self, obj_id, rdt_object):
            return FloorMetadata(tensor_meta=[(t.shape, t.dtype) for t in rdt_object], tensor_device="cpu",
                                 payload=tuple(t.contiguous().view(torch.uint8).numpy().tobytes()
                                               for t in rdt_object))

        def recv_multiple_tensors(self, obj_id, meta, communicator_metadata, target_buffers=None):
            return [torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dtype).reshape(shape)
                    for b, (shape, dtype) in zip(meta.payload, meta.tensor_meta)]

        def send_multiple_tensors(self, tensors, meta, communicator_metadata):
            # Ray's interface requires it; Ray calls it only for two-sided
            # transports, and this one is one-sided.
            raise NotImplementedError("the floor transport is one-sided: Ray never calls send")

        def garbage_collect(self, obj_id, meta, tensors):
            pass

        def abort_transport(self, obj_id, communicator_metadata):
            pass

    return FloorTransport


def register_floor() -> None:
    """Registers the floor transport (in the driver, and in every worker as
    its setup hook)."""
    import torch
    import ray.experimental
    ray.experimental.register_tensor_transport("FLOOR", ["cpu"], _floor_transport(), torch.Tensor)


# ---------------------------------------------------------------- one mode

def run_mode(mode: str, quick: bool, sizes: list) -> dict:
    """Runs in the child process: one Ray session, every cell of one mode."""
    import numpy as np
    import ray

    transport, data = MODES[mode]
    runtime_env = {}
    rdt_ray = None
    if transport == "RDT":
        try:
            import rdt.ray as rdt_ray
        except Exception as e:  # the mode is reported, the run goes on
            return {"unavailable": f"cannot import rdt.ray: {e}"}
        kwargs = {"data_type": np.ndarray} if data == "numpy" else {}
        runtime_env = rdt_ray.runtime_env(**kwargs)
    if transport == "FLOOR":
        runtime_env = {"worker_process_setup_hook": register_floor}
    if transport == "nixl":
        try:
            import nixl._api  # noqa: F401  (Ray imports it in its workers)
        except Exception as e:
            return {"unavailable": f"cannot import nixl: {e}"}
    # Workers inherit this environment from the raylet; say it explicitly
    # too, since a runtime_env replaces the job's environment variables.
    env_vars = dict(runtime_env.get("env_vars", {}))
    for key in ("PYTHONPATH", "RDT_LIBRARY"):
        if os.environ.get(key):
            env_vars.setdefault(key, os.environ[key])
    if env_vars:
        runtime_env = {**runtime_env, "env_vars": env_vars}

    ray.init(address="local", num_cpus=2, object_store_memory=OBJECT_STORE_BYTES,
             include_dashboard=False, log_to_driver=False,
             runtime_env=runtime_env or None)
    try:
        if rdt_ray is not None:
            with warnings.catch_warnings():  # the numpy caveat: known, and measured here
                warnings.simplefilter("ignore", UserWarning)
                rdt_ray.register(**kwargs)
        if transport == "FLOOR":
            register_floor()
        return measure(mode, transport, data, quick, sizes)
    finally:
        ray.shutdown()


def measure(mode: str, transport, data: str, quick: bool, sizes: list) -> dict:
    import numpy as np
    import ray

    def make(nbytes: int):
        n = nbytes // 4
        if data == "numpy":
            return np.full(n, 1.0, dtype=np.float32)
        import torch
        return torch.full((n,), 1.0, dtype=torch.float32)

    def touch(x, how: str) -> float:
        # The object store hands numpy out zero-copy and read-only; both
        # receivers are honest on every mode: one element, or a sum over all.
        return float(x[0]) if how == "one" else float(x.sum())

    # The receiver needs the tensor-transport machinery too (its fetch runs
    # in Ray's system concurrency groups); Ray enables it by itself only on
    # classes with a decorated method.
    remote = ray.remote(num_cpus=0, enable_tensor_transport=transport is not None)

    @remote
    class Source:
        def prepare(self, nbytes: int) -> None:
            self.buf = None
            self.nbytes = nbytes
            self.buf = make(nbytes)

        def drop(self) -> None:
            self.buf = None

        def produce(self, fresh: bool):
            # fresh: a new tensor, written once (as a producer computes it).
            return make(self.nbytes) if fresh else self.buf

        if transport is not None:
            produce = ray.method(tensor_transport=transport)(produce)

    @remote
    class Sink:
        def consume(self, x, how: str) -> float:
            return touch(x, how)

    src, dst = Source.remote(), Sink.remote()
    if transport == "gloo":
        from ray.experimental.collective import create_collective_group
        create_collective_group([src, dst], backend="torch_gloo")

    results = {}
    for size in sizes:
        if transport == "FLOOR" and size > FLOOR_MAX:
            continue
        ray.get(src.prepare.remote(size), timeout=CALL_TIMEOUT_S)
        want = {"one": 1.0, "all": float(size // 4)}
        warm, reps = reps_for(size, quick)
        for path in PATHS:
            if path == "driver" and transport == "gloo":
                continue  # two-sided: the driver is not in the group
            for source in SOURCES:
                for how in RECEIVERS:
                    key = f"{size}|{path}|{source}|{how}"
                    times = []
                    try:
                        for i in range(warm + reps):
                            t0 = time.perf_counter()
                            ref = src.produce.remote(source == "fresh")
                            if path == "actor":
                                got = ray.get(dst.consume.remote(ref, how), timeout=CALL_TIMEOUT_S)
                            else:
                                x = ray.get(ref, timeout=CALL_TIMEOUT_S)
                                got = touch(x, how)
                                del x
                            dt = time.perf_counter() - t0
                            del ref
                            if abs(got - want[how]) > 1e-3 * want[how]:
                                raise AssertionError(f"received {got}, want {want[how]}")
                            if i >= warm:
                                times.append(dt)
                        results[key] = {"median": statistics.median(times), "n": len(times)}
                        log(f"{mode:11s} {SIZE_NAMES[size]:>6s} {path:6s} {source:8s} {how:3s} "
                            f"{fmt_time(results[key]['median'])} ({len(times)} runs)")
                    except Exception as e:
                        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                        results[key] = {"error": f"{type(e).__name__}: {first[:200]}"}
                        log(f"{mode:11s} {SIZE_NAMES[size]:>6s} {path:6s} {source:8s} {how:3s} "
                            f"FAILED {results[key]['error']}")
        ray.get(src.drop.remote(), timeout=CALL_TIMEOUT_S)
    return {"cells": results}


# ---------------------------------------------------------------- machine limits

def machine_limits() -> dict:
    """memcpy and read-every-byte (sum) bandwidth on this machine, GB/s, best of 3."""
    import numpy as np
    import torch
    torch.set_num_threads(1)  # Ray runs actors with one OpenMP thread
    out = {}
    for size in (64 * MIB, GIB):
        a = np.full(size // 4, 1.0, dtype=np.float32)
        b = np.empty_like(a)
        b.fill(0)
        t = torch.from_numpy(a)
        best = {"memcpy": 1e9, "sum numpy": 1e9, "sum torch": 1e9}
        for _ in range(3):
            for name, fn in (("memcpy", lambda: np.copyto(b, a)),
                             ("sum numpy", lambda: a.sum()),
                             ("sum torch", lambda: t.sum())):
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        out[size] = {k: size / v / 1e9 for k, v in best.items()}
        del a, b, t
    return out


# ---------------------------------------------------------------- report

def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_cell(size: int, cell) -> str:
    if cell is None:
        return "—"
    if "error" in cell:
        return "failed"
    s = cell["median"]
    if size >= MB:
        return f"{fmt_time(s)} ({size / s / 1e9:.2f} GB/s)"
    return fmt_time(s)


def ratio(results: dict, fast: str, slow: str, key: str):
    a = results.get(fast, {}).get("cells", {}).get(key)
    b = results.get(slow, {}).get("cells", {}).get(key)
    if not a or not b or "median" not in a or "median" not in b:
        return None
    return b["median"] / a["median"]


def fmt_ratio(r) -> str:
    return "—" if r is None else f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def report(results: dict, limits: dict, quick: bool, elapsed: float) -> str:
    lines = []
    w = lines.append
    w("# rdt inside Ray: benchmark results\n")
    w(textwrap.fill(
        "Written by `make bench-ray` (bench/ray_bench.py). Ray benchmark: two actors on one host, "
        "a source and a receiver; every mode runs in a fresh Ray session in its own process "
        "(Ray's serializer hook for a transport's data type is process-global). Modes: Ray's "
        "object store with numpy arrays and with torch tensors (plain actor methods), Ray's gloo "
        "transport (a `torch_gloo` collective group and `@ray.method(tensor_transport=\"gloo\")`), "
        "Ray's NIXL transport on CPU (`tensor_transport=\"nixl\"`, UCX over shared memory), and "
        "rdt as a Ray tensor transport (`rdt.ray`, `tensor_transport=\"RDT\"`) with torch tensors "
        "and with numpy arrays. The floor is what Ray's tensor-transport path costs any transport: a "
        "transport that carries the bytes inside its metadata, so its receive asks no one (up to "
        "1 MB). Data is float32. Actor to actor: the driver calls "
        "`sink.consume.remote(source.produce.remote(...))` and waits for the result; actor to "
        "driver: the driver calls `ray.get` on the source's ref and reads the value itself (gloo "
        "is two-sided and cannot serve the driver). A preallocated source returns the same tensor "
        "every time; a fresh source returns a newly allocated tensor it has just written (so "
        "every mode pays that write). The receiver touches one element, or reads every byte (a "
        "sum). Each number is the median wall time of the whole call as the driver sees it, "
        "task round trips included, after warm-up runs (none at 1 GiB, where the median of 3 "
        "drops the cold first run); GB/s is bytes over that time. Ratios are speed-ups of rdt "
        "over the Ray mode moving the same data type, for the same cell, measured in this run.",
        width=100))
    w("")
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f", {int(f.readline().split()[1]) / (1 << 20):.1f} GiB"
    except OSError:
        pass
    import numpy
    import ray
    versions = f"ray {ray.__version__}, numpy {numpy.__version__}"
    try:
        import torch
        versions += f", torch {torch.__version__}"
    except ImportError:
        pass
    w(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores{mem}, "
      f"Linux {platform.release()}. {versions}. {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
      f"whole run {elapsed / 60:.1f} min{' (--quick: fewer runs per cell)' if quick else ''}.\n")

    w("## Machine limits, measured in this run (GB/s, one core, best of 3)\n")
    w("| size | memcpy | sum, numpy | sum, torch |\n|---|---|---|---|")
    for size, v in limits.items():
        w(f"| {SIZE_NAMES[size]} | {v['memcpy']:.2f} | {v['sum numpy']:.2f} | {v['sum torch']:.2f} |")
    w("\nA receiver that reads every byte cannot beat its sum's bandwidth; every transfer "
      "that lands in new memory is bounded by memcpy.\n")

    unavailable = [m for m in MODES if "unavailable" in results.get(m, {})]
    if unavailable:
        w("## Modes not measured\n")
        for m in unavailable:
            w(f"- {MODE_TITLES[m]}: unavailable: {results[m]['unavailable']}")
        w("")

    for path in PATHS:
        for source in SOURCES:
            for how in RECEIVERS:
                w(f"## {'Actor to actor' if path == 'actor' else 'Actor to driver'}, "
                  f"{'preallocated' if source == 'prealloc' else 'fresh'} source, receiver "
                  f"{'touches one element' if how == 'one' else 'reads every byte'}\n")
                w("| size | " + " | ".join(MODE_TITLES[m] for m in MODES) + " | "
                  + " | ".join(f"{a} vs {b}" for a, b in RATIOS)
                  + " |")
                w("|---" * (1 + len(MODES) + len(RATIOS)) + "|")
                for size in SIZES:
                    key = f"{size}|{path}|{source}|{how}"
                    cells = []
                    for m in MODES:
                        r = results.get(m, {})
                        if "unavailable" in r:
                            cells.append("unavailable")
                        elif m == "gloo" and path == "driver":
                            cells.append("n/a (two-sided)")
                        else:
                            cells.append(fmt_cell(size, r.get("cells", {}).get(key)))
                    rs = [fmt_ratio(ratio(results, a, b, key)) for a, b in RATIOS]
                    w(f"| {SIZE_NAMES[size]} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")
                w("")

    errors = [(m, k, c["error"]) for m in MODES for k, c in results.get(m, {}).get("cells", {}).items()
              if "error" in c]
    if errors:
        w("## Failed cells\n")
        for m, k, e in errors:
            size, path, source, how = k.split("|")
            w(f"- {MODE_TITLES[m]}, {SIZE_NAMES[int(size)]}, {path}, {source}, {how}: {e}")
        w("")

    w("## Targets\n")
    w("| target | measured (prealloc/one, prealloc/all, fresh/one, fresh/all) | met |\n|---|---|---|")

    def target(label: str, keys: list, fast: str, slow: str, need: float) -> None:
        rs = [ratio(results, fast, slow, k) for k in keys]
        got = [r for r in rs if r is not None]
        met = "not measured" if not got else "yes" if len(got) == len(rs) and all(r >= need for r in got) \
            else f"**no** ({sum(r >= need for r in got)} of {len(rs)})"
        w(f"| {label} | {' / '.join(fmt_ratio(r) for r in rs)} | {met} |")

    combos = [(s, h) for s in SOURCES for h in RECEIVERS]
    for size in (64 * MIB, GIB):
        keys = [f"{size}|actor|{s}|{h}" for s, h in combos]
        for slow, need in (("store-torch", 20), ("gloo", 5), ("nixl", 10)):
            target(f"rdt torch ≥ {need}x {MODE_TITLES[slow]}, {SIZE_NAMES[size]} actor to actor",
                   keys, "rdt-torch", slow, need)
    for path in PATHS:
        keys = [f"4|{path}|{s}|{h}" for s, h in combos]
        for fast, slow in (("rdt-torch", "store-torch"), ("rdt-numpy", "store-numpy")):
            target(f"{MODE_TITLES[fast]} no slower than {MODE_TITLES[slow]}, 4 B actor to {path}",
                   keys, fast, slow, 1.0)
    for path in PATHS:
        keys = [f"{GIB}|{path}|{s}|all" for s in SOURCES]
        rs = [ratio(results, "rdt-numpy", "store-numpy", k) for k in keys]
        got = [r for r in rs if r is not None]
        met = "not measured" if not got else "yes" if len(got) == len(rs) and all(r >= 1 for r in got) \
            else f"**no** ({sum(r >= 1 for r in got)} of {len(rs)})"
        w(f"| rdt numpy ≥ Ray object store numpy, receiver reads every byte, 1 GiB actor to {path} "
          f"| {fmt_ratio(rs[0])} (prealloc) / {fmt_ratio(rs[1])} (fresh) | {met} |")
    w("")
    return "\n".join(lines)


# ---------------------------------------------------------------- driver

NIXL_SHIM = """\
# The nixl meta package's import name, over the unpacked nixl-cu12 wheel.
import sys
import nixl_cu12
import nixl_cu12._api
sys.modules[__name__ + "._api"] = nixl_cu12._api
from nixl_cu12 import *  # noqa: F401,F403
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the Markdown report here (default: stdout)")
    ap.add_argument("--nixl-dir", default=os.environ.get("RDT_BENCH_NIXL_DIR", "build/nixl"),
                    help="the unpacked nixl-cu12 wheel, for Ray's NIXL mode")
    ap.add_argument("--quick", action="store_true", help="fewer runs per cell (a smoke run)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--max-size", type=int, default=GIB, help="skip sizes above this many bytes")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [s for s in SIZES if s <= args.max_size]

    if args.child:
        try:
            res = run_mode(args.child, args.quick, sizes)
        except Exception as e:
            res = {"unavailable": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"}
        with open(args.result, "w") as f:
            json.dump(res, f)
        return

    started = time.time()
    log("machine limits (memcpy, sum)")
    limits = machine_limits()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ray_bench_") as tmp:
        os.makedirs(os.path.join(tmp, "nixl"))
        with open(os.path.join(tmp, "nixl", "__init__.py"), "w") as f:
            f.write(NIXL_SHIM)
        for mode in args.modes.split(","):
            env = dict(os.environ)
            if MODES[mode][0] == "nixl":
                paths = [tmp, os.path.abspath(args.nixl_dir)]
                if env.get("PYTHONPATH"):
                    paths.append(env["PYTHONPATH"])
                env["PYTHONPATH"] = os.pathsep.join(paths)
            result_file = os.path.join(tmp, f"{mode}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--result", result_file,
                   "--max-size", str(args.max_size)] + (["--quick"] if args.quick else [])
            log(f"mode {mode}: fresh Ray session")
            t0 = time.time()
            try:
                proc = subprocess.run(cmd, env=env, timeout=MODE_TIMEOUT_S, stdout=subprocess.DEVNULL)
                with open(result_file) as f:
                    results[mode] = json.load(f)
            except subprocess.TimeoutExpired:
                results[mode] = {"unavailable": f"did not finish within {MODE_TIMEOUT_S} s"}
            except (OSError, ValueError):
                results[mode] = {"unavailable": f"the mode's process exited with {proc.returncode}"}
            if "unavailable" in results[mode]:
                log(f"mode {mode}: unavailable: {results[mode]['unavailable']}")
            log(f"mode {mode}: done in {time.time() - t0:.0f} s")
    text = report(results, limits, args.quick, time.time() - started)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        log(f"wrote {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
