"""The second process of ``rdt doctor`` and ``rdt bench``.

``python -m rdt._cli._peer`` reads one JSON request a line on stdin and answers
each with one JSON line on stdout: it puts objects for the other process to
fetch, serves raw loopback TCP for bench's baseline, and says what it has.
:class:`PeerProcess` is the other end: it starts the peer with the same
Python and bounds every wait on it, so a hung or dead peer becomes a
:class:`PeerError`, never a hang.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import rdt

# Longest answer line the peer may send (a serialized ref is a few KiB).
MAX_LINE = 1 << 20


class PeerError(Exception):
    """The peer process is gone, hung, or could not start."""


class RequestError(Exception):
    """The peer is alive, but the request failed there (its message)."""


def pattern(nbytes: int, seed: int) -> Any:
    """The bytes an object of the peer holds: cheap to make on both sides
    and different for every seed and offset within a 251-byte period."""
    import numpy as np
    period = ((np.arange(251, dtype=np.uint32) * 31 + seed) % 251).astype(np.uint8)
    return np.resize(period, nbytes)


def quiet_runtime(name: str) -> Any:
    """The process's default runtime, logging errors only unless RDT_LOG
    says otherwise: a refused transport is an expected finding here, not a
    warning to repeat on stderr."""
    return rdt.init(name=name, log_level=os.environ.get("RDT_LOG") or "error")


def builtin_transports(rt: Any) -> List[str]:
    """The library's built-in transports, by name: those rt made and those
    it could not make on this host (the library says which, so the
    command never restates the list)."""
    made = {t["name"] for t in rt.transports() if t["builtin"]}
    return sorted(made | set(rt.unavailable_transports()))


def automatic_order(rt: Any, memory: str = "host") -> List[str]:
    """The transports the automatic choice tries between two processes of
    this host, best first, for "host" or "cuda" memory, as the library
    ranks them."""
    key = "auto_rank_host" if memory == "host" else "auto_rank_cuda"
    return [t["name"] for t in sorted((t for t in rt.transports() if t[key] > 0), key=lambda t: (t[key], t["name"]))]


class PeerProcess:
    """A running peer (``python -m rdt._cli._peer``), spoken to over pipes."""

    def __init__(self, env: Optional[Dict[str, str]] = None, start_timeout: float = 30.0) -> None:
        self._stderr = tempfile.TemporaryFile()
        self._buf = b""
        self.proc = subprocess.Popen([sys.executable, "-m", "rdt._cli._peer"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, env=env, close_fds=True)
        self.hello = self.request("hello", start_timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, op: str, timeout: float, **args: Any) -> Dict[str, Any]:
        """Sends one request and waits up to timeout seconds for its answer."""
        line = (json.dumps(dict(args, op=op)) + "\n").encode()
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise PeerError(self._death()) from None
        reply = json.loads(self._read_line(op, timeout))
        if not reply.get("ok"):
            raise RequestError(reply.get("error", "the peer gave no reason"))
        return reply

    def _read_line(self, op: str, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise PeerError(f"the peer process (pid {self.pid}) did not answer {op!r} within {timeout:g} s; "
                                "it was killed")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise PeerError(self._death())
            self._buf += chunk
            if len(self._buf) > MAX_LINE and b"\n" not in self._buf:
                self.kill()
                raise PeerError(f"the peer process (pid {self.pid}) sent an answer over {MAX_LINE} bytes")
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _death(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        self._stderr.seek(0)
        tail = self._stderr.read().decode("utf-8", "replace").strip()[-800:]
        return f"the peer process (pid {self.pid}) exited with status {rc}" + (f": {tail}" if tail else "")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Asks the peer to exit (killing it if it does not) and reaps it."""
        if self.proc.poll() is None:
            try:
                self.request("exit", 5.0)
            except (PeerError, RequestError):
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:  # a request left unsent in the buffer of a dead peer's pipe
                pass
        self._stderr.close()

    def __enter__(self) -> "PeerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- the peer's side ----------------------------------------------------------

MAX_PUT_BYTES = 1 << 34  # a request is bounded before anything is allocated


class _Peer:
    def __init__(self) -> None:
        self.rt = quiet_runtime("rdt-peer")
        self.held: Dict[int, Any] = {}
        self.next_key = 0

    def hello(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        return {"pid": os.getpid(), "transports": self.rt.transport_names(),
                "unavailable": self.rt.unavailable_transports()}

    def put(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        nbytes = int(msg["nbytes"])
        if not 0 < nbytes <= MAX_PUT_BYTES:
            raise ValueError(f"nbytes {nbytes} is out of range")
        data = pattern(nbytes, int(msg.get("seed", 0)))
        if msg.get("device", "cpu") == "cuda":
            import torch
            data = torch.from_numpy(data).to("cuda:0")
            torch.cuda.synchronize()
        ref = self.rt.put({"x": data}, transport=msg.get("transport"))
        key = self.next_key
        self.next_key += 1
        self.held[key] = ref
        return {"key": key, "ref": base64.b64encode(pickle.dumps(ref)).decode()}

    def release(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        ref = self.held.pop(int(msg["key"]), None)
        if ref is not None:
            ref.release()
        return {}

    def tcp_serve(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """Listens on loopback; the one connection then asks for n bytes at a
        time (an 8-byte length) and gets them: the raw TCP baseline."""
        nbytes = int(msg["nbytes"])
        if not 0 < nbytes <= MAX_PUT_BYTES:
            raise ValueError(f"nbytes {nbytes} is out of range")
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(30)
        payload = memoryview(bytes(pattern(nbytes, 1)))

        def serve() -> None:
            with listener:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while True:
                    head = conn.recv(8, socket.MSG_WAITALL)
                    if len(head) < 8:
                        return
                    (n,) = struct.unpack("<Q", head)
                    conn.sendall(payload[:min(n, nbytes)])

        threading.Thread(target=serve, daemon=True).start()
        return {"port": listener.getsockname()[1]}


def main() -> None:
    # Answers go to the original stdout; anything else printing to fd 1
    # (a library, a stray print) lands on stderr instead of the protocol.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    peer: Optional[_Peer] = None
    for raw in sys.stdin.buffer:
        msg: Dict[str, Any] = {}
        try:
            msg = json.loads(raw)
            op = msg.get("op")
            if op == "exit":
                reply: Dict[str, Any] = {"ok": True}
            else:
                if peer is None:
                    peer = _Peer()
                handler = {"hello": peer.hello, "put": peer.put, "release": peer.release,
                           "tcp_serve": peer.tcp_serve}.get(op)
                if handler is None:
                    raise ValueError(f"unknown request {op!r}")
                reply = dict(handler(msg), ok=True)
        except Exception as e:  # the message goes back; the peer keeps serving
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        answers.write((json.dumps(reply) + "\n").encode())
        answers.flush()
        if msg.get("op") == "exit":
            break


if __name__ == "__main__":
    main()
