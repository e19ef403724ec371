#!/usr/bin/env python3
"""Soak test: several processes put and get tensors over every host transport
for a while, every byte is verified, and afterwards every counter, descriptor
count and resident size must be back where it was.

    python tests/soak/soak.py --seconds 60        (make soak SECONDS=60)

Each worker process has its own rdt runtime (its default runtime, so pickled
refs land in it) and three threads: a producer that puts objects of 4 KiB to
16 MiB (one to three numpy tensors whose bytes follow from a seed) with a
random transport, hands refs to the other workers through multiprocessing
queues (pickled ObjectRefs or ``serialize()`` bytes) and releases its own
handle at a random time (sometimes at once, before anyone fetched), and two
consumers that take refs, get them zero to three times with a random
per-get transport override (auto, cma, shm, tcp), with and without ``out=``,
sometimes several refs in one get, hold some for later, forward some
(deserialized and serialized again, or the bytes as they came) to a third
worker, and drop a few unread so that their leases expire. Every get checks
dtype, shape and every byte, and every remote get must show up in the
counters of the transport that should have moved it. During the load,
short-lived visitor processes come and go one after another, doing the same
for a few seconds.

The run has two phases: a warm-up, after which each worker records its
descriptors and VmRSS as the baseline, and the load phase of ``--seconds``.
Each phase ends with a drain: producers stop, every message is consumed,
every handle released; then every runtime's counters (objects, refs,
borrows, borrowed objects, refs in transit, active fetches) must reach zero,
the binding must hold no put tensors any more, descriptors must be back
within ``--fd-slack`` (connections between live workers, the transports'
pools, are only held to the pools' bound) and VmRSS within
``--rss-slack-mib`` (measured with the receive cache emptied: it keeps
dropped buffers on purpose, and is held to its own bound). The run fails (exit status 1, naming what did not
return) on any failed get, corrupt byte, dead process or missed deadline.
Children are killed on every way out.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import pickle
import queue
import random
import select
import socket
import struct
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

HOST_TRANSPORTS = ("cma", "shm", "tcp")
DTYPES = ("uint8", "int16", "int32", "int64", "float32", "float64", "complex64")
# Counters of a runtime that must be zero once everything is released.
END_STATE = ("objects", "refs", "borrows", "borrowed_objects", "refs_in_transit", "fetches_active", "views_open")
GET_TIMEOUT = 30.0  # seconds; a get that takes this long counts as failed
MASK64 = (1 << 64) - 1
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# ---- the bytes of a tensor follow from its seed ---------------------------------

def pattern(seed: int, nbytes: int) -> np.ndarray:
    """nbytes bytes that depend on seed and on their position (a shifted or
    swapped range never matches)."""
    words = np.arange((nbytes + 7) // 8, dtype=np.uint64)
    words += np.uint64((seed * 0x100000001B3) & MASK64)
    words *= GOLDEN
    words ^= words >> np.uint64(29)
    return words.view(np.uint8)[:nbytes]


def make_tensor(seed: int, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return pattern(seed, n).copy().view(dtype).reshape(shape)


def random_spec(rng: random.Random, counter: int, base_seed: int, min_size: int, max_size: int) -> Dict[str, Any]:
    """An object: its form (one tensor, a list or a dict) and each tensor's
    dtype, shape and seed. Total sizes are log-uniform in [min, max]."""
    total = int(round(2 ** rng.uniform(np.log2(min_size), np.log2(max_size))))
    count = rng.choice((1, 1, 1, 2, 3))
    form = "single" if count == 1 else rng.choice(("list", "dict"))
    tensors = []
    left = total
    for t in range(count):
        size = left if t == count - 1 else rng.randint(min(1024, left // 2), max(1024, left // 2))
        left -= size
        dtype = rng.choice(DTYPES)
        items = max(1, size // np.dtype(dtype).itemsize)
        if items % 4 == 0 and rng.random() < 0.5:
            shape: Tuple[int, ...] = (4, items // 4)
        elif items % 2 == 0 and rng.random() < 0.3:
            shape = (items // 2, 2)
        else:
            shape = (items,)
        seed = (base_seed * 1_000_003 + counter * 8 + t) & MASK64
        tensors.append((dtype, shape, seed))
    return {"form": form, "tensors": tensors}


def build_value(spec: Dict[str, Any]) -> Any:
    arrays = [make_tensor(seed, dtype, shape) for dtype, shape, seed in spec["tensors"]]
    if spec["form"] == "single":
        return arrays[0]
    if spec["form"] == "list":
        return arrays
    return {f"t{i}": a for i, a in enumerate(arrays)}


def spec_nbytes(spec: Dict[str, Any]) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for dtype, shape, _ in spec["tensors"])


def flat_result(value: Any) -> List[Any]:
    """The tensors of a get's result in put order (a ref read from
    serialize() bytes gives a tensor or a list; a pickled one the put form)."""
    if isinstance(value, dict):
        return [value[f"t{i}"] for i in range(len(value))]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


class Verdict:
    def __init__(self) -> None:
        self.bytes = 0
        self.corrupt = 0
        self.problems: List[str] = []


def verify(spec: Dict[str, Any], got: List[Any], verdict: Verdict) -> None:
    tensors = spec["tensors"]
    if len(got) != len(tensors):
        verdict.problems.append(f"{len(got)} tensors, want {len(tensors)}")
        return
    for i, ((dtype, shape, seed), g) in enumerate(zip(tensors, got)):
        if not isinstance(g, np.ndarray):
            verdict.problems.append(f"tensor {i} is a {type(g).__name__}, want numpy")
            continue
        if str(g.dtype) != dtype or tuple(g.shape) != tuple(shape):
            verdict.problems.append(f"tensor {i} is {g.dtype}{g.shape}, want {dtype}{tuple(shape)}")
            continue
        want = pattern(seed, g.nbytes)
        have = np.ascontiguousarray(g).view(np.uint8).reshape(-1)
        verdict.corrupt += int(np.count_nonzero(have != want))
        verdict.bytes += g.nbytes


# ---- a worker process -------------------------------------------------------------

def memory_kib() -> Dict[str, int]:
    """VmRSS and its parts (anonymous, file, shared memory), KiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1])
    return out


