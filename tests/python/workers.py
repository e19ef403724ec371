"""Code that runs in spawned child processes (importable by name)."""

import collections
import importlib
import os
import pickle
import time

import numpy as np

import rdt

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]

Point = collections.namedtuple("Point", "x y")


def dtype_arrays():
    """Every dtype numpy and DLPack share, plus 0-d and empty arrays."""
    out = {}
    for i, name in enumerate(DTYPES):
        a = (np.arange(24, dtype=np.int64).reshape(2, 3, 4) * (i + 3)) % 7 - 2
        if name.startswith("complex"):
            out[name] = (a + 1j * (a + 1)).astype(name)
        elif name == "bool":
            out[name] = a > 0
        else:
            out[name] = a.astype(name)
    out["zero_d"] = np.array(3.5)
    out["zero_d_int"] = np.array(-7, dtype=np.int32)
    out["empty"] = np.zeros((0, 5), dtype=np.float32)
    out["empty_1d"] = np.zeros((0,), dtype=np.int64)
    return out


def nested_value():
    return {"a": [np.ones(3), (np.arange(4), "text", 7)], "b": {"c": np.full((2, 2), 9.0)}, "d": None,
            "p": Point(np.int8(1), np.arange(2, dtype=np.uint16)),
            "o": collections.OrderedDict(z=np.zeros(1), y=b"bytes"), "scalar": np.float64(0.5)}


def make_values(what):
    if what == "dtypes":
        return [{"name": k, "tensor": v} for k, v in dtype_arrays().items()]
    if what == "nested":
        return [nested_value()]
    if what == "dlpack":
        import transports_for_tests as tt
        return [tt.DLPackOnly(np.arange(12, dtype=np.int32).reshape(3, 4)),
                tt.ArrayInterfaceOnly(np.arange(6, dtype=np.float32))]
    if what == "torch":
        import torch
        return [{"f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                 "bf16": torch.arange(6, dtype=torch.bfloat16), "i64": torch.tensor(7),
                 "np": np.arange(3)}]
    if what in ("cuda_torch", "cuda_torch_device_only"):
        import torch
        value = {"f32": torch.arange(1 << 20, dtype=torch.float32, device="cuda:0").reshape(1024, 1024),
                 # two tensors in one caching-allocator block, at an offset
                 "pair": list(torch.arange(2048, dtype=torch.int64, device="cuda:0").split(1024)),
                 "bf16": torch.arange(6, dtype=torch.bfloat16, device="cuda:0"),
                 "empty": torch.empty((0, 3), device="cuda:0"), "cpu": torch.arange(3)}
        if what == "cuda_torch_device_only":  # for a transport that moves device memory only
            del value["cpu"]
        return [value]
    if what == "cuda_big":
        import torch
        return [torch.arange(64 << 20, dtype=torch.int32, device="cuda:0")]  # 256 MiB
    if what == "cuda_2gib":
        import torch
        return [torch.full((2 << 30,), 7, dtype=torch.uint8, device="cuda:0")]
    if what == "cupy":
        import cupy
        return [cupy.arange(1000, dtype=cupy.float64)]
    if what == "big":
        return [np.arange(4 << 20, dtype=np.float64)]  # 32 MiB
    if what == "four":
        return [np.full((1000,), i, dtype=np.float32) for i in range(4)]
    if what == "small":
        return [np.arange(10.0)]
    raise ValueError(what)


def _register(register):
    for name, module, cls in register or ():
        rdt.register_tensor_transport(name, ["cpu"], getattr(importlib.import_module(module), cls))


def serve(conn, transports, what, register=None):
    """Puts the values once per transport, sends {transport: pickled refs},
    then answers commands until told to stop."""
    _register(register)
    refs = {t: [rdt.put(v, transport=t) for v in make_values(what)] for t in transports}
    conn.send({t: pickle.dumps(r) for t, r in refs.items()})
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg == "release":
            for rs in refs.values():
                for r in rs:
                    r.close()
            conn.send("released")
        elif msg == "stats":
            conn.send(rdt.default_runtime().stats())
        elif msg == "exit_now":
            os._exit(0)
        else:
            conn.close()
            return


