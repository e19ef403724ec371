"""What users do without rdt: pickle a 64 MiB buffer over a multiprocessing
pipe (spawn). Prints the receive-side throughput in GB/s as one number."""

import multiprocessing as mp
import statistics
import sys
import time

SIZE = 64 << 20
ROUNDS = 6


def producer(conn) -> None:
    payload = bytearray(SIZE)
    for i in range(0, SIZE, 4096):
        payload[i] = i & 0xFF
    for _ in range(ROUNDS):
        conn.recv()  # the consumer says when it is timing
        conn.send(payload)
    conn.close()


def main() -> None:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=producer, args=(child,))
    proc.start()
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        parent.send(None)
        data = parent.recv()
        times.append(time.perf_counter() - t0)
        if len(data) != SIZE or data[4096] != 0:
            sys.exit("pickle_pipe: wrong bytes received")
    proc.join()
    # The first round includes the producer's start-up work; drop it.
    print(f"{SIZE / statistics.median(times[1:]) / 1e9:.3f}")


if __name__ == "__main__":
    main()