def _socket_tables() -> Tuple[Dict[str, Tuple[int, int, str]], Dict[str, bool]]:
    """This network namespace's TCP sockets by inode (local port, remote
    port, state) and Unix sockets by inode (whether listening)."""
    tcp: Dict[str, Tuple[int, int, str]] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{name}") as f:
                next(f)
                for line in f:
                    p = line.split()
                    tcp[p[9]] = (int(p[1].rsplit(":", 1)[1], 16), int(p[2].rsplit(":", 1)[1], 16), p[3])
        except OSError:
            pass
    unix: Dict[str, bool] = {}
    try:
        with open("/proc/self/net/unix") as f:
            next(f)
            for line in f:
                p = line.split()
                unix[p[6]] = bool(int(p[3], 16) & 0x10000)
    except OSError:
        pass
    return tcp, unix


def _peer_closed(fd: int) -> bool:
    """Whether the other end of a connected socket has closed (it is kept
    for nothing then); poll only looks, it reads nothing."""
    p = select.poll()
    try:
        p.register(fd, select.POLLRDHUP | select.POLLHUP)
        return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError):
        return False


def _peer_pid(fd: int) -> int:
    """The pid at the other end of a connected Unix socket (SO_PEERCRED),
    read through a duplicate so the runtime's descriptor is left alone."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return 0
    try:
        return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    except OSError:
        return 0
    finally:
        s.close()


def descriptors() -> List[Dict[str, Any]]:
    """Every descriptor of this process: its kind (tcp, unix, pipe, memfd,
    anon_inode:[pidfd], a file...) and, for a socket, whether it listens,
    its ports or peer pid, and whether its other end has closed."""
    tcp, unix = _socket_tables()
    listen_ports = set()
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        d: Dict[str, Any] = {"kind": target}
        if target.startswith("socket:["):
            inode = target[8:-1]
            if inode in tcp:
                lport, rport, state = tcp[inode]
                d.update(kind="tcp", listener=state == "0A", lport=lport, rport=rport, state=state)
                if state == "0A":
                    listen_ports.add(lport)
            elif inode in unix:
                d.update(kind="unix", listener=unix[inode])
                if not unix[inode]:
                    d["peer_pid"] = _peer_pid(int(fd))
            else:
                d["kind"] = "socket"
            if not d.get("listener"):
                d["closed"] = _peer_closed(int(fd))
        elif target.startswith("pipe:"):
            d["kind"] = "pipe"
        elif target.startswith("/memfd:"):
            d["kind"] = "memfd"
        found.append(d)
    for d in found:
        if d["kind"] == "tcp" and not d["listener"]:
            d["served"] = d["lport"] in listen_ports
    return found


# The tcp and shm transports keep up to 16 idle connections per peer (their
# maxIdle); seen from both ends that is 64 sockets between two runtimes,
# plus their control connections.
POOLED_PER_PEER = 4 * 16 + 4


def label(d: Dict[str, Any]) -> str:
    """A descriptor's kind for messages: "tcp dialed", "unix listener",
    "tcp served (peer closed)", "anon_inode:[pidfd]"..."""
    if d["kind"] not in ("tcp", "unix", "socket"):
        return d["kind"]
    if d.get("listener"):
        return d["kind"] + " listener"
    role = "" if d["kind"] == "socket" else (" served" if d.get("served") else " dialed" if d["kind"] == "tcp"
                                                else "")
    return d["kind"] + role + (" (peer closed)" if d.get("closed") else "")


def classify(fds: Dict[int, List[Dict[str, Any]]], pids: Dict[int, int]) -> Dict[int, Dict[str, Any]]:
    """Splits each worker's descriptors into connections to another live
    worker of this run (the transports' pools and control connections, also
    those the other side already closed, say for idleness, which stay in a
    pool until it is used again) and everything else, which must come back
    to its baseline: a descriptor kept for a peer that is gone lands there."""
    port_owner = {d["lport"]: w for w, ds in fds.items() for d in ds if d["kind"] == "tcp"}
    pid_owner = {pid: w for w, pid in pids.items()}
    out = {}
    for w, ds in fds.items():
        pooled: collections.Counter = collections.Counter()
        closed = 0
        other: collections.Counter = collections.Counter()
        for d in ds:
            peer = None
            if d["kind"] == "tcp" and not d["listener"]:
                peer = port_owner.get(d["rport"])
            elif d["kind"] == "unix" and not d["listener"]:
                peer = pid_owner.get(d.get("peer_pid", 0))
            if peer is not None and peer != w:
                pooled[peer] += 1
                closed += bool(d.get("closed"))
            else:
                other[label(d)] += 1
        out[w] = {"pooled": pooled, "pooled_closed": closed, "other": other}
    return out


class Tally:
    """A worker's counts, shared by its threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.failures: collections.Counter = collections.Counter()
        self.examples: List[str] = []

    def add(self, **kw: int) -> None:
        with self.lock:
            self.counts.update(kw)

    def fail(self, kind: str, message: str) -> None:
        with self.lock:
            self.failures[kind] += 1
            if len(self.examples) < 8:
                self.examples.append(f"{kind}: {message}")

    def snapshot(self) -> Dict[str, Any]:
        with self.lock:
            return {"counts": dict(self.counts), "failures": dict(self.failures), "examples": list(self.examples)}


class Shared:
    """What the coordinator shares with the processes it starts. Index
    ``workers`` (one past the workers) is the visitor's: its inbox and
    progress slot, taken by one short-lived visitor process after another."""

    def __init__(self, ctx: Any, workers: int) -> None:
        self.inboxes = [ctx.Queue() for _ in range(workers + 1)]
        self.reports = ctx.Queue()
        self.outstanding = ctx.Value("q", 0)  # messages sent and not yet handled, by anyone
        self.progress = ctx.Array("q", workers + 1)
        names = ["finish"] + [f"{p}_{s}" for p in ("warmup", "load") for s in ("go", "stop", "quiet")]
        self.events = {k: ctx.Event() for k in names}
        # Whether the visitor takes refs now, and how many sent to it are
        # not handled yet; both under visitor_lock.
        self.visitor_lock = ctx.Lock()
        self.visitor_open = ctx.Value("q", 0, lock=False)
        self.visitor_outstanding = ctx.Value("q", 0, lock=False)


