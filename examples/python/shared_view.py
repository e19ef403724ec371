"""Many readers on one host, one copy: a loader puts a model, four readers
view it with rdt.get(ref, copy=False) instead of copying it.

    python examples/python/shared_view.py

Each reader maps the loader's staged copy read-only, so four readers add
about nothing to the host's memory where copies would add four models.
"""

import multiprocessing as mp
import pickle

import numpy as np

import rdt

READERS = 4
LAYERS = 8
ROWS = 2048  # 8 layers of 2048 x 1024 float32: 64 MiB


def anonymous_mib():
    """This process's anonymous memory: what a copy would add to it."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reader(conn, blob):
    ref = pickle.loads(blob)
    before = anonymous_mib()
    model = rdt.get(ref, copy=False)              # no bytes copied: a read-only mapping
    total = sum(float(w.sum(dtype=np.float64)) for w in model["layers"])
    try:
        model["layers"][0][0, 0] = 1.0
        wrote = True
    except ValueError:                            # numpy refuses: the view is read-only
        wrote = False
    conn.send((total, anonymous_mib() - before, wrote))
    conn.recv()                                   # the loader waits for every reader
    ref.close()


def main():
    model = {"layers": [np.full((ROWS, 1024), float(i), np.float32) for i in range(LAYERS)], "step": 7}
    want = sum(float(w.sum(dtype=np.float64)) for w in model["layers"])
    ref = rdt.put(model)
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for _ in range(READERS):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=reader, args=(child, pickle.dumps(ref)))
        p.start()
        pipes.append(parent)
        procs.append(p)
    results = [c.recv() for c in pipes]
    for c in pipes:
        c.send("done")
    for p in procs:
        p.join()
    ref.close()
    for total, grew, wrote in results:
        assert total == want, "a reader saw other bytes"
        assert not wrote, "a reader wrote into the shared copy"
    size = sum(w.nbytes for w in model["layers"]) >> 20
    most = max(grew for _, grew, _ in results)
    print(f"shared_view: {READERS} readers viewed the {size} MiB model; each added at most {most:.1f} MiB "
          "(a copy adds the model)")


if __name__ == "__main__":
    main()