def serve_on_gpu(conn, visible, device, n):
    """Shows this process the GPUs ``visible`` (CUDA_VISIBLE_DEVICES, set
    before CUDA starts here; None: as the parent), puts
    torch.arange(n) on its cuda:<device>, sends the pickled ref and the
    ordinal the ref names, then waits until told to stop."""
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    import torch
    ref = rdt.put(torch.arange(n, dtype=torch.int64, device=f"cuda:{device}"))
    conn.send((pickle.dumps(ref), ref.tensor_descs()[0].device_id))
    try:
        conn.recv()
    except EOFError:
        pass


class DLPackView:
    """A tensor seen only through __dlpack__ and __dlpack_device__: the
    stream and max_version the consumer names are handed on to it (as the
    consumer named them: torch's defaults differ between releases)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**{k: v for k, v in kw.items() if k in ("stream", "max_version")})

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def serve_dlpack_side_stream(conn, n, cycles):
    """Fills a CUDA tensor of n bytes with 7 on a side stream, after a kernel
    that spins ``cycles`` GPU clock cycles, and puts it through a DLPack-only
    view while that stream is still busy (and current). Sends the pickled
    ref, how long the put took and whether the fill had finished when it
    returned; then waits until told to stop."""
    import torch
    x = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        x.fill_(7)
        filled = torch.cuda.Event()
        filled.record()
        t0 = time.monotonic()
        ref = rdt.put(DLPackView(x))
        took = time.monotonic() - t0
        done = filled.query()
    conn.send((pickle.dumps(ref), took, done))
    try:
        conn.recv()
    except EOFError:
        pass


def receive_on_gpu(conn, visible, blob, n, runs=3):
    """Shows this process only the GPUs ``visible`` (CUDA_VISIBLE_DEVICES,
    set before CUDA starts here), then gets the pickled ref of
    torch.arange(n) (int64) into a tensor on its cuda:0: once, then ``runs``
    times timed. Sends ("ok", the transports whose completed transfers
    grew, GB/s of the best run, whether the bytes are right) or ("error",
    the error, the transports that grew)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    import torch
    rt = rdt.default_runtime()

    def completed():
        return {t["name"]: t["transfers_completed"] for t in rt.transports()}

    before = completed()
    ref = pickle.loads(blob)
    out = torch.empty(n, dtype=torch.int64, device="cuda:0")
    try:
        rdt.get(ref, out=[out], timeout=120)
        best = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            rdt.get(ref, out=[out], timeout=120)
            best = min(best, time.perf_counter() - t0)
        right = bool(torch.equal(out, torch.arange(n, dtype=torch.int64, device="cuda:0")))
    except rdt.RdtError as e:
        after = completed()
        conn.send(("error", f"{type(e).__name__}: {e}", sorted(k for k in after if after[k] > before.get(k, 0))))
        return
    after = completed()
    conn.send(("ok", sorted(k for k in after if after[k] > before.get(k, 0)), n * 8 / best / 1e9, right))


def serve_raw(conn, transports, n=1000):
    """Puts np.arange(n) once per transport (None: chosen per fetch), sends
    {transport: (C bytes, pickled ref)}, then waits until told to stop."""
    refs = {t: rdt.put(np.arange(n, dtype=np.float64), transport=t) for t in transports}
    conn.send({t: (r.serialize(), pickle.dumps(r)) for t, r in refs.items()})
    try:
        conn.recv()
    except EOFError:
        pass


def serve_sized(conn, plan):
    """For each (transport, nbytes, count) of plan, puts count uint8 arrays
    of nbytes (the i-th filled with i), sends the C bytes of all their refs
    in that order, then waits until told to stop."""
    refs = [rdt.put(np.full(nbytes, i, dtype=np.uint8), transport=t)
            for t, nbytes, count in plan for i in range(count)]
    conn.send([r.serialize() for r in refs])
    try:
        conn.recv()
    except EOFError:
        pass