class Worker:
    def __init__(self, index: int, cfg: Dict[str, Any], shared: Shared, visitor: Optional[int] = None) -> None:
        import rdt
        self.rdt = rdt
        self.index = index
        self.cfg = cfg
        self.shared = shared
        self.inboxes = shared.inboxes
        self.inbox = shared.inboxes[index]
        self.reports = shared.reports
        self.outstanding = shared.outstanding
        self.progress = shared.progress
        self.events = shared.events
        self.visitor = visitor  # the visitor's serial number, None for a worker
        self.tally = Tally()
        name = f"soak{index}" if visitor is None else f"soak-visitor{visitor}"
        self.rt = rdt.init(name=name, lease=cfg["lease"])
        names = self.rt.transport_names(builtin=True)
        self.transports = [t for t in HOST_TRANSPORTS if t in names]
        self.choices: List[Optional[str]] = [None] + list(self.transports)
        # What a fetch without a transport picks on one host (docs/abi.md).
        self.auto_transport = "cma" if "cma" in self.transports else "shm"
        self.counter = 0
        self.stop = threading.Event()     # producers stop putting (drain)
        self.quiet = threading.Event()    # nothing is outstanding anywhere: consumers end

    # -- messages between workers --

    def send(self, target: int, msg: Dict[str, Any]) -> None:
        with self.outstanding.get_lock():
            self.outstanding.value += 1
        self.inboxes[target].put(msg)

    def done(self, n: int = 1) -> None:
        with self.outstanding.get_lock():
            self.outstanding.value -= n
        if self.visitor is not None:  # everything in its inbox came through send_visitor
            with self.shared.visitor_lock:
                self.shared.visitor_outstanding.value -= n

    def other(self, rng: random.Random) -> int:
        """Another worker (never the visitor: refs reach it only from
        send_visitor, so that it can tell when none will come any more)."""
        n = self.cfg["workers"]
        return rng.choice([w for w in range(n) if w != self.index])

    def send_visitor(self, ref: Any, msg: Dict[str, Any], rng: random.Random) -> None:
        sh = self.shared
        with sh.visitor_lock:
            if not sh.visitor_open.value:
                return
            form, data = self.encode(ref, rng)
            sh.visitor_outstanding.value += 1
            with self.outstanding.get_lock():
                self.outstanding.value += 1
            self.inboxes[self.cfg["workers"]].put(dict(msg, form=form, data=data))
        self.tally.add(refs_sent=1, refs_sent_to_visitor=1)

    def encode(self, ref: Any, rng: random.Random) -> Tuple[str, bytes]:
        if rng.random() < 0.5:
            return "pickle", pickle.dumps(ref)
        return "bytes", ref.serialize()

    def decode(self, form: str, data: bytes) -> Any:
        if form == "pickle":
            return pickle.loads(data)
        return self.rt.deserialize(data)

    # -- gets --

    def get_and_verify(self, refs: List[Any], msgs: List[Dict[str, Any]], rng: random.Random, prev: Any) -> Any:
        """One get of refs (one fetch), every byte verified. Returns the
        result, which the caller keeps alive over its next get of the same
        object, so that a new buffer cannot be the old one with the right
        bytes already in it."""
        specs = [m["spec"] for m in msgs]
        override = rng.choice(self.choices)
        label = override or "auto"
        mode = rng.random()
        use_out = mode < 0.4
        view = not use_out and mode < 0.55  # copy=False: a view of the owner's staged copy, moving nothing
        if view:
            override, label = None, "view"
        try:
            if view:
                value = self.rdt.get(refs if len(refs) > 1 else refs[0], timeout=GET_TIMEOUT, copy=False)
                values = value if len(refs) > 1 else [value]
                per_ref = [flat_result(v) for v in values]
                result = value
            elif use_out:
                outs = [np.empty(shape, dtype) for s in specs for dtype, shape, _ in s["tensors"]]
                for o in outs:
                    o.view(np.uint8).fill(0xA5)  # bytes nobody wrote stay visible
                arg = outs if len(outs) > 1 else outs[0]
                self.rdt.get(refs if len(refs) > 1 else refs[0], timeout=GET_TIMEOUT, transport=override,
                             out=arg)
                per_ref: List[List[Any]] = []
                i = 0
                for s in specs:
                    per_ref.append(outs[i:i + len(s["tensors"])])
                    i += len(s["tensors"])
                result: Any = outs
            else:
                value = self.rdt.get(refs if len(refs) > 1 else refs[0], timeout=GET_TIMEOUT, transport=override)
                values = value if len(refs) > 1 else [value]
                per_ref = [flat_result(v) for v in values]
                result = value
        except self.rdt.RdtError as e:
            self.tally.fail(type(e).__name__, f"get via {label} of {[r.id for r in refs]}: {e}")
            return None
        for m, got in zip(msgs, per_ref):
            s, owner = m["spec"], m["owner"]
            v = Verdict()
            verify(s, got, v)
            if v.problems:
                self.tally.fail("wrong_result", f"get via {label}{' out=' if use_out else ''}: {v.problems}")
                continue
            local = owner == self.index
            self.tally.add(gets_verified=1, bytes_verified=v.bytes, corrupt_bytes=v.corrupt,
                           **{f"get_{label}": 1, "gets_own_object" if local else "gets_remote": 1,
                              "gets_out" if use_out else "gets_view" if view else "gets_alloc": 1})
            if owner == self.cfg["workers"] and self.visitor is None:
                self.tally.add(gets_of_visitor_objects=1)
            if not local and not view:  # the transport rdt must have used: the override, the put's, else its choice
                chosen = override or (m["put"] if m["put"] != "auto" else self.auto_transport)
                self.tally.add(**{f"moved_{chosen}": 1})
            if v.corrupt:
                self.tally.fail("corrupt", f"{v.corrupt} corrupt bytes via {label} (owner worker {owner})")
        if len(refs) > 1:
            self.tally.add(multi_ref_gets=1)
        with self.progress.get_lock():
            self.progress[self.index] += len(refs)
        return result

    # -- the producer --

    def produce(self) -> None:
        cfg = self.cfg
        rng = random.Random(f"{cfg['seed']}/{self.index}/producer")
        own: List[Tuple[float, Any, Dict[str, Any], str]] = []  # (release at, ref, spec, put transport)
        while not self.stop.is_set():
            now = time.monotonic()
            keep = []
            for due, ref, spec, put in own:
                if due <= now:
                    if rng.random() < 0.15:  # the owner reads its own object too
                        self.get_and_verify([ref], [{"spec": spec, "owner": self.index, "put": put}], rng, None)
                    ref.close()
                    self.tally.add(owner_releases=1)
                else:
                    keep.append((due, ref, spec, put))
            own = keep
            if self.rt.stats()["objects"] >= cfg["max_objects"]:
                time.sleep(0.005)  # receivers still hold them: keeps memory bounded
                continue
            self.counter += 1
            # Unique per process and object, so that a get of the wrong object fails.
            base = (cfg["seed"] * 1024 + self.index) * 1_000_003 + (0 if self.visitor is None else self.visitor + 1)
            spec = random_spec(rng, self.counter, base, cfg["min_size"], cfg["max_size"])
            put_transport = rng.choice(self.choices)
            try:
                ref = self.rt.put(build_value(spec), transport=put_transport)
            except self.rdt.RdtError as e:
                self.tally.fail("put_" + type(e).__name__, f"put via {put_transport or 'auto'}: {e}")
                continue
            self.tally.add(puts=1, put_bytes=spec_nbytes(spec), **{f"put_{put_transport or 'auto'}": 1})
            receivers = 1 if rng.random() < 0.85 else 2  # serialize once per receiver
            targets = rng.sample([w for w in range(cfg["workers"]) if w != self.index], receivers)
            msg = {"spec": spec, "owner": self.index, "hops": rng.choice((0, 0, 1, 2)), "put": put_transport or "auto"}
            try:
                for target in targets:
                    form, data = self.encode(ref, rng)
                    self.send(target, dict(msg, form=form, data=data))
                    self.tally.add(refs_sent=1)
                if self.visitor is None and rng.random() < 0.15:
                    self.send_visitor(ref, msg, rng)
            except self.rdt.RdtError as e:
                self.tally.fail("serialize_" + type(e).__name__, str(e))
            # Released at once (often before anyone fetched) or a little later.
            delay = 0.0 if rng.random() < 0.4 else rng.uniform(0, cfg["hold_max"])
            own.append((time.monotonic() + delay, ref, spec, put_transport or "auto"))
        for _, ref, _, _ in own:
            ref.close()
            self.tally.add(owner_releases=1)

    # -- the consumers --

    def consume(self, tid: int) -> None:
        cfg = self.cfg
        rng = random.Random(f"{cfg['seed']}/{self.index}/consumer{tid}")
        held: List[Tuple[float, Any, Dict[str, Any]]] = []  # (due, ref, msg)
        while True:
            now, stopping = time.monotonic(), self.stop.is_set()
            due = [h for h in held if h[0] <= now or stopping]
            if due and len(held) > len(due) and rng.random() < 0.3:
                due = held  # fetch the others with it, in one get
            if due:
                held = [h for h in held if not (h[0] <= now or stopping or due is held)]
                try:
                    self.finish_held(due, rng)
                except Exception as e:  # a defect of this script: count it, go on
                    self.tally.fail(type(e).__name__, "".join(traceback.format_exception_only(type(e), e)).strip())
                self.done(len(due))
                continue
            if self.quiet.is_set() and not held:
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    return
            else:
                try:
                    msg = self.inbox.get(timeout=0.05)
                except queue.Empty:
                    continue
            try:
                kept = self.handle(msg, rng)
            except Exception as e:  # a defect of this script, or an unexpected error: count it, go on
                self.tally.fail(type(e).__name__, "".join(traceback.format_exception_only(type(e), e)).strip())
                kept = None
            if kept is not None:
                held.append((time.monotonic() + rng.uniform(0, cfg["hold_max"]), kept, msg))
            else:
                self.done()

    def handle(self, msg: Dict[str, Any], rng: random.Random) -> Any:
        """Acts on one received ref. Returns the ref if it is held for later
        (its message stays outstanding until then), else None."""
        if msg["hops"] > 0 and rng.random() < 0.25:
            # Pass the bytes on as they came, without deserializing them.
            self.send(self.other(rng), dict(msg, hops=msg["hops"] - 1))
            self.tally.add(forwarded_raw=1)
            return None
        if msg["form"] == "bytes" and msg["owner"] < self.cfg["workers"] and rng.random() < 0.03:
            # Its lease expires at the owner (not a visitor's: it would wait
            # for the lease before it may leave).
            self.tally.add(dropped_unread=1)
            return None
        try:
            ref = self.decode(msg["form"], msg["data"])
        except self.rdt.RdtError as e:
            self.tally.fail("deserialize_" + type(e).__name__, str(e))
            return None
        self.tally.add(refs_received=1)
        if rng.random() < 0.05 and msg["form"] == "bytes":
            try:  # the same bytes deserialized twice: two borrows
                again = self.rt.deserialize(msg["data"])
                self.get_and_verify([again], [msg], rng, None)
                again.close()
                self.tally.add(double_deserialize=1)
            except self.rdt.RdtError as e:
                self.tally.fail("deserialize_twice_" + type(e).__name__, str(e))
        gets = rng.choices((0, 1, 2, 3), weights=(12, 55, 23, 10))[0]
        forward_at = rng.randrange(gets + 1) if msg["hops"] > 0 and rng.random() < 0.5 else -1
        prev = None
        for i in range(gets + 1):
            if i == forward_at:
                self.forward(ref, msg, rng)
            if i < gets:
                prev = self.get_and_verify([ref], [msg], rng, prev)
        if gets == 0:
            self.tally.add(released_unfetched=1)
        if not self.stop.is_set() and rng.random() < 0.2:
            return ref
        ref.close()
        return None

    def forward(self, ref: Any, msg: Dict[str, Any], rng: random.Random) -> None:
        try:
            form, data = self.encode(ref, rng)
        except self.rdt.RdtError as e:
            self.tally.fail("serialize_borrowed_" + type(e).__name__, str(e))
            return
        self.send(self.other(rng), dict(msg, form=form, data=data, hops=msg["hops"] - 1))
        self.tally.add(forwarded=1)

    def finish_held(self, due: List[Tuple[float, Any, Dict[str, Any]]], rng: random.Random) -> None:
        if len(due) > 1 and rng.random() < 0.5:
            self.get_and_verify([h[1] for h in due], [h[2] for h in due], rng, None)
        elif rng.random() < 0.7:
            for h in due:
                self.get_and_verify([h[1]], [h[2]], rng, None)
        for h in due:
            h[1].close()
        self.tally.add(held_refs=len(due))

    # -- phases --

    def end_state(self) -> Dict[str, int]:
        s = self.rt.stats()
        state = {k: s[k] for k in END_STATE}
        state["put_tensors_held"] = len(self.rt._store.entries)  # the binding's keep-alive entries
        return state

    def settle(self, limit: float) -> Dict[str, Any]:
        """Waits until every counter of END_STATE is zero; then measures."""
        deadline = time.monotonic() + limit
        while True:
            gc.collect()
            state = self.end_state()
            if not any(state.values()) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        gc.collect()
        time.sleep(0.2)  # closing descriptors of what was just released
        s = self.rt.stats()
        transports = {t["name"]: {k: t[k] for k in ("transfers_completed", "transfers_failed", "bytes_received")}
                      for t in self.rt.transports() if t["name"] in HOST_TRANSPORTS}
        # The receive cache keeps dropped buffers on purpose, up to its
        # bound: it is checked against that bound, then emptied for the
        # measurement, so that VmRSS shows what nothing should keep.
        cache = self.rdt._process.PROCESS.receive_cache()
        cached, bound = cache.cached_bytes(), cache.limit
        cache.set_limit(0)
        gc.collect()
        memory = memory_kib()
        cache.set_limit(bound)
        return {"state": self.end_state(), "stats": s, "fds": descriptors(), "rss_kib": memory["VmRSS"],
                "memory": memory, "transports": transports, "receive_cache": [cached, bound]}

    def start_threads(self) -> List[threading.Thread]:
        threads = [threading.Thread(target=self.produce, name="producer", daemon=True)]
        threads += [threading.Thread(target=self.consume, args=(t,), name=f"consumer{t}", daemon=True)
                    for t in range(self.cfg["consumers"])]
        for t in threads:
            t.start()
        return threads

    def join_threads(self, threads: List[threading.Thread]) -> None:
        for t in threads:
            t.join(self.cfg["drain_limit"])
            if t.is_alive():
                raise RuntimeError(f"thread {t.name} did not end within {self.cfg['drain_limit']} s of the drain")

    def run_phase(self, name: str) -> None:
        ev = self.events
        if not ev[name + "_go"].wait(self.cfg["phase_wait"]):
            raise RuntimeError(f"phase {name} never started")
        self.stop.clear()
        self.quiet.clear()
        self.tally = Tally()  # each phase reports its own counts
        threads = self.start_threads()
        ev[name + "_stop"].wait(self.cfg["phase_wait"])
        self.stop.set()
        ev[name + "_quiet"].wait(self.cfg["phase_wait"])
        self.quiet.set()
        self.join_threads(threads)
        report = self.settle(self.cfg["settle_limit"])
        report.update(self.tally.snapshot())
        self.reports.put(("phase", self.index, name, report))


