"""make bench-sync: the weight-sync job on the host test bed.

Four hosts of tests/hosts/bed.py, each link limited to --rate (10 Gbit/s)
each way: two trainer ranks on h0 each hold half of a model (float32
tensors, about 300), and one inference process on each of h1, h2, h3 needs
all of it, in arrays it allocated once. One sync: every inference process
holds the new version. Measured per method and model size (median of
--runs syncs after a first one that is not timed):

- rdt, pulls: each inference process pulls both halves in one rdt.get,
  straight into its arrays (tcp between hosts);
- rdt, relay: each inference process pulls a third of the model from the
  trainers, chunk by chunk, and pushes each chunk (rdt.write_start) into
  the other two, which expose their arrays for it, while it pulls the
  next; done when its own pulls and pushes ended and the others' pushes
  all arrived (one notice each);
- Ray's object store: each trainer rank ray.put()s its half (weights
  change every step, so every sync puts), each inference process
  ray.get()s both into its node's object store (and reads them there,
  without the copy into arrays of its own that an engine would make:
  generous to Ray, and what fits four nodes of a 2 GB model in 24 GiB);
- gloo: the trainer ranks gather the model on rank 0, which
  torch.distributed.broadcast()s it to every inference process over gloo.

Then one copy for many readers on one host: an owner on h1 holds the model
and 1, 2, 4, 8 readers on h1 each get all of it.

The links allow a sync no faster than the busiest link carries its bytes:
pulled straight, h0 sends the model to three hosts (3 x model / rate); in
the relay every link carries about one model (model / rate). Writes bench/SYNC.md and the
numbers for the plot (build/sync.json; bench/sync_plot.py draws
bench/sync.png from them). Needs root.

    python bench/sync_bench.py [--sizes 0.5,2] [--runs 3] [--rate 10gbit] [--out bench/SYNC.md]

Inside, the same file runs each role on a host: python bench/sync_bench.py --role NAME.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import secrets
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "hosts"))

GIB = 1 << 30
TENSORS = 300
TRAINERS = 2
READERS = 3
FANOUT = (1, 2, 4, 8)


# ---- the model --------------------------------------------------------------------

def shapes_of(nbytes: int):
    """About TENSORS float32 tensors, nbytes in all: two matrices for each
    vector, as a layer's weights and bias."""
    matrices = TENSORS - TENSORS // 3
    each = nbytes / 4 / matrices
    rows = max(64, int(each ** 0.5) // 64 * 64)
    cols = max(1, round(each / rows))
    return [(rows,) if i % 3 == 2 else (rows, cols) for i in range(TENSORS)]


def half(shapes, rank):
    """The tensors trainer rank `rank` owns."""
    return list(range(rank, len(shapes), TRAINERS))


def split(indices, sizes, n):
    """indices cut into n runs of about equal bytes, in order."""
    total = sum(sizes[i] for i in indices)
    out, cur, acc = [], [], 0
    for i in indices:
        cur.append(i)
        acc += sizes[i]
        if acc >= total * (len(out) + 1) / n and len(out) < n - 1:
            out.append(cur)
            cur = []
    out.append(cur)
    return [run for run in out if run]


def relay_plan(shapes, readers, chunks):
    """Reader k's share for the relay: its part of the model (a third for
    three readers), in chunks."""
    sizes = [int(np.prod(s)) * 4 for s in shapes]
    return [split(part, sizes, chunks) for part in split(list(range(len(shapes))), sizes, readers)]


def fill(arrays, version):
    import numpy as np
    for i, a in enumerate(arrays):
        a.reshape(-1)[:] = np.float32(version * 1000 + i)


# ---- the roles, each a process on a host, driven by JSON lines -------------------

class Role:
    def __init__(self) -> None:
        self.kept = {}


class RdtTrainer(Role):
    def init(self, address, token, rank, nbytes):
        import numpy as np
        import rdt
        rdt.init(name=f"trainer{rank}", listen_tcp=f"{address}:0", advertise_host=address, auth_token=token)
        shapes = shapes_of(nbytes)
        self.arrays = [np.empty(shapes[i], np.float32) for i in half(shapes, rank)]
        fill(self.arrays, 1)
        self.ref = rdt.put(self.arrays)
        return {"ref": pickle.dumps(self.ref).hex()}


class RdtReader(Role):
    def init(self, address, token, refs, name="reader"):
        import rdt
        rdt.init(name=name, listen_tcp=f"{address}:0", advertise_host=address, auth_token=token)
        self.refs = [pickle.loads(bytes.fromhex(r)) for r in refs]
        # One array per tensor, in the refs' order: every tensor of each ref.
        self.out = [np.zeros(shape, np.float32) for ref in self.refs for shape in ref.shapes]
        return {}

    def pull(self):
        import rdt
        t0 = time.monotonic()
        rdt.get(self.refs, out=self.out, timeout=600)
        return {"seconds": time.monotonic() - t0}

    def check(self):
        """Each tensor's first and last element hold what its owner filled
        it with (version 1: 1000 + its index in the owner's list)."""
        bad, pos = [], 0
        for ref in self.refs:
            for j in range(len(ref.shapes)):
                flat = self.out[pos].reshape(-1)
                if not (flat[0] == flat[-1] == 1000 + j):
                    bad.append(pos)
                pos += 1
        return {"bad": bad, "tensors": pos}


class RdtRelay(Role):
    """A reader that pulls only its part of the model from the trainers,
    chunk by chunk, and pushes each chunk into the other readers (which
    expose their whole model arrays for it) while it pulls the next: every
    link then carries about one model, not h0's three."""

    def init(self, address, token, nbytes, refs, index, readers, chunks):
        import rdt
        rdt.init(name=f"relay{index}", listen_tcp=f"{address}:0", advertise_host=address, auth_token=token)
        self.shapes = shapes_of(nbytes)
        self.trainers = [pickle.loads(bytes.fromhex(r)) for r in refs]
        self.out = [np.zeros(s, np.float32) for s in self.shapes]
        self.exposed = rdt.expose(self.out)
        self.plan = relay_plan(self.shapes, readers, chunks)
        self.index = index
        return {"ref": pickle.dumps(self.exposed).hex()}

    def peers(self, refs):
        self.others = [pickle.loads(bytes.fromhex(r)) for k, r in enumerate(refs) if k != self.index]
        self.expect = sum(len(part) for k, part in enumerate(self.plan) if k != self.index)
        return {}

    def sync(self, version):
        import rdt
        rt = rdt.default_runtime()
        t0 = time.monotonic()
        writes = []
        for chunk in self.plan[self.index]:
            rdt.get([self.trainers[i % TRAINERS][i // TRAINERS] for i in chunk], out=[self.out[i] for i in chunk],
                    timeout=600)
            for peer in self.others:       # on its way while the next chunk is pulled
                writes.append(rt.write_start([peer[i] for i in chunk], [self.out[i] for i in chunk], tag=version))
        for w in writes:
            w.result(600)
        for _ in range(self.expect):       # one notice per chunk each other reader pushed here
            n = self.exposed.wait_notice(600)
            if n.error is not None:
                raise RuntimeError(f"a push into reader {self.index} failed: {n.error}")
        return {"seconds": time.monotonic() - t0}

    def check(self):
        bad = [i for i, a in enumerate(self.out)
               if not (a.reshape(-1)[0] == a.reshape(-1)[-1] == 1000 + i // TRAINERS)]
        return {"bad": bad, "tensors": len(self.out)}


class FanOwner(Role):
    def init(self, nbytes):
        import numpy as np
        import rdt
        shapes = shapes_of(nbytes)
        self.arrays = [np.empty(s, np.float32) for s in shapes]
        fill(self.arrays, 1)
        self.ref = rdt.put(self.arrays)
        return {"ref": pickle.dumps(self.ref).hex()}


class FanViewer(Role):
    """A reader on the owner's host that views the model (get(copy=False))
    rather than copying it; with touch it then reads one element of every
    page, so that the page tables are filled as a reader's first pass
    would."""

    def init(self, address, token, refs, name="viewer"):
        import rdt
        rdt.init(name=name, listen_tcp=f"{address}:0", advertise_host=address, auth_token=token)
        self.refs = [pickle.loads(bytes.fromhex(r)) for r in refs]
        self.got = None
        return {}

    def drop(self):
        """Lets the last round's views go (untimed, before a round)."""
        import gc
        self.got = None
        gc.collect()
        return {}

    def view(self, touch=False):
        import rdt
        t0 = time.monotonic()
        self.got = [a for value in rdt.get(self.refs, timeout=600, copy=False) for a in value]
        if touch:
            for a in self.got:
                float(a.reshape(-1)[::1024].sum())  # one float32 of each 4 KiB page
        return {"seconds": time.monotonic() - t0}

    def check(self):
        bad = [i for i, a in enumerate(self.got)
               if a.flags.writeable or not (a.reshape(-1)[0] == a.reshape(-1)[-1] == 1000 + i)]
        return {"bad": bad, "tensors": len(self.got)}


class Gloo(Role):
    """A rank of one gloo group: 0 and 1 the trainers, the rest readers."""

    def init(self, master, rank, world, nbytes):
        import torch
        import torch.distributed as dist
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        dist.init_process_group("gloo", init_method=f"tcp://{master}:29511", rank=rank, world_size=world)
        n = nbytes // 4
        self.dist, self.rank = dist, rank
        self.model = torch.zeros(n, dtype=torch.float32)      # the flat model every rank ends with
        self.mine = torch.full((n // 2 + n % 2 if rank == 0 else n // 2,), float(rank + 1)) if rank < TRAINERS \
            else None
        return {}

    def sync(self):
        dist, n = self.dist, self.model.numel()
        dist.barrier()
        t0 = time.monotonic()
        first = n // 2 + n % 2
        if self.rank == 0:
            self.model[:first].copy_(self.mine)
            dist.recv(self.model[first:], src=1)                # the gather
        elif self.rank == 1:
            dist.send(self.mine, dst=0)
        dist.broadcast(self.model, src=0)
        dist.barrier()
        return {"seconds": time.monotonic() - t0, "ok": bool(self.model[0] == 1 and self.model[-1] == 2)}


class TcpPump(Role):
    """Plain sockets, for the machine's own bound: receives what it is told
    to expect and sends what it is told to, on threads, all at once."""

    PORT = 7100

    def init(self, address):
        import socket
        self.ln = socket.create_server((address, self.PORT), backlog=16)
        return {}

    def expect(self, streams):
        import threading

        def drain(conn):
            buf = bytearray(4 << 20)
            with conn:
                while conn.recv_into(buf):
                    pass

        def accept():
            for _ in range(streams):
                c, _ = self.ln.accept()
                t = threading.Thread(target=drain, args=(c,))
                t.start()
                self.drains.append(t)

        self.drains = []
        self.acceptor = threading.Thread(target=accept)
        self.acceptor.start()
        return {}

    def send(self, targets):
        import socket
        import threading
        chunk = memoryview(bytearray(4 << 20))
        t0 = time.monotonic()

        def pump(addr, nbytes):
            with socket.create_connection((addr, self.PORT)) as c:
                while nbytes > 0:
                    n = min(nbytes, len(chunk))
                    c.sendall(chunk[:n])
                    nbytes -= n

        ts = [threading.Thread(target=pump, args=(a, n)) for a, n in targets]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return {"seconds": time.monotonic() - t0}

    def drained(self):
        self.acceptor.join()
        for t in self.drains:
            t.join()
        return {}


ROLES = {"rdt-trainer": RdtTrainer, "rdt-reader": RdtReader, "rdt-relay": RdtRelay, "fan-owner": FanOwner,
         "fan-viewer": FanViewer, "gloo": Gloo, "tcp-pump": TcpPump}


def serve_role(role: str) -> None:
    from agent import serve, speaker
    say = speaker()
    serve(ROLES[role](), say)


# ---- Ray's object store, run as a driver on the head host ---------------------------

RAY_DRIVER = r'''
import json, sys, time
import numpy as np
import ray
sys.path.insert(0, sys.argv[1])
from sync_bench import shapes_of, half, fill, TRAINERS
nbytes, runs = int(sys.argv[2]), int(sys.argv[3])
ray.init(address="auto", logging_level="ERROR",
         runtime_env={"env_vars": {"PYTHONPATH": sys.argv[1] + ":" + __import__("os").environ.get("PYTHONPATH", "")}})

@ray.remote(num_cpus=0, resources={"h0": 1})
class Trainer:
    def __init__(self, rank):
        shapes = shapes_of(nbytes)
        self.arrays = [np.empty(shapes[i], np.float32) for i in half(shapes, rank)]
        fill(self.arrays, 1)
    def publish(self):
        return [ray.put(self.arrays)]          # weights change every step: a put every sync

@ray.remote(num_cpus=0)
class Reader:
    def pull(self, refs):
        # The model stays in the node's object store (read-only arrays that
        # ray.get maps): no copy into arrays of the engine's own, which a
        # real engine would make. Generous to Ray, and what fits four
        # nodes of a 2 GB model in 24 GiB.
        got = ray.get([r[0] for r in refs])
        return all(float(a.reshape(-1)[-1]) == 1000 + j for part in got for j, a in enumerate(part))

trainers = [Trainer.remote(r) for r in range(TRAINERS)]
readers = [Reader.options(resources={f"h{h}": 1}).remote() for h in (1, 2, 3)]
ray.get([r.pull.remote(ray.get([t.publish.remote() for t in trainers])) for r in readers])   # warm up
times = []
for _ in range(runs):
    t0 = time.monotonic()
    refs = ray.get([t.publish.remote() for t in trainers])
    ok = ray.get([r.pull.remote(refs) for r in readers])
    times.append(time.monotonic() - t0)
    assert all(ok), ok
    del refs
print("TIMES " + json.dumps(times), flush=True)
'''


# ---- the driver: beds, methods, the table ---------------------------------------------

def link_seconds(nbytes: int, rate_bps: float, copies: int) -> float:
    return nbytes * copies * 8 / rate_bps


def rate_bps(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for u, m in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * m
    raise ValueError(f"rate {rate!r}: want e.g. 10gbit")


def role(host, name, env=None):
    from agent import Lines
    return Lines(host, [sys.executable, os.path.abspath(__file__), "--role", name], env=env)


def start_trainers(bed, token, nbytes):
    """The trainer ranks on h0, each holding its half put; their refs."""
    h0 = bed.hosts[0]
    trainers = [role(h0, "rdt-trainer") for _ in range(TRAINERS)]
    refs = [t.call("init", address=h0.address, token=token, rank=r, nbytes=nbytes, timeout=600)["ref"]
            for r, t in enumerate(trainers)]
    return trainers, refs


def timed_rounds(procs, runs, op, before=None, **args):
    """runs + 1 rounds of op sent to every process at once, each round
    timed until the last answered; the first (connecting) is not kept.
    Before each round every process runs op before, untimed. The
    processes' check then says that each one holds every tensor."""
    times = []
    for i in range(runs + 1):
        if before:
            for x in procs:
                x.call(before)
        t0 = time.monotonic()
        for x in procs:
            x.send(op, **{k: (v(i) if callable(v) else v) for k, v in args.items()})
        for x in procs:
            a = x.read(900)
            assert a["ok"], a
        if i:
            times.append(time.monotonic() - t0)
    for x in procs:
        c = x.call("check")
        assert not c["bad"] and c["tensors"] == TENSORS, c
    return times


def close_all(*groups):
    for group in groups:
        for x in group:
            x.close()


def bench_rdt(bed, nbytes, runs):
    token = secrets.token_hex(16)
    trainers, refs = start_trainers(bed, token, nbytes)
    readers = [role(h, "rdt-reader") for h in bed.hosts[1:1 + READERS]]
    for r in readers:
        r.call("init", address=r.host.address, token=token, refs=refs, timeout=600)
    times = timed_rounds(readers, runs, "pull")
    close_all(readers, trainers)
    return times


def bench_relay(bed, nbytes, runs, chunks=8):
    token = secrets.token_hex(16)
    trainers, refs = start_trainers(bed, token, nbytes)
    readers = [role(h, "rdt-relay") for h in bed.hosts[1:1 + READERS]]
    exposed = [r.call("init", address=r.host.address, token=token, nbytes=nbytes, refs=refs, index=k,
                      readers=READERS, chunks=chunks, timeout=600)["ref"] for k, r in enumerate(readers)]
    for r in readers:
        r.call("peers", refs=exposed, timeout=600)
    times = timed_rounds(readers, runs, "sync", version=lambda i: i + 1)
    close_all(readers, trainers)
    return times


def bench_tcp_relay(bed, nbytes, runs):
    """The relay's traffic over plain sockets, all at once: h0 sends each
    reader a third, each reader sends its third to the other two. What
    this machine's kernel moves between the bed's hosts, with no rdt in
    the way: the bound of a relay here, where the hosts share the CPUs."""
    pumps = [role(h, "tcp-pump") for h in bed.hosts[:1 + READERS]]
    for x in pumps:
        x.call("init", address=x.host.address)
    third = nbytes // READERS
    sends = {0: [(bed.hosts[k].address, third) for k in range(1, 1 + READERS)]}
    for k in range(1, 1 + READERS):
        sends[k] = [(bed.hosts[j].address, third) for j in range(1, 1 + READERS) if j != k]
    times = []
    for i in range(runs + 1):
        for k, x in enumerate(pumps):
            x.call("expect", streams=0 if k == 0 else READERS)
        t0 = time.monotonic()
        for k, x in enumerate(pumps):
            x.send("send", targets=sends[k])
        for x in pumps:
            a = x.read(900)
            assert a["ok"], a
        for x in pumps:
            x.call("drained", timeout=900)
        if i:
            times.append(time.monotonic() - t0)
    for x in pumps:
        x.close()
    return times


def bench_gloo(bed, nbytes, runs):
    hosts = [bed.hosts[0]] * TRAINERS + bed.hosts[1:1 + READERS]
    ranks = [role(h, "gloo") for h in hosts]
    for r, x in enumerate(ranks):
        x.send("init", master=bed.hosts[0].address, rank=r, world=len(ranks), nbytes=nbytes)
    for x in ranks:
        a = x.read(600)
        assert a["ok"], a
    times = []
    for i in range(runs + 1):
        for x in ranks:
            x.send("sync")
        answers = [x.read(900) for x in ranks]
        assert all(a["ok"] for a in answers), answers
        if i:
            times.append(max(a["seconds"] for a in answers))
    for x in ranks:
        x.close()
    return times


def bench_ray(bed, nbytes, runs):
    from raycluster import RayCluster
    # One version of the model in each node's store: four stores of 2.5 versions
    # (and the copies each reader makes) did not fit a 24 GiB machine at 2 GB.
    cluster = RayCluster(bed, object_store=int(nbytes * 1.2) + (64 << 20))
    p = bed.hosts[0].spawn([sys.executable, "-c", RAY_DRIVER, HERE, str(nbytes), str(runs)], env=cluster.env)
    out = p.stdout.read()
    assert p.wait(60) == 0, out
    return json.loads([x for x in out.splitlines() if x.startswith("TIMES ")][-1][len("TIMES "):])


def bench_fanout(bed, nbytes, readers, runs, how="copy"):
    """N readers on the owner's host: each copies the model into arrays of
    its own (cma), or views it (view), or views it and reads every page
    (touch)."""
    token = secrets.token_hex(16)
    h = bed.hosts[1]
    owner = role(h, "fan-owner")
    ref = owner.call("init", nbytes=nbytes, timeout=600)["ref"]
    rs = [role(h, "rdt-reader" if how == "copy" else "fan-viewer") for _ in range(readers)]
    for i, r in enumerate(rs):
        r.call("init", address=h.address, token=token, refs=[ref], name=f"reader{i}", timeout=600)
    if how == "copy":
        times = timed_rounds(rs, runs, "pull")
    else:
        times = timed_rounds(rs, runs, "view", before="drop", touch=how == "touch")
    close_all(rs, [owner])
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="0.5,2", help="model sizes in GB (2^30 bytes), comma-separated")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", default="10gbit")
    p.add_argument("--fanout-size", type=float, default=0.5, help="the model size of the fan-out rows, GB")
    p.add_argument("--methods", default="tcp,rdt,relay,ray,gloo,fanout")
    p.add_argument("--out", default=os.path.join(HERE, "SYNC.md"))
    p.add_argument("--from-json", help="write the table again from the numbers of an earlier run")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "sync.json"), help="the numbers, for sync_plot.py")
    a = p.parse_args()
    if a.role:
        serve_role(a.role)
        return
    if a.from_json:
        with open(a.from_json) as f:
            write(json.load(f), a, rate_bps(a.rate))
        return
    from bed import Bed
    why = Bed.unavailable()
    if why:
        raise SystemExit(f"bench-sync: {why}")
    sizes = [float(s) for s in a.sizes.split(",")]
    methods = a.methods.split(",")
    bps = rate_bps(a.rate)
    results = {"rate": a.rate, "sizes": sizes, "runs": a.runs, "fanout_size": a.fanout_size, "methods": {},
               "fanout": {}, "fanout_view": {}, "fanout_touch": {}}
    for gb in sizes:
        nbytes = int(gb * GIB) // 256 * 256
        for m in ("tcp", "rdt", "relay", "ray", "gloo"):
            if m not in methods:
                continue
            with Bed(1 + READERS, rate=a.rate, keep=[ROOT]) as bed:
                t = {"tcp": bench_tcp_relay, "rdt": bench_rdt, "relay": bench_relay, "ray": bench_ray,
                     "gloo": bench_gloo}[m](
                    bed, nbytes, a.runs)
            results["methods"].setdefault(m, {})[str(gb)] = t
            print(f"{m} {gb} GB: {', '.join(f'{x:.2f}' for x in t)} s", flush=True)
    if "fanout" in methods:
        nbytes = int(a.fanout_size * GIB) // 256 * 256
        for n in FANOUT:
            for how, key in (("copy", "fanout"), ("view", "fanout_view"), ("touch", "fanout_touch")):
                with Bed(2, keep=[ROOT]) as bed:
                    t = bench_fanout(bed, nbytes, n, a.runs, how)
                results[key][str(n)] = t
                print(f"fan-out {n} readers, {how}: {', '.join(f'{x:.3f}' for x in t)} s", flush=True)
    write(results, a, bps)


def write(results, a, bps) -> None:
    import platform
    med = statistics.median
    lines = ["# Weight sync on the host test bed (`make bench-sync`)", "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GIB:.1f} GiB, Linux {platform.release()}, "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}. Four hosts of tests/hosts/bed.py, each link {a.rate} "
             "each way (tbf). Two trainer ranks on h0 hold half of a model of about 300 float32 tensors each; "
             "one inference process on each of h1, h2, h3 needs all of it in arrays it allocated once. "
             f"Median of {results.get('runs', a.runs)} syncs after one that is not timed (bench/sync_bench.py says how each method "
             "works).", "",
             "Two limits. Pulled straight from the trainers, h0's link carries the model three times "
             "(3 x model / rate). Each inference host needs the model once (model / rate): a sync can come "
             "close to that only if the hosts pass parts on to each other, as rdt's relay does (each pulls a "
             "third from the trainers, chunk by chunk, and pushes each chunk into the other two while it pulls "
             "the next).", "",
             "The hosts of the bed share this machine's cores, and the kernel's TCP copies of every host "
             "compete for them. *Plain TCP relay* moves the relay's bytes between the same hosts at once over "
             "plain sockets, with no rdt in the way: the most a relay can do here.", "",
             "| model | limit, h0 sends 3x | limit, each host receives 1x | plain TCP relay | rdt, pulls | "
             "rdt, relay | Ray object store | gloo gather + broadcast | rdt pulls / 3x | rdt relay / 1x | "
             "rdt relay / plain TCP relay | Ray / rdt relay | gloo / rdt relay |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for gb in results["sizes"]:
        nbytes = int(gb * GIB) // 256 * 256
        lim3, lim1 = link_seconds(nbytes, bps, READERS), link_seconds(nbytes, bps, 1)
        t = {m: med(v[str(gb)]) for m, v in results["methods"].items() if str(gb) in v}
        cell = lambda m: f"{t[m]:.2f} s" if m in t else "–"  # noqa: E731
        over = lambda m, lim: f"{t[m] / lim:.2f}x" if m in t else "–"  # noqa: E731
        ratio = lambda x, y: f"{t[x] / t[y]:.2f}x" if x in t and y in t else "–"  # noqa: E731
        lines.append(f"| {gb} GB | {lim3:.2f} s | {lim1:.2f} s | {cell('tcp')} | {cell('rdt')} | {cell('relay')} | "
                     f"{cell('ray')} | {cell('gloo')} | {over('rdt', lim3)} | {over('relay', lim1)} | "
                     f"{ratio('relay', 'tcp')} | {ratio('ray', 'relay')} | {ratio('gloo', 'relay')} |")
    if results["fanout"]:
        def column(key):
            got = results.get(key) or {}
            one = med(got["1"]) if "1" in got else None
            return lambda n: (f"{med(got[n]):.3f} s | " + (f"{med(got[n]) / one:.2f}x" if one else "–")
                              if n in got else "– | –")
        copy, view, touch = column("fanout"), column("fanout_view"), column("fanout_touch")
        lines += ["", f"## One host, many readers ({results.get('fanout_size', a.fanout_size)} GB model)", "",
                  "An owner on h1 holds the model; N readers on h1 at once each need all of it. *Copying*: "
                  "each gets it into arrays of its own (cma), N copies. *Shared view*: each calls "
                  "`rdt.get(refs, copy=False)` and maps the owner's one staged copy read-only (shm's sealed "
                  "segment, staged at the first view, which is not timed), no copy per reader; before each "
                  "round, untimed, the readers drop the last round's views. *View, every page read*: the same, then one element "
                  "of every 4 KiB page is read, filling the reader's page tables as a first pass over the "
                  "weights would. Each time is until the last reader answered. A view's work is per tensor "
                  "(a few µs each) and per page on the first read (page tables, not bytes), so it does not "
                  "grow with the bytes a copy moves; readers beyond the machine's cores wait for one.", "",
                  "| readers | copying | against one reader | shared view | against one reader | "
                  "view, every page read | against one reader |", "|---|---|---|---|---|---|---|"]
        for n in results["fanout"]:
            lines.append(f"| {n} | {copy(n)} | {view(n)} | {touch(n)} |")
    lines += ["", "bench/sync.png plots the sync time against the model size for each method, and the links' "
              "limit.", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({**results, "limits_s": {k: {str(gb): link_seconds(int(gb * GIB) // 256 * 256, bps, copies)
                                               for gb in results["sizes"]} for k, copies in (("3x", READERS),
                                                                                              ("1x", 1))}},
                  f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
