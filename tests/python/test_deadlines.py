"""Deadlines against an owner that stopped answering, and Ctrl-C.

The owner is a spawned process stopped with SIGSTOP: its sockets still
accept connections and requests, and nobody answers. get(timeout=T) and
deserialize(timeout=T) must still return at T (within a margin for a loaded
machine), and Ctrl-C must interrupt a wait that has no deadline.
"""

import asyncio
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rdt
import workers
from conftest import stop_process

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))

T = 1.0  # the deadline under test, seconds
MARGIN = 1.5  # how late it may be kept on a loaded machine
EXPECTED = np.arange(1000, dtype=np.float64)


class Stopped:
    """SIGSTOPs a process on entry (returning once every thread stopped) and
    SIGCONTs it on exit."""

    def __init__(self, pid):
        self.pid = pid

    def __enter__(self):
        stop_process(self.pid)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def _owner(child, transports):
    c = child(workers.serve_raw, transports)
    return c, c.recv()


def _timed(f):
    t0 = time.monotonic()
    try:
        f()
    finally:
        _timed.took = time.monotonic() - t0


TRANSPORTS = ["cma", "shm", "tcp", None]


@pytest.mark.parametrize("transport", TRANSPORTS, ids=lambda t: t or "auto")
def test_deserialize_and_unpickling_keep_their_deadline_with_a_stopped_owner(child, transport):
    c, refs = _owner(child, [transport])
    raw, blob = refs[transport]
    # New runtimes have no connection to the owner: they must make one,
    # and the stopped owner never answers the handshake.
    rt = rdt.Runtime("receiver", peer_timeout=30)
    default = rdt.default_runtime()
    saved = default.deserialize_timeout
    try:
        with Stopped(c.proc.pid):
            with pytest.raises(rdt.GetTimeoutError) as e:
                _timed(lambda: rt.deserialize(raw, timeout=T))
            assert isinstance(e.value, TimeoutError)
            assert _timed.took < T + MARGIN
            # pickle.loads takes no arguments: the runtime's own bound.
            default.deserialize_timeout = T
            with pytest.raises(rdt.GetTimeoutError):
                _timed(lambda: pickle.loads(blob))
            assert _timed.took < T + MARGIN
            assert rt.stats()["refs"] == 0  # nothing kept
        # Running again, the owner answers: the same bytes make refs.
        ref = rt.deserialize(raw)
        assert np.array_equal(rt.get(ref, timeout=30), EXPECTED)
        assert np.array_equal(rdt.get(pickle.loads(blob), timeout=30), EXPECTED)
        ref.close()
    finally:
        default.deserialize_timeout = saved
        rt.close()
    c.stop()


# Each case makes a phase of the fetch need the stopped owner: metadata the
# ref lacks (the object was put with another transport), or the bytes it
# serves (tcp). "auto" runs in a receiver that counts as another host, so
# that the automatic choice is tcp.
GET_CASES = {
    "cma": dict(put="shm", transport="cma"),
    "shm": dict(put="cma", transport="shm"),
    "tcp": dict(put="cma", transport="tcp"),
    "tcp-transfer": dict(put="tcp", transport=None),
    "auto": dict(put=None, transport=None, host_id="another-host"),
}


@pytest.mark.parametrize("case", list(GET_CASES))
def test_get_keeps_its_deadline_with_a_stopped_owner(child, case):
    spec = GET_CASES[case]
    c, refs = _owner(child, [spec["put"]])
    raw, _ = refs[spec["put"]]
    rt = rdt.Runtime("receiver", peer_timeout=30, host_id=spec.get("host_id"))
    try:
        ref = rt.deserialize(raw)  # while the owner runs: connected, borrowed
        out = np.zeros(1000)
        with Stopped(c.proc.pid):
            for kwargs in ({}, {"out": out}):  # new buffers, and the caller's
                with pytest.raises(rdt.GetTimeoutError):
                    _timed(lambda: rt.get(ref, timeout=T, transport=spec["transport"], **kwargs))
                assert T - 0.05 < _timed.took < T + MARGIN, kwargs
            assert (out == 0).all()
        assert np.array_equal(rt.get(ref, timeout=30, transport=spec["transport"]), EXPECTED)
        ref.close()
        assert rt.stats()["fetches_active"] == 0
    finally:
        rt.close()
    c.stop()


