"""asyncio: awaiting gets without blocking the event loop, and a get
started now (an rdt.Fetch) and collected later.

    python examples/python/async_fetch.py
"""

import asyncio
import multiprocessing as mp
import pickle

import numpy as np

import rdt


def producer(conn):
    refs = [rdt.put(np.full((512, 512), i, dtype=np.float32)) for i in range(8)]
    conn.send(pickle.dumps(refs))
    conn.recv()


async def main(refs):
    # Eight gets at once in one event loop; no thread waits for them.
    arrays = await asyncio.gather(*(rdt.get_async(r, timeout=10) for r in refs))
    print("gathered", [float(a[0, 0]) for a in arrays])

    # Start a get, do other work, then await it (or call .result()).
    with rdt.get_start(refs[3]) as f:
        await asyncio.sleep(0)
        print("got later", float((await f)[0, 0]))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=producer, args=(child,))
    p.start()
    asyncio.run(main(pickle.loads(parent.recv())))
    parent.send("done")
    p.join()
