"""put hands the library a small integer key as the object's user data.
The Go runtime inside takes a value below 4096 held as a pointer for a
corrupt one and aborts the process ("invalid pointer found on stack") when
it moves a goroutine's stack, which frequent garbage collection makes
likely. Spawned interpreters put, pass and release on two runtimes from two
threads with GOGC=1; each must exit cleanly."""

import os
import subprocess
import sys
import textwrap
import time

CHILDREN = 3
SECONDS = 4.0

CHILD = textwrap.dedent("""
    import itertools, sys, threading, time
    import numpy as np
    import rdt

    a, b = rdt.Runtime("a"), rdt.Runtime("b")
    # Only the first 4095 puts of a runtime get keys below 4096; cycling
    # through them keeps every put in that range (each object here is
    # released long before its key comes round again).
    for rt in (a, b):
        rt._store._keys = itertools.cycle(range(1, 4096))
    stop = time.monotonic() + float(sys.argv[1])
    counts = {}
    errors = []

    def loop(rt, other):
        x = np.arange(16.0)
        n = 0
        try:
            while time.monotonic() < stop:
                ref = rt.put(x)
                borrowed = other.borrow(ref)  # as a ref sent to another process is
                borrowed.close()
                ref.close()
                n += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))
        counts[rt.name] = n

    threads = [threading.Thread(target=loop, args=(a, b)), threading.Thread(target=loop, args=(b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for rt in (a, b):
        # every object was freed and handed back by its key
        end = time.monotonic() + 30
        while (rt.stats()["objects"] or rt._store.entries) \\
                and time.monotonic() < end:
            time.sleep(0.01)
        assert rt.stats()["objects"] == 0 and rt.stats()["objects_freed"] == counts[rt.name], rt.stats()
        assert not rt._store.entries
    a.close()
    b.close()
    print("puts", counts["a"], counts["b"])
""")


def test_put_with_small_keys_survives_frequent_gc():
    env = dict(os.environ, GOGC="1")
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(SECONDS)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(CHILDREN)]
    failures = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=SECONDS + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            failures.append(f"pid {p.pid} did not finish: {err[-2000:]}")
            continue
        if p.returncode != 0 or not out.startswith("puts "):
            why = [line for line in err.splitlines() if line.startswith(("fatal error", "runtime:", "panic"))]
            failures.append(f"pid {p.pid} exited with {p.returncode}: {why[:4] or err[-2000:]}")
    assert not failures, "\n".join(failures)
    assert time.monotonic() - start < SECONDS + 60
