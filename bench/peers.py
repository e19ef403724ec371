"""rdt against the libraries users would pick instead (`make bench-peers`).

    python bench/peers.py --rdtbench build/rdtbench --out bench/PEERS.md
    python bench/peers.py --rdtbench build/rdtbench --quick      # a smoke run

Every system moves the same shapes from a source process to a receiving
process on this host: one tensor of 4 KiB, 1 MiB, 64 MiB and 1 GiB, and one
object of 1,024 x 4 KiB and of 4,096 x 64 KiB tensors. Each peer runs in a
process pair of its own (this file, started again with --peer NAME, which
spawns its source), used as its own documentation recommends:

- Mooncake Transfer Engine, tcp protocol, P2P handshake (no metadata
  server): both sides register their buffers once; a read is
  transfer_sync_read, many tensors one batch_transfer_sync_read (its queue
  per peer raised with MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER: the default
  refuses a batch of 4,096).
- NIXL used directly through its Python API (UCX backend): buffers
  registered once, one transfer handle per shape made once and re-posted.
- torch.distributed send/recv over gloo (CPU tensors): the receiver sends a
  one-element request, the source answers with send (many tensors with
  batch_isend_irecv).
- multiprocessing.shared_memory: one segment per shape made once; per fetch
  the source copies its arrays in with numpy and the receiver copies them
  out.
- pickle over a multiprocessing pipe: the source sends the array (or the
  list of arrays), the receiver unpickles.

rdt's rows come from `rdtbench row` (the C ABI, the source in a second
process): rdt's automatic choice, and cma, shm and tcp by name. rdt is
measured from Python too, the way the Python peers are: the source puts each
shape as one object and hands its pickled ref over the pipe, the receiver
gets it into its arrays with `rdt.get(ref, out=...)`, or runs a get it
prepared once (`rdt.prepare_get`), as NIXL's handle is re-posted. Every
figure is the median time of one whole fetch into buffers the receiver has
touched before; the first fetch of each shape checks the bytes and is not
timed. A peer that cannot be installed or run gets a row saying why.
"""

import argparse
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# (count, bytes per tensor, timed runs)
SHAPES = [(1, 4 * KIB, 300), (1, MIB, 40), (1, 64 * MIB, 8), (1, GIB, 3),
          (1024, 4 * KIB, 10), (4096, 64 * KIB, 3)]
QUICK_SHAPES = [(1, 4 * KIB, 3), (1, 64 * KIB, 3), (8, 4 * KIB, 3)]
# rdt from Python: (transport or None for the automatic choice, prepared).
RDT_PY_PEERS = {"rdt-py-auto": (None, False), "rdt-py-tcp": ("tcp", False), "rdt-py-prepared": (None, True)}
PEERS = ["mooncake", "nixl", "gloo", "shared_memory", "pickle"] + list(RDT_PY_PEERS)
PEER_TITLES = {
    "rdt-py-auto": "rdt from Python, automatic choice",
    "rdt-py-tcp": "rdt from Python, tcp",
    "rdt-py-prepared": "rdt from Python, automatic choice, prepared",
    "mooncake": "Mooncake Transfer Engine, tcp",
    "nixl": "NIXL (UCX), used directly",
    "gloo": "torch.distributed gloo send/recv",
    "shared_memory": "multiprocessing.shared_memory + numpy copies",
    "pickle": "pickle over a multiprocessing pipe",
}
RDT_ROWS = ["auto", "cma", "shm", "tcp"]
# Writes (push): one tensor from the receiver's buffer into the source's
# registered or exposed one. The peers that write used directly, and rdt's
# transports that write on host memory.
WRITE_SHAPES = [(1, 4 * KIB, 300), (1, 64 * MIB, 8), (1, GIB, 3)]
QUICK_WRITE_SHAPES = [(1, 4 * KIB, 3), (1, 64 * KIB, 3)]
WRITE_PEERS = ["mooncake", "nixl"]
RDT_WRITE_ROWS = ["cma", "tcp", "nixl"]
PEER_TIMEOUT_S = 600


