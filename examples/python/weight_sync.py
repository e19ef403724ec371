"""Weight sync: trainer ranks hand every step's weights to inference replicas.

The job RL systems run every step. --trainers trainer ranks each hold a
shard of a model of --tensors float32 tensors (--size-mb in all; every
tensor is owned by one trainer rank). --replicas inference replicas, each
of --tp tensor-parallel ranks, keep their rank's rows of every tensor in
arrays they allocated once. Every step:

1. each trainer rank writes version v into one of two buffers (a ring of
   two: the other still serves v-1) and puts it, without a copy;
2. each inference rank pulls its rows of every tensor from the trainer
   ranks that own them, straight into its staging arrays, in one fetch
   (partial fetches: nothing it does not need moves);
3. meanwhile it serves requests with the weights of v-1 (the pull
   overlaps the compute);
4. it switches to v only once all of v has landed (and, with --check,
   every byte is right): the update is all-or-nothing. A pull that fails
   leaves the rank on v-1 and says why; the next step tries again.

Ray carries the control (a few hundred bytes of pickled refs per trainer
and step); rdt moves the bytes: over cma or shm within a host, over tcp
between hosts, each process's runtime listening on its node's address
with a token the driver makes. It needs Ray (`pip install ray`;
tests/python/requirements.txt pins the version the tests use): without
it, it says so and exits.

    python examples/python/weight_sync.py [--size-mb 64] [--tensors 300] [--steps 4]
        [--trainers 2] [--replicas 3] [--tp 2] [--check] [--address auto]
        [--trainer-resource R] [--replica-resources R1,R2,R3]

The resource options place the trainer ranks, and each replica, on the
Ray nodes that have that custom resource (`ray start --resources`).
"""

import argparse
import os
import pickle
import secrets
import time

import numpy as np

try:
    import ray
except ImportError as e:  # the actors below need it at import
    raise SystemExit(f"weight_sync.py runs its trainers and replicas as Ray actors, and Ray is not installed "
                     f"here ({e}): pip install ray") from None

import rdt

MIB = 1 << 20


def layout(tensors, nbytes, tp):
    """A model's shapes: two matrices of rows x cols for each vector of
    rows (a layer's weights and its bias), adding up to about nbytes of
    float32; rows a multiple of 16 * tp, so that every rank's share of a
    vector starts on a whole cache line."""
    matrices = tensors - tensors // 3
    quantum = 16 * tp
    each = nbytes / 4 / matrices                     # elements per matrix
    rows = max(quantum, round(each ** 0.5 / quantum) * quantum)
    cols = max(1, round(each / rows))
    return [(rows,) if i % 3 == 2 else (rows, cols) for i in range(tensors)]


def weights(version, index, shape, lo=0, hi=None):
    """Rows [lo, hi) of tensor `index` at `version`: integers exact in
    float32, different for every version, tensor and element, so that a
    rank can check every byte it received."""
    hi = shape[0] if hi is None else hi
    row = int(np.prod(shape[1:], dtype=np.int64))
    flat = np.arange(lo * row, hi * row, dtype=np.int64)
    out = (flat * 7 + index * 131 + version * 1009) % 65521
    return out.astype(np.float32).reshape((hi - lo,) + tuple(shape[1:]))


def rows_of(shape, tp, rank):
    return shape[0] * rank // tp, shape[0] * (rank + 1) // tp


def start_rdt(token, name):
    """This process's runtime, reachable from other hosts at its node's
    address, authenticated by the job's token."""
    ip = ray.util.get_node_ip_address()
    host = f"[{ip}]" if ":" in ip else ip
    rdt.init(name=name, listen_tcp=f"{host}:0", advertise_host=ip, auth_token=token)


@ray.remote(num_cpus=0)
class Trainer:
    """One trainer rank: owns tensors rank, rank + trainers, ..."""

    def __init__(self, rank, trainers, shapes, token):
        start_rdt(token, f"trainer{rank}")
        self.mine = list(range(rank, len(shapes), trainers))
        self.shapes = shapes
        # A ring of two: version v lives in buffers[v % 2].
        self.buffers = [[np.empty(shapes[i], np.float32) for i in self.mine] for _ in range(2)]
        self.refs = {}

    def publish(self, version):
        """Writes version `version` and puts it; returns the pickled ref."""
        buf = self.buffers[version % 2]
        # The buffer last held version - 2: no rank reads it any more once
        # the object is freed (every rank finished and closed its borrow).
        rdt.default_runtime().wait_tensor_freed(buf[0], timeout=120)
        for t, i in zip(buf, self.mine):
            t[...] = weights(version, i, self.shapes[i])       # "the optimizer step"
        ref = rdt.put(buf)                                     # a plain list of arrays: no copy
        self.refs[version] = ref
        return pickle.dumps(ref)

    def retire(self, version):
        """Every rank is done with `version`: the trainer's own ref goes."""
        self.refs.pop(version).close()