def test_a_slow_small_get_off_the_main_thread_is_moved_once(child):
    # A get of one small array runs in one C call. The main thread gives it
    # up after a slice to see Ctrl-C and starts again; a thread that never
    # sees signals must wait it out, not abort the transfer and move it twice.
    c, refs = _owner(child, ["tcp"])  # the owner serves the bytes
    raw, _ = refs["tcp"]
    rt = rdt.Runtime("receiver", peer_timeout=30)
    try:
        ref = rt.deserialize(raw)
        out = np.zeros(1000)
        ended = {}

        def get():
            try:
                ended["value"] = rt.get(ref, timeout=30, out=out)
            except BaseException as e:  # noqa: BLE001 - asserted below
                ended["error"] = e

        getter = threading.Thread(target=get)
        with Stopped(c.proc.pid):
            getter.start()
            time.sleep(0.5)  # five main-thread slices
        getter.join(30)
        assert not getter.is_alive() and "error" not in ended, ended
        assert np.array_equal(out, EXPECTED)
        st = rt.stats()
        assert (st["transfers_completed"], st["transfers_failed"]) == (1, 0), st
        ref.close()
    finally:
        rt.close()
    c.stop()


def _readline(proc, timeout):
    """A line of proc's stdout, or "" when none comes within timeout."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


@pytest.mark.parametrize("mode", ["get", "deserialize"])
def test_ctrl_c_interrupts_a_wait_for_a_stopped_owner(child, mode):
    # Put with shm: a get over cma needs its metadata from the owner.
    c, refs = _owner(child, ["shm"])
    raw, _ = refs["shm"]
    script = (f"import workers; workers.wait_until_interrupted({mode!r}, {raw.hex()!r}, "
              f"{'cma' if mode == 'get' else None!r})")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=HERE)
    try:
        assert _readline(proc, 60) == "ready"
        with Stopped(c.proc.pid):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert _readline(proc, 30) == "waiting"
            time.sleep(0.3)  # well inside the wait: no deadline, 30 s peer timeout
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            line = _readline(proc, 30)
            took = time.monotonic() - sent
            assert line.startswith("interrupted"), line
            assert took < MARGIN, f"KeyboardInterrupt came {took:.2f} s after SIGINT"
            assert line.endswith("fetches_active=0"), line  # the fetch was aborted and freed
            assert _readline(proc, 30) == "closed"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    c.stop()


def test_deserialize_timeout_is_checked_and_defaults_to_the_library_default():
    with pytest.raises(rdt.InvalidArgumentError):
        rdt.Runtime("bad", deserialize_timeout=-1)
    with pytest.raises(rdt.InvalidArgumentError):
        rdt.Runtime("bad", deserialize_timeout="soon")
    with rdt.Runtime("default") as rt:
        assert rt.deserialize_timeout == 30.0
        ref = rt.put(EXPECTED)
        # A ref of this runtime needs no owner to answer: any timeout works.
        for timeout in (0, 0.5, None):
            r = rt.deserialize(ref.serialize(), timeout=timeout)
            assert r.is_owner
            r.close()
        with pytest.raises(rdt.InvalidArgumentError):
            rt.deserialize(ref.serialize(), timeout=-2)
        ref.close()


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_timeout_zero_is_the_same_on_every_transport(child, stopped):
    """timeout=0 is no time at all (docs/python.md, "Timeouts"): a get, a
    write, a prepared get and a view of another process's object raise
    GetTimeoutError at once and move nothing, whichever transport and
    whether the owner runs; this process's own objects come back."""
    names = ["cma", "shm", "tcp"]
    c, refs = _owner(child, names)
    e = child(workers.exposer, names, None)
    blobs = e.recv()
    rt = rdt.default_runtime()
    got = {t: rt.deserialize(refs[t][0]) for t in names}
    writable = {t: rt.deserialize(blobs[t]) for t in names}
    before = rt.stats()
    out = np.zeros(1000)
    pids = [c.proc.pid, e.proc.pid] if stopped else []
    for pid in pids:
        stop_process(pid)
    try:
        for t in names:
            calls = {
                "get": lambda: rdt.get(got[t], timeout=0, transport=t),
                "get out=": lambda: rdt.get(got[t], timeout=0, transport=t, out=out),
                "get_async": lambda: asyncio.run(rdt.get_async(got[t], timeout=0, transport=t)),
                "view": lambda: rdt.get(got[t], timeout=0, copy=False),
                "prepared": lambda: rdt.prepare_get(got[t], transport=t).run(timeout=0),
                "write": lambda: rt.write(writable[t], np.ones(4096, np.uint8), timeout=0, transport=t),
            }
            for what, call in calls.items():
                with pytest.raises(rdt.GetTimeoutError, match="timeout 0|no time"):
                    call()
        assert (out == 0).all()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    after = rt.stats()
    for k in ("transfers_completed", "transfers_failed", "writes_completed", "writes_failed"):
        assert after[k] == before[k], f"{k}: nothing was started"
    # With time, the same refs move; an own object needs none.
    for t in names:
        assert np.array_equal(rdt.get(got[t], timeout=30, transport=t), EXPECTED)
    mine = np.arange(5.0)
    with rdt.put(mine) as r:
        assert rdt.get(r, timeout=0) is mine
        np.testing.assert_array_equal(rdt.get(r, timeout=0, out=np.zeros(5)), mine)
    for r in list(got.values()) + list(writable.values()):
        r.close()
    c.stop()
    e.send("stop")
    e.stop()