def human(n: int) -> str:
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def shape_name(count: int, size: int) -> str:
    """The name rdtbench row takes: 4KiB, or 1024x4KiB."""
    one = human(size).replace(" ", "")
    return one if count == 1 else f"{count}x{one}"


def shape_title(count: int, size: int) -> str:
    return human(size) if count == 1 else f"{count:,} × {human(size)}"


def parse_shapes(text: str) -> list:
    """'4KiB:300,1024x4KiB:10' -> [(1, 4096, 300), (1024, 4096, 10)]."""
    shapes = []
    for item in text.split(","):
        name, _, runs = item.partition(":")
        count, _, size = name.rpartition("x")
        number = size.rstrip("KMGiB")
        unit = {"": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB}[size[len(number):]]
        shapes.append((int(count or 1), int(number) * unit, int(runs or 3)))
    return shapes


def format_shapes(shapes: list) -> str:
    return ",".join(f"{shape_name(c, s)}:{r}" for c, s, r in shapes)


# ------------------------------------------------------------- the peers
#
# Each peer is a source(conn) function, run in a spawned process, and a
# receiver class with prepare(count, size, info) -> fetch callable. The
# source answers "shape" messages with what the receiver needs and stops
# at "quit". Tensor i of a shape holds the byte (i * 7 + 1) & 255.


def pattern(i: int) -> int:
    return (i * 7 + 1) & 255


def source_arrays(count, size):
    import numpy as np
    block = np.empty(count * size, dtype=np.uint8)
    for i in range(count):
        block[i * size:(i + 1) * size] = pattern(i)
    return block, [block[i * size:(i + 1) * size] for i in range(count)]


def check_arrays(arrays) -> None:
    for i, a in enumerate(arrays):
        if not (a == pattern(i)).all():
            raise RuntimeError(f"tensor {i} arrived corrupted")


def receiver_arrays(count, size):
    import numpy as np
    block = np.empty(count * size, dtype=np.uint8)
    block.fill(0)  # touched before, as the other rows' buffers are
    return block, [block[i * size:(i + 1) * size] for i in range(count)]


def mooncake_engine():
    from mooncake.engine import TransferEngine
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("TransferEngine.initialize failed")
    return engine


def registering_source(conn, register) -> None:
    """The source of a peer that registers each shape's memory with its
    library (Mooncake, NIXL): register(block, count, size) registers a new
    shape's block and returns what the receiver needs and a function that
    unregisters the block. A write lands in zeroed arrays, which a "check"
    after the first write checks."""
    conn.send(("ready", None))
    unregister = arrays = None
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        if msg[0] == "check":  # after the first write: did its bytes land?
            check_arrays(arrays)
            conn.send("ok")
            continue
        if unregister is not None:
            unregister()
        count, size, write = msg[1], msg[2], msg[3]
        held, arrays = (receiver_arrays if write else source_arrays)(count, size)
        info, unregister = register(held, count, size)
        conn.send(info)


def mooncake_source(conn) -> None:
    engine = mooncake_engine()
    target = f"127.0.0.1:{engine.get_rpc_port()}"

    def register(block, count, size):
        if engine.register_memory(block.ctypes.data, block.nbytes) != 0:
            raise RuntimeError("register_memory failed")
        return (target, block.ctypes.data), lambda: engine.unregister_memory(block.ctypes.data)

    registering_source(conn, register)


class MooncakeReceiver:
    def __init__(self):
        self.engine = mooncake_engine()
        self.registered = None

    def prepare(self, count, size, info, write=False):
        target, remote = info
        if self.registered is not None:
            self.engine.unregister_memory(self.registered.ctypes.data)
        block, arrays = (source_arrays if write else receiver_arrays)(count, size)
        self.registered = block
        base = block.ctypes.data
        if self.engine.register_memory(base, block.nbytes) != 0:
            raise RuntimeError("register_memory failed")
        engine = self.engine
        if write:
            def push():
                if engine.transfer_sync_write(target, base, remote, size) != 0:
                    raise RuntimeError("transfer_sync_write failed")
            return push, arrays
        if count == 1:
            def fetch():
                if engine.transfer_sync_read(target, base, remote, size) != 0:
                    raise RuntimeError("transfer_sync_read failed")
        else:
            local = [base + i * size for i in range(count)]
            remotes = [remote + i * size for i in range(count)]
            lengths = [size] * count

            def fetch():
                if engine.batch_transfer_sync_read(target, local, remotes, lengths) != 0:
                    raise RuntimeError("batch_transfer_sync_read failed")
        return fetch, arrays


