"""A process on a bed host that a test drives: one JSON command per line on
stdin, one JSON answer per line on stdout (events, such as a get having
started, are lines too). It keeps named refs and buffers between commands.

Commands (every answer has "ok"; a failed one "error", the exception's
class name, and "message"):

- init: runtime with tcp on the host's address (peer_timeout, lease)
- put NAME nbytes seed [transport] [keep_own]: an object of one uint8
  tensor filled from seed; answers "ref", the pickled ref in hex. Unless
  keep_own, the owner's own ref is released: the object lives only while
  others hold it.
- expose NAME nbytes: a writable object of zeros; answers "ref"
- take NAME ref [deadline]: unpickles a ref (a borrow) and keeps it;
  answers "seconds"
- drop NAME: closes a ref
- alloc NAME nbytes: a buffer of zeros to get into
- get REF BUF deadline [transport]: answers "started" first, then the
  result with "seconds"
- write REF nbytes seed deadline [transport]: writes a value made from
  seed; "started" first too
- notice NAME deadline: the oldest write notice of an exposed object
- check BUF seed: whether BUF holds the bytes made from seed
- digest BUF: a hash of BUF (to see that nothing changed it)
- stats: the runtime's counters
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import selectors
import sys
import time
import traceback
from typing import Any, Callable, Dict, Optional

import numpy as np

import rdt


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """nbytes bytes that differ for every seed and every offset's word."""
    words = (nbytes + 7) // 8
    a = (np.arange(words, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed * 97 + 1))
    return a.view(np.uint8)[:nbytes]


def speaker() -> Callable[..., None]:
    """say(**fields) writes one JSON line on the answers' own stream: the
    process's stdout as it started, while descriptor 1 becomes stderr, so
    that whatever a library prints to stdout (UCX's errors, Ray's worker
    logs) cannot break a line."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def say(**fields: Any) -> None:
        channel.write(json.dumps(fields) + "\n")
        channel.flush()
    return say


def failure(e: BaseException) -> Dict[str, Any]:
    """The answer to a command that raised: the test reads what went wrong."""
    return {"ok": False, "error": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}


def serve(obj: Any, say: Callable[..., None]) -> None:
    """Runs obj's methods as the commands on stdin ({"op": name, ...args},
    a line each) and says each one's answer, "ok" added."""
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            answer = getattr(obj, op)(**cmd)
        except Exception as e:
            answer = failure(e)
        answer.setdefault("ok", True)
        say(**answer)


