"""Resharding pulls: each receiver fetches only the rows it needs.

Two trainer processes each own half of a model (a dict of float32 matrices
of --rows x --cols). Two receiver processes, ranks 0 and 1 of a
tensor-parallel group of 2, each pull from both trainers rows
[rank*R/2, (rank+1)*R/2) of every matrix, straight into arrays they
allocated beforehand, in one get. Nothing else moves: each receiver checks
every byte it got and that it received exactly its rows' bytes.

    python examples/python/reshard.py [--rows 512] [--cols 256] [--matrices 20]
"""

import argparse
import multiprocessing as mp
import pickle

import numpy as np

import rdt

TRAINERS = 2
RANKS = 2


def names(trainer, matrices):
    """The matrices trainer `trainer` owns: every TRAINERS-th one."""
    return [f"layer{i}.w" for i in range(trainer, matrices, TRAINERS)]


def matrix(name, rows, cols):
    """The contents of a matrix: any process can make them again to check."""
    seed = int(name[len("layer"):-len(".w")])
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


def trainer(conn, index, rows, cols, matrices):
    model = {name: matrix(name, rows, cols) for name in names(index, matrices)}
    ref = rdt.put(model)                   # nothing is copied
    conn.send(pickle.dumps(ref))
    conn.recv()                            # keep the weights until every receiver is done
    ref.close()


def receiver(conn, rank, blobs, rows, cols, matrices):
    refs = [pickle.loads(b) for b in blobs]          # one borrow per trainer
    lo, hi = rank * rows // RANKS, (rank + 1) * rows // RANKS
    shard = {}
    slices, out = [], []
    for t, ref in enumerate(refs):
        for name in names(t, matrices):
            shard[name] = np.empty((hi - lo, cols), np.float32)   # preallocated, written in place
            slices.append(ref[name][lo:hi])                       # rows lo..hi of that matrix
            out.append(shard[name])
    rt = rdt.default_runtime()
    before = rt.stats()["bytes_received"]
    rdt.get(slices, out=out, timeout=60)             # one fetch: every range of both trainers at once
    moved = rt.stats()["bytes_received"] - before
    for name, got in shard.items():
        want = matrix(name, rows, cols)[lo:hi]
        assert got.tobytes() == want.tobytes(), f"rank {rank}: {name} rows [{lo}, {hi}) differ"
    assert moved == sum(a.nbytes for a in shard.values()), f"rank {rank} received {moved} bytes"
    over = [t["name"] for t in rt.transports() if t["bytes_received"]]
    conn.send(f"receiver {rank}: rows [{lo}, {hi}) of {len(shard)} matrices from {len(refs)} trainers, "
              f"{moved} bytes over {', '.join(over)}, every byte checked")
    for r in refs:
        r.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--cols", type=int, default=256)
    p.add_argument("--matrices", type=int, default=20)
    a = p.parse_args()
    ctx = mp.get_context("spawn")          # rdt does not survive fork: use spawn
    trainers = []
    for i in range(TRAINERS):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=trainer, args=(child, i, a.rows, a.cols, a.matrices))
        proc.start()
        trainers.append((proc, parent))
    blobs = [conn.recv() for _, conn in trainers]    # pickled refs: a few hundred bytes each
    receivers = []
    for rank in range(RANKS):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=receiver, args=(child, rank, blobs, a.rows, a.cols, a.matrices))
        proc.start()
        receivers.append((proc, parent))
    failed = False
    for proc, conn in receivers:
        try:
            print(conn.recv(), flush=True)
        except EOFError:                   # it failed: its traceback is on stderr
            failed = True
        proc.join()
        failed = failed or proc.exitcode != 0
    for proc, conn in trainers:
        conn.send("done")
        proc.join()
    if failed:
        raise SystemExit("reshard: a receiver failed")
    print(f"reshard: {RANKS} receivers pulled their rows of {a.matrices} matrices from {TRAINERS} trainers")


if __name__ == "__main__":
    main()