@ray.remote(num_cpus=0)
class InferenceRank:
    """Tensor-parallel rank `rank` of `tp` of one inference replica."""

    def __init__(self, replica, rank, tp, trainers, shapes, token, check):
        start_rdt(token, f"replica{replica}-rank{rank}")
        self.name = f"replica {replica} rank {rank}"
        self.trainers, self.shapes, self.check, self.rank, self.tp = trainers, shapes, check, rank, tp
        self.rows = [rows_of(s, tp, rank) for s in shapes]
        part = [(hi - lo,) + tuple(s[1:]) for s, (lo, hi) in zip(shapes, self.rows)]
        self.live = [np.zeros(p, np.float32) for p in part]       # what requests are served with
        self.staging = [np.zeros(p, np.float32) for p in part]    # what the next version lands in
        self.version = 0
        self.pending = None

    def start_pull(self, version, blobs):
        """Starts pulling this rank's rows of version `version` and returns."""
        refs = [pickle.loads(b) for b in blobs]                  # one borrow per trainer rank
        ranges = []
        for i, (lo, hi) in enumerate(self.rows):
            owner = refs[i % self.trainers]
            ranges.append(owner[i // self.trainers][lo:hi])     # rows lo..hi of that tensor
        fetch = rdt.get_start(ranges, out=self.staging)          # one get, every range at once
        self.pending = (version, refs, fetch, time.monotonic())

    def compute(self):
        """Serves a request with the live weights (while the pull runs)."""
        x = np.ones(self.shapes[0][-1], np.float32)
        total = 0.0
        for w in self.live:
            total += float((w @ x[:w.shape[-1]]).sum()) if w.ndim == 2 else float(w.sum())
        return total

    def finish_pull(self, timeout=120.0):
        """Waits for the pull; switches to its version only if all of it
        landed (and, with check, every byte is right)."""
        version, refs, fetch, t0 = self.pending
        self.pending = None
        try:
            fetch.result(timeout)
        except rdt.RdtError as e:
            fetch.close()
            return {"rank": self.name, "version": self.version, "ok": False,
                    "why": f"pull of version {version} failed: {type(e).__name__}: {e}"}
        finally:
            for r in refs:
                r.close()
        seconds = time.monotonic() - t0
        if self.check:
            for i, (got, (lo, hi)) in enumerate(zip(self.staging, self.rows)):
                if not np.array_equal(got, weights(version, i, self.shapes[i], lo, hi)):
                    return {"rank": self.name, "version": self.version, "ok": False,
                            "why": f"version {version}: tensor {i} rows [{lo}, {hi}) differ"}
        self.live, self.staging = self.staging, self.live
        self.version = version
        return {"rank": self.name, "version": version, "ok": True, "seconds": seconds,
                "bytes": sum(a.nbytes for a in self.live),
                "over": [t["name"] for t in rdt.default_runtime().transports() if t["bytes_received"]]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=64)
    p.add_argument("--tensors", type=int, default=300)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--check", action="store_true", help="check every byte each rank receives")
    p.add_argument("--address", default=None, help="a Ray cluster to join (default: start one here)")
    p.add_argument("--trainer-resource", default=None)
    p.add_argument("--replica-resources", default=None, help="one custom resource per replica, comma-separated")
    a = p.parse_args()
    if a.tensors < 3 or a.trainers < 1 or a.replicas < 1 or a.tp < 1 or a.steps < 1:
        p.error("want at least 3 tensors and one trainer, replica, rank and step")
    placed = a.replica_resources.split(",") if a.replica_resources else None
    if placed is not None and len(placed) != a.replicas:
        p.error(f"--replica-resources names {len(placed)} resources for {a.replicas} replicas")

    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(address=a.address, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 x for x in (here, os.environ.get("PYTHONPATH", "")) if x)}})
    token = secrets.token_urlsafe(24)                           # the job's runtimes trust only each other
    shapes = layout(a.tensors, a.size_mb * MIB, a.tp)
    model_bytes = sum(int(np.prod(s)) * 4 for s in shapes)

    def at(resource):
        return {"resources": {resource: 1}} if resource else {}

    trainers = [Trainer.options(**at(a.trainer_resource)).remote(r, a.trainers, shapes, token)
                for r in range(a.trainers)]
    ranks = [InferenceRank.options(**at(placed[k] if placed else None)).remote(k, j, a.tp, a.trainers, shapes,
                                                                                 token, a.check)
             for k in range(a.replicas) for j in range(a.tp)]
    print(f"weight_sync: {len(shapes)} tensors, {model_bytes / MIB:.1f} MiB, {a.trainers} trainer ranks -> "
          f"{a.replicas} replicas x {a.tp} ranks", flush=True)

    failures = 0
    for v in range(1, a.steps + 1):
        blobs = ray.get([t.publish.remote(v) for t in trainers])
        t0 = time.monotonic()
        for r in ranks:
            r.start_pull.remote(v, blobs)
        served = ray.get([r.compute.remote() for r in ranks])     # on v - 1, while v lands
        results = ray.get([r.finish_pull.remote() for r in ranks])
        seconds = time.monotonic() - t0
        ray.get([t.retire.remote(v) for t in trainers])
        failed = [r for r in results if not r["ok"]]
        failures += len(failed)
        moved = sum(r["bytes"] for r in results if r["ok"])
        over = sorted({x for r in results if r["ok"] for x in r["over"]})
        print(f"step {v}: {len(results) - len(failed)}/{len(results)} ranks on version {v} in {seconds:.3f} s "
              f"({moved / MIB:.1f} MiB over {', '.join(over) or '-'}; served {len(served)} requests meanwhile)",
              flush=True)
        for r in failed:
            print(f"  {r['rank']} stays on version {r['version']}: {r['why']}", flush=True)
    ray.shutdown()
    if failures:
        raise SystemExit(f"weight_sync: {failures} pulls failed")
    print(f"weight_sync: {a.steps} versions reached every rank of {a.replicas} replicas"
          + (", every byte checked" if a.check else ""))


if __name__ == "__main__":
    main()
