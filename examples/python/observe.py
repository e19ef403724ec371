"""Watching rdt in a service: its log lines in Python's logging, and its
metrics on a Prometheus endpoint.

    pip install prometheus_client
    python examples/python/observe.py
"""

import logging
import multiprocessing as mp
import pickle
import urllib.request

import numpy as np
import prometheus_client

import rdt
import rdt.metrics


def producer(conn):
    refs = [rdt.put(np.full(n, 1.0, np.float32)) for n in (256, 256, 65536, 16)]  # 1 KiB, 1 KiB, 256 KiB, 64 B
    conn.send([pickle.dumps(r) for r in refs])
    conn.recv()                                    # keep them until the consumer is done


def main():
    # rdt logs to the logger "rdt": it goes wherever the application's logs go.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")  # to stderr
    rdt.set_log_level("info")

    # Serve the default runtime's metrics next to the application's own.
    rdt.metrics.register()
    server, _ = prometheus_client.start_http_server(0, addr="127.0.0.1")
    port = server.server_address[1]

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=producer, args=(child,))
    p.start()
    *refs, last = [pickle.loads(blob) for blob in parent.recv()]
    for ref in refs:
        rdt.get(ref)                               # three fetches from the other process
    parent.send("done")
    p.join()                                       # the producer exits with its objects
    try:
        rdt.get(last, timeout=10)                  # fails, and rdt logs a warning saying why
    except rdt.PeerUnavailableError as e:
        print("the owner is gone:", type(e).__name__)

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(("rdt_fetch_seconds_count", "rdt_bytes_total", "rdt_peers")):
            print(line)
    server.shutdown()


if __name__ == "__main__":
    main()