def _watchdog(hard_timeout: float) -> None:
    """Ends this process if the coordinator goes or the run's hard limit passes."""
    parent = os.getppid()
    deadline = time.monotonic() + hard_timeout

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent or time.monotonic() > deadline:
                os._exit(70)
    threading.Thread(target=watch, daemon=True).start()
    warnings.filterwarnings("ignore", message="rdt.get of an object put by this process")


def _report_failure(shared: Shared, who: str, e: BaseException) -> None:
    """Tells the coordinator why this process failed, and lets it exit
    without waiting for its inboxes' pipes to drain."""
    shared.reports.put(("error", who, "".join(traceback.format_exception(type(e), e, e.__traceback__))))
    for q in shared.inboxes:
        q.cancel_join_thread()


def worker_main(index: int, cfg: Dict[str, Any], shared: Shared) -> None:
    _watchdog(cfg["hard_timeout"])
    try:
        w = Worker(index, cfg, shared)
        shared.reports.put(("ready", index, {"pid": os.getpid(), "transports": w.transports}))
        for phase in ("warmup", "load"):
            w.run_phase(phase)
        shared.events["finish"].wait(cfg["phase_wait"])
        w.rt.close()
    except BaseException as e:
        _report_failure(shared, f"worker {index}", e)
        raise