class Agent:
    def __init__(self, say: Callable[..., None]) -> None:
        self.say = say
        self.rt: rdt.Runtime = None  # type: ignore[assignment]
        self.refs = {}
        self.bufs = {}
        self.owned = {}

    def init(self, address: str, token: str, peer_timeout: float = 2.0, lease: float = 30.0) -> dict:
        # The default runtime: unpickled refs become its borrows.
        self.rt = rdt.init(name="bed-" + address, listen_tcp=f"{address}:0", auth_token=token,
                           peer_timeout=peer_timeout, lease=lease)
        return {"address": self.rt.address, "transports": self.rt.transport_names()}

    def put(self, name: str, nbytes: int, seed: int, transport: str = "tcp", keep_own: bool = False) -> dict:
        data = pattern(nbytes, seed).copy()
        ref = self.rt.put(data, transport=transport)
        blob = pickle.dumps(ref).hex()
        self.owned[name] = data
        if keep_own:
            self.refs[name] = ref
        else:
            ref.close()
        return {"ref": blob}

    def expose(self, name: str, nbytes: int, transport: str = "tcp") -> dict:
        data = np.zeros(nbytes, dtype=np.uint8)
        ref = self.rt.expose(data, transport=transport)
        self.owned[name] = data
        self.refs[name] = ref
        return {"ref": pickle.dumps(ref).hex()}

    def take(self, name: str, ref: str, deadline: Optional[float] = None) -> dict:
        """Unpickles ref, waiting for its owner at most deadline seconds
        (None: the runtime's deserialize_timeout)."""
        before = self.rt.deserialize_timeout
        if deadline is not None:
            self.rt.deserialize_timeout = deadline
        t0 = time.monotonic()
        try:
            self.refs[name] = pickle.loads(bytes.fromhex(ref))
        except rdt.RdtError as e:
            return {"ok": False, "error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}
        finally:
            self.rt.deserialize_timeout = before
        return {"seconds": time.monotonic() - t0}

    def drop(self, name: str) -> dict:
        self.refs.pop(name).close()
        return {}

    def alloc(self, name: str, nbytes: int) -> dict:
        self.bufs[name] = np.zeros(nbytes, dtype=np.uint8)
        return {}

    def get(self, ref: str, buf: str, deadline: float, transport: str = "tcp") -> dict:
        self.say(event="started")
        t0 = time.monotonic()
        try:
            self.rt.get(self.refs[ref], out=self.bufs[buf], timeout=deadline, transport=transport)
        except rdt.RdtError as e:
            return {"ok": False, "error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}
        return {"seconds": time.monotonic() - t0}

    def write(self, ref: str, nbytes: int, seed: int, deadline: float, transport: str = "tcp") -> dict:
        value = pattern(nbytes, seed).copy()
        self.say(event="started")
        t0 = time.monotonic()
        try:
            self.rt.write(self.refs[ref], value, timeout=deadline, transport=transport)
        except rdt.RdtError as e:
            return {"ok": False, "error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}
        return {"seconds": time.monotonic() - t0}

    def notice(self, name: str, deadline: float) -> dict:
        n = self.refs[name].wait_notice(deadline)
        return {"failed": n.error is not None, "message": str(n.error or ""), "nbytes": n.nbytes}

    def _array(self, name: str) -> np.ndarray:
        """A buffer got into, or an owned object's array."""
        return self.bufs[name] if name in self.bufs else self.owned[name]

    def check(self, buf: str, seed: int) -> dict:
        b = self._array(buf)
        return {"same": bool(np.array_equal(b, pattern(b.size, seed)))}

    def digest(self, buf: str) -> dict:
        return {"digest": hashlib.sha256(self._array(buf)).hexdigest()}

    def stats(self) -> dict:
        return {"stats": self.rt.stats()}


class Lines:
    """The test's side of a process on a bed host that answers JSON lines
    (this agent, tests/hosts/ray_driver.py): calls to it, with deadlines."""

    def __init__(self, host: Any, args: list, env: Optional[Dict[str, str]] = None) -> None:
        self.host = host
        self.process = host.spawn(args, env=env)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.process.stdout, selectors.EVENT_READ)

    def send(self, op: str, **args: Any) -> None:
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()

    def read(self, timeout: float = 120) -> Dict[str, Any]:
        """The next line the agent writes, within timeout seconds."""
        if not self._sel.select(timeout):
            raise TimeoutError(f"the agent on {self.host.name} said nothing for {timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise EOFError(f"the agent on {self.host.name} ended (exit {self.process.wait(10)})")
        return json.loads(line)

    def ask(self, op: str, timeout: float = 120, **args: Any) -> Dict[str, Any]:
        """Runs op and returns its answer, failed or not (events before it
        skipped)."""
        self.send(op, **args)
        while True:
            answer = self.read(timeout)
            if "event" not in answer:
                return answer

    def call(self, op: str, timeout: float = 120, **args: Any) -> Dict[str, Any]:
        """Runs op; raises unless it worked."""
        answer = self.ask(op, timeout, **args)
        if not answer["ok"]:
            raise RuntimeError(f"{op} on {self.host.name}: {answer['error']}: {answer['message']}\n"
                               f"{answer.get('trace', '')}")
        return answer

    def start(self, op: str, **args: Any) -> None:
        """Sends op and returns once the agent says it started."""
        self.send(op, **args)
        event = self.read()
        assert event.get("event") == "started", event

    def close(self) -> None:
        if self.process.proc.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(20)
            except Exception:
                self.process.kill()


class Remote(Lines):
    """An agent started on a bed host, its runtime listening on the host's
    address with the token that all agents of the test share."""

    def __init__(self, host: Any, token: str, **init: Any) -> None:
        super().__init__(host, [sys.executable, os.path.abspath(__file__)])
        started = self.call("init", address=host.address, token=token, **init)
        self.address, self.transports = started["address"], started["transports"]


def main() -> None:
    say = speaker()
    serve(Agent(say), say)


if __name__ == "__main__":
    main()
