"""Two processes: a producer puts a dict of arrays, a consumer gets it.

    python examples/python/two_processes.py
"""

import multiprocessing as mp
import pickle

import numpy as np

import rdt


def producer(conn):
    weights = {"layer0": np.random.rand(1024, 1024).astype(np.float32), "step": 42}
    ref = rdt.put(weights)                 # nothing is copied
    conn.send(pickle.dumps(ref))           # a few hundred bytes, whatever the size
    conn.recv()                            # keep the arrays until the consumer is done
    ref.close()


def main():
    ctx = mp.get_context("spawn")          # rdt does not survive fork: use spawn
    parent, child = ctx.Pipe()
    p = ctx.Process(target=producer, args=(child,))
    p.start()
    ref = pickle.loads(parent.recv())      # a borrow, counted by the producer
    print("got", ref)
    value = rdt.get(ref)                   # the bytes move now (cma on one host)
    print("step", value["step"], "layer0", value["layer0"].shape, value["layer0"].dtype)
    ref.close()
    parent.send("done")
    p.join()


if __name__ == "__main__":
    main()