def nixl_api():
    import nixl_cu12._api as api  # the nixl-cu12 wheel unpacked in build/nixl
    return api


def nixl_source(conn) -> None:
    api = nixl_api()
    agent = api.nixl_agent("peers-source", api.nixl_agent_config(backends=["UCX"]))

    def register(block, count, size):
        base = block.ctypes.data
        reg = agent.register_memory([(base, block.nbytes, 0, "")], "DRAM")
        descs = agent.get_xfer_descs([(base + i * size, size, 0) for i in range(count)], "DRAM")
        return (agent.get_agent_metadata(), agent.get_serialized_descs(descs)), lambda: agent.deregister_memory(reg)

    registering_source(conn, register)


class NixlReceiver:
    def __init__(self):
        self.api = nixl_api()
        self.agent = self.api.nixl_agent("peers-receiver", self.api.nixl_agent_config(backends=["UCX"]))
        self.reg = self.handle = self.block = None

    def prepare(self, count, size, info, write=False):
        metadata, remote_descs = info
        agent = self.agent
        if self.handle is not None:
            agent.release_xfer_handle(self.handle)
        if self.reg is not None:
            agent.deregister_memory(self.reg)
        peer = agent.add_remote_agent(metadata)
        self.block, arrays = (source_arrays if write else receiver_arrays)(count, size)
        base = self.block.ctypes.data
        self.reg = agent.register_memory([(base, self.block.nbytes, 0, "")], "DRAM")
        local = agent.get_xfer_descs([(base + i * size, size, 0) for i in range(count)], "DRAM")
        remote = agent.deserialize_descs(remote_descs)
        self.handle = handle = agent.initialize_xfer("WRITE" if write else "READ", local, remote, peer)

        def fetch():
            state = agent.transfer(handle)
            while state != "DONE":
                if state == "ERR":
                    raise RuntimeError("NIXL transfer failed")
                state = agent.check_xfer_state(handle)
        return fetch, arrays


def gloo_init(rank: int, port: int):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    return dist


def gloo_source(conn) -> None:
    import torch
    port = conn.recv()
    dist = gloo_init(0, port)
    conn.send(("ready", None))
    request = torch.zeros(1, dtype=torch.int64)
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            dist.destroy_process_group()
            return
        count, size = msg[1], msg[2]
        _, arrays = source_arrays(count, size)
        tensors = [torch.from_numpy(a) for a in arrays]
        conn.send(None)
        # One request per fetch until the receiver sends -1.
        while True:
            dist.recv(request, src=1)
            if request.item() < 0:
                break
            if count == 1:
                dist.send(tensors[0], dst=1)
            else:
                ops = [dist.P2POp(dist.isend, t, 1, tag=i) for i, t in enumerate(tensors)]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()


class GlooReceiver:
    def __init__(self, port: int):
        import torch
        self.torch = torch
        self.dist = gloo_init(1, port)
        self.active = False

    def finish_shape(self):
        if self.active:
            self.dist.send(self.torch.tensor([-1], dtype=self.torch.int64), dst=0)
            self.active = False

    def prepare(self, count, size, info):
        torch, dist = self.torch, self.dist
        _, arrays = receiver_arrays(count, size)
        tensors = [torch.from_numpy(a) for a in arrays]
        request = torch.ones(1, dtype=torch.int64)
        self.active = True
        if count == 1:
            def fetch():
                dist.send(request, dst=0)
                dist.recv(tensors[0], src=0)
        else:
            def fetch():
                dist.send(request, dst=0)
                ops = [dist.P2POp(dist.irecv, t, 0, tag=i) for i, t in enumerate(tensors)]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
        return fetch, arrays