def visitor_main(serial: int, cfg: Dict[str, Any], shared: Shared, leave: Any) -> None:
    """A short-lived peer: for a few seconds it puts objects for the workers
    and gets objects they send it, like the rest; then it takes no more
    refs, waits until the workers released its objects, and goes: every
    other visitor destroys its runtime first, the others just exit. The
    workers must then drop whatever they kept for it (descriptors,
    connections), which their end-of-run descriptor check sees."""
    _watchdog(cfg["hard_timeout"])
    try:
        w = Worker(cfg["workers"], cfg, shared, visitor=serial)
        w.stop.clear()
        threads = w.start_threads()
        with shared.visitor_lock:
            shared.visitor_open.value = 1
        leave.wait(cfg["visitor_life"])
        w.stop.set()
        with shared.visitor_lock:
            shared.visitor_open.value = 0
        deadline = time.monotonic() + cfg["drain_limit"]
        while shared.visitor_outstanding.value and time.monotonic() < deadline:
            time.sleep(0.02)
        w.quiet.set()
        w.join_threads(threads)
        report = w.settle(cfg["settle_limit"])
        report.update(w.tally.snapshot(), pid=os.getpid(), destroyed=serial % 2 == 0)
        shared.reports.put(("visitor", serial, report))
        if serial % 2:
            shared.reports.close()
            shared.reports.join_thread()  # the report is in the pipe
            os._exit(0)  # no destroy: the workers see the process vanish
        w.rt.close()
    except BaseException as e:
        _report_failure(shared, f"visitor {serial}", e)
        raise


# ---- the coordinator ----------------------------------------------------------

class Failed(Exception):
    pass


def report_problems(r: Dict[str, Any], who: str, unsettled: str) -> List[str]:
    """What a process's report shows went wrong: each kind of operation
    that failed, and examples (the lines start with who), and unsettled
    followed by the counters that were not back to zero, if any were."""
    problems = [f"{who}: {n} failed: {kind}" for kind, n in sorted(r["failures"].items())]
    problems += [f"{who}:   e.g. {ex}" for ex in r["examples"]]
    left = {k: v for k, v in r["state"].items() if v}
    if left:
        problems.append(unsettled + ", ".join(f"{k}={v}" for k, v in left.items()))
    return problems