def wait_until_interrupted(mode, raw_hex, transport=None):
    """Run as a script: waits on the owner of the ref in raw_hex, in `mode`
    ("get": a get of a ref deserialized first; "deserialize": deserializing
    it), with no deadline, after a line on stdin says the owner is stopped.
    Prints how the wait ended and how long after it began."""
    import signal
    import sys
    # A process started in the background may inherit SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rt = rdt.Runtime("interrupted", peer_timeout=30)
    raw = bytes.fromhex(raw_hex)
    ref = rt.deserialize(raw) if mode == "get" else None
    print("ready", flush=True)
    sys.stdin.readline()
    print("waiting", flush=True)
    start = time.monotonic()
    try:
        if mode == "get":
            rt.get(ref, transport=transport)
        else:
            rt.deserialize(raw, timeout=None)
        print("returned", flush=True)
    except KeyboardInterrupt:
        took = time.monotonic() - start
        # A get into buffers of its own frees the aborted fetch on a
        # background thread: give it a moment before counting.
        settle = time.monotonic() + 5
        while rt.stats()['fetches_active'] and time.monotonic() < settle:
            time.sleep(0.01)
        print(f"interrupted {took:.3f} fetches_active={rt.stats()['fetches_active']}", flush=True)
    except Exception as e:
        print(f"error {type(e).__name__}: {e}", flush=True)
    rt.close()
    print("closed", flush=True)


def hold(conn, ref_bytes):
    """Unpickles a ref (a borrow) and keeps it until told, or until killed."""
    ref = pickle.loads(ref_bytes)
    conn.send("holding")
    if conn.recv() == "release":
        ref.close()
        conn.send("released")
    time.sleep(0.2)


def fetch_in_child(conn, ref_bytes, register=None):
    """Unpickles and gets a ref; sends back the value or the error."""
    _register(register)
    try:
        conn.send(("ok", rdt.get(pickle.loads(ref_bytes), timeout=30)))
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))


def nccl_rank1(conn, address):
    """Rank 1 of the two-GPU nccl test: joins the group on cuda:1, then
    fetches each ref it is sent and answers with the sum."""
    import torch
    rdt.create_collective_group(2, 1, address, name="pair", device=1, timeout=120)
    conn.send("joined")
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        ref = pickle.loads(msg)
        out = torch.empty(1 << 20, dtype=torch.float32, device="cuda:1")
        try:
            rdt.get(ref, out=[out], timeout=60)
            conn.send(("ok", float(out.double().sum().item())))
        except rdt.RdtError as e:
            conn.send(("error", str(e)))


def nccl_pair_rank(conn, rank, address=None):
    """Rank ``rank`` of the two-rank nccl group "pair", on cuda:<rank>, in
    the default runtime. Rank 0 first sends its runtime's address. After
    "joined" it answers: "put" (puts torch.arange(1 << 20) in float32 over
    nccl, sends the pickled ref), ("get", blob) (fetches it, answers
    ("ok", the sum) or ("error", why)), "destroy" and "close" (destroys the
    group, closes the runtime: answers (how it ended, seconds)), "exit"
    (leaves at once, the group still formed)."""
    import torch
    rt = rdt.default_runtime()
    if rank == 0:
        conn.send(rt.address)
    rt.create_collective_group(2, rank, address, name="pair", device=rank, timeout=120)
    conn.send("joined")
    held = []
    for msg in requests(conn):
        if msg == "put":
            held.append(rt.put([torch.arange(1 << 20, dtype=torch.float32, device=f"cuda:{rank}")], transport="nccl"))
            conn.send(pickle.dumps(held[-1]))
        elif msg[0] == "get":
            out = torch.empty(1 << 20, dtype=torch.float32, device=f"cuda:{rank}")
            try:
                rdt.get(pickle.loads(msg[1]), out=[out], timeout=60)
                conn.send(("ok", float(out.double().sum().item())))
            except rdt.RdtError as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
        elif msg in ("destroy", "close"):
            t0 = time.monotonic()
            try:
                if msg == "destroy":
                    rt.destroy_collective_group("pair")
                else:
                    held.clear()
                    rt.close()
                how = "ok"
            except rdt.GetTimeoutError as e:
                how = f"timeout: {e}"
            except Exception as e:
                how = f"error: {type(e).__name__}: {e}"
            conn.send((how, time.monotonic() - t0))
        elif msg == "exit":
            os._exit(0)