def shared_memory_source(conn) -> None:
    import numpy as np
    from multiprocessing import shared_memory
    conn.send(("ready", None))
    segment = None
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            if segment is not None:
                segment.close()
                segment.unlink()
            return
        if msg[0] == "copy":
            for dst, src in zip(views, arrays):
                np.copyto(dst, src)
            conn.send(None)
            continue
        count, size = msg[1], msg[2]
        if segment is not None:
            views = None
            segment.close()
            segment.unlink()
        _, arrays = source_arrays(count, size)
        segment = shared_memory.SharedMemory(create=True, size=count * size)
        flat = np.ndarray(count * size, dtype=np.uint8, buffer=segment.buf)
        views = [flat[i * size:(i + 1) * size] for i in range(count)]
        conn.send(segment.name)


class SharedMemoryReceiver:
    def __init__(self, conn):
        self.conn = conn
        self.segment = None

    def prepare(self, count, size, info):
        import numpy as np
        from multiprocessing import shared_memory
        if self.segment is not None:
            self.segment.close()
        self.segment = shared_memory.SharedMemory(name=info)
        flat = np.ndarray(count * size, dtype=np.uint8, buffer=self.segment.buf)
        views = [flat[i * size:(i + 1) * size] for i in range(count)]
        _, arrays = receiver_arrays(count, size)
        conn = self.conn

        def fetch():
            conn.send(("copy",))
            conn.recv()
            for dst, src in zip(arrays, views):
                np.copyto(dst, src)
        return fetch, arrays


def pickle_source(conn) -> None:
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        if msg[0] == "send":
            conn.send(payload)
            continue
        count, size = msg[1], msg[2]
        payload = None
        _, arrays = source_arrays(count, size)
        payload = arrays[0].copy() if count == 1 else [a.copy() for a in arrays]
        conn.send(None)


class PickleReceiver:
    def __init__(self, conn):
        self.conn = conn

    def prepare(self, count, size, info):
        conn = self.conn
        got = []

        def fetch():
            conn.send(("send",))
            got[:] = [conn.recv()]
        # Unpickling makes new arrays: the check reads what the last fetch got.
        fetch.arrays = lambda: got[0] if count > 1 else [got[0]]
        return fetch, None


def rdt_source(conn, transport) -> None:
    import pickle

    import rdt
    conn.send(("ready", None))
    ref = None
    while True:
        msg = conn.recv()
        if ref is not None:
            ref.close()  # the receiver's borrow, if it still holds one, keeps the object
            ref = None
        if msg[0] == "quit":
            return
        count, size = msg[1], msg[2]
        _, arrays = source_arrays(count, size)
        ref = rdt.put(arrays[0] if count == 1 else arrays, transport=transport)
        conn.send(pickle.dumps(ref))


class RdtReceiver:
    def __init__(self, transport, prepared):
        import rdt
        self.rdt, self.transport, self.prepared = rdt, transport, prepared
        self.held = []

    def prepare(self, count, size, info):
        import pickle
        for h in self.held:
            h.close()
        ref = pickle.loads(info)
        _, arrays = receiver_arrays(count, size)
        out = arrays[0] if count == 1 else arrays
        self.held = [ref]
        if self.prepared:
            p = self.rdt.prepare_get(ref, out=out, transport=self.transport)
            self.held.insert(0, p)
            return p.run, arrays
        get, transport = self.rdt.get, self.transport
        return (lambda: get(ref, out=out, transport=transport)), arrays


SOURCES = {"mooncake": mooncake_source, "nixl": nixl_source, "gloo": gloo_source,
           "shared_memory": shared_memory_source, "pickle": pickle_source}
