"""The reader side of test_view.py, run in spawned processes."""

import gc
import pickle

import numpy as np

import rdt


def anonymous_kib():
    """This process's anonymous memory (what a copy would add), in KiB."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    raise RuntimeError("no Anonymous line in smaps_rollup")


def read_and_measure(conn, blob, copy):
    """Gets the ref (copy or view), reads every byte, and sends back the
    sum of the first tensor and the growth of anonymous memory in KiB."""
    ref = pickle.loads(blob)
    before = anonymous_kib()
    value = rdt.get(ref, timeout=60, copy=copy)
    a = value if isinstance(value, np.ndarray) else value[0]
    total = int(a.sum(dtype=np.uint64))
    conn.send((total, anonymous_kib() - before))
    conn.recv()


def view_and_hold(conn, blob):
    """Views the ref and holds the view until told to drop it; then says
    how many views the runtime holds."""
    value = rdt.get(pickle.loads(blob), timeout=60, copy=False)
    conn.send(("viewing", float(value.sum())))
    conn.recv()
    del value
    gc.collect()
    conn.send(rdt.default_runtime().stats()["views_open"])
    conn.recv()


def view_rewritten(conn, blob):
    """Deserializes a ref's bytes and tries to view it, then to copy it;
    sends back what each raised (or None)."""
    ref = rdt.default_runtime().deserialize(blob)
    out = []
    for copy in (False, True):
        try:
            rdt.get(ref, timeout=60, copy=copy)
            out.append(None)
        except rdt.RdtError as e:
            out.append((type(e).__name__, str(e)))
    conn.send(out)
    conn.recv()