def fetch_each_in_child(conn, blobs, transport=None):
    """Unpickles and gets each pickled ref in turn; sends back, for each,
    the value or the error."""
    out = []
    for blob in blobs:
        try:
            out.append(("ok", rdt.get(pickle.loads(blob), timeout=30, transport=transport)))
        except Exception as e:
            out.append(("error", f"{type(e).__name__}: {e}"))
    conn.send(out)


def version_of(tag):
    """The state dict a writer writes as version ``tag``."""
    return {"w": np.full((64, 16), float(tag), np.float32) + np.arange(16, dtype=np.float32),
            "b": np.full(100, tag % 251, np.uint8)}


def writer(conn, blob, transport=None):
    """Unpickles a writable ref and writes what it is told: ("whole", tag)
    the whole version, ("rows", tag) rows 8..15 of "w" only, ("loop", tag)
    versions from tag on (every byte tag % 251) until killed. Answers "ok" or the error."""
    ref = pickle.loads(blob)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        kind, tag = msg
        try:
            if kind == "whole":
                v = version_of(tag)
                rdt.write(ref, v, tag=tag, timeout=30, transport=transport)
            elif kind == "rows":
                rdt.write(ref["w"][8:16], version_of(tag)["w"][8:16], tag=tag, timeout=30, transport=transport)
            elif kind == "loop":
                conn.send("looping")
                while True:
                    v = [np.full(shape, tag % 251, np.dtype(dt)) for shape, dt in zip(ref.shapes, ref.dtypes)]
                    rdt.write(ref, v, tag=tag, transport=transport)
                    tag += 1
            conn.send("ok")
        except Exception as e:
            conn.send(f"{type(e).__name__}: {e}")


def exposer(conn, transports, register):
    """Exposes one np.zeros(4096, uint8) per transport, sends {transport:
    the writable ref's C bytes}, then answers ("notice", transport) with the
    next notice of that object and a copy of its bytes."""
    _register(register)
    bufs = {t: np.zeros(4096, np.uint8) for t in transports}
    refs = {t: rdt.expose(bufs[t], transport=t) for t in transports}
    conn.send({t: r.serialize() for t, r in refs.items()})
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        _, t = msg
        n = refs[t].wait_notice(timeout=30)
        conn.send((n.ok, n.tag, None if n.error is None else str(n.error), bufs[t].copy()))


def requests(conn):
    """The test's messages on conn, until it says "stop" or goes away."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg == "stop":
            return
        yield msg


def mutable_source(conn, transport):
    """Puts a 4 KiB float32 array with `transport` and sends the pickled
    ref; ("set", v) fills the array with v in place and answers "ok"."""
    x = np.zeros(1024, np.float32)
    ref = rdt.put(x, transport=transport)
    conn.send(pickle.dumps(ref))
    for msg in requests(conn):
        x[:] = msg[1]
        conn.send("ok")


def version_source(conn, transport):
    """Each ("put", v) puts a new object of two float32 arrays (1024 and
    256 elements, both filled with v) with `transport`, drops its earlier
    ones, and sends the pickled ref; ("put3", v) puts one of three arrays
    instead (another layout)."""
    held = []
    for kind, v in requests(conn):
        arrays = [np.full(1024, v, np.float32), np.full(256, v, np.float32)]
        if kind == "put3":
            arrays.append(np.full(8, v, np.float32))
        for r in held:
            r.close()
        held = [rdt.put(arrays, transport=transport)]
        conn.send(pickle.dumps(held[0]))


def prepared_writer(conn, blob, transport=None):
    """Prepares a write of version_of(tag) into a writable ref and runs it
    when told ("run", tag); ("loop", tag) runs versions from tag on until
    killed. Answers "ok" or the error."""
    ref = pickle.loads(blob)
    v = version_of(0)
    p = rdt.prepare_write(ref, v, transport=transport)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg == "stop":
            p.close()
            return
        kind, tag = msg
        try:
            if kind == "run":
                new = version_of(tag)
                for k in v:
                    v[k][...] = new[k]  # in place: the prepared write holds these buffers
                p.run(tag, timeout=30)
            elif kind == "loop":
                conn.send("looping")
                while True:
                    new = version_of(tag)
                    for k in v:
                        v[k][...] = new[k]
                    p.run(tag)
                    tag += 1
            conn.send("ok")
        except Exception as e:
            conn.send(f"{type(e).__name__}: {e}")