SOURCES.update({name: functools.partial(rdt_source, transport=t) for name, (t, _) in RDT_PY_PEERS.items()})


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(name: str, shapes: list, write: bool = False) -> dict:
    """The receiving side of one peer: spawns the source, measures every
    shape, returns {shape name: median seconds}. With write, the receiver
    pushes its arrays into the source's (Mooncake and NIXL), and the source
    checks the bytes of the first push."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    source = ctx.Process(target=SOURCES[name], args=(child,), daemon=True)
    source.start()
    receiver = None
    try:
        if name == "gloo":
            port = free_port()
            conn.send(port)
            receiver = GlooReceiver(port)
        conn.recv()  # the source is ready
        if name == "mooncake":
            receiver = MooncakeReceiver()
        elif name == "nixl":
            receiver = NixlReceiver()
        elif name == "shared_memory":
            receiver = SharedMemoryReceiver(conn)
        elif name == "pickle":
            receiver = PickleReceiver(conn)
        elif name in RDT_PY_PEERS:
            receiver = RdtReceiver(*RDT_PY_PEERS[name])
        results = {}
        for count, size, runs in shapes:
            conn.send(("shape", count, size, write))
            if write:
                fetch, _ = receiver.prepare(count, size, conn.recv(), write=True)
                fetch()
                conn.send(("check",))
                if conn.recv() != "ok":
                    raise RuntimeError("the source did not confirm the written bytes")
            else:
                fetch, arrays = receiver.prepare(count, size, conn.recv())
                fetch()
                check_arrays(arrays if arrays is not None else fetch.arrays())
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fetch()
                times.append(time.perf_counter() - t0)
            if name == "gloo":
                receiver.finish_shape()
            results[shape_name(count, size)] = statistics.median(times)
        results["version"] = peer_version(name)
        conn.send(("quit",))
        source.join(30)
        return results
    finally:
        if source.is_alive():
            source.kill()


# ------------------------------------------------------------- the driver


def peer_version(name: str) -> str:
    """The measured library's version, as its process pair sees it."""
    from importlib import metadata
    if name == "gloo":
        import torch
        return f"torch {torch.__version__}"
    if name in RDT_PY_PEERS:
        return f"rdt {metadata.version('rdt')}, Python {platform.python_version()}"
    dist = {"mooncake": "mooncake-transfer-engine-non-cuda", "nixl": "nixl-cu12"}.get(name, "numpy")
    return f"{dist} {metadata.version(dist)}, Python {platform.python_version()}"


def measure_peer(name: str, shapes: list, python: str, env: dict, write: bool = False) -> dict:
    """Runs one peer in a process pair of its own; {"unavailable": why} when
    it cannot be imported or run."""
    cmd = [python, os.path.abspath(__file__), "--peer", name, "--shapes", format_shapes(shapes)] + (["--write"] if write else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"unavailable": f"did not finish in {PEER_TIMEOUT_S} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    # The Python exception's line says why; C++ peers log more after it.
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    why = (errors or lines or ["no output"])[-1]
    return {"unavailable": f"exit status {proc.returncode}: {why[:300]}"}


def rdtbench_row(rdtbench: str, transport: str, shape: str, runs: int, want: tuple):
    """One `rdtbench row` line as its fields, or why it gave none of want
    (a string)."""
    proc = subprocess.run([rdtbench, "row", transport, shape, str(runs)],
                          capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    fields = dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv)
    if proc.returncode == 0 and any(k in fields for k in want):
        return fields
    if fields.get("available") == "no":
        return f"librdt lists no {transport} transport here"
    return f"rdtbench row: exit status {proc.returncode}: {proc.stderr.strip()[-300:]}"


def measure_rdt(rdtbench: str, transport: str, shapes: list) -> dict:
    """rdt's row through `rdtbench row` (C ABI): {shape: seconds, "by": ...}."""
    results, by = {}, set()
    for count, size, runs in shapes:
        fields = rdtbench_row(rdtbench, transport, shape_name(count, size), runs, ("p50_us", "many_ms"))
        if isinstance(fields, str):
            return {"unavailable": fields}
        by.add(fields.get("by", "?"))
        if count == 1:
            results[shape_name(count, size)] = float(fields["p50_us"]) * 1e-6
        else:
            results[shape_name(count, size)] = float(fields["many_ms"]) * 1e-3
    results["by"] = ", ".join(sorted(by))
    return results


def measure_rdt_write(rdtbench: str, transport: str, shapes: list, prepared: bool = False) -> dict:
    """rdt's write row through `rdtbench row T write:SIZE` (C ABI, the owner
    in a second process checking every notice), or with prepared its
    prepared writes (`rdtbench row T prepared:SIZE`: `rdt_prepare_write`
    once, then `rdt_prepared_run`, as a re-posted NIXL handle is used):
    {shape: seconds}."""
    kind, field = ("prepared:", "prepared_write_p50_us") if prepared else ("write:", "write_p50_us")
    results = {}
    for count, size, runs in shapes:
        fields = rdtbench_row(rdtbench, transport, kind + shape_name(count, size), runs, (field,))
        if isinstance(fields, str):
            return {"unavailable": fields}
        results[shape_name(count, size)] = float(fields[field]) * 1e-6
    results["by"] = transport
    return results


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def machine_line() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) / (1024 * 1024)
    except OSError:
        mem = 0.0
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"Machine: {model}, {os.cpu_count()} cores, {mem:.1f} GiB, Linux {platform.release()} "
            f"({platform.machine()}), Python {platform.python_version()}. {date}.")


