"""Fixtures of the vLLM backend's suite: vLLM's worker engine on the CPU
against a model, and a trainer in another process (trainer_proc.py) whose
weight-sync calls this process answers as vLLM's worker would."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from trainer_side import serve_call

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_until(cond, timeout=30.0):
    """Polls cond until it holds or the timeout passes; returns its last value."""
    end = time.monotonic() + timeout
    while True:
        got = cond()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.01)


class Trainer:
    """The trainer process. ``run(cmd)`` sends one command and answers the
    client calls it makes with ``engine`` until it is done; the errors the
    engine raised are kept in ``errors``."""

    def __init__(self, seed=0):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "trainer_proc.py"), str(seed)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=HERE, text=True)
        self.errors = []
        self.calls = []

    def send(self, cmd):
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            if self.proc.poll() is None:
                raise  # only a trainer that is gone may not hear its answer

    def read(self, timeout=60.0):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError(f"the trainer said nothing for {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("the trainer exited")
        return json.loads(line)

    def answer(self, engine, msg, before_update=None):
        call, arg = msg["call"], msg["arg"]
        self.calls.append(call)
        try:
            serve_call(engine, call, arg, before_update)
            self.send({"ok": True})
        except Exception as e:
            self.errors.append(e)
            self.send({"error": f"{type(e).__name__}: {e}"})

    def run(self, cmd, engine=None, before_update=None, timeout=60.0):
        self.send(cmd)
        while True:
            msg = self.read(timeout)
            if "call" in msg:
                self.answer(engine, msg, before_update)
            else:
                return msg

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def trainer_factory():
    made = []

    def make(seed=0):
        t = Trainer(seed)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