class Coordinator:
    def __init__(self, cfg: Dict[str, Any]) -> None:
        import multiprocessing as mp
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.shared = sh = Shared(self.ctx, cfg["workers"])
        self.events = sh.events
        self.outstanding = sh.outstanding
        self.procs = [self.ctx.Process(target=worker_main, name=f"soak-worker-{i}", daemon=True, args=(i, cfg, sh))
                      for i in range(cfg["workers"])]
        self.phase: Dict[str, Dict[int, Dict[str, Any]]] = {"warmup": {}, "load": {}}
        self.ready: Dict[int, Dict[str, Any]] = {}
        self.visitor: Optional[Tuple[int, Any, Any]] = None  # (serial, process, leave event)
        self.visitors_started = 0
        self.visits: Dict[int, Dict[str, Any]] = {}  # reports by serial

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if p.exitcode is not None:
                how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit status {p.exitcode}"
                raise Failed(f"worker {i} (pid {p.pid}) died with {how}")
        if self.visitor is not None and self.visitor[1].exitcode is not None:
            serial, p, _ = self.visitor
            if p.exitcode != 0:
                how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit status {p.exitcode}"
                raise Failed(f"visitor {serial} (pid {p.pid}) died with {how}")
            self.pump(0.5)  # its report was sent before it exited
            if serial not in self.visits:
                raise Failed(f"visitor {serial} (pid {p.pid}) exited without its report")
            self.visitor = None

    def start_visitor(self) -> None:
        serial = self.visitors_started
        self.visitors_started += 1
        leave = self.ctx.Event()
        p = self.ctx.Process(target=visitor_main, name=f"soak-visitor-{serial}", daemon=True,
                             args=(serial, self.cfg, self.shared, leave))
        p.start()
        self.visitor = (serial, p, leave)

    def pump(self, timeout: float) -> None:
        """Takes reports for up to timeout seconds."""
        end = time.monotonic() + timeout
        while True:
            try:
                kind, index, *rest = self.shared.reports.get(timeout=max(0.0, min(0.2, end - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= end:
                    return
                continue
            if kind == "error":
                raise Failed(f"{index} failed:\n{rest[0]}")
            if kind == "ready":
                self.ready[index] = rest[0]
            elif kind == "phase":
                self.phase[rest[0]][index] = rest[1]
            elif kind == "visitor":
                self.visits[index] = rest[0]

    def wait_for(self, cond: Any, limit: float, what: str) -> None:
        end = time.monotonic() + limit
        while not cond():
            if time.monotonic() >= end:
                raise Failed(f"{what} did not happen within {limit:g} s")
            self.pump(0.1)
            self.check_alive()

    def run_phase(self, name: str, seconds: float) -> None:
        ev = self.events
        ev[name + "_go"].set()
        start = time.monotonic()
        last = start
        visitors = name == "load" and self.cfg["visitors"]
        while time.monotonic() - start < seconds:
            self.pump(min(0.5, max(0.0, seconds - (time.monotonic() - start))))
            self.check_alive()
            left = seconds - (time.monotonic() - start)
            if visitors and self.visitor is None and left > self.cfg["visitor_life"] + 2:
                self.start_visitor()
            if name == "load" and time.monotonic() - last >= 10:
                last = time.monotonic()
                print(f"soak: {last - start:4.0f} s, {sum(self.shared.progress[:])} gets verified, "
                      f"{len(self.visits)} visitors came and went", flush=True)
        if self.visitor is not None:
            self.visitor[2].set()  # leave now
        ev[name + "_stop"].set()
        drain_start = time.monotonic()
        self.wait_for(lambda: self.outstanding.value == 0, self.cfg["drain_limit"],
                      f"{name}: consuming every message after producers stopped "
                      f"({self.outstanding.value} still outstanding)")
        # The workers measure only once the visitor is gone.
        self.wait_for(lambda: self.visitor is None, self.cfg["drain_limit"] + self.cfg["settle_limit"],
                      "the last visitor leaving")
        ev[name + "_quiet"].set()
        self.wait_for(lambda: len(self.phase[name]) == self.cfg["workers"],
                      self.cfg["drain_limit"] + self.cfg["settle_limit"] + 10, f"{name}: every worker settling")
        print(f"soak: {name} done, drained and settled in {time.monotonic() - drain_start:.1f} s", flush=True)

    def run(self) -> List[str]:
        cfg = self.cfg
        for p in self.procs:
            p.start()
        self.wait_for(lambda: len(self.ready) == cfg["workers"], 60, "every worker starting its runtime")
        transports = sorted({t for r in self.ready.values() for t in r["transports"]}, key=HOST_TRANSPORTS.index)
        pids = ", ".join(str(r["pid"]) for _, r in sorted(self.ready.items()))
        print(f"soak: {cfg['workers']} workers (pids {pids}), transports auto, {', '.join(transports)}; "
              f"seed {cfg['seed']}; {cfg['warmup']:g} s warm-up, {cfg['seconds']:g} s load", flush=True)
        missing = [t for t in HOST_TRANSPORTS if t not in transports]
        self.run_phase("warmup", cfg["warmup"])
        self.run_phase("load", cfg["seconds"])
        self.events["finish"].set()
        for p in self.procs:
            p.join(30)
        problems = self.check() + self.check_visitors()
        if missing:
            print(f"soak: note: transports not available here, not exercised: {', '.join(missing)}")
        return problems

    def check(self) -> List[str]:
        cfg = self.cfg
        base, end = self.phase["warmup"], self.phase["load"]
        problems: List[str] = []
        for i in range(cfg["workers"]):
            for phase, reps in (("warm-up", base), ("load", end)):
                problems += report_problems(reps[i], f"worker {i}, {phase}",
                                            f"worker {i}, after {phase}: not back to zero within "
                                            f"{cfg['settle_limit']:g} s: ")
            problems += self.check_descriptors(i)
            for phase, reps in (("warm-up", base), ("load", end)):
                cached, bound = reps[i]["receive_cache"]
                if cached > bound:
                    problems.append(f"worker {i}, after {phase}: the receive cache held {cached} bytes, over its "
                                    f"bound of {bound}")
            drss = (end[i]["rss_kib"] - base[i]["rss_kib"]) / 1024
            if drss > cfg["rss_slack_mib"]:
                parts = ", ".join(f"{k} {(end[i]['memory'][k] - base[i]['memory'][k]) / 1024:+.0f}"
                                  for k in ("RssAnon", "RssFile", "RssShmem") if k in base[i]["memory"])
                problems.append(f"worker {i}: VmRSS {base[i]['rss_kib'] / 1024:.0f} MiB after warm-up, "
                                f"{end[i]['rss_kib'] / 1024:.0f} MiB at the end ({drss:+.0f} MiB, allowed "
                                f"+{cfg['rss_slack_mib']:g}; {parts})")
        for i, p in enumerate(self.procs):
            if p.exitcode != 0:
                problems.append(f"worker {i} exited with {p.exitcode}")
        total = sum(r["counts"].get("gets_verified", 0) for r in end.values())
        if total == 0:
            problems.append("no get was verified during the load phase")
        if not sum(r["counts"].get("gets_view", 0) for r in end.values()):
            problems.append("no view (get with copy=False) was verified during the load phase")
        for t, (ours, theirs) in self.transport_counts().items():
            if ours != theirs["transfers_completed"] or theirs["transfers_failed"]:
                problems.append(f"{t}: {ours} gets from another worker went over it, by the override, the put's "
                                f"transport or the same-host choice; rdt counted {theirs['transfers_completed']} "
                                f"completed and {theirs['transfers_failed']} failed transfers")
        return problems

    def check_visitors(self) -> List[str]:
        cfg = self.cfg
        problems = []
        if cfg["visitors"] and cfg["seconds"] > cfg["visitor_life"] + 2 and not self.visits:
            problems.append("no visitor came and went during the load")
        for serial, r in sorted(self.visits.items()):
            problems += report_problems(r, f"visitor {serial}", f"visitor {serial}: not back to zero within "
                                        f"{cfg['settle_limit']:g} s before leaving: ")
        return problems

    def transport_counts(self) -> Dict[str, Tuple[int, collections.Counter]]:
        """Per transport, during the load: the remote gets that should have
        used it, and rdt's own transfer counters summed over the receivers."""
        base, end = self.phase["warmup"], self.phase["load"]
        out = {}
        for t in HOST_TRANSPORTS:
            theirs: collections.Counter = collections.Counter()
            for i in range(self.cfg["workers"]):
                for k, x in end[i]["transports"].get(t, {}).items():
                    theirs[k] += x - base[i]["transports"].get(t, {}).get(k, 0)
            for r in self.visits.values():  # visitors count from their start
                for k, x in r["transports"].get(t, {}).items():
                    theirs[k] += x
            ours = sum(r["counts"].get(f"moved_{t}", 0) for r in [*end.values(), *self.visits.values()])
            if ours or theirs:
                out[t] = (ours, theirs)
        return out

    def descriptor_classes(self) -> Tuple[Dict[int, Dict[str, Any]], Dict[int, Dict[str, Any]]]:
        pids = {i: r["pid"] for i, r in self.ready.items()}
        return tuple(classify({i: r["fds"] for i, r in self.phase[p].items()}, pids)  # type: ignore[return-value]
                     for p in ("warmup", "load"))

    def check_descriptors(self, i: int) -> List[str]:
        """Descriptors other than connections between live workers must be
        back to the baseline; those connections stay within the pools' bound."""
        base, end = self.descriptor_classes()
        b, e = base[i]["other"], end[i]["other"]
        problems = []
        delta = sum(e.values()) - sum(b.values())
        if abs(delta) > self.cfg["fd_slack"]:
            diff = {k: e.get(k, 0) - b.get(k, 0) for k in sorted(set(b) | set(e))}
            problems.append(f"worker {i}: {sum(b.values())} descriptors after warm-up, {sum(e.values())} at the end "
                            f"({delta:+d}, allowed ±{self.cfg['fd_slack']}; not counting connections to the other "
                            f"workers): " + ", ".join(f"{k} {v:+d}" for k, v in diff.items() if v))
        for peer, n in sorted(end[i]["pooled"].items()):
            if n > POOLED_PER_PEER:
                problems.append(f"worker {i}: {n} sockets connected to worker {peer} at the end, more than the "
                                f"transports' pools keep ({POOLED_PER_PEER})")
        return problems

    def summary(self) -> str:
        base, end = self.phase["warmup"], self.phase["load"]
        if len(end) != self.cfg["workers"] or len(base) != self.cfg["workers"]:
            return ""
        lines = []
        labels = ["auto", *HOST_TRANSPORTS, "view"]
        head = (f"{'worker':>6} {'puts':>6} {'gets ok':>8} {'GiB ok':>7} {'corrupt':>7} {'failed':>6} "
                + " ".join(f"{'get ' + t:>8}" for t in labels)
                + f" {'fwd':>5} {'unread':>6} {'fds':>8} {'pooled':>8} {'RSS MiB':>10}")
        lines.append(head)
        tot: collections.Counter = collections.Counter()
        fb, fe = self.descriptor_classes()
        for i in range(self.cfg["workers"]):
            c = collections.Counter(end[i]["counts"])
            tot.update(c)
            fails = sum(end[i]["failures"].values())
            tot["failed"] += fails
            other_b, other_e = sum(fb[i]["other"].values()), sum(fe[i]["other"].values())
            pooled_b, pooled_e = sum(fb[i]["pooled"].values()), sum(fe[i]["pooled"].values())
            drss = (end[i]["rss_kib"] - base[i]["rss_kib"]) / 1024
            lines.append(f"{i:>6} {c['puts']:>6} {c['gets_verified']:>8} {c['bytes_verified'] / 2**30:>7.2f} "
                         f"{c['corrupt_bytes']:>7} {fails:>6} "
                         + " ".join(f"{c['get_' + t]:>8}" for t in labels)
                         + f" {c['forwarded'] + c['forwarded_raw']:>5}"
                         f" {c['released_unfetched'] + c['dropped_unread']:>6}"
                         f" {other_b:>4}{other_e - other_b:>+4d} {pooled_b:>4}{pooled_e - pooled_b:>+4d}"
                         f" {base[i]['rss_kib'] / 1024:>5.0f}{drss:>+5.0f}")
        lines.append(f"{'total':>6} {tot['puts']:>6} {tot['gets_verified']:>8} {tot['bytes_verified'] / 2**30:>7.2f} "
                     f"{tot['corrupt_bytes']:>7} {tot['failed']:>6} "
                     + " ".join(f"{tot['get_' + t]:>8}" for t in labels)
                     + f" {tot['forwarded'] + tot['forwarded_raw']:>5}"
                     f" {tot['released_unfetched'] + tot['dropped_unread']:>6}")
        lines.append(f"gets: {tot['gets_remote']} from another worker, {tot['gets_own_object']} of the worker's own "
                     f"object, {tot['gets_out']} into out=, {tot['gets_view']} as views (copy=False), "
                     f"{tot['multi_ref_gets']} of several refs at once; "
                     f"{tot['refs_sent']} refs sent, {tot['forwarded']} forwarded after deserializing, "
                     f"{tot['forwarded_raw']} as bytes, {tot['released_unfetched']} released unfetched, "
                     f"{tot['dropped_unread']} never deserialized, {tot['double_deserialize']} deserialized twice")
        if self.visits:
            v: collections.Counter = collections.Counter()
            for r in self.visits.values():
                v.update(r["counts"])
                v["failed"] += sum(r["failures"].values())
            destroyed = sum(1 for r in self.visits.values() if r["destroyed"])
            lines.append(f"visitors: {len(self.visits)} came and went ({destroyed} destroyed their runtime, "
                         f"{len(self.visits) - destroyed} just exited); they put {v['puts']}, verified "
                         f"{v['gets_verified']} gets ({v['bytes_verified'] / 2**30:.2f} GiB, {v['corrupt_bytes']} "
                         f"corrupt bytes, {v['failed']} failed); the workers verified "
                         f"{tot['gets_of_visitor_objects']} gets of visitors' objects")
        state: collections.Counter = collections.Counter()
        leases = 0
        for i in range(self.cfg["workers"]):
            state.update(end[i]["state"])
            leases += end[i]["stats"]["leases_expired"] - base[i]["stats"]["leases_expired"]
        lines.append("end state, summed over workers: " + ", ".join(f"{k} {state[k]}" for k in
                                                                   (*END_STATE, "put_tensors_held"))
                     + f"; leases expired during the load {leases}")
        pooled = sum(sum(c["pooled"].values()) for c in fe.values())
        lines.append(f"descriptors: connections between workers at the end {pooled} (pooled; "
                     f"{sum(c['pooled_closed'] for c in fe.values())} already closed by the other side), "
                     f"other descriptors {sum(sum(c['other'].values()) for c in fe.values())} "
                     f"(after warm-up {sum(sum(c['other'].values()) for c in fb.values())})")
        lines.append("remote gets by the transport that moved them, expected / rdt's counters: " + "; ".join(
            f"{t} {ours} / {theirs['transfers_completed']} completed, {theirs['transfers_failed']} failed"
            for t, (ours, theirs) in self.transport_counts().items()))
        return "\n".join(lines)

    def kill(self) -> None:
        for q in self.shared.inboxes:
            q.cancel_join_thread()
        procs = self.procs + ([self.visitor[1]] if self.visitor is not None else [])
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60, help="length of the load phase (default 60)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--consumers", type=int, default=2, help="consumer threads per worker")
    ap.add_argument("--warmup", type=float, default=5, help="warm-up seconds before the baseline (default 5)")
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    ap.add_argument("--min-size", type=int, default=4 << 10)
    ap.add_argument("--max-size", type=int, default=16 << 20)
    ap.add_argument("--max-objects", type=int, default=12,
                    help="objects a worker owns at once, at most (bounds memory)")
    ap.add_argument("--lease", type=float, default=8, help="lease of serialized refs, seconds (default 8)")
    ap.add_argument("--hold-max", type=float, default=1.5, help="longest a handle is held before release, s")
    ap.add_argument("--fd-slack", type=int, default=2,
                    help="descriptors allowed above or below the baseline, not counting connections between "
                         "live workers (default 2)")
    ap.add_argument("--rss-slack-mib", type=float, default=64, help="VmRSS growth allowed over the baseline")
    ap.add_argument("--drain-limit", type=float, default=30, help="seconds for the messages to be consumed")
    ap.add_argument("--visitors", action=argparse.BooleanOptionalAction, default=True,
                    help="during the load, start short-lived peers one after another (default: on)")
    ap.add_argument("--visitor-life", type=float, default=4, help="seconds a visitor puts and gets (default 4)")
    args = ap.parse_args()
    if args.workers < 3:
        ap.error("--workers must be at least 3 (refs are forwarded through a third process)")
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000_007
    cfg = {"seconds": args.seconds, "workers": args.workers, "consumers": args.consumers, "warmup": args.warmup,
           "seed": seed, "min_size": args.min_size, "max_size": args.max_size, "max_objects": args.max_objects,
           "lease": args.lease, "hold_max": args.hold_max, "fd_slack": args.fd_slack,
           "rss_slack_mib": args.rss_slack_mib, "drain_limit": args.drain_limit,
           "visitors": args.visitors, "visitor_life": args.visitor_life,
           # leases expire within lease seconds of the last serialize
           "settle_limit": args.lease + 20}
    # Every wait of a worker and the whole run are bounded.
    drain, settle = cfg["drain_limit"], cfg["settle_limit"]
    cfg["phase_wait"] = args.warmup + args.seconds + 2 * (drain + settle) + 60
    # Start-up, both phases, and the end of each: messages consumed, the
    # visitor gone (load only), every worker settled.
    cfg["hard_timeout"] = 60 + args.warmup + args.seconds + 5 * drain + 3 * settle + 40
    # Arrays of 128 KiB and more are mapped and unmapped by themselves, so
    # that VmRSS shows what is still held rather than what glibc keeps in its
    # heap after raising its threshold for big blocks (up to 100 MiB seen).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 << 10))
    # Frequent garbage collections (and the stack shrinks they bring) make
    # defects at the cgo boundary, such as an integer where Go expects a
    # pointer, fail within seconds instead of hours. GOGC set by the caller
    # wins.
    os.environ.setdefault("GOGC", "10")
    coord = Coordinator(cfg)

    def on_stop(why: str) -> None:
        raise Failed(why)

    def on_alarm(signum: int, frame: Any) -> None:
        on_stop(f"the run passed its hard limit of {cfg['hard_timeout']:.0f} s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda signum, frame: on_stop("terminated (SIGTERM)"))
    signal.alarm(int(cfg["hard_timeout"]) + 5)
    problems: List[str]
    try:
        problems = coord.run()
    except Failed as e:
        problems = [str(e)]
    except KeyboardInterrupt:
        problems = ["interrupted"]
    finally:
        signal.alarm(0)
        coord.kill()
    table = coord.summary()
    if table:
        print(table)
    if problems:
        print(f"soak FAILED (seed {seed}):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"soak passed (seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