def times_table(w, shapes: list, rows: dict, label) -> None:
    """Writes (through w) a table of each system's time and GB/s per shape;
    label(title, result) names a row."""
    names = [shape_name(c, s) for c, s, _ in shapes]
    sizes = {shape_name(c, s): c * s for c, s, _ in shapes}
    w("| system | " + " | ".join(shape_title(c, s) for c, s, _ in shapes) + " |")
    w("|---|" + "---|" * len(shapes))
    for title, res in rows.items():
        if "unavailable" in res:
            w(f"| {title} | not measured: {res['unavailable']} |" + " |" * (len(shapes) - 1))
            continue
        w(f"| {label(title, res)} | " + " | ".join(
            f"{fmt_time(res[n])}<br>{sizes[n] / res[n] / 1e9:.2f} GB/s" if n in res else "" for n in names) + " |")
    w("")


def report(shapes: list, rows: dict) -> str:
    names = [shape_name(c, s) for c, s, _ in shapes]
    lines = []
    w = lines.append
    w("# rdt against the libraries users would pick instead\n")
    w("Written by `make bench-peers` (bench/peers.py).\n")
    w(machine_line() + "\n")
    w("Method: the source and the receiver are separate processes on this host, one process pair per "
      "system. Every cell is the median time of one whole fetch (the receiver asks, the bytes land in "
      "buffers it touched before), with GB/s beneath; the first fetch of each shape checks the bytes and "
      "is not timed. rdt's rows are `rdtbench row` (the C ABI, source in a second process; the "
      "transport that moved the bytes in brackets). The peers are driven from Python, each as its "
      "documentation recommends: Mooncake Transfer Engine over its tcp protocol with the P2P handshake, "
      "buffers registered once, one `batch_transfer_sync_read` for many tensors "
      "(`MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER=8192`, since its default queue refuses a batch of 4,096); NIXL's Python API with "
      "the UCX backend, buffers registered once, one transfer handle per shape re-posted; "
      "`torch.distributed` over gloo, a one-element request then `recv` (`batch_isend_irecv` for many "
      "tensors); `multiprocessing.shared_memory`, the source copying its arrays in with numpy on request "
      "and the receiver copying them out; pickle over a `multiprocessing` pipe. Runs per shape: "
      + ", ".join(f"{shape_title(c, s)} {r}" for c, s, r in shapes) + ".\n")
    w("## Time per fetch\n")
    times_table(w, shapes, rows, lambda title, res: f"{title} ({res['by']})" if res.get("by")
                else f"{title} ({res['version']})")
    rdt_auto, rdt_tcp = rows.get("rdt, automatic choice", {}), rows.get("rdt, tcp", {})
    py = {which: rows.get(PEER_TITLES[name], {}) for which, name in (
        ("automatic, from Python", "rdt-py-auto"), ("tcp, from Python", "rdt-py-tcp"),
        ("automatic, prepared, from Python", "rdt-py-prepared"))}
    w("## rdt's speed over each peer's (peer time / rdt time; above 1: rdt is faster)\n")
    w("rdt through the C ABI, and from Python as the peers are driven.\n")
    w("| peer | rdt | " + " | ".join(shape_title(c, s) for c, s, _ in shapes) + " |")
    w("|---|---|" + "---|" * len(shapes))
    peers = [t for t in rows if not t.startswith("rdt")]
    for peer in peers:
        measured = [(which, res) for which, res in py.items() if res and "unavailable" not in res]
        for which, res in (("automatic", rdt_auto), ("tcp", rdt_tcp), *measured):
            cells = [f"{rows[peer][n] / res[n]:.2f}x" if n in rows[peer] and n in res else "–" for n in names]
            w(f"| {peer} | {which} | " + " | ".join(cells) + " |")
    w("")

    def ratio(peer_title, rdt_res, n):
        peer = rows.get(peer_title, {})
        return peer[n] / rdt_res[n] if n in peer and n in rdt_res else None

    def target(desc, values, want):
        shown = " / ".join("–" if v is None else f"{v:.2f}x" for v in values)
        met = all(v is not None and v >= want for v in values)
        w(f"| {desc} | {shown} | {'yes' if met else '**no**'} |")

    w("## Targets\n")
    w("| target | measured | met |\n|---|---|---|")
    big = [n for n in ("64MiB", "1GiB") if n in names]
    if big:
        mc, nx = PEER_TITLES["mooncake"], PEER_TITLES["nixl"]
        target(f"rdt over tcp >= 1.5x Mooncake's tcp at {' and '.join(big)}",
               [ratio(mc, rdt_tcp, n) for n in big], 1.5)
        target(f"rdt's automatic choice >= 5x Mooncake's tcp at {' and '.join(big)}",
               [ratio(mc, rdt_auto, n) for n in big], 5)
        target(f"rdt's automatic choice >= 2x NIXL used directly at {' and '.join(big)}",
               [ratio(nx, rdt_auto, n) for n in big], 2)
    if "64MiB" in names:
        target("rdt (automatic) >= 5x gloo at 64 MiB", [ratio(PEER_TITLES["gloo"], rdt_auto, "64MiB")], 5)
        target("rdt (automatic) >= 2x the shared-memory copy at 64 MiB",
               [ratio(PEER_TITLES["shared_memory"], rdt_auto, "64MiB")], 2)
    if "4KiB" in names:
        # At most half the latency is at least 2x the speed.
        target("rdt tcp 4 KiB latency <= half of Mooncake's tcp latency",
               [ratio(PEER_TITLES["mooncake"], rdt_tcp, "4KiB")], 2)
    w("\nA peer's row that says \"not measured\" counts as not met.")
    return "\n".join(lines) + "\n"


