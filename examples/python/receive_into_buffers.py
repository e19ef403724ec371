"""Receiving into preallocated buffers with out=, and a list of refs fetched
concurrently.

    python examples/python/receive_into_buffers.py
"""

import multiprocessing as mp
import pickle

import numpy as np

import rdt


def producer(conn):
    refs = [rdt.put(np.full((256, 256), i, dtype=np.float32)) for i in range(4)]
    conn.send(pickle.dumps(refs))
    conn.recv()


def main():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=producer, args=(child,))
    p.start()
    refs = pickle.loads(parent.recv())
    buffers = [np.empty((256, 256), dtype=np.float32) for _ in refs]
    rdt.get(refs, out=buffers, timeout=10)   # one fetch for all four, into our buffers
    print([float(b[0, 0]) for b in buffers])
    parent.send("done")
    p.join()


if __name__ == "__main__":
    main()
