import multiprocessing as mp
import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# rdt cannot run in a child forked after loading it: the tests spawn.
mp.set_start_method("spawn", force=True)


def wait_until(cond, timeout=10.0):
    """Polls cond until it holds or the timeout passes; returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def check_notices_after_writer_killed(ref, first, whole):
    """Takes the notices of an exposed ref whose writer was killed in a loop
    of writes (first: the first notice, taken already) and checks that they
    came in the order of the writes, that only the last may have failed
    (torn: PEER_UNAVAILABLE), and that a last success left its version
    whole (whole(tag) says so). A torn write names its version when it was
    admitted on its own, and 0 when a prepared write's standing admission
    was open: the owner cannot know which run was under way."""
    import rdt
    notices = [first]
    while True:
        try:
            notices.append(ref.wait_notice(0))
        except rdt.GetTimeoutError:
            break
    *done, last = notices
    assert all(n.ok for n in done), "only the last write can have failed"
    tags = [n.tag for n in notices]
    if last.ok:  # killed between writes: that version is whole
        assert tags == list(range(first.tag, first.tag + len(notices)))
        assert whole(last.tag), f"version {last.tag} is whole"
    else:
        assert tags[:-1] == list(range(first.tag, first.tag + len(done)))
        assert last.tag in (0, first.tag + len(done)), tags
        assert isinstance(last.error, rdt.PeerUnavailableError), last.error


def all_threads_stopped(pid):
    """Whether every thread of process pid is stopped (state T or t)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            pass  # a thread that exited
    return bool(states) and all(st in ("T", "t") for st in states)


def stop_process(pid, timeout=10.0):
    """SIGSTOPs pid and returns once every thread of it stopped: the signal
    is delivered asynchronously, and a test that acts on a stopped process
    must not race its last steps."""
    os.kill(pid, signal.SIGSTOP)
    assert wait_until(lambda: all_threads_stopped(pid), timeout), f"process {pid} did not stop"


def _builtin_transports():
    """The built-in transports that move host memory (the GPU ones, listed
    only where CUDA is, have their own tests in test_gpu.py)."""
    import rdt
    with rdt.Runtime("probe") as rt:
        return [t["name"] for t in rt.transports() if t["builtin"] and "cpu" in t["devices"]]


BUILTINS = _builtin_transports()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skips without one; `make gpu-test` runs -m gpu)")


def pytest_report_header(config):
    import rdt
    from rdt import _lib
    return [f"rdt {rdt.library_version()} from {_lib.library_path()}; built-in transports: "
            f"{', '.join(BUILTINS) or 'none'}"]


def pytest_generate_tests(metafunc):
    # Tests taking `builtin` run once per built-in transport the runtime lists.
    if "builtin" in metafunc.fixturenames:
        if BUILTINS:
            metafunc.parametrize("builtin", BUILTINS)
        else:
            metafunc.parametrize("builtin", [pytest.param(None, marks=pytest.mark.skip(
                reason="the runtime lists no built-in transport"))])


class Child:
    """A spawned process running a function of workers.py, with a pipe."""

    def __init__(self, target, *args):
        ctx = mp.get_context("spawn")
        self.conn, child_end = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child_end,) + args)
        self.proc.start()
        child_end.close()

    def recv(self, timeout=60):
        if not self.conn.poll(timeout):
            raise TimeoutError("the child did not answer")
        return self.conn.recv()

    def send(self, msg):
        self.conn.send(msg)

    def stop(self, expect_ok=True):
        try:
            self.conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        if expect_ok:
            assert self.proc.exitcode == 0

    def kill(self):
        self.proc.kill()
        self.proc.join(30)


@pytest.fixture
def child():
    made = []

    def start(target, *args):
        c = Child(target, *args)
        made.append(c)
        return c
    yield start
    for c in made:
        if c.proc.is_alive():
            c.stop(expect_ok=False)


@pytest.fixture(scope="module")
def served_values():
    """One child that put partial_workers' values (torch's too where torch
    is installed); {name: their refs}, unpickled here."""
    import importlib.util
    import pickle

    import partial_workers
    c = Child(partial_workers.serve, importlib.util.find_spec("torch") is not None)
    refs = {k: pickle.loads(v) for k, v in c.recv().items()}
    yield refs
    for r in refs.values():
        r.close()
    c.stop()