def peer_env(name: str, base_env: dict, args) -> dict:
    """The environment peer name's process pair runs in."""
    env = dict(base_env)
    if name == "nixl":
        env["PYTHONPATH"] = os.path.abspath(args.nixl_dir) + os.pathsep + env.get("PYTHONPATH", "")
    if name == "mooncake":
        # Its tcp transport queues at most a few thousand transfers per
        # peer by default and fails a batch of 4,096; this is its knob.
        env.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "8192")
        env["LD_LIBRARY_PATH"] = os.path.abspath(os.path.join(args.mooncake_libs, "lib")) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return env


def write_report(shapes: list, rows: dict) -> str:
    """The writes section: a table of times, then each peer against rdt's
    transports."""
    if not shapes:
        return ""
    names = [shape_name(c, s) for c, s, _ in shapes]
    lines = []
    w = lines.append
    w("\n## Writes (push)\n")
    w("One tensor from the writer's buffer into the owner's, which registered (Mooncake, NIXL) or exposed "
      "(rdt) it once. rdt's rows are `rdtbench row T write:SIZE`: `rdt_write` returns once every byte "
      "landed, and the owner, a second process, takes and checks each write's notice and the bytes of the "
      "last; its *prepared* rows (`rdtbench row T prepared:SIZE`) prepare the write once and run it again "
      "and again (`rdt_prepared_run`), as the peers re-post theirs. The peers' rows are `transfer_sync_write` (Mooncake, tcp) and a re-posted NIXL WRITE handle, "
      "driven from Python, the owner checking the bytes of the first write. Median of "
      + ", ".join(f"{shape_title(c, s)} {r}" for c, s, r in shapes) + " writes.\n")
    times_table(w, shapes, rows, lambda title, res: title if res.get("by") else f"{title} ({res['version']})")
    w("Peer time over rdt time (above 1: rdt is faster):\n")
    w("| peer | rdt | " + " | ".join(shape_title(c, s) for c, s, _ in shapes) + " |")
    w("|---|---|" + "---|" * len(shapes))
    for peer in [t for t in rows if not t.startswith("rdt")]:
        for rdt_title in [t for t in rows if t.startswith("rdt")]:
            res = rows[rdt_title]
            cells = [f"{rows[peer][n] / res[n]:.2f}x" if n in rows[peer] and n in res else "–" for n in names]
            w(f"| {peer} | {rdt_title[5:]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rdtbench", default="build/rdtbench", help="the C benchmark, for rdt's rows")
    ap.add_argument("--out", help="write the Markdown table here (default: stdout only)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 3 runs each (a smoke run)")
    ap.add_argument("--shapes", help="comma-separated SHAPE:RUNS, e.g. 4KiB:300,1024x4KiB:10")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    ap.add_argument("--rdt", default=",".join(RDT_ROWS), help="rdt's rows: comma-separated subset of "
                    + ",".join(RDT_ROWS) + ", or none")
    ap.add_argument("--torch-python", default=sys.executable,
                    help="a Python with torch, for the gloo peer (default: this one)")
    ap.add_argument("--nixl-dir", default="build/nixl", help="the unpacked nixl-cu12 wheel")
    ap.add_argument("--mooncake-libs", default="build/bench-libs",
                    help="where tools/bench-peers-libs.sh unpacked libibverbs (DIR/lib), or said why not (DIR/why)")
    ap.add_argument("--write-shapes", help="the write rows' shapes, SIZE:RUNS (one tensor each), or none")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    shapes = parse_shapes(args.shapes) if args.shapes else QUICK_SHAPES if args.quick else SHAPES
    if args.peer:
        print(json.dumps(run_peer(args.peer, shapes, args.write)))
        return
    if args.write_shapes == "none":
        write_shapes = []
    else:
        write_shapes = (parse_shapes(args.write_shapes) if args.write_shapes
                        else QUICK_WRITE_SHAPES if args.quick else WRITE_SHAPES)

    why_not = {}
    libs_why = os.path.join(args.mooncake_libs, "why")
    if os.path.exists(libs_why):
        with open(libs_why) as f:
            why_not["mooncake"] = "Debian's libibverbs1, which its engine.so links, could not be unpacked: " + f.read().strip()
    rows = {}
    for transport in [t for t in args.rdt.split(",") if t and t != "none"]:
        title = "rdt, automatic choice" if transport == "auto" else f"rdt, {transport}"
        print(f"measuring {title}", file=sys.stderr, flush=True)
        rows[title] = measure_rdt(args.rdtbench, transport, shapes)
    base_env = dict(os.environ)
    for name in [p for p in args.peers.split(",") if p]:
        title = PEER_TITLES[name]
        print(f"measuring {title}", file=sys.stderr, flush=True)
        if name in why_not:
            rows[title] = {"unavailable": why_not[name]}
            continue
        python = args.torch_python if name == "gloo" or name in RDT_PY_PEERS else sys.executable
        rows[title] = measure_peer(name, shapes, python, peer_env(name, base_env, args))
    write_rows = {}
    # --rdt none leaves out rdt's write rows too.
    rdt_writes = RDT_WRITE_ROWS if write_shapes and args.rdt.split(",") != ["none"] else []
    for transport in rdt_writes:
        print(f"measuring rdt's writes over {transport}", file=sys.stderr, flush=True)
        write_rows[f"rdt, {transport}"] = measure_rdt_write(args.rdtbench, transport, write_shapes)
        write_rows[f"rdt, {transport}, prepared"] = measure_rdt_write(args.rdtbench, transport, write_shapes, prepared=True)
    for name in [p for p in args.peers.split(",") if p in WRITE_PEERS] if write_shapes else []:
        title = PEER_TITLES[name]
        print(f"measuring {title}'s writes", file=sys.stderr, flush=True)
        if name in why_not:
            write_rows[title] = {"unavailable": why_not[name]}
            continue
        write_rows[title] = measure_peer(name, write_shapes, sys.executable, peer_env(name, base_env, args), write=True)
    text = report(shapes, rows) + write_report(write_shapes, write_rows)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
